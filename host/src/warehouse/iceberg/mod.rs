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
//!
//! Layout:
//! - [`config`]: a lakehouse destination's configuration, checked;
//! - [`catalog`]: the Iceberg catalog, its pointers in the control
//!   database;
//! - [`schema`]: a stream's JSON Schema as a table's columns, and schema
//!   evolution;
//! - [`rows`]: records as Arrow batches of those columns;
//! - [`writer`]: the [`IcebergWriter`] of one job;
//! - [`s3`]: warehouses in an S3-compatible object store, reached through
//!   the egress's pinned client for warehouses;
//! - [`sigv4`]: the AWS request signing of those requests;
//! - [`orphans`]: files no table refers to, listed and removed.

pub mod catalog;
pub mod config;
pub mod orphans;
pub mod rows;
pub mod s3;
pub mod schema;
pub mod sigv4;
pub mod writer;

use std::sync::Arc;

use catalog::ControlDatabaseCatalog;
use config::{Lakehouse, PartitionField};
use s3::ObjectStore;
pub use writer::IcebergWriter;

use super::config::{Place, Revealed};
use super::{WriteError, failed};

/// Opens a lakehouse destination for one job: its warehouse (a folder of
/// the workspace's lakehouse, or an object store reached with the
/// revealed access key), its catalog in the control database, and the
/// writer of its namespace.
pub(crate) async fn open(
    warehouse: &Lakehouse,
    namespace: &str,
    commit_every: std::time::Duration,
    partitions: &std::collections::BTreeMap<String, Vec<PartitionField>>,
    place: &Place<'_>,
    revealed: Option<Revealed>,
) -> Result<IcebergWriter, WriteError> {
    let store = place.catalogs.ok_or_else(|| WriteError::Destination("lakehouses need the control database".into()))?;
    let (location, file_io) = match warehouse {
        Lakehouse::Folder(folder) => {
            let path = place.lakehouse_dir().join(folder);
            std::fs::create_dir_all(&path).map_err(|e| failed("cannot create the warehouse folder", e))?;
            // Absolute, whatever the data directory was given
            // as: a relative `file://` location would name the
            // root.
            let path = std::fs::canonicalize(&path).map_err(|e| failed("cannot resolve the warehouse folder", e))?;
            let location = url::Url::from_directory_path(&path)
                .map_err(|()| WriteError::Destination("the warehouse folder has no file URL".into()))?
                .as_str()
                .trim_end_matches('/')
                .to_owned();
            (location, ::iceberg::io::FileIOBuilder::new(Arc::new(::iceberg::io::LocalFsStorageFactory)).build())
        }
        Lakehouse::ObjectStore(s3) => {
            let Some(Revealed::AccessKey { id, secret }) = revealed else {
                return Err(WriteError::Destination("the object store's access key was not revealed".into()));
            };
            let store = ObjectStore::connect(s3, (id, secret), place.warehouses, place.extra_roots).await?;
            (s3.location(), store.file_io())
        }
    };
    let name = warehouse.catalog_name(place.workspace_id);
    let catalog = ControlDatabaseCatalog::new(store.clone(), name, location.clone(), file_io);
    IcebergWriter::open(catalog, location, namespace, commit_every, partitions.clone()).await
}
