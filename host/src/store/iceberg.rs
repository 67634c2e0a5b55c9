//! The Iceberg SQL catalog of lakehouse destinations: namespaces and the
//! pointer from each table to its current metadata file. A commit moves
//! the pointer with a compare-and-set, so concurrent writers (threads or
//! servers) never lose one another's commits: the loser sees
//! [`Swapped::Raced`] and retries on the new metadata.

use std::collections::HashMap;

use sqlx::Row;

use super::{ResultExt, Store, StoreResult};

/// How a compare-and-set of a table's metadata location ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swapped {
    Done,
    /// Another commit moved the pointer first.
    Raced,
}

/// A stream's state to save with a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCheckpoint {
    pub pipeline_id: String,
    pub stream: String,
    pub state: String,
}

/// Records a table: binds the catalog, namespace, table and metadata
/// location.
const INSERT_TABLE: &str = "INSERT INTO iceberg_tables \
     (catalog_name, table_namespace, table_name, metadata_location, iceberg_type) VALUES ($1, $2, $3, $4, 'TABLE')";

/// Marks a namespace as existing, whatever else it holds.
const EXISTS: &str = "exists";

impl Store {
    /// Creates a namespace with its properties; false when it existed.
    pub async fn create_iceberg_namespace(
        &self,
        catalog: &str,
        namespace: &str,
        properties: &HashMap<String, String>,
    ) -> StoreResult<bool> {
        let mut tx = self.begin_write().await?;
        let created = sqlx::query(
            "INSERT INTO iceberg_namespace_properties (catalog_name, namespace, property_key, property_value) \
             VALUES ($1, $2, $3, 'true') ON CONFLICT DO NOTHING",
        )
        .bind(catalog)
        .bind(namespace)
        .bind(EXISTS)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if created {
            for (key, value) in properties.iter().filter(|(k, _)| k.as_str() != EXISTS) {
                sqlx::query(
                    "INSERT INTO iceberg_namespace_properties (catalog_name, namespace, property_key, property_value) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(catalog)
                .bind(namespace)
                .bind(key)
                .bind(value)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(created)
    }

    /// A namespace's properties, if it exists.
    pub async fn iceberg_namespace(
        &self,
        catalog: &str,
        namespace: &str,
    ) -> StoreResult<Option<HashMap<String, String>>> {
        let rows = sqlx::query(
            "SELECT property_key, property_value FROM iceberg_namespace_properties \
             WHERE catalog_name = $1 AND namespace = $2",
        )
        .bind(catalog)
        .bind(namespace)
        .fetch_all(self.pool())
        .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut out = HashMap::new();
        for r in &rows {
            let key: String = r.try_get("property_key")?;
            if key != EXISTS {
                out.insert(key, r.try_get::<Option<String>, _>("property_value")?.unwrap_or_default());
            }
        }
        Ok(Some(out))
    }

    /// The namespaces of a catalog, by name.
    pub async fn iceberg_namespaces(&self, catalog: &str) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT DISTINCT namespace FROM iceberg_namespace_properties WHERE catalog_name = $1 ORDER BY namespace",
        )
        .bind(catalog)
        .fetch_all(self.pool())
        .await?)
    }

