//! The [`Writer`] of one job: opened on a destination (each kind opens in
//! its own module: `sqlite`, `postgres`, `jsonl`, `iceberg`), it lays out
//! each batch for its database (or file) and applies it in one
//! transaction.

use std::collections::HashMap;

use serde_json::json;

use super::config::{DestinationConfig, Place, Revealed};
use super::iceberg::IcebergWriter;
use super::jsonl;
use super::postgres::{self, copy_data};
use super::shape::{Rows, shape};
use super::sqlite::SqliteRows;
use super::tables::Db;
use super::{METADATA_COLUMNS, WriteError, failed, quote, sql_name, text_bytes};
use crate::store::jobs::JobLease;
use crate::store::pipelines::StreamSyncMode;

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
    /// Apache Iceberg tables.
    Iceberg(Box<IcebergWriter>),
}

/// A batch laid out for its destination: everything but the I/O, so the
/// next batch is prepared while this one is applied.
pub(super) struct Batch {
    pub(crate) table: String,
    /// The batch's columns, besides the metadata ones.
    pub(crate) columns: Vec<String>,
    /// Records and bytes the batch holds.
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    pub(crate) load: Load,
}

pub(super) enum Load {
    /// JSON lines to append.
    Lines(Vec<u8>),
    /// SQLite rows to upsert in one transaction.
    Rows(SqliteRows),
    /// PostgreSQL binary `COPY` data, and the upsert to finish with when keys may
    /// exist already.
    Copy { names: Vec<String>, data: Vec<u8>, upsert: Option<String> },
    /// Columns of one Iceberg data file.
    Arrow(arrow_array::RecordBatch),
}

impl Writer {
    /// Opens the destination for one job of `place.workspace_id`.
    pub async fn open(
        config: &DestinationConfig,
        place: &Place<'_>,
        revealed: Option<Revealed>,
    ) -> Result<Writer, WriteError> {
        match config {
            DestinationConfig::Sqlite { file } => {
                let opened = super::sqlite::open(file, place).await?;
                let db = Db::Sqlite(opened.pool, opened.rows, opened.checkpointer);
                Ok(Writer::Sql { db, columns: Default::default() })
            }
            DestinationConfig::Postgres { target, .. } => {
                Ok(Writer::Sql { db: postgres::open(target, revealed, place).await?, columns: Default::default() })
            }
            DestinationConfig::Jsonl { directory } => Ok(Writer::Jsonl { dir: jsonl::open(directory, place)? }),
            DestinationConfig::Iceberg { warehouse, namespace, commit_every, partitions } => {
                let lake =
                    super::iceberg::open(warehouse, namespace, *commit_every, partitions, place, revealed).await?;
                Ok(Writer::Iceberg(Box::new(lake)))
            }
        }
    }

    /// Starts writing a stream: a full refresh empties its table first
    /// (a lakehouse writes a staged table instead, swapped in by
    /// [`Writer::end_stream`]); a lakehouse table is made or evolved from
    /// the stream's JSON Schema.
    pub async fn begin_stream(
        &self,
        pipeline_id: &str,
        stream: &str,
        mode: StreamSyncMode,
        json_schema: &serde_json::Value,
    ) -> Result<(), WriteError> {
        let refresh = mode == StreamSyncMode::FullRefreshOverwrite;
        match self {
            Writer::Iceberg(lake) => lake.begin(&sql_name(stream), (pipeline_id, stream), json_schema, refresh).await,
            _ if refresh => self.clear(stream).await,
            _ => Ok(()),
        }
    }

    /// Makes the writer's commits those of `lease`'s job attempt: a commit
    /// after the job went to another runner is refused (in the commit's
    /// own transaction), so an attempt that lost its lease never writes
    /// over the one that took the job over.
    pub fn hold_for(&mut self, lease: JobLease) {
        if let Writer::Iceberg(lake) = self {
            lake.hold_for(lease);
        }
    }

    /// Whether batches are committed at checkpoints, together with the
    /// state ([`Writer::checkpoint`]), rather than each on its own.
    pub(crate) fn commits_at_checkpoints(&self) -> bool {
        matches!(self, Writer::Iceberg(_))
    }

    /// A stream's state, reported after every batch written so far: the
    /// state to save now, if any (a lakehouse saves it with its commit,
    /// when one is due).
    pub(crate) async fn checkpoint(&self, stream: &str, state: String) -> Result<Option<String>, WriteError> {
        match self {
            Writer::Iceberg(lake) => lake.checkpoint(&sql_name(stream), state).await,
            _ => Ok(Some(state)),
        }
    }

