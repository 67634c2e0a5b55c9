//! The one door every write goes through ([`submit`]), and the approval
//! gate behind it: the one place that decides whether a write runs now or
//! is stored as a proposal (spec section 4, "Safety model").
//!
//! - A request with `X-Service-Execution-Mode: proposal` always becomes a
//!   proposal.
//! - A write from an MCP client becomes a proposal when the workspace's
//!   policy for its category requires approval (the default for every
//!   category).
//! - A change a sync cannot undo (a deduplicated stream's primary key)
//!   always becomes a proposal, whoever asks.
//! - Anything else executes at once.
//!
//! Approving claims the proposal in one statement (`pending` → `executing`),
//! so it executes exactly once however many approvers click; the execution
//! runs as the proposer, with the proposer's current role, and its answer
//! (result or error) is stored on the proposal, without the values shown
//! only once (links, OAuth states), and returned to the approver.
//!
//! Who decides: a member with the category's approver role (and operator
//! standing, for plugins), never through an MCP session or header, and
//! never from the session that made the proposal. Revoking that session
//! voids its pending proposals. Policy changes are refused to MCP clients:
//! an assistant must not switch its own guard off.

use axum::http::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::act::{Category, Ctx, Executed, Via};
use super::execute::{authorise, execute_as_proposer};
use super::operation::Operation;
use super::policies::{Policy, policies, policy};
use crate::access::{ClientSource, Principal, Role, WorkspaceAccess};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::approvals::{Approval, DecideError, NewApproval};
use crate::store::kinds::ApprovalStatus;

/// How long a proposal can be approved.
pub(crate) const PROPOSAL_TTL_MS: i64 = 24 * 60 * 60 * 1000;

/// Header that turns a write into a proposal.
pub(crate) const EXECUTION_MODE_HEADER: &str = "x-service-execution-mode";

/// The door every write goes through: checks that the caller may perform
/// it, notes the action for the audit record, and either executes it now
/// or stores it as a proposal.
pub(crate) async fn submit(
    state: &AppState,
    access: &WorkspaceAccess,
    note: &AuditNote,
    op: impl Into<Operation>,
) -> ApiResult<Executed> {
    let op = op.into();
    note.action(op.act().action());
    authorise(state, access, &op).await?;
    let principal = &access.principal;
    let destructive = op.destructive(state, access).await?;
    let propose = principal.proposal_requested
        || destructive.is_some()
        || (principal.client == ClientSource::Mcp
            && policy(state, &access.workspace_id, op.act().category()).await?.requires_approval);
    if !propose {
        return op.run(&Ctx { state, access, note, via: Via::Request }).await;
    }
    let operation = serde_json::to_value(&op).map_err(ApiError::internal)?;
    let summary = match &destructive {
        Some(why) => format!("{} (an approval is needed: {why})", op.act().summary()),
        None => op.act().summary(),
    };
    let approval = state
        .store
        .create_approval(NewApproval {
            workspace_id: &access.workspace_id,
            category: op.act().category().as_str(),
            action: op.act().action(),
            summary: &summary,
            operation: &operation,
            proposed_by: &principal.user_id,
            proposed_session: &principal.session_id,
            client_source: principal.client,
            request_id: &crate::telemetry::request_id::current(),
            expires_at: crate::store::now_ms() + PROPOSAL_TTL_MS,
        })
        .await?;
    note.outcome(crate::store::kinds::AuditOutcome::Proposed);
    note.target("approval", &approval.approval_id);
    note.approval(&approval.approval_id);
    Executed::with_status(
        StatusCode::ACCEPTED,
        serde_json::to_value(Proposed { approval }).map_err(ApiError::internal)?,
    )
}

/// The answer (202) to a write that became a proposal instead: the
/// approval to decide. Every route that may propose answers this.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Proposed {
    /// The stored proposal, pending.
    pub approval: Approval,
}

/// Answers 400 when a request asks for a proposal of something that cannot
/// be one (deciding a proposal, accepting an invitation, minting a token):
/// the header's promise is that nothing changes, so nothing does.
pub(crate) fn refuse_proposal_mode(access: &Principal, what: &str) -> ApiResult<()> {
    if access.proposal_requested {
        return Err(ApiError::bad_request(
            "PROPOSAL_NOT_APPLICABLE",
            format!("{what} cannot be proposed; send the request without X-Service-Execution-Mode: proposal"),
        )
        .with_details(json!({ "header": "X-Service-Execution-Mode" })));
    }
    Ok(())
}

/// Who may decide a proposal: a person, through a session other than the
/// one that proposed it. An assistant must not approve its own proposals,
/// and neither may the session that asked for the proposal.
fn refuse_undecidable(approver: &WorkspaceAccess, pending: &Approval) -> ApiResult<()> {
    if approver.principal.client == ClientSource::Mcp {
        return Err(ApiError::permission_denied(
            "permission denied: approval decisions are made by a person through the API or CLI, not by an MCP client",
        ));
    }
    if pending.proposed_session.as_deref() == Some(approver.principal.session_id.as_str()) {
        return Err(ApiError::permission_denied(
            "permission denied: a proposal is decided from another session than the one that proposed it",
        ));
    }
    Ok(())
}

fn decide_error(e: DecideError, id: &str) -> ApiError {
    match e {
        DecideError::NotFound => ApiError::not_found("approval"),
        DecideError::Expired => {
            ApiError::conflict("APPROVAL_EXPIRED", "the proposal expired; propose the operation again")
                .with_details(json!({ "approval_id": id, "status": "expired" }))
        }
        DecideError::NotPending(status) => ApiError::conflict(
            "APPROVAL_NOT_PENDING",
            format!("the proposal is already {status}; nothing was executed"),
        )
        .with_details(json!({ "approval_id": id, "status": status })),
    }
}

