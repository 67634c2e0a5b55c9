//! Reverse ETL at scale, through the public API: a model of `BENCH_ROWS`
//! (1,000,000) rows over an SQLite warehouse (and a PostgreSQL one when
//! `BENCH_POSTGRES_URL` names a database the benchmark may write to) sent
//! by an activation to a webhook destination, an HTTPS receiver in this
//! process that only counts what it gets, so it is never the limit.
//!
//! For each warehouse: a first run sends every row; then `BENCH_ROUNDS`
//! (3) times, 1% of the rows change and a run sends them. Reported: the
//! diff phase (the model streamed and compared with the diff state), the
//! rows per second the run sent, the rows the receiver got (the goal: the
//! changed rows exactly), and the process's peak resident memory during
//! the run (server, receiver and all: Linux's `VmHWM`, reset before each
//! run through `/proc/self/clear_refs`). The summary gives medians.
//!
//! Run with `cargo bench -p service --bench reverse_etl`. Nothing asserts
//! the timings; they depend on the machine. The row counts are checked.

use testkit::provider;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection;

const HOOK_HOST: &str = "hooks.bench.test";
const TOKEN: &str = "svc_bench_bootstrap_token_0123456789";

/// The API client of the benchmark.
struct Api {
    base: String,
    client: reqwest::Client,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.client.request(method, format!("{}/v1{path}", self.base)).bearer_auth(TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {body}");
        body["data"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// Runs an activation to its end; the run as the API shows it.
    async fn run(&self, activation: &str) -> Value {
        let started = self.post(&format!("/reverse-etl/activations/{activation}/run"), json!({})).await;
        let run_id = started["run_id"].as_str().unwrap().to_owned();
        loop {
            let run = self.call(reqwest::Method::GET, &format!("/reverse-etl/runs/{run_id}"), None).await;
            match run["status"].as_str() {
                Some("succeeded") => return run,
                Some("failed" | "cancelled") => panic!("run ended {run}"),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A warehouse holding `customers`, and how to change 1% of it.
enum Warehouse {
    Sqlite(String),
    Postgres(String),
}

impl Warehouse {
    async fn exec(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Warehouse::Sqlite(url) => {
                let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
                sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
            }
            Warehouse::Postgres(url) => {
                let mut c = sqlx::PgConnection::connect(url).await.unwrap();
                sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
            }
        }
    }

    /// `rows` customers of about 120 bytes each (an id, an e-mail, a
    /// name, a plan and a score).
    async fn fill(&self, rows: u64) {
        self.exec("DROP TABLE IF EXISTS customers; CREATE TABLE customers (id BIGINT PRIMARY KEY, email TEXT NOT NULL, first_name TEXT, plan TEXT, score BIGINT)").await;
        let fill = match self {
            Warehouse::Sqlite(_) => format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows}) \
                 INSERT INTO customers SELECT i, 'customer' || i || '@example.com', 'Name' || i, CASE i % 3 WHEN 0 THEN 'free' WHEN 1 THEN 'team' ELSE 'enterprise' END, i % 1000 FROM n"
            ),
            Warehouse::Postgres(_) => format!(
                "INSERT INTO customers SELECT i, 'customer' || i || '@example.com', 'Name' || i, CASE i % 3 WHEN 0 THEN 'free' WHEN 1 THEN 'team' ELSE 'enterprise' END, i % 1000 \
                 FROM generate_series(1, {rows}) AS i; ANALYZE customers"
            ),
        };
        self.exec(&fill).await;
    }

    /// Changes the score of 1% of the rows (a different 1% each round).
    async fn change(&self, round: u64) {
        self.exec(&format!("UPDATE customers SET score = score + 1 WHERE id % 100 = {round}")).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rows: u64 = std::env::var("BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let rounds: u64 = std::env::var("BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).clamp(1, 99);

    // The receiver: counts the records of each batch, accepts them all.
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    let router = axum::Router::new().route(
        "/retl",
        axum::routing::post(move |body: axum::body::Bytes| {
            let counter = counter.clone();
            async move {
                #[derive(serde::Deserialize)]
                struct Batch<'a> {
                    #[serde(borrow)]
                    records: Vec<&'a serde_json::value::RawValue>,
                }
                let batch: Batch = serde_json::from_slice(&body).unwrap();
                counter.fetch_add(batch.records.len() as u64, Ordering::SeqCst);
                axum::Json(json!({ "rejected": [] }))
            }
        }),
    );
    let ca = provider::TestCa::new();
    let hooks = provider::FakeProvider::start(&ca, &[HOOK_HOST], router).await;
    let egress =
        service::egress::EgressPolicy::from_settings("", Some(&hooks.pins(&[HOOK_HOST])), Some(ca.pem.as_bytes()))
            .unwrap()
            .with_webhook_hosts(HOOK_HOST)
            .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let state = support::state(dir.path(), egress).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let _server = service::server::start_on(listener, state.clone()).unwrap();
    let api = Api { base, client: reqwest::Client::new() };
    let ws = state.store.first_workspace().await.unwrap().unwrap().workspace_id;
    let hook = api.post("/reverse-etl/destinations", json!({ "name": "receiver", "kind": "webhook", "configuration": { "url": format!("https://{HOOK_HOST}/retl") } })).await;

    let mut warehouses = vec![(
        "sqlite",
        json!({ "name": "sqlite warehouse", "kind": "sqlite", "configuration": { "file": "bench.db" } }),
    )];
    let mut admin_url: Option<String> = None;
    match std::env::var("BENCH_POSTGRES_URL") {
        Ok(url) => {
            // Models never run as a role that is or may become a
            // superuser: the warehouse is read as a role that can only read
            // (granted the table once it is filled).
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            let role_exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bench_retl_reader')")
                    .fetch_one(&mut c)
                    .await
                    .unwrap();
            if !role_exists {
                sqlx::query("CREATE ROLE bench_retl_reader LOGIN NOSUPERUSER").execute(&mut c).await.unwrap();
            }
            let mut reader = url::Url::parse(&url).unwrap();
            reader.set_username("bench_retl_reader").unwrap();
            let _ = reader.set_password(None);
            warehouses.push((
                "postgres",
                json!({ "name": "postgres warehouse", "kind": "postgres", "configuration": { "url": reader.to_string() } }),
            ));
            admin_url = Some(url);
        }
        Err(_) => println!("postgres: skipped (set BENCH_POSTGRES_URL to a database the benchmark may write to)"),
    }
    println!(
        "{rows} rows, {rounds} rounds of 1% changed, machine: {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for (kind, body) in warehouses {
        let dest = api.post("/destinations", body.clone()).await;
        let warehouse = match kind {
            "sqlite" => {
                let path = dir.path().join("warehouses").join(&ws).join("bench.db");
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                Warehouse::Sqlite(format!("sqlite://{}?mode=rwc", path.display()))
            }
            _ => Warehouse::Postgres(admin_url.clone().expect("BENCH_POSTGRES_URL")),
        };
        let filling = Instant::now();
        warehouse.fill(rows).await;
        println!("{kind}: {rows} rows written to the warehouse in {:.1} s", filling.elapsed().as_secs_f64());
        if let Warehouse::Postgres(url) = &warehouse {
            let mut c = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::query("GRANT SELECT ON customers TO bench_retl_reader").execute(&mut c).await.unwrap();
        }
        let model = api
            .post("/reverse-etl/models", json!({ "name": kind, "warehouse_id": dest["destination_id"], "query": "SELECT id, email, first_name, plan, score FROM customers", "primary_key": "id" }))
            .await;
        let mappings = json!([
            { "field": "email", "column": "email" }, { "field": "first_name", "column": "first_name" },
            { "field": "plan", "column": "plan" }, { "field": "score", "column": "score" }
        ]);
        let activation = api
            .post("/reverse-etl/activations", json!({ "name": kind, "model_id": model["model_id"], "destination_id": hook["destination_id"], "mappings": mappings, "mode": "upsert" }))
            .await;
        let activation = activation["activation_id"].as_str().unwrap().to_owned();

        let measure = async |label: &str, expected: u64| -> (f64, f64, f64) {
            let before = received.load(Ordering::SeqCst);
            let (resident, anon) = (support::memory_mb("self", "VmRSS:"), support::memory_mb("self", "RssAnon:"));
            support::reset_peak_rss("self");
            let started = Instant::now();
            let run = api.run(&activation).await;
            let secs = started.elapsed().as_secs_f64();
            let peak = support::memory_mb("self", "VmHWM:");
            let got = received.load(Ordering::SeqCst) - before;
            let counts = &run["progress"]["counts"];
            let sent = counts["added"].as_u64().unwrap() + counts["changed"].as_u64().unwrap();
            let diff = run["progress"]["diff_ms"].as_f64().unwrap() / 1000.0;
            let send_secs = (secs - diff).max(1e-9);
            println!(
                "{kind} {label:<8} diff {diff:>6.2} s, sent {sent:>8} ({:>8.0} rows/s after the diff, {:>8.0} rows/s overall), received {got:>8}, whole run {secs:>6.2} s, peak RSS {peak:>6.1} MB (from {resident:.1} MB, {anon:.1} MB of it heap)",
                sent as f64 / send_secs,
                sent as f64 / secs
            );
            assert_eq!(got, expected, "{kind} {label}: the receiver got every row to send, once");
            assert_eq!(sent, expected, "{kind} {label}: {run}");
            assert_eq!(counts["queried"].as_u64(), Some(rows));
            (diff, sent as f64 / send_secs, peak)
        };
        measure("first", rows).await;
        let (mut diffs, mut rates, mut peaks) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            warehouse.change(round).await;
            let (diff, rate, peak) = measure(&format!("round {}", round + 1), rows / 100).await;
            diffs.push(diff);
            rates.push(rate);
            peaks.push(peak);
        }
        println!(
            "{kind}: median of {rounds} rounds with 1% changed: diff of {rows} rows {:.2} s, {:.0} rows/s sent, peak RSS {:.1} MB",
            median(&mut diffs),
            median(&mut rates),
            median(&mut peaks)
        );
    }
}
