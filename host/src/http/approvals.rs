//! Approvals and approval policies (spec section 4, "Approvals").

use axum::Extension;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiJson, ApiQuery, PageQuery, Workspace};
use super::{Envelope, Page, ok};
use crate::access::{ClientSource, Role};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::ops::gate;
use crate::ops::policies::{self, Policy};
use crate::ops::{Category, Executed};
use crate::state::AppState;
use crate::store::approvals::{Approval, ApprovalFilter};
use crate::store::kinds::ApprovalStatus;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_approvals))
        .routes(routes!(approve))
        .routes(routes!(reject))
        .routes(routes!(list_policies))
        .routes(routes!(update_policy))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ApprovalQuery {
    /// pending, executing, executed, failed, rejected, expired or voided.
    #[param(value_type = Option<crate::store::kinds::ApprovalStatus>)]
    status: Option<String>,
    /// An approval category, e.g. `workspace_admin`.
    #[param(value_type = Option<crate::ops::Category>)]
    category: Option<String>,
    /// api, cli or mcp.
    #[param(value_type = Option<crate::store::sessions::ClientSource>)]
    client_source: Option<String>,
}

/// Proposals of the workspace, newest first. The operation and result of a
/// proposal are shown only to its proposer and to those who may decide it.
#[utoipa::path(get, path = "/approvals", tag = "approvals", params(PageQuery, ApprovalQuery),
    responses((status = 200, body = Envelope<Page<Approval>>), (status = 400, body = crate::error::ErrorBody)))]
async fn list_approvals(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
    ApiQuery(f): ApiQuery<ApprovalQuery>,
) -> ApiResult<Envelope<Page<Approval>>> {
    let status = match &f.status {
        Some(s) => Some(ApprovalStatus::parse(s).ok_or_else(|| {
            ApiError::invalid_field("status", format!("status must be {}", ApprovalStatus::choices()))
        })?),
        None => None,
    };
    if let Some(c) = &f.category
        && Category::parse(c).is_none()
    {
        return Err(ApiError::invalid_field("category", "unknown approval category"));
    }
    let client_source = match &f.client_source {
        Some(c) => Some(
            ClientSource::parse(c)
                .ok_or_else(|| ApiError::invalid_field("client_source", "client_source must be api, cli or mcp"))?,
        ),
        None => None,
    };
    let limit = q.limit()?;
    let filter = ApprovalFilter { status, category: f.category, client_source };
    let mut items = state.store.approvals(&ws.workspace_id, &filter, q.after()?.as_deref(), limit + 1).await?;
    gate::redact_for(&state, &ws, &mut items).await?;
    Ok(ok(q.page(items, limit, |a| &a.approval_id)))
}

/// Approve a proposal: executes its operation exactly once and answers
/// with its result or its error. Deciding twice, or an expired proposal,
/// is 409 and executes nothing.
#[utoipa::path(post, path = "/approvals/{approval_id}/approve", tag = "approvals", params(("approval_id" = String, Path)),
    responses((status = 200, body = Envelope<gate::Approved>), (status = 409, body = crate::error::ErrorBody)))]
async fn approve(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(approval_id): Path<String>,
) -> ApiResult<Executed> {
    gate::approve(&state, &ws, &note, &approval_id).await
}

/// Reject a proposal; nothing is executed.
#[utoipa::path(post, path = "/approvals/{approval_id}/reject", tag = "approvals", params(("approval_id" = String, Path)),
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 409, body = crate::error::ErrorBody)))]
async fn reject(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(approval_id): Path<String>,
) -> ApiResult<Executed> {
    gate::reject(&state, &ws, &note, &approval_id).await
}

/// Policies of every MCP approval category (administrators).
#[utoipa::path(get, path = "/approval-policies", tag = "approvals",
    responses((status = 200, body = Envelope<Page<Policy>>), (status = 403, body = crate::error::ErrorBody)))]
async fn list_policies(State(state): State<AppState>, ws: Workspace) -> ApiResult<Envelope<Page<Policy>>> {
    ws.require(Role::Administrator)?;
    Ok(ok(Page { items: policies::policies(&state, &ws.workspace_id).await?, next_cursor: None }))
}

/// Body of `PATCH /approval-policies/{category}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyUpdate {
    /// Whether writes of this category from MCP clients need approval.
    pub requires_approval: Option<bool>,
    /// The least role that may decide proposals: administrator or editor.
    #[schema(value_type = Option<ApproverRole>)]
    pub approver_role: Option<Role>,
}

/// The roles that may decide proposals (viewers never do).
#[derive(ToSchema)]
#[allow(dead_code)] // describes the field above; never built
enum ApproverRole {
    #[schema(rename = "administrator")]
    Administrator,
    #[schema(rename = "editor")]
    Editor,
}

/// Choose whether an MCP category requires approval, and who approves
/// (administrators; not through MCP). With the proposal header, a proposal.
#[utoipa::path(patch, path = "/approval-policies/{category}", tag = "approvals", params(("category" = crate::ops::Category, Path)),
    request_body = PolicyUpdate,
    responses((status = 200, body = Envelope<Policy>), (status = 202, body = Envelope<crate::ops::Proposed>), (status = 403, body = crate::error::ErrorBody)))]
async fn update_policy(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(category): Path<String>,
    ApiJson(body): ApiJson<PolicyUpdate>,
) -> ApiResult<Executed> {
    let category = Category::parse(&category).ok_or_else(|| ApiError::not_found("approval category"))?;
    let change = crate::ops::policies::PolicyChange {
        category,
        requires_approval: body.requires_approval,
        approver_role: body.approver_role,
    };
    crate::ops::submit(&state, &ws, &note, crate::ops::policies::PolicyOp::SetApprovalPolicy(change)).await
}
