//! Jobs: the runners, the scheduler, one sync, and the write queue between
//! a read and its writer.
//!
//! Layout:
//! - [`runner`]: claiming jobs with leases, heartbeats, retries, fair
//!   concurrency between workspaces ([`spawn`] starts it all);
//! - [`scheduler`]: starting due scheduled syncs, skipping busy ones;
//! - [`sync`]: one sync or reset, stream by stream, with its progress;
//! - [`queue`]: a stream's byte-bounded write queue and its grouping.

pub mod queue;
pub mod runner;
pub mod scheduler;
pub mod sync;

pub use runner::spawn;
