//! Per-pipeline, per-stream counters in `/metrics`: records and bytes
//! read from the source and written to the destination, labelled
//! `workspace`, `pipeline` and `stream`.
//!
//! The label sets are bounded: one process keeps at most [`MAX_SERIES`]
//! (pipeline, stream) pairs; the streams of pipelines it meets after that
//! are counted together under `other` in every label, so a large or
//! growing installation cannot grow a scrape without bound.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use metrics::Counter;

/// (pipeline, stream) pairs one process labels one by one at most.
pub const MAX_SERIES: usize = 2000;

/// The label all pairs beyond [`MAX_SERIES`] share.
const OTHER: &str = "other";

/// Whether a (pipeline, stream) pair gets series of its own.
fn admitted(pipeline: &str, stream: &str) -> bool {
    static SEEN: OnceLock<Mutex<HashSet<(String, String)>>> = OnceLock::new();
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    let key = (pipeline.to_owned(), stream.to_owned());
    if seen.contains(&key) {
        return true;
    }
    if seen.len() >= MAX_SERIES {
        return false;
    }
    seen.insert(key);
    true
}

/// The counters of one stream of one pipeline.
pub(super) struct StreamMeter {
    records_read: Counter,
    bytes_read: Counter,
    records_written: Counter,
    bytes_written: Counter,
}

impl StreamMeter {
    pub(super) fn new(workspace: &str, pipeline: &str, stream: &str) -> StreamMeter {
        let (w, p, s) = if admitted(pipeline, stream) {
            (workspace.to_owned(), pipeline.to_owned(), stream.to_owned())
        } else {
            (OTHER.to_owned(), OTHER.to_owned(), OTHER.to_owned())
        };
        let counter = |name: &'static str| metrics::counter!(name, "workspace" => w.clone(), "pipeline" => p.clone(), "stream" => s.clone());
        StreamMeter {
            records_read: counter("pipeline_records_read_total"),
            bytes_read: counter("pipeline_bytes_read_total"),
            records_written: counter("pipeline_records_written_total"),
            bytes_written: counter("pipeline_bytes_written_total"),
        }
    }

    /// Records the plugin emitted.
    pub(super) fn read(&self, records: u64, bytes: u64) {
        self.records_read.increment(records);
        self.bytes_read.increment(bytes);
    }

    /// Records the destination committed.
    pub(super) fn written(&self, records: u64, bytes: u64) {
        self.records_written.increment(records);
        self.bytes_written.increment(bytes);
    }
}
