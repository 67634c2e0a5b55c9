//! The tables of a destination database the service owns: listed in
//! `_service_tables`, with their columns, so nothing is dropped, emptied or
//! written that someone else made.
//!
//! What the two SQL kinds share lives here too: the tables a job has seen
//! and their columns ([`Tables`]), and a batch's rows laid out for an
//! upsert ([`SqlRows`]), which each kind then encodes its own way
//! (`sqlite::batch`, `postgres::batch`).

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::Row as _;
use sqlx::sqlite::SqlitePool;

use super::shape::{Rows, Shaped};
use super::sqlite::{Checkpointer, RowWriter};
use super::{METADATA_COLUMNS, WriteError, failed, quote};
use crate::store::pipelines::StreamSyncMode;

/// A destination database.
pub(crate) enum Db {
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
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {} (\"name\" TEXT PRIMARY KEY, \"created_at\" BIGINT NOT NULL)",
            quote(REGISTRY)
        );
        if self.execute(create.clone()).await.is_err() {
            // Two streams of a spread sync creating it at once on
            // PostgreSQL: the one that lost the race finds it made.
            self.execute(create).await.map_err(|e| failed(&format!("cannot create {REGISTRY}"), e))?;
        }
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

    /// Up to `limit` rows of the service's `table` whose key comes after
    /// `after` and whose metadata is `meta` (the rows of one pipeline), in
    /// key order: each its key and the text of `columns` (null for a column
    /// the table does not have). None when there is no such table.
    pub(crate) async fn rows_after(
        &self,
        table: &str,
        columns: &[&str],
        (after, meta): (&str, &str),
        limit: i64,
    ) -> Result<Vec<(String, Vec<Option<String>>)>, WriteError> {
        let existing = self.claim(table).await?;
        if existing.is_empty() {
            return Ok(Vec::new());
        }
        let select = text_columns(&existing, columns);
        let (key, from, owner) = (quote("_service_raw_id"), quote(table), quote("_service_meta"));
        let sql = |p: &dyn Fn(usize) -> String| {
            format!(
                "SELECT {key}, {select} FROM {from} WHERE {key} > {} AND {owner} = {} ORDER BY {key} LIMIT {}",
                p(1),
                p(2),
                p(3)
            )
        };
        self.keyed_texts(table, sql, &[Bind::Text(after), Bind::Text(meta), Bind::Int(limit)], columns.len()).await
    }

    /// The rows of the service's `table` with these keys (any order), each
    /// key with `columns` as text (NULL where the table lacks a column).
    pub(crate) async fn rows_with_keys(
        &self,
        table: &str,
        columns: &[&str],
        keys: &[String],
    ) -> Result<Vec<(String, Vec<Option<String>>)>, WriteError> {
        let existing = self.claim(table).await?;
        if keys.is_empty() || existing.is_empty() {
            return Ok(Vec::new());
        }
        let select = text_columns(&existing, columns);
        let (key, from) = (quote("_service_raw_id"), quote(table));
        let mut found = Vec::new();
        for some in keys.chunks(500) {
            let sql = |p: &dyn Fn(usize) -> String| {
                let list: Vec<String> = (1..=some.len()).map(p).collect();
                format!("SELECT {key}, {select} FROM {from} WHERE {key} IN ({})", list.join(", "))
            };
            let binds: Vec<Bind<'_>> = some.iter().map(|k| Bind::Text(k)).collect();
            found.extend(self.keyed_texts(table, sql, &binds, columns.len()).await?);
        }
        Ok(found)
    }

