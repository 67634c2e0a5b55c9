//! A model's query against its warehouse: resolving the warehouse
//! destination (and its password, by credential handle) and running the
//! query read-only (see [`crate::warehouse::query`]).

use std::time::Duration;

use serde_json::json;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::warehouse::query::{Bounds, ModelRows, QueryError};
use crate::warehouse::{DestinationConfig, Place};

/// How long a preview or a model check may run.
pub const PREVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a run's query may run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Rows a preview shows at most.
pub const PREVIEW_ROWS: u64 = 100;

/// How much of a model a preview (or a model's check) takes: its rows,
/// each value up to the preview's cell size, for [`PREVIEW_TIMEOUT`].
pub fn preview_bounds(state: &AppState) -> Bounds {
    Bounds {
        rows: Some(PREVIEW_ROWS),
        value_bytes: state.config.limits.reverse_etl.preview_cell_bytes,
        timeout: PREVIEW_TIMEOUT,
    }
}

/// How much of a model a run takes: one row more than a run may send (so
/// a model past the limit is seen to be), each value up to the run's cap,
/// for [`RUN_TIMEOUT`].
pub fn run_bounds(state: &AppState) -> Bounds {
    let limits = &state.config.limits.reverse_etl;
    Bounds { rows: Some(limits.rows_per_run.saturating_add(1)), value_bytes: limits.value_bytes, timeout: RUN_TIMEOUT }
}

/// Runs `query` over the workspace's warehouse destination `warehouse_id`.
pub async fn open(
    state: &AppState,
    workspace_id: &str,
    warehouse_id: &str,
    query: &str,
    bounds: Bounds,
) -> ApiResult<ModelRows> {
    let warehouse = state
        .store
        .destination(workspace_id, warehouse_id)
        .await?
        .ok_or_else(|| ApiError::invalid_field("warehouse_id", "no such destination in this workspace"))?;
    let config = crate::warehouse::validate(warehouse.kind, &warehouse.configuration)?;
    let password = match &config {
        DestinationConfig::Postgres { target, credential_handle: Some(h), .. } => Some(
            state
                .vault
                .reveal(workspace_id, h, &target.host)
                .await
                .map_err(|e| credential_refused(warehouse_id, &e))?,
        ),
        DestinationConfig::Jsonl { .. } => {
            return Err(ApiError::invalid_field(
                "warehouse_id",
                "a JSON-lines destination cannot be queried; choose an SQLite or PostgreSQL destination",
            ));
        }
        _ => None,
    };
    let place = Place { data_dir: &state.config.data_dir, workspace_id, warehouses: &state.config.plugins.warehouses };
    crate::warehouse::query::run(&config, &place, password, query, bounds).await.map_err(query_error)
}

/// The warehouse's credential cannot be used: revoked, unknown or bound
/// to another host is the caller's to fix; a store outage may pass.
fn credential_refused(warehouse_id: &str, reason: &str) -> ApiError {
    if reason == crate::credentials::vault::STORE_UNAVAILABLE {
        return ApiError::unavailable(format!("the warehouse's credential cannot be read now: {reason}"));
    }
    ApiError::bad_request(
        "WAREHOUSE_CREDENTIAL_UNUSABLE",
        format!("the warehouse's credential cannot be used: {reason}"),
    )
    .with_details(json!({ "field": "warehouse_id", "warehouse_id": warehouse_id }))
}

/// The API's answer to a refused or failed model query.
pub fn query_error(e: QueryError) -> ApiError {
    match &e {
        QueryError::ReadOnly(m) => ApiError::bad_request(
            "MODEL_QUERY_WRITES",
            "models are read-only: the warehouse refused a statement that would write",
        )
        .with_details(json!({ "field": "query", "reason": m })),
        QueryError::Invalid(m) => {
            ApiError::bad_request("MODEL_QUERY_INVALID", format!("the warehouse refused the query: {m}"))
                .with_details(json!({ "field": "query" }))
        }
        QueryError::Timeout(_) => {
            ApiError::bad_request("MODEL_QUERY_TIMEOUT", e.to_string()).with_details(json!({ "field": "query" }))
        }
        QueryError::Unavailable(_) => {
            ApiError::new(axum::http::StatusCode::BAD_GATEWAY, "WAREHOUSE_UNAVAILABLE", e.to_string())
        }
        QueryError::RoleRefused(m) => {
            ApiError::bad_request("WAREHOUSE_ROLE_REFUSED", m.clone()).with_details(json!({ "field": "warehouse_id" }))
        }
    }
}
