//! JSON-lines warehouses: one file per stream in the destination's folder,
//! each line a record with the metadata fields, appended and flushed per
//! batch.
//!
//! Layout (the role files every kind has):
//! - [`config`]: the configuration's fields and their check;
//! - [`open`]: the destination's folder;
//! - [`batch`]: records into lines, their [`append`], and reading them
//!   back by position ([`lines_after`]).

pub(crate) mod batch;
pub(crate) mod config;
pub(crate) mod open;

pub(in crate::warehouse) use batch::{append, lines, lines_after};
pub(crate) use config::{FIELDS, config};
pub(crate) use open::open;
