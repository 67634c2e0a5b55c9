//! The Iceberg catalog of one lakehouse warehouse: its namespaces and
//! table pointers in the control database ([`crate::store::iceberg`]),
//! its metadata and data files in the destination's warehouse location.
//!
//! A commit applies the transaction's updates to the table as it is now,
//! writes the new metadata file, then moves the table's pointer with a
//! compare-and-set. A commit that lost the race answers a retryable
//! conflict, and the transaction is applied again on the new metadata: no
//! commit is lost, and a reader only ever finds a pointer to a complete
//! metadata file. A catalog made for a job ([`ControlDatabaseCatalog::saving`],
//! [`ControlDatabaseCatalog::leased`]) also saves the stream's state in the
//! pointer's transaction, and commits only while the job's attempt still
//! holds its lease.

use std::collections::HashMap;
use std::str::FromStr;

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, MetadataLocation, Namespace, NamespaceIdent, Result, TableCommit, TableCreation,
    TableIdent, TableUpdate,
};

use crate::store::Store;
use crate::store::iceberg::{CommitWith, IcebergTableName, Replacement, StreamCheckpoint, Swapped};
use crate::store::jobs::JobLease;

/// How a table's commits retry when another commit won the race: up to
/// 100 times over at most ten minutes, waiting 20 ms doubling to 2 s.
const COMMIT_RETRIES: [(&str, &str); 4] = [
    ("commit.retry.num-retries", "100"),
    ("commit.retry.min-wait-ms", "20"),
    ("commit.retry.max-wait-ms", "2000"),
    ("commit.retry.total-timeout-ms", "600000"),
];

/// How many times a schema change is tried against racing commits.
const COMMIT_ATTEMPTS: usize = 100;

/// Namespaces are one level deep: a destination's namespace holds its
/// streams' tables.
fn namespace_name(ns: &NamespaceIdent) -> String {
    ns.clone().inner().join(".")
}

fn store_error(e: crate::store::StoreError) -> Error {
    Error::new(ErrorKind::Unexpected, "the catalog's database failed").with_source(e)
}

/// One destination's Iceberg catalog, kept in the control database (the
/// `iceberg_*` tables) and moved by compare-and-set.
#[derive(Clone)]
pub struct ControlDatabaseCatalog {
    store: Store,
    /// The destination's id: the catalog's name in the catalog tables.
    name: String,
    /// Where its tables live (`file:///…`, `s3://bucket/prefix`).
    warehouse: String,
    file_io: FileIO,
    /// Where the tables' reading and writing tasks run: the server's.
    runtime: iceberg::Runtime,
    /// The stream state a commit through this catalog saves with it.
    checkpoint: Option<std::sync::Arc<StreamCheckpoint>>,
    /// The job attempt that must still hold its job for a commit through
    /// this catalog to go in.
    lease: Option<std::sync::Arc<JobLease>>,
    /// Another table a commit through this catalog replaces in the same
    /// transaction.
    replacing: Option<std::sync::Arc<Replacement>>,
}

impl std::fmt::Debug for ControlDatabaseCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlDatabaseCatalog").field("name", &self.name).field("warehouse", &self.warehouse).finish()
    }
}

impl ControlDatabaseCatalog {
    /// Made on the server's Tokio runtime.
    pub fn new(store: Store, name: impl Into<String>, warehouse: impl Into<String>, file_io: FileIO) -> Self {
        ControlDatabaseCatalog {
            store,
            name: name.into(),
            warehouse: warehouse.into(),
            file_io,
            runtime: iceberg::Runtime::current(),
            checkpoint: None,
            lease: None,
            replacing: None,
        }
    }

    /// This catalog, its commits going in only while `lease`'s attempt
    /// still holds its job.
    pub fn leased(&self, lease: JobLease) -> ControlDatabaseCatalog {
        ControlDatabaseCatalog { lease: Some(std::sync::Arc::new(lease)), ..self.clone() }
    }

    /// This catalog, its commits saving `checkpoint` in the same
    /// transaction as the table's new pointer.
    pub fn saving(&self, checkpoint: StreamCheckpoint) -> ControlDatabaseCatalog {
        ControlDatabaseCatalog { checkpoint: Some(std::sync::Arc::new(checkpoint)), ..self.clone() }
    }

