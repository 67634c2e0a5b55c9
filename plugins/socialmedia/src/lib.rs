//! The bundled social-media source, `conn_socialmedia_hub`.
//!
//! It reads a marketing suite's social publishing API with three levels: a
//! *portal* (the provider account, "hub id"), its *brands* (business units)
//! and the *channels* connected to each brand (a Facebook page, a LinkedIn
//! company page, ...), whose published posts ("broadcasts") carry click and
//! interaction counts. The API is HubSpot's social and business-unit API;
//! HubSpot marks the social (broadcast) part deprecated but keeps it
//! working, so a provider change there is the first thing to check when
//! reads start failing.
//!
//! Credentials come from OAuth 2 (authorization code with PKCE): the host
//! runs the flow, exchanges the code and refreshes the access token; the
//! plugin only ever sees the credential handle.
//!
//! # What it offers
//!
//! | operation | what it does |
//! |---|---|
//! | `check` | reads the account details; the account is the portal id |
//! | `entity-options` | portal, brands of the portal, channels of the brands ([`entities`]) |
//! | `discover` | `channels`, `posts`, `post_metrics`, `channel_statistics` ([`streams`]) |
//! | `read` | the selected channels only; `posts` incremental on `created_at` ([`read`](mod@read)) |
//!
//! Its legacy aliases `source:socialmedia` and `source:hubspot_social`
//! exist only so old saved configurations keep resolving.
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | [`config`] | the config type (ids as text) and its JSON Schema |
//! | [`api`] | the only code that builds requests |
//! | [`entities`] | the entity options |
//! | [`streams`] | stream names, schemas and record building |
//! | [`read`](mod@read) | the read operation and the incremental state |
//!
//! Unit tests cover the pure parts and run natively:
//! `cargo test --target x86_64-unknown-linux-gnu -p conn-socialmedia`.

pub mod api;
pub mod config;
pub mod entities;
pub mod read;
pub mod streams;

use connector_sdk::{
    CheckResult, Connector, ConnectorInfo, EntityOption, OAuthEndpoints, Operation, ReadRequest, Result, Stream, Value,
    export_connector,
};

use crate::config::Config;

/// The stable connector id.
pub const CONNECTOR_ID: &str = "conn_socialmedia_hub";

/// Older ids found in saved configurations (compatibility only).
pub const LEGACY_ALIASES: [&str; 2] = ["source:socialmedia", "source:hubspot_social"];

/// The connector; see the crate documentation.
pub struct SocialMedia;

impl Connector for SocialMedia {
    type Config = Config;

    fn describe() -> ConnectorInfo {
        ConnectorInfo::source(CONNECTOR_ID, "Social media", env!("CARGO_PKG_VERSION"))
            .with_legacy_aliases(LEGACY_ALIASES)
            .with_hosts(["api.hubapi.com"])
            .with_operations([Operation::Check, Operation::Discover, Operation::Read, Operation::EntityOptions])
            .with_oauth(OAuthEndpoints {
                authorize_url: "https://app.hubspot.com/oauth/authorize".into(),
                token_url: "https://api.hubapi.com/oauth/v1/token".into(),
                scopes: vec!["oauth".into(), "social".into(), "business_units_view.read".into()],
            })
            .with_config_schema(config::schema())
    }

    fn check(config: Config) -> Result<CheckResult> {
        let account = api::Api::new(&config.credential_handle).account()?;
        let portal = config::Id::from_value(&account.portal_id).map(|p| p.0).unwrap_or_else(|| "unknown".into());
        Ok(CheckResult::success("the credential can read the portal").with_account(format!("portal {portal}")))
    }

    fn discover(config: Config) -> Result<Vec<Stream>> {
        config.validate()?;
        Ok(streams::catalogue())
    }

    fn read(request: ReadRequest<Config>) -> Result<()> {
        read::read(request)
    }

    fn entity_options(config: Value, field: &str) -> Result<Vec<EntityOption>> {
        entities::options(&config, field)
    }
}

export_connector!(SocialMedia);

#[cfg(test)]
mod tests {
    use super::*;
    use connector_sdk::ConnectorKind;

    #[test]
    fn describe_names_the_connector_its_aliases_and_its_one_host() {
        let info = SocialMedia::describe();
        assert_eq!((info.id.as_str(), info.kind), (CONNECTOR_ID, ConnectorKind::Source));
        assert_eq!(info.legacy_aliases, LEGACY_ALIASES);
        assert_eq!(info.hosts, ["api.hubapi.com"]);
        assert!(info.operations.contains(&Operation::EntityOptions));
        let oauth = info.oauth.expect("credentials come from OAuth");
        assert!(oauth.token_url.starts_with("https://api.hubapi.com/"), "the token endpoint is on a declared host");
    }
}
