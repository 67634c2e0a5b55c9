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
        sqlx::query(
            "INSERT INTO iceberg_tables (catalog_name, table_namespace, table_name, metadata_location, iceberg_type) \
             VALUES ($1, $2, $3, $4, 'TABLE')",
        )
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
    /// at `expected`.
    pub async fn swap_iceberg_table(
        &self,
        catalog: &str,
        namespace: &str,
        table: &str,
        expected: &str,
        next: &str,
    ) -> StoreResult<Swapped> {
        let n = sqlx::query(
            "UPDATE iceberg_tables SET metadata_location = $1, previous_metadata_location = $2 \
             WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5 AND metadata_location = $2",
        )
        .bind(next)
        .bind(expected)
        .bind(catalog)
        .bind(namespace)
        .bind(table)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(if n == 1 { Swapped::Done } else { Swapped::Raced })
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
