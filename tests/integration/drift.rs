//! The drift suite: thirteen ways a source drifts between two syncs, each
//! run through the bundled REST manifest source into SQLite under two data
//! contracts: everything `evolve` (the default), and everything
//! `quarantine`. A case serves six records that fit the declared schema
//! and syncs; then the provider adds six more, drifted (a column added,
//! removed or renamed, a type changed, widened or narrowed, an object
//! where a value was, a null-only column, a new enumeration value, a
//! decimal with too many places), or the user changes the pipeline (a
//! deduplicated stream's primary key, through its approval; the stream
//! taken out of the pipeline for a sync and put back); and it syncs again.
//!
//! For every case and contract the suite checks what became of every row:
//! how many the table holds, which were kept aside and why (reason and
//! field), the column an evolving table gained, and that every job's
//! ledger balances with nothing unaccounted.
//!
//! With `DRIFT_DLT_PYTHON` naming a Python with dlt 1.31 and DuckDB (the
//! benchmarks' tools, `benches/python/requirements.txt`), the same syncs
//! of the same pages also run through dlt's schema contracts (`evolve`,
//! and `discard_row` for columns and types: dlt keeps no rows aside), and
//! the suite prints both side by side (recorded in `benches/README.md`):
//!
//! ```text
//! bash tests/python/venv target/bench-python benches/python/requirements.txt
//! DRIFT_DLT_PYTHON=target/bench-python/bin/python cargo test --test integration drift -- --nocapture
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use reqwest::Method;
use serde_json::{Value, json};
use testkit::python::Script;

use crate::support::provider::{FakeProvider, TestCa};
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, json_ok};

const HOST: &str = "api.drift.test";
const PAGE_SIZE: u64 = 4;

/// The fake provider: each stream's records in cursor pages (`data`,
/// `next_cursor`), behind a bearer token; `since` keeps the records
/// updated strictly after it.
struct Provider {
    token: String,
    streams: Mutex<HashMap<String, Arc<Vec<Value>>>>,
}

fn routes(p: Arc<Provider>) -> Router {
    Router::new()
        .route(
            "/{stream}",
            get(
                |State(p): State<Arc<Provider>>,
                 Path(stream): Path<String>,
                 h: HeaderMap,
                 Query(q): Query<HashMap<String, String>>| async move {
                    if h.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {}", p.token)) {
                        return StatusCode::UNAUTHORIZED.into_response();
                    }
                    let Some(all) = p.streams.lock().unwrap().get(&stream).cloned() else {
                        return StatusCode::NOT_FOUND.into_response();
                    };
                    // The times are all written alike: as text they sort in time.
                    let since = q.get("since");
                    let records: Vec<&Value> = all
                        .iter()
                        .filter(|r| since.is_none_or(|s| r["updated_at"].as_str().is_some_and(|u| u > s.as_str())))
                        .collect();
                    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(100);
                    let start: usize = q.get("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
                    let end = (start + limit).min(records.len());
                    let next = if end < records.len() { json!(end.to_string()) } else { Value::Null };
                    axum::Json(json!({ "data": records[start.min(end)..end], "next_cursor": next })).into_response()
                },
            ),
        )
        .with_state(p)
}

/// The schema both streams declare.
fn schema() -> Value {
    json!({ "type": "object", "required": ["id"], "properties": {
        "id": { "type": "integer" },
        "updated_at": { "type": "string", "format": "date-time" },
        "kind": { "type": "string", "enum": ["open", "click"] },
        "label": { "type": ["string", "null"] },
        "count": { "type": ["integer", "null"] },
        "score": { "type": ["number", "null"] },
        "amount": { "type": ["string", "number", "null"], "format": "decimal", "precision": 10, "scale": 2 },
        "note": { "type": ["string", "null"] }
    } })
}

/// The same schema as dlt's column hints.
fn dlt_columns() -> Value {
    json!({
        "id": { "data_type": "bigint", "nullable": false },
        "updated_at": { "data_type": "timestamp" },
        "kind": { "data_type": "text" },
        "label": { "data_type": "text" },
        "count": { "data_type": "bigint" },
        "score": { "data_type": "double" },
        "amount": { "data_type": "decimal", "precision": 10, "scale": 2 },
        "note": { "data_type": "text" }
    })
}

