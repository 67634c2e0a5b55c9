//! Loading one stream: each batch is prepared (off the async workers, and
//! judged there by the stream's contract where it has one),
//! then applied in the background, in order, with as many in flight as
//! the destination allows, and checkpoints come due only after the batches
//! before them.

use std::collections::VecDeque;
use std::sync::Arc;

use super::contract::{Breach, Contract, Judgement, Rejected, text_digest};
use super::shape::{AppendKeys, ReadTimes, shape_keyed};
use super::{WriteError, Writer};
use crate::store::Store;
use crate::store::kinds::{ContractMode, ContractRule, RejectionReason};
use crate::store::pipelines::StreamSyncMode;

/// Writes one stream's batches: each is prepared, then applied in the
/// background, in order, with as many in flight as the destination allows
/// for the sync mode, so the next batch is prepared while the last one is
/// in the database.
///
/// Preparing runs on the blocking pool: it is CPU work with no `.await`
/// in it, milliseconds per batch and tens of milliseconds for a group of
/// them ([`GROUP_BYTES`]), which on an async worker would hold up every
/// other task there (API requests, the source's HTTP transfers).
///
/// Checkpoints queue behind the batches emitted before them and come back
/// as [`Written::checkpoint`] once all of those are written, without
/// stopping the batches after them. Each is saved exactly once, by its
/// one owner: a lakehouse in the transaction of its commit, every other
/// destination here, once the batches before it are applied (given the
/// control database to save in, [`Loader::saving_states`]).
pub struct Loader {
    writer: Arc<Writer>,
    stream: Arc<StreamTarget>,
    limit: usize,
    in_flight: VecDeque<InFlight>,
    /// Where the checkpoints of a destination that does not save its own
    /// are saved.
    states: Option<Store>,
    /// How the records of an append are keyed, the next batch's first.
    keys: AppendKeys,
    /// Whether rows keep the read times their records carry.
    read_times: ReadTimes,
}

/// Where a stream's batches go and how they are keyed.
struct StreamTarget {
    pipeline_id: String,
    stream: String,
    mode: StreamSyncMode,
    primary_key: Vec<String>,
}

enum InFlight {
    Batch(tokio::task::JoinHandle<Result<Applied, WriteError>>),
    Checkpoint(String),
}

/// What one batch did once applied.
struct Applied {
    records: u64,
    bytes: u64,
    deduplicated: u64,
    /// Rows the destination stored, as it counted them (none yet for a
    /// lakehouse, which stores rows at its commits).
    stored: Option<u64>,
}

/// What finished writing since the last call.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Records and bytes of the batches applied.
    pub records: u64,
    pub bytes: u64,
    /// Of `records`: those replaced by a later copy of their key in their
    /// batch, so never written.
    pub deduplicated: u64,
    /// Rows the destination stored for them, as it counted them (0 for a
    /// lakehouse, which stores rows at its commits).
    pub stored: u64,
    /// The latest checkpoint whose data is all written, saved (when the
    /// loader saves states, and the mode keeps any).
    pub checkpoint: Option<String>,
}

impl Loader {
    pub fn new(
        writer: Arc<Writer>,
        pipeline_id: &str,
        stream: &str,
        mode: StreamSyncMode,
        primary_key: Vec<String>,
    ) -> Loader {
        let limit = writer.concurrent_batches(mode);
        let stream = StreamTarget { pipeline_id: pipeline_id.to_owned(), stream: stream.to_owned(), mode, primary_key };
        Loader {
            writer,
            stream: Arc::new(stream),
            limit,
            in_flight: Default::default(),
            states: None,
            keys: AppendKeys::Fresh,
            read_times: ReadTimes::Now,
        }
    }

    /// Keys the records of an append written from now on by where they
    /// were read: after `state` (`None`: from the start), each by its
    /// place since then and its text ([`AppendKeys::Seeded`]), so a read
    /// resumed from `state` that reads them again rewrites their rows.
    /// `replaces`: rows with these keys may exist already, written by an
    /// attempt that ended before it saved the state after them.
    pub(crate) fn key_appends_after(&mut self, state: Option<&str>, replaces: bool) {
        self.keys = AppendKeys::after(&self.stream.pipeline_id, &self.stream.stream, state, replaces);
    }

