//! Logs, metrics and request ids.
//!
//! Layout: this module sets up logging and the metrics recorder;
//! [`labels`] says how tenants appear in metric labels; [`request_id`]
//! gives every request its id, in bodies, headers and log lines;
//! [`job_id`] says which job the current task's work is for.
//!
//! Logs go through `tracing` (human or JSON lines; filter with
//! `SERVICE_LOG`, e.g. `SERVICE_LOG=debug`). Nothing secret is ever a field
//! of a log event: secrets live in `secrecy` types whose `Debug` is redacted.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::{ConfigError, LogFormat};

pub(crate) mod job_id;
pub(crate) mod labels;
pub(crate) mod request_id;

/// Installs the global log subscriber (once; later calls are ignored),
/// writing what `directives` (`SERVICE_LOG`) selects.
pub(crate) fn init_logging(format: LogFormat, directives: &str) -> Result<(), ConfigError> {
    let filter = EnvFilter::try_new(directives).map_err(|e| ConfigError::new("SERVICE_LOG", e.to_string()))?;
    // Colour only for a terminal: a log file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    };
    Ok(())
}

/// The process-wide Prometheus recorder (installed on first use, so several
/// servers in one test process share it).
pub(crate) fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("http_request_duration_seconds".into()),
                    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
                )
                .expect("static bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
            }
            handle
        })
        .clone()
}
