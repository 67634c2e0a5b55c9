//! The vault: creates credentials, hands a secret out only to the egress
//! layer (for one workspace, connector and bound host at a time), checks
//! handles for the operations that name one, and rotates the master key.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use zeroize::Zeroizing;

use super::exchange::{ExchangeError, Obtained, TokenExchange};
use super::keyring::{self, Keyring};
use super::stores::{Freshness, Reference, SecretStoreSettings, SecretStores};
pub(crate) use crate::egress::SecretError;
use crate::egress::{HostPattern, Injection, Placement, SecretSource};
use crate::store::credentials::{CredentialHandle, CredentialRecord, NewCredential, Sealed};
use crate::store::kinds::{CredentialKind, CredentialStatus};
use crate::store::{Store, new_id, now_ms};

/// How often `last_used_at` of a credential is refreshed.
const TOUCH_INTERVAL_MS: i64 = 60_000;

/// The secret part of a credential.
pub struct SecretMaterial {
    /// The token, key or password the provider expects.
    pub secret: SecretString,
    /// OAuth refresh token, when there is one.
    pub refresh_token: Option<SecretString>,
}

impl SecretMaterial {
    pub fn new(secret: SecretString) -> Self {
        SecretMaterial { secret, refresh_token: None }
    }

    fn to_plaintext(&self) -> Zeroizing<Vec<u8>> {
        let mut v = json!({ "secret": self.secret.expose_secret() });
        if let Some(r) = &self.refresh_token {
            v["refresh_token"] = json!(r.expose_secret());
        }
        let bytes = Zeroizing::new(serde_json::to_vec(&v).unwrap_or_default());
        // The Value held copies of the secrets; scrub them.
        if let Value::Object(mut map) = v {
            for (_, val) in map.iter_mut() {
                if let Value::String(s) = val {
                    zeroize::Zeroize::zeroize(s);
                }
            }
        }
        bytes
    }

    fn from_plaintext(bytes: &[u8]) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct Raw {
            secret: SecretString,
            refresh_token: Option<SecretString>,
        }
        let raw: Raw = serde_json::from_slice(bytes).ok()?;
        Some(SecretMaterial { secret: raw.secret, refresh_token: raw.refresh_token })
    }
}

/// A credential to create.
pub struct NewSecret<'a> {
    pub workspace_id: &'a str,
    pub created_by: &'a str,
    pub kind: CredentialKind,
    pub connector_id: Option<&'a str>,
    pub label: Option<&'a str>,
    /// Exact host names the secret may be sent to.
    pub hosts: Vec<String>,
    pub metadata: Value,
    pub material: SecretMaterial,
    /// `active`, or `pending_approval` until the gate lets it through.
    pub status: CredentialStatus,
    pub access_expires_at: Option<i64>,
}

/// Why a handle cannot be used where it was given.
#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    #[error("credential_handle names no credential of this workspace")]
    Unknown,
    #[error("the credential is not bound to {0}")]
    NotBoundTo(String),
    #[error(transparent)]
    Store(crate::store::StoreError),
}

impl HandleError {
    /// The client error for the request field that carried the handle.
    pub fn at(self, field: &str) -> crate::error::ApiError {
        use crate::error::ApiError;
        use serde_json::json;
        match self {
            HandleError::Unknown => {
                ApiError::bad_request("UNKNOWN_CREDENTIAL_HANDLE", HandleError::Unknown.to_string())
                    .with_details(json!({ "field": field }))
            }
            HandleError::NotBoundTo(host) => {
                ApiError::bad_request("CREDENTIAL_HOST_MISMATCH", format!("the credential is not bound to {host}"))
                    .with_details(json!({ "field": field, "host": host }))
            }
            HandleError::Store(e) => e.into(),
        }
    }
}

/// A credential's bound hosts, as a check.
pub(crate) trait BoundHosts {
    /// Fails unless the credential may be sent to `host`.
    fn require_host(&self, host: &str) -> Result<(), HandleError>;
}

impl BoundHosts for CredentialRecord {
    fn require_host(&self, host: &str) -> Result<(), HandleError> {
        if self.hosts.iter().any(|h| h == host) { Ok(()) } else { Err(HandleError::NotBoundTo(host.to_owned())) }
    }
}

/// Why a credential could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("{0}")]
    InvalidHost(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// A refreshed OAuth grant.
pub(crate) struct Refreshed {
    pub access_token: SecretString,
    /// A new refresh token, when the provider rotated it.
    pub refresh_token: Option<SecretString>,
    /// When the access token expires (Unix ms), when the provider says.
    pub expires_at: Option<i64>,
}

/// Why a provider would not refresh a grant (logged, never shown: the
/// credential then needs re-authorisation).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct RefreshRefused(pub String);

/// Gets a new access token for an OAuth credential (the OAuth module
/// implements it; the vault only asks).
pub(crate) trait TokenRefresher: Send + Sync {
    fn refresh<'a>(
        &'a self,
        workspace_id: &'a str,
        provider: &'a str,
        refresh_token: &'a SecretString,
    ) -> Pin<Box<dyn Future<Output = Result<Refreshed, RefreshRefused>> + Send + 'a>>;

    /// Trades `secret` (with `refresh_token`, for the refresh-token
    /// grant) for a token by `exchange`, for `record`'s workspace,
    /// connector and bound hosts.
    fn exchange<'a>(
        &'a self,
        record: &'a CredentialRecord,
        exchange: &'a TokenExchange,
        secret: &'a SecretString,
        refresh_token: Option<&'a SecretString>,
    ) -> Pin<Box<dyn Future<Output = Result<Obtained, ExchangeError>> + Send + 'a>>;
}

