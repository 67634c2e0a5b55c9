//! Warehouses: the destinations built into the host (an SQLite file, a
//! PostgreSQL database, a directory of JSON-lines files), and the only
//! place that speaks SQL to a tenant's database (the control database's
//! SQL lives in `store`).
//!
//! Each stream lands in its own table (or file) with three metadata columns
//! besides the record's top-level fields: `_service_raw_id` (the key:
//! derived from the primary key in deduplicated mode, random otherwise),
//! `_service_extracted_at` (Unix ms) and `_service_meta` (JSON). A field the
//! table has not seen yet adds a column instead of failing the sync. The
//! service lists the tables it creates in `_service_tables` and drops,
//! empties or writes only those.
//!
//! Files are written through a cap-std directory scoped to the
//! destination's folder under the workspace's own folder of the data
//! directory, so no configuration can make the host write anywhere else,
//! nor into another workspace's files. PostgreSQL destinations are reached
//! only as [`postgres`] allows.
//!
//! Layout:
//! - this module: configurations ([`validate`]), where a workspace's files
//!   live ([`Place`]), the [`Writer`] of one job and the tables it owns;
//! - [`shape`]: records into keys, fields and rows;
//! - [`sqlite`]: SQLite batches, the connection that writes their rows,
//!   and the WAL checkpointer;
//! - [`postgres`]: URLs, the address policy, connect options and `COPY`;
//! - [`jsonl`]: JSON-lines files;
//! - [`load`]: the [`Loader`] of one stream's batches and checkpoints;
//! - [`query`]: read-only queries that reverse-ETL models run.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use sqlx::Row as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use crate::error::ApiError;
use crate::store::kinds::DestinationKind;
use crate::store::pipelines::StreamSyncMode;
use postgres::{CopyData, POSTGRES_CONNECTIONS, copy_data, copy_rows, copy_text_from_binary};
use shape::{Rows, shape};
use sqlite::{BUSY_TIMEOUT, Checkpointer, RowWriter, SqliteRows, WAL_BACKSTOP_PAGES};

pub mod jsonl;
pub mod load;
pub mod postgres;
pub mod query;
pub mod shape;
pub mod sqlite;

pub use load::{Loader, Written};

/// Where a job's destination lives and what it may reach: files of a
/// workspace stay under that workspace's own folders, so no other
/// workspace can name them (a destination's `file` is only a name, and the
/// folder is the workspace's), and databases are reached only as the
/// operator allows.
pub struct Place<'a> {
    pub data_dir: &'a Path,
    pub workspace_id: &'a str,
    pub warehouses: &'a postgres::WarehousePolicy,
}

impl Place<'_> {
    /// `<data-dir>/warehouses/<workspace>`: the workspace's SQLite files.
    pub fn warehouse_dir(&self) -> std::path::PathBuf {
        self.data_dir.join("warehouses").join(self.workspace_id)
    }

    /// `<data-dir>/exports/<workspace>`: the workspace's JSON-lines folders.
    pub fn export_dir(&self) -> std::path::PathBuf {
        self.data_dir.join("exports").join(self.workspace_id)
    }
}

/// Moves files that destinations kept directly under `warehouses/` and
/// `exports/` (before each workspace had folders of its own) into their
/// workspace's folder, when exactly one workspace names them. A file that
/// several workspaces named is left where it is, with a warning: it cannot
/// be told whose it is, and each workspace starts a file of its own.
pub async fn relocate_shared_files(store: &crate::store::Store, data_dir: &Path) {
    let Ok(destinations) = store.file_destinations().await else { return };
    let legacy = |d: &crate::store::pipelines::Destination| -> Option<(&'static str, String)> {
        match d.kind {
            DestinationKind::Sqlite => d.configuration["file"].as_str().map(|f| ("warehouses", f.to_owned())),
            DestinationKind::Jsonl => d.configuration["directory"].as_str().map(|f| ("exports", f.to_owned())),
            DestinationKind::Postgres => None,
        }
    };
    for d in &destinations {
        let Some((folder, name)) = legacy(d) else { continue };
        let old = data_dir.join(folder).join(&name);
        let new_dir = data_dir.join(folder).join(&d.workspace_id);
        if !old.exists() || new_dir.join(&name).exists() || name.contains('/') {
            continue;
        }
        let claimants: std::collections::BTreeSet<&str> = destinations
            .iter()
            .filter(|o| legacy(o).is_some_and(|(f, n)| f == folder && n == name))
            .map(|o| o.workspace_id.as_str())
            .collect();
        if claimants.len() > 1 {
            tracing::warn!(file = %old.display(), workspaces = ?claimants, "a file several workspaces named is left in place; each workspace now writes a file of its own");
            continue;
        }
        if let Err(e) = std::fs::create_dir_all(&new_dir) {
            tracing::warn!(error = %e, "cannot create {}", new_dir.display());
            continue;
        }
        // SQLite's side files move with the database.
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let from = data_dir.join(folder).join(format!("{name}{suffix}"));
            if from.exists()
                && let Err(e) = std::fs::rename(&from, new_dir.join(format!("{name}{suffix}")))
            {
                tracing::warn!(error = %e, file = %from.display(), "could not move a destination file");
            }
        }
        tracing::info!(file = %old.display(), workspace = %d.workspace_id, "moved a destination's file into its workspace's folder");
    }
}

