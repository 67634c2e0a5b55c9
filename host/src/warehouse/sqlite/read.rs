//! A model's rows read through SQLite's C interface ([`ModelReader`]),
//! on a read-only connection of their own: each row is handed over where
//! SQLite steps to it, with no hop between threads per row (a driver's
//! worker thread costs more than the read itself on a model of a million
//! rows).
//!
//! The connection is narrowed as the model's statement is: opened
//! read-only with `query_only` on, an authorizer that lets it read tables
//! and views only ([`model_authorizer`]), a length limit on every value it
//! builds, and a deadline checked by a progress handler.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use libsqlite3_sys as ffi;

/// What an SQLite model may do: read tables and views and call functions,
/// nothing else. `pragma_*` table functions (which show, among others, the
/// path of the database file) and every statement but a `SELECT` are
/// refused while the statement is prepared.
pub(in crate::warehouse) unsafe extern "C" fn model_authorizer(
    _: *mut c_void,
    action: c_int,
    table: *const c_char,
    _: *const c_char,
    _: *const c_char,
    _: *const c_char,
) -> c_int {
    match action {
        ffi::SQLITE_SELECT | ffi::SQLITE_FUNCTION | ffi::SQLITE_RECURSIVE => ffi::SQLITE_OK,
        ffi::SQLITE_READ => {
            if table.is_null() {
                return ffi::SQLITE_OK;
            }
            // SAFETY: SQLite passes a NUL-terminated table name that lives
            // for the duration of the call.
            let name = unsafe { CStr::from_ptr(table) }.to_bytes();
            if name.len() >= 7 && name[..7].eq_ignore_ascii_case(b"pragma_") {
                ffi::SQLITE_DENY
            } else {
                ffi::SQLITE_OK
            }
        }
        _ => ffi::SQLITE_DENY,
    }
}

/// Stops a statement past its deadline: SQLite calls it every few
/// thousand instructions with the reader's deadline.
unsafe extern "C" fn past_deadline(deadline: *mut c_void) -> c_int {
    // SAFETY: the pointer is the reader's boxed deadline, which outlives
    // the connection's handler (the connection is closed first).
    let deadline = unsafe { &*deadline.cast::<Instant>() };
    c_int::from(Instant::now() >= *deadline)
}

/// Why reading failed: SQLite's primary result code and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadFailure {
    pub code: c_int,
    pub message: String,
}

impl ReadFailure {
    fn own(message: &str) -> ReadFailure {
        ReadFailure { code: ffi::SQLITE_ERROR, message: message.to_owned() }
    }
}

/// One value of the row SQLite stands on, as stored (its storage class,
/// whatever the column was declared as).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Cell<'a> {
    Null,
    Integer(i64),
    Real(f64),
    /// Text as SQLite holds it (UTF-8 unless the file says otherwise).
    Text(&'a [u8]),
    Blob(&'a [u8]),
}

/// The row a statement stands on, valid while the callback runs.
pub(crate) struct RowRef<'a> {
    stmt: NonNull<ffi::sqlite3_stmt>,
    width: c_int,
    _row: std::marker::PhantomData<&'a ()>,
}

impl<'a> RowRef<'a> {
    pub(crate) fn len(&self) -> usize {
        usize::try_from(self.width).unwrap_or(0)
    }

    /// The value of column `i` (`Null` past the last).
    pub(crate) fn cell(&self, i: usize) -> Cell<'a> {
        let Ok(i) = c_int::try_from(i) else { return Cell::Null };
        if i >= self.width {
            return Cell::Null;
        }
        let stmt = self.stmt.as_ptr();
        // SAFETY: the statement stands on a row (the callback runs between
        // a step that returned SQLITE_ROW and the next step); pointers to
        // its text and blobs stay valid until then, which `'a` bounds. The
        // text or blob is fetched before its length, as SQLite documents.
        unsafe {
            match ffi::sqlite3_column_type(stmt, i) {
                ffi::SQLITE_INTEGER => Cell::Integer(ffi::sqlite3_column_int64(stmt, i)),
                ffi::SQLITE_FLOAT => Cell::Real(ffi::sqlite3_column_double(stmt, i)),
                ffi::SQLITE_TEXT => {
                    let p = ffi::sqlite3_column_text(stmt, i);
                    Cell::Text(bytes(p, ffi::sqlite3_column_bytes(stmt, i)))
                }
                ffi::SQLITE_BLOB => {
                    let p = ffi::sqlite3_column_blob(stmt, i).cast::<u8>();
                    Cell::Blob(bytes(p, ffi::sqlite3_column_bytes(stmt, i)))
                }
                _ => Cell::Null,
            }
        }
    }
}

/// `len` bytes at `p` (none when `p` is null, as for an empty blob).
///
/// # Safety
/// `p` is null or valid for `len` bytes for `'a`.
unsafe fn bytes<'a>(p: *const u8, len: c_int) -> &'a [u8] {
    match usize::try_from(len) {
        // SAFETY: per the caller.
        Ok(len) if !p.is_null() && len > 0 => unsafe { std::slice::from_raw_parts(p, len) },
        _ => &[],
    }
}

