//! OAuth for sources and the task app, against a fake authorization server
//! over HTTPS reached through the egress overrides: PKCE, single-use state,
//! host-side code exchange, refresh, and every failure's own code.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::on_both_backends;
use crate::support::process::ServerProcess;
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, expect_error, json_ok};

/// The fake authorization server and API.
#[derive(Default)]
struct Auth {
    /// code → (PKCE challenge, redirect_uri)
    codes: Mutex<HashMap<String, (String, String)>>,
    access: Mutex<Vec<String>>,
    refresh: Mutex<Vec<String>>,
    issued: AtomicUsize,
    refreshed: AtomicUsize,
    expires_in: AtomicUsize,
    /// Whether a refresh token is spent by its use (single-use rotating
    /// refresh tokens).
    rotating: std::sync::atomic::AtomicBool,
    /// Requests for `/items` (the API a manifest source reads).
    items_read: AtomicUsize,
}

fn issue(a: &Auth) -> Value {
    let n = a.issued.fetch_add(1, Ordering::SeqCst);
    let (at, rt) = (format!("provider-access-{n}-{}", uuid::Uuid::new_v4().simple()), format!("provider-refresh-{n}"));
    a.access.lock().unwrap().push(at.clone());
    a.refresh.lock().unwrap().push(rt.clone());
    json!({ "access_token": at, "refresh_token": rt, "expires_in": a.expires_in.load(Ordering::SeqCst), "token_type": "Bearer", "scope": "social.read" })
}

fn routes(auth: Arc<Auth>) -> Router {
    Router::new()
        .route(
            "/oauth/token",
            post(|State(a): State<Arc<Auth>>, axum::Form(f): axum::Form<HashMap<String, String>>| async move {
                if f.get("client_id").map(String::as_str) != Some("client-1") || f.get("client_secret").map(String::as_str) != Some("operator-secret") {
                    return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "error": "invalid_client" }))).into_response();
                }
                match f.get("grant_type").map(String::as_str) {
                    Some("authorization_code") => {
                        let code = f.get("code").cloned().unwrap_or_default();
                        let Some((challenge, redirect)) = a.codes.lock().unwrap().remove(&code) else {
                            return (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": "invalid_grant", "error_description": "<script>alert(1)</script> code unknown" }))).into_response();
                        };
                        let verifier = f.get("code_verifier").cloned().unwrap_or_default();
                        if URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes())) != challenge || f.get("redirect_uri") != Some(&redirect) {
                            return (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": "invalid_grant" }))).into_response();
                        }
                        axum::Json(issue(&a)).into_response()
                    }
                    Some("refresh_token") => {
                        let rt = f.get("refresh_token").cloned().unwrap_or_default();
                        {
                            let mut valid = a.refresh.lock().unwrap();
                            if !valid.contains(&rt) {
                                return (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": "invalid_grant" }))).into_response();
                            }
                            if a.rotating.load(Ordering::SeqCst) {
                                valid.retain(|r| *r != rt);
                            }
                        }
                        a.refreshed.fetch_add(1, Ordering::SeqCst);
                        axum::Json(issue(&a)).into_response()
                    }
                    _ => (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": "unsupported_grant_type" }))).into_response(),
                }
            }),
        )
        .route(
            "/items",
            get(|State(a): State<Arc<Auth>>, h: HeaderMap| async move {
                a.items_read.fetch_add(1, Ordering::SeqCst);
                let auth = h.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").trim_start_matches("Bearer ").to_owned();
                if a.access.lock().unwrap().last() != Some(&auth) {
                    return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "message": "expired or unknown token" }))).into_response();
                }
                axum::Json(json!([{ "id": 1, "name": "first" }, { "id": 2, "name": "second" }])).into_response()
            }),
        )
        .route(
            "/me",
            get(|State(a): State<Arc<Auth>>, h: HeaderMap| async move {
                let auth = h.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").trim_start_matches("Bearer ").to_owned();
                if a.access.lock().unwrap().last() != Some(&auth) {
                    return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "message": "expired or unknown token" }))).into_response();
                }
                axum::Json(json!({ "portal_id": "portal-42" })).into_response()
            }),
        )
        .with_state(auth)
}

