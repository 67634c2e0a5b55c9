//! Sessions (spec section 4, "Audit and sessions"; section 5, "Sessions").

use axum::Extension;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiQuery, PageQuery, Workspace};
use super::{Envelope, Page, ok};
use crate::access::Role;
use crate::audit::AuditNote;
use crate::error::ApiResult;
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::sessions::{Session, SessionQuery};

pub(crate) fn router() -> OpenApiRouter<AppState> {
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

/// Sessions, newest first: your own, and, for administrators, those of the
/// members whose every workspace you administer (a member who also works
/// in another workspace is that workspace's administrators' business too,
/// and an operator's only operators').
#[utoipa::path(get, path = "/sessions", tag = "sessions", params(PageQuery, SessionFilter),
    responses((status = 200, body = Envelope<Page<Session>>), (status = 403, body = crate::error::ErrorBody)))]
async fn list_sessions(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
    ApiQuery(f): ApiQuery<SessionFilter>,
) -> ApiResult<Envelope<Page<Session>>> {
    let limit = q.limit()?;
    let items = state
        .store
        .sessions_in_workspace(
            &SessionQuery {
                workspace_id: &ws.workspace_id,
                viewer: &ws.principal.user_id,
                as_administrator: ws.role == Role::Administrator,
                user_id: f.user_id.as_deref(),
                include_revoked: f.include_revoked,
            },
            q.after()?.as_deref(),
            limit + 1,
        )
        .await?;
    Ok(ok(q.page(items, limit, |s| &s.session_id)))
}

/// Revoke a session; the next request with its token gets 401. Anyone may
/// revoke their own sessions (signing out, a leaked token); administrators
/// those they administer (see `GET /sessions`).
#[utoipa::path(post, path = "/sessions/{session_id}/revoke", tag = "sessions", params(("session_id" = String, Path)),
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 202, body = Envelope<crate::ops::Proposed>),
        (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
async fn revoke_session(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(session_id): Path<String>,
) -> ApiResult<Executed> {
    let own = state.store.session(&session_id).await?.is_some_and(|s| s.user_id == ws.principal.user_id);
    // An assistant ending its own session needs nobody; ending its
    // person's other sessions (the one they would reject its proposals
    // with, say) goes through the gate like any of its writes.
    let assistant_on_others =
        ws.principal.client == crate::access::ClientSource::Mcp && session_id != ws.principal.session_id;
    if own && assistant_on_others {
        return ops::submit(&state, &ws, &note, crate::ops::sessions::SessionOp::RevokeOwnSession { session_id }).await;
    }
    if own {
        // Ending one's own access needs nobody's approval.
        note.action("sessions.revoke");
        crate::ops::gate::refuse_proposal_mode(&ws.principal, "revoking your own session")?;
        return ops::sessions::revoke(&ops::Ctx::request(&state, &ws, &note), &session_id).await;
    }
    ops::submit(&state, &ws, &note, crate::ops::sessions::SessionOp::RevokeSession { session_id }).await
}
