//! Sessions (spec section 4, "Audit and sessions"; section 5, "Sessions").

use axum::Extension;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{PageQuery, Workspace};
use super::middleware::AuditNote;
use super::{Envelope, Page, ok};
use crate::access::Role;
use crate::error::ApiResult;
use crate::ops::{self, Executed, Operation};
use crate::server::AppState;
use crate::store::sessions::Session;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_sessions)).routes(routes!(revoke_session))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SessionFilter {
    /// Only sessions of this user.
    user_id: Option<String>,
    /// Include revoked sessions (default false).
    #[serde(default)]
    include_revoked: bool,
}

/// Sessions of the workspace's members, newest first (administrators).
#[utoipa::path(get, path = "/sessions", tag = "sessions", params(PageQuery, SessionFilter),
    responses((status = 200, body = Envelope<Page<Session>>), (status = 403, body = crate::error::ErrorBody)))]
async fn list_sessions(
    State(state): State<AppState>,
    ws: Workspace,
    Query(q): Query<PageQuery>,
    Query(f): Query<SessionFilter>,
) -> ApiResult<Envelope<Page<Session>>> {
    ws.require(Role::Administrator)?;
    let limit = q.limit()?;
    let items = state
        .store
        .sessions_in_workspace(&ws.workspace_id, f.user_id.as_deref(), f.include_revoked, q.after()?.as_deref(), limit + 1)
        .await?;
    Ok(ok(q.page(items, limit, |s| &s.session_id)))
}

/// Revoke a session; the next request with its token gets 401
/// (administrators).
#[utoipa::path(post, path = "/sessions/{session_id}/revoke", tag = "sessions", params(("session_id" = String, Path)),
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 404, body = crate::error::ErrorBody)))]
async fn revoke_session(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(session_id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, Operation::RevokeSession { session_id }).await
}
