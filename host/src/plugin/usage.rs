//! What a plugin costs, per invocation, per job and per plugin version.
//!
//! Counted for every invocation, from what the sandbox keeps anyway:
//! - guest CPU: the epoch ticks during which guest code ran (the ticks the
//!   CPU limit already counts, 5 ms each), so accounting adds no fuel
//!   instrumentation to the guest's code;
//! - peak linear memory: the most the invocation's memories held together
//!   (the memory limiter's own sum);
//! - requests, bytes sent (request bodies) and received (response bodies)
//!   through the egress, and the host time spent on them: the host's time
//!   on the plugin's behalf, writes to destinations excluded.
//!
//! An invocation's usage goes to the plugin's Prometheus meters (labelled
//! by connector and version, registered once per loaded component) and to
//! the job it runs for, when there is one: jobs run their invocations
//! inside [`metered`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) use crate::store::jobs::Usage;

tokio::task_local! {
    /// The usage of the job the current task runs.
    static JOB_USAGE: Arc<Mutex<Usage>>;
}

/// Runs `work` charging every invocation it makes to `meter`.
pub(crate) async fn metered<F: Future>(meter: Arc<Mutex<Usage>>, work: F) -> F::Output {
    JOB_USAGE.scope(meter, work).await
}

/// Adds an invocation's usage to the job of the current task, if any.
pub(super) fn charge(usage: &Usage) {
    let _ = JOB_USAGE.try_with(|meter| meter.lock().unwrap_or_else(|p| p.into_inner()).add(usage));
}

/// The egress side of one invocation, shared with the requests it starts
/// ahead on tasks of their own.
#[derive(Debug, Default)]
pub(crate) struct EgressUsage {
    requests: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
    host_nanos: AtomicU64,
}

impl EgressUsage {
    /// One request: its body, its answer's body and the host's time on it.
    pub(super) fn record(&self, sent: usize, received: usize, took: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.sent.fetch_add(sent as u64, Ordering::Relaxed);
        self.received.fetch_add(received as u64, Ordering::Relaxed);
        self.host_nanos.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The invocation's usage, with its guest CPU and memory.
    pub(super) fn usage(&self, guest_cpu: Duration, peak_memory_bytes: u64) -> Usage {
        Usage {
            guest_cpu_ms: guest_cpu.as_millis() as u64,
            peak_memory_bytes,
            requests: self.requests.load(Ordering::Relaxed),
            bytes_sent: self.sent.load(Ordering::Relaxed),
            bytes_received: self.received.load(Ordering::Relaxed),
            host_ms: self.host_nanos.load(Ordering::Relaxed) / 1_000_000,
        }
    }
}

/// A loaded component's Prometheus meters.
pub struct PluginMeters {
    invocations: metrics::Counter,
    guest_cpu_ms: metrics::Counter,
    requests: metrics::Counter,
    bytes_sent: metrics::Counter,
    bytes_received: metrics::Counter,
    host_ms: metrics::Counter,
    /// The largest peak of one invocation so far: a gauge set when it
    /// grows (a histogram would keep every sample until scraped).
    peak_memory: metrics::Gauge,
    largest_peak: AtomicU64,
}

impl PluginMeters {
    /// The meters of one connector version, registered once.
    pub(super) fn new(connector: &str, version: &str) -> PluginMeters {
        let labels = [("connector", connector.to_owned()), ("version", version.to_owned())];
        PluginMeters {
            invocations: metrics::counter!("plugin_invocations_total", &labels),
            guest_cpu_ms: metrics::counter!("plugin_guest_cpu_milliseconds_total", &labels),
            requests: metrics::counter!("plugin_requests_total", &labels),
            bytes_sent: metrics::counter!("plugin_sent_bytes_total", &labels),
            bytes_received: metrics::counter!("plugin_received_bytes_total", &labels),
            host_ms: metrics::counter!("plugin_host_milliseconds_total", &labels),
            peak_memory: metrics::gauge!("plugin_peak_memory_bytes", &labels),
            largest_peak: AtomicU64::new(0),
        }
    }

    pub(super) fn record(&self, usage: &Usage) {
        self.invocations.increment(1);
        self.guest_cpu_ms.increment(usage.guest_cpu_ms);
        self.requests.increment(usage.requests);
        self.bytes_sent.increment(usage.bytes_sent);
        self.bytes_received.increment(usage.bytes_received);
        self.host_ms.increment(usage.host_ms);
        if self.largest_peak.fetch_max(usage.peak_memory_bytes, Ordering::Relaxed) < usage.peak_memory_bytes {
            self.peak_memory.set(usage.peak_memory_bytes as f64);
        }
    }
}
