//! Outbound webhooks end to end: subscriptions through the API, events
//! from real syncs written to the outbox with their cause, deliveries to
//! a receiver over real HTTPS signed per Standard Webhooks (checked with
//! the `standardwebhooks` package from PyPI, unmodified), retried through
//! an outage, once each and in order; and who may do what.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use reqwest::Method;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::events::{EventsSource, events_source_beside};
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::{Backend, expect_error, json_ok, python_script, test_python};

const HOOK_HOST: &str = "hooks.acme-corp.com";

/// What the receiver got: each message's webhook headers and its body
/// exactly as received.
#[derive(Default)]
struct Receiver {
    up: AtomicBool,
    /// Answered while down (503 unless set).
    down_status: AtomicU16,
    got: std::sync::Mutex<Vec<(Value, String)>>,
    /// When each message arrived.
    arrived: std::sync::Mutex<Vec<chrono::DateTime<chrono::Utc>>>,
    /// Answers for the next requests, in turn, before the rules above:
    /// (status, milliseconds to wait before answering).
    script: std::sync::Mutex<std::collections::VecDeque<(u16, u64)>>,
    /// Requests that began.
    began: std::sync::atomic::AtomicUsize,
    /// `/slow` requests being answered now, and the most at once.
    slow_now: std::sync::atomic::AtomicUsize,
    slow_most: std::sync::atomic::AtomicUsize,
}

fn receiver_routes(r: Arc<Receiver>) -> Router {
    Router::new()
        .route(
            "/hooks",
            post(|State(r): State<Arc<Receiver>>, h: HeaderMap, body: Bytes| async move {
                r.began.fetch_add(1, Ordering::SeqCst);
                let scripted = r.script.lock().unwrap().pop_front();
                if let Some((status, wait_ms)) = scripted {
                    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                    return StatusCode::from_u16(status).unwrap().into_response();
                }
                if !r.up.load(Ordering::SeqCst) {
                    let status = match r.down_status.load(Ordering::SeqCst) {
                        0 => 503,
                        s => s,
                    };
                    return StatusCode::from_u16(status).unwrap().into_response();
                }
                let headers: serde_json::Map<String, Value> = ["webhook-id", "webhook-timestamp", "webhook-signature"]
                    .iter()
                    .map(|n| (n.to_string(), json!(h.get(*n).and_then(|v| v.to_str().ok()).unwrap_or(""))))
                    .collect();
                r.got.lock().unwrap().push((Value::Object(headers), String::from_utf8(body.to_vec()).unwrap()));
                r.arrived.lock().unwrap().push(chrono::Utc::now());
                StatusCode::NO_CONTENT.into_response()
            }),
        )
        // A receiver that takes eight seconds to answer.
        .route(
            "/slow",
            post(|State(r): State<Arc<Receiver>>| async move {
                let now = r.slow_now.fetch_add(1, Ordering::SeqCst) + 1;
                r.slow_most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(8)).await;
                r.slow_now.fetch_sub(1, Ordering::SeqCst);
                StatusCode::NO_CONTENT
            }),
        )
        // A receiver that sends its messages somewhere else.
        .route(
            "/moved",
            post(|| async {
                (StatusCode::TEMPORARY_REDIRECT, [("location", "https://elsewhere.acme-corp.com/hooks")])
                    .into_response()
            }),
        )
        .with_state(r)
}

struct Hooks {
    fx: EventsSource,
    receiver: Arc<Receiver>,
    _server: FakeProvider,
}

/// A paged source with `count` events, and a receiver on HTTPS the
/// operator allows webhooks to reach; retries wait at most two seconds.
async fn setup(backend: Backend, count: u64) -> Hooks {
    let ca = TestCa::new();
    let receiver = Arc::new(Receiver::default());
    receiver.up.store(true, Ordering::SeqCst);
    let server =
        FakeProvider::start(&ca, &[HOOK_HOST, "elsewhere.acme-corp.com"], receiver_routes(receiver.clone())).await;
    let pins = server.pins(&[HOOK_HOST, "elsewhere.acme-corp.com"]);
    let fx = events_source_beside(backend, count, &ca, &pins, |c| {
        c.plugins.egress = c.plugins.egress.clone().with_webhook_hosts("*.acme-corp.com").unwrap();
        c.limits.webhooks.max_backoff = Duration::from_secs(2);
    })
    .await;
    Hooks { fx, receiver, _server: server }
}

