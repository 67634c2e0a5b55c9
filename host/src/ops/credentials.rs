//! Credential operations. The secret is sealed before the gate is asked,
//! so a proposal never holds one: the stored operation only activates a
//! sealed credential, or creates an entry link.

use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;
use secrecy::ExposeSecret;

use super::Executed;
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::http::middleware::AuditNote;
use crate::server::AppState;
use crate::tokens;

/// How long a credential-entry link stays usable.
pub const ENTRY_LINK_TTL_MS: i64 = 15 * 60 * 1000;

/// What a credential-entry link will create (no secret).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EntryLinkRequest {
    /// `api_token` (sent as a bearer token), `basic` (password with the
    /// given username) or `secret` (placed as the connector asks).
    #[serde(default = "default_kind")]
    pub kind: String,
    /// Connector the credential is for.
    pub connector_id: Option<String>,
    /// Exact host names the secret may be sent to.
    pub hosts: Vec<String>,
    /// Free text shown on the entry page and the credential.
    pub label: Option<String>,
    /// Username for `basic` credentials (not a secret).
    pub username: Option<String>,
}

fn default_kind() -> String {
    "api_token".into()
}

/// Checks a credential kind.
pub fn check_kind(kind: &str) -> ApiResult<()> {
    if ["api_token", "basic", "secret"].contains(&kind) {
        Ok(())
    } else {
        Err(ApiError::invalid_field("kind", "kind must be api_token, basic or secret"))
    }
}

pub async fn activate(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, credential_id: &str) -> ApiResult<Executed> {
    note.target("credential", credential_id);
    if !state.store.set_credential_status(&access.workspace_id, credential_id, "pending_approval", "active").await? {
        return Err(ApiError::conflict("CREDENTIAL_NOT_PENDING", "the credential is not awaiting activation"));
    }
    let record = state.store.credential(&access.workspace_id, credential_id).await?.ok_or_else(|| ApiError::not_found("credential"))?.record;
    Executed::created(record)
}

pub async fn create_entry_link(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, req: EntryLinkRequest) -> ApiResult<Executed> {
    check_kind(&req.kind)?;
    let hosts = crate::credentials::bound_hosts(&req.hosts).map_err(|e| ApiError::invalid_field("hosts", e))?;
    let connector_id = match &req.connector_id {
        Some(c) => Some(state.plugins.canonical_id(c).ok_or_else(|| ApiError::invalid_field("connector_id", "unknown connector"))?),
        None => None,
    };
    let spec = json!({ "kind": req.kind, "connector_id": connector_id, "hosts": hosts, "label": req.label, "username": req.username });
    let token = tokens::generate(tokens::CODE_PREFIX);
    let link = state
        .store
        .create_entry_link(&access.workspace_id, &tokens::hash_secret(&token), &access.principal.user_id, &spec, crate::store::now_ms() + ENTRY_LINK_TTL_MS)
        .await?;
    note.target("credential_entry_link", &link.entry_id);
    let url = state.config.public_url.join(&format!("credential-entry/{}", token.expose_secret())).map_err(ApiError::internal)?;
    Executed::created(json!({
        "entry_id": link.entry_id,
        "url": url.to_string(),
        "expires_at": link.expires_at,
        "status": link.status,
        "poll": format!("/v1/credentials/entry-links/{}", link.entry_id),
    }))
}

/// Starts an OAuth flow for a source connector or the task app.
pub async fn start_oauth(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, target: &str) -> ApiResult<Executed> {
    note.target("oauth_flow", target);
    let started = crate::oauth::start(state, &access.workspace_id, &access.principal.user_id, target).await?;
    Executed::ok(started)
}
