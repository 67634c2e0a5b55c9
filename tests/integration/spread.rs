//! One sync spread over servers by stream (`SERVICE_JOB_SPREAD_STREAMS`):
//! its streams read side by side by the runners of several processes,
//! every record once in every stream when a process is killed with
//! `kill -9` mid-sync, a resumed incremental sync reading on from the
//! state each stream saved, a stream that fails retried alone while the
//! others are not read again (on both control databases), one that fails
//! for good failing the job once the others ended, a workspace's cap on
//! runners kept, and a cancellation stopping every runner reading.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use sqlx::{Connection, Row};
use testkit::restapi::RestApi;

use crate::support::json_ok;
use crate::support::process::ServerProcess;
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::replicas::{CrashInto, CrashTarget, Processes};

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("s{i}")).collect()
}

/// `(status, attempts, runner)` of each stream row of a job, by stream.
async fn stream_rows(control_url: &str, job_id: &str) -> Vec<(String, String, i64, String)> {
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(control_url).await.unwrap();
    let rows = sqlx::query(
        "SELECT stream, status, attempts, COALESCE(runner, '') AS runner FROM job_streams WHERE job_id = $1 ORDER BY stream",
    )
    .bind(job_id)
    .fetch_all(&mut c)
    .await
    .unwrap();
    rows.iter()
        .map(|r| {
            (
                r.try_get("stream").unwrap(),
                r.try_get("status").unwrap(),
                r.try_get("attempts").unwrap(),
                r.try_get("runner").unwrap(),
            )
        })
        .collect()
}

/// A `RestApi` of `records` records behind a fake provider, the token it
/// takes, and server processes that reach it and spread syncs.
async fn spreading(records: usize) -> (Arc<RestApi>, FakeProvider, Processes, String) {
    let ca = TestCa::new();
    let token = format!("spread-{}", uuid::Uuid::new_v4().simple());
    let api = Arc::new(RestApi::new(records).with_token(token.clone()));
    let provider = FakeProvider::start(&ca, &["api.source.test"], testkit::restapi::router(api.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("SERVICE_JOB_SPREAD_STREAMS", "true".into()));
    (api, provider, procs, token)
}

async fn sync(procs: &Processes, base: &str, pipeline: &str) -> String {
    let job = json_ok(
        procs.api(base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).json(&json!({})).send().await.unwrap(),
    )
    .await;
    job["data"]["job_id"].as_str().unwrap().to_owned()
}

/// Every stream of the job's last progress, with `records` written each
/// and a balanced ledger.
fn assert_every_stream_shows(job: &Value, streams: &[String], records: u64) {
    let progress = &job["progress"];
    for s in streams {
        assert_eq!(progress["streams"][s]["records_read"], records, "{s}: {progress}");
        assert_eq!(progress["streams"][s]["status"], "done", "{s}: {progress}");
        assert_eq!(progress["ledger"]["streams"][s]["unaccounted"], 0, "{s}: {progress}");
    }
    assert_eq!(progress["ledger"]["balanced"], true, "{progress}");
}

/// Which server a crash test kills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Killed {
    /// The one whose runner holds the job (and merges its streams).
    Coordinator,
    /// One that only reads streams for it.
    Helper,
}

