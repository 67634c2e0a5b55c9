//! The operator's secret stores, where credentials that hold a reference
//! find their secrets (`credentials::stores` reads them).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use secrecy::SecretString;
use url::Url;

use super::ConfigError;

/// Flags and environment of the secret stores.
#[derive(Debug, Clone, Args)]
pub struct SecretStoreArgs {
    /// An OpenBao or HashiCorp Vault server credentials may name secrets
    /// in (`vault://MOUNT/workspaces/WORKSPACE/PATH#KEY`, KV version 2):
    /// `https://vault.internal:8200` (plain `http` only on loopback).
    #[arg(long, env = "SERVICE_VAULT_ADDR")]
    pub vault_addr: Option<Url>,
    /// The server's token at the store.
    #[arg(long, env = "SERVICE_VAULT_TOKEN", hide_env_values = true, value_parser = super::secret)]
    pub vault_token: Option<SecretString>,
    /// Or an AppRole the server logs in with: its role id ...
    #[arg(long, env = "SERVICE_VAULT_ROLE_ID")]
    pub vault_role_id: Option<String>,
    /// ... and its secret id.
    #[arg(long, env = "SERVICE_VAULT_SECRET_ID", hide_env_values = true, value_parser = super::secret)]
    pub vault_secret_id: Option<SecretString>,
    /// An AWS Secrets Manager endpoint credentials may name secrets in
    /// (`aws-sm://workspaces/WORKSPACE/NAME#KEY`), e.g.
    /// `https://secretsmanager.eu-west-1.amazonaws.com` (plain `http` only
    /// on loopback).
    #[arg(long, env = "SERVICE_AWS_SM_ENDPOINT")]
    pub aws_sm_endpoint: Option<Url>,
    /// Its region.
    #[arg(long, env = "SERVICE_AWS_SM_REGION", default_value = "us-east-1")]
    pub aws_sm_region: String,
    /// The server's access key there: its id ...
    #[arg(long, env = "SERVICE_AWS_SM_ACCESS_KEY_ID")]
    pub aws_sm_access_key_id: Option<String>,
    /// ... and its secret.
    #[arg(long, env = "SERVICE_AWS_SM_SECRET_ACCESS_KEY", hide_env_values = true, value_parser = super::secret)]
    pub aws_sm_secret_access_key: Option<SecretString>,
    /// Environment variables credentials may name (`env://NAME`),
    /// comma-separated names or prefixes ending in `*`; every workspace
    /// may name them. The server's own `SERVICE_*` never.
    #[arg(long, env = "SERVICE_SECRET_ENV_ALLOW", default_value = "")]
    pub secret_env_allow: String,
    /// A directory whose `WORKSPACE/` subdirectories hold files credentials
    /// of that workspace may name (`file:///…`).
    #[arg(long, env = "SERVICE_SECRET_FILE_DIR")]
    pub secret_file_dir: Option<PathBuf>,
    /// Seconds a secret read from a store is used before it is read again
    /// (a rotation reaches requests within this time).
    #[arg(long, env = "SERVICE_SECRET_REFERENCE_TTL_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub secret_reference_ttl_secs: u64,
}

/// The operator's secret stores.
#[derive(Debug, Clone)]
pub struct SecretStoreSettings {
    /// An OpenBao or Vault server.
    pub vault: Option<VaultSettings>,
    /// An AWS Secrets Manager endpoint.
    pub aws_sm: Option<AwsSmSettings>,
    /// Environment variables references may name: names, or prefixes
    /// ending in `*`.
    pub env_allow: Vec<String>,
    /// The directory whose per-workspace subdirectories file references
    /// must lie in.
    pub file_dir: Option<PathBuf>,
    /// How long a value read is used.
    pub ttl: Duration,
}

