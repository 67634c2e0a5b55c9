//! Provider rate budgets shared by every server: syncs drawing on one
//! budget never exceed it together, on one server or on two sharing
//! PostgreSQL; a `Retry-After` one server meets holds the other too; an
//! operator sets, lists and clears budgets, and `/metrics` shows them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::IntoResponse;
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::events::{Events, routes, slow_events};
use crate::support::json_ok;
use crate::support::process::{ServerProcess, command};
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::replicas::Processes;

/// When each request reached the fake provider; the `refuse`-th (from 1)
/// is answered `429` with `Retry-After: 2`.
struct Arrivals {
    at: Mutex<Vec<Instant>>,
    refuse: usize,
}

impl Arrivals {
    fn new(refuse: usize) -> Arc<Arrivals> {
        Arc::new(Arrivals { at: Mutex::new(Vec::new()), refuse })
    }

    /// `inner`, every request to it recorded first.
    fn around(self: &Arc<Self>, inner: Router) -> Router {
        let arrivals = self.clone();
        inner.layer(axum::middleware::from_fn(move |req: Request, next: Next| {
            let arrivals = arrivals.clone();
            async move {
                let n = {
                    let mut at = arrivals.at.lock().unwrap();
                    at.push(Instant::now());
                    at.len()
                };
                if n == arrivals.refuse {
                    return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "2")], "slow down").into_response();
                }
                next.run(req).await
            }
        }))
    }

    fn times(&self) -> Vec<Instant> {
        self.at.lock().unwrap().clone()
    }

    /// The most requests that arrived within any span of `width`.
    fn most_within(&self, width: Duration) -> usize {
        let times = self.times();
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
}

