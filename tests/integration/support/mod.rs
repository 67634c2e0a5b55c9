//! Test harness: starts the real server on `127.0.0.1:0` over a fresh
//! database and talks HTTP to it.
//!
//! Backends: every test written with [`backend_tests!`] runs twice, on
//! SQLite and on PostgreSQL: the server `SERVICE_TEST_DATABASE_URL` names
//! (one where the test may create databases), else the local one at
//! `postgres://postgres@127.0.0.1:5432/postgres` when it answers. Without
//! either, a PostgreSQL test prints `skipped: no PostgreSQL` and passes;
//! with `SERVICE_TEST_REQUIRE_POSTGRES=1` (as CI sets) it fails instead.
//! Each test gets its own SQLite file or its own PostgreSQL database, so
//! tests run in parallel.
//!
//! Layout:
//! - this module: [`TestServer`] (an in-process server over a fresh
//!   database), [`PgDatabase`], the per-backend test macros and response
//!   checks;
//! - [`process`]: the `service` binary run as a user runs it;
//! - [`replicas`]: several such processes on one control database, and
//!   the destinations crash tests kill them over;
//! - [`trust`]: the egress policy of a server trusting fake providers;
//! - [`events`]: the paged test source over a fake events API, the
//!   fixture most pipeline tests start from;
//! - [`iceberg`]: Iceberg tables read back by pyiceberg and DuckDB;
//! - [`openbao`]: OpenBao's dev server, the operator's secret store;
//! - from the `testkit` crate (shared with the benchmarks): [`provider`]
//!   (a TLS test CA and fake providers over real HTTPS), [`mailcoach`] and
//!   [`hubspot`] (the bundled connectors' providers), [`routes`] (canned
//!   routes), [`fakepg`] (a fake PostgreSQL) and [`test_plugin`] (the
//!   test plugins' builder).

#![allow(dead_code)]

pub mod events;
pub mod iceberg;
pub mod openbao;
pub mod process;
pub mod replicas;
pub mod trust;

pub use testkit::plugins::test_plugin;
pub use testkit::{fakepg, hubspot, mailcoach, provider, routes};

use std::path::PathBuf;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use secrecy::ExposeSecret;
use serde_json::Value;
use service::access::Role;
use service::config::ServerConfig;
use service::server::RunningServer;
use service::state::AppState;
use sqlx::Connection;
use tempfile::TempDir;

/// Environment variable naming the PostgreSQL server for the tests.
pub const PG_ENV: &str = "SERVICE_TEST_DATABASE_URL";

/// Environment variable that turns a missing PostgreSQL into a failure.
pub const PG_REQUIRED_ENV: &str = "SERVICE_TEST_REQUIRE_POSTGRES";

/// The local server tried when [`PG_ENV`] is unset.
const LOCAL_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The PostgreSQL server tests create their databases on, found once per
/// test process.
async fn postgres_server() -> Option<String> {
    static SERVER: tokio::sync::OnceCell<Option<String>> = tokio::sync::OnceCell::const_new();
    SERVER
        .get_or_init(|| async {
            if let Some(url) = std::env::var(PG_ENV).ok().filter(|s| !s.is_empty()) {
                return Some(url);
            }
            let probe =
                tokio::time::timeout(std::time::Duration::from_secs(3), sqlx::PgConnection::connect(LOCAL_POSTGRES))
                    .await;
            match probe {
                Ok(Ok(conn)) => {
                    let _ = conn.close().await;
                    Some(LOCAL_POSTGRES.to_owned())
                }
                _ => None,
            }
        })
        .await
        .clone()
}

/// The database engine a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The master key of every test server (32 bytes, base64).
pub const TEST_MASTER_KEY: &str = "bWFzdGVyIGtleSBvZiB0aGUgc2VydmljZSB0ZXN0cyE=";

