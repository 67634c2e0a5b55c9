//! No silent loss, as a property under faults: runs drawn at random from
//! a seed, each a sync under a data contract through the paged test
//! plugin or the bundled REST manifest source, then a replay of what the
//! contract kept aside, while faults strike.
//!
//! - **Drift.** Records drift from the declared schema at random: a value
//!   of another type, a field the schema does not declare, a record
//!   without its id.
//! - **A malformed page.** The provider answers one page with a body cut
//!   short. The job fails for good, naming the page, and the next sync
//!   resumes from the state saved before it.
//! - **`kill -9`.** The server is killed at a random moment of the sync
//!   and of the replay; a new process takes the job over once its lease
//!   runs out.
//!
//! Every run checks the same promises:
//!
//! - every ledger balances, with nothing unaccounted;
//! - every record the contract lets through is in the destination table
//!   exactly once, and every record it keeps aside is in the rejected
//!   table exactly once;
//! - a replay under a contract that now lets the drifted values through
//!   loads each of them exactly once and leaves only the records that
//!   still break a rule.
//!
//! The destination is SQLite, PostgreSQL or an Iceberg lakehouse, the
//! sync mode append or deduplicated (a lakehouse appends), the rules
//! `quarantine` or `discard_value`, all drawn from the seed. CI runs the fixed seeds below. The benchmark suite runs
//! a thousand random ones (about two and a half seconds each, most of it
//! pages' delays and leases running out, so the debug build serves):
//! `FAULT_RUNS=1000 cargo test --test integration faults`, and
//! `FAULT_SEED=<seed>` runs the one a failure names again.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::json_ok;
use crate::support::process::ServerProcess;
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::replicas::{CrashInto, CrashTarget, Processes};

/// The seeds CI runs: between them, every destination (a lakehouse each
/// third seed), both modes, every rule and every fault.
const FIXED_SEEDS: [u64; 9] = [1, 2, 3, 4, 5, 6, 7, 8, 9];

/// How a record drifts from the schema the test plugin declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drift {
    Fits,
    /// `kind` is a number: a type change.
    KindNumber,
    /// A field the schema does not declare: a new column.
    Coupon,
    /// `id` is null: an invalid record (the id is required, and the key).
    NoId,
}

/// The connector a run syncs through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Connector {
    /// The paged test plugin.
    Paged,
    /// The bundled REST manifest source, reading the same protocol from a
    /// manifest (cursor paging, incremental on `updated_at` through the
    /// provider's `since` filter).
    RestManifest,
}

/// What one run draws from its seed.
struct Plan {
    seed: u64,
    connector: Connector,
    into: CrashInto,
    mode: &'static str,
    new_columns: &'static str,
    type_changes: &'static str,
    drifts: Vec<Drift>,
    page_size: u64,
    /// Milliseconds each page waits before it is answered.
    page_delay_ms: u64,
    /// The offset of the page answered once with a body cut short.
    malformed_at: Option<usize>,
    /// When the server is killed during the sync, in milliseconds.
    kill_sync_after: Option<u64>,
    /// When the server is killed during the replay, in milliseconds.
    kill_replay_after: Option<u64>,
}

/// A failure names the seed and what it drew, the drifts counted.
impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = |d: Drift| self.drifts.iter().filter(|x| **x == d).count();
        f.debug_struct("Plan")
            .field("seed", &self.seed)
            .field("connector", &self.connector)
            .field("into", &self.into)
            .field("mode", &self.mode)
            .field("new_columns", &self.new_columns)
            .field("type_changes", &self.type_changes)
            .field("records", &self.drifts.len())
            .field("kind_number", &count(Drift::KindNumber))
            .field("coupon", &count(Drift::Coupon))
            .field("no_id", &count(Drift::NoId))
            .field("page_size", &self.page_size)
            .field("page_delay_ms", &self.page_delay_ms)
            .field("malformed_at", &self.malformed_at)
            .field("kill_sync_after", &self.kill_sync_after)
            .field("kill_replay_after", &self.kill_replay_after)
            .finish()
    }
}