    /// Records of `stream` made readable so far, where that is not every
    /// record written (a lakehouse stores what it wrote at its commits);
    /// `None` where every batch written is stored.
    pub(crate) fn committed_records(&self, stream: &str) -> Option<u64> {
        match self {
            Writer::Iceberg(lake) => Some(lake.committed_records(&sql_name(stream))),
            _ => None,
        }
    }

    /// Commits what awaits a commit; the state saved with it.
    pub(crate) async fn flush(&self, stream: &str) -> Result<Option<String>, WriteError> {
        match self {
            Writer::Iceberg(lake) => lake.flush(&sql_name(stream)).await,
            _ => Ok(None),
        }
    }

    /// Ends a stream whose records are all written.
    pub async fn end_stream(&self, stream: &str) -> Result<(), WriteError> {
        match self {
            Writer::Iceberg(lake) => lake.finish(&sql_name(stream)).await,
            _ => Ok(()),
        }
    }

    /// Makes sure the stream's table has every column of `fields`; tells
    /// whether binary `COPY` can write them all (and the metadata columns).
    pub(crate) async fn ensure_columns(&self, table: &str, fields: &[String]) -> Result<bool, WriteError> {
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

    /// Empties a stream before a full refresh (or a reset). Only a table
    /// the service created is dropped; a table of the same name that
    /// someone else made fails the job and stays as it is.
    pub async fn clear(&self, stream: &str) -> Result<(), WriteError> {
        let table = sql_name(stream);
        match self {
            Writer::Sql { db, columns } => {
                if db.claim(&table).await?.is_empty() {
                    return Ok(());
                }
                db.execute(format!("DROP TABLE IF EXISTS {}", quote(&table))).await.map_err(|e| failed("", e))?;
                db.unregister(&table).await?;
                columns.lock().await.remove(&table);
                Ok(())
            }
            Writer::Jsonl { dir } => match dir.remove_file(format!("{table}.jsonl")) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(failed("", e)),
            },
            Writer::Iceberg(lake) => lake.drop_table(&table).await,
        }
    }

    /// How many batches of a stream may be applied at once: several only
    /// where each runs in its own transaction and their order cannot
    /// matter (PostgreSQL, with fresh keys).
    pub(crate) fn concurrent_batches(&self, mode: StreamSyncMode) -> usize {
        match self {
            Writer::Sql { db: Db::Postgres(_), .. } if mode != StreamSyncMode::IncrementalDeduped => {
                postgres::POSTGRES_CONNECTIONS as usize
            }
            _ => 1,
        }
    }

    /// Lays a batch out for the destination: parsing, keys, escaping and
    /// binding, with no I/O. `None` when the batch is too wide to lay out
    /// at once ([`shape::MAX_CELLS`]) and is to be written in parts.
    pub(super) fn prepare(
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
        let shaped = || {
            records
                .iter()
                .map(|r| shape(r, mode, primary_key))
                .collect::<Result<Vec<_>, _>>()
                .map_err(WriteError::BadRecord)
        };
        let (columns, load) = match self {
            Writer::Iceberg(lake) => (Vec::new(), Load::Arrow(lake.prepare(&table, records, &meta)?)),
            Writer::Jsonl { .. } => (Vec::new(), Load::Lines(jsonl::lines(shaped()?, bytes as usize, now, &meta)?)),
            Writer::Sql { db, .. } => {
                let shaped = shaped()?;
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
                let load = match db {
                    Db::Sqlite(..) => Load::Rows(SqliteRows::new(&quote(&table), &names, &upsert, &rows, now, &meta)?),
                    // Fresh keys never collide: they are copied straight in.
                    // Keys that may exist already go through a staging table.
                    Db::Postgres(_) => Load::Copy {
                        data: copy_data(&names, &rows, now, &meta)?,
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
    pub(super) async fn apply(&self, batch: Batch) -> Result<u64, WriteError> {
        let io = WriteError::Destination;
        let Batch { table, columns, bytes, load, .. } = batch;
        let binary = self.ensure_columns(&table, &columns).await?;
        match (self, load) {
            (Writer::Iceberg(lake), Load::Arrow(rows)) => lake.append(&table, rows, bytes).await?,
            (Writer::Jsonl { dir }, Load::Lines(out)) => {
                jsonl::append(dir, &table, &out).map_err(|e| io(e.to_string()))?
            }
            (Writer::Sql { db: Db::Sqlite(_, writer, checkpointer), .. }, Load::Rows(rows)) => {
                super::sqlite::apply(writer, checkpointer, rows, &table).await?
            }
            (Writer::Sql { db: Db::Postgres(pool), .. }, Load::Copy { names, data, upsert }) => {
                postgres::apply(pool, &table, &names, upsert.as_deref(), data, binary).await?
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
            Writer::Jsonl { .. } | Writer::Iceberg(_) => {}
        }
    }
}
