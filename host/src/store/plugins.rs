//! Enabled state of connector plugins and the digest each is pinned to,
//! shared by all replicas.

use std::collections::HashMap;

use sqlx::Row;

use super::{Store, StoreResult, now_ms};

/// The operator's switch for one connector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PluginState {
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
    pub(crate) async fn plugin_state(&self, connector_id: &str) -> StoreResult<PluginState> {
        let row = sqlx::query("SELECT enabled, digest FROM plugin_states WHERE connector_id = $1")
            .bind(connector_id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(state_from_row).transpose().map(|s| s.unwrap_or(PluginState::UNTOUCHED))
    }

    /// Every recorded state.
    pub(crate) async fn plugin_states(&self) -> StoreResult<HashMap<String, PluginState>> {
        let rows =
            sqlx::query("SELECT connector_id, enabled, digest FROM plugin_states").fetch_all(self.pool()).await?;
        rows.iter().map(|r| Ok((r.try_get("connector_id")?, state_from_row(r)?))).collect()
    }

    /// Switches a connector on (pinned to `digest`, when given) or off
    /// (keeping the digest it was pinned to).
    pub(crate) async fn set_plugin_enabled(
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

/// One installed component of a connector, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginVersion {
    pub connector_id: String,
    /// SHA-256 of the component, hex.
    pub digest: String,
    /// The version the component declares.
    pub version: String,
    /// The WIT interface version it exports.
    pub interface: String,
    /// The trusted key that signed it when it was installed.
    pub signer: Option<String>,
    /// Where it came from: `file:<name>` or an `oci://` reference.
    pub origin: String,
    pub added_at: i64,
}

/// A component to install, verified by the caller.
pub(crate) struct NewPluginVersion<'a> {
    pub version: &'a PluginVersion,
    /// The signature file as it was found (JSON), when signed.
    pub signature: Option<&'a str>,
    pub component: &'a [u8],
}

fn version_from_row(r: &sqlx::any::AnyRow) -> StoreResult<PluginVersion> {
    Ok(PluginVersion {
        connector_id: r.try_get("connector_id")?,
        digest: r.try_get("digest")?,
        version: r.try_get("version")?,
        interface: r.try_get("interface")?,
        signer: r.try_get("signer")?,
        origin: r.try_get("origin")?,
        added_at: r.try_get("added_at")?,
    })
}

impl Store {
    /// Installs a component unless the same one is installed already.
    /// `true` when it is new.
    pub(crate) async fn add_plugin_version(&self, new: &NewPluginVersion<'_>) -> StoreResult<bool> {
        use base64::Engine as _;
        let v = new.version;
        let done = sqlx::query(
            "INSERT INTO plugin_versions (connector_id, digest, version, interface, signer, signature, origin, component, added_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (connector_id, digest) DO NOTHING",
        )
        .bind(&v.connector_id)
        .bind(&v.digest)
        .bind(&v.version)
        .bind(&v.interface)
        .bind(&v.signer)
        .bind(new.signature)
        .bind(&v.origin)
        .bind(base64::engine::general_purpose::STANDARD.encode(new.component))
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// A connector's installed components, oldest first.
    pub(crate) async fn plugin_versions(&self, connector_id: &str) -> StoreResult<Vec<PluginVersion>> {
        let rows = sqlx::query(
            "SELECT connector_id, digest, version, interface, signer, origin, added_at FROM plugin_versions \
             WHERE connector_id = $1 ORDER BY added_at, digest",
        )
        .bind(connector_id)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(version_from_row).collect()
    }

    /// An installed component's bytes and the signature file it came with.
    pub(crate) async fn plugin_component(
        &self,
        connector_id: &str,
        digest: &str,
    ) -> StoreResult<Option<(Vec<u8>, Option<String>)>> {
        use base64::Engine as _;
        let row =
            sqlx::query("SELECT component, signature FROM plugin_versions WHERE connector_id = $1 AND digest = $2")
                .bind(connector_id)
                .bind(digest)
                .fetch_optional(self.pool())
                .await?;
        let Some(row) = row else { return Ok(None) };
        let text: String = row.try_get("component")?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| {
            super::StoreError::Database(sqlx::Error::ColumnDecode { index: "component".into(), source: Box::new(e) })
        })?;
        Ok(Some((bytes, row.try_get("signature")?)))
    }

    /// Makes `digest` the component every replica runs for a connector and
    /// enables it; `None` runs the bundled build.
    pub(crate) async fn use_plugin_version(
        &self,
        connector_id: &str,
        digest: Option<&str>,
        by: Option<&str>,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO plugin_states (connector_id, enabled, updated_at, updated_by, digest) VALUES ($1, 1, $2, $3, $4) \
             ON CONFLICT (connector_id) DO UPDATE SET enabled = 1, updated_at = excluded.updated_at, \
             updated_by = excluded.updated_by, digest = excluded.digest",
        )
        .bind(connector_id)
        .bind(now_ms())
        .bind(by)
        .bind(digest)
        .execute(self.pool())
        .await?;
        Ok(())
    }
}
