//! Approval-policy operations: which MCP categories need approval, and who
//! decides. Through the gate like every write; never for an MCP client.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed};
use crate::access::Role;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The effective policy of one category in a workspace.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Policy {
    pub category: Category,
    /// What the category covers.
    pub description: &'static str,
    /// Whether writes of this category from MCP clients need approval.
    pub requires_approval: bool,
    /// The least role that may approve or reject its proposals.
    pub approver_role: Role,
    /// False while the category has its default policy.
    pub customised: bool,
}

/// The effective policies of every category (defaults filled in: approval
/// required, approved by administrators). Whatever is stored, a category
/// whose answers hold secrets always needs approval and is never decided
/// by a role below the one that may perform its operations.
pub(crate) async fn policies(state: &AppState, workspace_id: &str) -> ApiResult<Vec<Policy>> {
    let stored = state.store.approval_policies(workspace_id).await?;
    Ok(Category::ALL
        .iter()
        .map(|&category| {
            let s = stored.iter().find(|p| p.category == category.as_str());
            Policy {
                category,
                description: category.description(),
                requires_approval: category.answers_secrets()
                    || s.map(|p| p.requires_approval).unwrap_or(category.default_requires_approval()),
                approver_role: match s.map(|p| p.approver_role).unwrap_or(Role::Administrator) {
                    role if category.answers_secrets() => role.max(category.required_role()),
                    role => role,
                },
                customised: s.is_some(),
            }
        })
        .collect())
}

/// The effective policy of one category.
pub(super) async fn policy(state: &AppState, workspace_id: &str, category: Category) -> ApiResult<Policy> {
    let all = policies(state, workspace_id).await?;
    all.into_iter()
        .find(|p| p.category == category)
        .ok_or_else(|| ApiError::internal(anyhow::anyhow!("category without policy")))
}

/// A change of one category's approval policy.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyChange {
    pub category: Category,
    /// Whether writes of this category from MCP clients need approval.
    pub requires_approval: Option<bool>,
    /// The least role that may approve or reject its proposals.
    pub approver_role: Option<Role>,
}

/// Policy operations.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub(crate) enum PolicyOp {
    /// Change a category's approval policy.
    SetApprovalPolicy(PolicyChange),
}

impl Act for PolicyOp {
    fn action(&self) -> &'static str {
        "approval_policies.update"
    }

    fn category(&self) -> Category {
        Category::WorkspaceAdmin
    }

    fn summary(&self) -> String {
        let PolicyOp::SetApprovalPolicy(c) = self;
        format!(
            "Set the approval policy of {}:{}{}",
            c.category.as_str(),
            c.requires_approval.map(|r| format!(" requires_approval={r}")).unwrap_or_default(),
            c.approver_role.map(|r| format!(" approver_role={}", r.as_str())).unwrap_or_default()
        )
    }

    fn refused_to_mcp(&self) -> bool {
        true
    }
}

impl PolicyOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        let PolicyOp::SetApprovalPolicy(change) = self;
        Executed::ok(set_policy(ctx, change).await?)
    }
}

async fn set_policy(ctx: &Ctx<'_>, change: PolicyChange) -> ApiResult<Policy> {
    let (state, admin) = (ctx.state, ctx.access);
    ctx.note.target("approval_policy", change.category.as_str());
    if change.approver_role == Some(Role::Viewer) {
        return Err(ApiError::invalid_field("approver_role", "approver_role must be administrator or editor"));
    }
    if change.category.answers_secrets() {
        let least = change.category.required_role();
        if change.approver_role.is_some_and(|r| r < least) {
            return Err(ApiError::invalid_field(
                "approver_role",
                format!(
                    "proposals of {} answer a secret to whoever approves them: approver_role must be {}",
                    change.category.as_str(),
                    least.as_str()
                ),
            ));
        }
        if change.requires_approval == Some(false) {
            return Err(ApiError::invalid_field(
                "requires_approval",
                format!(
                    "MCP writes of {} always need approval: their answers hold a secret shown once, which goes to a person",
                    change.category.as_str()
                ),
            ));
        }
    }
    let current = policy(state, &admin.workspace_id, change.category).await?;
    state
        .store
        .set_approval_policy(
            &admin.workspace_id,
            change.category.as_str(),
            change.requires_approval.unwrap_or(current.requires_approval),
            change.approver_role.unwrap_or(current.approver_role),
            &admin.principal.user_id,
        )
        .await?;
    policy(state, &admin.workspace_id, change.category).await
}
