//! The connector's configuration: what the user fills in, its JSON Schema,
//! and the checks run before any request is made.
//!
//! The host validates `base_url` against its own rules (approved HTTPS host,
//! port 443, no private addresses, ...) before the plugin ever runs. The
//! checks here repeat the ones that can be decided from the text alone, so a
//! mistake is reported as `invalid-config` naming the field rather than as a
//! puzzling provider or egress error later.

use connector_sdk::{Error, Result, Value, json};
use serde::Deserialize;

use crate::incremental::Timestamp;

/// The provider's cloud domain: a cloud `base_url` must be on a subdomain.
pub const CLOUD_DOMAIN: &str = "mailcoach.app";

/// What the user configures. Matches [`schema`]; holds no secret.
///
/// Unknown fields are ignored rather than refused, so configurations saved
/// by older versions of the connector keep working (the schema still
/// declares `additionalProperties: false` for new ones).
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    /// The provider's API URL, ending in `/api`.
    pub base_url: String,
    /// The handle of the stored API token; the host sends it as a Bearer
    /// token.
    pub credential_handle: String,
    /// Self-hosted instance or the provider's cloud.
    #[serde(default)]
    pub connection_method: ConnectionMethod,
    /// Limits the `subscribers` stream to these lists; the first one is where
    /// `write` creates subscribers. Empty means all lists (for reading).
    #[serde(default)]
    pub email_list_uuids: Vec<String>,
    /// The earliest `updated_at` a first incremental read emits.
    #[serde(default)]
    pub start_date: Option<String>,
}

/// How the provider is deployed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionMethod {
    /// An instance the customer runs at their own domain.
    #[default]
    SelfHosted,
    /// The provider's hosted offering at `<team>.mailcoach.app`.
    Cloud,
}

/// The JSON Schema (draft 2020-12) of [`Config`].
pub fn schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Email campaigns (Mailcoach-compatible API)",
        "type": "object",
        "additionalProperties": false,
        "required": ["base_url", "credential_handle"],
        "properties": {
            "base_url": {
                "type": "string",
                "format": "uri",
                "title": "API base URL",
                "description": "The HTTPS URL of the API, ending in /api: https://<instance-domain>/api for a self-hosted instance, https://<team>.mailcoach.app/api for the cloud."
            },
            "credential_handle": {
                "type": "string",
                "minLength": 1,
                "title": "API token",
                "description": "Handle of the stored API token (create it with POST /credentials/emailcampaign/api-token); the token itself is never part of the configuration."
            },
            "connection_method": {
                "type": "string",
                "enum": ["self_hosted", "cloud"],
                "default": "self_hosted",
                "title": "Deployment",
                "description": "self_hosted: an instance on your own domain; cloud: the provider's hosted offering."
            },
            "email_list_uuids": {
                "type": "array",
                "items": { "type": "string", "minLength": 1 },
                "uniqueItems": true,
                "title": "Email lists",
                "description": "Read subscribers of these lists only (all lists when empty). Writes create subscribers in the first list."
            },
            "start_date": {
                "type": "string",
                "format": "date-time",
                "title": "Start date",
                "description": "The first incremental read skips records last updated before this time."
            }
        }
    })
}

impl Config {
    /// The validated API base URL, without a trailing slash, for example
    /// `https://news.example.com/api`.
    pub fn api_base(&self) -> Result<String> {
        validate_base_url(&self.base_url, self.connection_method)
    }

    /// The credential handle, which must not be blank.
    pub fn credential(&self) -> Result<&str> {
        let handle = self.credential_handle.trim();
        if handle.is_empty() {
            return Err(Error::InvalidConfig("credential_handle: must name a stored API token".into()));
        }
        Ok(handle)
    }

    /// The parsed `start_date`, if one is set.
    pub fn start_date(&self) -> Result<Option<Timestamp>> {
        match self.start_date.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(text) => Timestamp::parse(text).map(Some).ok_or_else(|| {
                Error::InvalidConfig("start_date: must be an RFC 3339 date-time such as 2024-01-01T00:00:00Z".into())
            }),
        }
    }

    /// The configured email lists, each checked to be usable in a URL path.
    pub fn email_lists(&self) -> Result<Vec<String>> {
        self.email_list_uuids
            .iter()
            .enumerate()
            .map(|(i, uuid)| {
                let uuid = uuid.trim();
                if is_path_safe_id(uuid) {
                    Ok(uuid.to_owned())
                } else {
                    Err(Error::InvalidConfig(format!("email_list_uuids[{i}]: not an email list uuid")))
                }
            })
            .collect()
    }

    /// Runs every check at once, so an operation reports a bad config before
    /// doing any work.
    pub fn validate(&self) -> Result<()> {
        self.api_base()?;
        self.credential()?;
        self.start_date()?;
        self.email_lists()?;
        Ok(())
    }
}

