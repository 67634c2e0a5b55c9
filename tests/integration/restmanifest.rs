//! The REST API source described by a manifest (`conn_rest_manifest`),
//! through the API as a user runs it: every paging style against a fake
//! API over real HTTPS, a parent–child stream, a 429 with `Retry-After`
//! mid-sync, an incremental sync that reads exactly what is new, manifests
//! refused at their JSON pointer, and hostile manifests that fail clearly
//! without a request to an unvetted host.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use reqwest::Method;
use serde_json::{Value, json};

use crate::on_both_backends;
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, count_rows, expect_error, json, json_ok};
use testkit::restapi::{self, HOST, RestApi};

/// A host the operator allows (and pins to a fake that counts requests),
/// which no manifest's base URL names: a connector that followed a link
/// there would be caught.
const ELSEWHERE: &str = "files.acme-data.net";

/// A server reaching the fake REST API (and a second host, elsewhere),
/// with a credential stored for the REST manifest source.
struct ManifestServer {
    srv: TestServer,
    api: Arc<RestApi>,
    handle: String,
    token: String,
    elsewhere: FakeProvider,
    _provider: FakeProvider,
}

async fn setup(backend: Backend, api: RestApi) -> ManifestServer {
    setup_with(backend, api, json!({})).await
}

/// [`setup`], the credential stored with `fields` (its kind and where it
/// goes) beside its secret and host.
async fn setup_with(backend: Backend, api: RestApi, fields: Value) -> ManifestServer {
    let ca = TestCa::new();
    let token = format!("rest-token-{}", uuid::Uuid::new_v4().simple());
    let api = Arc::new(api.with_token(token.clone()));
    let provider = FakeProvider::start(&ca, &[HOST], restapi::router(api.clone())).await;
    let elsewhere = FakeProvider::start(&ca, &[ELSEWHERE], restapi::router(Arc::new(RestApi::new(5)))).await;
    let trust = Trust::new(&ca).serving(&provider, &[HOST]).serving(&elsewhere, &[ELSEWHERE]);
    let srv = TestServer::start_with(backend, |c| c.plugins.egress = trust.policy()).await.unwrap();
    let mut body = json!({ "connector_id": "conn_rest_manifest", "hosts": [HOST], "secret": token });
    body.as_object_mut().unwrap().extend(fields.as_object().cloned().unwrap_or_default());
    let cred = json_ok(srv.post("/v1/credentials", body).send().await.unwrap()).await;
    let handle = cred["data"]["credential_handle"].as_str().unwrap().to_owned();
    ManifestServer { srv, api, handle, token, elsewhere, _provider: provider }
}

impl ManifestServer {
    fn configuration(&self, manifest: Value) -> Value {
        json!({ "base_url": format!("https://{HOST}"), "credential_handle": self.handle, "manifest": manifest })
    }

    async fn create_source(&self, manifest: Value) -> reqwest::Response {
        let body = json!({ "connector_id": "conn_rest_manifest", "name": "Acme", "configuration": self.configuration(manifest) });
        self.srv.post("/v1/sources", body).send().await.unwrap()
    }

    async fn source(&self, manifest: Value) -> String {
        let created = json_ok(self.create_source(manifest).await).await;
        created["data"]["source_id"].as_str().unwrap().to_owned()
    }

