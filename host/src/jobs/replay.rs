//! One replay job: the records each stream's contract kept aside are
//! judged again, by the stream's contract and schema as they are now.
//! Those that fit load into the stream's table; the rest stay aside with
//! their new reason. A pipeline replays only the rows it kept aside, in a
//! table another pipeline may share.
//!
//! Exactly once, page by page: a replayed record's row is keyed by its
//! rejection (in deduplicated mode, by its primary key, as the stream's
//! rows are), so a replay cut short and run again writes the same row
//! again instead of another; its rejected row is deleted only once the
//! record is loaded. In deduplicated mode a record whose key a newer
//! version has reached since (a later sync read it again, or another
//! rejected row holds a later one) is not loaded: it is counted as
//! deduplicated and its rejected row deleted, so a replay never puts an
//! older version over a newer one. Newer means a greater cursor value
//! where both versions have one, otherwise read later: a replayed row
//! keeps the time its record was read (not the time the replay wrote
//! it), so it ranks among its key's versions as that read does, for a
//! later page, a replay run again after one cut short, or a later replay.
//!
//! A record that stays aside is written again under its rejection: in a
//! database that replaces its row. A file cannot replace a line, so a
//! file's replay first loads every record that fits (a record whose
//! replay key the file holds already, loaded by a replay cut short, is
//! not loaded again), then rewrites the rejected file at once, under its
//! lock: the loaded records' lines left out, the others' with their new
//! reason. A file's replay reads the stream's file once, for the keys of
//! all its rejected lines. (A file only appends, so each line kept aside
//! is a rejection of its own.)
//!
//! A lakehouse cannot delete a row either: its replay reads the whole
//! rejected-rows table at once and ends in one catalog transaction that
//! commits the loaded records and swaps in the rewritten rejected-rows
//! table ([`replay_lake`]).

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

use super::quarantine::{contract_of, new_reason, rejected_again, rejected_as_read, rejected_loader, rejected_schema};
use super::sync::{Prepared, prepare};
use super::{CancellationToken, Failure};
use crate::state::AppState;
use crate::store::jobs::Job;
use crate::store::kinds::{ContractMode, ContractRule, RejectionReason};
use crate::store::pipelines::{StreamSelection, StreamSyncMode};
use crate::store::progress::{JobProgress, StreamLedger, StreamProgress, StreamStatus, SyncLedger, SyncProgress};
use crate::warehouse::contract::{Breach, Contract, REJECTED_COLUMNS, REJECTION_ID, rejected_stream};
use crate::warehouse::shape::READ_AT;
use crate::warehouse::{Loader, WriteError, Writer, Written};

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
    let lease = crate::store::jobs::JobLease { job_id: job.job_id.clone(), owner: owner.to_owned(), stream: None };
    let prepared = prepare(state, job, lease).await?;
    let mut replayed: BTreeMap<String, Replayed> = BTreeMap::new();
    let mut outcome = Ok(());
    for sel in &prepared.pipeline.streams {
        let done = replayed.entry(sel.name.clone()).or_default();
        let replay = if prepared.writer.commits_at_checkpoints() {
            replay_lake(&prepared, sel, cancel, done).await
        } else {
            replay_stream(&prepared, sel, cancel, done).await
        };
        if let Err(e) = replay {
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
        earlier_ledgers: SyncProgress::ledgers_before(&job.progress, attempt),
    });
    let _ = state.store.job_progress(&job.job_id, &progress).await;
    if let Ok(w) = std::sync::Arc::try_unwrap(prepared.writer) {
        w.close().await;
    }
    outcome
}

