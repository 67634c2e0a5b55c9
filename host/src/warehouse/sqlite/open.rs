//! Opening an SQLite destination: the file in the workspace's folder, a pool
//! for the service's own table bookkeeping, the one connection that writes
//! rows, and the checkpointer that copies committed pages from the
//! write-ahead log into the database file.

use sqlx::sqlite::SqliteConnectOptions;

use std::sync::Arc;

use sqlx::sqlite::{SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::warehouse::config::Place;
use crate::warehouse::{WriteError, failed};

use super::batch::RowWriter;

/// How long an SQLite warehouse's connections wait for another's lock
/// (the pool's and the [`RowWriter`]'s take turns writing) before failing.
pub(in crate::warehouse) const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Pages an SQLite warehouse's write-ahead log may hold before the writer
/// copies them into the database file itself: a backstop for when the
/// [`Checkpointer`] falls behind (64 MiB with 16 KiB pages).
pub(in crate::warehouse) const WAL_BACKSTOP_PAGES: u32 = 4096;

/// Copies what an SQLite warehouse commits from its write-ahead log into the
/// database file, on a connection of its own. With SQLite's automatic
/// checkpoints the writer's connection would do that copy and its flush to
/// disk itself after every few commits, before it could start the next
/// batch; here they overlap the next batch. Passive checkpoints never block
/// the writer, and durability is unchanged: a commit is on disk in the log
/// when it returns.
pub(crate) struct Checkpointer {
    /// One pending wake-up is enough: a checkpoint copies everything
    /// committed before it starts. Dropping it ends the task.
    wake: tokio::sync::mpsc::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Checkpointer {
    pub(in crate::warehouse) async fn start(options: &SqliteConnectOptions) -> Result<Checkpointer, sqlx::Error> {
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
    pub(in crate::warehouse) fn committed(&self) {
        let _ = self.wake.try_send(());
    }

    /// Closes its connection, so that the pool's (closed last, after the
    /// [`RowWriter`]'s) folds the rest of the log into the file.
    pub(in crate::warehouse) async fn close(self) {
        drop(self.wake);
        let _ = self.task.await;
    }
}

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
