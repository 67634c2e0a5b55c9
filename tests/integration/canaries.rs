//! A canary per placement, stored only in OpenBao, through the bundled
//! REST manifest source and the public API, into an SQLite warehouse:
//! a key in a header, in the query, in a JSON body field; a signing key;
//! a client secret, a JWT private key and a password each traded for a
//! token. The fake provider checks each the way its API would and echoes
//! whatever it receives, into the page and into the records. Then no
//! canary, and no token traded for one, may be in the control database,
//! the warehouse, any other file the server wrote, its log (debug, JSON),
//! the audit log, the job records, or the guests' linear memory (searched
//! whole at the end of every invocation by the runtime's probe, which
//! must find the records the guests did hold). A redirect to another
//! allowed host carries none of them.
//!
//! And a key rotated in OpenBao in the middle of a sync: the provider
//! refuses the old one from then on, the host reads the store again on
//! the refusal (long before the TTL) and the sync finishes with every
//! page; a provider refusing what the store still holds gets its answer
//! back, after one read.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use axum::{Json, Router};
use base64::Engine;
use serde_json::{Value, json};
use service::plugin::probe::GuestMemoryProbe;

use crate::support::openbao::{self, OpenBao};
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, count_rows, json_ok};

/// The provider's API host, the only one the credentials are bound to
/// (one the misbehaving test plugin declares, as the manifest source
/// declares any).
pub(crate) const HOST: &str = "api.provider.test";
/// Another host the operator allows and the plugins declare: a next
/// link's or a redirect's target.
const ELSEWHERE: &str = "echo.provider.test";
/// Pages of each stream, and records on each.
pub(crate) const PAGES: u64 = 3;
pub(crate) const PER_PAGE: u64 = 4;

/// The secrets, each stored only in OpenBao.
#[derive(Clone)]
pub(crate) struct Canaries {
    header: String,
    query: String,
    body: String,
    signing: String,
    client_secret: String,
    password: String,
    /// A PKCS#8 PEM (ES256), and its public key for the token endpoint.
    jwt_pem: String,
    jwt_public: Vec<u8>,
    /// Every token the token endpoints issue starts with this.
    tokens: String,
}

impl Canaries {
    pub(crate) fn new() -> Canaries {
        let c = |what: &str| format!("CANARY{what}{}", uuid::Uuid::new_v4().simple());
        let rng = ring::rand::SystemRandom::new();
        let alg = &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = ring::signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref());
        Canaries {
            header: c("header"),
            query: c("query"),
            body: c("body"),
            signing: c("signing"),
            client_secret: c("client"),
            password: c("password"),
            jwt_pem: format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n"),
            jwt_public: ring::signature::KeyPair::public_key(&pair).as_ref().to_vec(),
            tokens: c("token"),
        }
    }

    /// The secret a [`Case`] keeps under `key`.
    pub(crate) fn by_key(&self, key: &str) -> &str {
        match key {
            "header" => &self.header,
            "query" => &self.query,
            "body" => &self.body,
            "signing" => &self.signing,
            "client_secret" => &self.client_secret,
            "password" => &self.password,
            "jwt" => &self.jwt_pem,
            other => panic!("no canary is kept under {other}"),
        }
    }

    /// What may appear nowhere: each secret, the private part of the
    /// key's base64 body, and the tokens.
    pub(crate) fn needles(&self) -> Vec<(&'static str, String)> {
        let key = self.jwt_pem.lines().nth(1).unwrap();
        vec![
            ("header", self.header.clone()),
            ("query", self.query.clone()),
            ("body", self.body.clone()),
            ("signing", self.signing.clone()),
            ("client secret", self.client_secret.clone()),
            ("password", self.password.clone()),
            // Characters 48 to 90 of a P-256 PKCS#8 document in base64
            // are its private scalar (the rest: a constant header and
            // the public key).
            ("jwt private key", key[48..90].to_owned()),
            ("token", self.tokens.clone()),
        ]
    }
}

/// The fake provider: its secrets, the tokens it issued, and what the
/// other host heard.
pub(crate) struct Provider {
    pub(crate) canaries: Canaries,
    pub(crate) issued: AtomicUsize,
    pub(crate) elsewhere_heard: Mutex<Vec<String>>,
    /// Names every record, so the probe can show it saw guests' memory.
    pub(crate) control: String,
}