/// Every message verified by the reference library with `secret`.
fn verify(secret: &str, messages: &[(Value, String)]) -> Result<String, String> {
    let file = tempfile::NamedTempFile::new().unwrap();
    let list: Vec<Value> = messages.iter().map(|(h, b)| json!({ "secret": secret, "headers": h, "body": b })).collect();
    std::fs::write(file.path(), serde_json::to_vec(&list).unwrap()).unwrap();
    let out = std::process::Command::new(test_python())
        .arg(python_script("verify_webhooks.py"))
        .arg(file.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() { Ok(text) } else { Err(text) }
}

async fn subscribe(h: &Hooks, path: &str, types: &[&str]) -> (String, String) {
    let created = json_ok(
        h.fx.srv
            .post(
                "/v1/webhooks",
                json!({ "url": format!("https://{HOOK_HOST}{path}"), "event_types": types, "description": "ops" }),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    let secret = created["data"]["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{created}");
    (created["data"]["webhook_id"].as_str().unwrap().to_owned(), secret)
}

/// Waits until the receiver holds `n` messages (or fails after `secs`).
async fn received(h: &Hooks, n: usize, secs: u64) -> Vec<(Value, String)> {
    for _ in 0..secs * 10 {
        if h.receiver.got.lock().unwrap().len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = h.receiver.got.lock().unwrap().clone();
    assert!(got.len() >= n, "{} of {n} messages arrived", got.len());
    got
}

/// Checks the receiver holds exactly `n` messages with `n` distinct
/// `webhook-id`s; answers each one's event type and job id, in the order
/// they arrived.
fn once_each(receiver: &Receiver, n: usize) -> Vec<(String, String)> {
    let got = receiver.got.lock().unwrap().clone();
    assert_eq!(got.len(), n, "every event once");
    let ids: std::collections::BTreeSet<&str> = got.iter().map(|(h, _)| h["webhook-id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), n, "no message id twice");
    got.iter()
        .map(|(_, b)| {
            let v: Value = serde_json::from_str(b).unwrap();
            (v["type"].as_str().unwrap().to_owned(), v["data"]["job_id"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// A pipeline whose source the provider refuses: its sync fails for good.
async fn failing_pipeline(h: &Hooks, dest: &str) -> String {
    let srv = &h.fx.srv;
    let cred = json_ok(
        srv.post("/v1/credentials", json!({ "hosts": ["api.source.test"], "secret": "not-the-token" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let src = json_ok(
        srv.post("/v1/sources", json!({ "connector_id": "test_paged_source", "name": "Refused", "configuration": { "base_url": "https://api.source.test", "credential_handle": cred["data"]["credential_handle"], "page_size": 300 } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let p = json_ok(
        srv.post("/v1/pipelines", json!({ "name": "refused", "source_id": src["data"]["source_id"], "destination_id": dest, "streams": [{ "name": "events", "sync_mode": "incremental_append" }] }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    p["data"]["pipeline_id"].as_str().unwrap().to_owned()
}

/// The receiver is down for a minute while syncs succeed and fail; when
/// it returns it gets every event exactly once (by `webhook-id`), in the
/// order they happened, each signed so the reference library accepts it.
/// Both backends at once, in one test: the outage is waited out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_down_for_a_minute_gets_every_event_once_and_in_order() {
    let sqlite = outage(Backend::Sqlite);
    let postgres = async {
        if crate::support::postgres_available().await {
            outage(Backend::Postgres).await
        }
    };
    tokio::join!(sqlite, postgres);
}

async fn outage(backend: Backend) {
    let h = setup(backend, 300).await;
    let srv = &h.fx.srv;
    let (webhook_id, secret) =
        subscribe(&h, "/hooks", &["job.started", "job.succeeded", "job.failed", "job.cancelled"]).await;
    h.receiver.up.store(false, Ordering::SeqCst);
    let went_down = std::time::Instant::now();

    let dest = h.fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let good = h.fx.pipeline(&dest, "incremental_append").await;
    let bad = failing_pipeline(&h, &dest).await;
    let mut jobs = Vec::new();
    for pipeline in [&good, &bad, &good] {
        let job =
            json_ok(srv.request(Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
        let id = job["data"]["job_id"].as_str().unwrap().to_owned();
        let done = srv.wait_job(&id).await;
        jobs.push((id, done["status"].as_str().unwrap().to_owned()));
    }
    assert_eq!(jobs.iter().map(|(_, s)| s.as_str()).collect::<Vec<_>>(), ["succeeded", "failed", "succeeded"]);

    // While it is down, every attempt is logged and the queue waits.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let log = json_ok(srv.get(&format!("/v1/webhooks/{webhook_id}/deliveries")).send().await.unwrap()).await;
    let items = log["data"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 6, "{log}");
    assert!(items.iter().all(|d| d["status"] == "pending"), "{log}");
    let head = items.last().unwrap();
    assert!(head["attempts"].as_i64().unwrap() >= 2, "the head was retried: {head}");
    assert_eq!(head["last_status_code"], 503);
    assert_eq!(head["attempt_log"][0]["status_code"], 503);
    assert!(head["attempt_log"][0]["duration_ms"].is_i64());
    assert!(h.receiver.got.lock().unwrap().is_empty());

    let down_for = Duration::from_secs(60).saturating_sub(went_down.elapsed());
    tokio::time::sleep(down_for).await;
    h.receiver.up.store(true, Ordering::SeqCst);
    let got = received(&h, 6, 30).await;
    // Nothing more comes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = once_each(&h.receiver, 6);

    // In the order they happened: each job started, then ended, job by job.
    let expected: Vec<(String, String)> = jobs
        .iter()
        .flat_map(|(id, status)| [("job.started".to_owned(), id.clone()), (format!("job.{status}"), id.clone())])
        .collect();
    assert_eq!(seen, expected);
    let failed: Value = serde_json::from_str(&got[3].1).unwrap();
    assert_eq!(failed["data"]["status"], "failed");
    assert!(failed["data"]["error"].as_str().is_some_and(|e| !e.is_empty()), "{failed}");
    assert_eq!(failed["data"]["pipeline_id"], bad.as_str());

    // The reference library accepts every signature, and refuses one
    // made with another secret or over another body.
    let accepted = verify(&secret, &got).unwrap_or_else(|e| panic!("signatures refused:\n{e}"));
    assert_eq!(accepted.lines().filter(|l| l.starts_with("ok ")).count(), 6);
    let other = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    assert!(verify(other, &got[..1]).is_err(), "another secret does not verify");
    let mut tampered = got[0].clone();
    tampered.1 = tampered.1.replace("job.started", "job.succeeded");
    assert!(verify(&secret, &[tampered]).is_err(), "another body does not verify");

    let log =
        json_ok(srv.get(&format!("/v1/webhooks/{webhook_id}/deliveries?status=delivered")).send().await.unwrap()).await;
    assert_eq!(log["data"]["items"].as_array().unwrap().len(), 6);
    h.fx.srv.stop().await;
}

/// Rotation signs with both secrets for the overlap; a replay resends the
/// same message id; a redirect to another host is not followed; a
/// proposal and its decision are announced.
async fn secrets_rotate_replays_keep_their_id_and_redirects_stay_home(backend: Backend) {
    let h = setup(backend, 10).await;
    let srv = &h.fx.srv;
    let (webhook_id, old) = subscribe(&h, "/hooks", &["approval.requested", "approval.decided"]).await;

    // An MCP client's write becomes a proposal: announced, then decided.
    let proposal = srv
        .request(Method::POST, "/v1/destinations")
        .header("x-service-client", "mcp")
        .json(&json!({ "name": "proposed", "kind": "sqlite", "configuration": { "file": "p.db" } }))
        .send()
        .await
        .unwrap();
    assert_eq!(proposal.status(), 202);
    let approval_id = json_ok(proposal).await["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
    let requested = received(&h, 1, 10).await;
    let body: Value = serde_json::from_str(&requested[0].1).unwrap();
    assert_eq!(body["type"], "approval.requested");
    assert_eq!(body["data"]["approval_id"], approval_id.as_str());
    assert!(body["data"].get("operation").is_none(), "a receiver is not shown the operation: {body}");

    // A new secret: both sign until the overlap ends.
    let rotated = json_ok(
        srv.request(Method::PATCH, &format!("/v1/webhooks/{webhook_id}"))
            .json(&json!({ "rotate_secret": true }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let new = rotated["data"]["secret"].as_str().unwrap().to_owned();
    assert!(new.starts_with("whsec_") && new != old);
    assert!(rotated["data"]["previous_secret_expires_at"].is_string(), "{rotated}");
    let got = json_ok(srv.get(&format!("/v1/webhooks/{webhook_id}")).send().await.unwrap()).await;
    assert!(got["data"].get("secret").is_none(), "the secret is shown once: {got}");
    json_ok(
        srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{approval_id}/reject"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let got = received(&h, 2, 10).await;
    let decided = &got[1];
    assert_eq!(serde_json::from_str::<Value>(&decided.1).unwrap()["type"], "approval.decided");
    assert_eq!(decided.0["webhook-signature"].as_str().unwrap().split(' ').count(), 2);
    verify(&new, std::slice::from_ref(decided)).expect("the new secret verifies");
    verify(&old, std::slice::from_ref(decided)).expect("the old secret still verifies during the overlap");

    // A replay sends the same message again, with the same id.
    let log = json_ok(srv.get(&format!("/v1/webhooks/{webhook_id}/deliveries")).send().await.unwrap()).await;
    let first = log["data"]["items"].as_array().unwrap().last().unwrap()["delivery_id"].as_str().unwrap().to_owned();
    let replay = srv
        .request(Method::POST, &format!("/v1/webhooks/{webhook_id}/deliveries/{first}/replay"))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 202);
    let got = received(&h, 3, 10).await;
    assert_eq!(got[2].0["webhook-id"], got[0].0["webhook-id"]);
    assert_eq!(got[2].1, got[0].1);
    expect_error(
        srv.request(Method::POST, &format!("/v1/webhooks/{webhook_id}/deliveries/msg_nope/replay"))
            .send()
            .await
            .unwrap(),
        404,
        "404",
    )
    .await;

    // A receiver that redirects to another host: not followed, logged,
    // and given up at once (the egress policy will refuse it every time).
    let moved = json_ok(
        srv.post(
            "/v1/webhooks",
            json!({ "url": format!("https://{HOOK_HOST}/moved"), "event_types": ["approval.requested"] }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let moved_id = moved["data"]["webhook_id"].as_str().unwrap();
    let before = h.receiver.got.lock().unwrap().len();
    srv.request(Method::POST, "/v1/destinations")
        .header("x-service-client", "mcp")
        .json(&json!({ "name": "again", "kind": "sqlite", "configuration": { "file": "q.db" } }))
        .send()
        .await
        .unwrap();
    let mut attempt = Value::Null;
    for _ in 0..100 {
        let log = json_ok(srv.get(&format!("/v1/webhooks/{moved_id}/deliveries")).send().await.unwrap()).await;
        attempt = log["data"]["items"][0].clone();
        if attempt["attempts"].as_i64().unwrap_or(0) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(attempt["status"], "failed", "{attempt}");
    assert_eq!(attempt["attempts"], 1, "no retry of what cannot pass: {attempt}");
    let said = attempt["last_error"].as_str().unwrap();
    assert!(said.contains("redirect refused") && said.contains("not the receiver's host"), "{attempt}");
    assert!(!said.contains("connector"), "a subscription has no connector: {said}");
    // The first subscription got the same event; nothing else arrived.
    received(&h, before + 1, 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.receiver.got.lock().unwrap().len(), before + 1);

    // A month on, ended deliveries are swept with their events (the one
    // given up too); one still pending (its receiver down) stays.
    h.receiver.up.store(false, Ordering::SeqCst);
    srv.request(Method::POST, "/v1/destinations")
        .header("x-service-client", "mcp")
        .json(&json!({ "name": "later", "kind": "sqlite", "configuration": { "file": "r.db" } }))
        .send()
        .await
        .unwrap();
    let mut pending = Value::Null;
    for _ in 0..100 {
        let log = json_ok(srv.get(&format!("/v1/webhooks/{webhook_id}/deliveries")).send().await.unwrap()).await;
        pending = log["data"]["items"][0].clone();
        if pending["status"] == "pending" && pending["attempts"].as_i64().unwrap_or(0) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(pending["status"], "pending", "{pending}");
    let month = 31 * 24 * 3600 * 1000;
    srv.state.store.sweep_expired(service::store::now_ms() + month).await.unwrap();
    let log = json_ok(srv.get(&format!("/v1/webhooks/{webhook_id}/deliveries")).send().await.unwrap()).await;
    assert_eq!(log["data"]["items"].as_array().unwrap().len(), 1, "{log}");
    assert_eq!(log["data"]["items"][0]["payload"]["type"], "approval.requested");
    let log = json_ok(srv.get(&format!("/v1/webhooks/{moved_id}/deliveries")).send().await.unwrap()).await;
    assert_eq!(log["data"]["items"].as_array().unwrap().len(), 0, "{log}");
    h.fx.srv.stop().await;
}

/// Subscriptions are administrators' writes and their delivery bodies
/// are not for viewers; receivers are HTTPS hosts the operator allows,
/// never an address; one workspace never sees another's.
async fn only_administrators_subscribe_and_receivers_obey_the_egress_rules(backend: Backend) {
    let h = setup(backend, 10).await;
    let srv = &h.fx.srv;
    let (webhook_id, _) = subscribe(&h, "/hooks", &["job.failed"]).await;
    let ws = srv.workspace_id().await;
    let body = json!({ "url": format!("https://{HOOK_HOST}/hooks"), "event_types": ["job.failed"] });
    for role in [service::access::Role::Viewer, service::access::Role::Editor] {
        let (_, token) = srv.user_in(&ws, role).await;
        expect_error(
            srv.request_as(&token, Method::POST, "/v1/webhooks").json(&body).send().await.unwrap(),
            403,
            "403",
        )
        .await;
        expect_error(
            srv.request_as(&token, Method::DELETE, &format!("/v1/webhooks/{webhook_id}")).send().await.unwrap(),
            403,
            "403",
        )
        .await;
    }
    let (_, viewer) = srv.user_in(&ws, service::access::Role::Viewer).await;
    expect_error(
        srv.request_as(&viewer, Method::GET, &format!("/v1/webhooks/{webhook_id}/deliveries")).send().await.unwrap(),
        403,
        "403",
    )
    .await;
    let (_, editor) = srv.user_in(&ws, service::access::Role::Editor).await;
    json_ok(
        srv.request_as(&editor, Method::GET, &format!("/v1/webhooks/{webhook_id}/deliveries")).send().await.unwrap(),
    )
    .await;

    for (url, code) in [
        ("https://127.0.0.1/hooks", "VALIDATION_FAILED"),
        ("https://10.0.0.8/hooks", "VALIDATION_FAILED"),
        ("https://[::1]/hooks", "VALIDATION_FAILED"),
        ("https://169.254.169.254/latest/meta-data", "VALIDATION_FAILED"),
        ("http://hooks.acme-corp.com/hooks", "VALIDATION_FAILED"),
        ("https://hooks.acme-corp.com:8443/hooks", "VALIDATION_FAILED"),
        ("https://user:pw@hooks.acme-corp.com/hooks", "SECRET_NOT_ACCEPTED"),
        ("https://localhost/hooks", "WEBHOOK_HOST_NOT_ALLOWED"),
        ("https://api.source.test/hooks", "WEBHOOK_HOST_NOT_ALLOWED"),
    ] {
        expect_error(
            srv.post("/v1/webhooks", json!({ "url": url, "event_types": ["job.failed"] })).send().await.unwrap(),
            400,
            code,
        )
        .await;
    }
    for bad in [
        json!({ "url": format!("https://{HOOK_HOST}/h"), "event_types": [] }),
        json!({ "url": format!("https://{HOOK_HOST}/h"), "event_types": ["job.exploded"] }),
    ] {
        expect_error(srv.post("/v1/webhooks", bad).send().await.unwrap(), 400, "VALIDATION_FAILED").await;
    }

    // Another workspace's administrator sees none of it.
    let (_, other) = srv.other_workspace().await;
    expect_error(
        srv.request_as(&other, Method::GET, &format!("/v1/webhooks/{webhook_id}")).send().await.unwrap(),
        404,
        "404",
    )
    .await;
    expect_error(
        srv.request_as(&other, Method::GET, &format!("/v1/webhooks/{webhook_id}/deliveries")).send().await.unwrap(),
        404,
        "404",
    )
    .await;
    let theirs = json_ok(srv.request_as(&other, Method::GET, "/v1/webhooks").send().await.unwrap()).await;
    assert_eq!(theirs["data"]["items"].as_array().unwrap().len(), 0);

    // A failing job is announced as it fails (the time it took is printed
    // for the record, not asserted: machines are shared).
    let dest = h.fx.destination("sqlite", json!({ "file": "f.db" })).await;
    let bad = failing_pipeline(&h, &dest).await;
    let job = json_ok(srv.request(Method::POST, &format!("/v1/pipelines/{bad}/sync")).send().await.unwrap()).await;
    let done = srv.wait_job(job["data"]["job_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "failed");
    let got = received(&h, 1, 10).await;
    assert_eq!(serde_json::from_str::<Value>(&got[0].1).unwrap()["type"], "job.failed");
    let finished: chrono::DateTime<chrono::Utc> = done["finished_at"].as_str().unwrap().parse().unwrap();
    let arrived = h.receiver.arrived.lock().unwrap()[0];
    eprintln!("job.failed arrived {} ms after the job failed", (arrived - finished).num_milliseconds());

    // Writes are audited, never with the secret.
    let audit = json_ok(srv.get("/v1/audit-logs?action=webhooks.create").send().await.unwrap()).await;
    assert!(!audit["data"]["items"].as_array().unwrap().is_empty());
    assert!(!audit.to_string().contains("whsec_"), "{audit}");
    let deleted =
        json_ok(srv.request(Method::DELETE, &format!("/v1/webhooks/{webhook_id}")).send().await.unwrap()).await;
    assert_eq!(deleted["data"]["deleted"], true);
    expect_error(srv.get(&format!("/v1/webhooks/{webhook_id}")).send().await.unwrap(), 404, "404").await;
    h.fx.srv.stop().await;
}

/// Two `service serve` processes on one PostgreSQL database run the jobs
/// and both deliver: each event reaches the receiver once, in order,
/// while the receiver first fails and every server competes for the
/// retries. Needs PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_deliver_each_event_once() {
    use crate::support::events::slow_events;
    use crate::support::process::ServerProcess;
    use crate::support::replicas::Processes;
    crate::support::init_crypto();
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let ca = TestCa::new();
    let events = slow_events("replica-webhook-source-token", 200, 0);
    let provider = FakeProvider::start(&ca, &["api.source.test"], crate::support::events::routes(events.clone())).await;
    let receiver = Arc::new(Receiver::default());
    receiver.down_status.store(500, Ordering::SeqCst);
    let hooks = FakeProvider::start(&ca, &[HOOK_HOST], receiver_routes(receiver.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.retain(|(k, _)| *k != "SERVICE_EGRESS_RESOLVE");
    procs.env.push((
        "SERVICE_EGRESS_RESOLVE",
        format!("{},{}", provider.pins(&["api.source.test"]), hooks.pins(&[HOOK_HOST])),
    ));
    procs.env.push(("SERVICE_WEBHOOK_ALLOWED_HOSTS", HOOK_HOST.into()));
    procs.env.push(("SERVICE_WEBHOOK_MAX_BACKOFF_SECS", "1".into()));
    procs.env.push(("DATABASE_URL", db.url.clone()));
    let a = ServerProcess::start(procs.env.clone()).await;
    let b = ServerProcess::start(procs.env.clone()).await;
    let (base_a, base_b) = (a.base.clone(), b.base.clone());
    let hook = json_ok(
        procs
            .api(&base_a, Method::POST, "/v1/webhooks")
            .json(&json!({ "url": format!("https://{HOOK_HOST}/hooks"), "event_types": ["job.started", "job.succeeded"] }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let secret = hook["data"]["secret"].as_str().unwrap().to_owned();
    let pipeline = procs.pipeline(&base_a, &events, 100).await;
    let mut jobs = Vec::new();
    for i in 0..6 {
        let base = if i % 2 == 0 { &base_a } else { &base_b };
        let job =
            json_ok(procs.api(base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap())
                .await;
        let id = job["data"]["job_id"].as_str().unwrap().to_owned();
        assert_eq!(procs.wait(base, &id).await["status"], "succeeded");
        jobs.push(id);
        if i == 2 {
            receiver.up.store(true, Ordering::SeqCst);
        }
    }
    let mut got = Vec::new();
    for _ in 0..300 {
        got = receiver.got.lock().unwrap().clone();
        if got.len() >= 12 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = once_each(&receiver, 12);
    let expected: Vec<(String, String)> = jobs
        .iter()
        .flat_map(|id| [("job.started".to_owned(), id.clone()), ("job.succeeded".to_owned(), id.clone())])
        .collect();
    assert_eq!(seen, expected);
    verify(&secret, &got).unwrap_or_else(|e| panic!("signatures refused:\n{e}"));
    drop((a, b));
}

/// A pipeline whose data goes stale is announced once per breach, seen on
/// the pipeline, and announced again when a sync makes it fresh.
async fn a_stale_pipeline_raises_and_clears_its_freshness_events(backend: Backend) {
    use sqlx::Connection;
    let h = setup(backend, 10).await;
    let srv = &h.fx.srv;
    subscribe(&h, "/hooks", &["pipeline.freshness_breached", "pipeline.freshness_recovered"]).await;
    let dest = h.fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = h.fx.pipeline(&dest, "incremental_append").await;
    let patch = |body: Value| srv.request(Method::PATCH, &format!("/v1/pipelines/{pipeline}")).json(&body).send();
    for bad in [json!(-1), json!(525_601), json!("an hour")] {
        expect_error(patch(json!({ "freshness_minutes": bad })).await.unwrap(), 400, "VALIDATION_FAILED").await;
    }
    let set = json_ok(patch(json!({ "freshness_minutes": 60 })).await.unwrap()).await;
    assert_eq!(set["data"]["freshness_minutes"], 60);
    assert_eq!(h.fx.sync(&pipeline).await["status"], "succeeded");
    let fresh = json_ok(srv.get(&format!("/v1/pipelines/{pipeline}")).send().await.unwrap()).await;
    assert!(fresh["data"]["last_succeeded_at"].is_string(), "{fresh}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(h.receiver.got.lock().unwrap().is_empty(), "fresh data raises nothing");

    // Two hours pass without a sync.
    sqlx::any::install_default_drivers();
    let mut db = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
    sqlx::query("UPDATE pipelines SET last_succeeded_at = last_succeeded_at - 7200000, created_at = created_at - 7200000 WHERE id = $1")
        .bind(&pipeline)
        .execute(&mut db)
        .await
        .unwrap();
    let got = received(&h, 1, 10).await;
    let breached: Value = serde_json::from_str(&got[0].1).unwrap();
    assert_eq!(breached["type"], "pipeline.freshness_breached");
    assert_eq!(breached["data"]["pipeline_id"], pipeline.as_str());
    assert_eq!(breached["data"]["freshness_minutes"], 60);
    let stale = json_ok(srv.get(&format!("/v1/pipelines/{pipeline}")).send().await.unwrap()).await;
    assert!(stale["data"]["freshness_breached_at"].is_string(), "{stale}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.receiver.got.lock().unwrap().len(), 1, "one event per breach");
    let metrics = srv.get("/metrics").send().await.unwrap().text().await.unwrap();
    let breached = metrics
        .lines()
        .find(|l| l.starts_with("pipeline_freshness_breached{") && l.contains(&format!("pipeline=\"{pipeline}\"")))
        .unwrap_or_else(|| panic!("{metrics}"));
    // The workspace appears as an opaque label, never its id.
    assert!(
        breached.starts_with("pipeline_freshness_breached{workspace=\"w_") && breached.ends_with("} 1"),
        "{breached}"
    );
    assert!(!breached.contains(&srv.workspace_id().await), "{breached}");

    assert_eq!(h.fx.sync(&pipeline).await["status"], "succeeded");
    let got = received(&h, 2, 10).await;
    assert_eq!(serde_json::from_str::<Value>(&got[1].1).unwrap()["type"], "pipeline.freshness_recovered");
    let again = json_ok(srv.get(&format!("/v1/pipelines/{pipeline}")).send().await.unwrap()).await;
    assert!(again["data"]["freshness_breached_at"].is_null(), "{again}");
    let removed = json_ok(patch(json!({ "freshness_minutes": 0 })).await.unwrap()).await;
    assert!(removed["data"]["freshness_minutes"].is_null(), "{removed}");
    db.close().await.unwrap();
    h.fx.srv.stop().await;
}

/// The control database of a test server, for what the API does not show.
async fn control_db(h: &Hooks) -> sqlx::AnyConnection {
    use sqlx::Connection;
    sqlx::any::install_default_drivers();
    sqlx::AnyConnection::connect(&h.fx.srv.state.config.database_url).await.unwrap()
}

/// A subscription's signing secret reaches administrators only: an MCP
/// client's subscription is always a proposal, whatever the stored
/// policy, decided by an administrator; the policy cannot be loosened.
/// Receiver paths (which often carry the receiver's own token) are shown
/// to administrators only, and never in proposal summaries sent out. A
/// decision is announced once its execution answered. A subscription
/// whose host left the allowlist can still be switched off.
async fn secrets_and_receiver_paths_stay_with_administrators(backend: Backend) {
    use service::access::Role;
    use sqlx::Connection;
    let h = setup(backend, 10).await;
    let srv = &h.fx.srv;
    let ws = srv.workspace_id().await;
    let (webhook_id, _) = subscribe(&h, "/hooks", &["approval.requested", "approval.decided"]).await;

    for change in [json!({ "requires_approval": false }), json!({ "approver_role": "editor" })] {
        expect_error(
            srv.request(Method::PATCH, "/v1/approval-policies/webhooks").json(&change).send().await.unwrap(),
            400,
            "VALIDATION_FAILED",
        )
        .await;
    }
    // A policy stored as if it had been loosened (before the rule, or by
    // hand) changes nothing.
    let mut db = control_db(&h).await;
    let me = json_ok(srv.get("/v1/me").send().await.unwrap()).await;
    sqlx::query(
        "INSERT INTO approval_policies (workspace_id, category, requires_approval, approver_role, updated_by, updated_at) \
         VALUES ($1, 'webhooks', 0, 'editor', $2, 0)",
    )
    .bind(&ws)
    .bind(me["data"]["user"]["user_id"].as_str().unwrap())
    .execute(&mut db)
    .await
    .unwrap();
    let policies = json_ok(srv.get("/v1/approval-policies").send().await.unwrap()).await;
    let policy =
        policies["data"]["items"].as_array().unwrap().iter().find(|p| p["category"] == "webhooks").unwrap().clone();
    assert_eq!(policy["requires_approval"], true, "{policy}");
    assert_eq!(policy["approver_role"], "administrator", "{policy}");

    let secret_path = format!("https://{HOOK_HOST}/in/T0001/s3cr3t-path");
    let proposed = srv
        .request(Method::POST, "/v1/webhooks")
        .header("x-service-client", "mcp")
        .json(&json!({ "url": secret_path, "event_types": ["job.failed"] }))
        .send()
        .await
        .unwrap();
    assert_eq!(proposed.status(), 202, "an assistant's subscription is a proposal");
    let proposed = json_ok(proposed).await;
    assert!(!proposed.to_string().contains("whsec_"), "{proposed}");
    let approval_id = proposed["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
    let requested = received(&h, 1, 10).await;
    let summary =
        serde_json::from_str::<Value>(&requested[0].1).unwrap()["data"]["summary"].as_str().unwrap().to_owned();
    assert!(summary.contains(&format!("https://{HOOK_HOST}/…")) && !summary.contains("s3cr3t"), "{summary}");

    let (_, editor) = srv.user_in(&ws, Role::Editor).await;
    expect_error(
        srv.request_as(&editor, Method::POST, &format!("/v1/approvals/{approval_id}/approve")).send().await.unwrap(),
        403,
        "403",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.receiver.got.lock().unwrap().len(), 1, "nothing is decided yet");
    let approved = srv
        .request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{approval_id}/approve"))
        .send()
        .await
        .unwrap();
    assert_eq!(approved.status(), 201);
    let approved = json_ok(approved).await;
    assert!(
        approved["data"]["result"]["secret"].as_str().unwrap().starts_with("whsec_"),
        "the approver is answered: {approved}"
    );
    let created = approved["data"]["result"]["webhook_id"].as_str().unwrap().to_owned();
    let stored = json_ok(srv.get("/v1/approvals?status=executed").send().await.unwrap()).await;
    assert!(stored.to_string().contains(&approval_id), "{stored}");
    assert!(!stored.to_string().contains("whsec_"), "the proposal keeps no secret: {stored}");
    let got = received(&h, 2, 10).await;
    let decided: Value = serde_json::from_str(&got[1].1).unwrap();
    assert_eq!(decided["type"], "approval.decided");
    assert_eq!(decided["data"]["status"], "executed", "announced once it executed: {decided}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.receiver.got.lock().unwrap().len(), 2, "one decision, announced once");

    // Members below administrator see the receivers' hosts, not paths.
    for role in [Role::Viewer, Role::Editor] {
        let (_, token) = srv.user_in(&ws, role).await;
        let one =
            json_ok(srv.request_as(&token, Method::GET, &format!("/v1/webhooks/{created}")).send().await.unwrap())
                .await;
        assert_eq!(one["data"]["url"], format!("https://{HOOK_HOST}/…"), "{one}");
        let all = json_ok(srv.request_as(&token, Method::GET, "/v1/webhooks").send().await.unwrap()).await;
        assert!(!all.to_string().contains("s3cr3t") && !all.to_string().contains(".com/hooks"), "{all}");
    }
    let full = json_ok(srv.get(&format!("/v1/webhooks/{created}")).send().await.unwrap()).await;
    assert_eq!(full["data"]["url"], secret_path.as_str());
    // An administrator who proposed a subscription and was then made an
    // editor no longer reads the proposal's URL either.
    let (proposer_id, proposer) = srv.user_in(&ws, Role::Administrator).await;
    let res = srv
        .request_as(&proposer, Method::POST, "/v1/webhooks")
        .header("x-service-execution-mode", "proposal")
        .json(&json!({ "url": format!("https://{HOOK_HOST}/in/T0002/s3cr3t-too"), "event_types": ["job.failed"] }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    let mine =
        json_ok(srv.request_as(&proposer, Method::GET, "/v1/approvals?status=pending").send().await.unwrap()).await;
    assert!(mine.to_string().contains("s3cr3t-too"), "an administrator reads their proposal: {mine}");
    sqlx::query("UPDATE memberships SET role = 'editor' WHERE user_id = $1 AND workspace_id = $2")
        .bind(&proposer_id)
        .bind(&ws)
        .execute(&mut db)
        .await
        .unwrap();
    let mine =
        json_ok(srv.request_as(&proposer, Method::GET, "/v1/approvals?status=pending").send().await.unwrap()).await;
    assert!(!mine.to_string().contains("s3cr3t"), "{mine}");

    // The operator took the host off the allowlist (here: the URL moved
    // off it): the subscription can still be disabled, not pointed at
    // another such host.
    sqlx::query("UPDATE webhooks SET url = 'https://gone.example.org/x' WHERE id = $1")
        .bind(&webhook_id)
        .execute(&mut db)
        .await
        .unwrap();
    let off = json_ok(
        srv.request(Method::PATCH, &format!("/v1/webhooks/{webhook_id}"))
            .json(&json!({ "enabled": false, "url": "https://gone.example.org/x" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(off["data"]["enabled"], false);
    expect_error(
        srv.request(Method::PATCH, &format!("/v1/webhooks/{webhook_id}"))
            .json(&json!({ "url": "https://gone.example.org/y" }))
            .send()
            .await
            .unwrap(),
        400,
        "WEBHOOK_HOST_NOT_ALLOWED",
    )
    .await;
    db.close().await.unwrap();
    h.fx.srv.stop().await;
}

/// Asks for an MCP proposal (a destination): one `approval.requested`.
async fn propose(h: &Hooks, name: &str) {
    propose_as(h, &h.fx.srv.admin_token, name).await
}

/// A subscription's deliveries, oldest first: (id, status, attempts).
async fn queue(h: &Hooks, webhook_id: &str) -> Vec<(String, String, i64)> {
    let log = json_ok(h.fx.srv.get(&format!("/v1/webhooks/{webhook_id}/deliveries")).send().await.unwrap()).await;
    let mut items: Vec<(String, String, i64)> = log["data"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["delivery_id"].as_str().unwrap().to_owned(),
                d["status"].as_str().unwrap().to_owned(),
                d["attempts"].as_i64().unwrap(),
            )
        })
        .collect();
    items.reverse();
    items
}

/// A queue waiting for its head's retry is left alone (not claimed over
/// and over), even when a later delivery is replayed, and keeps its
/// order; a replay of the head sends it at once whatever its backoff had
/// grown to. Events nobody subscribed to are not written at all.
async fn replays_jump_the_backoff_but_never_the_order(backend: Backend) {
    use sqlx::Connection;
    let h = setup(backend, 10).await;
    let srv = &h.fx.srv;
    let (webhook_id, _) = subscribe(&h, "/hooks", &["approval.requested"]).await;
    h.receiver.up.store(false, Ordering::SeqCst);
    propose(&h, "first").await;
    let mut items = Vec::new();
    for _ in 0..100 {
        items = queue(&h, &webhook_id).await;
        if items.first().is_some_and(|d| d.2 >= 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(items[0].1, "pending", "{items:?}");
    propose(&h, "second").await;
    let items = queue(&h, &webhook_id).await;
    assert_eq!(items.len(), 2);
    let (head, later) = (items[0].0.clone(), items[1].0.clone());

    // The head's backoff has grown to an hour (set while the subscription
    // is off, so no attempt under way writes over it).
    let enable = |on: bool| {
        srv.request(Method::PATCH, &format!("/v1/webhooks/{webhook_id}")).json(&json!({ "enabled": on })).send()
    };
    json_ok(enable(false).await.unwrap()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut db = control_db(&h).await;
    let hour_on = service::store::now_ms() + 3_600_000;
    sqlx::query("UPDATE webhook_deliveries SET next_attempt_at = $1, failures = 12 WHERE id = $2")
        .bind(hour_on)
        .bind(&head)
        .execute(&mut db)
        .await
        .unwrap();
    sqlx::query("UPDATE webhooks SET blocked_until = $1 WHERE id = $2")
        .bind(hour_on)
        .bind(&webhook_id)
        .execute(&mut db)
        .await
        .unwrap();
    json_ok(enable(true).await.unwrap()).await;
    h.receiver.up.store(true, Ordering::SeqCst);
    // Replaying the later one unblocks the queue for a look: its head is
    // not due, so the queue is blocked again until the head's retry and
    // nothing jumps the order.
    let replay =
        |id: &str| srv.request(Method::POST, &format!("/v1/webhooks/{webhook_id}/deliveries/{id}/replay")).send();
    assert_eq!(replay(&later).await.unwrap().status(), 202);
    let mut blocked = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        blocked = sqlx::query_scalar::<_, Option<i64>>("SELECT blocked_until FROM webhooks WHERE id = $1")
            .bind(&webhook_id)
            .fetch_one(&mut db)
            .await
            .unwrap();
        if blocked.is_some() {
            break;
        }
    }
    assert_eq!(blocked, Some(hour_on), "the queue waits for its head again");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(h.receiver.got.lock().unwrap().is_empty(), "nothing was sent out of order");
    assert_eq!(queue(&h, &webhook_id).await[1].2, 0, "the later one was not tried");

    // Replaying the head sends it now, then the rest, in order.
    assert_eq!(replay(&head).await.unwrap().status(), 202);
    let got = received(&h, 2, 10).await;
    let ids: Vec<&str> = got.iter().map(|(hd, _)| hd["webhook-id"].as_str().unwrap()).collect();
    assert_eq!(ids, [head.as_str(), later.as_str()]);
    let failures: i64 = sqlx::query_scalar("SELECT failures FROM webhook_deliveries WHERE id = $1")
        .bind(&head)
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(failures, 0, "a replay starts the backoff again");

    // A replay while an attempt is under way is not undone by it: the
    // attempt that fails after the replay is logged, but the delivery
    // stays due and goes out at once, its backoff still unstarted.
    h.receiver.script.lock().unwrap().push_back((503, 1500));
    let began = h.receiver.began.load(Ordering::SeqCst);
    propose(&h, "third").await;
    for _ in 0..100 {
        if h.receiver.began.load(Ordering::SeqCst) > began {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let third = queue(&h, &webhook_id).await.last().unwrap().0.clone();
    assert_eq!(replay(&third).await.unwrap().status(), 202);
    let got = received(&h, 3, 15).await;
    assert_eq!(got[2].0["webhook-id"], third.as_str());
    let (failures, attempts): (i64, i64) =
        sqlx::query_as("SELECT failures, attempts FROM webhook_deliveries WHERE id = $1")
            .bind(&third)
            .fetch_one(&mut db)
            .await
            .unwrap();
    assert_eq!((failures, attempts), (0, 2), "the failure before the replay counts in no window");

    // The sweep keeps a month from when a delivery ended, not from its
    // event.
    sqlx::query("UPDATE webhook_deliveries SET created_at = created_at - $1 WHERE webhook_id = $2")
        .bind(60i64 * 24 * 3600 * 1000)
        .bind(&webhook_id)
        .execute(&mut db)
        .await
        .unwrap();
    srv.state.store.sweep_expired(service::store::now_ms()).await.unwrap();
    assert_eq!(queue(&h, &webhook_id).await.len(), 3, "ended just now: kept");
    srv.state.store.sweep_expired(service::store::now_ms() + 31 * 24 * 3600 * 1000).await.unwrap();
    assert!(queue(&h, &webhook_id).await.is_empty(), "ended a month ago: swept");

    // Syncs happen; nobody subscribed to job events: none is written.
    let dest = h.fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = h.fx.pipeline(&dest, "incremental_append").await;
    assert_eq!(h.fx.sync(&pipeline).await["status"], "succeeded");
    let job_events: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM events WHERE event_type LIKE 'job.%'")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(job_events, 0);
    db.close().await.unwrap();
    h.fx.srv.stop().await;
}

/// Asks, as `token`'s MCP client, for a proposal: one
/// `approval.requested` in that token's workspace.
async fn propose_as(h: &Hooks, token: &str, name: &str) {
    let res =
        h.fx.srv
            .request_as(token, Method::POST, "/v1/destinations")
            .header("x-service-client", "mcp")
            .json(&json!({ "name": name, "kind": "sqlite", "configuration": { "file": format!("{name}.db") } }))
            .send()
            .await
            .unwrap();
    assert_eq!(res.status(), 202);
}

/// One workspace cannot starve another's webhooks: workspace A's eight
/// subscriptions to a receiver that takes eight seconds, with four events
/// each, hold at most two delivery slots, and workspace B's event arrives
/// at once. A's subscriptions stop at the operator's cap.
async fn one_workspace_cannot_hold_every_delivery_slot(backend: Backend) {
    let h = setup(backend, 10).await;
    let srv = &h.fx.srv;
    let admin = srv.admin_token.clone();
    for _ in 0..8 {
        subscribe(&h, "/slow", &["approval.requested"]).await;
    }
    let (_, b) = srv.other_workspace().await;
    let created = srv
        .request_as(&b, Method::POST, "/v1/webhooks")
        .json(&json!({ "url": format!("https://{HOOK_HOST}/hooks"), "event_types": ["approval.requested"] }))
        .send()
        .await
        .unwrap();
    json_ok(created).await;
    for i in 0..4 {
        propose_as(&h, &admin, &format!("a{i}")).await;
    }
    // A's deliveries are under way.
    for _ in 0..50 {
        if h.receiver.slow_now.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let asked = std::time::Instant::now();
    propose_as(&h, &b, "b").await;
    received(&h, 1, 10).await;
    let waited = asked.elapsed();
    assert!(waited < Duration::from_secs(10), "B's event waited {waited:?}");
    assert_eq!(h.receiver.slow_most.load(Ordering::SeqCst), 2, "A held its two slots and no more");

    // Two more make ten, the default cap; the eleventh is refused.
    subscribe(&h, "/slow", &["approval.requested"]).await;
    subscribe(&h, "/slow", &["approval.requested"]).await;
    let refused = srv.post(
        "/v1/webhooks",
        json!({ "url": format!("https://{HOOK_HOST}/slow"), "event_types": ["approval.requested"] }),
    );
    let e = expect_error(refused.send().await.unwrap(), 409, "WEBHOOK_LIMIT_REACHED").await;
    assert_eq!(e["details"]["limit"], 10, "{e}");
    h.fx.srv.stop().await;
}

/// Undelivered events are bounded per subscription and per workspace:
/// with the receiver down, 1,000 events leave at most the bound pending;
/// each subscription that reached it is disabled, saying why, with the
/// events it missed counted; enabling it again clears the reason.
async fn a_workspaces_undelivered_events_are_bounded(backend: Backend) {
    let ca = TestCa::new();
    let receiver = Arc::new(Receiver::default());
    let server = FakeProvider::start(&ca, &[HOOK_HOST], receiver_routes(receiver.clone())).await;
    let pins = server.pins(&[HOOK_HOST]);
    let fx = events_source_beside(backend, 10, &ca, &pins, |c| {
        c.plugins.egress = c.plugins.egress.clone().with_webhook_hosts("*.acme-corp.com").unwrap();
        c.limits.webhooks.pending_per_subscription = 20;
        c.limits.webhooks.pending_per_workspace = 50;
        // A thousand proposals in a few seconds, from one session.
        c.limits.throttle.per_session = service::config::limits::Rate::OFF;
        c.limits.throttle.per_address = service::config::limits::Rate::OFF;
    })
    .await;
    let h = Hooks { fx, receiver, _server: server };
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(subscribe(&h, "/hooks", &["approval.requested"]).await.0);
    }
    let admin = h.fx.srv.admin_token.clone();
    let names: Vec<String> = (0..1000).map(|i| format!("d{i}")).collect();
    use futures_util::StreamExt;
    futures_util::stream::iter(names.iter().map(|n| propose_as(&h, &admin, n)))
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    use sqlx::Connection;
    let mut db = control_db(&h).await;
    let pending: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM webhook_deliveries WHERE status = 'pending'")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert!(pending <= 50, "{pending} deliveries pending");
    let mut dropped = 0;
    for id in &ids {
        let w = json_ok(h.fx.srv.get(&format!("/v1/webhooks/{id}")).send().await.unwrap()).await;
        assert_eq!(w["data"]["enabled"], false, "{w}");
        let reason = w["data"]["disabled_reason"].as_str().unwrap();
        assert!(reason.contains("SERVICE_WEBHOOK_MAX_PENDING"), "{reason}");
        dropped += w["data"]["dropped_events"].as_i64().unwrap();
    }
    // Every event is either queued or counted as dropped, per subscription
    // (those that went out before the receiver was found down included).
    let queued: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM webhook_deliveries").fetch_one(&mut db).await.unwrap();
    assert_eq!(queued + dropped, 3 * 1000, "{queued} queued, {dropped} dropped");
    let enabled =
        h.fx.srv
            .request(Method::PATCH, &format!("/v1/webhooks/{}", ids[0]))
            .json(&json!({ "enabled": true }))
            .send()
            .await
            .unwrap();
    let enabled = json_ok(enabled).await;
    assert!(enabled["data"]["disabled_reason"].is_null(), "{enabled}");
    db.close().await.unwrap();
    h.fx.srv.stop().await;
}

/// Each sync's end announces its ledger, signed: a deduplicated stream
/// keyed by a field with two values accounts for all 1,000 records read
/// as rows SQLite stored and copies a later one replaced, and leaves two
/// rows; a sync that fails at its first page announces a ledger too.
async fn a_sync_announces_its_ledger_signed_and_every_record_is_accounted_for(backend: Backend) {
    let h = setup(backend, 1000).await;
    let (_, secret) = subscribe(&h, "/hooks", &["sync.ledger"]).await;
    let srv = &h.fx.srv;
    let dest = h.fx.destination("sqlite", json!({ "file": "ledger.db" })).await;
    let body = json!({ "name": "by kind", "source_id": h.fx.source_id, "destination_id": dest,
        "streams": [{ "name": "events", "sync_mode": "incremental_deduped", "primary_key": ["kind"] }] });
    let pipeline = json_ok(srv.post("/v1/pipelines", body).send().await.unwrap()).await;
    let job = h.fx.sync(pipeline["data"]["pipeline_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let ledger = &job["progress"]["ledger"];
    assert_eq!((&ledger["attempt"], &ledger["balanced"]), (&json!(1), &json!(true)), "{job}");
    let events = &ledger["streams"]["events"];
    let (loaded, deduplicated) = (events["loaded"].as_u64().unwrap(), events["deduplicated"].as_u64().unwrap());
    assert_eq!(events["read"], 1000, "{job}");
    assert_eq!(loaded + deduplicated, 1000, "{job}");
    // Pages of 300 make at most four batches, each stored as two rows
    // (one per kind), as SQLite counts its upserts.
    assert!((2..=8).contains(&loaded) && loaded % 2 == 0, "{job}");
    assert_eq!((&events["left_to_retry"], &events["unaccounted"]), (&json!(0), &json!(0)), "{job}");
    let url = format!("sqlite://{}?mode=ro", srv.warehouse(&srv.workspace_id().await, "ledger.db").display());
    assert_eq!(crate::support::count_rows(&url, "events").await, 2);

    let failing = failing_pipeline(&h, &dest).await;
    let failed = h.fx.sync(&failing).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let got = received(&h, 2, 30).await;
    verify(&secret, &got).unwrap();
    let announced: Vec<Value> = got.iter().map(|(_, b)| serde_json::from_str(b).unwrap()).collect();
    assert!(announced.iter().all(|a| a["type"] == "sync.ledger"), "{announced:?}");
    let ok = announced.iter().find(|a| a["data"]["job_id"] == job["job_id"]).expect("the sync's ledger");
    assert_eq!(ok["data"]["status"], "succeeded");
    assert_eq!(ok["data"]["streams"], ledger["streams"], "the job's own ledger");
    let bad = announced.iter().find(|a| a["data"]["job_id"] == failed["job_id"]).expect("the failed sync's ledger");
    assert_eq!(bad["data"]["status"], "failed");
    assert_eq!(bad["data"]["attempt"], failed["attempts"]);
    assert_eq!(bad["data"]["streams"]["events"]["read"], 0, "{bad}");
    assert_eq!(bad["data"]["balanced"], true, "{bad}");
    h.fx.srv.stop().await;
}

on_both_backends!(
    a_sync_announces_its_ledger_signed_and_every_record_is_accounted_for,
    one_workspace_cannot_hold_every_delivery_slot,
    a_workspaces_undelivered_events_are_bounded,
    secrets_and_receiver_paths_stay_with_administrators,
    replays_jump_the_backoff_but_never_the_order,
    a_stale_pipeline_raises_and_clears_its_freshness_events,
    secrets_rotate_replays_keep_their_id_and_redirects_stay_home,
    only_administrators_subscribe_and_receivers_obey_the_egress_rules,
);
