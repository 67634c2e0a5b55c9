//! Warehouses: the destinations built into the host (an SQLite file, a
//! PostgreSQL database, a directory of JSON-lines files, Apache Iceberg
//! tables), and the only place that speaks SQL to a tenant's database (the
//! control database's SQL, the Iceberg catalog's included, lives in
//! `store`).
//!
//! Each stream lands in its own table (or file) with three metadata columns
//! besides the record's top-level fields: `_service_raw_id` (the key:
//! derived from the primary key in deduplicated mode, random otherwise),
//! `_service_extracted_at` (Unix ms) and `_service_meta` (JSON). A field the
//! table has not seen yet adds a column instead of failing the sync. The
//! service lists the tables it creates in `_service_tables` and drops,
//! empties or writes only those. Iceberg tables are typed instead, from the
//! stream's JSON Schema, and keep undeclared fields in `_service_unmapped`
//! (see [`iceberg`]).
//!
//! Files are written through a cap-std directory scoped to the
//! destination's folder under the workspace's own folder of the data
//! directory, so no configuration can make the host write anywhere else,
//! nor into another workspace's files. PostgreSQL destinations and
//! lakehouse object stores are reached only as the host's one address
//! policy allows warehouses (`egress::reach`, `SERVICE_WAREHOUSE_ALLOWED_HOSTS`).
//!
//! Layout:
//! - this module: what the rooms share (names, metadata columns, the
//!   writers' error);
//! - [`config`]: configurations ([`validate`]) and where a workspace's
//!   files live ([`Place`]);
//! - [`writer`]: the [`Writer`] of one job, which starts and ends each
//!   stream ([`Writer::begin_stream`], [`Writer::end_stream`]);
//! - [`tables`]: the tables a destination database holds for the service,
//!   and what the two SQL kinds share ([`tables::Tables`], [`tables::SqlRows`]);
//! - [`legacy`]: moving files of destinations from before per-workspace
//!   folders;
//! - [`shape`]: records into keys, fields and rows;
//! - [`contract`]: a stream's records judged against its schema by its
//!   data contract, before they are loaded;
//! - [`decimal`]: declared decimals, and whether a value fits one;
//! - the kinds, each a folder with the same role files (`config`, `open`,
//!   `batch`) and one line in each dispatch ([`config::validate`],
//!   [`Writer`]): [`sqlite`] (the connection that writes rows, the WAL
//!   checkpointer), [`postgres`] (URLs, connect options and `COPY`),
//!   [`jsonl`] (JSON-lines files), [`iceberg`] (Parquet committed to
//!   Apache Iceberg tables, in a folder or an S3-compatible bucket);
//! - [`load`]: the [`Loader`] of one stream's batches and checkpoints;
//! - [`query`]: read-only queries that reverse-ETL models run;
//! - [`handle`]: [`Warehouses`], the one handle callers open a writer or
//!   run a query through (it resolves the configuration and the
//!   credential: a password, or an object store's access key).

pub mod config;
pub(crate) mod contract;
pub(crate) mod decimal;
pub(crate) mod handle;
pub mod iceberg;
pub(crate) mod jsonl;
pub(crate) mod legacy;
pub(crate) mod load;
pub mod postgres;
pub(crate) mod query;
pub(crate) mod shape;
pub(crate) mod sqlite;
pub(crate) mod tables;
pub(crate) mod writer;

pub use config::{DestinationConfig, Place, validate};
pub(crate) use handle::{PasswordSource, WarehouseError, Warehouses};
pub(crate) use legacy::relocate_shared_files;
pub use load::Loader;
pub(crate) use load::Written;
pub use writer::Writer;

/// The text records hold, in bytes.
pub(crate) fn text_bytes(records: &[String]) -> usize {
    records.iter().map(String::len).sum()
}

/// How many characters of a raw name a table or column name keeps.
pub(crate) const SQL_NAME_LENGTH: usize = 60;

/// Table and column names: lower case letters, digits and `_`, at most
/// [`SQL_NAME_LENGTH`] of them (and a `_` before a leading digit).
pub(crate) fn sql_name(raw: &str) -> String {
    let mut s: String = raw
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
        .take(SQL_NAME_LENGTH)
        .collect();
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

/// Why a destination was not opened, cleared or written.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// A record cannot be stored as it is; writing it again will not help.
    #[error("{0}")]
    BadRecord(String),
    /// The destination holds something the service may not touch (a table
    /// of the stream's name someone else made); trying again will not help.
    #[error("{0}")]
    Refused(String),
    /// The destination failed or could not be reached; it may work later.
    #[error("{0}")]
    Destination(String),
    /// The destination's driver or store failed doing `context`; it may
    /// work later. The driver's error is kept as the source.
    #[error("{}{source}", prefix(.context))]
    Failed {
        context: String,
        #[source]
        source: std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>,
    },
}