/// Everything a request carried, as one text.
fn heard(method: &Method, uri: &Uri, headers: &HeaderMap, body: &str) -> String {
    let mut text = format!("{method} {uri}\n");
    for (k, v) in headers {
        text.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or_default()));
    }
    text.push_str(body);
    text
}

/// Whether the request carries what `kind`'s credential puts on it.
fn admitted(p: &Provider, kind: &str, method: &Method, uri: &Uri, headers: &HeaderMap, body: &str) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let token = |value: String| value.starts_with(&p.canaries.tokens) && value.len() > p.canaries.tokens.len();
    match kind {
        "header" => header("x-api-key") == p.canaries.header,
        "query" => url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .any(|(k, v)| k == "api_key" && v == p.canaries.query.as_str()),
        "body" => {
            let sent: Value = serde_json::from_str(body).unwrap_or_default();
            sent["auth"]["password"] == p.canaries.body.as_str() && sent["query"] == "all"
        }
        "signed" => {
            use hmac::Mac;
            use sha2::Digest;
            let message = format!(
                "{}\n{}\n{}\n{}",
                header("x-timestamp"),
                method,
                uri.path_and_query().map(|p| p.as_str()).unwrap_or_default(),
                hex::encode(sha2::Sha256::digest(body.as_bytes()))
            );
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(p.canaries.signing.as_bytes()).unwrap();
            mac.update(message.as_bytes());
            header("x-signature") == format!("v1={}", hex::encode(mac.finalize().into_bytes()))
        }
        "client" | "jwt" => token(header("authorization").trim_start_matches("Bearer ").to_owned()),
        "login" => token(header("x-session")),
        _ => false,
    }
}

/// A page of `kind`'s records, each holding what the request carried
/// (its URL, the credential's header, its body): the echo the host must
/// scrub before the connector, and so the warehouse, sees it.
async fn items(
    State(p): State<Arc<Provider>>,
    Path(kind): Path<String>,
    Query(query): Query<std::collections::HashMap<String, String>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: String,
) -> Response {
    let everything = heard(&method, &uri, &headers, &body);
    if !admitted(&p, &kind, &method, &uri, &headers, &body) {
        return (StatusCode::UNAUTHORIZED, Json(json!({ "error": "unauthorized", "heard": everything })))
            .into_response();
    }
    let page: u64 = query.get("page").and_then(|v| v.parse().ok()).unwrap_or(1);
    let seen = ["x-api-key", "authorization", "x-session", "x-signature"]
        .iter()
        .filter_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()))
        .collect::<Vec<_>>()
        .join(" ");
    let records: Vec<Value> = (1..=PER_PAGE)
        .map(|i| {
            let id = (page - 1) * PER_PAGE + i;
            json!({ "id": id, "name": format!("{}-{kind}-{id}", p.control), "url": uri.to_string(), "seen": seen, "body": body })
        })
        .collect();
    Json(json!({ "data": records, "meta": { "total_pages": PAGES }, "heard": everything })).into_response()
}

/// The token endpoints: client credentials and JWT bearer (RFC 7523,
/// ES256 checked with the public key), and a JSON login.
async fn token(State(p): State<Arc<Provider>>, uri: Uri, body: String) -> Response {
    let issue = || format!("{}{}", p.canaries.tokens, p.issued.fetch_add(1, Ordering::SeqCst));
    if uri.path() == "/login" {
        let login: Value = serde_json::from_str(&body).unwrap_or_default();
        if login != json!({ "user": "me", "pass": p.canaries.password }) {
            return (StatusCode::UNAUTHORIZED, Json(json!({ "error": "bad_login", "heard": body }))).into_response();
        }
        return Json(json!({ "session": { "id": issue() } })).into_response();
    }
    let form: std::collections::HashMap<String, String> =
        url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    let good = match form.get("grant_type").map(String::as_str) {
        Some("client_credentials") => {
            form.get("client_id").map(String::as_str) == Some("app")
                && form.get("client_secret") == Some(&p.canaries.client_secret)
        }
        Some("urn:ietf:params:oauth:grant-type:jwt-bearer") => form.get("assertion").is_some_and(|jwt| {
            let Some((input, signature)) = jwt.rsplit_once('.') else { return false };
            let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
            ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &p.canaries.jwt_public)
                .verify(input.as_bytes(), &b64.decode(signature).unwrap_or_default())
                .is_ok()
        }),
        _ => false,
    };
    if !good {
        return (StatusCode::UNAUTHORIZED, Json(json!({ "error": "invalid_client", "heard": body }))).into_response();
    }
    Json(json!({ "access_token": issue(), "token_type": "Bearer", "expires_in": 3600 })).into_response()
}

