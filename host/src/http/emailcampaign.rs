//! The email-campaign connector's operations (spec section 4,
//! "Email-campaign connector"): store the API token, check access, preview
//! campaign data. Check and preview create, change and delete nothing.
//!
//! Responses are built field by field from an allowlist: connector id,
//! credential handle, data-source status, field coverage and sanitised
//! metrics. Provider tokens, raw payloads, runtime ids and internals have
//! no field to travel in.

use axum::Extension;
use axum::extract::State;
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiJson, SecretJson, Workspace};
use super::{Envelope, ok};
use crate::access::Role;
use crate::audit::AuditNote;
use crate::connectors::emailcampaign::{self as ec, ConnectionMethod, base_url_error};
use crate::credentials::{BoundHosts, NewSecret, SecretMaterial};
use crate::error::{ApiError, ApiResult};
use crate::ops::Executed;
use crate::ops::credentials::store_secret;
use crate::plugin::InvocationError;
use crate::plugin::types::ConnectorError;
use crate::state::AppState;
use crate::store::credentials::CredentialHandle;
use crate::store::kinds::{CredentialKind, CredentialStatus};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(store_api_token)).routes(routes!(check)).routes(routes!(preview))
}

fn method(raw: Option<&str>) -> ApiResult<ConnectionMethod> {
    ConnectionMethod::parse(raw).map_err(|m| ApiError::invalid_field("connection_method", m))
}

/// Body of `POST /credentials/emailcampaign/api-token`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApiTokenBody {
    /// The provider's API URL (`https://<instance>/api` or
    /// `https://<team>.mailcoach.app/api`).
    pub base_url: String,
    /// The provider's bearer token. Stored sealed; never returned.
    #[schema(value_type = String, format = Password)]
    pub api_token: SecretString,
    /// `self_hosted` (default) or `cloud`.
    pub connection_method: Option<String>,
    pub label: Option<String>,
}

/// Store the provider's API token, bound to the base_url's host; answers a
/// `credential_handle`. The only operation that accepts the raw token.
#[utoipa::path(post, path = "/credentials/emailcampaign/api-token", tag = "email-campaign connector", request_body = ApiTokenBody,
    responses((status = 201, body = Envelope<crate::store::credentials::CredentialRecord>), (status = 400, body = crate::error::ErrorBody)))]
async fn store_api_token(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    SecretJson(body): SecretJson<ApiTokenBody>,
) -> ApiResult<Executed> {
    note.action("credentials.create");
    ws.require(Role::Editor)?;
    crate::ops::text::check_opt("label", body.label.as_deref(), crate::ops::text::LABEL_MAX)?;
    let method = method(body.connection_method.as_deref())?;
    let url =
        ec::validate_base_url(&body.base_url, method, &state.egress.policy().allowed_hosts).map_err(base_url_error)?;
    let host = url.host_str().unwrap_or_default().to_owned();
    store_secret(
        &crate::ops::Ctx::request(&state, &ws, &note),
        NewSecret {
            workspace_id: &ws.workspace_id,
            created_by: &ws.principal.user_id,
            kind: CredentialKind::ApiToken,
            connector_id: Some(ec::CONNECTOR_ID),
            label: body.label.as_deref(),
            hosts: vec![host],
            metadata: json!({ "base_url": body.base_url, "connection_method": method.as_str() }),
            material: SecretMaterial::new(body.api_token),
            status: CredentialStatus::PendingApproval,
            access_expires_at: None,
        },
    )
    .await
}

/// Body of check and preview.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AccessBody {
    /// Handle of the stored API token.
    pub credential_handle: CredentialHandle,
    /// Defaults to the base_url stored with the credential.
    pub base_url: Option<String>,
    /// `self_hosted` or `cloud`; defaults to the credential's, else
    /// `self_hosted`.
    pub connection_method: Option<String>,
}

/// The data source as a response describes it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DataSource {
    /// `connected`, `invalid_credentials`, `permission_denied`,
    /// `rate_limited`, `unavailable` or `error`.
    pub status: &'static str,
    pub message: String,
    pub connection_method: ConnectionMethod,
    pub base_url: String,
    /// The token owner's e-mail address, when the provider says.
    pub account: Option<String>,
}

/// What check and preview answer (preview adds campaigns and attribution).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AccessReport {
    pub connector_id: &'static str,
    pub credential_handle: CredentialHandle,
    pub data_source: DataSource,
    /// Per metric: `provided`, `derived` or `not_provided`.
    pub field_coverage: Option<Value>,
    /// Totals over the most recent sent campaigns.
    pub metrics: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub campaigns: Option<Value>,
    /// Traffic and sales metrics, flagged as needing external attribution.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attribution: Option<Value>,
}