/// Record `i` as it fits the schema.
fn fitting(i: u64) -> Value {
    json!({ "id": i, "updated_at": format!("2026-01-01T00:00:{i:02}Z"), "kind": "open", "label": format!("l{i}"),
        "count": i, "score": i as f64 + 0.5, "amount": "12.50", "note": "n" })
}

/// Record `i` with `field` set to `value`.
fn with(i: u64, field: &str, value: Value) -> Value {
    let mut r = fitting(i);
    r[field] = value;
    r
}

/// Record `i` without `field`.
fn without(i: u64, field: &str) -> Value {
    let mut r = fitting(i);
    r.as_object_mut().unwrap().remove(field);
    r
}

/// What the user changes between the two syncs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Nothing,
    /// The deduplicated stream's primary key, from `id` to `id` and
    /// `kind` (an approval).
    Rekey,
    /// The stream out of the pipeline for a sync, then back.
    StreamGap,
}

struct Case {
    name: &'static str,
    /// The record the provider adds as `i` (7 to 12) before the second
    /// sync.
    drifted: fn(u64) -> Value,
    /// The reason and field a quarantining contract keeps those records
    /// aside for (`None`: they fit).
    breach: Option<(&'static str, &'static str)>,
    /// The column an evolving table gains.
    gains: Option<&'static str>,
    change: Change,
}

fn cases() -> Vec<Case> {
    let case =
        |name: &'static str,
         drifted: fn(u64) -> Value,
         breach: Option<(&'static str, &'static str)>,
         gains: Option<&'static str>| Case { name, drifted, breach, gains, change: Change::Nothing };
    vec![
        case(
            "column added",
            |i| with(i, "coupon", json!(format!("SAVE{i}"))),
            Some(("new_column", "/coupon")),
            Some("coupon"),
        ),
        case("column removed", |i| without(i, "note"), None, None),
        case(
            "column renamed",
            |i| {
                let mut r = without(i, "note");
                r["remark"] = json!("n");
                r
            },
            Some(("new_column", "/remark")),
            Some("remark"),
        ),
        case("int to string", |i| with(i, "count", json!(i.to_string())), Some(("type_mismatch", "/count")), None),
        case("string to int", |i| with(i, "label", json!(i)), Some(("type_mismatch", "/label")), None),
        case("widened number", |i| with(i, "count", json!(i as f64 + 0.25)), Some(("type_mismatch", "/count")), None),
        case("narrowed number", |i| with(i, "score", json!(i)), None, None),
        case(
            "nested object appears",
            |i| with(i, "label", json!({ "en": format!("l{i}"), "fr": format!("é{i}") })),
            Some(("type_mismatch", "/label")),
            None,
        ),
        case("null-only column", |i| with(i, "deleted_at", Value::Null), Some(("new_column", "/deleted_at")), None),
        Case {
            name: "primary key changed",
            // Records 3 to 8 again, now clicks, read after the key became
            // (id, kind).
            drifted: |i| {
                let mut r = with(i - 4, "kind", json!("click"));
                r["updated_at"] = json!(format!("2026-01-01T00:00:{i:02}Z"));
                r
            },
            breach: None,
            gains: None,
            change: Change::Rekey,
        },
        Case {
            name: "stream removed and added back",
            drifted: fitting,
            breach: None,
            gains: None,
            change: Change::StreamGap,
        },
        case("new enum value", |i| with(i, "kind", json!("bounce")), Some(("not_in_enum", "/kind")), None),
        case(
            "decimal with too many places",
            |i| with(i, "amount", json!(format!("12.{i:02}5"))),
            Some(("decimal_out_of_range", "/amount")),
            None,
        ),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contract {
    Evolve,
    Quarantine,
}

impl Contract {
    fn rules(self) -> Value {
        let mode = match self {
            Contract::Evolve => "evolve",
            Contract::Quarantine => "quarantine",
        };
        json!({ "new_columns": mode, "type_changes": mode, "invalid_records": mode })
    }

    fn dlt(self) -> &'static str {
        match self {
            Contract::Evolve => "evolve",
            Contract::Quarantine => "strict",
        }
    }
}

/// dlt, run by `DRIFT_DLT_PYTHON` over the same provider.
struct Dlt {
    script: Script,
    dir: tempfile::TempDir,
}

impl Dlt {
    async fn start(provider: &FakeProvider, ca: &TestCa) -> Option<Dlt> {
        let python = PathBuf::from(std::env::var_os("DRIFT_DLT_PYTHON")?);
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &ca.pem).unwrap();
        let port = provider.addr.port().to_string();
        let script = crate::support::python_script("dlt_drift.py");
        let script = Script::start(&python, &script, &[HOST, &port, ca_file.to_str().unwrap()]).await;
        assert_eq!(script.started["ready"], true, "{}", script.started);
        Some(Dlt { script, dir })
    }

    /// One sync of `streams` (names) by the pipeline `name`: what dlt
    /// made of each stream.
    async fn sync(
        &mut self,
        name: &str,
        token: &str,
        contract: Contract,
        streams: &[&str],
        key: &[&str],
        dedup: bool,
    ) -> Value {
        let streams: Vec<Value> = streams
            .iter()
            .map(|s| {
                json!({ "name": s, "path": format!("/{s}"), "primary_key": key,
                    "write_disposition": if dedup { "merge" } else { "append" }, "columns": dlt_columns() })
            })
            .collect();
        let command = json!({ "dir": self.dir.path(), "pipeline": name, "token": token, "page_size": PAGE_SIZE,
            "contract": contract.dlt(), "streams": streams });
        self.script.ask(&command).await
    }
}

