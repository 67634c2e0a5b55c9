//! Provider-backed options for a connector's config fields
//! (`POST /v1/sources/entities`), for any connector that offers the
//! `entity-options` operation.
//!
//! The plugin is called with what the user chose so far, the credential
//! handle, and `credential_account`: what the provider said about the
//! account when the credential was authorised (for OAuth, ids such as
//! `hub_id` and `user_id` from the token response). That field is the
//! host's alone; a client cannot set it.

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::plugin::types::Operation;
use crate::state::AppState;
use crate::store::credentials::CredentialHandle;

pub(crate) use crate::plugin::types::CREDENTIAL_ACCOUNT;

/// One choice for a config field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct EntityOption {
    /// The value to put in the field.
    pub value: String,
    /// What to show a person.
    pub label: String,
    /// The value of the option this one belongs to (a channel's brand, a
    /// brand's portal), when the options form a hierarchy.
    pub parent: Option<String>,
}

/// Every option the provider offers for `field` of `connector_id`, given
/// `chosen` (the configuration so far) and the credential behind `handle`.
pub(crate) async fn options(
    state: &AppState,
    access: &WorkspaceAccess,
    connector_id: &str,
    handle: &CredentialHandle,
    chosen: &Map<String, Value>,
    field: &str,
) -> ApiResult<Vec<EntityOption>> {
    let plugin = state.plugins.available(connector_id).await?;
    if !plugin.info.operations.contains(&Operation::EntityOptions) {
        return Err(ApiError::bad_request(
            "CONNECTOR_OPERATION_UNSUPPORTED",
            format!("connector {connector_id} offers no entity options"),
        )
        .with_details(serde_json::json!({ "field": "connector_id" })));
    }
    let fields = plugin.info.config_schema["properties"].as_object();
    if !fields.is_some_and(|f| f.contains_key(field)) || field == "credential_handle" {
        return Err(ApiError::invalid_field(
            "field",
            format!("connector {connector_id} has no config field `{field}` with options"),
        ));
    }
    let credential =
        state.vault.require_handle(&access.workspace_id, handle, None).await.map_err(|e| e.at("credential_handle"))?;
    if credential.connector_id.as_deref().is_some_and(|c| c != connector_id) {
        return Err(ApiError::invalid_field("credential_handle", "the credential belongs to another connector"));
    }
    let mut config = chosen.clone();
    config.remove(CREDENTIAL_ACCOUNT);
    config.insert("credential_handle".into(), Value::String(handle.as_str().to_owned()));
    if let Some(account) = credential.metadata.get("account").filter(|a| a.is_object()) {
        config.insert(CREDENTIAL_ACCOUNT.into(), account.clone());
    }
    let config = Value::Object(config).to_string();
    let found =
        state.plugins.connector(connector_id, &access.workspace_id).await?.entity_options(&config, field).await?;
    Ok(found
        .into_iter()
        .map(|o| EntityOption {
            value: o.value.chars().take(200).collect(),
            label: o.label.chars().take(200).collect(),
            parent: o.parent.map(|p| p.chars().take(200).collect()),
        })
        .collect())
}