/// A read-only connection that runs one model's statement.
pub(crate) struct ModelReader {
    db: NonNull<ffi::sqlite3>,
    /// Read by [`past_deadline`] through the connection's progress
    /// handler; boxed so its address holds while the reader moves.
    deadline: Box<Instant>,
}

// SAFETY: SQLite is built thread-safe (checked when opening); a connection
// opened with SQLITE_OPEN_NOMUTEX may move between threads as long as one
// thread at a time uses it, which `&mut self` on every use guarantees.
unsafe impl Send for ModelReader {}

impl ModelReader {
    /// Opens the database file at `path` read-only, every value it builds
    /// limited to `longest` bytes, its statements stopped at `deadline`.
    /// Blocking: call it off the async workers.
    pub(crate) fn open(path: &std::path::Path, longest: usize, deadline: Instant) -> Result<ModelReader, ReadFailure> {
        // SAFETY: a constant of the library, callable at any time.
        if unsafe { ffi::sqlite3_threadsafe() } == 0 {
            return Err(ReadFailure::own("the SQLite library was built without thread safety"));
        }
        let name = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| ReadFailure::own("the database path holds a NUL byte"))?;
        let mut db = std::ptr::null_mut();
        // SAFETY: `name` is a NUL-terminated path; `db` receives a handle,
        // which must be closed even when opening fails (the Drop below).
        let rc = unsafe {
            ffi::sqlite3_open_v2(
                name.as_ptr(),
                &mut db,
                ffi::SQLITE_OPEN_READONLY | ffi::SQLITE_OPEN_NOMUTEX,
                std::ptr::null(),
            )
        };
        let Some(db) = NonNull::new(db) else { return Err(ReadFailure::own("SQLite could not allocate a connection")) };
        let mut reader = ModelReader { db, deadline: Box::new(deadline) };
        if rc != ffi::SQLITE_OK {
            return Err(reader.error());
        }
        reader.exec("PRAGMA query_only = ON")?;
        let longest = c_int::try_from(longest).unwrap_or(c_int::MAX);
        let busy = c_int::try_from(Duration::from_secs(5).as_millis()).unwrap_or(c_int::MAX);
        let deadline: *mut Instant = &mut *reader.deadline;
        // SAFETY: the handle is open; the authorizer keeps no state and the
        // progress handler reads the boxed deadline, which lives as long as
        // the connection.
        unsafe {
            ffi::sqlite3_busy_timeout(db.as_ptr(), busy);
            ffi::sqlite3_limit(db.as_ptr(), ffi::SQLITE_LIMIT_LENGTH, longest);
            ffi::sqlite3_set_authorizer(db.as_ptr(), Some(model_authorizer), std::ptr::null_mut());
            ffi::sqlite3_progress_handler(db.as_ptr(), 10_000, Some(past_deadline), deadline.cast());
        }
        Ok(reader)
    }

    /// Runs `sql` (one statement), handing each row to `each` until the
    /// rows end or `each` returns `false`.
    pub(crate) fn rows(&mut self, sql: &str, mut each: impl FnMut(&RowRef<'_>) -> bool) -> Result<(), ReadFailure> {
        let len = c_int::try_from(sql.len()).map_err(|_| ReadFailure::own("the statement is too long"))?;
        let mut stmt = std::ptr::null_mut();
        // SAFETY: `sql` is valid for `len` bytes; SQLite copies what it keeps.
        let rc = unsafe {
            ffi::sqlite3_prepare_v2(self.db.as_ptr(), sql.as_ptr().cast(), len, &mut stmt, std::ptr::null_mut())
        };
        if rc != ffi::SQLITE_OK {
            return Err(self.error());
        }
        let Some(stmt) = NonNull::new(stmt) else { return Ok(()) };
        let statement = Finalize(stmt);
        // SAFETY: the statement is live.
        let width = unsafe { ffi::sqlite3_column_count(stmt.as_ptr()) };
        loop {
            // SAFETY: as above; no row handed out outlives this iteration.
            match unsafe { ffi::sqlite3_step(stmt.as_ptr()) } {
                ffi::SQLITE_ROW => {
                    if !each(&RowRef { stmt, width, _row: std::marker::PhantomData }) {
                        break;
                    }
                }
                ffi::SQLITE_DONE => break,
                _ => return Err(self.error()),
            }
        }
        drop(statement);
        Ok(())
    }

    fn exec(&mut self, sql: &str) -> Result<(), ReadFailure> {
        let sql = CString::new(sql).map_err(|_| ReadFailure::own("a statement holds a NUL byte"))?;
        // SAFETY: the handle is open and `sql` NUL-terminated.
        let rc = unsafe {
            ffi::sqlite3_exec(self.db.as_ptr(), sql.as_ptr(), None, std::ptr::null_mut(), std::ptr::null_mut())
        };
        if rc == ffi::SQLITE_OK { Ok(()) } else { Err(self.error()) }
    }

    /// The connection's last error, as SQLite words it.
    fn error(&self) -> ReadFailure {
        // SAFETY: the handle is open (or failed to open, which
        // `sqlite3_errmsg` also describes); the message is NUL-terminated
        // and copied before the next call on the connection.
        unsafe {
            let code = ffi::sqlite3_errcode(self.db.as_ptr());
            let message = CStr::from_ptr(ffi::sqlite3_errmsg(self.db.as_ptr())).to_string_lossy().into_owned();
            ReadFailure { code, message }
        }
    }
}

