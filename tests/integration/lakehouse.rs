//! The lakehouse destination end to end: a sync through a real plugin
//! lands typed rows that pyiceberg and DuckDB (from PyPI) read back
//! exactly, a full refresh swaps a table's contents at once, and the
//! Iceberg catalog on the control database keeps every racing commit.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
use service::warehouse::iceberg::catalog::ControlDatabaseCatalog;

use crate::on_both_backends;
use crate::support::iceberg::Reader;
use crate::support::process::{self, ServerProcess};
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::replicas::Processes;
use crate::support::trust::Trust;
use crate::support::{ADMIN_TOKEN, Backend, TEST_MASTER_KEY, TestServer, expect_error, json_ok, test_python};
use testkit::objectstore::MotoS3;

/// Appends one data file holding `ids` to the table, retrying on the
/// catalog's conflicts as a transaction does.
async fn append(catalog: &ControlDatabaseCatalog, ident: &TableIdent, ids: Vec<i64>, prefix: String) {
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
    let catalog = ControlDatabaseCatalog::new(srv.state.store.clone(), "dst_race", warehouse, file_io);
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
    let other = ControlDatabaseCatalog::new(
        srv.state.store.clone(),
        "dst_other",
        "file:///nowhere",
        FileIOBuilder::new(Arc::new(LocalFsStorageFactory)).build(),
    );
    assert!(!other.table_exists(&ident).await.unwrap());
    srv.stop().await;
}

on_both_backends!(racing_commits_to_one_table_are_all_kept);

/// The decimal(38,9) the fake source gives record `i`: 29 digits before
/// the point and 9 after, negative for odd `i`.
fn amount(i: u64) -> String {
    let sign = if i % 2 == 1 { "-" } else { "" };
    format!("{sign}{}.{:09}", 10u128.pow(28) + u128::from(i), (i * 7919) % 1_000_000_000)
}

/// Record `i`'s time, in microseconds since the epoch.
fn micros(i: u64) -> i64 {
    1_704_067_200_000_000 + i as i64 * 1_000_001
}

