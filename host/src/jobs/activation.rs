//! One activation run: the diff of the model against the activation's
//! diff state, then the sends, committing the state key by key only for
//! what the destination accepted.
//!
//! The diff streams the model once, keeping per key only a 128-bit hash,
//! the fingerprint last accepted and a few flags, so a model of a million
//! rows needs tens of megabytes, never the rows. Rows to send are kept in
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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::spool::{Spool, SpoolBudget};
use super::{CancellationToken, Failure};
use crate::reverse_etl::mapping::Mapper;
use crate::reverse_etl::targets::{Op, SendError, Target};
use crate::state::AppState;
use crate::store::jobs::Job;
use crate::store::kinds::{ActivationMode, JobKind};
use crate::store::reverse_etl::KeyOutcome;

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

fn transient(e: impl std::fmt::Display) -> Failure {
    Failure::Transient(e.to_string())
}

/// The run stopped because it was cancelled (or lost its lease).
fn cancelled() -> Failure {
    permanent("the run was cancelled")
}

/// A run's counts, as `GET /reverse-etl/runs/{runId}` shows them.
#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct Counts {
    /// Rows the model returned.
    pub queried: u64,
    /// New keys the destination accepted.
    pub added: u64,
    /// Changed (or earlier failed) keys the destination accepted.
    pub changed: u64,
    /// Records removed because their rows left the model (mirror mode).
    pub removed: u64,
    pub unchanged: u64,
    /// Rows whose key is null or appears more than once, or that are too
    /// large: never sent.
    pub invalid: u64,
    /// Rows (or removals) the destination refused: sent again next run.
    pub failed: u64,
    /// Changed rows an insert-only activation does not send.
    pub skipped: u64,
}

/// One sample of a failed or invalid row.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    key: Option<String>,
    reason: String,
}

#[derive(Default)]
struct Report {
    counts: Counts,
    failed: Vec<Sample>,
    invalid: Vec<Sample>,
    diff_ms: u64,
}

impl Report {
    fn sample(list: &mut Vec<Sample>, key: Option<&str>, reason: &str) {
        if list.len() < SAMPLES {
            list.push(Sample { key: key.map(str::to_owned), reason: crate::reverse_etl::targets::short(reason) });
        }
    }

