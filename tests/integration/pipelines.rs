//! Destinations, pipelines and jobs end to end: a paginated HTTPS source
//! through a real plugin into SQLite, JSON-lines and PostgreSQL
//! destinations, with exactly one active job per pipeline.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use reqwest::Method;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::fakepg::FakePostgres;
use crate::support::process::ServerProcess;
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::{Backend, TestServer, count_rows, expect_error, json, json_ok, test_plugin};

/// The fake source: `count` events, `next_cursor` paging, a bearer token,
/// and an optional delay per page.
pub(crate) struct Events {
    pub token: String,
    count: u64,
    pub delay_ms: AtomicU64,
    /// Requests being answered now, and the most there ever were.
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// Requests for pages of this size wait until it is set back to 0.
    hold_page_size: AtomicU64,
}

pub(crate) fn routes(ev: Arc<Events>) -> Router {
    Router::new()
        .route(
            "/events",
            get(|State(e): State<Arc<Events>>, h: HeaderMap, Query(q): Query<HashMap<String, String>>| async move {
                if h.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {}", e.token)) {
                    return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "message": "bad token" }))).into_response();
                }
                let limit: u64 = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(100);
                while e.hold_page_size.load(Ordering::SeqCst) == limit {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let now = e.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                e.max_in_flight.fetch_max(now, Ordering::SeqCst);
                let delay = e.delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                e.in_flight.fetch_sub(1, Ordering::SeqCst);
                let start: u64 = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
                let end = (start + limit).min(e.count);
                let data: Vec<Value> = (start..end)
                    .map(|i| json!({ "id": i, "kind": if i % 2 == 0 { "open" } else { "click" }, "updated_at": format!("2024-01-01T00:00:{:02}Z", i % 60), "payload": { "n": i }, "note": note(i) }))
                    .collect();
                let next = if end < e.count { json!(end.to_string()) } else { Value::Null };
                axum::Json(json!({ "data": data, "next_cursor": next })).into_response()
            }),
        )
        .with_state(ev)
}

/// Text with every character a bulk load must escape.
fn note(i: u64) -> String {
    format!("row {i}\ttab\nnewline\r\\backslash \\N \u{e9}")
}

pub(crate) struct Fx {
    pub srv: TestServer,
    pub events: Arc<Events>,
    pub source_id: String,
    _provider: FakeProvider,
}

async fn setup(backend: Backend, count: u64) -> Fx {
    setup_with(backend, count, |_| {}).await
}

async fn setup_with(backend: Backend, count: u64, adjust: impl FnOnce(&mut service::config::ServerConfig)) -> Fx {
    setup_beside(backend, count, &TestCa::new(), "", adjust).await
}

