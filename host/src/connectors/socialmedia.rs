//! Rules of the social-media source, `conn_socialmedia_hub`: the selection
//! of portal, brands and channels is checked against what the provider
//! offers now ([`super::entities`]), level by level, each narrowed by the
//! one above. Ids a saved source already holds are not checked again, so
//! sources saved before the selection was validated (with raw ids) keep
//! working when they are updated.

use std::collections::BTreeSet;
use std::pin::Pin;

use serde_json::{Map, Value, json};

use super::ConnectorRules;
use super::entities;
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::credentials::CredentialHandle;

/// The connector id.
pub(crate) const CONNECTOR_ID: &str = "conn_socialmedia_hub";

/// The rules.
pub(crate) struct Rules;

/// An id as text (saved configurations may hold numbers).
fn id(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The ids under `key`, one or many.
fn ids(config: Option<&Value>, key: &str) -> BTreeSet<String> {
    match config.and_then(|c| c.get(key)) {
        Some(Value::Array(items)) => items.iter().filter_map(id).collect(),
        Some(v) => id(v).into_iter().collect(),
        None => BTreeSet::new(),
    }
}

/// The ids under `key` that `config` holds and `saved` does not.
fn added(config: &Value, saved: Option<&Value>, key: &str) -> Vec<String> {
    let before = ids(saved, key);
    ids(Some(config), key).into_iter().filter(|i| !before.contains(i)).collect()
}

fn not_offered(field: &str, what: &str, value: &str, scope: &str) -> ApiError {
    let shown: String = value.chars().take(64).collect();
    ApiError::bad_request("ENTITY_NOT_OFFERED", format!("{field}: the provider does not offer {what} `{shown}` {scope}; choose one of the options of POST /v1/sources/entities"))
        .with_details(json!({ "field": format!("configuration.{field}"), "id": shown }))
}

impl Rules {
    async fn check_selection(
        &self,
        state: &AppState,
        access: &WorkspaceAccess,
        config: &Value,
        saved: Option<&Value>,
    ) -> ApiResult<()> {
        let handle = CredentialHandle::new(config["credential_handle"].as_str().unwrap_or_default());
        // Another credential (or portal) sees other things: nothing the
        // source held before is taken on trust then.
        let saved = saved.filter(|s| {
            s["credential_handle"] == config["credential_handle"]
                && ids(Some(s), "portal_id") == ids(Some(config), "portal_id")
        });
        let mut chosen = Map::new();

        let new_portal = added(config, saved, "portal_id");
        if !new_portal.is_empty() {
            let offered = entities::options(state, access, CONNECTOR_ID, &handle, &chosen, "portal_id").await?;
            if let Some(p) = new_portal.iter().find(|p| !offered.iter().any(|o| o.value == **p)) {
                return Err(not_offered("portal_id", "portal", p, "to this credential"));
            }
        }
        if let Some(p) = config.get("portal_id") {
            chosen.insert("portal_id".into(), p.clone());
        }

        let brands = ids(Some(config), "brand_ids");
        let new_brands = added(config, saved, "brand_ids");
        if !new_brands.is_empty() {
            let offered = entities::options(state, access, CONNECTOR_ID, &handle, &chosen, "brand_ids").await?;
            if let Some(b) = new_brands.iter().find(|b| !offered.iter().any(|o| o.value == **b)) {
                return Err(not_offered("brand_ids", "brand", b, "in the chosen portal"));
            }
        }
        chosen.insert("brand_ids".into(), json!(brands));

        let new_channels = added(config, saved, "channel_ids");
        if !new_channels.is_empty() {
            let offered = entities::options(state, access, CONNECTOR_ID, &handle, &chosen, "channel_ids").await?;
            if let Some(c) = new_channels.iter().find(|c| !offered.iter().any(|o| o.value == **c)) {
                return Err(not_offered("channel_ids", "channel", c, "for the chosen brands"));
            }
        }
        Ok(())
    }
}

impl ConnectorRules for Rules {
    fn connector_id(&self) -> &'static str {
        CONNECTOR_ID
    }

    fn validate_source<'a>(
        &'a self,
        state: &'a AppState,
        access: &'a WorkspaceAccess,
        config: &'a Value,
        saved: Option<&'a Value>,
    ) -> Pin<Box<dyn Future<Output = ApiResult<()>> + Send + 'a>> {
        Box::pin(self.check_selection(state, access, config, saved))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_text_whether_saved_as_text_or_numbers() {
        let c = json!({ "portal_id": 62515, "brand_ids": ["7", 8, null, ""], "channel_ids": "one" });
        assert_eq!(ids(Some(&c), "portal_id"), BTreeSet::from(["62515".to_owned()]));
        assert_eq!(ids(Some(&c), "brand_ids"), BTreeSet::from(["7".to_owned(), "8".to_owned()]));
        assert_eq!(ids(Some(&c), "channel_ids"), BTreeSet::from(["one".to_owned()]));
        assert!(ids(None, "brand_ids").is_empty());
    }
}