/// Where test servers keep compiled plugins: one directory for the whole
/// run (and the next), so each plugin is compiled once, not once a test.
pub fn shared_compile_cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// A Python interpreter with the tests' Python tools installed
/// (`tests/python/requirements.txt`, pinned with hashes, from PyPI) in a
/// virtual environment of its own, made once by `tests/python/venv` and
/// kept for the next run. Panics when it cannot be made: a test that needs
/// it never passes without it.
pub fn test_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-python");
            let made = std::process::Command::new("bash").arg(python_script("venv")).arg(&venv).status();
            assert!(
                made.is_ok_and(|s| s.success()),
                "tests/python/venv could not install tests/python/requirements.txt (it needs python3-venv and PyPI)"
            );
            venv.join("bin/python")
        })
        .clone()
}

/// A Python interpreter with Airbyte's CDK, the reference the manifest
/// tests compare with (`tests/python/airbyte/requirements.txt`, pinned
/// with hashes, from PyPI), in `target/tmp/airbyte-cdk` as CI makes it.
/// Panics when it cannot be made.
pub fn airbyte_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("airbyte-cdk");
            let made = std::process::Command::new("bash")
                .arg(python_script("venv"))
                .arg(&venv)
                .arg(python_script("airbyte/requirements.txt"))
                .status();
            assert!(
                made.is_ok_and(|s| s.success()),
                "tests/python/venv could not install tests/python/airbyte/requirements.txt (it needs python3-venv and PyPI)"
            );
            venv.join("bin/python")
        })
        .clone()
}

/// A script of `tests/python`.
pub fn python_script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/python").join(name)
}

/// Token every test server is bootstrapped with (`SERVICE_BOOTSTRAP_TOKEN`).
pub const ADMIN_TOKEN: &str = "svc_test_bootstrap_token_0123456789abcdef";

/// A running server with its own database.
pub struct TestServer {
    pub base: String,
    pub state: AppState,
    pub admin_token: String,
    /// Another session of the same administrator: proposals are decided
    /// from a session other than the one that made them.
    pub approver_token: String,
    pub client: reqwest::Client,
    pub data_dir: PathBuf,
    server: Option<RunningServer>,
    dir: Option<TempDir>,
    pg: Option<PgDatabase>,
}

/// Whether the tests have a PostgreSQL server; prints why not (or fails
/// when one is required) like [`PgDatabase::create`].
pub async fn postgres_available() -> bool {
    if postgres_server().await.is_some() {
        return true;
    }
    let required = std::env::var(PG_REQUIRED_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    assert!(
        !required,
        "{PG_REQUIRED_ENV} is set but no PostgreSQL answers: set {PG_ENV} or start one on 127.0.0.1:5432"
    );
    eprintln!("skipped: no PostgreSQL (set {PG_ENV} or start one on 127.0.0.1:5432)");
    false
}

/// A PostgreSQL database created for one test and dropped after it.
pub struct PgDatabase {
    admin_url: String,
    name: String,
    /// The database's own `postgres://` URL.
    pub url: String,
}

impl PgDatabase {
    /// A fresh database on the tests' PostgreSQL server; `None`, after
    /// printing `skipped: no PostgreSQL`, when there is none (a failure
    /// instead when [`PG_REQUIRED_ENV`] is set).
    pub async fn create() -> Option<PgDatabase> {
        if !postgres_available().await {
            return None;
        }
        let admin_url = postgres_server().await?;
        let name = database_name();
        let mut conn = sqlx::PgConnection::connect(&admin_url).await.expect("connect to the tests' PostgreSQL server");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).execute(&mut conn).await.unwrap();
        Some(PgDatabase { url: with_database(&admin_url, &name), admin_url, name })
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop runs inside the test's runtime; use a thread of our own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url).await {
                    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                    let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await;
                }
            });
        })
        .join();
    }
}

/// A temporary directory only its owner may enter, as the server demands
/// of its data directory.
pub fn private_dir() -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// Installs the TLS crypto provider the HTTP client needs (once).
pub fn init_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn database_name() -> String {
    format!("svc_test_{}", uuid::Uuid::new_v4().simple())
}

