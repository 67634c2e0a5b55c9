//! Plugin operations: switching a connector off and on for the whole
//! installation. They go through the same door as every other write, so a
//! proposal header or an MCP client gets a proposal that an operator
//! decides.

use super::Executed;
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::http::middleware::AuditNote;
use crate::server::AppState;

async fn known(state: &AppState, id: &str) -> ApiResult<()> {
    match state.plugins.summary(id).await {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found("plugin")),
    }
}

pub async fn unload(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, id: &str) -> ApiResult<Executed> {
    note.target("plugin", id);
    known(state, id).await?;
    let id = state.plugins.unload(id, Some(&access.principal.user_id)).await?;
    Executed::ok(crate::http::plugins::Plugin::from(&state.plugins.summary(&id).await.ok_or_else(|| ApiError::not_found("plugin"))?))
}

pub async fn load(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, id: &str) -> ApiResult<Executed> {
    note.target("plugin", id);
    known(state, id).await?;
    let id = state.plugins.load(id, Some(&access.principal.user_id)).await?;
    Executed::ok(crate::http::plugins::Plugin::from(&state.plugins.summary(&id).await.ok_or_else(|| ApiError::not_found("plugin"))?))
}
