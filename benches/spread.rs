//! One large sync spread over servers by stream, as an operator meets it:
//! a pipeline of `BENCH_STREAMS` streams (default 8) of the bundled REST
//! source, each `BENCH_RECORDS` records (5,000) in pages of 100, the
//! provider taking `BENCH_PAGE_MS` (100) over each page, so each stream
//! reads at a fixed rate and the provider, not the machine, is the limit
//! per stream. The pipeline syncs in full into JSON lines, from
//! `POST /v1/pipelines/{id}/sync` to the job's end, on:
//!
//! - one `service serve` process with spreading off (streams one after
//!   another, as before `SERVICE_JOB_SPREAD_STREAMS`);
//! - one process with spreading on;
//! - three processes on one PostgreSQL with spreading on;
//!
//! each process with `BENCH_SLOTS` runners (4, the default
//! `SERVICE_JOB_CONCURRENCY`). It prints each setting's median over
//! `BENCH_ROUNDS` (3) and the speed-up of three processes over one.
//! Not CPU-bound: the debug build measures it as well.
//!
//! ```sh
//! cargo bench -p service --bench spread --profile dev
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::provider::{FakeProvider, TestCa};
use testkit::restapi::{self, RestApi};

mod servers;
use servers::{Installation, Scratch, Server};

const TOKEN: &str = "svc_bench_spread_admin_token_0123456789";

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn call(client: &reqwest::Client, method: reqwest::Method, base: &str, path: &str, body: Option<Value>) -> Value {
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

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(run());
}

async fn run() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let streams = setting("BENCH_STREAMS", 8) as usize;
    let records = setting("BENCH_RECORDS", 5_000) as usize;
    let rounds = setting("BENCH_ROUNDS", 3).max(1) as usize;
    let slots = setting("BENCH_SLOTS", 4);
    let scratch = Scratch::create("spread").await;
    let api = Arc::new(RestApi::new(records).with_token("bench-spread-token"));
    api.page_delay_ms.store(setting("BENCH_PAGE_MS", 100), std::sync::atomic::Ordering::SeqCst);
    let ca = TestCa::new();
    let provider = FakeProvider::start(&ca, &[restapi::HOST], restapi::router(api.clone())).await;
    let installation = Installation::new(&scratch.url, TOKEN, restapi::HOST, provider.pins(&[restapi::HOST]), &ca.pem)
        .with("SERVICE_JOB_CONCURRENCY", slots);
    let client = reqwest::Client::new();

    let pipeline = {
        let server = Server::start(&installation.env).await;
        let pipeline = make_pipeline(&client, &server.base, streams).await;
        drop(server);
        pipeline
    };
    println!(
        "{streams} streams of {records} records, pages of 100 taking {} ms each; {slots} runners a process; {rounds} rounds",
        setting("BENCH_PAGE_MS", 100)
    );
    let mut medians = Vec::new();
    for (label, processes, spread) in [
        ("one process, streams in turn", 1, false),
        ("one process, spread", 1, true),
        ("three processes, spread", 3, true),
    ] {
        let env: Vec<(&str, String)> =
            installation.env.iter().cloned().chain([("SERVICE_JOB_SPREAD_STREAMS", spread.to_string())]).collect();
        let mut servers = Vec::new();
        for _ in 0..processes {
            servers.push(Server::start(&env).await);
        }
        let mut times = Vec::new();
        for _ in 0..rounds {
            let started = Instant::now();
            let job = call(
                &client,
                reqwest::Method::POST,
                &servers[0].base,
                &format!("/v1/pipelines/{pipeline}/sync"),
                Some(json!({})),
            )
            .await;
            let job_id = job["data"]["job_id"].as_str().unwrap().to_owned();
            let last = loop {
                let j =
                    call(&client, reqwest::Method::GET, &servers[0].base, &format!("/v1/jobs/{job_id}"), None).await;
                if ["succeeded", "failed", "cancelled"].contains(&j["data"]["status"].as_str().unwrap_or_default()) {
                    break j["data"].clone();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            assert_eq!(last["status"], "succeeded", "{last}");
            assert_eq!(last["progress"]["records"], (streams * records) as u64, "{last}");
            times.push(started.elapsed().as_secs_f64());
        }
        drop(servers);
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "{label:<32} median {median:>6.2} s  ({:>8.0} records/s)  rounds {times:.2?}",
            (streams * records) as f64 / median
        );
        medians.push(median);
    }
    println!(
        "three processes over one: {:.2}x (spread), {:.2}x (against streams in turn)",
        medians[1] / medians[2],
        medians[0] / medians[2]
    );
    drop(provider);
    scratch.drop_now().await;
}

/// A pipeline of `streams` streams of the REST source, each reading all
/// of `/pages/items` (its name in the query), in full into JSON lines.
async fn make_pipeline(client: &reqwest::Client, base: &str, streams: usize) -> String {
    let post = |path: &'static str, body: Value| call(client, reqwest::Method::POST, base, path, Some(body));
    let cred = post(
        "/v1/credentials",
        json!({ "connector_id": "conn_rest_manifest", "hosts": [restapi::HOST], "secret": "bench-spread-token" }),
    )
    .await;
    let names: Vec<String> = (0..streams).map(|i| format!("s{i}")).collect();
    let specs: Vec<Value> = names
        .iter()
        .map(|name| {
            json!({ "name": name, "path": "/pages/items", "records": "/data", "primary_key": ["id"],
                "params": { "per_page": 100, "stream": name },
                "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" } })
        })
        .collect();
    let configuration = json!({ "base_url": format!("https://{}", restapi::HOST),
        "credential_handle": cred["data"]["credential_handle"], "manifest": { "streams": specs } });
    let source = post(
        "/v1/sources",
        json!({ "connector_id": "conn_rest_manifest", "name": "m", "configuration": configuration }),
    )
    .await;
    let destination =
        post("/v1/destinations", json!({ "name": "out", "kind": "jsonl", "configuration": { "directory": "out" } }))
            .await;
    let selected: Vec<Value> =
        names.iter().map(|name| json!({ "name": name, "sync_mode": "full_refresh_overwrite" })).collect();
    let pipeline = post(
        "/v1/pipelines",
        json!({ "name": "p", "source_id": source["data"]["source_id"],
            "destination_id": destination["data"]["destination_id"], "streams": selected }),
    )
    .await;
    pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned()
}
