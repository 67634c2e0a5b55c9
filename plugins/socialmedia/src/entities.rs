//! `entity-options`: the provider-backed choices for `portal_id`,
//! `brand_ids` and `channel_ids`, each level narrowed by the one above.
//!
//! | field | needs in the config | options |
//! |---|---|---|
//! | `portal_id` | `credential_handle` | the credential's portal |
//! | `brand_ids` | `portal_id` (the credential's) | the brands the authorising user can access; parent: the portal |
//! | `channel_ids` | `brand_ids` | the channels of those brands; parent: the brand |
//!
//! Brands are listed per user. The user is the one who authorised the
//! credential: the host passes what the provider said about it at the
//! token exchange as `credential_account` (`hub_id`, `user_id`).

use connector_sdk::{EntityOption, Error, Result, Value};

use crate::api::Api;
use crate::config::Id;

/// The options for `field` given what the user chose so far.
pub fn options(config: &Value, field: &str) -> Result<Vec<EntityOption>> {
    let handle = config["credential_handle"]
        .as_str()
        .filter(|h| !h.trim().is_empty())
        .ok_or_else(|| Error::InvalidConfig("credential_handle is required".into()))?;
    let api = Api::new(handle);
    match field {
        "portal_id" => Ok(vec![portal_option(&api)?]),
        "brand_ids" => {
            let portal = chosen_portal(&api, config)?;
            let user = config.pointer("/credential_account/user_id").and_then(Id::from_value).ok_or_else(|| {
                Error::InvalidCredentials(
                    "the credential does not say which user authorised it; authorise again".into(),
                )
            })?;
            Ok(api
                .brands(&user)?
                .into_iter()
                .filter_map(|b| {
                    let id = Id::from_value(&b.id)?;
                    let label = b.name.filter(|n| !n.trim().is_empty()).unwrap_or_else(|| format!("Brand {}", id.0));
                    Some(EntityOption::new(id.0, label).with_parent(portal.0.clone()))
                })
                .collect())
        }
        "channel_ids" => {
            let brands: Vec<Id> = config["brand_ids"]
                .as_array()
                .map(|a| a.iter().filter_map(Id::from_value).collect())
                .unwrap_or_default();
            if brands.is_empty() {
                return Err(Error::InvalidConfig("brand_ids: choose at least one brand first".into()));
            }
            let portal = config.get("portal_id").and_then(Id::from_value);
            Ok(api
                .channels()?
                .into_iter()
                .filter(|c| {
                    portal
                        .as_ref()
                        .is_none_or(|p| c.portal_id.as_ref().and_then(Id::from_value).is_none_or(|cp| cp == *p))
                })
                .filter_map(|c| {
                    let brand = c.brand().filter(|b| brands.contains(b))?;
                    Some(EntityOption::new(c.channel_guid.clone(), c.label()).with_parent(brand.0))
                })
                .collect())
        }
        other => Err(Error::Unsupported(format!("this connector offers no options for `{other}`"))),
    }
}

fn portal_option(api: &Api) -> Result<EntityOption> {
    let account = api.account()?;
    let id = Id::from_value(&account.portal_id)
        .ok_or_else(|| Error::ProviderError("the account details carry no portalId".into()))?;
    let label = match account.ui_domain.filter(|d| !d.trim().is_empty()) {
        Some(domain) => format!("Portal {} ({domain})", id.0),
        None => format!("Portal {}", id.0),
    };
    Ok(EntityOption::new(id.0, label))
}

/// The chosen portal, which must be the credential's own.
fn chosen_portal(api: &Api, config: &Value) -> Result<Id> {
    let chosen = config
        .get("portal_id")
        .and_then(Id::from_value)
        .ok_or_else(|| Error::InvalidConfig("portal_id: choose the portal first".into()))?;
    let own = portal_option(api)?;
    if own.value != chosen.0 {
        return Err(Error::InvalidConfig(format!(
            "portal_id: the credential belongs to portal {}, not {}",
            own.value, chosen.0
        )));
    }
    Ok(chosen)
}
