//! One activation run: the diff of the model against the activation's
//! diff state, then the sends, committing the state key by key only for
//! what the destination accepted.
//!
//! The diff streams the model once, keeping per key only a 128-bit hash,
//! the fingerprint last accepted and a few flags, so a model of a million
//! rows needs tens of megabytes, never the rows. What was accepted before
//! comes from the snapshot the last run left (25 bytes a key, in a few
//! chunks) while nothing has written to the state since; otherwise from
//! the state's rows, key by key. A run that ends leaves the state it
//! stored, as it knows it, as the next snapshot. Rows to send are kept in
//! memory while they fit and spooled beyond that (see [`super::spool`]),
//! so the warehouse query ends with the diff however slow the destination.
//! A key whose row appears more than once, or is null, is invalid and
//! never sent; so is a row holding a value over the run's value cap or
//! whose mapped fields exceed [`RECORD_BYTES`].
//!
//! Bounded: a model returning more rows than a run may take
//! (`SERVICE_RETL_MAX_ROWS`) fails the run before anything is sent, and
//! the spool never passes the workspace's share. A cancellation stops the
//! run at once, also while it waits for the warehouse or for a
//! destination's `Retry-After`.
//!
//! A run that stops part way (a crash, a lost lease, a transient failure)
//! has kept what was accepted, so the next attempt sends only what is
//! left: a changed row's new fingerprint is already recorded, and a full
//! resync skips keys its own earlier attempt had accepted unchanged.
//!
//! In mirror mode, keys accepted before whose rows left the model are
//! removed at the destination, by the matching value they were sent with,
//! unless a row still in the model has that value (its key changed, not
//! its record): then the old key is only forgotten.
//!
//! The phases, in order: [`prepare`] (the activation, model and
//! destination), [`Run::diff`] (each row's [`verdict`]), then
//! [`Run::send_changed`] and, in mirror mode, [`Run::remove_gone`]; the
//! job shows its phase and counts as a typed [`RunProgress`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::spool::{Spool, SpoolBudget};
use super::{CancellationToken, Failure};
use crate::reverse_etl::mapping::Mapper;
use crate::reverse_etl::targets::{Op, SendError, Target};
use crate::state::AppState;
use crate::store::jobs::Job;
use crate::store::kinds::{ActivationMode, JobKind};
use crate::store::progress::{JobProgress, RowSample, RunCounts, RunPhase, RunProgress};
use crate::store::reverse_etl::{Activation, KeyOutcome, Model, SnapshotKey};
use crate::warehouse::query::ModelRows;

/// The largest record (mapped fields as JSON) a run sends.
pub(crate) const RECORD_BYTES: usize = 1024 * 1024;
/// The most record bytes in one batch to a destination.
const BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Samples of failed and of invalid rows kept at most.
const SAMPLES: usize = 100;
/// How often a run's progress is saved at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

fn permanent(m: impl Into<String>) -> Failure {
    Failure::Permanent(m.into())
}

/// The run stopped because it was cancelled (or lost its lease).
fn cancelled() -> Failure {
    SendError::Cancelled.into()
}

/// Samples of failed and invalid rows, and the counts, as the job shows
/// them.
#[derive(Default)]
struct Report {
    counts: RunCounts,
    failed: Vec<RowSample>,
    invalid: Vec<RowSample>,
    diff_ms: u64,
}

impl Report {
    fn sample(list: &mut Vec<RowSample>, key: Option<&str>, reason: &str) {
        if list.len() < SAMPLES {
            list.push(RowSample { key: key.map(str::to_owned), reason: crate::reverse_etl::targets::short(reason) });
        }
    }

    fn snapshot(&self, phase: RunPhase) -> JobProgress {
        JobProgress::Run(RunProgress {
            phase,
            counts: self.counts.clone(),
            diff_ms: self.diff_ms,
            failed_samples: self.failed.clone(),
            invalid_samples: self.invalid.clone(),
        })
    }
}

