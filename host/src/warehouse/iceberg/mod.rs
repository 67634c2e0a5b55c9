//! Lakehouse destinations: Parquet files committed to Apache Iceberg
//! tables, readable by every engine that reads Iceberg.
//!
//! Layout:
//! - [`catalog`]: the Iceberg catalog of one destination, its pointers in
//!   the control database.

pub mod catalog;