    /// An SQLite file destination, and its id.
    async fn destination(&self, file: &str) -> String {
        let dest = json_ok(
            self.srv
                .post("/v1/destinations", json!({ "name": file, "kind": "sqlite", "configuration": { "file": file } }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        dest["data"]["destination_id"].as_str().unwrap().to_owned()
    }

    /// A pipeline of `streams` (name, mode) into an SQLite file, and its id.
    async fn pipeline(&self, source_id: &str, file: &str, streams: &[(&str, &str)]) -> String {
        let dest = self.destination(file).await;
        let streams: Vec<Value> =
            streams.iter().map(|(name, mode)| json!({ "name": name, "sync_mode": mode })).collect();
        let body = json!({ "name": file, "source_id": source_id, "destination_id": dest, "streams": streams });
        let p = json_ok(self.srv.post("/v1/pipelines", body).send().await.unwrap()).await;
        p["data"]["pipeline_id"].as_str().unwrap().to_owned()
    }

    async fn sync(&self, pipeline_id: &str) -> Value {
        let job =
            json_ok(self.srv.request(Method::POST, &format!("/v1/pipelines/{pipeline_id}/sync")).send().await.unwrap())
                .await;
        self.srv.wait_job(job["data"]["job_id"].as_str().unwrap()).await
    }

    async fn rows(&self, file: &str, table: &str) -> i64 {
        let path = self.srv.warehouse(&self.srv.workspace_id().await, file);
        count_rows(&format!("sqlite://{}?mode=ro", path.display()), table).await
    }
}

/// One manifest with a stream in each paging style and a child stream.
fn every_style() -> Value {
    json!({
        "headers": { "X-Api-Version": "2024-01" },
        "streams": [
            { "name": "pages", "path": "/pages/items", "records": "/data", "primary_key": ["id"],
              "paging": { "type": "page_number", "param": "page", "size_param": "per_page", "size": 40, "total_pages": "meta.total_pages" },
              "schema": { "type": "object", "properties": { "id": { "type": "integer" }, "name": { "type": "string" } } } },
            { "name": "cursor", "path": "/cursor/items", "params": { "limit": 60 }, "records": "items", "primary_key": ["id"],
              "paging": { "type": "cursor", "param": "cursor", "next_cursor": "/next_cursor" } },
            { "name": "link", "path": "/link/items", "params": { "per_page": 30 }, "primary_key": ["id"],
              "paging": { "type": "link_header" } },
            { "name": "offset", "path": "/offset/items", "records": "/results", "primary_key": ["id"],
              "paging": { "type": "offset", "offset_param": "offset", "limit_param": "limit", "limit": 50, "total": "/total" } },
            { "name": "owners", "path": "/owners", "records": "/owners", "primary_key": ["login"] },
            { "name": "owned", "path": "/owners/{owner}/items", "records": "/data", "primary_key": ["id"],
              "parent": { "stream": "owners", "field": "login", "as": "owner" },
              "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" } }
        ]
    })
}

async fn every_paging_style_reads_every_record_through_a_429(backend: Backend) {
    let fx = setup(backend, RestApi::new(250)).await;
    let source = fx.source(every_style()).await;

    let plan =
        json_ok(fx.srv.post("/v1/pipelines/prepare", json!({ "source_id": source })).send().await.unwrap()).await;
    let streams = plan["data"]["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 6);
    assert_eq!(streams[0]["json_schema"]["properties"]["name"]["type"], "string", "declared");
    assert!(streams[0]["json_schema"]["x-inferred"].is_null());
    let cursor = &streams[1]["json_schema"];
    assert_eq!(cursor["x-inferred"], true, "inferred, and marked so: {cursor}");
    assert_eq!(cursor["properties"]["price"]["type"], "object");
    assert_eq!(
        streams[5]["json_schema"]["properties"]["owner"]["type"], "string",
        "a child's schema from a first parent"
    );
    assert_eq!(plan["data"]["preview"]["streams"]["pages"].as_array().unwrap().len(), 5, "{}", plan["data"]["preview"]);
    assert!(plan["data"]["preview"]["streams"].get("owned").is_none(), "children are read per parent");

    // Page 3 of the first style to reach it is refused once with 429.
    fx.api.throttle_page.store(3, Ordering::SeqCst);
    let all: Vec<(&str, &str)> = ["pages", "cursor", "link", "offset", "owners", "owned"]
        .iter()
        .map(|s| (*s, "full_refresh_overwrite"))
        .collect();
    let pipeline = fx.pipeline(&source, "every.db", &all).await;
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(fx.api.throttled.load(Ordering::SeqCst), 1, "the 429 was answered and waited out");
    for stream in ["pages", "cursor", "link", "offset", "owned"] {
        assert_eq!(fx.rows("every.db", stream).await, 250, "{stream}");
        assert_eq!(job["progress"]["streams"][stream]["records"], 250, "{stream}: {job}");
    }
    assert_eq!(fx.rows("every.db", "owners").await, 3);
    assert_eq!(fx.elsewhere.hits(), 0);
}

async fn an_incremental_sync_reads_exactly_the_new_records(backend: Backend) {
    let fx = setup(backend, RestApi::new(100)).await;
    let manifest = json!({ "streams": [{
        "name": "items", "path": "/pages/items", "records": "/data", "primary_key": ["id"],
        "params": { "per_page": 25 },
        "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" },
        "incremental": { "cursor_field": "updated_at", "param": "since", "format": "rfc3339" } }] });
    let source = fx.source(manifest).await;
    // Appending: a record read twice would be a second row.
    let pipeline = fx.pipeline(&source, "inc.db", &[("items", "incremental_append")]).await;
    let records = |job: &Value| job["progress"]["streams"]["items"]["records"].as_u64().unwrap_or(0);

    let first = fx.sync(&pipeline).await;
    assert_eq!(first["status"], "succeeded", "{first}");
    assert_eq!(records(&first), 100);

    // Seven new records on one new cursor value, and an old one changed to
    // that same value.
    fx.api.add(7);
    let boundary = "2030-01-01T00:00:00Z";
    fx.api.touch(5, boundary);
    let second = fx.sync(&pipeline).await;
    assert_eq!(records(&second), 8, "{second}");

    // Nothing changed: the API answers the boundary's records again, and
    // none is read.
    let third = fx.sync(&pipeline).await;
    assert_eq!(records(&third), 0, "{third}");

    // A record changed to the boundary value after the last sync is new,
    // though its cursor equals the saved one.
    fx.api.touch(6, boundary);
    let fourth = fx.sync(&pipeline).await;
    assert_eq!(records(&fourth), 1, "{fourth}");
    assert_eq!(fx.rows("inc.db", "items").await, 109);
}

/// A stream without a declared schema is discovered once, when the user
/// prepares the pipeline: creating the pipeline asks the provider nothing
/// (it may be down then), and a sync asks for each page once, every
/// request of an incremental one with its `since`.
async fn a_discovered_catalog_is_kept_and_syncs_ask_for_no_page_twice(backend: Backend) {
    let fx = setup(backend, RestApi::new(60)).await;
    let manifest = json!({ "streams": [{
        "name": "items", "path": "/pages/items", "records": "/data", "primary_key": ["id"],
        "params": { "per_page": 25 },
        "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" },
        "incremental": { "cursor_field": "updated_at", "param": "since", "format": "rfc3339" } }] });
    let source = fx.source(manifest).await;
    let asked = || std::mem::take(&mut *fx.api.asked.lock().unwrap());
    asked();
    let prepared =
        json_ok(fx.srv.post("/v1/pipelines/prepare", json!({ "source_id": source })).send().await.unwrap()).await;
    assert_eq!(prepared["data"]["streams"][0]["name"], "items", "{prepared}");
    assert!(!asked().is_empty(), "the prepare read the first page to infer the schema");

    // Down while the pipeline is made: nothing is asked of it.
    fx.api.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let pipeline = fx.pipeline(&source, "kept.db", &[("items", "incremental_append")]).await;
    assert_eq!(asked(), Vec::<String>::new(), "creating the pipeline asked the provider");
    fx.api.down.store(false, std::sync::atomic::Ordering::SeqCst);

    let first = fx.sync(&pipeline).await;
    assert_eq!(first["status"], "succeeded", "{first}");
    let mut pages = asked();
    // Pages are asked for ahead, so they may arrive in any order.
    pages.sort();
    assert_eq!(
        pages,
        ["/pages/items?per_page=25&page=1", "/pages/items?per_page=25&page=2", "/pages/items?per_page=25&page=3"]
    );

    fx.api.add(3);
    let second = fx.sync(&pipeline).await;
    assert_eq!(second["status"], "succeeded", "{second}");
    let pages = asked();
    assert_eq!(pages.len(), 1, "{pages:?}");
    assert!(pages.iter().all(|p| p.contains("since=")), "every request of an incremental read is filtered: {pages:?}");
    assert_eq!(fx.rows("kept.db", "items").await, 63);

    // A changed configuration is discovered again (at its first use).
    let changed = json!({ "streams": [{ "name": "everything", "path": "/pages/items", "records": "/data",
        "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" } }] });
    let patched = fx
        .srv
        .request(Method::PATCH, &format!("/v1/sources/{source}"))
        .json(&json!({ "configuration": fx.configuration(changed) }))
        .send()
        .await
        .unwrap();
    assert!(patched.status().is_success(), "{}", patched.text().await.unwrap());
    let refused = fx
        .srv
        .post(
            "/v1/pipelines",
            json!({ "name": "again", "source_id": source, "destination_id": fx.destination("again.db").await,
            "streams": [{ "name": "items", "sync_mode": "full_refresh_overwrite" }] }),
        )
        .send()
        .await
        .unwrap();
    let refused = expect_error(refused, 400, "VALIDATION_FAILED").await;
    assert!(refused.to_string().contains("offers no stream items"), "the new configuration was discovered: {refused}");
}