/// A validated destination configuration.
#[derive(Debug, Clone)]
pub enum DestinationConfig {
    /// `<data-dir>/warehouses/<workspace>/<file>`.
    Sqlite { file: String },
    /// A PostgreSQL database; the password, if any, by credential handle
    /// (bound to the database host); reverse-ETL models run as
    /// `model_role` when it is given.
    Postgres { target: postgres::Target, credential_handle: Option<String>, model_role: Option<String> },
    /// `<data-dir>/exports/<workspace>/<directory>/<stream>.jsonl`.
    Jsonl { directory: String },
}

fn plain_name(field: &str, v: Option<&str>) -> Result<String, ApiError> {
    let v = v.ok_or_else(|| ApiError::invalid_field(field, format!("{field} is required")))?;
    let ok = !v.is_empty()
        && v.len() <= 100
        && !v.starts_with('.')
        && v.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        return Err(ApiError::invalid_field(
            field,
            format!("{field} must be a plain file name (letters, digits, . _ -)"),
        ));
    }
    // SQLite keeps a database's write-ahead log, shared-memory index and
    // rollback journal beside it under these suffixes: a destination named
    // like one would write into another destination's live state.
    let lower = v.to_ascii_lowercase();
    if SIDE_FILE_SUFFIXES.iter().any(|s| lower.ends_with(s)) {
        return Err(ApiError::invalid_field(
            field,
            format!(
                "{field} must not end in {}: SQLite uses those names for its own files",
                SIDE_FILE_SUFFIXES.join(", ")
            ),
        ));
    }
    Ok(v.to_owned())
}

/// Names SQLite gives the files it keeps beside a database.
const SIDE_FILE_SUFFIXES: &[&str] = &["-wal", "-shm", "-journal"];

/// Validates a destination of `kind`.
pub fn validate(kind: DestinationKind, config: &Value) -> Result<DestinationConfig, ApiError> {
    let obj = config
        .as_object()
        .ok_or_else(|| ApiError::invalid_field("configuration", "configuration must be an object"))?;
    let allowed: &[&str] = match kind {
        DestinationKind::Sqlite => &["file"],
        DestinationKind::Postgres => &["url", "credential_handle", "model_role"],
        DestinationKind::Jsonl => &["directory"],
    };
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::invalid_field(&format!("configuration.{k}"), format!("unknown field {k}")));
    }
    Ok(match kind {
        DestinationKind::Sqlite => DestinationConfig::Sqlite {
            file: plain_name("configuration.file", obj.get("file").and_then(Value::as_str))?,
        },
        DestinationKind::Jsonl => DestinationConfig::Jsonl {
            directory: plain_name("configuration.directory", obj.get("directory").and_then(Value::as_str))?,
        },
        DestinationKind::Postgres => {
            let raw = obj
                .get("url")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid_field("configuration.url", "url is required"))?;
            let url = url::Url::parse(raw)
                .map_err(|_| ApiError::invalid_field("configuration.url", "url must be a postgres:// URL"))?;
            if url.password().is_some() {
                return Err(ApiError::secret_refused("configuration.url"));
            }
            let credential_handle = match obj.get("credential_handle") {
                None | Some(Value::Null) => None,
                Some(Value::String(h)) => Some(h.clone()),
                Some(_) => {
                    return Err(ApiError::invalid_field(
                        "configuration.credential_handle",
                        "credential_handle must be a string",
                    ));
                }
            };
            let target = postgres::parse(&url, credential_handle.is_some())
                .map_err(|m| ApiError::invalid_field("configuration.url", m))?;
            let model_role = match obj.get("model_role") {
                None | Some(Value::Null) => None,
                Some(Value::String(r)) if postgres::plain(r) => Some(r.clone()),
                Some(_) => {
                    return Err(ApiError::invalid_field(
                        "configuration.model_role",
                        "model_role must be a role name (letters, digits, _ - . $)",
                    ));
                }
            };
            DestinationConfig::Postgres { target, credential_handle, model_role }
        }
    })
}

