//! The checkpointer of an SQLite destination: committed pages copied from
//! the write-ahead log into the database file, beside the writer.

use sqlx::sqlite::SqliteConnectOptions;

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
    /// [`RowWriter`](super::RowWriter)'s) folds the rest of the log into the file.
    pub(in crate::warehouse) async fn close(self) {
        drop(self.wake);
        let _ = self.task.await;
    }
}
