//! JSON-lines warehouses: one file per stream in the destination's folder,
//! each line a record with the metadata fields, appended and flushed per
//! batch.
//!
//! Layout (the role files every kind has):
//! - [`config`]: the configuration's fields and their check;
//! - [`open`]: the destination's folder;
//! - [`batch`]: records into lines;
//! - [`file`]: a stream's file: lines appended under its lock, read back by
//!   position ([`lines_after`]) or key ([`lines_with_keys`]), and
//!   rewritten under the lock ([`rewrite`]).

pub(crate) mod batch;
pub(crate) mod config;
pub(crate) mod file;
pub(crate) mod open;

pub(in crate::warehouse) use batch::lines;
pub(crate) use config::{FIELDS, config};
pub(in crate::warehouse) use file::{Position, Rewritten, Row, append, lines_after, lines_with_keys, rewrite};
pub(crate) use open::open;