pub(crate) fn provider(p: Arc<Provider>) -> Router {
    Router::new()
        .route("/{kind}/items", any(items))
        // To another allowed host, keeping the method and body (307).
        .route(
            "/{kind}/away",
            any(|Path(kind): Path<String>| async move {
                (StatusCode::TEMPORARY_REDIRECT, [("location", format!("https://{ELSEWHERE}/{kind}/items?page=1"))])
                    .into_response()
            }),
        )
        .route("/oauth/token", post(token))
        .route("/login", post(token))
        .with_state(p)
}

/// The other host: answers anything with one record, and keeps what it
/// heard.
fn elsewhere(p: Arc<Provider>) -> Router {
    Router::new()
        .fallback(any(
            |State(p): State<Arc<Provider>>, method: Method, uri: Uri, headers: HeaderMap, body: String| async move {
                p.elsewhere_heard.lock().unwrap().push(heard(&method, &uri, &headers, &body));
                Json(json!({ "data": [{ "id": 1, "name": "mirrored" }], "meta": { "total_pages": 1 } }))
            },
        ))
        .with_state(p)
}

/// A placement: the credential's fields beside the reference, and the
/// manifest's `credential_placement`.
pub(crate) struct Case {
    pub(crate) kind: &'static str,
    /// The key of the OpenBao secret holding the canary.
    pub(crate) key: &'static str,
    pub(crate) fields: Value,
    pub(crate) placement: &'static str,
}

pub(crate) fn cases() -> Vec<Case> {
    let token_url = format!("https://{HOST}/oauth/token");
    vec![
        Case { kind: "header", key: "header", fields: json!({ "header": "X-Api-Key" }), placement: "header:X-Api-Key" },
        Case {
            kind: "query",
            key: "query",
            fields: json!({ "query_parameter": "api_key" }),
            placement: "query:api_key",
        },
        Case { kind: "body", key: "body", fields: json!({ "body_field": "/auth/password" }), placement: "as-stored" },
        Case {
            kind: "signed",
            key: "signing",
            fields: json!({ "signing": { "algorithm": "hmac-sha256", "header": "X-Signature", "prefix": "v1=",
                "timestamp_header": "X-Timestamp", "parts": ["timestamp", "method", "path", "body_sha256"], "encoding": "hex" } }),
            placement: "as-stored",
        },
        Case {
            kind: "client",
            key: "client_secret",
            fields: json!({ "exchange": { "grant": "client_credentials", "token_url": token_url, "client_id": "app" } }),
            placement: "as-stored",
        },
        Case {
            kind: "jwt",
            key: "jwt",
            fields: json!({ "exchange": { "grant": "jwt_bearer", "token_url": token_url, "issuer": "svc@example.test", "algorithm": "ES256" } }),
            placement: "as-stored",
        },
        Case {
            kind: "login",
            key: "password",
            fields: json!({ "exchange": { "grant": "login", "token_url": format!("https://{HOST}/login"), "username": "me",
                "username_field": "user", "password_field": "pass", "token_pointer": "/session/id", "header": "X-Session" } }),
            placement: "as-stored",
        },
    ]
}

/// OpenBao holding every canary (under `path`, a key per [`Case`]), the
/// provider on [`HOST`], the other host on [`ELSEWHERE`], and a server
/// reaching all three (its guests' memories allocated by `memories`).
struct Fixture {
    srv: TestServer,
    p: Arc<Provider>,
    /// The OpenBao path of the canaries.
    path: String,
    ws: String,
    _bao: OpenBao,
    _api: FakeProvider,
    _mirror: FakeProvider,
}

