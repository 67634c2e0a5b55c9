//! Proof that secrets never leak: canaries enter through every credential
//! flow of a real `service serve` process, every endpoint that touches them
//! is exercised (success, provider errors that echo headers, validation
//! failures), and then no canary may appear in any response body or
//! header, any log line (debug level, JSON), any audit record, or any file
//! the server wrote (database, warehouse, caches) except as ciphertext.
//! Entry paths: `POST /credentials`, the email-campaign API token, the
//! secure entry page, and OAuth (the host stores the provider's tokens).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::support::mailcoach::{self, MailcoachState};
use crate::support::process::ServerProcess;
use crate::support::provider::{FakeProvider, TestCa};

const ADMIN: &str = "svc_leak_test_admin_token_0123456789";

/// Everything a client saw.
#[derive(Default)]
struct Seen(String);

impl Seen {
    async fn take(&mut self, resp: reqwest::Response) -> (u16, Value) {
        let status = resp.status().as_u16();
        for (k, v) in resp.headers() {
            self.0.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("")));
        }
        let text = resp.text().await.unwrap();
        self.0.push_str(&text);
        self.0.push('\n');
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_appear_in_no_response_log_audit_record_or_plaintext_column() {
    crate::support::init_crypto();
    let canary = |what: &str| format!("CANARY{what}{}", uuid::Uuid::new_v4().simple());
    let (c_generic, c_token, c_entry, c_bad, c_rejected) =
        (canary("generic"), canary("token"), canary("entry"), canary("bad"), canary("rejected"));

    // The provider accepts c_token and echoes whatever it gets in errors.
    let ca = TestCa::new();
    let mc = Arc::new(MailcoachState {
        token: c_token.clone(),
        campaigns: mailcoach::campaigns(12),
        echo_auth_in_errors: true,
        ..Default::default()
    });
    // The OAuth provider hands out canary tokens; the event source accepts
    // the canary token of a generic credential.
    let (c_access, c_refresh, c_source) = (canary("access"), canary("refresh"), canary("source"));
    let oauth_tokens =
        json!({ "access_token": c_access, "refresh_token": c_refresh, "expires_in": 3600, "token_type": "Bearer" });
    let source_token = format!("Bearer {c_source}");
    let extra = axum::Router::new()
        .route("/oauth/token", axum::routing::post(move || { let t = oauth_tokens.clone(); async move { axum::Json(t) } }))
        .route(
            "/events",
            axum::routing::get(move |h: axum::http::HeaderMap| {
                let ok = h.get("authorization").and_then(|v| v.to_str().ok()) == Some(source_token.as_str());
                async move {
                    if !ok {
                        return (axum::http::StatusCode::UNAUTHORIZED, axum::Json(json!({ "echo": format!("{:?}", h.get("authorization")) }))).into_response();
                    }
                    axum::Json(json!({ "data": [{ "id": 1, "note": "hello" }, { "id": 2, "note": "world" }], "next_cursor": null })).into_response()
                }
            }),
        );
    let names = ["mail.acme-corp.com", "auth.social.test", "api.social.test", "api.source.test"];
    let provider = FakeProvider::start(&ca, &names, mailcoach::router(mc.clone()).merge(extra)).await;
    let plugins_dir = tempfile::tempdir().unwrap();
    for p in ["test_oauth_source", "test_paged_source"] {
        std::fs::copy(crate::support::test_plugin(p), plugins_dir.path().join(format!("{p}.wasm"))).unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    std::fs::write(&roots, &ca.pem).unwrap();
    let mut server = ServerProcess::start(vec![
        ("SERVICE_DATA_DIR", dir.path().join("data").display().to_string()),
        ("SERVICE_BOOTSTRAP_TOKEN", ADMIN.to_owned()),
        ("SERVICE_LOG", "debug".to_owned()),
        ("SERVICE_LOG_FORMAT", "json".to_owned()),
        ("SERVICE_EGRESS_ALLOWED_HOSTS", "mail.acme-corp.com,*.social.test,*.source.test".to_owned()),
        ("SERVICE_PLUGINS_DIR", plugins_dir.path().display().to_string()),
        // The test plugins are built unsigned.
        ("SERVICE_PLUGIN_SIGNATURES", "allowed".to_owned()),
        (
            "SERVICE_OAUTH_CLIENTS",
            r#"{"test_oauth_source": {"client_id": "c", "client_secret": "operator-client-secret"}}"#.to_owned(),
        ),
        ("SERVICE_EGRESS_RESOLVE", provider.pins(&names)),
        ("SERVICE_EGRESS_EXTRA_ROOTS", roots.display().to_string()),
    ])
    .await;
    let base = server.base.clone();
    let client = reqwest::Client::new();
    let api = |m: reqwest::Method, p: &str| client.request(m, format!("{base}{p}")).bearer_auth(ADMIN);
    let mut seen = Seen::default();
    // Plugin files dropped into the directory wait for an operator.
    for p in ["test_oauth_source", "test_paged_source"] {
        let (s, v) =
            seen.take(api(reqwest::Method::POST, &format!("/v1/admin/plugins/{p}/load")).send().await.unwrap()).await;
        assert_eq!(s, 200, "{v}");
    }

    // Entry paths.
    let (s, v) = seen
        .take(
            api(reqwest::Method::POST, "/v1/credentials")
                .json(&json!({ "hosts": ["mail.acme-corp.com"], "secret": c_generic }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let generic = v["data"]["credential_handle"].as_str().unwrap().to_owned();
    let generic_id = v["data"]["credential_id"].as_str().unwrap().to_owned();
    let (s, v) = seen
        .take(
            api(reqwest::Method::POST, "/v1/credentials/emailcampaign/api-token")
                .json(&json!({ "base_url": "https://mail.acme-corp.com/api", "api_token": c_token }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let good = v["data"]["credential_handle"].as_str().unwrap().to_owned();
    let (_, v) = seen
        .take(
            api(reqwest::Method::POST, "/v1/credentials/emailcampaign/api-token")
                .json(&json!({ "base_url": "https://mail.acme-corp.com/api", "api_token": c_bad }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    let bad = v["data"]["credential_handle"].as_str().unwrap().to_owned();
    let (_, v) = seen
        .take(
            api(reqwest::Method::POST, "/v1/credentials/entry-links")
                .json(&json!({ "hosts": ["mail.acme-corp.com"] }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    let url = v["data"]["url"].as_str().unwrap().to_owned();
    seen.take(client.post(&url).form(&[("secret", c_entry.as_str())]).send().await.unwrap()).await;
    // A validation failure carrying a secret.
    let (s, _) = seen
        .take(
            api(reqwest::Method::POST, "/v1/credentials/emailcampaign/api-token")
                .json(&json!({ "base_url": "http://127.0.0.1/api", "api_token": c_rejected }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    assert_eq!(s, 400);
    let (s, _) = seen
        .take(
            api(reqwest::Method::POST, "/v1/credentials/entry-links")
                .json(&json!({ "hosts": ["mail.acme-corp.com"], "token": c_rejected }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    assert_eq!(s, 400);

    // Use them: success, a bad token the provider echoes back, outages
    // whose error bodies echo the Authorization header.
    for handle in [&good, &bad, &generic] {
        seen.take(
            api(reqwest::Method::POST, "/v1/connectors/emailcampaign/check")
                .json(&json!({ "credential_handle": handle }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        seen.take(
            api(reqwest::Method::POST, "/v1/connectors/emailcampaign/edm/preview")
                .json(&json!({ "credential_handle": handle, "base_url": "https://mail.acme-corp.com/api" }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    }
    mc.fail_next.store(50, Ordering::SeqCst);
    seen.take(
        api(reqwest::Method::POST, "/v1/connectors/emailcampaign/edm/preview")
            .json(&json!({ "credential_handle": good }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    mc.fail_next.store(0, Ordering::SeqCst);
    seen.take(api(reqwest::Method::GET, &format!("/v1/credentials/{generic_id}")).send().await.unwrap()).await;
    seen.take(api(reqwest::Method::GET, "/v1/credentials").send().await.unwrap()).await;
    seen.take(api(reqwest::Method::GET, "/v1/audit-logs?limit=200").send().await.unwrap()).await;
    seen.take(api(reqwest::Method::GET, "/v1/approvals").send().await.unwrap()).await;

    // OAuth: the host exchanges the code and stores canary tokens; the
    // plugin uses them through the handle.
    let (_, v) = seen
        .take(
            api(reqwest::Method::POST, "/v1/credentials/source/oauth/start")
                .json(&json!({ "connector_id": "test_oauth_source" }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    let state = v["data"]["state"].as_str().expect("oauth start").to_owned();
    let (s, v) = seen
        .take(
            api(reqwest::Method::POST, "/v1/credentials/source/oauth/callback")
                .json(&json!({ "state": state, "code": "any" }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    assert_eq!(s, 201, "{v}");

    // A sync: a generic credential for the event source, through a plugin
    // into an SQLite destination.
    let (_, v) = seen
        .take(
            api(reqwest::Method::POST, "/v1/credentials")
                .json(&json!({ "hosts": ["api.source.test"], "secret": c_source }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    let source_handle = v["data"]["credential_handle"].as_str().unwrap().to_owned();
    let (s, v) = seen
        .take(api(reqwest::Method::POST, "/v1/sources").json(&json!({ "connector_id": "test_paged_source", "name": "events", "configuration": { "base_url": "https://api.source.test", "credential_handle": source_handle } })).send().await.unwrap())
        .await;
    assert_eq!(s, 201, "{v}");
    let source_id = v["data"]["source_id"].as_str().unwrap().to_owned();
    let (_, v) = seen
        .take(
            api(reqwest::Method::POST, "/v1/destinations")
                .json(&json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "w.db" } }))
                .send()
                .await
                .unwrap(),
        )
        .await;
    let dest = v["data"]["destination_id"].as_str().unwrap().to_owned();
    let (s, v) = seen
        .take(api(reqwest::Method::POST, "/v1/pipelines").json(&json!({ "name": "p", "source_id": source_id, "destination_id": dest, "streams": [{ "name": "events", "sync_mode": "incremental_append" }] })).send().await.unwrap())
        .await;
    assert_eq!(s, 201, "{v}");
    let pipeline = v["data"]["pipeline_id"].as_str().unwrap().to_owned();
    let (_, v) =
        seen.take(api(reqwest::Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let job = v["data"]["job_id"].as_str().unwrap().to_owned();
    let mut status = String::new();
    for _ in 0..200 {
        let (_, v) = seen.take(api(reqwest::Method::GET, &format!("/v1/jobs/{job}")).send().await.unwrap()).await;
        status = v["data"]["status"].as_str().unwrap_or("").to_owned();
        if status == "succeeded" || status == "failed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, "succeeded");

    // The provider did receive the real token: injection works.
    assert!(mc.seen_auth.lock().unwrap().iter().any(|a| a.contains(&c_token)));

    let logs = server.stop_and_collect();
    assert!(logs.contains("\"level\""), "JSON logs were captured");

    let mut db = Vec::new();
    // Every file the server wrote: its database, the warehouse, caches.
    let mut stack = vec![dir.path().join("data")];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if !path.ends_with("master.key") {
                db.extend(std::fs::read(&path).unwrap());
            }
        }
    }
    assert!(!db.is_empty());
    let db = String::from_utf8_lossy(&db);
    for c in [&c_generic, &c_token, &c_entry, &c_bad, &c_rejected, &c_access, &c_refresh, &c_source] {
        assert!(!seen.0.contains(c.as_str()), "{c} leaked into a response");
        assert!(!logs.contains(c.as_str()), "{c} leaked into the logs");
        assert!(!db.contains(c.as_str()), "{c} is in the database in plaintext");
    }
}
