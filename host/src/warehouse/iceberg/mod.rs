//! Lakehouse destinations: Parquet files committed to Apache Iceberg
//! tables, readable by every engine that reads Iceberg.
//!
//! A destination of kind `iceberg` names a warehouse (a folder under the
//! workspace's `lakehouse` folder of the data directory, or an
//! `s3://bucket/prefix` of an S3-compatible store) and a namespace. Its
//! catalog is an Iceberg SQL catalog in the control database, named
//! `<workspace>/<folder>` (or `<workspace>/s3://bucket/prefix`):
//! destinations of a workspace naming the same warehouse share it.
//! Each stream is a table. The batches between two commits are written as
//! Parquet (zstd, with Iceberg field ids): into one file in an
//! unpartitioned table, a file per batch and partition in a partitioned
//! one. Each commit is one snapshot, made before the stream's state is
//! saved, so a reader only ever sees whole commits and a restarted sync
//! resumes after the last one committed. A full refresh writes a staged
//! table and swaps it in with one catalog transaction at the stream's end.
//! The rows a stream's contract keeps aside go to a table beside the
//! stream's, committed before each of its commits; a replay rewrites that
//! table as a staged one, swapped in by the transaction that commits the
//! replayed records.
//!
//! Layout (the role files every kind has, then the lakehouse's own):
//! - [`config`]: a lakehouse destination's configuration, checked;
//! - [`open`]: the warehouse, its catalog and the writer of one job;
//! - [`batch`]: records as Arrow batches of a table's columns;
//! - [`catalog`]: the Iceberg catalog, its pointers in the control
//!   database;
//! - [`schema`]: a stream's JSON Schema as a table's columns, and schema
//!   evolution;
//! - [`writer`]: the [`IcebergWriter`] of one job;
//! - [`s3`]: warehouses in an S3-compatible object store, reached through
//!   the egress's pinned client for warehouses and signed by
//!   `egress::sigv4`;
//! - [`orphans`]: files no table refers to, listed and removed;
//! - [`aside`]: the rows a stream's contract kept aside, read back.

pub(crate) mod aside;
pub(crate) mod batch;
pub mod catalog;
pub(crate) mod config;
pub(crate) mod open;
pub(crate) mod orphans;
pub mod s3;
pub(crate) mod schema;
pub(crate) mod writer;

pub(crate) use open::open;
pub(crate) use writer::{IcebergWriter, KeptAside};
