//! The email-campaign connector's host side (spec sections 2, 4 and 8):
//! the one `base_url` validator, connection methods, the rules of a saved
//! source, and the allowlist that shapes what check and preview may
//! answer.
//!
//! The provider (a Mailcoach-compatible API) runs self-hosted at
//! `https://<instance>/api` or in the cloud at `https://<team>.mailcoach.app/api`.

use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use url::{Host, Url};
use utoipa::ToSchema;

use super::ConnectorRules;
use crate::access::WorkspaceAccess;
use crate::egress::HostPattern;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::credentials::CredentialHandle;

/// The product connector id.
pub(crate) const CONNECTOR_ID: &str = "conn_emailcampaign_edm";

/// The provider's cloud domain: cloud base URLs are on a subdomain of it.
pub(crate) const CLOUD_DOMAIN: &str = "mailcoach.app";

/// How the provider is deployed. Absent means `self_hosted`, so saved
/// configurations without the field keep working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ConnectionMethod {
    /// The customer's own instance; its host must be approved by the operator.
    #[default]
    SelfHosted,
    /// The provider's cloud offering, on `*.mailcoach.app`.
    Cloud,
}

impl ConnectionMethod {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ConnectionMethod::SelfHosted => "self_hosted",
            ConnectionMethod::Cloud => "cloud",
        }
    }

    /// Parses the optional field; unknown values are refused.
    pub(crate) fn parse(raw: Option<&str>) -> Result<ConnectionMethod, String> {
        match raw {
            None | Some("self_hosted") => Ok(ConnectionMethod::SelfHosted),
            Some("cloud") => Ok(ConnectionMethod::Cloud),
            Some(other) => Err(format!("connection_method '{other}' is not one of: self_hosted, cloud")),
        }
    }
}

/// Why a base URL was refused: the rule of spec section 8 it broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BaseUrlRejection {
    /// Number of the rule in the spec's list (1-7).
    pub rule_number: u8,
    /// Stable name of the rule.
    pub rule: &'static str,
    pub message: String,
}

fn reject(rule_number: u8, rule: &'static str, message: impl Into<String>) -> BaseUrlRejection {
    BaseUrlRejection { rule_number, rule, message: message.into() }
}

/// Host names that never belong to a provider on the internet: special-use
/// and internal suffixes.
const INTERNAL_SUFFIXES: &[&str] = &[
    "localhost",
    "local",
    "internal",
    "intranet",
    "lan",
    "home",
    "corp",
    "private",
    "localdomain",
    "test",
    "invalid",
    "example",
    "onion",
    "arpa",
    "home.arpa",
    "in-addr.arpa",
    "ip6.arpa",
];

