//! One replay job: the records each stream's contract kept aside are
//! judged again, by the stream's contract and schema as they are now.
//! Those that fit load into the stream's table; the rest stay aside with
//! their new reason.
//!
//! Exactly once, page by page: a replayed record's row is keyed by its
//! rejection (in deduplicated mode, by its primary key, as the stream's
//! rows are), so a replay cut short and run again writes the same row
//! again instead of another; its rejected row is deleted only once the
//! record is loaded. A record that stays aside is written again under its
//! rejection, which replaces its row. Only databases replay: a file cannot
//! replace a line.

use std::collections::BTreeMap;

use serde_json::Value;

use super::quarantine::{rejected_again, rejected_loader};
use super::sync::{Prepared, prepare};
use super::{CancellationToken, Failure};
use crate::state::AppState;
use crate::store::jobs::Job;
use crate::store::kinds::{ContractRule, RejectionReason};
use crate::store::pipelines::{StreamSelection, StreamSyncMode};
use crate::store::progress::{JobProgress, StreamLedger, StreamProgress, StreamStatus, SyncLedger, SyncProgress};
use crate::warehouse::contract::{Breach, Contract, REJECTED_COLUMNS, rejected_stream};
use crate::warehouse::{Loader, WriteError, Written};

/// Rejected rows judged and written at a time.
const PAGE: usize = 500;

/// The field a replayed record of a stream without a primary key in use
/// is keyed by (a `_service_` field: never a column).
const REPLAY_KEY: &str = "_service_replay";

/// What one stream's replay did.
#[derive(Debug, Default)]
struct Replayed {
    read: u64,
    loaded: u64,
    deduplicated: u64,
    kept: u64,
    value_discarded: u64,
    ended_well: bool,
}

pub(super) async fn execute(
    state: &AppState,
    job: &Job,
    owner: &str,
    cancel: &CancellationToken,
) -> Result<(), Failure> {
    let prepared = prepare(state, job, owner).await?;
    if !prepared.writer.deduplicates() {
        return Err(Failure::Permanent("only database destinations replay rejected rows".into()));
    }
    let mut replayed: BTreeMap<String, Replayed> = BTreeMap::new();
    let mut outcome = Ok(());
    for sel in &prepared.pipeline.streams {
        let done = replayed.entry(sel.name.clone()).or_default();
        if let Err(e) = replay_stream(&prepared, sel, cancel, done).await {
            outcome = Err(Failure::of(format!("stream {}: {e}", sel.name), crate::retry::Transient::is_transient(&e)));
            break;
        }
        done.ended_well = true;
    }
    let attempt = u32::try_from(job.attempts).unwrap_or(u32::MAX);
    let ledger = SyncLedger::new(
        attempt,
        replayed
            .iter()
            .map(|(name, r)| {
                let mut l = StreamLedger::settle(r.read, r.loaded, r.deduplicated, r.kept, r.ended_well);
                l.value_discarded = r.value_discarded;
                (name.clone(), l)
            })
            .collect(),
    );
    if outcome.is_ok()
        && let Some(imbalance) = ledger.imbalance()
    {
        outcome = Err(Failure::Permanent(format!("replay: {imbalance}")));
    }
    let streams = replayed
        .iter()
        .map(|(name, r)| {
            let stream = StreamProgress {
                records: r.loaded,
                bytes: 0,
                records_read: r.read,
                bytes_read: 0,
                records_per_second: 0.0,
                checkpointed_at: None,
                records_remaining: None,
                status: StreamStatus::Done,
            };
            (name.clone(), stream)
        })
        .collect();
    let progress = JobProgress::Sync(SyncProgress {
        records: replayed.values().map(|r| r.loaded).sum(),
        bytes: 0,
        streams,
        ledger: Some(ledger),
    });
    let _ = state.store.job_progress(&job.job_id, &progress).await;
    if let Ok(w) = std::sync::Arc::try_unwrap(prepared.writer) {
        w.close().await;
    }
    outcome
}

