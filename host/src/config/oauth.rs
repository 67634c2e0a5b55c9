//! The operator's OAuth clients: one per connector that uses OAuth
//! (`SERVICE_OAUTH_CLIENTS`) and the task app's provider
//! (`SERVICE_TASKAPP_OAUTH`). Client ids and secrets always come from here,
//! never from callers.

use std::collections::HashMap;

use secrecy::SecretString;
use serde::Deserialize;
use url::Url;

use super::ConfigError;

/// An OAuth client registered with a provider by the operator.
///
/// A connector that declares no OAuth endpoints of its own (the REST
/// manifest source, which reads whatever API its manifest names) gets
/// them here: the operator names the provider's endpoints and the API
/// hosts its tokens may be sent to (`hosts`, required with endpoints).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthClient {
    pub client_id: String,
    pub client_secret: SecretString,
    #[serde(default)]
    pub authorize_url: Option<String>,
    #[serde(default)]
    pub token_url: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub hosts: Vec<String>,
}

impl OAuthClient {
    /// A client with no endpoints of its own (the connector declares them).
    pub fn new(client_id: String, client_secret: SecretString) -> Self {
        OAuthClient {
            client_id,
            client_secret,
            authorize_url: None,
            token_url: None,
            scopes: Vec::new(),
            hosts: Vec::new(),
        }
    }

    /// The provider the operator named: (authorize URL, token URL), if any.
    pub fn endpoints(&self) -> Option<(&str, &str)> {
        Some((self.authorize_url.as_deref()?, self.token_url.as_deref()?))
    }

    /// Endpoints both or neither, https, and with the hosts tokens go to.
    fn check(&self, connector_id: &str) -> Result<(), ConfigError> {
        let refuse = |message: String| ConfigError::new("SERVICE_OAUTH_CLIENTS", format!("{connector_id}: {message}"));
        if self.authorize_url.is_none() && self.token_url.is_none() {
            return Ok(());
        }
        for (name, u) in [("authorize_url", &self.authorize_url), ("token_url", &self.token_url)] {
            match u {
                Some(u) if Url::parse(u).is_ok_and(|u| u.scheme() == "https") => {}
                Some(_) => return Err(refuse(format!("{name} must be an https URL"))),
                None => return Err(refuse(format!("{name} is needed with the other endpoint"))),
            }
        }
        if self.hosts.is_empty() {
            return Err(refuse("hosts must name the API hosts the provider's tokens may be sent to".into()));
        }
        for host in &self.hosts {
            // A token is bound to exact names only.
            if !matches!(super::egress::HostPattern::parse(host), Ok(super::egress::HostPattern::Exact(_))) {
                return Err(refuse(format!("{host:?} is not an exact host name")));
            }
        }
        Ok(())
    }
}

/// The task-management provider's OAuth settings.
#[derive(Clone, Deserialize)]
pub struct TaskAppOAuth {
    pub authorize_url: String,
    pub token_url: String,
    #[serde(default)]
    pub scopes: Vec<String>,
    pub client_id: String,
    pub client_secret: SecretString,
}

/// Operator OAuth configuration.
#[derive(Clone, Default)]
pub struct OAuthSettings {
    /// Clients per connector id (`SERVICE_OAUTH_CLIENTS`).
    pub clients: HashMap<String, OAuthClient>,
    /// The task app (`SERVICE_TASKAPP_OAUTH`).
    pub taskapp: Option<TaskAppOAuth>,
}

impl std::fmt::Debug for OAuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthSettings")
            .field("clients", &self.clients.keys().collect::<Vec<_>>())
            .field("taskapp", &self.taskapp.is_some())
            .finish()
    }
}

impl OAuthSettings {
    /// Parses the two JSON settings.
    pub fn from_settings(clients: Option<&str>, taskapp: Option<&str>) -> Result<Self, ConfigError> {
        let clients = match clients.filter(|s| !s.trim().is_empty()) {
            Some(s) => serde_json::from_str(s).map_err(|e| {
                ConfigError::new(
                    "SERVICE_OAUTH_CLIENTS",
                    format!("not a JSON object of {{connector_id: {{client_id, client_secret}}}}: {e}"),
                )
            })?,
            None => HashMap::new(),
        };
        let taskapp: Option<TaskAppOAuth> = match taskapp.filter(|s| !s.trim().is_empty()) {
            Some(s) => Some(serde_json::from_str(s).map_err(|e| {
                ConfigError::new(
                    "SERVICE_TASKAPP_OAUTH",
                    format!("not a JSON object with authorize_url, token_url, client_id, client_secret: {e}"),
                )
            })?),
            None => None,
        };
        let clients: HashMap<String, OAuthClient> = clients;
        for (connector_id, client) in &clients {
            client.check(connector_id)?;
        }
        if let Some(t) = &taskapp {
            for (name, u) in [("authorize_url", &t.authorize_url), ("token_url", &t.token_url)] {
                if !Url::parse(u).is_ok_and(|u| u.scheme() == "https") {
                    return Err(ConfigError::new("SERVICE_TASKAPP_OAUTH", format!("{name} must be an https URL")));
                }
            }
        }
        Ok(OAuthSettings { clients, taskapp })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(clients: &str) -> String {
        OAuthSettings::from_settings(Some(clients), None).unwrap_err().to_string()
    }

    #[test]
    fn an_operator_named_provider_needs_both_https_endpoints_and_the_hosts_tokens_go_to() {
        let ok = r#"{"conn_rest_manifest": {"client_id": "c", "client_secret": "s",
            "authorize_url": "https://auth.example.com/a", "token_url": "https://auth.example.com/t", "hosts": ["api.example.com"]}}"#;
        let settings = OAuthSettings::from_settings(Some(ok), None).unwrap();
        let client = &settings.clients["conn_rest_manifest"];
        assert_eq!(client.endpoints(), Some(("https://auth.example.com/a", "https://auth.example.com/t")));

        let plain = r#"{"x": {"client_id": "c", "client_secret": "s"}}"#;
        assert_eq!(OAuthSettings::from_settings(Some(plain), None).unwrap().clients["x"].endpoints(), None);

        let one = r#"{"x": {"client_id": "c", "client_secret": "s", "token_url": "https://a.example.com/t", "hosts": ["a.example.com"]}}"#;
        assert!(refusal(one).contains("authorize_url is needed"), "{}", refusal(one));
        let http = r#"{"x": {"client_id": "c", "client_secret": "s", "authorize_url": "http://a.example.com/a",
            "token_url": "https://a.example.com/t", "hosts": ["a.example.com"]}}"#;
        assert!(refusal(http).contains("authorize_url must be an https URL"));
        let hostless = r#"{"x": {"client_id": "c", "client_secret": "s", "authorize_url": "https://a.example.com/a",
            "token_url": "https://a.example.com/t"}}"#;
        assert!(refusal(hostless).contains("hosts must name"));
        let anywhere = r#"{"x": {"client_id": "c", "client_secret": "s", "authorize_url": "https://a.example.com/a",
            "token_url": "https://a.example.com/t", "hosts": ["*"]}}"#;
        assert!(refusal(anywhere).contains("is not an exact host name"));
        let pattern = anywhere.replace(r#"["*"]"#, r#"["*.example.com"]"#);
        assert!(refusal(&pattern).contains("is not an exact host name"));
        let typo = r#"{"x": {"client_id": "c", "client_secret": "s", "token_uri": "https://a.example.com/t"}}"#;
        assert!(refusal(typo).contains("token_uri"), "an unknown field is named");
    }
}