/// What the diff knows about a key (16 bytes: a million keys fit in
/// some 70 MB of table).
#[derive(Clone, Copy, Default)]
struct Known {
    /// The fingerprint last accepted, if `accepted`.
    fingerprint: i64,
    accepted: bool,
    failed: bool,
    /// Accepted by an earlier attempt of this run.
    mine: bool,
    /// Times seen in this run's model (saturating).
    seen: u8,
    /// What its first row became.
    first: Verdict,
    /// Held in the diff state (as loaded, or kept by this run): part of
    /// the snapshot this run leaves.
    stored: bool,
}

impl Known {
    /// The state's record of a key, as loaded.
    fn loaded(fingerprint: Option<i64>, failed: bool, mine: bool) -> Known {
        Known {
            fingerprint: fingerprint.unwrap_or(0),
            accepted: fingerprint.is_some(),
            failed,
            mine,
            stored: true,
            ..Known::default()
        }
    }
}

/// Applies outcomes just kept in the diff state to what the run knows,
/// so the snapshot it leaves is the state as stored.
fn keep(known: &mut HashMap<u128, Known>, outcomes: &[KeyOutcome]) {
    for outcome in outcomes {
        match outcome {
            KeyOutcome::Sent { key, fingerprint, .. } => {
                let k = known.entry(key_hash(key)).or_default();
                (k.fingerprint, k.accepted, k.failed, k.stored) = (*fingerprint, true, false, true);
            }
            KeyOutcome::Failed { key, .. } => {
                let k = known.entry(key_hash(key)).or_default();
                (k.failed, k.stored) = (true, true);
            }
            KeyOutcome::Removed { key } => {
                if let Some(k) = known.get_mut(&key_hash(key)) {
                    (k.fingerprint, k.accepted, k.failed, k.stored) = (0, false, false, false);
                }
            }
        }
    }
}

/// What becomes of a row of the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
enum Verdict {
    /// As last accepted: not sent.
    #[default]
    Unchanged,
    /// A key never accepted: sent as new.
    Add,
    /// A key whose row differs from what was accepted (or whose last send
    /// failed): sent again.
    Change,
    /// Changed, but the activation only inserts: not sent.
    Skipped,
}

/// The verdict on a row seen once in the model, from what is known of
/// its key, the fingerprint of its mapped fields, the activation's mode and
/// whether the run is a full resync.
fn verdict(known: &Known, fingerprint: i64, mode: ActivationMode, full: bool) -> Verdict {
    match known.accepted {
        false => Verdict::Add,
        true if mode == ActivationMode::InsertOnly => Verdict::Skipped,
        true if known.failed => Verdict::Change,
        // A full resync sends every key again, but those an earlier
        // attempt of this very run had accepted as they are.
        true if full && known.mine && known.fingerprint == fingerprint => Verdict::Unchanged,
        true if full => Verdict::Change,
        true if known.fingerprint != fingerprint => Verdict::Change,
        true => Verdict::Unchanged,
    }
}

/// A key (or a matching value) as the diff holds it.
fn key_hash(key: &str) -> u128 {
    let digest = Sha256::digest(key.as_bytes());
    u128::from_le_bytes(digest[..16].try_into().expect("sixteen bytes"))
}

/// A row to send.
#[derive(Serialize, Deserialize)]
struct Pending {
    key: String,
    record: Map<String, Value>,
    fingerprint: i64,
    verdict: Verdict,
    /// The size of its record as JSON.
    bytes: usize,
}

struct Run<'a> {
    state: &'a AppState,
    job: &'a Job,
    activation_id: &'a str,
    target: Target,
    mapper: Mapper,
    report: Report,
    saved: Instant,
    cancel: &'a CancellationToken,
    /// The diff state's version as this run will have left it: as loaded,
    /// moved by each of its own writes.
    version: i64,
}

/// What a run reads before it diffs: its activation, its model, and its
/// destination opened for sending.
struct Prepared {
    activation: Activation,
    model: Model,
    target: Target,
}

/// What the diff leaves for the sends and removals.
struct Diffed {
    /// Every key known before the run or seen in the model.
    known: HashMap<u128, Known>,
    /// Matching values of the rows in the model (mirror mode): a record
    /// one of them still names is never removed.
    live: HashSet<u128>,
    /// The rows to send.
    pending: Spool,
}

