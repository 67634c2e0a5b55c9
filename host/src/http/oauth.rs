//! OAuth flows over the API (spec section 4, "Credentials"): start returns
//! the provider's authorization URL; callback exchanges the code (done by
//! the host) and answers a `credential_handle`, never provider tokens.
//! Browsers land on `/oauth/callback` (see [`crate::web`]) instead.

use axum::Extension;
use axum::extract::State;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Envelope;
use super::extract::{ApiJson, Workspace};
use crate::audit::AuditNote;
use crate::credentials::oauth::{self, Callback};
use crate::error::{ApiError, ApiResult};
use crate::ops::credentials::store_secret;
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::kinds::CredentialStatus;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(start_source_oauth))
        .routes(routes!(complete_source_oauth))
        .routes(routes!(start_taskapp_oauth))
        .routes(routes!(complete_taskapp_oauth))
}

/// Body of the source OAuth start.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SourceOAuthStart {
    /// The connector whose provider to authorise (legacy aliases accepted).
    pub connector_id: String,
}

/// Body of the task-app OAuth start (nothing to choose).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskAppOAuthStart {}

/// Return the provider's authorization URL for a source connector (PKCE,
/// single-use state bound to you, the workspace and the connector).
#[utoipa::path(post, path = "/credentials/source/oauth/start", tag = "credentials", request_body = SourceOAuthStart,
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 400, body = crate::error::ErrorBody)))]
async fn start_source_oauth(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<SourceOAuthStart>,
) -> ApiResult<Executed> {
    let target = state
        .plugins
        .canonical_id(&body.connector_id)
        .ok_or_else(|| ApiError::invalid_field("connector_id", "unknown connector"))?;
    ops::submit(&state, &ws, &note, crate::ops::credentials::CredentialOp::StartOAuth { target }).await
}

async fn complete(
    state: &AppState,
    ws: &Workspace,
    note: &AuditNote,
    cb: Callback,
    taskapp: bool,
) -> ApiResult<Executed> {
    note.action("credentials.oauth_complete");
    ws.require(crate::access::Role::Editor)?;
    let mut done = state.oauth.complete(&cb, Some((&ws.workspace_id, &ws.principal.user_id))).await?;
    if (done.connector_id == oauth::TASKAPP) != taskapp {
        return Err(ApiError::bad_request("OAUTH_STATE_UNKNOWN", "unknown OAuth state; start the flow again"));
    }
    store_secret(&crate::ops::Ctx::request(state, ws, note), done.new_secret(CredentialStatus::PendingApproval)).await
}

/// Complete a source OAuth flow: the host exchanges the code and answers a
/// `credential_handle` (never provider tokens).
#[utoipa::path(post, path = "/credentials/source/oauth/callback", tag = "credentials", request_body = Callback,
    responses((status = 201, body = Envelope<crate::store::credentials::CredentialRecord>), (status = 400, body = crate::error::ErrorBody)))]
async fn complete_source_oauth(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(cb): ApiJson<Callback>,
) -> ApiResult<Executed> {
    complete(&state, &ws, &note, cb, false).await
}

/// Start the task app's OAuth flow (provider and client from operator
/// configuration).
#[utoipa::path(post, path = "/credentials/taskapp/oauth/start", tag = "credentials", request_body = TaskAppOAuthStart,
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 503, body = crate::error::ErrorBody)))]
async fn start_taskapp_oauth(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
) -> ApiResult<Executed> {
    ops::submit(
        &state,
        &ws,
        &note,
        crate::ops::credentials::CredentialOp::StartOAuth { target: oauth::TASKAPP.to_owned() },
    )
    .await
}

/// Complete the task app's OAuth flow; answers a workspace credential's
/// handle.
#[utoipa::path(post, path = "/credentials/taskapp/oauth/callback", tag = "credentials", request_body = Callback,
    responses((status = 201, body = Envelope<crate::store::credentials::CredentialRecord>), (status = 400, body = crate::error::ErrorBody)))]
async fn complete_taskapp_oauth(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(cb): ApiJson<Callback>,
) -> ApiResult<Executed> {
    complete(&state, &ws, &note, cb, true).await
}