/// The `postgres://` URL of the same server with another database name.
fn with_database(admin_url: &str, db: &str) -> String {
    let mut url = url::Url::parse(admin_url).expect("SERVICE_TEST_DATABASE_URL is a URL");
    url.set_path(&format!("/{db}"));
    url.to_string()
}

impl TestServer {
    /// Starts a server on `backend`; `None` when PostgreSQL is asked for but
    /// not configured.
    pub async fn start(backend: Backend) -> Option<TestServer> {
        Self::start_with(backend, |_| {}).await
    }

    /// Starts a server after `adjust` has changed its configuration.
    pub async fn start_with(backend: Backend, adjust: impl FnOnce(&mut ServerConfig)) -> Option<TestServer> {
        init_crypto();
        let dir = private_dir();
        let (database_url, pg) = match backend {
            Backend::Sqlite => (format!("sqlite://{}/service.db?mode=rwc", dir.path().display()), None),
            Backend::Postgres => {
                let db = PgDatabase::create().await?;
                (db.url.clone(), Some(db))
            }
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = ServerConfig {
            bind: addr,
            data_dir: dir.path().to_owned(),
            database_url,
            public_url: url::Url::parse(&format!("http://{addr}/")).unwrap(),
            session_ttl_ms: 3_600_000,
            bootstrap_token: Some(ADMIN_TOKEN.to_owned().into()),
            bootstrap_email: "admin@example.test".into(),
            // One key for every test server, so they share the compiled
            // plugins (the cache is authenticated with a key derived from
            // it); a test of the key file itself sets none.
            master_key: Some(TEST_MASTER_KEY.to_owned().into()),
            plugins: service::config::PluginSettings {
                plugins_dir: dir.path().join("plugins"),
                compile_cache_dir: shared_compile_cache(),
                egress: service::egress::EgressPolicy::default(),
                limits: service::plugin::sandbox::Limits::default(),
                // The tests' PostgreSQL destinations are on this machine.
                warehouses: service::config::warehouse::WarehousePolicy::from_settings("127.0.0.1,::1").unwrap(),
                // Test plugins are built unsigned; the signature tests set
                // the default policy (required) themselves.
                signatures: service::config::signatures::SignaturePolicy::allowed(),
                guest_memories: None,
                guest_clock: None,
            },
            oauth: Default::default(),
            limits: Default::default(),
            metrics: Default::default(),
            secret_stores: Default::default(),
        };
        let mut config = config;
        adjust(&mut config);
        let state = AppState::open(config).await.expect("server state opens");
        let approver = service::access::admin::create_token(
            &state.store,
            &state.config.bootstrap_email,
            Some("approver"),
            None,
            service::access::ClientSource::Api,
        )
        .await
        .unwrap();
        let server = service::server::start_on(listener, state.clone()).unwrap();
        Some(TestServer {
            base: format!("http://{addr}"),
            state,
            admin_token: ADMIN_TOKEN.into(),
            approver_token: approver.expose_secret().to_owned(),
            client: reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap(),
            data_dir: dir.path().to_owned(),
            server: Some(server),
            dir: Some(dir),
            pg,
        })
    }

    /// Stops the server and closes the database.
    pub async fn stop(mut self) {
        if let Some(s) = self.server.take() {
            s.stop().await.unwrap();
        }
        self.state.store.close().await;
    }

    /// Stops the server but keeps its data directory, for tests that
    /// reopen it (offline commands, restarts).
    pub async fn stop_keeping_data(mut self) -> TempDir {
        if let Some(s) = self.server.take() {
            s.stop().await.unwrap();
        }
        self.state.store.close().await;
        self.dir.take().expect("data directory")
    }

    /// Loads the test plugin `name` (built from `tests/plugins`) from its
    /// file, as an operator would; returns its connector id.
    pub async fn load_test_plugin(&self, name: &str) -> String {
        let path = test_plugin(name);
        let bytes = std::fs::read(&path).unwrap();
        self.state.plugins.load_bytes(&bytes, service::plugin::registry::PluginSource::File(path)).await.unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// A request with `token` as bearer.
    /// Polls a job until it ends; returns its last `data`.
    pub async fn wait_job(&self, job_id: &str) -> Value {
        let mut last = Value::Null;
        for _ in 0..600 {
            last = json_ok(self.get(&format!("/v1/jobs/{job_id}")).send().await.unwrap()).await["data"].clone();
            if ["succeeded", "failed", "cancelled"].contains(&last["status"].as_str().unwrap_or_default()) {
                return last;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("job {job_id} did not finish: {last}");
    }

    pub fn request_as(&self, token: &str, method: Method, path: &str) -> RequestBuilder {
        self.client.request(method, self.url(path)).bearer_auth(token)
    }

    /// A request as the bootstrap administrator.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.request_as(&self.admin_token, method, path)
    }

    pub fn get(&self, path: &str) -> RequestBuilder {
        self.request(Method::GET, path)
    }

    pub fn post(&self, path: &str, body: Value) -> RequestBuilder {
        self.request(Method::POST, path).json(&body)
    }

    /// The bootstrap administrator's default workspace.
    pub async fn workspace_id(&self) -> String {
        let me = json_ok(self.get("/v1/me").send().await.unwrap()).await;
        me["data"]["default_workspace_id"].as_str().unwrap().to_owned()
    }

    /// Creates a user with `role` in `workspace_id` and returns
    /// (user_id, token), through the same code as the admin CLI.
    pub async fn user_in(&self, workspace_id: &str, role: Role) -> (String, String) {
        let email = format!("{}-{}@example.test", role.as_str(), uuid::Uuid::new_v4().simple());
        let (user_id, _) =
            service::access::admin::create_user(&self.state.store, &email, "Test user", Some(workspace_id), role)
                .await
                .unwrap();
        let token = service::access::admin::create_token(
            &self.state.store,
            &email,
            Some("test"),
            None,
            service::access::ClientSource::Cli,
        )
        .await
        .unwrap();
        (user_id, token.expose_secret().to_owned())
    }

    /// Where a workspace's SQLite destination file `file` lives.
    pub fn warehouse(&self, workspace_id: &str, file: &str) -> PathBuf {
        self.data_dir.join("warehouses").join(workspace_id).join(file)
    }

    /// Where a workspace's JSON-lines destination `directory` lives.
    pub fn exports(&self, workspace_id: &str, directory: &str) -> PathBuf {
        self.data_dir.join("exports").join(workspace_id).join(directory)
    }

    /// A second workspace with its own administrator: (workspace_id, token).
    pub async fn other_workspace(&self) -> (String, String) {
        let ws = self.state.store.create_workspace("Other workspace").await.unwrap();
        let (_, token) = self.user_in(&ws.workspace_id, Role::Administrator).await;
        (ws.workspace_id, token)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            drop(server);
        }
    }
}

/// The JSON body of a response.
/// The CSRF token a page's form carries (its hidden `csrf` field), as a
/// browser would post it back.
pub fn form_csrf(html: &str) -> Option<String> {
    let start = html.find("name=\"csrf\" value=\"")? + "name=\"csrf\" value=\"".len();
    let end = html[start..].find('"')?;
    Some(html[start..start + end].to_owned())
}

pub async fn json(resp: Response) -> (StatusCode, Value) {
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}"));
    (status, value)
}

/// The JSON body of a response that must be a 2xx.
pub async fn json_ok(resp: Response) -> Value {
    let (status, body) = json(resp).await;
    assert!(status.is_success(), "expected success, got {status}: {body}");
    body
}

/// Asserts the spec's error shape and returns the body.
pub async fn expect_error(resp: Response, status: u16, code: &str) -> Value {
    let header_id = resp.headers().get("x-request-id").map(|v| v.to_str().unwrap().to_owned());
    let (got, body) = json(resp).await;
    assert_eq!(got.as_u16(), status, "status; body: {body}");
    assert_eq!(body["code"], code, "code; body: {body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "message: {body}");
    assert!(body["details"].is_object(), "details: {body}");
    let id = body["request_id"].as_str().expect("request_id");
    assert!(uuid::Uuid::parse_str(id).is_ok(), "request_id is a UUID: {id}");
    assert_eq!(header_id.as_deref(), Some(id), "X-Request-Id header matches the body");
    body
}

/// Defines each test once per backend: `mod name { fn sqlite; fn postgres }`.
#[macro_export]
macro_rules! backend_tests {
    ($(async fn $name:ident($srv:ident) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($srv: &$crate::support::TestServer) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let srv = $crate::support::TestServer::start($crate::support::Backend::Sqlite).await.unwrap();
                run(&srv).await;
                srv.stop().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                // None has printed why it skipped.
                let Some(srv) = $crate::support::TestServer::start($crate::support::Backend::Postgres).await else { return };
                run(&srv).await;
                srv.stop().await;
            }
        }
    )*};
}