    /// Removes an empty namespace; false when it did not exist.
    pub async fn drop_iceberg_namespace(&self, catalog: &str, namespace: &str) -> StoreResult<bool> {
        let n = sqlx::query("DELETE FROM iceberg_namespace_properties WHERE catalog_name = $1 AND namespace = $2")
            .bind(catalog)
            .bind(namespace)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    /// The tables of a namespace, by name.
    pub async fn iceberg_tables(&self, catalog: &str, namespace: &str) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT table_name FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2 \
             AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL) ORDER BY table_name",
        )
        .bind(catalog)
        .bind(namespace)
        .fetch_all(self.pool())
        .await?)
    }

    /// Where a table's current metadata is, if the table exists.
    pub async fn iceberg_table(&self, catalog: &str, namespace: &str, table: &str) -> StoreResult<Option<String>> {
        let row = sqlx::query(
            "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2 \
             AND table_name = $3 AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
        )
        .bind(catalog)
        .bind(namespace)
        .bind(table)
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| r.try_get::<Option<String>, _>("metadata_location"))
            .transpose()
            .map(Option::flatten)
            .map_err(Into::into)
    }

    /// Records a new table at `metadata_location`; a conflict when the
    /// name is taken.
    pub async fn create_iceberg_table(
        &self,
        catalog: &str,
        namespace: &str,
        table: &str,
        metadata_location: &str,
    ) -> StoreResult<()> {
        sqlx::query(INSERT_TABLE)
            .bind(catalog)
            .bind(namespace)
            .bind(table)
            .bind(metadata_location)
            .execute(self.pool())
            .await
            .on_conflict("iceberg_table_exists")?;
        Ok(())
    }

    /// Moves a table's pointer from `expected` to `next`, if it still is
    /// at `expected`; with a checkpoint, saves that stream state in the
    /// same transaction, so the state covers exactly what the table holds.
    pub async fn swap_iceberg_table(
        &self,
        catalog: &str,
        namespace: &str,
        table: &str,
        expected: &str,
        next: &str,
        checkpoint: Option<&StreamCheckpoint>,
    ) -> StoreResult<Swapped> {
        let mut tx = self.begin_write().await?;
        let n = sqlx::query(
            "UPDATE iceberg_tables SET metadata_location = $1, previous_metadata_location = $2 \
             WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5 AND metadata_location = $2",
        )
        .bind(next)
        .bind(expected)
        .bind(catalog)
        .bind(namespace)
        .bind(table)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n != 1 {
            return Ok(Swapped::Raced);
        }
        if let Some(c) = checkpoint {
            sqlx::query(super::pipelines::SAVE_STREAM_STATE)
                .bind(&c.pipeline_id)
                .bind(&c.stream)
                .bind(&c.state)
                .bind(super::now_ms())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Swapped::Done)
    }

    /// Points `table` at `staged`'s current metadata and forgets `staged`,
    /// in one transaction: readers find the old contents or the new, never
    /// a mix. `table` is created when it did not exist. False when
    /// `staged` does not exist.
    pub async fn replace_iceberg_table(
        &self,
        catalog: &str,
        namespace: &str,
        table: &str,
        staged: &str,
    ) -> StoreResult<bool> {
        let mut tx = self.begin_write().await?;
        let located = sqlx::query_scalar::<_, Option<String>>(
            "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2 \
             AND table_name = $3",
        )
        .bind(catalog)
        .bind(namespace)
        .bind(staged)
        .fetch_optional(&mut *tx)
        .await?
        .flatten();
        let Some(location) = located else { return Ok(false) };
        let moved = sqlx::query(
            "UPDATE iceberg_tables SET previous_metadata_location = metadata_location, metadata_location = $1 \
             WHERE catalog_name = $2 AND table_namespace = $3 AND table_name = $4",
        )
        .bind(&location)
        .bind(catalog)
        .bind(namespace)
        .bind(table)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if moved == 0 {
            sqlx::query(INSERT_TABLE)
                .bind(catalog)
                .bind(namespace)
                .bind(table)
                .bind(&location)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("DELETE FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3")
            .bind(catalog)
            .bind(namespace)
            .bind(staged)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Every table of a catalog with its current metadata, by namespace
    /// and name.
    pub async fn iceberg_catalog_tables(&self, catalog: &str) -> StoreResult<Vec<(String, String, String)>> {
        let rows = sqlx::query(
            "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables \
             WHERE catalog_name = $1 AND metadata_location IS NOT NULL ORDER BY table_namespace, table_name",
        )
        .bind(catalog)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("table_namespace")?, r.try_get("table_name")?, r.try_get("metadata_location")?)))
            .collect()
    }

    /// Forgets a table (its files stay where they are); false when it did
    /// not exist.
    pub async fn drop_iceberg_table(&self, catalog: &str, namespace: &str, table: &str) -> StoreResult<bool> {
        let n = sqlx::query(
            "DELETE FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3",
        )
        .bind(catalog)
        .bind(namespace)
        .bind(table)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(n == 1)
    }
}