impl Plan {
    fn draw(seed: u64) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let count = rng.random_range(40..=160usize);
        let drift_rate = [0.0, 0.05, 0.25][rng.random_range(0..3)];
        let drifts = (0..count)
            .map(|_| {
                if rng.random_bool(drift_rate) {
                    [Drift::KindNumber, Drift::Coupon, Drift::NoId][rng.random_range(0..3)]
                } else {
                    Drift::Fits
                }
            })
            .collect();
        let page_size = rng.random_range(3..=12u64);
        let pages = count.div_ceil(page_size as usize);
        let page_delay_ms = rng.random_range(4..=12u64);
        let rule = |rng: &mut StdRng| if rng.random_bool(0.5) { "quarantine" } else { "discard_value" };
        Plan {
            seed,
            into: if seed.is_multiple_of(3) {
                CrashInto::Iceberg
            } else if seed.is_multiple_of(2) {
                CrashInto::Postgres
            } else {
                CrashInto::Sqlite
            },
            // A lakehouse appends (it does not deduplicate).
            mode: match rng.random_bool(0.5) {
                false if !seed.is_multiple_of(3) => "incremental_deduped",
                _ => "incremental_append",
            },
            new_columns: rule(&mut rng),
            type_changes: rule(&mut rng),
            drifts,
            page_size,
            page_delay_ms,
            malformed_at: rng.random_bool(0.3).then(|| rng.random_range(0..pages) * page_size as usize),
            kill_sync_after: rng
                .random_bool(0.6)
                .then(|| rng.random_range(0..=(pages as u64 * page_delay_ms + page_delay_ms))),
            kill_replay_after: rng.random_bool(0.5).then(|| rng.random_range(0..=40u64)),
            // Drawn last, so what a seed drew before it stays the same.
            connector: if rng.random_bool(0.5) { Connector::Paged } else { Connector::RestManifest },
        }
    }

    fn records(&self) -> Vec<Value> {
        let at = |i: usize| format!("2026-01-01T00:{:02}:{:02}Z", i / 60, i % 60);
        self.drifts
            .iter()
            .enumerate()
            .map(|(i, drift)| {
                let mut r =
                    json!({ "id": i, "kind": "open", "updated_at": at(i), "payload": { "n": i }, "note": "fits" });
                match drift {
                    Drift::Fits => {}
                    Drift::KindNumber => r["kind"] = json!(i),
                    Drift::Coupon => r["coupon"] = json!(format!("SAVE{i}")),
                    Drift::NoId => r["id"] = Value::Null,
                }
                r
            })
            .collect()
    }

    /// Whether the contract keeps a record aside rather than loading it.
    fn kept_aside(&self, drift: Drift, new_columns: &str, type_changes: &str) -> bool {
        match drift {
            Drift::Fits => false,
            Drift::KindNumber => type_changes == "quarantine",
            Drift::Coupon => new_columns == "quarantine",
            Drift::NoId => true,
        }
    }

    /// Records loaded and kept aside under the run's contract.
    fn expected(&self, new_columns: &str, type_changes: &str) -> (i64, i64) {
        let aside = self.drifts.iter().filter(|d| self.kept_aside(**d, new_columns, type_changes)).count() as i64;
        (self.drifts.len() as i64 - aside, aside)
    }
}

/// The fake provider: the paged test plugin's protocol (`data`,
/// `next_cursor`, a bearer token, and a `since` filter for the REST
/// manifest source) over the current run's records, one page of which may
/// be answered once with a body cut short.
struct Faulty {
    token: String,
    records: Mutex<Arc<Vec<Value>>>,
    delay_ms: AtomicU64,
    /// The offset of the page to cut short once (`usize::MAX`: none).
    malformed_at: AtomicUsize,
}

