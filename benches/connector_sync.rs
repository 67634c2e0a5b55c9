//! End-to-end sync as a user meets it: the server's real router on a
//! loopback port, `POST /v1/pipelines/{id}/sync` to the job's end (polled
//! with `GET /v1/jobs/{id}`), the bundled email-campaign connector reading
//! `BENCH_RECORDS` (100,000) campaigns of about 1 KB over HTTPS, 100 per
//! page as the connector asks, from an in-process server answering
//! pre-rendered Mailcoach pages (no JSON is built per request), into an
//! SQLite destination and, when `BENCH_POSTGRES_URL` names a database, a
//! PostgreSQL one.
//!
//! Run with `cargo bench -p service --bench connector_sync`. Each
//! destination gets `BENCH_ROUNDS` (5) rounds, taking turns; the summary
//! is the median. `BENCH_PROVIDER_DELAY_MS` makes the provider wait that
//! long before each answer, as one across a network does; the bench then
//! prints the best a read one page at a time could do, which reading ahead
//! must beat. Nothing asserts the figures; benches/README.md keeps
//! them. The CPU seconds of the whole process (provider included) are
//! reported beside the wall-clock rate.

#[path = "../tests/integration/support/provider.rs"]
#[allow(dead_code)]
mod provider;
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::Query;
use axum::http::HeaderMap;
use serde_json::{Value, json};
use service::egress::EgressPolicy;

const HOST: &str = "mail.acme-corp.com";
const PER_PAGE: usize = 100;
const PROVIDER_TOKEN: &str = "bench-provider-token-0123456789";

/// One campaign of about 1 KB, as Mailcoach lists it.
fn campaign(i: usize) -> Value {
    let sent = 1000 + i as u64 * 10;
    json!({
        "uuid": format!("00000000-0000-4000-8000-{i:012}"),
        "name": format!("Newsletter {i}"),
        "email_list_uuid": "10000000-0000-4000-8000-000000000001",
        "status": "sent",
        "subject": format!("Issue {i}: what changed this week"),
        "from_email": "news@acme-corp.com",
        "html": format!("<html><body>{}</body></html>", "campaign body text ".repeat(24)),
        "sent_to_number_of_subscribers": sent,
        "open_count": sent / 2,
        "unique_open_count": sent / 3,
        "click_count": sent / 10,
        "unique_click_count": sent / 12,
        "unsubscribe_count": 3,
        "bounce_count": 20,
        "open_rate": 3333,
        "click_rate": 833,
        "unsubscribe_rate": 30,
        "bounce_rate": 200,
        "sent_at": format!("2024-03-{:02}T09:00:00.000000Z", 1 + i % 28),
        "created_at": "2024-02-01T09:00:00.000000Z",
        "updated_at": format!("2024-03-{:02}T10:00:00.000000Z", 1 + i % 28),
    })
}

/// Every page of the campaign list, rendered once; and the record size.
fn pages(records: usize) -> (Arc<Vec<Bytes>>, usize) {
    let last = records.div_ceil(PER_PAGE).max(1);
    let size = campaign(0).to_string().len();
    let pages = (1..=last)
        .map(|p| {
            let data: Vec<Value> = ((p - 1) * PER_PAGE..(p * PER_PAGE).min(records)).map(campaign).collect();
            let link = |n: usize| json!(format!("https://{HOST}/api/campaigns?page={n}"));
            let body = json!({
                "data": data,
                "links": { "first": link(1), "last": link(last), "prev": if p > 1 { link(p - 1) } else { Value::Null }, "next": if p < last { link(p + 1) } else { Value::Null } },
                "meta": { "current_page": p, "last_page": last, "per_page": PER_PAGE, "total": records }
            });
            Bytes::from(body.to_string())
        })
        .collect();
    (Arc::new(pages), size)
}

/// The provider: the campaign list, page by page, behind the bearer token,
/// each answer given after `delay` (a provider across a network).
fn router(pages: Arc<Vec<Bytes>>, delay: Duration) -> axum::Router {
    axum::Router::new().route(
        "/api/campaigns",
        axum::routing::get(move |headers: HeaderMap, Query(q): Query<std::collections::HashMap<String, String>>| {
            let pages = pages.clone();
            async move {
                use axum::response::IntoResponse;
                if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {PROVIDER_TOKEN}")) {
                    return (axum::http::StatusCode::UNAUTHORIZED, "{\"message\":\"Unauthenticated.\"}").into_response();
                }
                tokio::time::sleep(delay).await;
                let n: usize = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(1).max(1);
                let body = pages.get(n - 1).cloned().unwrap_or_else(|| Bytes::from_static(b"{\"data\":[],\"meta\":{}}"));
                ([("content-type", "application/json")], body).into_response()
            }
        }),
    )
}

