//! Destinations built into the host: an SQLite file, a PostgreSQL database,
//! and a directory of JSON-lines files.
//!
//! Each stream lands in its own table (or file) with three metadata columns
//! besides the record's top-level fields: `_service_raw_id` (the key:
//! derived from the primary key in deduplicated mode, random otherwise),
//! `_service_extracted_at` (Unix ms) and `_service_meta` (JSON). A field the
//! table has not seen yet adds a column instead of failing the sync.
//!
//! Files are written through a cap-std directory scoped to the
//! destination's folder under the workspace's own folder of the data
//! directory, so no configuration can make the host write anywhere else,
//! nor into another workspace's files. PostgreSQL destinations are reached
//! only as [`postgres`] allows.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::Row as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use crate::error::ApiError;
use crate::store::pipelines::StreamSyncMode;

pub mod postgres;

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
        match d.kind.as_str() {
            "sqlite" => d.configuration["file"].as_str().map(|f| ("warehouses", f.to_owned())),
            "jsonl" => d.configuration["directory"].as_str().map(|f| ("exports", f.to_owned())),
            _ => None,
        }
    };
    for d in &destinations {
        let Some((folder, name)) = legacy(d) else { continue };
        let old = data_dir.join(folder).join(&name);
        let new_dir = data_dir.join(folder).join(&d.workspace_id);
        if !old.exists() || new_dir.join(&name).exists() || name.contains('/') {
            continue;
        }
        let claimants: std::collections::BTreeSet<&str> =
            destinations.iter().filter(|o| legacy(o).is_some_and(|(f, n)| f == folder && n == name)).map(|o| o.workspace_id.as_str()).collect();
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
    /// (bound to the database host).
    Postgres { target: postgres::Target, credential_handle: Option<String> },
    /// `<data-dir>/exports/<workspace>/<directory>/<stream>.jsonl`.
    Jsonl { directory: String },
}

fn plain_name(field: &str, v: Option<&str>) -> Result<String, ApiError> {
    let v = v.ok_or_else(|| ApiError::invalid_field(field, format!("{field} is required")))?;
    let ok = !v.is_empty() && v.len() <= 100 && !v.starts_with('.') && v.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        return Err(ApiError::invalid_field(field, format!("{field} must be a plain file name (letters, digits, . _ -)")));
    }
    // SQLite keeps a database's write-ahead log, shared-memory index and
    // rollback journal beside it under these suffixes: a destination named
    // like one would write into another destination's live state.
    let lower = v.to_ascii_lowercase();
    if SIDE_FILE_SUFFIXES.iter().any(|s| lower.ends_with(s)) {
        return Err(ApiError::invalid_field(field, format!("{field} must not end in {}: SQLite uses those names for its own files", SIDE_FILE_SUFFIXES.join(", "))));
    }
    Ok(v.to_owned())
}

/// Names SQLite gives the files it keeps beside a database.
const SIDE_FILE_SUFFIXES: &[&str] = &["-wal", "-shm", "-journal"];

/// Validates a destination of `kind`.
pub fn validate(kind: &str, config: &Value) -> Result<DestinationConfig, ApiError> {
    let obj = config.as_object().ok_or_else(|| ApiError::invalid_field("configuration", "configuration must be an object"))?;
    let allowed: &[&str] = match kind {
        "sqlite" => &["file"],
        "postgres" => &["url", "credential_handle"],
        "jsonl" => &["directory"],
        _ => return Err(ApiError::invalid_field("kind", "kind must be sqlite, postgres or jsonl")),
    };
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::invalid_field(&format!("configuration.{k}"), format!("unknown field {k}")));
    }
    Ok(match kind {
        "sqlite" => DestinationConfig::Sqlite { file: plain_name("configuration.file", obj.get("file").and_then(Value::as_str))? },
        "jsonl" => DestinationConfig::Jsonl { directory: plain_name("configuration.directory", obj.get("directory").and_then(Value::as_str))? },
        _ => {
            let raw = obj.get("url").and_then(Value::as_str).ok_or_else(|| ApiError::invalid_field("configuration.url", "url is required"))?;
            let url = url::Url::parse(raw).map_err(|_| ApiError::invalid_field("configuration.url", "url must be a postgres:// URL"))?;
            if url.password().is_some() {
                return Err(ApiError::secret_refused("configuration.url"));
            }
            let credential_handle = match obj.get("credential_handle") {
                None | Some(Value::Null) => None,
                Some(Value::String(h)) => Some(h.clone()),
                Some(_) => return Err(ApiError::invalid_field("configuration.credential_handle", "credential_handle must be a string")),
            };
            let target = postgres::parse(&url, credential_handle.is_some()).map_err(|m| ApiError::invalid_field("configuration.url", m))?;
            DestinationConfig::Postgres { target, credential_handle }
        }
    })
}

/// Table and column names: lower case letters, digits and `_`.
pub fn sql_name(raw: &str) -> String {
    let mut s: String = raw.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).take(60).collect();
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
    /// Its own driver rather than `Any`, which copies every bound value
    /// once more on its way in. The writer's single connection, and the
    /// connection that moves committed pages into the database file.
    Sqlite(SqlitePool, Checkpointer),
    /// Its own driver rather than `Any`: batches go in with `COPY`.
    Postgres(sqlx::PgPool),
}

impl Db {
    async fn execute(&self, sql: String) -> Result<(), sqlx::Error> {
        match self {
            Db::Sqlite(pool, _) => sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await.map(|_| ()),
            Db::Postgres(pool) => sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await.map(|_| ()),
        }
    }

