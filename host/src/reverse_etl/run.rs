//! One activation run: the diff of the model against the activation's
//! diff state, then the sends, committing the state key by key only for
//! what the destination accepted.
//!
//! The diff streams the model once, keeping per key only a 128-bit hash,
//! the fingerprint last accepted and a few flags, so a model of a million
//! rows needs tens of megabytes, never the rows. Rows to send are kept in
//! memory while they fit in [`PENDING_BYTES`] and spooled to an unnamed
//! file in the data directory beyond that (a first run, a full resync), so
//! the warehouse query ends with the diff however slow the destination.
//! A key whose row appears more than once, or is null, is invalid and
//! never sent; so is a row whose mapped fields exceed [`RECORD_BYTES`].
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};

use super::mapping::Mapper;
use super::targets::{Op, SendError, Target};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::kinds::{ActivationMode, JobKind};
use crate::store::pipelines::Job;
use crate::store::reverse_etl::KeyOutcome;

/// Bytes of rows to send kept in memory at most; the rest is spooled.
pub const PENDING_BYTES: usize = 32 * 1024 * 1024;
/// The largest record (mapped fields as JSON) a run sends.
pub const RECORD_BYTES: usize = 1024 * 1024;
/// The most record bytes in one batch to a destination.
const BATCH_BYTES: usize = 4 * 1024 * 1024;
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

fn transient(e: impl std::fmt::Display) -> RunFailure {
    RunFailure::Transient(e.to_string())
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
            list.push(Sample { key: key.map(str::to_owned), reason: super::targets::short(reason) });
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

/// The rows to send as JSON lines: in memory up to [`PENDING_BYTES`],
/// then in an unnamed file (gone when closed, readable by no one else).
struct Spool {
    memory: Vec<u8>,
    file: Option<BufWriter<tokio::fs::File>>,
    dir: std::path::PathBuf,
}

impl Spool {
    fn new(dir: &std::path::Path) -> Spool {
        Spool { memory: Vec::new(), file: None, dir: dir.to_owned() }
    }

    async fn push(&mut self, p: &Pending) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(p)?;
        // Compact JSON never holds a raw newline: one line per row.
        line.push(b'\n');
        if self.file.is_none() && self.memory.len() + line.len() > PENDING_BYTES {
            let mut file = BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(tempfile::tempfile_in(&self.dir)?));
            file.write_all(&std::mem::take(&mut self.memory)).await?;
            self.file = Some(file);
        }
        match &mut self.file {
            Some(f) => f.write_all(&line).await,
            None => {
                self.memory.extend_from_slice(&line);
                Ok(())
            }
        }
    }

    /// The rows, in the order they came.
    async fn read(self) -> std::io::Result<Spooled> {
        match self.file {
            None => Ok(Spooled::Memory(self.memory, 0)),
            Some(mut f) => {
                f.flush().await?;
                let mut file = f.into_inner();
                tokio::io::AsyncSeekExt::rewind(&mut file).await?;
                Ok(Spooled::File(BufReader::with_capacity(1 << 20, file).lines()))
            }
        }
    }
}

/// A spool being read back.
enum Spooled {
    /// The lines, and where the next one starts.
    Memory(Vec<u8>, usize),
    File(tokio::io::Lines<BufReader<tokio::fs::File>>),
}

impl Spooled {
    async fn next(&mut self) -> std::io::Result<Option<Pending>> {
        match self {
            Spooled::Memory(lines, at) => {
                let rest = &lines[*at..];
                let Some(end) = rest.iter().position(|b| *b == b'\n') else { return Ok(None) };
                *at += end + 1;
                Ok(Some(serde_json::from_slice(&rest[..end])?))
            }
            Spooled::File(lines) => match lines.next_line().await? {
                Some(line) => Ok(Some(serde_json::from_str(&line)?)),
                None => Ok(None),
            },
        }
    }
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
    let activation = state.store.activation(ws, activation_id).await.map_err(transient)?.ok_or_else(|| permanent("the activation no longer exists"))?;
    let model = state.store.model(ws, &activation.model_id).await.map_err(transient)?.ok_or_else(|| permanent("the model no longer exists"))?;
    let dest = state.store.retl_destination(ws, &activation.destination_id).await.map_err(transient)?.ok_or_else(|| permanent("the destination no longer exists"))?;
    let target = Target::open(state, ws, &dest).await.map_err(from_api)?;
    let full = job.kind == JobKind::ActivationResync;
    let mode = activation.mode;

    // The diff.
    let started = Instant::now();
    let mut rows = super::model::open(state, ws, &model.warehouse_id, &model.query, None, super::model::RUN_TIMEOUT).await.map_err(from_api)?;
    let mapper = Mapper::new(&activation.mappings, &rows.columns, &model.primary_key, target.match_field()).map_err(|e| permanent(format!("{}: {}", e.field, e.message)))?;
    let mut run = Run { state, job, activation_id, target, mapper, report: Report::default(), saved: Instant::now(), cancelled };
    // Sized up front: growing a table of a million keys would hold the
    // old one and the new one at once.
    let stored = state.store.diff_state_len(activation_id).await.map_err(transient)?;
    let mut known: HashMap<u128, Known> = HashMap::with_capacity(usize::try_from(stored).unwrap_or(0).saturating_add(1024));
    state
        .store
        .diff_state(activation_id, &job.job_id, |key, s| {
            let known_key = Known { fingerprint: s.fingerprint.unwrap_or(0), accepted: s.fingerprint.is_some(), failed: s.failed, mine: s.sent_by_this_run, ..Known::default() };
            known.insert(key_hash(&key), known_key);
        })
        .await
        .map_err(transient)?;
    // Matching values of the rows in the model (mirror mode): a record
    // one of them still names is never removed.
    let mut live: HashSet<u128> = HashSet::new();
    let mut spool = Spool::new(&state.config.data_dir);
    while let Some(batch) = rows.next_batch().await.map_err(|e| from_api(super::model::query_error(e)))? {
        run.stopped()?;
        for row in batch {
            let counts = &mut run.report.counts;
            counts.queried += 1;
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
                Report::sample(&mut run.report.invalid, Some(&key), &format!("the mapped fields take {bytes} bytes; at most {RECORD_BYTES} are sent"));
                entry.seen = u8::MAX;
                continue;
            }
            let old = entry.fingerprint;
            entry.first = match entry.accepted {
                false => Verdict::Add,
                true if mode == ActivationMode::InsertOnly => Verdict::Skipped,
                true if entry.failed => Verdict::Change,
                true if full => {
                    if entry.mine && old == print { Verdict::Unchanged } else { Verdict::Change }
                }
                true if old != print => Verdict::Change,
                true => Verdict::Unchanged,
            };
            match entry.first {
                Verdict::Unchanged => counts.unchanged += 1,
                Verdict::Skipped => counts.skipped += 1,
                verdict @ (Verdict::Add | Verdict::Change) => {
                    let p = Pending { key, record: run.mapper.record(&row), fingerprint: print, verdict, bytes };
                    spool.push(&p).await.map_err(transient)?;
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
    let mut spooled = spool.read().await.map_err(transient)?;
    while let Some(p) = spooled.next().await.map_err(transient)? {
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
        self.state.store.record_outcomes(self.activation_id, &self.job.job_id, &outcomes).await.map_err(transient)?;
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
        self.state.store.record_outcomes(self.activation_id, &self.job.job_id, &outcomes).await.map_err(transient)?;
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