/// How the vault reaches the refresher: weakly, since the refresher's
/// egress client holds the vault.
pub(crate) type RefresherSlot = Arc<std::sync::OnceLock<std::sync::Weak<dyn TokenRefresher>>>;

/// Seals, stores and (for egress only) reveals credentials.
#[derive(Clone)]
pub struct Vault {
    store: Store,
    keyring: Arc<Keyring>,
    /// Set once the OAuth module exists (it needs egress, which needs the
    /// vault).
    refresher: RefresherSlot,
    /// Secrets recently revealed to the egress layer.
    revealed: Arc<Revealed>,
    /// Counts revocations: a secret read before a revocation is not put
    /// into [`Revealed`] after it.
    revocations: Arc<std::sync::atomic::AtomicU64>,
    /// When each handle was last renewed on a provider's word: at most
    /// once per [`FORCED_RENEWAL_EVERY`], attempt or not.
    renewed: Arc<Mutex<HashMap<String, Instant>>>,
    /// One forced renewal at a time per handle, so concurrent requests
    /// that were all told their secret is refused renew it once (and a
    /// slow store or token endpoint holds up only its own credential).
    renewing: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// The operator's secret stores, for credentials that hold a
    /// reference.
    stores: Arc<SecretStores>,
    /// Tokens obtained for credentials traded first, by credential id,
    /// with when they expire (Unix ms).
    exchanged: Arc<Mutex<HashMap<String, (SecretString, i64)>>>,
    /// One token request at a time per credential, so requests that all
    /// find no token make one (and a slow token endpoint holds up only
    /// its own credential).
    exchanging: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

/// A credential's token is renewed on a provider's word at most this often:
/// an endpoint that always answers "expired" cannot make a plugin refresh
/// on every request.
const FORCED_RENEWAL_EVERY: Duration = Duration::from_secs(30);

/// How long a secret revealed to the egress layer is used again without
/// reading the credential anew. A connector paging through an API makes
/// many requests a second, and each reveal is a database read and an AEAD
/// open (about a millisecond under load, measured). So a change to a
/// credential reaches outbound requests within this time; an OAuth access
/// token is refreshed long before that matters ([`REFRESH_MARGIN_MS`]).
const REVEALED_FOR: Duration = Duration::from_secs(2);

/// Revealed secrets by workspace, connector, handle and host, with when
/// they were read; entries older than [`REVEALED_FOR`] are never handed
/// out and are dropped (and zeroised) as new ones come in.
#[derive(Default)]
struct Revealed(Mutex<HashMap<RevealedKey, (Injection, Instant)>>);

/// Workspace, connector, handle and host.
type RevealedKey = (String, String, String, String);

impl Revealed {
    fn get(&self, key: &RevealedKey, now: Instant) -> Option<Injection> {
        let cache = self.0.lock().unwrap_or_else(|p| p.into_inner());
        cache.get(key).filter(|(_, at)| now.duration_since(*at) < REVEALED_FOR).map(|(secret, _)| secret.clone())
    }

    fn put(&self, key: RevealedKey, secret: Injection, now: Instant) {
        let mut cache = self.0.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|_, (_, at)| now.duration_since(*at) < REVEALED_FOR);
        cache.insert(key, (secret, now));
    }
}

/// The metadata key of a credential that holds a reference: the reference
/// as written (no value), for people to read.
pub(crate) const REFERENCE: &str = "secret_reference";

impl Vault {
    /// Notes a read of a referenced secret in the audit log: the
    /// credential, the reference and the outcome, never the value.
    async fn audit_resolution(
        &self,
        record: &CredentialRecord,
        reference: &Reference,
        outcome: Result<(), &SecretError>,
    ) {
        use crate::store::audit::NewAuditRecord;
        use crate::store::kinds::AuditOutcome;
        let (result, status) = match outcome {
            Ok(()) => (AuditOutcome::Succeeded, 200),
            Err(e) if crate::retry::Transient::is_transient(e) => (AuditOutcome::Failed, 503),
            Err(_) => (AuditOutcome::Failed, 404),
        };
        let mut audit = NewAuditRecord::event(
            &record.workspace_id,
            "credentials.resolve_reference",
            result,
            status,
            crate::telemetry::request_id::current(),
        )
        .on("credential", &record.credential_id);
        audit.details = Some(serde_json::json!({
            "credential_handle": record.credential_handle.as_str(),
            "job_id": crate::telemetry::job_id::current(),
            "reference": reference.text(),
            "error": outcome.err().map(ToString::to_string),
        }));
        if let Err(e) = self.store.append_audit(&audit).await {
            tracing::error!(error = %e, "could not write audit record");
        }
    }
}

/// How long a server may hold a credential's refresh lease: beyond the
/// token request's own timeout (30 s) and the reads around it, so a lease
/// never lapses while its refresh may still be under way.
const REFRESH_LEASE_MS: i64 = 90_000;
/// How long a server waits for another's refresh before it gives up (a
/// transient failure: the request is tried again later).
const REFRESH_WAIT: Duration = Duration::from_secs(100);