    /// The columns `table` has (`table` went through [`sql_name`]), each
    /// with whether its type is one binary `COPY` writes as the host does:
    /// `TEXT` (or `VARCHAR`), and `BIGINT` for the extraction time. SQLite
    /// converts whatever it is given, so there every column is.
    async fn columns(&self, table: &str) -> Result<HashMap<String, bool>, sqlx::Error> {
        Ok(match self {
            Db::Sqlite(pool, _) => sqlx::query(sqlx::AssertSqlSafe(format!("SELECT name FROM pragma_table_info('{table}')")))
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
        self.execute(format!("CREATE TABLE IF NOT EXISTS {} (\"name\" TEXT PRIMARY KEY, \"created_at\" BIGINT NOT NULL)", quote(REGISTRY)))
            .await
            .map_err(|e| format!("cannot create {REGISTRY}: {e}"))?;
        let existing = self.columns(table).await.map_err(|e| e.to_string())?;
        if existing.is_empty() {
            return Ok(existing);
        }
        let listed = match self {
            Db::Sqlite(pool, _) => sqlx::query("SELECT 1 FROM \"_service_tables\" WHERE name = ?").bind(table).fetch_optional(pool).await.map(|r| r.is_some()),
            Db::Postgres(pool) => sqlx::query("SELECT 1 FROM \"_service_tables\" WHERE name = $1").bind(table).fetch_optional(pool).await.map(|r| r.is_some()),
        }
        .map_err(|e| e.to_string())?;
        if !listed {
            if !METADATA_COLUMNS.iter().all(|c| existing.contains_key(*c)) {
                return Err(format!("table {table} exists and was not created by the service; rename it, or choose another destination or stream"));
            }
            self.register(table).await?;
        }
        Ok(existing)
    }

    /// Lists a table the service created.
    async fn register(&self, table: &str) -> Result<(), String> {
        let now = crate::store::now_ms();
        match self {
            Db::Sqlite(pool, _) => sqlx::query("INSERT INTO \"_service_tables\" (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING").bind(table).bind(now).execute(pool).await.map(|_| ()),
            Db::Postgres(pool) => sqlx::query("INSERT INTO \"_service_tables\" (name, created_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING").bind(table).bind(now).execute(pool).await.map(|_| ()),
        }
        .map_err(|e| format!("cannot record table {table}: {e}"))
    }

    /// Forgets a dropped table.
    async fn unregister(&self, table: &str) -> Result<(), String> {
        match self {
            Db::Sqlite(pool, _) => sqlx::query("DELETE FROM \"_service_tables\" WHERE name = ?").bind(table).execute(pool).await.map(|_| ()),
            Db::Postgres(pool) => sqlx::query("DELETE FROM \"_service_tables\" WHERE name = $1").bind(table).execute(pool).await.map(|_| ()),
        }
        .map_err(|e| e.to_string())
    }
}

/// Pages an SQLite warehouse's write-ahead log may hold before the writer
/// copies them into the database file itself: a backstop for when the
/// [`Checkpointer`] falls behind (64 MiB with 16 KiB pages).
const WAL_BACKSTOP_PAGES: u32 = 4096;

/// Copies what an SQLite warehouse commits from its write-ahead log into the
/// database file, on a connection of its own. With SQLite's automatic
/// checkpoints the writer's connection would do that copy and its flush to
/// disk itself after every few commits, before it could start the next
/// batch; here they overlap the next batch. Passive checkpoints never block
/// the writer, and durability is unchanged: a commit is on disk in the log
/// when it returns.
pub struct Checkpointer {
    /// One pending wake-up is enough: a checkpoint copies everything
    /// committed before it starts. Dropping it ends the task.
    wake: tokio::sync::mpsc::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Checkpointer {
    async fn start(options: &SqliteConnectOptions) -> Result<Checkpointer, sqlx::Error> {
        use sqlx::{ConnectOptions as _, Connection as _};
        let mut conn = options.connect().await?;
        let (wake, mut woken) = tokio::sync::mpsc::channel::<()>(1);
        let task = tokio::spawn(async move {
            while woken.recv().await.is_some() {
                if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&mut conn).await {
                    // The writer's backstop checkpoints take over.
                    tracing::warn!(error = %e, "SQLite destination checkpoint failed");
                }
            }
            let _ = conn.close().await;
        });
        Ok(Checkpointer { wake, task })
    }

    /// Asks for the pages committed so far to be copied.
    fn committed(&self) {
        let _ = self.wake.try_send(());
    }

    /// Closes its connection, so the writer's is the last one and folds
    /// the rest of the log into the file when it closes.
    async fn close(self) {
        drop(self.wake);
        let _ = self.task.await;
    }
}

/// Where records go.
pub enum Writer {
    /// A database, with the columns each table is known to have (and
    /// whether binary `COPY` can write each, see [`Db::columns`]).
    Sql { db: Db, columns: tokio::sync::Mutex<HashMap<String, HashMap<String, bool>>> },
    Jsonl { dir: cap_std::fs::Dir },
}

/// A JSON string's content, borrowed from the input when it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Visit)
    }
}

/// A record's top-level fields in the provider's order, each value kept as
/// the provider wrote it: nested values are never parsed into a tree.
struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Fields<'de>, M::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some((Text(k), v)) = map.next_entry::<Text<'de>, &'de RawValue>()? {
                    fields.push((k, v));
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// One record ready for a destination: its key and its fields.
struct Shaped<'a> {
    raw_id: String,
    fields: Vec<(Cow<'a, str>, &'a RawValue)>,
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes.iter().flat_map(|b| [DIGITS[(b >> 4) as usize] as char, DIGITS[(b & 15) as usize] as char]).collect()
}

/// Splits a record into its fields and derives its key: from the primary
/// key in deduplicated mode (so a rewrite replaces the row), otherwise a
/// time-ordered random id (so rows append at the end of the key index).
fn shape<'a>(record: &'a str, mode: StreamSyncMode, primary_key: &[String]) -> Result<Shaped<'a>, String> {
    let Fields(fields) = serde_json::from_str(record).map_err(|_| "a record is not a JSON object".to_owned())?;
    let raw_id = if mode == StreamSyncMode::IncrementalDeduped {
        // The key's canonical JSON, so formatting differences between two
        // copies of one record do not make two rows.
        let key: Vec<Value> = primary_key
            .iter()
            .map(|k| fields.iter().rev().find(|(name, _)| name == k).map_or(Ok(Value::Null), |(_, raw)| serde_json::from_str(raw.get())))
            .collect::<Result<_, _>>()
            .map_err(|_| "a record's key is not valid JSON".to_owned())?;
        hex(&Sha256::digest(serde_json::to_vec(&key).unwrap_or_default()))
    } else {
        uuid::Uuid::now_v7().to_string()
    };
    Ok(Shaped { raw_id, fields })
}

/// A field as a column value: strings unquoted, null as NULL, anything
/// else (numbers, booleans, nested objects and arrays) as its JSON text.
fn column_value(raw: &RawValue) -> Result<Option<Cow<'_, str>>, String> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'n') => Ok(None),
        // The string was checked when the record was split into fields;
        // without a backslash its text is its value, and a byte search is
        // much cheaper than decoding it again.
        Some(b'"') if memchr::memchr(b'\\', text.as_bytes()).is_none() => Ok(Some(Cow::Borrowed(&text[1..text.len() - 1]))),
        Some(b'"') => serde_json::from_str::<Text>(text).map(|t| Some(t.0)).map_err(|_| "a record holds an invalid string".to_owned()),
        _ => Ok(Some(Cow::Borrowed(text))),
    }
}

/// A row: its key and its values, in the order of [`Rows::columns`].
type Row<'a> = (String, Vec<Option<Cow<'a, str>>>);

/// The rows of one batch, aligned to the union of their columns.
struct Rows<'a> {
    columns: Vec<String>,
    rows: Vec<Row<'a>>,
}