impl Default for SecretStoreSettings {
    /// No store: every reference is refused.
    fn default() -> Self {
        SecretStoreSettings {
            vault: None,
            aws_sm: None,
            env_allow: Vec::new(),
            file_dir: None,
            ttl: Duration::from_secs(60),
        }
    }
}

/// How the server reaches and logs in to OpenBao or Vault.
#[derive(Debug, Clone)]
pub struct VaultSettings {
    /// `http(s)://host:port`, the API under `/v1/`.
    pub address: Url,
    pub login: VaultLogin,
}

/// How the server reaches AWS Secrets Manager.
#[derive(Debug, Clone)]
pub struct AwsSmSettings {
    pub endpoint: Url,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: SecretString,
}

/// Whether `url` is https, or http on a loopback address.
fn https_or_loopback(url: &Url) -> bool {
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    url.scheme() == "https" || (url.scheme() == "http" && loopback)
}

/// The server's own identity at the store.
#[derive(Debug, Clone)]
pub enum VaultLogin {
    /// A token.
    Token(SecretString),
    /// AppRole.
    AppRole { role_id: String, secret_id: SecretString },
}

impl SecretStoreArgs {
    pub(crate) fn resolve(&self) -> Result<SecretStoreSettings, ConfigError> {
        let vault = match &self.vault_addr {
            None => None,
            Some(address) => {
                if !https_or_loopback(address) {
                    return Err(ConfigError::new(
                        "SERVICE_VAULT_ADDR",
                        "must be an https:// URL (http:// only on a loopback address)",
                    ));
                }
                let login = match (&self.vault_token, &self.vault_role_id, &self.vault_secret_id) {
                    (Some(token), None, None) => VaultLogin::Token(token.clone()),
                    (None, Some(role_id), Some(secret_id)) => {
                        VaultLogin::AppRole { role_id: role_id.clone(), secret_id: secret_id.clone() }
                    }
                    _ => {
                        return Err(ConfigError::new(
                            "SERVICE_VAULT_TOKEN",
                            "with SERVICE_VAULT_ADDR, set either SERVICE_VAULT_TOKEN or both SERVICE_VAULT_ROLE_ID and SERVICE_VAULT_SECRET_ID",
                        ));
                    }
                };
                let mut address = address.clone();
                if !address.path().ends_with('/') {
                    let path = format!("{}/", address.path());
                    address.set_path(&path);
                }
                Some(VaultSettings { address, login })
            }
        };
        let aws_sm = match (&self.aws_sm_endpoint, &self.aws_sm_access_key_id, &self.aws_sm_secret_access_key) {
            (None, _, _) => None,
            (Some(endpoint), Some(id), Some(secret)) if https_or_loopback(endpoint) => Some(AwsSmSettings {
                endpoint: endpoint.clone(),
                region: self.aws_sm_region.clone(),
                access_key_id: id.clone(),
                secret_access_key: secret.clone(),
            }),
            (Some(_), Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "SERVICE_AWS_SM_ENDPOINT",
                    "must be an https:// URL (http:// only on a loopback address)",
                ));
            }
            _ => {
                return Err(ConfigError::new(
                    "SERVICE_AWS_SM_ACCESS_KEY_ID",
                    "with SERVICE_AWS_SM_ENDPOINT, set SERVICE_AWS_SM_ACCESS_KEY_ID and SERVICE_AWS_SM_SECRET_ACCESS_KEY",
                ));
            }
        };
        let env_allow: Vec<String> =
            self.secret_env_allow.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned).collect();
        if let Some(bad) = env_allow.iter().find(|n| n.starts_with("SERVICE_") || *n == "*") {
            return Err(ConfigError::new(
                "SERVICE_SECRET_ENV_ALLOW",
                format!("{bad} would let credentials read the server's own settings"),
            ));
        }
        Ok(SecretStoreSettings {
            vault,
            aws_sm,
            env_allow,
            file_dir: self.secret_file_dir.clone(),
            ttl: Duration::from_secs(self.secret_reference_ttl_secs),
        })
    }
}