/// Record `i` as the provider writes it: decimals as JSON numbers (even
/// `i`) or strings (odd), a zoned time to the microsecond, a date, a
/// nested object the schema closes, text with escapes, and now and then
/// a field the schema does not declare.
fn event(i: u64) -> String {
    let at = chrono::DateTime::from_timestamp_micros(micros(i)).unwrap().format("%Y-%m-%dT%H:%M:%S%.6fZ");
    let amount = if i.is_multiple_of(2) { amount(i) } else { format!("\"{}\"", amount(i)) };
    let day = if i.is_multiple_of(5) { "null".to_owned() } else { "\"2024-02-29\"".to_owned() };
    let extra = if i.is_multiple_of(10) { format!(r#","extra":{{"k":{i}}}"#) } else { String::new() };
    format!(
        r#"{{"id":{i},"kind":"open","updated_at":"{at}","payload":{{"n":{i}}},"note":"row {i}\ttab\n\u00e9","amount":{amount},"day":{day}{extra}}}"#
    )
}

/// A fake source of `count` such records (a count that may grow), paged
/// by `next_cursor` up to an empty page, so an incremental read resumes
/// after the last record, and answering each page after `delay` ms.
fn typed_events(token: String, count: Arc<AtomicU64>, delay: Arc<AtomicU64>) -> axum::Router {
    use axum::extract::Query;
    use axum::http::HeaderMap;
    axum::Router::new().route(
        "/events",
        axum::routing::get(move |h: HeaderMap, Query(q): Query<HashMap<String, String>>| {
            let (token, count, delay) = (token.clone(), count.load(Ordering::SeqCst), delay.load(Ordering::SeqCst));
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                if h.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {token}")) {
                    return (axum::http::StatusCode::UNAUTHORIZED, String::new());
                }
                let limit: u64 = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(100);
                let start: u64 = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
                let end = (start + limit).min(count);
                let data: Vec<String> = (start..end).map(event).collect();
                let next = if start < count { format!("\"{end}\"") } else { "null".to_owned() };
                (axum::http::StatusCode::OK, format!(r#"{{"data":[{}],"next_cursor":{next}}}"#, data.join(",")))
            }
        }),
    )
}

struct Lake {
    srv: TestServer,
    reader: tokio::sync::Mutex<Reader>,
    /// The source's token at the fake provider.
    token: String,
    source_id: String,
    /// The CA the server trusts beside the system's.
    ca: TestCa,
    _provider: FakeProvider,
}

impl Lake {
    async fn start(backend: Backend, count: u64) -> Option<Lake> {
        Lake::start_reaching(backend, count, "").await
    }

    /// A lake whose destinations may reach `warehouse_hosts`
    /// (`SERVICE_WAREHOUSE_ALLOWED_HOSTS`).
    async fn start_reaching(backend: Backend, count: u64, warehouse_hosts: &str) -> Option<Lake> {
        let ca = TestCa::new();
        let token = format!("src-token-{}", uuid::Uuid::new_v4().simple());
        let routes = typed_events(token.clone(), Arc::new(AtomicU64::new(count)), Default::default());
        let provider = FakeProvider::start(&ca, &["api.source.test"], routes).await;
        let trust = Trust::new(&ca).serving(&provider, &["api.source.test"]);
        let srv = TestServer::start_with(backend, |c| {
            c.plugins.egress = trust.policy();
            c.plugins.warehouses =
                service::warehouse::postgres::WarehousePolicy::from_settings(warehouse_hosts).unwrap();
        })
        .await?;
        srv.load_test_plugin("test_paged_source").await;
        let reader = tokio::sync::Mutex::new(Reader::start());
        let mut lake = Lake { srv, reader, token, source_id: String::new(), ca, _provider: provider };
        lake.source_id = lake.source_as(ADMIN_TOKEN).await;
        Some(lake)
    }

    /// `POST path` with `body`, as the holder of `token`; the answer's data.
    async fn post_as(&self, token: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
        json_ok(self.srv.request_as(token, reqwest::Method::POST, path).json(&body).send().await.unwrap()).await["data"]
            .clone()
    }

    /// `moto`'s access key stored through a credential-entry page in the
    /// workspace of `token`, as a CLI or MCP user stores one: the link
    /// leaves the username to the person, who types the key's id beside
    /// its secret (a request body naming the id is refused: it looks like
    /// a key). Answers the credential's handle.
    async fn access_key_typed_on_a_page(&self, token: &str, moto: &MotoS3) -> serde_json::Value {
        let links = "/v1/credentials/entry-links";
        let naming_the_id =
            serde_json::json!({ "kind": "basic", "username": moto.access_key_id, "hosts": ["127.0.0.1"] });
        let refused =
            self.srv.request_as(token, reqwest::Method::POST, links).json(&naming_the_id).send().await.unwrap();
        let refused = expect_error(refused, 400, "SECRET_NOT_ACCEPTED").await;
        assert_eq!(refused["details"]["field"], "username", "{refused}");
        assert!(refused["message"].as_str().unwrap().contains("leave username out"), "{refused}");
        let link = serde_json::json!({ "kind": "basic", "hosts": ["127.0.0.1"], "label": "store key" });
        let link = self.post_as(token, links, link).await;
        let form = [("username", moto.access_key_id.as_str()), ("secret", moto.secret_access_key.as_str())];
        let typed = self.srv.client.post(link["url"].as_str().unwrap()).form(&form).send().await.unwrap();
        assert_eq!(typed.status(), reqwest::StatusCode::OK, "{}", typed.text().await.unwrap());
        let poll = self.srv.request_as(token, reqwest::Method::GET, link["poll"].as_str().unwrap());
        let done = json_ok(poll.send().await.unwrap()).await;
        assert_eq!(done["data"]["status"], "completed", "{done}");
        done["data"]["credential_handle"].clone()
    }

    /// A source of the fake events in the workspace of `token`.
    async fn source_as(&self, token: &str) -> String {
        let secret = serde_json::json!({ "hosts": ["api.source.test"], "secret": self.token });
        let cred = self.post_as(token, "/v1/credentials", secret).await;
        let body = serde_json::json!({ "connector_id": "test_paged_source", "name": "Events", "configuration": { "base_url": "https://api.source.test", "credential_handle": cred["credential_handle"], "page_size": 300 } });
        self.post_as(token, "/v1/sources", body).await["source_id"].as_str().unwrap().to_owned()
    }

    async fn destination(&self, configuration: serde_json::Value) -> String {
        self.destination_as(ADMIN_TOKEN, configuration).await
    }

    async fn destination_as(&self, token: &str, configuration: serde_json::Value) -> String {
        let body = serde_json::json!({ "name": "lake", "kind": "iceberg", "configuration": configuration });
        self.post_as(token, "/v1/destinations", body).await["destination_id"].as_str().unwrap().to_owned()
    }

    async fn pipeline(&self, destination_id: &str, mode: &str) -> reqwest::Response {
        self.pipeline_as(ADMIN_TOKEN, &self.source_id, destination_id, mode).await
    }

    async fn pipeline_as(&self, token: &str, source_id: &str, destination_id: &str, mode: &str) -> reqwest::Response {
        let body = serde_json::json!({ "name": "events", "source_id": source_id, "destination_id": destination_id, "streams": [{ "name": "events", "sync_mode": mode }] });
        self.srv.request_as(token, reqwest::Method::POST, "/v1/pipelines").json(&body).send().await.unwrap()
    }

    async fn sync(&self, pipeline_id: &str) -> serde_json::Value {
        self.sync_as(ADMIN_TOKEN, pipeline_id).await
    }

    /// Starts a sync as the holder of `token` and waits for its end.
    async fn sync_as(&self, token: &str, pipeline_id: &str) -> serde_json::Value {
        let job = self.post_as(token, &format!("/v1/pipelines/{pipeline_id}/sync"), serde_json::json!({})).await;
        let path = format!("/v1/jobs/{}", job["job_id"].as_str().unwrap());
        for _ in 0..1200 {
            let job = json_ok(self.srv.request_as(token, reqwest::Method::GET, &path).send().await.unwrap()).await;
            if ["succeeded", "failed", "cancelled"].contains(&job["data"]["status"].as_str().unwrap_or_default()) {
                return job["data"].clone();
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("{path} did not finish");
    }

    /// What pyiceberg and DuckDB read of `table` in the warehouse folder
    /// `warehouse` of the first workspace.
    async fn read_back(&self, warehouse: &str, table: &str) -> serde_json::Value {
        let catalog = format!("{}/{warehouse}", self.srv.workspace_id().await);
        self.read_back_in(&catalog, table).await
    }

    /// What pyiceberg and DuckDB read of `table` in the catalog `catalog`.
    async fn read_back_in(&self, catalog: &str, table: &str) -> serde_json::Value {
        self.read_back_with(catalog, table, serde_json::json!({})).await
    }

    /// The same, the catalog opened with `properties` (an object store's).
    async fn read_back_with(&self, catalog: &str, table: &str, properties: serde_json::Value) -> serde_json::Value {
        self.reader.lock().await.read(&self.srv.state.config.database_url, catalog, table, properties).await
    }
}

/// Every record once, each value exactly as the provider wrote it, in
/// what pyiceberg and DuckDB read.
fn assert_exact(read: &serde_json::Value, count: u64) {
    let rows = read["rows"].as_array().unwrap();
    assert_eq!(rows.len() as u64, count, "every record once");
    let mut seen = std::collections::BTreeSet::new();
    for row in rows {
        let i: u64 = row["id"].as_str().unwrap().parse().unwrap();
        assert!(seen.insert(i), "record {i} twice");
        assert_eq!(row["amount"], amount(i), "record {i}'s decimal, as pyiceberg reads it");
        let at = chrono::DateTime::from_timestamp_micros(micros(i)).unwrap().format("%Y-%m-%dT%H:%M:%S%.6f+00:00");
        assert_eq!(row["updated_at"], at.to_string(), "record {i}'s time");
        assert_eq!(row["payload_n"], i);
        assert_eq!(row["note"], format!("row {i}\ttab\n\u{e9}"));
        assert_eq!(row["day"], if i.is_multiple_of(5) { serde_json::Value::Null } else { "2024-02-29".into() });
    }
    assert_eq!(seen.len() as u64, count);
    let duck = read["duckdb"].as_array().unwrap();
    assert_eq!(duck.len() as u64, count, "DuckDB reads the same snapshot");
    for r in duck {
        let i: u64 = r[0].as_str().unwrap().parse().unwrap();
        assert_eq!(r[1], amount(i), "record {i}'s decimal, as DuckDB reads it");
        assert_eq!(r[2], micros(i), "record {i}'s microseconds, as DuckDB reads them");
    }
}

async fn typed_rows_land_exactly_and_a_full_refresh_swaps_the_table_at_once(backend: Backend) {
    let Some(lake) = Lake::start(backend, 2500).await else { return };
    let dest = lake.destination(serde_json::json!({ "warehouse": "lake", "namespace": "analytics" })).await;
    let refused = expect_error(lake.pipeline(&dest, "incremental_deduped").await, 400, "VALIDATION_FAILED").await;
    assert!(refused["message"].as_str().unwrap().contains("cannot deduplicate"), "{refused}");

    let pipeline = json_ok(lake.pipeline(&dest, "incremental_append").await).await;
    let job = lake.sync(pipeline["data"]["pipeline_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["progress"]["records"], 2500);
    let read = lake.read_back("lake", "analytics.events").await;
    assert_exact(&read, 2500);
    assert!(read["snapshots"].as_u64().unwrap() >= 1);
    // The ledger's snapshots are the ones pyiceberg sees: all of a new
    // table's.
    let ledger = &job["progress"]["ledger"];
    assert_eq!(ledger["balanced"], true, "{job}");
    let events = &ledger["streams"]["events"];
    assert!(events["read"] == 2500 && events["loaded"] == 2500 && events["left_to_retry"] == 0, "{job}");
    assert_eq!(events["snapshot_ids"], read["snapshot_ids"], "{job}");
    let types = &read["types"];
    assert_eq!(types["amount"], "decimal(38, 9)", "{types}");
    assert_eq!(types["updated_at"], "timestamptz");
    assert_eq!(types["day"], "date");
    assert_eq!(types["id"], "string", "a union of types is JSON text");
    assert!(types["payload"].as_str().unwrap().starts_with("struct<"), "{types}");
    assert_eq!(
        read["columns"].as_array().unwrap()[..4],
        ["_service_raw_id", "_service_extracted_at", "_service_meta", "_service_unmapped"]
    );

    // Another workspace naming the same folder and namespace gets a
    // catalog and files of its own: its sync leaves the first's table as
    // it was.
    let (other_ws, other) = lake.srv.other_workspace().await;
    let source = lake.source_as(&other).await;
    let theirs =
        lake.destination_as(&other, serde_json::json!({ "warehouse": "lake", "namespace": "analytics" })).await;
    let pipeline = json_ok(lake.pipeline_as(&other, &source, &theirs, "incremental_append").await).await;
    let job = lake.sync_as(&other, pipeline["data"]["pipeline_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_exact(&lake.read_back_in(&format!("{other_ws}/lake"), "analytics.events").await, 2500);
    assert_exact(&lake.read_back("lake", "analytics.events").await, 2500);
    assert!(lake.srv.data_dir.join("lakehouse").join(&other_ws).join("lake/analytics/events").is_dir());
    // No configuration names a place outside the workspace's folder.
    for (field, bad) in [
        ("warehouse", serde_json::json!({ "warehouse": "../other" })),
        ("warehouse", serde_json::json!({ "warehouse": format!("../{other_ws}/lake") })),
        ("warehouse", serde_json::json!({ "warehouse": "/tmp/lake" })),
        ("namespace", serde_json::json!({ "warehouse": "lake", "namespace": "a.b" })),
        ("namespace", serde_json::json!({ "warehouse": "lake", "namespace": "../x" })),
        ("commit_every_seconds", serde_json::json!({ "warehouse": "lake", "commit_every_seconds": 0 })),
        (
            "partitions",
            serde_json::json!({ "warehouse": "lake", "partitions": { "events": [{ "field": "id", "transform": "weekly" }] } }),
        ),
        (
            "partitions",
            serde_json::json!({ "warehouse": "lake", "partitions": { "events": [{ "transform": "day" }] } }),
        ),
        ("path", serde_json::json!({ "warehouse": "lake", "path": "/" })),
    ] {
        let body = serde_json::json!({ "name": "x", "kind": "iceberg", "configuration": bad });
        let refused =
            expect_error(lake.srv.post("/v1/destinations", body).send().await.unwrap(), 400, "VALIDATION_FAILED");
        assert_eq!(refused.await["details"]["field"], format!("configuration.{field}"), "{bad}");
    }

    // A full refresh into another namespace, partitioned: each sync's rows
    // replace the last's in one catalog step, so a reader never sees both
    // or neither; each commit is a file per partition.
    let partitions = serde_json::json!({ "events": [
        { "field": "updated_at", "transform": "hour" },
        { "field": "id", "transform": "bucket[4]" },
    ] });
    let refreshed = lake
        .destination(serde_json::json!({ "warehouse": "lake", "namespace": "snapshots", "partitions": partitions }))
        .await;
    let pipeline = json_ok(lake.pipeline(&refreshed, "full_refresh_overwrite").await).await;
    let pipeline_id = pipeline["data"]["pipeline_id"].as_str().unwrap();
    for _ in 0..2 {
        let job = lake.sync(pipeline_id).await;
        assert_eq!(job["status"], "succeeded");
        let read = lake.read_back("lake", "snapshots.events").await;
        assert_exact(&read, 2500);
        // The refreshed table's snapshots, swapped in with it.
        let events = &job["progress"]["ledger"]["streams"]["events"];
        assert!(events["loaded"] == 2500 && events["unaccounted"] == 0, "{job}");
        assert_eq!(events["snapshot_ids"], read["snapshot_ids"], "{job}");
        assert_eq!(read["spec"], serde_json::json!([["updated_at_hour", "hour"], ["id_bucket_4", "bucket[4]"]]));
        // 2,500 seconds of records from the top of an hour: one hour, four
        // buckets, each commit a file per partition it holds.
        assert_eq!(read["partitions"], 4);
        assert!(read["files"].as_u64().unwrap() >= 4, "{}", read["files"]);
    }
    let catalog = format!("{}/lake", lake.srv.workspace_id().await);
    let tables = lake.srv.state.store.iceberg_tables(&catalog, "snapshots").await.unwrap();
    assert_eq!(tables, vec!["events".to_owned()], "the staged table is gone once swapped in");

    // A partition the stream cannot have fails the sync, named, before
    // anything is written.
    let partitions = serde_json::json!({ "events": [{ "field": "nope", "transform": "day" }] });
    let wrong = lake
        .destination(serde_json::json!({ "warehouse": "lake", "namespace": "wrong", "partitions": partitions }))
        .await;
    let pipeline = json_ok(lake.pipeline(&wrong, "incremental_append").await).await;
    let job = lake.sync(pipeline["data"]["pipeline_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert!(job["error"].as_str().unwrap().contains("partition field nope: the stream has no such column"), "{job}");
    assert_eq!(job["attempts"], 1, "a refusal is not retried: {job}");
    assert!(lake.srv.state.store.iceberg_tables(&catalog, "wrong").await.unwrap().is_empty());
    lake.srv.stop().await;
}

on_both_backends!(typed_rows_land_exactly_and_a_full_refresh_swaps_the_table_at_once);

async fn an_object_store_warehouse_holds_every_record_once_and_only_its_key_opens_it(backend: Backend) {
    let Some(lake) = Lake::start_reaching(backend, 2500, "127.0.0.1").await else { return };
    let moto = MotoS3::start(&test_python(), "lake-bucket").await;
    // moto speaks HTTP; the server reaches it over HTTPS, as a store.
    let front = moto.https_front(&lake.ca).await;
    let endpoint = format!("https://127.0.0.1:{}", front.addr.port());
    // The access key, as a basic credential bound to the endpoint: its id
    // the username, its secret the password.
    let (posting, username) = (&lake, &moto.access_key_id);
    let access_key = |host: &str, secret: &str| {
        let key = serde_json::json!({ "kind": "basic", "username": username, "hosts": [host], "secret": secret });
        async move { posting.post_as(ADMIN_TOKEN, "/v1/credentials", key).await["credential_handle"].clone() }
    };
    let handle = access_key("127.0.0.1", &moto.secret_access_key).await;
    let s3 = |namespace: &str, handle: &serde_json::Value| {
        serde_json::json!({ "warehouse": "s3://lake-bucket/tenants/a", "namespace": namespace, "endpoint": endpoint,
            "region": "us-east-1", "credential_handle": handle })
    };
    let catalog = format!("{}/s3://lake-bucket/tenants/a", lake.srv.workspace_id().await);

    // Incremental: every record once, exactly, in moto's bucket.
    let dest = lake.destination(s3("analytics", &handle)).await;
    let pipeline = json_ok(lake.pipeline(&dest, "incremental_append").await).await;
    let job = lake.sync(pipeline["data"]["pipeline_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let read = lake.read_back_with(&catalog, "analytics.events", moto.reader_properties()).await;
    assert_exact(&read, 2500);
    let location = lake.srv.state.store.iceberg_catalog_tables(&catalog).await.unwrap()[0].2.clone();
    assert!(location.starts_with("s3://lake-bucket/tenants/a/analytics/events/metadata/"), "{location}");

    // A full refresh, twice: the staged table swapped in each time.
    let dest = lake.destination(s3("snapshots", &handle)).await;
    let pipeline = json_ok(lake.pipeline(&dest, "full_refresh_overwrite").await).await;
    for _ in 0..2 {
        let job = lake.sync(pipeline["data"]["pipeline_id"].as_str().unwrap()).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        assert_exact(&lake.read_back_with(&catalog, "snapshots.events", moto.reader_properties()).await, 2500);
    }

    // A wrong secret signs requests moto refuses: the sync fails, named,
    // and the table is not created.
    let wrong = access_key("127.0.0.1", "not-the-secret-key").await;
    let dest = lake.destination(s3("refused", &wrong)).await;
    let pipeline = json_ok(lake.pipeline(&dest, "incremental_append").await).await;
    let job = lake.sync(pipeline["data"]["pipeline_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert!(job["error"].as_str().unwrap().contains("SignatureDoesNotMatch"), "{job}");
    assert!(!job.to_string().contains("not-the-secret-key"), "the secret is never shown: {job}");
    assert!(lake.srv.state.store.iceberg_tables(&catalog, "refused").await.unwrap().is_empty());

    // Configurations that would reach elsewhere, or send the key in clear.
    let elsewhere = |patch: serde_json::Value| {
        let mut c = s3("x", &handle);
        c.as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
        serde_json::json!({ "name": "x", "kind": "iceberg", "configuration": c })
    };
    for (field, code, patch) in [
        ("endpoint", "DESTINATION_HOST_NOT_ALLOWED", serde_json::json!({ "endpoint": "https://localhost:9000" })),
        ("endpoint", "VALIDATION_FAILED", serde_json::json!({ "endpoint": format!("http://127.0.0.1:{}", moto.port) })),
        ("endpoint", "VALIDATION_FAILED", serde_json::json!({ "endpoint": "https://127.0.0.1/other-bucket" })),
        ("warehouse", "VALIDATION_FAILED", serde_json::json!({ "warehouse": "s3://lake-bucket/tenants/../b" })),
        ("warehouse", "VALIDATION_FAILED", serde_json::json!({ "warehouse": "s3://Lake_Bucket" })),
        ("warehouse", "VALIDATION_FAILED", serde_json::json!({ "warehouse": "gs://lake-bucket" })),
        ("credential_handle", "VALIDATION_FAILED", serde_json::json!({ "credential_handle": null })),
    ] {
        let refused =
            expect_error(lake.srv.post("/v1/destinations", elsewhere(patch.clone())).send().await.unwrap(), 400, code);
        assert_eq!(refused.await["details"]["field"], format!("configuration.{field}"), "{patch}");
    }
    // A credential bound to another host is not sent to this one, and an
    // access key is a basic credential.
    let elsewhere_bound = access_key("api.source.test", &moto.secret_access_key).await;
    let token = serde_json::json!({ "hosts": ["127.0.0.1"], "secret": moto.secret_access_key });
    let token = lake.post_as(ADMIN_TOKEN, "/v1/credentials", token).await["credential_handle"].clone();
    // An access key stored for a connector is that connector's: a
    // destination may not borrow it.
    let me = json_ok(lake.srv.get("/v1/me").send().await.unwrap()).await;
    let connectors = lake
        .srv
        .state
        .vault
        .create(service::credentials::NewSecret {
            workspace_id: &lake.srv.workspace_id().await,
            created_by: me["data"]["user"]["user_id"].as_str().unwrap(),
            kind: service::store::kinds::CredentialKind::Basic,
            connector_id: Some("conn_rest_manifest"),
            label: None,
            hosts: vec!["127.0.0.1".into()],
            metadata: serde_json::json!({ "username": moto.access_key_id }),
            material: service::credentials::SecretMaterial::new(moto.secret_access_key.clone().into()),
            status: service::store::kinds::CredentialStatus::Active,
            access_expires_at: None,
        })
        .await
        .unwrap()
        .credential_handle
        .to_string();
    let connectors = serde_json::json!(connectors);
    for (handle, code) in
        [(elsewhere_bound, "CREDENTIAL_HOST_MISMATCH"), (token, "VALIDATION_FAILED"), (connectors, "VALIDATION_FAILED")]
    {
        let body = serde_json::json!({ "name": "x", "kind": "iceberg", "configuration": s3("x", &handle) });
        let refused = expect_error(lake.srv.post("/v1/destinations", body).send().await.unwrap(), 400, code);
        assert_eq!(refused.await["details"]["field"], "configuration.credential_handle");
    }
    // Another workspace loads the same prefix with its key of its own: its
    // catalog is its own, and its files are not the first's orphans.
    let (other_ws, other) = lake.srv.other_workspace().await;
    let their_key = lake.access_key_typed_on_a_page(&other, &moto).await;
    let source = lake.source_as(&other).await;
    let theirs = lake.destination_as(&other, s3("analytics", &their_key)).await;
    let pipeline = json_ok(lake.pipeline_as(&other, &source, &theirs, "incremental_append").await).await;
    let job = lake.sync_as(&other, pipeline["data"]["pipeline_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let their_catalog = format!("{other_ws}/s3://lake-bucket/tenants/a");
    assert_exact(&lake.read_back_with(&their_catalog, "analytics.events", moto.reader_properties()).await, 2500);

    // What the second refresh replaced is in no snapshot: `service
    // warehouse orphans`, with the server's settings, lists it in the
    // bucket and removes it, and every table still reads exactly.
    let roots = lake.srv.data_dir.join("test-ca.pem");
    std::fs::write(&roots, &lake.ca.pem).unwrap();
    let orphans = |delete: bool| {
        let mut cmd = process::command();
        cmd.env("SERVICE_DATA_DIR", &lake.srv.data_dir)
            .env("DATABASE_URL", &lake.srv.state.config.database_url)
            .env("SERVICE_MASTER_KEY", TEST_MASTER_KEY)
            .env("SERVICE_WAREHOUSE_ALLOWED_HOSTS", "127.0.0.1")
            .env("SERVICE_EGRESS_EXTRA_ROOTS", &roots)
            .args(["warehouse", "orphans", "--grace-minutes", "0"]);
        if delete {
            cmd.arg("--delete");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "orphans: {}", String::from_utf8_lossy(&out.stderr));
        let objects: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("s3://"))
            .map(|l| l.split('\t').next().unwrap().to_owned())
            .collect();
        (objects, String::from_utf8(out.stderr).unwrap())
    };
    let (listed, warnings) = orphans(false);
    assert!(warnings.is_empty(), "every warehouse was listed: {warnings}");
    assert!(!listed.is_empty(), "the replaced table's files");
    let replaced = "s3://lake-bucket/tenants/a/snapshots/";
    assert!(listed.iter().all(|o| o.starts_with(replaced) && o.contains("/snapshots/events.")), "{listed:?}");
    let live = lake.srv.state.store.iceberg_catalog_tables(&catalog).await.unwrap();
    for (_, _, location) in &live {
        let folder = location.split("/metadata/").next().unwrap();
        assert!(listed.iter().all(|o| !o.starts_with(&format!("{folder}/"))), "a live table's file is listed");
    }
    let (removed, _) = orphans(true);
    assert_eq!(removed, listed);
    assert!(orphans(false).0.is_empty(), "nothing is left to remove");
    assert_exact(&lake.read_back_with(&catalog, "analytics.events", moto.reader_properties()).await, 2500);
    assert_exact(&lake.read_back_with(&catalog, "snapshots.events", moto.reader_properties()).await, 2500);
    assert_exact(&lake.read_back_with(&their_catalog, "analytics.events", moto.reader_properties()).await, 2500);

    // A folder warehouse takes none of the object store's fields.
    let body = serde_json::json!({ "name": "x", "kind": "iceberg", "configuration": { "warehouse": "lake", "endpoint": endpoint } });
    let refused = expect_error(lake.srv.post("/v1/destinations", body).send().await.unwrap(), 400, "VALIDATION_FAILED");
    assert_eq!(refused.await["details"]["field"], "configuration.endpoint");
    lake.srv.stop().await;
}

on_both_backends!(an_object_store_warehouse_holds_every_record_once_and_only_its_key_opens_it);

/// `service warehouse orphans` against the processes' data directory.
fn orphans(procs: &Processes, delete: bool) -> Vec<String> {
    let mut cmd = process::command();
    cmd.env("SERVICE_DATA_DIR", procs.data_dir()).args(["warehouse", "orphans", "--grace-minutes", "0"]);
    if delete {
        cmd.arg("--delete");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "orphans: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

/// A reader only ever sees committed snapshots, and the stream state is
/// saved in the same transaction as the commit its records are in: the
/// server is killed (`kill -9`) at a random point of each of 20 syncs,
/// the source growing between them, and after each the restarted server
/// finishes the job and the table opens in pyiceberg and DuckDB with every
/// record of the source exactly once. What the killed writes left behind
/// is listed by `service warehouse orphans`, and removing it loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_at_random_points_of_twenty_syncs_leaves_every_record_once() {
    crate::support::init_crypto();
    let ca = TestCa::new();
    let token = format!("lake-crash-{}", uuid::Uuid::new_v4().simple());
    let (count, delay) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let routes = typed_events(token.clone(), count.clone(), delay.clone());
    let provider = FakeProvider::start(&ca, &["api.source.test"], routes).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("SERVICE_JOB_LEASE_SECS", "1".into()));
    let mut server = ServerProcess::start(procs.env.clone()).await;
    let destination = serde_json::json!({ "name": "lake", "kind": "iceberg", "configuration": { "warehouse": "lake", "namespace": "crash" } });
    let pipeline =
        procs.pipeline_of(&server.base, "test_paged_source", &token, 40, destination, "incremental_append").await;
    let database_url = format!("sqlite://{}/service.db", procs.data_dir().display());
    let catalog = format!("{}/lake", procs.workspace());
    let mut kills = Vec::new();
    let mut reader = Reader::start();
    for round in 0..20u64 {
        count.fetch_add(300, Ordering::SeqCst);
        // Pages of 40 records, 25 ms each: about 200 ms of reading, killed
        // anywhere from before the first page to after the last.
        delay.store(25, Ordering::SeqCst);
        let sync = procs.api(&server.base, reqwest::Method::POST, &format!("/v1/pipelines/{pipeline}/sync"));
        let job = json_ok(sync.send().await.unwrap()).await;
        let job_id = job["data"]["job_id"].as_str().unwrap().to_owned();
        let kill_after = rand::random_range(0..300u64);
        kills.push(kill_after);
        tokio::time::sleep(std::time::Duration::from_millis(kill_after)).await;
        server.kill();
        delay.store(0, Ordering::SeqCst);
        server = ServerProcess::start(procs.env.clone()).await;
        let last = procs.wait(&server.base, &job_id).await;
        assert_eq!(last["status"], "succeeded", "round {round}, killed after {kill_after} ms: {last}");
        let read = reader.read(&database_url, &catalog, "crash.events", serde_json::json!({})).await;
        let rows = read["rows"].as_array().unwrap();
        let mut ids: Vec<u64> = rows.iter().map(|r| r["id"].as_str().unwrap().parse().unwrap()).collect();
        ids.sort();
        let want: Vec<u64> = (0..count.load(Ordering::SeqCst)).collect();
        assert!(
            ids == want,
            "round {round} (kills after {kills:?} ms): {} rows, not each of {} once",
            ids.len(),
            want.len()
        );
        assert_exact(&read, want.len() as u64);
    }
    server.kill();

    let listed = orphans(&procs, false);
    let summary = listed.last().unwrap();
    assert!(summary.ends_with("(--delete removes them)"), "{listed:?}");
    let removed = orphans(&procs, true);
    assert_eq!(removed.len(), listed.len(), "the same files are removed: {removed:?}");
    assert_eq!(orphans(&procs, false), vec!["0 orphan file(s), 0 bytes (--delete removes them)".to_owned()]);
    let read = reader.read(&database_url, &catalog, "crash.events", serde_json::json!({})).await;
    assert_exact(&read, count.load(Ordering::SeqCst));
}

/// Two `service serve` processes on one PostgreSQL database, two
/// pipelines loading one table at once, each committing every second:
/// their commits race for the table's pointer, the losers retry on the
/// new metadata, and no commit is lost: every record is in the table once
/// per pipeline. Needs `SERVICE_TEST_DATABASE_URL` (or the local server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_loading_one_table_lose_no_commit() {
    crate::support::init_crypto();
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let ca = TestCa::new();
    let token = format!("lake-replicas-{}", uuid::Uuid::new_v4().simple());
    let (count, delay) = (Arc::new(AtomicU64::new(1200)), Arc::new(AtomicU64::new(40)));
    let provider = FakeProvider::start(&ca, &["api.source.test"], typed_events(token.clone(), count, delay)).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("DATABASE_URL", db.url.clone()));
    // One after the other: the first creates the shared key file.
    let a = ServerProcess::start(procs.env.clone()).await;
    let b = ServerProcess::start(procs.env.clone()).await;
    let destination = |n: u32| serde_json::json!({ "name": format!("lake {n}"), "kind": "iceberg", "configuration": { "warehouse": "lake", "namespace": "shared", "commit_every_seconds": 1 } });
    let first = procs.pipeline_of(&a.base, "test_paged_source", &token, 30, destination(1), "incremental_append").await;
    let second =
        procs.pipeline_of(&b.base, "test_paged_source", &token, 30, destination(2), "incremental_append").await;
    let mut jobs = Vec::new();
    for (base, pipeline) in [(&a.base, &first), (&b.base, &second)] {
        let sync = procs.api(base, reqwest::Method::POST, &format!("/v1/pipelines/{pipeline}/sync"));
        jobs.push((base, json_ok(sync.send().await.unwrap()).await["data"]["job_id"].as_str().unwrap().to_owned()));
    }
    let mut spans = Vec::new();
    for (base, job_id) in &jobs {
        let job = procs.wait(base, job_id).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        spans.push((job["started_at"].as_str().unwrap().to_owned(), job["finished_at"].as_str().unwrap().to_owned()));
    }
    assert!(spans[0].0 < spans[1].1 && spans[1].0 < spans[0].1, "the two syncs ran at once: {spans:?}");
    let read = Reader::start()
        .read(&db.url, &format!("{}/lake", procs.workspace()), "shared.events", serde_json::json!({}))
        .await;
    assert!(read["snapshots"].as_u64().unwrap() >= 4, "several commits each: {}", read["snapshots"]);
    let rows = read["rows"].as_array().unwrap();
    for pipeline in [&first, &second] {
        let mut ids: Vec<u64> = rows
            .iter()
            .filter(|r| r["pipeline"] == pipeline.as_str())
            .map(|r| r["id"].as_str().unwrap().parse().unwrap())
            .collect();
        ids.sort();
        assert_eq!(ids, (0..1200).collect::<Vec<u64>>(), "pipeline {pipeline}: every record once");
    }
    assert_eq!(rows.len(), 2400);
    drop((a, b));
}
