//! A fake email-campaign provider speaking the Mailcoach-compatible API:
//! bearer auth, Laravel-style pagination, campaign statistics, lists and
//! subscribers, 401 for a bad token, 429 with Retry-After and 5xx on demand.
//!
//! Subscribers can also be written, as reverse ETL does: `POST
//! /email-lists/{uuid}/subscribers`, `PATCH /subscribers/{uuid}` and `DELETE
//! /subscribers/{uuid}` act on [`MailcoachState::written`], which a
//! `filter[email]` lookup of the list searches. The generated subscribers
//! that plain list reads page through ([`subscribers`]) are separate and
//! never change.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch};
use serde_json::{Map, Value, json};

/// Behaviour switches and what the provider saw.
#[derive(Default)]
pub struct MailcoachState {
    /// The one valid API token.
    pub token: String,
    pub campaigns: Vec<Value>,
    /// The next this-many requests answer 429 with `Retry-After: 1`.
    pub rate_limit_next: AtomicUsize,
    /// The first request for this page number of the campaign list
    /// answers 429 with `Retry-After: 1` (0: none).
    pub rate_limit_page: AtomicUsize,
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
    /// Requests being answered now, and the most there ever were at once.
    pub in_flight: AtomicUsize,
    pub most_in_flight: AtomicUsize,
    /// Subscribers created through the API (or seeded with
    /// [`MailcoachState::seed_subscriber`]), by uuid. `filter[email]`
    /// lookups, `PATCH` and `DELETE` see these only.
    pub written: Mutex<BTreeMap<String, Value>>,
    /// Email addresses that `POST` and `PATCH` refuse with a Laravel-style
    /// 422 (`errors.email`).
    pub reject_emails: Mutex<HashSet<String>>,
    /// Every successful write, in order: `("POST", email)`,
    /// `("PATCH", uuid)` or `("DELETE", uuid)`.
    pub writes: Mutex<Vec<(String, String)>>,
}

impl MailcoachState {
    /// The written subscriber with this email address, in any list
    /// (compared as the provider's lookup compares).
    pub fn subscriber_by_email(&self, email: &str) -> Option<Value> {
        self.written
            .lock()
            .unwrap()
            .values()
            .find(|s| s["email"].as_str().is_some_and(|e| same_email(e, email)))
            .cloned()
    }

    /// How many written subscribers exist now.
    pub fn written_count(&self) -> usize {
        self.written.lock().unwrap().len()
    }

    /// Puts a subscriber on [`LIST_UUID`] as if it had been created earlier,
    /// without logging a write; returns its uuid.
    pub fn seed_subscriber(&self, email: &str, first_name: Option<&str>) -> String {
        let subscriber = new_subscriber(LIST_UUID, email, &json!({ "first_name": first_name }));
        let uuid = subscriber["uuid"].as_str().unwrap().to_owned();
        self.written.lock().unwrap().insert(uuid.clone(), subscriber);
        uuid
    }