/// Refresh an access token this long before it expires.
const REFRESH_MARGIN_MS: i64 = 30_000;

/// Associated data of a sealed secret: a ciphertext copied to another
/// credential or workspace does not open.
fn binding(credential_id: &str, workspace_id: &str) -> String {
    format!("credential={credential_id};workspace={workspace_id}")
}

/// Normalises a list of bound hosts: exact, lower-case names, or IP
/// addresses (a database destination's host may be one; egress never
/// sends to an address, so there they bind nothing).
pub(crate) fn bound_hosts(hosts: &[String]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for h in hosts {
        if let Ok(ip) = h.trim().trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
            let ip = ip.to_string();
            if !out.contains(&ip) {
                out.push(ip);
            }
            continue;
        }
        match HostPattern::parse(h)? {
            HostPattern::Exact(name) => {
                if !out.contains(&name) {
                    out.push(name)
                }
            }
            _ => return Err(format!("'{h}': a credential is bound to exact host names, not patterns")),
        }
    }
    if out.is_empty() {
        return Err("a credential must be bound to at least one host".into());
    }
    Ok(out)
}

impl Vault {
    pub fn new(store: Store, keyring: Keyring) -> Self {
        Vault {
            store,
            keyring: Arc::new(keyring),
            refresher: Default::default(),
            revealed: Default::default(),
            revocations: Default::default(),
            renewed: Default::default(),
            renewing: Default::default(),
            stores: Arc::new(
                SecretStores::new(SecretStoreSettings::default()).expect("a client with default settings builds"),
            ),
            exchanged: Default::default(),
            exchanging: Default::default(),
        }
    }

    /// The same vault, reading referenced secrets from `stores`.
    pub fn with_stores(mut self, stores: Arc<SecretStores>) -> Self {
        self.stores = stores;
        self
    }

    /// The operator's secret stores.
    pub(crate) fn stores(&self) -> &SecretStores {
        &self.stores
    }

    /// A key derived from the master key for one purpose (see
    /// [`Keyring::derive`]).
    pub(crate) fn derived_key(&self, purpose: &str) -> keyring::DerivedKey {
        self.keyring.derive(purpose)
    }

    /// Seals a webhook subscription's signing secret, bound to the
    /// subscription and its workspace.
    pub(crate) fn seal_signing_secret(&self, webhook_id: &str, workspace_id: &str, secret: &[u8]) -> Sealed {
        self.keyring.seal(&signing_binding(webhook_id, workspace_id), secret)
    }

