//! SQLite batches: laid out in one buffer ([`SqliteRows`]) and written in one
//! transaction through SQLite's C interface ([`RowWriter`]).

use std::ffi::{CStr, CString, c_int};
use std::ptr::NonNull;

use libsqlite3_sys as ffi;

use std::sync::Arc;

use crate::warehouse::shape::Row;
use crate::warehouse::{METADATA_COLUMNS, WriteError, failed};

use super::checkpoint::Checkpointer;
use super::{BUSY_TIMEOUT, WAL_BACKSTOP_PAGES};

/// One batch laid out for [`RowWriter::write`]: every value's text in one
/// buffer, so preparing a batch allocates a handful of times instead of
/// once per value, and binding hands SQLite slices of that buffer instead
/// of copies.
pub(in crate::warehouse) struct SqliteRows {
    /// The one-row upsert each row goes through.
    sql: String,
    /// Values per row besides the metadata columns.
    width: usize,
    /// Every key and value, one after the other.
    text: String,
    /// Per row: its key, then `width` values (`None` is NULL), as
    /// `(start, length)` in `text`.
    spans: Vec<Option<(u32, u32)>>,
    /// Each row's `_service_extracted_at` and `_service_meta`.
    now: i64,
    meta: String,
    /// Rows whose `_service_extracted_at` is their own (a replay's), by
    /// their place: usually none.
    read_at: Vec<(usize, i64)>,
}

impl SqliteRows {
    /// Lays `rows` out for the table `target` (quoted), whose columns are
    /// `names` (quoted, the metadata columns first).
    pub(in crate::warehouse) fn new(
        target: &str,
        names: &[String],
        upsert: &str,
        rows: &[Row<'_>],
        now: i64,
        meta: &str,
    ) -> Result<SqliteRows, WriteError> {
        let width = names.len() - METADATA_COLUMNS.len();
        let sql = format!(
            "INSERT INTO {target} ({}) VALUES ({}){upsert}",
            names.join(", "),
            vec!["?"; names.len()].join(", ")
        );
        let size: usize =
            rows.iter().map(|row| row.key.len() + row.values.iter().flatten().map(|v| v.len()).sum::<usize>()).sum();
        if u32::try_from(size).is_err() {
            return Err(WriteError::BadRecord("a batch for SQLite must hold less than 4 GiB of text".into()));
        }
        let mut text = String::with_capacity(size);
        let mut spans = Vec::with_capacity(rows.len() * (1 + width));
        let mut push = |value: &str| {
            // Within u32: the total was checked above.
            let span = (text.len() as u32, value.len() as u32);
            text.push_str(value);
            Some(span)
        };
        for row in rows {
            spans.push(push(&row.key));
            spans.extend((0..width).map(|j| row.values.get(j).and_then(|v| v.as_deref()).and_then(&mut push)));
        }
        let read_at = rows.iter().enumerate().filter_map(|(i, row)| Some((i, row.read_at?))).collect();
        Ok(SqliteRows { sql, width, text, spans, now, meta: meta.to_owned(), read_at })
    }

    fn value(&self, span: (u32, u32)) -> &str {
        &self.text[span.0 as usize..(span.0 + span.1) as usize]
    }
}

/// The connection that writes a warehouse's rows, through SQLite's C
/// interface: it binds each value as a borrowed slice of its batch
/// (SQLite copies nothing), and keeps its upsert prepared from batch to
/// batch. Creating tables and columns, and the registry of tables, go
/// through the pool's connection; SQLite re-prepares the upsert itself
/// when that changes the schema.
pub(crate) struct RowWriter {
    db: NonNull<ffi::sqlite3>,
    /// The last upsert prepared, with its text.
    insert: Option<(String, NonNull<ffi::sqlite3_stmt>)>,
}

// SAFETY: SQLite is built thread-safe; a connection opened with
// SQLITE_OPEN_NOMUTEX may move between threads as long as one thread at a
// time uses it (and its statements), which `&mut self` on every use
// guarantees.
unsafe impl Send for RowWriter {}

impl RowWriter {
    /// Opens the existing database file at `path` (the pool created it and
    /// put it in WAL mode). Blocking: call it off the async workers.
    pub(in crate::warehouse) fn open(path: &std::path::Path) -> Result<RowWriter, SqliteFailure> {
        // `Send` above needs a thread-safe build (sqlx bundles one; a
        // system library could be built otherwise).
        // SAFETY: a constant of the library, callable at any time.
        if unsafe { ffi::sqlite3_threadsafe() } == 0 {
            return Err("the SQLite library was built without thread safety".into());
        }
        let name = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| "the database path holds a NUL byte".to_owned())?;
        let mut db = std::ptr::null_mut();
        // SAFETY: `name` is a NUL-terminated path; `db` receives a handle,
        // which must be closed even when opening fails.
        let rc = unsafe {
            ffi::sqlite3_open_v2(
                name.as_ptr(),
                &mut db,
                ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_NOMUTEX,
                std::ptr::null(),
            )
        };
        let Some(db) = NonNull::new(db) else { return Err("SQLite could not allocate a connection".into()) };
        let mut writer = RowWriter { db, insert: None };
        if rc != ffi::SQLITE_OK {
            return Err(writer.error());
        }
        // SAFETY: the handle is open.
        unsafe { ffi::sqlite3_busy_timeout(db.as_ptr(), BUSY_TIMEOUT.as_millis() as c_int) };
        writer.exec(&format!("PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = {WAL_BACKSTOP_PAGES}"))?;
        Ok(writer)
    }