/// Three server processes with one runner each on one PostgreSQL, a sync
/// of eight streams into a PostgreSQL warehouse: all three read its
/// streams at once; one process is killed with `kill -9` while each holds
/// a stream, and the job still ends with every record of every stream
/// once: the killed process's stream taken over, and the job too when
/// that process held it. A second, incremental sync reads on from each
/// stream's saved state, wherever it was saved.
async fn a_sync_spread_over_three_servers_keeps_every_record_once_when_one_is_killed(killed: Killed) {
    crate::support::init_crypto();
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let Some(mut target) = CrashTarget::new(CrashInto::Postgres).await else { return };
    let (api, _provider, mut procs, token) = spreading(2000).await;
    procs.env.push(("DATABASE_URL", db.url.clone()));
    procs.env.push(("SERVICE_JOB_CONCURRENCY", "1".into()));
    procs.env.push(("SERVICE_JOB_LEASE_SECS", "2".into()));
    procs.env.extend(target.env());
    let mut a = ServerProcess::start(procs.env.clone()).await;
    let streams = names(8);
    let destination = target.destination("w.db");
    let pipeline =
        procs.rest_manifest_streams_into(&a.base, &token, 100, "incremental_append", destination, &streams).await;
    // 20 pages of 100 a stream, 80 ms each: under two seconds a stream.
    api.page_delay_ms.store(80, Ordering::SeqCst);
    // The first server alone takes the job: it coordinates.
    let job_id = sync(&procs, &a.base, &pipeline).await;
    let mut rows = Vec::new();
    for _ in 0..400 {
        rows = stream_rows(&db.url, &job_id).await;
        if rows.iter().any(|r| r.1 == "running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let b = ServerProcess::start(procs.env.clone()).await;
    let mut c = ServerProcess::start(procs.env.clone()).await;
    for _ in 0..400 {
        rows = stream_rows(&db.url, &job_id).await;
        if rows.iter().filter(|r| r.1 == "running").count() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rows.iter().filter(|r| r.1 == "running").count(), 3, "every process holds a stream: {rows:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    match killed {
        Killed::Coordinator => a.kill(),
        Killed::Helper => c.kill(),
    }
    let last = procs.wait(&b.base, &job_id).await;
    assert_eq!(last["status"], "succeeded", "{killed:?}: {last}");
    let taken_over = if killed == Killed::Coordinator { 2 } else { 1 };
    assert_eq!(last["attempts"], taken_over, "{killed:?}: the job taken over only with its coordinator: {last}");
    let rows = stream_rows(&db.url, &job_id).await;
    assert!(rows.iter().all(|r| r.1 == "succeeded"), "{killed:?}: {rows:?}");
    let runners: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.3.as_str()).collect();
    assert!(runners.len() >= 2, "{killed:?}: streams read by more than one runner: {rows:?}");
    assert!(rows.iter().any(|r| r.2 >= 2), "{killed:?}: the killed process's stream was taken over: {rows:?}");
    assert!(api.most_pages_in_flight.load(Ordering::SeqCst) >= 3, "three streams read at once");
    for s in &streams {
        assert_eq!(target.count(&procs, "w.db", s, "id").await, (2000, 2000), "{killed:?}: stream {s}");
        assert_eq!(last["progress"]["streams"][s]["status"], "done", "{s}: {last}");
    }
    assert_eq!(last["progress"]["ledger"]["balanced"], true, "{last}");

    // Read on from each stream's state: only what was added.
    api.page_delay_ms.store(0, Ordering::SeqCst);
    api.add(300);
    let job_id = sync(&procs, &b.base, &pipeline).await;
    let last = procs.wait(&b.base, &job_id).await;
    assert_eq!(last["status"], "succeeded", "{last}");
    assert_eq!(last["attempts"], 1, "{last}");
    assert_every_stream_shows(&last, &streams, 300);
    for s in &streams {
        assert_eq!(target.count(&procs, "w.db", s, "id").await, (2300, 2300), "{killed:?}: stream {s}");
    }
    drop((a, b, c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_spread_over_three_servers_keeps_every_record_once_when_its_coordinator_is_killed() {
    a_sync_spread_over_three_servers_keeps_every_record_once_when_one_is_killed(Killed::Coordinator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_spread_over_three_servers_keeps_every_record_once_when_a_helper_is_killed() {
    a_sync_spread_over_three_servers_keeps_every_record_once_when_one_is_killed(Killed::Helper).await;
}

/// One process with three runners on each control database: a sync of
/// four streams reads three at once; one stream's provider fails it once,
/// and that stream alone is read again (after its backoff) while the job
/// keeps its one attempt and no other stream's first page is asked twice.
async fn a_failed_stream_of_a_spread_sync_is_retried_alone(on_postgres: bool) {
    crate::support::init_crypto();
    let db = if on_postgres {
        match crate::support::PgDatabase::create().await {
            Some(db) => Some(db),
            None => return,
        }
    } else {
        None
    };
    let (api, _provider, mut procs, token) = spreading(600).await;
    if let Some(db) = &db {
        procs.env.push(("DATABASE_URL", db.url.clone()));
    }
    procs.env.push(("SERVICE_JOB_CONCURRENCY", "3".into()));
    let server = ServerProcess::start(procs.env.clone()).await;
    let streams = names(4);
    let destination = json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "w.db" } });
    let pipeline =
        procs.rest_manifest_streams_into(&server.base, &token, 100, "incremental_deduped", destination, &streams).await;
    api.page_delay_ms.store(30, Ordering::SeqCst);
    *api.failing_stream.lock().unwrap() = Some(("s2".into(), 1));
    // What the source asked when it was made is not the sync's.
    api.asked.lock().unwrap().clear();
    let job_id = sync(&procs, &server.base, &pipeline).await;
    let last = procs.wait(&server.base, &job_id).await;
    assert_eq!(last["status"], "succeeded", "{last}");
    assert_eq!(last["attempts"], 1, "the job itself is not retried: {last}");
    assert_every_stream_shows(&last, &streams, 600);
    let control = match &db {
        Some(db) => db.url.clone(),
        None => format!("sqlite://{}?mode=ro", procs.data_dir().join("service.db").display()),
    };
    let rows = stream_rows(&control, &job_id).await;
    let attempts: Vec<(&str, i64)> = rows.iter().map(|r| (r.0.as_str(), r.2)).collect();
    assert_eq!(attempts, [("s0", 1), ("s1", 1), ("s2", 2), ("s3", 1)], "{rows:?}");
    let asked = api.asked.lock().unwrap().clone();
    // A stream's first page: its `page` parameter absent or 1.
    let firsts = |s: &str| {
        asked
            .iter()
            .filter(|uri| {
                let query = uri.split_once('?').map(|(_, q)| q).unwrap_or("");
                let params: Vec<&str> = query.split('&').collect();
                params.contains(&format!("stream={s}").as_str())
                    && params.iter().all(|p| !p.starts_with("page=") || *p == "page=1")
            })
            .count()
    };
    assert_eq!([firsts("s0"), firsts("s1"), firsts("s2"), firsts("s3")], [1, 1, 2, 1], "{asked:?}");
    assert!(api.most_pages_in_flight.load(Ordering::SeqCst) >= 2, "streams read side by side");
    let warehouse = procs.warehouse();
    for s in &streams {
        assert_eq!(crate::support::count_rows(&warehouse, s).await, 600, "stream {s}");
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_stream_of_a_spread_sync_is_retried_alone_on_sqlite() {
    a_failed_stream_of_a_spread_sync_is_retried_alone(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_stream_of_a_spread_sync_is_retried_alone_on_postgres() {
    a_failed_stream_of_a_spread_sync_is_retried_alone(true).await;
}

/// A workspace capped at one running job (`SERVICE_JOB_CONCURRENCY_PER_WORKSPACE`)
/// gets no more runners through a spread sync: its job's own runner reads
/// every stream, one after another, while the server's other runners stay
/// free for other workspaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spread_sync_keeps_to_its_workspaces_cap_on_runners() {
    crate::support::init_crypto();
    let (api, _provider, mut procs, token) = spreading(300).await;
    procs.env.push(("SERVICE_JOB_CONCURRENCY", "3".into()));
    procs.env.push(("SERVICE_JOB_CONCURRENCY_PER_WORKSPACE", "1".into()));
    let server = ServerProcess::start(procs.env.clone()).await;
    let streams = names(3);
    let destination = json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "w.db" } });
    let pipeline =
        procs.rest_manifest_streams_into(&server.base, &token, 100, "incremental_deduped", destination, &streams).await;
    api.page_delay_ms.store(30, Ordering::SeqCst);
    let job_id = sync(&procs, &server.base, &pipeline).await;
    let last = procs.wait(&server.base, &job_id).await;
    assert_eq!(last["status"], "succeeded", "{last}");
    assert_every_stream_shows(&last, &streams, 300);
    let control = format!("sqlite://{}?mode=ro", procs.data_dir().join("service.db").display());
    let rows = stream_rows(&control, &job_id).await;
    let runners: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.3.as_str()).collect();
    assert_eq!(runners.len(), 1, "one runner read every stream: {rows:?}");
    drop(server);
}

/// A stream that fails for good fails the job once the other streams
/// have ended, naming it; the others are loaded whole, each read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_fails_for_good_fails_the_spread_job_after_the_others_end() {
    crate::support::init_crypto();
    let (api, _provider, mut procs, token) = spreading(300).await;
    procs.env.push(("SERVICE_JOB_CONCURRENCY", "2".into()));
    let server = ServerProcess::start(procs.env.clone()).await;
    let streams = names(3);
    let destination = json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "w.db" } });
    let pipeline =
        procs.rest_manifest_streams_into(&server.base, &token, 100, "incremental_deduped", destination, &streams).await;
    api.page_delay_ms.store(30, Ordering::SeqCst);
    *api.missing_stream.lock().unwrap() = Some("s1".into());
    api.asked.lock().unwrap().clear();
    let job_id = sync(&procs, &server.base, &pipeline).await;
    let last = procs.wait(&server.base, &job_id).await;
    assert_eq!(last["status"], "failed", "{last}");
    assert!(last["error"].as_str().unwrap_or_default().starts_with("stream s1: "), "{last}");
    let warehouse = procs.warehouse();
    for s in ["s0", "s2"] {
        assert_eq!(crate::support::count_rows(&warehouse, s).await, 300, "stream {s}");
        assert_eq!(last["progress"]["streams"][s]["status"], "done", "{s}: {last}");
    }
    let control = format!("sqlite://{}?mode=ro", procs.data_dir().join("service.db").display());
    let rows = stream_rows(&control, &job_id).await;
    let states: Vec<(&str, &str, i64)> = rows.iter().map(|r| (r.0.as_str(), r.1.as_str(), r.2)).collect();
    assert_eq!(states, [("s0", "succeeded", 1), ("s1", "failed", 1), ("s2", "succeeded", 1)], "{rows:?}");
    drop(server);
}