    /// Opens what [`Vault::seal_signing_secret`] sealed.
    pub(crate) fn open_signing_secret(
        &self,
        webhook_id: &str,
        workspace_id: &str,
        sealed: &Sealed,
    ) -> Result<Zeroizing<Vec<u8>>, &'static str> {
        self.keyring.open(&signing_binding(webhook_id, workspace_id), sealed)
    }

    /// Revokes a credential: the secret is destroyed in the store and
    /// forgotten by this process at once, so no further request of any
    /// plugin or job carries it. False when there is nothing to revoke.
    pub async fn revoke(
        &self,
        workspace_id: &str,
        credential_id: &str,
        by: &str,
    ) -> Result<bool, crate::store::StoreError> {
        let Some(row) = self.store.credential(workspace_id, credential_id).await? else { return Ok(false) };
        let revoked = self.store.revoke_credential(workspace_id, credential_id, by).await?;
        self.revocations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let handle = row.record.credential_handle.as_str().to_owned();
        let mut cache = self.revealed.0.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|(ws, _, h, _), _| !(ws == workspace_id && *h == handle));
        drop(cache);
        self.exchanged.lock().unwrap_or_else(|p| p.into_inner()).remove(credential_id);
        Ok(revoked)
    }

    /// Installs the OAuth token refresher (kept alive by its owner).
    pub(crate) fn set_refresher(&self, r: &Arc<dyn TokenRefresher>) {
        let _ = self.refresher.set(Arc::downgrade(r));
    }

    /// Stores a new credential; returns its public record.
    pub async fn create(&self, new: NewSecret<'_>) -> Result<CredentialRecord, CreateError> {
        let hosts = bound_hosts(&new.hosts).map_err(CreateError::InvalidHost)?;
        let id = new_id("crd");
        let mut raw = [0u8; 24];
        rand::rng().fill_bytes(&mut raw);
        let handle = format!("ch_{}", URL_SAFE_NO_PAD.encode(raw));
        let sealed = self.keyring.seal(&binding(&id, new.workspace_id), &new.material.to_plaintext());
        self.store
            .insert_credential(NewCredential {
                id: &id,
                workspace_id: new.workspace_id,
                handle: &handle,
                kind: new.kind,
                connector_id: new.connector_id,
                label: new.label,
                hosts: &hosts,
                metadata: &new.metadata,
                status: new.status,
                created_by: new.created_by,
                access_expires_at: new.access_expires_at,
                sealed: &sealed,
            })
            .await?;
        Ok(self.store.credential(new.workspace_id, &id).await?.expect("just inserted").record)
    }

    /// The secret behind a handle, for a request to `host` on behalf of
    /// `workspace_id`. The reasons it gives are safe to show.
    pub async fn reveal(&self, workspace_id: &str, handle: &str, host: &str) -> Result<SecretString, SecretError> {
        self.open(workspace_id, handle, host, None).await.map(|(_, secret)| secret)
    }

    /// The credential behind a handle and its secret, for a request to
    /// `host` on behalf of `workspace_id`. `rejected` is an access token
    /// the provider just called expired: if the credential still holds it,
    /// it is refreshed now whatever its recorded expiry says.
    async fn open(
        &self,
        workspace_id: &str,
        handle: &str,
        host: &str,
        rejected: Option<&SecretString>,
    ) -> Result<(CredentialRecord, SecretString), SecretError> {
        let row = self
            .store
            .credential_by_handle(workspace_id, handle)
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "credential lookup failed");
                SecretError::StoreUnavailable
            })?
            .ok_or(SecretError::Unknown)?;
        if row.record.status != CredentialStatus::Active {
            return Err(SecretError::NotActive(row.record.status.to_string()));
        }
        if !row.record.hosts.iter().any(|h| h == host) {
            return Err(SecretError::NotBound(host.to_owned()));
        }
        let plaintext =
            self.keyring.open(&binding(&row.record.credential_id, workspace_id), &row.sealed).map_err(|e| {
                tracing::error!(credential = %row.record.credential_id, error = e, "credential does not open");
                SecretError::Unopenable
            })?;
        let mut material = SecretMaterial::from_plaintext(&plaintext).ok_or_else(|| {
            tracing::error!(credential = %row.record.credential_id, "credential opens but is malformed");
            SecretError::Unopenable
        })?;
        if row.record.metadata.get(REFERENCE).is_some() {
            // The sealed value is the reference (sealed, so the database
            // cannot point the credential elsewhere); the store holds the
            // secret.
            let reference = Reference::parse(material.secret.expose_secret()).map_err(|_| SecretError::Unopenable)?;
            // A value the provider just refused may have been rotated in
            // the store: read it again now rather than at the TTL's end.
            // (A token traded for the value is what a provider refuses;
            // trading again is the answer to that.)
            let freshness = match rejected {
                Some(_) if row.record.metadata.get("exchange").is_none() => Freshness::Now,
                _ => Freshness::WithinTtl,
            };
            let outcome = self.stores.resolve_as(workspace_id, &reference, freshness).await;
            // A value still within its TTL was not read again: only reads
            // of the store are audited.
            if !matches!(outcome, Ok((_, false))) {
                self.audit_resolution(&row.record, &reference, outcome.as_ref().map(|_| ())).await;
            }
            material = SecretMaterial::new(outcome?.0);
        }
        if let Some(recipe) = row.record.metadata.get("exchange") {
            let exchange: TokenExchange =
                serde_json::from_value(recipe.clone()).map_err(|_| SecretError::Unopenable)?;
            let token = self.exchanged_token(&row, &exchange, material, rejected).await?;
            return Ok((row.record, token));
        }
        if row.record.metadata.get(REFERENCE).is_some() {
            if rejected.is_some_and(|r| r.expose_secret() == material.secret.expose_secret()) {
                return Err(SecretError::Unchanged);
            }
            return Ok((row.record, material.secret));
        }
        let now = now_ms();
        let expiring = row.access_expires_at.is_some_and(|t| t - REFRESH_MARGIN_MS <= now);
        let called_expired = rejected.is_some_and(|r| r.expose_secret() == material.secret.expose_secret());
        if row.record.kind == CredentialKind::Oauth2 && (expiring || called_expired) {
            material = self.refresh(&row, material).await?;
        } else if rejected.is_some() && row.record.kind != CredentialKind::Oauth2 {
            return Err(SecretError::NotRenewable);
        }
        if row.last_used_ms.is_none_or(|t| now - t > TOUCH_INTERVAL_MS) {
            let _ = self.store.touch_credential(&row.record.credential_id, now).await;
        }
        Ok((row.record, material.secret))
    }

    /// The token `secret` was traded for, obtained anew when there is
    /// none, it is about to expire, or the provider just refused it
    /// (`rejected`).
    async fn exchanged_token(
        &self,
        row: &crate::store::credentials::SealedCredential,
        exchange: &TokenExchange,
        material: SecretMaterial,
        rejected: Option<&SecretString>,
    ) -> Result<SecretString, SecretError> {
        let record = &row.record;
        let current = |now: i64| {
            let cache = self.exchanged.lock().unwrap_or_else(|p| p.into_inner());
            cache
                .get(&record.credential_id)
                .filter(|(token, expires)| {
                    *expires - REFRESH_MARGIN_MS > now
                        && rejected.is_none_or(|r| r.expose_secret() != token.expose_secret())
                })
                .map(|(token, _)| token.clone())
        };
        if let Some(token) = current(now_ms()) {
            return Ok(token);
        }
        let lock = {
            let mut locks = self.exchanging.lock().unwrap_or_else(|p| p.into_inner());
            locks.retain(|_, l| Arc::strong_count(l) > 1);
            locks.entry(record.credential_id.clone()).or_default().clone()
        };
        let _one_at_a_time = lock.lock().await;
        if let Some(token) = current(now_ms()) {
            return Ok(token);
        }
        let Obtained { token, expires_in, .. } = if exchange.refreshes() {
            self.refresh_grant(row, exchange).await?
        } else {
            self.trade(record, exchange, &material, None).await?
        };
        let expires = now_ms() + expires_in.unwrap_or(3600).clamp(1, 86_400 * 365) * 1000;
        let mut cache = self.exchanged.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|_, (_, e)| *e > now_ms());
        cache.insert(record.credential_id.clone(), (token.clone(), expires));
        Ok(token)
    }

    /// Trades a credential's material by its recipe.
    async fn trade(
        &self,
        record: &CredentialRecord,
        exchange: &TokenExchange,
        material: &SecretMaterial,
        refresh_token: Option<&SecretString>,
    ) -> Result<Obtained, SecretError> {
        let refresher = self.refresher.get().and_then(std::sync::Weak::upgrade).ok_or(SecretError::CannotRefresh)?;
        refresher.exchange(record, exchange, &material.secret, refresh_token).await.map_err(|e| {
            tracing::warn!(credential = %record.credential_id, reason = %e, "a token exchange failed");
            SecretError::Exchange(e.0)
        })
    }

    /// The refresh-token grant of a credential that holds its client's
    /// secret and a refresh token, one server at a time: the holder of
    /// the credential's refresh lease reads the refresh token as stored
    /// now (another server may have rotated it), trades it, and stores the
    /// one the endpoint rotates it to before giving the lease back. A
    /// provider that accepts each refresh token once so sees each once.
    async fn refresh_grant(
        &self,
        row: &crate::store::credentials::SealedCredential,
        exchange: &TokenExchange,
    ) -> Result<Obtained, SecretError> {
        let r = &row.record;
        let work = || async {
            let (_, current) = self.reread(row).await?;
            let obtained = self.trade(r, exchange, &current, current.refresh_token.as_ref()).await?;
            let rotated = obtained.refresh_token.as_ref().filter(|new| {
                current.refresh_token.as_ref().is_none_or(|old| old.expose_secret() != new.expose_secret())
            });
            if let Some(rotated) = rotated {
                let next = SecretMaterial { secret: current.secret, refresh_token: Some(rotated.clone()) };
                self.reseal(r, &next, None).await?;
                tracing::info!(credential = %r.credential_id, "stored the refresh token the provider rotated to");
            }
            Ok(obtained)
        };
        // Another server trading meanwhile stores what it rotates to;
        // this one trades that once the lease is free.
        self.under_refresh_lease(row, work, || async { Ok(None) }).await
    }

    /// Refreshes an expiring OAuth access token, one server at a time:
    /// the one holding the credential's refresh lease reads it again (a
    /// server may have refreshed it meanwhile) and refreshes; the others
    /// wait for the token it stores. A provider that rotates refresh
    /// tokens on use so sees each one once.
    async fn refresh(
        &self,
        row: &crate::store::credentials::SealedCredential,
        material: SecretMaterial,
    ) -> Result<SecretMaterial, SecretError> {
        let work = || async {
            match self.newer(row, &material).await? {
                Some(newer) => Ok(newer),
                None => {
                    let (current, current_material) = self.reread(row).await?;
                    self.refresh_now(&current, current_material).await
                }
            }
        };
        // Another server refreshes: use what it stores.
        self.under_refresh_lease(row, work, || self.newer(row, &material)).await
    }

    /// Runs `work` holding the credential's refresh lease, so one server
    /// at a time refreshes or trades it. While another holds the lease,
    /// `meanwhile` is asked after each wait for what that server stored
    /// (`None`: wait on), until the wait's limit.
    async fn under_refresh_lease<T, Work, Done, Meanwhile, Stored>(
        &self,
        row: &crate::store::credentials::SealedCredential,
        work: Work,
        meanwhile: Meanwhile,
    ) -> Result<T, SecretError>
    where
        Work: FnOnce() -> Done,
        Done: Future<Output = Result<T, SecretError>>,
        Meanwhile: Fn() -> Stored,
        Stored: Future<Output = Result<Option<T>, SecretError>>,
    {
        let r = &row.record;
        let unavailable = |e: crate::store::StoreError| {
            tracing::error!(error = %e, "the credential's refresh lease could not be taken");
            SecretError::StoreUnavailable
        };
        let deadline = Instant::now() + REFRESH_WAIT;
        loop {
            let now = now_ms();
            // The lease's end, made unique by a random part, is the
            // holder's mark: only the holder gives it back.
            let until = now + REFRESH_LEASE_MS + i64::from(rand::random::<u16>());
            if self.store.claim_credential_refresh(&r.credential_id, now, until).await.map_err(unavailable)? {
                let outcome = work().await;
                if let Err(e) = self.store.release_credential_refresh(&r.credential_id, until).await {
                    tracing::warn!(error = %e, "the credential's refresh lease could not be given back; it lapses");
                }
                return outcome;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Some(stored) = meanwhile().await? {
                return Ok(stored);
            }
            if Instant::now() > deadline {
                return Err(SecretError::StoreUnavailable);
            }
        }
    }

    /// Seals `material` as the credential's secret now, with when its
    /// access token expires.
    async fn reseal(
        &self,
        record: &CredentialRecord,
        material: &SecretMaterial,
        access_expires_at: Option<i64>,
    ) -> Result<(), SecretError> {
        let sealed = self.keyring.seal(&binding(&record.credential_id, &record.workspace_id), &material.to_plaintext());
        self.store.reseal_credential(&record.credential_id, &sealed, access_expires_at).await.map_err(|e| {
            tracing::error!(error = %e, "could not store a credential's new secret");
            SecretError::StoreUnavailable
        })
    }

    /// The credential as stored now, opened.
    async fn reread(
        &self,
        row: &crate::store::credentials::SealedCredential,
    ) -> Result<(crate::store::credentials::SealedCredential, SecretMaterial), SecretError> {
        let r = &row.record;
        let current = self
            .store
            .credential_by_handle(&r.workspace_id, r.credential_handle.as_str())
            .await
            .map_err(|_| SecretError::StoreUnavailable)?
            .ok_or(SecretError::Unknown)?;
        if current.record.status != CredentialStatus::Active {
            return Err(SecretError::NotActive(current.record.status.to_string()));
        }
        let plaintext = self
            .keyring
            .open(&binding(&r.credential_id, &r.workspace_id), &current.sealed)
            .map_err(|_| SecretError::Unopenable)?;
        let material = SecretMaterial::from_plaintext(&plaintext).ok_or(SecretError::Unopenable)?;
        Ok((current, material))
    }

    /// The stored material when another server refreshed since `material`
    /// was read (another access token, not about to expire).
    async fn newer(
        &self,
        row: &crate::store::credentials::SealedCredential,
        material: &SecretMaterial,
    ) -> Result<Option<SecretMaterial>, SecretError> {
        let (current, current_material) = self.reread(row).await?;
        let fresh = current.access_expires_at.is_none_or(|t| t - REFRESH_MARGIN_MS > now_ms());
        let other = current_material.secret.expose_secret() != material.secret.expose_secret();
        Ok((fresh && other).then_some(current_material))
    }

    /// Refreshes the token now and re-seals the result. A refusal marks
    /// the credential as needing re-authorisation.
    async fn refresh_now(
        &self,
        row: &crate::store::credentials::SealedCredential,
        material: SecretMaterial,
    ) -> Result<SecretMaterial, SecretError> {
        let r = &row.record;
        let (Some(refresher), Some(refresh_token), Some(provider)) = (
            self.refresher.get().and_then(std::sync::Weak::upgrade),
            &material.refresh_token,
            r.metadata["provider"].as_str(),
        ) else {
            return Err(SecretError::CannotRefresh);
        };
        match refresher.refresh(&r.workspace_id, provider, refresh_token).await {
            Ok(Refreshed { access_token, refresh_token: rotated, expires_at: expires }) => {
                let next = SecretMaterial { secret: access_token, refresh_token: rotated.or(material.refresh_token) };
                self.reseal(r, &next, expires).await?;
                tracing::info!(credential = %r.credential_id, "refreshed an OAuth access token");
                Ok(next)
            }
            Err(reason) => {
                let _ = self
                    .store
                    .set_credential_status(
                        &r.workspace_id,
                        &r.credential_id,
                        CredentialStatus::Active,
                        CredentialStatus::NeedsReauthorization,
                    )
                    .await;
                tracing::warn!(credential = %r.credential_id, reason = %reason, "OAuth refresh failed; credential needs re-authorisation");
                Err(SecretError::NeedsReauthorization)
            }
        }
    }

    /// The credential a handle names in `workspace_id`, checked to be bound
    /// to `host` when one is given: the one check every operation that
    /// takes a handle makes before anything is saved or sent. A handle of
    /// another workspace is simply unknown.
    pub(crate) async fn require_handle(
        &self,
        workspace_id: &str,
        handle: &CredentialHandle,
        host: Option<&str>,
    ) -> Result<CredentialRecord, HandleError> {
        let record = self
            .store
            .credential_by_handle(workspace_id, handle.as_str())
            .await
            .map_err(HandleError::Store)?
            .ok_or(HandleError::Unknown)?
            .record;
        if let Some(host) = host {
            record.require_host(host)?;
        }
        Ok(record)
    }

    /// Re-seals every credential and webhook signing secret with a new
    /// current key, then forgets the old keys (`service admin
    /// rotate-master-key`). Returns how many credentials were re-sealed.
    pub async fn rotate(
        store: &Store,
        mut keyring: Keyring,
        new_key: Option<&SecretString>,
    ) -> anyhow::Result<(usize, String)> {
        if keyring.file().is_none() {
            // The key is configured outside the data directory: the new one
            // must be too, and the operator swaps them afterwards. Both keys
            // are in the ring, so an interrupted run can simply be repeated.
            let new = new_key.ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: the master key comes from the environment; put the new key (32 bytes, base64) in {} and run again",
                    keyring::MASTER_KEY_ENV,
                    keyring::NEW_MASTER_KEY_ENV
                )
            })?;
            let new = keyring::MasterKey::parse(new.expose_secret())
                .map_err(|e| anyhow::anyhow!("{}: {e}", keyring::NEW_MASTER_KEY_ENV))?;
            keyring.add_current(new);
        } else {
            keyring.add_current(keyring::MasterKey::generate());
            // The file holds both keys before anything is re-sealed, so a
            // crash midway leaves every credential openable.
            keyring.write_file()?;
        }
        let mut n = 0;
        for c in store.all_sealed_credentials().await? {
            if c.record.status == CredentialStatus::Revoked {
                continue; // its secret is gone
            }
            let aad = binding(&c.record.credential_id, &c.record.workspace_id);
            let plaintext = keyring
                .open(&aad, &c.sealed)
                .map_err(|e| anyhow::anyhow!("credential {}: {e}", c.record.credential_id))?;
            let sealed = keyring.seal(&aad, &plaintext);
            store.reseal_credential(&c.record.credential_id, &sealed, c.access_expires_at).await?;
            n += 1;
        }
        for w in store.all_webhook_secrets().await? {
            let aad = signing_binding(&w.webhook_id, &w.workspace_id);
            let reseal = |sealed: &Sealed| {
                keyring
                    .open(&aad, sealed)
                    .map(|plain| keyring.seal(&aad, &plain))
                    .map_err(|e| anyhow::anyhow!("webhook {}: {e}", w.webhook_id))
            };
            let secret = reseal(&w.secret)?;
            // A rotated-out secret that no longer opens has no use left.
            let previous = w.previous.as_ref().and_then(|p| reseal(p).ok());
            store.reseal_webhook(&w.webhook_id, &secret, previous.as_ref()).await?;
        }
        keyring.retire_old();
        keyring.write_file()?;
        Ok((n, keyring.current().id.clone()))
    }
}