    /// Writes `rows` in one transaction: all of them, or none. Returns
    /// the rows SQLite inserted or replaced, as it counts them.
    pub(in crate::warehouse) fn write(&mut self, rows: &SqliteRows) -> Result<u64, SqliteFailure> {
        self.exec("BEGIN IMMEDIATE")?;
        // Rolled back on every way out but a commit, a panic included, so
        // no transaction is left holding the write lock.
        let mut tx = Transaction { writer: self, committed: false };
        let stored = tx.writer.insert_all(rows)?;
        tx.writer.exec("COMMIT")?;
        tx.committed = true;
        Ok(stored)
    }

    /// Upserts every row; the rows the upserts stored (their own changes,
    /// not those of any trigger someone put on the table).
    fn insert_all(&mut self, rows: &SqliteRows) -> Result<u64, SqliteFailure> {
        let stmt = self.statement(&rows.sql)?.as_ptr();
        let result = (|| {
            let mut stored = 0u64;
            // The metadata are the same for every row; bindings outlive a
            // reset, so they are bound once.
            self.check(unsafe { ffi::sqlite3_bind_int64(stmt, 2, rows.now) })?;
            self.check(bind_text(stmt, 3, &rows.meta))?;
            // A row with a read time of its own binds it, and the next row
            // binds the batch's again.
            let (mut own, mut bound_own) = (rows.read_at.iter().peekable(), false);
            for (at, row) in rows.spans.chunks_exact(1 + rows.width).enumerate() {
                let time = match own.next_if(|(i, _)| *i == at) {
                    Some((_, time)) => Some(*time),
                    None if bound_own => Some(rows.now),
                    None => None,
                };
                if let Some(time) = time {
                    // SAFETY: `stmt` is a live statement of this connection.
                    self.check(unsafe { ffi::sqlite3_bind_int64(stmt, 2, time) })?;
                    bound_own = time != rows.now;
                }
                for (i, span) in row.iter().enumerate() {
                    // Parameter 1 is the key; 2 and 3 are the metadata.
                    let index = if i == 0 { 1 } else { i as c_int + 3 };
                    let rc = match span {
                        Some(span) => bind_text(stmt, index, rows.value(*span)),
                        // SAFETY: `stmt` is a live statement of this connection.
                        None => unsafe { ffi::sqlite3_bind_null(stmt, index) },
                    };
                    self.check(rc)?;
                }
                // SAFETY: as above; every parameter is bound to memory that
                // `rows` keeps alive until the bindings are cleared below.
                let rc = unsafe { ffi::sqlite3_step(stmt) };
                unsafe { ffi::sqlite3_reset(stmt) };
                if rc != ffi::SQLITE_DONE {
                    return Err(self.error());
                }
                // SAFETY: the handle is open; this counts the step above.
                stored += u64::try_from(unsafe { ffi::sqlite3_changes64(self.db.as_ptr()) }).unwrap_or(0);
            }
            Ok(stored)
        })();
        // SAFETY: `stmt` is live. No binding may point into `rows` once
        // this returns.
        unsafe {
            ffi::sqlite3_reset(stmt);
            ffi::sqlite3_clear_bindings(stmt);
        }
        result
    }

