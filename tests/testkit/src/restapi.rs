//! A REST API of the kinds a manifest describes, over one set of records,
//! with each paging style as real APIs send it:
//!
//! | route | paging | body |
//! |---|---|---|
//! | `GET /pages/items?page&per_page[&since]` | page number with a total | `{"data": [...], "meta": {"page", "total_pages"}}` |
//! | `GET /cursor/items?cursor&limit` | cursor in the body | `{"items": [...], "next_cursor": "..." \| null}` |
//! | `GET /link/items?page&per_page` | `Link` header, as GitHub sends it | the list itself |
//! | `GET /offset/items?offset&limit` | offset and limit with a total | `{"results": [...], "total": N}` |
//! | `GET /owners` and `/owners/{owner}/items?page` | parent and child | `{"owners": [...]}`, `{"data": [...], "meta": ...}` |
//!
//! `/pages/items` can echo the request's `Authorization` into its records,
//! compressed whatever the request accepted (as a debugging proxy might).
//! `since` (RFC 3339, inclusive, as APIs' filters are) keeps the records
//! updated at or after it, oldest first. Every route checks the bearer
//! token when one is set, can answer one page with 429 and `Retry-After`,
//! and counts requests. `/hostile/...` routes misbehave on purpose: next
//! pages on another host, an IP address or plain HTTP, a paging that never
//! ends, a page of 50 MB.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

/// The API's host in tests.
pub const HOST: &str = "api.acme-data.com";

/// The records and behaviour of the API.
pub struct RestApi {
    pub items: Mutex<Vec<Value>>,
    /// When set, requests must carry `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// The first request for this page number (of `/pages`, `/link` or a
    /// child) answers 429 with `Retry-After: 1` (0: none).
    pub throttle_page: AtomicUsize,
    pub throttled: AtomicUsize,
    pub requests: AtomicUsize,
    /// Bytes of padding in each record (to make records of a given size).
    pub padding: usize,
    /// When set, `/pages/items` echoes the request's `Authorization` into
    /// every record (`requested_by`) and a header, and compresses its
    /// answer with this coding whatever the request accepted.
    pub echo_compressed: Mutex<Option<&'static str>>,
    /// Milliseconds `/pages/items` waits before answering.
    pub page_delay_ms: std::sync::atomic::AtomicU64,
    /// Every request's path and query, in the order they came.
    pub asked: Mutex<Vec<String>>,
    /// While set, every request is answered 500 (a provider that is down).
    pub down: std::sync::atomic::AtomicBool,
    /// This page number of `/pages/items` answers 404 (0: none): a read
    /// that fails for good part way.
    pub missing_page: AtomicUsize,
    /// When set (with `token`), the token comes in this query parameter
    /// instead of `Authorization`, and `/link/items` keeps it in the links
    /// it answers, as providers that build links from the request's query
    /// do.
    pub key_param: Option<String>,
    /// `/pages/items` requests whose `stream` query parameter names this
    /// stream answer 503, this many more times: one stream of several
    /// failing while the others read.
    pub failing_stream: Mutex<Option<(String, usize)>>,
    /// `/pages/items` requests for this stream (its `stream` query
    /// parameter) answer 404: a stream that fails for good.
    pub missing_stream: Mutex<Option<String>>,
    /// `/pages/items` requests being answered now, and the most at once.
    pub pages_in_flight: AtomicUsize,
    pub most_pages_in_flight: AtomicUsize,
    /// How many times records were added.
    generation: AtomicUsize,
}

/// Owners of the items (the parent stream).
pub const OWNERS: [&str; 3] = ["ada", "grace", "linus"];

impl RestApi {
    /// `count` records, updated a minute apart from 2024-01-01T00:00:00Z,
    /// each owned in turn by one of [`OWNERS`].
    pub fn new(count: usize) -> Self {
        RestApi::sized(count, 0)
    }

