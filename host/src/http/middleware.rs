//! Middleware of the `/v1` routes, outermost first:
//!
//! 1. [`authenticate`]: bearer token → [`Principal`]; its client kind (the
//!    session's, narrowed by `X-Service-Client`).
//! 2. [`idempotency`]: `Idempotency-Key` on POST replays the first response.
//! 3. [`audit`]: one audit record per state-changing request.
//!
//! and on every route, [`metrics`]: request counts and latencies.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::json;

use super::extract::{BODY_LIMIT, payload_too_large};
use crate::access::tokens;
use crate::access::{ClientSource, Principal};
use crate::audit::AuditNote;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::idempotency::KeyState;
use crate::store::now_ms;
use crate::store::sessions::SessionKind;

/// Header naming the client kind (spec section 5).
pub(crate) const CLIENT_HEADER: &str = "x-service-client";
/// Header carrying an idempotency key.
pub(crate) const IDEMPOTENCY_HEADER: &str = "idempotency-key";
/// Header set on a replayed response.
pub(crate) const REPLAYED_HEADER: &str = "idempotent-replayed";

/// How often `last_used_at` of a session is refreshed: writing it on every
/// request would turn each read into a write.
const TOUCH_INTERVAL_MS: i64 = 60_000;

/// Parses `X-Service-Client`; anything unknown is a 400.
pub(crate) fn client_source(headers: &axum::http::HeaderMap) -> Result<Option<ClientSource>, ApiError> {
    match headers.get(CLIENT_HEADER) {
        None => Ok(None),
        Some(v) => v.to_str().ok().and_then(ClientSource::parse).map(Some).ok_or_else(|| {
            ApiError::bad_request("INVALID_CLIENT_SOURCE", "X-Service-Client must be one of: api, cli, mcp")
                .with_details(json!({ "header": "X-Service-Client", "allowed": ["api", "cli", "mcp"] }))
        }),
    }
}

/// Parses `X-Service-Execution-Mode`: `proposal` turns writes into
/// proposals; `execute` (or no header) leaves the decision to the policy.
pub(crate) fn execution_mode(headers: &axum::http::HeaderMap) -> Result<bool, ApiError> {
    match headers.get(crate::ops::gate::EXECUTION_MODE_HEADER).map(|v| v.to_str().unwrap_or("")) {
        None | Some("execute") => Ok(false),
        Some("proposal") => Ok(true),
        Some(_) => {
            Err(ApiError::bad_request("INVALID_EXECUTION_MODE", "X-Service-Execution-Mode must be proposal or execute")
                .with_details(json!({ "header": "X-Service-Execution-Mode", "allowed": ["proposal", "execute"] })))
        }
    }
}

/// The bearer token of a request, if it carries one.
pub(crate) fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

/// Resolves the bearer token to a live session (spec section 5). Every
/// request reads the session row, so a revocation is seen by the next one.
pub(crate) async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let client = match client_source(req.headers()) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let proposal_requested = match execution_mode(req.headers()) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let Some(token) = bearer_token(req.headers()) else {
        return ApiError::unauthenticated("missing bearer token: send Authorization: Bearer <token>").into_response();
    };
    let address = crate::access::address::from_extensions(req.extensions());
    let hash = tokens::hash(token);
    let now = now_ms();
    // The epoch is taken before the database is read: a revocation heard
    // meanwhile keeps what was read out of the cache.
    let (cached, epoch) = state.session_cache.lookup(&hash, now);
    let session = match cached {
        Some(s) => s,
        None => match state.store.active_session(&hash).await {
            Ok(Some(s)) => {
                state.session_cache.put(&hash, s.clone(), epoch);
                s
            }
            Ok(None) => {
                // Failures are counted only for tokens that fail: a valid
                // token from an address that also sent bogus ones passes.
                if let Err(limited) = state.throttle.invalid_token(address, &hash) {
                    return limited.into_response();
                }
                return ApiError::unauthenticated("the bearer token is invalid, expired or revoked").into_response();
            }
            Err(e) => return ApiError::from(e).into_response(),
        },
    };
    if session.kind == SessionKind::Web {
        // A browser's cookie opens the pages only: the API takes tokens
        // issued for it (API tokens, CLI and MCP sessions).
        return ApiError::unauthenticated(
            "a web sign-in session opens the service's pages only; use an API token or `service auth login`",
        )
        .into_response();
    }
    if let Err(limited) = state.throttle.session(&session.session_id) {
        return limited.into_response();
    }
    if session.last_used_at.is_none_or(|t| now - t > TOUCH_INTERVAL_MS) {
        state.session_cache.touched(&hash, now);
        let store = state.store.clone();
        let id = session.session_id.clone();
        tokio::spawn(async move {
            if let Err(e) = store.touch_session(&id, now).await {
                tracing::warn!(error = %e, "could not record session use");
            }
        });
    }
    // The client kind belongs to the session: a session issued to an MCP
    // client stays one whatever the header says. The header names the
    // client of any other session (default `api`) and may narrow it to mcp.
    let client = if session.client_source == ClientSource::Mcp {
        ClientSource::Mcp
    } else {
        client.unwrap_or(ClientSource::Api)
    };
    req.extensions_mut().insert(Principal {
        user_id: session.user_id,
        session_id: session.session_id,
        client,
        proposal_requested,
    });
    next.run(req).await
}

