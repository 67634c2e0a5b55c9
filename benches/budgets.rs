//! A provider rate budget shared by two servers, measured as an operator
//! meets it: two `service serve` processes on one PostgreSQL, the bundled
//! REST source syncing two pipelines on one credential (one sync on each
//! server, again and again), a budget on the credential set with `service
//! admin set-rate-budget`. The fake provider records when each request
//! arrives; the benchmark reports the most that arrived within any
//! `BENCH_SECS` (default 60) and within any second, against the budget's
//! `BENCH_BUDGET` requests a second (default 50) and `BENCH_BURST`
//! (default 5).
//!
//! Needs PostgreSQL: `BENCH_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`) names a server where a
//! database of its own is made and dropped.
//!
//! ```sh
//! cargo bench -p service --bench budgets
//! ```

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::middleware::Next;
use serde_json::{Value, json};
use testkit::provider::{FakeProvider, TestCa};
use testkit::restapi::{self, RestApi};

mod servers;
use servers::{Installation, Scratch, Server};

const TOKEN: &str = "svc_bench_budget_admin_token_0123456789";
const PER_PAGE: usize = 10;

fn setting(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn call(client: &reqwest::Client, base: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let mut req = client.request(method, format!("{base}{path}")).bearer_auth(TOKEN);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

/// The most of `times` (in order) within any span of `width`.
fn most_within(times: &[Instant], width: Duration) -> usize {
    let mut first = 0;
    let mut most = 0;
    for (last, t) in times.iter().enumerate() {
        while t.duration_since(times[first]) >= width {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(run());
}

async fn run() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let secs = setting("BENCH_SECS", 60.0);
    let rate = setting("BENCH_BUDGET", 50.0);
    let burst = setting("BENCH_BURST", 5.0) as u32;
    let scratch = Scratch::create("budgets").await;
    let database_url = scratch.url.clone();

    // Enough pages that the two syncs together outlast the window.
    let pages = (rate * secs * 0.6).ceil() as usize + 10;
    let api = Arc::new(RestApi::new(pages * PER_PAGE).with_token("bench-budget-token"));
    let arrivals = Arc::new(Mutex::new(Vec::<Instant>::with_capacity(pages * 4)));
    let recorded = arrivals.clone();
    let router = restapi::router(api).layer(axum::middleware::from_fn(move |req: Request, next: Next| {
        let recorded = recorded.clone();
        async move {
            recorded.lock().unwrap().push(Instant::now());
            next.run(req).await
        }
    }));
    let ca = TestCa::new();
    let provider = FakeProvider::start(&ca, &[restapi::HOST], router).await;

    let installation = Installation::new(&database_url, TOKEN, restapi::HOST, provider.pins(&[restapi::HOST]), &ca.pem)
        .with("SERVICE_JOB_CONCURRENCY", 1);
    let env = &installation.env;
    let a = Server::start(env).await;
    let b = Server::start(env).await;
    let client = reqwest::Client::new();
    let post = |path: &'static str, body: Value| call(&client, &a.base, reqwest::Method::POST, path, Some(body));
    let cred = post(
        "/v1/credentials",
        json!({ "connector_id": "conn_rest_manifest", "hosts": [restapi::HOST], "secret": "bench-budget-token" }),
    )
    .await;
    let manifest = json!({ "streams": [{ "name": "items", "path": "/pages/items", "records": "/data", "primary_key": ["id"],
        "params": { "per_page": PER_PAGE }, "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" } }] });
    let configuration = json!({ "base_url": format!("https://{}", restapi::HOST), "credential_handle": cred["data"]["credential_handle"], "manifest": manifest });
    let source = post(
        "/v1/sources",
        json!({ "connector_id": "conn_rest_manifest", "name": "m", "configuration": configuration }),
    )
    .await;
    let mut pipelines = Vec::new();
    for file in ["one", "two"] {
        let destination =
            post("/v1/destinations", json!({ "name": file, "kind": "jsonl", "configuration": { "directory": file } }))
                .await;
        let pipeline = post(
            "/v1/pipelines",
            json!({ "name": file, "source_id": source["data"]["source_id"], "destination_id": destination["data"]["destination_id"],
                "streams": [{ "name": "items", "sync_mode": "full_refresh_overwrite" }] }),
        )
        .await;
        pipelines.push(pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned());
    }
    let credential = cred["data"]["credential_id"].as_str().unwrap().to_owned();
    let set = Command::new(env!("CARGO_BIN_EXE_service"))
        .env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["admin", "set-rate-budget", "--credential", &credential])
        .args(["--per-second", &rate.to_string(), "--burst", &burst.to_string()])
        .output()
        .unwrap();
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // One sync through each server; each server has one runner, so each
    // runs one.
    let started = Instant::now();
    let mut jobs = Vec::new();
    for (pipeline, server) in pipelines.iter().zip([&a, &b]) {
        let path = format!("/v1/pipelines/{pipeline}/sync");
        let job = call(&client, &server.base, reqwest::Method::POST, &path, None).await;
        jobs.push(job["data"]["job_id"].as_str().unwrap().to_owned());
    }
    for job in &jobs {
        loop {
            let j = call(&client, &a.base, reqwest::Method::GET, &format!("/v1/jobs/{job}"), None).await;
            match j["data"]["status"].as_str() {
                Some("succeeded") => break,
                Some("failed" | "cancelled") => panic!("the sync failed: {j}"),
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    let took = started.elapsed();
    drop((a, b));
    let times = arrivals.lock().unwrap().clone();
    let window = Duration::from_secs_f64(secs);
    let in_window = most_within(&times, window);
    let in_second = most_within(&times, Duration::from_secs(1));
    let allowed = (rate * secs).floor() as usize + burst as usize;
    println!(
        "budget {rate}/s burst {burst}, two servers, {} requests in {:.1} s ({:.1}/s)",
        times.len(),
        took.as_secs_f64(),
        times.len() as f64 / took.as_secs_f64()
    );
    println!("most within any {secs} s: {in_window} (budget {allowed}); within any second: {in_second}");
    assert!(in_window <= allowed + 1, "{in_window} requests within {secs} s exceed {allowed}");
    scratch.drop_now().await;
}