impl Fixture {
    async fn start(canaries: &Canaries, control: &str, memories: Option<service::config::GuestMemories>) -> Fixture {
        let p = Arc::new(Provider {
            canaries: canaries.clone(),
            issued: AtomicUsize::new(0),
            elsewhere_heard: Mutex::new(Vec::new()),
            control: control.to_owned(),
        });
        let bao = OpenBao::start().await;
        let ca = TestCa::new();
        let api = FakeProvider::start(&ca, &[HOST], provider(p.clone())).await;
        let mirror = FakeProvider::start(&ca, &[ELSEWHERE], elsewhere(p.clone())).await;
        let trust = Trust::new(&ca).serving(&api, &[HOST]).serving(&mirror, &[ELSEWHERE]);
        let vault = service::config::secrets::VaultSettings {
            address: url::Url::parse(&format!("{}/", bao.address)).unwrap(),
            login: service::config::secrets::VaultLogin::Token(bao.root.clone().into()),
        };
        let srv = TestServer::start_with(Backend::Sqlite, |c| {
            c.plugins.egress = trust.policy();
            c.plugins.guest_memories = memories;
            c.secret_stores.vault = Some(vault);
        })
        .await
        .unwrap();
        let ws = srv.workspace_id().await;
        let path = format!("workspaces/{ws}/canaries");
        let stored: serde_json::Map<String, Value> =
            cases().iter().map(|c| (c.key.to_owned(), json!(canaries.by_key(c.key)))).collect();
        bao.put(&path, Value::Object(stored)).await;
        Fixture { srv, p, path, ws, _bao: bao, _api: api, _mirror: mirror }
    }
}

/// A log sink shared by every thread of the test's runtime.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Names the threads of the runtime whose log is captured.
const LOGGED_THREADS: &str = "canary-runtime";

/// The log of every thread named [`LOGGED_THREADS`], at debug level, as
/// JSON: the test binary's one global subscriber (one scoped to some
/// threads misses events whose callsites another thread saw first),
/// filtering out, before formatting, every event of other tests' threads.
fn captured_log() -> &'static Log {
    static LOG: std::sync::OnceLock<Log> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::{Layer, filter};
        let log = Log::default();
        let sink = log.clone();
        // Decided per event (a plain filter_fn is decided once per
        // callsite, by whichever thread reaches it first).
        let ours = filter::dynamic_filter_fn(|meta, _| {
            *meta.level() <= tracing::Level::DEBUG
                && std::thread::current().name().is_some_and(|n| n.starts_with(LOGGED_THREADS))
        });
        let layer = tracing_subscriber::fmt::layer().json().with_writer(move || sink.clone()).with_filter(ours);
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("no other test sets a global subscriber");
        // Callsites other tests' threads reached before it was set were
        // told nobody listens: ask them again.
        tracing::callsite::rebuild_interest_cache();
        log
    })
}

/// A runtime whose threads' log [`captured_log`] keeps.
fn logging_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(LOGGED_THREADS)
        .enable_all()
        .build()
        .unwrap()
}

/// Every file under `dir`.
fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { out.extend(files(&path)) } else { out.push(path) }
    }
    out
}

#[test]
fn a_canary_in_openbao_reaches_no_byte_of_the_database_log_audit_job_warehouse_or_guest_memory() {
    let log = captured_log();
    logging_runtime().block_on(canaries_in_every_placement(log.clone()));
}

