//! `service plugins conform`: the host's promises checked for one
//! connector, offline, from one of its cassettes, with faults the host
//! injects. `plugins test` says the connector still does what it did; this
//! says that what it does keeps the promises a job relies on.
//!
//! For a cassette it checks:
//! - **replay**: every request finds its recorded answer (a miss fails at
//!   once, named with the closest recorded request), and the replay
//!   returns what was recorded;
//! - **schema**: the records fit the declared schema, or the cassette
//!   accepts the disagreement;
//! - **determinism**: two replays, each with the plugin's clock stopped at
//!   the recording's instant and its randomness seeded, make the same
//!   requests and return the same records and checkpoints;
//! - **crash** (each incremental stream): the read is cut at every
//!   checkpoint and resumed from the state the host would have saved
//!   there, as a restarted job is, from the resumed reads the recording
//!   made (`resume STREAM from checkpoint N`). As an append (records
//!   written only with a state that advances, [`advances`]), what was
//!   written before plus what the resume reads is the full read: no record
//!   twice, none missing. With a primary key, as a merge (records written
//!   at every checkpoint), no key of the full read is missing. The
//!   states only move forward;
//! - **secrets**: every answer to a request that names a credential
//!   echoes a canary secret, raw, Base64, percent- and JSON-escaped, in a
//!   header and in the body, once uncompressed and once under each of
//!   gzip, deflate, br and zstd; the egress handles those answers as it
//!   handles live ones, and no form of the canary may reach anything the
//!   plugin was handed, its records, checkpoints or errors, or the log.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use secrecy::SecretString;
use serde_json::Value;

use super::cassette::{self, Answer, Cassette, Exchange, Observations, StreamPlan};
use super::run::{self, StreamChoice};
use super::tape::{Player, Recording};
use super::{AuthoringError, Prepared};
use crate::egress::{
    CredentialHandle, Egress, EgressError, EgressPolicy, InboundResponse, Injection, OutboundRequest, Placement,
    Replay, SecretError, SecretSource,
};
use crate::plugin::connector::Connector;
use crate::plugin::types::{SyncMode, advances};

/// At most this many states of one stream are resumed from (spread over
/// the read when it saved more).
pub(crate) const MAX_RESUMES: usize = 25;

/// The secret the suite's echoes carry. Its forms differ from one another:
/// `+`, `/`, `=` and `"` are each written otherwise by Base64, percent-
/// and JSON-escaping.
const CANARY: &str = "cnf+Canary/7\"q\"Zx=";

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Passed,
    Failed,
    /// Nothing of this kind to check (a stream that is never resumed, a
    /// connector that names no credential); the line says why.
    NotApplicable,
}

/// One check: what it was about, how it ended, and its lines (the first a
/// summary, the rest what failed).
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub name: String,
    pub verdict: Verdict,
    pub lines: Vec<String>,
}

impl Check {
    fn new(name: impl Into<String>, failures: Vec<String>, summary: String) -> Check {
        let verdict = if failures.is_empty() { Verdict::Passed } else { Verdict::Failed };
        let mut lines = vec![summary];
        lines.extend(failures);
        Check { name: name.into(), verdict, lines }
    }

    fn failed(name: impl Into<String>, why: impl Into<String>) -> Check {
        Check { name: name.into(), verdict: Verdict::Failed, lines: vec![why.into()] }
    }

    fn not_applicable(name: impl Into<String>, why: impl Into<String>) -> Check {
        Check { name: name.into(), verdict: Verdict::NotApplicable, lines: vec![why.into()] }
    }
}

/// What the suite found for one cassette.
pub(crate) struct ConformReport {
    pub connector: super::cassette::ConnectorRef,
    pub component: String,
    pub checks: Vec<Check>,
    /// Checkpoints cut and resumed from, over every stream.
    pub crashes: usize,
}

impl ConformReport {
    pub(crate) fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.verdict != Verdict::Failed)
    }
}