/// The operator's OAuth clients (`SERVICE_OAUTH_CLIENTS`).
const OAUTH_CLIENTS: &str = r#"{"test_oauth_source": {"client_id": "client-1", "client_secret": "operator-secret"},
    "conn_rest_manifest": {"client_id": "client-1", "client_secret": "operator-secret",
        "authorize_url": "https://auth.social.test/oauth/authorize", "token_url": "https://auth.social.test/oauth/token",
        "scopes": ["items.read"], "hosts": ["api.social.test"]}}"#;

/// A server whose OAuth client is registered with the fake authorization
/// server (which also serves the API it authorizes).
struct OAuthServer {
    srv: TestServer,
    auth: Arc<Auth>,
    provider: FakeProvider,
    /// The test CA's root, PEM, for servers started as processes.
    roots: String,
}

async fn setup(backend: Backend) -> OAuthServer {
    try_setup(backend).await.expect("a server for the backend")
}

/// [`setup`], or nothing when the backend is PostgreSQL and the tests run
/// without it.
async fn try_setup(backend: Backend) -> Option<OAuthServer> {
    let ca = TestCa::new();
    let auth = Arc::new(Auth { expires_in: AtomicUsize::new(3600), ..Default::default() });
    let names = ["auth.social.test", "api.social.test"];
    let provider = FakeProvider::start(&ca, &names, routes(auth.clone())).await;
    let trust = Trust::new(&ca).serving(&provider, &names);
    let srv = TestServer::start_with(backend, |c| {
        c.plugins.egress = trust.policy();
        c.oauth = service::config::oauth::OAuthSettings::from_settings(
            Some(OAUTH_CLIENTS),
            Some(r#"{"authorize_url": "https://auth.social.test/oauth/authorize", "token_url": "https://auth.social.test/oauth/token", "scopes": ["tasks"], "client_id": "client-1", "client_secret": "operator-secret"}"#),
        )
        .unwrap();
    })
    .await?;
    srv.load_test_plugin("test_oauth_source").await;
    Some(OAuthServer { srv, auth, provider, roots: ca.pem.clone() })
}

impl OAuthServer {
    /// Starts a flow and plays the user's consent: returns (state, code).
    async fn consent(&self, start_path: &str, body: Value) -> (String, String) {
        let started = json_ok(self.srv.post(start_path, body).send().await.unwrap()).await;
        let url = url::Url::parse(started["data"]["authorization_url"].as_str().unwrap()).unwrap();
        let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
        assert_eq!(q["code_challenge_method"], "S256");
        assert_eq!(q["response_type"], "code");
        assert_eq!(q["client_id"], "client-1", "the client comes from operator configuration");
        let code = format!("code-{}", uuid::Uuid::new_v4().simple());
        self.auth.codes.lock().unwrap().insert(code.clone(), (q["code_challenge"].clone(), q["redirect_uri"].clone()));
        (q["state"].clone(), code)
    }

    async fn callback(&self, body: Value) -> reqwest::Response {
        self.srv.post("/v1/credentials/source/oauth/callback", body).send().await.unwrap()
    }

    async fn check(
        &self,
        handle: &str,
    ) -> Result<service::plugin::types::CheckResult, service::plugin::InvocationError> {
        self.check_with("test_oauth_source", json!({ "credential_handle": handle })).await
    }

    /// `connector`'s check with `config`, run as a source's would be.
    async fn check_with(
        &self,
        connector: &str,
        config: Value,
    ) -> Result<service::plugin::types::CheckResult, service::plugin::InvocationError> {
        let plugin = self.srv.state.plugins.available(connector).await.unwrap();
        let ws = self.srv.workspace_id().await;
        self.srv.state.plugins.runtime().check(&plugin, &ws, &self.srv.state.egress, &config.to_string()).await
    }
}

/// Two `service serve` processes on one PostgreSQL database, and a
/// provider whose refresh tokens are spent by their use: 50 discovers of a
/// manifest source at once through the API, half on each process, all
/// needing a refresh. One process refreshes; the others wait for the
/// token it stores; nobody spends the old refresh token twice, so the
/// grant is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_server_processes_refreshing_a_rotating_refresh_token_at_once_refresh_it_once() {
    let Some(fx) = try_setup(Backend::Postgres).await else { return };
    fx.auth.rotating.store(true, Ordering::SeqCst);
    // The first access token is due for a refresh as soon as it is stored.
    fx.auth.expires_in.store(1, Ordering::SeqCst);
    let (state, code) =
        fx.consent("/v1/credentials/source/oauth/start", json!({ "connector_id": "conn_rest_manifest" })).await;
    let created = json_ok(fx.callback(json!({ "state": state, "code": code })).await).await;
    let handle = created["data"]["credential_handle"].as_str().unwrap().to_owned();
    fx.auth.expires_in.store(3600, Ordering::SeqCst);
    let configuration = json!({ "base_url": "https://api.social.test", "credential_handle": handle,
        "manifest": { "streams": [{ "name": "items", "path": "/items", "primary_key": ["id"] }] } });
    let source = json_ok(
        fx.srv
            .post(
                "/v1/sources",
                json!({ "connector_id": "conn_rest_manifest", "name": "items", "configuration": configuration }),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    let source_id = source["data"]["source_id"].as_str().unwrap().to_owned();
    let refreshed_before = fx.auth.refreshed.load(Ordering::SeqCst);

    // The processes share the database and the master key, nothing else.
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    std::fs::write(&roots, &fx.roots).unwrap();
    let env = |name: &str| {
        vec![
            ("DATABASE_URL", fx.srv.state.config.database_url.clone()),
            ("SERVICE_MASTER_KEY", crate::support::TEST_MASTER_KEY.to_owned()),
            ("SERVICE_DATA_DIR", dir.path().join(name).display().to_string()),
            ("SERVICE_PLUGIN_CACHE_DIR", crate::support::shared_compile_cache().display().to_string()),
            ("SERVICE_EGRESS_ALLOWED_HOSTS", "*.social.test".to_owned()),
            ("SERVICE_EGRESS_RESOLVE", fx.provider.pins(&["auth.social.test", "api.social.test"])),
            ("SERVICE_EGRESS_EXTRA_ROOTS", roots.display().to_string()),
            ("SERVICE_OAUTH_CLIENTS", OAUTH_CLIENTS.to_owned()),
        ]
    };
    let (one, two) = tokio::join!(ServerProcess::start(env("one")), ServerProcess::start(env("two")));
    let client = reqwest::Client::new();
    let mut prepares = tokio::task::JoinSet::new();
    for i in 0..50 {
        let base = if i % 2 == 0 { one.base.clone() } else { two.base.clone() };
        let request = client
            .post(format!("{base}/v1/pipelines/prepare"))
            .bearer_auth(crate::support::ADMIN_TOKEN)
            .json(&json!({ "source_id": source_id }));
        prepares.spawn(async move { request.send().await.unwrap() });
    }
    let mut prepared = 0;
    while let Some(done) = prepares.join_next().await {
        let answer = json_ok(done.unwrap()).await;
        assert!(answer.to_string().contains("items"), "{answer}");
        prepared += 1;
    }
    assert_eq!(prepared, 50);
    assert_eq!(fx.auth.refreshed.load(Ordering::SeqCst) - refreshed_before, 1, "one refresh for both processes");
    let read = json_ok(
        fx.srv
            .get(&format!("/v1/credentials/{}", created["data"]["credential_id"].as_str().unwrap()))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(read["data"]["status"], "active", "{read}");
    drop((one, two));
}

async fn source_oauth_yields_a_handle_the_plugin_can_use_and_never_the_tokens(backend: Backend) {
    let fx = setup(backend).await;
    let (state, code) =
        fx.consent("/v1/credentials/source/oauth/start", json!({ "connector_id": "test_oauth_source" })).await;
    let resp = fx.callback(json!({ "state": state, "code": code })).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let created = json_ok(resp).await;
    let text = created.to_string();
    for t in fx.auth.access.lock().unwrap().iter().chain(fx.auth.refresh.lock().unwrap().iter()) {
        assert!(!text.contains(t.as_str()), "provider token in the response");
    }
    assert_eq!(created["data"]["kind"], "oauth2");
    assert_eq!(created["data"]["connector_id"], "test_oauth_source");
    let handle = created["data"]["credential_handle"].as_str().unwrap().to_owned();
    let checked = fx.check(&handle).await.unwrap();
    assert!(checked.ok);
    assert_eq!(checked.account.as_deref(), Some("portal-42"));

    // Single use.
    expect_error(fx.callback(json!({ "state": state, "code": code })).await, 409, "OAUTH_STATE_USED").await;
}

/// A manifest source reads whatever API it names, so it declares no OAuth
/// provider: the operator names one beside its client, with the API hosts
/// the tokens may go to. The credential is the manifest connector's, bound
/// to those hosts only, and refreshed by the host like any other.
async fn a_manifest_source_authorises_with_a_provider_the_operator_names(backend: Backend) {
    let fx = setup(backend).await;
    fx.auth.expires_in.store(1, Ordering::SeqCst);
    let (state, code) =
        fx.consent("/v1/credentials/source/oauth/start", json!({ "connector_id": "conn_rest_manifest" })).await;
    let created = json_ok(fx.callback(json!({ "state": state, "code": code })).await).await;
    assert_eq!(created["data"]["connector_id"], "conn_rest_manifest", "{created}");
    assert_eq!(created["data"]["hosts"], json!(["api.social.test"]), "bound to the API, not the authorization server");
    let handle = created["data"]["credential_handle"].as_str().unwrap().to_owned();
    fx.auth.expires_in.store(3600, Ordering::SeqCst);
    let config = |base_url: &str| {
        json!({ "base_url": base_url, "credential_handle": handle,
                "manifest": { "streams": [{ "name": "items", "path": "/items", "primary_key": ["id"] }] } })
    };

    let checked = fx.check_with("conn_rest_manifest", config("https://api.social.test")).await.unwrap();
    assert!(checked.ok, "{checked:?}");
    assert_eq!(fx.auth.refreshed.load(Ordering::SeqCst), 1, "the expiring token was refreshed by the host");
    assert_eq!(fx.auth.items_read.load(Ordering::SeqCst), 1);

    // The same manifest pointed at the authorization server (reachable for
    // the exchange) does not take the token there.
    let elsewhere = fx.check_with("conn_rest_manifest", config("https://auth.social.test")).await;
    assert!(!matches!(&elsewhere, Ok(c) if c.ok), "{elsewhere:?}");
    assert!(format!("{elsewhere:?}").contains("not bound to host auth.social.test"), "{elsewhere:?}");
    assert_eq!(fx.auth.items_read.load(Ordering::SeqCst), 1, "nothing was sent with the token");

    // Nor may another connector of the workspace borrow the credential.
    let borrowed = fx.check(&handle).await;
    assert!(!matches!(&borrowed, Ok(c) if c.ok), "{borrowed:?}");
    assert!(format!("{borrowed:?}").contains("belongs to connector conn_rest_manifest"), "{borrowed:?}");
}

async fn expired_tokens_are_refreshed_by_the_host_invisibly(backend: Backend) {
    let fx = setup(backend).await;
    fx.auth.expires_in.store(1, Ordering::SeqCst);
    let (state, code) =
        fx.consent("/v1/credentials/source/oauth/start", json!({ "connector_id": "test_oauth_source" })).await;
    let created = json_ok(fx.callback(json!({ "state": state, "code": code })).await).await;
    let handle = created["data"]["credential_handle"].as_str().unwrap().to_owned();
    fx.auth.expires_in.store(3600, Ordering::SeqCst);
    // The access token expires within the refresh margin: the next use refreshes it.
    assert!(fx.check(&handle).await.unwrap().ok);
    assert_eq!(fx.auth.refreshed.load(Ordering::SeqCst), 1);
    assert!(fx.check(&handle).await.unwrap().ok);
    assert_eq!(fx.auth.refreshed.load(Ordering::SeqCst), 1, "refreshed once, then reused");
}

async fn every_failure_has_its_own_code(backend: Backend) {
    let fx = setup(backend).await;
    expect_error(fx.callback(json!({ "state": "no-such-state", "code": "x" })).await, 400, "OAUTH_STATE_UNKNOWN").await;

    let (state, _) =
        fx.consent("/v1/credentials/source/oauth/start", json!({ "connector_id": "test_oauth_source" })).await;
    expect_error(fx.callback(json!({ "state": state, "error": "access_denied" })).await, 400, "OAUTH_ACCESS_DENIED")
        .await;

    let (state, _) =
        fx.consent("/v1/credentials/source/oauth/start", json!({ "connector_id": "test_oauth_source" })).await;
    let e =
        expect_error(fx.callback(json!({ "state": state, "code": "bad" })).await, 502, "OAUTH_PROVIDER_ERROR").await;
    assert_eq!(e["details"]["provider_error"], "invalid_grant");
    assert!(!e.to_string().contains("<script>"), "provider messages are sanitised");

    // Another user's flow is unknown to you and stays usable by them.
    let ws = fx.srv.workspace_id().await;
    let (state, code) =
        fx.consent("/v1/credentials/source/oauth/start", json!({ "connector_id": "test_oauth_source" })).await;
    let (_, editor) = fx.srv.user_in(&ws, service::access::Role::Editor).await;
    let resp = fx
        .srv
        .request_as(&editor, Method::POST, "/v1/credentials/source/oauth/callback")
        .json(&json!({ "state": state, "code": code }))
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, "OAUTH_STATE_UNKNOWN").await;
    assert_eq!(fx.callback(json!({ "state": state, "code": code })).await.status(), StatusCode::CREATED);

    // Expired.
    let me = json_ok(fx.srv.get("/v1/me").send().await.unwrap()).await;
    let user = me["data"]["user"]["user_id"].as_str().unwrap().to_owned();
    fx.srv
        .state
        .store
        .create_oauth_state(
            &service::access::tokens::hash("old-state"),
            &service::store::oauth::OAuthState {
                workspace_id: ws.clone(),
                user_id: user,
                target: "test_oauth_source".into(),
                code_verifier: "v".into(),
                redirect_uri: "r".into(),
                expires_at: service::store::now_ms() - 1,
                used: false,
                session_id: None,
                client_source: "api".into(),
            },
        )
        .await
        .unwrap();
    expect_error(fx.callback(json!({ "state": "old-state", "code": "x" })).await, 400, "OAUTH_STATE_EXPIRED").await;

    // Connectors without OAuth, and unconfigured clients.
    let e = expect_error(
        fx.srv
            .post("/v1/credentials/source/oauth/start", json!({ "connector_id": "conn_emailcampaign_edm" }))
            .send()
            .await
            .unwrap(),
        400,
        "OAUTH_NOT_SUPPORTED",
    )
    .await;
    assert_eq!(e["details"]["connector_id"], "conn_emailcampaign_edm");
}

async fn browsers_complete_the_flow_on_the_landing_page(backend: Backend) {
    let fx = setup(backend).await;
    let (state, code) =
        fx.consent("/v1/credentials/source/oauth/start", json!({ "connector_id": "test_oauth_source" })).await;
    let page = fx
        .srv
        .client
        .get(fx.srv.url(&format!("/oauth/callback?state={state}&code={code}&iss=https%3A%2F%2Fauth.social.test")))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    // The landing names who started the flow and for which workspace, and
    // stores nothing until a person confirms.
    assert!(html.contains("admin@example.test") && html.contains("Default workspace"), "{html}");
    assert!(!html.contains("<code>ch_"), "{html}");
    let none = json_ok(fx.srv.get("/v1/credentials").send().await.unwrap()).await;
    assert!(none["data"]["items"].as_array().unwrap().iter().all(|c| c["kind"] != "oauth2"), "{none}");
    let done = fx
        .srv
        .client
        .post(fx.srv.url("/oauth/callback"))
        .form(&[("state", state.as_str()), ("code", code.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    let html = done.text().await.unwrap();
    let start = html.find("<code>ch_").unwrap() + 6;
    let handle = &html[start..start + html[start..].find("</code>").unwrap()];
    assert!(fx.check(handle).await.unwrap().ok);
    let again = fx
        .srv
        .client
        .post(fx.srv.url("/oauth/callback"))
        .form(&[("state", state.as_str()), ("code", code.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::CONFLICT);
    let landing =
        fx.srv.client.get(fx.srv.url(&format!("/oauth/callback?state={state}&code={code}"))).send().await.unwrap();
    assert_eq!(landing.status(), StatusCode::GONE, "a spent flow has nothing to confirm");
}

async fn the_task_app_flow_yields_a_workspace_credential(backend: Backend) {
    let fx = setup(backend).await;
    let (state, code) = fx.consent("/v1/credentials/taskapp/oauth/start", json!({})).await;
    // A task-app state cannot complete a source flow.
    expect_error(fx.callback(json!({ "state": state, "code": code })).await, 400, "OAUTH_STATE_UNKNOWN").await;
    let (state, code) = fx.consent("/v1/credentials/taskapp/oauth/start", json!({})).await;
    let resp = fx
        .srv
        .post("/v1/credentials/taskapp/oauth/callback", json!({ "state": state, "code": code }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let created = json_ok(resp).await;
    assert_eq!(created["data"]["connector_id"], "taskapp");
    assert_eq!(created["data"]["hosts"], json!(["auth.social.test"]));
}

async fn a_flow_an_assistant_started_ends_in_a_proposal_wherever_it_is_completed(backend: Backend) {
    let fx = setup(backend).await;
    let assistant = service::access::admin::create_token(
        &fx.srv.state.store,
        &fx.srv.state.config.bootstrap_email,
        Some("assistant"),
        None,
        service::access::ClientSource::Mcp,
    )
    .await
    .unwrap();
    let started = fx
        .srv
        .request_as(
            secrecy::ExposeSecret::expose_secret(&assistant),
            Method::POST,
            "/v1/credentials/source/oauth/start",
        )
        .json(&json!({ "connector_id": "test_oauth_source" }))
        .send()
        .await
        .unwrap();
    let started = json_ok(started).await;
    let url = url::Url::parse(started["data"]["authorization_url"].as_str().unwrap()).unwrap();
    let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
    let code = format!("code-{}", uuid::Uuid::new_v4().simple());
    fx.auth.codes.lock().unwrap().insert(code.clone(), (q["code_challenge"].clone(), q["redirect_uri"].clone()));
    // The person finishes in the browser; the page says an assistant asked.
    let page = fx
        .srv
        .client
        .get(fx.srv.url(&format!("/oauth/callback?state={}&code={code}", q["state"])))
        .send()
        .await
        .unwrap();
    assert!(page.text().await.unwrap().contains("through the mcp client"));
    let done = fx
        .srv
        .client
        .post(fx.srv.url("/oauth/callback"))
        .form(&[("state", q["state"].as_str()), ("code", code.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    let html = done.text().await.unwrap();
    assert!(html.contains("approves") && !html.contains("<code>ch_"), "{html}");
    // The credential waits for a person's approval, like any the assistant stores.
    let creds = json_ok(fx.srv.get("/v1/credentials").send().await.unwrap()).await;
    let cred = creds["data"]["items"].as_array().unwrap().iter().find(|c| c["kind"] == "oauth2").cloned().unwrap();
    assert_eq!(cred["status"], "pending_approval", "{cred}");
    let pending = json_ok(fx.srv.get("/v1/approvals?status=pending").send().await.unwrap()).await;
    let approval = &pending["data"]["items"][0];
    assert_eq!(approval["client_source"], "mcp");
    assert_eq!(approval["operation"]["credential_id"], cred["credential_id"]);
    assert!(fx.check(cred["credential_handle"].as_str().unwrap()).await.is_err(), "unusable until approved");
}

on_both_backends!(
    a_flow_an_assistant_started_ends_in_a_proposal_wherever_it_is_completed,
    source_oauth_yields_a_handle_the_plugin_can_use_and_never_the_tokens,
    a_manifest_source_authorises_with_a_provider_the_operator_names,
    expired_tokens_are_refreshed_by_the_host_invisibly,
    every_failure_has_its_own_code,
    browsers_complete_the_flow_on_the_landing_page,
    the_task_app_flow_yields_a_workspace_credential,
);
