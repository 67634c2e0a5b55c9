//! Opening a lakehouse destination for one job.

use std::sync::Arc;

use super::IcebergWriter;
use super::catalog::ControlDatabaseCatalog;
use super::config::{Lakehouse, PartitionField};
use super::s3::ObjectStore;
use crate::warehouse::config::{Place, Revealed};
use crate::warehouse::{WriteError, failed};

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
