//! End-to-end sync as a user meets it: the server's real router on a
//! loopback port, `POST /v1/pipelines/{id}/sync` to the job's end (polled
//! with `GET /v1/jobs/{id}`), each bundled connector reading
//! `BENCH_RECORDS` (100,000) records of about 1 KB over HTTPS, 100 per page
//! as the connectors ask, from an in-process server answering pre-rendered
//! pages (no JSON is built per request), into an SQLite destination and,
//! when `BENCH_POSTGRES_URL` names a database, a PostgreSQL one:
//!
//! | connector | stream | provider | credential |
//! |---|---|---|---|
//! | email-campaign | `campaigns` | Mailcoach pages (`page`, `meta.last_page`) | API token |
//! | social-media | `posts` | HubSpot broadcasts (`count`, `offset`) | OAuth, through the API's flow |
//! | REST manifest | `campaigns` | the same Mailcoach pages, described by a manifest | API token, bound to the host |
//! | Airbyte manifest | `campaigns` | the same Mailcoach pages, described by an Airbyte declarative manifest | API token, bound to the host |
//!
//! The manifest source reads what the email-campaign connector reads: its
//! rate beside the compiled connector's is what describing an API instead
//! of compiling a connector for it costs.
//!
//! Each pipeline takes turns with its native baseline: the same pages over
//! the same HTTPS, each provider record passed through as it is into the
//! same destination through the same writer, with no plugin, API or job
//! runner. The share the connector reaches of it is what being a plugin
//! and the connector's own per-record work (parsing, reshaping) cost.
//!
//! Run with `cargo bench -p service --bench connector_sync`. Each pipeline
//! (connector and destination) gets `BENCH_ROUNDS` (5) rounds, taking
//! turns; the summary is the median. `BENCH_CONNECTORS` (`email,social`)
//! picks connectors. `BENCH_JSONL=1` adds a JSONL export destination,
//! whose writing is light (lines appended, one data sync per batch): when
//! a connector goes no faster into it than into SQLite, the read side is
//! the limit. `BENCH_ICEBERG=1` adds an Iceberg table on the local
//! filesystem (typed columns from the stream's schema, Parquet files);
//! `BENCH_ICEBERG_S3_PYTHON`, a Python with `tests/python/requirements.txt`
//! installed, adds one in a bucket of moto's S3 (a Python server, started
//! by `tests/python/moto_s3.py`) behind an HTTPS front; `BENCH_ICEBERG_S3S`,
//! the path of an `s3s-fs` binary (an S3 API in Rust over a folder, from
//! crates.io), one in a bucket of it, a store quick enough not to be the
//! limit. `BENCH_ICEBERG_PARTITIONED=1` adds each of those tables again,
//! partitioned by the day of a campaign's `sent_at` (28 days, in every
//! batch). `BENCH_STANDALONE=1` serves the API from a `service serve`
//! process of its own instead of this process's router: its CPU is
//! counted with the benchmark's, and the peak memory shown is the
//! server's alone.
//! `BENCH_AIRBYTE_PYTHON`, a Python with Airbyte's CDK installed (the tests
//! install one in `target/tmp/airbyte-cdk`), reads the Airbyte manifest
//! with the CDK too, as Airbyte runs a source (its entrypoint's `read`,
//! every message serialised), from the same provider over the same HTTPS,
//! and prints the Airbyte manifest source's rate as a multiple of it.
//! `BENCH_DLT_PYTHON`, a Python with `benches/python/requirements.txt`
//! installed, adds dlt as a peer: the same campaign pages, read from
//! files (no HTTP: in dlt's favour), loaded into Parquet files by its
//! filesystem destination. `BENCH_PROVIDER_DELAY_MS` makes the provider wait
//! that long before each list page, as one across a network does; the
//! bench then prints the best a read one page at a time could do, which
//! reading ahead must beat. Each round also fetches every page alone
//! (three at a time, as the email-campaign connector reads; bodies read
//! whole but not parsed): the rate that the provider and TLS at both ends allow
//! on this machine when nothing else runs, the ceiling every sync here
//! shares. Nothing asserts the figures; benches/README.md
//! keeps them. The CPU seconds of the whole process (provider included)
//! are reported beside the wall-clock rate, and where the PostgreSQL
//! server runs on this machine, its CPU seconds over each run too (the
//! machine's cores are all a sync here has, the database's work
//! included), then what it does after the run until it is idle, which
//! it finishes before the next run starts (work it starts later, such
//! as autovacuum on its own schedule, is not waited for).

use testkit::hubspot;
use testkit::objectstore::MotoS3;
use testkit::provider;
mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::Query;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use serde_json::{Value, json};
use service::config::oauth::OAuthSettings;
use service::egress::EgressPolicy;
use service::store::kinds::DestinationKind;
use service::warehouse::DestinationConfig;
use service::warehouse::config::Lakehouse;
use service::warehouse::iceberg::s3::ObjectStore;

const MAIL_HOST: &str = "mail.acme-corp.com";
const HUB_HOST: &str = "api.hubapi.com";
const PER_PAGE: usize = 100;
const PROVIDER_TOKEN: &str = "bench-provider-token-0123456789";
const SOCIAL: &str = "conn_socialmedia_hub";
/// The selected channels, both of brand 101 in the fake provider.
const CHANNELS: [&str; 2] = ["ch-retail-fb", "ch-retail-li"];

/// The manifest that describes the Mailcoach campaign list: the same pages
/// the email-campaign connector reads.
fn campaigns_manifest() -> Value {
    json!({ "streams": [{
        "name": "campaigns", "path": "/api/campaigns", "records": "/data", "primary_key": ["uuid"],
        "params": { "per_page": PER_PAGE },
        "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/last_page" }
    }] })
}

/// The same campaign list as an Airbyte declarative manifest, as its
/// authors write one: a bearer token, the records at `data`, the next
/// page from the page's own counters.
fn campaigns_airbyte_manifest() -> Value {
    json!({
        "version": "6.0.0",
        "type": "DeclarativeSource",
        "check": { "type": "CheckStream", "stream_names": ["campaigns"] },
        "streams": [{
            "type": "DeclarativeStream", "name": "campaigns", "primary_key": ["uuid"],
            "schema_loader": { "type": "InlineSchemaLoader", "schema": { "type": "object", "properties": {} } },
            "retriever": {
                "type": "SimpleRetriever",
                "requester": {
                    "type": "HttpRequester", "url_base": format!("https://{MAIL_HOST}/api"), "path": "/campaigns",
                    "http_method": "GET", "request_parameters": { "per_page": PER_PAGE.to_string() },
                    "authenticator": { "type": "BearerAuthenticator", "api_token": "{{ config['api_token'] }}" }
                },
                "record_selector": { "type": "RecordSelector",
                    "extractor": { "type": "DpathExtractor", "field_path": ["data"] } },
                "paginator": {
                    "type": "DefaultPaginator",
                    "page_token_option": { "type": "RequestOption", "inject_into": "request_parameter", "field_name": "page" },
                    "pagination_strategy": { "type": "CursorPagination",
                        "cursor_value": "{{ response.meta.current_page + 1 }}",
                        "stop_condition": "{{ response.meta.current_page >= response.meta.last_page }}" }
                }
            }
        }],
        "spec": { "type": "Spec", "connection_specification": { "type": "object", "required": ["api_token"],
            "properties": { "api_token": { "type": "string", "airbyte_secret": true } } } }
    })
}