/// Resolves and checks everything a provider request needs, before any
/// request is made.
async fn prepare(state: &AppState, ws: &Workspace, body: &AccessBody) -> ApiResult<(String, ConnectionMethod, String)> {
    let cred = state
        .vault
        .require_handle(&ws.workspace_id, &body.credential_handle, None)
        .await
        .map_err(|e| e.at("credential_handle"))?;
    let base_url = body
        .base_url
        .clone()
        .or_else(|| cred.metadata["base_url"].as_str().map(str::to_owned))
        .ok_or_else(|| ApiError::invalid_field("base_url", "base_url is required"))?;
    let method = method(body.connection_method.as_deref().or(cred.metadata["connection_method"].as_str()))?;
    let url = ec::validate_base_url(&base_url, method, &state.egress.policy().allowed_hosts).map_err(base_url_error)?;
    cred.require_host(url.host_str().unwrap_or_default()).map_err(|e| e.at("credential_handle"))?;
    let config = json!({ "base_url": base_url, "credential_handle": body.credential_handle, "connection_method": method.as_str() });
    Ok((config.to_string(), method, base_url))
}

/// How a failed provider call shows in `data_source.status`.
fn status_of(e: &InvocationError) -> Option<&'static str> {
    match e {
        InvocationError::Connector(ConnectorError::InvalidCredentials(_)) => Some("invalid_credentials"),
        InvocationError::Connector(ConnectorError::PermissionDenied(_)) => Some("permission_denied"),
        InvocationError::Connector(ConnectorError::RateLimited(_)) => Some("rate_limited"),
        InvocationError::Connector(ConnectorError::ProviderUnavailable(_)) => Some("unavailable"),
        _ => None,
    }
}

/// Check access with a credential_handle: answers the data-source status
/// and, when connected, current metrics.
#[utoipa::path(post, path = "/connectors/emailcampaign/check", tag = "email-campaign connector", request_body = AccessBody,
    responses((status = 200, body = Envelope<AccessReport>), (status = 400, body = crate::error::ErrorBody)))]
async fn check(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<AccessBody>,
) -> ApiResult<Envelope<AccessReport>> {
    note.action("emailcampaign.check");
    ws.require(Role::Editor)?;
    let (config, method, base_url) = prepare(&state, &ws, &body).await?;
    let connector = state.plugins.connector(ec::CONNECTOR_ID, &ws.workspace_id).await?;
    let mut report = AccessReport {
        connector_id: ec::CONNECTOR_ID,
        credential_handle: body.credential_handle.clone(),
        data_source: DataSource {
            status: "connected",
            message: String::new(),
            connection_method: method,
            base_url,
            account: None,
        },
        field_coverage: None,
        metrics: None,
        campaigns: None,
        attribution: None,
    };
    match connector.check(&config).await {
        Ok(c) if c.ok => {
            report.data_source.message = c.message.chars().take(300).collect();
            report.data_source.account = c.account.map(|a| a.chars().take(200).collect());
        }
        Ok(c) => {
            report.data_source.status = "error";
            report.data_source.message = c.message.chars().take(300).collect();
            return Ok(ok(report));
        }
        Err(e) => match status_of(&e) {
            Some(status) => {
                report.data_source.status = status;
                report.data_source.message = e.to_string().chars().take(300).collect();
                return Ok(ok(report));
            }
            None => return Err(e.into()),
        },
    }
    if let Ok(p) = connector.preview(&config).await {
        report.field_coverage = Some(ec::sanitise_coverage(&p["field_coverage"]));
        report.metrics = Some(ec::sanitise_metrics(&p["totals"]));
    }
    Ok(ok(report))
}

/// Preview campaign data with a credential_handle: recent campaigns with
/// sanitised metrics; traffic and sales flagged as needing attribution.
#[utoipa::path(post, path = "/connectors/emailcampaign/edm/preview", tag = "email-campaign connector", request_body = AccessBody,
    responses((status = 200, body = Envelope<AccessReport>), (status = 400, body = crate::error::ErrorBody)))]
async fn preview(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<AccessBody>,
) -> ApiResult<Envelope<AccessReport>> {
    note.action("emailcampaign.preview");
    ws.require(Role::Editor)?;
    let (config, method, base_url) = prepare(&state, &ws, &body).await?;
    let p = state.plugins.connector(ec::CONNECTOR_ID, &ws.workspace_id).await?.preview(&config).await?;
    Ok(ok(AccessReport {
        connector_id: ec::CONNECTOR_ID,
        credential_handle: body.credential_handle.clone(),
        data_source: DataSource {
            status: "connected",
            message: "campaign data read".into(),
            connection_method: method,
            base_url,
            account: None,
        },
        field_coverage: Some(ec::sanitise_coverage(&p["field_coverage"])),
        metrics: Some(ec::sanitise_metrics(&p["totals"])),
        campaigns: Some(ec::sanitise_campaigns(&p["campaigns"])),
        attribution: Some(ec::attribution()),
    }))
}
