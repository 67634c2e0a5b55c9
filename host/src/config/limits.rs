//! Limits that keep one client, tenant or plugin from exhausting the
//! server: connections, deadlines, request rates, job and plugin
//! concurrency, and each plugin call's sandbox.

use std::time::Duration;

pub use super::warehouse::Network;

/// Resolved limits of a running server.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Connections open at once, from everyone.
    pub max_connections: usize,
    /// Connections open at once from one address (trusted proxies are
    /// exempt: every client behind them shares their address).
    pub max_connections_per_address: usize,
    pub header_read_timeout: Duration,
    /// How long a client has to send a request's whole body, from its
    /// first byte: far shorter than [`ServerLimits::request_timeout`], so a
    /// body trickled a byte at a time cannot hold a connection for long.
    pub body_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed
    /// (HTTP/1 keep-alive and HTTP/2 alike).
    pub idle_timeout: Duration,
    /// Requests one HTTP/2 connection may have in flight at once.
    pub http2_max_concurrent_streams: u32,
    pub request_timeout: Duration,
    pub throttle: ThrottleSettings,
    /// Proxies whose `Forwarded` / `X-Forwarded-For` headers name the
    /// client: requests from anywhere else are counted by their own
    /// address, whatever those headers say.
    pub trusted_proxies: Vec<Network>,
    pub job_concurrency: usize,
    pub job_concurrency_per_workspace: i64,
    pub job_lease: Duration,
    /// Whether a sync's streams are leased one by one to any server's
    /// runners (`SERVICE_JOB_SPREAD_STREAMS`).
    pub job_spread_streams: bool,
    /// Bounds of reverse-ETL runs and previews.
    pub reverse_etl: ReverseEtlLimits,
    /// How outbound webhooks are retried.
    pub webhooks: WebhookLimits,
    /// How long a job's event stream stays open and how often it checks
    /// its reader.
    pub streams: StreamLimits,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 1024,
            max_connections_per_address: 64,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(60),
            http2_max_concurrent_streams: 64,
            request_timeout: Duration::from_secs(120),
            throttle: Default::default(),
            trusted_proxies: Vec::new(),
            job_concurrency: 4,
            job_concurrency_per_workspace: 0,
            job_lease: Duration::from_secs(30),
            job_spread_streams: false,
            reverse_etl: Default::default(),
            webhooks: Default::default(),
            streams: Default::default(),
        }
    }
}

/// Bounds of one event stream (`GET /v1/jobs/{job_id}/events`); how many
/// one user holds at once is [`crate::access::throttle::STREAMS_PER_USER`].
#[derive(Debug, Clone)]
pub struct StreamLimits {
    /// How long a stream stays open before it closes (its client
    /// reconnects, and is checked again).
    pub lifetime: Duration,
    /// How often an open stream checks that its session is live and its
    /// user still a member of the workspace.
    pub recheck: Duration,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits { lifetime: Duration::from_secs(3600), recheck: Duration::from_secs(15) }
    }
}

/// How webhook deliveries are retried and signed.
#[derive(Debug, Clone)]
pub struct WebhookLimits {
    /// The longest wait between two attempts of one delivery.
    pub max_backoff: Duration,
    /// How long after its event a delivery is still retried.
    pub retry_window: Duration,
    /// How long a rotated-out signing secret still signs, beside the new one.
    pub secret_overlap: Duration,
    /// How long a server holds a subscription without renewing its claim.
    pub lease: Duration,
    /// How long one attempt may take.
    pub attempt_timeout: Duration,
    /// Subscriptions one workspace may have.
    pub subscriptions_per_workspace: i64,
    /// Subscriptions of one workspace being sent to at once, on every
    /// server together.
    pub slots_per_workspace: i64,
    /// How long a server sends one subscription's queue before it lets
    /// the others have a turn.
    pub time_slice: Duration,
    /// Undelivered events one subscription may hold.
    pub pending_per_subscription: i64,
    /// Undelivered events one workspace's subscriptions may hold together.
    pub pending_per_workspace: i64,
}