    /// The prepared upsert for `sql`, preparing it when it is not the last
    /// one.
    fn statement(&mut self, sql: &str) -> Result<NonNull<ffi::sqlite3_stmt>, SqliteFailure> {
        if let Some((text, stmt)) = &self.insert
            && text == sql
        {
            return Ok(*stmt);
        }
        self.finalize();
        let len = c_int::try_from(sql.len()).map_err(|_| "the statement is too long".to_owned())?;
        let mut stmt = std::ptr::null_mut();
        // SAFETY: `sql` is valid for `len` bytes; SQLite copies what it keeps.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                self.db.as_ptr(),
                sql.as_ptr().cast(),
                len,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut stmt,
                std::ptr::null_mut(),
            )
        };
        self.check(rc)?;
        let stmt = NonNull::new(stmt).ok_or_else(|| "SQLite prepared an empty statement".to_owned())?;
        self.insert = Some((sql.to_owned(), stmt));
        Ok(stmt)
    }

    fn finalize(&mut self) {
        if let Some((_, stmt)) = self.insert.take() {
            // SAFETY: the statement is live and no longer referenced.
            unsafe { ffi::sqlite3_finalize(stmt.as_ptr()) };
        }
    }

    /// Runs statements that return no rows.
    fn exec(&mut self, sql: &str) -> Result<(), SqliteFailure> {
        let sql = CString::new(sql).map_err(|_| "a statement holds a NUL byte".to_owned())?;
        // SAFETY: the handle is open and `sql` NUL-terminated.
        let rc = unsafe {
            ffi::sqlite3_exec(self.db.as_ptr(), sql.as_ptr(), None, std::ptr::null_mut(), std::ptr::null_mut())
        };
        self.check(rc)
    }

    fn check(&self, rc: c_int) -> Result<(), SqliteFailure> {
        if rc == ffi::SQLITE_OK { Ok(()) } else { Err(self.error()) }
    }

    /// The connection's last error, as SQLite words it.
    fn error(&self) -> SqliteFailure {
        // SAFETY: the handle is open (or failed to open, which
        // `sqlite3_errmsg` also describes); the message is NUL-terminated
        // and copied before the next call on the connection.
        unsafe {
            let code = ffi::sqlite3_extended_errcode(self.db.as_ptr());
            let message = CStr::from_ptr(ffi::sqlite3_errmsg(self.db.as_ptr())).to_string_lossy();
            SqliteFailure(format!("{message} (SQLite code {code})"))
        }
    }
}

/// Why the row writer failed: SQLite's own words (or why it could not
/// start).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct SqliteFailure(pub String);

impl From<&str> for SqliteFailure {
    fn from(m: &str) -> Self {
        SqliteFailure(m.to_owned())
    }
}

impl From<String> for SqliteFailure {
    fn from(m: String) -> Self {
        SqliteFailure(m)
    }
}