async fn canaries_in_every_placement(log: Log) {
    let canaries = Canaries::new();
    let control = format!("control{}", uuid::Uuid::new_v4().simple());
    let needles = canaries.needles();
    let probe = GuestMemoryProbe::watching(needles.iter().map(|(_, n)| n.as_bytes()).chain([control.as_bytes()]));
    let Fixture { srv, p, path, ws, _bao, _api, _mirror } =
        Fixture::start(&canaries, &control, Some(probe.memories())).await;

    // Everything a client of the API was shown.
    let mut shown = String::new();
    for case in cases() {
        let mut body = json!({ "kind": "secret", "connector_id": "conn_rest_manifest", "hosts": [HOST],
            "reference": format!("vault://secret/{path}#{}", case.key) });
        body.as_object_mut().unwrap().extend(case.fields.as_object().cloned().unwrap());
        let credential = json_ok(srv.post("/v1/credentials", body).send().await.unwrap()).await;
        shown.push_str(&credential.to_string());
        let handle = credential["data"]["credential_handle"].as_str().unwrap();

        let stream = |name: &str, path: String| {
            let mut s = json!({ "name": name, "path": path, "records": "/data", "primary_key": ["id"],
                "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" } });
            if case.kind == "body" {
                s["body"] = json!({ "query": "all", "auth": { "user": "me" } });
            }
            s
        };
        let configuration = json!({ "base_url": format!("https://{HOST}"), "credential_handle": handle,
            "credential_placement": case.placement,
            "manifest": { "streams": [stream("items", format!("/{}/items", case.kind)), stream("away", format!("/{}/away", case.kind))] } });
        let source = json_ok(
            srv.post(
                "/v1/sources",
                json!({ "connector_id": "conn_rest_manifest", "name": case.kind, "configuration": configuration }),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        shown.push_str(&source.to_string());
        let source_id = source["data"]["source_id"].as_str().unwrap();
        let file = format!("{}.db", case.kind);
        let dest = json_ok(
            srv.post("/v1/destinations", json!({ "name": file, "kind": "sqlite", "configuration": { "file": file } }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let streams = json!([{ "name": "items", "sync_mode": "full_refresh_overwrite" },
            { "name": "away", "sync_mode": "full_refresh_overwrite" }]);
        let pipeline = json_ok(
            srv.post(
                "/v1/pipelines",
                json!({ "name": case.kind, "source_id": source_id, "destination_id": dest["data"]["destination_id"], "streams": streams }),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        shown.push_str(&pipeline.to_string());
        let pipeline_id = pipeline["data"]["pipeline_id"].as_str().unwrap();
        let job = json_ok(
            srv.request(reqwest::Method::POST, &format!("/v1/pipelines/{pipeline_id}/sync")).send().await.unwrap(),
        )
        .await;
        let job = srv.wait_job(job["data"]["job_id"].as_str().unwrap()).await;
        shown.push_str(&job.to_string());
        assert_eq!(job["status"], "succeeded", "{}: {job}", case.kind);
        assert_eq!(job["progress"]["streams"]["items"]["records"], PAGES * PER_PAGE, "{}: {job}", case.kind);
        let warehouse = srv.warehouse(&ws, &file);
        let url = format!("sqlite://{}?mode=ro", warehouse.display());
        assert_eq!(count_rows(&url, "items").await, (PAGES * PER_PAGE) as i64, "{}", case.kind);
        // The other host's record: the redirect was followed, without
        // the credential.
        assert_eq!(count_rows(&url, "away").await, 1, "{}", case.kind);
        // What the records echoed reached the table scrubbed.
        let echoed = std::fs::read(&warehouse).unwrap();
        assert!(memchr::memmem::find(&echoed, b"[REDACTED]").is_some(), "{}: no echo was scrubbed", case.kind);
    }
    for page in ["/v1/audit-logs?limit=200", "/v1/jobs?limit=200", "/v1/credentials", "/v1/sources", "/v1/pipelines"] {
        let answer = srv.get(page).send().await.unwrap();
        shown.push_str(&answer.text().await.unwrap());
    }

    // The other host heard requests (one per placement), none with a
    // secret or a token.
    let away = p.elsewhere_heard.lock().unwrap().join("\n");
    assert!(away.matches(" /").count() >= cases().len(), "{away}");
    let kept = srv.stop_keeping_data().await;
    let data_dir = kept.path().to_owned();
    let findings = probe.findings();
    let log = log.0.lock().unwrap().clone();
    assert!(
        log.len() > 10_000 && memchr::memmem::find(&log, b"DEBUG").is_some(),
        "the log was captured: {} bytes",
        log.len()
    );
    let written: Vec<(std::path::PathBuf, Vec<u8>)> =
        files(&data_dir).into_iter().map(|f| (f.clone(), std::fs::read(&f).unwrap_or_default())).collect();
    assert!(
        written.iter().any(|(f, _)| f.ends_with("service.db")),
        "{:?}",
        written.iter().map(|w| &w.0).collect::<Vec<_>>()
    );

    for (i, (what, needle)) in needles.iter().enumerate() {
        assert!(!shown.contains(needle.as_str()), "the API showed the {what}");
        assert!(!away.contains(needle.as_str()), "the other host got the {what}");
        assert!(!testkit::codings::holds(&log, needle.as_bytes()), "the log holds the {what}");
        for (file, bytes) in &written {
            assert!(!testkit::codings::holds(bytes, needle.as_bytes()), "{} holds the {what}", file.display());
        }
        assert_eq!(findings.hits[i], 0, "a guest's memory held the {what}: {findings:?}");
    }
    eprintln!("guest memory probe: {} memories, {} bytes searched", findings.memories, findings.bytes);
    // The probe did look at what the guests held: their records.
    assert!(findings.memories > 0 && findings.hits[needles.len()] > 0, "{findings:?}");
    // And the provider did get each secret where it goes.
    assert!(p.issued.load(Ordering::SeqCst) >= 3, "the token endpoints issued a token per exchange");
}

/// A provider that accepts only the current key, and rotates it in
/// OpenBao itself as it serves page [`ROTATE_AT`].
struct Rotating {
    current: Mutex<String>,
    next: String,
    /// OpenBao's address and root token, and the secret's path.
    store: (String, String),
    path: Mutex<String>,
    rotated: AtomicBool,
    refused: AtomicUsize,
    served_new: AtomicUsize,
    /// Whether the last page went with the new key.
    last_with_new: AtomicBool,
}

const ROTATE_AT: u64 = 4;
const ROTATION_PAGES: u64 = 12;

async fn rotating_items(
    State(r): State<Arc<Rotating>>,
    Query(query): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    if key != *r.current.lock().unwrap() {
        r.refused.fetch_add(1, Ordering::SeqCst);
        return (StatusCode::UNAUTHORIZED, Json(json!({ "error": "invalid api key" }))).into_response();
    }
    let page: u64 = query.get("page").and_then(|v| v.parse().ok()).unwrap_or(1);
    if key == r.next {
        r.served_new.fetch_add(1, Ordering::SeqCst);
        r.last_with_new.fetch_or(page == ROTATION_PAGES, Ordering::SeqCst);
    }
    if page == ROTATE_AT && !r.rotated.swap(true, Ordering::SeqCst) {
        let (address, root) = &r.store;
        let path = r.path.lock().unwrap().clone();
        openbao::write(address, root, &path, json!({ "api_key": r.next })).await;
        *r.current.lock().unwrap() = r.next.clone();
    }
    let records: Vec<Value> = (1..=PER_PAGE).map(|i| json!({ "id": (page - 1) * PER_PAGE + i })).collect();
    Json(json!({ "data": records, "meta": { "total_pages": ROTATION_PAGES } })).into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotated_in_openbao_mid_sync_is_read_again_on_the_refusal_and_no_page_fails() {
    let bao = OpenBao::start().await;
    let (old, new) =
        (format!("old-key-{}", uuid::Uuid::new_v4().simple()), format!("new-key-{}", uuid::Uuid::new_v4().simple()));
    let ca = TestCa::new();
    // The store's path is known once the workspace is: set below.
    let r = Arc::new(Rotating {
        current: Mutex::new(old.clone()),
        next: new.clone(),
        store: (bao.address.clone(), bao.root.clone()),
        path: Mutex::new(String::new()),
        rotated: AtomicBool::new(false),
        refused: AtomicUsize::new(0),
        served_new: AtomicUsize::new(0),
        last_with_new: AtomicBool::new(false),
    });
    let api =
        FakeProvider::start(&ca, &[HOST], Router::new().route("/items", any(rotating_items)).with_state(r.clone()))
            .await;
    let trust = Trust::new(&ca).serving(&api, &[HOST]);
    let vault = service::config::secrets::VaultSettings {
        address: url::Url::parse(&format!("{}/", bao.address)).unwrap(),
        login: service::config::secrets::VaultLogin::Token(bao.root.clone().into()),
    };
    // A TTL far longer than the sync: only the refusal can bring the new
    // key in.
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.plugins.egress = trust.policy();
        c.secret_stores.vault = Some(vault);
        c.secret_stores.ttl = Duration::from_secs(600);
    })
    .await
    .unwrap();
    let ws = srv.workspace_id().await;
    let path = format!("workspaces/{ws}/rotating");
    bao.put(&path, json!({ "api_key": old })).await;
    *r.path.lock().unwrap() = path.clone();

    let credential = json_ok(
        srv.post(
            "/v1/credentials",
            json!({ "kind": "secret", "connector_id": "conn_rest_manifest", "hosts": [HOST], "header": "X-Api-Key",
                "reference": format!("vault://secret/{path}#api_key") }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let handle = credential["data"]["credential_handle"].as_str().unwrap();
    let configuration = json!({ "base_url": format!("https://{HOST}"), "credential_handle": handle,
        "credential_placement": "header:X-Api-Key",
        "manifest": { "streams": [{ "name": "items", "path": "/items", "records": "/data", "primary_key": ["id"],
            "schema": { "type": "object", "properties": { "id": { "type": "integer" } } },
            "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" } }] } });
    let source = json_ok(
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_rest_manifest", "name": "rotating", "configuration": configuration }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let dest = json_ok(
        srv.post("/v1/destinations", json!({ "name": "rot", "kind": "sqlite", "configuration": { "file": "rot.db" } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let pipeline = json_ok(
        srv.post(
            "/v1/pipelines",
            json!({ "name": "rotating", "source_id": source["data"]["source_id"], "destination_id": dest["data"]["destination_id"],
                "streams": [{ "name": "items", "sync_mode": "full_refresh_overwrite" }] }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let pipeline_id = pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned();
    let sync = || async {
        let job = json_ok(
            srv.request(reqwest::Method::POST, &format!("/v1/pipelines/{pipeline_id}/sync")).send().await.unwrap(),
        )
        .await;
        srv.wait_job(job["data"]["job_id"].as_str().unwrap()).await
    };

    let job = sync().await;
    assert!(r.rotated.load(Ordering::SeqCst), "the key was rotated mid-sync");
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["progress"]["streams"]["items"]["records"], ROTATION_PAGES * PER_PAGE, "{job}");
    let url = format!("sqlite://{}?mode=ro", srv.warehouse(&ws, "rot.db").display());
    assert_eq!(count_rows(&url, "items").await, (ROTATION_PAGES * PER_PAGE) as i64);
    // Requests after the rotation were refused (those already on their
    // way with the old key, the pages ahead at most) and sent again with
    // the new key, read from the store on the refusal.
    let refused = r.refused.load(Ordering::SeqCst);
    assert!((1..=4).contains(&refused), "refused {refused}");
    // (The pages asked for ahead of page 4 may have been served with the
    // old key while page 4 was rotating it.)
    let served_new = r.served_new.load(Ordering::SeqCst) as u64;
    assert!(served_new >= ROTATION_PAGES - ROTATE_AT - 3, "the rest went with the new key: {served_new}");
    assert!(r.last_with_new.load(Ordering::SeqCst), "the last page went with the new key");
    assert!(!job.to_string().contains(&old) && !job.to_string().contains(&new), "{job}");
    // The read on the refusal is audited with the job it was for.
    let audit =
        json_ok(srv.get("/v1/audit-logs?action=credentials.resolve_reference&limit=200").send().await.unwrap()).await;
    let job_id = job["job_id"].as_str().unwrap();
    assert!(audit.to_string().contains(&format!("\"job_id\":\"{job_id}\"")), "{audit}");
    assert!(!audit.to_string().contains(&new), "{audit}");

    // The provider now refuses a key the store does not have: the
    // refusal reaches the connector (no request sent again with the key
    // just refused, the store read once at most), and the sync fails by
    // name.
    *r.current.lock().unwrap() = format!("never-stored-{}", uuid::Uuid::new_v4().simple());
    let before = r.refused.load(Ordering::SeqCst);
    let job = sync().await;
    assert_eq!(job["status"], "failed", "{job}");
    let refused = r.refused.load(Ordering::SeqCst) - before;
    assert!((1..=1 + 4).contains(&refused), "each request sent once: {refused}");
    assert!(!job.to_string().contains(&new), "{job}");
    let audit =
        json_ok(srv.get("/v1/audit-logs?action=credentials.resolve_reference&limit=200").send().await.unwrap()).await;
    let failing = job["job_id"].as_str().unwrap();
    // (At most once: none within 30 s of the last forced read.)
    assert!(audit.to_string().matches(failing).count() <= 1, "the store was read once at most for it: {audit}");
}

/// Every placement, asked by a plugin for a host the credential is not
/// bound to (a next link to another allowed host), and for its own host
/// when that answers with a redirect to the other: the other host gets
/// neither the secret nor a token traded for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_placement_sends_its_secret_to_an_allowed_host_it_is_not_bound_to() {
    let canaries = Canaries::new();
    let Fixture { srv, p, path, ws, _bao, _api, _mirror } = Fixture::start(&canaries, "control", None).await;
    let id = srv.load_test_plugin("test_misbehaving").await;
    let plugin = srv.state.plugins.available(&id).await.unwrap();
    let egress = |request: Value| {
        let (srv, plugin, ws) = (&srv, &plugin, &ws);
        async move {
            let config = json!({ "behave": "egress", "request": request }).to_string();
            srv.state.plugins.runtime().preview(plugin, ws, &srv.state.egress, &config).await.expect("the preview runs")
        }
    };
    for case in cases() {
        let mut body =
            json!({ "kind": "secret", "hosts": [HOST], "reference": format!("vault://secret/{path}#{}", case.key) });
        body.as_object_mut().unwrap().extend(case.fields.as_object().cloned().unwrap());
        let credential = json_ok(srv.post("/v1/credentials", body).send().await.unwrap()).await;
        let handle = credential["data"]["credential_handle"].as_str().unwrap();
        let placement = match case.placement {
            "header:X-Api-Key" => json!({ "header": "x-api-key" }),
            "query:api_key" => json!({ "query": "api_key" }),
            _ if case.kind == "body" => json!({ "body": "/auth/password" }),
            _ => json!("as-stored"),
        };
        let request = |url: String| {
            let mut r = json!({ "url": url, "credential": { "handle": handle, "placement": placement } });
            if case.kind == "body" {
                r["method"] = json!("POST");
                r["headers"] = json!([["content-type", "application/json"]]);
                r["body"] = json!(json!({ "query": "all", "auth": { "user": "me" } }).to_string());
            }
            r
        };
        // Its own host first: the credential works there.
        let home = egress(request(format!("https://{HOST}/{}/items", case.kind))).await;
        assert_eq!(home["ok"]["status"], 200, "{}: {home}", case.kind);
        // A next link to the other host: refused before anything leaves.
        let heard_before = p.elsewhere_heard.lock().unwrap().len();
        let next = egress(request(format!("https://{ELSEWHERE}/{}/items?page=2", case.kind))).await;
        assert_eq!(next["error"]["kind"], "credential-unavailable", "{}: {next}", case.kind);
        assert!(
            next["error"]["message"].as_str().unwrap().contains(&format!("not bound to host {ELSEWHERE}")),
            "{next}"
        );
        assert_eq!(p.elsewhere_heard.lock().unwrap().len(), heard_before, "{}: the request went out", case.kind);
        // A redirect there: followed without the credential.
        let away = egress(request(format!("https://{HOST}/{}/away", case.kind))).await;
        assert_eq!(away["ok"]["status"], 200, "{}: {away}", case.kind);
        assert_eq!(p.elsewhere_heard.lock().unwrap().len(), heard_before + 1, "{}", case.kind);
    }
    let heard = p.elsewhere_heard.lock().unwrap().join("\n");
    for (what, needle) in canaries.needles() {
        assert!(!heard.contains(&needle), "the other host got the {what}: {heard}");
    }
    assert!(p.issued.load(Ordering::SeqCst) >= 3, "each exchange traded its secret at home");
}
