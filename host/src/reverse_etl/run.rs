//! One activation run: the diff of the model against the activation's
//! diff state, then the sends, committing the state key by key only for
//! what the destination accepted.
//!
//! The diff streams the model once, keeping per key only a 128-bit hash,
//! the fingerprint last accepted and two small counters, so a model of a
//! million rows needs tens of megabytes, never the rows. Rows to send are
//! kept while they fit in [`PENDING_BYTES`]; beyond that (a first run, a
//! full resync) the model is read a second time and the rows to send are
//! picked out on the way. A key whose row appears more than once, or is
//! null, is invalid and never sent. A run that stops part way (a crash, a
//! lost lease, a transient failure) has kept what was accepted, so the
//! next attempt sends only what is left.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::mapping::{Mapper, fingerprint};
use super::targets::{Op, SendError, Target};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::kinds::{ActivationMode, JobKind};
use crate::store::pipelines::Job;
use crate::store::reverse_etl::KeyOutcome;

/// Bytes of rows to send kept from the diff at most.
pub const PENDING_BYTES: usize = 32 * 1024 * 1024;
/// Samples of failed and of invalid rows kept at most.
const SAMPLES: usize = 100;
/// How often a run's progress is saved at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// How a run failed: worth another attempt, or not.
pub enum RunFailure {
    Transient(String),
    Permanent(String),
}

fn permanent(m: impl Into<String>) -> RunFailure {
    RunFailure::Permanent(m.into())
}

/// An API error met while opening the run's parts: a provider or
/// warehouse outage may pass, anything else will not.
fn from_api(e: ApiError) -> RunFailure {
    let m = e.body().message;
    if e.status.is_server_error() { RunFailure::Transient(m) } else { RunFailure::Permanent(m) }
}

/// A run's counts, as `GET /reverse-etl/runs/{runId}` shows them.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Counts {
    /// Rows the model returned.
    pub queried: u64,
    /// New keys the destination accepted.
    pub added: u64,
    /// Changed (or earlier failed) keys the destination accepted.
    pub changed: u64,
    /// Records removed because their rows left the model (mirror mode).
    pub removed: u64,
    pub unchanged: u64,
    /// Rows whose key is null or appears more than once: never sent.
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
            list.push(Sample { key: key.map(str::to_owned), reason: reason.chars().take(300).collect() });
        }
    }

    fn to_json(&self, phase: &str) -> Value {
        json!({ "phase": phase, "counts": self.counts, "diff_ms": self.diff_ms, "failed_samples": self.failed, "invalid_samples": self.invalid })
    }
}

/// What the diff knows about a key.
#[derive(Clone, Copy, Default)]
struct Known {
    /// The fingerprint last accepted.
    fingerprint: Option<i64>,
    failed: bool,
    /// Times seen in this run's model (saturating).
    seen: u8,
    /// What its first row became.
    first: Verdict,
}

#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Verdict {
    #[default]
    Unchanged,
    Add,
    Change,
    Skipped,
}

/// A key as the diff holds it.
fn key_hash(key: &str) -> u128 {
    let digest = Sha256::digest(key.as_bytes());
    u128::from_le_bytes(digest[..16].try_into().expect("sixteen bytes"))
}

/// A row to send.
struct Pending {
    key: String,
    record: Map<String, Value>,
    fingerprint: i64,
    verdict: Verdict,
}

struct Run<'a> {
    state: &'a AppState,
    job: &'a Job,
    activation_id: &'a str,
    target: Target,
    mapper: Mapper,
    report: Report,
    saved: Instant,
    cancelled: Arc<AtomicBool>,
}

