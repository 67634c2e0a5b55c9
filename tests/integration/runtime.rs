//! The connector runtime with real, misbehaving Wasm components: limits,
//! egress policy, credential injection, load and unload.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use reqwest::Method;
use secrecy::SecretString;
use serde_json::{Value, json};
use service::credentials::{NewSecret, SecretMaterial};
use service::plugin::InvocationError;
use service::plugin::registry::{LoadedPlugin, PluginSource};

use crate::on_both_backends;
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, expect_error, json_ok, test_plugin};

const HOSTS: &[&str] = &["api.provider.test", "echo.provider.test", "redirect.provider.test"];

/// A provider that echoes requests, redirects to private addresses and
/// answers slowly on demand.
fn provider_routes() -> Router {
    Router::new()
        .route("/ok", get(|| async { "fine" }))
        // Longer than an epoch tick (5 ms): every request spans one.
        .route(
            "/unhurried",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(7)).await;
                "fine"
            }),
        )
        .route("/gone", get(|| async { StatusCode::GONE }))
        .route(
            "/echo",
            get(|headers: HeaderMap| async move {
                let all: Vec<(String, String)> =
                    headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect();
                let auth =
                    headers.get("authorization").map(|v| v.to_str().unwrap_or("").to_owned()).unwrap_or_default();
                (
                    [("x-echo-authorization", auth.clone()), ("set-cookie", format!("session={auth}"))],
                    axum::Json(json!({ "headers": all, "authorization": auth })),
                )
            }),
        )
        .route(
            "/reflect",
            get(|headers: HeaderMap| async move {
                // What a careless debug endpoint would hand back: the
                // credential it received, in every encoding it might use.
                use base64::Engine;
                let auth = headers
                    .get("authorization")
                    .or_else(|| headers.get("x-api-key"))
                    .map(|v| v.to_str().unwrap_or("").to_owned())
                    .unwrap_or_default();
                let secret = auth.strip_prefix("Bearer ").unwrap_or(&auth).to_owned();
                let decoded = auth
                    .strip_prefix("Basic ")
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                let percent: String = url::form_urlencoded::byte_serialize(secret.as_bytes()).collect();
                let body = json!({
                    "raw": secret,
                    "base64": base64::engine::general_purpose::STANDARD.encode(&secret),
                    "percent": percent,
                    "query": format!("https://echo.provider.test/?token={percent}"),
                    "basic_header": auth,
                    "basic_decoded": decoded,
                });
                axum::Json(body)
            }),
        )
        .route(
            "/coded/{coding}",
            get(|axum::extract::Path(coding): axum::extract::Path<String>, headers: HeaderMap| async move {
                // A provider that compresses whatever the request asked
                // for, and echoes the credential in its body and a header.
                let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("").to_owned());
                let auth = text("authorization").unwrap_or_default();
                let body = json!({
                    "authorization": auth,
                    "accept_encoding": text("accept-encoding"),
                    "te": text("te"),
                    "padding": "p".repeat(64),
                });
                if headers.contains_key("x-empty") {
                    return (StatusCode::NO_CONTENT, [("content-encoding", coding)]).into_response();
                }
                let size = headers.get("x-bomb").and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
                let plain = match size {
                    Some(n) => vec![b'b'; n],
                    None => body.to_string().into_bytes(),
                };
                (
                    [("content-encoding", coding.clone()), ("x-echo-authorization", auth)],
                    testkit::codings::encode(&coding, &plain),
                )
                    .into_response()
            }),
        )
        .route(
            "/keyed",
            get(|headers: HeaderMap, uri: axum::http::Uri| async move {
                // A provider that takes its key in the query, echoes it,
                // and builds its links from the request's query.
                let host = heard(&headers, &uri, "");
                let query = uri.query().unwrap_or_default().to_owned();
                let key: Vec<String> = url::form_urlencoded::parse(query.as_bytes())
                    .filter(|(k, _)| k == "api_key")
                    .map(|(_, v)| v.into_owned())
                    .collect();
                let next = format!("https://{host}/keyed?page=2&{query}");
                let elsewhere = format!("https://api.provider.test/keyed?page=2&{query}");
                (
                    [("link", format!("<{next}>; rel=\"next\"")), ("x-echo-key", key.join(","))],
                    axum::Json(json!({ "keys": key, "query": query, "next": next, "elsewhere": elsewhere })),
                )
            }),
        )
        .route(
            "/keyed-redirect/{to}",
            get(|axum::extract::Path(to): axum::extract::Path<String>, headers: HeaderMap, uri: axum::http::Uri| async move {
                heard(&headers, &uri, "");
                let query = uri.query().unwrap_or_default().to_owned();
                let key = url::form_urlencoded::parse(query.as_bytes())
                    .find(|(k, _)| k == "api_key")
                    .map(|(_, v)| url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>())
                    .unwrap_or_default();
                let location = match to.as_str() {
                    // Home, the key echoed: followed, and the key set again.
                    "home" => format!("/keyed?page=3&api_key={key}"),
                    // Elsewhere, the key echoed in its own parameter.
                    "away" => format!("https://api.provider.test/keyed?api_key={key}"),
                    // Elsewhere, the key echoed in another parameter.
                    _ => format!("https://api.provider.test/keyed?token={key}"),
                };
                (StatusCode::FOUND, [("location", location)]).into_response()
            }),
        )
        .route(
            "/signed",
            axum::routing::any(|method: Method, headers: HeaderMap, uri: axum::http::Uri, body: String| async move {
                // A provider that checks an HMAC of timestamp, method, path
                // and query, and the body's SHA-256, with the key it shares.
                use hmac::Mac;
                use sha2::Digest;
                heard(&headers, &uri, &body);
                let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
                let message = format!(
                    "{}\n{}\n{}\n{}",
                    text("x-timestamp"),
                    method,
                    uri.path_and_query().map(|p| p.as_str()).unwrap_or_default(),
                    hex::encode(sha2::Sha256::digest(body.as_bytes()))
                );
                let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SIGNING_KEY.as_bytes()).unwrap();
                mac.update(message.as_bytes());
                let expected = format!("v1={}", hex::encode(mac.finalize().into_bytes()));
                let signatures: Vec<String> =
                    headers.get_all("x-signature").iter().map(|v| v.to_str().unwrap_or_default().to_owned()).collect();
                let all: Vec<(String, String)> =
                    headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect();
                let status = if signatures == [expected] { StatusCode::OK } else { StatusCode::UNAUTHORIZED };
                (status, axum::Json(json!({ "signatures": signatures, "headers": all }))).into_response()
            }),
        )
        .route(
            "/oauth/token",
            axum::routing::post(|headers: HeaderMap, uri: axum::http::Uri, body: String| async move {
                // Client credentials (client `app`) and JWT bearer
                // assertions (verified with the test's public key).
                heard(&headers, &uri, &body);
                let form: std::collections::HashMap<String, String> =
                    url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
                let grant = form.get("grant_type").map(String::as_str).unwrap_or_default();
                let good = match grant {
                    "client_credentials" => {
                        form.get("client_id").map(String::as_str) == Some("app")
                            && form.get("client_secret").map(String::as_str) == Some(CLIENT_SECRET)
                    }
                    "urn:ietf:params:oauth:grant-type:jwt-bearer" => form.get("assertion").is_some_and(|jwt| {
                        use base64::Engine;
                        let Some((input, signature)) = jwt.rsplit_once('.') else { return false };
                        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
                        let public = JWT_PUBLIC.lock().unwrap().clone();
                        ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, public)
                            .verify(input.as_bytes(), &b64.decode(signature).unwrap_or_default())
                            .is_ok()
                    }),
                    _ => false,
                };
                if !good {
                    return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "error": "invalid_client" }))).into_response();
                }
                axum::Json(json!({ "access_token": issue(grant), "token_type": "Bearer", "expires_in": 3600 }))
                    .into_response()
            }),
        )
        .route(
            "/login",
            axum::routing::post(|headers: HeaderMap, uri: axum::http::Uri, body: String| async move {
                heard(&headers, &uri, &body);
                let login: Value = serde_json::from_str(&body).unwrap_or_default();
                if login != json!({ "user": "me", "pass": LOGIN_PASSWORD }) {
                    return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "error": "bad_login" }))).into_response();
                }
                axum::Json(json!({ "session": { "id": issue("login") } })).into_response()
            }),
        )
        .route(
            "/protected",
            get(|headers: HeaderMap, uri: axum::http::Uri| async move {
                heard(&headers, &uri, "");
                let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
                let token = text("authorization")
                    .and_then(|a| a.strip_prefix("Bearer ").map(str::to_owned))
                    .or_else(|| text("x-session"))
                    .unwrap_or_default();
                let tokens = TOKENS.lock().unwrap();
                if !tokens.0.contains(&token) || tokens.1.contains(&token) {
                    return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "error": "invalid_token" }))).into_response();
                }
                axum::Json(json!({ "token": token })).into_response()
            }),
        )
        .route(
            "/body",
            axum::routing::post(|headers: HeaderMap, uri: axum::http::Uri, body: String| async move {
                heard(&headers, &uri, &body);
                axum::Json(json!({ "received": body }))
            }),
        )
        .route(
            "/body-redirect",
            axum::routing::post(|headers: HeaderMap, uri: axum::http::Uri, body: String| async move {
                heard(&headers, &uri, &body);
                (StatusCode::TEMPORARY_REDIRECT, [("location", "https://api.provider.test/body")]).into_response()
            }),
        )
        .route(
            "/redirect-private",
            get(|| async { (StatusCode::FOUND, [("location", "https://localhost/steal")]).into_response() }),
        )
        .route(
            "/redirect-undeclared",
            get(|| async { (StatusCode::FOUND, [("location", "https://elsewhere.example/")]).into_response() }),
        )
        .route("/within-limit", get(|| async { "w".repeat(RESPONSE_LIMIT - 1024) }))
        .route("/over-limit", get(|| async { "o".repeat(RESPONSE_LIMIT + 1) }))
        .route(
            "/over-limit-unannounced",
            get(|| async { axum::body::Body::new(Unannounced { left: RESPONSE_LIMIT + 1 }) }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                "late"
            }),
        )
}