/// How `sel`'s records are judged again: the schema the source offers
/// for the stream, its primary key where it is deduplicated (none
/// otherwise), and its contract over them (`None`: every rule evolves).
fn judging(prepared: &Prepared, sel: &StreamSelection) -> (Value, Vec<String>, Option<Contract>) {
    let offered = prepared.catalog.iter().find(|c| c.name == sel.name);
    let schema = offered.map(|o| o.json_schema.clone()).unwrap_or(Value::Null);
    let primary_key: Vec<String> = match sel.sync_mode {
        StreamSyncMode::IncrementalDeduped => {
            sel.primary_key.clone().or_else(|| offered.map(|o| o.primary_key.clone())).unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let rules = contract_of(sel, prepared.default_contract, &schema).unwrap_or_default();
    let contract = Contract::new(rules, &schema, &primary_key);
    (schema, primary_key, contract)
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
    let (schema, keyed, contract) = judging(prepared, sel);
    let deduplicated = sel.sync_mode == StreamSyncMode::IncrementalDeduped;
    let primary_key = if deduplicated { keyed } else { vec![REPLAY_KEY.to_owned()] };
    let offered = catalog.iter().find(|c| c.name == sel.name);
    let cursor_field = sel.cursor_field.clone().or_else(|| offered.and_then(|o| o.default_cursor_field.clone()));
    writer.begin_stream(&pipeline.pipeline_id, &sel.name, StreamSyncMode::IncrementalDeduped, &schema).await?;
    // A replayed row keeps the time its record was read, so that it ranks
    // among the versions of its key as that read does, for this replay
    // and any later one.
    let mut main =
        Loader::new(writer.clone(), &pipeline.pipeline_id, &sel.name, StreamSyncMode::IncrementalDeduped, primary_key)
            .carrying_read_times();
    let mut aside = if writer.deduplicates() {
        Aside::Table(rejected_loader(writer, &pipeline.pipeline_id, &sel.name))
    } else {
        Aside::File(HashMap::new())
    };
    let loaded_before = match aside {
        Aside::File(_) if !deduplicated => loaded_before(writer, (&pipeline.pipeline_id, &table), &main).await?,
        _ => HashSet::new(),
    };
    let mut after = String::new();
    loop {
        if cancel.is_cancelled() {
            return Err(WriteError::Refused("the job was cancelled".into()));
        }
        let rows = writer.rows_after((&pipeline.pipeline_id, &table), &REJECTED_COLUMNS, &after, PAGE).await?;
        let Some((last, _)) = rows.last() else { break };
        after = last.clone();
        done.read += rows.len() as u64;
        let (mut loads, mut versions, mut loaded_keys, mut kept) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (key, row) in &rows {
            let record = row.get("record").and_then(Value::as_str).unwrap_or_default();
            let id = row.get(REJECTION_ID).and_then(Value::as_str).unwrap_or(key);
            match judge(contract.as_ref(), record) {
                Ok((record, discarded)) => {
                    done.value_discarded += u64::from(discarded);
                    let version = Version::rejected(row);
                    // Last, so that a field of the record's own cannot say it.
                    let record = with_field(&record, READ_AT, &version.read_at.into());
                    loads.push(if deduplicated { record } else { keyed_by(&record, id) });
                    versions.push(version);
                    loaded_keys.push((key.clone(), id.to_owned()));
                }
                Err(breach) => kept.push((row, breach)),
            }
        }
        // Loading a record a newer version replaced would put it over that
        // version; loading one a replay cut short loaded already (a file
        // cannot replace its line) would add it twice.
        let stale = if deduplicated {
            superseded(&main, &loads, &versions, cursor_field.as_deref()).await?
        } else if let Aside::File(_) = aside {
            main.keys_of(&loads).into_iter().map(|key| key.is_some_and(|k| loaded_before.contains(&k))).collect()
        } else {
            vec![false; loads.len()]
        };
        done.deduplicated += stale.iter().filter(|s| **s).count() as u64;
        let mut stale = stale.into_iter();
        loads.retain(|_| !stale.next().unwrap_or(false));
        let stored = |w: [Written; 2]| w.iter().map(|w| w.stored).sum::<u64>();
        if !loads.is_empty() {
            let written = main.write(loads).await?;
            let settled = main.settle().await?;
            done.deduplicated += written.deduplicated + settled.deduplicated;
            done.loaded += stored([written, settled]);
        }
        match &mut aside {
            Aside::Table(aside) => {
                if !kept.is_empty() {
                    let rows = kept.iter().map(|(row, breach)| rejected_again(row, breach)).collect();
                    let written = aside.write(rows).await?;
                    let settled = aside.settle().await?;
                    done.kept += written.deduplicated + settled.deduplicated;
                    done.kept += stored([written, settled]);
                }
                let positions: Vec<String> = loaded_keys.into_iter().map(|(at, _)| at).collect();
                writer.delete_rows(&table, &positions).await?;
            }
            Aside::File(changes) => {
                for (row, breach) in kept {
                    let id = row.get(REJECTION_ID).and_then(Value::as_str).unwrap_or_default();
                    changes.insert(id.to_owned(), Some(new_reason(&breach)));
                }
                changes.extend(loaded_keys.into_iter().map(|(_, id)| (id, None)));
            }
        }
    }
    if let Aside::File(changes) = aside {
        // The loads are written: the rejected lines change at once.
        let rewritten = writer.change_lines((&pipeline.pipeline_id, &table), REJECTION_ID, changes).await?;
        done.kept += rewritten.changed;
        let left_out = done.read.checked_sub(done.kept);
        if left_out != Some(rewritten.removed) {
            return Err(WriteError::Destination(format!(
                "{} rejected lines were left out of the file, {} were to be: the file changed during the replay",
                rewritten.removed,
                done.read.saturating_sub(done.kept)
            )));
        }
    }
    Ok(())
}

/// Replays one stream's rejected rows in a lakehouse, at once: the rows
/// are read from one version of the rejected-rows table, the records that
/// fit now are written to the stream's table, and the rows that stay
/// (the pipeline's with their new reason, other pipelines' as they were)
/// are written to a staged table that replaces the rejected-rows table in
/// the catalog transaction committing those records. A replay cut short
/// at any point has loaded all of them or none, and run again reads the
/// same rows. A lakehouse appends: every record that fits loads, as a
/// sync into it would have loaded it.
async fn replay_lake(
    prepared: &Prepared,
    sel: &StreamSelection,
    cancel: &CancellationToken,
    done: &mut Replayed,
) -> Result<(), WriteError> {
    let Prepared { pipeline, writer, .. } = prepared;
    let table = rejected_stream(&sel.name);
    let Some(aside) = writer.kept_aside(&table, &REJECTED_COLUMNS).await? else { return Ok(()) };
    let ours = Writer::meta_of(&pipeline.pipeline_id, &table);
    if !aside.rows.iter().any(|row| row.meta == ours) {
        // Other pipelines' rows only: nothing to rewrite.
        return Ok(());
    }
    let (schema, primary_key, contract) = judging(prepared, sel);
    // A value its column cannot hold as it is loads where type changes
    // evolve and the column can be widened to hold it (as a sync does).
    let type_changes = contract.as_ref().map_or(ContractMode::Evolve, |c| c.mode(ContractRule::TypeChanges));
    let widening = type_changes == ContractMode::Evolve;
    writer.begin_stream(&pipeline.pipeline_id, &sel.name, StreamSyncMode::IncrementalAppend, &schema).await?;
    let mut main =
        Loader::new(writer.clone(), &pipeline.pipeline_id, &sel.name, StreamSyncMode::IncrementalAppend, vec![]);
    // What stays aside, by the metadata of the rows' pipeline and stream.
    let mut kept: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut loads = Vec::new();
    for row in aside.rows {
        if row.meta != ours {
            kept.entry(row.meta).or_default().push(Value::Object(rejected_as_read(&row.fields)).to_string());
            continue;
        }
        done.read += 1;
        let record = row.fields.get("record").and_then(Value::as_str).unwrap_or_default();
        // A value the contract lets through that the table's column
        // cannot hold (nor, where type changes evolve, be widened to hold)
        // stays aside as a type change, or is made null where type
        // changes discard values.
        let judged = match judge(contract.as_ref(), record) {
            Ok((record, discarded)) => match writer.unfit(&sel.name, &record, widening)? {
                Some(pointer) if type_changes == ContractMode::DiscardValue => {
                    match writer.discard_unfit(&sel.name, &record, &primary_key)? {
                        // Judged again: a required value made null breaks
                        // the contract.
                        Some(fitted) => judge(contract.as_ref(), &fitted).map(|(fitted, _)| (fitted, true)),
                        // A key's value is never made null.
                        None => Err(Breach {
                            rule: ContractRule::TypeChanges,
                            reason: RejectionReason::TypeMismatch,
                            pointer,
                        }),
                    }
                }
                Some(pointer) => {
                    Err(Breach { rule: ContractRule::TypeChanges, reason: RejectionReason::TypeMismatch, pointer })
                }
                None => Ok((record, discarded)),
            },
            Err(breach) => Err(breach),
        };
        match judged {
            Ok((record, discarded)) => {
                done.value_discarded += u64::from(discarded);
                loads.push(record);
            }
            Err(breach) => {
                kept.entry(row.meta).or_default().push(rejected_again(&row.fields, &breach));
                done.kept += 1;
            }
        }
        if loads.len() >= PAGE {
            if cancel.is_cancelled() {
                return Err(WriteError::Refused("the job was cancelled".into()));
            }
            main.write(std::mem::take(&mut loads)).await?;
        }
    }
    if !loads.is_empty() {
        main.write(loads).await?;
    }
    main.settle().await?;
    if cancel.is_cancelled() {
        return Err(WriteError::Refused("the job was cancelled".into()));
    }
    let kept = kept.into_iter().collect();
    writer.end_replay((&pipeline.pipeline_id, &sel.name), &rejected_schema(), kept, aside.location).await?;
    done.loaded = writer.committed_records(&sel.name).unwrap_or_default();
    Ok(())
}

/// The replay keys of the pipeline's rejected lines in a file that the
/// stream's file holds already: records a replay cut short before its
/// rewrite appended. One read of each file, whatever their lengths.
async fn loaded_before(
    writer: &Writer,
    (pipeline_id, table): (&str, &str),
    main: &Loader,
) -> Result<HashSet<String>, WriteError> {
    let mut keyed = Vec::new();
    let mut after = String::new();
    loop {
        let rows = writer.rows_after((pipeline_id, table), &[REJECTION_ID], &after, PAGE).await?;
        let Some((last, _)) = rows.last() else { break };
        after = last.clone();
        keyed.extend(rows.iter().filter_map(|(_, row)| row.get(REJECTION_ID)?.as_str().map(|id| keyed_by("{}", id))));
    }
    let found = main.current_rows(&keyed, &[]).await?;
    Ok(main.keys_of(&keyed).into_iter().zip(found).filter_map(|(key, row)| row.and(key)).collect())
}

/// Where a replay keeps what still does not fit: a database's rejected
/// rows are written again by their key; a file's lines change once the
/// replay has read them all (by rejection: `None` leaves its lines out,
/// otherwise the new reason).
enum Aside {
    Table(Loader),
    File(HashMap<String, Option<serde_json::Map<String, Value>>>),
}

/// When a version of a record was read: its cursor's value (as text),
/// and the time it was read, in Unix ms.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    cursor: Option<String>,
    read_at: Option<i64>,
}

impl Version {
    /// The version a rejected row kept aside.
    fn rejected(row: &serde_json::Map<String, Value>) -> Version {
        let read_at = row
            .get("rejected_at")
            .and_then(Value::as_str)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_millis());
        Version { cursor: row.get("cursor").and_then(Value::as_str).map(str::to_owned), read_at }
    }

    /// The version a table's row holds (`cursor_field` read into
    /// `cursor`, `_service_extracted_at` into `read_at`).
    fn loaded(row: &serde_json::Map<String, Value>) -> Version {
        let text = |k: &str| row.get(k).and_then(Value::as_str);
        let read_at = text(EXTRACTED_AT).and_then(|t| t.parse().ok());
        Version { cursor: text(CURSOR).map(str::to_owned), read_at }
    }

    /// Whether this version is newer than `other`: by the cursor where
    /// both have one and they differ (as numbers where both are), then
    /// by when each was read.
    fn newer_than(&self, other: &Version) -> bool {
        if let (Some(a), Some(b)) = (&self.cursor, &other.cursor) {
            let order = match (a.parse::<f64>(), b.parse::<f64>()) {
                (Ok(a), Ok(b)) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
                _ => a.cmp(b),
            };
            if order != Ordering::Equal {
                return order == Ordering::Greater;
            }
        }
        self.read_at > other.read_at
    }
}

