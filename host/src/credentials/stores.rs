//! Secrets that stay in the operator's own store: a credential may hold a
//! reference (`vault://mount/path#key`, `aws-sm://name#key`, `env://NAME`,
//! `file:///run/secrets/name`) instead of a sealed value. The host reads
//! the value when a request needs it, keeps it for a short while in
//! memory only, and never writes it anywhere.
//!
//! Which stores exist is the operator's setting ([`SecretStoreSettings`]):
//! an OpenBao or HashiCorp Vault server (KV version 2, the server's own
//! token or AppRole login), AWS Secrets Manager (the server's access key,
//! requests signed with SigV4), environment variables the operator lists,
//! files under one directory. A reference to anything else is refused when the
//! credential is made, so an editor cannot point a credential at the
//! server's own environment (its master key) or files.
//!
//! A value read is used for [`SecretStoreSettings::ttl`]; after that the
//! next request reads it again, so a rotation in the store reaches
//! requests within the TTL. A store that cannot be reached is a named,
//! transient failure, and a value past its TTL is never used instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use url::Url;

use crate::config::egress::EgressPolicy;
pub use crate::config::secrets::{AwsSmSettings, SecretStoreSettings, VaultLogin, VaultSettings};
use crate::egress::inject::zero_strings;
use crate::egress::{SecretError, WithoutUrlRef};

/// A secret kept elsewhere, as a credential names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reference {
    /// A key of a KV version 2 secret: `vault://MOUNT/PATH#KEY`.
    Vault { mount: String, path: String, key: String },
    /// A secret of AWS Secrets Manager, or one key of its JSON:
    /// `aws-sm://NAME#KEY`.
    AwsSm { name: String, key: Option<String> },
    /// An environment variable of the server: `env://NAME`.
    Env(String),
    /// A file's contents, trailing newline dropped: `file:///ABSOLUTE/PATH`.
    File(PathBuf),
}

/// Why a reference cannot be used. Each message is safe to show: it names
/// the reference, never a value or the store's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReferenceError {
    #[error("{0}: a secret reference is vault://MOUNT/PATH#KEY, aws-sm://NAME#KEY, env://NAME or file:///PATH")]
    Malformed(String),
    #[error("this server has no {0} secret store configured")]
    NotConfigured(&'static str),
    #[error("the operator does not allow {0}")]
    NotAllowed(String),
    #[error("{0} does not exist")]
    Missing(String),
}

impl Reference {
    pub(crate) fn parse(text: &str) -> Result<Reference, ReferenceError> {
        let malformed = || ReferenceError::Malformed(text.chars().take(200).collect());
        if let Some(rest) = text.strip_prefix("vault://") {
            let (location, key) = rest.split_once('#').ok_or_else(malformed)?;
            let (mount, path) = location.split_once('/').ok_or_else(malformed)?;
            let segment_ok = |s: &str| {
                !s.is_empty()
                    && s != "."
                    && s != ".."
                    && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
            };
            if !segment_ok(mount) || !path.split('/').all(segment_ok) || key.is_empty() || key.len() > 200 {
                return Err(malformed());
            }
            return Ok(Reference::Vault { mount: mount.into(), path: path.into(), key: key.into() });
        }
        if let Some(rest) = text.strip_prefix("aws-sm://") {
            let (name, key) = match rest.split_once('#') {
                Some((name, key)) if !key.is_empty() => (name, Some(key.to_owned())),
                Some(_) => return Err(malformed()),
                None => (rest, None),
            };
            // Secrets Manager's own rule for names, and no `..`.
            if name.is_empty()
                || name.len() > 512
                || name.contains("..")
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || "/_+=.@-".contains(c))
            {
                return Err(malformed());
            }
            return Ok(Reference::AwsSm { name: name.into(), key });
        }
        if let Some(name) = text.strip_prefix("env://") {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(malformed());
            }
            return Ok(Reference::Env(name.into()));
        }
        if text.starts_with("file://") {
            let url = Url::parse(text).map_err(|_| malformed())?;
            if url.host_str().is_some_and(|h| !h.is_empty()) || url.query().is_some() || url.fragment().is_some() {
                return Err(malformed());
            }
            let path = url.to_file_path().map_err(|_| malformed())?;
            return Ok(Reference::File(path));
        }
        Err(malformed())
    }

    /// The reference as written (no value).
    pub(crate) fn text(&self) -> String {
        match self {
            Reference::Vault { mount, path, key } => format!("vault://{mount}/{path}#{key}"),
            Reference::AwsSm { name, key: Some(key) } => format!("aws-sm://{name}#{key}"),
            Reference::AwsSm { name, key: None } => format!("aws-sm://{name}"),
            Reference::Env(name) => format!("env://{name}"),
            Reference::File(path) => format!("file://{}", path.display()),
        }
    }
}