impl<'a> Rows<'a> {
    /// Lays the batch out as rows. Fields whose column names collide keep
    /// the last value; in deduplicated mode a key seen twice in one batch
    /// keeps its last version.
    fn collect(shaped: Vec<Shaped<'a>>, dedupe: bool) -> Result<Rows<'a>, String> {
        let mut columns: Vec<String> = Vec::new();
        let mut by_field: HashMap<String, Option<usize>> = HashMap::new();
        let mut rows: Vec<Row<'a>> = Vec::with_capacity(shaped.len());
        let mut by_key: HashMap<String, usize> = HashMap::new();
        for record in shaped {
            let mut row: Vec<Option<Cow<'a, str>>> = vec![None; columns.len()];
            for (name, raw) in &record.fields {
                let slot = match by_field.get(name.as_ref()) {
                    Some(slot) => *slot,
                    None => {
                        let column = sql_name(name);
                        let slot = if column.starts_with("_service_") {
                            None
                        } else if let Some(i) = columns.iter().position(|c| *c == column) {
                            Some(i)
                        } else {
                            columns.push(column);
                            Some(columns.len() - 1)
                        };
                        by_field.insert(name.to_string(), slot);
                        slot
                    }
                };
                if let Some(i) = slot {
                    if row.len() <= i {
                        row.resize(i + 1, None);
                    }
                    row[i] = column_value(raw)?;
                }
            }
            if dedupe && let Some(&at) = by_key.get(&record.raw_id) {
                rows[at].1 = row;
                continue;
            }
            if dedupe {
                by_key.insert(record.raw_id.clone(), rows.len());
            }
            rows.push((record.raw_id, row));
        }
        Ok(Rows { columns, rows })
    }
}

/// Connections a job keeps to a PostgreSQL destination: batches of one
/// stream load over both at once.
const POSTGRES_CONNECTIONS: u32 = 2;

/// Record bytes a writer gathers into one transaction at most, when
/// batches queue up faster than it writes them: a transaction costs a
/// flush to disk, whatever its size.
pub const GROUP_BYTES: usize = 16 * 1024 * 1024;

/// Bound parameters per statement, under SQLite's limit (32766) and
/// PostgreSQL's (65535).
const MAX_PARAMS: usize = 30_000;
/// Rows per INSERT statement at most.
const MAX_ROWS_PER_STATEMENT: usize = 500;

/// Multi-row upserts for SQLite, with their values bound.
fn insert_statements(target: &str, names: &[String], upsert: &str, rows: &[Row<'_>], now: i64, meta: &str) -> Result<Vec<(String, SqliteArguments)>, String> {
    use sqlx::Arguments as _;
    let head = format!("INSERT INTO {target} ({}) VALUES ", names.join(", "));
    // SQLite looks named parameters (`$1`) up by walking a list, which
    // makes binding thousands of them quadratic; anonymous `?` are not.
    let tuple = format!("({})", vec!["?"; names.len()].join(", "));
    let per_statement = (MAX_PARAMS / names.len()).clamp(1, MAX_ROWS_PER_STATEMENT);
    let mut statements = Vec::with_capacity(rows.len().div_ceil(per_statement));
    for chunk in rows.chunks(per_statement) {
        let mut sql = String::with_capacity(head.len() + upsert.len() + chunk.len() * (tuple.len() + 2));
        sql.push_str(&head);
        for i in 0..chunk.len() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&tuple);
        }
        sql.push_str(upsert);
        let mut args = SqliteArguments::default();
        args.reserve(chunk.len() * names.len(), 0);
        for (raw_id, values) in chunk {
            args.add(raw_id.as_str()).map_err(|e| e.to_string())?;
            args.add(now).map_err(|e| e.to_string())?;
            args.add(meta).map_err(|e| e.to_string())?;
            for j in 0..names.len() - METADATA_COLUMNS.len() {
                args.add(values.get(j).and_then(|v| v.as_deref())).map_err(|e| e.to_string())?;
            }
        }
        statements.push((sql, args));
    }
    Ok(statements)
}

/// Appends one field of a `COPY ... (FORMAT binary)` row: its length and
/// its bytes, or length -1 for NULL. Binary rather than text: the server
/// takes each value as it comes instead of scanning every byte twice for
/// line ends, delimiters and escapes, which was most of its CPU time per
/// row (about 1 KB each). A NUL character is refused: PostgreSQL text
/// cannot hold one, and retrying would fail the same way.
fn copy_field(out: &mut Vec<u8>, value: Option<&str>) -> Result<(), String> {
    let Some(value) = value.map(str::as_bytes) else {
        out.extend_from_slice(&(-1i32).to_be_bytes());
        return Ok(());
    };
    if memchr::memchr(0, value).is_some() {
        return Err("a record holds a NUL character (\\u0000), which PostgreSQL text cannot store".into());
    }
    let len = i32::try_from(value.len()).map_err(|_| "a value is larger than PostgreSQL allows".to_owned())?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(value);
    Ok(())
}

