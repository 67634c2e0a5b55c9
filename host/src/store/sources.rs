//! Sources and the guard that keeps a source while pipelines use it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::Row;
use utoipa::ToSchema;

use super::destinations::DeleteRefused;
use super::{Store, StoreResult, from_ms, new_id, now_ms};

/// A configured source.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Source {
    pub source_id: String,
    pub workspace_id: String,
    /// The canonical connector id (legacy aliases are resolved on input).
    pub connector_id: String,
    pub name: String,
    /// Non-secret settings and credential handles.
    pub configuration: Value,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn from_row(r: &sqlx::any::AnyRow) -> StoreResult<Source> {
    let configuration: String = r.try_get("configuration")?;
    Ok(Source {
        source_id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        connector_id: r.try_get("connector_id")?,
        name: r.try_get("name")?,
        configuration: serde_json::from_str(&configuration).unwrap_or(Value::Null),
        created_by: r.try_get("created_by")?,
        created_at: from_ms(r.try_get("created_at")?),
        updated_at: from_ms(r.try_get("updated_at")?),
    })
}

const COLUMNS: &str = "id, workspace_id, connector_id, name, configuration, created_by, created_at, updated_at";

impl Store {
    /// The catalog kept for `source_id`, when it was discovered by the
    /// plugin of `plugin_digest` for `configuration`.
    pub(crate) async fn source_catalog(
        &self,
        source_id: &str,
        plugin_digest: &str,
        configuration: &str,
    ) -> StoreResult<Option<Value>> {
        let row = sqlx::query(
            "SELECT catalog FROM source_catalogs WHERE source_id = $1 AND plugin_digest = $2 AND configuration = $3",
        )
        .bind(source_id)
        .bind(plugin_digest)
        .bind(configuration)
        .fetch_optional(self.pool())
        .await?;
        let Some(row) = row else { return Ok(None) };
        let text: String = row.try_get("catalog")?;
        Ok(serde_json::from_str(&text).ok())
    }

    /// Keeps `catalog` as what the plugin of `plugin_digest` discovered
    /// for `source_id` with `configuration`, in place of any kept before.
    pub(crate) async fn save_source_catalog(
        &self,
        source_id: &str,
        plugin_digest: &str,
        configuration: &str,
        catalog: &Value,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO source_catalogs (source_id, plugin_digest, configuration, catalog, discovered_at) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (source_id) DO UPDATE SET plugin_digest = excluded.plugin_digest, \
             configuration = excluded.configuration, catalog = excluded.catalog, discovered_at = excluded.discovered_at",
        )
        .bind(source_id)
        .bind(plugin_digest)
        .bind(configuration)
        .bind(catalog.to_string())
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    pub async fn create_source(
        &self,
        workspace_id: &str,
        connector_id: &str,
        name: &str,
        configuration: &Value,
        created_by: &str,
    ) -> StoreResult<Source> {
        let id = new_id("src");
        let now = now_ms();
        sqlx::query(
            "INSERT INTO sources (id, workspace_id, connector_id, name, configuration, created_by, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7)",
        )
        .bind(&id)
        .bind(workspace_id)
        .bind(connector_id)
        .bind(name)
        .bind(configuration.to_string())
        .bind(created_by)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(self.source(workspace_id, &id).await?.expect("just inserted"))
    }

    pub(crate) async fn source(&self, workspace_id: &str, source_id: &str) -> StoreResult<Option<Source>> {
        let sql = format!("SELECT {COLUMNS} FROM sources WHERE workspace_id = $1 AND id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(source_id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(from_row).transpose()
    }

    pub(crate) async fn sources(
        &self,
        workspace_id: &str,
        connector_id: Option<&str>,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Source>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM sources WHERE workspace_id = $1 AND ($2 IS NULL OR connector_id = $2) AND ($3 IS NULL OR id > $3) ORDER BY id LIMIT $4"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(workspace_id)
            .bind(connector_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(from_row).collect()
    }

    pub(crate) async fn update_source(
        &self,
        workspace_id: &str,
        source_id: &str,
        name: &str,
        configuration: &Value,
    ) -> StoreResult<Option<Source>> {
        let n = sqlx::query(
            "UPDATE sources SET name = $1, configuration = $2, updated_at = $3 WHERE workspace_id = $4 AND id = $5",
        )
        .bind(name)
        .bind(configuration.to_string())
        .bind(now_ms())
        .bind(workspace_id)
        .bind(source_id)
        .execute(self.pool())
        .await?
        .rows_affected();
        if n == 0 {
            return Ok(None);
        }
        self.source(workspace_id, source_id).await
    }

    /// Deletes a source unless a pipeline uses it (see
    /// [`Store::delete_unless_used`]).
    pub(crate) async fn delete_source(
        &self,
        workspace_id: &str,
        source_id: &str,
    ) -> StoreResult<Result<(), DeleteRefused>> {
        self.delete_unless_used("sources", workspace_id, source_id, &[("pipelines", "source_id")]).await
    }
}