/// Validates an email-campaign base URL before any provider request.
///
/// Only input that is already in canonical form is accepted: the URL parser
/// silently rewrites many spellings (decimal or hex IPs, full-width
/// digits, backslashes, tabs, percent-encoded hosts, dot segments, upper
/// case), so the input must survive parsing unchanged. Hosts are compared
/// label by label, never with a naive suffix check.
pub(crate) fn validate_base_url(
    raw: &str,
    method: ConnectionMethod,
    approved: &[HostPattern],
) -> Result<Url, BaseUrlRejection> {
    if raw.is_empty() || raw.len() > 2048 {
        return Err(reject(1, "approved_https_host", "base_url must be a URL of at most 2048 characters"));
    }
    if !raw.chars().all(|c| c.is_ascii_graphic()) {
        return Err(reject(
            3,
            "no_internal_hosts",
            "base_url must be plain ASCII without spaces or control characters (write internationalised names in punycode)",
        ));
    }
    if raw.contains('\\') || raw.contains('%') {
        return Err(reject(3, "no_internal_hosts", "base_url must not contain backslashes or percent-encoding"));
    }
    let lower = raw.to_ascii_lowercase();
    if lower.starts_with("http://") {
        return Err(reject(2, "no_plain_http", "plain HTTP is not allowed; use https://"));
    }
    if !raw.starts_with("https://") {
        return Err(reject(1, "approved_https_host", "base_url must start with https://"));
    }
    if raw.contains('@') {
        return Err(reject(4, "no_userinfo", "base_url must not contain user-info (user@ or user:password@)"));
    }
    if raw.contains('?') || raw.contains('#') {
        return Err(reject(5, "no_query_or_fragment", "base_url must not contain a query string or a fragment"));
    }
    let url =
        Url::parse(raw).map_err(|e| reject(1, "approved_https_host", format!("base_url is not a valid URL: {e}")))?;
    if url.port().is_some() {
        return Err(reject(6, "port_443_only", "only port 443 is allowed"));
    }
    // The authority as typed, without an explicit :443 (the only port
    // allowed), must equal what the parser made of it.
    let authority = &raw["https://".len()..];
    let authority = authority.split('/').next().unwrap_or("");
    let typed_host = authority.strip_suffix(":443").unwrap_or(authority);
    if typed_host.contains(':') && !typed_host.starts_with('[') {
        return Err(reject(6, "port_443_only", "only port 443 is allowed"));
    }
    let host = match url.host() {
        Some(Host::Domain(d)) => d.to_owned(),
        Some(Host::Ipv4(_)) | Some(Host::Ipv6(_)) => {
            return Err(reject(3, "no_internal_hosts", "IP addresses are not allowed; use the provider's host name"));
        }
        None => return Err(reject(1, "approved_https_host", "base_url has no host")),
    };
    if typed_host != host {
        return Err(reject(
            3,
            "no_internal_hosts",
            "the host must be written in canonical form (lower case, no encodings)",
        ));
    }
    let rest = &raw["https://".len() + authority.len()..];
    if rest != url.path() {
        return Err(reject(7, "api_path", "the path must be written in canonical form (no dot segments or encodings)"));
    }
    if host.ends_with('.') || host.starts_with('.') || host.contains("..") {
        return Err(reject(3, "no_internal_hosts", "the host must not start or end with a dot"));
    }
    let labels: Vec<&str> = host.split('.').collect();
    if labels.len() < 2 {
        return Err(reject(3, "no_internal_hosts", "single-label (internal) host names are not allowed"));
    }
    if labels.last().is_some_and(|tld| tld.chars().all(|c| c.is_ascii_digit())) {
        return Err(reject(3, "no_internal_hosts", "the host looks like an IP address"));
    }
    if INTERNAL_SUFFIXES.iter().any(|s| host == *s || host.ends_with(&format!(".{s}"))) {
        return Err(reject(3, "no_internal_hosts", format!("{host} is a local, private or internal name")));
    }
    let path = url.path();
    if !path.ends_with("/api") {
        return Err(reject(7, "api_path", "base_url must be the instance's API URL ending in /api"));
    }
    let on_cloud = HostPattern::Suffix(format!(".{CLOUD_DOMAIN}")).matches(&host);
    match method {
        ConnectionMethod::Cloud => {
            if !on_cloud {
                return Err(reject(7, "api_path", format!("a cloud base_url is https://<team>.{CLOUD_DOMAIN}/api")));
            }
            if path != "/api" {
                return Err(reject(7, "api_path", format!("a cloud base_url is https://<team>.{CLOUD_DOMAIN}/api")));
            }
        }
        ConnectionMethod::SelfHosted => {}
    }
    if !approved.iter().any(|p| p.matches(&host)) {
        return Err(reject(
            1,
            "approved_https_host",
            format!(
                "{host} is not an approved host of the provider; the operator approves self-hosted instances by adding their host"
            ),
        ));
    }
    Ok(url)
}

/// Answers a base_url that breaks a rule, naming the rule.
pub(crate) fn base_url_error(r: BaseUrlRejection) -> ApiError {
    ApiError::bad_request("BASE_URL_REJECTED", format!("base_url rejected: {}", r.message))
        .with_details(json!({ "field": "base_url", "rule": r.rule, "rule_number": r.rule_number }))
}

/// The email-campaign rules for a saved source configuration: the same
/// base_url validator, a known connection method (absent means
/// self_hosted), and a credential bound to the base_url's host.
pub(crate) struct Rules;

