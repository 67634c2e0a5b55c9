//! Read-only queries over a warehouse: what reverse-ETL models run.
//!
//! The database enforces that a model cannot write, not a parser of ours:
//! an SQLite file is opened read-only with `query_only` on, and a
//! PostgreSQL query runs in a `READ ONLY` transaction with a statement
//! timeout, on a connection of its own that is closed afterwards. The
//! statement is run as a subquery through the prepared-statement protocol,
//! and a `;` anywhere but at its end is refused (SQLite's driver would run
//! every statement of a text), so it is exactly one query: an `ATTACH`, a
//! `PRAGMA` or a `VACUUM INTO` cannot follow it. SQLite queries are bounded
//! in time by a progress handler.
//!
//! What a model may do beyond `READ ONLY` is narrowed too: an SQLite
//! model may read tables and views only (an authorizer refuses PRAGMAs,
//! including the `pragma_*` table functions that would show the data
//! directory's path, and everything else), and a PostgreSQL one never runs
//! as a role that is, or may become, a superuser; where the destination
//! names a `model_role`, it runs as that role.
//!
//! Values larger than the caller's cap never reach this process: the
//! database measures them (`octet_length`, without loading them) and a
//! marker with their size ([`OVERSIZE`]) comes instead, so one huge value
//! costs no memory here. SQLite is also told the longest value it may
//! build at all.
//!
//! Rows come out in batches through a channel from a task of their own,
//! so a model is streamed, never held whole. SQLite rows are read through
//! its C interface on a thread of their own ([`ModelReader`]), once the
//! driver has prepared the statement and named its columns.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use secrecy::SecretString;
use serde::Serialize;
use serde_json::{Map, Value};
use sqlx::{Column as _, Connection, Executor, Row, Statement, TypeInfo};
use tokio::sync::mpsc;
use utoipa::ToSchema;

use super::sqlite::read::{Cell, ModelReader, ReadFailure, model_authorizer};
use super::{DestinationConfig, Place, postgres};
use libsqlite3_sys as ffi;

/// Rows handed over per batch.
const BATCH_ROWS: usize = 1024;

/// The key of the marker that stands for a value larger than the cap:
/// `{"$service_oversize": <bytes>}`.
pub(crate) const OVERSIZE: &str = "$service_oversize";

/// The size of the value a marker stands for, when `v` is one.
pub(crate) fn oversize(v: &Value) -> Option<u64> {
    match v {
        Value::Object(m) if m.len() == 1 => m.get(OVERSIZE).and_then(Value::as_u64),
        _ => None,
    }
}

fn oversize_marker(bytes: u64) -> Value {
    Value::Object(Map::from_iter([(OVERSIZE.to_owned(), Value::from(bytes))]))
}

/// How SQLite hands over a value it withheld: a text no stored text
/// starts with in practice (a NUL), then the size.
const SQLITE_OVERSIZE_PREFIX: &str = "\u{0}oversize:";

/// The longest string or blob an SQLite model may build at all (its own
/// concatenations, `zeroblob`, `printf`), whatever the value cap.
const SQLITE_LENGTH_FLOOR: usize = 16 * 1024 * 1024;

/// How much of a model a caller takes.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Rows at most.
    pub rows: Option<u64>,
    /// Values larger than this many bytes are withheld (see [`OVERSIZE`]).
    pub value_bytes: usize,
    pub timeout: Duration,
}

/// A column of a model's result.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Column {
    pub name: String,
    /// The database's type name (`INTEGER`, `TEXT`, `int8`, `timestamptz`
    /// ...), or the type of the values seen when the database has none.
    #[serde(rename = "type")]
    pub type_name: String,
}

/// Why a model query gave no rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The database refused to write: the statement is not read-only.
    #[error("the warehouse refused to write: {0}")]
    ReadOnly(String),
    /// The database refused the statement (syntax, unknown table or
    /// column, more than one statement).
    #[error("the warehouse refused the query: {0}")]
    Invalid(String),
    /// It ran past its time limit and was stopped.
    #[error("the query ran longer than {0} s and was stopped")]
    Timeout(u64),
    /// The warehouse could not be reached or opened.
    #[error("the warehouse is unavailable: {0}")]
    Unavailable(String),
    /// The warehouse's role may do more than read: models never run as it.
    #[error("{0}")]
    RoleRefused(String),
}

impl crate::retry::Transient for QueryError {
    /// Whether another attempt may succeed (the warehouse may come back).
    fn is_transient(&self) -> bool {
        matches!(self, QueryError::Unavailable(_))
    }
}

