//! Operational endpoints outside `/v1`'s authentication: liveness,
//! readiness, Prometheus metrics, and the OpenAPI description.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;

use super::ok;
use crate::error::ApiError;
use crate::state::AppState;

pub fn router(openapi: &utoipa::openapi::OpenApi) -> Router<AppState> {
    let doc = Arc::new(openapi.to_pretty_json().unwrap_or_default());
    Router::new()
        .route("/healthz", get(|| async { ok(json!({ "status": "ok" })) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        // The description is public here; `/v1/openapi.json` serves the
        // same document behind the bearer check like every `/v1` route.
        .route("/openapi.json", get(move || openapi_json(doc.clone())))
}

/// Serves the OpenAPI document.
pub(crate) async fn openapi_json(doc: Arc<String>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], (*doc).clone())
}

/// Ready when the database answers.
async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.store.ping().await {
        ok(json!({ "status": "ready", "database": "ok" })).into_response()
    } else {
        ApiError::unavailable("database unreachable").into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}
