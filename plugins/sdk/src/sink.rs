//! Handing what a read produces to the host: records and checkpoints.
//!
//! The host persists a checkpoint together with every record emitted before
//! it on the same stream. So the pattern of a resumable read is: emit a page,
//! then checkpoint the state that covers it.
//!
//! ```no_run
//! use connector_sdk::{Result, Sink, json};
//! # fn f(page: Vec<serde_json::Value>, last_id: u64) -> Result<()> {
//! Sink::emit("posts", &page)?;
//! Sink::checkpoint("posts", &json!({ "last_id": last_id }))?;
//! # Ok(()) }
//! ```

use std::fmt;

use serde_json::Value;

use crate::bindings::service::connector1_0_0::sink as wit;
use crate::types::Error;

/// The most records [`Sink::emit`] hands over in one host call.
pub const MAX_BATCH_RECORDS: usize = 1000;

/// The most bytes of JSON [`Sink::emit`] hands over in one host call (a
/// single larger record still goes alone; the host judges its size).
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// The host's side of a read.
#[derive(Debug)]
pub struct Sink;

impl Sink {
    /// Hands records of `stream` to the host, each a JSON object, in as
    /// many host calls as the batch limits need. On error, stop reading and
    /// return it (`?` turns it into an [`Error`]).
    pub fn emit(stream: &str, records: &[Value]) -> Result<(), SinkError> {
        Self::send(stream, batches(records, Value::to_string, MAX_BATCH_RECORDS, MAX_BATCH_BYTES))
    }

    /// Hands records that are already JSON text to the host, each an
    /// object: what a connector passing the provider's records through
    /// emits (for example [`RawValue`](serde_json::value::RawValue)s cut
    /// from a page), with no parsing and re-serialising in between. The
    /// host checks every record as it does those of [`Sink::emit`].
    pub fn emit_json<T: AsRef<str>>(stream: &str, records: &[T]) -> Result<(), SinkError> {
        Self::send(stream, batches(records, |r| r.as_ref().to_owned(), MAX_BATCH_RECORDS, MAX_BATCH_BYTES))
    }

    fn send(stream: &str, batches: Vec<(usize, Vec<String>)>) -> Result<(), SinkError> {
        for (offset, batch) in batches {
            wit::emit(stream, &batch).map_err(|e| SinkError::from(e).shifted_by(offset))?;
        }
        Ok(())
    }

    /// Records the progress of `stream`. The host hands `state` back in
    /// [`ReadRequest::state`](crate::ReadRequest::state) on the next read.
    pub fn checkpoint(stream: &str, state: &Value) -> Result<(), SinkError> {
        wit::checkpoint(stream, &state.to_string()).map_err(SinkError::from)
    }
}

/// Why the host did not take records or a checkpoint. Whatever the reason,
/// the read must stop: the host has already recorded why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkError {
    /// The job was cancelled or ran out of time; make no further requests.
    Cancelled,
    /// The record at this index of the slice given to [`Sink::emit`] is
    /// larger than the host accepts.
    RecordTooLarge {
        /// Index into the slice passed to `emit`.
        index: usize,
    },
    /// The job has produced more than it may.
    QuotaExceeded,
    /// The host refused the call for another reason.
    Rejected(String),
}

impl SinkError {
    /// Turns an index within one batch into an index within the caller's
    /// slice.
    fn shifted_by(self, offset: usize) -> Self {
        match self {
            SinkError::RecordTooLarge { index } => SinkError::RecordTooLarge { index: index + offset },
            other => other,
        }
    }
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkError::Cancelled => f.write_str("the host cancelled the read"),
            SinkError::RecordTooLarge { index } => {
                write!(f, "record {index} exceeds the host's record size limit")
            }
            SinkError::QuotaExceeded => f.write_str("the job exceeded its record quota"),
            SinkError::Rejected(reason) => write!(f, "the host rejected the records: {reason}"),
        }
    }
}

impl std::error::Error for SinkError {}

impl From<SinkError> for Error {
    /// The connector-level error is only a formality here: the host caused
    /// the failure and keeps its own, more precise, reason.
    fn from(e: SinkError) -> Self {
        Error::Internal(e.to_string())
    }
}

/// Turns records into text and groups them into batches within both
/// limits, each with the index of its first record.
fn batches<T>(
    records: &[T],
    text: impl Fn(&T) -> String,
    max_records: usize,
    max_bytes: usize,
) -> Vec<(usize, Vec<String>)> {
    let mut batches: Vec<(usize, Vec<String>)> = Vec::new();
    let mut bytes = 0;
    for (index, record) in records.iter().enumerate() {
        let text = text(record);
        match batches.last_mut() {
            Some((_, batch)) if batch.len() < max_records && bytes + text.len() <= max_bytes => {
                bytes += text.len();
                batch.push(text);
            }
            _ => {
                bytes = text.len();
                batches.push((index, vec![text]));
            }
        }
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn batches_respect_the_record_limit() {
        let records: Vec<Value> = (0..5).map(|i| json!({ "id": i })).collect();
        let sizes: Vec<(usize, usize)> =
            batches(&records, Value::to_string, 2, usize::MAX).iter().map(|(o, b)| (*o, b.len())).collect();
        assert_eq!(sizes, [(0, 2), (2, 2), (4, 1)]);
    }

    #[test]
    fn batches_respect_the_byte_limit_but_never_split_a_record() {
        let records = [json!({ "a": "x".repeat(10) }), json!({ "b": 1 }), json!({ "c": "y".repeat(50) })];
        let sizes: Vec<(usize, usize)> =
            batches(&records, Value::to_string, 100, 30).iter().map(|(o, b)| (*o, b.len())).collect();
        assert_eq!(sizes, [(0, 2), (2, 1)]);
    }

    #[test]
    fn no_records_means_no_host_call() {
        assert!(batches(&[] as &[Value], Value::to_string, 10, 10).is_empty());
        assert_eq!(
            batches(&["{\"a\":1}", "{}"], |r| r.to_string(), 10, 10),
            [(0, vec!["{\"a\":1}".to_owned(), "{}".to_owned()])]
        );
    }

    #[test]
    fn oversized_record_index_refers_to_the_callers_slice() {
        assert_eq!(SinkError::RecordTooLarge { index: 3 }.shifted_by(1000), SinkError::RecordTooLarge { index: 1003 });
    }
}