/// The checkpoints a read is resumed from: each distinct state it saved,
/// numbered by the first checkpoint (from 1) that said it, but the state
/// it started from; at most [`MAX_RESUMES`], spread over the read.
pub(crate) fn resume_points(lines: &[Value], initial: Option<&Value>) -> Vec<(usize, Value)> {
    let mut points: Vec<(usize, Value)> = Vec::new();
    let checkpoints = lines.iter().filter_map(|l| l.get("checkpoint"));
    for (n, state) in checkpoints.enumerate() {
        if Some(state) != initial && !points.iter().any(|(_, s)| s == state) {
            points.push((n + 1, state.clone()));
        }
    }
    if points.len() > MAX_RESUMES {
        let len = points.len();
        points = (0..MAX_RESUMES).map(|i| points[i * len / MAX_RESUMES].clone()).collect();
    }
    points
}

/// Runs the suite over the prepared cassette.
pub(super) async fn conform(
    prepared: Prepared,
    progress: &mut dyn FnMut(&str),
) -> Result<ConformReport, AuthoringError> {
    let Prepared { cassette, label, plugin, runtime } = prepared;
    let replayer = Replayer { cassette: &cassette, plugin, runtime };
    let mut checks = Vec::new();

    progress("replay");
    let first = replayer.replay(None).await?;
    let mut failures: Vec<String> = first.misses.iter().map(ToString::to_string).collect();
    for difference in super::compare::differences(&cassette.expected, &first.observed) {
        failures.push(format!("{} differs from the recording (- recorded, + replayed):", difference.file));
        failures.extend(difference.diff.lines().map(|l| format!("  {l}")));
    }
    let requests = first.exchanges.len();
    checks.push(Check::new("replay", failures, format!("{requests} request(s) answered from the recording")));

    let (_, disagreements) = super::infer_schemas(&first.observed, &first.declared);
    let unaccepted: Vec<String> = disagreements
        .iter()
        .filter(|d| {
            !cassette
                .manifest
                .accepted
                .iter()
                .any(|a| a.stream == d.stream && a.field == d.field && a.disagreement == d.kind)
        })
        .map(ToString::to_string)
        .collect();
    let records: usize = first.observed.streams.values().map(|lines| records_of(lines).len()).sum();
    checks.push(Check::new("schema", unaccepted, format!("{records} record(s) against the declared schemas")));

    progress("determinism");
    let second = replayer.replay(None).await?;
    let mut failures = Vec::new();
    let (asked_first, asked_second) = (first.requests(), second.requests());
    if asked_second != asked_first {
        let at = asked_first.iter().zip(&asked_second).position(|(a, b)| a != b);
        failures.push(match at {
            Some(i) => {
                format!("request {} differs between two replays: {} then {}", i + 1, asked_first[i], asked_second[i])
            }
            None => format!("the replays made {} and {} requests", asked_first.len(), asked_second.len()),
        });
    }
    for difference in super::compare::differences(&first.observed, &second.observed) {
        failures.push(format!("{} differs between two replays (- first, + second):", difference.file));
        failures.extend(difference.diff.lines().map(|l| format!("  {l}")));
    }
    checks.push(Check::new(
        "determinism",
        failures,
        format!(
            "two replays, clock stopped at {}: same requests and outcomes",
            cassette.manifest.recorded_at.as_deref().unwrap_or(super::cassette::UNRECORDED_CLOCK)
        ),
    ));

    let mut crashes = 0;
    for plan in &cassette.manifest.streams {
        let name = format!("crash {}", plan.name);
        if plan.sync_mode != SyncMode::Incremental {
            checks.push(Check::not_applicable(name, "a full refresh starts over; nothing is resumed"));
            continue;
        }
        progress(&name);
        let lines = first.observed.streams.get(&plan.name).cloned().unwrap_or_default();
        let key = first.primary_keys.get(&plan.name).cloned().unwrap_or_default();
        let (check, crashed) = replayer.crash(plan, &lines, &key).await?;
        crashes += crashed;
        checks.push(check);
    }

    progress("secrets");
    checks.push(replayer.secrets().await?);

    Ok(ConformReport { connector: replayer.plugin_ref(), component: label, checks, crashes })
}