    /// Like [`RestApi::new`], each record padded by `padding` bytes.
    pub fn sized(count: usize, padding: usize) -> Self {
        let items = (0..count).map(|i| item(i, minute(i), padding)).collect();
        RestApi {
            items: Mutex::new(items),
            token: None,
            throttle_page: AtomicUsize::new(0),
            throttled: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            padding,
            echo_compressed: Mutex::new(None),
            page_delay_ms: Default::default(),
            asked: Mutex::new(Vec::new()),
            down: Default::default(),
            missing_page: AtomicUsize::new(0),
            key_param: None,
            failing_stream: Mutex::new(None),
            missing_stream: Mutex::new(None),
            pages_in_flight: AtomicUsize::new(0),
            most_pages_in_flight: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    /// This API, demanding `Authorization: Bearer <token>`.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Takes the token from the query parameter `name` (see `key_param`).
    pub fn with_key_param(mut self, name: impl Into<String>) -> Self {
        self.key_param = Some(name.into());
        self
    }

    /// Adds `n` records, all updated at the same moment, after every
    /// other record (several records on one cursor value: the boundary an
    /// incremental read must get exactly right).
    pub fn add(&self, n: usize) {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let at = format!("2030-01-{:02}T00:00:00Z", generation.min(28));
        let mut items = self.items.lock().unwrap();
        let start = items.len();
        for i in start..start + n {
            items.push(item(i, at.clone(), self.padding));
        }
    }

    /// Sets record `id`'s `updated_at` to `at` (a change the next
    /// incremental read must see).
    pub fn touch(&self, id: usize, at: &str) {
        if let Some(record) = self.items.lock().unwrap().iter_mut().find(|r| r["id"] == id) {
            record["updated_at"] = json!(at);
            record["name"] = json!(format!("item {id}, changed"));
        }
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// The items at or after `since`, oldest first (all, by id, without it).
    fn selected(&self, q: &HashMap<String, String>, owner: Option<&str>) -> Vec<Value> {
        self.window(q, owner, 0, usize::MAX).1
    }

    /// How many items [`RestApi::selected`] holds, and `len` of them from
    /// `start`: only those are copied, so a large API answers a page as
    /// fast as a small one.
    fn window(
        &self,
        q: &HashMap<String, String>,
        owner: Option<&str>,
        start: usize,
        len: usize,
    ) -> (usize, Vec<Value>) {
        let items = self.items.lock().unwrap();
        let mut chosen: Vec<&Value> = items
            .iter()
            .filter(|i| owner.is_none_or(|o| i["owner"] == o))
            .filter(|i| q.get("since").is_none_or(|s| i["updated_at"].as_str().unwrap_or("") >= s.as_str()))
            .collect();
        if q.contains_key("since") {
            chosen.sort_by(|a, b| {
                a["updated_at"].as_str().cmp(&b["updated_at"].as_str()).then(a["id"].as_u64().cmp(&b["id"].as_u64()))
            });
        }
        (chosen.len(), chosen.into_iter().skip(start).take(len).cloned().collect())
    }

    /// Counts the request and refuses it when the token is wrong or the
    /// page is the one to throttle.
    fn gate(&self, headers: &HeaderMap, page: Option<usize>) -> Option<Response> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if let Some(token) = &self.token
            && self.key_param.is_none()
            && headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {token}"))
        {
            return Some(
                (StatusCode::UNAUTHORIZED, axum::Json(json!({ "message": "Bad credentials" }))).into_response(),
            );
        }
        let throttle = self.throttle_page.load(Ordering::SeqCst);
        if throttle > 0 && page == Some(throttle) {
            self.throttle_page.store(0, Ordering::SeqCst);
            self.throttled.fetch_add(1, Ordering::SeqCst);
            return Some(
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", "1")],
                    axum::Json(json!({ "message": "API rate limit exceeded" })),
                )
                    .into_response(),
            );
        }
        None
    }
}

/// 2024-01-01T00:00:00Z plus `i` minutes.
fn minute(i: usize) -> String {
    let at = chrono::DateTime::from_timestamp(1_704_067_200 + i as i64 * 60, 0).unwrap_or_default();
    at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn item(i: usize, updated_at: String, padding: usize) -> Value {
    let mut record = json!({
        "id": i,
        "name": format!("item {i}"),
        "owner": OWNERS[i % OWNERS.len()],
        "updated_at": updated_at,
        "tags": ["a", "b"],
        "price": { "amount": i * 100, "currency": "EUR" },
    });
    if padding > 0 {
        record["description"] = json!("x".repeat(padding));
    }
    record
}

type Q = Query<HashMap<String, String>>;

fn number(q: &HashMap<String, String>, key: &str, default: usize) -> usize {
    q.get(key).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn slice(items: &[Value], start: usize, len: usize) -> Vec<Value> {
    items.iter().skip(start).take(len).cloned().collect()
}

pub fn router(api: Arc<RestApi>) -> Router {
    Router::new()
        .route("/pages/items", get(pages))
        .route("/cursor/items", get(cursor))
        .route("/link/items", get(link))
        .route("/offset/items", get(offset))
        .route("/owners", get(owners))
        .route("/owners/{owner}/items", get(owned))
        .route("/hostile/next", get(hostile_next))
        .route("/hostile/endless", get(endless))
        .route("/hostile/loop", get(looping))
        .route("/hostile/huge", get(huge))
        .layer(axum::middleware::from_fn_with_state(api.clone(), watch))
        .with_state(api)
}

/// Notes each request, and answers 500 while the API is down.
async fn watch(
    State(api): State<Arc<RestApi>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    api.asked.lock().unwrap().push(request.uri().to_string());
    if api.down.load(Ordering::SeqCst) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "down for maintenance").into_response();
    }
    if let (Some(name), Some(token)) = (&api.key_param, &api.token) {
        let query = request.uri().query().unwrap_or_default();
        let keys: Vec<String> = url::form_urlencoded::parse(query.as_bytes())
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
            .collect();
        if keys != [token.clone()] {
            api.requests.fetch_add(1, Ordering::SeqCst);
            return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "message": "Invalid API key" }))).into_response();
        }
    }
    next.run(request).await
}