impl Default for WebhookLimits {
    fn default() -> Self {
        WebhookLimits {
            max_backoff: Duration::from_secs(3600),
            retry_window: Duration::from_secs(24 * 3600),
            secret_overlap: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
            subscriptions_per_workspace: 10,
            slots_per_workspace: 2,
            time_slice: Duration::from_secs(2),
            pending_per_subscription: 1000,
            pending_per_workspace: 5000,
        }
    }
}

/// What one reverse-ETL run or preview may take: each bound is a clear
/// refusal or a run failing with a named reason, never a server that
/// grows without bound.
#[derive(Debug, Clone)]
pub struct ReverseEtlLimits {
    /// Rows a model may return to one run.
    pub rows_per_run: u64,
    /// The largest single value a run reads; a row holding a larger one
    /// is invalid and never sent.
    pub value_bytes: usize,
    /// Bytes of rows waiting to be sent that one workspace's runs may
    /// spool to disk at once, on this server.
    pub spool_bytes_per_workspace: u64,
    /// Where runs spool; default: `<data-dir>/spool`, a folder of its own.
    pub spool_dir: Option<std::path::PathBuf>,
    /// The largest value a preview shows; larger ones are replaced by a
    /// marker giving their size.
    pub preview_cell_bytes: usize,
    /// The largest sample a preview answers with; rows past it are left
    /// out and the answer says so.
    pub preview_response_bytes: usize,
}

impl Default for ReverseEtlLimits {
    fn default() -> Self {
        ReverseEtlLimits {
            rows_per_run: 1_000_000,
            value_bytes: 1024 * 1024,
            spool_bytes_per_workspace: 1024 * 1024 * 1024,
            spool_dir: None,
            preview_cell_bytes: 64 * 1024,
            preview_response_bytes: 4 * 1024 * 1024,
        }
    }
}

/// A rate: `per_second` on average, bursts up to `burst`. Zero disables.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

impl Rate {
    pub const OFF: Rate = Rate { per_second: 0.0, burst: 0.0 };

    /// `n` per second with a burst of twice that.
    pub fn per_second(n: u32) -> Rate {
        Rate { per_second: f64::from(n), burst: f64::from(n) * 2.0 }
    }

    /// Whether the limit applies at all.
    pub fn enabled(self) -> bool {
        self.per_second > 0.0
    }
}

/// What the operator sets.
#[derive(Debug, Clone, Copy)]
pub struct ThrottleSettings {
    /// Requests of one client address.
    pub per_address: Rate,
    /// Requests with an invalid, expired or revoked token from one address.
    pub failures_per_address: Rate,
    /// Requests of one session.
    pub per_session: Rate,
}

impl Default for ThrottleSettings {
    fn default() -> Self {
        ThrottleSettings {
            per_address: Rate::per_second(500),
            failures_per_address: Rate { per_second: 0.5, burst: 30.0 },
            per_session: Rate::per_second(200),
        }
    }
}

/// Limits of one invocation. Configurable by the operator.
#[derive(Debug, Clone)]
pub struct PluginLimits {
    /// Guest CPU time (wall time outside host calls).
    pub cpu: Duration,
    /// Largest linear memory of an instance.
    pub memory_bytes: usize,
    /// Wall clock of short calls (describe, check, discover, entity
    /// options, preview).
    pub wall_short: Duration,
    /// Wall clock of long calls (read, write).
    pub wall_long: Duration,
    /// Largest string a call may return (preview, schemas).
    pub max_output_bytes: usize,
    /// Largest single record emitted by a read.
    pub max_record_bytes: usize,
    /// Log bytes accepted per invocation (log import, stdout and stderr).
    pub max_log_bytes: usize,
    /// Invocations running at once on this server; more wait for a turn
    /// (at most their wall-clock limit).
    pub max_concurrent: usize,
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits {
            cpu: Duration::from_secs(10),
            memory_bytes: 256 * 1024 * 1024,
            wall_short: Duration::from_secs(60),
            wall_long: Duration::from_secs(60 * 60),
            max_output_bytes: 4 * 1024 * 1024,
            max_record_bytes: 4 * 1024 * 1024,
            max_log_bytes: 256 * 1024,
            max_concurrent: 32,
        }
    }
}
