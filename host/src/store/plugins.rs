//! Enabled state of connector plugins, shared by all replicas.

use std::collections::HashMap;

use sqlx::Row;

use super::{Store, StoreResult, now_ms};

impl Store {
    /// Whether a connector is enabled (never-touched plugins are).
    pub async fn plugin_enabled(&self, connector_id: &str) -> StoreResult<bool> {
        let row = sqlx::query("SELECT enabled FROM plugin_states WHERE connector_id = $1")
            .bind(connector_id)
            .fetch_optional(self.pool())
            .await?;
        Ok(row.map(|r| r.try_get::<i64, _>("enabled")).transpose()?.is_none_or(|e| e != 0))
    }

    /// Every recorded state.
    pub async fn plugin_states(&self) -> StoreResult<HashMap<String, bool>> {
        let rows = sqlx::query("SELECT connector_id, enabled FROM plugin_states").fetch_all(self.pool()).await?;
        rows.iter().map(|r| Ok((r.try_get("connector_id")?, r.try_get::<i64, _>("enabled")? != 0))).collect()
    }

    pub async fn set_plugin_enabled(&self, connector_id: &str, enabled: bool, by: Option<&str>) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO plugin_states (connector_id, enabled, updated_at, updated_by) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (connector_id) DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at, updated_by = excluded.updated_by",
        )
        .bind(connector_id)
        .bind(i64::from(enabled))
        .bind(now_ms())
        .bind(by)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Records a plugin as disabled unless it has a state already.
    pub async fn register_plugin_disabled(&self, connector_id: &str) -> StoreResult<()> {
        sqlx::query("INSERT INTO plugin_states (connector_id, enabled, updated_at, updated_by) VALUES ($1, 0, $2, NULL) ON CONFLICT (connector_id) DO NOTHING")
            .bind(connector_id)
            .bind(super::now_ms())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Whether a user is an installation operator.
    pub async fn is_operator(&self, user_id: &str) -> StoreResult<bool> {
        let row = sqlx::query("SELECT operator FROM users WHERE id = $1").bind(user_id).fetch_optional(self.pool()).await?;
        Ok(row.map(|r| r.try_get::<i64, _>("operator")).transpose()?.is_some_and(|o| o != 0))
    }

    pub async fn set_operator(&self, user_id: &str, operator: bool) -> StoreResult<()> {
        sqlx::query("UPDATE users SET operator = $1 WHERE id = $2").bind(i64::from(operator)).bind(user_id).execute(self.pool()).await?;
        Ok(())
    }
}