/// One campaign of about 1 KB, as Mailcoach lists it.
fn campaign(i: usize) -> Value {
    let sent = 1000 + i as u64 * 10;
    json!({
        "uuid": format!("00000000-0000-4000-8000-{i:012}"),
        "name": format!("Newsletter {i}"),
        "email_list_uuid": "10000000-0000-4000-8000-000000000001",
        "status": "sent",
        "subject": format!("Issue {i}: what changed this week"),
        "from_email": "news@acme-corp.com",
        "html": format!("<html><body>{}</body></html>", "campaign body text ".repeat(24)),
        "sent_to_number_of_subscribers": sent,
        "open_count": sent / 2,
        "unique_open_count": sent / 3,
        "click_count": sent / 10,
        "unique_click_count": sent / 12,
        "unsubscribe_count": 3,
        "bounce_count": 20,
        "open_rate": 3333,
        "click_rate": 833,
        "unsubscribe_rate": 30,
        "bounce_rate": 200,
        "sent_at": format!("2024-03-{:02}T09:00:00.000000Z", 1 + i % 28),
        "created_at": "2024-02-01T09:00:00.000000Z",
        "updated_at": format!("2024-03-{:02}T10:00:00.000000Z", 1 + i % 28),
    })
}

/// Every page of the campaign list, rendered once; and the record size.
fn campaign_pages(records: usize) -> (Arc<Vec<Bytes>>, usize) {
    let last = records.div_ceil(PER_PAGE).max(1);
    let size = campaign(0).to_string().len();
    let pages = (1..=last)
        .map(|p| {
            let data: Vec<Value> = ((p - 1) * PER_PAGE..(p * PER_PAGE).min(records)).map(campaign).collect();
            let link = |n: usize| json!(format!("https://{MAIL_HOST}/api/campaigns?page={n}"));
            let body = json!({
                "data": data,
                "links": { "first": link(1), "last": link(last), "prev": if p > 1 { link(p - 1) } else { Value::Null }, "next": if p < last { link(p + 1) } else { Value::Null } },
                "meta": { "current_page": p, "last_page": last, "per_page": PER_PAGE, "total": records }
            });
            Bytes::from(body.to_string())
        })
        .collect();
    (Arc::new(pages), size)
}

/// The `i`th newest of `records` published posts, about 1 KB as HubSpot
/// lists a broadcast, alternating between the selected channels.
fn broadcast(i: usize, records: usize) -> Value {
    let channel = CHANNELS[i % CHANNELS.len()];
    let created = 1_700_000_000_000_i64 + (records - i) as i64 * 60_000;
    json!({
        "broadcastGuid": format!("bc-{channel}-{created}"), "channelGuid": channel, "channelKey": format!("FacebookPage:{channel}"),
        "portalId": hubspot::PORTAL, "status": "SUCCESS", "createdAt": created, "triggerAt": created + 500, "finishedAt": created + 900,
        "content": { "body": format!("Post {i}: {}", "what our stores carry this season, and why ".repeat(16)), "linkUrl": "https://acme.example/p" },
        "message": null, "clicks": i % 97,
        "interactionCounts": { "impressions": i % 970, "likes": i % 7, "comments": i % 3 },
        "createdBy": 123456, "campaignGuid": "internal-campaign"
    })
}

/// Every page of the broadcasts listing (newest first, `PER_PAGE` each,
/// a bare array as HubSpot answers), rendered once; and the record size.
fn broadcast_pages(records: usize) -> (Arc<Vec<Bytes>>, usize) {
    let size = broadcast(0, records).to_string().len();
    let pages = (0..records.div_ceil(PER_PAGE))
        .map(|p| {
            let page: Vec<Value> =
                (p * PER_PAGE..((p + 1) * PER_PAGE).min(records)).map(|i| broadcast(i, records)).collect();
            Bytes::from(Value::Array(page).to_string())
        })
        .collect();
    (Arc::new(pages), size)
}