async fn pages(State(api): State<Arc<RestApi>>, h: HeaderMap, Query(q): Q) -> Response {
    let page = number(&q, "page", 1).max(1);
    if let Some(refused) = api.gate(&h, Some(page)) {
        return refused;
    }
    if let Some((stream, left)) = &mut *api.failing_stream.lock().unwrap()
        && *left > 0
        && q.get("stream") == Some(stream)
    {
        *left -= 1;
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({ "message": "try later" }))).into_response();
    }
    if api.missing_stream.lock().unwrap().as_ref().is_some_and(|s| q.get("stream") == Some(s)) {
        return (StatusCode::NOT_FOUND, axum::Json(json!({ "message": "Not Found" }))).into_response();
    }
    let now = api.pages_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    api.most_pages_in_flight.fetch_max(now, Ordering::SeqCst);
    let delay = api.page_delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    }
    api.pages_in_flight.fetch_sub(1, Ordering::SeqCst);
    if api.missing_page.load(Ordering::SeqCst) == page {
        return (StatusCode::NOT_FOUND, axum::Json(json!({ "message": "Not Found" }))).into_response();
    }
    let per_page = number(&q, "per_page", 10).clamp(1, 1000);
    let (total, mut data) = api.window(&q, None, (page - 1) * per_page, per_page);
    let total_pages = total.div_ceil(per_page);
    let meta = json!({ "page": page, "per_page": per_page, "total_pages": total_pages });
    let echo = *api.echo_compressed.lock().unwrap();
    let Some(coding) = echo else {
        return axum::Json(json!({ "data": data, "meta": meta })).into_response();
    };
    let auth = h.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    for record in &mut data {
        record["requested_by"] = json!(auth);
    }
    let plain = serde_json::to_vec(&json!({ "data": data, "meta": meta })).unwrap_or_default();
    let coded = crate::codings::encode(coding, &plain);
    ([("content-type", "application/json"), ("content-encoding", coding), ("x-echo", auth.as_str())], coded)
        .into_response()
}

async fn cursor(State(api): State<Arc<RestApi>>, h: HeaderMap, Query(q): Q) -> Response {
    if let Some(refused) = api.gate(&h, None) {
        return refused;
    }
    let limit = number(&q, "limit", 10).clamp(1, 1000);
    let items = api.selected(&q, None);
    // The cursor is opaque to clients: the next index, disguised.
    let start = q.get("cursor").and_then(|c| c.strip_prefix("c_")).and_then(|c| c.parse().ok()).unwrap_or(0);
    let data = slice(&items, start, limit);
    let next = if start + limit < items.len() { json!(format!("c_{}", start + limit)) } else { Value::Null };
    axum::Json(json!({ "items": data, "next_cursor": next })).into_response()
}