/// Writes one audit record for every state-changing request, whatever its
/// outcome, before the response leaves. Records hold ids and outcomes only.
pub(crate) async fn audit(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let note = AuditNote::default();
    req.extensions_mut().insert(note.clone());
    let principal = req.extensions().get::<Principal>().cloned();
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let method = req.method().clone();
    let address = crate::access::address::from_extensions(req.extensions()).map(|a| a.to_string());

    let response = next.run(req).await;

    let fallback_action = format!("{method} {route}");
    let record = note.record(principal.as_ref(), &fallback_action, response.status()).at_address(address.as_deref());
    if let Err(e) = state.store.append_audit(&record).await {
        // The change already happened; losing its record is an operator
        // problem, not the client's.
        tracing::error!(error = %e, action = %record.action, "could not write audit record");
    }
    response
}

/// `Idempotency-Key` on POST: the first response to a key is stored; the
/// same key with the same request replays it; the same key with a different
/// request is refused. Keys are per user and kept for 24 hours.
pub(crate) async fn idempotency(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let Some(key) = req.headers().get(IDEMPOTENCY_HEADER) else {
        return next.run(req).await;
    };
    let key = match key.to_str() {
        Ok(k) if !k.is_empty() && k.len() <= 255 => k.to_owned(),
        _ => {
            return ApiError::invalid_field(
                "Idempotency-Key",
                "Idempotency-Key must be 1 to 255 visible ASCII characters",
            )
            .into_response();
        }
    };
    let Some(principal) = req.extensions().get::<Principal>().cloned() else {
        return next.run(req).await;
    };

    // The fingerprint covers what the operation depends on: path, query,
    // the addressed workspace and the body. Keyed: bodies of credential
    // flows hold raw secrets, and an unkeyed hash of one would let anyone
    // who reads the table test guesses against it.
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(b) => b,
        Err(_) => return payload_too_large().into_response(),
    };
    let workspace = parts.headers.get(super::extract::WORKSPACE_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
    let tag = state.fingerprint_key.mac(&[parts.uri.to_string().as_bytes(), workspace, &bytes]);
    let fingerprint: String = tag.iter().map(|b| format!("{b:02x}")).collect();

    match state.store.reserve_idempotency_key(&principal.user_id, &key, &fingerprint).await {
        Err(e) => return ApiError::from(e).into_response(),
        Ok(KeyState::InFlight { request_hash }) | Ok(KeyState::Completed { request_hash, .. })
            if request_hash != fingerprint =>
        {
            return ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "IDEMPOTENCY_KEY_REUSED",
                "this Idempotency-Key was already used with a different request; use a new key",
            )
            .into_response();
        }
        Ok(KeyState::InFlight { .. }) => {
            return ApiError::conflict(
                "IDEMPOTENCY_IN_PROGRESS",
                "a request with this Idempotency-Key is still being processed; retry shortly",
            )
            .into_response();
        }
        Ok(KeyState::Completed { status, body, .. }) => {
            let stored_body = body.clone();
            let mut response = (StatusCode::from_u16(status).unwrap_or(StatusCode::OK), body).into_response();
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
            // The body is the first answer, with the first request's id;
            // the header says the same, so a client sees which request
            // this answers. This request's own id stays in the logs.
            if let Some(first) = serde_json::from_str::<serde_json::Value>(&stored_body)
                .ok()
                .and_then(|v| v["request_id"].as_str().map(str::to_owned))
                && let Ok(v) = HeaderValue::from_str(&first)
            {
                tracing::info!(replays = %first, "idempotent replay");
                headers.insert(crate::telemetry::request_id::HEADER, v);
            }
            return response;
        }
        Ok(KeyState::Reserved) => {}
    }

    let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    // Values shown once (links, states) are answered but not kept: a
    // replay gets the answer without them.
    let replay = response.extensions().get::<super::ReplayBody>().map(|r| r.0.clone());
    let (parts, body) = response.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let _ = state.store.release_idempotency_key(&principal.user_id, &key).await;
            return ApiError::internal(anyhow::anyhow!("response body: {e}")).into_response();
        }
    };
    if parts.status.is_server_error() {
        // A server-side failure is not an answer worth replaying.
        if let Err(e) = state.store.release_idempotency_key(&principal.user_id, &key).await {
            tracing::warn!(error = %e, "could not release idempotency key");
        }
    } else if let Err(e) = state
        .store
        .complete_idempotency_key(
            &principal.user_id,
            &key,
            parts.status.as_u16(),
            &String::from_utf8_lossy(replay.as_ref().unwrap_or(&body)),
        )
        .await
    {
        tracing::warn!(error = %e, "could not store idempotent response");
    }
    Response::from_parts(parts, Body::from(body))
}

