//! Several `service` processes on one control database, as an
//! installation scales out: [`Processes`] (their data directory and
//! environment, and the API calls tests make through any of them), and the
//! destinations crash tests kill them over ([`CrashTarget`]).

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::events::Events;
use super::provider::{FakeProvider, TestCa};
use super::{count_rows, json_ok, test_plugin};

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
    pub(crate) async fn pipeline_into(
        &self,
        base: &str,
        events: &Events,
        page_size: u64,
        destination: Value,
    ) -> String {
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
        let manifest = json!({ "streams": [{ "name": "items", "path": "/pages/items", "records": "/data", "primary_key": ["id"],
            "params": { "per_page": per_page }, "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" },
            "incremental": { "cursor_field": "updated_at", "param": "since", "format": "rfc3339" } }] });
        self.rest_manifest_source_into(base, token, manifest, destination, &[("items".into(), mode)]).await
    }

    /// Makes, through the server at `base`, a REST source with one stream
    /// per name in `streams`, each reading `/pages/items` of a `RestApi`
    /// (`per_page` records a page, its name in the `stream` query
    /// parameter, incremental on `updated_at`, a failed request not
    /// retried by the connector), the destination and a pipeline of every
    /// stream in `mode`; returns the pipeline id.
    pub(crate) async fn rest_manifest_streams_into(
        &self,
        base: &str,
        token: &str,
        per_page: u64,
        mode: &str,
        destination: Value,
        streams: &[String],
    ) -> String {
        let specs: Vec<Value> = streams
            .iter()
            .map(|name| {
                json!({ "name": name, "path": "/pages/items", "records": "/data", "primary_key": ["id"],
                    "params": { "per_page": per_page, "stream": name },
                    "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" },
                    "incremental": { "cursor_field": "updated_at", "param": "since", "format": "rfc3339" } })
            })
            .collect();
        let manifest = json!({ "retry": { "max_retries": 0 }, "streams": specs });
        let selected: Vec<(String, &str)> = streams.iter().map(|name| (name.clone(), mode)).collect();
        self.rest_manifest_source_into(base, token, manifest, destination, &selected).await
    }

    /// A credential holding `token`, a REST source of `manifest` on
    /// `https://api.source.test`, the destination and a pipeline of the
    /// `selected` streams (name and mode), made through the server at
    /// `base`; returns the pipeline id.
    async fn rest_manifest_source_into(
        &self,
        base: &str,
        token: &str,
        manifest: Value,
        destination: Value,
        selected: &[(String, &str)],
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
        let configuration = json!({ "base_url": "https://api.source.test", "credential_handle": cred["data"]["credential_handle"], "manifest": manifest });
        let source = post(
            "/v1/sources",
            json!({ "connector_id": "conn_rest_manifest", "name": "m", "configuration": configuration }),
        )
        .await;
        let destination = post("/v1/destinations", destination).await;
        let streams: Vec<Value> =
            selected.iter().map(|(name, mode)| json!({ "name": name, "sync_mode": mode })).collect();
        let pipeline = post(
            "/v1/pipelines",
            json!({ "name": "p", "source_id": source["data"]["source_id"], "destination_id": destination["data"]["destination_id"],
                "streams": streams }),
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

    /// The directory of the servers' files (data, plugins, roots).
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
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
    pub(crate) fn warehouse(&self) -> String {
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
    pub(crate) async fn rows(&self) -> i64 {
        count_rows(&self.warehouse(), "events").await
    }
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
    reader: Option<super::iceberg::Reader>,
    /// The lakehouse namespace its tables are in.
    namespace: String,
}

impl CrashTarget {
    /// `None` for PostgreSQL when no server answers (and none is required).
    pub(crate) async fn new(into: CrashInto) -> Option<CrashTarget> {
        let pg = match into {
            CrashInto::Postgres => Some(crate::support::PgDatabase::create().await?),
            _ => None,
        };
        let reader = matches!(into, CrashInto::Iceberg).then(super::iceberg::Reader::start);
        Some(CrashTarget { into, pg, reader, namespace: "crash".into() })
    }

    /// The same target, a lakehouse's tables in `namespace` (letters,
    /// digits and `_`), so runs sharing a server never share a table.
    pub(crate) fn in_namespace(mut self, namespace: &str) -> CrashTarget {
        self.namespace = namespace.to_owned();
        self
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
                json!({ "name": "lake", "kind": "iceberg",
                    "configuration": { "warehouse": "lake", "namespace": self.namespace } })
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
            let read = reader
                .read_with(&database_url, &catalog, &format!("{}.{table}", self.namespace), json!({}), &[key])
                .await;
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