impl Drop for RowWriter {
    fn drop(&mut self) {
        self.finalize();
        // SAFETY: every statement is finalized (`sqlite3_exec` finalizes
        // its own); the handle is not used again.
        let rc = unsafe { ffi::sqlite3_close(self.db.as_ptr()) };
        debug_assert_eq!(rc, ffi::SQLITE_OK, "a statement outlived the connection");
    }
}

/// The open transaction of [`RowWriter::write`].
struct Transaction<'a> {
    writer: &'a mut RowWriter,
    committed: bool,
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        // A failed COMMIT leaves the transaction open; an error SQLite
        // rolled back itself leaves none, and this ROLLBACK fails harmlessly.
        if !self.committed {
            let _ = self.writer.exec("ROLLBACK");
        }
    }
}

/// Binds `value` without a copy: the caller keeps it alive and unchanged
/// until the binding is replaced or cleared.
fn bind_text(stmt: *mut ffi::sqlite3_stmt, index: c_int, value: &str) -> c_int {
    // SAFETY: `stmt` is a live statement; `value` is valid UTF-8 for its
    // length, and SQLITE_STATIC promises SQLite it stays so while bound.
    unsafe {
        ffi::sqlite3_bind_text64(
            stmt,
            index,
            value.as_ptr().cast(),
            value.len() as u64,
            ffi::SQLITE_STATIC(),
            ffi::SQLITE_UTF8 as u8,
        )
    }
}