/// What the stores need at run time: the settings, a client, the values
/// read and the store's login token.
pub struct SecretStores {
    settings: SecretStoreSettings,
    /// The client for OpenBao, Vault or AWS, when one is configured.
    client: Option<reqwest::Client>,
    read: Mutex<HashMap<String, (SecretString, Instant)>>,
    vault_token: tokio::sync::Mutex<Option<SecretString>>,
}

/// Whether a value read within the TTL will do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// A value read within the TTL is used again.
    WithinTtl,
    /// The store is read now: the value held was just refused by a
    /// provider (a rotation the TTL has not caught up with).
    Now,
}

/// Why a store may not be reached at `ip`, if it may not: the operator's
/// own network (private, loopback, carrier-grade NAT, unique local) and
/// global addresses are fine; link-local and cloud metadata addresses,
/// and every other special one, are not.
fn store_refusal(ip: std::net::IpAddr) -> Option<&'static str> {
    match crate::egress::address::refusal(ip) {
        None
        | Some(
            "private address" | "loopback address" | "carrier-grade NAT address" | "unique local (private) address",
        ) => None,
        Some(why) => Some(why),
    }
}

/// Resolves a store's name: the operator's pin, else the system's
/// resolver, every address checked by [`store_refusal`].
struct StoreAddresses {
    pinned: HashMap<String, Vec<std::net::SocketAddr>>,
}

impl reqwest::dns::Resolve for StoreAddresses {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let pinned = self.pinned.get(name.as_str()).cloned();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addresses: Vec<std::net::SocketAddr> = match pinned {
                Some(pinned) => pinned,
                None => tokio::net::lookup_host((host.as_str(), 0)).await?.collect(),
            };
            if let Some(why) = addresses.iter().find_map(|a| store_refusal(a.ip())) {
                tracing::warn!(%host, "a secret store's name resolves to a {why}; not connecting");
                return Err(format!("the secret store's name resolves to a {why}").into());
            }
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The largest file a `file://` reference may name.
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// How long a request to a store may take.
const STORE_TIMEOUT: Duration = Duration::from_secs(10);

impl SecretStores {
    /// The stores `settings` configure, reached with no pins or extra
    /// roots.
    pub fn new(settings: SecretStoreSettings) -> anyhow::Result<Self> {
        Self::reaching(settings, &EgressPolicy::default())
    }