pub async fn execute(state: &AppState, job: &Job, cancelled: Arc<AtomicBool>) -> Result<(), RunFailure> {
    let ws = &job.workspace_id;
    let activation_id = job.activation_id.as_deref().ok_or_else(|| permanent("the run names no activation"))?;
    let activation = state.store.activation(ws, activation_id).await.ok().flatten().ok_or_else(|| permanent("the activation no longer exists"))?;
    let model = state.store.model(ws, &activation.model_id).await.ok().flatten().ok_or_else(|| permanent("the model no longer exists"))?;
    let dest = state.store.retl_destination(ws, &activation.destination_id).await.ok().flatten().ok_or_else(|| permanent("the destination no longer exists"))?;
    let target = Target::open(state, ws, &dest).await.map_err(from_api)?;
    let full = job.kind == JobKind::ActivationResync;
    let mode = activation.mode;

    // The diff.
    let started = Instant::now();
    let mut rows = super::model::open(state, ws, &model.warehouse_id, &model.query, None, super::model::RUN_TIMEOUT).await.map_err(from_api)?;
    let mapper = Mapper::new(&activation.mappings, &rows.columns, &model.primary_key, target.match_field()).map_err(|e| permanent(format!("{}: {}", e.field, e.message)))?;
    let mut run = Run { state, job, activation_id, target, mapper, report: Report::default(), saved: Instant::now(), cancelled };
    let mut known: HashMap<u128, Known> = HashMap::new();
    state
        .store
        .diff_state(activation_id, |key, s, _| {
            known.insert(key_hash(&key), Known { fingerprint: s.fingerprint, failed: s.failed, ..Known::default() });
        })
        .await
        .map_err(|e| RunFailure::Transient(e.to_string()))?;
    let mut pending = Vec::new();
    let (mut pending_bytes, mut overflow) = (0usize, false);
    while let Some(batch) = rows.next_batch().await.map_err(|e| from_api(super::model::query_error(e)))? {
        run.stopped()?;
        for row in batch {
            run.report.counts.queried += 1;
            let Some(key) = run.mapper.key(&row) else {
                run.report.counts.invalid += 1;
                Report::sample(&mut run.report.invalid, None, "the primary key is null");
                continue;
            };
            let record = run.mapper.record(&row);
            let print = fingerprint(&record);
            let entry = known.entry(key_hash(&key)).or_default();
            entry.seen = entry.seen.saturating_add(1);
            if entry.seen > 1 {
                continue;
            }
            entry.first = match entry.fingerprint {
                None => Verdict::Add,
                Some(_) if mode == ActivationMode::InsertOnly => Verdict::Skipped,
                Some(old) if full || old != print || entry.failed => Verdict::Change,
                Some(_) => Verdict::Unchanged,
            };
            match entry.first {
                Verdict::Unchanged => run.report.counts.unchanged += 1,
                Verdict::Skipped => run.report.counts.skipped += 1,
                verdict @ (Verdict::Add | Verdict::Change) => {
                    if !overflow {
                        pending_bytes += key.len() + record.iter().map(|(k, v)| k.len() + v.to_string().len() + 16).sum::<usize>();
                        if pending_bytes > PENDING_BYTES {
                            overflow = true;
                            pending = Vec::new();
                        } else {
                            pending.push(Pending { key, record, fingerprint: print, verdict });
                        }
                    }
                }
            }
        }
    }
    // Keys seen more than once are invalid, every row of them.
    let duplicated: HashMap<u128, Known> = known.iter().filter(|(_, k)| k.seen > 1).map(|(h, k)| (*h, *k)).collect();
    for k in duplicated.values() {
        match k.first {
            Verdict::Unchanged => run.report.counts.unchanged -= 1,
            Verdict::Skipped => run.report.counts.skipped -= 1,
            _ => {}
        }
        run.report.counts.invalid += u64::from(k.seen);
    }
    if !duplicated.is_empty() {
        pending.retain(|p: &Pending| {
            let dup = duplicated.get(&key_hash(&p.key));
            if let Some(k) = dup {
                Report::sample(&mut run.report.invalid, Some(&p.key), &format!("the primary key appears {} times", k.seen));
            }
            dup.is_none()
        });
    }
    run.report.diff_ms = started.elapsed().as_millis() as u64;
    run.progress("sending", true).await;

    // The sends.
    let op = match mode {
        ActivationMode::Upsert | ActivationMode::Mirror => Op::Upsert,
        ActivationMode::UpdateOnly => Op::Update,
        ActivationMode::InsertOnly => Op::Insert,
    };
    if overflow {
        let mut rows = super::model::open(state, ws, &model.warehouse_id, &model.query, None, super::model::RUN_TIMEOUT).await.map_err(from_api)?;
        let mut batch_out = Vec::new();
        while let Some(batch) = rows.next_batch().await.map_err(|e| from_api(super::model::query_error(e)))? {
            for row in batch {
                let Some(key) = run.mapper.key(&row) else { continue };
                let Some(k) = known.get_mut(&key_hash(&key)) else { continue };
                if k.seen != 1 || !matches!(k.first, Verdict::Add | Verdict::Change) {
                    continue;
                }
                // Sent once, even if the row shows up again meanwhile.
                k.seen = u8::MAX;
                let record = run.mapper.record(&row);
                let print = fingerprint(&record);
                batch_out.push(Pending { key, record, fingerprint: print, verdict: k.first });
                if batch_out.len() == run.target.batch_size() {
                    run.send(op, std::mem::take(&mut batch_out)).await?;
                }
            }
        }
        run.send(op, batch_out).await?;
    } else {
        let size = run.target.batch_size();
        let mut it = pending.into_iter().peekable();
        while it.peek().is_some() {
            let chunk: Vec<Pending> = it.by_ref().take(size).collect();
            run.send(op, chunk).await?;
        }
    }

    // Removals: keys accepted before whose rows left the model.
    if mode == ActivationMode::Mirror {
        let mut gone = Vec::new();
        let mut forget = Vec::new();
        state
            .store
            .diff_state(activation_id, |key, s, destination_key| {
                if known.get(&key_hash(&key)).is_some_and(|k| k.seen > 0) {
                    return;
                }
                match (s.fingerprint, destination_key) {
                    (Some(_), Some(d)) => gone.push((key, d)),
                    _ => forget.push(KeyOutcome::Removed { key }),
                }
            })
            .await
            .map_err(|e| RunFailure::Transient(e.to_string()))?;
        state.store.record_outcomes(activation_id, &forget).await.map_err(|e| RunFailure::Transient(e.to_string()))?;
        for chunk in gone.chunks(run.target.batch_size()) {
            run.remove(chunk).await?;
        }
    }
    run.progress("done", true).await;
    Ok(())
}