pub(super) async fn execute(
    state: &AppState,
    spool: &Arc<SpoolBudget>,
    job: &Job,
    cancel: &CancellationToken,
) -> Result<(), Failure> {
    let activation_id = job.activation_id.as_deref().ok_or_else(|| permanent("the run names no activation"))?;
    let Prepared { activation, model, target } = prepare(state, job, activation_id).await?;
    let started = Instant::now();
    let bounds = crate::reverse_etl::model::run_bounds(state);
    let opened = tokio::select! {
        opened = crate::reverse_etl::model::open(state, &job.workspace_id, &model.warehouse_id, &model.query, bounds) => opened,
        () = cancel.cancelled() => return Err(cancelled()),
    };
    let rows = opened?;
    let mapper = Mapper::new(&activation.mappings, &rows.columns, &model.primary_key, target.match_field())
        .map_err(|e| permanent(format!("{}: {}", e.field, e.message)))?;
    let mut run = Run {
        state,
        job,
        activation_id,
        target,
        mapper,
        report: Report::default(),
        saved: Instant::now(),
        cancel,
        version: 0,
    };
    let Diffed { mut known, live, pending } =
        run.diff(rows, activation.mode, Spool::new(spool.clone(), &job.workspace_id)).await?;
    run.report.diff_ms = started.elapsed().as_millis() as u64;
    run.progress(RunPhase::Sending, true).await;
    run.send_changed(pending, &mut known, activation.mode).await?;
    if activation.mode == ActivationMode::Mirror {
        run.remove_gone(&mut known, &live).await?;
    }
    run.leave_snapshot(&known).await;
    run.progress(RunPhase::Done, true).await;
    Ok(())
}

/// The activation, its model and its destination; a run whose activation,
/// model or destination is gone fails for good, while a control database
/// that cannot answer leaves it to be tried again.
async fn prepare(state: &AppState, job: &Job, activation_id: &str) -> Result<Prepared, Failure> {
    let ws = &job.workspace_id;
    let activation =
        state.store.activation(ws, activation_id).await?.ok_or_else(|| permanent("the activation no longer exists"))?;
    let model =
        state.store.model(ws, &activation.model_id).await?.ok_or_else(|| permanent("the model no longer exists"))?;
    let dest = state
        .store
        .retl_destination(ws, &activation.destination_id)
        .await?
        .ok_or_else(|| permanent("the destination no longer exists"))?;
    let target = Target::open(state, ws, &dest).await?;
    Ok(Prepared { activation, model, target })
}

/// Rows gathered for one call to the destination.
#[derive(Default)]
struct Batch {
    rows: Vec<Pending>,
    bytes: usize,
}

impl Batch {
    fn take(&mut self) -> Vec<Pending> {
        self.bytes = 0;
        std::mem::take(&mut self.rows)
    }
}

