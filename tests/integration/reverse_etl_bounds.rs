//! Reverse ETL within bounds: a model larger than a run may take fails the
//! run before anything is sent; a value over the cap is never read (a
//! preview shows its size, a run skips its row as invalid); a preview's
//! answer stays within its size; an SQLite model cannot read PRAGMAs (nor
//! learn the data directory's path); an assistant's preview is a proposal;
//! a run waiting on a destination's `Retry-After` stops when cancelled.

use std::time::Duration;

use axum::routing::post;
use reqwest::Method;
use serde_json::json;

use crate::on_both_backends;
use crate::reverse_etl::{HOOK_HOST, setup_with};
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, expect_error, json_ok};

on_both_backends!(runs_and_previews_stay_within_their_bounds);

async fn runs_and_previews_stay_within_their_bounds(backend: Backend) {
    let s = setup_with(backend, |c| {
        let limits = &mut c.limits.reverse_etl;
        limits.rows_per_run = 10;
        limits.value_bytes = 4096;
        limits.preview_cell_bytes = 1024;
        limits.preview_response_bytes = 4096;
    })
    .await;
    let srv = &s.srv;
    // A value of 200 KB, and a few of 900 bytes (under the cell size).
    s.sql(&format!("INSERT INTO customers VALUES ('big', '{}', 'B')", "x".repeat(200_000))).await;
    for i in 0..6 {
        s.sql(&format!("INSERT INTO customers VALUES ('wide{i}', 'w{i}@example.com', '{}')", "y".repeat(900))).await;
    }
    let prepare =
        |query: &str| srv.post("/v1/reverse-etl/prepare", json!({ "warehouse_id": s.warehouse_id, "query": query }));

    // A preview shows the big value by its size, never the value.
    let preview =
        json_ok(prepare("SELECT id, email FROM customers WHERE id IN ('c1', 'big')").send().await.unwrap()).await;
    let rows = preview["data"]["sample_rows"].as_array().unwrap();
    let big = rows.iter().find(|r| r["id"] == "big").unwrap();
    assert_eq!(big["email"], json!({ "$service_oversize": 200_000 }), "{big}");
    assert_eq!(preview["data"]["oversize_values"], 1);
    assert!(!preview.to_string().contains("xxxxxxxxxx"), "the value itself never appears");
    // Rows past the answer's size are left out, and it says so.
    let preview = json_ok(prepare("SELECT id, first_name FROM customers").send().await.unwrap()).await;
    assert_eq!(preview["data"]["sample_truncated"], true, "{}", preview["data"]["sample_rows"]);
    assert!(preview.to_string().len() < 8 * 1024);

    // PRAGMAs (which name the data directory's path) are refused.
    let data_dir = srv.data_dir.display().to_string();
    for query in [
        "SELECT * FROM pragma_database_list",
        "SELECT file AS id FROM pragma_database_list",
        "SELECT name AS id FROM pragma_table_info('customers')",
    ] {
        let refused = expect_error(prepare(query).send().await.unwrap(), 400, "MODEL_QUERY_INVALID").await;
        assert!(!refused.to_string().contains(&data_dir), "{refused}");
    }

    // A model over the rows a run may take fails the run, sending nothing.
    let hook = json_ok(srv.post("/v1/reverse-etl/destinations", json!({ "name": "hook", "kind": "webhook", "configuration": { "url": format!("https://{HOOK_HOST}/retl") } })).send().await.unwrap()).await;
    let hook_id = hook["data"]["destination_id"].as_str().unwrap().to_owned();
    let activation = |query: &'static str| {
        let (srv, warehouse, hook) = (srv, s.warehouse_id.clone(), hook_id.clone());
        async move {
            let model = json_ok(
                srv.post(
                    "/v1/reverse-etl/models",
                    json!({ "name": query, "warehouse_id": warehouse, "query": query, "primary_key": "id" }),
                )
                .send()
                .await
                .unwrap(),
            )
            .await;
            let body = json!({ "name": query, "model_id": model["data"]["model_id"], "destination_id": hook, "mappings": [{ "field": "email", "column": "email" }], "mode": "upsert" });
            json_ok(srv.post("/v1/reverse-etl/activations", body).send().await.unwrap()).await["data"]["activation_id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let all = activation("SELECT id, email FROM customers").await;
    let started =
        json_ok(srv.post(&format!("/v1/reverse-etl/activations/{all}/run"), json!({})).send().await.unwrap()).await;
    let job = srv.wait_job(started["data"]["run_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert!(job["error"].as_str().unwrap().contains("SERVICE_RETL_MAX_ROWS"), "{job}");
    assert!(s.hook.lock().unwrap().is_empty(), "nothing was sent");

    // A row holding a value over the run's cap is invalid, the rest sent.
    let two = activation("SELECT id, email FROM customers WHERE id IN ('c1', 'c2', 'big')").await;
    let started =
        json_ok(srv.post(&format!("/v1/reverse-etl/activations/{two}/run"), json!({})).send().await.unwrap()).await;
    let run_id = started["data"]["run_id"].as_str().unwrap().to_owned();
    assert_eq!(srv.wait_job(&run_id).await["status"], "succeeded");
    let run = json_ok(srv.get(&format!("/v1/reverse-etl/runs/{run_id}")).send().await.unwrap()).await;
    let progress = &run["data"]["progress"];
    assert_eq!(
        (progress["counts"]["added"].as_u64(), progress["counts"]["invalid"].as_u64()),
        (Some(2), Some(1)),
        "{progress}"
    );
    let reason = progress["invalid_samples"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("200000 bytes") && reason.contains("SERVICE_RETL_MAX_VALUE_BYTES"), "{reason}");

    // An assistant's preview runs a query with the workspace's
    // credentials: a proposal, like its writes.
    let ws = srv.workspace_id().await;
    let (_, editor) = srv.user_in(&ws, service::access::Role::Editor).await;
    let assistant = srv
        .request_as(&editor, Method::POST, "/v1/reverse-etl/prepare")
        .header("x-service-client", "mcp")
        .json(&json!({ "warehouse_id": s.warehouse_id, "query": "SELECT id FROM customers" }))
        .send()
        .await
        .unwrap();
    assert_eq!(assistant.status(), reqwest::StatusCode::ACCEPTED);
    let proposed = json_ok(assistant).await;
    assert_eq!(proposed["data"]["approval"]["category"], "reverse_etl", "{proposed}");
    let asked = srv
        .post("/v1/reverse-etl/prepare", json!({ "warehouse_id": s.warehouse_id, "query": "SELECT id FROM customers" }))
        .header("x-service-execution-mode", "proposal");
    assert_eq!(asked.send().await.unwrap().status(), reqwest::StatusCode::ACCEPTED, "the proposal header is honoured");
}

/// A destination that answers 429 with a long `Retry-After`: the run is
/// waiting when it is cancelled, and stops at once instead of after the
/// wait: on a server with one runner, the next run starts and ends well
/// within the minute the destination asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_stops_while_it_waits_for_retry_after() {
    let ca = TestCa::new();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = hits.clone();
    let receiver = axum::Router::new().route(
        "/retl",
        post(move || {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                (axum::http::StatusCode::TOO_MANY_REQUESTS, [("retry-after", "60")], "slow down")
            }
        }),
    );
    let hooks = FakeProvider::start(&ca, &[HOOK_HOST], receiver).await;
    let trust = Trust::new(&ca).pinning(&hooks.pins(&[HOOK_HOST])).receiving(&[HOOK_HOST]);
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.plugins.egress = trust.policy();
        c.limits.job_concurrency = 1;
    })
    .await
    .unwrap();
    let ws = srv.workspace_id().await;
    let dest = json_ok(
        srv.post("/v1/destinations", json!({ "name": "crm", "kind": "sqlite", "configuration": { "file": "crm.db" } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let path = srv.warehouse(&ws, "crm.db");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut c = <sqlx::SqliteConnection as sqlx::Connection>::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    sqlx::raw_sql("CREATE TABLE t (id TEXT, email TEXT); INSERT INTO t VALUES ('a', 'a@example.com')")
        .execute(&mut c)
        .await
        .unwrap();
    let model = json_ok(srv.post("/v1/reverse-etl/models", json!({ "name": "t", "warehouse_id": dest["data"]["destination_id"], "query": "SELECT id, email FROM t", "primary_key": "id" })).send().await.unwrap()).await;
    let hook = json_ok(srv.post("/v1/reverse-etl/destinations", json!({ "name": "hook", "kind": "webhook", "configuration": { "url": format!("https://{HOOK_HOST}/retl") } })).send().await.unwrap()).await;
    let body = json!({ "name": "a", "model_id": model["data"]["model_id"], "destination_id": hook["data"]["destination_id"], "mappings": [{ "field": "email", "column": "email" }], "mode": "upsert" });
    let activation =
        json_ok(srv.post("/v1/reverse-etl/activations", body).send().await.unwrap()).await["data"]["activation_id"]
            .as_str()
            .unwrap()
            .to_owned();
    let started =
        json_ok(srv.post(&format!("/v1/reverse-etl/activations/{activation}/run"), json!({})).send().await.unwrap())
            .await;
    let run_id = started["data"]["run_id"].as_str().unwrap().to_owned();
    for _ in 0..200 {
        if hits.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1, "the run reached the destination and is waiting");
    json_ok(srv.request(Method::POST, &format!("/v1/jobs/{run_id}/cancel")).send().await.unwrap()).await;
    // The one runner is free again long before the minute the destination
    // asked for: a run of an empty model starts and ends.
    let empty = json_ok(srv.post("/v1/reverse-etl/models", json!({ "name": "none", "warehouse_id": dest["data"]["destination_id"], "query": "SELECT id, email FROM t WHERE id = 'nobody'", "primary_key": "id" })).send().await.unwrap()).await;
    let body = json!({ "name": "b", "model_id": empty["data"]["model_id"], "destination_id": hook["data"]["destination_id"], "mappings": [{ "field": "email", "column": "email" }], "mode": "upsert" });
    let next =
        json_ok(srv.post("/v1/reverse-etl/activations", body).send().await.unwrap()).await["data"]["activation_id"]
            .as_str()
            .unwrap()
            .to_owned();
    let started =
        json_ok(srv.post(&format!("/v1/reverse-etl/activations/{next}/run"), json!({})).send().await.unwrap()).await;
    let job = srv.wait_job(started["data"]["run_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let cancelled = json_ok(srv.get(&format!("/v1/jobs/{run_id}")).send().await.unwrap()).await;
    assert_eq!(cancelled["data"]["status"], "cancelled");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1, "nothing more was sent");
    drop(hooks);
    srv.stop().await;
}
