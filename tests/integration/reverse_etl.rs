//! Reverse ETL end to end: a model over a real SQLite warehouse file sent
//! by the bundled email-campaign connector to a fake Mailcoach-compatible
//! provider over HTTPS (with 429s and 422 rejections), and to a webhook
//! through the egress policy; both control-database backends.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::routing::post;
use reqwest::Method;
use serde_json::{Value, json};
use sqlx::Connection;

use crate::on_both_backends;
use crate::support::mailcoach::{self, LIST_UUID, MailcoachState};
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, expect_error, json, json_ok};

const SELF_HOSTED: &str = "https://mail.acme-corp.com/api";
pub(crate) const HOOK_HOST: &str = "hooks.acme-corp.com";

pub(crate) struct Setup {
    pub srv: TestServer,
    mc: Arc<MailcoachState>,
    pub hook: Arc<std::sync::Mutex<Vec<Value>>>,
    _providers: (FakeProvider, FakeProvider),
    pub warehouse_id: String,
    db: String,
}

/// A server with the fake provider and a webhook receiver pinned, and an
/// SQLite warehouse holding `customers`: 20 good rows, one with a null
/// key and two sharing a key.
async fn setup(backend: Backend) -> Setup {
    setup_with(backend, |_| {}).await
}

/// [`setup`], with the server's configuration adjusted first.
pub(crate) async fn setup_with(backend: Backend, adjust: impl FnOnce(&mut service::config::ServerConfig)) -> Setup {
    let ca = TestCa::new();
    let token = format!("mc-token-{}", uuid::Uuid::new_v4().simple());
    let mc =
        Arc::new(MailcoachState { token: token.clone(), campaigns: mailcoach::campaigns(1), ..Default::default() });
    let mail = FakeProvider::start(&ca, &["mail.acme-corp.com"], mailcoach::router(mc.clone())).await;
    let hook: Arc<std::sync::Mutex<Vec<Value>>> = Arc::default();
    let seen = hook.clone();
    let receiver = axum::Router::new().route(
        "/retl",
        post(move |axum::Json(body): axum::Json<Value>| {
            let seen = seen.clone();
            async move {
                // The record whose key is c7 is refused, the rest accepted.
                let rejected: Vec<Value> = body["records"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r["key"] == "c7")
                    .map(|(i, _)| json!({ "index": i, "reason": "c7 is blocked here" }))
                    .collect();
                seen.lock().unwrap().push(body);
                axum::Json(json!({ "rejected": rejected }))
            }
        }),
    );
    let hooks = FakeProvider::start(&ca, &[HOOK_HOST], receiver).await;
    let trust = Trust::new(&ca)
        .serving(&mail, &["mail.acme-corp.com"])
        .allowing("*.mailcoach.app")
        .pinning(&hooks.pins(&[HOOK_HOST]))
        .receiving(&[HOOK_HOST]);
    let srv = TestServer::start_with(backend, |c| {
        c.plugins.egress = trust.policy();
        adjust(c);
    })
    .await
    .unwrap();
    let dest = json_ok(
        srv.post("/v1/destinations", json!({ "name": "crm", "kind": "sqlite", "configuration": { "file": "crm.db" } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let warehouse_id = dest["data"]["destination_id"].as_str().unwrap().to_owned();
    let path = srv.warehouse(&srv.workspace_id().await, "crm.db");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let db = format!("sqlite://{}?mode=rwc", path.display());
    let mut c = sqlx::SqliteConnection::connect(&db).await.unwrap();
    sqlx::raw_sql("CREATE TABLE customers (id TEXT, email TEXT, first_name TEXT)").execute(&mut c).await.unwrap();
    for i in 1..=20 {
        sqlx::query("INSERT INTO customers VALUES ($1, $2, $3)")
            .bind(format!("c{i}"))
            .bind(format!("c{i}@example.com"))
            .bind(format!("Name{i}"))
            .execute(&mut c)
            .await
            .unwrap();
    }
    sqlx::raw_sql("INSERT INTO customers VALUES (NULL, 'nokey@example.com', 'X'), ('dup', 'd1@example.com', 'D'), ('dup', 'd2@example.com', 'D')").execute(&mut c).await.unwrap();
    c.close().await.unwrap();
    let _ = token;
    Setup { srv, mc, hook, _providers: (mail, hooks), warehouse_id, db }
}

impl Setup {
    pub async fn sql(&self, sql: &str) {
        let mut c = sqlx::SqliteConnection::connect(&self.db).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).execute(&mut c).await.unwrap();
    }

    async fn customers(&self) -> i64 {
        let mut c = sqlx::SqliteConnection::connect(&self.db).await.unwrap();
        sqlx::query_scalar("SELECT COUNT(*) FROM customers").fetch_one(&mut c).await.unwrap()
    }

    async fn handle(&self) -> String {
        let body = json!({ "base_url": SELF_HOSTED, "api_token": self.mc.token });
        let created =
            json_ok(self.srv.post("/v1/credentials/emailcampaign/api-token", body).send().await.unwrap()).await;
        created["data"]["credential_handle"].as_str().unwrap().to_owned()
    }

    async fn model(&self) -> String {
        let body = json!({ "name": "customers", "warehouse_id": self.warehouse_id, "query": "SELECT id, email, first_name FROM customers", "primary_key": "id" });
        let m = json_ok(self.srv.post("/v1/reverse-etl/models", body).send().await.unwrap()).await;
        m["data"]["model_id"].as_str().unwrap().to_owned()
    }

    /// Runs an activation to its end; the run as `GET /reverse-etl/runs` shows it.
    async fn run(&self, activation: &str, body: Value) -> Value {
        let started = json_ok(
            self.srv.post(&format!("/v1/reverse-etl/activations/{activation}/run"), body).send().await.unwrap(),
        )
        .await;
        let run_id = started["data"]["run_id"].as_str().unwrap().to_owned();
        let job = self.srv.wait_job(&run_id).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        json_ok(self.srv.get(&format!("/v1/reverse-etl/runs/{run_id}")).send().await.unwrap()).await["data"].clone()
    }
}

fn counts(run: &Value) -> Value {
    run["progress"]["counts"].clone()
}

/// The whole life of a connector activation: writing SQL refused, the
/// first run sends every valid row (honouring 429s) and reports the
/// invalid and the rejected ones, the next sends exactly what changed and
/// the row that failed, mirror mode removes the row that left the model,
/// and only one of many concurrent run requests starts a run.
async fn an_activation_sends_only_what_changed_and_retries_what_failed(backend: Backend) {
    let s = setup(backend).await;
    let srv = &s.srv;

    // Models are read-only, enforced by the warehouse: nothing changes.
    for (query, code) in [
        ("DELETE FROM customers", "MODEL_QUERY_INVALID"),
        ("SELECT 1; DELETE FROM customers", "MODEL_QUERY_INVALID"),
        ("UPDATE customers SET email = 'x'", "MODEL_QUERY_INVALID"),
        ("DROP TABLE customers", "MODEL_QUERY_INVALID"),
        ("ATTACH DATABASE 'other.db' AS other", "MODEL_QUERY_INVALID"),
        ("PRAGMA query_only = OFF", "MODEL_QUERY_INVALID"),
        ("SELECT * FROM nowhere", "MODEL_QUERY_INVALID"),
        // Closing the subquery to append statements: refused before SQLite sees it.
        (
            "SELECT 1 AS id) AS x; PRAGMA query_only = 0; VACUUM INTO '/tmp/retl-escape.db'; SELECT * FROM (SELECT 1 AS id",
            "MODEL_QUERY_INVALID",
        ),
    ] {
        let body = json!({ "name": "bad", "warehouse_id": s.warehouse_id, "query": query, "primary_key": "id" });
        expect_error(srv.post("/v1/reverse-etl/models", body).send().await.unwrap(), 400, code).await;
    }
    assert_eq!(s.customers().await, 23, "the warehouse is unchanged");
    assert!(!std::path::Path::new("/tmp/retl-escape.db").exists(), "no file was written");
    // A query one character too long, in the widest encoding JSON has, is
    // still a 400 naming the field, never a 413 for the body.
    let wide = "\u{1D54F}".repeat(65_537);
    let body = json!({ "name": "long", "warehouse_id": s.warehouse_id, "query": wide, "primary_key": "id" });
    let escaped = serde_json::to_string(&body).unwrap().replace('\u{1D54F}', "\\ud835\\udd4f");
    let res = srv
        .post("/v1/reverse-etl/models", json!({}))
        .header("content-type", "application/json")
        .body(escaped)
        .send()
        .await
        .unwrap();
    let e = expect_error(res, 400, "VALIDATION_FAILED").await;
    assert_eq!(e["details"]["field"], "query", "{e}");
    let body = json!({ "name": "bad", "warehouse_id": s.warehouse_id, "query": "SELECT email FROM customers", "primary_key": "id" });
    expect_error(srv.post("/v1/reverse-etl/models", body).send().await.unwrap(), 400, "VALIDATION_FAILED").await;

    let model = s.model().await;
    let handle = s.handle().await;
    let connector = json!({ "connector_id": "conn_emailcampaign_edm", "object": "subscribers", "configuration": { "base_url": SELF_HOSTED, "credential_handle": handle, "email_list_uuids": [LIST_UUID] } });
    let dest = json_ok(
        srv.post(
            "/v1/reverse-etl/destinations",
            json!({ "name": "newsletter", "kind": "connector", "configuration": connector }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let dest_id = dest["data"]["destination_id"].as_str().unwrap().to_owned();
    let bad = json!({ "connector_id": "conn_emailcampaign_edm", "object": "campaigns", "configuration": connector["configuration"] });
    expect_error(
        srv.post("/v1/reverse-etl/destinations", json!({ "name": "x", "kind": "connector", "configuration": bad }))
            .send()
            .await
            .unwrap(),
        400,
        "VALIDATION_FAILED",
    )
    .await;

    // Prepare: columns, samples, a suggested key and mappings by name.
    let prep = json_ok(
        srv.post("/v1/reverse-etl/prepare", json!({ "model_id": model, "destination_id": dest_id }))
            .send()
            .await
            .unwrap(),
    )
    .await["data"]
        .clone();
    let columns: Vec<&str> = prep["columns"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(columns, ["id", "email", "first_name"], "{prep}");
    assert_eq!(prep["sample_rows"].as_array().unwrap().len(), 23);
    assert_eq!(prep["suggested_primary_key"], "email", "id has a null and a duplicate: {prep}");
    assert_eq!(prep["match_field"], "email");
    assert_eq!(
        prep["suggested_mappings"],
        json!([{ "field": "email", "column": "email" }, { "field": "first_name", "column": "first_name" }]),
        "{prep}"
    );

    let mappings = json!([{ "field": "email", "column": "email" }, { "field": "first_name", "column": "first_name" }]);
    let wrong = json!([{ "field": "first_name", "column": "first_name" }]);
    expect_error(
        srv.post(
            "/v1/reverse-etl/activations",
            json!({ "name": "a", "model_id": model, "destination_id": dest_id, "mappings": wrong, "mode": "upsert" }),
        )
        .send()
        .await
        .unwrap(),
        400,
        "VALIDATION_FAILED",
    )
    .await;
    let a = json_ok(srv.post("/v1/reverse-etl/activations", json!({ "name": "customers to newsletter", "model_id": model, "destination_id": dest_id, "mappings": mappings, "mode": "upsert" })).send().await.unwrap()).await;
    let activation = a["data"]["activation_id"].as_str().unwrap().to_owned();

    // First run: every valid row but the one the provider rejects.
    s.mc.reject_emails.lock().unwrap().insert("c5@example.com".into());
    s.mc.rate_limit_next.store(2, Ordering::SeqCst);
    let run = s.run(&activation, json!({})).await;
    assert_eq!(
        counts(&run),
        json!({ "queried": 23, "added": 19, "changed": 0, "removed": 0, "unchanged": 0, "invalid": 3, "failed": 1, "skipped": 0 }),
        "{run}"
    );
    assert_eq!(s.mc.written_count(), 19);
    let failed = &run["progress"]["failed_samples"];
    assert_eq!(failed[0]["key"], "c5", "{run}");
    assert!(failed[0]["reason"].as_str().unwrap().contains("422"), "{run}");
    assert!(!run.to_string().contains(&s.mc.token), "no secret in a run");
    let invalid: Vec<String> = run["progress"]["invalid_samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["reason"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        invalid.iter().any(|r| r.contains("null")) && invalid.iter().any(|r| r.contains("more than once")),
        "{invalid:?}"
    );
    assert!(s.mc.subscriber_by_email("d1@example.com").is_none(), "duplicated keys are never sent");

    // Two rows change, one leaves, the rejected one is now accepted.
    s.sql(
        "UPDATE customers SET first_name = 'Changed' WHERE id IN ('c1', 'c2'); DELETE FROM customers WHERE id = 'c3'",
    )
    .await;
    s.mc.reject_emails.lock().unwrap().clear();
    let before = s.mc.write_log().len();
    let run = s.run(&activation, json!({})).await;
    assert_eq!(
        counts(&run),
        json!({ "queried": 22, "added": 1, "changed": 2, "removed": 0, "unchanged": 16, "invalid": 3, "failed": 0, "skipped": 0 }),
        "{run}"
    );
    let writes: Vec<(String, String)> = s.mc.write_log()[before..].to_vec();
    assert_eq!(writes.len(), 3, "exactly the two changed rows and the retried one: {writes:?}");
    assert_eq!(s.mc.subscriber_by_email("c1@example.com").unwrap()["first_name"], "Changed");
    assert!(s.mc.subscriber_by_email("c5@example.com").is_some(), "the failed row was sent once accepted");
    assert!(s.mc.subscriber_by_email("c3@example.com").is_some(), "upsert mode removes nothing");

    // Nothing changed: nothing is sent.
    let before = s.mc.write_log().len();
    let run = s.run(&activation, json!({})).await;
    assert_eq!(counts(&run)["unchanged"], 19, "{run}");
    assert_eq!(s.mc.write_log().len(), before);

    // Mirror mode removes the record whose row left the model, not one
    // whose row only changed its key (its e-mail is still in the model).
    s.sql("UPDATE customers SET id = 'c4-renamed' WHERE id = 'c4'").await;
    json_ok(
        srv.request(Method::PATCH, &format!("/v1/reverse-etl/activations/{activation}"))
            .json(&json!({ "mode": "mirror" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let run = s.run(&activation, json!({})).await;
    assert_eq!(counts(&run)["removed"], 1, "{run}");
    assert_eq!((counts(&run)["added"].as_u64(), counts(&run)["unchanged"].as_u64()), (Some(1), Some(18)), "{run}");
    assert!(s.mc.subscriber_by_email("c3@example.com").is_none(), "removed at the provider");
    assert!(s.mc.subscriber_by_email("c4@example.com").is_some(), "a renamed key keeps its record");
    let run = s.run(&activation, json!({})).await;
    assert_eq!(
        (counts(&run)["removed"].as_u64(), counts(&run)["unchanged"].as_u64()),
        (Some(0), Some(19)),
        "the old key is forgotten: {run}"
    );

    // A full resync sends every valid row again.
    let run = s.run(&activation, json!({ "full_resync": true })).await;
    assert_eq!(counts(&run)["changed"], 19, "{run}");
    assert_eq!(run["full_resync"], true);

    // Fifty concurrent requests: one run, 49 conflicts naming it. The run
    // has a row to send to a slow provider, so it is still active when the
    // last request arrives.
    s.sql("UPDATE customers SET first_name = 'Again' WHERE id = 'c1'").await;
    s.mc.delay_ms.store(3_000, Ordering::SeqCst);
    let url = format!("/v1/reverse-etl/activations/{activation}/run");
    let answers = futures_join((0..50).map(|_| {
        let req = srv.post(&url, json!({}));
        async move { json(req.send().await.unwrap()).await }
    }))
    .await;
    let started: Vec<&Value> = answers.iter().filter(|(s, _)| s.as_u16() == 201).map(|(_, b)| b).collect();
    let conflicts: Vec<&Value> = answers.iter().filter(|(s, _)| s.as_u16() == 409).map(|(_, b)| b).collect();
    assert_eq!((started.len(), conflicts.len()), (1, 49), "{answers:?}");
    let run_id = started[0]["data"]["run_id"].as_str().unwrap();
    assert!(
        conflicts.iter().all(|c| c["code"] == "EXECUTION_CONFLICT" && c["details"]["active_run"]["run_id"] == run_id),
        "{conflicts:?}"
    );
    srv.wait_job(run_id).await;
    s.mc.delay_ms.store(0, Ordering::SeqCst);

    // Another destination starts from an empty diff state: every valid
    // row goes there, though none changed.
    let hook = json_ok(srv.post("/v1/reverse-etl/destinations", json!({ "name": "hook", "kind": "webhook", "configuration": { "url": format!("https://{HOOK_HOST}/retl") } })).send().await.unwrap()).await;
    let hook_id = hook["data"]["destination_id"].as_str().unwrap().to_owned();
    json_ok(
        srv.request(Method::PATCH, &format!("/v1/reverse-etl/activations/{activation}"))
            .json(&json!({ "destination_id": hook_id }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let run = s.run(&activation, json!({})).await;
    assert_eq!(
        (counts(&run)["added"].as_u64(), counts(&run)["failed"].as_u64(), counts(&run)["removed"].as_u64()),
        (Some(18), Some(1), Some(0)),
        "{run}"
    );
    let received: usize = s.hook.lock().unwrap().iter().map(|b| b["records"].as_array().unwrap().len()).sum();
    assert_eq!(received, 19, "every valid row reached the new destination");
    json_ok(
        srv.request(Method::PATCH, &format!("/v1/reverse-etl/activations/{activation}"))
            .json(&json!({ "destination_id": dest_id }))
            .send()
            .await
            .unwrap(),
    )
    .await;

    // What is in use cannot be deleted.
    json_ok(srv.request(Method::DELETE, &format!("/v1/reverse-etl/destinations/{hook_id}")).send().await.unwrap())
        .await;
    let e = expect_error(
        srv.request(Method::DELETE, &format!("/v1/reverse-etl/models/{model}")).send().await.unwrap(),
        409,
        "MODEL_IN_USE",
    )
    .await;
    assert_eq!(e["details"]["activation_ids"], json!([activation]));
    let e = expect_error(
        srv.request(Method::DELETE, &format!("/v1/reverse-etl/destinations/{dest_id}")).send().await.unwrap(),
        409,
        "DESTINATION_IN_USE",
    )
    .await;
    assert_eq!(e["details"]["activation_ids"], json!([activation]));
    let e = expect_error(
        srv.request(Method::DELETE, &format!("/v1/destinations/{}", s.warehouse_id)).send().await.unwrap(),
        409,
        "DESTINATION_IN_USE",
    )
    .await;
    assert_eq!(e["details"]["model_ids"], json!([model]));
    json_ok(srv.request(Method::DELETE, &format!("/v1/reverse-etl/activations/{activation}")).send().await.unwrap())
        .await;
    json_ok(srv.request(Method::DELETE, &format!("/v1/reverse-etl/models/{model}")).send().await.unwrap()).await;
    json_ok(srv.request(Method::DELETE, &format!("/v1/reverse-etl/destinations/{dest_id}")).send().await.unwrap())
        .await;
}

async fn futures_join<F: Future<Output = T>, T>(futures: impl Iterator<Item = F>) -> Vec<T> {
    let handles: Vec<_> = futures.collect();
    let mut out = Vec::new();
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = handles.into_iter().map(Box::pin).collect();
    // Polled together: every request is in flight before any is awaited alone.
    let mut done: Vec<Option<T>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if done[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => done[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    out.extend(done.into_iter().map(Option::unwrap));
    out
}

/// A webhook gets the same batches through egress: only an allowed HTTPS
/// host, never an address literal; a record it rejects is reported and
/// sent again next run.
async fn a_webhook_receives_batches_through_the_egress_policy(backend: Backend) {
    let s = setup(backend).await;
    let srv = &s.srv;
    for (url, code) in [
        ("https://127.0.0.1/retl", "VALIDATION_FAILED"),
        ("https://10.1.2.3/retl", "VALIDATION_FAILED"),
        ("https://[::1]/retl", "VALIDATION_FAILED"),
        ("http://hooks.acme-corp.com/retl", "VALIDATION_FAILED"),
        ("https://hooks.acme-corp.com:8443/retl", "VALIDATION_FAILED"),
        ("https://hooks.acme-corp.com/retl?token=abc", "VALIDATION_FAILED"),
        ("https://localhost/retl", "WEBHOOK_HOST_NOT_ALLOWED"),
        ("https://metadata.google.internal/retl", "WEBHOOK_HOST_NOT_ALLOWED"),
        // A provider connectors may reach is not a receiver of rows: any
        // tenant of a SaaS domain could be behind it.
        ("https://attacker.mailcoach.app/retl", "WEBHOOK_HOST_NOT_ALLOWED"),
        ("https://mail.acme-corp.com/retl", "WEBHOOK_HOST_NOT_ALLOWED"),
    ] {
        expect_error(
            srv.post(
                "/v1/reverse-etl/destinations",
                json!({ "name": "h", "kind": "webhook", "configuration": { "url": url } }),
            )
            .send()
            .await
            .unwrap(),
            400,
            code,
        )
        .await;
    }
    // A credential bound to a connector is that connector's alone: refused
    // when the webhook is made, not at its first send.
    let ws = srv.workspace_id().await;
    let bound = srv
        .state
        .vault
        .create(service::credentials::NewSecret {
            workspace_id: &ws,
            created_by: &srv.state.store.user_by_email("admin@example.test").await.unwrap().unwrap().user_id,
            kind: service::store::kinds::CredentialKind::ApiToken,
            connector_id: Some("conn_emailcampaign_edm"),
            label: Some("the connector's"),
            hosts: vec![HOOK_HOST.to_owned()],
            metadata: json!({}),
            material: service::credentials::SecretMaterial::new(secrecy::SecretString::from("hook-secret-value")),
            status: service::store::kinds::CredentialStatus::Active,
            access_expires_at: None,
        })
        .await
        .unwrap();
    let refused = expect_error(
        srv.post("/v1/reverse-etl/destinations", json!({ "name": "h", "kind": "webhook", "configuration": { "url": format!("https://{HOOK_HOST}/retl"), "credential_handle": bound.credential_handle.as_str() } }))
            .send()
            .await
            .unwrap(),
        400,
        "VALIDATION_FAILED",
    )
    .await;
    assert!(refused["message"].as_str().unwrap().contains("bound to connector conn_emailcampaign_edm"), "{refused}");
    let model = s.model().await;
    let dest = json_ok(srv.post("/v1/reverse-etl/destinations", json!({ "name": "hook", "kind": "webhook", "configuration": { "url": format!("https://{HOOK_HOST}/retl") } })).send().await.unwrap()).await;
    let dest_id = dest["data"]["destination_id"].as_str().unwrap();
    // A secret is never a mapping constant, which every reader of the
    // activation would see: by the field it fills, or by its shape.
    for constant in [
        json!({ "field": "api_key", "value": "anything at all" }),
        json!({ "field": "note", "value": "sk_live_51Habcdefghijklmnopqrstuv" }),
        json!({ "field": "auth", "value": "AKIAIOSFODNN7EXAMPLE" }),
    ] {
        let mappings = json!([{ "field": "mail", "column": "email" }, constant]);
        let refused = expect_error(
            srv.post("/v1/reverse-etl/activations", json!({ "name": "hook", "model_id": model, "destination_id": dest_id, "mappings": mappings, "mode": "upsert" })).send().await.unwrap(),
            400,
            "SECRET_NOT_ACCEPTED",
        )
        .await;
        assert_eq!(refused["details"]["field"], "mappings[1].value", "{refused}");
    }
    let mappings = json!([{ "field": "mail", "column": "email" }, { "field": "origin", "value": "warehouse" }]);
    let a = json_ok(srv.post("/v1/reverse-etl/activations", json!({ "name": "hook", "model_id": model, "destination_id": dest_id, "mappings": mappings, "mode": "upsert" })).send().await.unwrap()).await;
    let activation = a["data"]["activation_id"].as_str().unwrap().to_owned();
    // Runs are announced to webhook subscriptions, with the rows they
    // could not send (the log keeps each body, delivered or not).
    let subscription = json_ok(
        srv.post("/v1/webhooks", json!({ "url": format!("https://{HOOK_HOST}/announcements"), "event_types": ["activation_run.succeeded", "rows.rejected"] }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let subscription = subscription["data"]["webhook_id"].as_str().unwrap().to_owned();
    let run = s.run(&activation, json!({})).await;
    assert_eq!(counts(&run)["added"], 19, "{run}");
    assert_eq!(counts(&run)["failed"], 1, "{run}");
    let log = json_ok(srv.get(&format!("/v1/webhooks/{subscription}/deliveries")).send().await.unwrap()).await;
    let announced: Vec<&Value> = log["data"]["items"].as_array().unwrap().iter().map(|d| &d["payload"]).collect();
    let rejected = announced.iter().find(|p| p["type"] == "rows.rejected").expect("rows.rejected announced");
    assert_eq!(
        (rejected["data"]["failed"].as_u64(), rejected["data"]["invalid"].as_u64()),
        (Some(1), Some(3)),
        "{rejected}"
    );
    assert_eq!(rejected["data"]["activation_id"], activation.as_str());
    assert!(announced.iter().any(|p| p["type"] == "activation_run.succeeded" && p["data"]["job_id"] == run["run_id"]));
    json_ok(srv.request(reqwest::Method::DELETE, &format!("/v1/webhooks/{subscription}")).send().await.unwrap()).await;

    // The activation's page lists the run; the run's page shows its counts.
    service::access::admin::set_password(
        &srv.state.store,
        "admin@example.test",
        secrecy::SecretString::from(crate::web_sessions::PASSWORD),
        service::access::admin::OnPasswordChange::KeepSessions,
    )
    .await
    .unwrap();
    let (cookie, _) = crate::web_sessions::web_sign_in(srv, "admin@example.test").await;
    let page = |path: String| reqwest::Client::new().get(srv.url(&path)).header("cookie", &cookie).send();
    let run_id = run["run_id"].as_str().unwrap();
    let list = page("/reverse-etl/activations".into()).await.unwrap().text().await.unwrap();
    assert!(list.contains(&activation) && list.contains("succeeded"), "{list}");
    let one = page(format!("/reverse-etl/activations/{activation}")).await.unwrap().text().await.unwrap();
    assert!(one.contains(run_id) && one.contains("upsert"), "{one}");
    let run_page = page(format!("/jobs/{run_id}")).await.unwrap().text().await.unwrap();
    assert!(run_page.contains("<td>failed</td><td class=\"n\">1</td>"), "{run_page}");
    assert_eq!(run["progress"]["failed_samples"][0]["reason"], "c7 is blocked here");
    let batches = s.hook.lock().unwrap().clone();
    assert_eq!(batches.len(), 1, "one batch of 20");
    assert_eq!(batches[0]["operation"], "upsert");
    assert_eq!(batches[0]["activation_id"], activation.as_str());
    let first = &batches[0]["records"][0];
    assert_eq!(first["fields"], json!({ "mail": "c1@example.com", "origin": "warehouse" }), "{first}");
    let run = s.run(&activation, json!({})).await;
    assert_eq!(
        (counts(&run)["unchanged"].as_u64(), counts(&run)["failed"].as_u64()),
        (Some(19), Some(1)),
        "the rejected record is sent again, alone: {run}"
    );
    let again = s.hook.lock().unwrap()[1]["records"].clone();
    assert_eq!(again.as_array().unwrap().len(), 1, "{again}");
    assert_eq!(again[0]["key"], "c7");
}

/// Viewers read but cannot write; another workspace sees nothing; MCP
/// clients get proposals in the reverse-ETL category.
async fn reverse_etl_keeps_to_its_workspace_and_roles(backend: Backend) {
    let s = setup(backend).await;
    let srv = &s.srv;
    let model = s.model().await;
    let ws = srv.workspace_id().await;
    let (_, viewer) = srv.user_in(&ws, service::access::Role::Viewer).await;
    let body = json!({ "name": "v", "warehouse_id": s.warehouse_id, "query": "SELECT id FROM customers", "primary_key": "id" });
    expect_error(
        srv.request_as(&viewer, Method::POST, "/v1/reverse-etl/models").json(&body).send().await.unwrap(),
        403,
        "403",
    )
    .await;
    expect_error(
        srv.request_as(&viewer, Method::POST, "/v1/reverse-etl/prepare")
            .json(&json!({ "model_id": model }))
            .send()
            .await
            .unwrap(),
        403,
        "403",
    )
    .await;
    let listed = json_ok(srv.request_as(&viewer, Method::GET, "/v1/reverse-etl/models").send().await.unwrap()).await;
    assert_eq!(listed["data"]["items"].as_array().unwrap().len(), 1);

    let (_, other) = srv.other_workspace().await;
    let listed = json_ok(srv.request_as(&other, Method::GET, "/v1/reverse-etl/models").send().await.unwrap()).await;
    assert!(listed["data"]["items"].as_array().unwrap().is_empty(), "{listed}");
    let steal = json!({ "name": "steal", "warehouse_id": s.warehouse_id, "query": "SELECT id FROM customers", "primary_key": "id" });
    expect_error(
        srv.request_as(&other, Method::POST, "/v1/reverse-etl/models").json(&steal).send().await.unwrap(),
        400,
        "VALIDATION_FAILED",
    )
    .await;
    expect_error(
        srv.request_as(&other, Method::PATCH, &format!("/v1/reverse-etl/models/{model}"))
            .json(&json!({ "name": "x" }))
            .send()
            .await
            .unwrap(),
        404,
        "404",
    )
    .await;

    let proposed = srv.post("/v1/reverse-etl/models", json!({ "name": "m2", "warehouse_id": s.warehouse_id, "query": "SELECT id FROM customers", "primary_key": "id" })).header("x-service-execution-mode", "proposal").send().await.unwrap();
    let (status, body) = json(proposed).await;
    assert_eq!(status.as_u16(), 202, "{body}");
    assert_eq!(body["data"]["approval"]["category"], "reverse_etl", "{body}");
}

/// A run loads the diff state from the snapshot the run before it left,
/// and only while nothing has written to the state since. Shown by taking
/// the state's rows away behind the server's back: while the snapshot is
/// current the next run still knows every key; once the state's version
/// moves, as any write moves it, the run reads the rows (now none) and
/// sends everything again.
async fn a_run_reads_the_snapshot_the_last_run_left_while_it_is_current(backend: Backend) {
    let s = setup(backend).await;
    let srv = &s.srv;
    let model = s.model().await;
    let hook = json_ok(srv.post("/v1/reverse-etl/destinations", json!({ "name": "hook", "kind": "webhook", "configuration": { "url": format!("https://{HOOK_HOST}/retl") } })).send().await.unwrap()).await;
    let mappings = json!([{ "field": "email", "column": "email" }, { "field": "first_name", "column": "first_name" }]);
    let body = json!({ "name": "a", "model_id": model, "destination_id": hook["data"]["destination_id"], "mappings": mappings, "mode": "upsert" });
    let a = json_ok(srv.post("/v1/reverse-etl/activations", body).send().await.unwrap()).await;
    let activation = a["data"]["activation_id"].as_str().unwrap().to_owned();
    sqlx::any::install_default_drivers();
    let mut control = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
    // The snapshot's keys, and whether it is at the state's version.
    let snapshot = async |control: &mut sqlx::AnyConnection| -> (i64, bool) {
        let row = sqlx::query(
            "SELECT s.keys, CASE WHEN s.version = a.state_version THEN 1 ELSE 0 END FROM retl_state_snapshots s \
             JOIN retl_activations a ON a.id = s.activation_id WHERE s.activation_id = $1 AND s.chunk = 0",
        )
        .bind(&activation)
        .fetch_one(&mut *control)
        .await
        .unwrap();
        (sqlx::Row::get::<i64, _>(&row, 0), sqlx::Row::get::<i64, _>(&row, 1) == 1)
    };
    let forget_rows = async |control: &mut sqlx::AnyConnection| {
        sqlx::query("DELETE FROM retl_state WHERE activation_id = $1")
            .bind(&activation)
            .execute(&mut *control)
            .await
            .unwrap();
    };

    // 20 keys: 19 accepted, c7 refused by the receiver.
    let run = s.run(&activation, json!({})).await;
    assert_eq!((counts(&run)["added"].as_u64(), counts(&run)["failed"].as_u64()), (Some(19), Some(1)), "{run}");
    assert_eq!(snapshot(&mut control).await, (20, true));

    forget_rows(&mut control).await;
    let run = s.run(&activation, json!({})).await;
    assert_eq!(
        (counts(&run)["added"].as_u64(), counts(&run)["unchanged"].as_u64(), counts(&run)["changed"].as_u64()),
        (Some(0), Some(19), Some(0)),
        "the state came from the snapshot: only c7, refused before, was sent again: {run}"
    );
    assert_eq!(counts(&run)["failed"], 1, "{run}");
    assert_eq!(snapshot(&mut control).await, (20, true), "kept again after the run's own write");

    forget_rows(&mut control).await;
    sqlx::query("UPDATE retl_activations SET state_version = state_version + 1 WHERE id = $1")
        .bind(&activation)
        .execute(&mut control)
        .await
        .unwrap();
    assert_eq!(snapshot(&mut control).await, (20, false));
    let run = s.run(&activation, json!({})).await;
    assert_eq!(
        (counts(&run)["added"].as_u64(), counts(&run)["unchanged"].as_u64()),
        (Some(19), Some(0)),
        "a snapshot behind the state's version is not read: {run}"
    );
    assert_eq!(snapshot(&mut control).await, (20, true));
}

on_both_backends!(
    a_run_reads_the_snapshot_the_last_run_left_while_it_is_current,
    an_activation_sends_only_what_changed_and_retries_what_failed,
    a_webhook_receives_batches_through_the_egress_policy,
    reverse_etl_keeps_to_its_workspace_and_roles,
);

/// A server killed in the middle of a run: another one takes the run over
/// once its lease expires and sends only what was not accepted yet, both
/// for a first run and for a full resync. At most the batch in flight at
/// the kill (100 rows) reaches the provider twice, as idempotent upserts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_server_was_killed_resumes_without_resending_accepted_rows() {
    use crate::support::process::ServerProcess;
    crate::support::init_crypto();
    const ROWS: usize = 300;
    const BATCH: usize = 100;
    let ca = TestCa::new();
    let token = format!("mc-token-{}", uuid::Uuid::new_v4().simple());
    let mc =
        Arc::new(MailcoachState { token: token.clone(), campaigns: mailcoach::campaigns(1), ..Default::default() });
    let mail = FakeProvider::start(&ca, &["mail.acme-corp.com"], mailcoach::router(mc.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    std::fs::write(&roots, &ca.pem).unwrap();
    std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
    let admin = "svc_retl_process_test_token_0123456789".to_owned();
    let env = vec![
        ("SERVICE_DATA_DIR", dir.path().join("data").display().to_string()),
        ("SERVICE_PLUGINS_DIR", dir.path().join("plugins").display().to_string()),
        ("SERVICE_BOOTSTRAP_TOKEN", admin.clone()),
        ("SERVICE_EGRESS_ALLOWED_HOSTS", "mail.acme-corp.com".into()),
        ("SERVICE_EGRESS_RESOLVE", mail.pins(&["mail.acme-corp.com"])),
        ("SERVICE_EGRESS_EXTRA_ROOTS", roots.display().to_string()),
        ("SERVICE_JOB_LEASE_SECS", "2".into()),
    ];
    let client = reqwest::Client::new();
    let api = |base: &str, m: Method, p: &str| client.request(m, format!("{base}{p}")).bearer_auth(&admin);

    let mut first = ServerProcess::start(env.clone()).await;
    let base = first.base.clone();
    let me = json_ok(api(&base, Method::GET, "/v1/me").send().await.unwrap()).await;
    let ws = me["data"]["default_workspace_id"].as_str().unwrap().to_owned();
    let dest = json_ok(
        api(&base, Method::POST, "/v1/destinations")
            .json(&json!({ "name": "crm", "kind": "sqlite", "configuration": { "file": "crm.db" } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let path = dir.path().join("data").join("warehouses").join(&ws).join("crm.db");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display())).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE customers (id INTEGER, email TEXT, first_name TEXT); \
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS}) INSERT INTO customers SELECT i, 'k' || i || '@example.com', 'Name' || i FROM n"
    )))
    .execute(&mut c)
    .await
    .unwrap();
    c.close().await.unwrap();
    let body = json!({ "name": "customers", "warehouse_id": dest["data"]["destination_id"], "query": "SELECT id, email, first_name FROM customers", "primary_key": "id" });
    let model = json_ok(api(&base, Method::POST, "/v1/reverse-etl/models").json(&body).send().await.unwrap()).await;
    let cred = json_ok(
        api(&base, Method::POST, "/v1/credentials/emailcampaign/api-token")
            .json(&json!({ "base_url": SELF_HOSTED, "api_token": token }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let connector = json!({ "connector_id": "conn_emailcampaign_edm", "object": "subscribers", "configuration": { "base_url": SELF_HOSTED, "credential_handle": cred["data"]["credential_handle"], "email_list_uuids": [LIST_UUID] } });
    let rdest = json_ok(
        api(&base, Method::POST, "/v1/reverse-etl/destinations")
            .json(&json!({ "name": "newsletter", "kind": "connector", "configuration": connector }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let mappings = json!([{ "field": "email", "column": "email" }, { "field": "first_name", "column": "first_name" }]);
    let body = json!({ "name": "a", "model_id": model["data"]["model_id"], "destination_id": rdest["data"]["destination_id"], "mappings": mappings, "mode": "upsert" });
    let activation =
        json_ok(api(&base, Method::POST, "/v1/reverse-etl/activations").json(&body).send().await.unwrap()).await;
    let run_url = format!("/v1/reverse-etl/activations/{}/run", activation["data"]["activation_id"].as_str().unwrap());

    for (round, resync) in [(1, false), (2, true)] {
        let before = mc.write_log().len();
        // Slow enough that the kill lands in the second batch.
        mc.delay_ms.store(15, Ordering::SeqCst);
        let started = json_ok(
            api(&first.base, Method::POST, &run_url).json(&json!({ "full_resync": resync })).send().await.unwrap(),
        )
        .await;
        let run_id = started["data"]["run_id"].as_str().unwrap().to_owned();
        let mut waited = 0;
        while mc.write_log().len() - before < BATCH + BATCH / 2 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            waited += 1;
            assert!(waited < 3000, "round {round}: the run never got to its second batch");
        }
        first.kill();
        mc.delay_ms.store(0, Ordering::SeqCst);

        let second = ServerProcess::start(env.clone()).await;
        let mut run = Value::Null;
        for _ in 0..600 {
            run = json_ok(
                api(&second.base, Method::GET, &format!("/v1/reverse-etl/runs/{run_id}")).send().await.unwrap(),
            )
            .await["data"]
                .clone();
            if run["status"] == "succeeded" || run["status"] == "failed" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(
            (run["status"].as_str(), run["attempts"].as_i64()),
            (Some("succeeded"), Some(2)),
            "round {round}: taken over once: {run}"
        );
        // Every row reached the provider; none accepted before the kill
        // was sent again: only the batch in flight may repeat.
        let writes = mc.write_log()[before..].to_vec();
        let mut per_record = std::collections::HashMap::<String, usize>::new();
        let written = mc.written.lock().unwrap().clone();
        for (method, id) in &writes {
            // Creations are logged by e-mail, updates by the subscriber's uuid.
            let email = if method == "POST" { id.clone() } else { written[id]["email"].as_str().unwrap().to_owned() };
            *per_record.entry(email).or_default() += 1;
        }
        let repeated = per_record.values().filter(|n| **n > 1).count();
        assert_eq!(per_record.len(), ROWS, "round {round}: every row was sent");
        assert!(
            repeated <= BATCH,
            "round {round}: {repeated} rows were sent twice; at most the batch in flight may be"
        );
        assert!(per_record.values().all(|n| *n <= 2), "round {round}: no row three times");
        assert_eq!(mc.written_count(), ROWS, "round {round}: upserts: one subscriber per row");
        first = second;
    }
    drop(first);
    drop(mail);
}

/// A model over a PostgreSQL warehouse runs in a `READ ONLY` transaction
/// with a statement timeout, as a role that cannot become a superuser
/// (a superuser, or a member of one, is refused: it could read server
/// files or switch roles from inside a `SELECT`): writes the text does not
/// show (a sequence, a function that deletes, a data-modifying CTE) are
/// refused by the database and change nothing, a slow query ends at the
/// preview's deadline, a value over the cap never leaves the database, a
/// configured `model_role` narrows what a model reads, and a run streams
/// the rows to the destination.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_warehouse_is_queried_read_only() {
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let s = setup(Backend::Sqlite).await;
    let srv = &s.srv;
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let tag = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let (login, reader, escalating) =
        (format!("retl_login_{tag}"), format!("retl_reader_{tag}"), format!("retl_super_member_{tag}"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE customers (id INT PRIMARY KEY, email TEXT NOT NULL); \
         INSERT INTO customers SELECT i, 'p' || i || '@example.com' FROM generate_series(1, 30) AS i; \
         CREATE TABLE secrets (id INT, note TEXT); INSERT INTO secrets VALUES (1, 'for the login role only'); \
         CREATE TABLE wide (id INT, body TEXT); INSERT INTO wide VALUES (1, repeat('z', 300000)), (2, 'small'); \
         CREATE SEQUENCE ticket; \
         CREATE FUNCTION sneaky() RETURNS int LANGUAGE sql AS 'DELETE FROM customers RETURNING 1'; \
         CREATE ROLE {login} LOGIN; CREATE ROLE {reader} NOLOGIN; CREATE ROLE {escalating} LOGIN; \
         GRANT {reader} TO {login}; GRANT postgres TO {escalating}; \
         GRANT SELECT, DELETE ON customers, secrets, wide TO {login}; GRANT USAGE, UPDATE ON SEQUENCE ticket TO {login}; \
         GRANT SELECT ON customers TO {reader};"
    )))
    .execute(&mut c)
    .await
    .unwrap();
    let as_role = |role: &str| {
        let mut url = url::Url::parse(&db.url).unwrap();
        url.set_username(role).unwrap();
        url.to_string()
    };
    // A superuser, and a role that may become one, are refused.
    for url in [db.url.clone(), as_role(&escalating)] {
        let dest = json_ok(
            srv.post("/v1/destinations", json!({ "name": "pg", "kind": "postgres", "configuration": { "url": url } }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let body = json!({ "warehouse_id": dest["data"]["destination_id"], "query": "SELECT pg_read_file('/etc/hostname') AS id" });
        let refused = expect_error(
            srv.post("/v1/reverse-etl/prepare", body).send().await.unwrap(),
            400,
            "WAREHOUSE_ROLE_REFUSED",
        )
        .await;
        assert!(refused["message"].as_str().unwrap().contains("superuser"), "{refused}");
    }
    let dest = json_ok(
        srv.post(
            "/v1/destinations",
            json!({ "name": "pg", "kind": "postgres", "configuration": { "url": as_role(&login) } }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let warehouse = dest["data"]["destination_id"].as_str().unwrap().to_owned();
    for (query, code) in [
        ("SELECT nextval('ticket') AS id", "MODEL_QUERY_WRITES"),
        ("SELECT sneaky() AS id", "MODEL_QUERY_WRITES"),
        ("WITH gone AS (DELETE FROM customers RETURNING id) SELECT id FROM gone", "MODEL_QUERY_WRITES"),
        ("DELETE FROM customers", "MODEL_QUERY_INVALID"),
        ("SELECT 1 AS id; DELETE FROM customers", "MODEL_QUERY_INVALID"),
        ("SELECT 1 AS id FROM pg_sleep(30)", "MODEL_QUERY_TIMEOUT"),
    ] {
        let body = json!({ "name": "bad", "warehouse_id": warehouse, "query": query, "primary_key": "id" });
        let e = expect_error(srv.post("/v1/reverse-etl/models", body).send().await.unwrap(), 400, code).await;
        assert_eq!(e["details"]["field"], "query", "{query}: {e}");
    }
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM customers").fetch_one(&mut c).await.unwrap();
    let advanced: bool = sqlx::query_scalar("SELECT is_called FROM ticket").fetch_one(&mut c).await.unwrap();
    assert_eq!((left, advanced), (30, false), "the warehouse is unchanged");

    // A value over the preview's cell size stays in the database.
    let preview = json_ok(
        srv.post(
            "/v1/reverse-etl/prepare",
            json!({ "warehouse_id": warehouse, "query": "SELECT id, body FROM wide ORDER BY id" }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let rows = &preview["data"]["sample_rows"];
    assert_eq!(rows[0]["body"], json!({ "$service_oversize": 300_000 }), "{rows}");
    assert_eq!(rows[1]["body"], "small");

    // Run as the configured model role, a model reads only what that role
    // may read.
    let narrowed = json_ok(srv.post("/v1/destinations", json!({ "name": "pg narrowed", "kind": "postgres", "configuration": { "url": as_role(&login), "model_role": reader } })).send().await.unwrap()).await;
    let narrowed = narrowed["data"]["destination_id"].as_str().unwrap().to_owned();
    let read = |warehouse: &str, query: &str| {
        srv.post("/v1/reverse-etl/prepare", json!({ "warehouse_id": warehouse, "query": query }))
    };
    assert_eq!(
        json_ok(read(&warehouse, "SELECT id, note FROM secrets").send().await.unwrap()).await["data"]["sample_rows"][0]
            ["id"],
        1
    );
    let refused =
        expect_error(read(&narrowed, "SELECT id, note FROM secrets").send().await.unwrap(), 400, "MODEL_QUERY_INVALID")
            .await;
    assert!(refused["message"].as_str().unwrap().contains("permission denied"), "{refused}");
    assert_eq!(
        json_ok(read(&narrowed, "SELECT id, email FROM customers ORDER BY id").send().await.unwrap()).await["data"]["sample_rows"]
            [0]["id"],
        1
    );

    let body = json!({ "name": "pg customers", "warehouse_id": warehouse, "query": "SELECT id, email FROM customers", "primary_key": "id" });
    let model = json_ok(srv.post("/v1/reverse-etl/models", body).send().await.unwrap()).await;
    let hook = json_ok(srv.post("/v1/reverse-etl/destinations", json!({ "name": "hook", "kind": "webhook", "configuration": { "url": format!("https://{HOOK_HOST}/retl") } })).send().await.unwrap()).await;
    let body = json!({ "name": "a", "model_id": model["data"]["model_id"], "destination_id": hook["data"]["destination_id"], "mappings": [{ "field": "email", "column": "email" }], "mode": "mirror" });
    let activation = json_ok(srv.post("/v1/reverse-etl/activations", body).send().await.unwrap()).await;
    let activation = activation["data"]["activation_id"].as_str().unwrap().to_owned();
    let run = s.run(&activation, json!({})).await;
    assert_eq!((counts(&run)["queried"].as_u64(), counts(&run)["added"].as_u64()), (Some(30), Some(30)), "{run}");
    let received: Vec<String> = s
        .hook
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| {
            b["records"].as_array().unwrap().iter().map(|r| r["fields"]["email"].as_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(received.len(), 30);
    assert!(received.contains(&"p30@example.com".to_owned()));
    // A row that leaves the model is removed at the destination by its key.
    sqlx::raw_sql("DELETE FROM customers WHERE id = 30").execute(&mut c).await.unwrap();
    let run = s.run(&activation, json!({})).await;
    assert_eq!((counts(&run)["removed"].as_u64(), counts(&run)["unchanged"].as_u64()), (Some(1), Some(29)), "{run}");
    let last = s.hook.lock().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["operation"].as_str(), last["records"][0]["key"].as_str()),
        (Some("delete"), Some("30")),
        "{last}"
    );
    // Roles belong to the whole PostgreSQL server: dropped with their grants.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP OWNED BY {login}, {reader}, {escalating}; DROP ROLE {login}, {reader}, {escalating}"
    )))
    .execute(&mut c)
    .await
    .unwrap();
}

/// The same through the CLI: a query tried, a model, a webhook
/// destination and an activation made from options, and a run waited for
/// with its counts shown until the outcome.
async fn the_cli_makes_an_activation_and_waits_for_its_run(backend: Backend) {
    use crate::cli_api::{Cli, stderr, stdout};
    let s = setup(backend).await;
    let srv = &s.srv;
    let config = crate::support::private_dir();
    let cli = Cli::of(srv, config.path());
    let query = "SELECT id, email, first_name FROM customers";
    let tried = cli.ok(&["reverse-etl", "prepare", "--warehouse", &s.warehouse_id, "--query", query]).await;
    let header: Vec<&str> = tried.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["id", "email", "first_name"], "{tried}");
    assert!(tried.contains("c1@example.com") && tried.contains("Suggested key: email"), "{tried}");

    let model = cli
        .json(&[
            "reverse-etl",
            "models",
            "create",
            "--name",
            "customers",
            "--warehouse",
            &s.warehouse_id,
            "--query",
            query,
            "--primary-key",
            "id",
        ])
        .await;
    let model_id = model["model_id"].as_str().unwrap().to_owned();
    let url = format!("configuration.url=https://{HOOK_HOST}/retl");
    let dest = cli
        .json(&["reverse-etl", "destinations", "create", "--name", "hook", "--kind", "webhook", "--set", &url])
        .await;
    let dest_id = dest["destination_id"].as_str().unwrap().to_owned();
    let created = cli
        .ok(&[
            "reverse-etl",
            "activations",
            "create",
            "--name",
            "hook",
            "--model",
            &model_id,
            "--destination",
            &dest_id,
            "--map",
            "mail=email",
            "--constant",
            "origin=warehouse",
            "--mode",
            "upsert",
        ])
        .await;
    let activation =
        created.split_whitespace().find(|w| w.starts_with("ra_")).unwrap_or_else(|| panic!("{created}")).to_owned();
    let listed = cli.ok(&["reverse-etl", "activations", "list"]).await;
    assert!(listed.lines().any(|l| l.starts_with(&activation) && l.contains("upsert")), "{listed}");

    let out = cli.run(&["reverse-etl", "activations", "run", &activation, "--wait"]).await;
    let (so, se) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{so}\n{se}");
    let run_id = so.split_whitespace().find(|w| w.starts_with("run_")).unwrap_or_else(|| panic!("{so}")).to_owned();
    assert!(so.contains(&format!("{run_id} succeeded in")), "{so}");
    assert!(
        se.lines()
            .any(|l| l.starts_with(&format!("{run_id} succeeded")) && l.contains("added 19") && l.contains("failed 1")),
        "{se}"
    );
    let batches = s.hook.lock().unwrap().clone();
    assert_eq!(batches[0]["records"][0]["fields"], json!({ "mail": "c1@example.com", "origin": "warehouse" }));
    let shown = cli.ok(&["reverse-etl", "runs", "get", &run_id]).await;
    assert!(shown.contains("progress.counts:") && shown.contains("\"added\":19"), "{shown}");
}

on_both_backends!(the_cli_makes_an_activation_and_waits_for_its_run);
