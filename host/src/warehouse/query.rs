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
//! Rows come out in batches through a channel from a task of their own,
//! so a model is streamed, never held whole.

use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use secrecy::SecretString;
use serde::Serialize;
use serde_json::{Map, Value};
use sqlx::{Column as _, Connection, Executor, Row, Statement, TypeInfo, ValueRef};
use tokio::sync::mpsc;
use utoipa::ToSchema;

use super::{DestinationConfig, Place, postgres};

/// Rows handed over per batch.
const BATCH_ROWS: usize = 1024;

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
    pub async fn next_batch(&mut self) -> Result<Option<Vec<Vec<Value>>>, QueryError> {
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

/// Runs `sql` (one `SELECT`) read-only against the warehouse, at most
/// `limit` rows and for at most `timeout`. Returns once the statement is
/// prepared: a refused statement is an error here, not in a batch.
pub async fn run(config: &DestinationConfig, place: &Place<'_>, password: Option<SecretString>, sql: &str, limit: Option<u64>, timeout: Duration) -> Result<ModelRows, QueryError> {
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
    let limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
    let (tx, mut rx) = mpsc::channel(4);
    match config {
        DestinationConfig::Sqlite { file } => {
            let path = place.warehouse_dir().join(file);
            if !path.is_file() {
                return Err(QueryError::Unavailable("the SQLite warehouse has no data yet (no pipeline has written to it)".into()));
            }
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .read_only(true)
                .create_if_missing(false)
                .pragma("query_only", "ON")
                .busy_timeout(Duration::from_secs(5));
            let sql = format!("SELECT * FROM ({body}) AS model{limit}");
            tokio::spawn(async move {
                let result = sqlite_rows(options, &sql, timeout, &tx).await;
                if let Err(e) = result {
                    let _ = tx.send(Err(e)).await;
                }
            });
        }
        DestinationConfig::Postgres { target, .. } => {
            let options = postgres::connect_options(target, password.as_ref(), place.warehouses).await.map_err(QueryError::Unavailable)?;
            let described = format!("SELECT * FROM ({body}) AS model{limit}");
            let as_json = format!("SELECT row_to_json(model)::text FROM ({body}) AS model{limit}");
            tokio::spawn(async move {
                let result = postgres_rows(options, &described, &as_json, timeout, &tx).await;
                if let Err(e) = result {
                    let _ = tx.send(Err(e)).await;
                }
            });
        }
        DestinationConfig::Jsonl { .. } => return Err(QueryError::Invalid("a JSON-lines destination cannot be queried; models read SQLite and PostgreSQL warehouses".into())),
    }
    match rx.recv().await {
        Some(Ok(Chunk::Columns(columns))) => Ok(ModelRows { columns, rx }),
        Some(Err(e)) => Err(e),
        _ => Err(QueryError::Unavailable("the query stopped before it started".into())),
    }
}

async fn sqlite_rows(options: sqlx::sqlite::SqliteConnectOptions, sql: &str, timeout: Duration, tx: &mpsc::Sender<Result<Chunk, QueryError>>) -> Result<(), QueryError> {
    let mut conn = sqlx::sqlite::SqliteConnection::connect_with(&options).await.map_err(|e| QueryError::Unavailable(e.to_string()))?;
    let deadline = Instant::now() + timeout;
    conn.lock_handle().await.map_err(|e| QueryError::Unavailable(e.to_string()))?.set_progress_handler(10_000, move || Instant::now() < deadline);
    let secs = timeout.as_secs();
    let statement = conn.prepare(sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(sql.to_owned()))).await.map_err(|e| classify(e, secs))?;
    let declared: Vec<Column> = statement.columns().iter().map(|c| Column { name: c.name().to_owned(), type_name: c.type_info().name().to_owned() }).collect();
    if tx.send(Ok(Chunk::Columns(declared))).await.is_err() {
        return Ok(());
    }
    let mut rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).fetch(&mut conn);
    let mut batch = Vec::with_capacity(BATCH_ROWS);
    while let Some(row) = rows.try_next().await.map_err(|e| classify(e, secs))? {
        let values = (0..row.len()).map(|i| sqlite_value(&row, i)).collect();
        batch.push(values);
        if batch.len() == BATCH_ROWS && tx.send(Ok(Chunk::Rows(std::mem::replace(&mut batch, Vec::with_capacity(BATCH_ROWS))))).await.is_err() {
            return Ok(());
        }
    }
    if !batch.is_empty() {
        let _ = tx.send(Ok(Chunk::Rows(batch))).await;
    }
    Ok(())
}