enum Chunk {
    Columns(Vec<Column>),
    Rows(Vec<Vec<Value>>),
}

/// A running model query: its columns, then its rows batch by batch.
pub struct ModelRows {
    pub columns: Vec<Column>,
    rx: mpsc::Receiver<Result<Chunk, QueryError>>,
}

impl ModelRows {
    /// The next batch of rows (values in column order); `None` at the end.
    pub(crate) async fn next_batch(&mut self) -> Result<Option<Vec<Vec<Value>>>, QueryError> {
        loop {
            match self.rx.recv().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(e),
                Some(Ok(Chunk::Rows(rows))) => return Ok(Some(rows)),
                Some(Ok(Chunk::Columns(_))) => continue,
            }
        }
    }
}

/// Runs `sql` (one `SELECT`) read-only against the warehouse within
/// `bounds`. Returns once the statement is prepared: a refused statement is
/// an error here, not in a batch.
pub(crate) async fn run(
    config: &DestinationConfig,
    place: &Place<'_>,
    password: Option<SecretString>,
    sql: &str,
    bounds: Bounds,
) -> Result<ModelRows, QueryError> {
    let body = sql.trim().trim_end_matches(';').trim_end();
    if body.is_empty() {
        return Err(QueryError::Invalid("the query is empty".into()));
    }
    // SQLite's driver prepares and runs every statement of a text, so a
    // body that closes the subquery could append statements (a PRAGMA, an
    // ATTACH, a VACUUM INTO). A model is one statement: `;` may only end it.
    if body.contains(';') {
        return Err(QueryError::Invalid("a model is exactly one SELECT statement: `;` may only end it".into()));
    }
    let (tx, mut rx) = mpsc::channel(4);
    let model =
        Model { body: body.to_owned(), limit: bounds.rows.map(|n| format!(" LIMIT {n}")).unwrap_or_default(), bounds };
    match config {
        DestinationConfig::Sqlite { file } => {
            let path = place.warehouse_dir().join(file);
            if !path.is_file() {
                return Err(QueryError::Unavailable(
                    "the SQLite warehouse has no data yet (no pipeline has written to it)".into(),
                ));
            }
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .read_only(true)
                .create_if_missing(false)
                .pragma("query_only", "ON")
                .busy_timeout(Duration::from_secs(5));
            tokio::spawn(async move {
                let result = sqlite_rows(options, path, &model, &tx).await;
                if let Err(e) = result {
                    let _ = tx.send(Err(e)).await;
                }
            });
        }
        DestinationConfig::Postgres { target, model_role, .. } => {
            let options = postgres::connect_options(target, password.as_ref(), place.warehouses)
                .await
                .map_err(|e| QueryError::Unavailable(e.to_string()))?;
            let role = model_role.clone();
            tokio::spawn(async move {
                let result = postgres_rows(options, role.as_deref(), &model, &tx).await;
                if let Err(e) = result {
                    let _ = tx.send(Err(e)).await;
                }
            });
        }
        DestinationConfig::Jsonl { .. } | DestinationConfig::Iceberg { .. } => {
            return Err(QueryError::Invalid("only SQLite and PostgreSQL warehouses can be queried by models".into()));
        }
    }
    match rx.recv().await {
        Some(Ok(Chunk::Columns(columns))) => Ok(ModelRows { columns, rx }),
        Some(Err(e)) => Err(e),
        _ => Err(QueryError::Unavailable("the query stopped before it started".into())),
    }
}

/// A model's statement and how much of it is taken.
struct Model {
    body: String,
    /// ` LIMIT n`, or nothing.
    limit: String,
    bounds: Bounds,
}

impl Model {
    /// The statement as a subquery, every column as it is.
    fn plain(&self) -> String {
        format!("SELECT * FROM ({}) AS model{}", self.body, self.limit)
    }
}

