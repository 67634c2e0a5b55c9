//! Schedules at scale across servers, as an operator meets them: three
//! `service serve` processes with eight runners each on one PostgreSQL,
//! `BENCH_SCHEDULES` pipelines (default 500) of the bundled REST source,
//! each on a one-minute schedule, run for `BENCH_SECS` (default 600: ten
//! ticks of every schedule); the provider takes `BENCH_PAGE_MS` (2,000)
//! over each page, so a tick's runs keep the runners busy a while. Half
//! way through, one server is killed with `kill -9` while every runner
//! runs a job.
//!
//! It reports, from the control database:
//!
//! - **double runs**: two scheduled jobs of one pipeline queued within
//!   half its interval (one tick queued twice), and ticks skipped because
//!   a run was active (rightly when the killed server held it, or a tick
//!   came before the last one's runs were done; wrongly when another
//!   server had queued the same tick). A tick taken by two servers shows
//!   as a double run only when the first run ended before the second was
//!   queued (`BENCH_PAGE_MS=0`), otherwise as a skip; only double runs
//!   are asserted, skips are reported;
//! - **stuck jobs**: jobs still queued or running a lease and a minute
//!   after the schedules stopped;
//! - **takeovers**: the killed server's jobs, each taken over by another
//!   (its attempt abandoned), and how long after the kill, against the
//!   lease (`SERVICE_JOB_LEASE_SECS`, 30 s);
//! - the runs queued and how they ended, and each tick's spread.
//!
//! Needs PostgreSQL: `BENCH_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`) names a server where a
//! database of its own is made and dropped. Not CPU-bound in what it
//! checks: the debug build runs it as well.
//!
//! ```sh
//! cargo bench -p service --bench schedules --profile dev
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::{Connection, Row};
use testkit::provider::{FakeProvider, TestCa};
use testkit::restapi::{self, RestApi};

mod servers;
use servers::{Installation, Scratch, Server};

