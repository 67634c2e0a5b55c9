//! The example source's provider: a JSONPlaceholder-style REST API (the
//! `json-server` conventions it is built on). `GET /posts` filters with
//! `FIELD_gte`, sorts with `_sort`/`_order`, and pages with `_page` and
//! `_limit` (10 by default once `_page` is given), answering a JSON array
//! with `X-Total-Count`. Other query parameters are ignored, as the real
//! service ignores them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

/// The host name the example source declares.
pub const HOST: &str = "jsonplaceholder.typicode.com";

/// The provider's data and behaviour.
#[derive(Default)]
pub struct Placeholder {
    pub posts: Vec<Value>,
    /// When set, requests must carry `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Echo the request's `Authorization` header back: raw in the
    /// `x-echo-authorization` header and in every post's `requested_by`,
    /// Base64 in `x-echo-base64`, as debugging proxies do.
    pub echo_credential: bool,
    /// Compress every answer with this content coding, whatever the
    /// request's `Accept-Encoding` said.
    pub compress: Option<&'static str>,
    pub requests: AtomicUsize,
}

impl Placeholder {
    /// `count` posts, ten per user, ids from 1.
    pub fn with_posts(count: usize) -> Self {
        Placeholder { posts: posts(count), ..Placeholder::default() }
    }
}

/// `count` posts as the real service shapes them.
pub fn posts(count: usize) -> Vec<Value> {
    (1..=count)
        .map(|id| {
            json!({
                "userId": 1 + (id - 1) / 10,
                "id": id,
                "title": format!("post number {id}"),
                "body": format!("the body of post {id}\nover two lines"),
            })
        })
        .collect()
}

pub fn router(state: Arc<Placeholder>) -> Router {
    Router::new().route("/posts", get(list_posts)).with_state(state)
}

async fn list_posts(
    State(state): State<Arc<Placeholder>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    if let Some(token) = &state.token
        && auth != format!("Bearer {token}")
    {
        return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "error": "invalid token" }))).into_response();
    }
    let mut posts: Vec<Value> = state
        .posts
        .iter()
        .filter(|post| {
            query
                .iter()
                .filter_map(|(k, v)| Some((k.strip_suffix("_gte")?, v.parse::<i64>().ok()?)))
                .all(|(field, min)| post[field].as_i64().is_some_and(|n| n >= min))
        })
        .cloned()
        .collect();
    if let Some(field) = query.get("_sort") {
        posts.sort_by_key(|p| p[field].as_i64().unwrap_or(0));
        if query.get("_order").map(String::as_str) == Some("desc") {
            posts.reverse();
        }
    }
    let total = posts.len();
    if let Some(page) = query.get("_page").and_then(|p| p.parse::<usize>().ok()) {
        let limit = query.get("_limit").and_then(|l| l.parse::<usize>().ok()).unwrap_or(10);
        posts = posts.into_iter().skip(page.saturating_sub(1) * limit).take(limit).collect();
    } else if let Some(limit) = query.get("_limit").and_then(|l| l.parse::<usize>().ok()) {
        posts.truncate(limit);
    }
    let mut response_headers = vec![("x-total-count".to_owned(), total.to_string())];
    if state.echo_credential && !auth.is_empty() {
        use base64::Engine;
        for post in &mut posts {
            post["requested_by"] = json!(auth);
        }
        response_headers.push(("x-echo-authorization".into(), auth.clone()));
        let secret = auth.strip_prefix("Bearer ").unwrap_or(&auth);
        response_headers.push(("x-echo-base64".into(), base64::engine::general_purpose::STANDARD.encode(secret)));
    }
    if let Some(coding) = state.compress {
        response_headers.push(("content-encoding".into(), coding.into()));
    }
    let body = serde_json::to_vec(&posts).unwrap_or_default();
    let body = match state.compress {
        Some(coding) => crate::codings::encode(coding, &body),
        None => body,
    };
    let mut response = ([("content-type", "application/json")], body).into_response();
    for (name, value) in response_headers {
        if let (Ok(name), Ok(value)) = (name.parse::<axum::http::HeaderName>(), value.parse()) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}