/// An SQLite identifier, quoted.
fn sqlite_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Prepares the model on a connection of the driver (which names the
/// columns and their declared types), then reads its rows on a
/// [`ModelReader`] off the async workers.
async fn sqlite_rows(
    options: sqlx::sqlite::SqliteConnectOptions,
    path: std::path::PathBuf,
    model: &Model,
    tx: &mpsc::Sender<Result<Chunk, QueryError>>,
) -> Result<(), QueryError> {
    let timeout = model.bounds.timeout;
    let mut conn = sqlx::sqlite::SqliteConnection::connect_with(&options)
        .await
        .map_err(|e| QueryError::Unavailable(e.to_string()))?;
    let deadline = Instant::now() + timeout;
    let longest = model.bounds.value_bytes.max(SQLITE_LENGTH_FLOOR);
    {
        let mut handle = conn.lock_handle().await.map_err(|e| QueryError::Unavailable(e.to_string()))?;
        handle.set_progress_handler(10_000, move || Instant::now() < deadline);
        let db = handle.as_raw_handle().as_ptr();
        // SAFETY: `db` is this connection's open handle, held locked; the
        // authorizer is a plain function that keeps no state.
        unsafe {
            ffi::sqlite3_limit(db, ffi::SQLITE_LIMIT_LENGTH, c_int::try_from(longest).unwrap_or(c_int::MAX));
            ffi::sqlite3_set_authorizer(db, Some(model_authorizer), std::ptr::null_mut());
        }
    }
    let secs = timeout.as_secs();
    let plain = model.plain();
    let statement = conn
        .prepare(sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(plain.clone())))
        .await
        .map_err(|e| classify(e, secs))?;
    let declared: Vec<Column> = statement
        .columns()
        .iter()
        .map(|c| Column { name: c.name().to_owned(), type_name: c.type_info().name().to_owned() })
        .collect();
    drop(statement);
    let _ = conn.close().await;
    // Each value is measured before it is read; a column name the result
    // has twice cannot be addressed, and then the length limit alone holds.
    let names: std::collections::HashSet<&str> = declared.iter().map(|c| c.name.as_str()).collect();
    let sql = if names.len() == declared.len() && !declared.is_empty() {
        let cap = model.bounds.value_bytes;
        let columns: Vec<String> = declared
            .iter()
            .map(|c| {
                let col = format!("model.{}", sqlite_ident(&c.name));
                format!("CASE WHEN octet_length({col}) > {cap} THEN char(0) || 'oversize:' || octet_length({col}) ELSE {col} END AS {}", sqlite_ident(&c.name))
            })
            .collect();
        format!("SELECT {} FROM ({}) AS model{}", columns.join(", "), model.body, model.limit)
    } else {
        plain
    };
    if tx.send(Ok(Chunk::Columns(declared))).await.is_err() {
        return Ok(());
    }
    let tx = tx.clone();
    let read = tokio::task::spawn_blocking(move || {
        let mut reader = ModelReader::open(&path, longest, deadline).map_err(|e| classify_sqlite(e, secs))?;
        let mut batch = Vec::with_capacity(BATCH_ROWS);
        reader
            .rows(&sql, |row| {
                batch.push((0..row.len()).map(|i| sqlite_value(row.cell(i))).collect());
                batch.len() < BATCH_ROWS
                    || tx
                        .blocking_send(Ok(Chunk::Rows(std::mem::replace(&mut batch, Vec::with_capacity(BATCH_ROWS)))))
                        .is_ok()
            })
            .map_err(|e| classify_sqlite(e, secs))?;
        if !batch.is_empty() {
            let _ = tx.blocking_send(Ok(Chunk::Rows(batch)));
        }
        Ok(())
    });
    read.await.map_err(|e| QueryError::Unavailable(format!("the query stopped: {e}")))?
}

/// A value as SQLite stored it (its storage class, whatever the column
/// was declared as); a text that is not UTF-8 reads as null.
fn sqlite_value(cell: Cell<'_>) -> Value {
    match cell {
        Cell::Null => Value::Null,
        Cell::Integer(n) => Value::from(n),
        Cell::Real(x) => serde_json::Number::from_f64(x).map(Value::Number).unwrap_or(Value::Null),
        Cell::Blob(b) => {
            use base64::Engine as _;
            Value::String(base64::engine::general_purpose::STANDARD.encode(b))
        }
        Cell::Text(t) => match std::str::from_utf8(t) {
            Ok(text) => match text.strip_prefix(SQLITE_OVERSIZE_PREFIX).and_then(|n| n.parse().ok()) {
                Some(bytes) => oversize_marker(bytes),
                None => Value::String(text.to_owned()),
            },
            Err(_) => Value::Null,
        },
    }
}

/// Whether the connection's roles may do more than read: the login role
/// or the role the model runs as is, or may become, a superuser (a model
/// could switch to it with `set_config('role', …)`).
const POSTGRES_SUPERUSER_REACH: &str = "SELECT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolsuper \
     AND (pg_has_role(session_user, r.oid, 'MEMBER') OR pg_has_role(current_user, r.oid, 'MEMBER')))";

