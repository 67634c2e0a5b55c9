//! One sync (or reset) job: each selected stream is read through the
//! source plugin into the destination, batch by batch, through a write
//! queue, and its state is saved after the records it covers are written,
//! so a restart resumes from the last checkpoint (and, in deduplicated
//! mode, rewrites the same rows instead of adding duplicates). An append
//! writes a record only with a state that covers it ([`super::held`]): a
//! checkpoint that does not advance the state commits nothing new, and a
//! read that fails leaves what it held to the retry.
//!
//! Two phases: [`prepare`] reads what the job runs on (pipeline, source,
//! destination, the connector version pinned to the job, its catalog) and
//! clears a reset's tables; then each stream runs on its own
//! ([`SyncRun::run_stream`]). What the job shows as it goes is a typed
//! [`SyncProgress`]. A sync spread over servers (the `spread` module)
//! runs each stream as an attempt of its own ([`read_spread_stream`]),
//! which shows its progress in the stream's row ([`Shown`]).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Mutex;

use super::held::Held;
use super::meters::StreamMeter;
use super::quarantine::{Judge, Owner, Verdicts, contract_of};
use super::queue::{QUEUE_BYTES, Work, WorkSender, gather, gather_to_checkpoint, queue};
use super::spool::SpoolBudget;
use super::{CancellationToken, Failure};
use crate::plugin::connector::Connector;
use crate::plugin::sandbox::RecordSink;
use crate::plugin::types::{ReadRequest, SinkRefusal, Stream, SyncMode, advances};
use crate::retry::Transient;
use crate::state::AppState;
use crate::store::jobs::JobLease;
use crate::store::jobs::{Job, JobPlugin};
use crate::store::kinds::JobKind;
use crate::store::pipelines::{Pipeline, StreamContract, StreamSelection, StreamSyncMode};
use crate::store::progress::{JobProgress, StreamLedger, StreamProgress, StreamStatus, SyncLedger, SyncProgress};
use crate::warehouse::contract::Contract;
use crate::warehouse::{Loader, WriteError, Writer, Written};

/// Counters a sync keeps as it goes: per stream, shown as the job's
/// [`SyncProgress`].
#[derive(Default)]
struct Progress {
    streams: BTreeMap<String, StreamTally>,
    /// The ledgers of the job's earlier attempts that ended.
    earlier_ledgers: Vec<SyncLedger>,
}

/// One stream's counters.
#[derive(Default)]
struct StreamTally {
    /// Records and bytes the plugin emitted.
    read: (u64, u64),
    /// Records and bytes the destination committed.
    written: (u64, u64),
    /// Rows the destination stored, as it counted them (a lakehouse's
    /// come from its commits instead).
    stored: u64,
    /// Records never written because a later copy of their key in the same
    /// batch replaced them.
    deduplicated: u64,
    /// Records its contract kept aside, written to its rejected-rows table.
    quarantined: u64,
    /// Records loaded with a value its contract left out.
    value_discarded: u64,
    /// Whether it read and wrote everything it had to.
    ended_well: bool,
    /// When its last state was saved (Unix milliseconds); never in a mode
    /// that keeps no state.
    checkpointed_at: Option<i64>,
    /// When its first record was read, for its rate.
    started: Option<std::time::Instant>,
    /// When it was done, so its rate stays what it was at the end.
    ended: Option<std::time::Instant>,
    /// Whether its read ended (written or failed).
    done: bool,
}

impl StreamTally {
    /// The stream as the job shows it.
    fn shown(&self) -> StreamProgress {
        let until = self.ended.unwrap_or_else(std::time::Instant::now);
        let secs = self.started.map(|t| until.duration_since(t).as_secs_f64()).unwrap_or(0.0);
        let rate = if secs > 0.0 { (self.written.0 as f64 / secs * 10.0).round() / 10.0 } else { 0.0 };
        StreamProgress {
            records: self.written.0,
            bytes: self.written.1,
            records_read: self.read.0,
            bytes_read: self.read.1,
            records_per_second: rate,
            checkpointed_at: self.checkpointed_at.map(crate::store::from_ms),
            records_remaining: None,
            status: if self.done { StreamStatus::Done } else { StreamStatus::Running },
        }
    }
}

