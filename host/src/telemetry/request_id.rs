//! Request ids: one UUID per request, sent back as `X-Request-Id`, carried in
//! every response body and attached to every log line of the request.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

tokio::task_local! {
    static REQUEST_ID: String;
}

/// Name of the response header carrying the request id.
pub(crate) const HEADER: &str = "x-request-id";

/// The id of the request being handled on this task (a fresh one outside a
/// request, e.g. in background work).
pub(crate) fn current() -> String {
    REQUEST_ID.try_with(Clone::clone).unwrap_or_else(|_| uuid::Uuid::new_v4().to_string())
}

/// Middleware: assigns the id, opens the request's tracing span and sets the
/// response header (unless the answer is an idempotent replay, which keeps
/// the id of the request it first answered).
pub(crate) async fn assign(req: Request, next: Next) -> Response {
    let id = uuid::Uuid::new_v4().to_string();
    let span = tracing::info_span!("request", request_id = %id, method = %req.method(), path = %loggable_path(req.uri().path()));
    let mut response = REQUEST_ID.scope(id.clone(), next.run(req).instrument(span)).await;
    // A replayed answer already names the request it answered first.
    if !response.headers().contains_key(HEADER)
        && let Ok(v) = HeaderValue::from_str(&id)
    {
        response.headers_mut().insert(HEADER, v);
    }
    response
}

/// Page paths whose last segment is a one-time code.
const ONE_TIME_PATHS: &[&str] = &["/login/", "/invitations/", "/credential-entry/"];

/// A path as it may appear in logs: one-time codes replaced, since log
/// pipelines keep lines forever.
pub(crate) fn loggable_path(path: &str) -> std::borrow::Cow<'_, str> {
    match ONE_TIME_PATHS.iter().find(|p| path.starts_with(**p)) {
        Some(prefix) => format!("{prefix}<code>").into(),
        None => path.into(),
    }
}