fn routes(p: Arc<Faulty>) -> Router {
    Router::new()
        .route(
            "/events",
            get(
                |State(p): State<Arc<Faulty>>,
                 h: HeaderMap,
                 Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    if h.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {}", p.token)) {
                        return StatusCode::UNAUTHORIZED.into_response();
                    }
                    tokio::time::sleep(Duration::from_millis(p.delay_ms.load(Ordering::SeqCst))).await;
                    let all = p.records.lock().unwrap().clone();
                    // `since`: records updated at or after it (the times
                    // are all written alike, so as text they sort in time).
                    let since = q.get("since");
                    let records: Vec<&Value> = all
                        .iter()
                        .filter(|r| since.is_none_or(|s| r["updated_at"].as_str().is_some_and(|u| u >= s.as_str())))
                        .collect();
                    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(100);
                    let start: usize = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
                    let end = (start + limit).min(records.len());
                    let next = if end < records.len() { json!(end.to_string()) } else { Value::Null };
                    let body = json!({ "data": records[start.min(end)..end], "next_cursor": next }).to_string();
                    // The page of the first read that reaches the offset.
                    let at = all.len() - records.len() + start;
                    if p.malformed_at.compare_exchange(at, usize::MAX, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                        let cut = body[..body.len() / 2].to_owned();
                        return ([("content-type", "application/json")], cut).into_response();
                    }
                    ([("content-type", "application/json")], body).into_response()
                },
            ),
        )
        .with_state(p)
}

/// The servers of a property test, kept across its runs (a run that
/// kills one starts the next).
struct Bench {
    procs: Processes,
    server: ServerProcess,
    provider: Arc<Faulty>,
    _fake: FakeProvider,
}