/// The signature, flags and header extension length that open binary
/// `COPY` data.
const COPY_BINARY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// Rows in `COPY ... (FORMAT binary)` form, for the columns `names`: the
/// key, the extraction time (`BIGINT`), the metadata, then the fields (all
/// `TEXT`).
fn copy_data(names: &[String], rows: &[Row<'_>], now: i64, meta: &str) -> Result<Vec<u8>, String> {
    let count = i16::try_from(names.len()).map_err(|_| "a record has more fields than a PostgreSQL table can hold".to_owned())?;
    let size = |v: &Option<Cow<'_, str>>| 4 + v.as_ref().map_or(0, |c| c.len());
    let mut data = Vec::with_capacity(
        COPY_BINARY_HEADER.len() + 2 + rows.iter().map(|(id, v)| 2 + 4 + id.len() + 12 + 4 + meta.len() + v.iter().map(size).sum::<usize>()).sum::<usize>(),
    );
    data.extend_from_slice(COPY_BINARY_HEADER);
    for (raw_id, values) in rows {
        data.extend_from_slice(&count.to_be_bytes());
        copy_field(&mut data, Some(raw_id))?;
        data.extend_from_slice(&8i32.to_be_bytes());
        data.extend_from_slice(&now.to_be_bytes());
        copy_field(&mut data, Some(meta))?;
        for j in 0..names.len() - METADATA_COLUMNS.len() {
            copy_field(&mut data, values.get(j).and_then(|v| v.as_deref()))?;
        }
    }
    // The trailer: a row of -1 fields.
    data.extend_from_slice(&(-1i16).to_be_bytes());
    Ok(data)
}

/// `COPY` data in one format or the other.
enum CopyData {
    Binary(Vec<u8>),
    Text(Vec<u8>),
}

/// Rewrites binary `COPY` data made by [`copy_data`] in `COPY ... (FORMAT
/// text)` form: tab-separated, `\N` for NULL, with backslash, tab, newline
/// and carriage return escaped, and the extraction time (the second field)
/// as a decimal number.
fn copy_text_from_binary(data: &[u8]) -> Result<Vec<u8>, String> {
    let corrupt = || "the prepared batch is corrupt".to_owned();
    let mut at = COPY_BINARY_HEADER.len();
    let mut take = |n: usize| -> Result<&[u8], String> {
        let bytes: &[u8] = data.get(at..at + n).ok_or_else(corrupt)?;
        at += n;
        Ok(bytes)
    };
    let mut out = Vec::with_capacity(data.len());
    loop {
        let fields = i16::from_be_bytes(take(2)?.try_into().map_err(|_| corrupt())?);
        if fields < 0 {
            return Ok(out);
        }
        for i in 0..fields {
            if i > 0 {
                out.push(b'\t');
            }
            let len = i32::from_be_bytes(take(4)?.try_into().map_err(|_| corrupt())?);
            let Ok(len) = usize::try_from(len) else {
                out.extend_from_slice(b"\\N");
                continue;
            };
            let value = take(len)?;
            if i == 1 {
                let ms = i64::from_be_bytes(value.try_into().map_err(|_| corrupt())?);
                out.extend_from_slice(ms.to_string().as_bytes());
                continue;
            }
            let mut copied = 0;
            for (j, b) in value.iter().enumerate() {
                let escaped: &[u8] = match b {
                    b'\\' => b"\\\\",
                    b'\t' => b"\\t",
                    b'\n' => b"\\n",
                    b'\r' => b"\\r",
                    _ => continue,
                };
                out.extend_from_slice(&value[copied..j]);
                out.extend_from_slice(escaped);
                copied = j + 1;
            }
            out.extend_from_slice(&value[copied..]);
        }
        out.push(b'\n');
    }
}

/// One PostgreSQL transaction: `COPY` the rows in, into a staging table
/// first when they must upsert.
async fn copy_rows(pool: &sqlx::PgPool, target: &str, names: &[String], upsert: Option<&str>, data: CopyData) -> Result<(), sqlx::Error> {
    let columns = names.join(", ");
    let mut tx = pool.begin().await?;
    let into = match upsert {
        Some(_) => {
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE TEMP TABLE \"_service_staging\" (LIKE {target}) ON COMMIT DROP"))).execute(&mut *tx).await?;
            "\"_service_staging\"".to_owned()
        }
        None => target.to_owned(),
    };
    let (format, data) = match data {
        CopyData::Binary(data) => ("binary", data),
        CopyData::Text(data) => ("text", data),
    };
    let mut copy = tx.copy_in_raw(&format!("COPY {into} ({columns}) FROM STDIN (FORMAT {format})")).await?;
    copy.send(data).await?;
    copy.finish().await?;
    if let Some(upsert) = upsert {
        let sql = format!("INSERT INTO {target} ({columns}) SELECT {columns} FROM \"_service_staging\"{upsert}");
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut *tx).await?;
    }
    tx.commit().await
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
    /// SQLite statements to run in one transaction.
    Statements(Vec<(String, SqliteArguments)>),
    /// PostgreSQL binary `COPY` data, and the upsert to finish with when keys may
    /// exist already.
    Copy { names: Vec<String>, data: Vec<u8>, upsert: Option<String> },
}

impl Writer {
    /// Opens the destination for one job of `place.workspace_id`.
    pub async fn open(config: &DestinationConfig, place: &Place<'_>, password: Option<secrecy::SecretString>) -> Result<Writer, String> {
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
                    .busy_timeout(std::time::Duration::from_secs(10));
                let failed = |e: sqlx::Error| format!("cannot open the SQLite destination: {e}");
                let writer = options.clone().pragma("wal_autocheckpoint", WAL_BACKSTOP_PAGES.to_string());
                let pool = SqlitePoolOptions::new().max_connections(1).connect_with(writer).await.map_err(failed)?;
                let checkpointer = Checkpointer::start(&options).await.map_err(failed)?;
                Ok(Writer::Sql { db: Db::Sqlite(pool, checkpointer), columns: Default::default() })
            }
            DestinationConfig::Postgres { target, .. } => {
                let options = postgres::connect_options(target, password.as_ref(), place.warehouses).await?;
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(POSTGRES_CONNECTIONS)
                    .connect_with(options)
                    .await
                    .map_err(|e| format!("cannot connect to the PostgreSQL destination {}:{}: {e}", target.host, target.port))?;
                Ok(Writer::Sql { db: Db::Postgres(pool), columns: Default::default() })
            }
            DestinationConfig::Jsonl { directory } => {
                let path = place.export_dir().join(directory);
                std::fs::create_dir_all(&path).map_err(|e| format!("cannot create the export directory: {e}"))?;
                let dir = cap_std::fs::Dir::open_ambient_dir(&path, cap_std::ambient_authority()).map_err(|e| format!("cannot open the export directory: {e}"))?;
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
                    if !e.to_string().to_lowercase().contains("duplicate") && !e.to_string().contains("already exists") {
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
            Writer::Sql { db: Db::Postgres(_), .. } if mode != StreamSyncMode::IncrementalDeduped => POSTGRES_CONNECTIONS as usize,
            _ => 1,
        }
    }

    /// Lays a batch out for the destination: parsing, keys, escaping and
    /// binding, with no I/O.
    fn prepare(&self, pipeline_id: &str, stream: &str, records: &[String], mode: StreamSyncMode, primary_key: &[String]) -> Result<Batch, WriteError> {
        let table = sql_name(stream);
        let now = crate::store::now_ms();
        let meta = json!({ "pipeline_id": pipeline_id, "stream": stream }).to_string();
        let bytes = text_bytes(records) as u64;
        let shaped = records.iter().map(|r| shape(r, mode, primary_key)).collect::<Result<Vec<_>, _>>().map_err(WriteError::BadRecord)?;
        let (columns, load) = match self {
            Writer::Jsonl { .. } => {
                let mut out = Vec::with_capacity(bytes as usize + records.len() * (96 + meta.len()));
                for record in shaped {
                    out.push(b'{');
                    for (name, raw) in record.fields.iter().filter(|(name, _)| !name.starts_with("_service_")) {
                        serde_json::to_writer(&mut out, name.as_ref()).map_err(|e| WriteError::BadRecord(e.to_string()))?;
                        out.push(b':');
                        out.extend_from_slice(raw.get().as_bytes());
                        out.push(b',');
                    }
                    let _ = write!(out, "\"_service_raw_id\":\"{}\",\"_service_extracted_at\":{now},\"_service_meta\":{meta}}}", record.raw_id);
                    out.push(b'\n');
                }
                (Vec::new(), Load::Lines(out))
            }
            Writer::Sql { db, .. } => {
                let dedupe = mode == StreamSyncMode::IncrementalDeduped;
                let Rows { columns, rows } = Rows::collect(shaped, dedupe).map_err(WriteError::BadRecord)?;
                let mut names: Vec<String> = METADATA_COLUMNS.iter().map(|c| quote(c)).collect();
                names.extend(columns.iter().map(|c| quote(c)));
                let upsert = format!(
                    " ON CONFLICT (\"_service_raw_id\") DO UPDATE SET {}",
                    names[1..].iter().map(|n| format!("{n} = excluded.{n}")).collect::<Vec<_>>().join(", ")
                );
                let load = match db {
                    Db::Sqlite(..) => Load::Statements(insert_statements(&quote(&table), &names, &upsert, &rows, now, &meta).map_err(WriteError::BadRecord)?),
                    // Fresh keys never collide: they are copied straight in.
                    // Keys that may exist already go through a staging table.
                    Db::Postgres(_) => Load::Copy { data: copy_data(&names, &rows, now, &meta).map_err(WriteError::BadRecord)?, upsert: dedupe.then_some(upsert), names },
                };
                (columns, load)
            }
        };
        Ok(Batch { table, columns, records: records.len() as u64, bytes, load })
    }

