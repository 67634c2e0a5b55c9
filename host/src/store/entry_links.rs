//! Credential-entry links.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::Row;
use utoipa::ToSchema;

use super::{Store, StoreResult, from_ms, new_id, now_ms};

/// A link's state as a client polls it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct EntryLink {
    pub entry_id: String,
    pub workspace_id: String,
    /// `pending`, `completed` or `expired`.
    pub status: String,
    /// What the credential will be (kind, hosts, connector): no secret.
    pub spec: Value,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Set once the person has entered the secret.
    pub credential_id: Option<String>,
}

fn from_row(r: &sqlx::any::AnyRow, now: i64) -> StoreResult<EntryLink> {
    let used: Option<i64> = r.try_get("used_at")?;
    let expires: i64 = r.try_get("expires_at")?;
    let spec: String = r.try_get("spec")?;
    Ok(EntryLink {
        entry_id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        status: if used.is_some() {
            "completed"
        } else if expires <= now {
            "expired"
        } else {
            "pending"
        }
        .into(),
        spec: serde_json::from_str(&spec).unwrap_or(Value::Null),
        created_at: from_ms(r.try_get("created_at")?),
        expires_at: from_ms(expires),
        credential_id: r.try_get("credential_id")?,
    })
}

impl Store {
    pub(crate) async fn create_entry_link(
        &self,
        workspace_id: &str,
        token_hash: &str,
        requested_by: &str,
        spec: &Value,
        expires_at: i64,
    ) -> StoreResult<EntryLink> {
        let id = new_id("cel");
        sqlx::query(
            "INSERT INTO credential_entry_links (id, workspace_id, token_hash, requested_by, spec, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&id)
        .bind(workspace_id)
        .bind(token_hash)
        .bind(requested_by)
        .bind(spec.to_string())
        .bind(now_ms())
        .bind(expires_at)
        .execute(self.pool())
        .await?;
        Ok(self.entry_link(workspace_id, &id).await?.expect("just inserted"))
    }

    pub(crate) async fn entry_link(&self, workspace_id: &str, id: &str) -> StoreResult<Option<EntryLink>> {
        let row = sqlx::query("SELECT * FROM credential_entry_links WHERE workspace_id = $1 AND id = $2")
            .bind(workspace_id)
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        let now = now_ms();
        row.map(|r| from_row(&r, now)).transpose()
    }

    /// A pending link by its token: (link, requested_by).
    pub(crate) async fn pending_entry_link(&self, token_hash: &str) -> StoreResult<Option<(EntryLink, String)>> {
        let now = now_ms();
        let row = sqlx::query(
            "SELECT * FROM credential_entry_links WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2",
        )
        .bind(token_hash)
        .bind(now)
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| Ok((from_row(&r, now)?, r.try_get("requested_by")?))).transpose()
    }

    /// Spends a link; true once, false for a used or expired one.
    pub(crate) async fn spend_entry_link(&self, token_hash: &str) -> StoreResult<bool> {
        let now = now_ms();
        let n = sqlx::query("UPDATE credential_entry_links SET used_at = $1 WHERE token_hash = $2 AND used_at IS NULL AND expires_at > $1")
            .bind(now)
            .bind(token_hash)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(n == 1)
    }

    pub(crate) async fn complete_entry_link(&self, token_hash: &str, credential_id: &str) -> StoreResult<()> {
        sqlx::query("UPDATE credential_entry_links SET credential_id = $1 WHERE token_hash = $2")
            .bind(credential_id)
            .bind(token_hash)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}