async fn postgres_rows(
    options: sqlx::postgres::PgConnectOptions,
    role: Option<&str>,
    model: &Model,
    tx: &mpsc::Sender<Result<Chunk, QueryError>>,
) -> Result<(), QueryError> {
    let timeout = model.bounds.timeout;
    let secs = timeout.as_secs();
    let mut conn = sqlx::postgres::PgConnection::connect_with(&options)
        .await
        .map_err(|e| QueryError::Unavailable(e.to_string()))?;
    conn.execute("BEGIN TRANSACTION READ ONLY").await.map_err(|e| classify(e, secs))?;
    conn.execute(sqlx::AssertSqlSafe(format!("SET LOCAL statement_timeout = {}", timeout.as_millis().max(1))))
        .await
        .map_err(|e| classify(e, secs))?;
    if let Some(role) = role {
        // A plain name (checked when the destination was saved), quoted.
        conn.execute(sqlx::AssertSqlSafe(format!("SET LOCAL ROLE \"{role}\""))).await.map_err(|e| match e {
            sqlx::Error::Database(db) => QueryError::RoleRefused(format!(
                "the warehouse's login role cannot run as model_role {role}: {}",
                db.message()
            )),
            other => classify(other, secs),
        })?;
    }
    let reaches_superuser: bool =
        sqlx::query_scalar(POSTGRES_SUPERUSER_REACH).fetch_one(&mut conn).await.map_err(|e| classify(e, secs))?;
    if reaches_superuser {
        let _ = conn.close().await;
        return Err(QueryError::RoleRefused(
            "the warehouse's role is, or may become, a PostgreSQL superuser, which a read-only transaction does not restrain (it can read server files and end other sessions): give models a role that can only read".into(),
        ));
    }
    let described = model.plain();
    let statement = conn
        .prepare(sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(described)))
        .await
        .map_err(|e| classify(e, secs))?;
    let columns: Vec<Column> = statement
        .columns()
        .iter()
        .map(|c| Column { name: c.name().to_owned(), type_name: c.type_info().name().to_owned() })
        .collect();
    let names: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
    if tx.send(Ok(Chunk::Columns(columns))).await.is_err() {
        return Ok(());
    }
    // Each value is measured in the database; one over the cap comes as a
    // marker of its size, never as itself. A row is measured by its
    // columns' text first (cheap), and only a row with a value over the
    // cap is taken apart value by value.
    let cap = model.bounds.value_bytes;
    let marked = format!(
        "(SELECT json_object_agg(e.key, CASE WHEN octet_length(e.value #>> '{{}}') > {cap} THEN json_build_object('{OVERSIZE}', octet_length(e.value #>> '{{}}')) ELSE e.value END) \
         FROM json_each(row_to_json(model)) AS e)::text"
    );
    let distinct: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    let row = if distinct.len() == names.len() && !names.is_empty() {
        let longest: Vec<String> =
            names.iter().map(|n| format!("octet_length(model.\"{}\"::text)", n.replace('"', "\"\""))).collect();
        format!("CASE WHEN GREATEST({}) > {cap} THEN {marked} ELSE row_to_json(model)::text END", longest.join(", "))
    } else {
        marked
    };
    let as_json = format!("SELECT {row} FROM ({}) AS model{}", model.body, model.limit);
    let in_order = InColumnOrder::new(&names);
    {
        let mut rows = sqlx::query(sqlx::AssertSqlSafe(as_json)).fetch(&mut conn);
        let mut batch = Vec::with_capacity(BATCH_ROWS);
        while let Some(row) = rows.try_next().await.map_err(|e| classify(e, secs))? {
            let text: Option<&str> = row.try_get(0).map_err(|e| QueryError::Invalid(e.to_string()))?;
            batch.push(in_order.read(text));
            if batch.len() == BATCH_ROWS
                && tx
                    .send(Ok(Chunk::Rows(std::mem::replace(&mut batch, Vec::with_capacity(BATCH_ROWS)))))
                    .await
                    .is_err()
            {
                return Ok(());
            }
        }
        if !batch.is_empty() {
            let _ = tx.send(Ok(Chunk::Rows(batch))).await;
        }
    }
    let _ = conn.execute("ROLLBACK").await;
    let _ = conn.close().await;
    Ok(())
}

/// Reads a row's JSON object (as `row_to_json` writes it) straight into
/// its columns' order, without building the object: a key no column has
/// is skipped, a column the object lacks is null, the last of repeated
/// keys counts, and a text that is not an object reads as nulls.
struct InColumnOrder<'a> {
    columns: std::collections::HashMap<&'a str, usize>,
    width: usize,
}