/// Whether `id` can be put into a URL path as it is: letters, digits, `-`
/// and `_`, as the provider's uuids are. Everything the plugin puts into a
/// path goes through this check, so no input can add path segments or a
/// query.
pub fn is_path_safe_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Checks `base_url` and returns it without a trailing slash.
fn validate_base_url(url: &str, method: ConnectionMethod) -> Result<String> {
    let invalid = |why: &str| Error::InvalidConfig(format!("base_url: {why}"));
    let url = url.trim().trim_end_matches('/');
    let Some(scheme_end) = url.find("://") else {
        return Err(invalid("must be an absolute https:// URL ending in /api"));
    };
    if !url[..scheme_end].eq_ignore_ascii_case("https") {
        return Err(invalid("must use https"));
    }
    let rest = &url[scheme_end + 3..];
    if rest.contains(['?', '#']) {
        return Err(invalid("must not contain a query string or a fragment"));
    }
    if rest.chars().any(char::is_whitespace) {
        return Err(invalid("must not contain spaces"));
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.contains('@') {
        return Err(invalid("must not contain user information"));
    }
    let host = match authority.rsplit_once(':') {
        // A bracketed IPv6 literal has colons of its own.
        Some((host, port)) if !port.contains(']') => {
            if port != "443" {
                return Err(invalid("must use the standard HTTPS port 443"));
            }
            host
        }
        _ => authority,
    };
    if host.is_empty() {
        return Err(invalid("has no host"));
    }
    if !path.ends_with("/api") {
        return Err(invalid("must be the API URL, ending in /api"));
    }
    if method == ConnectionMethod::Cloud {
        let host = host.to_ascii_lowercase();
        let on_cloud = host.strip_suffix(CLOUD_DOMAIN).is_some_and(|team| team.len() > 1 && team.ends_with('.'));
        if !on_cloud {
            return Err(invalid("a cloud connection must use https://<team>.mailcoach.app/api"));
        }
    }
    Ok(url.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(value: Value) -> Config {
        serde_json::from_value(value).unwrap()
    }

    fn base(url: &str, method: ConnectionMethod) -> Result<String> {
        validate_base_url(url, method)
    }

    #[test]
    fn only_base_url_and_credential_handle_are_required() {
        let c = config(json!({ "base_url": "https://news.example.com/api", "credential_handle": "cred_1" }));
        assert_eq!(c.connection_method, ConnectionMethod::SelfHosted);
        assert!(c.email_list_uuids.is_empty());
        assert!(c.validate().is_ok());
    }

    #[test]
    fn saved_configs_with_unknown_fields_still_parse() {
        let c = config(json!({
            "base_url": "https://news.example.com/api",
            "credential_handle": "cred_1",
            "legacy_setting": true
        }));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn self_hosted_and_cloud_api_urls_are_accepted() {
        use ConnectionMethod::*;
        assert_eq!(base("https://news.example.com/api/", SelfHosted).unwrap(), "https://news.example.com/api");
        assert!(base("https://example.com/mailcoach/api", SelfHosted).is_ok());
        assert!(base("https://example.com:443/api", SelfHosted).is_ok());
        assert!(base("https://acme.mailcoach.app/api", Cloud).is_ok());
        assert!(base("HTTPS://Acme.Mailcoach.App/api", Cloud).is_ok());
    }

    #[test]
    fn base_urls_breaking_the_spec_limits_are_invalid_config() {
        use ConnectionMethod::*;
        for (url, method) in [
            ("http://news.example.com/api", SelfHosted),
            ("news.example.com/api", SelfHosted),
            ("https://news.example.com", SelfHosted),
            ("https://news.example.com/api?x=1", SelfHosted),
            ("https://news.example.com/api#top", SelfHosted),
            ("https://user:pw@news.example.com/api", SelfHosted),
            ("https://news.example.com:8443/api", SelfHosted),
            ("https:///api", SelfHosted),
            ("https://news.example.com/api", Cloud),
            ("https://mailcoach.app/api", Cloud),
            ("https://evilmailcoach.app/api", Cloud),
            ("https://acme.mailcoach.app.evil.com/api", Cloud),
        ] {
            let err = base(url, method).unwrap_err();
            assert!(matches!(&err, Error::InvalidConfig(m) if m.starts_with("base_url: ")), "{url}: {err:?}");
        }
    }

    #[test]
    fn a_blank_credential_handle_is_invalid_config() {
        let c = config(json!({ "base_url": "https://a.example/api", "credential_handle": " " }));
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(m)) if m.starts_with("credential_handle")));
    }

    #[test]
    fn start_date_must_be_a_date_time() {
        let mut c = config(json!({ "base_url": "https://a.example/api", "credential_handle": "h" }));
        c.start_date = Some("2024-01-01T00:00:00Z".into());
        assert!(c.start_date().unwrap().is_some());
        c.start_date = Some("last tuesday".into());
        assert!(matches!(c.start_date(), Err(Error::InvalidConfig(m)) if m.starts_with("start_date")));
    }

    #[test]
    fn email_list_uuids_must_be_safe_path_segments() {
        let mut c = config(json!({ "base_url": "https://a.example/api", "credential_handle": "h" }));
        c.email_list_uuids = vec!["845b334b-90de-455d-8e9f-50598d75c06b".into()];
        assert!(c.email_lists().is_ok());
        c.email_list_uuids.push("../../user".into());
        assert!(matches!(
            c.email_lists(),
            Err(Error::InvalidConfig(m)) if m.starts_with("email_list_uuids[1]")
        ));
    }

    #[test]
    fn unknown_connection_methods_do_not_parse() {
        let parsed = serde_json::from_value::<Config>(json!({
            "base_url": "https://a.example/api", "credential_handle": "h", "connection_method": "ftp"
        }));
        assert!(parsed.is_err());
    }

    #[test]
    fn the_schema_requires_exactly_the_documented_fields_and_holds_no_secret() {
        let s = schema();
        assert_eq!(s["required"], json!(["base_url", "credential_handle"]));
        assert_eq!(s["additionalProperties"], json!(false));
        let fields: Vec<&String> = s["properties"].as_object().unwrap().keys().collect();
        assert_eq!(fields.len(), 5);
        assert!(fields.iter().all(|f| !f.contains("token") && !f.contains("secret")));
    }
}
