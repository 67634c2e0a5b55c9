//! Enabled state of connector plugins and the digest each is pinned to,
//! shared by all replicas.

use std::collections::HashMap;

use sqlx::Row;

use super::{Store, StoreResult, now_ms};

/// The operator's switch for one connector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginState {
    pub enabled: bool,
    /// The component (SHA-256, hex) the operator enabled; every replica
    /// runs exactly this one. `None`: not pinned (bundled plugins).
    pub digest: Option<String>,
}

impl PluginState {
    /// The state of a connector nobody has touched: enabled, unpinned.
    pub(crate) const UNTOUCHED: PluginState = PluginState { enabled: true, digest: None };
}

fn state_from_row(r: &sqlx::any::AnyRow) -> StoreResult<PluginState> {
    Ok(PluginState { enabled: r.try_get::<i64, _>("enabled")? != 0, digest: r.try_get("digest")? })
}

impl Store {
    /// A connector's state ([`PluginState::UNTOUCHED`] when it has none).
    pub async fn plugin_state(&self, connector_id: &str) -> StoreResult<PluginState> {
        let row = sqlx::query("SELECT enabled, digest FROM plugin_states WHERE connector_id = $1")
            .bind(connector_id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(state_from_row).transpose().map(|s| s.unwrap_or(PluginState::UNTOUCHED))
    }

    /// Every recorded state.
    pub async fn plugin_states(&self) -> StoreResult<HashMap<String, PluginState>> {
        let rows =
            sqlx::query("SELECT connector_id, enabled, digest FROM plugin_states").fetch_all(self.pool()).await?;
        rows.iter().map(|r| Ok((r.try_get("connector_id")?, state_from_row(r)?))).collect()
    }

    /// Switches a connector on (pinned to `digest`, when given) or off
    /// (keeping the digest it was pinned to).
    pub async fn set_plugin_enabled(
        &self,
        connector_id: &str,
        enabled: bool,
        by: Option<&str>,
        digest: Option<&str>,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO plugin_states (connector_id, enabled, updated_at, updated_by, digest) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (connector_id) DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at, updated_by = excluded.updated_by, \
             digest = COALESCE(excluded.digest, plugin_states.digest)",
        )
        .bind(connector_id)
        .bind(i64::from(enabled))
        .bind(now_ms())
        .bind(by)
        .bind(digest)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Pins an enabled connector that has no digest yet to `digest` (a
    /// plugin enabled before pinning existed, trusted as it is found).
    pub(crate) async fn pin_plugin_if_unpinned(&self, connector_id: &str, digest: &str) -> StoreResult<()> {
        sqlx::query("UPDATE plugin_states SET digest = $1 WHERE connector_id = $2 AND digest IS NULL AND enabled = 1")
            .bind(digest)
            .bind(connector_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Records a plugin as disabled unless it has a state already.
    pub(crate) async fn register_plugin_disabled(&self, connector_id: &str) -> StoreResult<()> {
        sqlx::query("INSERT INTO plugin_states (connector_id, enabled, updated_at, updated_by) VALUES ($1, 0, $2, NULL) ON CONFLICT (connector_id) DO NOTHING")
            .bind(connector_id)
            .bind(super::now_ms())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Whether a user is an installation operator.
    pub(crate) async fn is_operator(&self, user_id: &str) -> StoreResult<bool> {
        let row =
            sqlx::query("SELECT operator FROM users WHERE id = $1").bind(user_id).fetch_optional(self.pool()).await?;
        Ok(row.map(|r| r.try_get::<i64, _>("operator")).transpose()?.is_some_and(|o| o != 0))
    }

    pub(crate) async fn set_operator(&self, user_id: &str, operator: bool) -> StoreResult<()> {
        sqlx::query("UPDATE users SET operator = $1 WHERE id = $2")
            .bind(i64::from(operator))
            .bind(user_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}
