//! Destinations, pipelines and jobs end to end: a paginated HTTPS source
//! through a real plugin into SQLite, JSON-lines and PostgreSQL
//! destinations, with exactly one active job per pipeline.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::events::{EventsSource, events_source, events_source_with, note};
use crate::support::{Backend, TestServer, count_rows, expect_error, json, json_ok};

async fn a_sync_lands_every_record_in_sqlite_and_dedup_leaves_no_duplicates(backend: Backend) {
    let fx = events_source(backend, 1000).await;
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

/// Two pipelines appending the same provider's records into one table
/// keep each other's rows: an appended row's key holds its pipeline, so
/// records of the same text, read at the same place after the same state,
/// are still two rows, and the incremental syncs that read each last page
/// again rewrite only their own pipeline's rows.
async fn two_pipelines_appending_into_one_table_keep_each_others_rows(backend: Backend) {
    let fx = events_source(backend, 1000).await;
    let dest = fx.destination("sqlite", json!({ "file": "shared.db" })).await;
    let (a, b) = (fx.pipeline(&dest, "incremental_append").await, fx.pipeline(&dest, "incremental_append").await);
    let url = format!("sqlite://{}?mode=ro", fx.srv.warehouse(&fx.srv.workspace_id().await, "shared.db").display());
    for (n, pipeline) in [&a, &b, &a, &b].into_iter().enumerate() {
        let job = fx.sync(pipeline).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        let expected = if n == 0 { 1000 } else { 2000 };
        assert_eq!(count_rows(&url, "events").await, expected, "after sync {n}");
    }
    use sqlx::Connection;
    let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
    let sql = "SELECT COUNT(*) FROM \"events\" WHERE \"_service_meta\" LIKE '%' || $1 || '%'";
    for pipeline in [&a, &b] {
        let n: i64 = sqlx::query_scalar(sql).bind(pipeline.as_str()).fetch_one(&mut c).await.unwrap();
        assert_eq!(n, 1000, "{pipeline} keeps its own rows");
    }
}

async fn jsonl_destinations_get_one_file_per_stream(backend: Backend) {
    let fx = events_source(backend, 450).await;
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
    let fx = events_source_with(backend, 600, |c| c.limits.max_connections_per_address = 200).await;
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
    let fx = events_source(backend, 10).await;
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
    let fx = events_source(backend, 10).await;
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
    let fx = events_source(backend, 700).await;
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
    let fx = events_source(backend, 10).await;
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
    let fx = events_source(backend, 40).await;
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
    let fx = events_source(backend, 5).await;
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
    let fx = events_source(backend, 1000).await;
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
    let fx = events_source_with(backend, 10, |c| {
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
    two_pipelines_appending_into_one_table_keep_each_others_rows,
    a_job_says_what_its_plugin_cost,
    runs_started_by_an_approval_say_so_whatever_they_run,
    a_sync_lands_every_record_in_sqlite_and_dedup_leaves_no_duplicates,
    jsonl_destinations_get_one_file_per_stream,
    a_hundred_concurrent_syncs_make_one_job_and_99_conflicts,
    a_changed_schedule_refuses_stale_sync_commands_and_proposals,
    sources_in_use_are_kept_until_their_connections_are_deleted,
    postgres_destinations_receive_the_same_rows,
);

async fn schedules_start_syncs_skip_when_busy_and_stop_when_paused(backend: Backend) {
    // Four slow pages: each run takes seconds, so the next ticks meet it.
    let fx = events_source(backend, 1200).await;
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
    let fx = events_source(backend, 600).await;
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
async fn other_workspace_pipeline(fx: &EventsSource, page_size: u64, destination: Value) -> (String, String, String) {
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
    let fx = events_source(backend, 40).await;
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
    let fx = events_source(backend, 30).await;
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
    let fx = events_source_with(backend, 20, |c| {
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
    let fx = events_source_with(backend, 20, |c| {
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

/// The control database failing for a moment while a job starts (here:
/// the destinations table gone and back, on PostgreSQL) is a transient
/// failure: the job is retried and succeeds, never failed as if what it
/// read had been deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_database_hiccup_is_retried_not_taken_for_a_deletion() {
    if !crate::support::postgres_available().await {
        return;
    }
    let fx = events_source(Backend::Postgres, 100).await;
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
