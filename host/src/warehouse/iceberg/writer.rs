//! One job's writes into a lakehouse: each stream's table made or evolved
//! from the stream's schema when the stream starts, batches written as
//! Parquet (into one file per commit and partition, so a batch spreading
//! its rows over many partitions does not make a file for each; the open
//! files bounded in number and bytes, the largest closed early when a
//! bound is hit; several closed and uploaded at once),
//! and the files written since the last commit committed as one
//! snapshot at a checkpoint, together with the stream state in the same
//! control-database transaction: the state a restarted sync resumes from
//! always covers exactly the rows the table holds, so a crash at any point
//! neither loses nor repeats a record. Commits come once the destination's
//! commit interval has passed or [`COMMIT_BYTES`] are written (and at the
//! stream's end), not at every checkpoint: fewer, larger snapshots. A full refresh is written to
//! a staged table that replaces the live one when the stream ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use futures_util::{StreamExt as _, TryStreamExt as _};
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::io::FileIO;
use iceberg::spec::PartitionKey;
use iceberg::spec::{DataFile, DataFileFormat, PartitionSpecRef, SchemaRef as IcebergSchemaRef};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{DefaultFileNameGenerator, LocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{CurrentFileStatus, IcebergWriter as _, IcebergWriterBuilder};
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableCreation, TableIdent, TableUpdate};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde_json::Value;

use super::super::WriteError;
use super::super::config::PartitionField;
use super::super::shape::Shaped;
use super::catalog::ControlDatabaseCatalog;
use super::{batch, schema};
use crate::store::iceberg::{Replacement, StreamCheckpoint};
use crate::store::jobs::JobLease;

/// A job's writer into one lakehouse namespace.
pub struct IcebergWriter {
    catalog: ControlDatabaseCatalog,
    /// Where the warehouse's tables live (`file:///…`).
    warehouse: String,
    namespace: NamespaceIdent,
    /// How long written files may wait for a commit, at most.
    commit_every: Duration,
    /// Partition fields per stream.
    partitions: std::collections::BTreeMap<String, Vec<PartitionField>>,
    /// The table each started stream writes to, by its table name.
    streams: Mutex<HashMap<String, Arc<StreamTable>>>,
    /// Records each stream made readable, by table name: committed to
    /// the live table (an increment), or in the staged table once it
    /// replaced the live one (a full refresh).
    committed: Mutex<HashMap<String, u64>>,
    /// The snapshots each stream committed, in order, by table name.
    snapshots: Mutex<HashMap<String, Vec<i64>>>,
    /// Files a stream keeps open at once, and the bytes they hold.
    open_files_max: (usize, usize),
}

/// The rows kept aside in a table, as read, and where its metadata was
/// then.
pub(crate) struct KeptAside {
    pub location: String,
    pub rows: Vec<super::aside::AsideRow>,
}

/// A commit is due once its files hold this many bytes of records (or
/// once the commit interval has passed since the first was written).
const COMMIT_BYTES: u64 = 256 * 1024 * 1024;

/// How many of a commit's files are checked for at once before it.
const EXISTENCE_CHECKS: usize = 16;

/// How many files are closed (uploaded, in an object store) at once.
const FILES_CLOSED_AT_ONCE: usize = 8;

/// Files a stream keeps open at once (one per partition written since
/// the last commit): past it, the largest is closed early.
const OPEN_FILES_MAX: usize = 64;

/// Encoded bytes a stream's open files hold together before the largest
/// is closed early (an object store's file is held until it is closed).
const OPEN_FILES_BYTES: usize = 64 * 1024 * 1024;

/// Where one stream's batches go.
struct StreamTable {
    /// The stream's table name (a full refresh writes another table,
    /// `ident`, under it).
    name: String,
    /// The table written.
    ident: TableIdent,
    /// Its schema and partition spec when the stream started, and the
    /// schema as Arrow.
    schema: IcebergSchemaRef,
    spec: PartitionSpecRef,
    arrow: SchemaRef,
    /// How its files are written, and where (fixed for a table's life).
    file_io: FileIO,
    data: DataLocations,
    /// What its commits do besides adding files.
    delivery: Delivery,
    /// What the next commit takes.
    pending: tokio::sync::Mutex<Pending>,
    /// Records in the files committed so far.
    committed_records: std::sync::atomic::AtomicU64,
    /// The snapshots committed to a full refresh's staged table: the
    /// stream's once that table replaces the live one.
    staged_snapshots: Mutex<Vec<i64>>,
}

/// What a stream's commits do besides adding files.
#[derive(Clone)]
enum Delivery {
    /// Each commit saves the state of `pipeline_id`'s `stream` with it.
    Incremental { pipeline_id: String, stream: String },
    /// A full refresh writes a staged table, which replaces `live` when
    /// the stream ends; it keeps no state.
    Refresh { live: TableIdent },
    /// The rows a stream's contract keeps aside, in a table beside the
    /// stream's table `beside`: they keep no state of their own, so each
    /// of `beside`'s commits first commits every row kept aside so far
    /// (its state may cover their records). A row the stream writes again
    /// after a failure adds a row under the same rejection, of which
    /// readers take the last ([`super::aside`]).
    Aside { beside: String },
}

/// What a table begun by [`IcebergWriter::begin`] is to its stream.
enum Role {
    /// The stream's own table, written in place.
    Live,
    /// A staged table replacing the stream's own at its end.
    Refresh,
    /// The table of rows kept aside beside the stream's table `beside`.
    Aside { beside: String },
}

/// Files written and not yet committed, and the latest state reported
/// after the first `covered` of them; the files being written, one per
/// partition (every batch's rows of it until the next commit closes it,
/// or a bound closes it early, after the `covered` files), and whether the
/// latest state came after every row written.
#[derive(Default)]
struct Pending {
    files: Vec<DataFile>,
    covered: usize,
    /// By the partition's path (`""` in an unpartitioned table).
    open: std::collections::BTreeMap<String, OpenFile>,
    open_covered: bool,
    bytes: u64,
    since: Option<Instant>,
    state: Option<String>,
}

/// A data file being written: it starts another file, committed with it,
/// once it holds [`OPEN_FILE_BYTES`], so an upload is never held in memory
/// larger than that.
type OpenFile = DataFileWriter<ParquetWriterBuilder, DataLocations, DefaultFileNameGenerator>;

/// Encoded bytes an open data file takes before the next one is started.
const OPEN_FILE_BYTES: usize = 32 * 1024 * 1024;

/// Encoded bytes of a row group: an open file's rows are held in memory,
/// encoded, until their row group is complete, so a file taking a whole
/// commit's rows stores them a row group at a time.
const ROW_GROUP_BYTES: usize = 8 * 1024 * 1024;

/// Where a table's data files go: `<table>/data/<file>`, or for a
/// partition `<table>/data/p-<hash of its values>/<file>`. The values
/// themselves are in the manifests; a path spelled with them (a source's
/// text, `../` and all) could lead out of the table's folder.
#[derive(Clone)]
struct DataLocations {
    data: String,
}

impl LocationGenerator for DataLocations {
    fn generate_location(&self, key: Option<&PartitionKey>, file_name: &str) -> String {
        match key {
            Some(key) if !PartitionKey::is_effectively_none(Some(key)) => {
                use sha2::Digest;
                let hash = hex::encode(sha2::Sha256::digest(key.to_path().as_bytes()));
                format!("{}/p-{}/{file_name}", self.data, &hash[..16])
            }
            _ => format!("{}/{file_name}", self.data),
        }
    }
}

impl StreamTable {
    /// The same table under `schema` (as Arrow, `arrow`), taking over what
    /// its next commit takes (`pending`, held locked by the caller, so
    /// nothing is added to it meanwhile) and the snapshots staged so far.
    fn with_schema(&self, schema: IcebergSchemaRef, arrow: SchemaRef, pending: Pending) -> StreamTable {
        let staged =
            std::mem::take(&mut *self.staged_snapshots.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        StreamTable {
            name: self.name.clone(),
            ident: self.ident.clone(),
            schema,
            spec: self.spec.clone(),
            arrow,
            file_io: self.file_io.clone(),
            data: self.data.clone(),
            delivery: self.delivery.clone(),
            pending: tokio::sync::Mutex::new(pending),
            committed_records: self.committed_records.load(std::sync::atomic::Ordering::SeqCst).into(),
            staged_snapshots: Mutex::new(staged),
        }
    }

    /// A new data file of the table (in `key`'s partition), zstd-compressed.
    async fn data_file(&self, key: Option<PartitionKey>) -> iceberg::Result<OpenFile> {
        let properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
            .build();
        let files = RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(properties, self.schema.clone()),
            OPEN_FILE_BYTES,
            self.file_io.clone(),
            self.data.clone(),
            DefaultFileNameGenerator::new(uuid::Uuid::now_v7().to_string(), None, DataFileFormat::Parquet),
        );
        DataFileWriterBuilder::new(files).build(key).await
    }
}