/// A spread sync cancelled while its streams are read: every runner
/// reading one stops (the provider sees no request after a moment), the
/// job ends cancelled, and no stream of it is claimed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_spread_sync_stops_every_runner_reading_it() {
    crate::support::init_crypto();
    let (api, _provider, mut procs, token) = spreading(3000).await;
    procs.env.push(("SERVICE_JOB_CONCURRENCY", "3".into()));
    let server = ServerProcess::start(procs.env.clone()).await;
    let streams = names(3);
    let destination = json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "w.db" } });
    let pipeline =
        procs.rest_manifest_streams_into(&server.base, &token, 100, "incremental_deduped", destination, &streams).await;
    // 30 pages of 100 ms a stream: three seconds each.
    api.page_delay_ms.store(100, Ordering::SeqCst);
    let job_id = sync(&procs, &server.base, &pipeline).await;
    let control = format!("sqlite://{}?mode=ro", procs.data_dir().join("service.db").display());
    let mut rows = Vec::new();
    for _ in 0..300 {
        rows = stream_rows(&control, &job_id).await;
        if rows.iter().filter(|r| r.1 == "running").count() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rows.iter().filter(|r| r.1 == "running").count(), 3, "three runners read: {rows:?}");
    let cancel = format!("/v1/jobs/{job_id}/cancel");
    json_ok(procs.api(&server.base, Method::POST, &cancel).send().await.unwrap()).await;
    let last = procs.wait(&server.base, &job_id).await;
    assert_eq!(last["status"], "cancelled", "{last}");
    // Within the cancellation poll and a page in flight, the reading stops.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let asked = api.requests();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(api.requests(), asked, "no request after the runners stopped");
    let rows = stream_rows(&control, &job_id).await;
    assert!(rows.iter().all(|r| r.1 == "queued"), "each stopped stream put back, none held: {rows:?}");
    assert!(rows.iter().all(|r| r.2 == 0), "a stopped attempt is not counted: {rows:?}");
    drop(server);
}