impl Run<'_> {
    fn stopped(&self) -> Result<(), RunFailure> {
        if self.cancelled.load(Ordering::SeqCst) { Err(permanent("the run was cancelled")) } else { Ok(()) }
    }

    async fn progress(&mut self, phase: &str, now: bool) {
        if now || self.saved.elapsed() >= PROGRESS_EVERY {
            self.saved = Instant::now();
            let _ = self.state.store.job_progress(&self.job.job_id, &self.report.to_json(phase)).await;
        }
    }

    /// Sends rows and keeps what became of each.
    async fn send(&mut self, op: Op, rows: Vec<Pending>) -> Result<(), RunFailure> {
        if rows.is_empty() {
            return Ok(());
        }
        self.stopped()?;
        let records: Vec<(String, Map<String, Value>)> = rows.iter().map(|p| (p.key.clone(), p.record.clone())).collect();
        let answers = self.target.send(self.state, &self.job.workspace_id, (self.activation_id, &self.job.job_id), op, &records).await.map_err(send_failure)?;
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
        self.state.store.record_outcomes(self.activation_id, &outcomes).await.map_err(|e| RunFailure::Transient(e.to_string()))?;
        self.progress("sending", false).await;
        Ok(())
    }

    /// Removes the records of keys that left the model.
    async fn remove(&mut self, gone: &[(String, String)]) -> Result<(), RunFailure> {
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
        let answers = self.target.send(self.state, &self.job.workspace_id, (self.activation_id, &self.job.job_id), Op::Delete, &records).await.map_err(send_failure)?;
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
        self.state.store.record_outcomes(self.activation_id, &outcomes).await.map_err(|e| RunFailure::Transient(e.to_string()))?;
        self.progress("removing", false).await;
        Ok(())
    }
}

fn send_failure(e: SendError) -> RunFailure {
    match e {
        SendError::Transient(m) => RunFailure::Transient(m),
        SendError::Permanent(m) => RunFailure::Permanent(m),
    }
}