/// Where a stream's progress is saved as it goes: in the job's record, or,
/// for a stream of a job spread over servers, in the stream's own row
/// (while its lease holds), which the job's runner merges.
#[derive(Debug, Clone)]
pub(super) enum Shown {
    Job(String),
    Stream(JobLease),
}

/// Progress taken under the lock, saved after it.
enum Showing {
    Job(String, JobProgress),
    Stream(JobLease, StreamProgress),
    Nothing,
}

impl Showing {
    async fn save(self, state: &AppState) {
        match self {
            Showing::Job(job_id, progress) => {
                let _ = state.store.job_progress(&job_id, &progress).await;
            }
            Showing::Stream(lease, progress) => {
                let stream = lease.stream.as_deref().unwrap_or_default();
                let _ = state.store.stream_progress(&lease.job_id, stream, &lease.owner, &progress).await;
            }
            Showing::Nothing => {}
        }
    }
}

impl Progress {
    fn stream(&mut self, stream: &str) -> &mut StreamTally {
        let s = self.streams.entry(stream.to_owned()).or_default();
        s.started.get_or_insert_with(std::time::Instant::now);
        s
    }

    fn snapshot(&self) -> JobProgress {
        let (records, bytes) = self.streams.values().fold((0, 0), |(r, b), s| (r + s.written.0, b + s.written.1));
        let streams = self.streams.iter().map(|(name, s)| (name.clone(), s.shown())).collect();
        JobProgress::Sync(SyncProgress {
            records,
            bytes,
            streams,
            ledger: None,
            earlier_ledgers: self.earlier_ledgers.clone(),
        })
    }

    /// What the job shows now, to save once the lock on the progress is
    /// let go: the whole job's progress, or one spread stream's.
    fn showing(&self, shown: &Shown) -> Showing {
        match shown {
            Shown::Job(job_id) => Showing::Job(job_id.clone(), self.snapshot()),
            Shown::Stream(lease) => match self.streams.get(lease.stream.as_deref().unwrap_or_default()) {
                Some(s) => Showing::Stream(lease.clone(), s.shown()),
                None => Showing::Nothing,
            },
        }
    }

    /// Where what each stream read went, as the attempt ends: what the
    /// destination stored (a lakehouse's from its commits, `writer`),
    /// what batches dropped as earlier copies of a key, and what a stream
    /// that did not end well leaves to the retry.
    fn ledger(&self, attempt: u32, writer: &Writer) -> SyncLedger {
        let streams: BTreeMap<String, StreamLedger> = self
            .streams
            .iter()
            .map(|(name, s)| {
                let loaded = writer.committed_records(name).unwrap_or(s.stored);
                // A lakehouse stores the rows kept aside at its commits too.
                let aside = crate::warehouse::contract::rejected_stream(name);
                let quarantined = writer.committed_records(&aside).unwrap_or(s.quarantined);
                let mut ledger = StreamLedger::settle(s.read.0, loaded, s.deduplicated, quarantined, s.ended_well);
                ledger.value_discarded = s.value_discarded;
                ledger.snapshot_ids = writer.committed_snapshots(name);
                (name.clone(), ledger)
            })
            .collect();
        SyncLedger::new(attempt, streams)
    }
}

/// How often a running job's progress is saved at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Writes one stream's batches and checkpoints on a task of its own, so
/// the plugin fetches the next page while the last one is being written,
/// batches that queued up meanwhile are written together, and each batch
/// is prepared while the one before it is applied. A checkpoint is saved
/// only after every batch queued before it is written, which keeps "state
/// covers the data" true; when a write fails, the queue closes and the
/// plugin's next emit is refused.
struct WriteQueue {
    tx: WorkSender,
    task: tokio::task::JoinHandle<Result<(), WriteError>>,
    /// Set when the read ended well, before the queue closes: what an
    /// append holds is written then, and dropped otherwise.
    read_ended_well: Arc<std::sync::atomic::AtomicBool>,
}