/// What became of the drifted records, said in a few words.
fn ours_said(rows: i64, aside: usize, why: &str, gained: Option<&str>) -> String {
    let mut said = format!("{rows} rows");
    if let Some(column) = gained {
        said.push_str(&format!(" (+{column})"));
    }
    if aside > 0 {
        said.push_str(&format!(", {aside} aside ({why})"));
    }
    said
}

/// Whether a value loaded holds what was read: the same number (a
/// number's text included), instant, text or object (as JSON text
/// included); a field the record lacked loads as null.
fn holds(loaded: &Value, read: Option<&Value>) -> bool {
    let number = |v: &Value| match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse::<f64>().ok(),
        _ => None,
    };
    let instant = |v: &Value| v.as_str().and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
    let parsed = |v: &Value| match v {
        Value::String(s) => serde_json::from_str::<Value>(s).ok().filter(|p| p.is_object() || p.is_array()),
        _ => None,
    };
    let Some(read) = read.filter(|r| !r.is_null()) else { return loaded.is_null() };
    if let (Some(a), Some(b)) = (number(loaded), number(read)) {
        return a == b;
    }
    if let (Some(a), Some(b)) = (instant(loaded), instant(read)) {
        return a == b;
    }
    loaded == read || parsed(loaded).as_ref() == Some(read)
}

/// How many rows (each a table row's declared fields) hold a value other
/// than the record read with their key (`id`, or `id` and `kind`).
fn altered(rows: &[Value], served: &[Value], key: &[&str]) -> usize {
    let key_of = |r: &Value| key.iter().map(|k| number_or_text(&r[*k])).collect::<Vec<_>>();
    rows.iter()
        .filter(|row| {
            let Some(read) = served.iter().rev().find(|r| key_of(r) == key_of(row)) else { return true };
            row.as_object().unwrap().iter().any(|(field, loaded)| !holds(loaded, read.get(field)))
        })
        .count()
}

fn number_or_text(v: &Value) -> String {
    v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())
}