/// `service admin …` against the servers' database.
fn admin(procs: &Processes, args: &[&str]) -> std::process::Output {
    command().envs(procs.env.iter().map(|(k, v)| (*k, v.as_str()))).arg("admin").args(args).output().unwrap()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Through the server at `base`: the paged source on one credential for
/// `events` (`page_size` records a page) and two pipelines reading it
/// into two SQLite files. Returns the credential's id and the pipelines.
async fn two_pipelines_on_one_credential(
    procs: &Processes,
    base: &str,
    events: &Events,
    page_size: u64,
) -> (String, [String; 2]) {
    let post = |path: &str, body: Value| {
        let sent = procs.api(base, Method::POST, path).json(&body).send();
        async move { json_ok(sent.await.unwrap()).await }
    };
    json_ok(procs.api(base, Method::POST, "/v1/admin/plugins/test_paged_source/load").send().await.unwrap()).await;
    let cred = post("/v1/credentials", json!({ "hosts": ["api.source.test"], "secret": events.token })).await;
    let configuration = json!({ "base_url": "https://api.source.test", "credential_handle": cred["data"]["credential_handle"], "page_size": page_size });
    let source = post(
        "/v1/sources",
        json!({ "connector_id": "test_paged_source", "name": "e", "configuration": configuration }),
    )
    .await;
    let mut pipelines = Vec::new();
    for file in ["one.db", "two.db"] {
        let destination =
            post("/v1/destinations", json!({ "name": file, "kind": "sqlite", "configuration": { "file": file } }))
                .await;
        let pipeline = post(
            "/v1/pipelines",
            json!({ "name": file, "source_id": source["data"]["source_id"], "destination_id": destination["data"]["destination_id"],
                "streams": [{ "name": "events", "sync_mode": "full_refresh_overwrite" }] }),
        )
        .await;
        pipelines.push(pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned());
    }
    let credential = cred["data"]["credential_id"].as_str().unwrap().to_owned();
    (credential, pipelines.try_into().unwrap())
}

/// Starts a sync of each pipeline, through the servers in turn, and waits
/// for them all; returns the finished jobs.
async fn sync_all(procs: &Processes, bases: &[&str], pipelines: &[String]) -> Vec<Value> {
    let mut jobs = Vec::new();
    for (i, pipeline) in pipelines.iter().enumerate() {
        let base = bases[i % bases.len()];
        let job = procs.api(base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap();
        jobs.push(json_ok(job).await["data"]["job_id"].as_str().unwrap().to_owned());
    }
    let mut done = Vec::new();
    for job in jobs {
        let finished = procs.wait(bases[0], &job).await;
        assert_eq!(finished["status"], "succeeded", "{finished}");
        done.push(finished);
    }
    done
}

/// Whether the two jobs ran at the same time (each started before the
/// other finished).
fn overlapped(a: &Value, b: &Value) -> bool {
    let at = |j: &Value, f: &str| j[f].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    at(a, "started_at") < at(b, "finished_at") && at(b, "started_at") < at(a, "finished_at")
}

/// Two syncs on one credential, one server: at most the budget's rate
/// (10 a second, 2 at once) reaches the provider in any two seconds; the
/// operator's commands refuse what is not a budget; `/metrics` counts
/// the turns.
async fn syncs_on_one_credential_share_its_budget(db: Option<crate::support::PgDatabase>) {
    crate::support::init_crypto();
    let ca = TestCa::new();
    let events = slow_events("budget-test-source-token", 3000, 0);
    let arrivals = Arrivals::new(usize::MAX);
    let provider = FakeProvider::start(&ca, &["api.source.test"], arrivals.around(routes(events.clone()))).await;
    let mut procs = Processes::new(&ca, &provider);
    if let Some(db) = &db {
        procs.env.push(("DATABASE_URL", db.url.clone()));
    }
    let server = ServerProcess::start(procs.env.clone()).await;
    procs.adopt_workspace(&server.base).await;
    let (credential, pipelines) = two_pipelines_on_one_credential(&procs, &server.base, &events, 100).await;

    for (args, says) in [
        (vec!["set-rate-budget", "--credential", "crd_nobody", "--per-second", "10"], "no credential crd_nobody"),
        (vec!["set-rate-budget", "--credential", &credential, "--per-second", "0"], "0.001 to 100000"),
        (vec!["set-rate-budget", "--credential", &credential, "--per-second", "5", "--burst", "0"], "burst of 1 to"),
        (vec!["set-rate-budget", "--host", "https://api.source.test/", "--per-second", "5"], "must be a host name"),
        (
            vec!["set-rate-budget", "--credential", &credential, "--host", "api.source.test", "--per-second", "5"],
            "cannot be used with",
        ),
        (vec!["clear-rate-budget", "--host", "api.source.test"], "host:api.source.test has no rate budget"),
    ] {
        let out = admin(&procs, &args);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    let set = admin(&procs, &["set-rate-budget", "--credential", &credential, "--per-second", "10", "--burst", "2"]);
    assert!(set.status.success(), "{}", stderr(&set));
    assert_eq!(stdout(&set).trim(), format!("credential:{credential} now allows 10 requests per second, 2 at once"));
    let listed = admin(&procs, &["rate-budgets"]);
    assert_eq!(stdout(&listed).trim(), format!("credential:{credential}\t10/s\tburst 2"));
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let jobs = sync_all(&procs, &[&server.base], &pipelines).await;
    assert!(overlapped(&jobs[0], &jobs[1]), "both syncs ran at once: {jobs:?}");
    let requests = arrivals.times().len();
    assert_eq!(requests, 60, "30 pages each");
    // The budget lets 2 go at once and 10 a second after: any two
    // seconds see at most 22, give or take one request's latency.
    let most = arrivals.most_within(Duration::from_secs(2));
    println!("one server, two syncs on one credential's budget of 10/s: at most {most} requests in two seconds");
    assert!(most <= 23, "{most} requests within two seconds on a budget of 10 a second");
    let metrics = reqwest::get(format!("{}/metrics", server.base)).await.unwrap().text().await.unwrap();
    let counted = format!("egress_budget_requests_total{{budget=\"credential:{credential}\"}} {requests}");
    assert!(metrics.contains(&counted), "{counted} in {metrics}");
    assert!(metrics.contains(&format!("egress_budget_requests_per_second{{budget=\"credential:{credential}\"}} 10")));

    let cleared = admin(&procs, &["clear-rate-budget", "--credential", &credential]);
    assert!(cleared.status.success(), "{}", stderr(&cleared));
    assert_eq!(stdout(&admin(&procs, &["rate-budgets"])).trim(), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_on_one_credential_share_its_budget_on_sqlite() {
    syncs_on_one_credential_share_its_budget(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_on_one_credential_share_its_budget_on_postgres() {
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    syncs_on_one_credential_share_its_budget(Some(db)).await;
}

/// Two `service serve` processes on one PostgreSQL, a sync on each, one
/// budget for the provider's host: together they never exceed it, and
/// the `429` one of them meets (`Retry-After: 2`) holds the other's
/// requests too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_never_exceed_a_shared_budget_and_both_wait_out_a_retry_after() {
    crate::support::init_crypto();
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let ca = TestCa::new();
    let events = slow_events("budget-replica-test-token", 3000, 0);
    let arrivals = Arrivals::new(20);
    let provider = FakeProvider::start(&ca, &["api.source.test"], arrivals.around(routes(events.clone()))).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("DATABASE_URL", db.url.clone()));
    // One runner each: the two syncs run on the two servers.
    procs.env.push(("SERVICE_JOB_CONCURRENCY", "1".into()));
    let a = ServerProcess::start(procs.env.clone()).await;
    let b = ServerProcess::start(procs.env.clone()).await;
    procs.adopt_workspace(&a.base).await;
    let (_, pipelines) = two_pipelines_on_one_credential(&procs, &a.base, &events, 100).await;
    let set = admin(&procs, &["set-rate-budget", "--host", "API.source.test", "--per-second", "10", "--burst", "2"]);
    assert!(set.status.success(), "{}", stderr(&set));
    // The servers read budgets again within a second.
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let jobs = sync_all(&procs, &[&a.base, &b.base], &pipelines).await;
    drop((a, b));
    assert!(overlapped(&jobs[0], &jobs[1]), "both servers synced at once: {jobs:?}");
    let times = arrivals.times();
    // 30 pages each, and the refused page again.
    assert_eq!(times.len(), 61);
    let most = arrivals.most_within(Duration::from_secs(2));
    assert!(most <= 23, "{most} requests within two seconds on a budget of 10 a second");
    // After the 429, nothing but a turn the other server had already
    // taken reaches the provider until the two seconds are over.
    let refused = times[19];
    let during = times
        .iter()
        .filter(|t| **t > refused + Duration::from_millis(100) && **t < refused + Duration::from_millis(1900))
        .count();
    println!("two servers, a host budget of 10/s: at most {most} requests in two seconds, {during} during a pause");
    assert!(during <= 2, "{during} requests arrived while the provider asked every server to wait");
}

/// A turn more than a minute away is not waited for: the connector gets a
/// `429` from the server at once (and gives up as it does when a provider
/// asks for a long wait), the provider sees nothing more, and `/metrics`
/// counts the request held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_far_away_is_answered_429_at_once_and_nothing_more_reaches_the_provider() {
    crate::support::init_crypto();
    let ca = TestCa::new();
    let events = slow_events("budget-held-test-token", 300, 0);
    let arrivals = Arrivals::new(usize::MAX);
    let provider = FakeProvider::start(&ca, &["api.source.test"], arrivals.around(routes(events.clone()))).await;
    let procs = Processes::new(&ca, &provider);
    let server = ServerProcess::start(procs.env.clone()).await;
    procs.adopt_workspace(&server.base).await;
    let (credential, pipelines) = two_pipelines_on_one_credential(&procs, &server.base, &events, 100).await;
    // One request every 100 seconds.
    let set = admin(&procs, &["set-rate-budget", "--credential", &credential, "--per-second", "0.01"]);
    assert!(set.status.success(), "{}", stderr(&set));
    // The server reads budgets again within a second.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let sync = procs.api(&server.base, Method::POST, &format!("/v1/pipelines/{}/sync", pipelines[0])).send().await;
    let job = json_ok(sync.unwrap()).await["data"]["job_id"].as_str().unwrap().to_owned();
    let held = format!("egress_budget_held_total{{budget=\"credential:{credential}\"}}");
    let mut metrics = String::new();
    for _ in 0..300 {
        metrics = reqwest::get(format!("{}/metrics", server.base)).await.unwrap().text().await.unwrap();
        if metrics.contains(&held) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(metrics.contains(&held), "no request was held: {metrics}");
    // The attempt ends (as a provider's long wait ends it) rather than
    // holding its runner.
    for _ in 0..100 {
        let attempts = procs.api(&server.base, Method::GET, &format!("/v1/jobs/{job}/attempts")).send().await.unwrap();
        if json_ok(attempts).await["data"]["items"][0]["outcome"] != Value::Null {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let attempts = procs.api(&server.base, Method::GET, &format!("/v1/jobs/{job}/attempts")).send().await.unwrap();
    let attempts = json_ok(attempts).await;
    let first = &attempts["data"]["items"][0];
    assert_ne!(first["outcome"], "succeeded", "{attempts}");
    assert!(first["error"].as_str().unwrap_or_default().contains("rate limited"), "the attempt says why: {attempts}");
    assert_eq!(arrivals.times().len(), 1, "only the first page's request reached the provider");
}