/// A sync into a lakehouse that fails part way shows as written only what
/// a reader can see: a full refresh's rows are not, until its table
/// replaces the live one; once a sync ends, every row it committed is.
async fn a_failed_lakehouse_sync_shows_only_what_was_committed(backend: Backend) {
    let fx = setup(backend, RestApi::new(300)).await;
    let manifest = json!({ "streams": [{
        "name": "items", "path": "/pages/items", "records": "/data", "primary_key": ["id"],
        "params": { "per_page": 100 },
        "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" } }] });
    let source = fx.source(manifest).await;
    let lake =
        json!({ "name": "lake", "kind": "iceberg", "configuration": { "warehouse": "lake", "namespace": "acme" } });
    let dest = json_ok(fx.srv.post("/v1/destinations", lake).send().await.unwrap()).await;
    let body = json!({ "name": "lake", "source_id": source, "destination_id": dest["data"]["destination_id"],
        "streams": [{ "name": "items", "sync_mode": "full_refresh_overwrite" }] });
    let pipeline = json_ok(fx.srv.post("/v1/pipelines", body).send().await.unwrap()).await;
    let pipeline = pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned();
    // Pages 1 and 2 are read (and written to files), page 3 is gone.
    fx.api.missing_page.store(3, Ordering::SeqCst);
    let failed = fx.sync(&pipeline).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let items = &failed["progress"]["streams"]["items"];
    assert_eq!(items["records_read"], 200, "{failed}");
    assert_eq!(items["records"], 0, "nothing a reader can see was written: {failed}");
    assert_eq!(failed["progress"]["records"], 0, "{failed}");
    // The ledger of the last attempt: what it read is left to the retry,
    // and a staged table's snapshots are not the stream's.
    let ledger = &failed["progress"]["ledger"];
    assert_eq!(ledger["attempt"], failed["attempts"], "{failed}");
    assert_eq!(ledger["balanced"], true, "{failed}");
    let counts = &ledger["streams"]["items"];
    assert!(counts["read"] == 200 && counts["loaded"] == 0 && counts["left_to_retry"] == 200, "{failed}");
    assert!(counts.get("snapshot_ids").is_none(), "{failed}");

    fx.api.missing_page.store(0, Ordering::SeqCst);
    let done = fx.sync(&pipeline).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["progress"]["streams"]["items"]["records"], 300, "{done}");
    let counts = &done["progress"]["ledger"]["streams"]["items"];
    assert!(counts["read"] == 300 && counts["loaded"] == 300 && counts["left_to_retry"] == 0, "{done}");
    assert!(!counts["snapshot_ids"].as_array().unwrap().is_empty(), "{done}");
}