struct StreamWrite {
    state: AppState,
    shown: Shown,
    pipeline_id: String,
    stream: String,
    mode: StreamSyncMode,
    primary_key: Vec<String>,
    writer: Arc<Writer>,
    progress: Arc<Mutex<Progress>>,
    meter: StreamMeter,
    /// The state the read starts from (saved by an earlier sync or
    /// attempt).
    resumed_from: Option<String>,
    /// Where an append's uncovered records wait beyond memory.
    spool: Arc<SpoolBudget>,
    workspace_id: String,
    /// The stream's contract at work, when it has one that judges.
    judge: Option<Judge>,
}

impl StreamWrite {
    fn start(mut self) -> WriteQueue {
        let (tx, mut rx) = queue(QUEUE_BYTES);
        let read_ended_well = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ended_well = read_ended_well.clone();
        let task = tokio::spawn(async move {
            let mut loader =
                Loader::new(self.writer.clone(), &self.pipeline_id, &self.stream, self.mode, self.primary_key.clone())
                    .saving_states(self.state.store.clone());
            let mut saved = tokio::time::Instant::now();
            let mut judge = self.judge.take();
            let result = async {
                if self.mode == StreamSyncMode::IncrementalAppend {
                    return self.append(&mut loader, &mut judge, &mut rx, &mut saved, &ended_well).await;
                }
                while let Some(first) = rx.recv().await {
                    let (records, checkpoint) = gather(first, &mut rx);
                    if !records.is_empty() {
                        let written = self.write(&mut loader, &mut judge, records).await?;
                        self.record(written, &mut saved, false).await?;
                    }
                    if let Some(state) = checkpoint {
                        let written = loader.checkpoint(state).await?;
                        self.record(written, &mut saved, false).await?;
                    }
                }
                if let Some(judge) = &mut judge {
                    judge.finish().await?;
                }
                let written = loader.drain().await?;
                self.record(written, &mut saved, true).await
            }
            .await;
            if result.is_err() {
                // What was written shows, even though the stream failed.
                let _ = self.record(Written::default(), &mut saved, true).await;
            }
            result
        });
        WriteQueue { tx, task, read_ended_well }
    }

    /// An append's writes: records are held until a checkpoint that
    /// advances the state covers them (then written, and the state saved
    /// after them), or the read ends well (then written, with the last
    /// state). In a database each is keyed by the state it follows, its
    /// place after it and its text, and the first of them are upserted:
    /// an attempt killed after writing them but before saving the state
    /// after them left rows that this read, resumed from the state saved
    /// before them, rewrites rather than doubles.
    async fn append(
        &self,
        loader: &mut Loader,
        judge: &mut Option<Judge>,
        rx: &mut super::queue::WorkQueue,
        saved: &mut tokio::time::Instant,
        ended_well: &std::sync::atomic::AtomicBool,
    ) -> Result<(), WriteError> {
        let spool_failed = |e: super::spool::SpoolError| WriteError::Destination(format!("holding records: {e}"));
        let mut held = Held::new(self.spool.clone(), &self.workspace_id);
        let mut committed = self.resumed_from.clone();
        // The records up to the first state saved may have been written
        // before, by an attempt that ended before it saved that state.
        let mut replaces = true;
        while let Some(first) = rx.recv().await {
            let (records, checkpoint) = gather_to_checkpoint(first, rx);
            if !records.is_empty() {
                held.push(records).await.map_err(spool_failed)?;
                // What was read shows while it waits to be written.
                self.show_progress(saved).await;
            }
            match checkpoint {
                Some(state) if advances(committed.as_deref(), &state) => {
                    loader.key_appends_after(committed.as_deref(), replaces);
                    replaces = false;
                    self.write_held(loader, judge, &mut held, saved).await?;
                    let written = loader.checkpoint(state.clone()).await?;
                    self.record(written, saved, false).await?;
                    // Written and saved before more is held: what shows as
                    // written is what the state covers.
                    let settled = loader.settle().await?;
                    self.record(settled, saved, false).await?;
                    committed = Some(state);
                }
                // It covers nothing the saved state does not: the records
                // since wait for one that does.
                _ => {}
            }
        }
        if ended_well.load(std::sync::atomic::Ordering::SeqCst) {
            loader.key_appends_after(committed.as_deref(), replaces);
            self.write_held(loader, judge, &mut held, saved).await?;
        }
        if let Some(judge) = judge {
            judge.finish().await?;
        }
        let written = loader.drain().await?;
        self.record(written, saved, true).await
    }