    /// This catalog, its commits also replacing a table with a staged
    /// one (`replacement`), in the same transaction as the committed
    /// table's new pointer: both happen, or neither.
    pub fn replacing(&self, replacement: Replacement) -> ControlDatabaseCatalog {
        ControlDatabaseCatalog { replacing: Some(std::sync::Arc::new(replacement)), ..self.clone() }
    }

    async fn table_at(&self, ident: &TableIdent, metadata_location: String) -> Result<Table> {
        let metadata = TableMetadata::read_from(&self.file_io, &metadata_location).await?;
        Table::builder()
            .file_io(self.file_io.clone())
            .metadata_location(metadata_location)
            .metadata(metadata)
            .identifier(ident.clone())
            .runtime(self.runtime.clone())
            .build()
    }

    /// How the catalog's rows name `ident`.
    fn table_name(&self, ident: &TableIdent) -> IcebergTableName {
        IcebergTableName {
            catalog: self.name.clone(),
            namespace: namespace_name(ident.namespace()),
            table: ident.name().to_owned(),
        }
    }

    /// Where a table's current metadata is, if the table exists.
    async fn pointer(&self, ident: &TableIdent) -> Result<Option<String>> {
        self.store.iceberg_table(&self.table_name(ident)).await.map_err(store_error)
    }

    /// Records a new table at `metadata_location`.
    async fn record_table(&self, ident: &TableIdent, metadata_location: &str) -> Result<()> {
        self.store.create_iceberg_table(&self.table_name(ident), metadata_location).await.map_err(|e| match e {
            crate::store::StoreError::Conflict(_) => {
                Error::new(ErrorKind::TableAlreadyExists, format!("table {} exists", ident.name()))
            }
            e => store_error(e),
        })
    }

    /// Writes `metadata` at `next` and moves the table's pointer there
    /// from `expected`, unless another commit moved it first (the file
    /// written is then in no table's history: an orphan the warehouse's
    /// orphan listing finds).
    async fn publish(
        &self,
        ident: &TableIdent,
        expected: &str,
        metadata: &TableMetadata,
        next: &MetadataLocation,
    ) -> Result<Swapped> {
        metadata.write_to(&self.file_io, next).await?;
        self.store
            .swap_iceberg_table(
                &self.table_name(ident),
                expected,
                &next.to_string(),
                CommitWith {
                    checkpoint: self.checkpoint.as_deref(),
                    lease: self.lease.as_deref(),
                    replacing: self.replacing.as_deref(),
                },
            )
            .await
            .map_err(store_error)
    }

    /// Saves `checkpoint` alone (no file awaits a commit), while this
    /// catalog's attempt still holds its job.
    pub async fn save_checkpoint(&self, checkpoint: &StreamCheckpoint) -> Result<()> {
        match self.store.save_iceberg_checkpoint(checkpoint, self.lease.as_deref()).await.map_err(store_error)? {
            Swapped::LeaseLost => Err(Self::lease_lost()),
            Swapped::Outdated => Err(Self::outdated()),
            Swapped::Done | Swapped::Raced => Ok(()),
        }
    }

    fn lease_lost() -> Error {
        Error::new(ErrorKind::PreconditionFailed, "the job went to another runner: this attempt commits nothing more")
    }

    fn outdated() -> Error {
        Error::new(ErrorKind::CatalogCommitConflicts, "a table the commit replaces changed since it was read")
    }

    fn raced(ident: &TableIdent) -> Error {
        Error::new(ErrorKind::CatalogCommitConflicts, format!("table {} changed during the commit", ident.name()))
            .with_retryable(true)
    }