/// A stream whose API sorts by the cursor says so: its newest value is
/// saved after every page, so an append writes as it reads (a read that
/// fails part way keeps what it read, and the next resumes there), and
/// every record lands once. An API
/// that does not keep the order it claims fails the read, naming both
/// values, rather than losing a record.
async fn a_sorted_stream_is_written_as_it_is_read_and_a_broken_order_fails(backend: Backend) {
    let fx = setup(backend, RestApi::new(1000)).await;
    let manifest = json!({ "streams": [{
        "name": "items", "path": "/pages/items", "records": "/data", "primary_key": ["id"],
        "params": { "per_page": 50 },
        "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" },
        "incremental": { "cursor_field": "updated_at", "param": "since", "format": "rfc3339", "sorted": true } }] });
    let source = fx.source(manifest).await;
    let pipeline = fx.pipeline(&source, "sorted.db", &[("items", "incremental_append")]).await;
    // Page 15 is gone: the read fails for good there, and what the pages
    // before it held is stored with their state.
    fx.api.missing_page.store(15, Ordering::SeqCst);
    let failed = fx.sync(&pipeline).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["progress"]["streams"]["items"]["records"], 700, "{failed}");
    assert_eq!(fx.rows("sorted.db", "items").await, 700, "pages 1 to 14 were written as they were read");
    fx.api.missing_page.store(0, Ordering::SeqCst);
    let done = fx.sync(&pipeline).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["progress"]["streams"]["items"]["records"], 300, "the read resumed where it was cut: {done}");
    assert_eq!(fx.rows("sorted.db", "items").await, 1000);

    // Item 5 changed: the next read (since the saved value) is in order
    // again and reads it alone; a first read by id is not in order.
    fx.api.touch(5, "2030-01-01T00:00:00Z");
    let next = fx.sync(&pipeline).await;
    assert_eq!(next["progress"]["streams"]["items"]["records"], 1, "{next}");
    let again = fx.pipeline(&source, "again.db", &[("items", "incremental_append")]).await;
    let broken = fx.sync(&again).await;
    assert_eq!(broken["status"], "failed", "{broken}");
    let said = broken["error"].as_str().unwrap_or_default();
    assert!(
        said.contains("sorted by updated_at")
            && said.contains("\"2024-01-01T00:06:00Z\" comes after \"2030-01-01T00:00:00Z\""),
        "{broken}"
    );
}

