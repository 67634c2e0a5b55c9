//! A source whose credentials come from OAuth: it declares the provider's
//! authorization and token endpoints, and checks access with the handle the
//! host's OAuth flow produced (bearer placement; the host refreshes the
//! token when it expires). The host's OAuth tests use it against a fake
//! authorization server.

use connector_sdk::{
    CheckResult, Connector, ConnectorInfo, Http, OAuthEndpoints, Operation, Placement, Result, export_connector, json,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Config {
    credential_handle: String,
}

struct OAuthSource;

impl Connector for OAuthSource {
    type Config = Config;

    fn describe() -> ConnectorInfo {
        ConnectorInfo::source("test_oauth_source", "OAuth test source", env!("CARGO_PKG_VERSION"))
            .with_hosts(["api.social.test", "auth.social.test"])
            .with_operations([Operation::Check])
            .with_oauth(OAuthEndpoints {
                authorize_url: "https://auth.social.test/oauth/authorize".into(),
                token_url: "https://auth.social.test/oauth/token".into(),
                scopes: vec!["social.read".into()],
            })
            .with_config_schema(json!({ "type": "object", "required": ["credential_handle"],
                "properties": { "credential_handle": { "type": "string" } } }))
    }

    fn check(config: Config) -> Result<CheckResult> {
        let me = Http::get("https://api.social.test/me")
            .credential(&config.credential_handle, Placement::Bearer)
            .send()?
            .json::<connector_sdk::Value>()?;
        let account = me["portal_id"].as_str().unwrap_or("unknown").to_owned();
        Ok(CheckResult::success("connected").with_account(account))
    }
}

export_connector!(OAuthSource);