/// Runs `async fn name(backend: Backend)` on SQLite and, when configured,
/// on PostgreSQL: `mod name { fn sqlite; fn postgres }`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::support::Backend::Sqlite).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if $crate::support::postgres_available().await {
                    super::$name($crate::support::Backend::Postgres).await
                }
            }
        }
    )*};
}

/// Every object key in `v`, as dotted paths without array indices.
pub fn key_paths(v: &Value) -> std::collections::BTreeSet<String> {
    fn walk(v: &Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let p = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    out.insert(p.clone());
                    walk(v, &p, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, prefix, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(v, "", &mut out);
    out
}

/// A fingerprint of the rows an operation must not create, change or
/// delete (everything but audit records and usage timestamps).
pub async fn data_fingerprint(srv: &TestServer) -> Vec<String> {
    use sqlx::Row;
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
    let mut out = Vec::new();
    for (table, cols) in FINGERPRINT_TABLES {
        let sql = format!("SELECT {cols} FROM {table} ORDER BY 1");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(&mut conn).await.unwrap();
        for r in rows {
            let mut line = format!("{table}:");
            for i in 0..r.len() {
                let v: Option<String> = r.try_get(i).ok().flatten();
                line.push_str(&format!("{}|", v.unwrap_or_default()));
            }
            out.push(line);
        }
    }
    out
}

/// Tables and text columns the fingerprint covers.
pub const FINGERPRINT_TABLES: &[(&str, &str)] = &[
    ("workspaces", "id, name"),
    ("memberships", "id, role"),
    ("users", "id, email"),
    ("credentials", "id, handle, status, hosts, metadata, key_id, nonce, ciphertext"),
    ("plugin_states", "connector_id"),
    ("approvals", "id, status"),
    ("invitations", "id, email"),
    ("credential_entry_links", "id, spec"),
    ("sources", "id, connector_id, name, configuration"),
    ("pipelines", "id, source_id"),
];

/// Rows in a destination table, checking that no key appears twice.
pub async fn count_rows(url: &str, table: &str) -> i64 {
    use sqlx::Row;
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(url).await.unwrap();
    let sql = format!("SELECT COUNT(*) AS n, COUNT(DISTINCT \"_service_raw_id\") AS d FROM \"{table}\"");
    let r = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(&mut c).await.unwrap();
    let (n, d): (i64, i64) = (r.try_get("n").unwrap(), r.try_get("d").unwrap());
    assert_eq!(n, d, "no duplicate keys in {table}");
    n
}

/// Every Rust file of the server crate (`host/src`), with its path below
/// `src` and its text: for tests that hold the code to its conventions.
pub fn host_sources() -> Vec<(PathBuf, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut folders = vec![root.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(folder).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path.strip_prefix(&root).unwrap().to_owned(), text));
            }
        }
    }
    out
}
