//! A fake email-campaign provider speaking the Mailcoach-compatible API:
//! bearer auth, Laravel-style pagination, campaign statistics, lists and
//! subscribers, 401 for a bad token, 429 with Retry-After and 5xx on demand.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

/// Behaviour switches and what the provider saw.
#[derive(Default)]
pub struct MailcoachState {
    /// The one valid API token.
    pub token: String,
    pub campaigns: Vec<Value>,
    /// The next this-many requests answer 429 with `Retry-After: 1`.
    pub rate_limit_next: AtomicUsize,
    /// The next this-many requests answer 503.
    pub fail_next: AtomicUsize,
    /// Echo the request's Authorization header in error bodies, as some
    /// debugging proxies do.
    pub echo_auth_in_errors: bool,
    /// Authorization headers received.
    pub seen_auth: Mutex<Vec<String>>,
    pub requests: AtomicUsize,
    /// Subscribers on the one email list.
    pub subscribers: usize,
    /// Milliseconds every answer waits before it is given.
    pub delay_ms: std::sync::atomic::AtomicU64,
}

/// The provider's one email list.
pub const LIST_UUID: &str = "11111111-1111-4111-8111-111111111111";

/// `count` sent campaigns with plausible statistics.
pub fn campaigns(count: usize) -> Vec<Value> {
    (0..count)
        .map(|i| {
            let sent = 1000 + i as u64 * 10;
            json!({
                "uuid": format!("00000000-0000-4000-8000-{i:012}"),
                "name": format!("Newsletter {i}"),
                "email_list_uuid": LIST_UUID,
                "status": "sent",
                "subject": format!("Issue {i}"),
                "from_email": "news@acme-corp.com",
                "html": "<html><body>full campaign body</body></html>",
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
        })
        .collect()
}

/// The provider's gate for every endpoint: counts and records the request,
/// then answers with the failure the test queued (429, 503) or 401 for a
/// wrong token, if any.
#[allow(clippy::result_large_err, reason = "the error is the handler's whole answer, returned at once")]
fn check(state: &MailcoachState, headers: &HeaderMap) -> Result<(), Response> {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    state.seen_auth.lock().unwrap().push(auth.clone());
    let take = |c: &AtomicUsize| c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
    if take(&state.rate_limit_next) {
        return Err((StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], axum::Json(json!({ "message": "Too Many Attempts." }))).into_response());
    }
    if take(&state.fail_next) {
        let body = if state.echo_auth_in_errors { json!({ "message": "upstream failure", "request": { "authorization": auth } }) } else { json!({ "message": "Server Error" }) };
        return Err((StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response());
    }
    if auth != format!("Bearer {}", state.token) {
        let body = if state.echo_auth_in_errors { json!({ "message": "Unauthenticated.", "you_sent": auth }) } else { json!({ "message": "Unauthenticated." }) };
        return Err((StatusCode::UNAUTHORIZED, axum::Json(body)).into_response());
    }
    Ok(())
}

fn paginate(items: &[Value], q: &HashMap<String, String>, path: &str) -> Value {
    let per_page: usize = q.get("per_page").and_then(|p| p.parse().ok()).unwrap_or(15).clamp(1, 100);
    let page: usize = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(1).max(1);
    let last_page = items.len().div_ceil(per_page).max(1);
    let data: Vec<Value> = items.iter().skip((page - 1) * per_page).take(per_page).cloned().collect();
    let link = |p: usize| json!(format!("https://provider{path}?page={p}"));
    json!({
        "data": data,
        "links": { "first": link(1), "last": link(last_page), "prev": if page > 1 { link(page - 1) } else { Value::Null }, "next": if page < last_page { link(page + 1) } else { Value::Null } },
        "meta": { "current_page": page, "last_page": last_page, "per_page": per_page, "total": items.len() }
    })
}

/// The provider's routes under `/api`.
pub fn router(state: Arc<MailcoachState>) -> Router {
    let slow = state.clone();
    let delay = axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
        let ms = slow.delay_ms.load(Ordering::SeqCst);
        async move {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            next.run(req).await
        }
    });
    routes(state).layer(delay)
}

