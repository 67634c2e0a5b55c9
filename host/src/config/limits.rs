//! Limits that keep one client, tenant or plugin from exhausting the
//! server: connections, deadlines, request rates, job and plugin
//! concurrency, and each plugin call's sandbox.

use std::time::Duration;

/// Resolved limits of a running server.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub request_timeout: Duration,
    pub throttle: ThrottleSettings,
    pub job_concurrency: usize,
    pub job_concurrency_per_workspace: i64,
    pub job_lease: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(120),
            throttle: Default::default(),
            job_concurrency: 4,
            job_concurrency_per_workspace: 2,
            job_lease: Duration::from_secs(30),
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