    /// Saves the job's progress (records read included) when it was last
    /// saved a while ago.
    async fn show_progress(&self, saved: &mut tokio::time::Instant) {
        if saved.elapsed() < PROGRESS_EVERY {
            return;
        }
        let showing = self.progress.lock().await.showing(&self.shown);
        *saved = tokio::time::Instant::now();
        showing.save(&self.state).await;
    }

    /// Writes every held record, in order.
    async fn write_held(
        &self,
        loader: &mut Loader,
        judge: &mut Option<Judge>,
        held: &mut Held,
        saved: &mut tokio::time::Instant,
    ) -> Result<(), WriteError> {
        let spool_failed = |e: super::spool::SpoolError| WriteError::Destination(format!("holding records: {e}"));
        let mut taken = held.take().await.map_err(spool_failed)?;
        while let Some(batch) = taken.next_batch().await.map_err(spool_failed)? {
            let written = self.write(loader, judge, batch).await?;
            self.record(written, saved, false).await?;
        }
        Ok(())
    }

    /// Writes `records`, through the stream's contract when it has one
    /// that judges, counting what it kept aside or changed.
    async fn write(
        &self,
        loader: &mut Loader,
        judge: &mut Option<Judge>,
        records: Vec<String>,
    ) -> Result<Written, WriteError> {
        let Some(judge) = judge else { return loader.write(records).await };
        let (written, verdicts) = judge.load(loader, records).await?;
        if verdicts != Verdicts::default() {
            let mut p = self.progress.lock().await;
            let s = p.stream(&self.stream);
            s.quarantined += verdicts.quarantined;
            s.value_discarded += verdicts.value_discarded;
        }
        Ok(written)
    }

    /// Counts written records and notes the checkpoint they made due (the
    /// loader saved it); saves the job's progress when it last did so a
    /// while ago (or `now`).
    async fn record(&self, written: Written, saved: &mut tokio::time::Instant, now: bool) -> Result<(), WriteError> {
        self.meter.written(written.records, written.bytes);
        {
            let mut p = self.progress.lock().await;
            let s = p.stream(&self.stream);
            // Where records are stored only at commits, what shows as
            // written is what was committed.
            s.written.0 = match self.writer.committed_records(&self.stream) {
                Some(committed) => committed,
                None => s.written.0 + written.records,
            };
            s.written.1 += written.bytes;
            s.stored += written.stored;
            s.deduplicated += written.deduplicated;
        }
        // Every batch queued before the checkpoint is written, and the
        // checkpoint saved by its owner (the loader, or the lakehouse in
        // its commit).
        let checkpointed = written.checkpoint.is_some() && self.mode != StreamSyncMode::FullRefreshOverwrite;
        let showing = {
            let mut p = self.progress.lock().await;
            let s = p.stream(&self.stream);
            if checkpointed {
                s.checkpointed_at = Some(crate::store::now_ms());
            }
            if now && !s.done {
                s.done = true;
                s.ended = Some(std::time::Instant::now());
            }
            (now || (written.records > 0 && saved.elapsed() >= PROGRESS_EVERY)).then(|| p.showing(&self.shown))
        };
        if let Some(showing) = showing {
            *saved = tokio::time::Instant::now();
            showing.save(&self.state).await;
        }
        Ok(())
    }
}

impl WriteQueue {
    /// Waits until everything queued is written (what an append holds
    /// only when the read `ended_well`); the first write failure, if there
    /// was one.
    async fn finish(self, ended_well: bool) -> Result<(), WriteError> {
        self.read_ended_well.store(ended_well, std::sync::atomic::Ordering::SeqCst);
        drop(self.tx);
        self.task.await.unwrap_or_else(|e| Err(WriteError::Destination(format!("the writer stopped: {e}"))))
    }
}

