//! Session operations.

use serde_json::json;

use serde::{Deserialize, Serialize};

use super::act::{Act, Category, Ctx, Executed};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Revokes a session everywhere: in the database, in this server's cache
/// of sessions, and (with PostgreSQL) in every other server's, through the
/// notice sent as the revocation commits. It returns once every server
/// listening for notices has confirmed its eviction (at most a second: a
/// server that cannot hear notices uses no cache), so the very next
/// request anywhere is refused. False when it was revoked already.
pub(crate) async fn end_session(state: &AppState, session_id: &str) -> ApiResult<bool> {
    let confirmations = state.store.confirmations();
    let newly_revoked = state.store.revoke_session(session_id).await?;
    state.session_cache.forget_session(session_id);
    state.store.confirmed_everywhere(session_id, confirmations).await;
    Ok(newly_revoked)
}

/// Revokes a session: the caller's own, or one of a member of the
/// caller's workspace whose sessions the caller administers. Sessions of
/// users outside the workspace answer 404, like sessions that do not
/// exist; those of members who also belong to workspaces the caller does
/// not administer (or of operators, for a non-operator) answer 403.
pub(crate) async fn revoke(ctx: &Ctx<'_>, session_id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("session", session_id);
    let session = state.store.session(session_id).await?.ok_or_else(|| ApiError::not_found("session"))?;
    if state.store.role_in(&session.user_id, &access.workspace_id).await?.is_none() {
        return Err(ApiError::not_found("session"));
    }
    if !state.store.administers_sessions_of(&access.principal.user_id, &session.user_id).await? {
        return Err(ApiError::permission_denied(
            "permission denied: this member also works in workspaces you do not administer; an administrator of each, or the member, revokes their sessions",
        ));
    }
    let newly_revoked = end_session(state, session_id).await?;
    let session = state.store.session(session_id).await?.ok_or_else(|| ApiError::not_found("session"))?;
    Executed::ok(json!({ "revoked": true, "already_revoked": !newly_revoked, "session": session }))
}

/// Session operations through the gate: revoking others' sessions, and an
/// assistant revoking its own person's other sessions. (A person ending
/// their own session, or an assistant its own, needs nobody's approval.)
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub(crate) enum SessionOp {
    /// Revoke a session of a workspace member.
    RevokeSession { session_id: String },
    /// Revoke another session of the proposer's own (proposed by an MCP
    /// client).
    RevokeOwnSession { session_id: String },
}

impl Act for SessionOp {
    fn action(&self) -> &'static str {
        "sessions.revoke"
    }

    fn category(&self) -> Category {
        Category::WorkspaceAdmin
    }

    fn required_role(&self) -> crate::access::Role {
        match self {
            SessionOp::RevokeSession { .. } => self.category().required_role(),
            // Anyone may end their own sessions.
            SessionOp::RevokeOwnSession { .. } => crate::access::Role::Viewer,
        }
    }

    fn summary(&self) -> String {
        match self {
            SessionOp::RevokeSession { session_id } => format!("Revoke session {session_id}"),
            SessionOp::RevokeOwnSession { session_id } => format!("Revoke your own session {session_id}"),
        }
    }
}

impl SessionOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        match self {
            SessionOp::RevokeSession { session_id } => revoke(ctx, &session_id).await,
            SessionOp::RevokeOwnSession { session_id } => {
                // Still the proposer's own when it runs.
                let session =
                    ctx.state.store.session(&session_id).await?.ok_or_else(|| ApiError::not_found("session"))?;
                if session.user_id != ctx.access.principal.user_id {
                    return Err(ApiError::not_found("session"));
                }
                revoke(ctx, &session_id).await
            }
        }
    }
}