/// [`setup_with`], the source's provider certified by `ca` and the
/// egress also pinning `other_pins` (other fake servers of the same CA).
pub(crate) async fn setup_beside(
    backend: Backend,
    count: u64,
    ca: &TestCa,
    other_pins: &str,
    adjust: impl FnOnce(&mut service::config::ServerConfig),
) -> Fx {
    let events = Arc::new(Events {
        token: format!("src-token-{}", uuid::Uuid::new_v4().simple()),
        count,
        delay_ms: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        max_in_flight: AtomicU64::new(0),
        hold_page_size: AtomicU64::new(0),
    });
    let provider = FakeProvider::start(ca, &["api.source.test"], routes(events.clone())).await;
    let mut pins = provider.pins(&["api.source.test"]);
    if !other_pins.is_empty() {
        pins = format!("{pins},{other_pins}");
    }
    let srv = TestServer::start_with(backend, |c| {
        c.plugins.egress =
            service::egress::EgressPolicy::from_settings("*.source.test", Some(&pins), Some(ca.pem.as_bytes()))
                .unwrap();
        adjust(c);
    })
    .await
    .unwrap();
    srv.load_test_plugin("test_paged_source").await;
    let cred = json_ok(
        srv.post("/v1/credentials", json!({ "hosts": ["api.source.test"], "secret": events.token }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let handle = cred["data"]["credential_handle"].as_str().unwrap();
    let src = json_ok(
        srv.post("/v1/sources", json!({ "connector_id": "test_paged_source", "name": "Events", "configuration": { "base_url": "https://api.source.test", "credential_handle": handle, "page_size": 300 } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let source_id = src["data"]["source_id"].as_str().unwrap().to_owned();
    Fx { srv, events, source_id, _provider: provider }
}

impl Fx {
    pub(crate) async fn destination(&self, kind: &str, configuration: Value) -> String {
        let d = json_ok(
            self.srv
                .post("/v1/destinations", json!({ "name": kind, "kind": kind, "configuration": configuration }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        d["data"]["destination_id"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn pipeline(&self, destination_id: &str, mode: &str) -> String {
        let p = json_ok(
            self.srv
                .post("/v1/pipelines", json!({ "name": "events", "source_id": self.source_id, "destination_id": destination_id, "streams": [{ "name": "events", "sync_mode": mode }] }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        p["data"]["pipeline_id"].as_str().unwrap().to_owned()
    }

    /// Starts a sync and waits for its end.
    pub(crate) async fn sync(&self, pipeline_id: &str) -> Value {
        let job =
            json_ok(self.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline_id}/sync")).send().await.unwrap())
                .await;
        self.wait(job["data"]["job_id"].as_str().unwrap()).await
    }

    async fn wait(&self, job_id: &str) -> Value {
        self.srv.wait_job(job_id).await
    }
}

async fn a_sync_lands_every_record_in_sqlite_and_dedup_leaves_no_duplicates(backend: Backend) {
    let fx = setup(backend, 1000).await;
    let prep =
        json_ok(fx.srv.post("/v1/pipelines/prepare", json!({ "source_id": fx.source_id })).send().await.unwrap()).await;
    assert_eq!(prep["data"]["streams"][0]["name"], "events");
    assert_eq!(prep["data"]["suggested_selection"][0]["sync_mode"], "incremental_deduped");

    let dest = fx.destination("sqlite", json!({ "file": "warehouse.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_deduped").await;
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["progress"]["records"], 1000);
    assert_eq!(job["progress"]["streams"]["events"]["records"], 1000);
    assert!(job["progress"]["bytes"].as_u64().unwrap() > 10_000);
    assert_eq!(job["attempts"], 1);
    let url = format!("sqlite://{}?mode=ro", fx.srv.warehouse(&fx.srv.workspace_id().await, "warehouse.db").display());
    assert_eq!(count_rows(&url, "events").await, 1000);
    // The next incremental sync re-reads the last page; deduplication keeps 1000 rows.
    assert_eq!(fx.sync(&pipeline).await["status"], "succeeded");
    assert_eq!(count_rows(&url, "events").await, 1000);
    {
        use sqlx::{Connection, Row};
        let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
        let r = sqlx::query("SELECT \"_service_extracted_at\" AS t, \"_service_meta\" AS m, \"kind\" AS k, \"payload\" AS p FROM \"events\" LIMIT 1").fetch_one(&mut c).await.unwrap();
        assert!(r.try_get::<i64, _>("t").unwrap() > 0);
        assert!(r.try_get::<String, _>("m").unwrap().contains(&pipeline));
        assert!(r.try_get::<String, _>("p").unwrap().contains("\"n\""));
    }
}

async fn jsonl_destinations_get_one_file_per_stream(backend: Backend) {
    let fx = setup(backend, 450).await;
    let dest = fx.destination("jsonl", json!({ "directory": "exports-1" })).await;
    let bad = fx.srv.post("/v1/pipelines", json!({ "name": "x", "source_id": fx.source_id, "destination_id": dest, "streams": [{ "name": "events", "sync_mode": "incremental_deduped" }] })).send().await.unwrap();
    expect_error(bad, 400, "VALIDATION_FAILED").await;
    let pipeline = fx.pipeline(&dest, "full_refresh_overwrite").await;
    for _ in 0..2 {
        assert_eq!(fx.sync(&pipeline).await["status"], "succeeded");
    }
    let text = std::fs::read_to_string(fx.srv.exports(&fx.srv.workspace_id().await, "exports-1").join("events.jsonl"))
        .unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 450, "overwrite replaced the first sync's file");
    assert!(
        lines[0]["_service_raw_id"].is_string()
            && lines[0]["_service_extracted_at"].is_i64()
            && lines[0]["_service_meta"].is_object()
    );
    assert_eq!(lines[5]["id"], 5);
    assert_eq!(lines[5]["note"], note(5), "the provider's values, unchanged");
    assert_eq!(lines[5]["payload"], json!({ "n": 5 }));
    for bad in [json!({ "directory": "../escape" }), json!({ "directory": "/tmp" })] {
        expect_error(
            fx.srv
                .post("/v1/destinations", json!({ "name": "x", "kind": "jsonl", "configuration": bad }))
                .send()
                .await
                .unwrap(),
            400,
            "VALIDATION_FAILED",
        )
        .await;
    }
    let unknown = fx
        .srv
        .post("/v1/destinations", json!({ "name": "x", "kind": "mysql", "configuration": {} }))
        .send()
        .await
        .unwrap();
    let body = expect_error(unknown, 400, "VALIDATION_FAILED").await;
    assert_eq!(body["details"]["field"], "kind", "{body}");
    assert_eq!(body["message"], "kind must be sqlite, postgres, jsonl or iceberg", "{body}");
}

async fn a_hundred_concurrent_syncs_make_one_job_and_99_conflicts(backend: Backend) {
    // A hundred connections from this one address: more than its share by
    // default, so the share is raised for this test of conflicts.
    let fx = setup_with(backend, 600, |c| c.limits.max_connections_per_address = 200).await;
    fx.events.delay_ms.store(1500, Ordering::SeqCst);
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    let mut handles = Vec::new();
    for _ in 0..100 {
        let req = fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync"));
        handles.push(tokio::spawn(async move { json(req.send().await.unwrap()).await }));
    }
    let (mut created, mut conflicts, mut job_id) = (0, 0, String::new());
    for h in handles {
        let (status, body) = h.await.unwrap();
        match status {
            StatusCode::CREATED => {
                created += 1;
                job_id = body["data"]["job_id"].as_str().unwrap().to_owned();
            }
            StatusCode::CONFLICT => {
                assert_eq!(body["code"], "EXECUTION_CONFLICT");
                assert!(body["details"]["active_job"]["job_id"].is_string(), "{body}");
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!((created, conflicts), (1, 99));
    fx.events.delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(fx.wait(&job_id).await["status"], "succeeded");
}

async fn a_changed_schedule_refuses_stale_sync_commands_and_proposals(backend: Backend) {
    let fx = setup(backend, 10).await;
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    let p = json_ok(fx.srv.get(&format!("/v1/pipelines/{pipeline}")).send().await.unwrap()).await;
    let version = p["data"]["schedule_version"].as_i64().unwrap();
    // A proposal pins the current version.
    let proposal = json_ok(
        fx.srv
            .request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync"))
            .header("x-service-execution-mode", "proposal")
            .send()
            .await
            .unwrap(),
    )
    .await;
    let approval_id = proposal["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
    assert_eq!(proposal["data"]["approval"]["operation"]["schedule_version"], version);
    json_ok(
        fx.srv
            .request(Method::PATCH, &format!("/v1/pipelines/{pipeline}"))
            .json(&json!({ "schedule": { "kind": "interval", "minutes": 60 } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let resp = fx
        .srv
        .request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync"))
        .header("if-match", format!("\"{version}\""))
        .send()
        .await
        .unwrap();
    let e = expect_error(resp, 409, "EXECUTION_CONFLICT").await;
    assert_eq!(e["details"]["reason"], "schedule_changed");
    let e = expect_error(
        fx.srv
            .request_as(&fx.srv.approver_token, Method::POST, &format!("/v1/approvals/{approval_id}/approve"))
            .send()
            .await
            .unwrap(),
        409,
        "EXECUTION_CONFLICT",
    )
    .await;
    assert_eq!(e["details"]["current_schedule_version"], version + 1);
    let p = json_ok(fx.srv.get(&format!("/v1/pipelines/{pipeline}")).send().await.unwrap()).await;
    assert!(p["data"]["active_job"].is_null(), "a 409 never creates a job");
    // With the current version it runs.
    let job = json_ok(
        fx.srv
            .request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync"))
            .json(&json!({ "schedule_version": version + 1 }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(fx.wait(job["data"]["job_id"].as_str().unwrap()).await["status"], "succeeded");
}

async fn sources_in_use_are_kept_until_their_connections_are_deleted(backend: Backend) {
    let fx = setup(backend, 10).await;
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "full_refresh_overwrite").await;
    let e = expect_error(
        fx.srv.request(Method::DELETE, &format!("/v1/sources/{}", fx.source_id)).send().await.unwrap(),
        409,
        "SOURCE_IN_USE",
    )
    .await;
    assert_eq!(e["details"]["connection_ids"], json!([pipeline]));
    json_ok(fx.srv.request(Method::DELETE, &format!("/v1/connections/{pipeline}")).send().await.unwrap()).await;
    let done =
        json_ok(fx.srv.request(Method::DELETE, &format!("/v1/sources/{}", fx.source_id)).send().await.unwrap()).await;
    assert_eq!(done["data"]["deletion_verified"], true);
}

async fn postgres_destinations_receive_the_same_rows(backend: Backend) {
    // The warehouse is a database of its own, whichever the control
    // database is. None has printed why it skipped.
    let Some(warehouse) = crate::support::PgDatabase::create().await else { return };
    let fx = setup(backend, 700).await;
    let url = url::Url::parse(&warehouse.url).unwrap();
    let dest = fx.destination("postgres", json!({ "url": url.as_str() })).await;
    let pipeline = fx.pipeline(&dest, "incremental_deduped").await;
    for _ in 0..2 {
        let job = fx.sync(&pipeline).await;
        assert_eq!(job["status"], "succeeded", "{job}");
    }
    assert_eq!(count_rows(url.as_str(), "events").await, 700);
    use sqlx::{Connection, Row};
    let mut c = sqlx::PgConnection::connect(url.as_str()).await.unwrap();
    let row = sqlx::query("SELECT note, payload, kind FROM events WHERE id = '5'").fetch_one(&mut c).await.unwrap();
    assert_eq!(row.get::<String, _>(0), note(5), "escaped characters arrive intact");
    assert_eq!(row.get::<String, _>(1), r#"{"n":5}"#);
    assert_eq!(row.get::<String, _>(2), "click");

    // Someone gives columns real types in the warehouse; the next sync
    // still lands (the server converts the text it is sent).
    let extracted = "SELECT _service_extracted_at FROM events WHERE id = '699'";
    let before: i64 = sqlx::query(extracted).fetch_one(&mut c).await.unwrap().get(0);
    sqlx::query("ALTER TABLE events ALTER COLUMN payload TYPE jsonb USING payload::jsonb, ALTER COLUMN updated_at TYPE timestamptz USING updated_at::timestamptz")
        .execute(&mut c)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(count_rows(url.as_str(), "events").await, 700);
    let after: i64 = sqlx::query(extracted).fetch_one(&mut c).await.unwrap().get(0);
    assert!(after > before, "the last page was written again, into the typed columns");
    let row =
        sqlx::query("SELECT payload->>'n', extract(epoch FROM updated_at)::bigint, note FROM events WHERE id = '699'")
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(row.get::<String, _>(0), "699", "a JSON column");
    assert_eq!(row.get::<i64, _>(1), 1_704_067_200 + 699 % 60, "a timestamp column");
    assert_eq!(row.get::<String, _>(2), note(699), "escaped characters still arrive intact");

    // A full refresh copies straight into a fresh table.
    let dest2 = fx.destination("postgres", json!({ "url": url.as_str() })).await;
    let p = json_ok(
        fx.srv
            .post("/v1/pipelines", json!({ "name": "refresh", "source_id": fx.source_id, "destination_id": dest2, "streams": [{ "name": "events", "sync_mode": "full_refresh_overwrite" }] }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let refresh = p["data"]["pipeline_id"].as_str().unwrap().to_owned();
    for _ in 0..2 {
        let job = fx.sync(&refresh).await;
        assert_eq!(job["status"], "succeeded", "{job}");
    }
    assert_eq!(count_rows(url.as_str(), "events").await, 700, "overwritten, not appended");
    let row = sqlx::query("SELECT note FROM events WHERE id = '699'").fetch_one(&mut c).await.unwrap();
    assert_eq!(row.get::<String, _>(0), note(699));
}

/// A run started by approving a proposal records the trigger `approval`,
/// whether it syncs or resets; one asked for directly records `manual`.
async fn runs_started_by_an_approval_say_so_whatever_they_run(backend: Backend) {
    let fx = setup(backend, 10).await;
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    for action in ["sync", "reset"] {
        let direct =
            json_ok(fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/{action}")).send().await.unwrap())
                .await;
        let job = fx.wait(direct["data"]["job_id"].as_str().unwrap()).await;
        assert_eq!((job["kind"].as_str(), job["trigger"].as_str()), (Some(action), Some("manual")), "{job}");

        let proposal = json_ok(
            fx.srv
                .request(Method::POST, &format!("/v1/pipelines/{pipeline}/{action}"))
                .header("x-service-execution-mode", "proposal")
                .send()
                .await
                .unwrap(),
        )
        .await;
        let approval_id = proposal["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
        let approved = json_ok(
            fx.srv
                .request_as(&fx.srv.approver_token, Method::POST, &format!("/v1/approvals/{approval_id}/approve"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let job_id = approved["data"]["result"]["job_id"].as_str().unwrap_or_else(|| panic!("{approved}")).to_owned();
        let job = fx.wait(&job_id).await;
        assert_eq!((job["kind"].as_str(), job["trigger"].as_str()), (Some(action), Some("approval")), "{job}");
    }
}

/// `GET /jobs` and a job's attempts, around a credential that is revoked
/// between two syncs: the next sync fails at once, the source says why.
async fn jobs_are_listed_by_filter_and_a_revoked_credential_stops_the_next_sync(backend: Backend) {
    let fx = setup(backend, 40).await;
    let srv = &fx.srv;
    let dest = fx.destination("sqlite", json!({ "file": "jobs.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    let j1 = fx.sync(&pipeline).await;
    let j2 = fx.sync(&pipeline).await;
    assert_eq!((j1["status"].as_str(), j2["status"].as_str()), (Some("succeeded"), Some("succeeded")));

    // Revoke the source's credential.
    let creds = json_ok(srv.get("/v1/credentials").send().await.unwrap()).await;
    let cred = creds["data"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["hosts"] == json!(["api.source.test"]))
        .unwrap()
        .clone();
    let id = cred["credential_id"].as_str().unwrap();
    let ws = srv.workspace_id().await;
    let (_, viewer) = srv.user_in(&ws, service::access::Role::Viewer).await;
    expect_error(
        srv.request_as(&viewer, Method::POST, &format!("/v1/credentials/{id}/revoke")).send().await.unwrap(),
        403,
        "403",
    )
    .await;
    let revoked =
        json_ok(srv.request(Method::POST, &format!("/v1/credentials/{id}/revoke")).send().await.unwrap()).await;
    let me = json_ok(srv.get("/v1/me").send().await.unwrap()).await;
    assert_eq!(revoked["data"]["credential"]["status"], "revoked");
    assert_eq!(revoked["data"]["credential"]["revoked_by"], me["data"]["user"]["user_id"]);
    assert!(revoked["data"]["credential"]["revoked_at"].is_string());
    assert_eq!(revoked["data"]["sources_using_it"], json!([fx.source_id]));
    expect_error(
        srv.request(Method::POST, &format!("/v1/credentials/{id}/revoke")).send().await.unwrap(),
        409,
        "CREDENTIAL_REVOKED",
    )
    .await;
    {
        use sqlx::{Connection, Row};
        let mut c = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
        let row = sqlx::query("SELECT ciphertext, nonce FROM credentials WHERE id = $1")
            .bind(id)
            .fetch_one(&mut c)
            .await
            .unwrap();
        assert_eq!(
            (row.get::<String, _>(0), row.get::<String, _>(1)),
            (String::new(), String::new()),
            "the sealed secret is destroyed"
        );
    }
    let source = json_ok(srv.get(&format!("/v1/sources/{}", fx.source_id)).send().await.unwrap()).await;
    assert!(source["data"]["credential_warnings"][0].as_str().unwrap().contains("revoked"), "{source}");
    let j3 = fx.sync(&pipeline).await;
    assert_eq!(j3["status"], "failed", "{j3}");
    let j3_id = j3["job_id"].as_str().unwrap();
    let attempts = json_ok(srv.get(&format!("/v1/jobs/{j3_id}/attempts")).send().await.unwrap()).await;
    let last = attempts["data"]["items"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["outcome"], "failed", "{attempts}");
    assert!(last["error"].as_str().unwrap().contains("revoked"), "{attempts}");
    assert!(!attempts.to_string().contains(&fx.events.token));

    // Listing: newest first, by status, paged, by pipeline, kind and time.
    let ids = |v: &Value| {
        v["data"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["job_id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let id_of = |j: &Value| j["job_id"].as_str().unwrap().to_owned();
    let all = json_ok(srv.get("/v1/jobs").send().await.unwrap()).await;
    assert_eq!(ids(&all), [id_of(&j3), id_of(&j2), id_of(&j1)]);
    assert_eq!(ids(&json_ok(srv.get("/v1/jobs?status=failed").send().await.unwrap()).await), [id_of(&j3)]);
    let page = json_ok(srv.get("/v1/jobs?status=succeeded&limit=1").send().await.unwrap()).await;
    assert_eq!(ids(&page), [id_of(&j2)]);
    let cursor = page["data"]["next_cursor"].as_str().unwrap();
    let next =
        json_ok(srv.get(&format!("/v1/jobs?status=succeeded&limit=1&cursor={cursor}")).send().await.unwrap()).await;
    assert_eq!(ids(&next), [id_of(&j1)]);
    assert!(next["data"]["next_cursor"].is_null());
    assert_eq!(
        ids(&json_ok(srv.get(&format!("/v1/jobs?pipeline_id={pipeline}&kind=sync")).send().await.unwrap()).await).len(),
        3
    );
    assert!(ids(&json_ok(srv.get("/v1/jobs?kind=reset").send().await.unwrap()).await).is_empty());
    assert!(ids(&json_ok(srv.get("/v1/jobs?pipeline_id=pl_other").send().await.unwrap()).await).is_empty());
    assert!(
        ids(&json_ok(srv.get("/v1/jobs?created_after=2999-01-01T00:00:00Z").send().await.unwrap()).await).is_empty()
    );
    assert_eq!(
        ids(&json_ok(
            srv.get("/v1/jobs?created_before=2999-01-01T00:00:00Z&created_after=2001-01-01T00:00:00Z")
                .send()
                .await
                .unwrap()
        )
        .await)
        .len(),
        3
    );
    let e = expect_error(srv.get("/v1/jobs?status=exploded").send().await.unwrap(), 400, "VALIDATION_FAILED").await;
    assert_eq!(e["details"]["field"], "status");
    expect_error(srv.get("/v1/jobs?created_after=yesterday").send().await.unwrap(), 400, "VALIDATION_FAILED").await;
    // Another workspace sees none of them, nor their attempts.
    let (_, other) = srv.other_workspace().await;
    let theirs = json_ok(srv.request_as(&other, Method::GET, "/v1/jobs").send().await.unwrap()).await;
    assert!(ids(&theirs).is_empty());
    expect_error(
        srv.request_as(&other, Method::GET, &format!("/v1/jobs/{j3_id}/attempts")).send().await.unwrap(),
        404,
        "404",
    )
    .await;
}

/// PATCH merges a destination's configuration as it does a source's, and
/// a destination is deleted only once no pipeline writes to it.
async fn destinations_merge_patches_and_are_deleted_only_when_unused(backend: Backend) {
    let fx = setup(backend, 5).await;
    let srv = &fx.srv;
    let dest = fx.destination("sqlite", json!({ "file": "first.db" })).await;
    let path = format!("/v1/destinations/{dest}");
    let patched = json_ok(
        srv.request(Method::PATCH, &path)
            .json(&json!({ "name": "renamed", "configuration": {} }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(patched["data"]["configuration"], json!({ "file": "first.db" }), "keys the body leaves out stay");
    let patched = json_ok(
        srv.request(Method::PATCH, &path)
            .json(&json!({ "configuration": { "file": "second.db" } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(patched["data"]["configuration"], json!({ "file": "second.db" }));
    assert_eq!(patched["data"]["name"], "renamed");
    expect_error(
        srv.request(Method::PATCH, &path).json(&json!({ "configuration": { "file": null } })).send().await.unwrap(),
        400,
        "VALIDATION_FAILED",
    )
    .await;

    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    let e = expect_error(srv.request(Method::DELETE, &path).send().await.unwrap(), 409, "DESTINATION_IN_USE").await;
    assert_eq!(e["details"]["pipeline_ids"], json!([pipeline]));
    let (_, other) = srv.other_workspace().await;
    expect_error(srv.request_as(&other, Method::DELETE, &path).send().await.unwrap(), 404, "404").await;
    json_ok(srv.request(Method::DELETE, &format!("/v1/connections/{pipeline}")).send().await.unwrap()).await;
    let deleted = json_ok(srv.request(Method::DELETE, &path).send().await.unwrap()).await;
    assert_eq!(deleted["data"]["deleted"], true);
    expect_error(srv.get(&path).send().await.unwrap(), 404, "404").await;
    expect_error(srv.request(Method::DELETE, &path).send().await.unwrap(), 404, "404").await;
}

/// What a sync's plugin cost is on its job (guest CPU, peak memory,
/// requests and bytes through the egress, host time), in `/metrics` by
/// connector and version, and in the CLI's job view.
async fn a_job_says_what_its_plugin_cost(backend: Backend) {
    let fx = setup(backend, 1000).await;
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_deduped").await;
    let before = fx.srv.client.get(fx.srv.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let usage = &job["usage"];
    // 1000 records, 300 a page: four pages, each one request.
    assert_eq!(usage["requests"], 4, "{job}");
    assert!(usage["bytes_received"].as_u64().unwrap() > job["progress"]["bytes"].as_u64().unwrap() / 2, "{job}");
    assert_eq!(usage["bytes_sent"], 0, "GET requests carry no body: {job}");
    assert!(usage["peak_memory_bytes"].as_u64().unwrap() > 64 * 1024, "{job}");
    assert!(usage["guest_cpu_ms"].is_u64() && usage["host_ms"].is_u64(), "{job}");

    let metrics = fx.srv.client.get(fx.srv.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let counted = |text: &str, name: &str| {
        let key = format!("{name}{{connector=\"test_paged_source\",version=\"0.1.0\"}} ");
        text.lines().find_map(|l| l.strip_prefix(key.as_str())).map_or(0.0, |v| v.trim().parse::<f64>().unwrap())
    };
    // (The meters are the process's: other tests' syncs of this plugin
    // may count at the same time, never fewer.)
    let requests = counted(&metrics, "plugin_requests_total") - counted(&before, "plugin_requests_total");
    assert!(requests >= 4.0, "{requests}: {metrics}");
    assert!(counted(&metrics, "plugin_received_bytes_total") >= usage["bytes_received"].as_f64().unwrap());
    // Invocations: one read (the catalog was kept when the pipeline was
    // made, so the sync does not discover).
    assert!(counted(&metrics, "plugin_invocations_total") - counted(&before, "plugin_invocations_total") >= 1.0);
    assert!(metrics.contains("plugin_peak_memory_bytes"), "{metrics}");

    let config = tempfile::tempdir().unwrap();
    let cli = crate::cli_api::Cli::of(&fx.srv, config.path());
    let shown = cli.ok(&["jobs", "get", job["job_id"].as_str().unwrap()]).await;
    assert!(shown.contains("usage.requests:") && shown.contains("usage.guest_cpu_ms:"), "{shown}");
    assert!(shown.contains("plugin.version:"), "{shown}");
}

/// A destination host the operator allows by name that resolves to an
/// address the operator does not allow: the sync fails on its first
/// attempt (no retry can change the rule), naming the rule and not the
/// address, which job errors would show to every member.
async fn a_warehouse_refused_by_the_address_rule_fails_at_once_without_naming_the_address(backend: Backend) {
    let fx = setup_with(backend, 10, |c| {
        c.plugins.warehouses =
            service::config::warehouse::WarehousePolicy::from_settings("localhost,127.0.0.2").unwrap();
    })
    .await;
    let dest = fx.destination("postgres", json!({ "url": "postgres://loader@localhost/w" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["attempts"], 1, "a rule is not retried: {job}");
    let error = job["error"].as_str().unwrap();
    assert!(error.contains("localhost resolves to a loopback address, which the operator does not allow"), "{error}");
    assert!(!job.to_string().contains("127.0.0.1") && !job.to_string().contains("::1"), "{job}");
}

on_both_backends!(
    a_warehouse_refused_by_the_address_rule_fails_at_once_without_naming_the_address,
    jobs_are_listed_by_filter_and_a_revoked_credential_stops_the_next_sync,
    destinations_merge_patches_and_are_deleted_only_when_unused,
);

on_both_backends!(
    a_job_says_what_its_plugin_cost,
    runs_started_by_an_approval_say_so_whatever_they_run,
    a_sync_lands_every_record_in_sqlite_and_dedup_leaves_no_duplicates,
    jsonl_destinations_get_one_file_per_stream,
    a_hundred_concurrent_syncs_make_one_job_and_99_conflicts,
    a_changed_schedule_refuses_stale_sync_commands_and_proposals,
    sources_in_use_are_kept_until_their_connections_are_deleted,
    postgres_destinations_receive_the_same_rows,
);

/// Server processes for one test: a data directory with the paged source
/// plugin and the fake provider's root, and the environment that reaches it.
pub(crate) struct Processes {
    dir: tempfile::TempDir,
    pub env: Vec<(&'static str, String)>,
    token: String,
    client: reqwest::Client,
    /// The bootstrap administrator's workspace, once a pipeline is made.
    workspace: std::sync::OnceLock<String>,
}

impl Processes {
    pub(crate) fn new(ca: &TestCa, provider: &FakeProvider) -> Processes {
        let dir = tempfile::tempdir().unwrap();
        let roots = dir.path().join("roots.pem");
        std::fs::write(&roots, &ca.pem).unwrap();
        let plugins = dir.path().join("plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::copy(test_plugin("test_paged_source"), plugins.join("paged.wasm")).unwrap();
        let token = "svc_process_test_admin_token_0123456789".to_owned();
        let env = vec![
            ("SERVICE_DATA_DIR", dir.path().join("data").display().to_string()),
            ("SERVICE_PLUGINS_DIR", plugins.display().to_string()),
            // The test plugin is built unsigned.
            ("SERVICE_PLUGIN_SIGNATURES", "allowed".into()),
            ("SERVICE_BOOTSTRAP_TOKEN", token.clone()),
            ("SERVICE_EGRESS_ALLOWED_HOSTS", "*.source.test".into()),
            ("SERVICE_EGRESS_RESOLVE", provider.pins(&["api.source.test"])),
            ("SERVICE_EGRESS_EXTRA_ROOTS", roots.display().to_string()),
        ];
        Processes { dir, env, token, client: reqwest::Client::new(), workspace: Default::default() }
    }

    pub(crate) fn api(&self, base: &str, m: Method, p: &str) -> reqwest::RequestBuilder {
        self.client.request(m, format!("{base}{p}")).bearer_auth(&self.token)
    }

    /// Creates, through the server at `base`, a credential for `events`, a
    /// source reading `page_size` records per page, an SQLite destination
    /// `w.db` and a deduplicated pipeline; returns the pipeline id.
    pub(crate) async fn pipeline(&self, base: &str, events: &Events, page_size: u64) -> String {
        self.pipeline_into(
            base,
            events,
            page_size,
            json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "w.db" } }),
        )
        .await
    }

    /// Like [`Processes::pipeline`], into the destination `destination`
    /// describes (a `POST /destinations` body).
    async fn pipeline_into(&self, base: &str, events: &Events, page_size: u64, destination: Value) -> String {
        self.pipeline_of(base, "test_paged_source", &events.token, page_size, destination, "incremental_deduped").await
    }

    /// Enables `connector` (its file waits for an operator), then makes a
    /// credential holding `token`, a source, the destination and a pipeline in `mode`
    /// through the server at `base`; returns the pipeline id.
    pub(crate) async fn pipeline_of(
        &self,
        base: &str,
        connector: &str,
        token: &str,
        page_size: u64,
        destination: Value,
        mode: &str,
    ) -> String {
        let load = format!("/v1/admin/plugins/{connector}/load");
        json_ok(self.api(base, Method::POST, &load).send().await.unwrap()).await;
        let me = json_ok(self.api(base, Method::GET, "/v1/me").send().await.unwrap()).await;
        let _ = self.workspace.set(me["data"]["default_workspace_id"].as_str().unwrap().to_owned());
        let cred = json_ok(
            self.api(base, Method::POST, "/v1/credentials")
                .json(&json!({ "hosts": ["api.source.test"], "secret": token }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let configuration = json!({ "base_url": "https://api.source.test", "credential_handle": cred["data"]["credential_handle"], "page_size": page_size });
        let src = json_ok(
            self.api(base, Method::POST, "/v1/sources")
                .json(&json!({ "connector_id": connector, "name": "e", "configuration": configuration }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let dest =
            json_ok(self.api(base, Method::POST, "/v1/destinations").json(&destination).send().await.unwrap()).await;
        let streams = json!([{ "name": "events", "sync_mode": mode }]);
        let body = json!({ "name": "p", "source_id": src["data"]["source_id"], "destination_id": dest["data"]["destination_id"], "streams": streams });
        let p = json_ok(self.api(base, Method::POST, "/v1/pipelines").json(&body).send().await.unwrap()).await;
        p["data"]["pipeline_id"].as_str().unwrap().to_owned()
    }

    /// Makes, through the server at `base`, a credential holding `token`
    /// for the bundled REST source, a source reading `/pages/items` of
    /// `https://api.source.test` (a `RestApi`) `per_page` records a page,
    /// incremental on `updated_at`, an SQLite destination `w.db` and a
    /// pipeline of its stream `items` in `mode`; returns the pipeline id.
    pub(crate) async fn rest_manifest_pipeline(&self, base: &str, token: &str, per_page: u64, mode: &str) -> String {
        let destination = json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "w.db" } });
        self.rest_manifest_pipeline_into(base, token, per_page, mode, destination).await
    }

    /// [`Processes::rest_manifest_pipeline`] into `destination` (the body
    /// of `POST /destinations`).
    pub(crate) async fn rest_manifest_pipeline_into(
        &self,
        base: &str,
        token: &str,
        per_page: u64,
        mode: &str,
        destination: Value,
    ) -> String {
        let post = |path: &str, body: Value| {
            let sent = self.api(base, Method::POST, path).json(&body).send();
            async move { json_ok(sent.await.unwrap()).await }
        };
        let cred = post(
            "/v1/credentials",
            json!({ "connector_id": "conn_rest_manifest", "hosts": ["api.source.test"], "secret": token }),
        )
        .await;
        let manifest = json!({ "streams": [{ "name": "items", "path": "/pages/items", "records": "/data", "primary_key": ["id"],
            "params": { "per_page": per_page }, "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" },
            "incremental": { "cursor_field": "updated_at", "param": "since", "format": "rfc3339" } }] });
        let configuration = json!({ "base_url": "https://api.source.test", "credential_handle": cred["data"]["credential_handle"], "manifest": manifest });
        let source = post(
            "/v1/sources",
            json!({ "connector_id": "conn_rest_manifest", "name": "m", "configuration": configuration }),
        )
        .await;
        let destination = post("/v1/destinations", destination).await;
        let pipeline = post(
            "/v1/pipelines",
            json!({ "name": "p", "source_id": source["data"]["source_id"], "destination_id": destination["data"]["destination_id"],
                "streams": [{ "name": "items", "sync_mode": mode }] }),
        )
        .await;
        self.workspace.get_or_init(|| source["data"]["workspace_id"].as_str().unwrap_or_default().to_owned());
        pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned()
    }

    /// Servers that reach `provider` under `names` (and nothing else),
    /// rather than the paged source's host.
    pub(crate) fn reaching(&mut self, provider: &FakeProvider, names: &[&str]) {
        self.env.retain(|(k, _)| !matches!(*k, "SERVICE_EGRESS_ALLOWED_HOSTS" | "SERVICE_EGRESS_RESOLVE"));
        self.env.push(("SERVICE_EGRESS_ALLOWED_HOSTS", names.join(",")));
        self.env.push(("SERVICE_EGRESS_RESOLVE", provider.pins(names)));
    }

    /// Takes the bootstrap administrator's default workspace as the one
    /// pipelines are made in (for tests that make their own).
    pub(crate) async fn adopt_workspace(&self, base: &str) {
        let me = json_ok(self.api(base, Method::GET, "/v1/me").send().await.unwrap()).await;
        let _ = self.workspace.set(me["data"]["default_workspace_id"].as_str().unwrap().to_owned());
    }

    /// The data directory of the servers.
    pub(crate) fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// The workspace the pipelines are made in, once one is.
    pub(crate) fn workspace(&self) -> &str {
        self.workspace.get().expect("a pipeline was made")
    }

    /// The SQLite destination `w.db` of the pipeline's workspace.
    fn warehouse(&self) -> String {
        let ws = self.workspace.get().expect("a pipeline was made");
        format!("sqlite://{}?mode=ro", self.dir.path().join("data/warehouses").join(ws).join("w.db").display())
    }

    /// Polls the job through `base` until it ends.
    pub(crate) async fn wait(&self, base: &str, job_id: &str) -> Value {
        let mut last = Value::Null;
        for _ in 0..600 {
            last =
                json_ok(self.api(base, Method::GET, &format!("/v1/jobs/{job_id}")).send().await.unwrap()).await["data"]
                    .clone();
            if ["succeeded", "failed", "cancelled"].contains(&last["status"].as_str().unwrap_or_default()) {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("job {job_id} did not finish: {last}");
    }

    /// Rows in the SQLite destination's `events` table.
    async fn rows(&self) -> i64 {
        count_rows(&self.warehouse(), "events").await
    }
}

pub(crate) fn slow_events(token: &str, count: u64, delay_ms: u64) -> Arc<Events> {
    Arc::new(Events {
        token: token.into(),
        count,
        delay_ms: AtomicU64::new(delay_ms),
        in_flight: AtomicU64::new(0),
        max_in_flight: AtomicU64::new(0),
        hold_page_size: AtomicU64::new(0),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_server_was_killed_is_taken_over_without_duplicate_rows() {
    crate::support::init_crypto();
    let ca = TestCa::new();
    let events = slow_events("crash-test-source-token", 1200, 150);
    let provider = FakeProvider::start(&ca, &["api.source.test"], routes(events.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("SERVICE_JOB_LEASE_SECS", "2".into()));
    let mut first = ServerProcess::start(procs.env.clone()).await;
    let base = first.base.clone();
    let pipeline = procs.pipeline(&base, &events, 60).await;
    let job =
        json_ok(procs.api(&base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let job_id = job["data"]["job_id"].as_str().unwrap().to_owned();
    // Kill the server once some records are written.
    for _ in 0..400 {
        let j = json_ok(procs.api(&base, Method::GET, &format!("/v1/jobs/{job_id}")).send().await.unwrap()).await;
        if j["data"]["progress"]["records"].as_u64().unwrap_or(0) >= 120 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    first.kill();
    events.delay_ms.store(0, Ordering::SeqCst);

    let second = ServerProcess::start(procs.env.clone()).await;
    let last = procs.wait(&second.base, &job_id).await;
    let attempts =
        json_ok(procs.api(&second.base, Method::GET, &format!("/v1/jobs/{job_id}/attempts")).send().await.unwrap())
            .await;
    drop(second);
    assert_eq!(last["status"], "succeeded", "{last}");
    assert_eq!(last["attempts"], 2, "taken over after the lease expired: {last}");
    let a = &attempts["data"]["items"];
    assert_eq!((a[0]["attempt"].as_i64(), a[0]["outcome"].as_str()), (Some(1), Some("abandoned")), "{attempts}");
    assert!(a[0]["error"].as_str().unwrap().contains("lease"));
    assert_eq!((a[1]["attempt"].as_i64(), a[1]["outcome"].as_str()), (Some(2), Some("succeeded")), "{attempts}");
    assert_eq!(procs.rows().await, 1200, "every record once, no duplicates");
}

/// Two `service serve` processes on one PostgreSQL database, both with
/// runners: sync requests spread over both make one job per round, and
/// only one runner ever reads for it. Needs `SERVICE_TEST_DATABASE_URL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_on_one_postgres_never_run_two_jobs_of_one_pipeline() {
    crate::support::init_crypto();
    // None has printed why it skipped.
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let ca = TestCa::new();
    let events = slow_events("replica-test-source-token", 600, 80);
    let provider = FakeProvider::start(&ca, &["api.source.test"], routes(events.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("DATABASE_URL", db.url.clone()));
    // One after the other: the first creates the shared key file.
    let a = ServerProcess::start(procs.env.clone()).await;
    let b = ServerProcess::start(procs.env.clone()).await;
    let (base_a, base_b) = (a.base.clone(), b.base.clone());
    let pipeline = procs.pipeline(&base_a, &events, 100).await;
    for round in 0..3 {
        // The round's job reads nothing until every request is answered, so
        // however slowly the servers answer, each request meets it active.
        events.hold_page_size.store(100, Ordering::SeqCst);
        let mut requests = Vec::new();
        for i in 0..20 {
            let req = procs.api(
                if i % 2 == 0 { &base_a } else { &base_b },
                Method::POST,
                &format!("/v1/pipelines/{pipeline}/sync"),
            );
            requests.push(tokio::spawn(async move { json(req.send().await.unwrap()).await }));
        }
        let mut created = Vec::new();
        for r in requests {
            let (status, body) = r.await.unwrap();
            match status {
                StatusCode::CREATED => created.push(body["data"]["job_id"].as_str().unwrap().to_owned()),
                StatusCode::CONFLICT => assert_eq!(body["code"], "EXECUTION_CONFLICT", "{body}"),
                other => panic!("round {round}: unexpected {other}: {body}"),
            }
        }
        assert_eq!(created.len(), 1, "round {round}: one job across both servers: {created:?}");
        events.hold_page_size.store(0, Ordering::SeqCst);
        let job = procs.wait(&base_b, &created[0]).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        assert_eq!(job["attempts"], 1, "never claimed twice: {job}");
    }
    drop((a, b));
    assert_eq!(events.max_in_flight.load(Ordering::SeqCst), 1, "only one runner read at a time");
    assert_eq!(procs.rows().await, 600, "every record once");
}

/// Upgrades drain, on two server processes sharing one PostgreSQL
/// database: a sync that started on version 1 finishes on version 1 while
/// version 2 is made current mid-sync, even when its server dies and
/// another takes the job over; the next sync runs version 2. Only the
/// first server ever has the plugin's files: the second runs what the
/// database holds. Needs `SERVICE_TEST_DATABASE_URL` (or the local server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_finishes_on_the_plugin_version_it_started_with_while_another_becomes_current() {
    crate::support::init_crypto();
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let ca = TestCa::new();
    // Slow pages (24 of them) until the first server is gone, then quick.
    let events = slow_events("upgrade-test-source-token", 1200, 600);
    let provider = FakeProvider::start(&ca, &["api.source.test"], routes(events.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("DATABASE_URL", db.url.clone()));
    procs.env.push(("SERVICE_JOB_LEASE_SECS", "2".into()));
    let files = procs.dir.path().join("plugins");
    std::fs::copy(test_plugin("test_versioned_one"), files.join("versioned.wasm")).unwrap();
    let mut a = ServerProcess::start(procs.env.clone()).await;
    let base_a = a.base.clone();
    let destination = json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "w.db" } });
    let pipeline =
        procs.pipeline_of(&base_a, "test_versioned", &events.token, 50, destination, "full_refresh_overwrite").await;
    let sync = |base: &str| {
        let req = procs.api(base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync"));
        async move { json_ok(req.send().await.unwrap()).await["data"]["job_id"].as_str().unwrap().to_owned() }
    };
    let job_id = sync(&base_a).await;
    let job_path = format!("/v1/jobs/{job_id}");
    for _ in 0..400 {
        let j = json_ok(procs.api(&base_a, Method::GET, &job_path).send().await.unwrap()).await;
        if j["data"]["progress"]["records"].as_u64().unwrap_or(0) >= 100 {
            assert_eq!(j["data"]["plugin"]["version"], "1.0.0", "{j}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // Version 2 arrives; it is installed, not run, until made current.
    std::fs::copy(test_plugin("test_versioned_two"), files.join("versioned-2.wasm")).unwrap();
    let versions_path = "/v1/admin/plugins/test_versioned/versions";
    let mut versions = Value::Null;
    for _ in 0..200 {
        versions = json_ok(procs.api(&base_a, Method::GET, versions_path).send().await.unwrap()).await;
        if versions["data"]["items"].as_array().unwrap().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let items = versions["data"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{versions}");
    assert_eq!((items[0]["version"].as_str(), items[0]["current"].as_bool()), (Some("1.0.0"), Some(true)));
    assert_eq!((items[1]["version"].as_str(), items[1]["current"].as_bool()), (Some("2.0.0"), Some(false)));
    let used = procs.api(&base_a, Method::POST, "/v1/admin/plugins/test_versioned/use");
    let used = json_ok(used.json(&json!({ "version": "2.0.0" })).send().await.unwrap()).await;
    assert_eq!((used["data"]["version"].as_str(), used["data"]["available"].as_bool()), (Some("2.0.0"), Some(true)));
    let running = json_ok(procs.api(&base_a, Method::GET, &job_path).send().await.unwrap()).await;
    assert_eq!(running["data"]["status"], "running", "version 2 became current mid-sync: {running}");

    // The first server dies mid-sync; the second, with no plugin file,
    // takes the job over and finishes it on version 1.
    a.kill();
    events.delay_ms.store(0, Ordering::SeqCst);
    let elsewhere = procs.dir.path().join("plugins-b");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let mut env_b = procs.env.clone();
    env_b.retain(|(k, _)| *k != "SERVICE_PLUGINS_DIR");
    env_b.push(("SERVICE_PLUGINS_DIR", elsewhere.display().to_string()));
    let b = ServerProcess::start(env_b).await;
    let first = procs.wait(&b.base, &job_id).await;
    assert_eq!((first["status"].as_str(), first["attempts"].as_i64()), (Some("succeeded"), Some(2)), "{first}");
    assert_eq!(first["plugin"]["version"], "1.0.0", "{first}");
    assert_eq!(stamps(&procs.warehouse()).await, vec![("1.0.0".to_owned(), 1200)], "every record read by version 1");

    // The next sync runs version 2.
    let next = sync(&b.base).await;
    let second = procs.wait(&b.base, &next).await;
    assert_eq!((second["status"].as_str(), second["plugin"]["version"].as_str()), (Some("succeeded"), Some("2.0.0")));
    assert_eq!(stamps(&procs.warehouse()).await, vec![("2.0.0".to_owned(), 1200)]);
    drop(b);
}

/// The plugin versions stamped on the destination's events, with counts.
async fn stamps(url: &str) -> Vec<(String, i64)> {
    use sqlx::{Connection, Row};
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(url).await.unwrap();
    let rows = sqlx::query("SELECT plugin_version AS v, COUNT(*) AS n FROM events GROUP BY plugin_version ORDER BY 1")
        .fetch_all(&mut c)
        .await
        .unwrap();
    rows.iter().map(|r| (r.try_get("v").unwrap(), r.try_get("n").unwrap())).collect()
}

async fn schedules_start_syncs_skip_when_busy_and_stop_when_paused(backend: Backend) {
    // Four slow pages: each run takes seconds, so the next ticks meet it.
    let fx = setup(backend, 1200).await;
    fx.events.delay_ms.store(1000, Ordering::SeqCst);
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_deduped").await;
    let bad = fx
        .srv
        .request(Method::PATCH, &format!("/v1/pipelines/{pipeline}"))
        .json(&json!({ "schedule": { "kind": "cron", "expression": "not a cron" } }))
        .send()
        .await
        .unwrap();
    expect_error(bad, 400, "VALIDATION_FAILED").await;
    // Every second.
    json_ok(
        fx.srv
            .request(Method::PATCH, &format!("/v1/pipelines/{pipeline}"))
            .json(&json!({ "schedule": { "kind": "cron", "expression": "* * * * * *" } }))
            .send()
            .await
            .unwrap(),
    )
    .await;

    let mut scheduled = Value::Null;
    for _ in 0..100 {
        let p = json_ok(fx.srv.get(&format!("/v1/pipelines/{pipeline}")).send().await.unwrap()).await;
        if p["data"]["active_job"]["trigger"] == "schedule" {
            scheduled = p["data"]["active_job"].clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(scheduled["trigger"], "schedule", "a scheduled sync started");
    // While it runs, the next ticks are skipped and recorded, not queued.
    let mut skipped = 0;
    for _ in 0..60 {
        let logs = json_ok(fx.srv.get("/v1/audit-logs?action=pipelines.schedule_skipped").send().await.unwrap()).await;
        skipped = logs["data"]["items"].as_array().unwrap().len();
        if skipped > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(skipped > 0, "a busy scheduled run is recorded as skipped");
    json_ok(fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/pause")).send().await.unwrap()).await;
    fx.events.delay_ms.store(0, Ordering::SeqCst);
    fx.wait(scheduled["job_id"].as_str().unwrap()).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let p = json_ok(fx.srv.get(&format!("/v1/pipelines/{pipeline}")).send().await.unwrap()).await;
    assert!(p["data"]["active_job"].is_null(), "paused pipelines do not run: {p}");
    assert_eq!(p["data"]["status"], "paused");
}

async fn a_running_job_can_be_cancelled(backend: Backend) {
    let fx = setup(backend, 600).await;
    fx.events.delay_ms.store(400, Ordering::SeqCst);
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    let job =
        json_ok(fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let id = job["data"]["job_id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let cancelled = json_ok(fx.srv.request(Method::POST, &format!("/v1/jobs/{id}/cancel")).send().await.unwrap()).await;
    assert_eq!(cancelled["data"]["status"], "cancelled");
    expect_error(
        fx.srv.request(Method::POST, &format!("/v1/jobs/{id}/cancel")).send().await.unwrap(),
        409,
        "JOB_NOT_ACTIVE",
    )
    .await;
    // The pipeline is free again.
    fx.events.delay_ms.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fx.sync(&pipeline).await["status"], "succeeded");
    assert_eq!(
        json_ok(fx.srv.get(&format!("/v1/jobs/{id}")).send().await.unwrap()).await["data"]["status"],
        "cancelled"
    );
}

/// Polls a job with `token` (its workspace's member) until it ends.
async fn wait_as(srv: &TestServer, token: &str, job_id: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..600 {
        last = json_ok(srv.request_as(token, Method::GET, &format!("/v1/jobs/{job_id}")).send().await.unwrap()).await["data"].clone();
        if ["succeeded", "failed", "cancelled"].contains(&last["status"].as_str().unwrap_or_default()) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {job_id} did not finish: {last}");
}

/// A second workspace reading the same fake source into its own
/// destination: (workspace, its administrator's token, pipeline).
async fn other_workspace_pipeline(fx: &Fx, page_size: u64, destination: Value) -> (String, String, String) {
    let (ws, admin) = fx.srv.other_workspace().await;
    let api = |m: Method, p: &str| fx.srv.request_as(&admin, m, p);
    let cred = json_ok(
        api(Method::POST, "/v1/credentials")
            .json(&json!({ "hosts": ["api.source.test"], "secret": fx.events.token }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let configuration = json!({ "base_url": "https://api.source.test", "credential_handle": cred["data"]["credential_handle"], "page_size": page_size });
    let src = json_ok(
        api(Method::POST, "/v1/sources")
            .json(&json!({ "connector_id": "test_paged_source", "name": "theirs", "configuration": configuration }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let dest = json_ok(api(Method::POST, "/v1/destinations").json(&destination).send().await.unwrap()).await;
    let body = json!({ "name": "theirs", "source_id": src["data"]["source_id"], "destination_id": dest["data"]["destination_id"], "streams": [{ "name": "events", "sync_mode": "full_refresh_overwrite" }] });
    let p = json_ok(api(Method::POST, "/v1/pipelines").json(&body).send().await.unwrap()).await;
    (ws, admin, p["data"]["pipeline_id"].as_str().unwrap().to_owned())
}

async fn workspaces_never_share_warehouse_files(backend: Backend) {
    let fx = setup(backend, 40).await;
    let ws = fx.srv.workspace_id().await;
    let mine =
        fx.pipeline(&fx.destination("sqlite", json!({ "file": "shared.db" })).await, "full_refresh_overwrite").await;
    assert_eq!(fx.sync(&mine).await["status"], "succeeded");
    // Another workspace names the same file and runs a full refresh: it
    // drops and fills a table of its own file, not of this one.
    let (other, admin, theirs) = other_workspace_pipeline(
        &fx,
        300,
        json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "shared.db" } }),
    )
    .await;
    let job =
        json_ok(fx.srv.request_as(&admin, Method::POST, &format!("/v1/pipelines/{theirs}/sync")).send().await.unwrap())
            .await;
    assert_eq!(wait_as(&fx.srv, &admin, job["data"]["job_id"].as_str().unwrap()).await["status"], "succeeded");
    for (workspace, pipeline) in [(&ws, &mine), (&other, &theirs)] {
        let url = format!("sqlite://{}?mode=ro", fx.srv.warehouse(workspace, "shared.db").display());
        assert_eq!(count_rows(&url, "events").await, 40);
        use sqlx::{Connection, Row};
        let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
        let meta: String =
            sqlx::query("SELECT \"_service_meta\" FROM \"events\" LIMIT 1").fetch_one(&mut c).await.unwrap().get(0);
        assert!(meta.contains(pipeline.as_str()), "each file holds its own workspace's rows: {meta}");
    }
    // SQLite's own files beside a database are no destination's name.
    for side in ["shared.db-wal", "shared.db-shm", "shared.db-journal"] {
        let resp = fx
            .srv
            .post("/v1/destinations", json!({ "name": "side", "kind": "sqlite", "configuration": { "file": side } }))
            .send()
            .await
            .unwrap();
        expect_error(resp, 400, "VALIDATION_FAILED").await;
    }
}

async fn a_full_refresh_drops_only_tables_the_service_created(backend: Backend) {
    use sqlx::{Connection, Row};
    let fx = setup(backend, 30).await;
    let ws = fx.srv.workspace_id().await;
    // Someone's own table, named like the stream.
    let file = fx.srv.warehouse(&ws, "theirs.db");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
    sqlx::query("CREATE TABLE events (mine TEXT)").execute(&mut c).await.unwrap();
    sqlx::query("INSERT INTO events (mine) VALUES ('keep me')").execute(&mut c).await.unwrap();
    let pipeline =
        fx.pipeline(&fx.destination("sqlite", json!({ "file": "theirs.db" })).await, "full_refresh_overwrite").await;
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert!(job["error"].as_str().unwrap().contains("was not created by the service"), "{job}");
    let reset =
        json_ok(fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/reset")).send().await.unwrap()).await;
    assert_eq!(fx.wait(reset["data"]["job_id"].as_str().unwrap()).await["status"], "failed");
    let kept: String = sqlx::query("SELECT mine FROM events").fetch_one(&mut c).await.unwrap().get(0);
    assert_eq!(kept, "keep me", "the table and its row are as they were");

    if backend == Backend::Postgres {
        let db = crate::support::PgDatabase::create().await.expect("the PostgreSQL run has a server");
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query("CREATE TABLE events (mine TEXT)").execute(&mut c).await.unwrap();
        sqlx::query("INSERT INTO events (mine) VALUES ('keep me')").execute(&mut c).await.unwrap();
        let pipeline =
            fx.pipeline(&fx.destination("postgres", json!({ "url": db.url })).await, "full_refresh_overwrite").await;
        let job = fx.sync(&pipeline).await;
        assert_eq!(job["status"], "failed", "{job}");
        let kept: String = sqlx::query("SELECT mine FROM events").fetch_one(&mut c).await.unwrap().get(0);
        assert_eq!(kept, "keep me");
    }
}

async fn one_workspace_cannot_hold_every_runner(backend: Backend) {
    let fx = setup_with(backend, 20, |c| {
        c.limits.job_concurrency = 2;
        c.limits.job_concurrency_per_workspace = 1;
    })
    .await;
    // This workspace's provider stalls (its pages are 300 records).
    fx.events.hold_page_size.store(300, Ordering::SeqCst);
    let mut mine = Vec::new();
    for i in 0..3 {
        let pipeline = fx
            .pipeline(
                &fx.destination("sqlite", json!({ "file": format!("held-{i}.db") })).await,
                "full_refresh_overwrite",
            )
            .await;
        let job =
            json_ok(fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap())
                .await;
        mine.push(job["data"]["job_id"].as_str().unwrap().to_owned());
    }
    let (_, admin, theirs) = other_workspace_pipeline(
        &fx,
        299,
        json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "free.db" } }),
    )
    .await;
    let job =
        json_ok(fx.srv.request_as(&admin, Method::POST, &format!("/v1/pipelines/{theirs}/sync")).send().await.unwrap())
            .await;
    let done = wait_as(&fx.srv, &admin, job["data"]["job_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "another tenant's job runs while this one's are stuck: {done}");
    let mut statuses = Vec::new();
    for id in &mine {
        statuses.push(
            json_ok(fx.srv.get(&format!("/v1/jobs/{id}")).send().await.unwrap()).await["data"]["status"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    statuses.sort();
    assert_eq!(statuses, ["queued", "queued", "running"], "one runner at most for the stuck workspace");
    fx.events.hold_page_size.store(0, Ordering::SeqCst);
    for id in &mine {
        assert_eq!(fx.wait(id).await["status"], "succeeded");
    }
}

async fn connector_calls_beyond_the_cap_wait_their_turn_then_give_up(backend: Backend) {
    let fx = setup_with(backend, 20, |c| {
        c.plugins.limits.max_concurrent = 1;
        c.plugins.limits.wall_short = Duration::from_secs(2);
    })
    .await;
    // A sync holds the one turn while its provider stalls.
    fx.events.hold_page_size.store(300, Ordering::SeqCst);
    let pipeline =
        fx.pipeline(&fx.destination("sqlite", json!({ "file": "w.db" })).await, "full_refresh_overwrite").await;
    let job =
        json_ok(fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    for _ in 0..100 {
        if fx.events.in_flight.load(Ordering::SeqCst) == 0
            && json_ok(
                fx.srv.get(&format!("/v1/jobs/{}", job["data"]["job_id"].as_str().unwrap())).send().await.unwrap(),
            )
            .await["data"]["status"]
                == "running"
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A short call waits for a turn within its own time limit, then is
    // refused as a condition to retry.
    let resp = fx.srv.post("/v1/pipelines/prepare", json!({ "source_id": fx.source_id })).send().await.unwrap();
    let e = expect_error(resp, 503, "503").await;
    assert!(e["message"].as_str().unwrap().contains("too many connector invocations"), "{e}");
    fx.events.hold_page_size.store(0, Ordering::SeqCst);
    assert_eq!(fx.wait(job["data"]["job_id"].as_str().unwrap()).await["status"], "succeeded");
    json_ok(fx.srv.post("/v1/pipelines/prepare", json!({ "source_id": fx.source_id })).send().await.unwrap()).await;
}

on_both_backends!(
    connector_calls_beyond_the_cap_wait_their_turn_then_give_up,
    schedules_start_syncs_skip_when_busy_and_stop_when_paused,
    a_running_job_can_be_cancelled,
    workspaces_never_share_warehouse_files,
    a_full_refresh_drops_only_tables_the_service_created,
    one_workspace_cannot_hold_every_runner,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_never_get_the_servers_own_postgres_settings_or_an_unverified_password() {
    crate::support::init_crypto();
    let ca = TestCa::new();
    let events = slow_events("ambient-test-source-token", 10, 0);
    let provider = FakeProvider::start(&ca, &["api.source.test"], routes(events.clone())).await;
    let pg = FakePostgres::start().await;
    let mut procs = Processes::new(&ca, &provider);
    // The server's own settings, as an operator might have them for the
    // control database, and a pgpass file in its home.
    let home = crate::support::private_dir();
    std::fs::write(home.path().join(".pgpass"), "*:*:*:*:canary-pgpass-password\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(home.path().join(".pgpass"), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    for (k, v) in [
        ("PGPASSWORD", "canary-env-password".to_owned()),
        ("PGUSER", "canary_env_user".to_owned()),
        ("PGDATABASE", "canary_env_db".to_owned()),
        ("PGOPTIONS", "-c search_path=canary".to_owned()),
        ("PGAPPNAME", "canary-app".to_owned()),
        ("HOME", home.path().display().to_string()),
        ("PGPASSFILE", home.path().join(".pgpass").display().to_string()),
        ("SERVICE_WAREHOUSE_ALLOWED_HOSTS", "127.0.0.1".to_owned()),
    ] {
        procs.env.push((k, v));
    }
    let server = ServerProcess::start(procs.env.clone()).await;
    let base = server.base.clone();
    let url = format!("postgres://loader@127.0.0.1:{}/warehouse", pg.addr.port());
    let pipeline = procs
        .pipeline_into(&base, &events, 50, json!({ "name": "pg", "kind": "postgres", "configuration": { "url": url } }))
        .await;
    let job =
        json_ok(procs.api(&base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let job = procs.wait(&base, job["data"]["job_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "failed", "{job}");
    let seen = pg.connections();
    assert!(!seen.is_empty(), "the destination was tried");
    for s in &seen {
        assert_eq!(s.startup.get("user").map(String::as_str), Some("loader"), "{s:?}");
        assert_eq!(s.startup.get("database").map(String::as_str), Some("warehouse"), "{s:?}");
        assert_eq!(s.password.as_deref(), Some(""), "no password from the environment or pgpass: {s:?}");
        assert!(!format!("{s:?}").contains("canary"), "{s:?}");
    }

    // With a stored password, the connection must verify TLS first: this
    // server offers none, so the password never leaves.
    let before = seen.len();
    let cred = json_ok(
        procs
            .api(&base, Method::POST, "/v1/credentials")
            .json(&json!({ "hosts": ["127.0.0.1"], "secret": "canary-stored-password" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let dest = json!({ "name": "pg2", "kind": "postgres", "configuration": { "url": url, "credential_handle": cred["data"]["credential_handle"] } });
    let pipeline = procs.pipeline_into(&base, &events, 50, dest).await;
    let job =
        json_ok(procs.api(&base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let job = procs.wait(&base, job["data"]["job_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "failed", "{job}");
    let seen = pg.connections();
    assert!(seen.len() > before, "tried again");
    for s in &seen[before..] {
        assert!(s.asked_for_tls, "{s:?}");
        assert!(s.password.is_none() && s.startup.is_empty(), "nothing was sent without TLS: {s:?}");
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_database_still_takes_the_servers_postgres_settings() {
    // None has printed why it skipped.
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let name = url::Url::parse(&db.url).unwrap().path().trim_start_matches('/').to_owned();
    let admin = url::Url::parse(&db.url).unwrap();
    let dir = crate::support::private_dir();
    let env = vec![
        ("SERVICE_DATA_DIR", dir.path().display().to_string()),
        ("DATABASE_URL", format!("postgres:///{name}")),
        ("PGHOST", admin.host_str().unwrap().to_owned()),
        ("PGPORT", admin.port().unwrap_or(5432).to_string()),
        ("PGUSER", admin.username().to_owned()),
    ];
    let server = ServerProcess::start(env).await;
    let ready = reqwest::get(format!("{}/readyz", server.base)).await.unwrap();
    drop(server);
    assert!(ready.status().is_success(), "the control database was reached through PGHOST/PGPORT/PGUSER");
}

/// Where a crash test writes: SQLite, a PostgreSQL database of its own,
/// or an Iceberg table read back by pyiceberg and DuckDB.
#[derive(Clone, Copy, Debug)]
pub(crate) enum CrashInto {
    Sqlite,
    Postgres,
    Iceberg,
}

impl CrashInto {
    pub(crate) const ALL: [CrashInto; 3] = [CrashInto::Sqlite, CrashInto::Postgres, CrashInto::Iceberg];
}

/// One destination of a crash test, and how to count what landed in it.
pub(crate) struct CrashTarget {
    pub(crate) into: CrashInto,
    pg: Option<crate::support::PgDatabase>,
    reader: Option<crate::lakehouse::Reader>,
}

impl CrashTarget {
    /// `None` for PostgreSQL when no server answers (and none is required).
    pub(crate) async fn new(into: CrashInto) -> Option<CrashTarget> {
        let pg = match into {
            CrashInto::Postgres => Some(crate::support::PgDatabase::create().await?),
            _ => None,
        };
        let reader = matches!(into, CrashInto::Iceberg).then(crate::lakehouse::Reader::start);
        Some(CrashTarget { into, pg, reader })
    }

    /// What the servers need to reach it: a PostgreSQL warehouse is on
    /// loopback, as a tenant's never may be.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        match self.into {
            CrashInto::Postgres => vec![("SERVICE_WAREHOUSE_ALLOWED_HOSTS", "127.0.0.1".into())],
            _ => Vec::new(),
        }
    }

    /// The body of `POST /destinations` for it (`file` for SQLite).
    pub(crate) fn destination(&self, file: &str) -> Value {
        match (self.into, &self.pg) {
            (CrashInto::Postgres, Some(db)) => {
                json!({ "name": "pg", "kind": "postgres", "configuration": { "url": db.url } })
            }
            (CrashInto::Iceberg, _) => {
                json!({ "name": "lake", "kind": "iceberg", "configuration": { "warehouse": "lake", "namespace": "crash" } })
            }
            _ => json!({ "name": "w", "kind": "sqlite", "configuration": { "file": file } }),
        }
    }

    /// Rows of `table` and distinct values of its `key`, as a reader sees
    /// them (`file`: the SQLite destination's).
    pub(crate) async fn count(&mut self, procs: &Processes, file: &str, table: &str, key: &str) -> (i64, i64) {
        if let Some(reader) = self.reader.as_mut() {
            let database_url = format!("sqlite://{}/service.db", procs.data_dir().display());
            let catalog = format!("{}/lake", procs.workspace());
            let read = reader.read_with(&database_url, &catalog, &format!("crash.{table}"), json!({}), &[key]).await;
            let rows = read["rows"].as_array().unwrap_or_else(|| panic!("{read}"));
            let mut ids: Vec<String> = rows.iter().map(|r| r[key].to_string()).collect();
            let n = ids.len() as i64;
            ids.sort();
            ids.dedup();
            return (n, ids.len() as i64);
        }
        let url = match &self.pg {
            Some(db) => db.url.clone(),
            None => format!(
                "sqlite://{}?mode=ro",
                procs.data_dir().join("warehouses").join(procs.workspace()).join(file).display()
            ),
        };
        use sqlx::{Connection, Row};
        sqlx::any::install_default_drivers();
        let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
        let sql = format!("SELECT COUNT(*) AS n, COUNT(DISTINCT \"{key}\") AS ids FROM \"{table}\"");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(&mut c).await.unwrap();
        (row.try_get("n").unwrap(), row.try_get("ids").unwrap())
    }
}

/// Exactly once for the bundled REST source in an append: its pages
/// checkpoint the state the read started from (they need not come in
/// cursor order), so nothing they hold may be committed before the read's
/// end. A server killed (`kill -9`) in the middle of a first read, and of
/// a read resumed from a saved state, finishes the job on restart with
/// every record in the table once: into SQLite, PostgreSQL and an Iceberg
/// table (read back by pyiceberg and DuckDB).
async fn a_rest_manifest_append_killed_mid_read_leaves_every_record_once(into: CrashInto) {
    crate::support::init_crypto();
    let Some(mut target) = CrashTarget::new(into).await else { return };
    let ca = TestCa::new();
    let token = format!("rest-crash-{}", uuid::Uuid::new_v4().simple());
    let api = Arc::new(testkit::restapi::RestApi::new(3000).with_token(token.clone()));
    let provider = FakeProvider::start(&ca, &["api.source.test"], testkit::restapi::router(api.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("SERVICE_JOB_LEASE_SECS", "1".into()));
    procs.env.extend(target.env());
    let mut server = ServerProcess::start(procs.env.clone()).await;
    let destination = target.destination("w.db");
    let pipeline =
        procs.rest_manifest_pipeline_into(&server.base, &token, 100, "incremental_append", destination).await;
    let post = |base: &str, path: &str, body: Value| procs.api(base, Method::POST, path).json(&body);
    // Pages of 100, 30 ms each: a read of 3,000 records takes a second.
    api.page_delay_ms.store(30, Ordering::SeqCst);
    for (round, total) in [("first read", 3000), ("resumed read", 6000)] {
        let before = api.requests();
        let job =
            json_ok(post(&server.base, &format!("/v1/pipelines/{pipeline}/sync"), json!({})).send().await.unwrap())
                .await;
        let job_id = job["data"]["job_id"].as_str().unwrap().to_owned();
        // Killed once ten pages were read (and, before the fix, written),
        // the job showing records read and none written yet.
        let mut shown = Value::Null;
        for _ in 0..300 {
            shown = json_ok(procs.api(&server.base, Method::GET, &format!("/v1/jobs/{job_id}")).send().await.unwrap())
                .await["data"]["progress"]["streams"]["items"]
                .clone();
            if api.requests() >= before + 10 && shown["records_read"].as_u64().unwrap_or(0) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        server.kill();
        assert!(shown["records_read"].as_u64().unwrap_or(0) > 0, "{into:?}, {round}: reading shows: {shown}");
        assert_eq!(shown["records"], 0, "{into:?}, {round}: nothing the state does not cover is written: {shown}");
        server = ServerProcess::start(procs.env.clone()).await;
        let last = procs.wait(&server.base, &job_id).await;
        assert_eq!(last["status"], "succeeded", "{into:?}, {round}: {last}");
        let (n, ids) = target.count(&procs, "w.db", "items", "id").await;
        assert_eq!((n, ids), (total, total), "{into:?}, {round}: {n} rows for {ids} ids");
        // 3,000 new records for the next read to resume.
        api.add(3000);
    }
    server.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_manifest_append_killed_mid_read_leaves_every_record_once_in_sqlite() {
    a_rest_manifest_append_killed_mid_read_leaves_every_record_once(CrashInto::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_manifest_append_killed_mid_read_leaves_every_record_once_in_postgres() {
    a_rest_manifest_append_killed_mid_read_leaves_every_record_once(CrashInto::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_manifest_append_killed_mid_read_leaves_every_record_once_in_iceberg() {
    a_rest_manifest_append_killed_mid_read_leaves_every_record_once(CrashInto::Iceberg).await;
}

/// The control database failing for a moment while a job starts (here:
/// the destinations table gone and back, on PostgreSQL) is a transient
/// failure: the job is retried and succeeds, never failed as if what it
/// read had been deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_database_hiccup_is_retried_not_taken_for_a_deletion() {
    if !crate::support::postgres_available().await {
        return;
    }
    let fx = setup(Backend::Postgres, 100).await;
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    use sqlx::Connection;
    sqlx::any::install_default_drivers();
    let mut db = sqlx::AnyConnection::connect(&fx.srv.state.config.database_url).await.unwrap();
    sqlx::query("ALTER TABLE destinations RENAME TO destinations_away").execute(&mut db).await.unwrap();
    let job =
        json_ok(fx.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let id = job["data"]["job_id"].as_str().unwrap().to_owned();
    let mut seen = Value::Null;
    for _ in 0..200 {
        seen = json_ok(fx.srv.get(&format!("/v1/jobs/{id}")).send().await.unwrap()).await["data"].clone();
        if seen["attempts"].as_i64().unwrap_or(0) >= 1 && seen["status"] == "queued" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen["status"], "queued", "the attempt failed and another is due: {seen}");
    let said = seen["error"].as_str().unwrap_or_default();
    assert!(said.contains("control database") && !said.contains("no longer exists"), "{seen}");
    sqlx::query("ALTER TABLE destinations_away RENAME TO destinations").execute(&mut db).await.unwrap();
    let done = fx.wait(&id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["attempts"], 2, "{done}");
    db.close().await.unwrap();
    fx.srv.stop().await;
}
