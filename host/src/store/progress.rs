//! A job's progress, as its record keeps it and every reader shows it:
//! `GET /jobs/{id}`, a reverse-ETL run, the job's event stream and page,
//! and the OpenAPI description, all from these types.
//!
//! A queued job has none yet (`{}`); a sync or reset counts per stream
//! ([`SyncProgress`]); a reverse-ETL run counts per verdict in phases
//! ([`RunProgress`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a job has done so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum JobProgress {
    /// A sync or reset: records and bytes written, per stream.
    Sync(SyncProgress),
    /// A reverse-ETL run: its phase and counts.
    Run(RunProgress),
    /// Nothing yet: the job has not started.
    NotStarted(NotStarted),
}

impl Default for JobProgress {
    fn default() -> Self {
        JobProgress::NotStarted(NotStarted {})
    }
}

/// The progress of a job that has not started: `{}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NotStarted {}

/// A sync's (or reset's) progress: totals written, and each stream's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SyncProgress {
    /// Records the destination committed, all streams.
    pub records: u64,
    /// Bytes the destination committed, all streams.
    pub bytes: u64,
    /// Per stream, by name.
    pub streams: BTreeMap<String, StreamProgress>,
}

/// One stream of a sync.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StreamProgress {
    /// Records the destination committed.
    pub records: u64,
    /// Bytes the destination committed.
    pub bytes: u64,
    /// Records the connector emitted.
    pub records_read: u64,
    /// Bytes the connector emitted.
    pub bytes_read: u64,
    /// Committed records per second since the stream's first record (to
    /// its end, once it ended), to one decimal.
    pub records_per_second: f64,
    /// When its last checkpoint was saved; never in a mode that keeps no
    /// state.
    pub checkpointed_at: Option<DateTime<Utc>>,
    /// Records still to read: sources report no totals through the
    /// connector interface yet, so this is not known (`null`).
    pub records_remaining: Option<u64>,
    /// Whether its read still runs.
    pub status: StreamStatus,
}

/// Whether a stream of a sync still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamStatus {
    /// Being read and written.
    Running,
    /// Its read ended (written, or failed).
    Done,
}

/// A reverse-ETL run's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunProgress {
    /// Where the run is.
    pub phase: RunPhase,
    /// What became of the model's rows so far.
    pub counts: RunCounts,
    /// How long the diff took (milliseconds; 0 until it ended).
    pub diff_ms: u64,
    /// Up to 100 rows (or removals) the destination refused, and why.
    pub failed_samples: Vec<RowSample>,
    /// Up to 100 rows never sent because they are invalid, and why.
    pub invalid_samples: Vec<RowSample>,
}

/// The phases of a reverse-ETL run, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunPhase {
    /// Reading the model and comparing it with what was sent before.
    Diffing,
    /// Sending new and changed rows.
    Sending,
    /// Removing records whose rows left the model (mirror mode).
    Removing,
    /// Finished.
    Done,
}

/// A reverse-ETL run's counts, as `GET /reverse-etl/runs/{runId}` shows
/// them.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunCounts {
    /// Rows the model returned.
    pub queried: u64,
    /// New keys the destination accepted.
    pub added: u64,
    /// Changed (or earlier failed) keys the destination accepted.
    pub changed: u64,
    /// Records removed because their rows left the model (mirror mode).
    pub removed: u64,
    /// Keys whose rows are as last accepted: not sent.
    pub unchanged: u64,
    /// Rows whose key is null or appears more than once, or that are too
    /// large: never sent.
    pub invalid: u64,
    /// Rows (or removals) the destination refused: sent again next run.
    pub failed: u64,
    /// Changed rows an insert-only activation does not send.
    pub skipped: u64,
}

/// One failed or invalid row of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RowSample {
    /// Its key, when it has one.
    pub key: Option<String>,
    /// Why (shortened).
    pub reason: String,
}

impl JobProgress {
    /// A run's progress, if this is one.
    pub fn run(&self) -> Option<&RunProgress> {
        match self {
            JobProgress::Run(run) => Some(run),
            _ => None,
        }
    }

    /// A sync's progress, if this is one.
    pub fn sync(&self) -> Option<&SyncProgress> {
        match self {
            JobProgress::Sync(sync) => Some(sync),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Each shape reads back as itself, and a record written before the
    /// types existed reads as what it was.
    #[test]
    fn every_shape_reads_back_as_itself() {
        let stream = StreamProgress {
            records: 3,
            bytes: 30,
            records_read: 4,
            bytes_read: 40,
            records_per_second: 1.5,
            checkpointed_at: None,
            records_remaining: None,
            status: StreamStatus::Done,
        };
        let sync = JobProgress::Sync(SyncProgress {
            records: 3,
            bytes: 30,
            streams: BTreeMap::from([("items".to_owned(), stream)]),
        });
        let run = JobProgress::Run(RunProgress {
            phase: RunPhase::Sending,
            counts: RunCounts { queried: 2, added: 1, ..RunCounts::default() },
            diff_ms: 5,
            failed_samples: vec![RowSample { key: Some("k".into()), reason: "no".into() }],
            invalid_samples: vec![],
        });
        for progress in [sync, run, JobProgress::default()] {
            let text = serde_json::to_string(&progress).unwrap();
            assert_eq!(serde_json::from_str::<JobProgress>(&text).unwrap(), progress, "{text}");
        }
        assert_eq!(serde_json::to_value(JobProgress::default()).unwrap(), json!({}));
        let stored = json!({ "records": 0, "bytes": 0, "streams": { "a": { "records": 0, "bytes": 0,
            "records_read": 0, "bytes_read": 0, "records_per_second": 0.0, "checkpointed_at": "2026-01-01T00:00:00Z",
            "records_remaining": null, "status": "running" } } });
        let read: JobProgress = serde_json::from_value(stored).unwrap();
        assert_eq!(read.sync().unwrap().streams["a"].status, StreamStatus::Running);
    }
}