/// The secret of the token endpoint's client `app`.
const CLIENT_SECRET: &str = "client-secret-0123456789";
/// The password `/login` takes for `me`.
const LOGIN_PASSWORD: &str = "login-password-0123456789";
/// The public key `/oauth/token` verifies JWT assertions with.
static JWT_PUBLIC: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());
/// Tokens the fake issued, and those it revoked since.
static TOKENS: std::sync::Mutex<(Vec<String>, Vec<String>)> = std::sync::Mutex::new((Vec::new(), Vec::new()));

/// A new token of `kind`, valid until revoked.
fn issue(kind: &str) -> String {
    let token = format!("{}-{}", kind.rsplit(':').next().unwrap_or(kind), uuid::Uuid::new_v4().simple());
    TOKENS.lock().unwrap().0.push(token.clone());
    token
}

/// The key the `/signed` route shares with a signing credential.
const SIGNING_KEY: &str = "signing-key-0123456789abcdef";

/// Every request the query and body routes received: host, path and
/// query, body. Tests look in it for their own canaries only.
static HEARD: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Notes a request in [`HEARD`]; answers the host it was sent to.
fn heard(headers: &HeaderMap, uri: &axum::http::Uri, body: &str) -> String {
    let host = headers.get("host").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    HEARD.lock().unwrap().push(format!("{host} {uri} {body}"));
    host
}

/// What [`HEARD`] holds that mentions `needle`.
fn heard_with(needle: &str) -> Vec<String> {
    HEARD.lock().unwrap().iter().filter(|l| l.contains(needle)).cloned().collect()
}

/// The largest response body the fixture's egress hands a plugin.
const RESPONSE_LIMIT: usize = 256 * 1024;

/// A body sent in 16 KiB frames without a `Content-Length`, so only the
/// bytes themselves tell how large it is.
struct Unannounced {
    left: usize,
}

impl hyper::body::Body for Unannounced {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        let n = self.left.min(16 * 1024);
        self.left -= n;
        std::task::Poll::Ready((n > 0).then(|| Ok(hyper::body::Frame::data(bytes::Bytes::from(vec![b'u'; n])))))
    }
}

struct Fixture {
    srv: TestServer,
    provider: FakeProvider,
    plugin: Arc<LoadedPlugin>,
    workspace_id: String,
}

/// A server whose egress reaches the fake provider under the test names,
/// with the misbehaving plugin loaded and tight limits.
async fn fixture() -> Fixture {
    let ca = TestCa::new();
    let provider = FakeProvider::start(&ca, HOSTS, provider_routes()).await;
    let trust = Trust::new(&ca).serving(&provider, HOSTS).allowing("localhost");
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.plugins.egress = trust.policy();
        c.plugins.egress.max_response_bytes = RESPONSE_LIMIT;
        c.plugins.limits.cpu = Duration::from_millis(500);
        c.plugins.limits.memory_bytes = 64 * 1024 * 1024;
        c.plugins.limits.wall_short = Duration::from_secs(3);
        c.plugins.limits.max_output_bytes = 1024 * 1024;
    })
    .await
    .unwrap();
    let path = test_plugin("test_misbehaving");
    let bytes = std::fs::read(&path).unwrap();
    let id = srv.state.plugins.load_bytes(&bytes, PluginSource::File(path)).await.unwrap();
    let plugin = srv.state.plugins.available(&id).await.unwrap();
    let workspace_id = srv.workspace_id().await;
    Fixture { srv, provider, plugin, workspace_id }
}

impl Fixture {
    async fn preview(&self, config: Value) -> Result<Value, InvocationError> {
        self.srv
            .state
            .plugins
            .runtime()
            .preview(&self.plugin, &self.workspace_id, &self.srv.state.egress, &config.to_string())
            .await
    }

    /// What the plugin saw of one request.
    async fn egress(&self, request: Value) -> Value {
        self.preview(json!({ "behave": "egress", "request": request })).await.expect("egress preview runs")
    }

    async fn credential(&self, workspace_id: &str, hosts: &[&str], secret: &str) -> String {
        let me = json_ok(self.srv.get("/v1/me").send().await.unwrap()).await;
        let admin = me["data"]["user"]["user_id"].as_str().unwrap().to_owned();
        self.srv
            .state
            .vault
            .create(NewSecret {
                workspace_id,
                created_by: &admin,
                kind: service::store::kinds::CredentialKind::ApiToken,
                connector_id: None,
                label: None,
                hosts: hosts.iter().map(|h| h.to_string()).collect(),
                metadata: json!({}),
                material: SecretMaterial::new(SecretString::from(secret.to_owned())),
                status: service::store::kinds::CredentialStatus::Active,
                access_expires_at: None,
            })
            .await
            .unwrap()
            .credential_handle
            .to_string()
    }

    /// A credential of `kind`, stored for `connector` if given, with
    /// `metadata` (its username or header).
    async fn credential_of(&self, kind: &str, connector: Option<&str>, metadata: Value, secret: &str) -> String {
        let me = json_ok(self.srv.get("/v1/me").send().await.unwrap()).await;
        let admin = me["data"]["user"]["user_id"].as_str().unwrap().to_owned();
        self.srv
            .state
            .vault
            .create(NewSecret {
                workspace_id: &self.workspace_id,
                created_by: &admin,
                kind: service::store::kinds::CredentialKind::parse(kind).expect("a credential kind"),
                connector_id: connector,
                label: None,
                hosts: vec!["echo.provider.test".into()],
                metadata,
                material: SecretMaterial::new(SecretString::from(secret.to_owned())),
                status: service::store::kinds::CredentialStatus::Active,
                access_expires_at: None,
            })
            .await
            .unwrap()
            .credential_handle
            .to_string()
    }

    async fn still_works(&self) {
        assert_eq!(self.preview(json!({ "behave": "noop" })).await.unwrap(), json!({}), "the next invocation works");
    }
}