    /// Writes a prepared batch in one transaction; returns its size in
    /// bytes.
    async fn apply(&self, batch: Batch) -> Result<u64, WriteError> {
        let io = WriteError::Destination;
        let Batch { table, columns, bytes, load, .. } = batch;
        let binary = self.ensure_columns(&table, &columns).await.map_err(io)?;
        let failed = |e: sqlx::Error| io(format!("cannot write to {table}: {e}"));
        match (self, load) {
            (Writer::Jsonl { dir }, Load::Lines(out)) => {
                let mut options = cap_std::fs::OpenOptions::new();
                options.create(true).append(true);
                let mut file = dir.open_with(format!("{table}.jsonl"), &options).map_err(|e| io(e.to_string()))?;
                file.write_all(&out).map_err(|e| io(e.to_string()))?;
                file.sync_data().map_err(|e| io(e.to_string()))?;
            }
            (Writer::Sql { db: Db::Sqlite(pool, checkpointer), .. }, Load::Statements(statements)) => {
                let mut tx = pool.begin().await.map_err(failed)?;
                for (sql, args) in statements {
                    sqlx::query_with(sqlx::AssertSqlSafe(sql), args).execute(&mut *tx).await.map_err(failed)?;
                }
                tx.commit().await.map_err(failed)?;
                checkpointer.committed();
            }
            (Writer::Sql { db: Db::Postgres(pool), .. }, Load::Copy { names, data, upsert }) => {
                // A column someone gave another type (JSONB, say) takes
                // text, which the server converts; binary it would refuse.
                let data = if binary { CopyData::Binary(data) } else { CopyData::Text(copy_text_from_binary(&data).map_err(io)?) };
                copy_rows(pool, &quote(&table), &names, upsert.as_deref(), data).await.map_err(failed)?;
            }
            _ => return Err(io("the batch was prepared for another destination".into())),
        }
        Ok(bytes)
    }

    /// Closes connections.
    pub async fn close(self) {
        match self {
            Writer::Sql { db: Db::Sqlite(pool, checkpointer), .. } => {
                checkpointer.close().await;
                pool.close().await;
            }
            Writer::Sql { db: Db::Postgres(pool), .. } => pool.close().await,
            Writer::Jsonl { .. } => {}
        }
    }
}

/// What a read hands its stream's writer, in the order the plugin made
/// the calls.
pub enum Work {
    /// A batch of records, each a JSON object's text.
    Records(Vec<String>),
    /// A stream state that covers the records before it.
    Checkpoint(String),
}

/// Sizes only: records can be large, and are the workspace's data.
impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Work::Records(records) => write!(f, "Records({} records, {} bytes)", records.len(), self.bytes()),
            Work::Checkpoint(state) => write!(f, "Checkpoint({} bytes)", state.len()),
        }
    }
}

/// The text records hold, in bytes.
fn text_bytes(records: &[String]) -> usize {
    records.iter().map(String::len).sum()
}

/// What a queued item costs besides its text, and what each of its
/// records does: the memory that holds them, roughly, so a flood of empty
/// checkpoints or tiny records fills the queue too.
const ITEM_OVERHEAD: usize = 64;
const RECORD_OVERHEAD: usize = 32;

impl Work {
    /// What it holds, in bytes.
    fn bytes(&self) -> usize {
        match self {
            Work::Records(records) => text_bytes(records),
            Work::Checkpoint(state) => state.len(),
        }
    }

    /// What it takes of a queue's room.
    fn cost(&self) -> usize {
        let records = if let Work::Records(records) = self { records.len() } else { 0 };
        ITEM_OVERHEAD + records * RECORD_OVERHEAD + self.bytes()
    }
}

/// Bytes of records and states (and their bookkeeping, see
/// [`Work::cost`]) a stream's queue holds ahead of its writer at most.
/// Counted in bytes rather than items, so a connector reads just as far
/// ahead whether it emits many small batches or a few large ones, and its
/// checkpoints (one after every page, typically) cost it almost nothing:
/// with a queue of eight items, a page and its checkpoint took two and the
/// plugin could read only four pages ahead of a slow commit. Streams are
/// read one at a time, so a running job holds at most this much queued,
/// or one batch larger than that, which goes in alone once the queue is
/// empty.
pub const QUEUE_BYTES: usize = 32 * 1024 * 1024;

/// A stream's write queue, bounded to `budget` bytes ([`QUEUE_BYTES`] in a
/// job): the sending half for the read, the receiving half for the writer.
pub fn queue(budget: usize) -> (WorkSender, WorkQueue) {
    let budget = budget.clamp(1, Semaphore::MAX_PERMITS);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let room = Arc::new(Semaphore::new(budget));
    (WorkSender { tx, room: room.clone(), budget }, WorkQueue { rx, room })
}

/// Queues work for a stream's writer.
#[derive(Clone)]
pub struct WorkSender {
    /// Each item travels with the room it takes, which is given back when
    /// the writer takes it off the queue.
    tx: tokio::sync::mpsc::UnboundedSender<(Work, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
    budget: usize,
}

impl WorkSender {
    /// Queues `work`, first waiting until the queue has room for it (an
    /// item larger than the whole queue waits for it to be empty). Gives
    /// it back if the writer has stopped.
    pub async fn send(&self, work: Work) -> Result<(), Work> {
        let cost = u32::try_from(work.cost().min(self.budget)).unwrap_or(u32::MAX);
        let Ok(room) = self.room.clone().acquire_many_owned(cost).await else { return Err(work) };
        self.tx.send((work, room)).map_err(|e| e.0.0)
    }
}

/// The writer's end of a stream's queue. Dropping it refuses whatever is
/// sent afterwards and wakes a sender waiting for room.
pub struct WorkQueue {
    rx: tokio::sync::mpsc::UnboundedReceiver<(Work, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
}

impl WorkQueue {
    /// The next item, once there is one; `None` when every sender is gone
    /// and the queue is empty.
    pub async fn recv(&mut self) -> Option<Work> {
        self.rx.recv().await.map(|(work, _room)| work)
    }

