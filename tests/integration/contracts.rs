//! Data contracts end to end: a provider whose records drift from the
//! schema the source declares (a value of another type, a new field, a
//! record without its id, a flat value where an object was), synced
//! through the paged test plugin into SQLite, PostgreSQL and JSON-lines
//! destinations. Each contract mode does what it says, the ledger accounts
//! for every record, the rejected rows are readable through the API and
//! the CLI with why, and nobody outside the workspace's editors reads them.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use reqwest::Method;
use serde_json::{Value, json};
use service::access::Role;

use crate::on_both_backends;
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, count_rows, expect_error, json_ok};

/// The fake provider: the paged test plugin's protocol (`data`,
/// `next_cursor`, a bearer token) over a list of records, which a test
/// may add to.
struct Drifting {
    token: String,
    records: std::sync::Mutex<Vec<Value>>,
    /// Milliseconds each page waits before it is answered.
    delay_ms: std::sync::atomic::AtomicU64,
    /// Pages from this record on answer 500 (0: none).
    failing_from: std::sync::atomic::AtomicUsize,
}

fn routes(p: Arc<Drifting>) -> Router {
    Router::new()
        .route(
            "/events",
            get(
                |State(p): State<Arc<Drifting>>,
                 h: HeaderMap,
                 Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    if h.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {}", p.token)) {
                        return StatusCode::UNAUTHORIZED.into_response();
                    }
                    let delay = p.delay_ms.load(std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(100);
                    let start: usize = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
                    let failing = p.failing_from.load(std::sync::atomic::Ordering::SeqCst);
                    if failing > 0 && start >= failing {
                        return (StatusCode::INTERNAL_SERVER_ERROR, "down").into_response();
                    }
                    let records = p.records.lock().unwrap().clone();
                    let end = (start + limit).min(records.len());
                    let next = if end < records.len() { json!(end.to_string()) } else { Value::Null };
                    axum::Json(json!({ "data": records[start.min(end)..end], "next_cursor": next })).into_response()
                },
            ),
        )
        .with_state(p)
}

/// Ten records: six that fit the declared schema, then a kind that is a
/// number, a field the schema does not declare, a record without its id,
/// and a payload that is text instead of an object.
fn drifting_records() -> Vec<Value> {
    let at = |i: u64| format!("2026-01-01T00:00:{i:02}Z");
    let mut records: Vec<Value> = (1..=6)
        .map(|i| json!({ "id": i, "kind": "open", "updated_at": at(i), "payload": { "n": i }, "note": "fits" }))
        .collect();
    records.push(json!({ "id": 7, "kind": 7, "updated_at": at(7), "payload": { "n": 7 } }));
    records.push(json!({ "id": 8, "kind": "open", "updated_at": at(8), "payload": { "n": 8 }, "coupon": "SAVE8" }));
    records.push(json!({ "id": null, "kind": "open", "updated_at": at(9), "payload": { "n": 9 } }));
    records.push(json!({ "id": 10, "kind": "open", "updated_at": at(10), "payload": "flat" }));
    records
}

struct Fixture {
    srv: TestServer,
    source_id: String,
    /// The provider's credential's handle.
    credential: Value,
    records: Vec<Value>,
    provider: Arc<Drifting>,
    _provider: FakeProvider,
}

