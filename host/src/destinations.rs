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
//! destination's folder under the data directory, so no configuration can
//! make the host write anywhere else.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use secrecy::ExposeSecret;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};

use crate::error::ApiError;
use crate::store::pipelines::StreamSyncMode;

/// A validated destination configuration.
#[derive(Debug, Clone)]
pub enum DestinationConfig {
    /// `<data-dir>/warehouses/<file>`.
    Sqlite { file: String },
    /// A PostgreSQL database; the password, if any, by credential handle
    /// (bound to the database host).
    Postgres { url: url::Url, credential_handle: Option<String> },
    /// `<data-dir>/exports/<directory>/<stream>.jsonl`.
    Jsonl { directory: String },
}

fn plain_name(field: &str, v: Option<&str>) -> Result<String, ApiError> {
    let v = v.ok_or_else(|| ApiError::invalid_field(field, format!("{field} is required")))?;
    let ok = !v.is_empty() && v.len() <= 100 && !v.starts_with('.') && v.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok { Ok(v.to_owned()) } else { Err(ApiError::invalid_field(field, format!("{field} must be a plain file name (letters, digits, . _ -)"))) }
}

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
            if !matches!(url.scheme(), "postgres" | "postgresql") || url.host_str().is_none() {
                return Err(ApiError::invalid_field("configuration.url", "url must be a postgres:// URL with a host"));
            }
            if url.password().is_some() {
                return Err(crate::http::extract::secret_refused("configuration.url"));
            }
            DestinationConfig::Postgres { url, credential_handle: obj.get("credential_handle").and_then(Value::as_str).map(str::to_owned) }
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

/// Where records go.
pub enum Writer {
    Sql { pool: AnyPool, postgres: bool, columns: HashMap<String, HashSet<String>> },
    Jsonl { dir: cap_std::fs::Dir },
}

/// One record ready for a table: its key and its columns.
fn shape(record: &str, mode: StreamSyncMode, primary_key: &[String]) -> Result<(String, Map<String, Value>), String> {
    let Value::Object(fields) = serde_json::from_str::<Value>(record).map_err(|_| "a record is not JSON".to_owned())? else {
        return Err("a record is not a JSON object".into());
    };
    let raw_id = if mode == StreamSyncMode::IncrementalDeduped {
        let key: Vec<&Value> = primary_key.iter().map(|k| fields.get(k).unwrap_or(&Value::Null)).collect();
        let digest = Sha256::digest(serde_json::to_vec(&key).unwrap_or_default());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    } else {
        uuid::Uuid::new_v4().to_string()
    };
    Ok((raw_id, fields))
}