fn dlt_said(answer: &Value, served: &[Value], key: &[&str]) -> String {
    if let Some(error) = answer["error"].as_str() {
        return format!("failed: {error}");
    }
    let events = &answer["streams"]["events"];
    let declared: Vec<String> = dlt_columns().as_object().unwrap().keys().cloned().collect();
    let added: Vec<&str> = events["columns"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|c| !declared.iter().any(|d| d == c))
        .collect();
    let mut said = format!("{} rows", events["rows"]);
    if !added.is_empty() {
        said.push_str(&format!(" (+{})", added.join(", +")));
    }
    let dropped = events["read"].as_i64().unwrap_or(0) - events["kept"].as_i64().unwrap_or(0);
    if dropped > 0 {
        said.push_str(&format!(", {dropped} dropped"));
    }
    let changed = altered(events["values"].as_array().map(Vec::as_slice).unwrap_or_default(), served, key);
    if changed > 0 {
        said.push_str(&format!(", {changed} with values changed"));
    }
    said
}

struct Suite {
    srv: TestServer,
    provider: Arc<Provider>,
    handle: String,
    workspace: String,
    dlt: Option<Dlt>,
    _fake: FakeProvider,
}

impl Suite {
    async fn start() -> Suite {
        let ca = TestCa::new();
        let token = format!("drift-{}", uuid::Uuid::new_v4().simple());
        let provider = Arc::new(Provider { token: token.clone(), streams: Mutex::default() });
        let fake = FakeProvider::start(&ca, &[HOST], routes(provider.clone())).await;
        let trust = Trust::new(&ca).serving(&fake, &[HOST]);
        let srv = TestServer::start_with(Backend::Sqlite, |c| c.plugins.egress = trust.policy()).await.unwrap();
        let body = json!({ "connector_id": "conn_rest_manifest", "hosts": [HOST], "secret": token });
        let cred = json_ok(srv.post("/v1/credentials", body).send().await.unwrap()).await;
        let handle = cred["data"]["credential_handle"].as_str().unwrap().to_owned();
        let workspace = srv.workspace_id().await;
        let dlt = Dlt::start(&fake, &ca).await;
        Suite { srv, provider, handle, workspace, dlt, _fake: fake }
    }

    fn serve(&self, events: Vec<Value>) {
        let mut streams = self.provider.streams.lock().unwrap();
        streams.insert("events".to_owned(), Arc::new(events));
        streams.insert("users".to_owned(), Arc::new((1..=3).map(fitting).collect()));
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        json_ok(self.srv.post(path, body).send().await.unwrap()).await
    }

    /// One sync of the pipeline; every stream of its ledger balances.
    async fn sync(&self, pipeline: &str, what: &str) -> Value {
        let job = self.post(&format!("/v1/pipelines/{pipeline}/sync"), json!({})).await;
        let job = self.srv.wait_job(job["data"]["job_id"].as_str().unwrap()).await;
        assert_eq!(job["status"], "succeeded", "{what}: {job}");
        let ledger = &job["progress"]["ledger"];
        assert_eq!(ledger["balanced"], true, "{what}: {ledger}");
        for (name, s) in ledger["streams"].as_object().unwrap() {
            assert_eq!(s["unaccounted"], 0, "{what}: stream {name}: {ledger}");
        }
        job
    }