impl ConnectorRules for Rules {
    fn connector_id(&self) -> &'static str {
        CONNECTOR_ID
    }

    fn validate_source<'a>(
        &'a self,
        state: &'a AppState,
        access: &'a WorkspaceAccess,
        config: &'a Value,
        _saved: Option<&'a Value>,
    ) -> Pin<Box<dyn Future<Output = ApiResult<()>> + Send + 'a>> {
        Box::pin(async move {
            let base_url = config["base_url"]
                .as_str()
                .ok_or_else(|| ApiError::invalid_field("configuration.base_url", "base_url is required"))?;
            let method = ConnectionMethod::parse(config["connection_method"].as_str())
                .map_err(|m| ApiError::invalid_field("configuration.connection_method", m))?;
            let url =
                validate_base_url(base_url, method, &state.egress.policy().allowed_hosts).map_err(base_url_error)?;
            let handle = CredentialHandle::new(config["credential_handle"].as_str().unwrap_or_default());
            state
                .vault
                .require_handle(&access.workspace_id, &handle, url.host_str())
                .await
                .map_err(|e| e.at("configuration.credential_handle"))?;
            Ok(())
        })
    }
}

/// Metric names a response may carry, counts first, then rates.
pub const METRICS: &[&str] = &[
    "sent",
    "delivered",
    "opens",
    "unique_opens",
    "clicks",
    "unique_clicks",
    "bounces",
    "unsubscribes",
    "complaints",
    "delivery_rate",
    "open_rate",
    "click_rate",
    "bounce_rate",
    "unsubscribe_rate",
    "complaint_rate",
];

/// Keeps only known metrics with numeric (or null) values.
pub(crate) fn sanitise_metrics(v: &Value) -> Value {
    let mut out = Map::new();
    for name in METRICS {
        let value = match v.get(*name) {
            Some(n @ Value::Number(_)) => n.clone(),
            _ => Value::Null,
        };
        out.insert((*name).to_owned(), value);
    }
    Value::Object(out)
}

/// Keeps only known coverage entries with known values.
pub(crate) fn sanitise_coverage(v: &Value) -> Value {
    let mut out = Map::new();
    for name in METRICS {
        let value = v
            .get(*name)
            .and_then(Value::as_str)
            .filter(|s| ["provided", "derived", "not_provided"].contains(s))
            .unwrap_or("not_provided");
        out.insert((*name).to_owned(), json!(value));
    }
    Value::Object(out)
}

fn short_string(v: Option<&Value>) -> Value {
    match v.and_then(Value::as_str) {
        Some(s) => json!(s.chars().take(200).collect::<String>()),
        None => Value::Null,
    }
}

/// Campaign rows of a preview, field by field.
pub(crate) fn sanitise_campaigns(v: &Value) -> Value {
    let rows = v.as_array().map(|a| a.as_slice()).unwrap_or_default();
    Value::Array(
        rows.iter()
            .take(50)
            .map(|c| {
                json!({
                    "campaign_id": short_string(c.get("campaign_id")),
                    "name": short_string(c.get("name")),
                    "status": short_string(c.get("status")),
                    "sent_at": short_string(c.get("sent_at")),
                    "metrics": sanitise_metrics(c.get("metrics").unwrap_or(&Value::Null)),
                })
            })
            .collect(),
    )
}

/// Traffic and sales metrics: present, flagged, never invented. This
/// provider knows email engagement only.
pub(crate) fn attribution() -> Value {
    json!({
        "traffic": {
            "requires_external_attribution": true,
            "reason": "website traffic is not reported by the email provider; join with a web analytics source",
            "metrics": { "website_sessions": null, "website_conversions": null }
        },
        "sales": {
            "requires_external_attribution": true,
            "reason": "sales are not reported by the email provider; join with an order or commerce source",
            "metrics": { "revenue": null, "orders": null }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approved() -> Vec<HostPattern> {
        ["*.mailcoach.app", "mail.acme-corp.com"].iter().map(|p| HostPattern::parse(p).unwrap()).collect()
    }

    #[test]
    fn canonical_approved_urls_pass() {
        assert!(validate_base_url("https://mail.acme-corp.com/api", ConnectionMethod::SelfHosted, &approved()).is_ok());
        assert!(
            validate_base_url("https://mail.acme-corp.com:443/api", ConnectionMethod::SelfHosted, &approved()).is_ok()
        );
        assert!(validate_base_url("https://team.mailcoach.app/api", ConnectionMethod::Cloud, &approved()).is_ok());
    }

    #[test]
    fn cloud_needs_the_cloud_domain() {
        let r = validate_base_url("https://mail.acme-corp.com/api", ConnectionMethod::Cloud, &approved()).unwrap_err();
        assert_eq!(r.rule_number, 7);
    }
}