fn failed(context: &str, e: impl std::error::Error + Send + Sync + 'static) -> WriteError {
    super::super::failed(context, e)
}

impl IcebergWriter {
    /// Opens `catalog`'s `namespace`, creating it the first time.
    pub(crate) async fn open(
        catalog: ControlDatabaseCatalog,
        warehouse: String,
        namespace: &str,
        commit_every: Duration,
        partitions: std::collections::BTreeMap<String, Vec<PartitionField>>,
    ) -> Result<IcebergWriter, WriteError> {
        let namespace = NamespaceIdent::new(namespace.to_owned());
        if let Err(e) = catalog.create_namespace(&namespace, HashMap::new()).await
            && e.kind() != ErrorKind::NamespaceAlreadyExists
        {
            return Err(failed("cannot create the lakehouse namespace", e));
        }
        Ok(IcebergWriter {
            catalog,
            warehouse,
            namespace,
            commit_every,
            partitions,
            streams: Default::default(),
            committed: Default::default(),
            snapshots: Default::default(),
            open_files_max: (OPEN_FILES_MAX, OPEN_FILES_BYTES),
        })
    }

    /// Starts `pipeline_id`'s `stream` into `table`: the table is created
    /// from the stream's schema, or evolved to take it (a change Iceberg
    /// cannot promote fails here, before anything is written). In a full
    /// refresh (`refresh`), the stream is written to a staged table of the
    /// pipeline's, which [`Self::finish`] swaps in.
    pub(crate) async fn begin(
        &self,
        table: &str,
        ids: (&str, &str),
        json_schema: &Value,
        refresh: bool,
    ) -> Result<(), WriteError> {
        self.start(table, ids, json_schema, if refresh { Role::Refresh } else { Role::Live }).await
    }

    /// Starts the table `table` of rows that `pipeline_id`'s stream
    /// `beside` (a table) keeps aside, created or evolved from
    /// `json_schema`: its rows are committed before each of `beside`'s
    /// commits.
    pub(crate) async fn begin_aside(
        &self,
        table: &str,
        beside: &str,
        ids: (&str, &str),
        json_schema: &Value,
    ) -> Result<(), WriteError> {
        self.start(table, ids, json_schema, Role::Aside { beside: beside.to_owned() }).await
    }