    /// The write log so far (a copy of [`MailcoachState::writes`]).
    pub fn write_log(&self) -> Vec<(String, String)> {
        self.writes.lock().unwrap().clone()
    }
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
        return Err((
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "1")],
            axum::Json(json!({ "message": "Too Many Attempts." })),
        )
            .into_response());
    }
    if take(&state.fail_next) {
        let body = if state.echo_auth_in_errors {
            json!({ "message": "upstream failure", "request": { "authorization": auth } })
        } else {
            json!({ "message": "Server Error" })
        };
        return Err((StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response());
    }
    if auth != format!("Bearer {}", state.token) {
        let body = if state.echo_auth_in_errors {
            json!({ "message": "Unauthenticated.", "you_sent": auth })
        } else {
            json!({ "message": "Unauthenticated." })
        };
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
        let s = slow.clone();
        async move {
            let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            s.most_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            let answer = next.run(req).await;
            s.in_flight.fetch_sub(1, Ordering::SeqCst);
            answer
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
                let page: usize = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
                if page > 0 && s.rate_limit_page.compare_exchange(page, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                    return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], axum::Json(json!({ "message": "Too Many Attempts." }))).into_response();
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
        .route("/api/email-lists/{uuid}/subscribers", get(list_subscribers).post(create_subscriber))
        .route("/api/subscribers/{uuid}", patch(update_subscriber).delete(delete_subscriber))
        .with_state(state)
}

/// `GET /api/email-lists/{uuid}/subscribers`: with `filter[email]`, the
/// written subscribers of the list with that address; otherwise the
/// generated ones.
async fn list_subscribers(
    State(s): State<Arc<MailcoachState>>,
    h: HeaderMap,
    Path(uuid): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = check(&s, &h) {
        return r;
    }
    if uuid != LIST_UUID {
        return not_found();
    }
    let path = format!("/api/email-lists/{uuid}/subscribers");
    if let Some(email) = q.get("filter[email]") {
        let matches: Vec<Value> = s
            .written
            .lock()
            .unwrap()
            .values()
            .filter(|x| {
                x["email_list_uuid"] == uuid.as_str() && x["email"].as_str().is_some_and(|e| same_email(e, email))
            })
            .cloned()
            .collect();
        return axum::Json(paginate(&matches, &q, &path)).into_response();
    }
    axum::Json(paginate(&subscribers(s.subscribers), &q, &path)).into_response()
}

/// `POST /api/email-lists/{uuid}/subscribers`: 201 with the new subscriber,
/// or 422 for a missing, invalid, rejected or already listed email.
async fn create_subscriber(
    State(s): State<Arc<MailcoachState>>,
    h: HeaderMap,
    Path(list): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(r) = check(&s, &h) {
        return r;
    }
    if list != LIST_UUID {
        return not_found();
    }
    // Laravel reads a body that is not JSON as no input at all.
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let email = match checked_email(&s, body.get("email")) {
        Ok(Some(email)) => email,
        Ok(None) => return invalid("email", "The email field is required."),
        Err(r) => return r,
    };
    let subscriber = {
        let mut written = s.written.lock().unwrap();
        let taken = written.values().any(|x| {
            x["email_list_uuid"] == list.as_str() && x["email"].as_str().is_some_and(|e| same_email(e, &email))
        });
        if taken {
            return invalid("email", "The email has already been taken.");
        }
        let subscriber = new_subscriber(&list, &email, &body);
        written.insert(subscriber["uuid"].as_str().unwrap().to_owned(), subscriber.clone());
        subscriber
    };
    s.writes.lock().unwrap().push(("POST".to_owned(), email));
    (StatusCode::CREATED, axum::Json(json!({ "data": subscriber }))).into_response()
}

/// `PATCH /api/subscribers/{uuid}`: 404 for an unknown subscriber, 422 for
/// an invalid, rejected or (within its list) taken email; otherwise the
/// given fields replace the stored ones and the answer is 200 with the
/// subscriber.
async fn update_subscriber(
    State(s): State<Arc<MailcoachState>>,
    h: HeaderMap,
    Path(uuid): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(r) = check(&s, &h) {
        return r;
    }
    if !s.written.lock().unwrap().contains_key(&uuid) {
        return not_found();
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let email = match checked_email(&s, body.get("email")) {
        Ok(email) => email,
        Err(r) => return r,
    };
    let updated = {
        let mut written = s.written.lock().unwrap();
        if let Some(email) = &email {
            let list = written.get(&uuid).map(|x| x["email_list_uuid"].clone()).unwrap_or(Value::Null);
            let taken = written.iter().any(|(other, x)| {
                other != &uuid
                    && x["email_list_uuid"] == list
                    && x["email"].as_str().is_some_and(|e| same_email(e, email))
            });
            if taken {
                return invalid("email", "The email has already been taken.");
            }
        }
        let Some(subscriber) = written.get_mut(&uuid) else {
            return not_found();
        };
        for field in ["first_name", "last_name", "extra_attributes", "tags"] {
            if let Some(value) = body.get(field) {
                subscriber[field] = value.clone();
            }
        }
        if let Some(email) = email {
            subscriber["email"] = Value::String(email);
        }
        subscriber["updated_at"] = Value::String(now());
        subscriber.clone()
    };
    s.writes.lock().unwrap().push(("PATCH".to_owned(), uuid));
    axum::Json(json!({ "data": updated })).into_response()
}

/// `DELETE /api/subscribers/{uuid}`: 204, or 404 for an unknown subscriber.
async fn delete_subscriber(State(s): State<Arc<MailcoachState>>, h: HeaderMap, Path(uuid): Path<String>) -> Response {
    if let Err(r) = check(&s, &h) {
        return r;
    }
    let removed = s.written.lock().unwrap().remove(&uuid);
    if removed.is_none() {
        return not_found();
    }
    s.writes.lock().unwrap().push(("DELETE".to_owned(), uuid));
    StatusCode::NO_CONTENT.into_response()
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, axum::Json(json!({ "message": "Not found." }))).into_response()
}

/// A Laravel validation failure: 422 with the message under `errors.<field>`.
fn invalid(field: &str, message: &str) -> Response {
    let mut errors = Map::new();
    errors.insert(field.to_owned(), json!([message]));
    (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(json!({ "message": message, "errors": errors }))).into_response()
}

/// The email address of a write's body (trimmed; `None` when absent or
/// null), or the 422 for one that is not an address or is rejected.
#[allow(clippy::result_large_err, reason = "the error is the handler's whole answer, returned at once")]
fn checked_email(s: &MailcoachState, value: Option<&Value>) -> Result<Option<String>, Response> {
    let email = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(e)) if e.trim().contains('@') => e.trim().to_owned(),
        Some(_) => return Err(invalid("email", "The email must be a valid email address.")),
    };
    if s.reject_emails.lock().unwrap().iter().any(|r| same_email(r, &email)) {
        return Err(invalid("email", "The email is invalid."));
    }
    Ok(Some(email))
}

/// Email addresses compare case-insensitively, as the provider's database
/// collation does.
fn same_email(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

/// The provider's timestamp format.
fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// A new subscriber of `list` from a create body.
fn new_subscriber(list: &str, email: &str, body: &Value) -> Value {
    let now = now();
    let given = |field: &str| body.get(field).cloned().unwrap_or(Value::Null);
    json!({
        "uuid": uuid::Uuid::new_v4().to_string(),
        "email_list_uuid": list,
        "email": email,
        "first_name": given("first_name"),
        "last_name": given("last_name"),
        "status": "subscribed",
        "extra_attributes": body.get("extra_attributes").filter(|v| v.is_object()).cloned().unwrap_or_else(|| json!({})),
        "tags": body.get("tags").filter(|v| v.is_array()).cloned().unwrap_or_else(|| json!([])),
        "subscribed_at": now,
        "unsubscribed_at": null,
        "created_at": now,
        "updated_at": now,
    })
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
