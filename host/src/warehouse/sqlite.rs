//! SQLite warehouses: multi-row upserts with anonymous parameters, and the
//! checkpointer that copies committed pages from the write-ahead log into
//! the database file beside the writer.

use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions};

use super::METADATA_COLUMNS;
use super::shape::Row;

/// Pages an SQLite warehouse's write-ahead log may hold before the writer
/// copies them into the database file itself: a backstop for when the
/// [`Checkpointer`] falls behind (64 MiB with 16 KiB pages).
pub(super) const WAL_BACKSTOP_PAGES: u32 = 4096;

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
    pub(super) async fn start(options: &SqliteConnectOptions) -> Result<Checkpointer, sqlx::Error> {
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
    pub(super) fn committed(&self) {
        let _ = self.wake.try_send(());
    }

    /// Closes its connection, so the writer's is the last one and folds
    /// the rest of the log into the file when it closes.
    pub(super) async fn close(self) {
        drop(self.wake);
        let _ = self.task.await;
    }
}

/// Bound parameters per statement, under SQLite's limit (32766) and
/// PostgreSQL's (65535).
pub(super) const MAX_PARAMS: usize = 30_000;
/// Rows per INSERT statement at most.
pub(super) const MAX_ROWS_PER_STATEMENT: usize = 500;

/// Multi-row upserts for SQLite, with their values bound.
pub(super) fn insert_statements(target: &str, names: &[String], upsert: &str, rows: &[Row<'_>], now: i64, meta: &str) -> Result<Vec<(String, SqliteArguments)>, String> {
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

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::super::tests::test_place;

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
}