async fn manifests_are_refused_at_their_json_pointer(backend: Backend) {
    let fx = setup(backend, RestApi::new(5)).await;
    let pointer = |body: &Value| body["details"]["errors"][0]["path"].as_str().unwrap_or_default().to_owned();
    let refused = |manifest: Value| async {
        let (status, body) = json(fx.create_source(manifest).await).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["code"], "CONFIGURATION_INVALID", "{body}");
        body
    };
    let body = refused(json!({ "streams": [{ "name": "a", "path": "/a", "paging": { "type": "pages" } }] })).await;
    assert_eq!(pointer(&body), "/manifest/streams/0/paging");
    let body = refused(json!({ "streams": [{ "name": "a", "path": "a" }] })).await;
    assert_eq!(pointer(&body), "/manifest/streams/0/path");
    let body = refused(json!({ "streams": [{ "name": "a", "path": "/a" }, { "name": "a", "path": "/b" }] })).await;
    assert_eq!(pointer(&body), "/manifest/streams/1/name");
    let body = refused(json!({ "streams": [{ "name": "b", "path": "/b/{x}", "parent": { "stream": "zz", "field": "id", "as": "x" } }] })).await;
    assert_eq!(pointer(&body), "/manifest/streams/0/parent/stream");
    let body =
        refused(json!({ "headers": { "Host": "api.other-data.com" }, "streams": [{ "name": "a", "path": "/a" }] }))
            .await;
    assert_eq!(pointer(&body), "/manifest/headers/Host");
    // A secret typed into the manifest is refused as anywhere else.
    let (status, body) = json(
        fx.create_source(json!({ "headers": { "Authorization": "Bearer abc" },
        "streams": [{ "name": "a", "path": "/a" }] }))
            .await,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "SECRET_NOT_ACCEPTED", "{body}");
    assert_eq!(body["details"]["field"], "configuration.manifest.headers.Authorization");

    // The base URL: https, to a host the operator allows.
    for (base_url, why) in [
        ("http://api.acme-data.com", "must be an https:// URL"),
        ("https://api.other-data.com", "not a host the operator allows"),
        ("https://10.1.2.3", "not an IP address"),
    ] {
        let body = json!({ "connector_id": "conn_rest_manifest", "name": "x",
            "configuration": { "base_url": base_url, "manifest": { "streams": [{ "name": "a", "path": "/a" }] } } });
        let (status, body) = json(fx.srv.post("/v1/sources", body).send().await.unwrap()).await;
        assert_eq!(status, 400, "{base_url}: {body}");
        assert_eq!(pointer(&body), "/base_url", "{base_url}: {body}");
        assert!(body.to_string().contains(why), "{base_url}: {body}");
        assert!(!body.to_string().contains("^https"), "a sentence, not the pattern: {body}");
    }
    // Every header that carries a credential is refused alike.
    for header in ["Authorization", "Cookie", "proxy-authorization"] {
        let (status, body) = json(
            fx.create_source(json!({ "headers": { header: "x=1" }, "streams": [{ "name": "a", "path": "/a" }] })).await,
        )
        .await;
        assert_eq!((status.as_u16(), body["code"].as_str()), (400, Some("SECRET_NOT_ACCEPTED")), "{header}: {body}");
        assert_eq!(body["details"]["field"], format!("configuration.manifest.headers.{header}"), "{body}");
    }

    // A credential stored for no connector in particular (or another) is
    // not lent to a manifest, which could ask for any path of its host.
    let other = json_ok(
        fx.srv
            .post("/v1/credentials", json!({ "hosts": [HOST], "secret": "another-token-0123456789" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let body = json!({ "connector_id": "conn_rest_manifest", "name": "x", "configuration": { "base_url": format!("https://{HOST}"),
        "credential_handle": other["data"]["credential_handle"], "manifest": { "streams": [{ "name": "a", "path": "/a" }] } } });
    let (status, body) = json(fx.srv.post("/v1/sources", body).send().await.unwrap()).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(pointer(&body), "/credential_handle", "{body}");

    // The schema is published: in the connector's spec and the description.
    let spec = json_ok(fx.srv.get("/v1/connectors/conn_rest_manifest/spec").send().await.unwrap()).await;
    assert!(spec.to_string().contains("link_header"), "{spec}");
    let doc: Value = fx.srv.get("/v1/openapi.json").send().await.unwrap().json().await.unwrap();
    let paging = &doc["components"]["schemas"]["RestManifestPaging"];
    assert_eq!(paging["oneOf"].as_array().map(Vec::len), Some(6), "{paging}");
    assert_eq!(
        doc["components"]["schemas"]["RestManifestConfiguration"]["properties"]["manifest"]["$ref"],
        "#/components/schemas/RestManifestManifest"
    );
}

/// A hostile manifest's sync fails with `expected` in its error, and no
/// request reaches the other host.
async fn fails(fx: &ManifestServer, name: &str, mut stream: Value, expected: &str) {
    // Declared, so that the failure is the sync's and not discovery's.
    stream["schema"] = json!({ "type": "object", "properties": { "id": { "type": "integer" } } });
    let source = fx.source(json!({ "streams": [stream] })).await;
    let stream = name.replace('-', "_");
    let pipeline = fx.pipeline(&source, &format!("{name}.db"), &[(stream.as_str(), "full_refresh_overwrite")]).await;
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "failed", "{name}: {job}");
    assert!(job["error"].to_string().contains(expected), "{name}: {job}");
    assert_eq!(fx.elsewhere.hits(), 0, "{name}: nothing went to the other host");
}

async fn hostile_manifests_fail_clearly_and_send_nothing_elsewhere(backend: Backend) {
    let fx = setup(backend, RestApi::new(40)).await;
    let next = |name: &str, to: &str| json!({ "name": name, "path": "/hostile/next", "params": { "next": to }, "records": "/data", "paging": { "type": "next_url", "next_url": "/next" } });
    let elsewhere = format!("https://{ELSEWHERE}/pages/items");
    fails(&fx, "other_host", next("other_host", &elsewhere), "outside https://api.acme-data.com; not followed").await;
    fails(&fx, "ip_literal", next("ip_literal", "https://127.0.0.1/pages/items"), "is at https://127.0.0.1").await;
    // The default port written out is the same origin: followed.
    let source =
        fx.source(json!({ "streams": [next("default_port", &format!("https://{HOST}:443/pages/items"))] })).await;
    let pipeline = fx.pipeline(&source, "default_port.db", &[("default_port", "full_refresh_overwrite")]).await;
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    fails(
        &fx,
        "plain_http",
        next("plain_http", "http://api.acme-data.com/pages/items"),
        "the next page is at http://api.acme-data.com/pages/items, which is no https URL",
    )
    .await;
    fails(&fx, "scheme_relative", next("scheme_relative", &format!("//{ELSEWHERE}/x")), "not followed").await;
    fails(
        &fx,
        "off_the_page",
        json!({ "name": "off_the_page", "path": "/pages/items", "records": "/items/0/rows" }),
        "the records selector /items/0/rows finds nothing (the page has fields data, meta)",
    )
    .await;
    fails(
        &fx,
        "endless",
        json!({ "name": "endless", "path": "/hostile/endless", "records": "/data", "page_limit": 12,
                "paging": { "type": "page_number", "param": "page" } }),
        "more than 12 pages; the paging does not end",
    )
    .await;
    fails(
        &fx,
        "looping",
        json!({ "name": "looping", "path": "/hostile/loop", "records": "/data", "paging": { "type": "cursor", "param": "c", "next_cursor": "/next_cursor" } }),
        "goes round in a loop",
    )
    .await;
    fails(
        &fx,
        "huge",
        json!({ "name": "huge", "path": "/hostile/huge", "records": "/data" }),
        "exceeded the host's size limit",
    )
    .await;

    // The server is unaffected: a good source still syncs.
    let source = fx
        .source(json!({ "streams": [{ "name": "fine", "path": "/offset/items", "records": "/results",
        "paging": { "type": "offset", "offset_param": "offset", "limit_param": "limit", "limit": 15 } }] }))
        .await;
    let pipeline = fx.pipeline(&source, "fine.db", &[("fine", "full_refresh_overwrite")]).await;
    assert_eq!(fx.sync(&pipeline).await["status"], "succeeded");
    assert_eq!(fx.rows("fine.db", "fine").await, 40);
}

async fn a_compressed_echo_of_the_token_never_reaches_records_or_the_job(backend: Backend) {
    let fx = setup(backend, RestApi::new(60)).await;
    // The manifest asks for gzip; the provider compresses in each coding
    // whatever it is asked, and echoes the Authorization header into
    // every record.
    let source = fx
        .source(json!({ "headers": { "Accept-Encoding": "gzip" }, "streams": [{
            "name": "items", "path": "/pages/items", "records": "/data", "primary_key": ["id"],
            "params": { "per_page": 25 },
            "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" } }] }))
        .await;
    for coding in testkit::codings::ALL {
        *fx.api.echo_compressed.lock().unwrap() = Some(coding);
        let file = format!("{coding}.db");
        let pipeline = fx.pipeline(&source, &file, &[("items", "full_refresh_overwrite")]).await;
        let job = fx.sync(&pipeline).await;
        assert_eq!(job["status"], "succeeded", "{coding}: {job}");
        assert_eq!(job["progress"]["streams"]["items"]["records"], 60, "{coding}: {job}");
        assert!(!job.to_string().contains(&fx.token), "{coding}: {job}");
        // The records hold the echo, scrubbed; no byte of the table's file
        // holds the token.
        let path = fx.srv.warehouse(&fx.srv.workspace_id().await, &file);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend(std::fs::read(path.with_extension("db-wal")).unwrap_or_default());
        assert!(memchr::memmem::find(&bytes, b"Bearer [REDACTED]").is_some(), "{coding}: the echo was loaded");
        assert!(!testkit::codings::holds(&bytes, fx.token.as_bytes()), "{coding}: the token reached the table");
    }
}

async fn a_key_in_the_query_is_set_by_the_host_and_never_reaches_records_links_or_the_job(backend: Backend) {
    let fx = setup_with(
        backend,
        RestApi::new(95).with_key_param("api_key"),
        json!({ "kind": "secret", "query_parameter": "api_key" }),
    )
    .await;
    // Link-header paging: the provider keeps the key in every link it
    // answers, so each next page the connector follows came back to it
    // redacted.
    let mut configuration = fx.configuration(json!({ "streams": [{
        "name": "items", "path": "/link/items", "params": { "per_page": 20 }, "primary_key": ["id"],
        "paging": { "type": "link_header" } }] }));
    configuration["credential_placement"] = json!("query:api_key");
    let created = json_ok(
        fx.srv
            .post(
                "/v1/sources",
                json!({ "connector_id": "conn_rest_manifest", "name": "Keyed", "configuration": configuration }),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    let source = created["data"]["source_id"].as_str().unwrap().to_owned();
    let pipeline = fx.pipeline(&source, "keyed.db", &[("items", "full_refresh_overwrite")]).await;
    let before = fx.api.asked.lock().unwrap().len();
    let job = fx.sync(&pipeline).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["progress"]["streams"]["items"]["records"], 95, "{job}");
    assert_eq!(fx.rows("keyed.db", "items").await, 95);
    // Every page went out with the key, once (the fake refuses anything
    // else), and none with the redaction the connector saw.
    let asked = fx.api.asked.lock().unwrap()[before..].to_vec();
    assert_eq!(asked.len(), 5, "{asked:?}");
    for uri in &asked {
        assert_eq!(uri.matches("api_key=").count(), 1, "{uri}");
        assert!(uri.contains(&fx.token) && !uri.contains("REDACTED"), "{uri}");
    }
    assert!(!job.to_string().contains(&fx.token), "{job}");
    let path = fx.srv.warehouse(&fx.srv.workspace_id().await, "keyed.db");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend(std::fs::read(path.with_extension("db-wal")).unwrap_or_default());
    assert!(!testkit::codings::holds(&bytes, fx.token.as_bytes()), "the key reached the table");

    // Asked for in a header instead, the same credential is refused.
    configuration["credential_placement"] = json!("header:api_key");
    let created = json_ok(
        fx.srv
            .post(
                "/v1/sources",
                json!({ "connector_id": "conn_rest_manifest", "name": "Misplaced", "configuration": configuration }),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    let misplaced = created["data"]["source_id"].as_str().unwrap().to_owned();
    let dest = fx.destination("misplaced.db").await;
    let before = fx.api.asked.lock().unwrap().len();
    let body = json!({ "name": "misplaced", "source_id": misplaced, "destination_id": dest,
        "streams": [{ "name": "items", "sync_mode": "full_refresh_overwrite" }] });
    let refused = expect_error(fx.srv.post("/v1/pipelines", body).send().await.unwrap(), 422, "EGRESS_DENIED").await;
    assert!(refused.to_string().contains("in query parameter api_key"), "{refused}");
    assert!(!refused.to_string().contains(&fx.token), "{refused}");
    assert_eq!(fx.api.asked.lock().unwrap().len(), before, "nothing went out");
}

on_both_backends!(
    a_key_in_the_query_is_set_by_the_host_and_never_reaches_records_links_or_the_job,
    a_compressed_echo_of_the_token_never_reaches_records_or_the_job,
    every_paging_style_reads_every_record_through_a_429,
    an_incremental_sync_reads_exactly_the_new_records,
    a_discovered_catalog_is_kept_and_syncs_ask_for_no_page_twice,
    a_failed_lakehouse_sync_shows_only_what_was_committed,
    a_sorted_stream_is_written_as_it_is_read_and_a_broken_order_fails,
    manifests_are_refused_at_their_json_pointer,
    hostile_manifests_fail_clearly_and_send_nothing_elsewhere,
);