    /// The stores `settings` configure, reached under the operator's reach
    /// rules: the names it pinned (`SERVICE_EGRESS_RESOLVE`) go to their
    /// addresses, the roots it added (`SERVICE_EGRESS_EXTRA_ROOTS`) are
    /// trusted, no redirect is followed and no proxy used; and whatever a
    /// store's name resolves to, the store is reached only at a global,
    /// private or loopback address (never a link-local or cloud metadata
    /// one, nor any other special address), checked at every connection.
    pub fn reaching(settings: SecretStoreSettings, egress: &EgressPolicy) -> anyhow::Result<Self> {
        for address in settings.vault.iter().map(|v| &v.address).chain(settings.aws_sm.iter().map(|a| &a.endpoint)) {
            let literal = match address.host() {
                Some(url::Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
                Some(url::Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
                _ => None,
            };
            if let Some(why) = literal.and_then(store_refusal) {
                anyhow::bail!("the secret store's address {address} is a {why}, which no store is reached at");
            }
        }
        let client = match (&settings.vault, &settings.aws_sm) {
            (None, None) => None,
            _ => {
                // The process's TLS provider, when nothing installed one yet.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let mut builder = reqwest::Client::builder()
                    .timeout(STORE_TIMEOUT)
                    .redirect(reqwest::redirect::Policy::none())
                    .no_proxy()
                    .dns_resolver(std::sync::Arc::new(StoreAddresses { pinned: egress.pinned.clone() }));
                if !egress.extra_roots.is_empty() {
                    builder = builder.tls_certs_merge(egress.extra_roots.iter().cloned());
                }
                Some(builder.build()?)
            }
        };
        Ok(SecretStores {
            settings,
            client,
            read: Mutex::new(HashMap::new()),
            vault_token: tokio::sync::Mutex::new(None),
        })
    }

    /// Whether the operator lets a credential of `workspace_id` name
    /// `reference`: its store is configured, and the name is one the
    /// workspace may use. A store path or file is the workspace's own
    /// (`vault://MOUNT/workspaces/WORKSPACE/…`, `FILE_DIR/WORKSPACE/…`),
    /// so one workspace's editor cannot bind another's secret to a host of
    /// their choosing; an environment variable is the operator's list,
    /// shared by every workspace.
    pub(crate) fn allows(&self, workspace_id: &str, reference: &Reference) -> Result<(), ReferenceError> {
        match reference {
            Reference::Vault { .. } if self.settings.vault.is_none() => Err(ReferenceError::NotConfigured("vault")),
            Reference::Vault { path, .. } if workspaces_own(workspace_id, path) => Ok(()),
            Reference::Vault { mount, path, .. } => Err(ReferenceError::NotAllowed(format!(
                "{mount}/{path}: this workspace's secrets are under {mount}/workspaces/{workspace_id}/"
            ))),
            Reference::AwsSm { .. } if self.settings.aws_sm.is_none() => Err(ReferenceError::NotConfigured("aws-sm")),
            Reference::AwsSm { name, .. } if workspaces_own(workspace_id, name) => Ok(()),
            Reference::AwsSm { name, .. } => Err(ReferenceError::NotAllowed(format!(
                "{name}: this workspace's secrets are named workspaces/{workspace_id}/…"
            ))),
            Reference::Env(name) => {
                let listed = self.settings.env_allow.iter().any(|allowed| match allowed.strip_suffix('*') {
                    Some(prefix) => name.starts_with(prefix),
                    None => allowed == name,
                });
                if self.settings.env_allow.is_empty() {
                    Err(ReferenceError::NotConfigured("env"))
                } else if name.starts_with("SERVICE_") || !listed {
                    Err(ReferenceError::NotAllowed(format!("environment variable {name}")))
                } else {
                    Ok(())
                }
            }
            Reference::File(path) => {
                let Some(dir) = &self.settings.file_dir else { return Err(ReferenceError::NotConfigured("file")) };
                let own = dir.join(workspace_id);
                if within(&own, path) {
                    Ok(())
                } else {
                    Err(ReferenceError::NotAllowed(format!(
                        "{}: this workspace's files are under {}",
                        path.display(),
                        own.display()
                    )))
                }
            }
        }
    }

    /// The value behind `reference`, read from its store unless read
    /// within the TTL, and whether it was read now.
    pub(crate) async fn resolve(
        &self,
        workspace_id: &str,
        reference: &Reference,
    ) -> Result<(SecretString, bool), SecretError> {
        self.resolve_as(workspace_id, reference, Freshness::WithinTtl).await
    }

    /// [`SecretStores::resolve`], or read from the store whatever the TTL
    /// says ([`Freshness::Now`]: a provider just refused the value held).
    pub(crate) async fn resolve_as(
        &self,
        workspace_id: &str,
        reference: &Reference,
        freshness: Freshness,
    ) -> Result<(SecretString, bool), SecretError> {
        self.allows(workspace_id, reference).map_err(|e| SecretError::Reference(e.to_string()))?;
        let key = reference.text();
        let now = Instant::now();
        {
            let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
            read.retain(|_, (_, at)| now.duration_since(*at) < self.settings.ttl);
            if let (Some((value, _)), Freshness::WithinTtl) = (read.get(&key), freshness) {
                return Ok((value.clone(), false));
            }
        }
        let value = match reference {
            Reference::Env(name) => std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .map(SecretString::from)
                .ok_or_else(|| missing(reference))?,
            Reference::File(path) => {
                // A secret is small: a file that is not (or not a file)
                // is refused rather than read whole.
                let meta = tokio::fs::metadata(path).await.map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => missing(reference),
                    _ => SecretError::SecretStoreUnavailable("file"),
                })?;
                if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
                    return Err(SecretError::Reference(format!(
                        "{} is not a file of at most {MAX_FILE_BYTES} bytes",
                        reference.text()
                    )));
                }
                let text = tokio::fs::read_to_string(path).await.map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => missing(reference),
                    _ => SecretError::SecretStoreUnavailable("file"),
                })?;
                // A file written by `echo` ends in a newline the secret lacks.
                let value = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
                if value.is_empty() {
                    return Err(missing(reference));
                }
                SecretString::from(value.to_owned())
            }
            Reference::Vault { mount, path, key } => self.vault_read(reference, mount, path, key).await?,
            Reference::AwsSm { name, key } => self.aws_sm_read(reference, name, key.as_deref()).await?,
        };
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        read.insert(key, (value.clone(), Instant::now()));
        Ok((value, true))
    }

    /// A key of a KV v2 secret, logging in first (and again once, when the
    /// store says the token is no longer good).
    async fn vault_read(
        &self,
        reference: &Reference,
        mount: &str,
        path: &str,
        key: &str,
    ) -> Result<SecretString, SecretError> {
        let (Some(vault), Some(client)) = (self.settings.vault.as_ref(), self.client.as_ref()) else {
            return Err(SecretError::SecretStoreUnavailable("vault"));
        };
        let url = vault
            .address
            .join(&format!("v1/{mount}/data/{path}"))
            .map_err(|_| SecretError::Reference(ReferenceError::Malformed(reference.text()).to_string()))?;
        for attempt in 0..2 {
            let token = self.vault_token(client, vault, attempt > 0).await?;
            let answer = client
                .get(url.clone())
                .header("x-vault-token", token.expose_secret())
                .send()
                .await
                .map_err(|e| unavailable("vault", &e))?;
            let status = answer.status().as_u16();
            if status == 403 && attempt == 0 && matches!(vault.login, VaultLogin::AppRole { .. }) {
                continue;
            }
            if status == 404 {
                return Err(missing(reference));
            }
            if status != 200 {
                tracing::warn!(status, store = "vault", "the secret store refused a read");
                return Err(match status {
                    403 => SecretError::Reference("the secret store refused the server's token for this path".into()),
                    _ => SecretError::SecretStoreUnavailable("vault"),
                });
            }
            let mut body: Value = answer.json().await.map_err(|e| unavailable("vault", &e))?;
            let value = body["data"]["data"][key].as_str().map(|s| SecretString::from(s.to_owned()));
            // The answer held every key of the secret.
            zero_strings(&mut body);
            return value.filter(|v| !v.expose_secret().is_empty()).ok_or_else(|| missing(reference));
        }
        Err(SecretError::SecretStoreUnavailable("vault"))
    }

    /// A secret of AWS Secrets Manager (`GetSecretValue`), or one key of
    /// its JSON, with a request signed by the server's access key.
    async fn aws_sm_read(
        &self,
        reference: &Reference,
        name: &str,
        key: Option<&str>,
    ) -> Result<SecretString, SecretError> {
        use crate::egress::sigv4::{self, AccessKey};
        let (Some(aws), Some(client)) = (self.settings.aws_sm.as_ref(), self.client.as_ref()) else {
            return Err(SecretError::SecretStoreUnavailable("aws-sm"));
        };
        let body = serde_json::to_vec(&serde_json::json!({ "SecretId": name })).unwrap_or_default();
        let access = AccessKey {
            access_key_id: aws.access_key_id.clone(),
            secret_access_key: aws.secret_access_key.clone(),
            region: aws.region.clone(),
            service: "secretsmanager",
        };
        let (content_type, target) = ("application/x-amz-json-1.1", "secretsmanager.GetSecretValue");
        let signed = sigv4::sign(
            &access,
            "POST",
            &aws.endpoint,
            &[("content-type", content_type), ("x-amz-target", target)],
            &sigv4::payload_sha256(&body),
            chrono::Utc::now(),
        );
        let mut request =
            client.post(aws.endpoint.clone()).header("content-type", content_type).header("x-amz-target", target);
        for (header, value) in signed {
            request = request.header(header, value);
        }
        let answer = request.body(body).send().await.map_err(|e| unavailable("aws-sm", &e))?;
        let status = answer.status().as_u16();
        let mut body: Value = answer.json().await.map_err(|e| unavailable("aws-sm", &e))?;
        if status != 200 {
            let kind = body["__type"].as_str().unwrap_or_default().rsplit('#').next().unwrap_or_default().to_owned();
            zero_strings(&mut body);
            tracing::warn!(status, kind = %kind, store = "aws-sm", "the secret store refused a read");
            return Err(match kind.as_str() {
                "ResourceNotFoundException" => missing(reference),
                "AccessDeniedException" | "UnrecognizedClientException" | "InvalidSignatureException" => {
                    SecretError::Reference("the secret store refused the server's access key for this secret".into())
                }
                _ => SecretError::SecretStoreUnavailable("aws-sm"),
            });
        }
        let whole = body["SecretString"].as_str().map(str::to_owned);
        zero_strings(&mut body);
        let mut whole = whole.ok_or_else(|| missing(reference))?;
        let value = match key {
            None => Some(whole.clone()),
            Some(key) => {
                let mut json: Value = serde_json::from_str(&whole).unwrap_or_default();
                let value = json[key].as_str().map(str::to_owned);
                zero_strings(&mut json);
                value
            }
        };
        zeroize::Zeroize::zeroize(&mut whole);
        value.filter(|v| !v.is_empty()).map(SecretString::from).ok_or_else(|| missing(reference))
    }

    /// The token the server reads with: the configured one, or an AppRole
    /// login's (kept until the store refuses it).
    async fn vault_token(
        &self,
        client: &reqwest::Client,
        vault: &VaultSettings,
        renew: bool,
    ) -> Result<SecretString, SecretError> {
        let (role_id, secret_id) = match &vault.login {
            VaultLogin::Token(token) => return Ok(token.clone()),
            VaultLogin::AppRole { role_id, secret_id } => (role_id, secret_id),
        };
        let mut cached = self.vault_token.lock().await;
        if let (Some(token), false) = (cached.as_ref(), renew) {
            return Ok(token.clone());
        }
        let url =
            vault.address.join("v1/auth/approle/login").map_err(|_| SecretError::SecretStoreUnavailable("vault"))?;
        let answer = client
            .post(url)
            .json(&serde_json::json!({ "role_id": role_id, "secret_id": secret_id.expose_secret() }))
            .send()
            .await
            .map_err(|e| unavailable("vault", &e))?;
        if !answer.status().is_success() {
            tracing::warn!(status = answer.status().as_u16(), "the secret store refused the server's AppRole login");
            return Err(SecretError::Reference("the secret store refused the server's login".into()));
        }
        let mut body: Value = answer.json().await.map_err(|e| unavailable("vault", &e))?;
        let token = body["auth"]["client_token"].as_str().map(|t| SecretString::from(t.to_owned()));
        zero_strings(&mut body);
        let token = token.ok_or(SecretError::SecretStoreUnavailable("vault"))?;
        *cached = Some(token.clone());
        Ok(token)
    }
}

