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

pub(crate) fn router(openapi: &utoipa::openapi::OpenApi) -> Router<AppState> {
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

/// Pipelines `/metrics` lists one by one at most (the stalest first), so
/// an installation with many never makes an unbounded scrape; the count
/// left out is a metric of its own.
const METRICS_PIPELINES: i64 = 1000;

async fn metrics(State(state): State<AppState>, headers: axum::http::HeaderMap) -> axum::response::Response {
    if let Some(token) = &state.config.metrics.token {
        use secrecy::ExposeSecret;
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let same: bool = subtle::ConstantTimeEq::ct_eq(given.as_bytes(), token.expose_secret().as_bytes()).into();
        if !same {
            return ApiError::unauthenticated(
                "/metrics needs the metrics token (SERVICE_METRICS_TOKEN) as a bearer token",
            )
            .into_response();
        }
    }
    let mut text = state.metrics.render();
    // Read from the control database at scrape time, so every replica
    // answers the same and a deleted pipeline leaves no stale series.
    if let Ok((pipelines, total)) = state.store.pipeline_freshness(METRICS_PIPELINES).await {
        text.push_str(&pipeline_metrics(&pipelines, total, crate::store::now_ms(), &state.metric_labels));
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The per-pipeline freshness series in Prometheus' text format.
fn pipeline_metrics(
    pipelines: &[crate::store::pipelines::PipelineFreshness],
    total: i64,
    now: i64,
    labels: &crate::telemetry::labels::MetricLabels,
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    out.push_str("# HELP pipeline_last_success_age_seconds Seconds since the pipeline's last successful sync.\n");
    out.push_str("# TYPE pipeline_last_success_age_seconds gauge\n");
    for p in pipelines.iter().filter(|p| p.last_succeeded_at.is_some()) {
        let age = (now - p.last_succeeded_at.unwrap_or(now)).max(0) as f64 / 1000.0;
        let _ = writeln!(
            out,
            "pipeline_last_success_age_seconds{{workspace=\"{}\",pipeline=\"{}\"}} {age}",
            labels.workspace(&p.workspace_id),
            p.pipeline_id
        );
    }
    out.push_str(
        "# HELP pipeline_freshness_breached 1 while the pipeline's data is older than its freshness setting.\n",
    );
    out.push_str("# TYPE pipeline_freshness_breached gauge\n");
    for p in pipelines {
        let _ = writeln!(
            out,
            "pipeline_freshness_breached{{workspace=\"{}\",pipeline=\"{}\"}} {}",
            labels.workspace(&p.workspace_id),
            p.pipeline_id,
            u8::from(p.breached)
        );
    }
    out.push_str(
        "# HELP pipelines_not_listed Pipelines left out of the per-pipeline series (beyond the stalest 1000).\n",
    );
    out.push_str("# TYPE pipelines_not_listed gauge\n");
    let _ = writeln!(out, "pipelines_not_listed {}", (total - pipelines.len() as i64).max(0));
    out
}