/// The sink a read writes through: it checks, counts and queues.
struct JobSink {
    stream: String,
    queue: WorkSender,
    cancel: CancellationToken,
    progress: Arc<Mutex<Progress>>,
    meter: StreamMeter,
}

impl JobSink {
    async fn send(&mut self, stream: &str, work: Work) -> Result<(), SinkRefusal> {
        if self.cancel.is_cancelled() {
            return Err(SinkRefusal::Cancelled);
        }
        if stream != self.stream {
            return Err(SinkRefusal::Rejected(format!("this read is for stream {}", self.stream)));
        }
        // A closed queue means a write failed; the job reports why.
        self.queue.send(work).await.map_err(|_| SinkRefusal::Rejected("the destination write failed".into()))
    }
}

impl RecordSink for JobSink {
    fn emit<'a>(
        &'a mut self,
        stream: &'a str,
        records: Vec<String>,
    ) -> Pin<Box<dyn Future<Output = Result<(), SinkRefusal>> + Send + 'a>> {
        Box::pin(async move {
            if stream == self.stream {
                let bytes = records.iter().map(|r| r.len() as u64).sum::<u64>();
                self.meter.read(records.len() as u64, bytes);
                let mut p = self.progress.lock().await;
                let s = p.stream(stream);
                s.read.0 += records.len() as u64;
                s.read.1 += bytes;
            }
            self.send(stream, Work::Records(records)).await
        })
    }

    fn checkpoint<'a>(
        &'a mut self,
        stream: &'a str,
        state: String,
    ) -> Pin<Box<dyn Future<Output = Result<(), SinkRefusal>> + Send + 'a>> {
        Box::pin(self.send(stream, Work::Checkpoint(state)))
    }
}

/// What a sync reads before its streams: the pipeline, the source's
/// configuration and catalog, the connector pinned to the job, and the
/// destination's writer held for it.
pub(super) struct Prepared {
    pub(super) pipeline: Pipeline,
    source_config: String,
    connector: Connector,
    pub(super) catalog: Vec<Stream>,
    pub(super) writer: Arc<Writer>,
    /// The destination's contract for streams that name none.
    pub(super) default_contract: Option<StreamContract>,
}

/// One attempt of a sync, stream after stream (or of one stream of a
/// spread sync).
pub(super) struct SyncRun<'a> {
    state: &'a AppState,
    spool: &'a Arc<SpoolBudget>,
    job: &'a Job,
    cancel: &'a CancellationToken,
    prepared: Prepared,
    progress: Arc<Mutex<Progress>>,
    shown: Shown,
}

/// Runs a prepared sync or reset, stream after stream, to the end of its
/// attempt.
pub(super) async fn execute(
    state: &AppState,
    spool: &Arc<SpoolBudget>,
    job: &Job,
    cancel: &CancellationToken,
    prepared: Prepared,
) -> Result<(), Failure> {
    let attempt = u32::try_from(job.attempts).unwrap_or(u32::MAX);
    let progress =
        Progress { earlier_ledgers: SyncProgress::ledgers_before(&job.progress, attempt), ..Progress::default() };
    let shown = Shown::Job(job.job_id.clone());
    let run = SyncRun { state, spool, job, cancel, prepared, progress: Arc::new(Mutex::new(progress)), shown };
    let mut outcome = Ok(());
    for sel in &run.prepared.pipeline.streams {
        outcome = run.run_stream(sel).await;
        if outcome.is_err() {
            break;
        }
    }
    let (ledger, mut last) = {
        let progress = run.progress.lock().await;
        (progress.ledger(attempt, &run.prepared.writer), progress.snapshot())
    };
    if outcome.is_ok()
        && let Some(imbalance) = ledger.imbalance()
    {
        // Something lost (or wrote twice) what was read: a bug, never to
        // pass as a success.
        outcome = Err(Failure::Permanent(imbalance));
    }
    if let JobProgress::Sync(sync) = &mut last {
        sync.ledger = Some(ledger);
    }
    let _ = state.store.job_progress(&job.job_id, &last).await;
    run.prepared.close().await;
    outcome
}