/// Replays one stream's rejected rows, page by page.
async fn replay_stream(
    prepared: &Prepared,
    sel: &StreamSelection,
    cancel: &CancellationToken,
    done: &mut Replayed,
) -> Result<(), WriteError> {
    let Prepared { pipeline, catalog, writer, .. } = prepared;
    let table = rejected_stream(&sel.name);
    let offered = catalog.iter().find(|c| c.name == sel.name);
    let schema = offered.map(|o| o.json_schema.clone()).unwrap_or(Value::Null);
    let deduplicated = sel.sync_mode == StreamSyncMode::IncrementalDeduped;
    let primary_key: Vec<String> = if deduplicated {
        sel.primary_key.clone().or_else(|| offered.map(|o| o.primary_key.clone())).unwrap_or_default()
    } else {
        vec![REPLAY_KEY.to_owned()]
    };
    let keyed: &[String] = if deduplicated { &primary_key } else { &[] };
    let contract = Contract::new(sel.contract.unwrap_or_default(), &schema, keyed);
    writer.begin_stream(&pipeline.pipeline_id, &sel.name, StreamSyncMode::IncrementalDeduped, &schema).await?;
    let mut main =
        Loader::new(writer.clone(), &pipeline.pipeline_id, &sel.name, StreamSyncMode::IncrementalDeduped, primary_key);
    let mut aside = rejected_loader(writer, &pipeline.pipeline_id, &sel.name);
    let mut after = String::new();
    loop {
        if cancel.is_cancelled() {
            return Err(WriteError::Refused("the job was cancelled".into()));
        }
        let rows = writer.rows_after(&table, &REJECTED_COLUMNS, &after, PAGE).await?;
        let Some((last, _)) = rows.last() else { return Ok(()) };
        after = last.clone();
        done.read += rows.len() as u64;
        let (mut loads, mut loaded_keys, mut kept) = (Vec::new(), Vec::new(), Vec::new());
        for (key, row) in &rows {
            let record = row.get("record").and_then(Value::as_str).unwrap_or_default();
            match judge(contract.as_ref(), record) {
                Ok((record, discarded)) => {
                    done.value_discarded += u64::from(discarded);
                    let id = row.get("rejection_id").and_then(Value::as_str).unwrap_or(key);
                    loads.push(if deduplicated { record } else { keyed_by(&record, id) });
                    loaded_keys.push(key.clone());
                }
                Err(breach) => kept.push(rejected_again(row, &breach)),
            }
        }
        let stored = |w: [Written; 2]| w.iter().map(|w| w.stored).sum::<u64>();
        if !loads.is_empty() {
            let written = main.write(loads).await?;
            let settled = main.settle().await?;
            done.deduplicated += written.deduplicated + settled.deduplicated;
            done.loaded += stored([written, settled]);
        }
        if !kept.is_empty() {
            let written = aside.write(kept).await?;
            let settled = aside.settle().await?;
            done.kept += written.deduplicated + settled.deduplicated;
            done.kept += stored([written, settled]);
        }
        writer.delete_rows(&table, &loaded_keys).await?;
    }
}

/// A rejected record judged again: what to load (and whether a value was
/// left out of it), or the breach that keeps it aside. A record that is
/// not an object stays aside whatever the contract says: no table takes it.
fn judge(contract: Option<&Contract>, record: &str) -> Result<(String, bool), Breach> {
    if serde_json::from_str::<serde_json::Map<String, Value>>(record).is_err() {
        return Err(Breach {
            rule: ContractRule::InvalidRecords,
            reason: RejectionReason::NotAnObject,
            pointer: String::new(),
        });
    }
    let Some(contract) = contract else { return Ok((record.to_owned(), false)) };
    let mut judged = contract.judge(vec![record.to_owned()])?;
    if let Some(rejected) = judged.rejected.pop() {
        return Err(rejected.breach);
    }
    let loaded = judged.load.pop().unwrap_or_else(|| record.to_owned());
    Ok((loaded, judged.value_discarded > 0))
}

/// `record` (an object) with the replay key `id` as its first field.
fn keyed_by(record: &str, id: &str) -> String {
    let body = record.trim_start().strip_prefix('{').unwrap_or(record);
    let separator = if body.trim_start().starts_with('}') { "" } else { "," };
    format!("{{\"{REPLAY_KEY}\":{}{separator}{body}", Value::from(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replay key goes first, into empty and spaced objects alike, and
    /// the record stays valid JSON with its fields.
    #[test]
    fn a_replayed_record_is_keyed_by_its_rejection() {
        for (record, fields) in [("{}", 1), (" { \"a\": 1 }", 2), ("{\"a\":{\"b\":[1,2]},\"c\":null}", 3)] {
            let keyed: serde_json::Map<String, Value> = serde_json::from_str(&keyed_by(record, "r\"1")).unwrap();
            assert_eq!(keyed.len(), fields, "{record}");
            assert_eq!(keyed[REPLAY_KEY], "r\"1");
        }
    }

    /// Without a contract every object loads as it is; anything else
    /// stays aside.
    #[test]
    fn a_record_that_is_no_object_stays_aside_whatever_the_contract() {
        assert_eq!(judge(None, r#"{"a": 1}"#), Ok((r#"{"a": 1}"#.to_owned(), false)));
        assert_eq!(judge(None, "[1]").unwrap_err().reason, RejectionReason::NotAnObject);
    }
}