/// Refuses clients that send too many requests from one address, before
/// any other work is done for them.
pub(crate) async fn throttle_address(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(address) = crate::access::address::from_extensions(req.extensions())
        && let Err(limited) = state.throttle.address(address)
    {
        return limited.into_response();
    }
    next.run(req).await
}

/// Reads a request's whole body before anything else works on it, within
/// the body-read timeout: a client trickling its body a byte at a time
/// gets 408 and its connection back, long before the request deadline.
/// Bodies past twice the API's own limit are refused here with 413 (each
/// route still applies its own).
pub(crate) async fn read_body(State(state): State<AppState>, req: Request, next: Next) -> Response {
    use axum::body::HttpBody;
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let timeout = state.config.limits.body_read_timeout;
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, 2 * BODY_LIMIT)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Ok(Err(e)) if is_length_limit(&e) => payload_too_large().into_response(),
        Ok(Err(_)) => ApiError::bad_request("BODY_UNREADABLE", "the request body could not be read").into_response(),
        Err(_) => {
            let mut response = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "BODY_TIMEOUT",
                format!("the request body did not arrive within {} s", timeout.as_secs()),
            )
            .with_details(json!({ "timeout_seconds": timeout.as_secs() }))
            .into_response();
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

/// Whether reading a body stopped at its length limit.
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Answers 503 `REQUEST_TIMEOUT` for a request that has not produced its
/// response in time (the work is dropped with it).
pub(crate) async fn deadline(State(state): State<AppState>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(state.config.limits.request_timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "REQUEST_TIMEOUT",
            "the request took too long and was abandoned; retry later",
        )
        .with_details(json!({ "timeout_seconds": state.config.limits.request_timeout.as_secs() }))
        .into_response(),
    }
}

/// Counts requests by route and status and records their latency
/// (`/metrics`, Prometheus text format).
pub(crate) async fn metrics(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let route =
        req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "unmatched".into());
    let method = req.method().as_str().to_owned();
    let response = next.run(req).await;
    let status = response.status().as_u16().to_string();
    let labels = [("method", method), ("route", route), ("status", status)];
    metrics::counter!("http_requests_total", &labels).increment(1);
    metrics::histogram!("http_request_duration_seconds", &labels[..2]).record(start.elapsed().as_secs_f64());
    response
}