    /// The same loader, its rows keeping the time each record says it was
    /// read ([`ReadTimes::Carried`]): a replay's, whose records were read
    /// by an earlier sync.
    pub(crate) fn carrying_read_times(mut self) -> Loader {
        self.read_times = ReadTimes::Carried;
        self
    }

    /// The same loader, saving each checkpoint that comes due in `store`
    /// as the stream's state (a lakehouse saves its own, with its
    /// commits; a full refresh keeps none).
    pub fn saving_states(mut self, store: Store) -> Loader {
        self.states = Some(store);
        self
    }

    /// Where the record at `at` of the batch being written was read, as a
    /// rejected row is keyed ([`Rejected::place`]).
    fn place(&self, at: usize, record: &str) -> String {
        match self.stream.mode {
            StreamSyncMode::IncrementalAppend => self.keys.key(at, record),
            _ => text_digest(record),
        }
    }

    /// `written`, its checkpoint saved where this loader is its owner.
    async fn saved(&self, written: Written) -> Result<Written, WriteError> {
        let owner = !self.writer.commits_at_checkpoints() && self.stream.mode != StreamSyncMode::FullRefreshOverwrite;
        if let (Some(store), Some(state), true) = (&self.states, &written.checkpoint, owner) {
            store
                .save_stream_state(&self.stream.pipeline_id, &self.stream.stream, state)
                .await
                .map_err(|e| WriteError::Destination(format!("cannot save the stream state: {e}")))?;
        }
        Ok(written)
    }

    /// Prepares `records` and starts writing them, first waiting for
    /// earlier batches while too many are in flight. Returns what finished
    /// meanwhile, or the first failure. A batch too wide to lay out at
    /// once is written in halves, in order (so in deduplicated mode the
    /// last copy of a key still wins).
    pub async fn write(&mut self, records: Vec<String>) -> Result<Written, WriteError> {
        Ok(self.write_under(records, None).await?.0)
    }

