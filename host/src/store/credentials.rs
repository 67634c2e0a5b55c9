//! Credential rows: metadata in the clear, the secret sealed.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::Row;
use utoipa::ToSchema;

use super::kinds::{CredentialKind, CredentialStatus};
use super::{Store, StoreResult, decode, from_ms, now_ms};

/// A sealed secret as stored.
#[derive(Debug, Clone)]
pub struct Sealed {
    pub key_id: String,
    /// Base64 nonce (24 bytes).
    pub nonce: String,
    /// Base64 ciphertext with its tag.
    pub ciphertext: String,
}

impl Sealed {
    /// The sealed secret as one column's text: `key:nonce:ciphertext`
    /// (base64 never holds a colon).
    pub(crate) fn to_text(&self) -> String {
        format!("{}:{}:{}", self.key_id, self.nonce, self.ciphertext)
    }

    /// The sealed secret [`Sealed::to_text`] wrote.
    pub(crate) fn from_text(text: &str) -> Option<Sealed> {
        let mut parts = text.rsplitn(3, ':');
        let ciphertext = parts.next()?.to_owned();
        let nonce = parts.next()?.to_owned();
        let key_id = parts.next()?.to_owned();
        Some(Sealed { key_id, nonce, ciphertext })
    }
}

/// The opaque reference to a stored credential (`ch_...`) that operations
/// and configurations carry instead of a secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, serde::Deserialize, ToSchema)]
#[serde(transparent)]
#[schema(value_type = String, example = "ch_3q2v9Kx7mN4pR8sT1uW6yZ0aB5cD7eF9")]
pub struct CredentialHandle(String);

impl CredentialHandle {
    pub fn new(handle: impl Into<String>) -> Self {
        CredentialHandle(handle.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The handles a configuration object names, with the keys that name
    /// them: `credential_handle`, or any key ending in
    /// `_credential_handle` (a connector with several credentials).
    pub(crate) fn in_configuration(config: &serde_json::Value) -> Vec<(&str, CredentialHandle)> {
        config
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(key, _)| *key == "credential_handle" || key.ends_with("_credential_handle"))
            .filter_map(|(key, value)| value.as_str().map(|h| (key.as_str(), CredentialHandle::new(h))))
            .collect()
    }
}

impl std::fmt::Display for CredentialHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What anyone may read about a credential: never the secret, not even a
/// fragment of it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CredentialRecord {
    pub credential_id: String,
    /// The opaque reference other operations use.
    pub credential_handle: CredentialHandle,
    pub workspace_id: String,
    pub kind: CredentialKind,
    /// Connector (or provider) the credential is for.
    pub connector_id: Option<String>,
    pub label: Option<String>,
    /// Hosts the secret may be sent to.
    pub hosts: Vec<String>,
    /// Non-secret settings kept with it (e.g. `base_url`, scopes).
    pub metadata: Value,
    pub status: CredentialStatus,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    /// When the credential was revoked (its secret is destroyed then).
    pub revoked_at: Option<DateTime<Utc>>,
    /// Who revoked it.
    pub revoked_by: Option<String>,
}

/// A credential to store.
pub(crate) struct NewCredential<'a> {
    pub id: &'a str,
    pub workspace_id: &'a str,
    pub handle: &'a str,
    pub kind: CredentialKind,
    pub connector_id: Option<&'a str>,
    pub label: Option<&'a str>,
    pub hosts: &'a [String],
    pub metadata: &'a Value,
    pub status: CredentialStatus,
    pub created_by: &'a str,
    pub access_expires_at: Option<i64>,
    pub sealed: &'a Sealed,
}

/// A row with its sealed secret, for the vault only.
pub(crate) struct SealedCredential {
    pub record: CredentialRecord,
    pub sealed: Sealed,
    pub access_expires_at: Option<i64>,
    pub last_used_ms: Option<i64>,
}

const COLUMNS: &str = "id, handle, workspace_id, kind, connector_id, label, hosts, metadata, status, created_by, created_at, \
     last_used_at, access_expires_at, key_id, nonce, ciphertext, revoked_at, revoked_by";

fn from_row(r: &sqlx::any::AnyRow) -> StoreResult<SealedCredential> {
    let hosts: String = r.try_get("hosts")?;
    let metadata: String = r.try_get("metadata")?;
    let last_used: Option<i64> = r.try_get("last_used_at")?;
    Ok(SealedCredential {
        record: CredentialRecord {
            credential_id: r.try_get("id")?,
            credential_handle: CredentialHandle(r.try_get("handle")?),
            workspace_id: r.try_get("workspace_id")?,
            kind: decode(r.try_get("kind")?, CredentialKind::parse, "kind")?,
            connector_id: r.try_get("connector_id")?,
            label: r.try_get("label")?,
            hosts: serde_json::from_str(&hosts).unwrap_or_default(),
            metadata: serde_json::from_str(&metadata).unwrap_or(Value::Null),
            status: decode(r.try_get("status")?, CredentialStatus::parse, "status")?,
            created_by: r.try_get("created_by")?,
            created_at: from_ms(r.try_get("created_at")?),
            last_used_at: last_used.map(from_ms),
            revoked_at: r.try_get::<Option<i64>, _>("revoked_at")?.map(from_ms),
            revoked_by: r.try_get("revoked_by")?,
        },
        sealed: Sealed {
            key_id: r.try_get("key_id")?,
            nonce: r.try_get("nonce")?,
            ciphertext: r.try_get("ciphertext")?,
        },
        access_expires_at: r.try_get("access_expires_at")?,
        last_used_ms: last_used,
    })
}