/// The text records hold, in bytes.
pub fn text_bytes(records: &[String]) -> usize {
    records.iter().map(String::len).sum()
}

/// Table and column names: lower case letters, digits and `_`.
pub fn sql_name(raw: &str) -> String {
    let mut s: String =
        raw.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).take(60).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

fn quote(name: &str) -> String {
    format!("\"{name}\"")
}

/// The metadata columns every table starts with, in the order each row
/// carries them, before the record's fields.
const METADATA_COLUMNS: [&str; 3] = ["_service_raw_id", "_service_extracted_at", "_service_meta"];

/// Why a batch was not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// A record cannot be stored as it is; writing it again will not help.
    #[error("{0}")]
    BadRecord(String),
    /// The destination refused or failed; it may work later.
    #[error("{0}")]
    Destination(String),
}

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
    async fn execute(&self, sql: String) -> Result<(), sqlx::Error> {
        match self {
            Db::Sqlite(pool, ..) => sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await.map(|_| ()),
            Db::Postgres(pool) => sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await.map(|_| ()),
        }
    }

    /// The columns `table` has (`table` went through [`sql_name`]), each
    /// with whether its type is one binary `COPY` writes as the host does:
    /// `TEXT` (or `VARCHAR`), and `BIGINT` for the extraction time. SQLite
    /// converts whatever it is given, so there every column is.
    async fn columns(&self, table: &str) -> Result<HashMap<String, bool>, sqlx::Error> {
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
const REGISTRY: &str = "_service_tables";

impl Db {
    /// The columns of `table` when it is the service's to write (empty
    /// when there is no such table yet). A table the registry does not list
    /// is the service's only if it has the metadata columns (tables from
    /// before the registry); it is then listed. Any other table of that
    /// name belongs to someone else, and the stream fails rather than
    /// drop, empty or write into it.
    async fn claim(&self, table: &str) -> Result<HashMap<String, bool>, String> {
        if table == REGISTRY {
            return Err(format!("{REGISTRY} is the service's own table; a stream cannot be written into it"));
        }
        self.execute(format!(
            "CREATE TABLE IF NOT EXISTS {} (\"name\" TEXT PRIMARY KEY, \"created_at\" BIGINT NOT NULL)",
            quote(REGISTRY)
        ))
        .await
        .map_err(|e| format!("cannot create {REGISTRY}: {e}"))?;
        let existing = self.columns(table).await.map_err(|e| e.to_string())?;
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
        .map_err(|e| e.to_string())?;
        if !listed {
            if !METADATA_COLUMNS.iter().all(|c| existing.contains_key(*c)) {
                return Err(format!(
                    "table {table} exists and was not created by the service; rename it, or choose another destination or stream"
                ));
            }
            self.register(table).await?;
        }
        Ok(existing)
    }

    /// Lists a table the service created.
    async fn register(&self, table: &str) -> Result<(), String> {
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
        .map_err(|e| format!("cannot record table {table}: {e}"))
    }

    /// Forgets a dropped table.
    async fn unregister(&self, table: &str) -> Result<(), String> {
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
        .map_err(|e| e.to_string())
    }
}

/// Where records go.
pub enum Writer {
    /// A database, with the columns each table is known to have (and
    /// whether binary `COPY` can write each, see [`Db::columns`]).
    Sql {
        db: Db,
        columns: tokio::sync::Mutex<HashMap<String, HashMap<String, bool>>>,
    },
    Jsonl {
        dir: cap_std::fs::Dir,
    },
}

/// A batch laid out for its destination: everything but the I/O, so the
/// next batch is prepared while this one is applied.
struct Batch {
    table: String,
    /// The batch's columns, besides the metadata ones.
    columns: Vec<String>,
    /// Records and bytes the batch holds.
    records: u64,
    bytes: u64,
    load: Load,
}

enum Load {
    /// JSON lines to append.
    Lines(Vec<u8>),
    /// SQLite rows to upsert in one transaction.
    Rows(SqliteRows),
    /// PostgreSQL binary `COPY` data, and the upsert to finish with when keys may
    /// exist already.
    Copy { names: Vec<String>, data: Vec<u8>, upsert: Option<String> },
}

impl Writer {
    /// Opens the destination for one job of `place.workspace_id`.
    pub async fn open(
        config: &DestinationConfig,
        place: &Place<'_>,
        password: Option<secrecy::SecretString>,
    ) -> Result<Writer, String> {
        match config {
            DestinationConfig::Sqlite { file } => {
                let dir = place.warehouse_dir();
                std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create the warehouse directory: {e}"))?;
                // Pages of 16 KiB for new files: rows of about 1 KB fill
                // three 4 KiB pages to every 16 KiB one, and with them the
                // B-tree and WAL bookkeeping per row (+40% throughput
                // measured). An existing file keeps its page size.
                let options = SqliteConnectOptions::new()
                    .filename(dir.join(file))
                    .create_if_missing(true)
                    .page_size(16_384)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Full)
                    .busy_timeout(BUSY_TIMEOUT);
                fn failed(e: impl std::fmt::Display) -> String {
                    format!("cannot open the SQLite destination: {e}")
                }
                let schema = options.clone().pragma("wal_autocheckpoint", WAL_BACKSTOP_PAGES.to_string());
                let pool = SqlitePoolOptions::new().max_connections(1).connect_with(schema).await.map_err(failed)?;
                let path = dir.join(file);
                let rows = tokio::task::spawn_blocking(move || RowWriter::open(&path))
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()))
                    .map_err(failed)?;
                let checkpointer = Checkpointer::start(&options).await.map_err(failed)?;
                Ok(Writer::Sql {
                    db: Db::Sqlite(pool, Arc::new(std::sync::Mutex::new(rows)), checkpointer),
                    columns: Default::default(),
                })
            }
            DestinationConfig::Postgres { target, .. } => {
                let options = postgres::connect_options(target, password.as_ref(), place.warehouses).await?;
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(POSTGRES_CONNECTIONS)
                    .connect_with(options)
                    .await
                    .map_err(|e| {
                        format!("cannot connect to the PostgreSQL destination {}:{}: {e}", target.host, target.port)
                    })?;
                Ok(Writer::Sql { db: Db::Postgres(pool), columns: Default::default() })
            }
            DestinationConfig::Jsonl { directory } => {
                let path = place.export_dir().join(directory);
                std::fs::create_dir_all(&path).map_err(|e| format!("cannot create the export directory: {e}"))?;
                let dir = cap_std::fs::Dir::open_ambient_dir(&path, cap_std::ambient_authority())
                    .map_err(|e| format!("cannot open the export directory: {e}"))?;
                Ok(Writer::Jsonl { dir })
            }
        }
    }

    /// Makes sure the stream's table has every column of `fields`; tells
    /// whether binary `COPY` can write them all (and the metadata columns).
    async fn ensure_columns(&self, table: &str, fields: &[String]) -> Result<bool, String> {
        let Writer::Sql { db, columns } = self else { return Ok(true) };
        // Held throughout, so concurrent batches do not race to add a column.
        let mut columns = columns.lock().await;
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
                db.execute(create).await.map_err(|e| format!("cannot create table {table}: {e}"))?;
                db.register(table).await?;
                db.columns(table).await.map_err(|e| e.to_string())?
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
                        return Err(format!("cannot add column {f} to {table}: {e}"));
                    }
                }
                known.insert(f.clone(), true);
            }
        }
        let binary = |c: &str| known.get(c).copied().unwrap_or(true);
        Ok(METADATA_COLUMNS.iter().copied().chain(fields.iter().map(String::as_str)).all(binary))
    }

    /// Empties a stream before a full refresh (or a reset). Only a table
    /// the service created is dropped; a table of the same name that
    /// someone else made fails the job and stays as it is.
    pub async fn clear(&self, stream: &str) -> Result<(), String> {
        let table = sql_name(stream);
        match self {
            Writer::Sql { db, columns } => {
                if db.claim(&table).await?.is_empty() {
                    return Ok(());
                }
                db.execute(format!("DROP TABLE IF EXISTS {}", quote(&table))).await.map_err(|e| e.to_string())?;
                db.unregister(&table).await?;
                columns.lock().await.remove(&table);
                Ok(())
            }
            Writer::Jsonl { dir } => match dir.remove_file(format!("{table}.jsonl")) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e.to_string()),
            },
        }
    }

    /// How many batches of a stream may be applied at once: several only
    /// where each runs in its own transaction and their order cannot
    /// matter (PostgreSQL, with fresh keys).
    fn concurrent_batches(&self, mode: StreamSyncMode) -> usize {
        match self {
            Writer::Sql { db: Db::Postgres(_), .. } if mode != StreamSyncMode::IncrementalDeduped => {
                POSTGRES_CONNECTIONS as usize
            }
            _ => 1,
        }
    }

    /// Lays a batch out for the destination: parsing, keys, escaping and
    /// binding, with no I/O. `None` when the batch is too wide to lay out
    /// at once ([`shape::MAX_CELLS`]) and is to be written in parts.
    fn prepare(
        &self,
        pipeline_id: &str,
        stream: &str,
        records: &[String],
        mode: StreamSyncMode,
        primary_key: &[String],
    ) -> Result<Option<Batch>, WriteError> {
        let table = sql_name(stream);
        let now = crate::store::now_ms();
        let meta = json!({ "pipeline_id": pipeline_id, "stream": stream }).to_string();
        let bytes = text_bytes(records) as u64;
        let shaped = records
            .iter()
            .map(|r| shape(r, mode, primary_key))
            .collect::<Result<Vec<_>, _>>()
            .map_err(WriteError::BadRecord)?;
        let (columns, load) = match self {
            Writer::Jsonl { .. } => (
                Vec::new(),
                Load::Lines(jsonl::lines(shaped, bytes as usize, now, &meta).map_err(WriteError::BadRecord)?),
            ),
            Writer::Sql { db, .. } => {
                let dedupe = mode == StreamSyncMode::IncrementalDeduped;
                let Some(Rows { columns, rows }) =
                    Rows::collect(shaped, dedupe, shape::MAX_CELLS).map_err(WriteError::BadRecord)?
                else {
                    return Ok(None);
                };
                let mut names: Vec<String> = METADATA_COLUMNS.iter().map(|c| quote(c)).collect();
                names.extend(columns.iter().map(|c| quote(c)));
                let upsert = format!(
                    " ON CONFLICT (\"_service_raw_id\") DO UPDATE SET {}",
                    names[1..].iter().map(|n| format!("{n} = excluded.{n}")).collect::<Vec<_>>().join(", ")
                );
                let load = match db {
                    Db::Sqlite(..) => Load::Rows(
                        SqliteRows::new(&quote(&table), &names, &upsert, &rows, now, &meta)
                            .map_err(WriteError::BadRecord)?,
                    ),
                    // Fresh keys never collide: they are copied straight in.
                    // Keys that may exist already go through a staging table.
                    Db::Postgres(_) => Load::Copy {
                        data: copy_data(&names, &rows, now, &meta).map_err(WriteError::BadRecord)?,
                        upsert: dedupe.then_some(upsert),
                        names,
                    },
                };
                (columns, load)
            }
        };
        Ok(Some(Batch { table, columns, records: records.len() as u64, bytes, load }))
    }

    /// Writes a prepared batch in one transaction; returns its size in
    /// bytes.
    async fn apply(&self, batch: Batch) -> Result<u64, WriteError> {
        let io = WriteError::Destination;
        let Batch { table, columns, bytes, load, .. } = batch;
        let binary = self.ensure_columns(&table, &columns).await.map_err(io)?;
        let failed = |e: &dyn std::fmt::Display| io(format!("cannot write to {table}: {e}"));
        match (self, load) {
            (Writer::Jsonl { dir }, Load::Lines(out)) => {
                jsonl::append(dir, &table, &out).map_err(|e| io(e.to_string()))?
            }
            (Writer::Sql { db: Db::Sqlite(_, writer, checkpointer), .. }, Load::Rows(rows)) => {
                // SQLite works synchronously: off the async workers.
                let writer = writer.clone();
                tokio::task::spawn_blocking(move || {
                    writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).write(&rows)
                })
                .await
                .unwrap_or_else(|e| Err(format!("the write stopped: {e}")))
                .map_err(|e| failed(&e))?;
                checkpointer.committed();
            }
            (Writer::Sql { db: Db::Postgres(pool), .. }, Load::Copy { names, data, upsert }) => {
                // A column someone gave another type (JSONB, say) takes
                // text, which the server converts; binary it would refuse.
                let data = if binary {
                    CopyData::Binary(data)
                } else {
                    CopyData::Text(copy_text_from_binary(&data).map_err(io)?)
                };
                copy_rows(pool, &quote(&table), &names, upsert.as_deref(), data).await.map_err(|e| failed(&e))?;
            }
            _ => return Err(io("the batch was prepared for another destination".into())),
        }
        Ok(bytes)
    }

    /// Closes connections.
    pub async fn close(self) {
        match self {
            Writer::Sql { db: Db::Sqlite(pool, writer, checkpointer), .. } => {
                drop(writer);
                checkpointer.close().await;
                pool.close().await;
            }
            Writer::Sql { db: Db::Postgres(pool), .. } => pool.close().await,
            Writer::Jsonl { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_safe_sql_identifiers() {
        assert_eq!(sql_name("Campaign Stats"), "campaign_stats");
        assert_eq!(sql_name("1st"), "_1st");
        assert_eq!(sql_name("a\"; DROP TABLE x; --"), "a___drop_table_x____");
    }

    #[test]
    fn paths_side_files_and_passwords_are_refused() {
        use DestinationKind::{Jsonl, Postgres, Sqlite};
        assert!(validate(Sqlite, &json!({ "file": "../etc/passwd" })).is_err());
        assert!(validate(Jsonl, &json!({ "directory": "/tmp" })).is_err());
        for side in ["w.db-wal", "w.db-shm", "w.db-journal", "W.DB-WAL"] {
            assert!(validate(Sqlite, &json!({ "file": side })).is_err(), "{side}");
        }
        assert!(validate(Postgres, &json!({ "url": "postgres://u:pw@h/db" })).is_err());
        assert!(validate(Postgres, &json!({ "url": "postgres://u@h/db" })).is_ok());
        assert!(validate(Postgres, &json!({ "url": "postgres://u@h/db?host=/tmp" })).is_err());
        assert!(validate(Sqlite, &json!({ "url": "x" })).is_err(), "fields of another kind");
    }

    #[tokio::test]
    async fn a_nul_character_is_a_bad_record_for_postgres_only() {
        let records = vec![r#"{"id": 1, "note": "a\u0000b"}"#.to_owned()];
        // Nothing connects: preparing does no I/O.
        let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://nobody@127.0.0.1:1/none").unwrap();
        let postgres = Writer::Sql { db: Db::Postgres(pool), columns: Default::default() };
        for mode in [StreamSyncMode::IncrementalAppend, StreamSyncMode::IncrementalDeduped] {
            match postgres.prepare("p", "events", &records, mode, &["id".to_owned()]).map(|batch| batch.is_some()) {
                Err(WriteError::BadRecord(m)) => assert!(m.contains("NUL"), "{m}"),
                Err(e) => panic!("expected a bad record, got {e:?}"),
                Ok(_) => panic!("expected a bad record"),
            }
        }
        let nested = vec![r#"{"id": 1, "payload": {"note": "a\u0000b"}}"#.to_owned()];
        assert!(
            matches!(postgres.prepare("p", "events", &nested, StreamSyncMode::IncrementalAppend, &[]), Ok(Some(_))),
            "nested JSON keeps the escape as text"
        );

        let dir = tempfile::tempdir().unwrap();
        let sqlite = Writer::open(&DestinationConfig::Sqlite { file: "w.db".into() }, &test_place(dir.path()), None)
            .await
            .unwrap();
        assert!(
            matches!(sqlite.prepare("p", "events", &records, StreamSyncMode::IncrementalAppend, &[]), Ok(Some(_))),
            "SQLite stores NUL in text"
        );
    }

    /// A workspace's place in a scratch data directory.
    pub(crate) fn test_place(dir: &Path) -> Place<'_> {
        static NONE: std::sync::OnceLock<postgres::WarehousePolicy> = std::sync::OnceLock::new();
        Place { data_dir: dir, workspace_id: "ws_test", warehouses: NONE.get_or_init(Default::default) }
    }
}
