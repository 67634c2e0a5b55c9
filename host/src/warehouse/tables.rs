//! The tables of a destination database the service owns: listed in
//! `_service_tables`, with their columns, so nothing is dropped, emptied or
//! written that someone else made.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::Row as _;
use sqlx::sqlite::SqlitePool;

use super::sqlite::{Checkpointer, RowWriter};
use super::{METADATA_COLUMNS, WriteError, failed, quote};

/// A destination database.
pub enum Db {
    /// The pool's single connection (tables, columns, the registry), the
    /// connection that writes rows, and the one that moves committed pages
    /// into the database file.
    Sqlite(SqlitePool, Arc<std::sync::Mutex<RowWriter>>, Checkpointer),
    /// Its own driver rather than `Any`: batches go in with `COPY`.
    Postgres(sqlx::PgPool),
}

impl Db {
    pub(crate) async fn execute(&self, sql: String) -> Result<(), sqlx::Error> {
        match self {
            Db::Sqlite(pool, ..) => sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await.map(|_| ()),
            Db::Postgres(pool) => sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await.map(|_| ()),
        }
    }

    /// The columns `table` has (`table` went through [`sql_name`]), each
    /// with whether its type is one binary `COPY` writes as the host does:
    /// `TEXT` (or `VARCHAR`), and `BIGINT` for the extraction time. SQLite
    /// converts whatever it is given, so there every column is.
    pub(crate) async fn columns(&self, table: &str) -> Result<HashMap<String, bool>, sqlx::Error> {
        Ok(match self {
            Db::Sqlite(pool, ..) => sqlx::query(sqlx::AssertSqlSafe(format!("SELECT name FROM pragma_table_info('{table}')")))
                .fetch_all(pool)
                .await?
                .iter()
                .filter_map(|r| r.try_get::<String, _>(0).ok())
                .map(|name| (name, true))
                .collect(),
            Db::Postgres(pool) => sqlx::query("SELECT column_name::text, data_type::text FROM information_schema.columns WHERE table_name = $1 AND table_schema = current_schema()")
                .bind(table)
                .fetch_all(pool)
                .await?
                .iter()
                .filter_map(|r| Some((r.try_get::<String, _>(0).ok()?, r.try_get::<String, _>(1).ok()?)))
                .map(|(name, data_type)| {
                    let binary = match name.as_str() {
                        "_service_extracted_at" => data_type == "bigint",
                        _ => matches!(data_type.as_str(), "text" | "character varying"),
                    };
                    (name, binary)
                })
                .collect(),
        })
    }
}

/// The table in each warehouse where the service lists the tables it
/// created: it drops, empties and writes into those only.
pub(crate) const REGISTRY: &str = "_service_tables";

impl Db {
    /// The columns of `table` when it is the service's to write (empty
    /// when there is no such table yet). A table the registry does not list
    /// is the service's only if it has the metadata columns (tables from
    /// before the registry); it is then listed. Any other table of that
    /// name belongs to someone else, and the stream fails rather than
    /// drop, empty or write into it.
    pub(crate) async fn claim(&self, table: &str) -> Result<HashMap<String, bool>, WriteError> {
        if table == REGISTRY {
            return Err(WriteError::Refused(format!(
                "{REGISTRY} is the service's own table; a stream cannot be written into it"
            )));
        }
        self.execute(format!(
            "CREATE TABLE IF NOT EXISTS {} (\"name\" TEXT PRIMARY KEY, \"created_at\" BIGINT NOT NULL)",
            quote(REGISTRY)
        ))
        .await
        .map_err(|e| failed(&format!("cannot create {REGISTRY}"), e))?;
        let existing = self.columns(table).await.map_err(|e| failed("", e))?;
        if existing.is_empty() {
            return Ok(existing);
        }
        let listed = match self {
            Db::Sqlite(pool, ..) => sqlx::query("SELECT 1 FROM \"_service_tables\" WHERE name = ?")
                .bind(table)
                .fetch_optional(pool)
                .await
                .map(|r| r.is_some()),
            Db::Postgres(pool) => sqlx::query("SELECT 1 FROM \"_service_tables\" WHERE name = $1")
                .bind(table)
                .fetch_optional(pool)
                .await
                .map(|r| r.is_some()),
        }
        .map_err(|e| failed("", e))?;
        if !listed {
            if !METADATA_COLUMNS.iter().all(|c| existing.contains_key(*c)) {
                return Err(WriteError::Refused(format!(
                    "table {table} exists and was not created by the service; rename it, or choose another destination or stream"
                )));
            }
            self.register(table).await?;
        }
        Ok(existing)
    }

    /// Lists a table the service created.
    pub(crate) async fn register(&self, table: &str) -> Result<(), WriteError> {
        let now = crate::store::now_ms();
        match self {
            Db::Sqlite(pool, ..) => sqlx::query(
                "INSERT INTO \"_service_tables\" (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
            )
            .bind(table)
            .bind(now)
            .execute(pool)
            .await
            .map(|_| ()),
            Db::Postgres(pool) => sqlx::query(
                "INSERT INTO \"_service_tables\" (name, created_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            )
            .bind(table)
            .bind(now)
            .execute(pool)
            .await
            .map(|_| ()),
        }
        .map_err(|e| failed(&format!("cannot record table {table}"), e))
    }

    /// Forgets a dropped table.
    pub(crate) async fn unregister(&self, table: &str) -> Result<(), WriteError> {
        match self {
            Db::Sqlite(pool, ..) => sqlx::query("DELETE FROM \"_service_tables\" WHERE name = ?")
                .bind(table)
                .execute(pool)
                .await
                .map(|_| ()),
            Db::Postgres(pool) => sqlx::query("DELETE FROM \"_service_tables\" WHERE name = $1")
                .bind(table)
                .execute(pool)
                .await
                .map(|_| ()),
        }
        .map_err(|e| failed("", e))
    }
}
