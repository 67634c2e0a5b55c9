//! A model's query against its warehouse: finding the warehouse
//! destination and running the query through [`crate::warehouse::Warehouses`]
//! (read-only, bounded: see [`crate::warehouse::query`]), with the API's
//! answers to what can go wrong.

use std::time::Duration;

use serde_json::json;

use crate::error::ApiError;
use crate::retry::Transient;
use crate::state::AppState;
use crate::store::kinds::DestinationKind;
use crate::warehouse::WarehouseError;
use crate::warehouse::query::{Bounds, ModelRows, QueryError};

/// How long a preview or a model check may run.
pub(crate) const PREVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a run's query may run.
pub(crate) const RUN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Rows a preview shows at most.
pub(crate) const PREVIEW_ROWS: u64 = 100;

/// How much of a model a preview (or a model's check) takes: its rows,
/// each value up to the preview's cell size, for [`PREVIEW_TIMEOUT`].
pub(crate) fn preview_bounds(state: &AppState) -> Bounds {
    Bounds {
        rows: Some(PREVIEW_ROWS),
        value_bytes: state.config.limits.reverse_etl.preview_cell_bytes,
        timeout: PREVIEW_TIMEOUT,
    }
}

/// How much of a model a run takes: one row more than a run may send (so
/// a model past the limit is seen to be), each value up to the run's cap,
/// for [`RUN_TIMEOUT`].
pub(crate) fn run_bounds(state: &AppState) -> Bounds {
    let limits = &state.config.limits.reverse_etl;
    Bounds { rows: Some(limits.rows_per_run.saturating_add(1)), value_bytes: limits.value_bytes, timeout: RUN_TIMEOUT }
}

/// Why a model gave no rows, kept typed until the caller's boundary: an
/// API operation turns it into its answer, a run into a failure that is
/// retried or not by [`ModelError::is_transient`].
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("no such destination in this workspace")]
    NoSuchWarehouse(String),
    #[error("only SQLite and PostgreSQL destinations can be queried; choose one of those")]
    NotQueryable(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("{1}")]
    Warehouse(String, WarehouseError),
}

impl Transient for ModelError {
    /// Whether another attempt may succeed.
    fn is_transient(&self) -> bool {
        match self {
            ModelError::NoSuchWarehouse(_) | ModelError::NotQueryable(_) => false,
            ModelError::Store(_) => true,
            ModelError::Warehouse(_, e) => e.is_transient(),
        }
    }
}

impl From<ModelError> for ApiError {
    fn from(e: ModelError) -> ApiError {
        match e {
            ModelError::NoSuchWarehouse(_) | ModelError::NotQueryable(_) => {
                ApiError::invalid_field("warehouse_id", e.to_string())
            }
            ModelError::Store(e) => e.into(),
            ModelError::Warehouse(id, WarehouseError::Credential(reason)) => credential_refused(&id, &reason),
            ModelError::Warehouse(_, WarehouseError::Query(q)) => query_error(q),
            ModelError::Warehouse(_, WarehouseError::Config(e)) => e,
            ModelError::Warehouse(_, WarehouseError::Write(w)) => ApiError::unavailable(w.to_string()),
        }
    }
}

/// Runs `query` over the workspace's warehouse destination `warehouse_id`.
pub(crate) async fn open(
    state: &AppState,
    workspace_id: &str,
    warehouse_id: &str,
    query: &str,
    bounds: Bounds,
) -> Result<ModelRows, ModelError> {
    let warehouse = state
        .store
        .destination(workspace_id, warehouse_id)
        .await?
        .ok_or_else(|| ModelError::NoSuchWarehouse(warehouse_id.to_owned()))?;
    if matches!(warehouse.kind, DestinationKind::Jsonl | DestinationKind::Iceberg) {
        return Err(ModelError::NotQueryable(warehouse_id.to_owned()));
    }
    state
        .warehouses
        .query(&warehouse, query, bounds)
        .await
        .map_err(|e| ModelError::Warehouse(warehouse_id.to_owned(), e))
}

/// The warehouse's credential cannot be used: revoked, unknown or bound
/// to another host is the caller's to fix; a store outage may pass.
fn credential_refused(warehouse_id: &str, reason: &crate::credentials::SecretError) -> ApiError {
    if reason.is_transient() {
        return ApiError::unavailable(format!("the warehouse's credential cannot be read now: {reason}"));
    }
    ApiError::bad_request(
        "WAREHOUSE_CREDENTIAL_UNUSABLE",
        format!("the warehouse's credential cannot be used: {reason}"),
    )
    .with_details(json!({ "field": "warehouse_id", "warehouse_id": warehouse_id }))
}

/// The API's answer to a refused or failed model query.
pub(crate) fn query_error(e: QueryError) -> ApiError {
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