    fn to_json(&self, phase: &str) -> Value {
        json!({ "phase": phase, "counts": self.counts, "diff_ms": self.diff_ms, "failed_samples": self.failed, "invalid_samples": self.invalid })
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
}

#[derive(Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
enum Verdict {
    #[default]
    Unchanged,
    Add,
    Change,
    Skipped,
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
}

pub(super) async fn execute(
    state: &AppState,
    spool: &Arc<SpoolBudget>,
    job: &Job,
    cancel: &CancellationToken,
) -> Result<(), Failure> {
    let ws = &job.workspace_id;
    let activation_id = job.activation_id.as_deref().ok_or_else(|| permanent("the run names no activation"))?;
    let activation = state
        .store
        .activation(ws, activation_id)
        .await
        .map_err(transient)?
        .ok_or_else(|| permanent("the activation no longer exists"))?;
    let model = state
        .store
        .model(ws, &activation.model_id)
        .await
        .map_err(transient)?
        .ok_or_else(|| permanent("the model no longer exists"))?;
    let dest = state
        .store
        .retl_destination(ws, &activation.destination_id)
        .await
        .map_err(transient)?
        .ok_or_else(|| permanent("the destination no longer exists"))?;
    let target = Target::open(state, ws, &dest).await?;
    let full = job.kind == JobKind::ActivationResync;
    let mode = activation.mode;

    // The diff.
    let started = Instant::now();
    let bounds = crate::reverse_etl::model::run_bounds(state);
    let opened = tokio::select! {
        opened = crate::reverse_etl::model::open(state, ws, &model.warehouse_id, &model.query, bounds) => opened,
        () = cancel.cancelled() => return Err(cancelled()),
    };
    let mut rows = opened?;
    let mapper = Mapper::new(&activation.mappings, &rows.columns, &model.primary_key, target.match_field())
        .map_err(|e| permanent(format!("{}: {}", e.field, e.message)))?;
    let mut run =
        Run { state, job, activation_id, target, mapper, report: Report::default(), saved: Instant::now(), cancel };
    let max_rows = state.config.limits.reverse_etl.rows_per_run;
    // Sized up front: growing a table of a million keys would hold the
    // old one and the new one at once.
    let stored = state.store.diff_state_len(activation_id).await.map_err(transient)?;
    let mut known: HashMap<u128, Known> =
        HashMap::with_capacity(usize::try_from(stored).unwrap_or(0).saturating_add(1024));
    state
        .store
        .diff_state(activation_id, &job.job_id, |key, s| {
            let known_key = Known {
                fingerprint: s.fingerprint.unwrap_or(0),
                accepted: s.fingerprint.is_some(),
                failed: s.failed,
                mine: s.sent_by_this_run,
                ..Known::default()
            };
            known.insert(key_hash(&key), known_key);
        })
        .await
        .map_err(transient)?;
    // Matching values of the rows in the model (mirror mode): a record
    // one of them still names is never removed.
    let mut live: HashSet<u128> = HashSet::new();
    let mut spool = Spool::new(spool.clone(), ws);
    loop {
        let batch = tokio::select! {
            batch = rows.next_batch() => batch,
            () = cancel.cancelled() => return Err(cancelled()),
        };
        let Some(batch) = batch? else { break };
        run.stopped()?;
        for row in batch {
            let counts = &mut run.report.counts;
            counts.queried += 1;
            if counts.queried > max_rows {
                return Err(permanent(format!(
                    "the model returned more than {max_rows} rows, the most a run takes (SERVICE_RETL_MAX_ROWS); narrow the model or raise the limit. Nothing was sent"
                )));
            }
            let Some(key) = run.mapper.key(&row) else {
                counts.invalid += 1;
                Report::sample(&mut run.report.invalid, None, "the primary key is null");
                continue;
            };
            if mode == ActivationMode::Mirror
                && let Some(v) = run.mapper.row_matching_value(&row)
            {
                live.insert(key_hash(&v));
            }
            if let Some(size) = row.iter().find_map(crate::warehouse::query::oversize) {
                // Invalid, like a row too large: never sent, never removed.
                counts.invalid += 1;
                Report::sample(
                    &mut run.report.invalid,
                    Some(&key),
                    &format!(
                        "a value takes {size} bytes; at most {} are read (SERVICE_RETL_MAX_VALUE_BYTES)",
                        bounds.value_bytes
                    ),
                );
                let entry = known.entry(key_hash(&key)).or_default();
                entry.seen = u8::MAX;
                continue;
            }
            let (print, bytes) = run.mapper.fingerprint(&row);
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
                    Report::sample(&mut run.report.invalid, Some(&key), "the primary key appears more than once");
                }
                continue;
            }
            if bytes > RECORD_BYTES {
                // Invalid whatever was sent before; `seen` stays 1 and the
                // verdict unchanged so the key is neither sent nor removed.
                counts.invalid += 1;
                Report::sample(
                    &mut run.report.invalid,
                    Some(&key),
                    &format!("the mapped fields take {bytes} bytes; at most {RECORD_BYTES} are sent"),
                );
                entry.seen = u8::MAX;
                continue;
            }
            let old = entry.fingerprint;
            entry.first = match entry.accepted {
                false => Verdict::Add,
                true if mode == ActivationMode::InsertOnly => Verdict::Skipped,
                true if entry.failed => Verdict::Change,
                true if full => {
                    if entry.mine && old == print {
                        Verdict::Unchanged
                    } else {
                        Verdict::Change
                    }
                }
                true if old != print => Verdict::Change,
                true => Verdict::Unchanged,
            };
            match entry.first {
                Verdict::Unchanged => counts.unchanged += 1,
                Verdict::Skipped => counts.skipped += 1,
                verdict @ (Verdict::Add | Verdict::Change) => {
                    let p = Pending { key, record: run.mapper.record(&row), fingerprint: print, verdict, bytes };
                    spool.push(&p).await?;
                }
            }
        }
        run.progress("diffing", false).await;
    }
    drop(rows);
    run.report.diff_ms = started.elapsed().as_millis() as u64;
    run.progress("sending", true).await;

    // The sends: rows of keys seen once only.
    let op = match mode {
        ActivationMode::Upsert | ActivationMode::Mirror => Op::Upsert,
        ActivationMode::UpdateOnly => Op::Update,
        ActivationMode::InsertOnly => Op::Insert,
    };
    let mut batch = Batch::default();
    let size = run.target.batch_size();
    let mut spooled = spool.read().await?;
    while let Some(p) = spooled.next::<Pending>().await? {
        if known.get(&key_hash(&p.key)).is_some_and(|k| k.seen == 1) {
            if batch.bytes + p.bytes > BATCH_BYTES || batch.rows.len() == size {
                run.send(op, batch.take()).await?;
            }
            batch.bytes += p.bytes;
            batch.rows.push(p);
        }
    }
    run.send(op, batch.take()).await?;

    // Removals: keys accepted before whose rows left the model.
    if mode == ActivationMode::Mirror {
        let mut gone = Vec::new();
        let mut forget = Vec::new();
        state
            .store
            .sent_keys(activation_id, |key, destination_key| {
                if known.get(&key_hash(&key)).is_some_and(|k| k.seen > 0) {
                    return;
                }
                match destination_key {
                    Some(d) if !live.contains(&key_hash(&d)) => gone.push((key, d)),
                    _ => forget.push(KeyOutcome::Removed { key }),
                }
            })
            .await
            .map_err(transient)?;
        state.store.record_outcomes(activation_id, &job.job_id, &forget).await.map_err(transient)?;
        for chunk in gone.chunks(run.target.batch_size()) {
            run.remove(chunk).await?;
        }
    }
    run.progress("done", true).await;
    Ok(())
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

    async fn progress(&mut self, phase: &str, now: bool) {
        if now || self.saved.elapsed() >= PROGRESS_EVERY {
            self.saved = Instant::now();
            let _ = self.state.store.job_progress(&self.job.job_id, &self.report.to_json(phase)).await;
        }
    }

    /// Sends rows and keeps what became of each.
    async fn send(&mut self, op: Op, rows: Vec<Pending>) -> Result<(), Failure> {
        if rows.is_empty() {
            return Ok(());
        }
        self.stopped()?;
        let records: Vec<(String, Map<String, Value>)> =
            rows.iter().map(|p| (p.key.clone(), p.record.clone())).collect();
        let answers = self
            .target
            .send(self.state, &self.job.workspace_id, (self.activation_id, &self.job.job_id), op, &records, self.cancel)
            .await
            .map_err(send_failure)?;
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
        self.state.store.record_outcomes(self.activation_id, &self.job.job_id, &outcomes).await.map_err(transient)?;
        self.progress("sending", false).await;
        Ok(())
    }

    /// Removes the records of keys that left the model.
    async fn remove(&mut self, gone: &[(String, String)]) -> Result<(), Failure> {
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
            .await
            .map_err(send_failure)?;
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
        self.state.store.record_outcomes(self.activation_id, &self.job.job_id, &outcomes).await.map_err(transient)?;
        self.progress("removing", false).await;
        Ok(())
    }
}

fn send_failure(e: SendError) -> Failure {
    match e {
        SendError::Transient(m) => Failure::Transient(m),
        SendError::Permanent(m) => Failure::Permanent(m),
        SendError::Cancelled => cancelled(),
    }
}