    /// Runs a SELECT of the key and `width` columns as text (`sql` given
    /// the engine's placeholder for each position) with `binds`: each row
    /// as its key and values.
    async fn keyed_texts<F>(
        &self,
        table: &str,
        sql: F,
        binds: &[Bind<'_>],
        width: usize,
    ) -> Result<Vec<(String, Vec<Option<String>>)>, WriteError>
    where
        F: Fn(&dyn Fn(usize) -> String) -> String + Sync,
    {
        let reading = |e| failed(&format!("cannot read {table}"), e);
        let rows = match self {
            Db::Sqlite(pool, ..) => binds
                .iter()
                .fold(sqlx::query(sqlx::AssertSqlSafe(sql(&|_| "?".to_owned()))), |q, b| match b {
                    Bind::Text(t) => q.bind(*t),
                    Bind::Int(n) => q.bind(*n),
                })
                .fetch_all(pool)
                .await
                .map_err(reading)?
                .iter()
                .map(|r| (0..=width).map(|i| r.try_get::<Option<String>, _>(i)).collect())
                .collect::<Result<Vec<Vec<Option<String>>>, _>>(),
            Db::Postgres(pool) => binds
                .iter()
                .fold(sqlx::query(sqlx::AssertSqlSafe(sql(&|i| format!("${i}")))), |q, b| match b {
                    Bind::Text(t) => q.bind(*t),
                    Bind::Int(n) => q.bind(*n),
                })
                .fetch_all(pool)
                .await
                .map_err(reading)?
                .iter()
                .map(|r| (0..=width).map(|i| r.try_get::<Option<String>, _>(i)).collect())
                .collect::<Result<Vec<Vec<Option<String>>>, _>>(),
        }
        .map_err(reading)?;
        Ok(rows
            .into_iter()
            .map(|mut values| {
                let key = values.remove(0).unwrap_or_default();
                (key, values)
            })
            .collect())
    }

    /// Deletes the rows of the service's `table` with these keys; how many
    /// it deleted.
    pub(crate) async fn delete_keys(&self, table: &str, keys: &[String]) -> Result<u64, WriteError> {
        if keys.is_empty() || self.claim(table).await?.is_empty() {
            return Ok(0);
        }
        let mut deleted = 0;
        for some in keys.chunks(500) {
            let sql = |p: &dyn Fn(usize) -> String| {
                let list: Vec<String> = (1..=some.len()).map(p).collect();
                format!("DELETE FROM {} WHERE \"_service_raw_id\" IN ({})", quote(table), list.join(", "))
            };
            let gone = match self {
                Db::Sqlite(pool, ..) => {
                    let sql = sql(&|_| "?".to_owned());
                    some.iter()
                        .fold(sqlx::query(sqlx::AssertSqlSafe(sql)), |q, k| q.bind(k))
                        .execute(pool)
                        .await
                        .map(|r| r.rows_affected())
                }
                Db::Postgres(pool) => {
                    let sql = sql(&|i| format!("${i}"));
                    some.iter()
                        .fold(sqlx::query(sqlx::AssertSqlSafe(sql)), |q, k| q.bind(k))
                        .execute(pool)
                        .await
                        .map(|r| r.rows_affected())
                }
            };
            deleted += gone.map_err(|e| failed(&format!("cannot delete from {table}"), e))?;
        }
        Ok(deleted)
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

/// A destination database and the columns each table is known to have in
/// it (and whether binary `COPY` can write each, see [`Db::columns`]).
pub struct Tables {
    pub(crate) db: Db,
    columns: tokio::sync::Mutex<HashMap<String, HashMap<String, bool>>>,
}

/// A batch's rows laid out for an SQL upsert: the record fields it has
/// (besides the metadata columns), every column's quoted name (metadata
/// first), the `ON CONFLICT` clause, and the rows.
pub(crate) struct SqlRows<'r> {
    pub(crate) columns: Vec<String>,
    pub(crate) names: Vec<String>,
    pub(crate) upsert: String,
    pub(crate) rows: Vec<super::shape::Row<'r>>,
}

impl<'r> SqlRows<'r> {
    /// Lays the `shaped` records out, or `None` when the batch is too wide
    /// to lay out at once ([`super::shape::MAX_CELLS`]) and is to be
    /// written in parts.
    pub(super) fn lay_out(shaped: Vec<Shaped<'r>>, mode: StreamSyncMode) -> Result<Option<Self>, WriteError> {
        let dedupe = mode == StreamSyncMode::IncrementalDeduped;
        let Some(Rows { columns, rows }) =
            Rows::collect(shaped, dedupe, super::shape::MAX_CELLS).map_err(WriteError::BadRecord)?
        else {
            return Ok(None);
        };
        let mut names: Vec<String> = METADATA_COLUMNS.iter().map(|c| quote(c)).collect();
        names.extend(columns.iter().map(|c| quote(c)));
        let upsert = format!(
            " ON CONFLICT (\"_service_raw_id\") DO UPDATE SET {}",
            names[1..].iter().map(|n| format!("{n} = excluded.{n}")).collect::<Vec<_>>().join(", ")
        );
        Ok(Some(SqlRows { columns, names, upsert, rows }))
    }
}

impl Tables {
    pub(crate) fn new(db: Db) -> Self {
        Tables { db, columns: Default::default() }
    }

    /// Makes sure the stream's table has every column of `fields`; tells
    /// whether binary `COPY` can write them all (and the metadata columns).
    pub(crate) async fn ensure_columns(&self, table: &str, fields: &[String]) -> Result<bool, WriteError> {
        let db = &self.db;
        // Held throughout, so concurrent batches do not race to add a column.
        let mut columns = self.columns.lock().await;
        if !columns.contains_key(table) {
            let existing = db.claim(table).await?;
            let existing = if existing.is_empty() {
                // Keys compare byte-wise: PostgreSQL's default collation would
                // make every index comparison a locale-aware one.
                let key_type = match db {
                    Db::Sqlite(..) => "TEXT",
                    Db::Postgres(_) => "TEXT COLLATE \"C\"",
                };
                let create = format!(
                    "CREATE TABLE IF NOT EXISTS {} (\"_service_raw_id\" {key_type} PRIMARY KEY, \"_service_extracted_at\" BIGINT NOT NULL, \"_service_meta\" TEXT NOT NULL)",
                    quote(table)
                );
                db.execute(create).await.map_err(|e| failed(&format!("cannot create table {table}"), e))?;
                db.register(table).await?;
                db.columns(table).await.map_err(|e| failed("", e))?
            } else {
                existing
            };
            columns.insert(table.to_owned(), existing);
        }
        let known = columns.get_mut(table).expect("inserted above");
        for f in fields {
            if !known.contains_key(f) {
                let alter = format!("ALTER TABLE {} ADD COLUMN {} TEXT", quote(table), quote(f));
                if let Err(e) = db.execute(alter).await {
                    // Another writer may have added it meanwhile.
                    if !e.to_string().to_lowercase().contains("duplicate") && !e.to_string().contains("already exists")
                    {
                        return Err(failed(&format!("cannot add column {f} to {table}"), e));
                    }
                }
                known.insert(f.clone(), true);
            }
        }
        let binary = |c: &str| known.get(c).copied().unwrap_or(true);
        Ok(METADATA_COLUMNS.iter().copied().chain(fields.iter().map(String::as_str)).all(binary))
    }

    /// Drops `table` when it is the service's (see [`Db::claim`]).
    pub(crate) async fn drop_table(&self, table: &str) -> Result<(), WriteError> {
        if self.db.claim(table).await?.is_empty() {
            return Ok(());
        }
        self.db.execute(format!("DROP TABLE IF EXISTS {}", quote(table))).await.map_err(|e| failed("", e))?;
        self.db.unregister(table).await?;
        self.columns.lock().await.remove(table);
        Ok(())
    }

    /// Closes the connections.
    pub(crate) async fn close(self) {
        match self.db {
            Db::Sqlite(pool, writer, checkpointer) => {
                drop(writer);
                checkpointer.close().await;
                pool.close().await;
            }
            Db::Postgres(pool) => pool.close().await,
        }
    }
}

/// A value bound to a read's placeholder.
enum Bind<'a> {
    Text(&'a str),
    Int(i64),
}

/// `columns` of a table as text, for a SELECT list: NULL for a column the
/// table (`existing`) does not have.
fn text_columns(existing: &HashMap<String, bool>, columns: &[&str]) -> String {
    let select: Vec<String> = columns
        .iter()
        .map(|c| if existing.contains_key(*c) { format!("CAST({} AS TEXT)", quote(c)) } else { "NULL".into() })
        .collect();
    select.join(", ")
}