    /// Applies the updates `evolve` derives from the table's metadata (a
    /// new schema, a new partition spec; nothing when it derives none), on
    /// the table as it is at the commit: a race is retried on the new
    /// metadata. The table as it is afterwards, or `evolve`'s refusal.
    pub async fn evolve<E>(
        &self,
        ident: &TableIdent,
        evolve: impl Fn(&TableMetadata) -> std::result::Result<Vec<TableUpdate>, E>,
    ) -> Result<std::result::Result<Table, E>> {
        for _ in 0..COMMIT_ATTEMPTS {
            let table = self.load_table(ident).await?;
            let updates = match evolve(table.metadata()) {
                Ok(updates) if updates.is_empty() => return Ok(Ok(table)),
                Ok(updates) => updates,
                Err(e) => return Ok(Err(e)),
            };
            let expected = table.metadata_location_result()?.to_owned();
            let mut builder = table.metadata().clone().into_builder(Some(expected.clone()));
            for update in updates {
                builder = update.apply(builder)?;
            }
            let metadata = builder.build()?.metadata;
            let next = MetadataLocation::from_str(&expected)?.with_next_version().with_new_metadata(&metadata);
            match self.publish(ident, &expected, &metadata, &next).await? {
                Swapped::Done => return Ok(Ok(self.table_at(ident, next.to_string()).await?)),
                Swapped::Raced => {}
                Swapped::LeaseLost => return Err(Self::lease_lost()),
                Swapped::Outdated => return Err(Self::outdated()),
            }
        }
        Err(Self::raced(ident))
    }

    /// Replaces a table's contents with a staged sibling's in one step,
    /// and forgets the staged table (both in `namespace`): readers of the
    /// table see all the old rows or all the new. Only if each is where
    /// the replacement expects it ([`Replacement`]).
    pub async fn replace(&self, namespace: &NamespaceIdent, replacement: &Replacement) -> Result<()> {
        let live = TableIdent::new(namespace.clone(), replacement.live.clone());
        let replaced = self
            .store
            .replace_iceberg_table(&self.table_name(&live), replacement, self.lease.as_deref())
            .await
            .map_err(store_error)?;
        match replaced {
            Swapped::Done => Ok(()),
            Swapped::Raced => Err(Self::missing_table(&TableIdent::new(namespace.clone(), replacement.staged.clone()))),
            Swapped::LeaseLost => Err(Self::lease_lost()),
            Swapped::Outdated => Err(Self::outdated()),
        }
    }

    /// Where a table's current metadata is.
    pub async fn location(&self, ident: &TableIdent) -> Result<String> {
        self.pointer(ident).await?.ok_or_else(|| Self::missing_table(ident))
    }

    fn missing_table(ident: &TableIdent) -> Error {
        Error::new(ErrorKind::TableNotFound, format!("no table {}", ident.name()))
    }
}

#[async_trait]
impl Catalog for ControlDatabaseCatalog {
    async fn list_namespaces(&self, parent: Option<&NamespaceIdent>) -> Result<Vec<NamespaceIdent>> {
        if parent.is_some() {
            return Ok(Vec::new());
        }
        let names = self.store.iceberg_namespaces(&self.name).await.map_err(store_error)?;
        names.into_iter().map(|n| NamespaceIdent::from_strs([n])).collect()
    }

    async fn create_namespace(&self, ns: &NamespaceIdent, properties: HashMap<String, String>) -> Result<Namespace> {
        let created = self
            .store
            .create_iceberg_namespace(&self.name, &namespace_name(ns), &properties)
            .await
            .map_err(store_error)?;
        if !created {
            return Err(Error::new(
                ErrorKind::NamespaceAlreadyExists,
                format!("namespace {} exists", namespace_name(ns)),
            ));
        }
        Ok(Namespace::with_properties(ns.clone(), properties))
    }

    async fn get_namespace(&self, ns: &NamespaceIdent) -> Result<Namespace> {
        match self.store.iceberg_namespace(&self.name, &namespace_name(ns)).await.map_err(store_error)? {
            Some(properties) => Ok(Namespace::with_properties(ns.clone(), properties)),
            None => Err(Error::new(ErrorKind::NamespaceNotFound, format!("no namespace {}", namespace_name(ns)))),
        }
    }

    async fn namespace_exists(&self, ns: &NamespaceIdent) -> Result<bool> {
        Ok(self.store.iceberg_namespace(&self.name, &namespace_name(ns)).await.map_err(store_error)?.is_some())
    }