/// Finalizes a statement on every way out.
struct Finalize(NonNull<ffi::sqlite3_stmt>);

impl Drop for Finalize {
    fn drop(&mut self) {
        // SAFETY: the statement is live and no longer referenced.
        unsafe { ffi::sqlite3_finalize(self.0.as_ptr()) };
    }
}

impl Drop for ModelReader {
    fn drop(&mut self) {
        // SAFETY: every statement is finalized (see `Finalize`); the
        // handle is closed once.
        unsafe { ffi::sqlite3_close(self.db.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(sql: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let name = CString::new(path.to_str().unwrap()).unwrap();
        let mut db = std::ptr::null_mut();
        let sql = CString::new(sql).unwrap();
        // SAFETY: a fresh connection used and closed here.
        unsafe {
            let flags = ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_CREATE;
            assert_eq!(ffi::sqlite3_open_v2(name.as_ptr(), &mut db, flags, std::ptr::null()), ffi::SQLITE_OK);
            let rc = ffi::sqlite3_exec(db, sql.as_ptr(), None, std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(rc, ffi::SQLITE_OK);
            ffi::sqlite3_close(db);
        }
        (dir, path)
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[test]
    fn values_come_as_stored() {
        let (_dir, path) = database(
            "CREATE TABLE t (a, b, c, d, e); INSERT INTO t VALUES (7, 1.5, 'héllo', x'00ff', NULL), (-1, 0.0, '', x'', 2)",
        );
        let mut reader = ModelReader::open(&path, 1 << 20, later()).unwrap();
        let mut rows = Vec::new();
        reader
            .rows("SELECT * FROM t", |row| {
                let cells: Vec<String> = (0..row.len()).map(|i| format!("{:?}", row.cell(i))).collect();
                rows.push(cells.join(" "));
                true
            })
            .unwrap();
        assert_eq!(
            rows,
            [
                format!("Integer(7) Real(1.5) Text({:?}) Blob([0, 255]) Null", "héllo".as_bytes()),
                "Integer(-1) Real(0.0) Text([]) Blob([]) Integer(2)".to_owned()
            ]
        );
    }

    #[test]
    fn a_model_cannot_write_nor_read_pragmas() {
        let (_dir, path) = database("CREATE TABLE t (a); INSERT INTO t VALUES (1)");
        let mut reader = ModelReader::open(&path, 1 << 20, later()).unwrap();
        let denied = reader.rows("SELECT * FROM pragma_database_list", |_| true).unwrap_err();
        assert!(denied.code == ffi::SQLITE_AUTH && denied.message.contains("prohibited"), "{denied:?}");
        let denied = reader.rows("DELETE FROM t", |_| true).unwrap_err();
        assert!(denied.code == ffi::SQLITE_AUTH && denied.message.contains("not authorized"), "{denied:?}");
        let mut n = 0;
        reader
            .rows("SELECT a FROM t", |_| {
                n += 1;
                true
            })
            .unwrap();
        assert_eq!(n, 1, "the row is still there");
    }

    #[test]
    fn a_statement_past_its_deadline_is_interrupted() {
        let (_dir, path) = database("CREATE TABLE t (a)");
        let mut reader = ModelReader::open(&path, 1 << 20, Instant::now()).unwrap();
        let endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n";
        let stopped = reader.rows(endless, |_| true).unwrap_err();
        assert_eq!(stopped.code, ffi::SQLITE_INTERRUPT, "{stopped:?}");
    }

    #[test]
    fn a_value_longer_than_the_limit_is_refused() {
        let (_dir, path) = database("CREATE TABLE t (a)");
        let mut reader = ModelReader::open(&path, 1000, later()).unwrap();
        let refused = reader.rows("SELECT zeroblob(5000)", |_| true).unwrap_err();
        assert_eq!(refused.code, ffi::SQLITE_TOOBIG, "{refused:?}");
    }

    #[test]
    fn the_caller_stops_the_rows() {
        let (_dir, path) = database("CREATE TABLE t (a); INSERT INTO t VALUES (1), (2), (3)");
        let mut reader = ModelReader::open(&path, 1 << 20, later()).unwrap();
        let mut seen = 0;
        reader
            .rows("SELECT a FROM t", |_| {
                seen += 1;
                seen < 2
            })
            .unwrap();
        assert_eq!(seen, 2);
    }
}