/// The column a table row's cursor is read into, and its time's.
const CURSOR: &str = "cursor";
const EXTRACTED_AT: &str = "_service_extracted_at";

/// Of the records a deduplicated stream's replay would load (with the
/// versions they were read as), those a newer version of their key has
/// superseded: the row the table holds now (a later sync read the key
/// again; a row a replay wrote holds the time its record was read), or
/// another record of the same page. Loading them would put an older
/// version over a newer one. Linear in the page.
async fn superseded(
    main: &Loader,
    records: &[String],
    versions: &[Version],
    cursor_field: Option<&str>,
) -> Result<Vec<bool>, WriteError> {
    let current = match cursor_field {
        Some(field) => main.current_rows(records, &[EXTRACTED_AT, field]).await?,
        None => main.current_rows(records, &[EXTRACTED_AT]).await?,
    };
    let current: Vec<Option<Version>> = current
        .into_iter()
        .map(|row| {
            row.map(|mut row| {
                if let Some(field) = cursor_field
                    && let Some(value) = row.remove(field)
                {
                    row.insert(CURSOR.to_owned(), value);
                }
                Version::loaded(&row)
            })
        })
        .collect();
    let mut stale = outdone_in_page(&main.keys_of(records), versions);
    for (i, (now, version)) in current.iter().zip(versions).enumerate() {
        stale[i] |= now.as_ref().is_some_and(|now| now.newer_than(version));
    }
    Ok(stale)
}

