//! The paged test source over a fake events API: the fixture most pipeline
//! tests start from ([`EventsSource`]: a server with the source made),
//! and the API itself ([`Events`], [`routes`]) for tests that run their own
//! servers.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use reqwest::Method;
use serde_json::{Value, json};

use super::provider::{FakeProvider, TestCa};
use super::trust::Trust;
use super::{Backend, TestServer, json_ok};

/// The fake source: `count` events, `next_cursor` paging, a bearer token,
/// and an optional delay per page.
pub(crate) struct Events {
    pub token: String,
    pub count: u64,
    pub delay_ms: AtomicU64,
    /// Requests being answered now, and the most there ever were.
    pub in_flight: AtomicU64,
    pub max_in_flight: AtomicU64,
    /// Requests for pages of this size wait until it is set back to 0.
    pub hold_page_size: AtomicU64,
}

pub(crate) fn routes(ev: Arc<Events>) -> Router {
    Router::new()
        .route(
            "/events",
            get(|State(e): State<Arc<Events>>, h: HeaderMap, Query(q): Query<HashMap<String, String>>| async move {
                if h.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {}", e.token)) {
                    return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "message": "bad token" }))).into_response();
                }
                let limit: u64 = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(100);
                while e.hold_page_size.load(Ordering::SeqCst) == limit {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let now = e.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                e.max_in_flight.fetch_max(now, Ordering::SeqCst);
                let delay = e.delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                e.in_flight.fetch_sub(1, Ordering::SeqCst);
                let start: u64 = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
                let end = (start + limit).min(e.count);
                let data: Vec<Value> = (start..end)
                    .map(|i| json!({ "id": i, "kind": if i % 2 == 0 { "open" } else { "click" }, "updated_at": format!("2024-01-01T00:00:{:02}Z", i % 60), "payload": { "n": i }, "note": note(i) }))
                    .collect();
                let next = if end < e.count { json!(end.to_string()) } else { Value::Null };
                axum::Json(json!({ "data": data, "next_cursor": next })).into_response()
            }),
        )
        .with_state(ev)
}

/// Text with every character a bulk load must escape.
pub(crate) fn note(i: u64) -> String {
    format!("row {i}\ttab\nnewline\r\\backslash \\N \u{e9}")
}

pub(crate) struct EventsSource {
    pub srv: TestServer,
    pub events: Arc<Events>,
    pub source_id: String,
    pub provider: FakeProvider,
}

pub(crate) async fn events_source(backend: Backend, count: u64) -> EventsSource {
    events_source_with(backend, count, |_| {}).await
}

pub(crate) async fn events_source_with(
    backend: Backend,
    count: u64,
    adjust: impl FnOnce(&mut service::config::ServerConfig),
) -> EventsSource {
    events_source_beside(backend, count, &TestCa::new(), "", adjust).await
}

/// [`events_source_with`], the source's provider certified by `ca` and the
/// egress also pinning `other_pins` (other fake servers of the same CA).
pub(crate) async fn events_source_beside(
    backend: Backend,
    count: u64,
    ca: &TestCa,
    other_pins: &str,
    adjust: impl FnOnce(&mut service::config::ServerConfig),
) -> EventsSource {
    let events = Arc::new(Events {
        token: format!("src-token-{}", uuid::Uuid::new_v4().simple()),
        count,
        delay_ms: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        max_in_flight: AtomicU64::new(0),
        hold_page_size: AtomicU64::new(0),
    });
    let provider = FakeProvider::start(ca, &["api.source.test"], routes(events.clone())).await;
    let trust = Trust::new(ca).serving(&provider, &["api.source.test"]).allowing("*.source.test").pinning(other_pins);
    let srv = TestServer::start_with(backend, |c| {
        c.plugins.egress = trust.policy();
        adjust(c);
    })
    .await
    .unwrap();
    srv.load_test_plugin("test_paged_source").await;
    let cred = json_ok(
        srv.post("/v1/credentials", json!({ "hosts": ["api.source.test"], "secret": events.token }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let handle = cred["data"]["credential_handle"].as_str().unwrap();
    let src = json_ok(
        srv.post("/v1/sources", json!({ "connector_id": "test_paged_source", "name": "Events", "configuration": { "base_url": "https://api.source.test", "credential_handle": handle, "page_size": 300 } }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let source_id = src["data"]["source_id"].as_str().unwrap().to_owned();
    EventsSource { srv, events, source_id, provider }
}

impl EventsSource {
    pub(crate) async fn destination(&self, kind: &str, configuration: Value) -> String {
        let d = json_ok(
            self.srv
                .post("/v1/destinations", json!({ "name": kind, "kind": kind, "configuration": configuration }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        d["data"]["destination_id"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn pipeline(&self, destination_id: &str, mode: &str) -> String {
        let p = json_ok(
            self.srv
                .post("/v1/pipelines", json!({ "name": "events", "source_id": self.source_id, "destination_id": destination_id, "streams": [{ "name": "events", "sync_mode": mode }] }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        p["data"]["pipeline_id"].as_str().unwrap().to_owned()
    }

    /// Starts a sync and waits for its end.
    pub(crate) async fn sync(&self, pipeline_id: &str) -> Value {
        let job =
            json_ok(self.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline_id}/sync")).send().await.unwrap())
                .await;
        self.wait(job["data"]["job_id"].as_str().unwrap()).await
    }

    /// Waits for the job's end.
    pub(crate) async fn wait(&self, job_id: &str) -> Value {
        self.srv.wait_job(job_id).await
    }
}

pub(crate) fn slow_events(token: &str, count: u64, delay_ms: u64) -> Arc<Events> {
    Arc::new(Events {
        token: token.into(),
        count,
        delay_ms: AtomicU64::new(delay_ms),
        in_flight: AtomicU64::new(0),
        max_in_flight: AtomicU64::new(0),
        hold_page_size: AtomicU64::new(0),
    })
}