const TOKEN: &str = "svc_bench_schedules_admin_token_012345";
const LEASE_SECS: u64 = 30;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn post(client: &reqwest::Client, base: &str, path: &str, body: Value) -> Value {
    let res = client.post(format!("{base}{path}")).bearer_auth(TOKEN).json(&body).send().await.unwrap();
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
    let schedules = setting("BENCH_SCHEDULES", 500) as usize;
    let secs = setting("BENCH_SECS", 600);
    let scratch = Scratch::create("schedules").await;
    let database_url = scratch.url.clone();

    // A page takes a while, as a real provider's does: a tick's runs
    // keep every runner busy for a part of the minute.
    let api = Arc::new(RestApi::new(20).with_token("bench-schedules-token"));
    api.page_delay_ms.store(setting("BENCH_PAGE_MS", 2000), std::sync::atomic::Ordering::SeqCst);
    let ca = TestCa::new();
    let provider = FakeProvider::start(&ca, &[restapi::HOST], restapi::router(api.clone())).await;
    let installation = Installation::new(&database_url, TOKEN, restapi::HOST, provider.pins(&[restapi::HOST]), &ca.pem)
        .with("SERVICE_JOB_CONCURRENCY", 8)
        .with("SERVICE_JOB_LEASE_SECS", LEASE_SECS);
    let env = &installation.env;
    let mut servers = vec![Server::start(env).await, Server::start(env).await, Server::start(env).await];
    let client = reqwest::Client::new();
    let base = servers[0].base.clone();
    let cred = post(
        &client,
        &base,
        "/v1/credentials",
        json!({ "connector_id": "conn_rest_manifest", "hosts": [restapi::HOST], "secret": "bench-schedules-token" }),
    )
    .await;
    let manifest = json!({ "streams": [{ "name": "items", "path": "/pages/items", "records": "/data", "primary_key": ["id"],
        "params": { "per_page": 20 }, "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" } }] });
    let configuration = json!({ "base_url": format!("https://{}", restapi::HOST),
        "credential_handle": cred["data"]["credential_handle"], "manifest": manifest });
    let source = post(
        &client,
        &base,
        "/v1/sources",
        json!({ "connector_id": "conn_rest_manifest", "name": "m", "configuration": configuration }),
    )
    .await;
    let created = Instant::now();
    for i in 0..schedules {
        let directory = format!("out-{i}");
        let body = json!({ "name": directory, "kind": "jsonl", "configuration": { "directory": directory } });
        let destination = post(&client, &base, "/v1/destinations", body).await;
        let body = json!({ "name": format!("p{i}"), "source_id": source["data"]["source_id"],
            "destination_id": destination["data"]["destination_id"], "schedule": { "kind": "interval", "minutes": 1 },
            "streams": [{ "name": "items", "sync_mode": "full_refresh_overwrite" }] });
        post(&client, &base, "/v1/pipelines", body).await;
    }
    println!(
        "{schedules} pipelines on a one-minute schedule, made in {:.1} s; three servers of eight runners, {secs} s",
        created.elapsed().as_secs_f64()
    );

    // Half way, the third server dies while it runs jobs.
    let mut db = sqlx::PgConnection::connect(&database_url).await.unwrap();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs / 2)).await;
    // Every runner busy: the third server's too.
    let running = "SELECT COUNT(*) FROM jobs WHERE status = 'running'";
    let waited = Instant::now();
    while waited.elapsed() < Duration::from_secs(120) {
        let n: i64 = sqlx::query_scalar(running).fetch_one(&mut db).await.unwrap();
        if n >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed_at = now_ms();
    let victim = servers.pop().unwrap();
    drop(victim);
    println!("third server killed after {:.0} s", started.elapsed().as_secs_f64());
    let left = Duration::from_secs(secs).saturating_sub(started.elapsed());
    tokio::time::sleep(left).await;

    // The schedules stop; what was queued runs out.
    sqlx::query("UPDATE pipelines SET next_run_at = NULL").execute(&mut db).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(LEASE_SECS + 60);
    let active = "SELECT COUNT(*) FROM jobs WHERE status IN ('queued', 'running')";
    while Instant::now() < deadline {
        let n: i64 = sqlx::query_scalar(active).fetch_one(&mut db).await.unwrap();
        if n == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let stuck: i64 = sqlx::query_scalar(active).fetch_one(&mut db).await.unwrap();

    let jobs = sqlx::query("SELECT pipeline_id, status, created_at FROM jobs WHERE trigger_source = 'schedule' ORDER BY pipeline_id, created_at")
        .fetch_all(&mut db)
        .await
        .unwrap();
    let mut by_pipeline: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for row in &jobs {
        by_pipeline.entry(row.get("pipeline_id")).or_default().push(row.get("created_at"));
        *statuses.entry(row.get("status")).or_default() += 1;
    }
    // A due run that met an active job of its pipeline is skipped (and
    // audited): rightly when a run outlasts the interval (or its server
    // died holding it), wrongly when two servers both took the tick.
    let skipped: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM audit_logs WHERE action = 'pipelines.schedule_skipped'")
            .fetch_one(&mut db)
            .await
            .unwrap();
    let double_runs: usize =
        by_pipeline.values().map(|times| times.windows(2).filter(|w| w[1] - w[0] < 30_000).count()).sum();
    let runs: Vec<usize> = by_pipeline.values().map(Vec::len).collect();
    let (fewest, most) = (runs.iter().min().copied().unwrap_or(0), runs.iter().max().copied().unwrap_or(0));

    // The killed server's jobs: attempts abandoned, and when the next
    // attempt of each started.
    let takeovers = sqlx::query(
        "SELECT a.job_id, n.started_at FROM job_attempts a JOIN job_attempts n ON n.job_id = a.job_id AND n.attempt = a.attempt + 1 \
         WHERE a.outcome = 'abandoned' AND a.started_at <= $1",
    )
    .bind(killed_at)
    .fetch_all(&mut db)
    .await
    .unwrap();
    let after: Vec<f64> =
        takeovers.iter().map(|r| (r.get::<i64, _>("started_at") - killed_at) as f64 / 1000.0).collect();
    let latest = after.iter().copied().fold(0.0, f64::max);

    println!(
        "scheduled runs: {} ({:?}); per pipeline {fewest}..{most} (ticks in {secs} s: about {})",
        jobs.len(),
        statuses,
        secs / 60
    );
    println!("double runs: {double_runs}; ticks skipped for an active run: {skipped}");
    println!("stuck jobs a lease and a minute after the schedules stopped: {stuck}");
    println!(
        "killed server's jobs taken over: {} (abandoned attempts), the last {latest:.1} s after the kill (lease {LEASE_SECS} s)",
        takeovers.len()
    );
    println!("provider requests: {}", api.requests.load(std::sync::atomic::Ordering::SeqCst));
    drop(servers);
    drop(db);
    scratch.drop_now().await;
    assert_eq!(double_runs, 0, "a tick was queued twice");
    assert_eq!(stuck, 0, "jobs were left queued or running");
    assert!(!takeovers.is_empty(), "the killed server held no job to take over");
    assert!(latest <= LEASE_SECS as f64 + 5.0, "a takeover came {latest:.1} s after the kill");
}

/// Now, in Unix ms, as the servers record times (all run on this
/// machine).
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}
