//! The lakehouse destination's Iceberg catalog on the control database:
//! writers racing to commit to one table all get their commits in, each
//! as its own snapshot, and the table always opens at a complete
//! metadata file.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch};
use iceberg::io::{FileIOBuilder, LocalFsStorageFactory};
use iceberg::spec::{DataFileFormat, NestedField, PrimitiveType, Schema, Type};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{DefaultFileNameGenerator, DefaultLocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Catalog, NamespaceIdent, TableCreation, TableIdent};
use service::warehouse::iceberg::catalog::ProductCatalog;

use crate::on_both_backends;
use crate::support::{Backend, TestServer};

/// Appends one data file holding `ids` to the table, retrying on the
/// catalog's conflicts as a transaction does.
async fn append(catalog: &ProductCatalog, ident: &TableIdent, ids: Vec<i64>, prefix: String) {
    let table = catalog.load_table(ident).await.unwrap();
    let schema = table.metadata().current_schema().clone();
    let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).unwrap());
    let files = RollingFileWriterBuilder::new_with_default_file_size(
        ParquetWriterBuilder::new(Default::default(), schema),
        table.file_io().clone(),
        DefaultLocationGenerator::new(table.metadata()).unwrap(),
        DefaultFileNameGenerator::new(prefix, None, DataFileFormat::Parquet),
    );
    let mut writer = DataFileWriterBuilder::new(files).build(None).await.unwrap();
    writer.write(RecordBatch::try_new(arrow, vec![Arc::new(Int64Array::from(ids))]).unwrap()).await.unwrap();
    let data = writer.close().await.unwrap();
    let tx = Transaction::new(&table);
    let tx = tx.fast_append().add_data_files(data).apply(tx).unwrap();
    tx.commit(catalog).await.unwrap();
}

async fn racing_commits_to_one_table_are_all_kept(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let dir = tempfile::tempdir().unwrap();
    let file_io = FileIOBuilder::new(Arc::new(LocalFsStorageFactory)).build();
    let warehouse = format!("file://{}", dir.path().display());
    let catalog = ProductCatalog::new(srv.state.store.clone(), "dst_race", warehouse, file_io);
    let ns = NamespaceIdent::new("events".into());
    catalog.create_namespace(&ns, HashMap::new()).await.unwrap();
    assert!(catalog.create_namespace(&ns, HashMap::new()).await.is_err(), "a namespace is made once");
    let schema = Schema::builder()
        .with_fields(vec![NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into()])
        .build()
        .unwrap();
    let created =
        catalog.create_table(&ns, TableCreation::builder().name("clicks".into()).schema(schema).build()).await.unwrap();
    let ident = created.identifier().clone();
    assert_eq!(created.metadata().properties().get("commit.retry.num-retries").map(String::as_str), Some("100"));

    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (catalog, ident) = (catalog.clone(), ident.clone());
            tokio::spawn(async move {
                for i in 0..5 {
                    append(&catalog, &ident, vec![w * 100 + i], format!("w{w}-{i}")).await;
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let table = catalog.load_table(&ident).await.unwrap();
    assert_eq!(table.metadata().snapshots().count(), 20, "every commit is a snapshot of its own");
    let mut ids = Vec::new();
    let mut batches = table.scan().build().unwrap().to_arrow().await.unwrap();
    use futures_util::StreamExt;
    while let Some(batch) = batches.next().await {
        let batch = batch.unwrap();
        let col = batch.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        ids.extend(col.iter().flatten());
    }
    ids.sort();
    let expected: Vec<i64> = (0..4).flat_map(|w| (0..5).map(move |i| w * 100 + i)).collect();
    assert_eq!(ids, expected, "no commit lost, none twice");
    assert_eq!(catalog.list_tables(&ns).await.unwrap(), vec![ident.clone()]);
    // Another destination's catalog sees none of it.
    let other = ProductCatalog::new(
        srv.state.store.clone(),
        "dst_other",
        "file:///nowhere",
        FileIOBuilder::new(Arc::new(LocalFsStorageFactory)).build(),
    );
    assert!(!other.table_exists(&ident).await.unwrap());
    srv.stop().await;
}

on_both_backends!(racing_commits_to_one_table_are_all_kept);