    async fn start(
        &self,
        table: &str,
        (pipeline_id, stream): (&str, &str),
        json_schema: &Value,
        role: Role,
    ) -> Result<(), WriteError> {
        let refused = |e: schema::SchemaError| WriteError::Refused(e.to_string());
        let columns = schema::columns(json_schema).map_err(refused)?;
        let partition = self.partitions.get(stream).map(Vec::as_slice).unwrap_or_default();
        let live = TableIdent::new(self.namespace.clone(), table.to_owned());
        let (ident, delivery) = if let Role::Aside { beside } = role {
            (live, Delivery::Aside { beside })
        } else if let Role::Refresh = role {
            let staged = TableIdent::new(self.namespace.clone(), format!("{table}__refresh_{pipeline_id}"));
            // An earlier attempt's staged table: its files become orphans.
            if self.catalog.table_exists(&staged).await.map_err(|e| failed("cannot read the catalog", e))? {
                self.catalog.drop_table(&staged).await.map_err(|e| failed("cannot drop a staged table", e))?;
            }
            (staged, Delivery::Refresh { live })
        } else {
            (live, Delivery::Incremental { pipeline_id: pipeline_id.to_owned(), stream: stream.to_owned() })
        };
        let opened = loop {
            if self.catalog.table_exists(&ident).await.map_err(|e| failed("cannot read the catalog", e))? {
                let evolved = self
                    .catalog
                    .evolve(&ident, |m| {
                        let mut updates = Vec::new();
                        let schema = match schema::evolve(m.current_schema(), m.last_column_id(), &columns)? {
                            Some(evolved) => {
                                updates.push(TableUpdate::AddSchema { schema: evolved.clone() });
                                updates.push(TableUpdate::SetCurrentSchema { schema_id: -1 });
                                evolved
                            }
                            None => m.current_schema().as_ref().clone(),
                        };
                        let spec = schema::partition_spec(&schema, partition)?;
                        if !schema::same_spec(m.default_partition_spec(), &spec) {
                            updates.push(TableUpdate::AddSpec { spec });
                            updates.push(TableUpdate::SetDefaultSpec { spec_id: -1 });
                        }
                        Ok(updates)
                    })
                    .await
                    .map_err(|e| failed("cannot change the table's schema", e))?;
                break evolved.map_err(refused)?;
            }
            let fresh = schema::new_table(&columns).map_err(refused)?;
            let spec = schema::partition_spec(&fresh, partition).map_err(refused)?;
            let mut creation = TableCreation::builder().name(ident.name().to_owned()).schema(fresh).build();
            creation.partition_spec = Some(spec);
            if matches!(delivery, Delivery::Refresh { .. }) {
                // Each generation of a refreshed table in a folder of its own.
                creation.location = Some(format!(
                    "{}/{}/{}",
                    self.warehouse.trim_end_matches('/'),
                    self.namespace.join("."),
                    format_args!("{table}.{}", uuid::Uuid::now_v7().simple()),
                ));
            }
            match self.catalog.create_table(&self.namespace, creation).await {
                Ok(created) => break created,
                // Another writer created it meanwhile: evolve theirs.
                Err(e) if e.kind() == ErrorKind::TableAlreadyExists => continue,
                Err(e) => return Err(failed("cannot create the table", e)),
            }
        };
        let schema = opened.metadata().current_schema().clone();
        let spec = opened.metadata().default_partition_spec().clone();
        let arrow = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(&schema).map_err(|e| failed("cannot map the table's schema", e))?,
        );
        let file_io = opened.file_io().clone();
        let data = DataLocations { data: format!("{}/data", opened.metadata().location().trim_end_matches('/')) };
        let stream = StreamTable {
            ident,
            schema,
            spec,
            arrow,
            file_io,
            data,
            delivery,
            pending: Default::default(),
            committed_records: Default::default(),
            staged_snapshots: Default::default(),
            name: table.to_owned(),
        };
        self.streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(table.to_owned(), Arc::new(stream));
        Ok(())
    }

    /// Makes every commit of this writer one of `lease`'s job attempt.
    pub(crate) fn hold_for(&mut self, lease: JobLease) {
        self.catalog = self.catalog.leased(lease);
    }

    fn stream(&self, table: &str) -> Result<Arc<StreamTable>, WriteError> {
        self.streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(table)
            .cloned()
            .ok_or_else(|| WriteError::Destination(format!("stream {table} was not started")))
    }

    /// Lays `shaped` records out as the table's columns (no I/O).
    pub(in crate::warehouse) fn lay_out(
        &self,
        table: &str,
        shaped: Vec<Shaped<'_>>,
        meta: &str,
    ) -> Result<RecordBatch, WriteError> {
        let stream = self.stream(table)?;
        batch::batch(shaped, &stream.arrow, crate::store::now_ms() * 1000, meta)
    }

    /// Widens the columns of `table` that `records` overflow, where
    /// Iceberg promotes them in place (int to long, float to double, a
    /// decimal's precision up): what a contract that evolves type changes
    /// does with such values. Whether any column was widened. The files
    /// being written hold the narrower type, so they are closed first (and
    /// committed with the next commit, read back promoted); later batches
    /// are laid out at the wider type.
    pub(crate) async fn widen_for(&self, table: &str, records: &[String]) -> Result<bool, WriteError> {
        let stream = self.stream(table)?;
        let keys = super::super::shape::AppendKeys::Fresh;
        let append = crate::store::pipelines::StreamSyncMode::IncrementalAppend;
        let shaped = super::super::shape::shape_all_keyed(records, append, &[], &keys)?;
        let wider = batch::widenings(&shaped, &stream.arrow);
        if wider.is_empty() {
            return Ok(false);
        }
        let mut pending = stream.pending.lock().await;
        let writing = |e: iceberg::Error| failed(&format!("cannot write to {}", stream.ident.name()), e);
        let open = std::mem::take(&mut pending.open);
        for mut file in open.into_values() {
            let closed = file.close().await.map_err(writing)?;
            pending.files.extend(closed);
        }
        if pending.open_covered {
            pending.covered = pending.files.len();
        }
        let evolved = self
            .catalog
            .evolve(&stream.ident, |m| {
                Ok::<_, schema::SchemaError>(match schema::widened(m.current_schema(), &wider)? {
                    Some(widened) => vec![
                        TableUpdate::AddSchema { schema: widened },
                        TableUpdate::SetCurrentSchema { schema_id: -1 },
                    ],
                    None => Vec::new(),
                })
            })
            .await
            .map_err(|e| failed("cannot change the table's schema", e))?
            .map_err(|e| WriteError::Refused(e.to_string()))?;
        let schema = evolved.metadata().current_schema().clone();
        let arrow = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(&schema).map_err(|e| failed("cannot map the table's schema", e))?,
        );
        let widened = stream.with_schema(schema, arrow, std::mem::take(&mut *pending));
        self.streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(table.to_owned(), Arc::new(widened));
        Ok(true)
    }

    /// The pointer of the first field of `record` that `table`'s columns
    /// cannot hold (a value of another type than its column's, or beyond
    /// it), if any; with `widening`, a value a column could be widened to
    /// hold ([`Self::widen_for`]) fits.
    pub(crate) fn unfit(&self, table: &str, record: &str, widening: bool) -> Result<Option<String>, WriteError> {
        let stream = self.stream(table)?;
        let shaped = shaped(record)?;
        let widened: Vec<String> = match widening {
            true => {
                batch::widenings(std::slice::from_ref(&shaped), &stream.arrow).into_iter().map(|(n, _)| n).collect()
            }
            false => Vec::new(),
        };
        let first = batch::refused(&shaped, &stream.arrow, &widened).into_iter().next();
        Ok(first.map(|name| super::super::contract::pointer(&name)))
    }

    /// `record` with every value `table`'s columns cannot hold made null
    /// (its last copy, the one a row takes; a nested object's whole
    /// value), if it had any and none is a field of `key`.
    pub(crate) fn discard_unfit(
        &self,
        table: &str,
        record: &str,
        key: &[String],
    ) -> Result<Option<String>, WriteError> {
        let stream = self.stream(table)?;
        let mut shaped = shaped(record)?;
        let refused = batch::refused(&shaped, &stream.arrow, &[]);
        if refused.is_empty() || refused.iter().any(|name| key.contains(name)) {
            return Ok(None);
        }
        for name in &refused {
            if let Some(field) = shaped.fields.iter_mut().rev().find(|(n, _)| n == name) {
                field.1 = serde_json::value::RawValue::NULL;
            }
        }
        Ok(Some(super::super::contract::render(&shaped.fields)))
    }

    /// Lays `records` out as the table's columns (no I/O).
    #[cfg(test)]
    fn prepare(&self, table: &str, records: &[String], meta: &str) -> Result<RecordBatch, WriteError> {
        let shaped =
            super::super::shape::shape_all(records, crate::store::pipelines::StreamSyncMode::IncrementalAppend, &[])?;
        self.lay_out(table, shaped, meta)
    }

    /// Writes a batch of `bytes` of records for the next commit: its rows
    /// go to the file being written for their partition (the whole table,
    /// unpartitioned), which the commit closes, so a commit adds a large
    /// file per partition rather than one per batch and partition (fewer
    /// uploads to an object store, fewer files for readers to open). Past
    /// [`OPEN_FILES_MAX`] files or [`OPEN_FILES_BYTES`] held, the largest
    /// is closed at once.
    pub(crate) async fn append(&self, table: &str, batch: RecordBatch, bytes: u64) -> Result<(), WriteError> {
        let stream = self.stream(table)?;
        let writing = |e: iceberg::Error| failed(&format!("cannot write to {}", stream.ident.name()), e);
        let parts = if stream.spec.is_unpartitioned() {
            vec![(None, batch)]
        } else {
            RecordBatchPartitionSplitter::try_new_with_computed_values(stream.schema.clone(), stream.spec.clone())
                .and_then(|splitter| splitter.split(&batch))
                .map_err(writing)?
                .into_iter()
                .map(|(key, part)| (Some(key), part))
                .collect()
        };
        let mut pending = stream.pending.lock().await;
        pending.open_covered = false;
        for (key, part) in parts {
            let path = key.as_ref().map(PartitionKey::to_path).unwrap_or_default();
            let file = match pending.open.entry(path) {
                std::collections::btree_map::Entry::Occupied(open) => open.into_mut(),
                std::collections::btree_map::Entry::Vacant(new) => {
                    new.insert(stream.data_file(key).await.map_err(writing)?)
                }
            };
            file.write(part).await.map_err(writing)?;
        }
        let (files_max, bytes_max) = self.open_files_max;
        while pending.open.len() > files_max
            || pending.open.values().map(CurrentFileStatus::current_written_size).sum::<usize>() > bytes_max
        {
            let Some(largest) =
                pending.open.iter().max_by_key(|(_, f)| f.current_written_size()).map(|(path, _)| path.clone())
            else {
                break;
            };
            if let Some(mut file) = pending.open.remove(&largest) {
                let closed = file.close().await.map_err(writing)?;
                pending.files.extend(closed);
            }
        }
        pending.bytes += bytes;
        pending.since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Takes the stream's latest state, reported after every file written
    /// so far; commits them when a commit is due. The state, if it was
    /// saved now (with the commit, or alone when no file awaits one): the
    /// lakehouse saves its checkpoints itself.
    pub(crate) async fn checkpoint(&self, table: &str, state: String) -> Result<Option<String>, WriteError> {
        let stream = self.stream(table)?;
        let mut pending = stream.pending.lock().await;
        pending.state = Some(state);
        pending.covered = pending.files.len();
        pending.open_covered = true;
        let due = (pending.files.is_empty() && pending.open.is_empty())
            || pending.bytes >= COMMIT_BYTES
            || pending.since.is_some_and(|t| t.elapsed() >= self.commit_every);
        if !due {
            return Ok(None);
        }
        self.commit(&stream, &mut pending, false, None).await
    }

    /// Commits the files the latest state covers, with it (a stream that
    /// stopped, for whatever reason, keeps what its state says it read: a
    /// retry resumes from there, and the records after it, written but not
    /// committed, are read again). The state saved.
    pub(crate) async fn flush(&self, table: &str) -> Result<Option<String>, WriteError> {
        let stream = self.stream(table)?;
        let mut pending = stream.pending.lock().await;
        self.commit(&stream, &mut pending, false, None).await
    }

    /// Commits pending files as one snapshot, saving the pending state in
    /// the same transaction (retried on the new metadata when another
    /// commit came first): the files the state covers, or with
    /// `everything` (a stream that ended well) all of them. Files a failed
    /// commit wrote stay orphans. The rows kept aside beside the stream
    /// are committed first; a table of rows kept aside commits all it
    /// holds. With `replacing`, the commit also replaces that table with
    /// its staged one, in the same catalog transaction.
    async fn commit(
        &self,
        stream: &StreamTable,
        pending: &mut Pending,
        everything: bool,
        replacing: Option<Replacement>,
    ) -> Result<Option<String>, WriteError> {
        let everything = everything || matches!(stream.delivery, Delivery::Aside { .. });
        if !matches!(stream.delivery, Delivery::Aside { .. })
            && let Some(aside) = self.aside_of(&stream.name)
        {
            Box::pin(self.commit(&aside, &mut *aside.pending.lock().await, true, None)).await?;
        }
        // The file being written is closed and committed when the state
        // came after every row in it (or the stream ended well).
        // Otherwise it holds rows read after the state beside rows it
        // covers, which are not stored yet: nothing is committed, and the
        // state waits with them for the stream's good end, or is never
        // saved if the stream fails (a retry reads again from the last
        // state committed).
        // A file closed early, after the state, may hold rows the state
        // covers beside rows it does not: the same wait.
        if !everything && !pending.open_covered && (!pending.open.is_empty() || pending.files.len() > pending.covered) {
            return Ok(None);
        }
        if !pending.open.is_empty() {
            let open = std::mem::take(&mut pending.open);
            let closed: Vec<Vec<DataFile>> = futures_util::stream::iter(open.into_values())
                .map(|mut file| async move { file.close().await })
                .buffered(FILES_CLOSED_AT_ONCE)
                .try_collect()
                .await
                .map_err(|e| failed(&format!("cannot write to {}", stream.ident.name()), e))?;
            pending.files.extend(closed.into_iter().flatten());
            pending.covered = pending.files.len();
        }
        let take = if everything { pending.files.len() } else { pending.covered };
        let files: Vec<DataFile> = pending.files.drain(..take).collect();
        let state = pending.state.take();
        pending.covered = 0;
        if pending.files.is_empty() {
            (pending.bytes, pending.since) = (0, None);
        }
        if files.is_empty()
            && let Some(replacement) = &replacing
        {
            self.catalog
                .replace(&self.namespace, replacement)
                .await
                .map_err(|e| failed(&format!("cannot replace a table beside {}", stream.ident.name()), e))?;
            return Ok(state);
        }
        if files.is_empty() {
            // Nothing to commit: the state is saved alone (still only
            // while the attempt holds its job).
            if let (Some(state), Delivery::Incremental { pipeline_id, stream: name }) = (&state, &stream.delivery) {
                let checkpoint =
                    StreamCheckpoint { pipeline_id: pipeline_id.clone(), stream: name.clone(), state: state.clone() };
                self.catalog
                    .save_checkpoint(&checkpoint)
                    .await
                    .map_err(|e| failed(&format!("cannot save the state of {}", stream.ident.name()), e))?;
            }
            return Ok(state);
        }
        let catalog = match (&state, &stream.delivery) {
            (Some(state), Delivery::Incremental { pipeline_id, stream: name }) => {
                self.catalog.saving(StreamCheckpoint {
                    pipeline_id: pipeline_id.clone(),
                    stream: name.clone(),
                    state: state.clone(),
                })
            }
            _ => self.catalog.clone(),
        };
        let catalog = match replacing {
            Some(replacement) => catalog.replacing(replacement),
            None => catalog,
        };
        let committing = |e: iceberg::Error| failed(&format!("cannot commit to {}", stream.ident.name()), e);
        let current = catalog.load_table(&stream.ident).await.map_err(committing)?;
        // A file removed meanwhile (as an orphan, by hand) must not become
        // part of the table: the stream fails and resumes from its state.
        // Asked together: on an object store each answer is a round trip.
        let io = current.file_io();
        for some in files.chunks(EXISTENCE_CHECKS) {
            let present = futures_util::future::try_join_all(some.iter().map(|f| io.exists(f.file_path())))
                .await
                .map_err(committing)?;
            if let Some((file, _)) = some.iter().zip(present).find(|(_, there)| !there) {
                return Err(WriteError::Destination(format!(
                    "cannot commit to {}: {} was removed before its commit",
                    stream.ident.name(),
                    file.file_path()
                )));
            }
        }
        let records: u64 = files.iter().map(DataFile::record_count).sum();
        let tx = Transaction::new(&current);
        let tx = tx.fast_append().add_data_files(files).apply(tx).map_err(committing)?;
        let committed = tx.commit(&catalog).await.map_err(committing)?;
        stream.committed_records.fetch_add(records, std::sync::atomic::Ordering::SeqCst);
        if let Some(id) = committed.metadata().current_snapshot_id() {
            match stream.delivery {
                Delivery::Incremental { .. } | Delivery::Aside { .. } => self.made_snapshots(&stream.name, [id]),
                Delivery::Refresh { .. } => {
                    stream.staged_snapshots.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(id)
                }
            }
        }
        if let Delivery::Incremental { .. } | Delivery::Aside { .. } = stream.delivery {
            self.made_readable(&stream.ident, records);
        }
        Ok(state)
    }

    /// The table of rows kept aside beside stream table `table`, if one
    /// was started.
    fn aside_of(&self, table: &str) -> Option<Arc<StreamTable>> {
        let streams = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        streams.values().find(|s| matches!(&s.delivery, Delivery::Aside { beside } if beside == table)).cloned()
    }

    /// Counts `records` as readable in `table`.
    fn made_readable(&self, table: &TableIdent, records: u64) {
        let mut committed = self.committed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *committed.entry(table.name().to_owned()).or_default() += records;
    }

    /// Records stream `table` made readable so far (committed to the live
    /// table, or in a refreshed table that replaced it); what a job shows
    /// as written, where records written to a file are not yet stored.
    pub(crate) fn committed_records(&self, table: &str) -> u64 {
        self.committed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(table).copied().unwrap_or(0)
    }

    /// Counts `ids` as snapshots stream `table` made readable.
    fn made_snapshots(&self, table: &str, ids: impl IntoIterator<Item = i64>) {
        let mut snapshots = self.snapshots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        snapshots.entry(table.to_owned()).or_default().extend(ids);
    }

    /// The snapshots stream `table` made readable so far (committed to the
    /// live table, or in a refreshed table that replaced it), in order.
    pub(crate) fn committed_snapshots(&self, table: &str) -> Vec<i64> {
        self.snapshots.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(table).cloned().unwrap_or_default()
    }

    /// Ends a stream that read all it had to: every file it wrote is
    /// committed, and a full refresh's staged table replaces the live one.
    pub(crate) async fn finish(&self, table: &str) -> Result<(), WriteError> {
        let stream = self.stream(table)?;
        self.commit(&stream, &mut *stream.pending.lock().await, true, None).await?;
        let stream = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(table);
        if let Some(StreamTable {
            ident,
            delivery: Delivery::Refresh { live },
            committed_records,
            staged_snapshots,
            ..
        }) = stream.as_deref()
        {
            // As this attempt left it: an attempt that lost its job may
            // have remade the staged table since.
            let staged_at = self.catalog.location(ident).await.map_err(|e| failed("cannot read the catalog", e))?;
            let replacement = Replacement {
                live: live.name().to_owned(),
                staged: ident.name().to_owned(),
                expected: None,
                staged_at: Some(staged_at),
            };
            self.catalog
                .replace(&self.namespace, &replacement)
                .await
                .map_err(|e| failed("cannot swap in the refreshed table", e))?;
            self.made_readable(live, committed_records.load(std::sync::atomic::Ordering::SeqCst));
            let staged =
                std::mem::take(&mut *staged_snapshots.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
            self.made_snapshots(table, staged);
        }
        Ok(())
    }

    /// Up to `limit` of the rows kept aside in `table` by the pipeline
    /// and stream whose rows carry `meta`, after the rejection `after`, in
    /// the order of their rejections: each its rejection and `columns` as
    /// text. None where there is no such table.
    pub(crate) async fn rows_after(
        &self,
        table: &str,
        meta: &str,
        columns: &[&str],
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, serde_json::Map<String, Value>)>, WriteError> {
        let Some(loaded) = self.existing(table).await? else { return Ok(Vec::new()) };
        let page = super::aside::Page { meta, after, limit };
        let rows = super::aside::read_page(&loaded, columns, page).await?;
        Ok(rows.into_iter().map(|r| (r.rejection().to_owned(), r.fields)).collect())
    }

    /// Every row kept aside in `table` now (one per pipeline and
    /// rejection, each with `columns`), and where the table's metadata was
    /// when they were read; `None` where there is no such table.
    pub(crate) async fn kept_aside(&self, table: &str, columns: &[&str]) -> Result<Option<KeptAside>, WriteError> {
        let Some(loaded) = self.existing(table).await? else { return Ok(None) };
        let location = loaded.metadata_location_result().map_err(|e| failed("cannot read the catalog", e))?.to_owned();
        let rows = super::aside::read(&loaded, columns).await?;
        Ok(Some(KeptAside { location, rows }))
    }

    /// Table `table` of the namespace as the catalog has it now, if it
    /// exists.
    async fn existing(&self, table: &str) -> Result<Option<iceberg::table::Table>, WriteError> {
        let ident = TableIdent::new(self.namespace.clone(), table.to_owned());
        match self.catalog.load_table(&ident).await {
            Ok(loaded) => Ok(Some(loaded)),
            Err(e) if e.kind() == ErrorKind::TableNotFound => Ok(None),
            Err(e) => Err(failed("cannot read the catalog", e)),
        }
    }

    /// Ends a replay into stream table `table` (begun, its replayed
    /// records written): the rows still kept aside, `kept` (by the
    /// metadata of the pipeline and stream they belong to, the records of
    /// their rows), are written to a staged table that replaces the table
    /// `aside` in the same catalog transaction as the commit of every
    /// replayed record, provided `aside` is still where it was read
    /// (`read_at`). Both happen or neither: a replay cut short and run
    /// again finds the rows it was replaying still aside, and none of
    /// them loaded.
    pub(crate) async fn end_replay(
        &self,
        table: &str,
        (aside, pipeline_id): (&str, &str),
        aside_schema: &Value,
        kept: Vec<(String, Vec<String>)>,
        read_at: String,
    ) -> Result<(), WriteError> {
        self.start(aside, (pipeline_id, aside), aside_schema, Role::Refresh).await?;
        let staged = self.stream(aside)?;
        let ended = async {
            for (meta, records) in &kept {
                let keys = super::super::shape::AppendKeys::Fresh;
                let shaped = super::super::shape::shape_all_keyed(
                    records,
                    crate::store::pipelines::StreamSyncMode::IncrementalAppend,
                    &[],
                    &keys,
                )?;
                let rows = batch::batch(shaped, &staged.arrow, crate::store::now_ms() * 1000, meta)?;
                self.append(aside, rows, super::super::text_bytes(records) as u64).await?;
            }
            self.commit(&staged, &mut *staged.pending.lock().await, true, None).await?;
            let staged_at =
                self.catalog.location(&staged.ident).await.map_err(|e| failed("cannot read the catalog", e))?;
            let main = self.stream(table)?;
            let replacement = Replacement {
                live: aside.to_owned(),
                staged: staged.ident.name().to_owned(),
                expected: Some(read_at),
                staged_at: Some(staged_at),
            };
            self.commit(&main, &mut *main.pending.lock().await, true, Some(replacement)).await?;
            Ok(())
        }
        .await;
        self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(aside);
        ended
    }

    /// Forgets a stream's table (a reset); its files become orphans.
    pub(crate) async fn drop_table(&self, table: &str) -> Result<(), WriteError> {
        let ident = TableIdent::new(self.namespace.clone(), table.to_owned());
        match self.catalog.drop_table(&ident).await {
            Err(e) if e.kind() != ErrorKind::TableNotFound => Err(failed("cannot drop the table", e)),
            _ => Ok(()),
        }
    }
}

/// `record` split into its fields, as a row of an append takes them.
fn shaped(record: &str) -> Result<Shaped<'_>, WriteError> {
    let keys = super::super::shape::AppendKeys::Fresh;
    super::super::shape::shape_keyed(record, crate::store::pipelines::StreamSyncMode::IncrementalAppend, &[], &keys, 0)
        .map_err(WriteError::BadRecord)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use futures_util::StreamExt;
    use iceberg::io::{FileIOBuilder, LocalFsStorageFactory};
    use iceberg::spec::{PrimitiveType, Type};
    use serde_json::json;

    /// A writer into the namespace `ns` of a scratch warehouse.
    async fn scratch(dir: &std::path::Path) -> (crate::store::Store, ControlDatabaseCatalog, IcebergWriter) {
        let store = crate::store::Store::connect(&format!("sqlite://{}/c.db?mode=rwc", dir.display())).await.unwrap();
        let warehouse = format!("file://{}/lake", dir.display());
        let file_io = FileIOBuilder::new(Arc::new(LocalFsStorageFactory)).build();
        let catalog = ControlDatabaseCatalog::new(store.clone(), "ws/lake", warehouse.clone(), file_io);
        let lake = IcebergWriter::open(catalog.clone(), warehouse, "ns", Duration::from_secs(10), Default::default())
            .await
            .unwrap();
        (store, catalog, lake)
    }

    /// The values of the column `n` of table `name`, in order.
    async fn values(catalog: &ControlDatabaseCatalog, name: &str) -> Vec<i64> {
        let table = catalog.load_table(&TableIdent::new(NamespaceIdent::new("ns".into()), name.into())).await.unwrap();
        let mut values = Vec::new();
        let mut batches = table.scan().select(["n"]).build().unwrap().to_arrow().await.unwrap();
        while let Some(batch) = batches.next().await {
            values.extend(batch.unwrap().column(0).as_primitive::<Int64Type>().iter().flatten());
        }
        values.sort();
        values
    }

    /// A writer into the scratch warehouse whose table `table` is
    /// partitioned by the identity of `s`, and a schema of `n` and `s`.
    async fn partitioned_by_s(
        dir: &std::path::Path,
        catalog: &ControlDatabaseCatalog,
        table: &str,
    ) -> (IcebergWriter, serde_json::Value) {
        let warehouse = format!("file://{}/lake", dir.display());
        let by_s = [(
            table.to_owned(),
            vec![PartitionField { field: "s".into(), transform: iceberg::spec::Transform::Identity }],
        )];
        let lake =
            IcebergWriter::open(catalog.clone(), warehouse, "ns", Duration::from_secs(10), by_s.into()).await.unwrap();
        (lake, json!({ "properties": { "n": { "type": "integer" }, "s": { "type": "string" } } }))
    }

    /// A partition value is a source's text: `../` in it leads no file out
    /// of the table's data folder.
    #[tokio::test]
    async fn partition_values_never_name_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog, _) = scratch(dir.path()).await;
        let (lake, schema) = partitioned_by_s(dir.path(), &catalog, "t").await;
        lake.begin("t", ("p", "t"), &schema, false).await.unwrap();
        let records = [r#"{"n": 1, "s": "../../../../../escape"}"#.to_owned(), r#"{"n": 2, "s": "/abs"}"#.to_owned()];
        let batch = lake.prepare("t", &records, "{}").unwrap();
        lake.append("t", batch, 1).await.unwrap();
        lake.finish("t").await.unwrap();
        assert_eq!(values(&catalog, "t").await, vec![1, 2]);
        let data = dir.path().join("lake/ns/t/data");
        let mut parquet = Vec::new();
        for entry in walk(dir.path()) {
            if entry.extension().is_some_and(|e| e == "parquet") {
                assert!(entry.starts_with(&data), "{} is outside {}", entry.display(), data.display());
                parquet.push(entry);
            }
        }
        assert_eq!(parquet.len(), 2, "a file per partition");
        assert!(!dir.path().join("escape").exists() && !std::path::Path::new("/abs").exists());
        store.close().await;
    }

    /// The batches written between two commits share a file in an
    /// unpartitioned table, and a file per partition in a partitioned one.
    #[tokio::test]
    async fn batches_between_commits_share_a_file_per_partition() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog, _) = scratch(dir.path()).await;
        let (lake, schema) = partitioned_by_s(dir.path(), &catalog, "p").await;
        for table in ["t", "p"] {
            lake.begin(table, ("x", table), &schema, false).await.unwrap();
            for n in 1..=3 {
                let records = [format!(r#"{{"n": {n}, "s": "a"}}"#), format!(r#"{{"n": {}, "s": "b"}}"#, n + 10)];
                let batch = lake.prepare(table, &records, "{}").unwrap();
                lake.append(table, batch, 1).await.unwrap();
            }
            lake.finish(table).await.unwrap();
            assert_eq!(values(&catalog, table).await, vec![1, 2, 3, 11, 12, 13]);
        }
        let parquet = |table: &str| {
            let data = dir.path().join("lake/ns").join(table);
            walk(&data).into_iter().filter(|p| p.extension().is_some_and(|e| e == "parquet")).count()
        };
        assert_eq!(parquet("t"), 1, "three batches, one file");
        assert_eq!(parquet("p"), 2, "three batches of two partitions, a file each");
        store.close().await;
    }

    /// Past the bound of open files the largest is closed early; a state
    /// reported before it was closed waits, as for rows in an open file,
    /// for a later state or the stream's good end.
    #[tokio::test]
    async fn open_files_are_bounded_and_one_closed_early_holds_its_state_back() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog, _) = scratch(dir.path()).await;
        let (lake, schema) = partitioned_by_s(dir.path(), &catalog, "p").await;
        let lake = IcebergWriter { open_files_max: (OPEN_FILES_MAX, OPEN_FILES_BYTES), ..lake };
        let append = async |rows: &[(i64, String)]| {
            let records: Vec<String> = rows.iter().map(|(n, s)| json!({ "n": n, "s": s }).to_string()).collect();
            let batch = lake.prepare("p", &records, "{}").unwrap();
            lake.append("p", batch, 1).await.unwrap();
        };
        lake.begin("p", ("x", "p"), &schema, true).await.unwrap();
        append(&[(1, "a".into())]).await;
        assert_eq!(lake.checkpoint("p", "after 1".into()).await.unwrap(), None, "not due for ten seconds");
        assert_eq!(lake.flush("p").await.unwrap().as_deref(), Some("after 1"));
        append(&[(2, "a".into())]).await;
        assert_eq!(lake.checkpoint("p", "after 2".into()).await.unwrap(), None);
        // More partitions than files may stay open: some close early.
        let many: Vec<(i64, String)> = (0..OPEN_FILES_MAX as i64 + 6).map(|i| (100 + i, format!("s{i}"))).collect();
        append(&many).await;
        let open = lake.stream("p").unwrap().pending.lock().await.open.len();
        assert!(open <= OPEN_FILES_MAX, "{open} files open");
        assert_eq!(lake.flush("p").await.unwrap(), None, "rows came after the state, some in files closed early");
        assert_eq!(values(&catalog, "p__refresh_x").await, vec![1], "row 2 waits with them and the state");
        lake.finish("p").await.unwrap();
        let mut all = vec![1, 2];
        all.extend(many.iter().map(|(n, _)| *n));
        assert_eq!(values(&catalog, "p").await, all, "a good end commits every file");
        store.close().await;
    }

    /// A file past the bound of bytes is closed at once, with rows from
    /// before and after the last state, leaving none open: that state
    /// still waits for them.
    #[tokio::test]
    async fn a_file_closed_early_for_its_bytes_holds_its_state_back() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog, _) = scratch(dir.path()).await;
        let row = |n: i64| json!({ "n": n, "s": "a" }).to_string();
        // What an open file holds after one row, and after two.
        let (probe, schema) = partitioned_by_s(dir.path(), &catalog, "q").await;
        probe.begin("q", ("x", "q"), &schema, true).await.unwrap();
        let mut file = probe.stream("q").unwrap().data_file(None).await.unwrap();
        file.write(probe.prepare("q", &[row(1)], "{}").unwrap()).await.unwrap();
        let one = file.current_written_size();
        file.write(probe.prepare("q", &[row(2)], "{}").unwrap()).await.unwrap();
        assert!(file.current_written_size() > one, "a second row adds to the file");
        // A bound one row fits in and two do not.
        let (lake, schema) = partitioned_by_s(dir.path(), &catalog, "p").await;
        let lake = IcebergWriter { open_files_max: (OPEN_FILES_MAX, one), ..lake };
        let append = async |n: i64| {
            let batch = lake.prepare("p", &[row(n)], "{}").unwrap();
            lake.append("p", batch, 1).await.unwrap();
        };
        lake.begin("p", ("x", "p"), &schema, true).await.unwrap();
        append(1).await;
        assert_eq!(lake.stream("p").unwrap().pending.lock().await.open.len(), 1, "one row stays open");
        assert_eq!(lake.checkpoint("p", "after 1".into()).await.unwrap(), None, "not due for ten seconds");
        append(2).await;
        assert!(lake.stream("p").unwrap().pending.lock().await.open.is_empty(), "closed early, rows 1 and 2 in it");
        assert_eq!(lake.flush("p").await.unwrap().as_deref(), None, "row 2 came after the state");
        assert_eq!(values(&catalog, "p__refresh_x").await, Vec::<i64>::new(), "row 1 waits with row 2");
        lake.finish("p").await.unwrap();
        assert_eq!(values(&catalog, "p").await, vec![1, 2]);
        store.close().await;
    }

    /// Every file under `dir`.
    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
        }
        out
    }

    /// An attempt whose job went to another runner commits nothing: the
    /// check is in the commit's own transaction.
    #[tokio::test]
    async fn an_attempt_that_lost_its_job_commits_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog, mut lake) = scratch(dir.path()).await;
        lake.begin("t", ("p", "t"), &json!({ "properties": { "n": { "type": "integer" } } }), false).await.unwrap();
        lake.hold_for(JobLease { job_id: "job_taken_over".into(), owner: "runner_gone".into(), stream: None });
        let batch = lake.prepare("t", &[r#"{"n": 1}"#.to_owned()], "{}").unwrap();
        lake.append("t", batch, 1).await.unwrap();
        let refused = lake.finish("t").await.unwrap_err();
        assert!(refused.to_string().contains("another runner"), "{refused}");
        assert_eq!(values(&catalog, "t").await, Vec::<i64>::new());
        store.close().await;
    }

    /// The same for a stream of a spread sync: what the runner holding
    /// the stream's lease writes is committed, and what one that no longer
    /// holds it (taken over) writes is not.
    #[tokio::test]
    async fn only_the_runner_holding_a_streams_lease_commits_it() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog, mut held) = scratch(dir.path()).await;
        let (_, job) = crate::store::testing::spread_job(&store, &["t"]).await;
        let claim = store.claim_stream("runner_holding", 60_000, None, 0).await.unwrap().unwrap();
        assert_eq!(claim.stream, "t");
        let schema = json!({ "properties": { "n": { "type": "integer" } } });
        held.begin("t", ("p", "t"), &schema, false).await.unwrap();
        held.hold_for(JobLease { job_id: job.clone(), owner: "runner_holding".into(), stream: Some("t".into()) });
        let batch = held.prepare("t", &[r#"{"n": 1}"#.to_owned()], "{}").unwrap();
        held.append("t", batch, 1).await.unwrap();
        held.finish("t").await.unwrap();
        assert_eq!(values(&catalog, "t").await, vec![1]);
        let (_, _, mut gone) = scratch(dir.path()).await;
        gone.begin("t", ("p", "t"), &schema, false).await.unwrap();
        gone.hold_for(JobLease { job_id: job, owner: "runner_gone".into(), stream: Some("t".into()) });
        let batch = gone.prepare("t", &[r#"{"n": 2}"#.to_owned()], "{}").unwrap();
        gone.append("t", batch, 1).await.unwrap();
        let refused = gone.finish("t").await.unwrap_err();
        assert!(refused.to_string().contains("another runner"), "{refused}");
        assert_eq!(values(&catalog, "t").await, vec![1]);
        store.close().await;
    }

    /// A data directory given as a relative path still puts the tables
    /// under it, not under the root.
    #[tokio::test]
    async fn a_relative_data_directory_keeps_the_tables_under_it() {
        let scratch_dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::connect(&format!("sqlite://{}/c.db?mode=rwc", scratch_dir.path().display()))
            .await
            .unwrap();
        let relative = std::path::PathBuf::from(format!("target/lake-test-{}", uuid::Uuid::new_v4().simple()));
        let policy = Default::default();
        let place = crate::warehouse::Place {
            data_dir: &relative,
            workspace_id: "ws_rel",
            warehouses: &policy,
            extra_roots: &[],
            catalogs: Some(&store),
        };
        let config = crate::warehouse::DestinationConfig::Iceberg {
            warehouse: crate::warehouse::config::Lakehouse::Folder("lake".into()),
            namespace: "ns".into(),
            commit_every: Duration::from_secs(10),
            partitions: Default::default(),
        };
        let writer = crate::warehouse::Writer::open(&config, &place, None).await.unwrap();
        let mode = crate::store::pipelines::StreamSyncMode::IncrementalAppend;
        writer.begin_stream("p", "t", mode, &json!({ "properties": { "n": { "type": "integer" } } })).await.unwrap();
        let tables = store.iceberg_catalog_tables("ws_rel/lake").await.unwrap();
        let location = &tables[0].2;
        let absolute = std::fs::canonicalize(&relative).unwrap();
        assert!(location.starts_with(&format!("file://{}/", absolute.display())), "{location}");
        let _ = std::fs::remove_dir_all(&relative);
        store.close().await;
    }

    /// A stream that stops keeps what its latest state covers only when
    /// nothing came after that state: rows after it share their file with
    /// rows before it, so the state waits with them for the stream's good
    /// end (which commits them all) rather than be saved without its rows.
    #[tokio::test]
    async fn a_stopped_stream_commits_only_what_its_state_covers() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog, lake) = scratch(dir.path()).await;
        let append = async |n: i64| {
            let batch = lake.prepare("t", &[format!(r#"{{"n": {n}}}"#)], "{}").unwrap();
            lake.append("t", batch, 1).await.unwrap();
        };
        // A full refresh keeps no state in the control database, which
        // holds no pipeline "p" here; what is committed when is the same.
        lake.begin("t", ("p", "t"), &json!({ "properties": { "n": { "type": "integer" } } }), true).await.unwrap();
        append(1).await;
        assert_eq!(lake.checkpoint("t", "after 1".into()).await.unwrap(), None, "not due for ten seconds");
        assert_eq!(lake.flush("t").await.unwrap().as_deref(), Some("after 1"), "the state covers every row");
        assert_eq!(values(&catalog, "t__refresh_p").await, vec![1]);
        append(2).await;
        assert_eq!(lake.checkpoint("t", "after 2".into()).await.unwrap(), None, "not due for ten seconds");
        append(3).await;
        assert_eq!(lake.flush("t").await.unwrap(), None, "row 3 came after the state");
        assert_eq!(values(&catalog, "t__refresh_p").await, vec![1], "row 2 waits with row 3 and the state");
        lake.finish("t").await.unwrap();
        assert_eq!(values(&catalog, "t").await, vec![1, 2, 3], "a good end commits them, and swaps the table in");
        store.close().await;
    }

    /// Rows kept aside are committed by the commit of the stream they
    /// are beside, before it, and read back one per rejection (the last
    /// kept); a replay's end swaps in the rewritten table with the
    /// stream's commit, or, when the table moved since it was read, does
    /// neither.
    #[tokio::test]
    async fn rows_kept_aside_commit_first_and_a_replay_ends_in_one_step() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog, lake) = scratch(dir.path()).await;
        let schema = json!({ "properties": { "n": { "type": "integer" } } });
        let aside_schema = json!({ "properties": { "rejection_id": { "type": "string" },
            "n": { "type": "integer" }, "rejected_at": { "type": "string" } } });
        let meta = r#"{"pipeline_id":"p","stream":"t__rejected"}"#;
        let put = async |lake: &IcebergWriter, table: &str, record: serde_json::Value| {
            let batch = lake.prepare(table, &[record.to_string()], meta).unwrap();
            lake.append(table, batch, 1).await.unwrap();
        };
        let kept = |id: &str, n: i64, second: u32| json!({ "rejection_id": id, "n": n, "rejected_at": format!("2026-01-01T00:00:{second:02}.000Z") });
        lake.begin("t", ("p", "t"), &schema, false).await.unwrap();
        lake.begin_aside("t__rejected", "t", ("p", "t__rejected"), &aside_schema).await.unwrap();
        put(&lake, "t", json!({ "n": 1 })).await;
        put(&lake, "t__rejected", kept("r1", 10, 0)).await;
        // The same record kept aside again, later; then another.
        put(&lake, "t__rejected", kept("r1", 11, 1)).await;
        put(&lake, "t__rejected", kept("r2", 20, 0)).await;
        assert_eq!(values(&catalog, "t__rejected").await, Vec::<i64>::new(), "nothing committed yet");
        lake.finish("t").await.unwrap();
        assert_eq!(values(&catalog, "t").await, vec![1]);
        assert_eq!(values(&catalog, "t__rejected").await, vec![10, 11, 20], "committed with the stream's commit");
        let read = lake.rows_after("t__rejected", meta, &["n"], "", 10).await.unwrap();
        let read: Vec<(&str, &serde_json::Value)> = read.iter().map(|(at, row)| (at.as_str(), &row["n"])).collect();
        assert_eq!(read, [("r1", &json!("11")), ("r2", &json!("20"))], "one row per rejection, the last kept");
        assert_eq!(lake.rows_after("t__rejected", meta, &["n"], "r1", 10).await.unwrap().len(), 1);
        let any = lake.rows_after("t__rejected", meta, &["_service_raw_id"], "", 1).await.unwrap();
        assert_eq!(any.len(), 1, "{any:?}");
        assert!(lake.rows_after("t__rejected", "{}", &["n"], "", 10).await.unwrap().is_empty(), "another's");
        assert!(lake.rows_after("t", meta, &["n"], "", 10).await.is_err(), "a stream's table keeps no rows aside");

        // A replay: r1 loads, r2 stays aside.
        let read_at = lake.kept_aside("t__rejected", &["n"]).await.unwrap().unwrap().location;
        lake.begin("t", ("p", "t"), &schema, false).await.unwrap();
        put(&lake, "t", json!({ "n": 11 })).await;
        let stays = vec![(meta.to_owned(), vec![kept("r2", 20, 0).to_string()])];
        lake.end_replay("t", ("t__rejected", "p"), &aside_schema, stays.clone(), read_at).await.unwrap();
        assert_eq!(values(&catalog, "t").await, vec![1, 11]);
        assert_eq!(values(&catalog, "t__rejected").await, vec![20]);

        // Another writer keeps a row aside after the replay read the table:
        // the replay commits nothing.
        let read_at = lake.kept_aside("t__rejected", &["n"]).await.unwrap().unwrap().location;
        let warehouse = format!("file://{}/lake", dir.path().display());
        let other = IcebergWriter::open(catalog.clone(), warehouse, "ns", Duration::from_secs(10), Default::default())
            .await
            .unwrap();
        other.begin_aside("t__rejected", "t", ("q", "t__rejected"), &aside_schema).await.unwrap();
        put(&other, "t__rejected", kept("r3", 30, 0)).await;
        other.flush("t__rejected").await.unwrap();
        lake.begin("t", ("p", "t"), &schema, false).await.unwrap();
        put(&lake, "t", json!({ "n": 20 })).await;
        let outdated = lake.end_replay("t", ("t__rejected", "p"), &aside_schema, stays, read_at).await;
        assert!(outdated.is_err(), "{outdated:?}");
        assert_eq!(values(&catalog, "t").await, vec![1, 11], "no record of the replay committed");
        assert_eq!(values(&catalog, "t__rejected").await, vec![20, 30]);

        // A staged table remade since it was written in full (by an attempt
        // that lost its job) is never swapped in.
        let ns = NamespaceIdent::new("ns".into());
        let staged_at = catalog.location(&TableIdent::new(ns.clone(), "t".into())).await.unwrap();
        let remade = Replacement {
            live: "t__rejected".into(),
            staged: "t".into(),
            expected: None,
            staged_at: Some(format!("{staged_at}.old")),
        };
        assert!(catalog.replace(&ns, &remade).await.is_err());
        assert_eq!(values(&catalog, "t__rejected").await, vec![20, 30], "unchanged");
        assert_eq!(values(&catalog, "t").await, vec![1, 11], "the staged table kept");
        let current = Replacement { staged_at: Some(staged_at), ..remade };
        catalog.replace(&ns, &current).await.unwrap();
        assert_eq!(values(&catalog, "t__rejected").await, vec![1, 11]);
        store.close().await;
    }

    /// Pages of one pipeline's rows kept aside, read with filters in the
    /// scans, give what the whole table read at once gives for it: one row
    /// per rejection (the last kept), in order, none of another pipeline's,
    /// whatever the page size, across several commits.
    #[tokio::test]
    async fn a_page_of_rows_kept_aside_is_what_the_whole_table_gives_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _catalog, lake) = scratch(dir.path()).await;
        let schema = json!({ "properties": { "n": { "type": "integer" } } });
        let aside_schema = json!({ "properties": { "rejection_id": { "type": "string" },
            "n": { "type": "integer" }, "rejected_at": { "type": "string" } } });
        let (ours, theirs) =
            (r#"{"pipeline_id":"p","stream":"t__rejected"}"#, r#"{"pipeline_id":"q","stream":"t__rejected"}"#);
        lake.begin("t", ("p", "t"), &schema, false).await.unwrap();
        lake.begin_aside("t__rejected", "t", ("p", "t__rejected"), &aside_schema).await.unwrap();
        // Three commits: each keeps aside some of 30 rejections of ours and
        // of theirs, the later ones again with a newer value.
        for round in 0..3i64 {
            for i in (round * 7)..(round * 7 + 12).min(30) {
                for (meta, n) in [(ours, round * 100 + i), (theirs, -(round * 100 + i))] {
                    let record = json!({ "rejection_id": format!("r{i:02}"), "n": n,
                        "rejected_at": format!("2026-01-01T00:00:{round:02}.000Z") });
                    let batch = lake.prepare("t__rejected", &[record.to_string()], meta).unwrap();
                    lake.append("t__rejected", batch, 1).await.unwrap();
                }
            }
            lake.finish("t").await.unwrap();
            lake.begin("t", ("p", "t"), &schema, false).await.unwrap();
        }
        let whole = lake.kept_aside("t__rejected", &["n"]).await.unwrap().unwrap().rows;
        let expected: Vec<(String, serde_json::Value)> = whole
            .into_iter()
            .filter(|r| r.meta == ours)
            .map(|r| (r.rejection().to_owned(), r.fields["n"].clone()))
            .collect();
        assert_eq!(expected.len(), 26, "{expected:?}");
        assert_eq!(expected[8], ("r08".to_owned(), json!("108")), "the last kept");
        for limit in [1, 4, 26, 100] {
            let (mut paged, mut after) = (Vec::new(), String::new());
            loop {
                let page = lake.rows_after("t__rejected", ours, &["n"], &after, limit).await.unwrap();
                assert!(page.len() <= limit);
                let Some((last, _)) = page.last() else { break };
                after = last.clone();
                paged.extend(page.into_iter().map(|(at, row)| (at, row["n"].clone())));
            }
            assert_eq!(paged, expected, "pages of {limit}");
        }
        store.close().await;
    }

    /// A record a lakehouse keeps aside is placed as a database places it:
    /// read again after the same state (an attempt cut short between the
    /// commits of the rejected table and the stream's), it is the same
    /// rejection; its row is keyed afresh all the same.
    #[tokio::test]
    async fn a_record_kept_aside_again_after_the_same_state_is_the_same_rejection() {
        use crate::store::pipelines::{StreamContract, StreamSyncMode};
        use crate::warehouse::shape::AppendKeys;
        let dir = tempfile::tempdir().unwrap();
        let (store, _catalog, lake) = scratch(dir.path()).await;
        let schema = json!({ "properties": { "n": { "type": "integer" } } });
        lake.begin("t", ("p", "t"), &schema, false).await.unwrap();
        let writer = crate::warehouse::Writer::Iceberg(Box::new(lake));
        let rules =
            StreamContract { type_changes: crate::store::kinds::ContractMode::Quarantine, ..StreamContract::default() };
        let contract = crate::warehouse::contract::Contract::new(rules, &schema, &[]).unwrap();
        let records = vec![r#"{"n": 1}"#.to_owned(), r#"{"n": "two"}"#.to_owned()];
        let judged = |state: &str| {
            let keys = AppendKeys::after("p", "t", Some(state), false);
            let (batch, judgement) = writer
                .prepare(
                    "p",
                    "t",
                    &records,
                    StreamSyncMode::IncrementalAppend,
                    &[],
                    (keys, Some(&contract), Default::default()),
                )
                .unwrap()
                .unwrap();
            let crate::warehouse::writer::Load::Arrow(rows) = batch.load else { panic!("a lakehouse lays out Arrow") };
            let raw_id = rows.column(0).as_string::<i32>().value(0).to_owned();
            (judgement.rejected.iter().map(|r| r.place.clone()).collect::<Vec<_>>(), raw_id)
        };
        let (first, first_row) = judged("after 1");
        let (again, again_row) = judged("after 1");
        assert_eq!((first.len(), &first), (1, &again), "the same rejection");
        assert_ne!(first_row, again_row, "rows are keyed afresh");
        assert_ne!(judged("after 2").0, first, "read after another state, another place");
        store.close().await;
    }

    /// Values a column cannot hold widen it where Iceberg promotes its
    /// type in place, when type changes evolve: a 32-bit integer column
    /// given a larger integer becomes a long, a decimal given more digits
    /// a larger precision; the rows written before read back promoted,
    /// every value exact. Where the contract freezes type changes, the
    /// batch fails and the column stays.
    #[tokio::test]
    async fn a_value_a_column_cannot_hold_widens_it_where_type_changes_evolve() {
        use crate::store::pipelines::{StreamContract, StreamSyncMode};
        use crate::warehouse::Loader;
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog, lake) = scratch(dir.path()).await;
        let schema = json!({ "properties": {
            "n": { "type": "integer", "format": "int32" },
            "f": { "type": "number", "format": "float" },
            "d": { "type": "string", "format": "decimal", "precision": 6, "scale": 2 } } });
        lake.begin("t", ("p", "t"), &schema, false).await.unwrap();
        let writer = Arc::new(crate::warehouse::Writer::Iceberg(Box::new(lake)));
        let mut loader = Loader::new(writer.clone(), "p", "t", StreamSyncMode::IncrementalAppend, vec![]);
        loader.write(vec![r#"{"n": 1, "d": "1234.56", "f": 1.5}"#.to_owned()]).await.unwrap();
        loader.write(vec![r#"{"n": 5000000000, "d": "-123456.78"}"#.to_owned()]).await.unwrap();
        loader.write(vec![r#"{"n": 3, "d": "0.01", "f": 1e300}"#.to_owned()]).await.unwrap();
        loader.drain().await.unwrap();
        writer.end_stream("t").await.unwrap();
        let ident = TableIdent::new(NamespaceIdent::new("ns".into()), "t".into());
        let table = catalog.load_table(&ident).await.unwrap();
        let field = |name: &str| table.metadata().current_schema().field_by_name(name).unwrap().field_type.to_string();
        let types = [field("n"), field("f"), field("d")];
        assert_eq!(types, ["long", "double", "decimal(8, 2)"].map(str::to_owned));
        assert_eq!(values(&catalog, "t").await, vec![1, 3, 5_000_000_000]);
        let mut decimals = Vec::new();
        let mut batches = table.scan().select(["d"]).build().unwrap().to_arrow().await.unwrap();
        while let Some(batch) = batches.next().await {
            let batch = batch.unwrap();
            let column = batch.column(0).as_primitive::<arrow_array::types::Decimal128Type>();
            decimals.extend(column.iter().flatten());
        }
        decimals.sort();
        assert_eq!(decimals, vec![-12_345_678, 1, 123_456], "every value exact");
        let mut floats = Vec::new();
        let mut batches = table.scan().select(["f"]).build().unwrap().to_arrow().await.unwrap();
        while let Some(batch) = batches.next().await {
            floats.extend(batch.unwrap().column(0).as_primitive::<arrow_array::types::Float64Type>().iter().flatten());
        }
        floats.sort_by(f64::total_cmp);
        assert_eq!(floats, vec![1.5, 1e300], "never an infinity");

        // Frozen type changes: no column widens.
        let frozen =
            StreamContract { type_changes: crate::store::kinds::ContractMode::Freeze, ..StreamContract::default() };
        let contract = Arc::new(crate::warehouse::contract::Contract::new(frozen, &schema, &[]).unwrap());
        writer.begin_stream("p", "u", StreamSyncMode::IncrementalAppend, &schema).await.unwrap();
        let mut loader = Loader::new(writer.clone(), "p", "u", StreamSyncMode::IncrementalAppend, vec![]);
        let refused = loader.write_under(vec![r#"{"n": 5000000000}"#.to_owned()], Some(&contract)).await;
        let frozen = |m: &str| m.contains("type_mismatch at /n") && m.contains("freezes");
        assert!(matches!(&refused, Err(WriteError::BadRecord(m)) if frozen(m)), "{:?}", refused.err());
        // A float's range the contract does not judge: the column refuses.
        let refused = loader.write_under(vec![r#"{"f": 1e300}"#.to_owned()], Some(&contract)).await;
        assert!(matches!(&refused, Err(WriteError::BadRecord(m)) if m.contains("32-bit float")), "{:?}", refused.err());
        let table = catalog.load_table(&TableIdent::new(NamespaceIdent::new("ns".into()), "u".into())).await.unwrap();
        let field = |name: &str| table.metadata().current_schema().field_by_name(name).unwrap().field_type.to_string();
        assert_eq!((field("n"), field("f")), ("int".to_owned(), "float".to_owned()));

        // Discarded type changes: the value the column refuses is made
        // null, its record loaded and counted; the column stays.
        let discarding = StreamContract {
            type_changes: crate::store::kinds::ContractMode::DiscardValue,
            ..StreamContract::default()
        };
        let contract = Arc::new(crate::warehouse::contract::Contract::new(discarding, &schema, &[]).unwrap());
        writer.begin_stream("p", "v", StreamSyncMode::IncrementalAppend, &schema).await.unwrap();
        let mut loader = Loader::new(writer.clone(), "p", "v", StreamSyncMode::IncrementalAppend, vec![]);
        let batch = vec![r#"{"n": 2, "f": 1e300}"#.to_owned(), r#"{"n": 4, "f": 2.5}"#.to_owned()];
        let (_, judged) = loader.write_under(batch, Some(&contract)).await.unwrap();
        assert_eq!((judged.value_discarded, judged.rejected.len()), (1, 0));
        loader.drain().await.unwrap();
        writer.end_stream("v").await.unwrap();
        let table = catalog.load_table(&TableIdent::new(NamespaceIdent::new("ns".into()), "v".into())).await.unwrap();
        assert_eq!(table.metadata().current_schema().field_by_name("f").unwrap().field_type.to_string(), "float");
        let mut rows = Vec::new();
        let mut batches = table.scan().select(["n", "f"]).build().unwrap().to_arrow().await.unwrap();
        while let Some(batch) = batches.next().await {
            let batch = batch.unwrap();
            let n = batch.column(0).as_primitive::<arrow_array::types::Int32Type>().clone();
            let f = batch.column(1).as_primitive::<arrow_array::types::Float32Type>().clone();
            rows.extend(n.iter().zip(f.iter()));
        }
        rows.sort_by_key(|(n, _)| *n);
        assert_eq!(rows, vec![(Some(2), None), (Some(4), Some(2.5))]);

        // A value the contract requires is not made null: where invalid
        // records are quarantined, the record as read is kept aside.
        let mut required = schema.clone();
        required["required"] = json!(["f"]);
        let rules = StreamContract {
            type_changes: crate::store::kinds::ContractMode::DiscardValue,
            invalid_records: crate::store::kinds::ContractMode::Quarantine,
            ..StreamContract::default()
        };
        let contract = Arc::new(crate::warehouse::contract::Contract::new(rules, &required, &[]).unwrap());
        writer.begin_stream("p", "w", StreamSyncMode::IncrementalAppend, &required).await.unwrap();
        let mut loader = Loader::new(writer.clone(), "p", "w", StreamSyncMode::IncrementalAppend, vec![]);
        let batch = vec![r#"{"n": 6, "f": 1e300}"#.to_owned(), r#"{"n": 7, "f": 3.5}"#.to_owned()];
        let (_, judged) = loader.write_under(batch, Some(&contract)).await.unwrap();
        assert_eq!(judged.value_discarded, 0);
        let aside: Vec<(&str, &str)> =
            judged.rejected.iter().map(|r| (r.record.as_str(), r.breach.pointer.as_str())).collect();
        assert_eq!(aside, [(r#"{"n": 6, "f": 1e300}"#, "/f")], "the record as read");
        store.close().await;
    }

    /// A stream's new field adds a column and a widened type is promoted
    /// in place (rows written before read back at the new type); a change
    /// Iceberg cannot promote fails before anything is written.
    #[tokio::test]
    async fn a_table_evolves_with_its_stream_and_refuses_what_iceberg_cannot_promote() {
        let dir = tempfile::tempdir().unwrap();
        let (store, catalog, lake) = scratch(dir.path()).await;
        let write = async |records: &[&str]| {
            let records: Vec<String> = records.iter().map(|r| r.to_string()).collect();
            let batch = lake.prepare("t", &records, "{}").unwrap();
            lake.append("t", batch, 1).await.unwrap();
            // No state: the pipeline "p" is not in the control database.
            lake.finish("t").await.unwrap();
        };

        let stream = ("p", "t");
        lake.begin("t", stream, &json!({ "properties": { "n": { "type": "integer", "format": "int32" } } }), false)
            .await
            .unwrap();
        write(&[r#"{"n": 1}"#]).await;
        let v2 = json!({ "properties": { "n": { "type": "integer" }, "s": { "type": "string" } } });
        lake.begin("t", stream, &v2, false).await.unwrap();
        write(&[r#"{"n": 5000000000, "s": "x"}"#]).await;

        let ident = TableIdent::new(NamespaceIdent::new("ns".into()), "t".into());
        let table = catalog.load_table(&ident).await.unwrap();
        let schema = table.metadata().current_schema().clone();
        assert_eq!(*schema.field_by_name("n").unwrap().field_type, Type::Primitive(PrimitiveType::Long));
        assert!(schema.field_by_name("s").is_some(), "the new field is a column");
        assert_eq!(table.metadata().snapshots().count(), 2, "a snapshot per batch");
        assert_eq!(values(&catalog, "t").await, vec![1, 5_000_000_000], "the int written first reads back as a long");

        match lake.begin("t", stream, &json!({ "properties": { "n": { "type": "string" } } }), false).await {
            Err(WriteError::Refused(m)) => assert!(m.contains("field n is long"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let after = catalog.load_table(&ident).await.unwrap();
        assert_eq!(after.metadata_location(), table.metadata_location(), "nothing was committed");
        store.close().await;
    }
}
