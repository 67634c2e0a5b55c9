//! Running an allowed operation: who may perform it ([`authorise`]), and
//! running an approved proposal as its proposer, with the role they hold
//! now, under an audit record of its own ([`execute_as_proposer`]).

use super::act::{Ctx, Executed, Via};
use super::operation::Operation;
use crate::access::{ClientSource, Principal, WorkspaceAccess};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::approvals::Approval;

/// Checks that a caller may perform `op`: the role it needs in the
/// workspace, operator standing where it needs that, and a client kind it
/// accepts.
pub(crate) async fn authorise(state: &AppState, access: &WorkspaceAccess, op: &Operation) -> ApiResult<()> {
    let act = op.act();
    access.require(act.required_role())?;
    if act.needs_operator() && !state.store.is_operator(&access.principal.user_id).await? {
        return Err(ApiError::permission_denied("permission denied: only installation operators manage plugins"));
    }
    if act.refused_to_mcp() && access.principal.client == ClientSource::Mcp {
        return Err(ApiError::permission_denied(
            "permission denied: approval policies are changed by a person through the API or CLI, not by an MCP client",
        ));
    }
    Ok(())
}

/// Runs the operation of a claimed proposal as its proposer, with the role
/// they hold in the workspace now (refused if they left it or lost the
/// standing it needs), and writes the execution's own audit record: the
/// operation, by its proposer through their client, linked to the
/// approval.
pub(super) async fn execute_as_proposer(
    state: &AppState,
    workspace_id: &str,
    claimed: &Approval,
    op: Operation,
) -> ApiResult<Executed> {
    let proposer_role = state.store.role_in(&claimed.proposed_by, workspace_id).await?;
    let proposer = proposer_role.map(|role| WorkspaceAccess {
        principal: Principal {
            user_id: claimed.proposed_by.clone(),
            session_id: String::new(),
            client: claimed.client_source,
            proposal_requested: false,
        },
        workspace_id: workspace_id.to_owned(),
        role,
    });
    let note = AuditNote::default();
    note.workspace(workspace_id);
    note.approval(&claimed.approval_id);
    note.action(op.act().action());
    let outcome = match &proposer {
        None => {
            Err(ApiError::permission_denied("permission denied: the proposer is no longer a member of the workspace"))
        }
        Some(proposer) => match authorise(state, proposer, &op).await {
            Err(e) => Err(e),
            Ok(()) => op.run(&Ctx { state, access: proposer, note: &note, via: Via::Approval }).await,
        },
    };
    let status = outcome.as_ref().map(|e| e.status).unwrap_or_else(|e| e.status);
    let record = note.record(proposer.as_ref().map(|p| &p.principal), "", status);
    if let Err(e) = state.store.append_audit(&record).await {
        tracing::error!(error = %e, "could not write audit record of an approved execution");
    }
    outcome
}