async fn link(State(api): State<Arc<RestApi>>, h: HeaderMap, Query(q): Q) -> Response {
    let page = number(&q, "page", 1).max(1);
    if let Some(refused) = api.gate(&h, Some(page)) {
        return refused;
    }
    let per_page = number(&q, "per_page", 30).clamp(1, 100);
    let items = api.selected(&q, None);
    let last = items.len().div_ceil(per_page).max(1);
    let data = slice(&items, (page - 1) * per_page, per_page);
    let key = api.key_param.as_ref().and_then(|name| {
        let value = q.get(name)?;
        let value: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
        Some(format!("&{name}={value}"))
    });
    let key = key.unwrap_or_default();
    let url = |p: usize| format!("<https://{HOST}/link/items?per_page={per_page}&page={p}{key}>");
    let mut links = Vec::new();
    if page < last {
        links.push(format!("{}; rel=\"next\"", url(page + 1)));
        links.push(format!("{}; rel=\"last\"", url(last)));
    }
    if page > 1 {
        links.push(format!("{}; rel=\"prev\"", url(page - 1)));
        links.push(format!("{}; rel=\"first\"", url(1)));
    }
    let mut response = axum::Json(Value::Array(data)).into_response();
    if !links.is_empty() {
        response.headers_mut().insert("link", links.join(", ").parse().unwrap());
    }
    response
}

async fn offset(State(api): State<Arc<RestApi>>, h: HeaderMap, Query(q): Q) -> Response {
    if let Some(refused) = api.gate(&h, None) {
        return refused;
    }
    let offset = number(&q, "offset", 0);
    let limit = number(&q, "limit", 20).clamp(1, 1000);
    let items = api.selected(&q, None);
    axum::Json(json!({ "results": slice(&items, offset, limit), "total": items.len() })).into_response()
}

async fn owners(State(api): State<Arc<RestApi>>, h: HeaderMap) -> Response {
    if let Some(refused) = api.gate(&h, None) {
        return refused;
    }
    let owners: Vec<Value> =
        OWNERS.iter().map(|o| json!({ "login": o, "url": format!("https://{HOST}/owners/{o}") })).collect();
    axum::Json(json!({ "owners": owners })).into_response()
}

async fn owned(State(api): State<Arc<RestApi>>, h: HeaderMap, Path(owner): Path<String>, Query(q): Q) -> Response {
    let page = number(&q, "page", 1).max(1);
    if let Some(refused) = api.gate(&h, Some(page)) {
        return refused;
    }
    if !OWNERS.contains(&owner.as_str()) {
        return (StatusCode::NOT_FOUND, axum::Json(json!({ "message": "Not Found" }))).into_response();
    }
    let per_page = number(&q, "per_page", 10).clamp(1, 1000);
    let items = api.selected(&q, Some(&owner));
    let total_pages = items.len().div_ceil(per_page);
    let data = slice(&items, (page - 1) * per_page, per_page);
    axum::Json(json!({ "data": data, "meta": { "page": page, "total_pages": total_pages } })).into_response()
}

/// One page of records whose next page is `next` (another host, an IP
/// address, plain HTTP: whatever the test asks for).
async fn hostile_next(State(api): State<Arc<RestApi>>, h: HeaderMap, Query(q): Q) -> Response {
    if let Some(refused) = api.gate(&h, None) {
        return refused;
    }
    let items = api.selected(&HashMap::new(), None);
    axum::Json(json!({ "data": slice(&items, 0, 5), "next": q.get("next") })).into_response()
}

/// Pages that never run out: every page full, whatever its number.
async fn endless(State(api): State<Arc<RestApi>>, h: HeaderMap, Query(q): Q) -> Response {
    if let Some(refused) = api.gate(&h, None) {
        return refused;
    }
    let page = number(&q, "page", 1);
    let data: Vec<Value> = (0..5).map(|i| json!({ "id": page * 5 + i })).collect();
    axum::Json(json!({ "data": data })).into_response()
}

/// A cursor that always points back at itself.
async fn looping(State(api): State<Arc<RestApi>>, h: HeaderMap) -> Response {
    if let Some(refused) = api.gate(&h, None) {
        return refused;
    }
    axum::Json(json!({ "data": [{ "id": 1 }], "next_cursor": "again" })).into_response()
}

/// A page of 50 MB, streamed.
async fn huge(State(api): State<Arc<RestApi>>, h: HeaderMap) -> Response {
    if let Some(refused) = api.gate(&h, None) {
        return refused;
    }
    const MB: usize = 1024 * 1024;
    let chunk = bytes::Bytes::from(format!("{{\"id\": 1, \"blob\": \"{}\"}},", "x".repeat(MB - 32)));
    let chunks = std::iter::once(Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"{\"data\": [")))
        .chain((0..50).map(move |_| Ok(chunk.clone())))
        .chain(std::iter::once(Ok(bytes::Bytes::from_static(b"{\"id\": 2}]}"))));
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))
        .unwrap()
}