impl Store {
    pub(crate) async fn insert_credential(&self, c: NewCredential<'_>) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO credentials (id, workspace_id, handle, kind, connector_id, label, hosts, metadata, status, created_by, \
             created_at, access_expires_at, key_id, nonce, ciphertext) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        )
        .bind(c.id)
        .bind(c.workspace_id)
        .bind(c.handle)
        .bind(c.kind.as_str())
        .bind(c.connector_id)
        .bind(c.label)
        .bind(serde_json::to_string(c.hosts).unwrap_or_else(|_| "[]".into()))
        .bind(c.metadata.to_string())
        .bind(c.status.as_str())
        .bind(c.created_by)
        .bind(now_ms())
        .bind(c.access_expires_at)
        .bind(&c.sealed.key_id)
        .bind(&c.sealed.nonce)
        .bind(&c.sealed.ciphertext)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    pub(crate) async fn credential(
        &self,
        workspace_id: &str,
        credential_id: &str,
    ) -> StoreResult<Option<SealedCredential>> {
        let sql = format!("SELECT {COLUMNS} FROM credentials WHERE workspace_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(credential_id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Looks a handle up within one workspace: a handle of another
    /// workspace is simply not found.
    pub(crate) async fn credential_by_handle(
        &self,
        workspace_id: &str,
        handle: &str,
    ) -> StoreResult<Option<SealedCredential>> {
        let sql = format!("SELECT {COLUMNS} FROM credentials WHERE workspace_id = $1 AND handle = $2");
        let row =
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(workspace_id).bind(handle).fetch_optional(self.pool()).await?;
        row.as_ref().map(from_row).transpose()
    }

    pub(crate) async fn credentials(
        &self,
        workspace_id: &str,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<CredentialRecord>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM credentials WHERE workspace_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(|r| from_row(r).map(|c| c.record)).collect()
    }

    pub(crate) async fn set_credential_status(
        &self,
        workspace_id: &str,
        credential_id: &str,
        from: CredentialStatus,
        to: CredentialStatus,
    ) -> StoreResult<bool> {
        let n = sqlx::query("UPDATE credentials SET status = $1 WHERE workspace_id = $2 AND id = $3 AND status = $4")
            .bind(to.as_str())
            .bind(workspace_id)
            .bind(credential_id)
            .bind(from.as_str())
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(n == 1)
    }

    /// Revokes a credential: its status becomes `revoked`, its sealed
    /// secret is overwritten, and who and when are recorded. False when it
    /// does not exist in the workspace or was revoked already.
    pub(crate) async fn revoke_credential(
        &self,
        workspace_id: &str,
        credential_id: &str,
        by: &str,
    ) -> StoreResult<bool> {
        let n = sqlx::query(
            "UPDATE credentials SET status = 'revoked', revoked_at = $1, revoked_by = $2, key_id = '', nonce = '', ciphertext = '', \
             access_expires_at = NULL WHERE workspace_id = $3 AND id = $4 AND status <> 'revoked'",
        )
        .bind(now_ms())
        .bind(by)
        .bind(workspace_id)
        .bind(credential_id)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    pub(crate) async fn touch_credential(&self, credential_id: &str, at: i64) -> StoreResult<()> {
        sqlx::query("UPDATE credentials SET last_used_at = $1 WHERE id = $2")
            .bind(at)
            .bind(credential_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Replaces the sealed secret (token refresh, key rotation).
    pub(crate) async fn reseal_credential(
        &self,
        credential_id: &str,
        sealed: &Sealed,
        access_expires_at: Option<i64>,
    ) -> StoreResult<()> {
        // A revoked credential stays without a secret, whatever a refresh
        // or rotation that started before the revocation writes.
        sqlx::query("UPDATE credentials SET key_id = $1, nonce = $2, ciphertext = $3, access_expires_at = $4 WHERE id = $5 AND status <> 'revoked'")
            .bind(&sealed.key_id)
            .bind(&sealed.nonce)
            .bind(&sealed.ciphertext)
            .bind(access_expires_at)
            .bind(credential_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Takes the lease to refresh a credential's token until `until` (Unix
    /// ms), unless another server holds it at `now`. True when taken.
    pub(crate) async fn claim_credential_refresh(
        &self,
        credential_id: &str,
        now: i64,
        until: i64,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE credentials SET refreshing_until = $1 WHERE id = $2 AND (refreshing_until IS NULL OR refreshing_until < $3)",
        )
        .bind(until)
        .bind(credential_id)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives back the refresh lease taken until `until` (a lease another
    /// server took since stays its own).
    pub(crate) async fn release_credential_refresh(&self, credential_id: &str, until: i64) -> StoreResult<()> {
        sqlx::query("UPDATE credentials SET refreshing_until = NULL WHERE id = $1 AND refreshing_until = $2")
            .bind(credential_id)
            .bind(until)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Every credential with its sealed secret (for key rotation).
    pub(crate) async fn all_sealed_credentials(&self) -> StoreResult<Vec<SealedCredential>> {
        let sql = format!("SELECT {COLUMNS} FROM credentials ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(self.pool()).await?;
        rows.iter().map(from_row).collect()
    }
}