impl Run<'_> {
    fn stopped(&self) -> Result<(), Failure> {
        if self.cancel.is_cancelled() { Err(cancelled()) } else { Ok(()) }
    }

    async fn progress(&mut self, phase: RunPhase, now: bool) {
        if now || self.saved.elapsed() >= PROGRESS_EVERY {
            self.saved = Instant::now();
            let _ = self.state.store.job_progress(&self.job.job_id, &self.report.snapshot(phase)).await;
        }
    }

    /// The diff state: the snapshot the last run left while nothing has
    /// written to the state since, otherwise every key's row.
    async fn load_state(&mut self) -> Result<HashMap<u128, Known>, Failure> {
        let store = &self.state.store;
        self.version = store.diff_state_version(self.activation_id).await?;
        // Sized up front: growing a table of a million keys would hold the
        // old one and the new one at once.
        let stored = store.diff_state_len(self.activation_id).await?;
        let mut known: HashMap<u128, Known> =
            HashMap::with_capacity(usize::try_from(stored).unwrap_or(0).saturating_add(1024));
        // A snapshot's keys were never sent by this run: any send of this
        // run would have moved the version past it.
        let whole = store
            .diff_snapshot(self.activation_id, self.version, |k| {
                known.insert(k.key_hash, Known::loaded(k.fingerprint, k.failed, false));
            })
            .await?;
        if !whole {
            known.clear();
            store
                .diff_state(self.activation_id, &self.job.job_id, |key, s| {
                    known.insert(key_hash(&key), Known::loaded(s.fingerprint, s.failed, s.sent_by_this_run));
                })
                .await?;
        }
        Ok(known)
    }

    /// Leaves the diff state as this run stored it as a snapshot for the
    /// next run, unless another writer moved it meanwhile. Best effort: a
    /// run without a snapshot reads the rows.
    async fn leave_snapshot(&mut self, known: &HashMap<u128, Known>) {
        let count = known.values().filter(|k| k.stored).count() as u64;
        // Boxed: the closures' types would otherwise be part of the run's
        // future, which then cannot be shown to be `Send`.
        let keys: Box<dyn Iterator<Item = SnapshotKey> + Send + '_> =
            Box::new(known.iter().filter(|(_, k)| k.stored).map(|(hash, k)| SnapshotKey {
                key_hash: *hash,
                fingerprint: k.accepted.then_some(k.fingerprint),
                failed: k.failed,
            }));
        if let Err(e) = self.state.store.keep_diff_snapshot(self.activation_id, self.version, count, keys).await {
            tracing::warn!(activation = %self.activation_id, error = %e, "the diff state's snapshot was not kept");
        }
    }

    /// Keeps outcomes in the diff state and in what the run knows.
    async fn record(&mut self, known: &mut HashMap<u128, Known>, outcomes: &[KeyOutcome]) -> Result<(), Failure> {
        self.version += self.state.store.record_outcomes(self.activation_id, &self.job.job_id, outcomes).await?;
        keep(known, outcomes);
        Ok(())
    }

    /// Reads the model once against what was sent before: each row gets
    /// its [`verdict`], rows to send go to `pending`, invalid rows are
    /// counted and sampled.
    async fn diff(&mut self, mut rows: ModelRows, mode: ActivationMode, mut pending: Spool) -> Result<Diffed, Failure> {
        let full = self.job.kind == JobKind::ActivationResync;
        let max_rows = self.state.config.limits.reverse_etl.rows_per_run;
        let value_bytes = crate::reverse_etl::model::run_bounds(self.state).value_bytes;
        let mut known = self.load_state().await?;
        let mut live: HashSet<u128> = HashSet::new();
        loop {
            let batch = tokio::select! {
                batch = rows.next_batch() => batch,
                () = self.cancel.cancelled() => return Err(cancelled()),
            };
            let Some(batch) = batch? else { break };
            self.stopped()?;
            for row in batch {
                let counts = &mut self.report.counts;
                counts.queried += 1;
                if counts.queried > max_rows {
                    return Err(permanent(format!(
                        "the model returned more than {max_rows} rows, the most a run takes (SERVICE_RETL_MAX_ROWS); narrow the model or raise the limit. Nothing was sent"
                    )));
                }
                let Some(key) = self.mapper.key(&row) else {
                    counts.invalid += 1;
                    Report::sample(&mut self.report.invalid, None, "the primary key is null");
                    continue;
                };
                if mode == ActivationMode::Mirror
                    && let Some(v) = self.mapper.row_matching_value(&row)
                {
                    live.insert(key_hash(&v));
                }
                if let Some(size) = row.iter().find_map(crate::warehouse::query::oversize) {
                    // Invalid, like a row too large: never sent, never removed.
                    counts.invalid += 1;
                    Report::sample(
                        &mut self.report.invalid,
                        Some(&key),
                        &format!(
                            "a value takes {size} bytes; at most {value_bytes} are read (SERVICE_RETL_MAX_VALUE_BYTES)"
                        ),
                    );
                    let entry = known.entry(key_hash(&key)).or_default();
                    entry.seen = u8::MAX;
                    continue;
                }
                let (print, bytes) = self.mapper.fingerprint(&row);
                let entry = known.entry(key_hash(&key)).or_default();
                entry.seen = entry.seen.saturating_add(1);
                if entry.seen > 1 {
                    // Every row of a repeated key is invalid, its first too.
                    counts.invalid += 1;
                    if entry.seen == 2 {
                        counts.invalid += 1;
                        match entry.first {
                            Verdict::Unchanged => counts.unchanged -= 1,
                            Verdict::Skipped => counts.skipped -= 1,
                            Verdict::Add | Verdict::Change => {}
                        }
                        Report::sample(&mut self.report.invalid, Some(&key), "the primary key appears more than once");
                    }
                    continue;
                }
                if bytes > RECORD_BYTES {
                    // Invalid whatever was sent before; `seen` stays 1 and
                    // the verdict unchanged so the key is neither sent nor
                    // removed.
                    counts.invalid += 1;
                    Report::sample(
                        &mut self.report.invalid,
                        Some(&key),
                        &format!("the mapped fields take {bytes} bytes; at most {RECORD_BYTES} are sent"),
                    );
                    entry.seen = u8::MAX;
                    continue;
                }
                entry.first = verdict(entry, print, mode, full);
                match entry.first {
                    Verdict::Unchanged => counts.unchanged += 1,
                    Verdict::Skipped => counts.skipped += 1,
                    verdict @ (Verdict::Add | Verdict::Change) => {
                        let p = Pending { key, record: self.mapper.record(&row), fingerprint: print, verdict, bytes };
                        pending.push(&p).await?;
                    }
                }
            }
            self.progress(RunPhase::Diffing, false).await;
        }
        Ok(Diffed { known, live, pending })
    }

    /// Sends the rows of keys the model holds once, in batches.
    async fn send_changed(
        &mut self,
        pending: Spool,
        known: &mut HashMap<u128, Known>,
        mode: ActivationMode,
    ) -> Result<(), Failure> {
        let op = match mode {
            ActivationMode::Upsert | ActivationMode::Mirror => Op::Upsert,
            ActivationMode::UpdateOnly => Op::Update,
            ActivationMode::InsertOnly => Op::Insert,
        };
        let mut batch = Batch::default();
        let size = self.target.batch_size();
        let mut spooled = pending.read().await?;
        while let Some(p) = spooled.next::<Pending>().await? {
            if known.get(&key_hash(&p.key)).is_some_and(|k| k.seen == 1) {
                if batch.bytes + p.bytes > BATCH_BYTES || batch.rows.len() == size {
                    self.send(op, batch.take(), known).await?;
                }
                batch.bytes += p.bytes;
                batch.rows.push(p);
            }
        }
        self.send(op, batch.take(), known).await
    }

    /// Removes (mirror mode) the records of keys accepted before whose
    /// rows left the model, unless a row still in the model has their
    /// matching value: those keys are only forgotten.
    async fn remove_gone(&mut self, known: &mut HashMap<u128, Known>, live: &HashSet<u128>) -> Result<(), Failure> {
        let mut gone = Vec::new();
        let mut forget = Vec::new();
        self.state
            .store
            .sent_keys(self.activation_id, |key, destination_key| {
                if known.get(&key_hash(&key)).is_some_and(|k| k.seen > 0) {
                    return;
                }
                match destination_key {
                    Some(d) if !live.contains(&key_hash(&d)) => gone.push((key, d)),
                    _ => forget.push(KeyOutcome::Removed { key }),
                }
            })
            .await?;
        self.record(known, &forget).await?;
        for chunk in gone.chunks(self.target.batch_size()) {
            self.remove(chunk, known).await?;
        }
        Ok(())
    }

    /// Sends rows and keeps what became of each.
    async fn send(&mut self, op: Op, rows: Vec<Pending>, known: &mut HashMap<u128, Known>) -> Result<(), Failure> {
        if rows.is_empty() {
            return Ok(());
        }
        self.stopped()?;
        let records: Vec<(String, Map<String, Value>)> =
            rows.iter().map(|p| (p.key.clone(), p.record.clone())).collect();
        let answers = self
            .target
            .send(self.state, &self.job.workspace_id, (self.activation_id, &self.job.job_id), op, &records, self.cancel)
            .await?;
        let mut outcomes = Vec::with_capacity(rows.len());
        for (p, answer) in rows.into_iter().zip(answers) {
            match answer {
                None => {
                    match p.verdict {
                        Verdict::Add => self.report.counts.added += 1,
                        _ => self.report.counts.changed += 1,
                    }
                    let destination_key = self.mapper.matching_value(&p.record).or_else(|| Some(p.key.clone()));
                    outcomes.push(KeyOutcome::Sent { key: p.key, fingerprint: p.fingerprint, destination_key });
                }
                Some(reason) => {
                    self.report.counts.failed += 1;
                    Report::sample(&mut self.report.failed, Some(&p.key), &reason);
                    outcomes.push(KeyOutcome::Failed { key: p.key, reason });
                }
            }
        }
        self.record(known, &outcomes).await?;
        self.progress(RunPhase::Sending, false).await;
        Ok(())
    }

    /// Removes the records of keys that left the model.
    async fn remove(&mut self, gone: &[(String, String)], known: &mut HashMap<u128, Known>) -> Result<(), Failure> {
        self.stopped()?;
        let field = self.target.match_field().map(str::to_owned);
        let records: Vec<(String, Map<String, Value>)> = gone
            .iter()
            .map(|(key, destination_key)| {
                let mut fields = Map::new();
                if let Some(f) = &field {
                    fields.insert(f.clone(), Value::String(destination_key.clone()));
                }
                (key.clone(), fields)
            })
            .collect();
        let answers = self
            .target
            .send(
                self.state,
                &self.job.workspace_id,
                (self.activation_id, &self.job.job_id),
                Op::Delete,
                &records,
                self.cancel,
            )
            .await?;
        let mut outcomes = Vec::with_capacity(gone.len());
        for ((key, _), answer) in gone.iter().zip(answers) {
            match answer {
                None => {
                    self.report.counts.removed += 1;
                    outcomes.push(KeyOutcome::Removed { key: key.clone() });
                }
                Some(reason) => {
                    self.report.counts.failed += 1;
                    Report::sample(&mut self.report.failed, Some(key), &format!("not removed: {reason}"));
                    outcomes.push(KeyOutcome::Failed { key: key.clone(), reason });
                }
            }
        }
        self.record(known, &outcomes).await?;
        self.progress(RunPhase::Removing, false).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted(fingerprint: i64) -> Known {
        Known { fingerprint, accepted: true, ..Known::default() }
    }

    #[test]
    fn a_key_never_accepted_is_added() {
        for mode in [ActivationMode::Upsert, ActivationMode::InsertOnly, ActivationMode::Mirror] {
            assert_eq!(verdict(&Known::default(), 7, mode, false), Verdict::Add);
            assert_eq!(verdict(&Known::default(), 7, mode, true), Verdict::Add);
        }
    }

    #[test]
    fn a_changed_row_is_sent_again_and_an_unchanged_one_is_not() {
        assert_eq!(verdict(&accepted(7), 8, ActivationMode::Upsert, false), Verdict::Change);
        assert_eq!(verdict(&accepted(7), 7, ActivationMode::Upsert, false), Verdict::Unchanged);
        assert_eq!(verdict(&accepted(7), 8, ActivationMode::UpdateOnly, false), Verdict::Change);
    }

    #[test]
    fn an_insert_only_activation_skips_what_it_sent_before() {
        assert_eq!(verdict(&accepted(7), 8, ActivationMode::InsertOnly, false), Verdict::Skipped);
        assert_eq!(verdict(&accepted(7), 7, ActivationMode::InsertOnly, true), Verdict::Skipped);
    }

    #[test]
    fn a_key_whose_send_failed_is_sent_again_unchanged() {
        let failed = Known { failed: true, ..accepted(7) };
        assert_eq!(verdict(&failed, 7, ActivationMode::Upsert, false), Verdict::Change);
    }

    #[test]
    fn a_full_resync_sends_everything_but_what_its_own_earlier_attempt_sent() {
        assert_eq!(verdict(&accepted(7), 7, ActivationMode::Upsert, true), Verdict::Change);
        let mine = Known { mine: true, ..accepted(7) };
        assert_eq!(verdict(&mine, 7, ActivationMode::Upsert, true), Verdict::Unchanged);
        assert_eq!(verdict(&mine, 8, ActivationMode::Upsert, true), Verdict::Change);
    }
}
