//! Connections: a pipeline's runtime record, deleted with its state and
//! jobs (spec section 4, "Pipelines").

use axum::Extension;
use axum::extract::{Path, State};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Envelope;
use super::extract::Workspace;
use crate::audit::AuditNote;
use crate::error::ApiResult;
use crate::ops::{self, Executed};
use crate::state::AppState;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(delete_connection))
}

/// Delete a connection (a pipeline's runtime record), its state and jobs.
#[utoipa::path(delete, path = "/connections/{connection_id}", tag = "pipelines", params(("connection_id" = String, Path)),
    responses((status = 200, body = Envelope<Value>), (status = 409, body = crate::error::ErrorBody)))]
async fn delete_connection(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::pipelines::PipelineOp::DeleteConnection { connection_id: id }).await
}