/// CPU seconds the process has used so far (Linux `/proc/self/stat`).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.base)).bearer_auth("svc_bench_bootstrap_token_0123456789");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {body}");
        body["data"].clone()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let records: usize = std::env::var("BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let rounds: usize = std::env::var("BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let delay = Duration::from_millis(std::env::var("BENCH_PROVIDER_DELAY_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(0));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let (pages, size) = pages(records);
        let ca = provider::TestCa::new();
        let provider = provider::FakeProvider::start(&ca, &[HOST], router(pages, delay)).await;
        let egress = EgressPolicy::from_settings(HOST, Some(&provider.pins(&[HOST])), Some(ca.pem.as_bytes())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let state = support::state(dir.path(), egress).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = service::server::start_on(listener, state).unwrap();
        let api = Api { http: reqwest::Client::new(), base: format!("http://{}/v1", server.addr) };

        let cred = api
            .call(reqwest::Method::POST, "/credentials/emailcampaign/api-token", Some(json!({ "base_url": format!("https://{HOST}/api"), "api_token": PROVIDER_TOKEN })))
            .await;
        let configuration = json!({ "base_url": format!("https://{HOST}/api"), "credential_handle": cred["credential_handle"] });
        let source = api.call(reqwest::Method::POST, "/sources", Some(json!({ "connector_id": "conn_emailcampaign_edm", "name": "bench", "configuration": configuration }))).await;
        let mut targets = vec![("SQLite", json!({ "name": "sqlite", "kind": "sqlite", "configuration": { "file": "bench.db" } }))];
        if let Ok(url) = std::env::var("BENCH_POSTGRES_URL") {
            targets.push(("PostgreSQL", json!({ "name": "postgres", "kind": "postgres", "configuration": { "url": url } })));
        }
        let mut pipelines = Vec::new();
        for (name, destination) in &targets {
            let d = api.call(reqwest::Method::POST, "/destinations", Some(destination.clone())).await;
            let body = json!({
                "name": format!("bench {name}"),
                "source_id": source["source_id"],
                "destination_id": d["destination_id"],
                "streams": [{ "name": "campaigns", "sync_mode": "full_refresh_overwrite" }],
            });
            let p = api.call(reqwest::Method::POST, "/pipelines", Some(body)).await;
            pipelines.push((*name, p["pipeline_id"].as_str().unwrap().to_owned(), Vec::new(), Vec::new()));
        }

        println!("{records} campaigns of {size} bytes, {PER_PAGE} per page, {rounds} rounds");
        if !delay.is_zero() {
            let pages = records.div_ceil(PER_PAGE) as f64;
            println!(
                "the provider answers each page after {} ms: one page at a time could reach at most {:.0} records/s",
                delay.as_millis(),
                records as f64 / (pages * delay.as_secs_f64())
            );
        }
        for round in 1..=rounds {
            for (name, pipeline, rates, cpus) in &mut pipelines {
                let cpu = cpu_seconds();
                let started = Instant::now();
                let job = api.call(reqwest::Method::POST, &format!("/pipelines/{pipeline}/sync"), Some(json!({}))).await;
                let job_id = job["job_id"].as_str().unwrap().to_owned();
                let done = loop {
                    let j = api.call(reqwest::Method::GET, &format!("/jobs/{job_id}"), None).await;
                    match j["status"].as_str() {
                        Some("succeeded") => break j,
                        Some("failed" | "cancelled") => panic!("the job ended {j}"),
                        _ => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                };
                let secs = started.elapsed().as_secs_f64();
                let got = done["progress"]["records"].as_u64().unwrap();
                assert_eq!(got as usize, records, "every record synced: {done}");
                let rate = got as f64 / secs;
                let used = cpu_seconds() - cpu;
                println!("round {round} {name:<10} {rate:>10.0} records/s {:>7.1} MB/s ({secs:.2} s, {used:.2} CPU-s)", rate * size as f64 / 1e6);
                rates.push(rate);
                cpus.push(used);
            }
        }
        for (name, _, rates, cpus) in pipelines {
            println!("median {name:<10} {:>10.0} records/s ({:.2} CPU-s per run)", median(rates), median(cpus));
        }
        server.stop().await.unwrap();
    });
}
