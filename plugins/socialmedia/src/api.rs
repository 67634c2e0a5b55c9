//! The only code that builds requests to the provider.
//!
//! | what | request |
//! |---|---|
//! | the portal | `GET /account-info/v3/details` → `portalId`, `uiDomain`, ... |
//! | brands | `GET /business-units/v3/business-units/user/{userId}` → `{"results": [{"id", "name"}]}` (not paged) |
//! | channels | `GET /broadcast/v1/channels/setting/publish/current` → a bare array |
//! | posts | `GET /broadcast/v1/broadcasts?status=success&since=<ms>&count=100&offset=N` → a bare array per page |
//!
//! Every request carries the credential handle with bearer placement; the
//! host injects the access token, refreshes it when it expires (and when the
//! provider answers that it expired), and never shows it to the plugin.
//! 429s are retried after `Retry-After` by the SDK.

use connector_sdk::{Error, Http, Placement, RequestBuilder, Result, Value};
use serde::Deserialize;

use crate::config::Id;

/// The provider's API.
pub const API: &str = "https://api.hubapi.com";

/// Posts per page of the broadcasts listing.
pub const PAGE_SIZE: usize = 100;

/// The portal the credential belongs to.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Account {
    /// The portal (hub) id.
    pub portal_id: Value,
    /// The domain of the portal's app, when given.
    #[serde(default)]
    pub ui_domain: Option<String>,
}

/// A brand (business unit).
#[derive(Debug, Deserialize)]
pub struct Brand {
    /// The brand id.
    pub id: Value,
    /// Its name.
    #[serde(default)]
    pub name: Option<String>,
}

/// A connected social channel.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Channel {
    /// The channel GUID: what the config selects.
    pub channel_guid: String,
    /// The network and account, for example `FacebookPage:1234`.
    #[serde(default)]
    pub channel_key: Option<String>,
    /// The network's account type, for example `FacebookPage`.
    #[serde(default)]
    pub account_type: Option<String>,
    /// Names as the provider gives them; null for some networks.
    #[serde(default)]
    pub name: Option<String>,
    /// See `name`.
    #[serde(default)]
    pub display_name: Option<String>,
    /// Whether the channel can publish.
    #[serde(default)]
    pub active: Option<bool>,
    /// The portal it belongs to.
    #[serde(default)]
    pub portal_id: Option<Value>,
    /// The brand (business unit) it belongs to.
    #[serde(default)]
    pub business_unit_id: Option<Value>,
}

impl Channel {
    /// What to show a person: the display name, the name, or the key.
    pub fn label(&self) -> String {
        let name = self.display_name.as_deref().or(self.name.as_deref()).filter(|n| !n.trim().is_empty());
        match (name, self.account_type.as_deref()) {
            (Some(n), Some(t)) => format!("{n} ({t})"),
            (Some(n), None) => n.to_owned(),
            (None, _) => self.channel_key.clone().unwrap_or_else(|| self.channel_guid.clone()),
        }
    }

    /// The brand the channel belongs to, as text.
    pub fn brand(&self) -> Option<Id> {
        self.business_unit_id.as_ref().and_then(Id::from_value)
    }
}

/// The provider's API through one credential.
pub struct Api<'a> {
    handle: &'a str,
}

impl<'a> Api<'a> {
    /// Requests made with the credential behind `handle`.
    pub fn new(handle: &'a str) -> Self {
        Api { handle }
    }

    fn get(&self, path: &str) -> RequestBuilder {
        Http::get(format!("{API}{path}")).header("accept", "application/json").credential(self.handle, Placement::Bearer)
    }

    /// The portal the credential belongs to.
    pub fn account(&self) -> Result<Account> {
        self.get("/account-info/v3/details").send()?.json()
    }

    /// The brands the user who authorised the credential can access.
    pub fn brands(&self, user: &Id) -> Result<Vec<Brand>> {
        #[derive(Deserialize)]
        struct Brands {
            results: Vec<Brand>,
        }
        let path = format!("/business-units/v3/business-units/user/{}", user.path_segment("credential_account.user_id")?);
        Ok(self.get(&path).send()?.json::<Brands>()?.results)
    }

    /// Every connected channel of the portal.
    pub fn channels(&self) -> Result<Vec<Channel>> {
        self.get("/broadcast/v1/channels/setting/publish/current").send()?.json()
    }

    /// One page of published posts created at or after `since` (epoch ms).
    pub fn broadcasts(&self, since: Option<i64>, offset: usize) -> Result<Vec<Value>> {
        let mut req = self.get("/broadcast/v1/broadcasts").query("status", "success").query("count", PAGE_SIZE).query("offset", offset);
        if let Some(since) = since {
            req = req.query("since", since);
        }
        let page: Value = req.send()?.json()?;
        match page {
            Value::Array(items) => Ok(items),
            _ => Err(Error::ProviderError("the broadcasts listing is not a JSON array".into())),
        }
    }
}
