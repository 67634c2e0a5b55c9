//! The Iceberg SQL catalog of lakehouse destinations: namespaces and the
//! pointer from each table to its current metadata file. A commit moves
//! the pointer with a compare-and-set, so concurrent writers (threads or
//! servers) never lose one another's commits: the loser sees
//! [`Swapped::Raced`] and retries on the new metadata. A catalog is one
//! lakehouse warehouse folder, named `<workspace>/<folder>` (migration
//! 0020's comment, older, says the destination's id).

use std::collections::HashMap;

use sqlx::Row;

use super::jobs::JobLease;
use super::{ResultExt, Store, StoreResult};

/// How a compare-and-set of a table's metadata location ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Swapped {
    Done,
    /// Another commit moved the pointer first (or, for a replacement, the
    /// staged table is gone).
    Raced,
    /// The job attempt the commit was made for no longer holds its job.
    LeaseLost,
    /// A table the commit replaces changed since it was read: nothing
    /// was committed.
    Outdated,
}

/// What a commit carries besides the table's new pointer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CommitWith<'a> {
    /// The stream state to save in the same transaction.
    pub checkpoint: Option<&'a StreamCheckpoint>,
    /// The job attempt that must still hold its job.
    pub lease: Option<&'a JobLease>,
    /// Another table of the catalog to replace in the same transaction.
    pub replacing: Option<&'a Replacement>,
}

/// A table replaced by a staged sibling's contents in one step
/// ([`Store::replace_iceberg_table`]), provided it is still as it was
/// read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    /// The table replaced.
    pub live: String,
    /// The staged table whose contents it takes (and which is forgotten).
    pub staged: String,
    /// Where `live`'s metadata was when its contents were read: the
    /// replacement is [`Swapped::Outdated`] if it moved since.
    pub expected: Option<String>,
    /// Where `staged`'s metadata was when it was written in full: the
    /// replacement is [`Swapped::Raced`] if another writer (an attempt
    /// that lost its job) has remade it since.
    pub staged_at: Option<String>,
}

/// Whether `lease`'s attempt still holds its job, checked inside the
/// commit's transaction: the row is locked (PostgreSQL) or the whole
/// database is (SQLite), so a takeover waits until the commit is done and
/// then reads the state it saved.
async fn still_held(tx: &mut sqlx::Transaction<'static, sqlx::Any>, lease: Option<&JobLease>) -> StoreResult<bool> {
    let Some(lease) = lease else { return Ok(true) };
    let held = match &lease.stream {
        None => {
            sqlx::query("UPDATE jobs SET lease_owner = lease_owner WHERE id = $1 AND lease_owner = $2")
                .bind(&lease.job_id)
                .bind(&lease.owner)
                .execute(&mut **tx)
                .await?
        }
        Some(stream) => sqlx::query(
            "UPDATE job_streams SET lease_owner = lease_owner WHERE job_id = $1 AND stream = $2 AND lease_owner = $3",
        )
        .bind(&lease.job_id)
        .bind(stream)
        .bind(&lease.owner)
        .execute(&mut **tx)
        .await?,
    }
    .rows_affected();
    Ok(held == 1)
}

/// Saves `c` in the transaction `tx`.
async fn save_state(tx: &mut sqlx::Transaction<'static, sqlx::Any>, c: &StreamCheckpoint) -> StoreResult<()> {
    sqlx::query(super::pipelines::SAVE_STREAM_STATE)
        .bind(&c.pipeline_id)
        .bind(&c.stream)
        .bind(&c.state)
        .bind(super::now_ms())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// [`Store::replace_iceberg_table`]'s work inside the transaction `tx`
/// (which the caller commits only when it is done). Each pointer is
/// compared in the statement that moves it, so a commit that lands
/// between this transaction's reads and writes (PostgreSQL reads what
/// others committed) is never overwritten.
async fn replace_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    live: &IcebergTableName,
    replacement: &Replacement,
) -> StoreResult<Swapped> {
    let staged = live.sibling(&replacement.staged);
    let delete = format!(
        "DELETE FROM iceberg_tables WHERE {NAMED} AND ($4 IS NULL OR metadata_location = $4) \
         RETURNING metadata_location"
    );
    let located = staged
        .bind(sqlx::query(sqlx::AssertSqlSafe(delete)))
        .bind(replacement.staged_at.as_deref())
        .fetch_optional(&mut **tx)
        .await?
        .map(|r| r.try_get::<Option<String>, _>("metadata_location"))
        .transpose()?
        .flatten();
    let Some(location) = located else { return Ok(Swapped::Raced) };
    let update = format!(
        "UPDATE iceberg_tables SET previous_metadata_location = metadata_location, metadata_location = $4 \
         WHERE {NAMED} AND ($5 IS NULL OR metadata_location = $5)"
    );
    let moved = live
        .bind(sqlx::query(sqlx::AssertSqlSafe(update)))
        .bind(&location)
        .bind(replacement.expected.as_deref())
        .execute(&mut **tx)
        .await?
        .rows_affected();
    match (moved, &replacement.expected) {
        (0, Some(_)) => return Ok(Swapped::Outdated),
        (0, None) => {
            live.bind(sqlx::query(INSERT_TABLE)).bind(&location).execute(&mut **tx).await?;
        }
        _ => {}
    }
    Ok(Swapped::Done)
}