impl<'a> InColumnOrder<'a> {
    fn new(names: &'a [String]) -> Self {
        let columns = names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        InColumnOrder { columns, width: names.len() }
    }

    fn read(&self, text: Option<&str>) -> Vec<Value> {
        use serde::de::DeserializeSeed as _;
        text.and_then(|t| {
            let mut de = serde_json::Deserializer::from_str(t);
            let row = self.deserialize(&mut de).ok()?;
            de.end().ok().map(|()| row)
        })
        .unwrap_or_else(|| vec![Value::Null; self.width])
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for &InColumnOrder<'_> {
    type Value = Vec<Value>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Vec<Value>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for &InColumnOrder<'_> {
    type Value = Vec<Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a row as a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Vec<Value>, A::Error> {
        let mut row = vec![Value::Null; self.width];
        while let Some(column) = map.next_key_seed(ColumnOf(&self.columns))? {
            match column {
                Some(i) => row[i] = map.next_value()?,
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(row)
    }
}

/// A key of a row's object, as the index of the column it names.
struct ColumnOf<'c, 'a>(&'c std::collections::HashMap<&'a str, usize>);

impl<'de> serde::de::DeserializeSeed<'de> for ColumnOf<'_, '_> {
    type Value = Option<usize>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ColumnOf<'_, '_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a column name")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(self.0.get(key).copied())
    }
}

/// What a database error means for a model query.
fn classify(e: sqlx::Error, timeout_secs: u64) -> QueryError {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            classify_refusal(&code, db.message(), timeout_secs)
        }
        other => QueryError::Unavailable(other.to_string().chars().take(300).collect()),
    }
}

/// What an error of the [`ModelReader`] means for a model query: a
/// database that cannot be opened is unavailable, anything else a refusal.
fn classify_sqlite(e: ReadFailure, timeout_secs: u64) -> QueryError {
    match e.code & 0xff {
        ffi::SQLITE_CANTOPEN | ffi::SQLITE_NOMEM | ffi::SQLITE_IOERR | ffi::SQLITE_CORRUPT | ffi::SQLITE_NOTADB => {
            QueryError::Unavailable(e.message.chars().take(300).collect())
        }
        code => classify_refusal(&code.to_string(), &e.message, timeout_secs),
    }
}

/// What a database's refusal (its code and message) means.
fn classify_refusal(code: &str, message: &str, timeout_secs: u64) -> QueryError {
    let message = message.chars().take(300).collect::<String>();
    let lower = message.to_ascii_lowercase();
    // PostgreSQL: read_only_sql_transaction, query_canceled, and a
    // data-modifying WITH that may not appear in a subquery.
    // SQLite: SQLITE_READONLY (8, with extended codes), SQLITE_INTERRUPT (9).
    if lower.contains("not authorized") {
        QueryError::Invalid(
            "a model may only read tables and views: PRAGMAs, their pragma_* functions and other statements are refused"
                .into(),
        )
    } else if code == "25006"
        || lower.contains("readonly")
        || lower.contains("read-only")
        || lower.contains("data-modifying")
        || code == "8"
    {
        QueryError::ReadOnly(message)
    } else if code == "57014" || code == "9" || lower.contains("interrupted") {
        QueryError::Timeout(timeout_secs)
    } else if lower.contains("near \";\"") || lower.contains("syntax error at or near \";\"") {
        QueryError::Invalid(format!("a model is exactly one SELECT statement ({message})"))
    } else {
        QueryError::Invalid(message)
    }
}

/// The text a key value is compared and kept as: strings as they are,
/// anything else as its JSON text; `None` for null.
pub(crate) fn key_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_row_object_is_read_in_column_order() {
        let names = vec!["id".to_owned(), "e\"mail".to_owned(), "n".to_owned()];
        let order = InColumnOrder::new(&names);
        assert_eq!(
            order.read(Some(r#"{"n": {"a": [1, 2]}, "extra": [true], "e\"mail": "x@y", "id": 7}"#)),
            vec![json!(7), json!("x@y"), json!({"a": [1, 2]})]
        );
        // The last of repeated keys; a missing column is null.
        assert_eq!(order.read(Some(r#"{"id": 1, "id": 2}"#)), vec![json!(2), Value::Null, Value::Null]);
        for broken in [None, Some("[1, 2, 3]"), Some("{\"id\": 1"), Some("{\"id\": 1} 2"), Some("null")] {
            assert_eq!(order.read(broken), vec![Value::Null; 3], "{broken:?}");
        }
    }
}