impl Bench {
    async fn start() -> Bench {
        crate::support::init_crypto();
        let ca = TestCa::new();
        let token = format!("faults-{}", uuid::Uuid::new_v4().simple());
        let provider = Arc::new(Faulty {
            token,
            records: Mutex::new(Arc::new(Vec::new())),
            delay_ms: AtomicU64::new(0),
            malformed_at: AtomicUsize::new(usize::MAX),
        });
        let fake = FakeProvider::start(&ca, &["api.source.test"], routes(provider.clone())).await;
        let mut procs = Processes::new(&ca, &fake);
        procs.env.push(("SERVICE_JOB_LEASE_SECS", "1".into()));
        procs.env.push(("SERVICE_WAREHOUSE_ALLOWED_HOSTS", "127.0.0.1".into()));
        let server = ServerProcess::start(procs.env.clone()).await;
        procs.adopt_workspace(&server.base).await;
        let load = "/v1/admin/plugins/test_paged_source/load";
        json_ok(procs.api(&server.base, Method::POST, load).send().await.unwrap()).await;
        Bench { procs, server, provider, _fake: fake }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> reqwest::Response {
        let mut request = self.procs.api(&self.server.base, method, path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        request.send().await.unwrap()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        json_ok(self.call(Method::POST, path, Some(body)).await).await
    }

    /// Kills the server `after` milliseconds from now (if at all) and
    /// starts another, which takes the job over once its lease runs out.
    async fn maybe_kill(&mut self, after: Option<u64>) {
        let Some(after) = after else { return };
        tokio::time::sleep(Duration::from_millis(after)).await;
        self.server.kill();
        self.server = ServerProcess::start(self.procs.env.clone()).await;
    }

    /// One run: sync (and, after a malformed page, sync again), check,
    /// let the drifted values through, replay, check again.
    async fn run(&mut self, plan: &Plan) {
        // Without a PostgreSQL server (and none required), SQLite only.
        let seed = plan.seed;
        let run = uuid::Uuid::new_v4().simple();
        let mut target = match CrashTarget::new(plan.into).await {
            Some(target) => target.in_namespace(&format!("faults_{seed}_{run}")),
            None => CrashTarget::new(CrashInto::Sqlite).await.expect("SQLite needs no server"),
        };
        let file = format!("faults-{seed}-{run}.db");
        *self.provider.records.lock().unwrap() = Arc::new(plan.records());
        self.provider.malformed_at.store(plan.malformed_at.unwrap_or(usize::MAX), Ordering::SeqCst);
        self.provider.delay_ms.store(plan.page_delay_ms, Ordering::SeqCst);

        let connector = match plan.connector {
            Connector::Paged => "test_paged_source",
            Connector::RestManifest => "conn_rest_manifest",
        };
        let cred = self
            .post(
                "/v1/credentials",
                json!({ "connector_id": connector, "hosts": ["api.source.test"], "secret": self.provider.token }),
            )
            .await;
        let handle = &cred["data"]["credential_handle"];
        let configuration = match plan.connector {
            Connector::Paged => {
                json!({ "base_url": "https://api.source.test", "credential_handle": handle, "page_size": plan.page_size })
            }
            Connector::RestManifest => {
                let manifest = json!({ "streams": [{ "name": "events", "path": "/events", "records": "/data",
                    "primary_key": ["id"], "params": { "limit": plan.page_size },
                    "paging": { "type": "cursor", "param": "cursor", "next_cursor": "/next_cursor" },
                    "incremental": { "cursor_field": "updated_at", "param": "since" },
                    "schema": event_schema() }] });
                json!({ "base_url": "https://api.source.test", "credential_handle": handle, "manifest": manifest })
            }
        };
        let source = self
            .post(
                "/v1/sources",
                json!({ "connector_id": connector, "name": format!("faults {seed}"), "configuration": configuration }),
            )
            .await;
        let destination = self.post("/v1/destinations", target.destination(&file)).await;
        let stream = |new_columns: &str, type_changes: &str| {
            json!([{ "name": "events", "sync_mode": plan.mode, "contract": {
                "new_columns": new_columns, "type_changes": type_changes, "invalid_records": "quarantine" } }])
        };
        let pipeline = self
            .post(
                "/v1/pipelines",
                json!({ "name": format!("faults {seed}"), "source_id": source["data"]["source_id"],
                    "destination_id": destination["data"]["destination_id"],
                    "streams": stream(plan.new_columns, plan.type_changes) }),
            )
            .await;
        let pipeline = pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned();

        // The sync, killed at random; after a malformed page it fails for
        // good, and the next sync resumes from the saved state.
        let job = self.post(&format!("/v1/pipelines/{pipeline}/sync"), json!({})).await;
        let job_id = job["data"]["job_id"].as_str().unwrap().to_owned();
        self.maybe_kill(plan.kill_sync_after).await;
        let mut last = self.procs.wait(&self.server.base, &job_id).await;
        balances(&last, plan, "the sync");
        if last["status"] == "failed" {
            assert!(plan.malformed_at.is_some(), "{plan:?}: the sync failed without a malformed page: {last}");
            let error = last["error"].as_str().unwrap_or_default();
            assert!(!error.is_empty(), "{plan:?}: the failure says why: {last}");
            let again = self.post(&format!("/v1/pipelines/{pipeline}/sync"), json!({})).await;
            last = self.procs.wait(&self.server.base, again["data"]["job_id"].as_str().unwrap()).await;
            balances(&last, plan, "the sync after the malformed page");
        }
        assert_eq!(last["status"], "succeeded", "{plan:?}: {last}");
        let (loaded, aside) = plan.expected(plan.new_columns, plan.type_changes);
        self.check(&mut target, (&file, &pipeline), plan, loaded, aside, "after the sync").await;

        // The drifted values are let through; a replay loads what fits now.
        let patch = json!({ "streams": stream("evolve", "evolve") });
        json_ok(self.call(Method::PATCH, &format!("/v1/pipelines/{pipeline}"), Some(patch)).await).await;
        let replay = self.call(Method::POST, &format!("/v1/pipelines/{pipeline}/rejected/replay"), None).await;
        if aside == 0 {
            assert_eq!(replay.status(), 409, "{plan:?}: nothing to replay");
            return;
        }
        let replay = json_ok(replay).await;
        let job_id = replay["data"]["job_id"].as_str().unwrap().to_owned();
        self.maybe_kill(plan.kill_replay_after).await;
        let last = self.procs.wait(&self.server.base, &job_id).await;
        assert_eq!(last["status"], "succeeded", "{plan:?}: the replay: {last}");
        balances(&last, plan, "the replay");
        let (loaded, aside) = plan.expected("evolve", "evolve");
        self.check(&mut target, (&file, &pipeline), plan, loaded, aside, "after the replay").await;
    }

    /// Each record the contract let through is in the table once, and
    /// each it kept aside is in the rejected table once (in a lakehouse,
    /// which appends a record kept aside again, once as its readers read
    /// it: through the API).
    async fn check(
        &self,
        target: &mut CrashTarget,
        (file, pipeline): (&str, &str),
        plan: &Plan,
        loaded: i64,
        aside: i64,
        when: &str,
    ) {
        let (rows, ids) = target.count(&self.procs, file, "events", "id").await;
        assert_eq!((rows, ids), (loaded, loaded), "{plan:?}, {when}: {rows} rows for {ids} ids, {loaded} expected");
        if aside > 0 || when == "after the replay" {
            let (rows, records) = match target.into {
                CrashInto::Iceberg => self.rejected(pipeline).await,
                _ => target.count(&self.procs, file, "events__rejected", "record").await,
            };
            assert_eq!(
                (rows, records),
                (aside, aside),
                "{plan:?}, {when}: {rows} rejected rows for {records} records, {aside} expected"
            );
        }
    }
}

impl Bench {
    /// The pipeline's rejected rows as the API lists them, and how many
    /// records they hold.
    async fn rejected(&self, pipeline: &str) -> (i64, i64) {
        let (mut records, mut cursor) = (Vec::new(), None::<String>);
        loop {
            let mut path = format!("/v1/pipelines/{pipeline}/rejected?stream=events&limit=100");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let page = json_ok(self.call(Method::GET, &path, None).await).await;
            records.extend(page["data"]["items"].as_array().unwrap().iter().map(|r| r["record"].to_string()));
            match page["data"]["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        let rows = records.len() as i64;
        records.sort();
        records.dedup();
        (rows, records.len() as i64)
    }
}

/// The schema the paged test plugin declares for its stream, which the
/// manifest declares too.
fn event_schema() -> Value {
    json!({ "type": "object", "required": ["id"], "additionalProperties": true, "properties": {
        "id": { "type": ["string", "integer"] },
        "kind": { "type": "string" },
        "updated_at": { "type": "string", "format": "date-time" },
        "payload": { "type": "object", "additionalProperties": false, "properties": { "n": { "type": "integer" } } },
        "note": { "type": ["string", "null"] },
        "amount": { "type": ["string", "number", "null"], "format": "decimal", "precision": 38, "scale": 9 },
        "day": { "type": ["string", "null"], "format": "date" }
    } })
}

/// Every stream of the job's ledger accounts for every record it read;
/// a job that succeeded balances.
fn balances(job: &Value, plan: &Plan, what: &str) {
    let ledger = &job["progress"]["ledger"];
    let streams = ledger["streams"].as_object().unwrap_or_else(|| panic!("{plan:?}, {what}: no ledger: {job}"));
    for (name, s) in streams {
        assert_eq!(s["unaccounted"], 0, "{plan:?}, {what}: stream {name} lost or doubled records: {ledger}");
    }
    if job["status"] == "succeeded" {
        assert_eq!(ledger["balanced"], true, "{plan:?}, {what}: {ledger}");
    }
}

/// The seeds to run: `FAULT_SEED` alone, `FAULT_RUNS` random ones, or
/// the fixed ones.
fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("FAULT_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    match std::env::var("FAULT_RUNS").ok().and_then(|n| n.parse::<u64>().ok()) {
        Some(runs) => {
            let base: u64 = rand::random_range(1_000..u64::MAX / 2);
            (base..base + runs).collect()
        }
        None => FIXED_SEEDS.to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_and_replays_under_random_faults_lose_and_double_nothing() {
    let mut bench = Bench::start().await;
    let seeds = seeds();
    let total = seeds.len();
    for (n, seed) in seeds.into_iter().enumerate() {
        let plan = Plan::draw(seed);
        bench.run(&plan).await;
        if total > FIXED_SEEDS.len() && (n + 1).is_multiple_of(50) {
            eprintln!("faults: {} of {total} runs held (the last seed {seed})", n + 1);
        }
    }
}