    /// Runs `case` under `contract`, checks what became of every row, and
    /// says it (ours, and dlt's when it runs).
    async fn run(&mut self, n: usize, case: &Case, contract: Contract) -> (String, Option<String>) {
        let what = format!("{} under {contract:?}", case.name);
        let dedup = case.change == Change::Rekey;
        let mode = if dedup { "incremental_deduped" } else { "incremental_append" };
        let stream = |name: &str, key: &[&str]| {
            let mut s = json!({ "name": name, "sync_mode": mode, "contract": contract.rules() });
            if dedup {
                s["primary_key"] = json!(key);
            }
            s
        };
        let manifest_stream = |name: &str| {
            json!({ "name": name, "path": format!("/{name}"), "records": "/data", "primary_key": ["id"],
                "params": { "limit": PAGE_SIZE },
                "paging": { "type": "cursor", "param": "cursor", "next_cursor": "/next_cursor" },
                "incremental": { "cursor_field": "updated_at", "param": "since" }, "schema": schema() })
        };
        let manifest = json!({ "streams": [manifest_stream("events"), manifest_stream("users")] });
        let source = self
            .post(
                "/v1/sources",
                json!({ "connector_id": "conn_rest_manifest", "name": format!("drift {n}"), "configuration": {
                "base_url": format!("https://{HOST}"), "credential_handle": self.handle, "manifest": manifest } }),
            )
            .await;
        let file = format!("drift-{n}-{contract:?}.db");
        let dest = self
            .post("/v1/destinations", json!({ "name": file, "kind": "sqlite", "configuration": { "file": file } }))
            .await;
        let both = json!([stream("events", &["id"]), stream("users", &["id"])]);
        let pipeline = self
            .post(
                "/v1/pipelines",
                json!({ "name": file, "source_id": source["data"]["source_id"],
                "destination_id": dest["data"]["destination_id"], "streams": both }),
            )
            .await;
        let pipeline = pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned();
        let dlt_name = format!("drift_{n}_{}", contract.dlt());
        let token = self.provider.token.clone();

        // The first sync: six records that fit.
        self.serve((1..=6).map(fitting).collect());
        self.sync(&pipeline, &format!("{what}, the first sync")).await;
        if let Some(dlt) = &mut self.dlt {
            let first = dlt.sync(&dlt_name, &token, contract, &["events", "users"], &["id"], dedup).await;
            assert_eq!(first["error"], Value::Null, "{what}: dlt's first sync: {first}");
        }

        // The drift, and the user's change.
        self.serve((1..=6).map(fitting).chain((7..=12).map(case.drifted)).collect());
        let mut key = vec!["id"];
        let patch = |streams: Value| {
            self.srv
                .request(Method::PATCH, &format!("/v1/pipelines/{pipeline}"))
                .json(&json!({ "streams": streams }))
                .send()
        };
        match case.change {
            Change::Nothing => {}
            Change::Rekey => {
                key = vec!["id", "kind"];
                let proposed = patch(json!([stream("events", &key), stream("users", &["id"])])).await.unwrap();
                assert_eq!(proposed.status(), StatusCode::ACCEPTED, "{what}: a rekey is proposed");
                let proposed = json_ok(proposed).await;
                let approval = proposed["data"]["approval"]["approval_id"].as_str().unwrap();
                let approve = self.srv.request_as(
                    &self.srv.approver_token,
                    Method::POST,
                    &format!("/v1/approvals/{approval}/approve"),
                );
                assert!(approve.send().await.unwrap().status().is_success(), "{what}: approved");
            }
            Change::StreamGap => {
                let users_only = patch(json!([stream("users", &["id"])])).await.unwrap();
                assert_eq!(users_only.status(), StatusCode::OK, "{what}");
                let gap = self.sync(&pipeline, &format!("{what}, the sync without the stream")).await;
                assert!(gap["progress"]["ledger"]["streams"].get("events").is_none(), "{what}: {gap}");
                if let Some(dlt) = &mut self.dlt {
                    let gap = dlt.sync(&dlt_name, &token, contract, &["users"], &key, dedup).await;
                    assert_eq!(gap["error"], Value::Null, "{what}: dlt's sync without the stream: {gap}");
                }
                assert_eq!(patch(both.clone()).await.unwrap().status(), StatusCode::OK, "{what}");
            }
        }

        // The second sync reads the six new records.
        let job = self.sync(&pipeline, &format!("{what}, the second sync")).await;
        let events = &job["progress"]["ledger"]["streams"]["events"];
        assert_eq!(events["read"], 6, "{what}: only the new records are read: {events}");
        let quarantined = contract == Contract::Quarantine && case.breach.is_some();
        let (loaded, aside) = if quarantined { (0, 6) } else { (6, 0) };
        assert_eq!((&events["loaded"], &events["quarantined"]), (&json!(loaded), &json!(aside)), "{what}: {events}");

        // What the table holds, and what was kept aside.
        let db = self.srv.warehouse(&self.workspace, &file);
        let url = format!("sqlite://{}?mode=ro", db.display());
        let rows = crate::support::count_rows(&url, "events").await;
        assert_eq!(rows, 6 + loaded, "{what}: every record that loads is a row");
        let rejected = json_ok(
            self.srv.get(&format!("/v1/pipelines/{pipeline}/rejected?stream=events&limit=100")).send().await.unwrap(),
        )
        .await;
        let items = rejected["data"]["items"].as_array().unwrap();
        assert_eq!(items.len() as i64, aside, "{what}: {rejected}");
        let mut why = String::new();
        if let Some((reason, pointer)) = case.breach.filter(|_| quarantined) {
            for item in items {
                assert_eq!(
                    (item["reason"].as_str(), item["pointer"].as_str()),
                    (Some(reason), Some(pointer)),
                    "{what}"
                );
                let read: Value = item["record"].clone();
                let id = read["id"].as_u64().unwrap();
                assert_eq!(read, (case.drifted)(id), "{what}: kept as read");
            }
            why = format!("{reason} {pointer}");
        }
        let gained = match (contract, case.gains) {
            (Contract::Evolve, Some(column)) => {
                assert!(columns(&url, "events").await.iter().any(|c| c == column), "{what}: the table gains {column}");
                Some(column)
            }
            _ => None,
        };
        if case.change == Change::Rekey {
            // Records 3 to 6 as clicks are rows of their own under the
            // new key, beside the opens read under the old one.
            let clicks = count_where(&url, "events", "kind = 'click'").await;
            assert_eq!(clicks, 6, "{what}");
        }
        // Every row holds the values read.
        let served: Vec<Value> = (1..=6).map(fitting).chain((7..=12).map(case.drifted)).collect();
        let held = declared_fields(&url, "events").await;
        assert_eq!(altered(&held, &served, &key), 0, "{what}: a value changed on its way in: {held:?}");
        let ours = ours_said(rows, aside as usize, &why, gained);

        let theirs = match &mut self.dlt {
            Some(dlt) => {
                let answer = dlt.sync(&dlt_name, &token, contract, &["events", "users"], &key, dedup).await;
                Some(dlt_said(&answer, &served, &key))
            }
            None => None,
        };
        (ours, theirs)
    }
}