fn column_value(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

impl Writer {
    /// Opens the destination for one job.
    pub async fn open(config: &DestinationConfig, data_dir: &Path, password: Option<secrecy::SecretString>) -> Result<Writer, String> {
        match config {
            DestinationConfig::Sqlite { file } => {
                let dir = data_dir.join("warehouses");
                std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create the warehouse directory: {e}"))?;
                let url = format!("sqlite://{}?mode=rwc", dir.join(file).display());
                let pool = AnyPoolOptions::new()
                    .max_connections(1)
                    .after_connect(|c, _| Box::pin(async move { sqlx::Executor::execute(c, "PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 10000;").await.map(|_| ()) }))
                    .connect(&url)
                    .await
                    .map_err(|e| format!("cannot open the SQLite destination: {e}"))?;
                Ok(Writer::Sql { pool, postgres: false, columns: HashMap::new() })
            }
            DestinationConfig::Postgres { url, .. } => {
                let mut url = url.clone();
                if let Some(p) = password {
                    let _ = url.set_password(Some(p.expose_secret()));
                }
                let pool = AnyPoolOptions::new().max_connections(2).connect(url.as_str()).await.map_err(|e| {
                    // Never echo the URL: it may now hold the password.
                    format!("cannot connect to the PostgreSQL destination: {}", e.to_string().replace(url.as_str(), "<url>"))
                })?;
                Ok(Writer::Sql { pool, postgres: true, columns: HashMap::new() })
            }
            DestinationConfig::Jsonl { directory } => {
                let path = data_dir.join("exports").join(directory);
                std::fs::create_dir_all(&path).map_err(|e| format!("cannot create the export directory: {e}"))?;
                let dir = cap_std::fs::Dir::open_ambient_dir(&path, cap_std::ambient_authority()).map_err(|e| format!("cannot open the export directory: {e}"))?;
                Ok(Writer::Jsonl { dir })
            }
        }
    }

    /// Makes sure the stream's table has every column of `fields`.
    async fn ensure_columns(&mut self, table: &str, fields: &[String]) -> Result<(), String> {
        let Writer::Sql { pool, postgres, columns } = self else { return Ok(()) };
        if !columns.contains_key(table) {
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {} (\"_service_raw_id\" TEXT PRIMARY KEY, \"_service_extracted_at\" BIGINT NOT NULL, \"_service_meta\" TEXT NOT NULL)",
                quote(table)
            );
            sqlx::query(sqlx::AssertSqlSafe(create)).execute(&*pool).await.map_err(|e| format!("cannot create table {table}: {e}"))?;
            let existing_sql = if *postgres {
                format!("SELECT column_name::text FROM information_schema.columns WHERE table_name = '{table}' AND table_schema = current_schema()")
            } else {
                format!("SELECT name FROM pragma_table_info('{table}')")
            };
            // `table` went through `sql_name`: letters, digits and `_` only.
            let existing: HashSet<String> = sqlx::query(sqlx::AssertSqlSafe(existing_sql))
                .fetch_all(&*pool)
                .await
                .map_err(|e| e.to_string())?
                .iter()
                .filter_map(|r| r.try_get::<String, _>(0).ok())
                .collect();
            columns.insert(table.to_owned(), existing);
        }
        let known = columns.get_mut(table).expect("inserted above");
        for f in fields {
            if !known.contains(f) {
                let alter = format!("ALTER TABLE {} ADD COLUMN {} TEXT", quote(table), quote(f));
                if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(alter)).execute(&*pool).await {
                    // Another writer may have added it meanwhile.
                    if !e.to_string().to_lowercase().contains("duplicate") && !e.to_string().contains("already exists") {
                        return Err(format!("cannot add column {f} to {table}: {e}"));
                    }
                }
                known.insert(f.clone());
            }
        }
        Ok(())
    }

    /// Empties a stream before a full refresh (or a reset).
    pub async fn clear(&mut self, stream: &str) -> Result<(), String> {
        let table = sql_name(stream);
        match self {
            Writer::Sql { pool, .. } => {
                let sql = format!("DROP TABLE IF EXISTS {}", quote(&table));
                sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&*pool).await.map_err(|e| e.to_string())?;
                if let Writer::Sql { columns, .. } = self {
                    columns.remove(&table);
                }
                Ok(())
            }
            Writer::Jsonl { dir } => match dir.remove_file(format!("{table}.jsonl")) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e.to_string()),
            },
        }
    }

    /// Writes a batch; returns its size in bytes.
    pub async fn write(&mut self, pipeline_id: &str, stream: &str, records: &[String], mode: StreamSyncMode, primary_key: &[String]) -> Result<u64, String> {
        let table = sql_name(stream);
        let now = crate::store::now_ms();
        let meta = json!({ "pipeline_id": pipeline_id, "stream": stream }).to_string();
        let bytes: u64 = records.iter().map(|r| r.len() as u64).sum();
        let mut shaped = Vec::with_capacity(records.len());
        for r in records {
            shaped.push(shape(r, mode, primary_key)?);
        }
        match self {
            Writer::Jsonl { dir } => {
                let mut options = cap_std::fs::OpenOptions::new();
                options.create(true).append(true);
                let mut file = dir.open_with(format!("{table}.jsonl"), &options).map_err(|e| e.to_string())?;
                let mut out = Vec::with_capacity(bytes as usize + records.len() * 96);
                for (raw_id, mut fields) in shaped {
                    fields.retain(|k, _| !k.starts_with("_service_"));
                    fields.insert("_service_raw_id".into(), json!(raw_id));
                    fields.insert("_service_extracted_at".into(), json!(now));
                    fields.insert("_service_meta".into(), json!({ "pipeline_id": pipeline_id, "stream": stream }));
                    serde_json::to_writer(&mut out, &Value::Object(fields)).map_err(|e| e.to_string())?;
                    out.push(b'\n');
                }
                file.write_all(&out).map_err(|e| e.to_string())?;
                file.sync_data().map_err(|e| e.to_string())?;
                Ok(bytes)
            }
            Writer::Sql { .. } => {
                let mut all: Vec<String> = Vec::new();
                for (_, fields) in &shaped {
                    for k in fields.keys() {
                        let c = sql_name(k);
                        if !c.starts_with("_service_") && !all.contains(&c) {
                            all.push(c);
                        }
                    }
                }
                self.ensure_columns(&table, &all).await?;
                let Writer::Sql { pool, .. } = self else { unreachable!() };
                let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
                for (raw_id, fields) in shaped {
                    let cols: Vec<(String, Option<String>)> =
                        fields.iter().map(|(k, v)| (sql_name(k), column_value(v))).filter(|(c, _)| !c.starts_with("_service_")).collect();
                    let mut names = vec!["\"_service_raw_id\"".to_owned(), "\"_service_extracted_at\"".into(), "\"_service_meta\"".into()];
                    names.extend(cols.iter().map(|(c, _)| quote(c)));
                    let params: Vec<String> = (1..=names.len()).map(|i| format!("${i}")).collect();
                    let updates: Vec<String> = names[1..].iter().map(|n| format!("{n} = excluded.{n}")).collect();
                    let sql = format!(
                        "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (\"_service_raw_id\") DO UPDATE SET {}",
                        quote(&table),
                        names.join(", "),
                        params.join(", "),
                        updates.join(", ")
                    );
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(raw_id).bind(now).bind(meta.clone());
                    for (_, v) in cols {
                        q = q.bind(v);
                    }
                    q.execute(&mut *tx).await.map_err(|e| format!("cannot write to {table}: {e}"))?;
                }
                tx.commit().await.map_err(|e| e.to_string())?;
                Ok(bytes)
            }
        }
    }

    /// Closes connections.
    pub async fn close(self) {
        if let Writer::Sql { pool, .. } = self {
            pool.close().await;
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
    fn paths_and_passwords_are_refused() {
        assert!(validate("sqlite", &json!({ "file": "../etc/passwd" })).is_err());
        assert!(validate("jsonl", &json!({ "directory": "/tmp" })).is_err());
        assert!(validate("postgres", &json!({ "url": "postgres://u:pw@h/db" })).is_err());
        assert!(validate("postgres", &json!({ "url": "postgres://u@h/db" })).is_ok());
        assert!(validate("mysql", &json!({})).is_err());
    }
}