    async fn update_namespace(&self, _ns: &NamespaceIdent, _properties: HashMap<String, String>) -> Result<()> {
        Err(Error::new(ErrorKind::FeatureUnsupported, "a destination's namespace properties are not changed"))
    }

    async fn drop_namespace(&self, ns: &NamespaceIdent) -> Result<()> {
        let name = namespace_name(ns);
        if !self.store.iceberg_tables(&self.name, &name).await.map_err(store_error)?.is_empty() {
            return Err(Error::new(ErrorKind::DataInvalid, format!("namespace {name} still holds tables")));
        }
        self.store.drop_iceberg_namespace(&self.name, &name).await.map_err(store_error)?;
        Ok(())
    }

    async fn list_tables(&self, ns: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        let names = self.store.iceberg_tables(&self.name, &namespace_name(ns)).await.map_err(store_error)?;
        Ok(names.into_iter().map(|n| TableIdent::new(ns.clone(), n)).collect())
    }

    async fn create_table(&self, ns: &NamespaceIdent, creation: TableCreation) -> Result<Table> {
        if !self.namespace_exists(ns).await? {
            return Err(Error::new(ErrorKind::NamespaceNotFound, format!("no namespace {}", namespace_name(ns))));
        }
        let ident = TableIdent::new(ns.clone(), creation.name.clone());
        let location = creation.location.clone().unwrap_or_else(|| {
            format!("{}/{}/{}", self.warehouse.trim_end_matches('/'), namespace_name(ns), creation.name)
        });
        // Writers of one table (streams of several pipelines, several
        // servers) race for its pointer: each loss is retried on the new
        // metadata, for longer than the library's default of four tries.
        let mut properties = creation.properties.clone();
        for (key, value) in COMMIT_RETRIES {
            properties.entry(key.to_owned()).or_insert_with(|| value.to_owned());
        }
        let creation = TableCreation { location: Some(location.clone()), properties, ..creation };
        let metadata = TableMetadataBuilder::from_table_creation(creation)?.build()?.metadata;
        let metadata_location = MetadataLocation::new_with_metadata(location, &metadata);
        metadata.write_to(&self.file_io, &metadata_location).await?;
        self.record_table(&ident, &metadata_location.to_string()).await?;
        self.table_at(&ident, metadata_location.to_string()).await
    }

    async fn load_table(&self, ident: &TableIdent) -> Result<Table> {
        let at = self.pointer(ident).await?.ok_or_else(|| Self::missing_table(ident))?;
        self.table_at(ident, at).await
    }

    async fn drop_table(&self, ident: &TableIdent) -> Result<()> {
        let dropped = self.store.drop_iceberg_table(&self.table_name(ident)).await.map_err(store_error)?;
        if dropped { Ok(()) } else { Err(Self::missing_table(ident)) }
    }

    async fn purge_table(&self, ident: &TableIdent) -> Result<()> {
        let table = self.load_table(ident).await?;
        self.drop_table(ident).await?;
        iceberg::drop_table_data(&table).await
    }

    async fn table_exists(&self, ident: &TableIdent) -> Result<bool> {
        Ok(self.pointer(ident).await?.is_some())
    }

    async fn rename_table(&self, _src: &TableIdent, _dest: &TableIdent) -> Result<()> {
        Err(Error::new(ErrorKind::FeatureUnsupported, "a destination's tables are named by their streams"))
    }

    async fn register_table(&self, ident: &TableIdent, metadata_location: String) -> Result<Table> {
        MetadataLocation::from_str(&metadata_location)?;
        self.record_table(ident, &metadata_location).await?;
        self.table_at(ident, metadata_location).await
    }

    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        let ident = commit.identifier().clone();
        let current = self.load_table(&ident).await?;
        let expected = current.metadata_location_result()?.to_owned();
        let staged = commit.apply(current)?;
        let next = MetadataLocation::from_str(staged.metadata_location_result()?)?;
        match self.publish(&ident, &expected, staged.metadata(), &next).await? {
            Swapped::Done => Ok(staged),
            Swapped::Raced => Err(Self::raced(&ident)),
            Swapped::LeaseLost => Err(Self::lease_lost()),
            Swapped::Outdated => Err(Self::outdated()),
        }
    }
}
