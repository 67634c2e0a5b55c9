//! SQLite warehouses: a database file in the workspace's folder, written
//! through one connection of SQLite's C interface, its write-ahead log
//! copied into the file in the background.
//!
//! Layout (the role files every kind has):
//! - [`config`]: the configuration's fields and their check;
//! - [`open`]: the file opened for one job ([`Opened`]), and the
//!   [`Checkpointer`];
//! - [`batch`]: a batch laid out ([`SqliteRows`]) and applied in one
//!   transaction ([`RowWriter`], [`apply`]).

pub(crate) mod batch;
pub(crate) mod config;
pub(crate) mod open;

pub(in crate::warehouse) use batch::{RowWriter, SqliteRows, apply};
pub(crate) use config::{FIELDS, config};
pub(in crate::warehouse) use open::{Checkpointer, open};
