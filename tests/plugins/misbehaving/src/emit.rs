//! `emit`: synthetic records through the sink, for read-side tests (record
//! and batch limits, quotas, cancellation, checkpoint/resume).
//!
//! Emits records `{"id": i, "payload": "xxx…"}` for `i` in
//! `offset..records`, `batch` per `sink.emit` call, and checkpoints
//! `{"offset": <next i>}` after each batch. A read resumes from the offset
//! in its state.

use crate::bindings::service::connector1_0_0::sink::{self, SinkError};
use crate::bindings::service::connector1_0_0::types::ConnectorError;
use crate::config::{Config, invalid_config};

/// Where a resumed read starts: the `offset` of the checkpointed state.
pub fn resume_offset(state: Option<&str>) -> Result<u64, ConnectorError> {
    let Some(state) = state else { return Ok(0) };
    serde_json::from_str::<serde_json::Value>(state)
        .ok()
        .and_then(|state| state.get("offset")?.as_u64())
        .ok_or_else(|| ConnectorError::Internal(format!("unexpected state {state:?}; expected {{\"offset\": n}}")))
}

/// Emits the configured records from `start` on; returns how many it
/// emitted. A refused sink call ends it with `internal("sink: <error>")`.
pub fn emit(config: &Config, stream: &str, start: u64) -> Result<u64, ConnectorError> {
    let records = config.u64("records", 10)?;
    let record_bytes = config.u64("record_bytes", 16)?;
    let batch = config.u64("batch", 100)?;
    if batch == 0 {
        return Err(invalid_config("batch: must be at least 1"));
    }
    let record_bytes = usize::try_from(record_bytes).map_err(|_| invalid_config("record_bytes: too large"))?;
    let payload = "x".repeat(record_bytes);

    let mut next = start;
    while next < records {
        let end = records.min(next.saturating_add(batch));
        let texts: Vec<String> = (next..end).map(|id| format!(r#"{{"id":{id},"payload":"{payload}"}}"#)).collect();
        sink::emit(stream, &texts).map_err(sink_failure)?;
        drop(texts);
        next = end;
        sink::checkpoint(stream, &format!(r#"{{"offset":{next}}}"#)).map_err(sink_failure)?;
    }
    Ok(next.saturating_sub(start))
}

fn sink_failure(error: SinkError) -> ConnectorError {
    let error = match error {
        SinkError::Cancelled => "cancelled".to_owned(),
        SinkError::RecordTooLarge(index) => format!("record-too-large({index})"),
        SinkError::QuotaExceeded => "quota-exceeded".to_owned(),
        SinkError::Rejected(reason) => format!("rejected({reason})"),
    };
    ConnectorError::Internal(format!("sink: {error}"))
}