/// The provider's wait before an answer, if it has one. A zero sleep is
/// not free in tokio: its deadline is rounded up to the timer's next
/// millisecond, so `sleep(0)` before every page held each request about a
/// millisecond and made the provider, not the sync, set the pace.
async fn wait(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// Both providers on one HTTPS server (their paths do not overlap), each
/// list page answered after `delay` (a provider across a network).
fn router(
    hub: Arc<hubspot::Hub>,
    campaigns: Arc<Vec<Bytes>>,
    broadcasts: Arc<Vec<Bytes>>,
    delay: Duration,
) -> axum::Router {
    type Q = Query<HashMap<String, String>>;
    let json_body = |body: Bytes| ([("content-type", "application/json")], body).into_response();
    let mailcoach = axum::Router::new().route(
        "/api/campaigns",
        axum::routing::get(move |headers: HeaderMap, Query(q): Q| {
            let pages = campaigns.clone();
            async move {
                if headers.get("authorization").and_then(|v| v.to_str().ok())
                    != Some(&format!("Bearer {PROVIDER_TOKEN}"))
                {
                    return (axum::http::StatusCode::UNAUTHORIZED, "{\"message\":\"Unauthenticated.\"}")
                        .into_response();
                }
                wait(delay).await;
                let n: usize = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(1).max(1);
                json_body(pages.get(n - 1).cloned().unwrap_or_else(|| Bytes::from_static(b"{\"data\":[],\"meta\":{}}")))
            }
        }),
    );
    let listing = hub.clone();
    let hubspot = hubspot::account_router(hub).route(
        "/broadcast/v1/broadcasts",
        axum::routing::get(move |headers: HeaderMap, Query(q): Q| {
            let (hub, pages) = (listing.clone(), broadcasts.clone());
            async move {
                if let Some(refused) = hub.refuse(&headers) {
                    return refused;
                }
                wait(delay).await;
                let number = |name: &str| q.get(name).and_then(|v| v.parse::<usize>().ok());
                // Pages are rendered for one page size; any other request
                // would get a wrong answer, so it gets none.
                match (number("count"), number("offset").unwrap_or(0), q.contains_key("since")) {
                    (Some(PER_PAGE), offset, false) if offset % PER_PAGE == 0 => {
                        json_body(pages.get(offset / PER_PAGE).cloned().unwrap_or_else(|| Bytes::from_static(b"[]")))
                    }
                    _ => {
                        (axum::http::StatusCode::BAD_REQUEST, format!("the benchmark's provider has no page for {q:?}"))
                            .into_response()
                    }
                }
            }
        }),
    );
    mailcoach.merge(hubspot)
}

/// The PostgreSQL server of `BENCH_POSTGRES_URL` when it runs on this
/// machine: its CPU is work a sync into it costs the machine that the
/// benchmark's own process does not show. It is the parent of the backend
/// that answers a connection, once that backend is proved to be this
/// connection's (its start time is the one the server reports): a server
/// elsewhere, or in another pid namespace, is not counted rather than
/// mistaken for a local one. Its every database and client counts.
struct LocalPostgres {
    postmaster: String,
}

impl LocalPostgres {
    async fn find(url: &str) -> Option<LocalPostgres> {
        let pool = sqlx::PgPool::connect(url).await.ok()?;
        let found: Option<(i32, f64)> = sqlx::query_as(
            "SELECT pid, extract(epoch FROM backend_start)::float8 FROM pg_stat_activity WHERE pid = pg_backend_pid()",
        )
        .fetch_one(&pool)
        .await
        .ok();
        let stat = found.and_then(|(backend, started)| Some((support::process_stat(&backend.to_string())?, started)));
        pool.close().await;
        let (stat, started) = stat?;
        let same = (support::started_at(stat.started)? - started).abs() < 2.0;
        let name = std::fs::read_to_string(format!("/proc/{}/comm", stat.parent)).ok()?;
        (same && name.trim() == "postgres").then_some(LocalPostgres { postmaster: stat.parent })
    }

    /// Clock ticks the server has used so far: the postmaster with the
    /// processes it has reaped, and every process it runs now (backends,
    /// the WAL writer, autovacuum) with those they reaped. Counted again
    /// when a process was reaped during the count, which would otherwise
    /// be in neither part. `None` once the server is gone.
    fn ticks(&self) -> Option<u64> {
        for _ in 0..10 {
            let before = support::process_stat(&self.postmaster)?;
            let mut total = before.ticks + before.reaped_ticks;
            for entry in std::fs::read_dir("/proc").ok()?.flatten() {
                let pid = entry.file_name().to_string_lossy().into_owned();
                if pid.bytes().all(|b| b.is_ascii_digit())
                    && let Some(child) = support::process_stat(&pid)
                    && child.parent == self.postmaster
                {
                    total += child.ticks + child.reaped_ticks;
                }
            }
            if support::process_stat(&self.postmaster)?.reaped_ticks == before.reaped_ticks {
                return Some(total);
            }
        }
        None
    }

    /// Waits, at most ten seconds, until the server's CPU has been quiet
    /// for a quarter second (less than a tick), so that what it goes on
    /// doing after a load does not run into the next run's timing; the
    /// CPU seconds it used meanwhile. Work it starts later (autovacuum
    /// wakes up on its own schedule) is not waited for.
    async fn settle(&self) -> Option<f64> {
        let (start, deadline) = (self.ticks()?, Instant::now() + Duration::from_secs(10));
        let mut last = start;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.ticks()?;
            if now.saturating_sub(last) < 1 || Instant::now() >= deadline {
                return Some(support::seconds(now.saturating_sub(start)));
            }
            last = now;
        }
    }
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth("svc_bench_bootstrap_token_0123456789");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {body}");
        body["data"].clone()
    }
}

/// What the store under an object-store destination allows on its own, the
/// ceiling of a sync into it as the pages fetched alone are the provider's:
/// every object under the warehouse that `held` did not list (what a sync
/// just wrote: data files, manifests, metadata) stored again, the same
/// size, with one `PUT` each, eight at a time (as the writer stores a
/// partitioned batch's files; it stores the others one after another),
/// under a folder of its own, then removed. The seconds the `PUT`s took,
/// the objects and their bytes.
async fn stored_alone(bucket: &ObjectStore, held: &HashSet<String>, round: usize) -> (f64, usize, u64) {
    use futures_util::StreamExt;
    let written: Vec<_> =
        bucket.list(None).await.unwrap().into_iter().filter(|o| !held.contains(&o.location)).collect();
    let bytes: u64 = written.iter().map(|o| o.bytes).sum();
    let file_io = bucket.file_io();
    let scratch = |i: usize| format!("s3://bench-lake/bench/stored-alone-{round}/{i:06}");
    let started = Instant::now();
    futures_util::stream::iter(written.iter().enumerate())
        .for_each_concurrent(8, |(i, object)| {
            let output = file_io.new_output(scratch(i)).unwrap();
            async move { output.write(Bytes::from(vec![0x5a; object.bytes as usize])).await.unwrap() }
        })
        .await;
    let secs = started.elapsed().as_secs_f64();
    for i in 0..written.len() {
        bucket.delete(&scratch(i)).await.unwrap();
    }
    (secs, written.len(), bytes)
}

/// What names the partitioned twin of an Iceberg destination
/// (`BENCH_ICEBERG_PARTITIONED=1`).
const BY_DAY: &str = " by day";

/// The configuration of an Iceberg destination in the bucket `bench-lake`
/// of the store behind `front`, with a credential holding `key` (id,
/// secret) made through the API.
async fn bucket_warehouse(api: &Api, front: &provider::TlsFront, (id, secret): &(String, String)) -> Value {
    let key =
        json!({ "kind": "basic", "username": id, "hosts": ["127.0.0.1"], "secret": secret, "label": "bench store" });
    let cred = api.call(reqwest::Method::POST, "/credentials", Some(key)).await;
    json!({ "warehouse": "s3://bench-lake/bench", "namespace": "bench", "endpoint": format!("https://127.0.0.1:{}", front.addr.port()), "credential_handle": cred["credential_handle"] })
}

/// s3s-fs (`cargo install s3s-fs --version 0.14.1 --features binary
/// --locked`, the newest that builds on rustc 1.95): an S3 API written in
/// Rust over a folder, checking every request's signature, quick enough
/// that a sync into it does not wait on the store.
struct S3sFs {
    _child: tokio::process::Child,
    _root: tempfile::TempDir,
    port: u16,
    /// The access key it accepts (id, secret).
    key: (String, String),
}