/// `context: `, or nothing for no context.
fn prefix(context: &str) -> String {
    if context.is_empty() { String::new() } else { format!("{context}: ") }
}

impl crate::retry::Transient for WriteError {
    /// Whether another attempt may succeed.
    fn is_transient(&self) -> bool {
        matches!(self, WriteError::Destination(_) | WriteError::Failed { .. })
    }
}

/// A destination's host refused by the address policy, as a write's
/// error: a name that did not resolve may resolve later; the operator's
/// rules will not change by retrying, so those fail the job at once.
pub(crate) fn unreachable(e: crate::egress::reach::Unreachable, context: &str) -> WriteError {
    use crate::retry::Transient;
    let text = if context.is_empty() { e.to_string() } else { format!("{context}: {e}") };
    if e.is_transient() { WriteError::Destination(text) } else { WriteError::Refused(text) }
}

/// A failure of the destination's database (or files, or store) doing
/// `context`, its error kept as the source.
fn failed(context: &str, e: impl std::error::Error + Send + Sync + 'static) -> WriteError {
    WriteError::Failed { context: context.to_owned(), source: std::sync::Arc::new(e) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kinds::DestinationKind;
    use crate::store::pipelines::StreamSyncMode;
    use serde_json::json;
    use shape::AppendKeys;
    use std::path::Path;
    use tables::Db;

    /// A driver's failure keeps its error as the source, says what was
    /// being done, and may pass if tried again.
    #[test]
    fn a_failure_keeps_its_source() {
        use crate::retry::Transient;
        use std::error::Error as _;
        let e = failed("cannot write to events", std::io::Error::other("disk full"));
        assert_eq!(e.to_string(), "cannot write to events: disk full");
        assert_eq!(e.source().map(|s| s.to_string()).as_deref(), Some("disk full"));
        assert!(e.is_transient());
        assert_eq!(failed("", std::io::Error::other("gone")).to_string(), "gone");
    }

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
        let postgres = Writer::Sql(tables::Tables::new(Db::Postgres(pool)));
        for mode in [StreamSyncMode::IncrementalAppend, StreamSyncMode::IncrementalDeduped] {
            match postgres
                .prepare(
                    "p",
                    "events",
                    &records,
                    mode,
                    &["id".to_owned()],
                    (AppendKeys::Fresh, None, Default::default()),
                )
                .map(|batch| batch.is_some())
            {
                Err(WriteError::BadRecord(m)) => assert!(m.contains("NUL"), "{m}"),
                Err(e) => panic!("expected a bad record, got {e:?}"),
                Ok(_) => panic!("expected a bad record"),
            }
        }
        let nested = vec![r#"{"id": 1, "payload": {"note": "a\u0000b"}}"#.to_owned()];
        assert!(
            matches!(
                postgres.prepare(
                    "p",
                    "events",
                    &nested,
                    StreamSyncMode::IncrementalAppend,
                    &[],
                    (AppendKeys::Fresh, None, Default::default())
                ),
                Ok(Some(_))
            ),
            "nested JSON keeps the escape as text"
        );

        let dir = tempfile::tempdir().unwrap();
        let sqlite = Writer::open(&DestinationConfig::Sqlite { file: "w.db".into() }, &test_place(dir.path()), None)
            .await
            .unwrap();
        assert!(
            matches!(
                sqlite.prepare(
                    "p",
                    "events",
                    &records,
                    StreamSyncMode::IncrementalAppend,
                    &[],
                    (AppendKeys::Fresh, None, Default::default())
                ),
                Ok(Some(_))
            ),
            "SQLite stores NUL in text"
        );
    }

    /// A workspace's place in a scratch data directory.
    pub(crate) fn test_place(dir: &Path) -> Place<'_> {
        static NONE: std::sync::OnceLock<postgres::WarehousePolicy> = std::sync::OnceLock::new();
        Place {
            data_dir: dir,
            workspace_id: "ws_test",
            warehouses: NONE.get_or_init(Default::default),
            extra_roots: &[],
            catalogs: None,
        }
    }
}