/// A value as SQLite stored it (its storage class, whatever the column
/// was declared as).
fn sqlite_value(row: &sqlx::sqlite::SqliteRow, i: usize) -> Value {
    let Ok(raw) = row.try_get_raw(i) else { return Value::Null };
    if raw.is_null() {
        return Value::Null;
    }
    match raw.type_info().name() {
        "INTEGER" => row.try_get_unchecked::<i64, _>(i).map(Value::from).unwrap_or(Value::Null),
        "REAL" => row.try_get_unchecked::<f64, _>(i).ok().and_then(serde_json::Number::from_f64).map(Value::Number).unwrap_or(Value::Null),
        "BLOB" => {
            use base64::Engine as _;
            row.try_get_unchecked::<Vec<u8>, _>(i).map(|b| Value::String(base64::engine::general_purpose::STANDARD.encode(b))).unwrap_or(Value::Null)
        }
        _ => row.try_get_unchecked::<String, _>(i).map(Value::String).unwrap_or(Value::Null),
    }
}

async fn postgres_rows(
    options: sqlx::postgres::PgConnectOptions,
    described: &str,
    as_json: &str,
    timeout: Duration,
    tx: &mpsc::Sender<Result<Chunk, QueryError>>,
) -> Result<(), QueryError> {
    let secs = timeout.as_secs();
    let mut conn = sqlx::postgres::PgConnection::connect_with(&options).await.map_err(|e| QueryError::Unavailable(e.to_string()))?;
    conn.execute("BEGIN TRANSACTION READ ONLY").await.map_err(|e| classify(e, secs))?;
    conn.execute(sqlx::AssertSqlSafe(format!("SET LOCAL statement_timeout = {}", timeout.as_millis().max(1)))).await.map_err(|e| classify(e, secs))?;
    let statement = conn.prepare(sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(described.to_owned()))).await.map_err(|e| classify(e, secs))?;
    let columns: Vec<Column> = statement.columns().iter().map(|c| Column { name: c.name().to_owned(), type_name: c.type_info().name().to_owned() }).collect();
    let names: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
    if tx.send(Ok(Chunk::Columns(columns))).await.is_err() {
        return Ok(());
    }
    {
        let mut rows = sqlx::query(sqlx::AssertSqlSafe(as_json.to_owned())).fetch(&mut conn);
        let mut batch = Vec::with_capacity(BATCH_ROWS);
        while let Some(row) = rows.try_next().await.map_err(|e| classify(e, secs))? {
            let text: Option<String> = row.try_get(0).map_err(|e| QueryError::Invalid(e.to_string()))?;
            let mut object: Map<String, Value> = text.as_deref().and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default();
            batch.push(names.iter().map(|n| object.remove(n).unwrap_or(Value::Null)).collect());
            if batch.len() == BATCH_ROWS && tx.send(Ok(Chunk::Rows(std::mem::replace(&mut batch, Vec::with_capacity(BATCH_ROWS))))).await.is_err() {
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

/// What a database error means for a model query.
fn classify(e: sqlx::Error, timeout_secs: u64) -> QueryError {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let message = db.message().chars().take(300).collect::<String>();
            let lower = message.to_ascii_lowercase();
            // PostgreSQL: read_only_sql_transaction, query_canceled, and a
            // data-modifying WITH that may not appear in a subquery.
            // SQLite: SQLITE_READONLY (8, with extended codes), SQLITE_INTERRUPT (9).
            if code == "25006" || lower.contains("readonly") || lower.contains("read-only") || lower.contains("data-modifying") || code == "8" {
                QueryError::ReadOnly(message)
            } else if code == "57014" || code == "9" || lower.contains("interrupted") {
                QueryError::Timeout(timeout_secs)
            } else if lower.contains("near \";\"") || lower.contains("syntax error at or near \";\"") {
                QueryError::Invalid(format!("a model is exactly one SELECT statement ({message})"))
            } else {
                QueryError::Invalid(message)
            }
        }
        other => QueryError::Unavailable(other.to_string().chars().take(300).collect()),
    }
}

/// The text a key value is compared and kept as: strings as they are,
/// anything else as its JSON text; `None` for null.
pub fn key_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}