    /// The next item if one is queued already.
    fn try_recv(&mut self) -> Option<Work> {
        self.rx.try_recv().ok().map(|(work, _room)| work)
    }
}

impl Drop for WorkQueue {
    fn drop(&mut self) {
        self.room.close();
    }
}

/// Takes `first` and whatever else is queued behind it already, up to
/// [`GROUP_BYTES`] of records: their records as one batch, and the latest
/// checkpoint among them, which goes after that batch. Each transaction
/// costs the destination a flush to disk, so when the writer falls behind
/// the batches that queued up meanwhile share one.
pub fn gather(first: Work, rx: &mut WorkQueue) -> (Vec<String>, Option<String>) {
    let (mut records, mut checkpoint) = (Vec::new(), None);
    let mut bytes = 0;
    let mut next = Some(first);
    while let Some(work) = next.take() {
        match work {
            Work::Records(more) => {
                bytes += text_bytes(&more);
                if records.is_empty() {
                    records = more;
                } else {
                    records.extend(more);
                }
            }
            Work::Checkpoint(state) => checkpoint = Some(state),
        }
        if bytes < GROUP_BYTES {
            next = rx.try_recv();
        }
    }
    (records, checkpoint)
}

/// Writes one stream's batches: each is prepared, then applied in the
/// background, in order, with as many in flight as the destination allows
/// for the sync mode, so the next batch is prepared while the last one is
/// in the database.
///
/// Preparing runs on the blocking pool: it is CPU work with no `.await`
/// in it, milliseconds per batch and tens of milliseconds for a group of
/// them ([`GROUP_BYTES`]), which on an async worker would hold up every
/// other task there (API requests, the source's HTTP transfers).
///
/// Checkpoints queue behind the batches emitted before them and come back
/// as [`Written::checkpoint`] once all of those are written, without
/// stopping the batches after them.
pub struct Loader {
    writer: std::sync::Arc<Writer>,
    stream: std::sync::Arc<StreamTarget>,
    limit: usize,
    in_flight: std::collections::VecDeque<InFlight>,
}

/// Where a stream's batches go and how they are keyed.
struct StreamTarget {
    pipeline_id: String,
    stream: String,
    mode: StreamSyncMode,
    primary_key: Vec<String>,
}

enum InFlight {
    Batch(tokio::task::JoinHandle<Result<(u64, u64), WriteError>>),
    Checkpoint(String),
}

/// What finished writing since the last call.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub records: u64,
    pub bytes: u64,
    /// The latest checkpoint whose data is all written.
    pub checkpoint: Option<String>,
}

impl Loader {
    pub fn new(writer: std::sync::Arc<Writer>, pipeline_id: &str, stream: &str, mode: StreamSyncMode, primary_key: Vec<String>) -> Loader {
        let limit = writer.concurrent_batches(mode);
        let stream = StreamTarget { pipeline_id: pipeline_id.to_owned(), stream: stream.to_owned(), mode, primary_key };
        Loader { writer, stream: std::sync::Arc::new(stream), limit, in_flight: Default::default() }
    }

    /// Prepares `records` and starts writing them, first waiting for
    /// earlier batches while too many are in flight. Returns what finished
    /// meanwhile, or the first failure.
    pub async fn write(&mut self, records: Vec<String>) -> Result<Written, WriteError> {
        let (writer, stream) = (self.writer.clone(), self.stream.clone());
        let batch = tokio::task::spawn_blocking(move || writer.prepare(&stream.pipeline_id, &stream.stream, &records, stream.mode, &stream.primary_key))
            .await
            .unwrap_or_else(|e| Err(WriteError::Destination(format!("preparing the batch stopped: {e}"))))?;
        let mut written = Written::default();
        while self.batches() >= self.limit {
            self.next(&mut written).await?;
        }
        let writer = self.writer.clone();
        self.in_flight.push_back(InFlight::Batch(tokio::spawn(async move {
            let records = batch.records;
            writer.apply(batch).await.map(|bytes| (records, bytes))
        })));
        Ok(written)
    }

    /// Queues a checkpoint behind the batches written before it; returns
    /// it at once when there are none.
    pub fn checkpoint(&mut self, state: String) -> Written {
        if self.in_flight.is_empty() {
            return Written { checkpoint: Some(state), ..Written::default() };
        }
        self.in_flight.push_back(InFlight::Checkpoint(state));
        Written::default()
    }

    /// Waits until every batch is written; what finished, or the first
    /// failure.
    pub async fn drain(&mut self) -> Result<Written, WriteError> {
        let mut written = Written::default();
        while !self.in_flight.is_empty() {
            self.next(&mut written).await?;
        }
        Ok(written)
    }

    /// Waits for the oldest batch, and takes the checkpoints it makes due.
    async fn next(&mut self, written: &mut Written) -> Result<(), WriteError> {
        self.take_due(written);
        if let Some(InFlight::Batch(task)) = self.in_flight.pop_front() {
            let (records, bytes) = task.await.unwrap_or_else(|e| Err(WriteError::Destination(format!("the writer stopped: {e}"))))?;
            written.records += records;
            written.bytes += bytes;
        }
        self.take_due(written);
        Ok(())
    }

    /// Batches being written now.
    fn batches(&self) -> usize {
        self.in_flight.iter().filter(|f| matches!(f, InFlight::Batch(_))).count()
    }