/// Of a page's records (their keys, and the versions they were read as),
/// those another record of their key outdoes: of the records of one key
/// the newest loads (of two alike, the later), exactly one whatever the
/// versions. A record without a key is outdone by none.
fn outdone_in_page(keys: &[Option<String>], versions: &[Version]) -> Vec<bool> {
    let mut newest: HashMap<&str, usize> = HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        if let Some(key) = key {
            let at = newest.entry(key.as_str()).or_insert(i);
            if !versions[*at].newer_than(&versions[i]) {
                *at = i;
            }
        }
    }
    keys.iter().enumerate().map(|(i, key)| key.as_ref().is_some_and(|key| newest[key.as_str()] != i)).collect()
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

/// `record` (an object) with `value` as its last field `name`: a field
/// given twice counts by its last, so a field of that name the record
/// holds itself cannot choose its row (the replay key) or its read time.
fn with_field(record: &str, name: &str, value: &Value) -> String {
    let body = record.trim_end().strip_suffix('}').unwrap_or(record).trim_end();
    let separator = if body.ends_with('{') { "" } else { "," };
    format!("{body}{separator}{}:{value}}}", Value::from(name))
}

/// `record` with the replay key `id` as its last field ([`with_field`]).
fn keyed_by(record: &str, id: &str) -> String {
    with_field(record, REPLAY_KEY, &id.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replay key goes last, into empty and spaced objects alike, and
    /// the record stays valid JSON with its fields; a replay key the record
    /// holds itself does not choose the row.
    #[test]
    fn a_replayed_record_is_keyed_by_its_rejection() {
        for (record, fields) in [("{}", 1), (" { \"a\": 1 } ", 2), ("{\"a\":{\"b\":[1,2]},\"c\":null}", 3), ("{ }", 1)]
        {
            let keyed: serde_json::Map<String, Value> = serde_json::from_str(&keyed_by(record, "r\"1")).unwrap();
            assert_eq!(keyed.len(), fields, "{record}");
            assert_eq!(keyed[REPLAY_KEY], "r\"1");
        }
        // Read as the loader reads a key (its last occurrence), as a map is.
        let chosen = keyed_by(r#"{"_service_replay":"theirs","a":1}"#, "ours");
        assert!(chosen.ends_with(r#","_service_replay":"ours"}"#), "{chosen}");
        let read: serde_json::Map<String, Value> = serde_json::from_str(&chosen).unwrap();
        assert_eq!(read[REPLAY_KEY], "ours");
    }

    /// A version is newer by its cursor (numbers as numbers) where both
    /// have one that differs, otherwise by when it was read.
    #[test]
    fn versions_are_ordered_by_cursor_then_by_when_they_were_read() {
        let v = |cursor: Option<&str>, read_at: Option<i64>| Version { cursor: cursor.map(str::to_owned), read_at };
        assert!(v(Some("2026-01-02T00:00:00Z"), Some(1)).newer_than(&v(Some("2026-01-01T00:00:00Z"), Some(9))));
        assert!(v(Some("10"), None).newer_than(&v(Some("9"), Some(5))), "numbers as numbers");
        assert!(v(Some("a"), Some(6)).newer_than(&v(Some("a"), Some(5))), "same cursor: the later read");
        assert!(!v(Some("a"), Some(5)).newer_than(&v(Some("a"), Some(5))), "alike: neither");
        assert!(v(None, Some(6)).newer_than(&v(Some("z"), Some(5))), "one cursor: by time");
        assert!(!v(None, None).newer_than(&v(None, Some(1))));
        let row = serde_json::json!({ "cursor": "c", "rejected_at": "2026-01-01T00:00:01.500Z" });
        assert_eq!(Version::rejected(row.as_object().unwrap()), v(Some("c"), Some(1_767_225_601_500)));
        let row = serde_json::json!({ "cursor": "c", "_service_extracted_at": "42" });
        assert_eq!(Version::loaded(row.as_object().unwrap()), v(Some("c"), Some(42)));
    }

    /// Of one key's records in a page exactly one loads: the newest, or of
    /// two alike the later; records without a key all load.
    #[test]
    fn of_each_key_in_a_page_only_the_newest_loads() {
        let v = |cursor: &str, read_at: i64| Version { cursor: Some(cursor.to_owned()), read_at: Some(read_at) };
        let key = |k: Option<&str>| k.map(str::to_owned);
        let keys = [key(Some("a")), key(None), key(Some("a")), key(Some("b")), key(Some("a")), key(None)];
        let versions = [v("3", 1), v("1", 1), v("2", 9), v("1", 1), v("3", 1), v("1", 1)];
        assert_eq!(outdone_in_page(&keys, &versions), [true, false, true, false, false, false]);
        // Versions no order ranks (each pair of cursors and times
        // disagrees around the circle): still exactly one of the key loads.
        let circle = [
            Version { cursor: Some("2".into()), read_at: Some(1) },
            Version { cursor: None, read_at: Some(2) },
            Version { cursor: Some("1".into()), read_at: Some(3) },
        ];
        let keys = [key(Some("k")), key(Some("k")), key(Some("k"))];
        assert_eq!(outdone_in_page(&keys, &circle).iter().filter(|o| !**o).count(), 1);
    }

    /// Without a contract every object loads as it is; anything else
    /// stays aside.
    #[test]
    fn a_record_that_is_no_object_stays_aside_whatever_the_contract() {
        assert_eq!(judge(None, r#"{"a": 1}"#), Ok((r#"{"a": 1}"#.to_owned(), false)));
        assert_eq!(judge(None, "[1]").unwrap_err().reason, RejectionReason::NotAnObject);
    }
}