/// What a webhook signing secret is sealed to.
fn signing_binding(webhook_id: &str, workspace_id: &str) -> String {
    format!("webhook-signing:{webhook_id}:{workspace_id}")
}

/// A warehouse's credential is bound to no connector: one stored for a
/// connector is that connector's alone.
fn unbound(record: &CredentialRecord) -> Result<(), SecretError> {
    match &record.connector_id {
        Some(owner) => Err(SecretError::OtherConnector(owner.clone())),
        None => Ok(()),
    }
}

/// A `basic` credential's `secret_as` when its secret is the whole pair,
/// `username:password`: both parts are secrets.
pub(crate) const SECRET_AS_PAIR: &str = "username:password";

/// Where a credential's secret goes, from its record: its kind decides, and
/// the username or header stored with it (never the plugin's choice).
pub(crate) fn placement(record: &CredentialRecord) -> Result<Placement, SecretError> {
    match record.kind {
        CredentialKind::ApiToken | CredentialKind::Oauth2 => Ok(Placement::Bearer),
        // The secret is the pair `username:password`.
        CredentialKind::Basic if record.metadata.get("secret_as").and_then(Value::as_str) == Some(SECRET_AS_PAIR) => {
            Ok(Placement::BasicPair)
        }
        // The secret as the username and as the password.
        CredentialKind::Basic if record.metadata.get("secret_as").is_some() => Ok(Placement::BasicBoth),
        // The secret as the username, beside a password that is none.
        CredentialKind::Basic if record.metadata.get("password").is_some_and(Value::is_string) => {
            Ok(Placement::BasicUsername(record.metadata["password"].as_str().unwrap_or_default().to_owned()))
        }
        CredentialKind::Basic => record.metadata["username"]
            .as_str()
            .filter(|u| !u.is_empty())
            .map(|u| Placement::BasicPassword(u.to_owned()))
            .ok_or(SecretError::Incomplete("the basic credential has no username; store it again with one")),
        CredentialKind::Secret if record.metadata.get("exchange").is_some() => {
            let exchange: TokenExchange =
                serde_json::from_value(record.metadata["exchange"].clone()).map_err(|_| {
                    SecretError::Incomplete("the credential's token exchange cannot be read; store it again")
                })?;
            Ok(exchange.header.map_or(Placement::Bearer, Placement::Header))
        }
        CredentialKind::Secret => {
            let named = |key: &str| record.metadata[key].as_str().filter(|v| !v.is_empty()).map(str::to_owned);
            let text = |key: &str| record.metadata[key].as_str().unwrap_or_default().to_owned();
            let around = |header: String| match (text("prefix"), text("suffix")) {
                (prefix, suffix) if prefix.is_empty() && suffix.is_empty() => Placement::Header(header),
                (prefix, suffix) => Placement::HeaderAround { header, prefix, suffix },
            };
            named("header")
                .map(around)
                .or_else(|| named("query_parameter").map(Placement::Query))
                .or_else(|| named("body_field").map(Placement::BodyField))
                .or_else(|| (record.metadata["url_path"] == Value::Bool(true)).then_some(Placement::Path))
                .or_else(|| {
                    serde_json::from_value::<crate::egress::signing::Signing>(record.metadata.get("signing")?.clone())
                        .ok()
                        .map(Placement::Signed)
                })
                .ok_or(SecretError::Incomplete(
                    "the secret credential names no header, query parameter, body field, URL path or signing recipe; store it again with one",
                ))
        }
    }
}