/// The columns of a table of an SQLite destination.
async fn columns(url: &str, table: &str) -> Vec<String> {
    use sqlx::{Connection, Row};
    let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
    let sql = format!("SELECT name FROM pragma_table_info('{table}')");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(&mut c).await.unwrap();
    rows.iter().map(|r| r.get::<String, _>("name")).collect()
}

/// Each row of a table of an SQLite destination, as an object of the
/// fields the schema declares.
async fn declared_fields(url: &str, table: &str) -> Vec<Value> {
    use sqlx::Connection;
    let present = columns(url, table).await;
    let declared: Vec<String> = schema()["properties"].as_object().unwrap().keys().cloned().collect();
    let pairs: Vec<String> =
        declared.iter().filter(|d| present.contains(d)).map(|d| format!("'{d}', \"{d}\"")).collect();
    let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
    let sql = format!("SELECT json_object({}) FROM \"{table}\"", pairs.join(", "));
    let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_all(&mut c).await.unwrap();
    rows.iter().map(|r| serde_json::from_str(r).unwrap()).collect()
}

/// The rows of a table of an SQLite destination that meet `condition`.
async fn count_where(url: &str, table: &str, condition: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
    let sql = format!("SELECT COUNT(*) FROM \"{table}\" WHERE {condition}");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_one(&mut c).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_drift_is_accounted_for_row_by_row() {
    let mut suite = Suite::start().await;
    let mut table = vec![
        "| case | ours, evolve | ours, quarantine | dlt, evolve | dlt, discard_row |".to_owned(),
        "|---|---|---|---|---|".to_owned(),
    ];
    for (n, case) in cases().iter().enumerate() {
        let (evolve, dlt_evolve) = suite.run(n, case, Contract::Evolve).await;
        let (quarantine, dlt_strict) = suite.run(n, case, Contract::Quarantine).await;
        let dlt = |said: Option<String>| said.unwrap_or_else(|| "not run".to_owned());
        table.push(format!("| {} | {evolve} | {quarantine} | {} | {} |", case.name, dlt(dlt_evolve), dlt(dlt_strict)));
    }
    println!("{}", table.join("\n"));
    suite.srv.stop().await;
}
