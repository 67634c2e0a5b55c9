//! Per-pipeline, per-stream counters in `/metrics`: records and bytes
//! read from the source and written to the destination, labelled
//! `workspace`, `pipeline` and `stream` (workspace and stream as the
//! server's [`MetricLabels`] say: opaque digests by default).
//!
//! The label sets are bounded: one process keeps at most [`MAX_SERIES`]
//! (pipeline, stream) pairs, and one workspace at most
//! [`MAX_SERIES_PER_WORKSPACE`] of them, so a tenant with many streams
//! cannot push the others out. A workspace's pairs beyond its share are
//! counted together under `pipeline="other",stream="other"` with its own
//! workspace label; pairs beyond the process's bound under `other` in
//! every label. A large or growing installation cannot grow a scrape
//! without bound.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

use metrics::Counter;

use crate::telemetry::labels::MetricLabels;

/// (pipeline, stream) pairs one process labels one by one at most.
pub(crate) const MAX_SERIES: usize = 2000;

/// (pipeline, stream) pairs of one workspace labelled one by one at most.
pub(crate) const MAX_SERIES_PER_WORKSPACE: usize = 200;

/// The label all pairs beyond a bound share.
const OTHER: &str = "other";

/// Which pairs have series of their own, and how many each workspace has.
#[derive(Default)]
struct Admissions {
    pairs: HashSet<(String, String)>,
    per_workspace: HashMap<String, usize>,
}

/// What a pair is counted under.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    /// Series of its own.
    Own,
    /// Its workspace's shared `other` series.
    WorkspaceOther,
    /// The process's shared `other` series.
    Other,
}

impl Admissions {
    fn admit(&mut self, workspace: &str, pipeline: &str, stream: &str, total: usize, each: usize) -> Admission {
        let key = (pipeline.to_owned(), stream.to_owned());
        if self.pairs.contains(&key) {
            return Admission::Own;
        }
        if self.pairs.len() >= total {
            return Admission::Other;
        }
        let used = self.per_workspace.entry(workspace.to_owned()).or_default();
        if *used >= each {
            return Admission::WorkspaceOther;
        }
        *used += 1;
        self.pairs.insert(key);
        Admission::Own
    }
}

fn admission(workspace: &str, pipeline: &str, stream: &str) -> Admission {
    static SEEN: OnceLock<Mutex<Admissions>> = OnceLock::new();
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    seen.admit(workspace, pipeline, stream, MAX_SERIES, MAX_SERIES_PER_WORKSPACE)
}

/// The counters of one stream of one pipeline.
pub(super) struct StreamMeter {
    records_read: Counter,
    bytes_read: Counter,
    records_written: Counter,
    bytes_written: Counter,
}

impl StreamMeter {
    pub(super) fn new(labels: &MetricLabels, workspace: &str, pipeline: &str, stream: &str) -> StreamMeter {
        let (w, p, s) = match admission(workspace, pipeline, stream) {
            Admission::Own => (labels.workspace(workspace), pipeline.to_owned(), labels.stream(pipeline, stream)),
            Admission::WorkspaceOther => (labels.workspace(workspace), OTHER.to_owned(), OTHER.to_owned()),
            Admission::Other => (OTHER.to_owned(), OTHER.to_owned(), OTHER.to_owned()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_workspace_keeps_to_its_share_and_others_still_get_series() {
        let mut a = Admissions::default();
        for i in 0..10 {
            assert_eq!(
                a.admit("busy", "p", &format!("s{i}"), 9, 3),
                if i < 3 { Admission::Own } else { Admission::WorkspaceOther }
            );
        }
        assert_eq!(a.admit("busy", "p", "s1", 9, 3), Admission::Own, "an admitted pair stays admitted");
        for w in ["b", "c"] {
            for i in 0..3 {
                assert_eq!(a.admit(w, w, &format!("s{i}"), 9, 3), Admission::Own, "{w}");
            }
        }
        // A tenth pair would pass the process's bound of 9.
        assert_eq!(a.admit("d", "d", "s0", 9, 3), Admission::Other);
    }
}
