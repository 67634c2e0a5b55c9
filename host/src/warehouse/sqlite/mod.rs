//! SQLite warehouses: a database file in the workspace's folder, written
//! through one connection of SQLite's C interface, its write-ahead log
//! copied into the file in the background.
//!
//! Layout (the role files every kind has):
//! - [`config`]: the configuration's fields and their check;
//! - [`open`]: the file opened for one job;
//! - [`batch`]: a batch laid out ([`SqliteRows`]) and applied in one
//!   transaction ([`RowWriter`], [`apply`]);
//! - [`checkpoint`]: the [`Checkpointer`], which copies committed pages
//!   into the database file beside the writer;
//! - [`read`]: a reverse-ETL model's rows, read on a read-only connection
//!   of their own ([`read::ModelReader`]).

pub(crate) mod batch;
pub(crate) mod checkpoint;
pub(crate) mod config;
pub(crate) mod open;
pub(crate) mod read;

pub(in crate::warehouse) use batch::{RowWriter, SqliteRows, apply};
pub(in crate::warehouse) use checkpoint::Checkpointer;
pub(crate) use config::{FIELDS, config};
pub(in crate::warehouse) use open::open;

/// How long an SQLite warehouse's connections wait for another's lock
/// (the pool's and the [`RowWriter`]'s take turns writing) before failing.
pub(in crate::warehouse) const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Pages an SQLite warehouse's write-ahead log may hold before the writer
/// copies them into the database file itself: a backstop for when the
/// [`Checkpointer`] falls behind (64 MiB with 16 KiB pages).
pub(in crate::warehouse) const WAL_BACKSTOP_PAGES: u32 = 4096;