/// Writes a batch's rows in one transaction, off the async workers (SQLite
/// works synchronously), and tells the checkpointer.
pub(in crate::warehouse) async fn apply(
    writer: &Arc<std::sync::Mutex<RowWriter>>,
    checkpointer: &Checkpointer,
    rows: SqliteRows,
    table: &str,
) -> Result<u64, WriteError> {
    let writer = writer.clone();
    let stored = tokio::task::spawn_blocking(move || {
        writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).write(&rows)
    })
    .await
    .map_err(|e| WriteError::Destination(format!("the write stopped: {e}")))?
    .map_err(|e| failed(&format!("cannot write to {table}"), e))?;
    checkpointer.committed();
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use crate::store::pipelines::StreamSyncMode;
    use crate::warehouse::tables::{Db, Tables};
    use crate::warehouse::tests::test_place;
    use crate::warehouse::*;
    use serde_json::json;

    /// A replay's loader keeps the read time each record carries, the
    /// rows between them taking the batch's; any other loader ignores a
    /// record's own (a connector never chooses its rows' metadata).
    #[tokio::test]
    async fn only_a_replay_keeps_the_read_times_its_records_carry() {
        let dir = tempfile::tempdir().unwrap();
        let writer = std::sync::Arc::new(
            Writer::open(&DestinationConfig::Sqlite { file: "w.db".into() }, &test_place(dir.path()), None)
                .await
                .unwrap(),
        );
        let Writer::Sql(Tables { db: Db::Sqlite(pool, ..), .. }) = &*writer else { panic!("an SQLite writer") };
        let records = |ids: &[(u32, &str)]| {
            ids.iter().map(|(id, at)| format!(r#"{{"id": {id}, "_service_read_at": {at}}}"#)).collect::<Vec<_>>()
        };
        let mode = StreamSyncMode::IncrementalDeduped;
        let mut replay = Loader::new(writer.clone(), "p", "events", mode, vec!["id".into()]).carrying_read_times();
        replay.write(records(&[(1, "5"), (2, "null"), (3, "7"), (4, "8"), (5, "\"x\"")])).await.unwrap();
        replay.drain().await.unwrap();
        let mut sync = Loader::new(writer.clone(), "p", "events", mode, vec!["id".into()]);
        sync.write(records(&[(6, "9")])).await.unwrap();
        sync.drain().await.unwrap();
        let times: Vec<(String, i64)> =
            sqlx::query_as("SELECT id, _service_extracted_at FROM events ORDER BY id").fetch_all(pool).await.unwrap();
        let now = crate::store::now_ms();
        let batch = |t: i64| t > now - 60_000 && t <= now;
        let own: Vec<Option<i64>> = times.iter().map(|(_, t)| (!batch(*t)).then_some(*t)).collect();
        assert_eq!(own, [Some(5), None, Some(7), Some(8), None, None], "{times:?}");
    }

    /// The rows of one batch: all of them land, with their values as
    /// given (escapes decoded, NUL kept, missing fields NULL), or none do.
    #[tokio::test]
    async fn a_batch_lands_whole_or_not_at_all_and_the_writer_goes_on_after_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let writer = std::sync::Arc::new(
            Writer::open(&DestinationConfig::Sqlite { file: "w.db".into() }, &test_place(dir.path()), None)
                .await
                .unwrap(),
        );
        let Writer::Sql(Tables { db: Db::Sqlite(pool, ..), .. }) = &*writer else { panic!("an SQLite writer") };
        let mut loader =
            Loader::new(writer.clone(), "p", "events", StreamSyncMode::IncrementalDeduped, vec!["id".into()]);
        let batch = |values: &[&str]| {
            values.iter().enumerate().map(|(i, v)| format!(r#"{{"id": {i}, "v": {v}}}"#)).collect::<Vec<_>>()
        };
        let mut written = loader
            .write(batch(&[r#""caf\u00e9 \"x\"""#, r#""a\u0000b""#, "null", r#"{"deep": [1, 2]}"#]))
            .await
            .unwrap()
            .records;
        written += loader.write(vec![r#"{"id": 4}"#.into()]).await.unwrap().records;
        written += loader.drain().await.unwrap().records;
        assert_eq!(written, 5);
        let rows: Vec<(String, Option<String>)> =
            sqlx::query_as("SELECT id, v FROM events ORDER BY CAST(id AS INTEGER)").fetch_all(pool).await.unwrap();
        let want = [
            ("0", Some("café \"x\"")),
            ("1", Some("a\0b")),
            ("2", None),
            ("3", Some(r#"{"deep": [1, 2]}"#)),
            ("4", None),
        ];
        assert_eq!(rows, want.map(|(id, v)| (id.to_owned(), v.map(str::to_owned))));

        // A row the database refuses in the middle of a batch: nothing of
        // the batch stays, and the next batch goes in.
        sqlx::query("CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.v = 'boom' BEGIN SELECT RAISE(ABORT, 'refused'); END").execute(pool).await.unwrap();
        let refused = [r#"{"id": 10, "v": "fine"}"#, r#"{"id": 11, "v": "boom"}"#, r#"{"id": 12, "v": "fine"}"#];
        loader.write(refused.map(str::to_owned).to_vec()).await.unwrap();
        match loader.drain().await {
            Err(e @ WriteError::Failed { .. }) => {
                // A failure that may pass, the driver's error kept.
                assert!(e.to_string().contains("refused") && std::error::Error::source(&e).is_some(), "{e}")
            }
            other => panic!("expected the write to fail, got {other:?}"),
        }
        let count =
            || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM events").fetch_one(pool).await.unwrap() };
        assert_eq!(count().await, 5, "the refused batch left no row behind");
        loader.write(vec![r#"{"id": 0, "v": "rewritten"}"#.into(), r#"{"id": 20, "v": "new"}"#.into()]).await.unwrap();
        assert_eq!(loader.drain().await.unwrap().records, 2);
        assert_eq!(count().await, 6, "one row replaced by its key, one added");
        let v: String = sqlx::query_scalar("SELECT v FROM events WHERE id = '0'").fetch_one(pool).await.unwrap();
        assert_eq!(v, "rewritten");
    }

    #[tokio::test]
    async fn sqlite_commits_reach_the_database_file_in_the_background_and_the_log_goes_on_close() {
        let dir = tempfile::tempdir().unwrap();
        let writer = std::sync::Arc::new(
            Writer::open(&DestinationConfig::Sqlite { file: "w.db".into() }, &test_place(dir.path()), None)
                .await
                .unwrap(),
        );
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