async fn setup(backend: Backend) -> Fixture {
    let ca = TestCa::new();
    let records = drifting_records();
    let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
    let p = Arc::new(Drifting {
        token,
        records: records.clone().into(),
        delay_ms: Default::default(),
        failing_from: Default::default(),
    });
    let provider = FakeProvider::start(&ca, &["api.source.test"], routes(p.clone())).await;
    let trust = Trust::new(&ca).serving(&provider, &["api.source.test"]);
    let srv = TestServer::start_with(backend, |c| c.plugins.egress = trust.policy()).await.unwrap();
    srv.load_test_plugin("test_paged_source").await;
    let cred = json_ok(
        srv.post("/v1/credentials", json!({ "hosts": ["api.source.test"], "secret": p.token })).send().await.unwrap(),
    )
    .await;
    let src = json_ok(
        srv.post("/v1/sources", json!({ "connector_id": "test_paged_source", "name": "Drifting", "configuration": {
            "base_url": "https://api.source.test", "credential_handle": cred["data"]["credential_handle"], "page_size": 4 } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let source_id = src["data"]["source_id"].as_str().unwrap().to_owned();
    let credential = cred["data"]["credential_handle"].clone();
    Fixture { srv, source_id, credential, records, provider: p, _provider: provider }
}

impl Fixture {
    async fn destination(&self, kind: &str, configuration: Value) -> String {
        let body = json!({ "name": kind, "kind": kind, "configuration": configuration });
        let d = json_ok(self.srv.post("/v1/destinations", body).send().await.unwrap()).await;
        d["data"]["destination_id"].as_str().unwrap().to_owned()
    }

    fn pipeline_body(&self, destination: &str, mode: &str, contract: Value) -> Value {
        json!({ "name": "drift", "source_id": self.source_id, "destination_id": destination,
            "streams": [{ "name": "events", "sync_mode": mode, "contract": contract }] })
    }

    async fn pipeline(&self, destination: &str, mode: &str, contract: Value) -> String {
        let body = self.pipeline_body(destination, mode, contract);
        let p = json_ok(self.srv.post("/v1/pipelines", body).send().await.unwrap()).await;
        p["data"]["pipeline_id"].as_str().unwrap().to_owned()
    }

    async fn sync(&self, pipeline: &str) -> Value {
        let job =
            json_ok(self.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap())
                .await;
        self.srv.wait_job(job["data"]["job_id"].as_str().unwrap()).await
    }

    /// Replays the pipeline's rejected rows; the job's counts (read,
    /// loaded, deduplicated, quarantined, unaccounted) and the job.
    async fn replayed(&self, pipeline: &str) -> (Vec<Value>, Value) {
        let path = format!("/v1/pipelines/{pipeline}/rejected/replay");
        let started = json_ok(self.srv.request(Method::POST, &path).send().await.unwrap()).await;
        let job = self.srv.wait_job(started["data"]["job_id"].as_str().unwrap()).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        let events = &job["progress"]["ledger"]["streams"]["events"];
        let counts = ["read", "loaded", "deduplicated", "quarantined", "unaccounted"];
        (counts.iter().map(|k| events[*k].clone()).collect(), job)
    }

    /// Every rejected row of the pipeline, read `per_page` at a time.
    async fn rejected(&self, pipeline: &str, per_page: u32) -> Vec<Value> {
        let (mut all, mut cursor) = (Vec::new(), None::<String>);
        loop {
            let mut path = format!("/v1/pipelines/{pipeline}/rejected?stream=events&limit={per_page}");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let page = json_ok(self.srv.get(&path).send().await.unwrap()).await;
            let items = page["data"]["items"].as_array().unwrap();
            assert!(items.len() <= per_page as usize);
            all.extend(items.iter().cloned());
            match page["data"]["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return all,
            }
        }
    }
}

/// Quarantine and discard, into each kind of destination that keeps
/// rejected rows: the six records that fit and the one whose new field
/// is left out load; the other three are kept aside, each with its
/// reason, field, rule, job, attempt and cursor, and the record as read.
async fn quarantined_records_are_kept_aside_with_why_and_the_ledger_balances(backend: Backend) {
    let fx = setup(backend).await;
    let warehouse = crate::support::PgDatabase::create().await.expect("a PostgreSQL warehouse");
    let contract =
        json!({ "new_columns": "discard_value", "type_changes": "quarantine", "invalid_records": "quarantine" });
    let ws = fx.srv.workspace_id().await;
    let destinations = [
        ("sqlite", json!({ "file": "drift.db" })),
        ("postgres", json!({ "url": warehouse.url })),
        ("jsonl", json!({ "directory": "drift" })),
    ];
    for (kind, configuration) in destinations {
        let dest = fx.destination(kind, configuration).await;
        let pipeline = fx.pipeline(&dest, "incremental_append", contract.clone()).await;
        let job = fx.sync(&pipeline).await;
        assert_eq!(job["status"], "succeeded", "{kind}: {job}");
        let ledger = &job["progress"]["ledger"];
        assert_eq!(ledger["balanced"], true, "{kind}: {job}");
        let events = &ledger["streams"]["events"];
        let counts: Vec<&Value> = ["read", "loaded", "quarantined", "value_discarded", "left_to_retry", "unaccounted"]
            .iter()
            .map(|k| &events[*k])
            .collect();
        assert_eq!(counts, [&json!(10), &json!(7), &json!(3), &json!(1), &json!(0), &json!(0)], "{kind}: {job}");

        // What loaded: seven rows, the new field left out.
        match kind {
            "jsonl" => {
                let text = std::fs::read_to_string(fx.srv.exports(&ws, "drift").join("events.jsonl")).unwrap();
                let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
                assert_eq!(lines.len(), 7, "{text}");
                assert!(lines.iter().all(|l| l.get("coupon").is_none()), "{text}");
                assert!(lines.iter().any(|l| l["id"] == 8), "the record loaded, without its new field");
            }
            _ => {
                let url = match kind {
                    "sqlite" => format!("sqlite://{}?mode=ro", fx.srv.warehouse(&ws, "drift.db").display()),
                    _ => warehouse.url.clone(),
                };
                assert_eq!(count_rows(&url, "events").await, 7, "{kind}");
            }
        }

        // What was kept aside, read a page of two at a time.
        let rejected = fx.rejected(&pipeline, 2).await;
        assert_eq!(rejected.len(), 3, "{kind}: {rejected:?}");
        let mut why: Vec<(String, String, String)> = rejected
            .iter()
            .map(|r| {
                let text = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
                (text("reason"), text("pointer"), text("rule"))
            })
            .collect();
        why.sort();
        assert_eq!(
            why,
            [
                ("missing_required".into(), "/id".into(), "invalid_records".into()),
                ("type_mismatch".into(), "/kind".into(), "type_changes".into()),
                ("type_mismatch".into(), "/payload".into(), "type_changes".into()),
            ],
            "{kind}: {rejected:?}"
        );
        for r in &rejected {
            assert_eq!((&r["job_id"], &r["attempt"], &r["stream"]), (&job["job_id"], &json!(1), &json!("events")));
            let original = fx.records.iter().find(|o| o["updated_at"].as_str() == r["cursor"].as_str());
            assert_eq!(Some(&r["record"]), original, "{kind}: the record as read, found by its cursor: {r}");
        }
    }

    // A freezing contract fails the sync before the batch is written,
    // naming the field and the rule; the ledger leaves it all to a retry
    // that will fail the same way.
    let dest = fx.destination("sqlite", json!({ "file": "frozen.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append", json!({ "type_changes": "freeze" })).await;
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["attempts"], 1, "a contract breach is not retried: {job}");
    let error = job["error"].as_str().unwrap();
    assert!(error.contains("type_mismatch at /kind") && error.contains("type_changes"), "{error}");
    let events = &job["progress"]["ledger"]["streams"]["events"];
    assert_eq!(events["loaded"], 4, "the first page loaded, the second was frozen: {job}");
    assert_eq!(events["left_to_retry"], events["read"].as_u64().unwrap() - 4, "{job}");
    let url = format!("sqlite://{}?mode=ro", fx.srv.warehouse(&ws, "frozen.db").display());
    assert_eq!(count_rows(&url, "events").await, 4);
    fx.srv.stop().await;
}

/// A sync retried after its provider failed part way accounts for the
/// whole job: the first attempt's ledger (what it loaded and kept aside,
/// what it left to the retry) stays beside the last one's, in the API and
/// in `service jobs get`, and every attempt balances.
async fn a_retried_sync_keeps_the_ledger_of_every_attempt(backend: Backend) {
    let fx = setup(backend).await;
    let ws = fx.srv.workspace_id().await;
    let dest = fx.destination("sqlite", json!({ "file": "retried.db" })).await;
    let quarantine = json!({ "type_changes": "quarantine", "invalid_records": "quarantine" });
    let pipeline = fx.pipeline(&dest, "incremental_append", quarantine).await;
    // The second page on fails until the first attempt has ended.
    fx.provider.failing_from.store(4, std::sync::atomic::Ordering::SeqCst);
    let path = format!("/v1/pipelines/{pipeline}/sync");
    let job = json_ok(fx.srv.request(Method::POST, &path).send().await.unwrap()).await;
    let id = job["data"]["job_id"].as_str().unwrap().to_owned();
    let mut seen = Value::Null;
    for _ in 0..600 {
        seen = json_ok(fx.srv.get(&format!("/v1/jobs/{id}")).send().await.unwrap()).await["data"].clone();
        if seen["attempts"] == 1 && seen["status"] == "queued" || seen["status"] == "failed" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(seen["status"], "queued", "the attempt failed and another is due: {seen}");
    fx.provider.failing_from.store(0, std::sync::atomic::Ordering::SeqCst);
    let done = fx.srv.wait_job(&id).await;
    assert_eq!((&done["status"], &done["attempts"]), (&json!("succeeded"), &json!(2)), "{done}");

    let progress = &done["progress"];
    let earlier = progress["earlier_ledgers"].as_array().unwrap_or_else(|| panic!("{done}"));
    assert_eq!(earlier.len(), 1, "{done}");
    let (first, last) = (&earlier[0], &progress["ledger"]);
    assert_eq!((&first["attempt"], &last["attempt"]), (&json!(1), &json!(2)), "{done}");
    assert_eq!((&first["balanced"], &last["balanced"]), (&json!(true), &json!(true)), "{done}");
    let (a, b) = (&first["streams"]["events"], &last["streams"]["events"]);
    assert_eq!((&a["read"], &a["loaded"], &a["quarantined"]), (&json!(4), &json!(4), &json!(0)), "{done}");
    assert_eq!(b["unaccounted"], 0, "{done}");
    // What the job stored over both attempts is what the table holds.
    let url = format!("sqlite://{}?mode=ro", fx.srv.warehouse(&ws, "retried.db").display());
    let loaded = a["loaded"].as_u64().unwrap() + b["loaded"].as_u64().unwrap();
    assert_eq!(count_rows(&url, "events").await, loaded as i64, "{done}");
    assert_eq!(count_rows(&url, "events").await, 7);
    assert_eq!(fx.rejected(&pipeline, 50).await.len(), 3);

    let config = tempfile::tempdir().unwrap();
    let cli = crate::cli_api::Cli::of(&fx.srv, config.path());
    let shown = cli.ok(&["jobs", "get", &id]).await;
    let first_at = shown.find("Ledger of attempt 1: balanced").unwrap_or_else(|| panic!("{shown}"));
    let last_at = shown.find("Ledger of attempt 2: balanced").unwrap_or_else(|| panic!("{shown}"));
    assert!(first_at < last_at, "oldest first: {shown}");
    fx.srv.stop().await;
}

/// What a contract cannot be, and who may read what it kept aside.
async fn contracts_refuse_what_cannot_work_and_rejected_rows_stay_with_editors(backend: Backend) {
    let fx = setup(backend).await;
    let sqlite = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let refused = |destination: &str, contract: Value| {
        let body = fx.pipeline_body(destination, "incremental_append", contract);
        fx.srv.post("/v1/pipelines", body).send()
    };
    let bad = expect_error(
        refused(&sqlite, json!({ "invalid_records": "discard_value" })).await.unwrap(),
        400,
        "VALIDATION_FAILED",
    )
    .await;
    assert_eq!(bad["details"]["field"], "streams.events.contract.invalid_records", "{bad}");
    let bad =
        expect_error(refused(&sqlite, json!({ "type_changes": "drop" })).await.unwrap(), 400, "VALIDATION_FAILED")
            .await;
    assert!(bad["message"].as_str().unwrap().contains("evolve, freeze, discard_value or quarantine"), "{bad}");
    expect_error(refused(&sqlite, json!({ "columns": "freeze" })).await.unwrap(), 400, "VALIDATION_FAILED").await;
    // A contract on a stream the source does not offer.
    let mut ghost = fx.pipeline_body(&sqlite, "incremental_append", json!({ "type_changes": "quarantine" }));
    ghost["streams"][0]["name"] = json!("ghost");
    let bad = expect_error(fx.srv.post("/v1/pipelines", ghost).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
    assert!(bad["message"].as_str().unwrap().contains("offers no stream ghost"), "{bad}");

    let pipeline = fx.pipeline(&sqlite, "incremental_append", json!({ "type_changes": "quarantine" })).await;
    assert_eq!(fx.sync(&pipeline).await["status"], "succeeded");
    assert_eq!(fx.rejected(&pipeline, 50).await.len(), 2, "the kind and the payload");
    // The CLI lists them with why.
    let config = tempfile::tempdir().unwrap();
    let cli = crate::cli_api::Cli::of(&fx.srv, config.path());
    let shown = cli.ok(&["pipelines", "rejected", &pipeline]).await;
    assert!(shown.starts_with("JOB"), "{shown}");
    let rows: Vec<&str> = shown.lines().filter(|l| l.starts_with("job_")).collect();
    assert_eq!(rows.len(), 2, "{shown}");
    assert!(
        rows.iter().any(|r| r.contains("type_changes") && r.contains("type_mismatch") && r.contains("/kind")),
        "{shown}"
    );
    // A stream the pipeline does not have, and a cursor no page gave.
    let path = format!("/v1/pipelines/{pipeline}/rejected");
    let bad =
        expect_error(fx.srv.get(&format!("{path}?stream=orders")).send().await.unwrap(), 400, "VALIDATION_FAILED")
            .await;
    assert_eq!(bad["details"]["field"], "stream");
    expect_error(fx.srv.get(&format!("{path}?cursor=..%2F")).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
    // A viewer of the workspace may not read the records; another
    // workspace does not see the pipeline at all.
    let ws = fx.srv.workspace_id().await;
    let (_, viewer) = fx.srv.user_in(&ws, Role::Viewer).await;
    expect_error(fx.srv.request_as(&viewer, Method::GET, &path).send().await.unwrap(), 403, "403").await;
    let replay = format!("/v1/pipelines/{pipeline}/rejected/replay");
    expect_error(fx.srv.request_as(&viewer, Method::POST, &replay).send().await.unwrap(), 403, "403").await;
    let (_, other) = fx.srv.other_workspace().await;
    expect_error(fx.srv.request_as(&other, Method::GET, &path).send().await.unwrap(), 404, "404").await;
    expect_error(fx.srv.request_as(&other, Method::POST, &replay).send().await.unwrap(), 404, "404").await;
    fx.srv.stop().await;
}

/// A replay after the contract changed loads the records that fit now,
/// once, and keeps the rest with their new reason; replaying again, or
/// after a crash left rejected rows behind that were already loaded, adds
/// no row twice. Nothing to replay, a sync running, and a destination
/// that cannot replace a row are each refused.
async fn a_replay_loads_what_fits_now_once_and_keeps_the_rest(backend: Backend) {
    use sqlx::{Connection, Row};
    let fx = setup(backend).await;
    let ws = fx.srv.workspace_id().await;
    let dest = fx.destination("sqlite", json!({ "file": "replay.db" })).await;
    let quarantine = json!({ "type_changes": "quarantine", "invalid_records": "quarantine" });
    let pipeline = fx.pipeline(&dest, "incremental_append", quarantine).await;
    let replay =
        |pipeline: &str| fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/rejected/replay")).send();
    // Nothing kept aside yet.
    expect_error(replay(&pipeline).await.unwrap(), 409, "NOTHING_TO_REPLAY").await;
    assert_eq!(fx.sync(&pipeline).await["status"], "succeeded");
    let url = format!("sqlite://{}", fx.srv.warehouse(&ws, "replay.db").display());
    assert_eq!(count_rows(&url, "events").await, 7, "the new field evolves; three are kept aside");
    assert_eq!(fx.rejected(&pipeline, 50).await.len(), 3);

    // While a sync runs, a replay conflicts as another sync would.
    fx.provider.delay_ms.store(1500, std::sync::atomic::Ordering::SeqCst);
    let running =
        json_ok(fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let conflict = expect_error(replay(&pipeline).await.unwrap(), 409, "EXECUTION_CONFLICT").await;
    assert_eq!(conflict["details"]["active_job"]["job_id"], running["data"]["job_id"], "{conflict}");
    fx.provider.delay_ms.store(0, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(fx.srv.wait_job(running["data"]["job_id"].as_str().unwrap()).await["status"], "succeeded");
    // That sync read the last page again (the plugin resumes there) and
    // kept its two breaking records aside again: the same records read
    // after the same state, so their rows are rewritten, not added, in
    // the table as in the rejected table.
    let before: Vec<Value> = fx.rejected(&pipeline, 50).await;
    assert_eq!(before.len(), 3, "{before:?}");
    let rows_before = count_rows(&url, "events").await;
    assert_eq!(rows_before, 7, "the last page read again rewrites its rows");

    // Types may change now; a record without its id still may not.
    let evolve = json!({ "streams": [{ "name": "events", "sync_mode": "incremental_append",
        "contract": { "type_changes": "evolve", "invalid_records": "quarantine" } }] });
    json_ok(fx.srv.request(Method::PATCH, &format!("/v1/pipelines/{pipeline}")).json(&evolve).send().await.unwrap())
        .await;
    // The rejected table as it is, to put back as a crash after the loads
    // and before the deletes would leave it.
    let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let saved = sqlx::query("SELECT * FROM \"events__rejected\"").fetch_all(&mut db).await.unwrap();
    let columns: Vec<String> = saved[0].columns().iter().map(|c| sqlx::Column::name(c).to_owned()).collect();
    let started = json_ok(replay(&pipeline).await.unwrap()).await;
    assert_eq!(started["data"]["kind"], "replay", "{started}");
    let job = fx.srv.wait_job(started["data"]["job_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let events = &job["progress"]["ledger"]["streams"]["events"];
    let counts: Vec<&Value> = ["read", "loaded", "quarantined", "unaccounted"].iter().map(|k| &events[*k]).collect();
    assert_eq!(counts, [&json!(3), &json!(2), &json!(1), &json!(0)], "{job}");
    assert_eq!(count_rows(&url, "events").await, rows_before + 2);
    let kept = fx.rejected(&pipeline, 50).await;
    assert_eq!(kept.len(), 1, "the record without an id: {kept:?}");
    assert!(kept.iter().all(|r| r["reason"] == "missing_required" && r["pointer"] == "/id"), "{kept:?}");

    // A crash between the loads and the deletes leaves the replayed rows
    // in the rejected table: the next replay writes their records again
    // under the same keys, and no row is added.
    for row in &saved {
        let marks = vec!["?"; columns.len()].join(", ");
        let names = columns.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ");
        let insert = format!("INSERT OR REPLACE INTO \"events__rejected\" ({names}) VALUES ({marks})");
        let mut q = sqlx::query(sqlx::AssertSqlSafe(insert));
        for i in 0..columns.len() {
            q = q.bind(
                row.try_get::<Option<String>, _>(i)
                    .unwrap_or_else(|_| row.try_get::<Option<i64>, _>(i).unwrap().map(|n| n.to_string())),
            );
        }
        q.execute(&mut db).await.unwrap();
    }
    db.close().await.unwrap();
    // Through the CLI this time.
    let config = tempfile::tempdir().unwrap();
    let cli = crate::cli_api::Cli::of(&fx.srv, config.path());
    let out = cli.ok(&["pipelines", "replay", &pipeline, "--wait"]).await;
    assert!(out.contains("succeeded"), "{out}");
    let job_id = out.split_whitespace().find(|w| w.starts_with("job_")).unwrap_or_else(|| panic!("{out}"));
    let job = json_ok(fx.srv.get(&format!("/v1/jobs/{job_id}")).send().await.unwrap()).await["data"].clone();
    assert_eq!((&job["status"], &job["kind"]), (&json!("succeeded"), &json!("replay")), "{job}");
    assert_eq!(job["progress"]["ledger"]["streams"]["events"]["loaded"], 2, "{job}");
    assert_eq!(count_rows(&url, "events").await, rows_before + 2, "each replayed record is one row");
    assert_eq!(fx.rejected(&pipeline, 50).await.len(), 1);
    fx.srv.stop().await;
}

/// A JSON-lines destination replays too, though a file cannot replace a
/// line: the records that fit now are appended once, the rejected file is
/// rewritten with what stays aside (with its new reason), another
/// pipeline's lines in the same file stay as they were, and a replay cut
/// short before its rewrite, run again, appends nothing twice.
async fn a_file_replays_each_record_once_and_rewrites_its_rejected_lines(backend: Backend) {
    let fx = setup(backend).await;
    let ws = fx.srv.workspace_id().await;
    let quarantine = json!({ "type_changes": "quarantine", "invalid_records": "quarantine" });
    let lines = |folder: &std::path::Path, name: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(folder.join(name)).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let evolve = json!({ "streams": [{ "name": "events", "sync_mode": "incremental_append",
        "contract": { "type_changes": "evolve", "invalid_records": "quarantine" } }] });

    // Two pipelines into one file.
    let dest = fx.destination("jsonl", json!({ "directory": "lines" })).await;
    let (mine, theirs) = (
        fx.pipeline(&dest, "incremental_append", quarantine.clone()).await,
        fx.pipeline(&dest, "incremental_append", quarantine).await,
    );
    // The second sync reads the last page again and keeps its two
    // breaking records aside again, each a new line of its own (as the
    // page's records that fit would have been appended again).
    for pipeline in [&mine, &theirs, &mine] {
        assert_eq!(fx.sync(pipeline).await["status"], "succeeded");
    }
    assert_eq!(fx.rejected(&mine, 50).await.len(), 5);
    let theirs_before = fx.rejected(&theirs, 50).await;
    assert_eq!(theirs_before.len(), 3);
    let folder = fx.srv.exports(&ws, "lines");
    let loaded_before = lines(&folder, "events.jsonl").len();
    // The rejected file as a replay cut short before its rewrite leaves it.
    let saved = std::fs::read(folder.join("events__rejected.jsonl")).unwrap();
    let path = format!("/v1/pipelines/{mine}");
    let patch = fx.srv.request(Method::PATCH, &path).json(&evolve);
    json_ok(patch.send().await.unwrap()).await;
    let (counts, job) = fx.replayed(&mine).await;
    assert_eq!(counts, [json!(5), json!(3), json!(0), json!(2), json!(0)], "{job}");
    let loaded = lines(&folder, "events.jsonl");
    let ids: Vec<&Value> = loaded[loaded_before..].iter().map(|l| &l["id"]).collect();
    assert_eq!(ids, [&json!(7), &json!(10), &json!(10)], "the kind and the payload, a line per line kept aside");
    let kept = fx.rejected(&mine, 50).await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept.iter().all(|k| k["reason"] == "missing_required" && k["pointer"] == "/id"), "{kept:?}");
    assert_eq!(fx.rejected(&theirs, 50).await, theirs_before, "another pipeline's lines stay as they were");
    assert!(!folder.join("events__rejected.jsonl.rewrite").exists());
    // Cut short before the rewrite: what it loaded is not loaded again.
    std::fs::write(folder.join("events__rejected.jsonl"), &saved).unwrap();
    let (counts, job) = fx.replayed(&mine).await;
    assert_eq!(counts, [json!(5), json!(0), json!(3), json!(2), json!(0)], "{job}");
    assert_eq!(lines(&folder, "events.jsonl").len(), loaded_before + 3, "nothing appended twice");
    assert_eq!(fx.rejected(&mine, 50).await.len(), 2);
    assert_eq!(fx.rejected(&theirs, 50).await, theirs_before);

    fx.srv.stop().await;
}

/// A destination's default contract judges every stream writing to it
/// that names no contract of its own; a stream's own contract wins. The
/// default is shown, changed and removed through the destination, and
/// refused where no stream's contract could be.
async fn a_destination_default_contract_judges_streams_that_name_none(backend: Backend) {
    let fx = setup(backend).await;
    let quarantine = json!({ "type_changes": "quarantine", "invalid_records": "quarantine" });
    let body = json!({ "name": "strict", "kind": "sqlite", "configuration": { "file": "strict.db" },
        "default_contract": quarantine });
    let dest = json_ok(fx.srv.post("/v1/destinations", body).send().await.unwrap()).await;
    assert_eq!(dest["data"]["default_contract"]["type_changes"], "quarantine", "{dest}");
    assert_eq!(dest["data"]["default_contract"]["new_columns"], "evolve", "a rule left out evolves: {dest}");
    let dest_id = dest["data"]["destination_id"].as_str().unwrap().to_owned();

    // A stream without a contract: the destination's judges it.
    let by_default = fx.pipeline(&dest_id, "incremental_append", Value::Null).await;
    let job = fx.sync(&by_default).await;
    let events = &job["progress"]["ledger"]["streams"]["events"];
    let counts: Vec<&Value> = ["read", "loaded", "quarantined", "unaccounted"].iter().map(|k| &events[*k]).collect();
    assert_eq!(counts, [&json!(10), &json!(7), &json!(3), &json!(0)], "{job}");
    assert_eq!(fx.rejected(&by_default, 50).await.len(), 3);

    // A stream with its own contract, every rule evolving: its own wins.
    let own = fx.pipeline(&dest_id, "incremental_append", json!({ "type_changes": "evolve" })).await;
    let job = fx.sync(&own).await;
    let events = &job["progress"]["ledger"]["streams"]["events"];
    assert_eq!((&events["loaded"], &events["quarantined"]), (&json!(10), &json!(0)), "{job}");

    // Changed, refused, and removed through the destination.
    let path = format!("/v1/destinations/{dest_id}");
    let patch = |body: Value| fx.srv.request(Method::PATCH, &path).json(&body).send();
    let bad = patch(json!({ "default_contract": { "invalid_records": "discard_value" } })).await.unwrap();
    let bad = expect_error(bad, 400, "VALIDATION_FAILED").await;
    assert_eq!(bad["details"]["field"], "default_contract.invalid_records", "{bad}");
    let renamed = json_ok(patch(json!({ "name": "still strict" })).await.unwrap()).await;
    assert_eq!(renamed["data"]["default_contract"], dest["data"]["default_contract"], "left out: unchanged");
    // A viewer may not loosen a destination's contract; another workspace
    // does not see the destination.
    let loosen = json!({ "default_contract": { "type_changes": "evolve" } });
    let ws = fx.srv.workspace_id().await;
    let (_, viewer) = fx.srv.user_in(&ws, Role::Viewer).await;
    let by_viewer = fx.srv.request_as(&viewer, Method::PATCH, &path).json(&loosen).send().await.unwrap();
    expect_error(by_viewer, 403, "403").await;
    let (_, other) = fx.srv.other_workspace().await;
    let by_other = fx.srv.request_as(&other, Method::PATCH, &path).json(&loosen).send().await.unwrap();
    expect_error(by_other, 404, "404").await;
    let unchanged = json_ok(fx.srv.get(&path).send().await.unwrap()).await;
    assert_eq!(unchanged["data"]["default_contract"], dest["data"]["default_contract"], "{unchanged}");
    let cleared = json_ok(patch(json!({ "default_contract": null })).await.unwrap()).await;
    assert!(cleared["data"].get("default_contract").is_none(), "{cleared}");
    let job = fx.sync(&by_default).await;
    let events = &job["progress"]["ledger"]["streams"]["events"];
    assert_eq!(events["quarantined"], 0, "no default, no contract: {job}");

    let body = json!({ "name": "x", "kind": "sqlite", "configuration": { "file": "x.db" },
        "default_contract": { "type_changes": "drop" } });
    expect_error(fx.srv.post("/v1/destinations", body).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
    fx.srv.stop().await;
}

/// A lakehouse keeps rows aside too, in an Iceberg table beside the
/// stream's that the stream's commits commit first. Two pipelines (one by
/// its stream's contract, one by the destination's default) share both
/// tables; a replay of one loads what fits now and swaps in the rejected
/// table it rewrote in the catalog transaction of that load: the other's
/// rejected rows stay as they were, and what pyiceberg reads of both
/// tables is what the API and the ledgers say.
async fn a_lakehouse_keeps_rows_aside_and_replays_them_in_one_catalog_step(backend: Backend) {
    let fx = setup(backend).await;
    let ws = fx.srv.workspace_id().await;
    let quarantine = json!({ "type_changes": "quarantine", "invalid_records": "quarantine" });
    let body = json!({ "name": "lake", "kind": "iceberg", "configuration": { "warehouse": "lake" },
        "default_contract": quarantine });
    let lake = json_ok(fx.srv.post("/v1/destinations", body).send().await.unwrap()).await;
    assert_eq!(lake["data"]["default_contract"]["type_changes"], "quarantine", "{lake}");
    let lake = lake["data"]["destination_id"].as_str().unwrap().to_owned();
    let ours = fx.pipeline(&lake, "incremental_append", quarantine).await;
    let theirs = fx.pipeline(&lake, "incremental_append", Value::Null).await;
    for pipeline in [&ours, &theirs] {
        let job = fx.sync(pipeline).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        let events = &job["progress"]["ledger"]["streams"]["events"];
        let counts: Vec<&Value> =
            ["read", "loaded", "quarantined", "unaccounted"].iter().map(|k| &events[*k]).collect();
        assert_eq!(counts, [&json!(10), &json!(7), &json!(3), &json!(0)], "{job}");
    }
    let mut reader = crate::support::iceberg::Reader::start();
    let database_url = fx.srv.state.config.database_url.clone();
    let catalog = format!("{ws}/lake");
    let mut read = async |table: &str| {
        let read = reader.read_with(&database_url, &catalog, &format!("default.{table}"), json!({}), &["record"]).await;
        read["rows"].as_array().unwrap_or_else(|| panic!("{read}")).clone()
    };
    let ids = |rows: &[Value], pipeline: &str| {
        let mut ids: Vec<String> =
            rows.iter().filter(|r| r["pipeline"] == pipeline).map(|r| r["id"].to_string()).collect();
        ids.sort();
        ids
    };
    let loaded: Vec<String> = ["1", "2", "3", "4", "5", "6", "8"].iter().map(|i| format!("\"{i}\"")).collect();
    let events = read("events").await;
    assert_eq!((ids(&events, &ours), ids(&events, &theirs)), (loaded.clone(), loaded.clone()), "{events:?}");
    assert_eq!(read("events__rejected").await.len(), 6, "three rows kept aside by each");
    let why = |rows: &[Value]| {
        let mut why: Vec<(String, String)> = rows
            .iter()
            .map(|r| (r["reason"].as_str().unwrap().to_owned(), r["pointer"].as_str().unwrap().to_owned()))
            .collect();
        why.sort();
        why
    };
    let theirs_before = fx.rejected(&theirs, 2).await;
    let aside = fx.rejected(&ours, 2).await;
    assert_eq!(
        why(&aside),
        [
            ("missing_required".into(), "/id".into()),
            ("type_mismatch".into(), "/kind".into()),
            ("type_mismatch".into(), "/payload".into())
        ],
        "{aside:?}"
    );
    for r in &aside {
        let original = fx.records.iter().find(|o| o["updated_at"].as_str() == r["cursor"].as_str());
        assert_eq!(Some(&r["record"]), original, "the record as read: {r}");
        assert_eq!(r["attempt"], 1, "{r}");
    }

    // Types may change now: the number in the text column `kind` loads
    // (as its text); text where the object `payload` was cannot be held
    // by the table's struct column, so it stays aside as a type change,
    // beside the record without an id.
    let contract = |type_changes: &str| {
        json!({ "streams": [{ "name": "events", "sync_mode": "incremental_append",
            "contract": { "type_changes": type_changes, "invalid_records": "quarantine" } }] })
    };
    let patch = |body: Value| fx.srv.request(Method::PATCH, &format!("/v1/pipelines/{ours}")).json(&body).send();
    json_ok(patch(contract("evolve")).await.unwrap()).await;
    let (counts, job) = fx.replayed(&ours).await;
    assert_eq!(counts, [json!(3), json!(1), json!(0), json!(2), json!(0)], "{job}");
    let events = read("events").await;
    let mut replayed = loaded.clone();
    replayed.push("\"7\"".to_owned());
    replayed.sort();
    assert_eq!((ids(&events, &ours), ids(&events, &theirs)), (replayed.clone(), loaded.clone()), "{events:?}");
    assert_eq!(read("events__rejected").await.len(), 5, "the table rewritten: two of ours, three of theirs");
    let aside = fx.rejected(&ours, 2).await;
    assert_eq!(
        why(&aside),
        [("missing_required".into(), "/id".into()), ("type_mismatch".into(), "/payload".into())],
        "{aside:?}"
    );
    assert_eq!(fx.rejected(&theirs, 2).await, theirs_before, "another pipeline's rows stay as they were");

    // Again, the value the table cannot hold left out: that record loads
    // once, the one without an id stays; nothing loads twice.
    json_ok(patch(contract("discard_value")).await.unwrap()).await;
    let (counts, job) = fx.replayed(&ours).await;
    assert_eq!(counts, [json!(2), json!(1), json!(0), json!(1), json!(0)], "{job}");
    assert_eq!(job["progress"]["ledger"]["streams"]["events"]["value_discarded"], 1, "{job}");
    let events = read("events").await;
    replayed.push("\"10\"".to_owned());
    replayed.sort();
    assert_eq!(ids(&events, &ours), replayed, "{events:?}");
    let flat = events.iter().find(|r| r["pipeline"] == ours.as_str() && r["id"] == "10").unwrap();
    assert_eq!(flat["payload_n"], Value::Null, "{flat}");
    let aside = fx.rejected(&ours, 2).await;
    assert_eq!(why(&aside), [("missing_required".into(), "/id".into())], "{aside:?}");
    fx.srv.stop().await;
}

/// Where type changes evolve, a lakehouse widens a column for a value
/// it cannot hold, where Iceberg promotes the column in place: a 32-bit
/// integer given a larger one, a float a number beyond its range, a
/// decimal more digits than its precision. pyiceberg reads every value
/// exactly. Where they are quarantined, the same records are kept aside
/// as type changes instead (the float's range judged by its column) and
/// the columns stay; a replay once the contract evolves widens them and
/// loads those records. Where values are discarded, each such value is
/// made null and its record loaded, by a sync and by a replay alike.
async fn a_lakehouse_widens_a_column_for_a_value_beyond_it_where_type_changes_evolve(backend: Backend) {
    let fx = setup(backend).await;
    *fx.provider.records.lock().unwrap() = vec![
        json!({ "id": 1, "n": 7, "amount": "1234.56", "f": 1.5 }),
        json!({ "id": 2, "n": 5_000_000_000u64, "amount": "-1234.78" }),
        json!({ "id": 3, "n": -3, "amount": 12345.6 }),
        json!({ "id": 4, "n": 4, "amount": "1.00", "f": 1e300 }),
    ];
    let body =
        json!({ "connector_id": "conn_rest_manifest", "hosts": ["api.source.test"], "secret": fx.provider.token });
    let cred = json_ok(fx.srv.post("/v1/credentials", body).send().await.unwrap()).await;
    let schema = json!({ "type": "object", "properties": { "id": { "type": "integer" },
        "n": { "type": "integer", "format": "int32" }, "f": { "type": "number", "format": "float" },
        "amount": { "type": ["string", "number"], "format": "decimal", "precision": 6, "scale": 2 } } });
    let manifest = json!({ "streams": [{ "name": "events", "path": "/events", "records": "/data",
        "primary_key": ["id"], "params": { "limit": 2 },
        "paging": { "type": "cursor", "param": "cursor", "next_cursor": "/next_cursor" }, "schema": schema }] });
    let source = json_ok(
        fx.srv
            .post(
                "/v1/sources",
                json!({ "connector_id": "conn_rest_manifest", "name": "Wide", "configuration": {
                "base_url": "https://api.source.test", "credential_handle": cred["data"]["credential_handle"],
                "manifest": manifest } }),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    let ws = fx.srv.workspace_id().await;
    let mut reader = crate::support::iceberg::Reader::start();
    let database_url = fx.srv.state.config.database_url.clone();
    // The rows (id, n, amount) and the column types pyiceberg reads.
    let mut read = async |namespace: &str| {
        let table = format!("{namespace}.events");
        let read = reader.read_with(&database_url, &format!("{ws}/lake"), &table, json!({}), &["n"]).await;
        let mut rows: Vec<[String; 3]> = read["rows"]
            .as_array()
            .unwrap_or_else(|| panic!("{read}"))
            .iter()
            .map(|r| ["id", "n", "amount"].map(|k| r[k].as_str().unwrap_or_default().to_owned()))
            .collect();
        rows.sort();
        let types = ["n", "f", "amount"].map(|c| read["types"][c].as_str().unwrap_or_default().to_owned());
        (rows, types)
    };
    let exact = |rows: &[[&str; 3]]| rows.iter().map(|r| r.map(str::to_owned)).collect::<Vec<_>>();
    let all =
        exact(&[["1", "7", "1234.56"], ["2", "5000000000", "-1234.78"], ["3", "-3", "12345.60"], ["4", "4", "1.00"]]);
    let widened = ["long", "double", "decimal(7, 2)"].map(str::to_owned);
    let contract = |type_changes: &str| json!([{ "name": "events", "sync_mode": "full_refresh_overwrite", "contract": { "type_changes": type_changes } }]);
    let mut pipelines = Vec::new();
    // Under discard_value, each record loses its one value beyond its
    // column: the contract's own judgement nulls the integer and the
    // decimal, the column's the float.
    let lossy = exact(&[["1", "7", "1234.56"], ["2", "", "-1234.78"], ["3", "-3", ""], ["4", "4", "1.00"]]);
    let narrow = ["int", "float", "decimal(6, 2)"].map(str::to_owned);
    let modes = [("wide", "evolve"), ("strict", "quarantine"), ("lossy", "discard_value"), ("later", "quarantine")];
    for (namespace, type_changes) in modes {
        let dest = fx.destination("iceberg", json!({ "warehouse": "lake", "namespace": namespace })).await;
        let body = json!({ "name": namespace, "source_id": source["data"]["source_id"], "destination_id": dest,
            "streams": contract(type_changes) });
        let pipeline = json_ok(fx.srv.post("/v1/pipelines", body).send().await.unwrap()).await;
        pipelines.push(pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned());
        let job = fx.sync(pipelines.last().unwrap()).await;
        assert_eq!(job["status"], "succeeded", "{type_changes}: {job}");
        let events = &job["progress"]["ledger"]["streams"]["events"];
        let (rows, types) = read(namespace).await;
        let counts = [&events["loaded"], &events["quarantined"], &events["value_discarded"]];
        match type_changes {
            "evolve" => {
                assert_eq!(counts, [&json!(4), &json!(0), &json!(0)], "{job}");
                assert_eq!((rows, types), (all.clone(), widened.clone()), "every value exact, the columns widened");
            }
            "discard_value" => {
                assert_eq!(counts, [&json!(4), &json!(0), &json!(3)], "{job}");
                assert_eq!((rows, types), (lossy.clone(), narrow.clone()));
            }
            _ => {
                assert_eq!(counts, [&json!(1), &json!(3), &json!(0)], "{job}");
                assert_eq!((rows, types), (exact(&[["1", "7", "1234.56"]]), narrow.clone()));
            }
        }
    }
    let strict = &pipelines[1];
    let mut why: Vec<(String, String)> = fx
        .rejected(strict, 10)
        .await
        .iter()
        .map(|r| (r["reason"].as_str().unwrap().to_owned(), r["pointer"].as_str().unwrap().to_owned()))
        .collect();
    why.sort();
    let expected = [("decimal_out_of_range", "/amount"), ("type_mismatch", "/f"), ("type_mismatch", "/n")];
    assert_eq!(why, expected.map(|(a, b)| (a.to_owned(), b.to_owned())));

    // The contract evolves now: a replay widens the columns and loads the
    // three records once.
    let patch = json!({ "streams": contract("evolve") });
    json_ok(fx.srv.request(Method::PATCH, &format!("/v1/pipelines/{strict}")).json(&patch).send().await.unwrap()).await;
    let (counts, job) = fx.replayed(strict).await;
    assert_eq!(counts, [json!(3), json!(3), json!(0), json!(0), json!(0)], "{job}");
    assert_eq!(read("strict").await, (all, widened));
    assert!(fx.rejected(strict, 10).await.is_empty());

    // Another quarantining pipeline replayed under discard_value loads
    // its three records as a sync under it would have, each less a value.
    let later = &pipelines[3];
    let patch = json!({ "streams": contract("discard_value") });
    json_ok(fx.srv.request(Method::PATCH, &format!("/v1/pipelines/{later}")).json(&patch).send().await.unwrap()).await;
    let (counts, job) = fx.replayed(later).await;
    assert_eq!(counts, [json!(3), json!(3), json!(0), json!(0), json!(0)], "{job}");
    assert_eq!(job["progress"]["ledger"]["streams"]["events"]["value_discarded"], json!(3), "{job}");
    assert_eq!(read("later").await, (lossy, narrow));
    assert!(fx.rejected(later, 10).await.is_empty());
    fx.srv.stop().await;
}

/// Two versions of each of 300 keys kept aside, read by two syncs with
/// the same cursor value: the replay's pages (500 rows, in the order of
/// their rejections) split many keys' versions, and the newer version
/// loads wherever its page falls. A row the replay wrote on an earlier
/// page counts as the version it was read as, not as read when the replay
/// wrote it.
async fn a_replay_spanning_pages_keeps_the_newest_version_of_every_key(backend: Backend) {
    let fx = setup(backend).await;
    let ws = fx.srv.workspace_id().await;
    let body = json!({ "connector_id": "test_paged_source", "name": "Wide", "configuration": {
        "base_url": "https://api.source.test", "credential_handle": fx.credential, "page_size": 100 } });
    let source = json_ok(fx.srv.post("/v1/sources", body).send().await.unwrap()).await;
    let version =
        |i: u64, n: u64| json!({ "id": i, "kind": 7, "updated_at": "2026-01-01T00:00:00Z", "payload": { "n": n } });
    *fx.provider.records.lock().unwrap() = (1..=300).map(|i| version(i, 1)).collect();
    let dest = fx.destination("sqlite", json!({ "file": "wide.db" })).await;
    let stream = |rule: &str| json!([{ "name": "events", "sync_mode": "incremental_deduped", "contract": { "type_changes": rule } }]);
    let body = json!({ "name": "wide", "source_id": source["data"]["source_id"], "destination_id": dest,
        "streams": stream("quarantine") });
    let pipeline = json_ok(fx.srv.post("/v1/pipelines", body).send().await.unwrap()).await["data"]["pipeline_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(fx.sync(&pipeline).await["status"], "succeeded");
    fx.provider.records.lock().unwrap().extend((1..=300).map(|i| version(i, 2)));
    assert_eq!(fx.sync(&pipeline).await["status"], "succeeded");
    let patch = json!({ "streams": stream("evolve") });
    json_ok(fx.srv.request(Method::PATCH, &format!("/v1/pipelines/{pipeline}")).json(&patch).send().await.unwrap())
        .await;
    let (counts, job) = fx.replayed(&pipeline).await;
    assert_eq!(counts[0], json!(600), "two versions of 300 keys: {job}");
    assert_eq!(counts[4], json!(0), "{job}");
    let url = format!("sqlite://{}?mode=ro", fx.srv.warehouse(&ws, "wide.db").display());
    use sqlx::Connection;
    let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let payloads: Vec<String> = sqlx::query_scalar("SELECT payload FROM events").fetch_all(&mut db).await.unwrap();
    assert_eq!(payloads.len(), 300);
    let old: Vec<&String> = payloads.iter().filter(|p| !p.contains('2')).collect();
    assert!(old.is_empty(), "{} keys hold their older version: {old:?}", old.len());
    fx.srv.stop().await;
}

/// A replayed row keeps the time its record was read, not the time the
/// replay wrote it. Two versions of each of three keys, read with the
/// same cursor value, are kept aside: the older for its kind, the newer
/// for a field the schema does not declare. A first replay lets kinds
/// through and loads the older versions; a second lets the new field
/// through, and the newer versions load over them. (Were the first
/// replay's rows as new as their writing, the second would count the
/// newer versions as superseded and drop them.) Into SQLite and
/// PostgreSQL (a file does not deduplicate).
async fn a_later_replay_ranks_replayed_rows_by_when_they_were_read(backend: Backend) {
    let fx = setup(backend).await;
    let warehouse = crate::support::PgDatabase::create().await.expect("a PostgreSQL warehouse");
    let ws = fx.srv.workspace_id().await;
    let at = "2026-01-01T00:00:00Z";
    let older = |i: u64| json!({ "id": i, "kind": 7, "updated_at": at, "payload": { "n": 1 } });
    let newer = |i: u64| json!({ "id": i, "kind": "open", "updated_at": at, "payload": { "n": 2 }, "coupon": "NEW" });
    let contract = |types: &str, columns: &str| json!({ "type_changes": types, "new_columns": columns, "invalid_records": "quarantine" });
    for (kind, configuration) in
        [("sqlite", json!({ "file": "ranked.db" })), ("postgres", json!({ "url": warehouse.url }))]
    {
        *fx.provider.records.lock().unwrap() = (1..=3).map(older).collect();
        let dest = fx.destination(kind, configuration).await;
        let pipeline = fx.pipeline(&dest, "incremental_deduped", contract("quarantine", "quarantine")).await;
        assert_eq!(fx.sync(&pipeline).await["status"], "succeeded", "{kind}");
        fx.provider.records.lock().unwrap().extend((1..=3).map(newer));
        assert_eq!(fx.sync(&pipeline).await["status"], "succeeded", "{kind}");
        assert_eq!(fx.rejected(&pipeline, 50).await.len(), 6, "{kind}: both versions of each key kept aside");

        let path = format!("/v1/pipelines/{pipeline}");
        let relax = |types: &str, columns: &str| json!({ "streams": [{ "name": "events", "sync_mode": "incremental_deduped", "contract": contract(types, columns) }] });
        json_ok(fx.srv.request(Method::PATCH, &path).json(&relax("evolve", "quarantine")).send().await.unwrap()).await;
        let (counts, job) = fx.replayed(&pipeline).await;
        assert_eq!(counts, [json!(6), json!(3), json!(0), json!(3), json!(0)], "{kind}: the older versions: {job}");

        json_ok(fx.srv.request(Method::PATCH, &path).json(&relax("evolve", "evolve")).send().await.unwrap()).await;
        let (counts, job) = fx.replayed(&pipeline).await;
        assert_eq!(counts, [json!(3), json!(3), json!(0), json!(0), json!(0)], "{kind}: the newer versions: {job}");

        let url = match kind {
            "sqlite" => format!("sqlite://{}", fx.srv.warehouse(&ws, "ranked.db").display()),
            _ => warehouse.url.clone(),
        };
        sqlx::any::install_default_drivers();
        let mut c = <sqlx::AnyConnection as sqlx::Connection>::connect(&url).await.unwrap();
        let sql = "SELECT COALESCE(coupon, '') FROM events ORDER BY CAST(id AS TEXT)";
        let coupons: Vec<String> = sqlx::query_scalar(sql).fetch_all(&mut c).await.unwrap();
        assert_eq!(coupons, ["NEW"; 3], "{kind}: every key holds its newer version");
    }
    fx.srv.stop().await;
}

/// A replay in deduplicated mode never puts a record over a newer
/// version of its key: record 7, kept aside for its kind, is read again
/// fixed by a later sync; when the contract then lets its old kind
/// through, the replay counts the old version as superseded and loads
/// only what no newer version replaced, into SQLite and PostgreSQL.
async fn a_replay_never_puts_an_older_version_over_a_newer_one(backend: Backend) {
    let fx = setup(backend).await;
    let warehouse = crate::support::PgDatabase::create().await.expect("a PostgreSQL warehouse");
    let ws = fx.srv.workspace_id().await;
    let quarantine = json!({ "type_changes": "quarantine", "invalid_records": "quarantine" });
    let sqlite = format!("sqlite://{}", fx.srv.warehouse(&ws, "newer.db").display());
    for (kind, configuration, url) in [
        ("sqlite", json!({ "file": "newer.db" }), sqlite),
        ("postgres", json!({ "url": warehouse.url }), warehouse.url.clone()),
    ] {
        *fx.provider.records.lock().unwrap() = fx.records.clone();
        let dest = fx.destination(kind, configuration).await;
        let pipeline = fx.pipeline(&dest, "incremental_deduped", quarantine.clone()).await;
        assert_eq!(fx.sync(&pipeline).await["status"], "succeeded", "{kind}");
        assert_eq!(fx.rejected(&pipeline, 50).await.len(), 3, "{kind}: records 7, 9 and 10 kept aside");

        // Record 7 again, fixed and later.
        let fixed = json!({ "id": 7, "kind": "click", "updated_at": "2026-01-01T00:00:11Z", "payload": { "n": 77 } });
        fx.provider.records.lock().unwrap().push(fixed);
        assert_eq!(fx.sync(&pipeline).await["status"], "succeeded", "{kind}");
        let kind_of_7 = || async {
            sqlx::any::install_default_drivers();
            let mut c = <sqlx::AnyConnection as sqlx::Connection>::connect(&url).await.unwrap();
            let sql = "SELECT kind FROM events WHERE CAST(id AS TEXT) = '7'";
            sqlx::query_scalar::<_, String>(sql).fetch_all(&mut c).await.unwrap()
        };
        assert_eq!(kind_of_7().await, ["click"], "{kind}");

        let evolve = json!({ "streams": [{ "name": "events", "sync_mode": "incremental_deduped",
            "contract": { "type_changes": "evolve", "invalid_records": "quarantine" } }] });
        let path = format!("/v1/pipelines/{pipeline}");
        json_ok(fx.srv.request(Method::PATCH, &path).json(&evolve).send().await.unwrap()).await;
        let replay = fx.srv.request(Method::POST, &format!("{path}/rejected/replay")).send().await.unwrap();
        let job = fx.srv.wait_job(json_ok(replay).await["data"]["job_id"].as_str().unwrap()).await;
        assert_eq!(job["status"], "succeeded", "{kind}: {job}");
        let events = &job["progress"]["ledger"]["streams"]["events"];
        let counts: Vec<&Value> =
            ["read", "loaded", "deduplicated", "quarantined", "unaccounted"].iter().map(|k| &events[*k]).collect();
        assert_eq!(counts, [&json!(3), &json!(1), &json!(1), &json!(1), &json!(0)], "{kind}: {job}");
        assert_eq!(kind_of_7().await, ["click"], "{kind}: the newer version stays");
        let kept = fx.rejected(&pipeline, 50).await;
        assert_eq!(kept.len(), 1, "{kind}: only the record without an id stays aside: {kept:?}");
    }
    fx.srv.stop().await;
}

/// Changing a deduplicated stream's primary key rekeys rows a sync cannot
/// put back: even an administrator's request becomes a proposal, which
/// runs once another member approves it. Other changes run at once.
async fn rekeying_a_deduplicated_stream_needs_an_approval(backend: Backend) {
    let fx = setup(backend).await;
    let dest = fx.destination("sqlite", json!({ "file": "keys.db" })).await;
    let body = json!({ "name": "keyed", "source_id": fx.source_id, "destination_id": dest,
        "streams": [{ "name": "events", "sync_mode": "incremental_deduped" }] });
    let pipeline = json_ok(fx.srv.post("/v1/pipelines", body).send().await.unwrap()).await;
    let id = pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned();
    let patch = |streams: Value| {
        fx.srv.request(Method::PATCH, &format!("/v1/pipelines/{id}")).json(&json!({ "streams": streams })).send()
    };
    // A contract, same key: runs now.
    let same =
        json!([{ "name": "events", "sync_mode": "incremental_deduped", "contract": { "type_changes": "freeze" } }]);
    assert_eq!(patch(same).await.unwrap().status(), StatusCode::OK);
    // Another key: a proposal, and the pipeline keeps its key meanwhile.
    let rekeyed = json!([{ "name": "events", "sync_mode": "incremental_deduped", "primary_key": ["kind"] }]);
    let proposed = patch(rekeyed).await.unwrap();
    assert_eq!(proposed.status(), StatusCode::ACCEPTED);
    let proposed = json_ok(proposed).await;
    let summary = proposed["data"]["approval"]["summary"].as_str().unwrap();
    assert!(summary.contains("primary key of deduplicated stream events"), "{summary}");
    let now = json_ok(fx.srv.get(&format!("/v1/pipelines/{id}")).send().await.unwrap()).await;
    assert!(now["data"]["streams"][0]["primary_key"].is_null(), "{now}");
    let approval = proposed["data"]["approval"]["approval_id"].as_str().unwrap();
    let approve = fx.srv.request_as(&fx.srv.approver_token, Method::POST, &format!("/v1/approvals/{approval}/approve"));
    assert!(approve.send().await.unwrap().status().is_success());
    let now = json_ok(fx.srv.get(&format!("/v1/pipelines/{id}")).send().await.unwrap()).await;
    assert_eq!(now["data"]["streams"][0]["primary_key"], json!(["kind"]), "{now}");
    fx.srv.stop().await;
}

/// Two pipelines quarantining into one destination's table of the same
/// stream: each pipeline's rejected rows are its own. Neither lists the
/// other's, a replay of one neither loads nor deletes the other's, and a
/// pipeline with nothing kept aside has nothing to replay while the other
/// has, in a database and in a file (read a row a page, so another
/// pipeline's rows between its own never cut a page short).
async fn rejected_rows_belong_to_the_pipeline_that_kept_them(backend: Backend) {
    let fx = setup(backend).await;
    let ws = fx.srv.workspace_id().await;
    let quarantine = json!({ "type_changes": "quarantine", "invalid_records": "quarantine" });
    let replay =
        |pipeline: &str| fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/rejected/replay")).send();
    let dest = fx.destination("sqlite", json!({ "file": "shared.db" })).await;
    let (mine, theirs) = (
        fx.pipeline(&dest, "incremental_append", quarantine.clone()).await,
        fx.pipeline(&dest, "incremental_append", quarantine.clone()).await,
    );
    assert_eq!(fx.sync(&mine).await["status"], "succeeded");
    assert_eq!(fx.rejected(&mine, 1).await.len(), 3);
    assert_eq!(fx.rejected(&theirs, 1).await, Vec::<Value>::new(), "another pipeline's rows are not theirs");
    expect_error(replay(&theirs).await.unwrap(), 409, "NOTHING_TO_REPLAY").await;
    assert_eq!(fx.sync(&theirs).await["status"], "succeeded");
    let kept_by_them = fx.rejected(&theirs, 1).await;
    assert_eq!(kept_by_them.len(), 3);
    assert_eq!(fx.rejected(&mine, 1).await.len(), 3, "each pipeline keeps its own rows of the shared table");

    // A replay of one pipeline reads and loads its own rows only.
    let evolve = json!({ "streams": [{ "name": "events", "sync_mode": "incremental_append",
        "contract": { "type_changes": "evolve", "invalid_records": "quarantine" } }] });
    json_ok(fx.srv.request(Method::PATCH, &format!("/v1/pipelines/{mine}")).json(&evolve).send().await.unwrap()).await;
    let url = format!("sqlite://{}?mode=ro", fx.srv.warehouse(&ws, "shared.db").display());
    let rows = count_rows(&url, "events").await;
    let started = json_ok(replay(&mine).await.unwrap()).await;
    let job = fx.srv.wait_job(started["data"]["job_id"].as_str().unwrap()).await;
    let events = &job["progress"]["ledger"]["streams"]["events"];
    let counts: Vec<&Value> = ["read", "loaded", "quarantined", "unaccounted"].iter().map(|k| &events[*k]).collect();
    assert_eq!(counts, [&json!(3), &json!(2), &json!(1), &json!(0)], "{job}");
    assert_eq!(count_rows(&url, "events").await, rows + 2);
    assert_eq!(fx.rejected(&mine, 1).await.len(), 1);
    assert_eq!(fx.rejected(&theirs, 1).await, kept_by_them, "the other pipeline's rows are untouched");

    // A file: the lines of both pipelines interleave in one file.
    let lines = fx.destination("jsonl", json!({ "directory": "shared" })).await;
    let (mine, theirs) = (
        fx.pipeline(&lines, "incremental_append", quarantine.clone()).await,
        fx.pipeline(&lines, "incremental_append", quarantine).await,
    );
    for pipeline in [&mine, &theirs, &mine] {
        assert_eq!(fx.sync(pipeline).await["status"], "succeeded");
    }
    let (a, b) = (fx.rejected(&mine, 1).await, fx.rejected(&theirs, 1).await);
    // The second sync of the first pipeline read its last page again and
    // kept its two breaking records aside again: a file cannot replace a
    // line.
    assert_eq!((a.len(), b.len()), (5, 3), "{a:?} {b:?}");
    let jobs_of =
        |rows: &[Value]| rows.iter().map(|r| r["job_id"].to_string()).collect::<std::collections::BTreeSet<_>>();
    assert!(jobs_of(&a).is_disjoint(&jobs_of(&b)), "{a:?} {b:?}");
    fx.srv.stop().await;
}

on_both_backends!(
    a_lakehouse_keeps_rows_aside_and_replays_them_in_one_catalog_step,
    a_lakehouse_widens_a_column_for_a_value_beyond_it_where_type_changes_evolve,
    a_replay_spanning_pages_keeps_the_newest_version_of_every_key,
    a_later_replay_ranks_replayed_rows_by_when_they_were_read,
    a_retried_sync_keeps_the_ledger_of_every_attempt,
    a_file_replays_each_record_once_and_rewrites_its_rejected_lines,
    rejected_rows_belong_to_the_pipeline_that_kept_them,
    a_destination_default_contract_judges_streams_that_name_none,
    a_replay_never_puts_an_older_version_over_a_newer_one,
    rekeying_a_deduplicated_stream_needs_an_approval,
    a_replay_loads_what_fits_now_once_and_keeps_the_rest,
    quarantined_records_are_kept_aside_with_why_and_the_ledger_balances,
    contracts_refuse_what_cannot_work_and_rejected_rows_stay_with_editors
);