/// One stream of a sync spread over servers, read by the runner holding
/// its lease (`lease.stream`): how it ended, and its ledger once it read
/// anything. Its progress is saved in its row as it goes.
pub(super) async fn read_spread_stream(
    state: &AppState,
    spool: &Arc<SpoolBudget>,
    job: &Job,
    lease: JobLease,
    cancel: &CancellationToken,
) -> (Result<(), Failure>, Option<StreamLedger>) {
    let stream = lease.stream.clone().unwrap_or_default();
    let prepared = match prepare(state, job, lease.clone()).await {
        Ok(prepared) => prepared,
        Err(e) => return (Err(e), None),
    };
    let Some(sel) = prepared.pipeline.streams.iter().find(|s| s.name == stream).cloned() else {
        prepared.close().await;
        return (Err(Failure::Permanent(format!("stream {stream} is no longer selected by the pipeline"))), None);
    };
    let attempt = u32::try_from(job.attempts).unwrap_or(u32::MAX);
    let progress = Arc::new(Mutex::new(Progress::default()));
    let run = SyncRun { state, spool, job, cancel, prepared, progress, shown: Shown::Stream(lease) };
    let mut outcome = run.run_stream(&sel).await;
    let ledger = run.progress.lock().await.ledger(attempt, &run.prepared.writer);
    if outcome.is_ok()
        && let Some(imbalance) = ledger.imbalance()
    {
        outcome = Err(Failure::Permanent(imbalance));
    }
    run.prepared.close().await;
    (outcome, ledger.streams.get(&stream).cloned())
}

impl Prepared {
    /// Lets the destination's writer go (closed when no stream holds it).
    pub(super) async fn close(self) {
        if let Ok(w) = Arc::try_unwrap(self.writer) {
            w.close().await;
        }
    }
}

/// The pipeline, its source and destination, the connector (the version
/// the job started with, to its end) and its catalog; a reset clears the
/// destination's tables and the saved states. A pipeline, source or
/// destination that is gone fails the job for good; a control database
/// that cannot answer leaves it to be tried again.
pub(super) async fn prepare(state: &AppState, job: &Job, lease: JobLease) -> Result<Prepared, Failure> {
    let ws = &job.workspace_id;
    let permanent = |m: &str| Failure::Permanent(m.to_owned());
    let pipeline_id = job.pipeline_id.as_deref().ok_or_else(|| permanent("the job names no pipeline"))?;
    let pipeline =
        state.store.pipeline(ws, pipeline_id).await?.ok_or_else(|| permanent("the pipeline no longer exists"))?;
    let source =
        state.store.source(ws, &pipeline.source_id).await?.ok_or_else(|| permanent("the source no longer exists"))?;
    let dest_id = pipeline.destination_id.clone().ok_or_else(|| permanent("the pipeline has no destination"))?;
    let dest =
        state.store.destination(ws, &dest_id).await?.ok_or_else(|| permanent("the destination no longer exists"))?;
    // The version the job started with, to its end; the current one when
    // it starts now.
    let recorded = job.plugin.as_ref().map(|p| p.digest.as_str());
    let connector =
        state.plugins.for_job(&source.connector_id, ws, recorded).await.map_err(|e| Failure::of(e, false))?;
    if recorded.is_none() {
        let plugin = connector.plugin();
        let runs = JobPlugin { version: plugin.info.version.clone(), digest: plugin.digest.clone() };
        let kept = state.store.pin_job_plugin(&job.job_id, &runs).await?;
        if kept != runs {
            return Err(Failure::Transient("another attempt of the job started on another plugin version".into()));
        }
    }
    let mut writer = state.warehouses.writer(&dest).await?;
    writer.hold_for(lease);
    let writer = Arc::new(writer);
    let source_config = source.configuration.to_string();
    let catalog = connector.catalog(&state.store, &source.source_id, &source_config).await?;
    if job.kind == JobKind::Reset {
        for s in &pipeline.streams {
            writer.clear(&s.name).await?;
        }
        state.store.clear_stream_state(&pipeline.pipeline_id).await?;
    }
    let default_contract = dest.default_contract;
    Ok(Prepared { pipeline, source_config, connector, catalog, writer, default_contract })
}