/// The password of a database destination: the credential's secret, for
/// the destination's host, in its workspace.
impl crate::warehouse::PasswordSource for Vault {
    fn password<'a>(
        &'a self,
        workspace_id: &'a str,
        handle: &'a str,
        host: &'a str,
    ) -> crate::warehouse::handle::Revealing<'a, SecretString> {
        Box::pin(async move {
            let (record, secret) = self.open(workspace_id, handle, host, None).await?;
            unbound(&record)?;
            Ok(secret)
        })
    }

    fn access_key<'a>(
        &'a self,
        workspace_id: &'a str,
        handle: &'a str,
        host: &'a str,
    ) -> crate::warehouse::handle::Revealing<'a, (String, SecretString)> {
        Box::pin(async move {
            let (record, secret) = self.open(workspace_id, handle, host, None).await?;
            unbound(&record)?;
            match placement(&record) {
                Ok(Placement::BasicPassword(id)) => Ok((id, secret)),
                _ => Err(SecretError::Incomplete(
                    "an object store's credential is a basic one: the access key's id as username, its secret as password",
                )),
            }
        })
    }
}

impl SecretSource for Vault {
    fn secret_for<'a>(
        &'a self,
        workspace_id: &'a str,
        connector_id: &'a str,
        handle: &'a CredentialHandle,
        host: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Injection, SecretError>> + Send + 'a>> {
        Box::pin(async move {
            let key = (workspace_id.to_owned(), connector_id.to_owned(), handle.as_str().to_owned(), host.to_owned());
            if let Some(injection) = self.revealed.get(&key, Instant::now()) {
                return Ok(injection);
            }
            self.injection(key, None).await
        })
    }

    fn renew<'a>(
        &'a self,
        workspace_id: &'a str,
        connector_id: &'a str,
        handle: &'a CredentialHandle,
        host: &'a str,
        rejected: &'a SecretString,
    ) -> Pin<Box<dyn Future<Output = Result<Injection, SecretError>> + Send + 'a>> {
        Box::pin(async move {
            let key = (workspace_id.to_owned(), connector_id.to_owned(), handle.as_str().to_owned(), host.to_owned());
            self.injection(key, Some(rejected)).await
        })
    }
}

