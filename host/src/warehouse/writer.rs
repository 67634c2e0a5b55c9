//! The [`Writer`] of one job: dispatch, and nothing else, to the kind of
//! its destination. Each kind is a folder with the same role files
//! (`config`, `open`, `batch`: `sqlite`, `postgres`, `jsonl`, `iceberg`);
//! the two SQL kinds share their tables' bookkeeping (`tables`).

use std::collections::HashMap;

use serde_json::json;

use super::config::{DestinationConfig, Place, Revealed};
use super::contract::{Contract, Judgement, shape_judged};
use super::iceberg::IcebergWriter;
use super::jsonl;
use super::postgres::{self, copy_data};
use super::shape::{AppendKeys, ReadTimes};
use super::sqlite::SqliteRows;
use super::tables::{Db, SqlRows, Tables};
use super::{WriteError, failed, quote, sql_name, text_bytes};
use crate::store::jobs::JobLease;
use crate::store::pipelines::StreamSyncMode;

/// Where records go.
pub enum Writer {
    /// An SQLite or PostgreSQL database.
    Sql(Tables),
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
    /// Records replaced by a later copy of their key in the batch
    /// (deduplicated mode): laid out as no row.
    pub(crate) deduplicated: u64,
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
                Ok(Writer::Sql(Tables::new(Db::Sqlite(opened.pool, opened.rows, opened.checkpointer))))
            }
            DestinationConfig::Postgres { target, .. } => {
                Ok(Writer::Sql(Tables::new(postgres::open(target, revealed, place).await?)))
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

    /// Starts the table of rows `stream`'s contract keeps aside
    /// ([`super::contract::rejected_stream`]), in `mode`: in a lakehouse,
    /// a table whose rows are committed before each commit of the
    /// stream's own.
    pub(crate) async fn begin_rejected(
        &self,
        pipeline_id: &str,
        stream: &str,
        mode: StreamSyncMode,
        json_schema: &serde_json::Value,
    ) -> Result<(), WriteError> {
        let aside = super::contract::rejected_stream(stream);
        match self {
            Writer::Iceberg(lake) => {
                lake.begin_aside(&sql_name(&aside), &sql_name(stream), (pipeline_id, &aside), json_schema).await
            }
            _ => self.begin_stream(pipeline_id, &aside, mode, json_schema).await,
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

    /// The snapshots `stream` committed so far, in order, where its
    /// destination is a lakehouse.
    pub(crate) fn committed_snapshots(&self, stream: &str) -> Vec<i64> {
        match self {
            Writer::Iceberg(lake) => lake.committed_snapshots(&sql_name(stream)),
            _ => Vec::new(),
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

    /// Empties a stream before a full refresh (or a reset). Only a table
    /// the service created is dropped; a table of the same name that
    /// someone else made fails the job and stays as it is.
    pub async fn clear(&self, stream: &str) -> Result<(), WriteError> {
        let table = sql_name(stream);
        match self {
            Writer::Sql(tables) => tables.drop_table(&table).await,
            Writer::Jsonl { dir } => match dir.remove_file(format!("{table}.jsonl")) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(failed("", e)),
            },
            Writer::Iceberg(lake) => lake.drop_table(&table).await,
        }
    }

    /// Whether a record written again under the same key replaces its
    /// row (a database) rather than adding another (a file, a lakehouse).
    pub(crate) fn deduplicates(&self) -> bool {
        matches!(self, Writer::Sql(_))
    }

    /// How many batches of a stream may be applied at once: several only
    /// where each runs in its own transaction and their order cannot
    /// matter (PostgreSQL, with fresh keys).
    pub(crate) fn concurrent_batches(&self, mode: StreamSyncMode) -> usize {
        match self {
            Writer::Sql(Tables { db: Db::Postgres(_), .. }) if mode != StreamSyncMode::IncrementalDeduped => {
                postgres::POSTGRES_CONNECTIONS as usize
            }
            _ => 1,
        }
    }

    /// Lays a batch out for the destination: parsing, the stream's
    /// `contract` (its records judged on the fields parsed for the
    /// layout), keys (an append's from `keys` in a database), read times
    /// (`read_times`; a lakehouse's rows are read now), escaping and
    /// binding, with no I/O. Returns the
    /// batch of the records that load, and what the contract did. `None`
    /// when the batch is too wide to lay out at once ([`super::shape::MAX_CELLS`])
    /// and is to be written in parts.
    pub(super) fn prepare(
        &self,
        pipeline_id: &str,
        stream: &str,
        records: &[String],
        mode: StreamSyncMode,
        primary_key: &[String],
        (keys, contract, read_times): (AppendKeys, Option<&Contract>, ReadTimes),
    ) -> Result<Option<(Batch, Judgement)>, WriteError> {
        let table = sql_name(stream);
        let now = crate::store::now_ms();
        let meta = meta(pipeline_id, stream);
        // A lakehouse keys every row afresh: it appends, and saves its
        // state with its commit. A file cannot replace a row. A record a
        // lakehouse keeps aside is placed as a database places it, so that
        // kept aside again (an attempt cut short between the commits of
        // the two tables, read again) it is the same rejection.
        let (key_mode, key, row_keys, places) = match self {
            Writer::Iceberg(_) => (StreamSyncMode::IncrementalAppend, &[][..], AppendKeys::Fresh, keys),
            Writer::Jsonl { .. } => (mode, primary_key, AppendKeys::Fresh, AppendKeys::Fresh),
            Writer::Sql(_) => (mode, primary_key, keys, keys),
        };
        let (mut shaped, judgement) =
            shape_judged(stream, records, (key_mode, key, &row_keys), (mode, &places), contract)?;
        if read_times != ReadTimes::Now {
            for record in &mut shaped {
                record.read_at = read_times.of(record);
            }
        }
        let aside: usize = judgement.rejected.iter().map(|r| r.record.len()).sum();
        let bytes = (text_bytes(records) - aside) as u64;
        let loaded = shaped.len() as u64;
        let mut deduplicated = 0;
        let (columns, load) = match self {
            Writer::Iceberg(lake) => (Vec::new(), Load::Arrow(lake.lay_out(&table, shaped, &meta)?)),
            Writer::Jsonl { .. } => (Vec::new(), Load::Lines(jsonl::lines(shaped, bytes as usize, now, &meta)?)),
            Writer::Sql(tables) => {
                let Some(SqlRows { columns, names, upsert, rows }) = SqlRows::lay_out(shaped, mode)? else {
                    return Ok(None);
                };
                deduplicated = loaded - rows.len() as u64;
                let load = match tables.db {
                    Db::Sqlite(..) => Load::Rows(SqliteRows::new(&quote(&table), &names, &upsert, &rows, now, &meta)?),
                    // Fresh keys never collide: they are copied straight in.
                    // Keys that may exist already go through a staging table.
                    Db::Postgres(_) => Load::Copy {
                        data: copy_data(&names, &rows, now, &meta)?,
                        upsert: (mode == StreamSyncMode::IncrementalDeduped || keys.replaces()).then_some(upsert),
                        names,
                    },
                };
                (columns, load)
            }
        };
        Ok(Some((Batch { table, columns, records: loaded, bytes, deduplicated, load }, judgement)))
    }

    /// Writes a prepared batch in one transaction; returns the rows the
    /// destination stored, as it counted them (`None` for a lakehouse,
    /// which stores rows at its commits: [`Writer::committed_records`]).
    pub(super) async fn apply(&self, batch: Batch) -> Result<Option<u64>, WriteError> {
        let io = WriteError::Destination;
        let Batch { table, columns, bytes, load, .. } = batch;
        let binary = match self {
            Writer::Sql(tables) => tables.ensure_columns(&table, &columns).await?,
            _ => true,
        };
        let stored = match (self, load) {
            (Writer::Iceberg(lake), Load::Arrow(rows)) => {
                lake.append(&table, rows, bytes).await?;
                None
            }
            (Writer::Jsonl { dir }, Load::Lines(out)) => {
                // A line per record: JSON text escapes every line break.
                let lines = out.iter().filter(|b| **b == b'\n').count() as u64;
                on_files(dir, move |dir| jsonl::append(dir, &table, &out)).await.map_err(|e| io(e.to_string()))?;
                Some(lines)
            }
            (Writer::Sql(Tables { db: Db::Sqlite(_, writer, checkpointer), .. }), Load::Rows(rows)) => {
                Some(super::sqlite::apply(writer, checkpointer, rows, &table).await?)
            }
            (Writer::Sql(Tables { db: Db::Postgres(pool), .. }), Load::Copy { names, data, upsert }) => {
                Some(postgres::apply(pool, &table, &names, upsert.as_deref(), data, binary).await?)
            }
            _ => return Err(io("the batch was prepared for another destination".into())),
        };
        Ok(stored)
    }

    /// Up to `limit` rows that pipeline `pipeline_id` wrote to `stream`'s
    /// table after the position `after` (where a page ended: a key in a
    /// database, a [`jsonl::Position`] in a file), in order: each its position and
    /// `columns` by name (text in a database, as written in a file). None
    /// where there is no such table; a lakehouse's tables are not read back
    /// here but for rows kept aside, positioned by their rejection.
    /// Another pipeline's rows of a shared table are never among them.
    pub(crate) async fn rows_after(
        &self,
        (pipeline_id, stream): (&str, &str),
        columns: &[&str],
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, serde_json::Map<String, serde_json::Value>)>, WriteError> {
        let table = sql_name(stream);
        let meta = meta(pipeline_id, stream);
        match self {
            Writer::Sql(tables) => {
                let rows = tables.db.rows_after(&table, columns, (after, &meta), limit as i64).await?;
                Ok(named(columns, rows).collect())
            }
            Writer::Jsonl { dir } => {
                let after = jsonl::Position::parse(after);
                let meta: serde_json::Value = serde_json::from_str(&meta).unwrap_or_default();
                let owned = move |row: &jsonl::Row| row.get("_service_meta") == Some(&meta);
                let lines = on_files(dir, move |dir| jsonl::lines_after(dir, &table, after.as_ref(), limit, owned))
                    .await
                    .map_err(|e| failed("", e))?;
                Ok(lines
                    .into_iter()
                    .map(|(at, mut row)| {
                        row.retain(|k, _| columns.contains(&k.as_str()));
                        (at.to_string(), row)
                    })
                    .collect())
            }
            Writer::Iceberg(lake) => lake.rows_after(&table, &meta, columns, after, limit).await,
        }
    }

    /// In a lakehouse, every row kept aside in `stream`'s table (one per
    /// pipeline and rejection, each with `columns`) and where the table's
    /// metadata was when they were read (`None`: no such table). Only a
    /// lakehouse's rows are read at once.
    pub(crate) async fn kept_aside(
        &self,
        stream: &str,
        columns: &[&str],
    ) -> Result<Option<super::iceberg::KeptAside>, WriteError> {
        match self {
            Writer::Iceberg(lake) => lake.kept_aside(&sql_name(stream), columns).await,
            _ => Err(WriteError::Refused("only a lakehouse's rejected rows are read at once".into())),
        }
    }

    /// The pointer of the first field of `record` that `stream`'s table
    /// (begun) cannot hold, if any: only a lakehouse's typed columns
    /// refuse a value of another type, or beyond them. With `widening`,
    /// a value a column could be widened to hold fits.
    pub(crate) fn unfit(&self, stream: &str, record: &str, widening: bool) -> Result<Option<String>, WriteError> {
        match self {
            Writer::Iceberg(lake) => lake.unfit(&sql_name(stream), record, widening),
            _ => Ok(None),
        }
    }

    /// `record` with every value `stream`'s table (begun) cannot hold made
    /// null, if it had any and none is a field of `key` (a row is not
    /// keyed by a null): only a lakehouse's typed columns refuse one.
    pub(crate) fn discard_unfit(
        &self,
        stream: &str,
        record: &str,
        key: &[String],
    ) -> Result<Option<String>, WriteError> {
        match self {
            Writer::Iceberg(lake) => lake.discard_unfit(&sql_name(stream), record, key),
            _ => Ok(None),
        }
    }

    /// Widens the columns of `stream`'s table that `records` overflow,
    /// where the destination promotes a column's type in place (a
    /// lakehouse: int to long, float to double, a decimal's precision up);
    /// whether any was.
    pub(crate) async fn widen_for(&self, stream: &str, records: &[String]) -> Result<bool, WriteError> {
        match self {
            Writer::Iceberg(lake) => lake.widen_for(&sql_name(stream), records).await,
            _ => Ok(false),
        }
    }

    /// The metadata of `pipeline_id`'s rows of `stream` (as a lakehouse's
    /// rows carry it).
    pub(crate) fn meta_of(pipeline_id: &str, stream: &str) -> String {
        meta(pipeline_id, stream)
    }

    /// Ends a lakehouse replay into `stream` (begun, its records written):
    /// the rows `kept` aside (each group's metadata, its records) replace
    /// the stream's rejected-rows table in the catalog transaction that
    /// commits the replayed records, if that table is still where it was
    /// read (`read_at`). Only a lakehouse replays at once.
    pub(crate) async fn end_replay(
        &self,
        (pipeline_id, stream): (&str, &str),
        aside_schema: &serde_json::Value,
        kept: Vec<(String, Vec<String>)>,
        read_at: String,
    ) -> Result<(), WriteError> {
        let Writer::Iceberg(lake) = self else {
            return Err(WriteError::Refused("only a lakehouse replays at once".into()));
        };
        let aside = sql_name(&super::contract::rejected_stream(stream));
        lake.end_replay(&sql_name(stream), (&aside, pipeline_id), aside_schema, kept, read_at).await
    }

    /// The rows of `stream`'s table with these keys, by key, each with
    /// `columns` (as text; in a file, each key's last line). A lakehouse's
    /// rows are not read by key.
    pub(crate) async fn rows_with_keys(
        &self,
        stream: &str,
        columns: &[&str],
        keys: &[String],
    ) -> Result<HashMap<String, serde_json::Map<String, serde_json::Value>>, WriteError> {
        match self {
            Writer::Sql(tables) => {
                let rows = tables.db.rows_with_keys(&sql_name(stream), columns, keys).await?;
                Ok(named(columns, rows).collect())
            }
            Writer::Jsonl { dir } => {
                let (table, keys) = (sql_name(stream), keys.to_vec());
                let lines = on_files(dir, move |dir| jsonl::lines_with_keys(dir, &table, &keys))
                    .await
                    .map_err(|e| failed("", e))?;
                Ok(lines.into_iter().map(|(key, row)| (key, as_text(columns, row))).collect())
            }
            Writer::Iceberg(_) => Err(WriteError::Refused("a lakehouse's rows are not read by key".into())),
        }
    }

    /// Changes, in a file, the lines pipeline `pipeline_id` wrote to
    /// `stream` whose `key_field` is a key of `changes`: `None` leaves the
    /// line out, `Some(fields)` sets those fields on it. Every other line
    /// stays. Only a file rewrites lines (a database replaces rows by key).
    pub(crate) async fn change_lines(
        &self,
        (pipeline_id, stream): (&str, &str),
        key_field: &str,
        changes: HashMap<String, Option<jsonl::Row>>,
    ) -> Result<jsonl::Rewritten, WriteError> {
        let Writer::Jsonl { dir } = self else {
            return Err(WriteError::Refused("only a file's lines are rewritten".into()));
        };
        let meta: serde_json::Value = serde_json::from_str(&meta(pipeline_id, stream)).unwrap_or_default();
        let (table, key_field) = (sql_name(stream), key_field.to_owned());
        on_files(dir, move |dir| {
            jsonl::rewrite(dir, &table, |row| {
                if row.get("_service_meta") != Some(&meta) {
                    return None;
                }
                let change = changes.get(row.get(key_field.as_str())?.as_str()?)?;
                Some(change.as_ref().map(|fields| {
                    let mut row = row.clone();
                    row.extend(fields.clone());
                    row
                }))
            })
        })
        .await
        .map_err(|e| failed("", e))
    }

    /// Deletes the rows of `stream`'s table with these keys (positions
    /// [`Writer::rows_after`] gave); how many it deleted. Only a database
    /// deletes rows.
    pub(crate) async fn delete_rows(&self, stream: &str, keys: &[String]) -> Result<u64, WriteError> {
        match self {
            Writer::Sql(tables) => tables.db.delete_keys(&sql_name(stream), keys).await,
            _ => Err(WriteError::Refused("only a database destination deletes rows".into())),
        }
    }

    /// Closes connections.
    pub async fn close(self) {
        match self {
            Writer::Sql(tables) => tables.close().await,
            Writer::Jsonl { .. } | Writer::Iceberg(_) => {}
        }
    }
}

/// Runs `work` on a file destination's folder off the async workers: it
/// may wait for a file's lock while another process rewrites the file,
/// and reads or writes whole files.
async fn on_files<T: Send + 'static>(
    dir: &cap_std::fs::Dir,
    work: impl FnOnce(&cap_std::fs::Dir) -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let dir = dir.try_clone()?;
    tokio::task::spawn_blocking(move || work(&dir)).await.map_err(std::io::Error::other)?
}

/// The metadata every row of `pipeline_id`'s `stream` carries (its
/// `_service_meta`), as text: rows are told apart by it.
fn meta(pipeline_id: &str, stream: &str) -> String {
    json!({ "pipeline_id": pipeline_id, "stream": stream }).to_string()
}

/// A line's `columns`, as text (as a database gives them: text as it is,
/// other values as JSON, null where the line has none).
fn as_text(columns: &[&str], mut row: jsonl::Row) -> serde_json::Map<String, serde_json::Value> {
    let text = |v: serde_json::Value| match v {
        serde_json::Value::Null => serde_json::Value::Null,
        serde_json::Value::String(s) => s.into(),
        other => other.to_string().into(),
    };
    columns.iter().map(|c| ((*c).to_owned(), text(row.remove(*c).unwrap_or_default()))).collect()
}

/// A database's rows (each its key and values as text) with their values
/// named by `columns`.
fn named<'a>(
    columns: &'a [&str],
    rows: Vec<(String, Vec<Option<String>>)>,
) -> impl Iterator<Item = (String, serde_json::Map<String, serde_json::Value>)> + 'a {
    rows.into_iter().map(move |(key, values)| {
        let fields = columns.iter().zip(values).map(|(c, v)| ((*c).to_owned(), json!(v)));
        (key, fields.collect())
    })
}