    /// [`Loader::write`] under the stream's `contract`: its records judged
    /// as they are prepared, on the fields parsed for the destination.
    /// Returns what the contract did too: the records it kept aside,
    /// which are the caller's to write. A breach of a rule that freezes
    /// fails the batch before any of it is written.
    pub(crate) async fn write_under(
        &mut self,
        records: Vec<String>,
        contract: Option<&Arc<Contract>>,
    ) -> Result<(Written, Judgement), WriteError> {
        let mut written = Written::default();
        let mut judged = Judgement::default();
        // The parts still to write, the next one last.
        let mut parts = vec![records];
        // Whether the batch was fitted to its columns (a column widened,
        // the records with a value no column holds kept aside, or those
        // values made null), once at most.
        let mut refitted = false;
        let type_changes = contract.map_or(ContractMode::Evolve, |c| c.mode(ContractRule::TypeChanges));
        while let Some(records) = parts.pop() {
            let (writer, stream, judging, keys, read_times) =
                (self.writer.clone(), self.stream.clone(), contract.cloned(), self.keys, self.read_times);
            let (records, batch) = tokio::task::spawn_blocking(move || {
                let batch = writer.prepare(
                    &stream.pipeline_id,
                    &stream.stream,
                    &records,
                    stream.mode,
                    &stream.primary_key,
                    (keys, judging.as_deref(), read_times),
                );
                (records, batch)
            })
            .await
            .map_err(|e| WriteError::Destination(format!("preparing the batch stopped: {e}")))?;
            let (batch, judgement) = match batch {
                Ok(Some(prepared)) => prepared,
                // A single record is split no further.
                Ok(None) if records.len() > 1 => {
                    let mut first = records;
                    let second = first.split_off(first.len() / 2);
                    parts.extend([second, first]);
                    continue;
                }
                Ok(None) => {
                    return Err(WriteError::BadRecord(
                        "a record has more fields than a destination table can hold".into(),
                    ));
                }
                // A value its column cannot hold: where type changes evolve,
                // the destination may widen the column (its batches before
                // written first), and the batch is laid out again.
                Err(WriteError::BadRecord(m)) if type_changes == ContractMode::Evolve && !refitted => {
                    while !self.in_flight.is_empty() {
                        self.next(&mut written).await?;
                    }
                    if !self.writer.widen_for(&self.stream.stream, &records).await? {
                        return Err(WriteError::BadRecord(m));
                    }
                    refitted = true;
                    parts.push(records);
                    continue;
                }
                // Where they are quarantined, the records with such a value
                // (one the contract does not judge: a float beyond its
                // range, a column narrower than the stream declares) are
                // kept aside, and the rest laid out again.
                Err(WriteError::BadRecord(m)) if type_changes == ContractMode::Quarantine && !refitted => {
                    let (mut fit, aside) = (Vec::with_capacity(records.len()), judged.rejected.len());
                    for (at, record) in records.into_iter().enumerate() {
                        // What the contract keeps aside itself is judged
                        // again, with its own reason, when the rest is.
                        let judged_aside = contract.is_some_and(|c| {
                            c.judge(vec![record.clone()]).map_or(true, |one| !one.rejected.is_empty())
                        });
                        if judged_aside {
                            fit.push(record);
                            continue;
                        }
                        match self.writer.unfit(&self.stream.stream, &record, false)? {
                            Some(pointer) => {
                                let place = self.place(at, &record);
                                let breach = Breach {
                                    rule: ContractRule::TypeChanges,
                                    reason: RejectionReason::TypeMismatch,
                                    pointer,
                                };
                                judged.rejected.push(Rejected { record, breach, place });
                            }
                            None => fit.push(record),
                        }
                    }
                    if judged.rejected.len() == aside {
                        return Err(WriteError::BadRecord(m));
                    }
                    refitted = true;
                    parts.push(fit);
                    continue;
                }
                // Where they are discarded, such values are made null in
                // their records, as the contract's own verdict leaves them
                // (so a record's new text depends on it alone), and the
                // batch is laid out again. A key's value is never made null.
                Err(WriteError::BadRecord(m)) if type_changes == ContractMode::DiscardValue && !refitted => {
                    let (mut fit, mut discarded) = (Vec::with_capacity(records.len()), 0);
                    for (at, record) in records.into_iter().enumerate() {
                        let own = match contract {
                            None => Some(record.clone()),
                            // What the contract keeps aside (or freezes on)
                            // is judged again with the rest.
                            Some(c) => match c.judge(vec![record.clone()]) {
                                Ok(mut one) if one.rejected.is_empty() => one.load.pop(),
                                _ => None,
                            },
                        };
                        let fitted = match own {
                            Some(own) => {
                                self.writer.discard_unfit(&self.stream.stream, &own, &self.stream.primary_key)?
                            }
                            None => None,
                        };
                        let Some(fitted) = fitted else {
                            fit.push(record);
                            continue;
                        };
                        discarded += 1;
                        match contract.map(|c| c.judge(vec![fitted.clone()])) {
                            // A value made null that the contract requires:
                            // the record as read is kept aside, with why.
                            Some(Ok(mut one)) if !one.rejected.is_empty() => {
                                let Some(Rejected { breach, .. }) = one.rejected.pop() else { continue };
                                let place = self.place(at, &record);
                                judged.rejected.push(Rejected { record, breach, place });
                            }
                            // Counted when the batch is prepared (or frozen
                            // then, naming the field).
                            Some(Ok(one)) if one.value_discarded > 0 => fit.push(fitted),
                            Some(Err(_)) => fit.push(fitted),
                            _ => {
                                judged.value_discarded += 1;
                                fit.push(fitted);
                            }
                        }
                    }
                    if discarded == 0 {
                        return Err(WriteError::BadRecord(m));
                    }
                    refitted = true;
                    parts.push(fit);
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.keys = self.keys.advanced(records.len());
            judged.rejected.extend(judgement.rejected);
            judged.value_discarded += judgement.value_discarded;
            if batch.records == 0 {
                // The contract kept every record aside.
                continue;
            }
            while self.batches() >= self.limit {
                self.next(&mut written).await?;
            }
            let writer = self.writer.clone();
            self.in_flight.push_back(InFlight::Batch(tokio::spawn(async move {
                let (records, bytes, deduplicated) = (batch.records, batch.bytes, batch.deduplicated);
                let stored = writer.apply(batch).await?;
                Ok(Applied { records, bytes, deduplicated, stored })
            })));
        }
        Ok((self.saved(written).await?, judged))
    }

    /// Queues a checkpoint behind the batches written before it; returns
    /// it at once when there are none. Where batches are committed at
    /// checkpoints, waits for them and hands the checkpoint to the writer,
    /// which returns it once it is saved with their commit.
    pub(crate) async fn checkpoint(&mut self, state: String) -> Result<Written, WriteError> {
        if self.writer.commits_at_checkpoints() {
            let mut written = self.written().await?;
            written.checkpoint = self.writer.checkpoint(&self.stream.stream, state).await?;
            return Ok(written);
        }
        if self.in_flight.is_empty() {
            return self.saved(Written { checkpoint: Some(state), ..Written::default() }).await;
        }
        self.in_flight.push_back(InFlight::Checkpoint(state));
        Ok(Written::default())
    }

    /// Waits until every batch is written (and committed); what finished,
    /// or the first failure.
    pub async fn drain(&mut self) -> Result<Written, WriteError> {
        let mut written = self.written().await?;
        if let Some(state) = self.writer.flush(&self.stream.stream).await? {
            written.checkpoint = Some(state);
        }
        self.saved(written).await
    }

    /// In a deduplicated stream, the key of each of `records`' rows
    /// (`None`: a record that has none).
    pub(crate) fn keys_of(&self, records: &[String]) -> Vec<Option<String>> {
        let (mode, key) = (StreamSyncMode::IncrementalDeduped, &self.stream.primary_key);
        records.iter().map(|r| shape_keyed(r, mode, key, &self.keys, 0).ok().map(|s| s.raw_id)).collect()
    }

    /// In a deduplicated stream, the row the table holds now for each of
    /// `records`' keys (in their order; `None`: no row, or a record with
    /// no key), with `columns` as text. Batches still in flight are not
    /// looked at: settle them first.
    pub(crate) async fn current_rows(
        &self,
        records: &[String],
        columns: &[&str],
    ) -> Result<Vec<Option<serde_json::Map<String, serde_json::Value>>>, WriteError> {
        let keys = self.keys_of(records);
        let wanted: Vec<String> = keys.iter().flatten().cloned().collect();
        let found = self.writer.rows_with_keys(&self.stream.stream, columns, &wanted).await?;
        Ok(keys.into_iter().map(|k| k.and_then(|k| found.get(&k).cloned())).collect())
    }

    /// Waits until every batch queued so far is written, without ending
    /// the stream; what finished (the checkpoints they made due too).
    pub(crate) async fn settle(&mut self) -> Result<Written, WriteError> {
        let written = self.written().await?;
        self.saved(written).await
    }

    /// Waits until every batch is written.
    async fn written(&mut self) -> Result<Written, WriteError> {
        let mut written = Written::default();
        while !self.in_flight.is_empty() {
            self.next(&mut written).await?;
        }
        Ok(written)
    }

    /// Waits for the oldest batch, and takes the checkpoints it makes due.
    async fn next(&mut self, written: &mut Written) -> Result<(), WriteError> {
        self.take_due(written);
        if let Some(InFlight::Batch(task)) = self.in_flight.pop_front() {
            let applied =
                task.await.unwrap_or_else(|e| Err(WriteError::Destination(format!("the writer stopped: {e}"))))?;
            written.records += applied.records;
            written.bytes += applied.bytes;
            written.deduplicated += applied.deduplicated;
            written.stored += applied.stored.unwrap_or(0);
        }
        self.take_due(written);
        Ok(())
    }

    /// Batches being written now.
    fn batches(&self) -> usize {
        self.in_flight.iter().filter(|f| matches!(f, InFlight::Batch(_))).count()
    }

    /// Takes the checkpoints no unwritten batch precedes.
    fn take_due(&mut self, written: &mut Written) {
        while let Some(InFlight::Checkpoint(_)) = self.in_flight.front() {
            if let Some(InFlight::Checkpoint(state)) = self.in_flight.pop_front() {
                written.checkpoint = Some(state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::DestinationConfig;
    use super::super::tests::test_place;
    use super::*;

    /// A batch too wide to lay out at once is written in parts, in order:
    /// every record lands, and the last copy of a key still wins.
    #[tokio::test]
    async fn a_batch_too_wide_to_lay_out_is_written_in_parts_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let writer = std::sync::Arc::new(
            Writer::open(&DestinationConfig::Sqlite { file: "w.db".into() }, &test_place(dir.path()), None)
                .await
                .unwrap(),
        );
        let mut loader =
            Loader::new(writer.clone(), "p", "events", StreamSyncMode::IncrementalDeduped, vec!["id".into()]);
        // 500 columns and 9,000 keys: more than MAX_CELLS. Keys 1 to 3,000
        // come twice, once in each half.
        let wide =
            format!(r#"{{"id": 0, {}}}"#, (0..498).map(|i| format!(r#""f{i}": {i}"#)).collect::<Vec<_>>().join(", "));
        let records: Vec<String> =
            std::iter::once(wide).chain((1..=12_000).map(|k| format!(r#"{{"id": {}, "v": {k}}}"#, k % 9000))).collect();
        const { assert!(9000 * 500 > super::super::shape::MAX_CELLS) };
        let during = loader.write(records).await.unwrap().records;
        assert!(
            during > 0 && during < 12_001,
            "a first part was written before the last was queued ({during} records)"
        );
        assert_eq!(during + loader.drain().await.unwrap().records, 12_001);
        let Writer::Sql(crate::warehouse::tables::Tables {
            db: crate::warehouse::tables::Db::Sqlite(pool, ..), ..
        }) = &*writer
        else {
            panic!("an SQLite writer")
        };
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM events").fetch_one(pool).await.unwrap();
        assert_eq!(count, 9000);
        let rows: Vec<(String, String)> = sqlx::query_as("SELECT id, v FROM events WHERE id IN ('0', '1', '2999', '3000', '3001', '8999') ORDER BY CAST(id AS INTEGER)").fetch_all(pool).await.unwrap();
        let want: Vec<(String, String)> =
            [(0, 9000), (1, 9001), (2999, 11_999), (3000, 12_000), (3001, 3001), (8999, 8999)]
                .iter()
                .map(|(id, v)| (id.to_string(), v.to_string()))
                .collect();
        assert_eq!(rows, want, "each key holds its last copy");
    }

    #[tokio::test]
    async fn checkpoints_come_due_only_after_the_batches_before_them() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Writer::open(&DestinationConfig::Jsonl { directory: "out".into() }, &test_place(dir.path()), None)
            .await
            .unwrap();
        let mut loader =
            Loader::new(std::sync::Arc::new(writer), "p", "events", StreamSyncMode::IncrementalAppend, Vec::new());
        let batch = |n: usize| (0..n).map(|i| format!(r#"{{"id": {i}}}"#)).collect::<Vec<_>>();
        assert_eq!(
            loader.checkpoint("a".into()).await.unwrap().checkpoint.as_deref(),
            Some("a"),
            "nothing before it: due at once"
        );
        assert_eq!(loader.write(batch(2)).await.unwrap(), Written::default());
        assert_eq!(loader.checkpoint("b".into()).await.unwrap(), Written::default(), "its batch is still in flight");
        let after_first = loader.write(batch(3)).await.unwrap();
        assert_eq!((after_first.records, after_first.checkpoint.as_deref()), (2, Some("b")));
        loader.checkpoint("c".into()).await.unwrap();
        let rest = loader.drain().await.unwrap();
        assert_eq!((rest.records, rest.checkpoint.as_deref()), (3, Some("c")));
        let lines = std::fs::read_to_string(dir.path().join("exports/ws_test/out/events.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 5);
        assert!(loader.write(vec!["not json".to_owned()]).await.is_err(), "a bad record fails before it is queued");
    }
}
