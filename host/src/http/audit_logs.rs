//! `GET /v1/audit-logs` (spec section 4, "Audit and sessions").

use axum::extract::State;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiQuery, PageQuery, Workspace, parse_time};
use super::{Envelope, Page, ok};
use crate::access::{ClientSource, Role};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::audit::{AuditFilter, AuditRecord};
use crate::store::kinds::AuditOutcome;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_audit_logs))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// Records at or after this time (RFC 3339).
    #[param(format = DateTime)]
    since: Option<String>,
    /// Records before this time (RFC 3339).
    #[param(format = DateTime)]
    until: Option<String>,
    /// Only records of this user.
    actor: Option<String>,
    /// Only this action, e.g. `members.invite`.
    action: Option<String>,
    /// Only this client kind: api, cli or mcp.
    #[param(value_type = Option<crate::store::sessions::ClientSource>)]
    client_source: Option<String>,
    /// Only this outcome: succeeded, failed, denied or proposed.
    #[param(value_type = Option<crate::store::kinds::AuditOutcome>)]
    outcome: Option<String>,
}

/// Audit records of the workspace, newest first. Administrators see every
/// record; other members see their own.
#[utoipa::path(get, path = "/audit-logs", tag = "audit", params(PageQuery, AuditQuery),
    responses((status = 200, body = Envelope<Page<AuditRecord>>), (status = 400, body = crate::error::ErrorBody)))]
async fn list_audit_logs(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
    ApiQuery(f): ApiQuery<AuditQuery>,
) -> ApiResult<Envelope<Page<AuditRecord>>> {
    let client_source = f
        .client_source
        .as_deref()
        .map(|c| {
            ClientSource::parse(c)
                .ok_or_else(|| ApiError::invalid_field("client_source", "client_source must be api, cli or mcp"))
        })
        .transpose()?;
    let outcome = f
        .outcome
        .as_deref()
        .map(|o| {
            AuditOutcome::parse(o).ok_or_else(|| {
                ApiError::invalid_field("outcome", format!("outcome must be {}", AuditOutcome::choices()))
            })
        })
        .transpose()?;
    let actor = if ws.role == Role::Administrator {
        f.actor
    } else {
        match f.actor {
            Some(a) if a != ws.principal.user_id => {
                return Err(ApiError::permission_denied(
                    "permission denied: only administrators see other members' records",
                ));
            }
            _ => Some(ws.principal.user_id.clone()),
        }
    };
    let filter = AuditFilter {
        workspace_id: ws.workspace_id.clone(),
        since: parse_time("since", f.since.as_deref())?,
        until: parse_time("until", f.until.as_deref())?,
        actor_user_id: actor,
        action: f.action,
        client_source,
        outcome,
    };
    let limit = q.limit()?;
    let items = state.store.audit_records(&filter, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |r| &r.audit_id)))
}
