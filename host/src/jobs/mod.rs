//! Jobs: the runners, the scheduler, the kinds of work a job does (a sync
//! or reset, a replay of rejected rows, an activation run), and what they
//! share.
//!
//! Layout:
//! - this module: how a job fails ([`Failure`]) and how it is stopped
//!   ([`CancellationToken`]);
//! - [`runner`]: claiming jobs with leases, heartbeats, cancellation,
//!   retries, fair concurrency between workspaces ([`spawn`] starts it
//!   all); [`lease`]: how long a lease lasts and how it is kept;
//! - [`scheduler`]: starting due scheduled syncs, skipping busy ones;
//! - [`sync`]: one sync or reset, stream by stream, with its progress;
//! - [`spread`]: a sync or reset job as a runner starts it: spread over
//!   servers by stream (its coordinator, and the runners that take its
//!   streams), or handed to [`sync`];
//! - [`watch`]: a job's events as it runs (Server-Sent Events);
//! - [`meters`]: per-pipeline, per-stream counters for `/metrics`, with
//!   bounded label sets;
//! - [`queue`]: a stream's byte-bounded write queue and its grouping;
//! - [`held`]: an append's records that no saved state covers yet, held
//!   until one does;
//! - [`quarantine`]: a stream's data contract applied as its batches are
//!   written, and its rejected-rows table;
//! - [`replay`]: one replay job: the rejected rows judged again, those that
//!   fit now loaded once;
//! - [`activation`]: one reverse-ETL activation run: the diff, the sends,
//!   the removals of mirror mode;
//! - [`spool`]: where a run keeps the rows it will send, within the
//!   workspace's share of the spool.

pub(crate) mod activation;
mod held;
mod lease;
pub(crate) mod meters;
pub(crate) mod quarantine;
pub mod queue;
mod replay;
pub(crate) mod runner;
pub(crate) mod scheduler;
pub(crate) mod spool;
mod spread;
pub(crate) mod sync;
pub(crate) mod watch;

pub use runner::spawn;
pub(crate) use tokio_util::sync::CancellationToken;

/// How a job's attempt failed: worth another attempt, or not. The text is
/// shown to users (sanitised, short).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    Transient(String),
    Permanent(String),
}

/// A typed error as a job's failure, retried when it may pass: what `?`
/// does in a job's code.
impl<E: crate::retry::Transient> From<E> for Failure {
    fn from(e: E) -> Failure {
        let transient = e.is_transient();
        Failure::of(e, transient)
    }
}

impl Failure {
    /// A failure whose reason is `e` (cut to a length fit for a job's
    /// record), transient or not as `transient` says.
    pub(crate) fn of(e: impl std::fmt::Display, transient: bool) -> Failure {
        let m: String = e.to_string().chars().take(300).collect();
        if transient { Failure::Transient(m) } else { Failure::Permanent(m) }
    }
}