/// A stream's state to save with a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCheckpoint {
    pub pipeline_id: String,
    pub stream: String,
    pub state: String,
}

/// One table of a catalog, as the catalog's rows name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IcebergTableName {
    pub catalog: String,
    pub namespace: String,
    pub table: String,
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

impl IcebergTableName {
    /// The same table's namespace under another name (a staged table).
    fn sibling(&self, table: &str) -> IcebergTableName {
        IcebergTableName { table: table.to_owned(), ..self.clone() }
    }

    /// Binds the name as `$1`, `$2` and `$3`, the places [`NAMED`] and
    /// [`INSERT_TABLE`] give it.
    fn bind<'q>(&self, query: AnyQuery<'q>) -> AnyQuery<'q> {
        query.bind(self.catalog.clone()).bind(self.namespace.clone()).bind(self.table.clone())
    }
}

/// Matches one table row by its name, bound by [`IcebergTableName::bind`].
const NAMED: &str = "catalog_name = $1 AND table_namespace = $2 AND table_name = $3";

/// Records a table: binds its name, then its metadata location as `$4`.
const INSERT_TABLE: &str = "INSERT INTO iceberg_tables \
     (catalog_name, table_namespace, table_name, metadata_location, iceberg_type) VALUES ($1, $2, $3, $4, 'TABLE')";

/// Marks a namespace as existing, whatever else it holds.
const EXISTS: &str = "exists";