fn routes(state: Arc<MailcoachState>) -> Router {
    Router::new()
        .route(
            "/api/user",
            get(|State(s): State<Arc<MailcoachState>>, h: HeaderMap| async move {
                if let Err(r) = check(&s, &h) {
                    return r;
                }
                axum::Json(json!({ "data": { "id": 7, "email": "owner@acme-corp.com", "name": "Owner" } })).into_response()
            }),
        )
        .route(
            "/api/campaigns",
            get(|State(s): State<Arc<MailcoachState>>, h: HeaderMap, Query(q): Query<HashMap<String, String>>| async move {
                if let Err(r) = check(&s, &h) {
                    return r;
                }
                let mut items: Vec<Value> = s
                    .campaigns
                    .iter()
                    .filter(|c| q.get("filter[status]").is_none_or(|st| c["status"] == st.as_str()))
                    .cloned()
                    .collect();
                if q.get("sort").map(String::as_str) == Some("-sent") {
                    items.sort_by(|a, b| b["sent_at"].as_str().cmp(&a["sent_at"].as_str()));
                }
                axum::Json(paginate(&items, &q, "/api/campaigns")).into_response()
            }),
        )
        .route(
            "/api/campaigns/{uuid}",
            get(|State(s): State<Arc<MailcoachState>>, h: HeaderMap, Path(uuid): Path<String>| async move {
                if let Err(r) = check(&s, &h) {
                    return r;
                }
                match s.campaigns.iter().find(|c| c["uuid"] == uuid.as_str()) {
                    Some(c) => axum::Json(json!({ "data": c })).into_response(),
                    None => (StatusCode::NOT_FOUND, axum::Json(json!({ "message": "Not found." }))).into_response(),
                }
            }),
        )
        .route(
            "/api/email-lists",
            get(|State(s): State<Arc<MailcoachState>>, h: HeaderMap, Query(q): Query<HashMap<String, String>>| async move {
                if let Err(r) = check(&s, &h) {
                    return r;
                }
                let lists = vec![json!({ "uuid": LIST_UUID, "name": "Newsletter", "active_subscribers_count": s.subscribers, "created_at": "2024-01-01T00:00:00.000000Z", "updated_at": "2024-01-02T00:00:00.000000Z" })];
                axum::Json(paginate(&lists, &q, "/api/email-lists")).into_response()
            }),
        )
        .route(
            "/api/email-lists/{uuid}/subscribers",
            get(|State(s): State<Arc<MailcoachState>>, h: HeaderMap, Path(uuid): Path<String>, Query(q): Query<HashMap<String, String>>| async move {
                if let Err(r) = check(&s, &h) {
                    return r;
                }
                if uuid != LIST_UUID {
                    return (StatusCode::NOT_FOUND, axum::Json(json!({ "message": "Not found." }))).into_response();
                }
                let path = format!("/api/email-lists/{uuid}/subscribers");
                axum::Json(paginate(&subscribers(s.subscribers), &q, &path)).into_response()
            }),
        )
        .with_state(state)
}

/// The one email list's subscribers: nested attributes and tags, as the
/// provider sends them.
pub fn subscribers(count: usize) -> Vec<Value> {
    (0..count)
        .map(|i| {
            json!({
                "uuid": format!("22222222-2222-4222-8222-{i:012}"),
                "email_list_uuid": LIST_UUID,
                "email": format!("reader{i}@example.com"),
                "first_name": format!("Reader {i}"),
                "last_name": null,
                "status": if i % 5 == 0 { "unsubscribed" } else { "subscribed" },
                "extra_attributes": { "plan": if i % 2 == 0 { "free" } else { "pro" } },
                "tags": ["newsletter"],
                "subscribed_at": "2024-01-03T00:00:00.000000Z",
                "unsubscribed_at": null,
                "created_at": "2024-01-03T00:00:00.000000Z",
                "updated_at": format!("2024-01-{:02}T00:00:00.000000Z", 3 + i % 20),
            })
        })
        .collect()
}