impl Vault {
    /// Opens the credential for an outbound request and caches the result.
    async fn injection(&self, key: RevealedKey, rejected: Option<&SecretString>) -> Result<Injection, SecretError> {
        let (workspace_id, connector_id, handle, host) = (&key.0, &key.1, &key.2, &key.3);
        let generation = self.revocations.load(std::sync::atomic::Ordering::SeqCst);
        let (record, secret) = match rejected {
            None => self.open(workspace_id, handle, host, None).await?,
            Some(rejected) => {
                let lock = {
                    let mut locks = self.renewing.lock().unwrap_or_else(|p| p.into_inner());
                    locks.retain(|_, l| Arc::strong_count(l) > 1);
                    locks.entry(handle.clone()).or_default().clone()
                };
                let _one_at_a_time = lock.lock().await;
                let recently = {
                    let mut renewed = self.renewed.lock().unwrap_or_else(|p| p.into_inner());
                    let now = Instant::now();
                    renewed.retain(|_, at| now.duration_since(*at) < FORCED_RENEWAL_EVERY);
                    let recently = renewed.contains_key(handle);
                    // The attempt counts, whatever comes of it: a provider
                    // that refuses everything cannot make the host read a
                    // store or refresh on every request.
                    if !recently {
                        renewed.insert(handle.clone(), now);
                    }
                    recently
                };
                if recently {
                    // Renewed a moment ago: what is current is as good as
                    // new, unless it is what the provider just refused.
                    let opened = self.open(workspace_id, handle, host, None).await?;
                    if opened.1.expose_secret() == rejected.expose_secret() {
                        return Err(SecretError::Unchanged);
                    }
                    opened
                } else {
                    self.open(workspace_id, handle, host, Some(rejected)).await?
                }
            }
        };
        // A credential stored for one connector is that connector's:
        // another plugin of the workspace may not borrow it.
        if let Some(owner) = &record.connector_id
            && owner != connector_id
        {
            return Err(SecretError::OtherConnector(owner.clone()));
        }
        let traded = record.metadata.get("exchange").is_some();
        let referenced = record.metadata.get(REFERENCE).is_some();
        let injection = Injection {
            secret,
            placement: placement(&record)?,
            renewable: record.kind == CredentialKind::Oauth2 || traded || referenced,
            // A token the host traded for is obtained again on any 401; a
            // value in the operator's store is read again on any 401.
            any_401_renews: traded || referenced,
        };
        if self.revocations.load(std::sync::atomic::Ordering::SeqCst) == generation {
            self.revealed.put(key, injection.clone(), Instant::now());
        }
        Ok(injection)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revealed_secret_is_reused_only_for_a_short_while() {
        let cache = Revealed::default();
        let key = |handle: &str| ("ws".to_owned(), "conn".to_owned(), handle.to_owned(), "api.example.com".to_owned());
        let injection = |s: &str| Injection {
            secret: SecretString::from(s.to_owned()),
            placement: Placement::Bearer,
            renewable: false,
            any_401_renews: false,
        };
        let t0 = Instant::now();
        cache.put(key("a"), injection("first"), t0);
        let hit = cache.get(&key("a"), t0 + REVEALED_FOR / 2).expect("fresh: reused");
        assert_eq!(hit.secret.expose_secret(), "first");
        assert!(cache.get(&key("b"), t0).is_none(), "another handle is not");
        assert!(
            cache.get(&("ws".into(), "conn".into(), "a".into(), "other.example.com".into()), t0).is_none(),
            "nor another host"
        );
        assert!(
            cache.get(&("ws".into(), "other".into(), "a".into(), "api.example.com".into()), t0).is_none(),
            "nor another connector"
        );
        assert!(cache.get(&key("a"), t0 + REVEALED_FOR).is_none(), "stale: read anew");

        cache.put(key("b"), injection("second"), t0 + REVEALED_FOR);
        assert_eq!(cache.0.lock().unwrap().len(), 1, "the stale secret was dropped");
    }
}
