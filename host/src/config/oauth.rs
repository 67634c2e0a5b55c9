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
#[derive(Clone, Deserialize)]
pub struct OAuthClient {
    pub client_id: String,
    pub client_secret: SecretString,
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