fn denied_rule(v: &Value) -> String {
    assert_eq!(v["error"]["kind"], "denied", "expected a denial: {v}");
    v["error"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_loop_hits_the_cpu_limit_and_the_next_call_works() {
    let f = fixture().await;
    assert_eq!(f.preview(json!({ "behave": "loop" })).await, Err(InvocationError::CpuLimit));
    f.still_works().await;
}

/// The CPU limit counts guest code, not the waits in between: a call of
/// many requests, each longer than a tick, waits far past the limit
/// (500 ms here) and is not cut short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_spent_waiting_on_requests_is_not_guest_cpu() {
    let f = fixture().await;
    let before = f.provider.hits();
    let request = json!({ "url": "https://api.provider.test/unhurried" });
    let ok = f
        .preview(json!({ "behave": "egress_timed", "times": 120, "request": request }))
        .await
        .expect("120 requests of 7 ms or more each: 840 ms of waiting, past a 500 ms CPU limit");
    let waited: u64 = ok["nanos"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).sum();
    assert!(waited > 840_000_000, "the requests took {waited} ns");
    assert_eq!(f.provider.hits(), before + 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_hits_the_memory_limit_and_the_next_call_works() {
    let f = fixture().await;
    assert_eq!(f.preview(json!({ "behave": "memory_bomb" })).await, Err(InvocationError::MemoryLimit));
    f.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_recursion_and_traps_fail_only_their_call() {
    let f = fixture().await;
    match f.preview(json!({ "behave": "recursion" })).await {
        Err(InvocationError::Trapped(m)) => assert!(m.contains("stack overflow"), "{m}"),
        other => panic!("expected a stack overflow, got {other:?}"),
    }
    f.still_works().await;
    assert!(matches!(f.preview(json!({ "behave": "trap" })).await, Err(InvocationError::Trapped(_))));
    f.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_output_is_refused() {
    let f = fixture().await;
    assert_eq!(
        f.preview(json!({ "behave": "oversized_output", "size": 4 * 1024 * 1024 })).await,
        Err(InvocationError::OutputTooLarge)
    );
    f.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_host_call_is_cut_by_the_wall_clock() {
    let f = fixture().await;
    let r = f
        .preview(json!({ "behave": "egress", "request": { "method": "GET", "url": "https://api.provider.test/slow" } }))
        .await;
    assert_eq!(r, Err(InvocationError::Timeout));
    f.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_flood_is_capped_without_failing_the_call() {
    let f = fixture().await;
    // 4,000 messages of ~200 bytes are three times the 256 KiB log budget,
    // and few enough host calls to stay well inside the fixture's 500 ms
    // CPU budget on a loaded machine.
    let r = f.preview(json!({ "behave": "log_flood", "count": 4000 })).await.unwrap();
    assert_eq!(r["logged"], 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_request_batch_makes_every_request_and_stops_at_a_refusal() {
    // The runtime benchmark reads its in-plugin figures from this
    // behaviour; a batch that quietly skipped requests would flatter them.
    let f = fixture().await;
    let before = f.provider.hits();
    let ok = f
        .preview(json!({ "behave": "egress_timed", "times": 5, "request": { "url": "https://api.provider.test/ok" } }))
        .await
        .unwrap();
    let nanos = ok["nanos"].as_array().expect("one figure per request");
    assert_eq!(nanos.len(), 5, "{ok}");
    assert!(nanos.iter().all(|n| n.as_u64().is_some_and(|n| n > 0)), "{ok}");
    assert_eq!(f.provider.hits(), before + 5, "every timed request reached the provider");

    let refused = f
        .preview(json!({ "behave": "egress_timed", "times": 5, "request": { "url": "https://undeclared.test/ok" } }))
        .await;
    match refused {
        Err(InvocationError::Connector(e)) => assert!(e.to_string().contains("request 0 failed: denied"), "{e}"),
        other => panic!("a refused request must fail the batch, got {other:?}"),
    }
    let missing = f
        .preview(
            json!({ "behave": "egress_timed", "times": 5, "request": { "url": "https://api.provider.test/gone" } }),
        )
        .await;
    match missing {
        Err(InvocationError::Connector(e)) => assert!(e.to_string().contains("request 0 answered 410"), "{e}"),
        other => panic!("an answer that is no success must fail the batch, got {other:?}"),
    }
    assert_eq!(f.provider.hits(), before + 6, "the batches stopped at their first failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_reaches_declared_and_allowed_hosts_only() {
    let f = fixture().await;
    let ok = f.egress(json!({ "method": "GET", "url": "https://api.provider.test/ok" })).await;
    assert_eq!(ok["ok"]["status"], 200, "{ok}");
    assert_eq!(ok["ok"]["body"], "fine");

    let rule = denied_rule(&f.egress(json!({ "method": "GET", "url": "https://undeclared.example.com/" })).await);
    assert!(rule.contains("not among the hosts the connector declared"), "{rule}");
    for url in [
        "https://127.0.0.1/",
        "https://[::1]/",
        "https://[::ffff:127.0.0.1]/",
        "https://169.254.169.254/latest/meta-data",
    ] {
        let rule = denied_rule(&f.egress(json!({ "method": "GET", "url": url })).await);
        assert!(rule.contains("IP-literal"), "{url}: {rule}");
    }
    let rule = denied_rule(&f.egress(json!({ "method": "GET", "url": "http://api.provider.test/ok" })).await);
    assert!(rule.contains("only https"), "{rule}");
    let rule = denied_rule(&f.egress(json!({ "method": "GET", "url": "https://api.provider.test:8443/ok" })).await);
    assert!(rule.contains("port 443"), "{rule}");
    let rule = denied_rule(&f.egress(json!({ "method": "GET", "url": "https://user:pw@api.provider.test/ok" })).await);
    assert!(rule.contains("user-info"), "{rule}");
    // One reading of a URL for the host and its connectors: the default
    // port and the case of a name change nothing; a name the SDK would
    // not read as the host does is refused, whatever the host's parser
    // makes of it.
    let ok = f.egress(json!({ "method": "GET", "url": "https://API.Provider.test:443/ok" })).await;
    assert_eq!(ok["ok"]["status"], 200, "{ok}");
    let before = f.provider.hits();
    let rule = denied_rule(&f.egress(json!({ "method": "GET", "url": "https://bücher.provider.test/ok" })).await);
    assert!(rule.contains("not written in ASCII") && rule.contains("xn--"), "{rule}");
    assert_eq!(f.provider.hits(), before);
    assert_eq!(f.provider.hits(), before, "no denied request reached the provider");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_over_the_size_limit_are_refused_whether_announced_or_not() {
    let f = fixture().await;
    let ok = f.egress(json!({ "method": "GET", "url": "https://api.provider.test/within-limit" })).await;
    assert_eq!(ok["ok"]["status"], 200, "a body under the limit arrives whole");
    assert_eq!(ok["ok"]["body"].as_str().map(str::len), Some(RESPONSE_LIMIT - 1024));
    for path in ["over-limit", "over-limit-unannounced"] {
        let v = f.egress(json!({ "method": "GET", "url": format!("https://api.provider.test/{path}") })).await;
        assert_eq!(v["error"]["kind"], "response-too-large", "{path}: {v}");
    }
    f.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_resolving_to_a_private_address_is_refused() {
    let f = fixture().await;
    // `localhost` is declared by the plugin and allowed by the operator,
    // but resolves to loopback.
    let rule = denied_rule(&f.egress(json!({ "method": "GET", "url": "https://localhost/" })).await);
    assert!(rule.contains("resolves to a loopback address"), "{rule}");
    assert!(!rule.contains("127.0.0.1") && !rule.contains("::1"), "the plugin is not told the address: {rule}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_checked_like_first_requests() {
    let f = fixture().await;
    let rule = denied_rule(
        &f.egress(json!({ "method": "GET", "url": "https://redirect.provider.test/redirect-private" })).await,
    );
    assert!(rule.contains("redirect refused") && rule.contains("loopback"), "{rule}");
    let rule = denied_rule(
        &f.egress(json!({ "method": "GET", "url": "https://redirect.provider.test/redirect-undeclared" })).await,
    );
    assert!(rule.contains("redirect refused"), "{rule}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_may_not_set_credential_headers_itself() {
    let f = fixture().await;
    for header in ["Authorization", "proxy-authorization", "Cookie", "HOST"] {
        let before = f.provider.hits();
        let v = f.egress(json!({ "method": "GET", "url": "https://echo.provider.test/echo", "headers": [[header, "Bearer stolen"]] })).await;
        assert!(denied_rule(&v).contains("may not be set by a plugin"), "{header}: {v}");
        assert_eq!(f.provider.hits(), before, "nothing was sent");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_injects_credentials_and_the_plugin_never_sees_them() {
    let f = fixture().await;
    let canary = format!("canary-{}", uuid::Uuid::new_v4().simple());
    let handle = f.credential(&f.workspace_id, &["echo.provider.test"], &canary).await;
    let report = f
        .preview(json!({
            "behave": "report",
            "request": { "method": "GET", "url": "https://echo.provider.test/echo", "credential": { "handle": handle, "placement": "bearer" } }
        }))
        .await
        .unwrap();
    let text = report.to_string();
    // The provider received the secret (the echo proves injection) ...
    assert!(text.contains("[REDACTED]"), "the echoed secret was scrubbed: {text}");
    // ... but nothing the plugin can see holds it: not the body, not a
    // header, not the environment or the filesystem.
    assert!(!text.contains(&canary), "canary leaked to the plugin: {text}");
    assert!(!text.contains("set-cookie"), "cookies are withheld: {text}");
    let env = &report["env"];
    assert!(
        env.as_array().is_none_or(|e| e.is_empty()) || env.as_object().is_some_and(|e| e.is_empty()),
        "no environment: {env}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_of_another_workspace_or_host_are_unavailable() {
    let f = fixture().await;
    let (other_ws, _) = f.srv.other_workspace().await;
    let foreign = f.credential(&other_ws, &["echo.provider.test"], "foreign-secret-value").await;
    let v = f
        .egress(json!({ "method": "GET", "url": "https://echo.provider.test/echo", "credential": { "handle": foreign, "placement": "bearer" } }))
        .await;
    assert_eq!(v["error"]["kind"], "credential-unavailable", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("unknown credential handle"), "{v}");

    let elsewhere = f.credential(&f.workspace_id, &["api.provider.test"], "bound-elsewhere-secret").await;
    let before = f.provider.hits();
    let v = f
        .egress(json!({ "method": "GET", "url": "https://echo.provider.test/echo", "credential": { "handle": elsewhere, "placement": "bearer" } }))
        .await;
    assert_eq!(v["error"]["kind"], "credential-unavailable", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("not bound to host echo.provider.test"), "{v}");
    assert_eq!(f.provider.hits(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connectors_come_from_plugins_and_unloading_makes_them_unavailable() {
    let f = fixture().await;
    let srv = &f.srv;
    let list = json_ok(srv.get("/v1/connectors").send().await.unwrap()).await;
    let item = list["data"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["connector_id"] == "test_misbehaving")
        .cloned()
        .unwrap();
    assert_eq!(item["status"], "available");
    assert_eq!(item["interface_version"], "service:connector@1.3.0", "it names several credentials on a request");
    let spec = json_ok(srv.get("/v1/connectors/test_misbehaving/spec").send().await.unwrap()).await;
    assert_eq!(spec["data"]["config_schema"]["type"], "object");
    expect_error(srv.get("/v1/connectors/no_such_connector").send().await.unwrap(), 404, "404").await;

    // Only operators manage plugins.
    let ws = f.workspace_id.clone();
    let (_, admin_not_operator) = srv.user_in(&ws, service::access::Role::Administrator).await;
    let resp = srv
        .request_as(&admin_not_operator, Method::POST, "/v1/admin/plugins/test_misbehaving/unload")
        .send()
        .await
        .unwrap();
    expect_error(resp, 403, "403").await;

    let unloaded =
        json_ok(srv.request(Method::POST, "/v1/admin/plugins/test_misbehaving/unload").send().await.unwrap()).await;
    assert_eq!(unloaded["data"]["enabled"], false);
    let c = json_ok(srv.get("/v1/connectors/test_misbehaving").send().await.unwrap()).await;
    assert_eq!(c["data"]["status"], "unavailable");
    assert!(matches!(srv.state.plugins.available("test_misbehaving").await, Err(InvocationError::Unavailable(_))));

    let loaded =
        json_ok(srv.request(Method::POST, "/v1/admin/plugins/test_misbehaving/load").send().await.unwrap()).await;
    assert_eq!(loaded["data"]["available"], true);
    let plugin = srv.state.plugins.available("test_misbehaving").await.unwrap();
    let r = srv.state.plugins.runtime().preview(&plugin, &ws, &srv.state.egress, r#"{"behave":"noop"}"#).await.unwrap();
    assert_eq!(r, json!({}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_added_to_the_plugins_directory_wait_for_an_operator_and_removed_ones_unload() {
    let srv = TestServer::start(Backend::Sqlite).await.unwrap();
    let dir = srv.state.config.plugins.plugins_dir.clone();
    let dest = dir.join("noop.wasm");
    std::fs::copy(test_plugin("test_noop"), &dest).unwrap();
    srv.state.plugins.scan_dir().await;
    // Registered, not enabled: writing to the directory does not make
    // anyone an operator.
    let c = json_ok(srv.get("/v1/connectors/test_noop").send().await.unwrap()).await;
    assert_eq!(c["data"]["status"], "unavailable");
    let plugin = json_ok(srv.get("/v1/admin/plugins").send().await.unwrap()).await;
    let noop =
        plugin["data"]["items"].as_array().unwrap().iter().find(|p| p["connector_id"] == "test_noop").cloned().unwrap();
    assert_eq!(noop["enabled"], false, "{noop}");
    json_ok(srv.post("/v1/admin/plugins/test_noop/load", json!({})).send().await.unwrap()).await;
    let c = json_ok(srv.get("/v1/connectors/test_noop").send().await.unwrap()).await;
    assert_eq!(c["data"]["status"], "available");
    std::fs::remove_file(&dest).unwrap();
    srv.state.plugins.scan_dir().await;
    let c = json_ok(srv.get("/v1/connectors/test_noop").send().await.unwrap()).await;
    assert_eq!(c["data"]["status"], "unavailable");
    // The compiled artefact was cached on disk, keyed by content.
    let cached = std::fs::read_dir(&srv.state.config.plugins.compile_cache_dir).unwrap().count();
    assert!(cached >= 1);
    srv.stop().await;
}

/// A component with a custom section appended: the same plugin, other
/// bytes (another digest).
pub fn with_custom_section(mut component: Vec<u8>, payload: &[u8]) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            out.push(if n == 0 { byte } else { byte | 0x80 });
            if n == 0 {
                break;
            }
        }
    }
    let name = b"service-test";
    let mut content = Vec::new();
    leb(name.len(), &mut content);
    content.extend_from_slice(name);
    content.extend_from_slice(payload);
    component.push(0);
    leb(content.len(), &mut component);
    component.extend_from_slice(&content);
    component
}

on_both_backends!(an_enabled_plugin_is_pinned_to_the_component_the_operator_enabled);

/// Overwriting an enabled plugin's file does not swap its code: the new
/// component is installed as a new version and runs only once an operator
/// makes it current; the version the operator enabled keeps running from
/// the control database, file or no file, and bytes swapped in the
/// database are refused.
async fn an_enabled_plugin_is_pinned_to_the_component_the_operator_enabled(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let dir = srv.state.config.plugins.plugins_dir.clone();
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("noop.wasm");
    let original = std::fs::read(test_plugin("test_noop")).unwrap();
    std::fs::write(&file, &original).unwrap();
    srv.state.plugins.scan_dir().await;
    json_ok(srv.post("/v1/admin/plugins/test_noop/load", json!({})).send().await.unwrap()).await;
    let listed = |srv: &TestServer| {
        let req = srv.get("/v1/admin/plugins");
        async move {
            let all = json_ok(req.send().await.unwrap()).await;
            all["data"]["items"].as_array().unwrap().iter().find(|p| p["connector_id"] == "test_noop").cloned().unwrap()
        }
    };
    let first = listed(&srv).await;
    assert_eq!((first["enabled"].as_bool(), first["available"].as_bool()), (Some(true), Some(true)), "{first}");

    // The file is overwritten with another component of the same id.
    let rebuilt = with_custom_section(original.clone(), b"another build");
    std::fs::write(&file, &rebuilt).unwrap();
    srv.state.plugins.scan_dir().await;
    let after = listed(&srv).await;
    assert_eq!(after["digest"], first["digest"], "the enabled version still runs: {after}");
    assert_eq!(after["available"], true, "{after}");
    assert_eq!(srv.state.plugins.available("test_noop").await.unwrap().digest, first["digest"].as_str().unwrap());
    let versions = json_ok(srv.get("/v1/admin/plugins/test_noop/versions").send().await.unwrap()).await;
    let items = versions["data"]["items"].as_array().unwrap().clone();
    let new_digest = service::plugin::signature::digest(&rebuilt);
    assert_eq!(items.len(), 2, "{versions}");
    assert_eq!((&items[0]["digest"], items[0]["current"].as_bool()), (&first["digest"], Some(true)), "{versions}");
    assert_eq!((items[1]["digest"].as_str(), items[1]["current"].as_bool()), (Some(new_digest.as_str()), Some(false)));

    // Both declare the same version: the operator names one by digest.
    let ambiguous = srv.post("/v1/admin/plugins/test_noop/use", json!({ "version": "0.1.0" })).send().await.unwrap();
    let e = expect_error(ambiguous, 409, "PLUGIN_VERSION_AMBIGUOUS").await;
    assert_eq!(e["details"]["digests"].as_array().unwrap().len(), 2, "{e}");
    let unknown = srv.post("/v1/admin/plugins/test_noop/use", json!({ "version": "9.9.9" })).send().await.unwrap();
    expect_error(unknown, 404, "404").await;
    let used = json_ok(
        srv.post("/v1/admin/plugins/test_noop/use", json!({ "version": &new_digest[..16] })).send().await.unwrap(),
    )
    .await;
    assert_eq!(
        (used["data"]["digest"].as_str(), used["data"]["available"].as_bool()),
        (Some(&*new_digest), Some(true))
    );
    // Rolling back is using the previous version.
    let back = json!({ "version": first["digest"] });
    json_ok(srv.post("/v1/admin/plugins/test_noop/use", back).send().await.unwrap()).await;
    assert_eq!(srv.state.plugins.available("test_noop").await.unwrap().digest, first["digest"].as_str().unwrap());

    // The file holds the rebuilt component, which does not run: its going
    // leaves the enabled version running (from the database's bytes).
    std::fs::remove_file(&file).unwrap();
    srv.state.plugins.scan_dir().await;
    assert_eq!(
        srv.state.plugins.available("test_noop").await.unwrap().digest,
        first["digest"].as_str().unwrap(),
        "removing another version's file changes nothing"
    );
    // Disabled and enabled again, with no file: the pinned version runs
    // from the database.
    json_ok(srv.post("/v1/admin/plugins/test_noop/unload", json!({})).send().await.unwrap()).await;
    assert!(srv.state.plugins.available("test_noop").await.is_err());
    json_ok(srv.post("/v1/admin/plugins/test_noop/load", json!({})).send().await.unwrap()).await;
    assert_eq!(srv.state.plugins.available("test_noop").await.unwrap().digest, first["digest"].as_str().unwrap());

    // Bytes swapped in the database under the pinned digest never run on
    // a replica that prepares them from there.
    let url = srv.state.config.database_url.clone();
    let digest = first["digest"].as_str().unwrap().to_owned();
    {
        use base64::Engine as _;
        use sqlx::Connection as _;
        let mut c = sqlx::AnyConnection::connect(&url).await.unwrap();
        sqlx::query("UPDATE plugin_versions SET component = $1 WHERE digest = $2")
            .bind(base64::engine::general_purpose::STANDARD.encode(&rebuilt))
            .bind(&digest)
            .execute(&mut c)
            .await
            .unwrap();
    }
    let replica = TestServer::start_with(backend, |c| c.database_url = url).await.unwrap();
    assert!(replica.state.plugins.available("test_noop").await.is_err(), "other bytes than the enabled ones never run");
    replica.stop().await;
    srv.stop().await;
}

#[test]
fn plugins_validate_reports_supported_versions_and_bad_descriptions() {
    let good = crate::support::process::command()
        .args(["plugins", "validate"])
        .arg(test_plugin("test_noop"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&good.stdout);
    assert!(good.status.success(), "{out}{}", String::from_utf8_lossy(&good.stderr));
    assert!(out.contains("service:connector@1.0.0") && out.contains("description: valid"), "{out}");

    let bad = crate::support::process::command()
        .args(["plugins", "validate"])
        .arg(test_plugin("test_bad_describe"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1), "a component whose description fails the check");
    let all = format!("{}{}", String::from_utf8_lossy(&bad.stdout), String::from_utf8_lossy(&bad.stderr));
    assert!(all.contains("config-schema is not JSON") || all.contains("problem"), "{all}");

    let dir = tempfile::tempdir().unwrap();
    let not_wasm = dir.path().join("x.wasm");
    std::fs::write(&not_wasm, b"hello").unwrap();
    let r = crate::support::process::command().args(["plugins", "validate"]).arg(&not_wasm).output().unwrap();
    assert!(String::from_utf8_lossy(&r.stderr).contains("not a WebAssembly file"));
    // Unusable input, as for `plugins test --component` and `conform`.
    assert_eq!(r.status.code(), Some(2));
    for command in ["test", "conform"] {
        let cassette = testkit::plugins::repository().join("plugins/restmanifest/cassettes/acme-items");
        let r = crate::support::process::command()
            .args(["plugins", command])
            .arg(&cassette)
            .arg("--component")
            .arg(&not_wasm)
            .output()
            .unwrap();
        assert_eq!(r.status.code(), Some(2), "{command}: {}", String::from_utf8_lossy(&r.stderr));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_goes_only_where_its_kind_puts_it() {
    let f = fixture().await;
    let echo = |handle: &str, placement: Value| json!({ "method": "GET", "url": "https://echo.provider.test/echo", "credential": { "handle": handle, "placement": placement } });
    let token = f.credential_of("api_token", None, json!({}), "bearer-only-secret-1").await;
    for placement in [json!({ "basic": "attacker" }), json!({ "header": "x-leak" })] {
        let before = f.provider.hits();
        let rule = denied_rule(&f.egress(echo(&token, placement.clone())).await);
        assert!(rule.contains("as a bearer token"), "{placement}: {rule}");
        assert_eq!(f.provider.hits(), before, "nothing was sent");
    }
    let basic = f.credential_of("basic", None, json!({ "username": "alice" }), "basic-secret-of-alice").await;
    assert!(
        denied_rule(&f.egress(echo(&basic, json!({ "basic": "mallory" }))).await).contains("Basic password of alice")
    );
    assert!(denied_rule(&f.egress(echo(&basic, json!("bearer"))).await).contains("Basic password of alice"));
    let v = f.egress(echo(&basic, json!({ "basic": "alice" }))).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    let keyed = f.credential_of("secret", None, json!({ "header": "x-api-key" }), "header-secret-value").await;
    assert!(denied_rule(&f.egress(echo(&keyed, json!({ "header": "x-other" }))).await).contains("in header x-api-key"));
    let v = f.egress(echo(&keyed, json!({ "header": "X-Api-Key" }))).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_stored_for_one_connector_serves_no_other() {
    let f = fixture().await;
    let theirs = f.credential_of("api_token", Some("conn_emailcampaign_edm"), json!({}), "email-campaign-token").await;
    let before = f.provider.hits();
    let v = f.egress(json!({ "method": "GET", "url": "https://echo.provider.test/echo", "credential": { "handle": theirs, "placement": "bearer" } })).await;
    assert_eq!(v["error"]["kind"], "credential-unavailable", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("belongs to connector conn_emailcampaign_edm"), "{v}");
    assert_eq!(f.provider.hits(), before);
    let mine = f.credential_of("api_token", Some("test_misbehaving"), json!({}), "misbehaving-own-token").await;
    let v = f.egress(json!({ "method": "GET", "url": "https://echo.provider.test/echo", "credential": { "handle": mine, "placement": "bearer" } })).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_requests_never_carry_a_credential() {
    let f = fixture().await;
    let token = f.credential_of("api_token", None, json!({}), "ranged-secret-value").await;
    let v = f
        .egress(json!({ "method": "GET", "url": "https://echo.provider.test/echo", "headers": [["Range", "bytes=0-3"], ["If-Range", "x"], ["x-kept", "1"]], "credential": { "handle": token, "placement": "bearer" } }))
        .await;
    let seen = v["ok"]["body"].as_str().unwrap().to_ascii_lowercase();
    assert!(seen.contains("x-kept") && !seen.contains("\"range\"") && !seen.contains("if-range"), "{seen}");
    // Without a credential, Range goes through.
    let v = f
        .egress(
            json!({ "method": "GET", "url": "https://echo.provider.test/echo", "headers": [["Range", "bytes=0-3"]] }),
        )
        .await;
    assert!(v["ok"]["body"].as_str().unwrap().contains("\"range\""), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_encoding_of_an_echoed_secret_is_scrubbed() {
    use base64::Engine;
    let f = fixture().await;
    let secret = format!("s3c/r+t\"q\"<x>&={}", uuid::Uuid::new_v4().simple());
    let forms = |s: &str| -> Vec<String> {
        let percent: String = url::form_urlencoded::byte_serialize(s.as_bytes()).collect();
        let json_escaped = serde_json::to_string(s).unwrap();
        vec![
            s.to_owned(),
            base64::engine::general_purpose::STANDARD.encode(s),
            percent.clone(),
            percent.to_ascii_lowercase(),
            json_escaped[1..json_escaped.len() - 1].to_owned(),
        ]
    };
    let bearer = f.credential_of("api_token", None, json!({}), &secret).await;
    let v = f.egress(json!({ "method": "GET", "url": "https://echo.provider.test/reflect", "credential": { "handle": bearer, "placement": "bearer" } })).await;
    let body = v["ok"]["body"].as_str().unwrap().to_owned();
    assert!(body.contains("[REDACTED]"), "the provider did echo it: {body}");
    for form in forms(&secret) {
        assert!(!body.contains(&form), "{form} reached the plugin: {body}");
    }
    let basic = f.credential_of("basic", None, json!({ "username": "bob" }), &secret).await;
    let v = f.egress(json!({ "method": "GET", "url": "https://echo.provider.test/reflect", "credential": { "handle": basic, "placement": { "basic": "bob" } } })).await;
    let body = v["ok"]["body"].as_str().unwrap().to_owned();
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("bob:{secret}"));
    assert!(!body.contains(&pair), "the Basic header's Base64: {body}");
    for form in forms(&secret) {
        assert!(!body.contains(&form), "{form} reached the plugin: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_credential_is_set_by_the_host_and_every_link_handed_back_is_redacted() {
    let f = fixture().await;
    let canary = format!("qk{}", uuid::Uuid::new_v4().simple());
    let key = f.credential_of("secret", None, json!({ "query_parameter": "api_key" }), &canary).await;
    let credential = json!({ "handle": key, "placement": { "query": "api_key" } });
    // The plugin's own value of the parameter is dropped, the rest of its
    // query kept as written.
    let v = f
        .egress(json!({ "url": "https://echo.provider.test/keyed?q=a%20b&api_key=mine", "credential": credential }))
        .await;
    let text = v.to_string();
    assert_eq!(v["ok"]["status"], 200, "{v}");
    assert!(!text.contains(&canary), "the key reached the plugin: {text}");
    let body: Value = serde_json::from_str(v["ok"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["keys"], json!(["[REDACTED]"]), "one key went out, the host's: {body}");
    assert!(body["query"].as_str().unwrap().starts_with("q=a%20b&api_key="), "{body}");
    let sent = heard_with(&canary);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0].starts_with("echo.provider.test /keyed?q=a%20b&api_key=") && !sent[0].contains("mine"), "{sent:?}");
    // The Link header leads on, redacted; the header that only echoed the
    // key is withheld.
    let headers: Vec<(String, String)> = serde_json::from_value(v["ok"]["headers"].clone()).unwrap();
    let link = headers.iter().find(|(n, _)| n == "link").map(|(_, v)| v.clone()).expect("the link is kept");
    assert!(link.contains("api_key=[REDACTED]") && !link.contains(&canary), "{link}");
    assert!(!headers.iter().any(|(n, _)| n == "x-echo-key"), "{headers:?}");

    // Following the next link as it came works: the host sets the key again.
    let next = body["next"].as_str().unwrap().to_owned();
    assert!(next.contains("[REDACTED]"), "{next}");
    let v = f.egress(json!({ "url": next, "credential": credential })).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    assert_eq!(heard_with(&canary).len(), 2, "the second page was asked with the key");

    // A link to another allowed host: the credential is not bound there,
    // and without it the host sends what the plugin has, the redaction.
    let elsewhere = body["elsewhere"].as_str().unwrap().to_owned();
    let v = f.egress(json!({ "url": elsewhere, "credential": credential })).await;
    assert_eq!(v["error"]["kind"], "credential-unavailable", "{v}");
    let v = f.egress(json!({ "url": elsewhere })).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    assert!(heard_with(&canary).iter().all(|l| l.starts_with("echo.provider.test ")), "{:?}", heard_with(&canary));

    // Nor stand its own value beside the host's in a spelling servers
    // read as the same parameter.
    let before = heard_with(&canary).len();
    for url in ["https://echo.provider.test/keyed?API_KEY=mine", "https://echo.provider.test/keyed?q=1;api_key=mine"] {
        let v = f.egress(json!({ "url": url, "credential": credential })).await;
        assert!(denied_rule(&v).contains("names query parameter api_key another way"), "{url}: {v}");
    }
    assert_eq!(heard_with(&canary).len(), before, "nothing went out");

    // The plugin cannot move the key: not to another parameter, not to a
    // header, not to the bearer token.
    for placement in [json!({ "query": "token" }), json!({ "header": "x-api-key" }), json!("bearer")] {
        let v = f
            .egress(json!({ "url": "https://echo.provider.test/keyed", "credential": { "handle": key, "placement": placement } }))
            .await;
        assert!(denied_rule(&v).contains("in query parameter api_key"), "{placement}: {v}");
    }
    assert_eq!(heard_with(&canary).len(), 2, "nothing more went out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_never_carries_a_query_credential_to_another_host() {
    let f = fixture().await;
    let canary = format!("rk{}", uuid::Uuid::new_v4().simple());
    let key = f.credential_of("secret", None, json!({ "query_parameter": "api_key" }), &canary).await;
    let credential = json!({ "handle": key, "placement": { "query": "api_key" } });
    // Home: followed, with the key set again (once).
    let v =
        f.egress(json!({ "url": "https://echo.provider.test/keyed-redirect/home", "credential": credential })).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    let body: Value = serde_json::from_str(v["ok"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["keys"], json!(["[REDACTED]"]), "{body}");
    assert!(heard_with(&canary).iter().any(|l| l.starts_with("echo.provider.test /keyed?page=3&api_key=")));
    // Away, the key echoed in its parameter: followed without it.
    let v =
        f.egress(json!({ "url": "https://echo.provider.test/keyed-redirect/away", "credential": credential })).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    // Away, the key echoed in another parameter: refused.
    let v =
        f.egress(json!({ "url": "https://echo.provider.test/keyed-redirect/leak", "credential": credential })).await;
    assert!(denied_rule(&v).contains("carries the credential's secret"), "{v}");
    assert!(!v.to_string().contains(&canary), "{v}");
    let reached = heard_with(&canary);
    assert!(reached.iter().all(|l| l.starts_with("echo.provider.test ")), "the key left its host: {reached:?}");
    assert_eq!(reached.len(), 4, "three first requests and the home redirect's target: {reached:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_credential_is_set_in_json_and_forms_and_never_follows_a_redirect_away() {
    let f = fixture().await;
    let canary = format!("bk{}", uuid::Uuid::new_v4().simple());
    let key = f.credential_of("secret", None, json!({ "body_field": "/auth/password" }), &canary).await;
    let credential = json!({ "handle": key, "placement": { "body": "/auth/password" } });
    let json_post = |url: &str, body: &str, content_type: &str| json!({ "method": "POST", "url": url, "headers": [["content-type", content_type]], "body": body, "credential": credential });
    let v = f
        .egress(json_post(
            "https://echo.provider.test/body",
            r#"{"user":"me","auth":{"password":"guess"}}"#,
            "application/json",
        ))
        .await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    assert!(!v.to_string().contains(&canary), "{v}");
    let received: Value = serde_json::from_str(
        serde_json::from_str::<Value>(v["ok"]["body"].as_str().unwrap()).unwrap()["received"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(received, json!({ "user": "me", "auth": { "password": "[REDACTED]" } }), "the echo, scrubbed");
    assert_eq!(heard_with(&canary).len(), 1);

    // A form, for a credential stored for a plain field.
    let field = f.credential_of("secret", None, json!({ "body_field": "password" }), &canary).await;
    let v = f
        .egress(json!({ "method": "POST", "url": "https://echo.provider.test/body",
            "headers": [["content-type", "application/x-www-form-urlencoded"]], "body": "user=me&password=guess",
            "credential": { "handle": field, "placement": { "body": "password" } } }))
        .await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    let sent = heard_with(&canary);
    assert!(sent.last().unwrap().ends_with(&format!("user=me&password={canary}")), "{sent:?}");

    // A body the host cannot place it in is refused before anything goes out.
    for (body, content_type) in [("password", "text/plain"), ("[1, 2]", "application/json")] {
        let v = f.egress(json_post("https://echo.provider.test/body", body, content_type)).await;
        assert_eq!(v["error"]["kind"], "invalid-request", "{content_type}: {v}");
        assert!(!v.to_string().contains(&canary), "{v}");
    }
    // A 307 to another allowed host resends the plugin's body, not the
    // host's.
    let before = heard_with(&canary).len();
    let v = f.egress(json_post("https://echo.provider.test/body-redirect", r#"{"auth":{}}"#, "application/json")).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    let sent = heard_with(&canary);
    assert_eq!(sent.len(), before + 1, "only the first hop had it: {sent:?}");
    assert!(sent.iter().all(|l| l.starts_with("echo.provider.test ")), "{sent:?}");
    assert!(
        HEARD
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("api.provider.test /body ") && l.ends_with(r#"{"auth":{}}"#))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signing_credential_signs_the_request_sent_and_its_key_goes_nowhere() {
    let f = fixture().await;
    let recipe = json!({ "algorithm": "hmac-sha256", "header": "X-Signature", "prefix": "v1=",
        "timestamp_header": "X-Timestamp", "parts": ["timestamp", "method", "path", "body_sha256"] });
    let key = f.credential_of("secret", None, json!({ "signing": recipe }), SIGNING_KEY).await;
    let credential = json!({ "handle": key, "placement": "as-stored" });
    // Signed as sent: the provider verifies it; a signature the plugin
    // wrote itself is dropped, not sent beside the host's.
    for (method, body) in [("GET", None), ("POST", Some(r#"{"order":1}"#))] {
        let mut request = json!({ "method": method, "url": "https://echo.provider.test/signed?page=2",
            "headers": [["x-signature", "v1=forged"], ["content-type", "application/json"]], "credential": credential });
        if let Some(body) = body {
            request["body"] = json!(body);
        }
        let v = f.egress(request).await;
        assert_eq!(v["ok"]["status"], 200, "{method}: {v}");
        assert!(!v.to_string().contains(SIGNING_KEY), "{v}");
        assert!(!v.to_string().contains("forged"), "{v}");
        // Its echo is scrubbed: the plugin cannot send it again itself.
        let body: Value = serde_json::from_str(v["ok"]["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["signatures"], json!(["[REDACTED]"]), "{method}: {body}");
    }
    // The key itself went out in no request.
    assert!(heard_with(SIGNING_KEY).is_empty(), "{:?}", heard_with(SIGNING_KEY));
    // The plugin cannot take the key as a header instead.
    let v = f
        .egress(json!({ "url": "https://echo.provider.test/signed", "credential": { "handle": key, "placement": { "header": "x-signature" } } }))
        .await;
    assert!(denied_rule(&v).contains("as a signature in header X-Signature"), "{v}");
    // Nor have another host's request signed.
    let v = f.egress(json!({ "url": "https://api.provider.test/signed", "credential": credential })).await;
    assert_eq!(v["error"]["kind"], "credential-unavailable", "{v}");
    // A recipe that would steer the request is refused when stored.
    let bad = f
        .srv
        .post(
            "/v1/credentials",
            json!({ "kind": "secret", "hosts": ["echo.provider.test"], "secret": SIGNING_KEY,
            "signing": { "algorithm": "hmac-sha256", "header": "Authorization", "parts": ["body"] } }),
        )
        .send()
        .await
        .unwrap();
    let e = expect_error(bad, 400, "VALIDATION_FAILED").await;
    assert!(e.to_string().contains("signing.header") && !e.to_string().contains(SIGNING_KEY), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_traded_for_a_token_send_only_the_token_and_trade_again_when_refused() {
    use base64::Engine;
    let f = fixture().await;
    let create = |extra: Value, secret: &str| {
        let mut body = json!({ "kind": "secret", "hosts": ["echo.provider.test"], "secret": secret });
        body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap());
        f.srv.post("/v1/credentials", body).send()
    };
    let token_url = "https://echo.provider.test/oauth/token";
    let protected = |handle: &str| json!({ "url": "https://echo.provider.test/protected", "credential": { "handle": handle, "placement": "as-stored" } });
    let token_requests = |grant: &str| heard_with("/oauth/token").iter().filter(|l| l.contains(grant)).count();

    // Client credentials: one token for many requests; the client secret
    // goes to the token endpoint only; the plugin sees neither.
    let cc = json_ok(
        create(
            json!({ "exchange": { "grant": "client_credentials", "token_url": token_url, "client_id": "app" } }),
            CLIENT_SECRET,
        )
        .await
        .unwrap(),
    )
    .await;
    let cc = cc["data"]["credential_handle"].as_str().unwrap().to_owned();
    let before = token_requests("client_credentials");
    for _ in 0..5 {
        let v = f.egress(protected(&cc)).await;
        assert_eq!(v["ok"]["status"], 200, "{v}");
        let body: Value = serde_json::from_str(v["ok"]["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["token"], "[REDACTED]", "the token's echo is scrubbed: {body}");
    }
    assert_eq!(token_requests("client_credentials"), before + 1, "one token for five requests");
    assert!(heard_with(CLIENT_SECRET).iter().all(|l| l.contains(" /oauth/token")), "{:?}", heard_with(CLIENT_SECRET));
    // The provider revokes it: the next request is refused once, traded
    // again and sent again, and the plugin only sees the answer.
    {
        let mut tokens = TOKENS.lock().unwrap();
        let all: Vec<String> = tokens.0.iter().filter(|t| t.starts_with("client_credentials-")).cloned().collect();
        tokens.1.extend(all);
    }
    let v = f.egress(protected(&cc)).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    assert_eq!(token_requests("client_credentials"), before + 2, "traded again after the 401");

    // JWT bearer: an ES256 assertion signed with the stored key.
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 =
        ring::signature::EcdsaKeyPair::generate_pkcs8(&ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        pkcs8.as_ref(),
        &rng,
    )
    .unwrap();
    *JWT_PUBLIC.lock().unwrap() = ring::signature::KeyPair::public_key(&pair).as_ref().to_vec();
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
    );
    let jwt = json_ok(
        create(json!({ "exchange": { "grant": "jwt_bearer", "token_url": token_url, "issuer": "svc@example.test", "algorithm": "ES256" } }), &pem)
            .await
            .unwrap(),
    )
    .await;
    let jwt = jwt["data"]["credential_handle"].as_str().unwrap().to_owned();
    let v = f.egress(protected(&jwt)).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    let key_line = pem.lines().nth(1).unwrap();
    assert!(heard_with(&key_line[..40]).is_empty(), "the private key went nowhere");

    // A login: the session token in a header of the recipe's choosing.
    let login = json_ok(
        create(
            json!({ "exchange": { "grant": "login", "token_url": "https://echo.provider.test/login", "username": "me",
                "username_field": "user", "password_field": "pass", "token_pointer": "/session/id", "header": "X-Session" } }),
            LOGIN_PASSWORD,
        )
        .await
        .unwrap(),
    )
    .await;
    let login = login["data"]["credential_handle"].as_str().unwrap().to_owned();
    let v = f.egress(protected(&login)).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    assert!(heard_with(LOGIN_PASSWORD).iter().all(|l| l.contains(" /login ")), "{:?}", heard_with(LOGIN_PASSWORD));
    for v in [f.egress(protected(&cc)).await, f.egress(protected(&jwt)).await, f.egress(protected(&login)).await] {
        let text = v.to_string();
        assert!(
            !text.contains(CLIENT_SECRET) && !text.contains(LOGIN_PASSWORD) && !text.contains(&key_line[..40]),
            "{text}"
        );
    }

    // Refused when stored: a token endpoint off the credential's hosts, a
    // key that is no key, a wrong client secret (a named failure, later).
    for (extra, secret, says) in [
        (
            json!({ "exchange": { "grant": "client_credentials", "token_url": "https://api.provider.test/oauth/token", "client_id": "app" } }),
            CLIENT_SECRET,
            "not among the credential's hosts",
        ),
        (
            json!({ "exchange": { "grant": "jwt_bearer", "token_url": token_url, "issuer": "x", "algorithm": "ES256" } }),
            "not-a-key-at-all",
            "PKCS#8",
        ),
        (json!({ "exchange": { "grant": "password", "token_url": token_url } }), CLIENT_SECRET, "not a token exchange"),
    ] {
        let e = expect_error(create(extra, secret).await.unwrap(), 400, "VALIDATION_FAILED").await;
        assert!(e.to_string().contains(says) && !e.to_string().contains(secret), "{e}");
    }
    let wrong = json_ok(
        create(
            json!({ "exchange": { "grant": "client_credentials", "token_url": token_url, "client_id": "app" } }),
            "wrong-secret-value",
        )
        .await
        .unwrap(),
    )
    .await;
    let v = f.egress(protected(wrong["data"]["credential_handle"].as_str().unwrap())).await;
    assert_eq!(v["error"]["kind"], "credential-unavailable", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("token exchange") && message.contains("invalid_client"), "{message}");
    assert!(!message.contains("wrong-secret-value"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_file_cannot_take_over_a_connector_id_or_alias() {
    let srv = TestServer::start(Backend::Sqlite).await.unwrap();
    let dir = srv.state.config.plugins.plugins_dir.clone();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(test_plugin("test_impostor_id"), dir.join("impostor.wasm")).unwrap();
    std::fs::copy(test_plugin("test_impostor_alias"), dir.join("alias.wasm")).unwrap();
    srv.state.plugins.scan_dir().await;
    let real = json_ok(srv.get("/v1/connectors/conn_emailcampaign_edm").send().await.unwrap()).await;
    assert_ne!(real["data"]["name"], "Not the email-campaign connector", "{real}");
    assert_eq!(real["data"]["status"], "available");
    let aliased = json_ok(srv.get("/v1/connectors/source:mailcoach").send().await.unwrap()).await;
    assert_eq!(aliased["data"]["connector_id"], "conn_emailcampaign_edm", "saved aliases keep their connector");
    expect_error(srv.get("/v1/connectors/test_impostor_alias").send().await.unwrap(), 404, "404").await;

    // Not even while the operator has the bundled connector unloaded.
    json_ok(srv.post("/v1/admin/plugins/conn_emailcampaign_edm/unload", json!({})).send().await.unwrap()).await;
    std::fs::remove_file(dir.join("impostor.wasm")).unwrap();
    srv.state.plugins.scan_dir().await;
    std::fs::copy(test_plugin("test_impostor_id"), dir.join("impostor-again.wasm")).unwrap();
    srv.state.plugins.scan_dir().await;
    let c = json_ok(srv.get("/v1/connectors/conn_emailcampaign_edm").send().await.unwrap()).await;
    assert_ne!(c["data"]["name"], "Not the email-campaign connector", "{c}");
    assert_eq!(c["data"]["status"], "unavailable");
    json_ok(srv.post("/v1/admin/plugins/conn_emailcampaign_edm/load", json!({})).send().await.unwrap()).await;
    let c = json_ok(srv.get("/v1/connectors/conn_emailcampaign_edm").send().await.unwrap()).await;
    assert!(c["data"]["operations"].as_array().unwrap().contains(&json!("preview")), "the real one is back: {c}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compiled_artefact_someone_else_wrote_is_never_loaded() {
    // Installations of their own: each its own key file and cache.
    let own = |c: &mut service::config::ServerConfig| {
        c.master_key = None;
        c.plugins.compile_cache_dir = c.data_dir.join("plugin-cache");
    };
    // Another installation compiles the no-op plugin: its artefact is a
    // valid one, authenticated with that installation's key.
    let other = TestServer::start_with(Backend::Sqlite, own).await.unwrap();
    let noop = test_plugin("test_noop");
    other.state.plugins.load_bytes(&std::fs::read(&noop).unwrap(), PluginSource::File(noop)).await.unwrap();
    let plugins = json_ok(other.get("/v1/admin/plugins").send().await.unwrap()).await;
    let digest_of = |id: &str| {
        plugins["data"]["items"].as_array().unwrap().iter().find(|p| p["connector_id"] == id).unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (noop_digest, email_digest) = (digest_of("test_noop"), digest_of("conn_emailcampaign_edm"));
    let cached = |dir: &std::path::Path, digest: &str| {
        std::fs::read_dir(dir.join("plugin-cache"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(digest))
            .unwrap()
    };
    let foreign = std::fs::read(cached(&other.data_dir, &noop_digest)).unwrap();
    other.stop().await;

    // Someone who can write to this installation's cache puts it in place
    // of the email-campaign connector's artefact.
    let srv = TestServer::start_with(Backend::Sqlite, own).await.unwrap();
    let dir = srv.stop_keeping_data().await;
    let target = cached(dir.path(), &email_digest);
    std::fs::write(&target, &foreign).unwrap();
    let url = format!("sqlite://{}/service.db?mode=rwc", dir.path().display());
    let path = dir.path().to_owned();
    let srv = TestServer::start_with(Backend::Sqlite, move |c| {
        c.data_dir = path.clone();
        c.database_url = url;
        c.plugins.plugins_dir = path.join("plugins");
        own(c);
    })
    .await
    .unwrap();
    let c = json_ok(srv.get("/v1/connectors/conn_emailcampaign_edm").send().await.unwrap()).await;
    assert!(
        c["data"]["operations"].as_array().unwrap().contains(&json!("preview")),
        "compiled anew from its own component: {c}"
    );
    expect_error(srv.get("/v1/connectors/test_noop").send().await.unwrap(), 404, "404").await;
    assert_ne!(std::fs::read(&target).unwrap(), foreign, "the forged artefact was replaced");
    srv.stop().await;
    drop(dir);
}

/// Requests a 1.1.0 plugin starts ahead (`http-ahead`) are policed exactly
/// like sent ones: the egress policy refuses what it refuses for `send`
/// (nothing reaches the provider), the host injects the credential and
/// scrubs its echo, at most the advertised number are pending at once, and
/// a dropped request stops counting and is not waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_started_ahead_are_policed_like_sent_ones() {
    let f = fixture().await;
    let id = f.srv.load_test_plugin("test_ahead").await;
    let ahead = f.srv.state.plugins.available(&id).await.unwrap();
    assert_eq!(ahead.version, service::plugin::InterfaceVersion::V1_1_0);
    assert_eq!(f.plugin.version, service::plugin::InterfaceVersion::V1_3_0, "1.3.0 plugins load beside it");
    // A plugin of the newest SDK that sends nothing imports nothing newer
    // than 1.0.0, and loads as a 1.0.0 plugin.
    let noop = f.srv.load_test_plugin("test_noop").await;
    let noop = f.srv.state.plugins.available(&noop).await.unwrap();
    assert_eq!(noop.version, service::plugin::InterfaceVersion::V1_0_0, "1.0.0 plugins load beside both");
    let preview = |config: Value| {
        let (srv, ahead, ws) = (&f.srv, ahead.clone(), f.workspace_id.clone());
        async move { srv.state.plugins.runtime().preview(&ahead, &ws, &srv.state.egress, &config.to_string()).await }
    };

    let canary = format!("canary-{}", uuid::Uuid::new_v4().simple());
    let handle = f.credential(&f.workspace_id, &["echo.provider.test"], &canary).await;
    let before = f.provider.hits();
    let v = preview(json!({ "requests": [
        { "url": "https://api.provider.test/ok" },
        { "url": "https://redirect.provider.test/ok" },
        { "url": "https://echo.provider.test/echo", "credential": handle },
        { "url": "https://127.0.0.1/" },
        { "url": "https://api.provider.test/ok" },
    ] }))
    .await
    .unwrap();
    assert_eq!(v["max"], 4, "{v}");
    let r = &v["results"];
    assert_eq!(r[0]["status"], 200, "{v}");
    assert_eq!(r[0]["body"], "fine");
    assert_eq!(r[1]["error"]["kind"], "denied", "a host the plugin did not declare: {v}");
    assert!(r[1]["error"]["message"].as_str().unwrap().contains("not among the hosts the connector declared"), "{v}");
    assert_eq!(r[2]["status"], 200, "{v}");
    let echoed = r[2]["body"].as_str().unwrap();
    assert!(
        echoed.contains("[REDACTED]") && !v.to_string().contains(&canary),
        "the host injected the secret and scrubbed its echo: {v}"
    );
    assert_eq!(r[3]["error"]["kind"], "denied", "{v}");
    assert!(r[3]["error"]["message"].as_str().unwrap().contains("IP-literal"), "{v}");
    assert_eq!(r[4]["refused"]["kind"], "denied", "a fifth pending request: {v}");
    assert!(r[4]["refused"]["message"].as_str().unwrap().contains("at most 4"), "{v}");
    assert_eq!(f.provider.hits(), before + 2, "only the two allowed requests reached the provider");

    // Four requests that would take 10 s each, dropped, then four more: the
    // second round is accepted (dropped ones stopped counting) and the call
    // ends within its 3 s wall clock (nothing waited for them).
    let slow = json!({ "url": "https://api.provider.test/slow" });
    let v = preview(json!({ "requests": [slow, slow, slow, slow], "finish": false }))
        .await
        .expect("dropped requests are not waited for");
    let dropped = v["results"].as_array().unwrap();
    assert_eq!(dropped.len(), 8, "{v}");
    assert!(dropped.iter().all(|d| d["dropped"] == true), "{v}");
    f.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_echo_never_carries_the_secret_to_the_plugin() {
    let f = fixture().await;
    let canary = format!("canary-{}", uuid::Uuid::new_v4().simple());
    let handle = f.credential(&f.workspace_id, &["echo.provider.test"], &canary).await;
    let credential = json!({ "handle": handle, "placement": "bearer" });
    for coding in testkit::codings::ALL {
        let v = f
            .egress(json!({
                "url": format!("https://echo.provider.test/coded/{coding}"),
                "headers": [["Accept-Encoding", coding], ["TE", "gzip"]],
                "credential": credential,
            }))
            .await;
        let text = v.to_string();
        assert!(!text.contains(&canary), "{coding}: the secret reached the plugin: {text}");
        let ok = &v["ok"];
        assert_eq!(ok["status"], 200, "{coding}: {v}");
        // Whatever the plugin does with the bytes, no decoding of them
        // holds the secret.
        let bytes = match ok["body_hex"].as_str() {
            Some(h) => hex::decode(h).unwrap(),
            None => ok["body"].as_str().unwrap().as_bytes().to_vec(),
        };
        assert!(!testkit::codings::holds(&bytes, canary.as_bytes()), "{coding}: {bytes:?}");
        // It gets the answer decoded and scrubbed, told at its own length.
        let body: Value = serde_json::from_slice(&bytes).expect("a decoded JSON body");
        assert_eq!(body["authorization"], "Bearer [REDACTED]", "{coding}: {body}");
        assert_eq!(body["accept_encoding"], "identity", "the host asked for no coding: {body}");
        assert_eq!(body["te"], Value::Null, "the plugin's TE was dropped: {body}");
        let headers: Vec<(String, String)> = serde_json::from_value(ok["headers"].clone()).unwrap();
        assert!(!headers.iter().any(|(n, _)| n == "content-encoding"), "{coding}: {headers:?}");
        assert!(!headers.iter().any(|(n, _)| n == "x-echo-authorization"), "the header echo is withheld: {headers:?}");
        let length = headers.iter().find(|(n, _)| n == "content-length").map(|(_, v)| v.clone());
        assert_eq!(length, Some(bytes.len().to_string()), "{coding}: the scrubbed body's length");
    }

    // A coding the host cannot undo is refused, by name.
    let v = f.egress(json!({ "url": "https://echo.provider.test/coded/compress", "credential": credential })).await;
    let rule = denied_rule(&v);
    assert!(rule.contains("\"compress\"") && rule.contains("cannot decode"), "{rule}");
    assert!(!v.to_string().contains(&canary), "{v}");
    // An answer with no body says a coding of nothing: handed on empty.
    let v = f
        .egress(json!({ "url": "https://echo.provider.test/coded/gzip", "headers": [["x-empty", "1"]], "credential": credential }))
        .await;
    assert_eq!(v["ok"]["status"], 204, "{v}");
    // A small answer that decodes past the size limit is refused like a
    // large one.
    let v = f
        .egress(json!({
            "url": "https://echo.provider.test/coded/gzip",
            "headers": [["x-bomb", (RESPONSE_LIMIT * 4).to_string()]],
            "credential": credential,
        }))
        .await;
    assert_eq!(v["error"]["kind"], "response-too-large", "{v}");

    // Without a credential nothing needs scrubbing: the plugin's own
    // Accept-Encoding goes out, and the coded answer comes back as sent.
    let v = f
        .egress(json!({ "url": "https://echo.provider.test/coded/gzip", "headers": [["Accept-Encoding", "gzip"]] }))
        .await;
    let bytes = hex::decode(v["ok"]["body_hex"].as_str().expect("compressed bytes")).unwrap();
    let plain: Value = serde_json::from_slice(&testkit::codings::every_decoding(&bytes)[1]).unwrap();
    assert_eq!(plain["accept_encoding"], "gzip", "{plain}");
    f.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_two_credentials_gets_each_in_its_place_and_neither_back() {
    let f = fixture().await;
    let key = format!("ak{}", uuid::Uuid::new_v4().simple());
    let app = format!("pk{}", uuid::Uuid::new_v4().simple());
    let api_key = f.credential_of("secret", None, json!({ "header": "x-api-key" }), &key).await;
    let app_key = f.credential_of("secret", None, json!({ "header": "x-app-key" }), &app).await;
    let two = |credentials: Value| json!({ "method": "GET", "url": "https://echo.provider.test/echo", "credentials": credentials });
    let header = |handle: &str, name: &str| json!({ "handle": handle, "placement": { "header": name } });

    // Both go out, each in its header; the provider's echo of both is
    // scrubbed, in the body and in its headers.
    let v = f.egress(two(json!([header(&api_key, "x-api-key"), header(&app_key, "x-app-key")]))).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    let text = v.to_string();
    assert!(!text.contains(&key) && !text.contains(&app), "a secret reached the plugin: {text}");
    let body: Value = serde_json::from_str(v["ok"]["body"].as_str().unwrap()).unwrap();
    let sent: Vec<(String, String)> = serde_json::from_value(body["headers"].clone()).unwrap();
    for name in ["x-api-key", "x-app-key"] {
        assert!(sent.contains(&(name.to_owned(), "[REDACTED]".to_owned())), "{name} went out: {sent:?}");
    }
    assert_eq!(
        f.srv.state.plugins.available("test_misbehaving").await.unwrap().version,
        service::plugin::InterfaceVersion::V1_3_0,
        "a plugin that names several credentials is a 1.3.0 plugin"
    );

    // A secret that is a prefix of another, named first: the echo of the
    // longer one is scrubbed whole, not cut after the prefix.
    let short = f.credential_of("secret", None, json!({ "header": "x-short" }), &key[..12]).await;
    let long = f.credential_of("secret", None, json!({ "header": "x-long" }), &key).await;
    let v = f.egress(two(json!([header(&short, "x-short"), header(&long, "x-long")]))).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    assert!(!v.to_string().contains(&key[12..]), "the rest of the longer secret reached the plugin: {v}");

    // Each is still placed only where its record says.
    let v = f.egress(two(json!([header(&api_key, "x-api-key"), header(&app_key, "x-other")]))).await;
    assert!(denied_rule(&v).contains("in header x-app-key"), "{v}");

    // Two credentials for one header: refused, nothing sent.
    let also_api = f.credential_of("secret", None, json!({ "header": "x-api-key" }), &format!("{app}2")).await;
    let v = f.egress(two(json!([header(&api_key, "x-api-key"), header(&also_api, "x-api-key")]))).await;
    assert_eq!(v["error"]["kind"], "invalid-request", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("a place of its own"), "{v}");
    // A bearer token beside HTTP Basic: both are `Authorization`.
    let bearer = f.credential(&f.workspace_id, &["echo.provider.test"], &format!("{key}b")).await;
    let basic = f.credential_of("basic", None, json!({ "username": "bob" }), &format!("{app}b")).await;
    let v = f
        .egress(two(
            json!([{ "handle": bearer, "placement": "bearer" }, { "handle": basic, "placement": { "basic": "bob" } }]),
        ))
        .await;
    assert_eq!(v["error"]["kind"], "invalid-request", "{v}");
    // One handle twice.
    let v = f.egress(two(json!([header(&api_key, "x-api-key"), header(&api_key, "x-api-key")]))).await;
    assert_eq!(v["error"]["kind"], "invalid-request", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("twice"), "{v}");
    // More than eight.
    let many: Vec<Value> = (0..9).map(|i| header(&format!("h{i}"), &format!("x-k{i}"))).collect();
    let v = f.egress(two(json!(many))).await;
    assert_eq!(v["error"]["kind"], "invalid-request", "{v}");

    // A second credential bound to another host, or of another
    // workspace: the request is refused whole (the first secret does not
    // go out alone either).
    let elsewhere = f.credential(&f.workspace_id, &["api.provider.test"], &format!("{key}e")).await;
    let v = f.egress(two(json!([header(&api_key, "x-api-key"), { "handle": elsewhere, "placement": "bearer" }]))).await;
    assert_eq!(v["error"]["kind"], "credential-unavailable", "{v}");
    let (other_ws, _) = f.srv.other_workspace().await;
    let foreign = f.credential(&other_ws, &["echo.provider.test"], &format!("{key}f")).await;
    let v = f.egress(two(json!([header(&api_key, "x-api-key"), { "handle": foreign, "placement": "bearer" }]))).await;
    assert_eq!(v["error"]["kind"], "credential-unavailable", "{v}");

    // A query parameter and a header together: each set by the host.
    let query = f.credential_of("secret", None, json!({ "query_parameter": "api_key" }), &format!("{key}q")).await;
    let v = f
        .egress(json!({ "url": "https://echo.provider.test/keyed?api_key=mine", "credentials": [
            { "handle": query, "placement": { "query": "api_key" } }, header(&app_key, "x-app-key")] }))
        .await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    let body: Value = serde_json::from_str(v["ok"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["keys"], json!(["[REDACTED]"]), "one key went out, the host's: {body}");
    let heard = heard_with(&format!("{key}q"));
    assert_eq!(heard.len(), 1, "{heard:?}");
    assert!(!v.to_string().contains(&format!("{key}q")));
}