/// Whether a store path or secret name lies below
/// `workspaces/<workspace_id>/`.
fn workspaces_own(workspace_id: &str, name: &str) -> bool {
    name.strip_prefix("workspaces/")
        .and_then(|p| p.strip_prefix(workspace_id))
        .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
}

fn missing(reference: &Reference) -> SecretError {
    SecretError::Reference(ReferenceError::Missing(reference.text()).to_string())
}

fn unavailable(store: &'static str, e: &reqwest::Error) -> SecretError {
    tracing::warn!(store, error = %e.without_url_ref(), "a secret store could not be reached");
    SecretError::SecretStoreUnavailable(store)
}

/// Whether `path` lies in `dir` once both are resolved (no `..` or link
/// leads out of it).
fn within(dir: &Path, path: &Path) -> bool {
    match (dir.canonicalize(), path.canonicalize()) {
        (Ok(dir), Ok(path)) => path.starts_with(&dir) && path != dir,
        // A file that does not exist yet: judged by its parent.
        (Ok(dir), Err(_)) => path
            .parent()
            .and_then(|p| p.canonicalize().ok())
            .is_some_and(|parent| parent.starts_with(&dir) && path.file_name().is_some()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_store_is_reached_in_the_operators_network_and_never_at_a_metadata_address() {
        use reqwest::dns::Resolve;
        for (ip, allowed) in [
            ("10.1.2.3", true),
            ("127.0.0.1", true),
            ("8.8.8.8", true),
            ("fd00::1", true),
            ("169.254.169.254", false),
            ("fe80::1", false),
            ("0.0.0.0", false),
            ("224.0.0.1", false),
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(store_refusal(ip).is_none(), allowed, "{ip}");
            let resolver = StoreAddresses {
                pinned: HashMap::from([("vault.test".to_owned(), vec![std::net::SocketAddr::new(ip, 443)])]),
            };
            let resolved = resolver.resolve("vault.test".parse().unwrap()).await;
            assert_eq!(resolved.is_ok(), allowed, "{ip}");
        }
        let at_metadata = SecretStoreSettings {
            vault: Some(VaultSettings {
                address: Url::parse("https://169.254.169.254/").unwrap(),
                login: VaultLogin::Token("t".to_owned().into()),
            }),
            ..Default::default()
        };
        assert!(SecretStores::new(at_metadata).is_err());
    }

    #[test]
    fn references_parse_and_read_back() {
        for text in [
            "vault://secret/apps/crm#api_key",
            "aws-sm://workspaces/ws_a/crm#api_key",
            "aws-sm://plain-name",
            "env://CRM_KEY",
            "file:///run/secrets/crm",
        ] {
            assert_eq!(Reference::parse(text).unwrap().text(), text);
        }
        for bad in [
            "vault://secret#key",
            "vault://secret/../x#key",
            "vault://secret/a",
            "env://A-B",
            "env://",
            "file://host/x",
            "file:///x?y",
            "aws-sm://a/../b#key",
            "aws-sm://name#",
            "https://x",
        ] {
            assert!(matches!(Reference::parse(bad), Err(ReferenceError::Malformed(_))), "{bad}");
        }
    }

    #[test]
    fn only_what_the_operator_lists_is_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let stores = SecretStores::new(SecretStoreSettings {
            env_allow: vec!["CRM_KEY".into(), "APP_*".into(), "SERVICE_*".into()],
            file_dir: Some(dir.path().to_owned()),
            ..Default::default()
        })
        .unwrap();
        let allows = |text: &str| stores.allows("ws_a", &Reference::parse(text).unwrap());
        assert_eq!(allows("env://CRM_KEY"), Ok(()));
        assert_eq!(allows("env://APP_TOKEN"), Ok(()));
        assert!(matches!(allows("env://SERVICE_MASTER_KEY"), Err(ReferenceError::NotAllowed(_))));
        assert!(matches!(allows("env://HOME"), Err(ReferenceError::NotAllowed(_))));
        assert_eq!(allows("vault://secret/workspaces/ws_a/crm#b"), Err(ReferenceError::NotConfigured("vault")));
        std::fs::create_dir_all(dir.path().join("ws_a")).unwrap();
        std::fs::create_dir_all(dir.path().join("ws_b")).unwrap();
        let inside = format!("file://{}/ws_a/crm", dir.path().display());
        assert_eq!(allows(&inside), Ok(()));
        for outside in [
            format!("file://{}/ws_b/crm", dir.path().display()),
            format!("file://{}/crm", dir.path().display()),
            format!("file://{}/ws_a/../ws_b/crm", dir.path().display()),
            "file:///etc/passwd".to_owned(),
        ] {
            assert!(matches!(allows(&outside), Err(ReferenceError::NotAllowed(_))), "{outside}");
        }
    }

    #[test]
    fn a_vault_path_is_the_workspaces_own() {
        let stores = SecretStores::new(SecretStoreSettings {
            vault: Some(VaultSettings {
                address: Url::parse("http://127.0.0.1:8200/").unwrap(),
                login: VaultLogin::Token(SecretString::from("t".to_owned())),
            }),
            ..Default::default()
        })
        .unwrap();
        let allows = |text: &str| stores.allows("ws_a", &Reference::parse(text).unwrap());
        assert_eq!(allows("vault://secret/workspaces/ws_a/crm#key"), Ok(()));
        for other in [
            "vault://secret/workspaces/ws_b/crm#key",
            "vault://secret/workspaces/ws_ab/crm#key",
            "vault://secret/workspaces/ws_a#key",
            "vault://secret/crm#key",
        ] {
            assert!(matches!(allows(other), Err(ReferenceError::NotAllowed(_))), "{other}");
        }
    }
}
