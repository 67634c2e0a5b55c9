//! A job's progress, as its record keeps it and every reader shows it:
//! `GET /jobs/{id}`, a reverse-ETL run, the job's event stream and page,
//! and the OpenAPI description, all from these types.
//!
//! A queued job has none yet (`{}`); a sync or reset counts per stream
//! ([`SyncProgress`]), and once an attempt ended says where every record
//! it read went ([`SyncLedger`]); a reverse-ETL run counts per verdict in
//! phases ([`RunProgress`]).

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
    /// Where the records the last attempt read went, once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<SyncLedger>,
    /// The ledgers of the job's earlier attempts that ended (failed, to be
    /// retried), oldest first: with `ledger`, where every record the whole
    /// job read went. An attempt whose server was killed left none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_ledgers: Vec<SyncLedger>,
}

impl SyncProgress {
    /// The ledgers of the attempts before `attempt`, as the job's progress
    /// holds them now (the last attempt's ledger, once it ended, and the
    /// ones before it).
    pub fn ledgers_before(progress: &JobProgress, attempt: u32) -> Vec<SyncLedger> {
        let Some(sync) = progress.sync() else { return Vec::new() };
        let mut earlier = sync.earlier_ledgers.clone();
        earlier.extend(sync.ledger.clone());
        earlier.retain(|l| l.attempt < attempt);
        earlier
    }
}

/// Where every record one attempt of a sync read went, per stream: each
/// was loaded, quarantined, deduplicated, or is left to the next attempt,
/// which reads it again from the last saved state. A ledger that does not
/// balance fails the job: a record went somewhere nothing counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SyncLedger {
    /// The attempt it counts (1 for the first).
    pub attempt: u32,
    /// Whether every stream balances: read = loaded + quarantined +
    /// deduplicated + left to retry.
    pub balanced: bool,
    /// Per stream, by name.
    pub streams: BTreeMap<String, StreamLedger>,
}

/// One stream's ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamLedger {
    /// Records the connector emitted.
    pub read: u64,
    /// Rows the destination stored, as it counted them (rows it inserted
    /// or replaced; a lakehouse's committed data files' row counts).
    pub loaded: u64,
    /// Rows loaded with a value set to null by the stream's contract (of
    /// `loaded`).
    pub value_discarded: u64,
    /// Records kept aside by the stream's contract instead of loaded.
    pub quarantined: u64,
    /// Records replaced, before they were written, by a later copy of the
    /// same primary key in the same batch (deduplicated mode).
    pub deduplicated: u64,
    /// Records this attempt read and did not store before it ended
    /// (failed or stopped): the next attempt reads them again from the
    /// last saved state.
    pub left_to_retry: u64,
    /// Records nothing accounts for: 0 unless something lost (or wrote
    /// twice) what was read.
    pub unaccounted: i64,
    /// The snapshots the stream committed to an Iceberg table, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshot_ids: Vec<i64>,
}

impl SyncLedger {
    /// The ledger of attempt `attempt` from its streams' ledgers.
    pub fn new(attempt: u32, streams: BTreeMap<String, StreamLedger>) -> SyncLedger {
        SyncLedger { attempt, balanced: streams.values().all(StreamLedger::balances), streams }
    }

    /// The first stream whose records are not all accounted for, in a
    /// sentence with its counts.
    pub fn imbalance(&self) -> Option<String> {
        let (name, s) = self.streams.iter().find(|(_, s)| !s.balances())?;
        Some(format!(
            "the ledger of stream {name} does not balance: {} read, {} loaded, {} quarantined, {} deduplicated, {} unaccounted",
            s.read, s.loaded, s.quarantined, s.deduplicated, s.unaccounted
        ))
    }
}

impl StreamLedger {
    /// The ledger of a stream that read `read` records, of which the
    /// destination stored `loaded` and the batches dropped `deduplicated`
    /// as earlier copies of a key. `ended_well`: the stream read and wrote
    /// everything, so nothing is left to a retry and every record must be
    /// accounted for; otherwise what was not stored is left to the retry
    /// (but never fewer than nothing: rows stored twice stay unaccounted).
    pub fn settle(read: u64, loaded: u64, deduplicated: u64, quarantined: u64, ended_well: bool) -> StreamLedger {
        let accounted = i128::from(loaded) + i128::from(deduplicated) + i128::from(quarantined);
        let rest = i128::from(read) - accounted;
        let left_to_retry = if ended_well { 0 } else { u64::try_from(rest).unwrap_or(0) };
        let unaccounted = rest - i128::from(left_to_retry);
        StreamLedger {
            read,
            loaded,
            value_discarded: 0,
            quarantined,
            deduplicated,
            left_to_retry,
            unaccounted: i64::try_from(unaccounted).unwrap_or(i64::MAX),
            snapshot_ids: Vec::new(),
        }
    }

    /// Whether every record read is accounted for.
    pub fn balances(&self) -> bool {
        self.unaccounted == 0
    }
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
            ledger: Some(SyncLedger {
                attempt: 2,
                balanced: true,
                streams: BTreeMap::from([("items".to_owned(), StreamLedger::settle(4, 3, 1, 0, true))]),
            }),
            earlier_ledgers: vec![SyncLedger {
                attempt: 1,
                balanced: true,
                streams: BTreeMap::from([("items".to_owned(), StreamLedger::settle(4, 1, 0, 0, false))]),
            }],
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
        assert_eq!(read.sync().unwrap().ledger, None, "progress saved before ledgers existed has none");
    }

    /// What a stream read must all be somewhere: stored, dropped as an
    /// earlier copy of a key, quarantined, or (only when it did not end
    /// well) left to the retry. A record missing, or stored twice, is
    /// unaccounted either way.
    #[test]
    fn a_ledger_balances_only_when_every_record_read_is_accounted_for() {
        let whole = StreamLedger::settle(10, 7, 2, 1, true);
        assert!(whole.balances());
        assert_eq!((whole.left_to_retry, whole.unaccounted), (0, 0));
        let lost = StreamLedger::settle(10, 7, 2, 0, true);
        assert!(!lost.balances(), "a record read and stored nowhere");
        assert_eq!(lost.unaccounted, 1);
        let twice = StreamLedger::settle(10, 11, 0, 0, true);
        assert_eq!(twice.unaccounted, -1, "a row stored twice");
        let cut = StreamLedger::settle(10, 4, 1, 0, false);
        assert!(cut.balances());
        assert_eq!((cut.left_to_retry, cut.unaccounted), (5, 0), "a failed read leaves the rest to the retry");
        let cut_twice = StreamLedger::settle(10, 12, 0, 0, false);
        assert_eq!(
            (cut_twice.left_to_retry, cut_twice.unaccounted),
            (0, -2),
            "a retry cannot explain rows stored twice"
        );
    }
}