/// A request as the determinism check compares it.
fn request_line(r: &OutboundRequest) -> String {
    let body = r.body.as_ref().map(|b| format!(" with a {}-byte body", b.len())).unwrap_or_default();
    format!("{} {}{body}", r.method.as_str(), r.url)
}

/// What one replay returned.
struct Replayed {
    observed: Observations,
    declared: BTreeMap<String, Value>,
    primary_keys: BTreeMap<String, Vec<String>>,
    misses: Vec<super::tape::Miss>,
    /// Each request and the answer the plugin was handed, in order.
    exchanges: Vec<Exchange>,
}

impl Replayed {
    /// Each request, in order, as the determinism check compares them.
    fn requests(&self) -> Vec<String> {
        self.exchanges.iter().map(|e| request_line(&e.request)).collect()
    }
}

struct Replayer<'a> {
    cassette: &'a Cassette,
    plugin: Arc<crate::plugin::LoadedPlugin>,
    runtime: Arc<crate::plugin::Runtime>,
}

impl Replayer<'_> {
    fn plugin_ref(&self) -> super::cassette::ConnectorRef {
        super::connector_ref(&self.plugin)
    }

    fn connector(
        &self,
        replay: Arc<dyn Replay>,
        recording: Arc<Recording>,
        inject: Option<Arc<dyn SecretSource>>,
    ) -> Connector {
        let policy = EgressPolicy { allowed_hosts: self.plugin.info.hosts.clone(), ..EgressPolicy::default() };
        let mut egress = Egress::replaying(policy, replay).recording(recording);
        if let Some(secrets) = inject {
            egress = egress.injecting(secrets);
        }
        Connector::new(self.plugin.clone(), self.runtime.clone(), egress, run::WORKSPACE)
    }

    /// The exchanges of every call but the resumed reads.
    fn recorded(&self) -> Vec<Exchange> {
        self.cassette.exchanges.iter().filter(|e| !run::is_resume(&e.call)).cloned().collect()
    }

    /// Replays every call as recorded; with `echoes`, every answer to a
    /// request naming a credential echoes the canary as they say, and the
    /// egress handles it as a live answer.
    async fn replay(&self, echoes: Option<&Arc<Echoes>>) -> Result<Replayed, AuthoringError> {
        let player = Arc::new(Player::new(&self.recorded()));
        let recording = Arc::new(Recording::default());
        let connector = match echoes {
            None => self.connector(player.clone(), recording.clone(), None),
            Some(echoes) => {
                let replay = Arc::new(Echoing { player: player.clone(), echoes: echoes.clone() });
                self.connector(
                    replay,
                    recording.clone(),
                    Some(Arc::new(Canary::of(
                        &self.cassette.exchanges,
                        self.cassette.manifest.secret_placement.as_ref().and_then(cassette::sent_placement),
                    ))),
                )
            }
        };
        let manifest = &self.cassette.manifest;
        let choice = StreamChoice::Recorded(manifest.streams.clone());
        let outcome =
            run::run(&connector, &player.call, &manifest.config, manifest.record_limit, choice, &mut |_| {}).await?;
        Ok(Replayed {
            observed: outcome.observed,
            declared: outcome.declared,
            primary_keys: outcome.primary_keys,
            misses: player.misses(),
            exchanges: recording.exchanges(),
        })
    }

    /// Reads `plan`'s stream again from `state`, the resumed read the
    /// recording made from checkpoint `n`.
    async fn resume(&self, plan: &StreamPlan, n: usize, state: &Value, limit: u64) -> Vec<Value> {
        let call = run::resume_call(&plan.name, n);
        let read = run::read_call(&plan.name);
        // Its own recordings first, then the full read's (the recording
        // keeps only the answers that differ).
        let mut exchanges: Vec<Exchange> = self.cassette.exchanges.iter().filter(|e| e.call == call).cloned().collect();
        exchanges.extend(self.cassette.exchanges.iter().filter(|e| e.call == read).cloned());
        for e in &mut exchanges {
            e.call = call.clone();
        }
        let player = Arc::new(Player::new(&exchanges));
        player.call.set(&call);
        let connector = self.connector(player.clone(), Arc::new(Recording::default()), None);
        let (config, _) = run::split_account(&self.cassette.manifest.config);
        let resumed = StreamPlan { state: Some(state.clone()), ..plan.clone() };
        run::read(&connector, &config.to_string(), &resumed, limit).await
    }

    /// The crash check of one incremental stream: (the check, checkpoints
    /// cut).
    async fn crash(
        &self,
        plan: &StreamPlan,
        lines: &[Value],
        key: &[String],
    ) -> Result<(Check, usize), AuthoringError> {
        let name = format!("crash {}", plan.name);
        match lines.last().and_then(|l| l.get("end")) {
            Some(Value::String(end)) if end == "complete" => {}
            Some(Value::String(end)) => {
                let why = format!(
                    "not checked: the recorded read ended with \"{end}\"; record it with a higher --record-limit"
                );
                return Ok((Check::failed(name, why), 0));
            }
            other => {
                let why = format!("not checked: the recorded read failed: {}", other.cloned().unwrap_or(Value::Null));
                return Ok((Check::failed(name, why), 0));
            }
        }
        let checkpoints: Vec<&Value> = lines.iter().filter_map(|l| l.get("checkpoint")).collect();
        if checkpoints.is_empty() {
            return Ok((Check::not_applicable(name, "the read saved no checkpoint; a restart reads it all again"), 0));
        }
        let full = records_of(lines);
        let mut failures = Vec::new();

        // The states only move forward: none comes back after another.
        let mut seen: Vec<&Value> = Vec::new();
        for (i, state) in checkpoints.iter().enumerate() {
            if seen.last() != Some(state) && seen.contains(state) {
                failures.push(format!("checkpoint {} goes back to an earlier state: {state}", i + 1));
            }
            seen.push(state);
        }

        // Each distinct state, read again from, once.
        let points = resume_points(lines, plan.state.as_ref());
        let limit = self.cassette.manifest.record_limit;
        let mut resumed: Vec<(Value, usize, Vec<Value>)> = Vec::new();
        for (n, state) in &points {
            let read = self.resume(plan, *n, state, limit).await;
            if let Some(error) = read.last().and_then(|l| l["end"].get("error")) {
                let call = run::resume_call(&plan.name, *n);
                let error = error.as_str().unwrap_or("");
                failures.push(if self.cassette.exchanges.iter().any(|e| e.call == call) {
                    format!("the read resumed from checkpoint {n} failed: {error}")
                } else {
                    // Recorded before resumed reads were.
                    format!(
                        "the recording holds no read resumed from checkpoint {n} ({state}); record the cassette again. Replayed from the full read's answers, it failed: {error}"
                    )
                });
                continue;
            }
            resumed.push((state.clone(), *n, read));
        }
        let resumed_from = |state: &Value| resumed.iter().find(|(s, _, _)| s == state);

        // As an append: cut at each checkpoint, what the host wrote and
        // the state it saved.
        let mut saved: Option<Value> = plan.state.clone();
        let (mut written, mut waiting) = (0usize, 0usize);
        let mut cut = 0;
        let mut index = 0;
        for line in lines {
            if line.get("record").is_some() {
                waiting += 1;
                continue;
            }
            let Some(state) = line.get("checkpoint") else { continue };
            index += 1;
            if advances(saved.as_ref().map(Value::to_string).as_deref(), &state.to_string()) {
                written += waiting;
                waiting = 0;
                saved = Some(state.clone());
            }
            // The read a restart makes: from the state the read started
            // from, the full read again; from another, the recorded resume.
            let (from, read) = match saved.as_ref().filter(|s| Some(*s) != plan.state.as_ref()) {
                None => ("the start".to_owned(), lines),
                Some(saved_state) => match resumed_from(saved_state) {
                    Some((_, n, read)) => (format!("checkpoint {n}"), read.as_slice()),
                    None if points.iter().any(|(_, s)| s == saved_state) => continue, // its failure is listed above
                    None => {
                        failures.push(format!(
                            "checkpoint {index}: the recording holds no read resumed from {saved_state}; record the cassette again"
                        ));
                        continue;
                    }
                },
            };
            cut += 1;
            let mut after = full[..written].to_vec();
            after.extend(records_of(read));
            failures.extend(
                compare_records(&full, &after, key)
                    .into_iter()
                    .map(|f| format!("cut at checkpoint {index} (append, resumed from {from}): {f}")),
            );
        }

        // As a merge on the primary key: written at every checkpoint; a
        // key missing after the resume was covered by a state before it
        // was emitted.
        if !key.is_empty() {
            let mut before = 0usize;
            let mut index = 0;
            for line in lines {
                if line.get("record").is_some() {
                    before += 1;
                    continue;
                }
                let Some(state) = line.get("checkpoint") else { continue };
                index += 1;
                let Some((_, n, read)) = resumed_from(state) else { continue };
                let mut after = full[..before].to_vec();
                after.extend(records_of(read));
                let missing = missing_keys(&full, &after, key);
                if !missing.is_empty() {
                    failures.push(format!(
                        "cut at checkpoint {index} (merge, resumed from checkpoint {n}): the state covers {} record(s) not yet emitted, keys {}",
                        missing.len(),
                        missing.iter().take(5).map(ToString::to_string).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
        let summary = format!(
            "{cut} of {} checkpoint(s) cut and resumed ({} distinct state(s) read again){}",
            checkpoints.len(),
            resumed.len(),
            if key.is_empty() {
                "; no primary key: records compared whole".to_owned()
            } else {
                format!("; key {}", key.join(", "))
            }
        );
        Ok((Check::new(name, failures, summary), cut))
    }

    /// The secrets check: one replay uncompressed and one under each
    /// coding, every answer to a request naming a credential echoing the
    /// canary.
    async fn secrets(&self) -> Result<Check, AuthoringError> {
        let named = self.cassette.exchanges.iter().filter(|e| !e.request.credentials.is_empty()).count();
        if named == 0 {
            return Ok(Check::not_applicable(
                "secrets",
                "no recorded request names a credential: the plugin is never given a secret",
            ));
        }
        // What the echoes plant, and every form the egress knows.
        let mut forms = crate::egress::reflections(CANARY, &Placement::Bearer);
        forms.extend(echo_forms().into_iter().map(|(_, f)| f.into_bytes()));
        let mut failures = Vec::new();
        let mut echoed = 0;
        for coding in std::iter::once("identity").chain(crate::egress::coding::KNOWN) {
            let echoes = Arc::new(Echoes { coding, planted: Mutex::new(0) });
            let log = Arc::new(Mutex::new(Vec::<u8>::new()));
            let replayed = {
                use tracing::instrument::WithSubscriber;
                let subscriber = capture_log(log.clone());
                self.replay(Some(&echoes)).with_subscriber(subscriber).await?
            };
            let Replayed { observed, exchanges: handed, .. } = replayed;
            echoed += *echoes.planted.lock().unwrap_or_else(|p| p.into_inner());
            let holds = |bytes: &[u8]| forms.iter().any(|f| memchr::memmem::find(bytes, f).is_some());
            // As written, and each string as the plugin holds it.
            let holds_value =
                |v: &Value| holds(v.to_string().as_bytes()) || strings(v).iter().any(|s| holds(s.as_bytes()));
            for (stream, lines) in &observed.streams {
                for (i, line) in lines.iter().enumerate() {
                    if holds_value(line) {
                        failures.push(format!("{coding}: stream {stream}, line {}, holds the canary", i + 1));
                    }
                }
            }
            for (file, value) in observed.files() {
                if value.is_some_and(holds_value) {
                    failures.push(format!("{coding}: {file} holds the canary"));
                }
            }
            for (i, Exchange { request, answer, .. }) in handed.iter().enumerate() {
                let what = format!("{coding}: the answer to request {} ({})", i + 1, request_line(request));
                match answer {
                    Answer::Response(r) => {
                        if let Some((name, _)) = r.headers.iter().find(|(_, v)| holds(v.as_bytes())) {
                            failures.push(format!("{what} handed the plugin the canary in header {name}"));
                        }
                        let coded = r.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("content-encoding"));
                        let readings =
                            crate::egress::coding::readings(&r.body, coded.map(|(_, v)| v.as_str()), 64 << 20);
                        if readings.iter().any(|b| holds(b)) {
                            failures.push(format!("{what} handed the plugin the canary in its body"));
                        }
                    }
                    Answer::Error(e) if holds(e.to_string().as_bytes()) => {
                        failures.push(format!("{what} was an error naming the canary"));
                    }
                    _ => {}
                }
            }
            if holds(&log.lock().unwrap_or_else(|p| p.into_inner())) {
                failures.push(format!("{coding}: the log holds the canary"));
            }
        }
        if echoed == 0 {
            failures.push("no answer could be made to echo the canary (every answer to a request naming a credential was missing or an error)".into());
        }
        let found = if failures.is_empty() { "none found" } else { "found" };
        Ok(Check::new(
            "secrets",
            failures,
            format!(
                "{echoed} answer(s) echoed the canary in {} forms, plain and under gzip, deflate, br and zstd; {found} in what the plugin was handed, its output or the log",
                echo_forms().len()
            ),
        ))
    }
}

/// Every string in `value`, keys included.
fn strings(value: &Value) -> Vec<&str> {
    match value {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) => items.iter().flat_map(strings).collect(),
        Value::Object(map) => map.iter().flat_map(|(k, v)| std::iter::once(k.as_str()).chain(strings(v))).collect(),
        _ => Vec::new(),
    }
}

/// The records of a read's lines.
fn records_of(lines: &[Value]) -> Vec<Value> {
    lines.iter().filter_map(|l| l.get("record")).cloned().collect()
}

/// A record's identity: its primary key's values, or the whole record.
fn identity(record: &Value, key: &[String]) -> Value {
    if key.is_empty() {
        return record.clone();
    }
    Value::Array(key.iter().map(|k| record.get(k).cloned().unwrap_or(Value::Null)).collect())
}

/// How `got` differs from `want` as collections of records: records twice
/// and records missing, by identity.
fn compare_records(want: &[Value], got: &[Value], key: &[String]) -> Vec<String> {
    let count = |records: &[Value]| {
        let mut counts: BTreeMap<String, (usize, Value)> = BTreeMap::new();
        for r in records {
            let id = identity(r, key);
            counts.entry(id.to_string()).or_insert((0, id)).0 += 1;
        }
        counts
    };
    let (want, got) = (count(want), count(got));
    let mut twice = Vec::new();
    let mut missing = Vec::new();
    for (id, (n, value)) in &got {
        let expected = want.get(id).map_or(0, |(n, _)| *n);
        if *n > expected {
            twice.push(value.clone());
        }
    }
    for (id, (n, value)) in &want {
        if got.get(id).map_or(0, |(n, _)| *n) < *n {
            missing.push(value.clone());
        }
    }
    let list = |v: &[Value]| v.iter().take(5).map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let mut out = Vec::new();
    if !twice.is_empty() {
        out.push(format!("{} record(s) written twice: {}", twice.len(), list(&twice)));
    }
    if !missing.is_empty() {
        out.push(format!("{} record(s) missing: {}", missing.len(), list(&missing)));
    }
    out
}

/// The keys of `want` that `got` lacks.
fn missing_keys(want: &[Value], got: &[Value], key: &[String]) -> Vec<Value> {
    let have: std::collections::BTreeSet<String> = got.iter().map(|r| identity(r, key).to_string()).collect();
    let mut missing: Vec<Value> = Vec::new();
    for r in want {
        let id = identity(r, key);
        if !have.contains(&id.to_string()) && !missing.contains(&id) {
            missing.push(id);
        }
    }
    missing
}

/// A log that writes into a buffer, for the secrets check.
fn capture_log(buffer: Arc<Mutex<Vec<u8>>>) -> tracing::Dispatch {
    use tracing_subscriber::layer::SubscriberExt;
    let writer = move || LogBuffer(buffer.clone());
    let layer = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(false);
    let filter = tracing_subscriber::filter::Targets::new().with_target("service", tracing::Level::TRACE);
    tracing::Dispatch::new(tracing_subscriber::registry().with(layer).with(filter))
}

struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How a replay's answers echo the canary.
struct Echoes {
    /// `identity`, or the coding the answers come compressed in.
    coding: &'static str,
    /// Answers that carried the echo.
    planted: Mutex<usize>,
}

/// A replay whose answers to requests naming a credential echo the canary
/// as a reflecting provider would: in headers and in the body, in each
/// form, compressed as the provider chose.
struct Echoing {
    player: Arc<Player>,
    echoes: Arc<Echoes>,
}

impl Replay for Echoing {
    fn answer(&self, request: &OutboundRequest) -> Result<InboundResponse, EgressError> {
        let mut answer = self.player.answer(request)?;
        if request.credentials.is_empty() {
            return Ok(answer);
        }
        let forms = echo_forms();
        for (name, form) in &forms {
            answer.headers.push((format!("x-echo-{name}"), form.clone()));
        }
        let mut body = match serde_json::from_slice::<Value>(&answer.body) {
            Ok(mut value) => {
                // Written into JSON, the plain form is JSON-escaped; the
                // escaped form itself would be escaped twice, which no
                // reflecting provider does.
                let in_json: Vec<_> = forms.iter().filter(|(name, _)| *name != "json").cloned().collect();
                plant(&mut value, &in_json, 0);
                serde_json::to_vec(&value).unwrap_or_default()
            }
            Err(_) if std::str::from_utf8(&answer.body).is_ok() => {
                let mut body = answer.body.clone();
                for (_, form) in &forms {
                    body.extend_from_slice(b"\n");
                    body.extend_from_slice(form.as_bytes());
                }
                body
            }
            Err(_) => answer.body.clone(),
        };
        answer
            .headers
            .retain(|(n, _)| !n.eq_ignore_ascii_case("content-encoding") && !n.eq_ignore_ascii_case("content-length"));
        if let Some(coded) = crate::egress::coding::encode(self.echoes.coding, &body) {
            body = coded;
            answer.headers.push(("content-encoding".into(), self.echoes.coding.to_owned()));
        }
        answer.headers.push(("content-length".into(), body.len().to_string()));
        answer.body = body;
        *self.echoes.planted.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        Ok(answer)
    }
}

/// The canary as a reflecting provider writes it back: (name, form).
fn echo_forms() -> Vec<(&'static str, String)> {
    use base64::Engine;
    let percent: String = url::form_urlencoded::byte_serialize(CANARY.as_bytes()).collect();
    let json = serde_json::to_string(CANARY).unwrap_or_default();
    vec![
        ("raw", CANARY.to_owned()),
        ("base64", base64::engine::general_purpose::STANDARD.encode(CANARY)),
        ("base64url", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(CANARY)),
        ("percent", percent),
        ("json", json[1..json.len() - 1].to_owned()),
    ]
}

/// Adds the echo to every object of `value` (a field per form), as an
/// API that reflects the request into each item would.
fn plant(value: &mut Value, forms: &[(&'static str, String)], depth: usize) {
    if depth > 8 {
        return;
    }
    match value {
        Value::Object(map) => {
            for child in map.values_mut() {
                plant(child, forms, depth + 1);
            }
            for (name, form) in forms {
                map.insert(format!("echo_{name}"), Value::String(form.clone()));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| plant(item, forms, depth + 1)),
        _ => {}
    }
}

/// The canary, for every handle the recording names, placed as it was
/// recorded.
struct Canary {
    placements: BTreeMap<String, Placement>,
}

impl Canary {
    /// `sent`: where the recording's secret went when the plugin left it
    /// to the credential.
    fn of(exchanges: &[Exchange], sent: Option<Placement>) -> Canary {
        let placements = exchanges
            .iter()
            .flat_map(|e| &e.request.credentials)
            .map(|c| {
                let placement = match (&c.placement, &sent) {
                    (Placement::AsStored, Some(sent)) => sent.clone(),
                    (asked, _) => asked.clone(),
                };
                (c.handle.as_str().to_owned(), placement)
            })
            .collect();
        Canary { placements }
    }
}

impl SecretSource for Canary {
    fn secret_for<'a>(
        &'a self,
        _workspace_id: &'a str,
        _connector_id: &'a str,
        handle: &'a CredentialHandle,
        _host: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Injection, SecretError>> + Send + 'a>> {
        Box::pin(async move {
            let placement = self.placements.get(handle.as_str()).cloned().ok_or(SecretError::Unknown)?;
            Ok(Injection { secret: SecretString::from(CANARY), renewable: false, any_401_renews: false, placement })
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lines(items: &[Value]) -> Vec<Value> {
        let mut out = items.to_vec();
        out.push(json!({ "end": "complete" }));
        out
    }

    #[test]
    fn each_distinct_state_is_resumed_once_but_the_one_started_from() {
        let read = lines(&[
            json!({ "record": { "id": 1 } }),
            json!({ "checkpoint": { "since": 0 } }),
            json!({ "record": { "id": 2 } }),
            json!({ "checkpoint": { "since": 0 } }),
            json!({ "checkpoint": { "since": 2 } }),
        ]);
        assert_eq!(resume_points(&read, Some(&json!({ "since": 0 }))), vec![(3, json!({ "since": 2 }))]);
        assert_eq!(resume_points(&read, None), vec![(1, json!({ "since": 0 })), (3, json!({ "since": 2 }))]);
    }

    #[test]
    fn at_most_so_many_states_are_resumed_spread_over_the_read() {
        let read: Vec<Value> = (0..100).map(|i| json!({ "checkpoint": { "n": i } })).collect();
        let points = resume_points(&lines(&read), None);
        assert_eq!(points.len(), MAX_RESUMES);
        assert_eq!(points[0].0, 1);
        assert!(points.last().unwrap().0 > 90);
    }

    #[test]
    fn records_twice_and_missing_are_named_by_key() {
        let full = vec![json!({ "id": 1 }), json!({ "id": 2 }), json!({ "id": 3 })];
        let again = vec![json!({ "id": 1 }), json!({ "id": 2 }), json!({ "id": 2 })];
        let found = compare_records(&full, &again, &["id".to_owned()]);
        assert_eq!(found, vec!["1 record(s) written twice: [2]".to_owned(), "1 record(s) missing: [3]".to_owned()]);
        assert!(compare_records(&full, &full, &[]).is_empty());
        assert_eq!(missing_keys(&full, &again, &["id".to_owned()]), vec![json!([3])]);
    }

    #[test]
    fn every_echo_form_is_one_the_egress_scrubs() {
        let scrubbed = crate::egress::reflections(CANARY, &Placement::Bearer);
        for (name, form) in echo_forms() {
            assert!(scrubbed.iter().any(|f| f == form.as_bytes()), "{name}: {form}");
        }
        let mut value = json!({ "data": [{ "id": 1 }], "meta": {} });
        plant(&mut value, &echo_forms(), 0);
        assert_eq!(value["data"][0]["echo_raw"], CANARY);
        assert_eq!(value["echo_percent"].as_str().unwrap(), "cnf%2BCanary%2F7%22q%22Zx%3D");
    }
}