/// Whether `member` may decide proposals of `category`: the category's
/// approver role, and operator standing for plugin proposals.
async fn can_decide(
    state: &AppState,
    member: &WorkspaceAccess,
    category: Category,
    policies: &[Policy],
) -> ApiResult<bool> {
    let role = policies.iter().find(|p| p.category == category).map(|p| p.approver_role).unwrap_or(Role::Administrator);
    if member.role < role {
        return Ok(false);
    }
    if category == Category::Plugins {
        return Ok(state.store.is_operator(&member.principal.user_id).await?);
    }
    Ok(true)
}

/// Loads a proposal and checks that `approver` may decide it.
async fn may_decide(state: &AppState, approver: &WorkspaceAccess, approval_id: &str) -> ApiResult<Approval> {
    let pending = state
        .store
        .approval(&approver.workspace_id, approval_id)
        .await?
        .ok_or_else(|| ApiError::not_found("approval"))?;
    let category =
        Category::parse(&pending.category).ok_or_else(|| ApiError::internal(anyhow::anyhow!("unknown category")))?;
    let policies = policies(state, &approver.workspace_id).await?;
    if !can_decide(state, approver, category, &policies).await? {
        let role =
            policies.iter().find(|p| p.category == category).map(|p| p.approver_role).unwrap_or(Role::Administrator);
        return Err(ApiError::permission_denied(format!(
            "permission denied: deciding {} proposals needs the {} role{}",
            category.as_str(),
            role.as_str(),
            if category == Category::Plugins { " and installation operator standing" } else { "" }
        )));
    }
    refuse_undecidable(approver, &pending)?;
    Ok(pending)
}

/// Withholds the operation and result of proposals `viewer` neither made
/// nor may decide: stored operations can name people and resources the
/// rest of the workspace has no business reading.
pub(crate) async fn redact_for(
    state: &AppState,
    viewer: &WorkspaceAccess,
    approvals: &mut [Approval],
) -> ApiResult<()> {
    let policies = policies(state, &viewer.workspace_id).await?;
    let mut decides: Vec<(Category, bool)> = Vec::new();
    for a in approvals.iter_mut() {
        let Some(category) = Category::parse(&a.category) else { continue };
        // A proposer sees their own proposal, unless its category holds
        // what their role no longer may (a receiver URL, once demoted).
        let still_entitled = !category.answers_secrets() || viewer.role >= category.required_role();
        if a.proposed_by == viewer.principal.user_id && still_entitled {
            continue;
        }
        let allowed = match decides.iter().find(|(c, _)| *c == category) {
            Some((_, d)) => *d,
            None => {
                let d = can_decide(state, viewer, category, &policies).await?;
                decides.push((category, d));
                d
            }
        };
        if !allowed {
            a.operation = Value::Null;
            a.result = None;
            a.details_hidden = true;
        }
    }
    Ok(())
}

/// What an approval answered: the proposal and what its execution returned.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Approved {
    pub approval: Approval,
    /// The executed operation's `data`.
    pub result: Value,
}

/// Approves and executes a proposal exactly once.
pub(crate) async fn approve(
    state: &AppState,
    approver: &WorkspaceAccess,
    note: &AuditNote,
    approval_id: &str,
) -> ApiResult<Executed> {
    note.action("approvals.approve");
    note.target("approval", approval_id);
    note.approval(approval_id);
    refuse_proposal_mode(&approver.principal, "approving a proposal")?;
    let pending = may_decide(state, approver, approval_id).await?;
    let op: Operation = serde_json::from_value(pending.operation.clone()).map_err(ApiError::internal)?;

    let claimed = state
        .store
        .decide_approval(&approver.workspace_id, approval_id, &approver.principal.user_id, ApprovalStatus::Executing)
        .await?
        .map_err(|e| decide_error(e, approval_id))?;

    let outcome = execute_as_proposer(state, &approver.workspace_id, &claimed, op).await;
    match outcome {
        Ok(executed) => {
            // Kept without its one-time values; the approver sees them once.
            state.store.finish_approval(approval_id, true, executed.status.as_u16(), &executed.storable()).await?;
            let approval = state
                .store
                .approval(&approver.workspace_id, approval_id)
                .await?
                .ok_or_else(|| ApiError::not_found("approval"))?;
            let one_time: Vec<String> = executed.one_time.iter().map(|p| format!("/result{p}")).collect();
            let mut answer = Executed::with_status(executed.status, Approved { approval, result: executed.data })?;
            answer.one_time = one_time;
            Ok(answer)
        }
        Err(e) => {
            let body = serde_json::to_value(e.body()).map_err(ApiError::internal)?;
            state.store.finish_approval(approval_id, false, e.status.as_u16(), &body).await?;
            let mut details = e.details.clone();
            if let Value::Object(map) = &mut details {
                map.insert("approval_id".into(), json!(approval_id));
            }
            Err(e.with_details(details))
        }
    }
}

/// Rejects a proposal; nothing is executed.
pub(crate) async fn reject(
    state: &AppState,
    approver: &WorkspaceAccess,
    note: &AuditNote,
    approval_id: &str,
) -> ApiResult<Executed> {
    note.action("approvals.reject");
    note.target("approval", approval_id);
    note.approval(approval_id);
    refuse_proposal_mode(&approver.principal, "rejecting a proposal")?;
    may_decide(state, approver, approval_id).await?;
    let approval = state
        .store
        .decide_approval(&approver.workspace_id, approval_id, &approver.principal.user_id, ApprovalStatus::Rejected)
        .await?
        .map_err(|e| decide_error(e, approval_id))?;
    Executed::ok(json!({ "approval": approval }))
}
