//! Workspaces and members (spec section 4, "Workspaces").

use axum::Extension;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiJson, ApiQuery, Caller, PageQuery, Workspace};
use super::{Envelope, Page, ok};
use crate::access::{ClientSource, Role};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::ops::members::{CreatedInvitation, InviteMember};
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::invitations::{AcceptError, Acceptor};
use crate::store::workspaces::{Member, WorkspaceWithRole};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_workspaces))
        .routes(routes!(list_members))
        .routes(routes!(invite_member))
        .routes(routes!(remove_member))
        .routes(routes!(accept_invitation))
}

/// Body of `POST /invitations/accept`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AcceptInvitation {
    /// The code at the end of the invitation's accept link
    /// (`.../invitations/<code>`).
    #[schema(min_length = 1, max_length = 200)]
    pub code: String,
}

/// What accepting an invitation granted.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Accepted {
    pub workspace_id: String,
    pub user_id: String,
    /// The role the invitation grants (an existing member keeps theirs).
    pub role: Role,
}

/// Accept an invitation to your own account's address with your own
/// session (how an existing account joins another workspace; a new
/// address accepts on the link's page instead). Not through MCP and never
/// as a proposal: joining a workspace is the person's own decision.
#[utoipa::path(post, path = "/invitations/accept", tag = "workspaces", request_body = AcceptInvitation,
    responses((status = 200, body = Envelope<Accepted>), (status = 400, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
async fn accept_invitation(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<AcceptInvitation>,
) -> ApiResult<Envelope<Accepted>> {
    note.action("invitations.accept");
    crate::ops::gate::refuse_proposal_mode(&principal, "accepting an invitation")?;
    if principal.client == ClientSource::Mcp {
        return Err(ApiError::permission_denied(
            "permission denied: an invitation is accepted by the person invited, not by an MCP client",
        ));
    }
    let hash = crate::access::tokens::hash(body.code.trim());
    let pending = state.store.pending_invitation(&hash).await?.ok_or_else(|| ApiError::not_found("invitation"))?;
    note.workspace(&pending.workspace_id);
    note.target("invitation", &pending.invitation_id);
    match state.store.accept_invitation(&hash, Acceptor::Account { user_id: &principal.user_id }).await? {
        Ok(a) => Ok(ok(Accepted { workspace_id: a.workspace_id, user_id: a.user_id, role: a.role })),
        Err(AcceptError::NotPending) => Err(ApiError::not_found("invitation")),
        // Someone else's invitation behaves like one that does not exist.
        Err(AcceptError::WrongAccount | AcceptError::AccountExists) => Err(ApiError::not_found("invitation")),
    }
}

/// Workspaces the caller belongs to, with the caller's role in each.
#[utoipa::path(get, path = "/workspaces", tag = "workspaces", params(PageQuery),
    responses((status = 200, body = Envelope<Page<WorkspaceWithRole>>), (status = 401, body = crate::error::ErrorBody)))]
async fn list_workspaces(
    State(state): State<AppState>,
    Caller(principal): Caller,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Envelope<Page<WorkspaceWithRole>>> {
    let limit = q.limit()?;
    let items = state.store.workspaces_of(&principal.user_id, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |w| &w.member_id)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct MemberFilter {
    /// Only members with this role.
    #[param(value_type = Option<crate::store::workspaces::Role>)]
    role: Option<String>,
}

/// Members of a workspace (any member may list them).
#[utoipa::path(get, path = "/workspaces/{workspace_id}/members", tag = "workspaces",
    params(("workspace_id" = String, Path), PageQuery, MemberFilter),
    responses((status = 200, body = Envelope<Page<Member>>), (status = 404, body = crate::error::ErrorBody)))]
async fn list_members(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
    ApiQuery(f): ApiQuery<MemberFilter>,
) -> ApiResult<Envelope<Page<Member>>> {
    let role = f
        .role
        .as_deref()
        .map(|r| {
            Role::parse(r)
                .ok_or_else(|| ApiError::invalid_field("role", "role must be administrator, editor or viewer"))
        })
        .transpose()?;
    let limit = q.limit()?;
    let items = state.store.members(&ws.workspace_id, role, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |m| &m.member_id)))
}

/// Invite someone by e-mail; the answer carries a single-use, expiring
/// accept link (administrators).
#[utoipa::path(post, path = "/workspaces/{workspace_id}/members/invitations", tag = "workspaces",
    params(("workspace_id" = String, Path)), request_body = InviteMember,
    responses((status = 201, body = Envelope<CreatedInvitation>), (status = 403, body = crate::error::ErrorBody)))]
async fn invite_member(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<InviteMember>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::members::MemberOp::InviteMember(body)).await
}

/// Remove a member (administrators). The last administrator cannot be
/// removed (409 `LAST_ADMINISTRATOR`).
#[utoipa::path(delete, path = "/workspaces/{workspace_id}/members/{member_id}", tag = "workspaces",
    params(("workspace_id" = String, Path), ("member_id" = String, Path)),
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 409, body = crate::error::ErrorBody)))]
async fn remove_member(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path((_, member_id)): Path<(String, String)>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::members::MemberOp::RemoveMember { member_id }).await
}