    /// Takes the checkpoints no unwritten batch precedes.
    fn take_due(&mut self, written: &mut Written) {
        while let Some(InFlight::Checkpoint(_)) = self.in_flight.front() {
            if let Some(InFlight::Checkpoint(state)) = self.in_flight.pop_front() {
                written.checkpoint = Some(state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(n: usize, size: usize) -> Work {
        Work::Records((0..n).map(|_| "r".repeat(size)).collect())
    }

    #[tokio::test]
    async fn queued_batches_are_written_together_with_the_latest_checkpoint_after_them() {
        let (tx, mut rx) = queue(QUEUE_BYTES);
        tx.send(Work::Checkpoint("c2".into())).await.unwrap();
        tx.send(records(3, 10)).await.unwrap();
        tx.send(Work::Checkpoint("c3".into())).await.unwrap();
        let (gathered, checkpoint) = gather(records(2, 10), &mut rx);
        assert_eq!(gathered.len(), 5, "both batches in one");
        assert_eq!(checkpoint.as_deref(), Some("c3"), "the latest checkpoint, which covers them all");
        assert!(rx.try_recv().is_none(), "the queue is empty");

        let (gathered, checkpoint) = gather(Work::Checkpoint("alone".into()), &mut rx);
        assert!(gathered.is_empty());
        assert_eq!(checkpoint.as_deref(), Some("alone"));
    }

    #[tokio::test]
    async fn a_group_stops_at_its_byte_limit() {
        let (tx, mut rx) = queue(QUEUE_BYTES);
        tx.send(records(1, 10)).await.unwrap();
        tx.send(Work::Checkpoint("later".into())).await.unwrap();
        let (gathered, checkpoint) = gather(records(4, GROUP_BYTES / 4), &mut rx);
        assert_eq!((gathered.len(), checkpoint), (4, None), "a full group takes nothing more");
        let (gathered, checkpoint) = gather(rx.try_recv().unwrap(), &mut rx);
        assert_eq!((gathered.len(), checkpoint.as_deref()), (1, Some("later")), "what was left is the next group");
    }

    #[tokio::test]
    async fn the_queue_holds_bytes_not_items_and_a_stopped_writer_frees_its_senders() {
        fn pending<F: std::future::Future + Unpin>(f: &mut F) -> bool {
            std::pin::Pin::new(f).poll(&mut std::task::Context::from_waker(std::task::Waker::noop())).is_pending()
        }
        let checkpoint = |s: &str| Work::Checkpoint(s.into());
        let (tx, mut rx) = queue(10 * checkpoint("0").cost() + records(4, 20).cost() + 10);
        for i in 0..10 {
            tx.send(checkpoint(&i.to_string())).await.unwrap();
        }
        tx.send(records(4, 20)).await.unwrap();
        let mut full = Box::pin(tx.send(records(1, 20)));
        assert!(pending(&mut full), "10 bytes of room left: a record of 20 waits");
        assert!(matches!(rx.recv().await, Some(Work::Checkpoint(c)) if c == "0"));
        assert!(pending(&mut full), "one checkpoint taken off is not room enough");
        for _ in 1..10 {
            assert!(matches!(rx.try_recv(), Some(Work::Checkpoint(_))));
        }
        assert!(matches!(rx.try_recv(), Some(Work::Records(r)) if r.len() == 4));
        assert!(full.await.is_ok(), "room again once the writer took what was queued");

        let mut oversized = Box::pin(tx.send(records(1, 100_000)));
        assert!(pending(&mut oversized), "larger than the queue: waits for it to be empty");
        assert!(rx.try_recv().is_some());
        assert!(oversized.await.is_ok(), "and then goes in alone");

        let mut waiting = Box::pin(tx.send(records(1, 50)));
        assert!(pending(&mut waiting));
        drop(rx);
        assert!(matches!(waiting.await, Err(Work::Records(r)) if r.len() == 1), "the work comes back when the writer stopped");
        assert!(tx.send(checkpoint("late")).await.is_err());

        // Empty items are not free: a flood of them fills the queue too.
        let (tx, _rx) = queue(3 * ITEM_OVERHEAD);
        for _ in 0..3 {
            tx.send(checkpoint("")).await.unwrap();
        }
        assert!(pending(&mut Box::pin(tx.send(checkpoint("")))));
    }

    #[test]
    fn names_are_safe_sql_identifiers() {
        assert_eq!(sql_name("Campaign Stats"), "campaign_stats");
        assert_eq!(sql_name("1st"), "_1st");
        assert_eq!(sql_name("a\"; DROP TABLE x; --"), "a___drop_table_x____");
    }

    #[test]
    fn records_become_rows_with_their_fields_as_column_text() {
        let records = [
            r#"{"id": 1, "name": "caf\u00e9 \"x\"", "tags": ["a", "b"], "gone": null, "_service_raw_id": "spoof"}"#.to_owned(),
            r#"{"id": 2, "Name": "second", "extra": {"deep": true}}"#.to_owned(),
        ];
        let shaped = records.iter().map(|r| shape(r, StreamSyncMode::IncrementalAppend, &[])).collect::<Result<Vec<_>, _>>().unwrap();
        assert_ne!(shaped[0].raw_id, shaped[1].raw_id);
        let Rows { columns, rows } = Rows::collect(shaped, false).unwrap();
        assert_eq!(columns, ["id", "name", "tags", "gone", "extra"], "one column per field name, _service_ fields dropped");
        let first: Vec<Option<&str>> = rows[0].1.iter().map(|v| v.as_deref()).collect();
        assert_eq!(first, [Some("1"), Some("café \"x\""), Some(r#"["a", "b"]"#), None]);
        let second: Vec<Option<&str>> = rows[1].1.iter().map(|v| v.as_deref()).collect();
        assert_eq!(second, [Some("2"), Some("second"), None, None, Some(r#"{"deep": true}"#)], "Name and name share a column");
    }

    #[test]
    fn deduplicated_keys_come_from_the_primary_key_and_the_last_copy_wins() {
        let pk = ["id".to_owned()];
        let records = [r#"{"id": 7, "v": "old"}"#.to_owned(), r#"{"v": "other", "id": 8}"#.to_owned(), r#"{ "id" : 7 , "v": "new"}"#.to_owned()];
        let shaped = records.iter().map(|r| shape(r, StreamSyncMode::IncrementalDeduped, &pk)).collect::<Result<Vec<_>, _>>().unwrap();
        assert_eq!(shaped[0].raw_id, shaped[2].raw_id, "formatting does not change the key");
        assert_eq!(shaped[0].raw_id, hex(&Sha256::digest(b"[7]")));
        let Rows { rows, .. } = Rows::collect(shaped, true).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].1[1].as_deref(), Some("new"));
        assert!(shape("[1]", StreamSyncMode::IncrementalAppend, &[]).is_err());
        assert!(shape("not json", StreamSyncMode::IncrementalAppend, &[]).is_err());
    }

    #[test]
    fn copy_rows_are_length_prefixed_fields_between_a_header_and_a_trailer() {
        let names: Vec<String> = ["_service_raw_id", "_service_extracted_at", "_service_meta", "a", "b"].iter().map(|n| quote(n)).collect();
        let rows: Vec<Row> = vec![("k".into(), vec![Some("a\tb\\".into()), None])];
        let data = copy_data(&names, &rows, 258, "{}").unwrap();
        let mut expected = b"PGCOPY\n\xff\r\n\0".to_vec();
        expected.extend_from_slice(&[0; 8]); // no flags, no header extension
        expected.extend_from_slice(&[0, 5]); // five fields
        expected.extend_from_slice(&[0, 0, 0, 1, b'k']);
        expected.extend_from_slice(&[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 1, 2]); // BIGINT 258
        expected.extend_from_slice(&[0, 0, 0, 2, b'{', b'}']);
        expected.extend_from_slice(&[0, 0, 0, 4, b'a', b'\t', b'b', b'\\']); // as it is, nothing escaped
        expected.extend_from_slice(&[0xff; 4]); // NULL
        expected.extend_from_slice(&[0xff; 2]); // the trailer
        assert_eq!(data, expected);
    }

    #[test]
    fn binary_copy_rows_convert_to_the_text_format_for_typed_columns() {
        let names: Vec<String> = ["_service_raw_id", "_service_extracted_at", "_service_meta", "a", "b", "c"].iter().map(|n| quote(n)).collect();
        let rows: Vec<Row> = vec![
            ("k1".into(), vec![Some("tab\there, newline\n, cr\r, backslash\\".into()), None, Some(r#"{"n":1}"#.into())]),
            ("k2".into(), vec![Some("plain".into())]),
        ];
        let text = copy_text_from_binary(&copy_data(&names, &rows, 1_700_000_000_123, "{}").unwrap()).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "k1\t1700000000123\t{}\ttab\\there, newline\\n, cr\\r, backslash\\\\\t\\N\t{\"n\":1}\n\
             k2\t1700000000123\t{}\tplain\t\\N\t\\N\n"
        );
        assert!(copy_text_from_binary(&copy_data(&names, &rows, 0, "{}").unwrap()[..40]).is_err(), "cut short: refused, not misread");
    }

    #[tokio::test]
    async fn checkpoints_come_due_only_after_the_batches_before_them() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Writer::open(&DestinationConfig::Jsonl { directory: "out".into() }, &test_place(dir.path()), None).await.unwrap();
        let mut loader = Loader::new(std::sync::Arc::new(writer), "p", "events", StreamSyncMode::IncrementalAppend, Vec::new());
        let batch = |n: usize| (0..n).map(|i| format!(r#"{{"id": {i}}}"#)).collect::<Vec<_>>();
        assert_eq!(loader.checkpoint("a".into()).checkpoint.as_deref(), Some("a"), "nothing before it: due at once");
        assert_eq!(loader.write(batch(2)).await.unwrap(), Written::default());
        assert_eq!(loader.checkpoint("b".into()), Written::default(), "its batch is still in flight");
        let after_first = loader.write(batch(3)).await.unwrap();
        assert_eq!((after_first.records, after_first.checkpoint.as_deref()), (2, Some("b")));
        loader.checkpoint("c".into());
        let rest = loader.drain().await.unwrap();
        assert_eq!((rest.records, rest.checkpoint.as_deref()), (3, Some("c")));
        let lines = std::fs::read_to_string(dir.path().join("exports/ws_test/out/events.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 5);
        assert!(loader.write(vec!["not json".to_owned()]).await.is_err(), "a bad record fails before it is queued");
    }

    #[tokio::test]
    async fn sqlite_commits_reach_the_database_file_in_the_background_and_the_log_goes_on_close() {
        let dir = tempfile::tempdir().unwrap();
        let writer = std::sync::Arc::new(Writer::open(&DestinationConfig::Sqlite { file: "w.db".into() }, &test_place(dir.path()), None).await.unwrap());
        let mut loader = Loader::new(writer.clone(), "p", "events", StreamSyncMode::IncrementalAppend, Vec::new());
        let pad = "x".repeat(1000);
        loader.write((0..200).map(|i| json!({ "id": i, "pad": pad }).to_string()).collect()).await.unwrap();
        assert_eq!(loader.drain().await.unwrap().records, 200);
        // 200 KB is far below the writer's own checkpoint threshold: only
        // the checkpointer moves it from the log into the file.
        let (file, log) = (dir.path().join("warehouses/ws_test/w.db"), dir.path().join("warehouses/ws_test/w.db-wal"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::metadata(&file).unwrap().len() < 200 * 1000 {
            assert!(std::time::Instant::now() < deadline, "the committed rows never reached the database file");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        drop(loader);
        let Ok(writer) = std::sync::Arc::try_unwrap(writer) else { panic!("the writer is still shared") };
        writer.close().await;
        assert!(!log.exists(), "closing folds the log into the file and removes it");
    }

    #[tokio::test]
    async fn a_nul_character_is_a_bad_record_for_postgres_only() {
        let records = vec![r#"{"id": 1, "note": "a\u0000b"}"#.to_owned()];
        // Nothing connects: preparing does no I/O.
        let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://nobody@127.0.0.1:1/none").unwrap();
        let postgres = Writer::Sql { db: Db::Postgres(pool), columns: Default::default() };
        for mode in [StreamSyncMode::IncrementalAppend, StreamSyncMode::IncrementalDeduped] {
            match postgres.prepare("p", "events", &records, mode, &["id".to_owned()]) {
                Err(WriteError::BadRecord(m)) => assert!(m.contains("NUL"), "{m}"),
                Err(e) => panic!("expected a bad record, got {e:?}"),
                Ok(_) => panic!("expected a bad record"),
            }
        }
        let nested = vec![r#"{"id": 1, "payload": {"note": "a\u0000b"}}"#.to_owned()];
        assert!(postgres.prepare("p", "events", &nested, StreamSyncMode::IncrementalAppend, &[]).is_ok(), "nested JSON keeps the escape as text");

        let dir = tempfile::tempdir().unwrap();
        let sqlite = Writer::open(&DestinationConfig::Sqlite { file: "w.db".into() }, &test_place(dir.path()), None).await.unwrap();
        assert!(sqlite.prepare("p", "events", &records, StreamSyncMode::IncrementalAppend, &[]).is_ok(), "SQLite stores NUL in text");
    }

    #[test]
    fn paths_side_files_and_passwords_are_refused() {
        assert!(validate("sqlite", &json!({ "file": "../etc/passwd" })).is_err());
        assert!(validate("jsonl", &json!({ "directory": "/tmp" })).is_err());
        for side in ["w.db-wal", "w.db-shm", "w.db-journal", "W.DB-WAL"] {
            assert!(validate("sqlite", &json!({ "file": side })).is_err(), "{side}");
        }
        assert!(validate("postgres", &json!({ "url": "postgres://u:pw@h/db" })).is_err());
        assert!(validate("postgres", &json!({ "url": "postgres://u@h/db" })).is_ok());
        assert!(validate("postgres", &json!({ "url": "postgres://u@h/db?host=/tmp" })).is_err());
        assert!(validate("mysql", &json!({})).is_err());
    }

    /// A workspace's place in a scratch data directory.
    fn test_place(dir: &Path) -> Place<'_> {
        static NONE: std::sync::OnceLock<postgres::WarehousePolicy> = std::sync::OnceLock::new();
        Place { data_dir: dir, workspace_id: "ws_test", warehouses: NONE.get_or_init(Default::default) }
    }
}