impl Store {
    /// Creates a namespace with its properties; false when it existed.
    pub(crate) async fn create_iceberg_namespace(
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
    pub(crate) async fn iceberg_namespace(
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
    pub(crate) async fn iceberg_namespaces(&self, catalog: &str) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT DISTINCT namespace FROM iceberg_namespace_properties WHERE catalog_name = $1 ORDER BY namespace",
        )
        .bind(catalog)
        .fetch_all(self.pool())
        .await?)
    }

    /// Removes an empty namespace; false when it did not exist.
    pub(crate) async fn drop_iceberg_namespace(&self, catalog: &str, namespace: &str) -> StoreResult<bool> {
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
    pub(crate) async fn iceberg_table(&self, name: &IcebergTableName) -> StoreResult<Option<String>> {
        let sql = format!(
            "SELECT metadata_location FROM iceberg_tables WHERE {NAMED} \
             AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)"
        );
        let row = name.bind(sqlx::query(sqlx::AssertSqlSafe(sql))).fetch_optional(self.pool()).await?;
        row.map(|r| r.try_get::<Option<String>, _>("metadata_location"))
            .transpose()
            .map(Option::flatten)
            .map_err(Into::into)
    }

    /// Records a new table at `metadata_location`; a conflict when the
    /// name is taken.
    pub(crate) async fn create_iceberg_table(
        &self,
        name: &IcebergTableName,
        metadata_location: &str,
    ) -> StoreResult<()> {
        name.bind(sqlx::query(INSERT_TABLE))
            .bind(metadata_location)
            .execute(self.pool())
            .await
            .on_conflict("iceberg_table_exists")?;
        Ok(())
    }

    /// Moves a table's pointer from `expected` to `next`, if it still is
    /// at `expected`; with a checkpoint, saves that stream state in the
    /// same transaction, so the state covers exactly what the table holds.
    pub(crate) async fn swap_iceberg_table(
        &self,
        name: &IcebergTableName,
        expected: &str,
        next: &str,
        with: CommitWith<'_>,
    ) -> StoreResult<Swapped> {
        let mut tx = self.begin_write().await?;
        if !still_held(&mut tx, with.lease).await? {
            return Ok(Swapped::LeaseLost);
        }
        let sql = format!(
            "UPDATE iceberg_tables SET metadata_location = $4, previous_metadata_location = $5 \
             WHERE {NAMED} AND metadata_location = $5"
        );
        let n = name
            .bind(sqlx::query(sqlx::AssertSqlSafe(sql)))
            .bind(next)
            .bind(expected)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n != 1 {
            return Ok(Swapped::Raced);
        }
        if let Some(c) = with.checkpoint {
            save_state(&mut tx, c).await?;
        }
        if let Some(r) = with.replacing {
            let replaced = replace_in(&mut tx, &name.sibling(&r.live), r).await?;
            if replaced != Swapped::Done {
                return Ok(replaced);
            }
        }
        tx.commit().await?;
        Ok(Swapped::Done)
    }

    /// Saves a stream's state alone (no file awaits a commit), while
    /// `lease`'s attempt still holds its job.
    pub(crate) async fn save_iceberg_checkpoint(
        &self,
        checkpoint: &StreamCheckpoint,
        lease: Option<&JobLease>,
    ) -> StoreResult<Swapped> {
        let mut tx = self.begin_write().await?;
        if !still_held(&mut tx, lease).await? {
            return Ok(Swapped::LeaseLost);
        }
        save_state(&mut tx, checkpoint).await?;
        tx.commit().await?;
        Ok(Swapped::Done)
    }

    /// Points `live` at `staged`'s current metadata and forgets `staged`,
    /// in one transaction: readers find the old contents or the new, never
    /// a mix. `live` is created when it did not exist. Raced when
    /// `staged` does not exist; outdated when `live`'s metadata is no
    /// longer at `replacement.expected`.
    pub(crate) async fn replace_iceberg_table(
        &self,
        catalog: &IcebergTableName,
        replacement: &Replacement,
        lease: Option<&JobLease>,
    ) -> StoreResult<Swapped> {
        let mut tx = self.begin_write().await?;
        if !still_held(&mut tx, lease).await? {
            return Ok(Swapped::LeaseLost);
        }
        let live = catalog.sibling(&replacement.live);
        let replaced = replace_in(&mut tx, &live, replacement).await?;
        if replaced == Swapped::Done {
            tx.commit().await?;
        }
        Ok(replaced)
    }

    /// The lakehouse warehouse folders a running sync loads, as
    /// (workspace, folder).
    pub(crate) async fn lakehouses_being_loaded(&self) -> StoreResult<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT d.workspace_id, d.configuration FROM jobs j JOIN pipelines p ON p.id = j.pipeline_id \
             JOIN destinations d ON d.id = p.destination_id WHERE j.status = 'running' AND d.kind = 'iceberg'",
        )
        .fetch_all(self.pool())
        .await?;
        let mut out = Vec::new();
        for r in &rows {
            let configuration: serde_json::Value =
                serde_json::from_str(&r.try_get::<String, _>("configuration")?).unwrap_or_default();
            if let Some(folder) = configuration["warehouse"].as_str() {
                out.push((r.try_get("workspace_id")?, folder.to_owned()));
            }
        }
        Ok(out)
    }

    /// The configuration of every lakehouse destination, with its
    /// workspace.
    pub(crate) async fn lakehouse_destinations(&self) -> StoreResult<Vec<(String, serde_json::Value)>> {
        let rows =
            sqlx::query("SELECT workspace_id, configuration FROM destinations WHERE kind = 'iceberg' ORDER BY id")
                .fetch_all(self.pool())
                .await?;
        let mut out = Vec::new();
        for r in &rows {
            let configuration = serde_json::from_str(&r.try_get::<String, _>("configuration")?).unwrap_or_default();
            out.push((r.try_get("workspace_id")?, configuration));
        }
        Ok(out)
    }

    /// The catalogs that hold a table.
    pub(crate) async fn iceberg_catalog_names(&self) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT DISTINCT catalog_name FROM iceberg_tables ORDER BY catalog_name")
            .fetch_all(self.pool())
            .await?)
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
    pub(crate) async fn drop_iceberg_table(&self, name: &IcebergTableName) -> StoreResult<bool> {
        let delete = format!("DELETE FROM iceberg_tables WHERE {NAMED}");
        let n = name.bind(sqlx::query(sqlx::AssertSqlSafe(delete))).execute(self.pool()).await?.rows_affected();
        Ok(n == 1)
    }
}