impl S3sFs {
    async fn start(binary: &str, bucket: &str) -> S3sFs {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(bucket)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let key = ("bench-s3s-access-key".to_owned(), "bench-s3s-secret-key-0123456789abcdef".to_owned());
        let child = tokio::process::Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", &key.0, "--secret-key", &key.1])
            .arg(root.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("BENCH_ICEBERG_S3S: cannot start {binary}: {e}"));
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return S3sFs { _child: child, _root: root, port, key };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("s3s-fs did not listen on port {port} within 10 s");
    }
}

/// `service serve` as an operator runs it (`BENCH_STANDALONE=1`): the
/// benchmark's build of the binary in a process of its own, with an empty
/// environment but for the settings given and the fake provider's root
/// certificate, so that its memory is a server's alone (not the
/// benchmark's, which holds the provider's pages). Started again (on the
/// same data and port) before each run, so that a run's peak is that of a
/// server that has done nothing else. Killed when dropped.
struct Standalone {
    command: std::process::Command,
    child: std::process::Child,
    _dir: tempfile::TempDir,
    base: String,
}

impl Standalone {
    async fn start(roots_pem: &str, env: Vec<(&'static str, String)>) -> Standalone {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (data, roots) = (dir.path().join("data"), dir.path().join("roots.pem"));
        std::fs::create_dir(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(&roots, roots_pem).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_service"));
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .env("SERVICE_DATA_DIR", &data)
            .env("SERVICE_BIND", format!("127.0.0.1:{port}"))
            .env("SERVICE_EGRESS_EXTRA_ROOTS", &roots)
            .env("SERVICE_LOG", "warn")
            .arg("serve")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        let child = command.spawn().expect("start the service binary");
        let standalone = Standalone { command, child, _dir: dir, base: format!("http://127.0.0.1:{port}") };
        standalone.answering().await;
        standalone
    }

    /// The running server's process id.
    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Stops the server and starts it again on the same data and port.
    async fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = self.command.spawn().expect("start the service binary");
        self.answering().await;
    }

    async fn answering(&self) {
        let health = format!("{}/healthz", self.base);
        for _ in 0..1200 {
            if reqwest::get(&health).await.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("`service serve` did not answer within two minutes");
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whose memory a run is measured in: the standalone server's process,
/// else this one.
fn measured_pid(standalone: &Option<Standalone>) -> String {
    standalone.as_ref().map_or_else(|| "self".to_owned(), Standalone::pid)
}

/// The CPU seconds of the processes that do a sync's work: this one, and
/// the standalone server if there is one.
fn work_cpu_seconds(standalone: &Option<Standalone>) -> f64 {
    let server = standalone.as_ref().and_then(|s| support::process_stat(&s.pid()));
    support::cpu_seconds() + server.map_or(0.0, |s| support::seconds(s.ticks))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The native baseline's reading of a Mailcoach page: its records' text,
/// and the next page's URL while `meta.last_page` is ahead.
fn cut_campaigns(first_url: &str, body: &[u8]) -> (Vec<String>, Option<String>) {
    #[derive(serde::Deserialize)]
    struct Meta {
        current_page: usize,
        last_page: usize,
    }
    #[derive(serde::Deserialize)]
    struct Page<'a> {
        #[serde(borrow)]
        data: Vec<&'a serde_json::value::RawValue>,
        meta: Meta,
    }
    let page: Page = serde_json::from_slice(body).unwrap();
    let records = page.data.iter().map(|r| r.get().to_owned()).collect();
    let next = (page.meta.current_page < page.meta.last_page)
        .then(|| format!("{first_url}&page={}", page.meta.current_page + 1));
    (records, next)
}

/// The native baseline's reading of a broadcasts page (a bare array): its
/// records' text, and the next offset's URL after a full page.
fn cut_broadcasts(first_url: &str, offset: &mut usize, body: &[u8]) -> (Vec<String>, Option<String>) {
    let page: Vec<&serde_json::value::RawValue> = serde_json::from_slice(body).unwrap();
    *offset += page.len();
    let next = (page.len() == PER_PAGE).then(|| format!("{first_url}&offset={offset}"));
    (page.iter().map(|r| r.get().to_owned()).collect(), next)
}

/// The OAuth flow as a person runs it through the API, the provider's
/// consent answered by the fake; the new credential's handle.
async fn social_credential(api: &Api, hub: &hubspot::Hub) -> Value {
    let started = api
        .call(reqwest::Method::POST, "/credentials/source/oauth/start", Some(json!({ "connector_id": SOCIAL })))
        .await;
    let url = url::Url::parse(started["authorization_url"].as_str().unwrap()).unwrap();
    let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
    let code = "bench-authorization-code".to_owned();
    hub.codes.lock().unwrap().insert(code.clone(), (q["code_challenge"].clone(), q["redirect_uri"].clone()));
    let created = api
        .call(
            reqwest::Method::POST,
            "/credentials/source/oauth/callback",
            Some(json!({ "state": q["state"], "code": code })),
        )
        .await;
    created["credential_handle"].clone()
}

/// Fetches every page's URL with `window` requests in flight and reads
/// each body without parsing it: what the provider and TLS at both ends
/// cost alone. Runs on
/// a task of the runtime's workers, as a sync's read does. Returns the
/// bytes received.
async fn fetch_only(client: reqwest::Client, urls: Vec<String>, window: usize) -> usize {
    use futures_util::StreamExt;
    tokio::spawn(async move {
        futures_util::stream::iter(urls)
            .map(|url| {
                let client = client.clone();
                async move {
                    let response = client.get(&url).send().await.unwrap();
                    assert!(response.status().is_success(), "the provider answered {url}");
                    response.bytes().await.unwrap().len()
                }
            })
            .buffered(window)
            .fold(0, |total, bytes| async move { total + bytes })
            .await
    })
    .await
    .unwrap()
}

/// A pipeline to measure, and its native baseline.
struct Run {
    label: String,
    connector: &'static str,
    pipeline: String,
    destination: DestinationConfig,
    /// An object store's access key (id, secret), for the native baseline.
    access_key: Option<(String, String)>,
    /// The stream's JSON Schema, as the connector discovers it.
    schema: serde_json::Value,
    rates: Vec<f64>,
    cpus: Vec<f64>,
    /// How far the process's resident memory rose above where it was at
    /// the start of each run, in MB; with a standalone server, the
    /// server's peak resident memory.
    peaks: Vec<f64>,
    native_rates: Vec<f64>,
    native_cpus: Vec<f64>,
    /// Into an object store: the bucket, and the rate its store allowed
    /// each run's objects stored alone (see [`stored_alone`]).
    bucket: Option<ObjectStore>,
    alone_rates: Vec<f64>,
    /// The local PostgreSQL server's CPU seconds per run, when it is the
    /// destination: the connector's runs, then the native baseline's.
    database_cpus: Vec<f64>,
    native_database_cpus: Vec<f64>,
}

fn main() {
    let records: usize = std::env::var("BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let rounds: usize = std::env::var("BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let delay =
        Duration::from_millis(std::env::var("BENCH_PROVIDER_DELAY_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(0));
    let connectors = std::env::var("BENCH_CONNECTORS").unwrap_or_else(|_| "email,social,manifest,airbyte".into());
    let connectors: Vec<&str> = connectors.split(',').map(str::trim).collect();
    if let Some(unknown) = connectors.iter().find(|c| !["email", "social", "manifest", "airbyte"].contains(c)) {
        panic!("BENCH_CONNECTORS: `{unknown}` is none of `email`, `social`, `manifest`, `airbyte`");
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let (campaigns, campaign_size) = campaign_pages(records);
        let (broadcasts, broadcast_size) = broadcast_pages(records);
        let hub = hubspot::Hub::new();
        let ca = provider::TestCa::new();
        let hosts = [MAIL_HOST, HUB_HOST];
        let page_bytes = |pages: &[Bytes]| pages.iter().map(Bytes::len).sum::<usize>();
        let (campaign_bytes, broadcast_bytes) = (page_bytes(&campaigns), page_bytes(&broadcasts));
        // dlt, when asked for, reads the same campaign pages from files.
        let dlt = std::env::var("BENCH_DLT_PYTHON").ok().map(|python| {
            let pages = tempfile::tempdir().unwrap();
            for (n, page) in campaigns.iter().enumerate() {
                std::fs::write(pages.path().join(format!("page-{n:06}.json")), page).unwrap();
            }
            (python, pages)
        });
        let provider = provider::FakeProvider::start(&ca, &hosts, router(hub.clone(), campaigns, broadcasts, delay)).await;
        let egress = EgressPolicy::from_settings(&hosts.join(","), Some(&provider.pins(&hosts)), Some(ca.pem.as_bytes())).unwrap();
        let oauth_clients = json!({ SOCIAL: { "client_id": hubspot::CLIENT_ID, "client_secret": hubspot::CLIENT_SECRET } }).to_string();
        let oauth = OAuthSettings::from_settings(Some(&oauth_clients), None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let state = support::state_with_oauth(dir.path(), egress, oauth).await;
        let workspace = state.store.first_workspace().await.unwrap().unwrap().workspace_id;
        let warehouses = state.config.plugins.warehouses.clone();
        let catalogs = state.store.clone();
        let roots = state.config.plugins.egress.extra_roots.clone();
        let place = service::warehouse::Place { data_dir: dir.path(), workspace_id: &workspace, warehouses: &warehouses, extra_roots: &roots, catalogs: Some(&catalogs) };
        // The API: this process's router, or a `service serve` of its own.
        let (server, mut standalone) = if std::env::var("BENCH_STANDALONE").is_ok_and(|v| v == "1") {
            let env = vec![
                ("SERVICE_BOOTSTRAP_TOKEN", "svc_bench_bootstrap_token_0123456789".to_owned()),
                ("SERVICE_EGRESS_ALLOWED_HOSTS", hosts.join(",")),
                ("SERVICE_EGRESS_RESOLVE", provider.pins(&hosts)),
                ("SERVICE_WAREHOUSE_ALLOWED_HOSTS", "127.0.0.1,::1,localhost".to_owned()),
                ("SERVICE_OAUTH_CLIENTS", oauth_clients.clone()),
                ("SERVICE_RATE_LIMIT_PER_SESSION", "1000000".to_owned()),
                ("SERVICE_RATE_LIMIT_PER_ADDRESS", "1000000".to_owned()),
            ];
            let standalone = Standalone::start(&ca.pem, env).await;
            println!("the API is a `service serve` process of its own, started again before each run: its CPU is counted, and its peak memory is what is shown");
            (None, Some(standalone))
        } else {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            (Some(service::server::start_on(listener, state).unwrap()), None)
        };
        let base = match (&server, &standalone) {
            (Some(server), _) => format!("http://{}/v1", server.addr),
            (None, Some(standalone)) => format!("{}/v1", standalone.base),
            (None, None) => unreachable!("one of them was started"),
        };
        let api = Api { http: reqwest::Client::new(), base };

        let mut sources = Vec::new();
        if connectors.contains(&"email") {
            let cred = api
                .call(reqwest::Method::POST, "/credentials/emailcampaign/api-token", Some(json!({ "base_url": format!("https://{MAIL_HOST}/api"), "api_token": PROVIDER_TOKEN })))
                .await;
            let configuration = json!({ "base_url": format!("https://{MAIL_HOST}/api"), "credential_handle": cred["credential_handle"] });
            let source = api.call(reqwest::Method::POST, "/sources", Some(json!({ "connector_id": "conn_emailcampaign_edm", "name": "bench email", "configuration": configuration }))).await;
            println!("email-campaign: {records} campaigns of {campaign_size} bytes, {PER_PAGE} per page");
            sources.push(("email", source["source_id"].clone(), "campaigns"));
        }
        if connectors.contains(&"manifest") {
            let body = json!({ "kind": "api_token", "connector_id": "conn_rest_manifest", "hosts": [MAIL_HOST], "secret": PROVIDER_TOKEN, "label": "bench manifest" });
            let cred = api.call(reqwest::Method::POST, "/credentials", Some(body)).await;
            let configuration = json!({ "base_url": format!("https://{MAIL_HOST}"), "credential_handle": cred["credential_handle"], "manifest": campaigns_manifest() });
            let source = api.call(reqwest::Method::POST, "/sources", Some(json!({ "connector_id": "conn_rest_manifest", "name": "bench manifest", "configuration": configuration }))).await;
            println!("REST manifest: the same {records} campaigns");
            sources.push(("manifest", source["source_id"].clone(), "campaigns"));
        }
        if connectors.contains(&"airbyte") {
            let body = json!({ "kind": "api_token", "connector_id": "conn_airbyte_manifest", "hosts": [MAIL_HOST], "secret": PROVIDER_TOKEN, "label": "bench airbyte" });
            let cred = api.call(reqwest::Method::POST, "/credentials", Some(body)).await;
            let configuration = json!({ "manifest": campaigns_airbyte_manifest(), "config": {}, "credentials": [{ "field": "/api_token", "credential_handle": cred["credential_handle"] }] });
            let source = api.call(reqwest::Method::POST, "/sources", Some(json!({ "connector_id": "conn_airbyte_manifest", "name": "bench airbyte", "configuration": configuration }))).await;
            println!("Airbyte manifest: the same {records} campaigns");
            sources.push(("airbyte", source["source_id"].clone(), "campaigns"));
        }
        if connectors.contains(&"social") {
            let handle = social_credential(&api, &hub).await;
            let configuration = json!({ "credential_handle": handle, "portal_id": hubspot::PORTAL.to_string(), "brand_ids": ["101"], "channel_ids": CHANNELS });
            let source = api.call(reqwest::Method::POST, "/sources", Some(json!({ "connector_id": SOCIAL, "name": "bench social", "configuration": configuration }))).await;
            println!("social-media: {records} posts of {broadcast_size} bytes, {PER_PAGE} per page");
            sources.push(("social", source["source_id"].clone(), "posts"));
        }
        let mut destinations = vec![("SQLite".to_owned(), DestinationKind::Sqlite, json!({ "file": "bench.db" }))];
        let mut postgres = None;
        if let Ok(url) = std::env::var("BENCH_POSTGRES_URL") {
            postgres = LocalPostgres::find(&url).await;
            match &postgres {
                Some(server) => println!("PostgreSQL runs on this machine (postmaster {}): its CPU seconds are counted beside each run", server.postmaster),
                None => println!("PostgreSQL does not run on this machine, or cannot be seen: its CPU is not counted"),
            }
            destinations.push(("PostgreSQL".to_owned(), DestinationKind::Postgres, json!({ "url": url })));
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        println!(
            "{cores} cores: at 150,000 records/s a run of {records} records has {:.2} CPU-s to spend, a database on this machine included",
            cores as f64 * records as f64 / 150_000.0
        );
        // The database's clock ticks so far, when it is the local
        // PostgreSQL server.
        let database_ticks = |destination: &DestinationConfig| match (destination, &postgres) {
            (DestinationConfig::Postgres { .. }, Some(server)) => server.ticks(),
            _ => None,
        };
        // The database's CPU seconds over a run, shown with what it does
        // after the run until it is quiet, which it finishes before the
        // next run starts.
        let database_share = async |before: Option<u64>, after: Option<u64>| match (before, after, &postgres) {
            (Some(b), Some(a), Some(server)) if a >= b => {
                let used = support::seconds(a - b);
                let later = server.settle().await.map_or_else(|| "the server is gone".to_owned(), |s| format!("{s:.2} more until quiet"));
                (Some(used), format!(", PostgreSQL server {used:.2} CPU-s, {later}"))
            }
            _ => (None, String::new()),
        };
        if std::env::var("BENCH_JSONL").is_ok_and(|v| v == "1") {
            // Appending lines is light work: a sync no faster into it than
            // into a database is limited by its read side.
            destinations.push(("JSONL".to_owned(), DestinationKind::Jsonl, json!({ "directory": "bench" })));
        }
        if std::env::var("BENCH_ICEBERG").is_ok_and(|v| v == "1") {
            destinations.push(("Iceberg".to_owned(), DestinationKind::Iceberg, json!({ "warehouse": "bench", "namespace": "bench" })));
        }
        // Iceberg warehouses in buckets, each store behind an HTTPS front
        // (as a store is reached): moto's S3, when a Python that has it is
        // named, and s3s-fs, when its binary is.
        let mut access_keys: HashMap<&str, (String, String)> = HashMap::new();
        let mut stores: Vec<(Box<dyn std::any::Any>, provider::TlsFront)> = Vec::new();
        if let Ok(python) = std::env::var("BENCH_ICEBERG_S3_PYTHON") {
            let moto = MotoS3::start(std::path::Path::new(&python), "bench-lake").await;
            let front = moto.https_front(&ca).await;
            let key = (moto.access_key_id.clone(), moto.secret_access_key.clone());
            destinations.push(("Iceberg on moto".to_owned(), DestinationKind::Iceberg, bucket_warehouse(&api, &front, &key).await));
            access_keys.insert("Iceberg on moto", key);
            stores.push((Box::new(moto), front));
        }
        if let Ok(binary) = std::env::var("BENCH_ICEBERG_S3S") {
            let s3s = S3sFs::start(&binary, "bench-lake").await;
            let front = provider::TlsFront::start(&ca, &["127.0.0.1"], ([127, 0, 0, 1], s3s.port).into()).await;
            destinations.push(("Iceberg on s3s".to_owned(), DestinationKind::Iceberg, bucket_warehouse(&api, &front, &s3s.key).await));
            access_keys.insert("Iceberg on s3s", s3s.key.clone());
            stores.push((Box::new(s3s), front));
        }
        // Each Iceberg table again, partitioned by the day of `sent_at` (28
        // days, every batch holding each of them), in a namespace of its own.
        if std::env::var("BENCH_ICEBERG_PARTITIONED").is_ok_and(|v| v == "1") {
            let by_day = json!({ "campaigns": [{ "field": "sent_at", "transform": "day" }] });
            let partitioned: Vec<_> = destinations
                .iter()
                .filter(|(_, kind, _)| *kind == DestinationKind::Iceberg)
                .map(|(name, kind, configuration)| {
                    let mut configuration = configuration.clone();
                    configuration["namespace"] = json!("bench_by_day");
                    configuration["partitions"] = by_day.clone();
                    (format!("{name}{BY_DAY}"), *kind, configuration)
                })
                .collect();
            destinations.extend(partitioned);
        }
        let mut runs = Vec::new();
        for (name, kind, configuration) in &destinations {
            // A partitioned twin uses its table's store and key.
            let key = access_keys.get(name.trim_end_matches(BY_DAY));
            let body = json!({ "name": name, "kind": kind.as_str(), "configuration": configuration });
            let d = api.call(reqwest::Method::POST, "/destinations", Some(body)).await;
            for (connector, source_id, stream) in &sources {
                let body = json!({
                    "name": format!("bench {connector} {name}"),
                    "source_id": source_id,
                    "destination_id": d["destination_id"],
                    "streams": [{ "name": stream, "sync_mode": "full_refresh_overwrite" }],
                });
                let p = api.call(reqwest::Method::POST, "/pipelines", Some(body)).await;
                let pipeline = p["pipeline_id"].as_str().unwrap().to_owned();
                let prepared = api.call(reqwest::Method::POST, "/pipelines/prepare", Some(json!({ "source_id": source_id }))).await;
                let schema = prepared["streams"].as_array().unwrap().iter().find(|s| s["name"] == *stream).map(|s| s["json_schema"].clone()).unwrap_or_default();
                let destination = service::warehouse::validate(*kind, configuration).unwrap();
                let bucket = match (&destination, key) {
                    (DestinationConfig::Iceberg { warehouse: Lakehouse::ObjectStore(s3), .. }, Some((id, secret))) => {
                        Some(ObjectStore::connect(s3, (id.clone(), secret.clone().into()), &warehouses, &roots).await.unwrap())
                    }
                    _ => None,
                };
                runs.push(Run {
                    label: format!("{connector} {name}"),
                    connector,
                    pipeline,
                    destination,
                    access_key: key.cloned(),
                    bucket,
                    alone_rates: Vec::new(),
                    schema,
                    rates: Vec::new(),
                    cpus: Vec::new(),
                    peaks: Vec::new(),
                    native_rates: Vec::new(),
                    native_cpus: Vec::new(),
                    database_cpus: Vec::new(),
                    native_database_cpus: Vec::new(),
                });
            }
        }

        // The native baseline fetches the same pages with the same
        // credentials, sent by itself.
        let native = |token: &str| {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
            let mut client = reqwest::Client::builder().default_headers(headers).tls_certs_merge(reqwest::Certificate::from_pem_bundle(ca.pem.as_bytes()).unwrap());
            for host in hosts {
                client = client.resolve(host, provider.addr);
            }
            support::Native { client: client.build().unwrap() }
        };
        let hub_token = hub.access.lock().unwrap().keys().next().cloned().unwrap_or_default();
        let (email_native, social_native) = (native(PROVIDER_TOKEN), native(&hub_token));
        let port = provider.addr.port();
        let campaigns_url = format!("https://{MAIL_HOST}:{port}/api/campaigns?per_page={PER_PAGE}");
        let broadcasts_url = format!("https://{HUB_HOST}:{port}/broadcast/v1/broadcasts?status=success&count={PER_PAGE}");

        println!("{rounds} rounds, each pipeline and its native baseline taking turns");
        if !delay.is_zero() {
            let pages = records.div_ceil(PER_PAGE) as f64;
            println!(
                "the provider answers each page after {} ms: one page at a time could reach at most {:.0} records/s",
                delay.as_millis(),
                records as f64 / (pages * delay.as_secs_f64())
            );
        }
        let pages = records.div_ceil(PER_PAGE);
        // The manifest source reads the email-campaign pages: fetched alone once.
        let mut alone: Vec<(&str, Vec<f64>, Vec<f64>)> = sources
            .iter()
            .filter(|(connector, _, _)| !matches!(*connector, "manifest" | "airbyte") || !connectors.contains(&"email"))
            .map(|(connector, _, _)| (*connector, Vec::new(), Vec::new()))
            .collect();
        for round in 1..=rounds {
            for (connector, rates, cpus) in &mut alone {
                let (client, urls, expected): (_, Vec<String>, _) = match *connector {
                    "email" | "manifest" | "airbyte" => (email_native.client.clone(), (1..=pages).map(|p| format!("{campaigns_url}&page={p}")).collect(), campaign_bytes),
                    _ => (social_native.client.clone(), (0..pages).map(|p| format!("{broadcasts_url}&offset={}", p * PER_PAGE)).collect(), broadcast_bytes),
                };
                let (cpu, started) = (support::cpu_seconds(), Instant::now());
                let bytes = fetch_only(client, urls, 3).await;
                let secs = started.elapsed().as_secs_f64();
                assert_eq!(bytes, expected, "every page arrived whole");
                let (rate, used) = (records as f64 / secs, support::cpu_seconds() - cpu);
                println!("round {round} {connector:<18} {rate:>10.0} records/s ({secs:.2} s, {used:.2} CPU-s) pages fetched alone");
                rates.push(rate);
                cpus.push(used);
            }
            for run in &mut runs {
                if let Some(server) = &mut standalone {
                    server.restart().await;
                }
                let (db, cpu, measured) = (database_ticks(&run.destination), work_cpu_seconds(&standalone), measured_pid(&standalone));
                support::reset_peak_rss(&measured);
                let resident = support::memory_mb(&measured, "VmRSS:");
                let held = match &run.bucket {
                    Some(bucket) => bucket.list(None).await.unwrap().into_iter().map(|o| o.location).collect(),
                    None => HashSet::new(),
                };
                let started = Instant::now();
                let job = api.call(reqwest::Method::POST, &format!("/pipelines/{}/sync", run.pipeline), Some(json!({}))).await;
                let job_id = job["job_id"].as_str().unwrap().to_owned();
                let done = loop {
                    let j = api.call(reqwest::Method::GET, &format!("/jobs/{job_id}"), None).await;
                    match j["status"].as_str() {
                        Some("succeeded") => break j,
                        Some("failed" | "cancelled") => panic!("the job ended {j}"),
                        _ => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                };
                let secs = started.elapsed().as_secs_f64();
                let got = done["progress"]["records"].as_u64().unwrap();
                assert_eq!(got as usize, records, "every record synced: {done}");
                let rate = got as f64 / secs;
                let (used, db_after) = (work_cpu_seconds(&standalone) - cpu, database_ticks(&run.destination));
                let (db_used, db_shown) = database_share(db, db_after).await;
                let peak = support::memory_mb(&measured, "VmHWM:");
                // A server's peak is what an operator provides for; this
                // process's, the rise over what it held already.
                let (shown, peak) = match &standalone {
                    Some(_) => (format!("server peak RSS {peak:.0} MB, {resident:.0} MB before"), peak),
                    None => (format!("peak RSS +{:.0} MB over {resident:.0} MB", peak - resident), peak - resident),
                };
                // The plugin's own share, as the job counts it.
                let guest = done["usage"]["guest_cpu_ms"].as_u64().map_or(String::new(), |ms| format!(", guest {:.2} CPU-s", ms as f64 / 1000.0));
                println!("round {round} {:<18} {rate:>10.0} records/s ({secs:.2} s, {used:.2} CPU-s{guest}{db_shown}, {shown})", run.label);
                run.rates.push(rate);
                run.cpus.push(used);
                run.peaks.push(peak);
                run.database_cpus.extend(db_used);
                if let Some(bucket) = &run.bucket {
                    let (secs, objects, bytes) = stored_alone(bucket, &held, round).await;
                    let rate = records as f64 / secs;
                    println!("round {round} {:<18} {rate:>10.0} records/s ({secs:.2} s, {objects} objects, {:.1} MB) the sync's objects stored alone", run.label, bytes as f64 / 1e6);
                    run.alone_rates.push(rate);
                }

                let (db, cpu, started) = (database_ticks(&run.destination), support::cpu_seconds(), Instant::now());
                let got = match run.connector {
                    "email" | "manifest" | "airbyte" => {
                        let first = campaigns_url.clone();
                        email_native.sync(format!("{first}&page=1"), move |body| cut_campaigns(&first, body), "campaigns_native", &run.schema, support::Target { destination: &run.destination, place: &place, access_key: run.access_key.as_ref() }).await
                    }
                    _ => {
                        let (first, mut offset) = (broadcasts_url.clone(), 0);
                        social_native.sync(format!("{first}&offset=0"), move |body| cut_broadcasts(&first, &mut offset, body), "posts_native", &run.schema, support::Target { destination: &run.destination, place: &place, access_key: run.access_key.as_ref() }).await
                    }
                };
                let secs = started.elapsed().as_secs_f64();
                assert_eq!(got as usize, records, "the native baseline read every record");
                let (rate, used, db_after) = (got as f64 / secs, support::cpu_seconds() - cpu, database_ticks(&run.destination));
                let (db_used, db_shown) = database_share(db, db_after).await;
                println!("round {round} {:<18} {rate:>10.0} records/s ({secs:.2} s, {used:.2} CPU-s{db_shown}) native baseline", run.label);
                run.native_rates.push(rate);
                run.native_cpus.push(used);
                run.native_database_cpus.extend(db_used);
            }
        }
        // Airbyte's CDK reading the same manifest from the same provider.
        if let Ok(python) = std::env::var("BENCH_AIRBYTE_PYTHON") {
            let work = tempfile::tempdir().unwrap();
            let (manifest, config, ca_file) = (work.path().join("manifest.json"), work.path().join("config.json"), work.path().join("ca.pem"));
            std::fs::write(&manifest, campaigns_airbyte_manifest().to_string()).unwrap();
            std::fs::write(&config, json!({ "api_token": PROVIDER_TOKEN }).to_string()).unwrap();
            std::fs::write(&ca_file, &ca.pem).unwrap();
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/python/airbyte_cdk_read.py");
            let mut rates = Vec::new();
            for round in 1..=rounds {
                let ran = std::process::Command::new(&python)
                    .arg(script).arg(&manifest).arg(&config).arg(MAIL_HOST).arg(provider.addr.port().to_string()).arg(&ca_file)
                    .output().unwrap();
                assert!(ran.status.success(), "the CDK: {}", String::from_utf8_lossy(&ran.stderr));
                let printed = String::from_utf8_lossy(&ran.stdout);
                let mut figures = printed.split_whitespace().map(|f| f.parse::<f64>().unwrap());
                let (got, secs) = (figures.next().unwrap(), figures.next().unwrap());
                assert_eq!(got as usize, records, "the CDK read every record");
                println!("round {round} {:<18} {:>10.0} records/s ({secs:.2} s) Airbyte's CDK, its entrypoint's read, messages serialised", "airbyte cdk", got / secs);
                rates.push(got / secs);
            }
            let cdk_rate = median(rates);
            println!("median {:<18} {cdk_rate:>10.0} records/s: Airbyte's CDK reading the manifest", "airbyte cdk");
            for run in runs.iter().filter(|r| r.connector == "airbyte") {
                println!("{} at {:.1}x the CDK's rate", run.label, median(run.rates.clone()) / cdk_rate);
            }
        }
        if let Some((python, pages)) = &dlt {
            let mut rates = Vec::new();
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/python/dlt_parquet.py");
            for round in 1..=rounds {
                let out = tempfile::tempdir().unwrap();
                let ran = std::process::Command::new(python).arg(script).arg(pages.path()).arg(out.path().join("lake")).output().unwrap();
                assert!(ran.status.success(), "dlt: {}", String::from_utf8_lossy(&ran.stderr));
                let printed = String::from_utf8_lossy(&ran.stdout);
                let mut figures = printed.split_whitespace().map(|f| f.parse::<f64>().unwrap());
                let (got, secs) = (figures.next().unwrap(), figures.next().unwrap());
                assert_eq!(got as usize, records, "dlt loaded every record");
                println!("round {round} {:<18} {:>10.0} records/s ({secs:.2} s) dlt 1.31, filesystem destination, Parquet, pages read from files", "email dlt", got / secs);
                rates.push(got / secs);
            }
            let dlt_rate = median(rates);
            println!("median {:<18} {dlt_rate:>10.0} records/s: dlt 1.31 into Parquet files", "email dlt");
            for run in runs.iter().filter(|r| r.connector == "email") {
                println!("{} at {:.1}x dlt's rate", run.label, median(run.rates.clone()) / dlt_rate);
            }
        }
        for (connector, rates, cpus) in alone {
            println!("median {connector:<18} {:>10.0} records/s ({:.2} CPU-s per run): the pages fetched alone, the ceiling of its syncs here", median(rates), median(cpus));
        }
        // The manifest source beside the compiled connector, per destination.
        let shares: Vec<String> = runs
            .iter()
            .filter(|r| r.connector == "manifest")
            .filter_map(|m| {
                let destination = m.label.trim_start_matches("manifest ");
                let email = runs.iter().find(|r| r.connector == "email" && r.label.ends_with(destination))?;
                Some(format!(
                    "the manifest source into {destination} at {:.0}% of the email-campaign connector's rate",
                    100.0 * median(m.rates.clone()) / median(email.rates.clone())
                ))
            })
            .collect();
        for run in runs.iter().filter(|r| !r.alone_rates.is_empty()) {
            println!("median {:<18} {:>10.0} records/s: its objects stored alone, the store's ceiling for its syncs", run.label, median(run.alone_rates.clone()));
        }
        for run in runs {
            let (rate, native) = (median(run.rates), median(run.native_rates));
            // The database's share, where it was measured: the medians.
            let shown = |cpus: Vec<f64>| if cpus.is_empty() { String::new() } else { format!(" + {:.2} PostgreSQL", median(cpus)) };
            println!(
                "median {:<18} {rate:>10.0} records/s ({:.2} CPU-s per run{}, {}); native baseline {native:.0} records/s ({:.2} CPU-s{}); the connector at {:.0}% of it",
                run.label,
                median(run.cpus),
                shown(run.database_cpus),
                match standalone {
                    Some(_) => format!("server peak RSS {:.0} MB", median(run.peaks)),
                    None => format!("peak RSS +{:.0} MB", median(run.peaks)),
                },
                median(run.native_cpus),
                shown(run.native_database_cpus),
                100.0 * rate / native
            );
        }
        for share in shares {
            println!("{share}");
        }
        drop(stores);
        if let Some(server) = server {
            server.stop().await.unwrap();
        }
    });
}