impl SyncRun<'_> {
    /// Reads one stream from its saved state (in an incremental mode) into
    /// the destination, through its write queue.
    pub(super) async fn run_stream(&self, sel: &StreamSelection) -> Result<(), Failure> {
        let (state, ws) = (self.state, &self.job.workspace_id);
        let Prepared { pipeline, source_config, connector, catalog, writer, default_contract } = &self.prepared;
        let offered = catalog.iter().find(|c| c.name == sel.name);
        let primary_key =
            sel.primary_key.clone().or_else(|| offered.map(|o| o.primary_key.clone())).unwrap_or_default();
        let incremental = sel.sync_mode != StreamSyncMode::FullRefreshOverwrite;
        let stream_state =
            if incremental { state.store.stream_state(&pipeline.pipeline_id, &sel.name).await? } else { None };
        let json_schema = offered.map(|o| o.json_schema.clone()).unwrap_or(Value::Null);
        writer.begin_stream(&pipeline.pipeline_id, &sel.name, sel.sync_mode, &json_schema).await?;
        let judge = match contract_of(sel, *default_contract, &json_schema) {
            Some(rules) => {
                let keyed = if sel.sync_mode == StreamSyncMode::IncrementalDeduped { &primary_key[..] } else { &[] };
                match Contract::new(rules, &json_schema, keyed) {
                    Some(contract) => {
                        let cursor_field =
                            sel.cursor_field.clone().or_else(|| offered.and_then(|o| o.default_cursor_field.clone()));
                        let owner = Owner {
                            writer,
                            pipeline_id: &pipeline.pipeline_id,
                            job_id: &self.job.job_id,
                            attempt: u32::try_from(self.job.attempts).unwrap_or(u32::MAX),
                            stream: &sel.name,
                            cursor_field,
                        };
                        Some(Judge::start(owner, contract, rules.quarantines()).await?)
                    }
                    None => None,
                }
            }
            None => None,
        };
        let queue = StreamWrite {
            state: state.clone(),
            shown: self.shown.clone(),
            pipeline_id: pipeline.pipeline_id.clone(),
            stream: sel.name.clone(),
            mode: sel.sync_mode,
            primary_key,
            writer: writer.clone(),
            progress: self.progress.clone(),
            meter: StreamMeter::new(&state.metric_labels, ws, &pipeline.pipeline_id, &sel.name),
            resumed_from: stream_state.clone(),
            spool: self.spool.clone(),
            workspace_id: ws.clone(),
            judge,
        }
        .start();
        let sink = JobSink {
            stream: sel.name.clone(),
            queue: queue.tx.clone(),
            cancel: self.cancel.clone(),
            progress: self.progress.clone(),
            meter: StreamMeter::new(&state.metric_labels, ws, &pipeline.pipeline_id, &sel.name),
        };
        let req = ReadRequest {
            config: source_config.clone(),
            stream: sel.name.clone(),
            sync_mode: if incremental { SyncMode::Incremental } else { SyncMode::FullRefresh },
            cursor_field: sel.cursor_field.clone(),
            state: stream_state,
        };
        let read = connector.read(&req, Box::new(sink)).await;
        // What the plugin emitted before it stopped is written either way
        // (but what an append holds uncovered), so a retry resumes from
        // the last checkpoint. A write failure is the real cause when the
        // plugin stopped because of it.
        match (queue.finish(read.is_ok()).await, read) {
            (Err(e), _) => Err(Failure::of(format!("stream {}: {e}", sel.name), e.is_transient())),
            (Ok(()), Err(e)) => Err(e.into()),
            (Ok(()), Ok(())) => {
                writer.end_stream(&sel.name).await?;
                let mut progress = self.progress.lock().await;
                let tally = progress.stream(&sel.name);
                if let Some(committed) = writer.committed_records(&sel.name) {
                    tally.written.0 = committed;
                }
                tally.ended_well = true;
                Ok(())
            }
        }
    }
}
