//! Connectors (spec section 4, "Connectors"): what the loaded plugins
//! offer. Legacy aliases resolve to the canonical id, which is the only id
//! responses carry.

use axum::extract::{Path, State};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiQuery, Caller, PageQuery};
use super::{Envelope, Page, ok};
use crate::error::{ApiError, ApiResult};
use crate::plugin::registry::PluginSummary;
use crate::plugin::types::{ConnectorKind, Operation};
use crate::state::AppState;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_connectors)).routes(routes!(get_connector)).routes(routes!(get_spec))
}

/// A connector as users see it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Connector {
    /// The canonical connector id.
    pub connector_id: String,
    pub name: String,
    pub version: String,
    pub kind: ConnectorKind,
    /// `available`, or `unavailable` while its plugin is unloaded.
    pub status: &'static str,
    pub operations: Vec<Operation>,
    /// Whether credentials come from an OAuth flow.
    pub oauth: bool,
    /// WIT interface version the plugin implements.
    pub interface_version: &'static str,
}

impl From<&PluginSummary> for Connector {
    fn from(p: &PluginSummary) -> Self {
        Connector {
            connector_id: p.info.id.clone(),
            name: p.info.name.clone(),
            version: p.info.version.clone(),
            kind: p.info.kind,
            status: if p.available { "available" } else { "unavailable" },
            operations: p.info.operations.clone(),
            oauth: p.info.oauth.is_some(),
            interface_version: p.interface_version.as_str(),
        }
    }
}

/// A connector's configuration specification.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ConnectorSpec {
    pub connector_id: String,
    /// JSON Schema of the configuration. Secrets never appear in it: fields
    /// that need one take a `credential_handle`.
    pub config_schema: serde_json::Value,
    /// Present when credentials come from an OAuth flow: only that, and
    /// which scopes it asks for. The provider's endpoints stay with the
    /// host, which runs the flow.
    pub oauth: Option<OAuthSummary>,
}

/// What a client needs to know of a connector's OAuth.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OAuthSummary {
    /// The scopes the authorisation asks for.
    pub scopes: Vec<String>,
    /// Where to start the flow.
    pub start: &'static str,
}

/// Every connector, available or not.
#[utoipa::path(get, path = "/connectors", tag = "connectors", params(PageQuery),
    responses((status = 200, body = Envelope<Page<Connector>>)))]
async fn list_connectors(
    State(state): State<AppState>,
    _caller: Caller,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Envelope<Page<Connector>>> {
    let limit = q.limit()?;
    let after = q.after()?;
    let items: Vec<Connector> = state
        .plugins
        .list()
        .await?
        .iter()
        .filter(|p| after.as_deref().is_none_or(|a| p.info.id.as_str() > a))
        .take(limit as usize + 1)
        .map(Connector::from)
        .collect();
    Ok(ok(q.page(items, limit, |c| &c.connector_id)))
}

async fn summary(state: &AppState, id: &str) -> ApiResult<PluginSummary> {
    state.plugins.summary(id).await?.ok_or_else(|| ApiError::not_found("connector"))
}

/// One connector (a legacy alias answers with the canonical id).
#[utoipa::path(get, path = "/connectors/{connector_id}", tag = "connectors", params(("connector_id" = String, Path)),
    responses((status = 200, body = Envelope<Connector>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_connector(
    State(state): State<AppState>,
    _caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Envelope<Connector>> {
    Ok(ok(Connector::from(&summary(&state, &id).await?)))
}

/// A connector's configuration schema.
#[utoipa::path(get, path = "/connectors/{connector_id}/spec", tag = "connectors", params(("connector_id" = String, Path)),
    responses((status = 200, body = Envelope<ConnectorSpec>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_spec(
    State(state): State<AppState>,
    _caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Envelope<ConnectorSpec>> {
    let s = summary(&state, &id).await?;
    let oauth = s
        .info
        .oauth
        .as_ref()
        .map(|o| OAuthSummary { scopes: o.scopes.clone(), start: "POST /v1/credentials/source/oauth/start" });
    Ok(ok(ConnectorSpec { connector_id: s.info.id.clone(), config_schema: s.info.config_schema.clone(), oauth }))
}
