//! Host-side rules of particular connectors, found by connector id: what
//! the generic paths (sources, credentials, check and preview) cannot know
//! about one provider. A connector without rules needs none beyond its
//! plugin's configuration schema.
//!
//! Layout: one file per connector with rules, each offering a
//! [`ConnectorRules`]; [`rules`] finds them by connector id.
//! - [`emailcampaign`]: `conn_emailcampaign_edm` (the `base_url` rules,
//!   connection methods, and what check and preview may answer).
//! - [`socialmedia`]: `conn_socialmedia_hub` (the portal, brand and channel
//!   selection checked against the provider's options).
//! - [`restmanifest`]: `conn_rest_manifest` (the base URL's host, the
//!   credential's binding, and the manifest's names, parents and
//!   placeholders; its schema as OpenAPI components).
//! - [`airbyte`]: `conn_airbyte_manifest` (the manifest read by the
//!   runtime's own crate, refusals by JSON pointer; hosts allowed; each
//!   secret's credential bound to its host and stored for its place).
//! - [`entities`]: provider-backed options for any connector's config
//!   fields (`POST /v1/sources/entities`).

pub(crate) mod airbyte;
pub mod emailcampaign;
pub(crate) mod entities;
pub(crate) mod restmanifest;
pub(crate) mod socialmedia;

use std::pin::Pin;

use serde_json::Value;

use crate::access::WorkspaceAccess;
use crate::error::ApiResult;
use crate::state::AppState;

/// What the host checks for one connector beyond the plugin's schema.
pub(crate) trait ConnectorRules: Sync {
    /// The connector the rules are for.
    fn connector_id(&self) -> &'static str;

    /// The largest configuration a source of this connector may hold,
    /// serialised, and its longest string, where they differ from every
    /// other source's (a published manifest is larger than a connector's
    /// settings).
    fn config_limits(&self) -> Option<ConfigLimits> {
        None
    }

    /// Checks a source configuration (already valid against the plugin's
    /// schema) before it is saved. `saved` is the configuration the source
    /// holds now when it is being updated: what it already holds was
    /// accepted before and need not pass again.
    fn validate_source<'a>(
        &'a self,
        state: &'a AppState,
        access: &'a WorkspaceAccess,
        config: &'a Value,
        saved: Option<&'a Value>,
    ) -> Pin<Box<dyn Future<Output = ApiResult<()>> + Send + 'a>>;
}

/// The size limits of a source's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConfigLimits {
    pub bytes: usize,
    pub string_chars: usize,
}

/// Every connector's rules.
const ALL: &[&dyn ConnectorRules] =
    &[&emailcampaign::Rules, &socialmedia::Rules, &restmanifest::Rules, &airbyte::Rules];

/// A refusal at a JSON pointer of a source's configuration, shaped as the
/// configuration schema's own errors are.
pub(crate) fn invalid(pointer: &str, message: impl Into<String>) -> crate::error::ApiError {
    let message = message.into();
    crate::error::ApiError::bad_request(
        "CONFIGURATION_INVALID",
        "the configuration does not match the connector's spec",
    )
    .with_details(serde_json::json!({ "field": "configuration", "errors": [{ "path": pointer, "message": message }] }))
}

/// The rules of a connector (by canonical id), if it has any.
pub(crate) fn rules(connector_id: &str) -> Option<&'static dyn ConnectorRules> {
    ALL.iter().copied().find(|r| r.connector_id() == connector_id)
}
