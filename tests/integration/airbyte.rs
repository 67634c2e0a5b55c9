//! Airbyte's published manifests, read through the public API by the
//! bundled `conn_airbyte_manifest` and by Airbyte's own CDK (7.39.1,
//! `tests/python/airbyte/requirements.txt`) against the same fake API,
//! made from each manifest by `tests/python/airbyte_fake.py`, behind TLS,
//! with the plugins' clock frozen at the instant the CDK's is.
//!
//! Per manifest: the records of every stream (as sorted lists), the set
//! of requests the fake received and, for each stream with a cursor, the
//! state saved must be the same — on a full read, then on an incremental
//! read from the state each side saved; or the source is
//! refused when it is saved, with the JSON pointer and a reason. A
//! manifest our side accepts and then fails to read, or reads
//! differently, fails the test.
//!
//! The CI runs a fixed sample ([`SAMPLE`]); the whole development corpus
//! (`../shared/airbyte-manifests`) runs with
//!
//! ```text
//! AIRBYTE_MANIFESTS=all cargo test --test integration airbyte -- --nocapture
//! ```
//!
//! (or a comma-separated list of manifest names), printing a line per
//! manifest and a summary. `AIRBYTE_CDK_TRACE=1` prints the CDK's stack
//! trace where it fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use testkit::provider::{TestCa, TlsFront};
use testkit::python::Script;

use crate::on_both_backends;
use crate::support::trust::Trust;
use crate::support::{Backend, TestServer, json_ok};

/// The name the fake API answers to.
const FAKE_HOST: &str = "airbyte.fake.test";

/// The instant both sides' clocks stand at.
const NOW: &str = "2026-11-20T12:00:00.123456Z";
/// How long the CDK may read one manifest (ours has as long, in `wait`):
/// a read past it is not compared. `AIRBYTE_CDK_LIMIT_SECS` sets another.
fn cdk_limit_secs() -> u64 {
    std::env::var("AIRBYTE_CDK_LIMIT_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(300)
}

/// Manifests of different shapes read in every run: cursors in bodies
/// and next URLs (`RequestPath`), page and offset counters, substream
/// routers, `AddFields`, `RemoveFields`, a `RecordFilter`, composite error
/// handlers, keys in headers, query parameters, bearer tokens and
/// Basic passwords (a literal word among them), two secrets in one
/// request (two headers; a bearer token and a header; a Basic username
/// and password that are both secret, one credential), an OAuth client's
/// token obtained by the host (with scopes, by a refresh token), a wait
/// until the time a header names, added fields that render
/// nothing, streams whose names are not table names, and incremental
/// cursors (daily and monthly windows, a lookback, a data feed, a cursor
/// per partition) read again from their state; a path that renders empty
/// once a list is read, a path value holding `?`, a page token the
/// manifest writes into a parameter itself, a base URL the spec fixes by
/// `const`, and a cursor that reads one page.
const SAMPLE: &[&str] = &[
    "source-activecampaign",
    "source-aha",
    "source-aircall",
    "source-captain-data",
    "source-convertkit",
    "source-copper",
    "source-customer-io",
    "source-datadog",
    "source-emailoctopus",
    "source-everhour",
    "source-exchange-rates",
    "source-gainsight-px",
    "source-glassfrog",
    "source-hubplanner",
    "source-jina-ai-reader",
    "source-klarna",
    "source-lemlist",
    "source-mailjet-sms",
    "source-merge",
    "source-nasa",
    "source-newsdata",
    "source-omnisend",
    "source-openweather",
    "source-orbit",
    "source-pendo",
    "source-pivotal-tracker",
    "source-oura",
    "source-pokeapi",
    "source-primetric",
    "source-pypi",
    "source-opsgenie",
    "source-secoda",
    "source-sentry",
    "source-strava",
    "source-toggl",
    "source-trustpilot",
    "source-yahoo-finance-price",
    "source-wikipedia-pageviews",
    "source-quickbooks",
    "source-survey-sparrow",
    "source-serpstat",
];

/// The development corpus beside the repository.
fn corpus() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/airbyte-manifests/manifests");
    assert!(dir.is_dir(), "the manifest corpus is not at {}", dir.display());
    dir
}

/// The manifests this run reads.
fn chosen() -> Vec<String> {
    match std::env::var("AIRBYTE_MANIFESTS").ok().filter(|v| !v.is_empty()) {
        Some(all) if all == "all" => {
            let mut names: Vec<String> = std::fs::read_dir(corpus())
                .unwrap()
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".yaml")).map(str::to_owned))
                .collect();
            names.sort();
            names
        }
        Some(list) => list.split(',').map(|s| s.trim().trim_end_matches(".yaml").to_owned()).collect(),
        None => SAMPLE.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// How one manifest came out.
#[derive(Debug)]
enum Verdict {
    Identical {
        records: usize,
        requests: usize,
        /// Records read again from the saved states.
        incremental: usize,
    },
    Refused(String),
    /// The CDK itself could not read it against the fake.
    CdkFailed(String),
    /// The CDK's read passed its time limit, after this many requests
    /// (and the first path of them it asked most).
    NotCompared {
        requests: usize,
        most: String,
    },
    Different(String),
    FailedHere(String),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Identical { records, requests, incremental: 0 } => {
                write!(f, "identical ({records} records, {requests} requests)")
            }
            Verdict::Identical { records, requests, incremental } => {
                write!(
                    f,
                    "identical ({records} records, {requests} requests; from the state: {incremental} records, states equal)"
                )
            }
            Verdict::Refused(why) => write!(f, "refused when saved: {why}"),
            Verdict::CdkFailed(why) => write!(f, "the CDK could not read it: {why}"),
            Verdict::NotCompared { requests, most } => write!(
                f,
                "not compared: the CDK's read passed {} s, after {requests} requests (most to {most})",
                cdk_limit_secs()
            ),
            Verdict::Different(what) => write!(f, "DIFFERENT: {what}"),
            Verdict::FailedHere(why) => write!(f, "FAILED HERE: {why}"),
        }
    }
}

/// The fake API and the CDK, one Python process.
struct Fake {
    script: Script,
}

impl Fake {
    async fn ask(&mut self, command: Value) -> Value {
        let answer = self.script.ask(&command).await;
        assert!(answer.get("failed").is_none(), "the fake failed: {answer}");
        answer
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_manifests_read_as_the_cdk_reads_them() {
    crate::support::init_crypto();
    let python = crate::support::airbyte_python();
    let script = Script::start(&python, &crate::support::python_script("airbyte_fake.py"), &[]).await;
    let backend = script.started["port"].as_u64().unwrap() as u16;
    let mut fake = Fake { script };
    let ca = TestCa::new();
    let front = TlsFront::start(&ca, &[FAKE_HOST], ([127, 0, 0, 1], backend).into()).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let trust = Trust::new(&ca).allowing(FAKE_HOST).pinning(&format!("{FAKE_HOST}={}", front.addr));
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.plugins.egress = trust.policy();
        let at = chrono::DateTime::parse_from_rfc3339(NOW).unwrap();
        c.plugins.guest_clock = Some(std::time::Duration::from_nanos(at.timestamp_nanos_opt().unwrap() as u64));
    })
    .await
    .unwrap();
    let ws = srv.workspace_id().await;

    let mut verdicts = Vec::new();
    for name in chosen() {
        let path = corpus().join(format!("{name}.yaml"));
        let verdict = read_both(&srv, &ws, &mut fake, front.addr.port(), &ca_file, &name, &path).await;
        println!("{name}: {verdict}");
        verdicts.push((name, verdict));
    }
    let count = |f: fn(&Verdict) -> bool| verdicts.iter().filter(|(_, v)| f(v)).count();
    let identical = count(|v| matches!(v, Verdict::Identical { .. }));
    let refused = count(|v| matches!(v, Verdict::Refused(_)));
    let cdk_failed = count(|v| matches!(v, Verdict::CdkFailed(_)));
    let not_compared = count(|v| matches!(v, Verdict::NotCompared { .. }));
    println!(
        "{} manifests: {identical} identical to the CDK, {refused} refused when saved (named), {cdk_failed} the CDK could not read, {not_compared} not compared (the CDK's read too long), {} different or failing here",
        verdicts.len(),
        verdicts.len() - identical - refused - cdk_failed - not_compared
    );
    let listed = |keep: fn(&Verdict) -> bool| {
        verdicts.iter().filter(|(_, v)| keep(v)).map(|(n, v)| format!("{n}: {v}")).collect::<Vec<_>>().join("\n")
    };
    let bad = listed(|v| matches!(v, Verdict::Different(_) | Verdict::FailedHere(_)));
    assert!(bad.is_empty(), "read differently from the CDK, or failing at run time:\n{bad}");
    if std::env::var("AIRBYTE_MANIFESTS").is_err() {
        // The sample is chosen to be read: each of it must be identical.
        assert_eq!(identical, verdicts.len(), "{}", listed(|v| !matches!(v, Verdict::Identical { .. })));
    }
}

#[allow(clippy::too_many_arguments)]
async fn read_both(
    srv: &TestServer,
    ws: &str,
    fake: &mut Fake,
    tls_port: u16,
    ca_file: &Path,
    name: &str,
    path: &Path,
) -> Verdict {
    let loaded = fake.ask(json!({ "load": path })).await;
    assert!(loaded["secrets"].is_object(), "{name}: {loaded}");
    let manifest = loaded["manifest"].clone();
    let config = loaded["config"].clone();
    let secrets: BTreeMap<String, String> = serde_json::from_value(loaded["secrets"].clone()).unwrap();
    let streams: Vec<String> = serde_json::from_value(loaded["streams"].clone()).unwrap();

    let incremental: Vec<String> = serde_json::from_value(loaded["incremental"].clone()).unwrap();

    // Our side, as a user: a credential per secret the manifest places,
    // stored for where it places it; the source; a pipeline into JSON
    // lines (incremental where a stream has a cursor); a sync.
    let mut plain = config.clone();
    for pointer in secrets.keys() {
        remove_pointer(&mut plain, pointer);
    }
    // (A manifest the runtime's crate refuses is saved without
    // credentials: the server's refusal is the verdict.)
    let placements = placements(&manifest, &plain, &secrets).unwrap_or_default();
    let mut handles = Vec::new();
    for (pointer, place) in &placements {
        let mut body = json!({ "connector_id": "conn_airbyte_manifest", "hosts": [FAKE_HOST],
            "secret": secrets[pointer], "label": format!("{name} {pointer}") });
        match place {
            declarative::retrieve::Place::Bearer => body["kind"] = json!("api_token"),
            declarative::retrieve::Place::Header(h) => {
                body["kind"] = json!("secret");
                body["header"] = json!(h);
            }
            declarative::retrieve::Place::Query(q) => {
                body["kind"] = json!("secret");
                body["query_parameter"] = json!(q);
            }
            declarative::retrieve::Place::BodyField(f) => {
                body["kind"] = json!("secret");
                body["body_field"] = json!(f);
            }
            declarative::retrieve::Place::Basic { username } => {
                body["kind"] = json!("basic");
                body["username"] = json!(username);
            }
            declarative::retrieve::Place::BasicUsername { password } => {
                body["kind"] = json!("basic");
                body["password"] = json!(password);
            }
            declarative::retrieve::Place::BasicBoth => {
                body["kind"] = json!("basic");
                body["secret_as"] = json!("username_and_password");
            }
            declarative::retrieve::Place::BasicPair { password } => {
                body["kind"] = json!("basic");
                body["secret_as"] = json!("username:password");
                body["secret"] = json!(format!("{}:{}", secrets[pointer], secrets[password]));
            }
            declarative::retrieve::Place::OAuthClient { token_url, client_id, client_id_field, grant, terms } => {
                let client_id = client_id_field.as_ref().map_or(client_id.clone(), |f| secrets[f].clone());
                body["kind"] = json!("secret");
                let grant_type = match grant {
                    declarative::retrieve::OAuthGrant::ClientCredentials => "client_credentials",
                    declarative::retrieve::OAuthGrant::RefreshToken { field } => {
                        body["refresh_token"] = json!(secrets[field]);
                        "refresh_token"
                    }
                    declarative::retrieve::OAuthGrant::EmptyRefreshToken => "refresh_token",
                };
                body["exchange"] = json!({ "grant": grant_type, "token_url": token_url, "client_id": client_id,
                    "empty_refresh_token": *grant == declarative::retrieve::OAuthGrant::EmptyRefreshToken,
                    "scopes": terms.scopes, "expiry_field": terms.expiry_field, "expiry_is_time": terms.expiry_is_time });
            }
            declarative::retrieve::Place::SessionLogin {
                login_url,
                username,
                username_field,
                password_field,
                token_pointer,
                header,
                lifetime_secs,
            } => {
                body["kind"] = json!("secret");
                body["exchange"] = json!({ "grant": "login", "token_url": login_url, "username": username,
                    "username_field": username_field, "password_field": password_field,
                    "token_pointer": token_pointer, "header": header, "lifetime_secs": lifetime_secs });
            }
            declarative::retrieve::Place::UrlPath => {
                body["kind"] = json!("secret");
                body["url_path"] = json!(true);
            }
            declarative::retrieve::Place::HeaderAround { header, prefix, suffix } => {
                body["kind"] = json!("secret");
                body["header"] = json!(header);
                body["header_prefix"] = json!(prefix);
                body["header_suffix"] = json!(suffix);
            }
        }
        let credential = json_ok(srv.post("/v1/credentials", body).send().await.unwrap()).await;
        handles.push(json!({ "field": pointer, "credential_handle": credential["data"]["credential_handle"] }));
        // The pair's credential stands for its password's field too, an
        // OAuth client's for its id's and refresh token's.
        for other in place.fields_beside() {
            handles.push(json!({ "field": other, "credential_handle": credential["data"]["credential_handle"] }));
        }
    }
    let configuration =
        json!({ "manifest": manifest, "config": plain, "credentials": handles, "schemas": loaded["schemas"] });
    let created = srv
        .post(
            "/v1/sources",
            json!({ "connector_id": "conn_airbyte_manifest", "name": name, "configuration": configuration }),
        )
        .send()
        .await
        .unwrap();
    let status = created.status();
    let created: Value = created.json().await.unwrap();
    if status.as_u16() == 400 {
        let details = &created["details"];
        let reason = match details["errors"][0].as_object() {
            Some(e) => format!("{}: {}", e["path"].as_str().unwrap_or(""), e["message"].as_str().unwrap_or("")),
            None => created.to_string(),
        };
        return Verdict::Refused(reason);
    }
    if !status.is_success() {
        return Verdict::FailedHere(format!("saving the source: {status} {created}"));
    }
    // Saved: the CDK reads it (a manifest refused here is not read by
    // either), then we do.
    fake.ask(json!({ "requests": true })).await;
    let theirs = fake.ask(json!({ "cdk": { "port": tls_port, "ca": ca_file, "limit": cdk_limit_secs() } })).await;
    let their_requests = fake.ask(json!({ "requests": true })).await["requests"].clone();
    if theirs["timed_out"] == true {
        return not_compared(&their_requests);
    }
    if let Some(error) = theirs["error"].as_str() {
        return Verdict::CdkFailed(error.chars().take(300).collect());
    }
    let directory = format!("airbyte-{name}");
    let dest = jsonl_destination(srv, &directory).await;
    let mode = |s: &String| if incremental.contains(s) { "incremental_append" } else { "full_refresh_overwrite" };
    let pipeline = srv
        .post(
            "/v1/pipelines",
            json!({ "name": name, "source_id": created["data"]["source_id"], "destination_id": dest,
                "streams": streams.iter().map(|s| json!({ "name": s, "sync_mode": mode(s) })).collect::<Vec<_>>() }),
        )
        .send()
        .await
        .unwrap();
    let pipeline_status = pipeline.status();
    let pipeline: Value = pipeline.json().await.unwrap();
    if !pipeline_status.is_success() {
        return Verdict::FailedHere(format!("making the pipeline: {pipeline_status} {pipeline}"));
    }
    let pipeline_id = pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned();
    let exports = srv.exports(ws, &directory);

    // The full read, then (where a stream has a cursor) the incremental
    // read from the state each side saved.
    let first = Round { theirs: &theirs, their_requests: &their_requests, before: BTreeMap::new() };
    let (records, requests) =
        match sync_and_compare(srv, fake, &pipeline_id, &exports, &streams, &incremental, first).await {
            Ok(counts) => counts,
            Err(verdict) => return verdict,
        };
    if incremental.is_empty() {
        return Verdict::Identical { records, requests, incremental: 0 };
    }
    let before: BTreeMap<String, usize> = streams.iter().map(|s| (s.clone(), read_lines(&exports, s).len())).collect();
    let theirs = fake
        .ask(
            json!({ "cdk": { "port": tls_port, "ca": ca_file, "state": theirs["states"], "limit": cdk_limit_secs() } }),
        )
        .await;
    let their_requests = fake.ask(json!({ "requests": true })).await["requests"].clone();
    if theirs["timed_out"] == true {
        return not_compared(&their_requests);
    }
    if let Some(error) = theirs["error"].as_str() {
        return Verdict::CdkFailed(format!("reading from its state: {}", error.chars().take(300).collect::<String>()));
    }
    let second = Round { theirs: &theirs, their_requests: &their_requests, before };
    match sync_and_compare(srv, fake, &pipeline_id, &exports, &streams, &incremental, second).await {
        Ok((again, _)) => Verdict::Identical { records, requests, incremental: again },
        Err(Verdict::Different(what)) => Verdict::Different(format!("reading from the state: {what}")),
        Err(verdict) => verdict,
    }
}

/// The verdict on a CDK read past its limit, with what it asked.
fn not_compared(requests: &Value) -> Verdict {
    let mut paths: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests.as_array().into_iter().flatten() {
        *paths.entry(r["path"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
    }
    let most = paths.iter().max_by_key(|(_, n)| **n).map(|(p, n)| format!("{p}, {n} times")).unwrap_or_default();
    Verdict::NotCompared { requests: requests.as_array().map_or(0, Vec::len), most }
}

/// One read by the CDK, to compare ours with: its records, states and
/// requests, and (for a read from a state) how many lines each stream's
/// file held before.
struct Round<'a> {
    theirs: &'a Value,
    their_requests: &'a Value,
    before: BTreeMap<String, usize>,
}

/// Syncs the pipeline once and compares its records (per stream, as
/// sorted lists), its requests (as a set) and its saved states with the
/// CDK's round: the records and requests compared, or the verdict.
async fn sync_and_compare(
    srv: &TestServer,
    fake: &mut Fake,
    pipeline_id: &str,
    exports: &Path,
    streams: &[String],
    incremental: &[String],
    round: Round<'_>,
) -> Result<(usize, usize), Verdict> {
    let job = sync(srv, pipeline_id).await;
    let our_requests = fake.ask(json!({ "requests": true })).await["requests"].clone();
    if job["status"] != "succeeded" {
        return Err(Verdict::FailedHere(format!("the sync: {}", job["error"])));
    }
    let mut records = 0;
    for stream in streams {
        // An incremental stream's file grows; the records of this read
        // are the lines past those it held.
        let skip = if incremental.contains(stream) { round.before.get(stream).copied().unwrap_or(0) } else { 0 };
        let mut ours: Vec<String> = read_lines(exports, stream).into_iter().skip(skip).collect();
        let mut cdk: Vec<String> =
            round.theirs["records"][stream].as_array().into_iter().flatten().map(|r| r.to_string()).collect();
        ours.sort();
        cdk.sort();
        if ours != cdk {
            let (here, there) = (ours.iter().find(|r| !cdk.contains(r)), cdk.iter().find(|r| !ours.contains(r)));
            // Where the first two that differ part, with some context.
            let at = match (here, there) {
                (Some(a), Some(b)) => a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count(),
                _ => 0,
            };
            let around = |r: Option<&String>| {
                r.map(|r| {
                    let start = r.floor_char_boundary(at.saturating_sub(80));
                    r[start..].chars().take(240).collect::<String>()
                })
            };
            return Err(Verdict::Different(format!(
                "stream {stream}: {} records here, {} by the CDK; first difference at byte {at}: here {:?}, CDK {:?}",
                ours.len(),
                cdk.len(),
                around(here),
                around(there),
            )));
        }
        records += ours.len();
    }
    let (ours, mut cdk) = (canonical(&our_requests), canonical(round.their_requests));
    // The host keeps an OAuth token for its lifetime, across syncs; the
    // CDK, a process per read, obtains one each time. A read here that
    // needed no token request (its API requests all the same) is the
    // same read.
    let tokens = |requests: &Value| {
        let asked = requests.as_array().into_iter().flatten().filter(|r| r["token"] == true);
        canonical(&Value::Array(asked.cloned().collect()))
    };
    if tokens(&our_requests).is_empty() {
        let theirs = tokens(round.their_requests);
        cdk.retain(|r| !theirs.contains(r));
    }
    if ours != cdk {
        let only_ours: Vec<&String> = ours.iter().filter(|r| !cdk.contains(r)).take(3).collect();
        let only_cdk: Vec<&String> = cdk.iter().filter(|r| !ours.contains(r)).take(3).collect();
        return Err(Verdict::Different(format!(
            "requests: {} here, {} by the CDK; only here {only_ours:?}, only by the CDK {only_cdk:?}",
            ours.len(),
            cdk.len()
        )));
    }
    let saved = saved_states(srv, pipeline_id).await;
    for stream in incremental {
        let mut theirs = round.theirs["states"][stream].clone();
        let mut ours = saved.get(stream).cloned().unwrap_or(Value::Null);
        // A partitioned stream keeps how long its read took, in seconds:
        // a measure, not a value the two reads can share.
        if ours["lookback_window"].is_number() && theirs["lookback_window"].is_number() {
            for state in [&mut ours, &mut theirs] {
                state.as_object_mut().map(|m| m.remove("lookback_window"));
            }
        }
        if ours != theirs {
            return Err(Verdict::Different(format!(
                "stream {stream}: the state saved here is {ours}, the CDK's {theirs}"
            )));
        }
    }
    Ok((records, ours.len()))
}

/// The states the server saved for a pipeline's streams.
async fn saved_states(srv: &TestServer, pipeline_id: &str) -> BTreeMap<String, Value> {
    use sqlx::{Connection, Row};
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
    let rows = sqlx::query("SELECT stream, state FROM pipeline_state WHERE pipeline_id = $1")
        .bind(pipeline_id)
        .fetch_all(&mut conn)
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let state: String = r.try_get("state").unwrap();
            (r.try_get("stream").unwrap(), serde_json::from_str(&state).unwrap())
        })
        .collect()
}

/// A pipeline syncing the stream `items` of `source` (as saving it
/// answered) in full into JSON lines under `directory`: its id.
async fn items_pipeline(srv: &TestServer, source: &Value, directory: &str) -> String {
    let dest = jsonl_destination(srv, directory).await;
    let pipeline = json_ok(
        srv.post(
            "/v1/pipelines",
            json!({ "name": directory, "source_id": source["data"]["source_id"], "destination_id": dest,
                "streams": [{ "name": "items", "sync_mode": "full_refresh_overwrite" }] }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    pipeline["data"]["pipeline_id"].as_str().unwrap().to_owned()
}

/// A JSON-lines destination writing into `directory`: its id.
async fn jsonl_destination(srv: &TestServer, directory: &str) -> Value {
    let body = json!({ "name": directory, "kind": "jsonl", "configuration": { "directory": directory } });
    json_ok(srv.post("/v1/destinations", body).send().await.unwrap()).await["data"]["destination_id"].clone()
}

/// Syncs a pipeline once: the job once it has ended.
async fn sync(srv: &TestServer, pipeline_id: &str) -> Value {
    let job =
        json_ok(srv.request(reqwest::Method::POST, &format!("/v1/pipelines/{pipeline_id}/sync")).send().await.unwrap())
            .await;
    wait(srv, job["data"]["job_id"].as_str().unwrap()).await
}

/// The job once it has ended (a sync of many slices may take a while).
async fn wait(srv: &TestServer, job_id: &str) -> Value {
    for _ in 0..3000 {
        let job = json_ok(srv.get(&format!("/v1/jobs/{job_id}")).send().await.unwrap()).await["data"].clone();
        if ["succeeded", "failed", "cancelled"].contains(&job["status"].as_str().unwrap_or_default()) {
            return job;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("job {job_id} did not finish in 300 s");
}

/// Where each secret goes, as the runtime's own crate reads the manifest
/// (a refusal is the source's).
fn placements(
    manifest: &Value,
    plain: &Value,
    secrets: &BTreeMap<String, String>,
) -> Result<Vec<(String, declarative::retrieve::Place)>, String> {
    let now = chrono::DateTime::parse_from_rfc3339(NOW).unwrap().with_timezone(&chrono::Utc);
    let given: Vec<String> = secrets.keys().cloned().collect();
    let plain = declarative::interpolation::Val::from(plain);
    let (source, env) = declarative::retrieve::prepare(manifest, &plain, &given, now).map_err(|e| format!("{e:?}"))?;
    let mut out: Vec<(String, declarative::retrieve::Place)> = Vec::new();
    for (_, request) in declarative::retrieve::first_requests(&source, &env) {
        for c in request.map(|r| r.credentials).unwrap_or_default() {
            if !out.iter().any(|(p, _)| *p == c.pointer) {
                out.push((c.pointer, c.place));
            }
        }
    }
    Ok(out)
}

fn remove_pointer(config: &mut Value, pointer: &str) {
    let parts: Vec<&str> = pointer.split('/').skip(1).collect();
    let Some((last, parents)) = parts.split_last() else { return };
    let mut node = config;
    for p in parents {
        let next = match node {
            Value::Array(items) => p.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
            _ => node.get_mut(*p),
        };
        match next {
            Some(next) => node = next,
            None => return,
        }
    }
    if let Some(map) = node.as_object_mut() {
        map.remove(*last);
    }
}

/// A stream's records as the JSON-lines destination wrote them, without
/// the destination's own fields, each as compact JSON text.
fn read_lines(dir: &Path, stream: &str) -> Vec<String> {
    // The file is named as the destination names a table: lower case,
    // anything but letters and digits an underscore.
    let mut table: String =
        stream.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).take(60).collect();
    if table.is_empty() || table.starts_with(|c: char| c.is_ascii_digit()) {
        table.insert(0, '_');
    }
    let Ok(text) = std::fs::read_to_string(dir.join(format!("{table}.jsonl"))) else { return Vec::new() };
    text.lines()
        .map(|line| {
            let mut record: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
            record.retain(|k, _| !k.starts_with("_service_"));
            Value::Object(record).to_string()
        })
        .collect()
}

/// The set of requests, as comparable text, sorted (a request sent twice
/// counts once: the CDK answers a repeated GET from its cache where the
/// manifest asks it to).
fn canonical(requests: &Value) -> Vec<String> {
    let mut out: Vec<String> = requests
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| json!({ "method": r["method"], "path": r["path"], "query": r["query"], "body": r["body"], "page": r["page"] }).to_string())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A server whose plugins may reach `host` only, answered there by
/// `router` behind TLS; the fake, kept alive with it, and the workspace.
async fn behind_fake(
    backend: Backend,
    host: &str,
    router: axum::Router,
) -> Option<(TestServer, testkit::provider::FakeProvider, String)> {
    let ca = TestCa::new();
    let fake = testkit::provider::FakeProvider::start(&ca, &[host], router).await;
    let pins = fake.pins(&[host]);
    let srv = TestServer::start_with(backend, |c| {
        c.plugins.egress =
            service::egress::EgressPolicy::from_settings(host, Some(&pins), Some(ca.pem.as_bytes())).unwrap();
    })
    .await?;
    let ws = srv.workspace_id().await;
    Some((srv, fake, ws))
}

/// A manifest of one stream on `host`, its key placed by `authenticator`,
/// with `extra` fields on the stream.
fn one_stream(host: &str, authenticator: Value, extra: Value) -> Value {
    let mut stream = json!({ "type": "DeclarativeStream", "name": "items", "primary_key": "id",
        "retriever": { "type": "SimpleRetriever",
            "requester": { "type": "HttpRequester", "url_base": format!("https://{host}/v1"), "path": "/items",
                "authenticator": authenticator },
            "record_selector": { "type": "RecordSelector",
                "extractor": { "type": "DpathExtractor", "field_path": ["data"] } } } });
    for (k, v) in extra.as_object().into_iter().flatten() {
        stream[k] = v.clone();
    }
    json!({ "version": "6.44.0", "type": "DeclarativeSource",
        "check": { "type": "CheckStream", "stream_names": ["items"] }, "streams": [stream],
        "spec": { "type": "Spec", "connection_specification": { "type": "object", "properties": {
            "api_key": { "type": "string", "airbyte_secret": true }, "region": { "type": "string" } } } } })
}

/// Every way a manifest could let the guest read a secret, or send one
/// where its credential is not meant to go, is refused when the source
/// is saved, by JSON pointer; the same manifest done right is saved.
async fn a_manifest_that_would_expose_a_secret_is_refused_when_saved(backend: Backend) {
    const HOST: &str = "api.example.com";
    let Some(srv) = TestServer::start_with(backend, |c| {
        c.plugins.egress = service::egress::EgressPolicy::from_settings(HOST, None, None).unwrap();
    })
    .await
    else {
        return;
    };
    let credential = |body: Value| async {
        json_ok(srv.post("/v1/credentials", body).send().await.unwrap()).await["data"]["credential_handle"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let header = credential(json!({ "kind": "secret", "connector_id": "conn_airbyte_manifest", "hosts": [HOST],
        "header": "X-Key", "secret": "key-one-0001" }))
    .await;
    let query = credential(json!({ "kind": "secret", "connector_id": "conn_airbyte_manifest", "hosts": [HOST],
        "query_parameter": "key", "secret": "key-two-0002" }))
    .await;
    let foreign = credential(json!({ "kind": "secret", "connector_id": "conn_rest_manifest", "hosts": [HOST],
        "header": "X-Key", "secret": "key-three-003" }))
    .await;
    let in_header = json!({ "type": "ApiKeyAuthenticator", "api_token": "{{ config['api_key'] }}",
        "inject_into": { "type": "RequestOption", "inject_into": "header", "field_name": "X-Key" } });
    let save = |manifest: Value, config: Value, handle: &str| {
        let configuration = json!({ "manifest": manifest, "config": config,
            "credentials": [{ "field": "/api_key", "credential_handle": handle }] });
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_airbyte_manifest", "name": "m", "configuration": configuration }),
        )
        .send()
    };
    let refused = |resp: reqwest::Response| async move {
        assert_eq!(resp.status(), 400);
        let body: Value = resp.json().await.unwrap();
        let path = body["details"]["errors"][0]["path"].as_str().map(str::to_owned);
        (body["code"].as_str().unwrap().to_owned(), path, body.to_string())
    };

    // Done right: saved.
    let ok = save(one_stream(HOST, in_header.clone(), json!({})), json!({ "region": "eu" }), &header).await.unwrap();
    assert_eq!(ok.status(), 201, "{}", ok.text().await.unwrap());

    // The secret with other text around it outside a header: only the
    // guest could write it.
    let prefixed = json!({ "type": "ApiKeyAuthenticator", "api_token": "Token {{ config['api_key'] }}",
        "inject_into": { "type": "RequestOption", "inject_into": "request_parameter", "field_name": "key" } });
    let (code, path, body) =
        refused(save(one_stream(HOST, prefixed, json!({})), json!({}), &header).await.unwrap()).await;
    assert_eq!((code.as_str(), path.as_deref()), ("CONFIGURATION_INVALID", Some("/manifest/streams/0")), "{body}");
    assert!(body.contains("other text"), "{body}");

    // Encoded into a parameter.
    let mut encoded = one_stream(HOST, in_header.clone(), json!({}));
    encoded["streams"][0]["retriever"]["requester"]["request_parameters"] =
        json!({ "sig": "{{ config['api_key'] | base64encode }}" });
    let (_, path, body) = refused(save(encoded, json!({}), &header).await.unwrap()).await;
    assert_eq!(path.as_deref(), Some("/manifest/streams/0"), "{body}");

    // Copied into every record.
    let copied = json!({ "transformations": [{ "type": "AddFields", "fields": [
        { "type": "AddedFieldDefinition", "path": ["leak"], "value": "{{ config.api_key }}" }] }] });
    let (_, path, body) =
        refused(save(one_stream(HOST, in_header.clone(), copied), json!({}), &header).await.unwrap()).await;
    assert_eq!(path.as_deref(), Some("/manifest/streams/0/transformations/0/fields/0/value"), "{body}");

    // A credential stored for another place, or for another connector.
    let (_, path, body) =
        refused(save(one_stream(HOST, in_header.clone(), json!({})), json!({}), &query).await.unwrap()).await;
    assert_eq!(path.as_deref(), Some("/credentials/0"), "{body}");
    assert!(body.contains("query parameter key"), "{body}");
    let (_, path, body) =
        refused(save(one_stream(HOST, in_header.clone(), json!({})), json!({}), &foreign).await.unwrap()).await;
    assert_eq!(path.as_deref(), Some("/credentials/0"), "{body}");

    // An OAuth client: the credential must trade its secret for a token
    // at the manifest's token endpoint, for the manifest's client.
    let oauth = |token_url: &str| {
        json!({ "type": "OAuthAuthenticator", "token_refresh_endpoint": token_url, "client_id": "client-7",
            "client_secret": "{{ config['api_key'] }}", "grant_type": "client_credentials" })
    };
    let traded = |token_url: &str, client_id: &str| {
        credential(json!({ "kind": "secret", "connector_id": "conn_airbyte_manifest", "hosts": [HOST],
            "secret": "client-secret-0004",
            "exchange": { "grant": "client_credentials", "token_url": token_url, "client_id": client_id } }))
    };
    let token_url = format!("https://{HOST}/oauth/token");
    let client = traded(&token_url, "client-7").await;
    let ok = save(one_stream(HOST, oauth(&token_url), json!({})), json!({}), &client).await.unwrap();
    assert_eq!(ok.status(), 201, "{}", ok.text().await.unwrap());
    for (handle, why) in [
        (traded(&format!("https://{HOST}/other/token"), "client-7").await, "/other/token"),
        (traded(&token_url, "client-8").await, "client id"),
        (header.clone(), "is stored to go in header"),
    ] {
        let (_, path, body) =
            refused(save(one_stream(HOST, oauth(&token_url), json!({})), json!({}), &handle).await.unwrap()).await;
        assert_eq!(path.as_deref(), Some("/credentials/0"), "{body}");
        assert!(body.contains(why), "{why}: {body}");
    }
    // A grant not built: refused by its pointer.
    let mut password = oauth(&token_url);
    password["grant_type"] = json!("password");
    let (_, path, _) = refused(save(one_stream(HOST, password, json!({})), json!({}), &client).await.unwrap()).await;
    assert_eq!(path.as_deref(), Some("/manifest/streams/0/retriever/requester/authenticator/grant_type"));

    // A host the operator does not allow.
    let (_, _, body) = refused(
        save(one_stream("elsewhere.example.net", in_header.clone(), json!({})), json!({}), &header).await.unwrap(),
    )
    .await;
    assert!(body.contains("elsewhere.example.net"), "{body}");

    // A parent stream its router reads, not listed itself: its host and
    // what it does with a secret are checked as a listed stream's are.
    let with_parent = |parent_host: &str, parameters: Value| {
        let mut manifest = one_stream(HOST, in_header.clone(), json!({}));
        let mut parent = one_stream(parent_host, in_header.clone(), json!({}))["streams"][0].clone();
        parent["name"] = json!("parents");
        parent["retriever"]["requester"]["request_parameters"] = parameters;
        manifest["streams"][0]["retriever"]["partition_router"] = json!({ "type": "SubstreamPartitionRouter",
            "parent_stream_configs": [{ "type": "ParentStreamConfig", "stream": parent, "parent_key": "id",
                "partition_field": "parent_id" }] });
        manifest
    };
    let ok = save(with_parent(HOST, json!({})), json!({}), &header).await.unwrap();
    assert_eq!(ok.status(), 201, "{}", ok.text().await.unwrap());
    let (_, _, body) =
        refused(save(with_parent("elsewhere.example.net", json!({})), json!({}), &header).await.unwrap()).await;
    assert!(body.contains("stream parents reaches elsewhere.example.net"), "{body}");
    let (_, path, body) = refused(
        save(with_parent(HOST, json!({ "sig": "{{ config['api_key'] | base64encode }}" })), json!({}), &header)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        path.as_deref(),
        Some("/manifest/streams/0/retriever/partition_router/parent_stream_configs/0/stream"),
        "{body}"
    );

    // The secret in the clear.
    let (code, _, _) = refused(
        save(one_stream(HOST, in_header.clone(), json!({})), json!({ "api_key": "key-one-0001" }), &header)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, "SECRET_NOT_ACCEPTED");

    // Python code, and what is not built yet, by pointer and name.
    let custom = json!({ "type": "CustomAuthenticator", "class_name": "source_x.components.Auth" });
    let (_, path, body) = refused(save(one_stream(HOST, custom, json!({})), json!({}), &header).await.unwrap()).await;
    assert_eq!(path.as_deref(), Some("/manifest/streams/0/retriever/requester/authenticator"), "{body}");
    assert!(body.contains("CustomAuthenticator source_x.components.Auth"), "{body}");
    srv.stop().await;
}

on_both_backends!(a_manifest_that_would_expose_a_secret_is_refused_when_saved);

on_both_backends!(a_manifest_source_may_be_large_and_other_sources_may_not);
/// A published manifest runs to hundreds of KB: its source takes up to
/// 768 KiB of configuration, where another connector's stays at 64 KiB;
/// past the limit, a 400 naming it. An incremental cursor is offered as a
/// sync mode; one the runtime cannot read is refused by its pointer.
async fn a_manifest_source_may_be_large_and_other_sources_may_not(backend: Backend) {
    const HOST: &str = "api.example.com";
    let Some(srv) = TestServer::start_with(backend, |c| {
        c.plugins.egress = service::egress::EgressPolicy::from_settings(HOST, None, None).unwrap();
    })
    .await
    else {
        return;
    };
    let save = |connector: &str, configuration: Value| {
        srv.post("/v1/sources", json!({ "connector_id": connector, "name": "big", "configuration": configuration }))
            .send()
    };
    let no_auth = json!({ "type": "NoAuth" });
    let cursor = json!({ "type": "DatetimeBasedCursor", "cursor_field": "updated_at",
        "datetime_format": "%Y-%m-%dT%H:%M:%SZ", "start_datetime": "{{ config['start_date'] }}",
        "step": "P1M", "cursor_granularity": "PT1S" });
    // 200 KB of schema descriptions: more than another source may hold.
    let properties: serde_json::Map<String, Value> = (0..100)
        .map(|i| (format!("field_{i}"), json!({ "type": "string", "description": "d".repeat(2000) })))
        .collect();
    let mut manifest = one_stream(HOST, no_auth.clone(), json!({ "incremental_sync": cursor }));
    manifest["streams"][0]["schema_loader"] =
        json!({ "type": "InlineSchemaLoader", "schema": { "type": "object", "properties": properties } });
    let configuration = json!({ "manifest": manifest, "config": { "start_date": "2024-01-01T00:00:00Z" } });
    let created = save("conn_airbyte_manifest", configuration.clone()).await.unwrap();
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    let created: Value = created.json().await.unwrap();
    let source_id = created["data"]["source_id"].as_str().unwrap();
    let plan =
        json_ok(srv.post("/v1/pipelines/prepare", json!({ "source_id": source_id })).send().await.unwrap()).await;
    let stream = &plan["data"]["streams"][0];
    assert!(stream.to_string().contains("incremental"), "{stream}");
    assert!(stream.to_string().contains("updated_at"), "{stream}");

    // Past 768 KiB: refused, naming the limit.
    let mut huge = configuration.clone();
    for i in 0..10 {
        huge["manifest"][format!("padding_{i}")] = json!("y".repeat(60_000));
    }
    let refused = save("conn_airbyte_manifest", huge).await.unwrap();
    let body = crate::support::expect_error(refused, 400, "VALIDATION_FAILED").await;
    assert_eq!(body["details"]["max_bytes"], 768 * 1024, "{body}");
    // Another connector's configuration stays within 64 KiB.
    let other = json!({ "base_url": format!("https://{HOST}"), "padding": "z".repeat(4000), "more": properties });
    let refused = save("conn_rest_manifest", other).await.unwrap();
    let body = crate::support::expect_error(refused, 400, "VALIDATION_FAILED").await;
    assert_eq!(body["details"]["max_bytes"], 64 * 1024, "{body}");

    // A cursor the runtime cannot read: refused by its pointer.
    let bad = json!({ "type": "DatetimeBasedCursor", "cursor_field": "updated_at", "datetime_format": "%Y-%m-%d",
        "start_datetime": "{{ config['start_date'] }}", "step": "P1D" });
    let manifest = one_stream(HOST, no_auth, json!({ "incremental_sync": bad }));
    let refused =
        save("conn_airbyte_manifest", json!({ "manifest": manifest, "config": { "start_date": "2024-01-01" } }))
            .await
            .unwrap();
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["details"]["errors"][0]["path"], "/manifest/streams/0/incremental_sync", "{body}");
    assert!(body.to_string().contains("cursor_granularity"), "{body}");
}

on_both_backends!(a_secret_of_the_urls_path_is_written_there_by_the_host);
/// An API whose path holds an identifier its users keep secret
/// (`/v3/a/<account>/calls.json`): the credential is stored for the URL's
/// path, the guest's URL holds a marker, and the host writes the secret
/// there. The provider's next link, which echoes it, comes back to the
/// guest with the marker, and the host fills it again; an echo in a
/// record is scrubbed. A credential stored for another place, a secret
/// twice in the path, and a path credential with another place or of
/// another kind are refused.
async fn a_secret_of_the_urls_path_is_written_there_by_the_host(backend: Backend) {
    use std::sync::{Arc, Mutex};
    const HOST: &str = "api.pathed.test";
    const ACCOUNT: &str = "acct-0123456789";
    let seen: Arc<Mutex<Vec<String>>> = Default::default();
    let router = axum::Router::new().fallback({
        let seen = seen.clone();
        move |uri: axum::http::Uri| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(uri.to_string());
                if uri.path() != format!("/v3/a/{ACCOUNT}/calls.json") {
                    return (axum::http::StatusCode::NOT_FOUND, axum::http::HeaderMap::new(), axum::Json(json!({})));
                }
                let mut headers = axum::http::HeaderMap::new();
                if uri.query().is_none() {
                    let next = format!("<https://{HOST}/v3/a/{ACCOUNT}/calls.json?page=2>; rel=\"next\"");
                    headers.insert("link", next.parse().unwrap());
                    (
                        axum::http::StatusCode::OK,
                        headers,
                        axum::Json(json!({ "calls": [{ "id": 1, "from": uri.path() }] })),
                    )
                } else {
                    (axum::http::StatusCode::OK, headers, axum::Json(json!({ "calls": [{ "id": 2 }] })))
                }
            }
        }
    });
    let Some((srv, _fake, ws)) = behind_fake(backend, HOST, router).await else {
        return;
    };
    let credential = |extra: Value| {
        let mut body = json!({ "kind": "secret", "connector_id": "conn_airbyte_manifest", "hosts": [HOST],
            "secret": ACCOUNT });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        srv.post("/v1/credentials", body).send()
    };
    for (extra, field) in [
        (json!({ "url_path": true, "header": "X-Key" }), "header"),
        (json!({ "url_path": true, "kind": "api_token" }), "kind"),
    ] {
        let resp = credential(extra).await.unwrap();
        assert_eq!(resp.status(), 400);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["details"]["field"], field, "{body}");
    }
    let handle = |resp: reqwest::Response| async {
        json_ok(resp).await["data"]["credential_handle"].as_str().unwrap().to_owned()
    };
    let in_path = handle(credential(json!({ "url_path": true })).await.unwrap()).await;
    let in_header = handle(credential(json!({ "header": "X-Key" })).await.unwrap()).await;
    let manifest = |path: &str| {
        let mut m = one_stream(HOST, json!({ "type": "NoAuth" }), json!({}));
        let retriever = &mut m["streams"][0]["retriever"];
        retriever["requester"]["url_base"] = json!(format!("https://{HOST}/v3/a/"));
        retriever["requester"]["path"] = json!(path);
        retriever["record_selector"]["extractor"]["field_path"] = json!(["calls"]);
        retriever["paginator"] = json!({ "type": "DefaultPaginator",
            "pagination_strategy": { "type": "CursorPagination", "cursor_value": "{{ headers['link']['next']['url'] }}",
                "stop_condition": "{{ 'next' not in headers['link'] }}" },
            "page_token_option": { "type": "RequestPath" } });
        m["spec"]["connection_specification"]["properties"] =
            json!({ "account_id": { "type": "string", "airbyte_secret": true } });
        m
    };
    let save = |manifest: Value, handle: &str| {
        let configuration = json!({ "manifest": manifest, "config": {},
            "credentials": [{ "field": "/account_id", "credential_handle": handle }] });
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_airbyte_manifest", "name": "pathed", "configuration": configuration }),
        )
        .send()
    };
    for (path, handle, at, why) in [
        ("{{ config['account_id'] }}/calls.json", &in_header, "/credentials/0", "is stored to go in header"),
        (
            "{{ config['account_id'] }}/{{ config['account_id'] }}/calls.json",
            &in_path,
            "/manifest/streams/0",
            "once in its path",
        ),
    ] {
        let resp = save(manifest(path), handle).await.unwrap();
        assert_eq!(resp.status(), 400);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["details"]["errors"][0]["path"], at, "{why}: {body}");
        assert!(body.to_string().contains(why), "{why}: {body}");
    }

    let source = json_ok(save(manifest("{{ config['account_id'] }}/calls.json"), &in_path).await.unwrap()).await;
    let pipeline_id = items_pipeline(&srv, &source, "pathed").await;
    let job = sync(&srv, &pipeline_id).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert!(!job.to_string().contains(ACCOUNT), "{job}");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [format!("/v3/a/{ACCOUNT}/calls.json"), format!("/v3/a/{ACCOUNT}/calls.json?page=2")],
        "the provider got the secret in the path, on the next page too"
    );
    let records = read_lines(&srv.exports(&ws, "pathed"), "items");
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(records.iter().all(|r| !r.contains(ACCOUNT)), "{records:?}");
    assert!(records.iter().any(|r| r.contains("[REDACTED]")), "{records:?}");
    srv.stop().await;
}

on_both_backends!(an_oauth_refresh_token_is_traded_by_the_host_and_the_one_it_rotates_to_is_kept);
/// A manifest's `OAuthAuthenticator` of the refresh-token grant: the
/// client's secret and the refresh token are one credential, both fields
/// name it, and the host trades them for an access token. A provider that
/// rotates refresh tokens and accepts each once (and each access token
/// for one request): the host stores the one it rotates to, so when the
/// next sync's token is refused it trades that one (with the first
/// again, the provider would refuse the grant). Neither the secret nor either refresh
/// token reaches a record, the job or the credential's record. A
/// credential of another grant, client or token endpoint, a refresh token
/// field naming another credential, and a refresh grant stored without a
/// refresh token (or a refresh token on another grant) are refused.
async fn an_oauth_refresh_token_is_traded_by_the_host_and_the_one_it_rotates_to_is_kept(backend: Backend) {
    use std::sync::{Arc, Mutex};
    const HOST: &str = "api.rotating.test";
    const CLIENT_SECRET: &str = "client-secret-0123456789";
    const FIRST: &str = "refresh-token-0-abcdef";
    #[derive(Default)]
    struct Provider {
        /// The refresh token the provider accepts next.
        current: String,
        /// The access token it last issued.
        access: String,
        /// The refresh tokens token requests carried.
        traded: Vec<String>,
    }
    let provider = Arc::new(Mutex::new(Provider { current: FIRST.into(), ..Default::default() }));
    let token = {
        let provider = provider.clone();
        move |body: String| {
            let provider = provider.clone();
            async move {
                let form: BTreeMap<String, String> =
                    url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
                let mut p = provider.lock().unwrap();
                let given = form.get("refresh_token").cloned().unwrap_or_default();
                p.traded.push(given.clone());
                let client = form.get("client_id").map(String::as_str) == Some("client-7")
                    && form.get("client_secret").map(String::as_str) == Some(CLIENT_SECRET)
                    && form.get("grant_type").map(String::as_str) == Some("refresh_token");
                if !client || given != p.current {
                    return (axum::http::StatusCode::BAD_REQUEST, axum::Json(json!({ "error": "invalid_grant" })));
                }
                let n = p.traded.len();
                p.current = format!("refresh-token-{n}-abcdef");
                p.access = format!("access-token-{n}-0123456789");
                (
                    axum::http::StatusCode::OK,
                    axum::Json(json!({ "access_token": p.access, "refresh_token": p.current, "expires_in": 3600 })),
                )
            }
        }
    };
    let items = {
        let provider = provider.clone();
        move |headers: axum::http::HeaderMap| {
            let provider = provider.clone();
            async move {
                let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                let mut p = provider.lock().unwrap();
                if p.access.is_empty() || auth != format!("Bearer {}", p.access) {
                    return (axum::http::StatusCode::UNAUTHORIZED, axum::Json(json!({ "error": "invalid_token" })));
                }
                // An access token serves one request: the next sync is
                // refused it, and the host trades again.
                p.access.clear();
                (axum::http::StatusCode::OK, axum::Json(json!({ "data": [{ "id": 1, "echo": auth }] })))
            }
        }
    };
    let router = axum::Router::new()
        .route("/oauth/token", axum::routing::post(token))
        .route("/v1/items", axum::routing::get(items));
    let Some((srv, _fake, ws)) = behind_fake(backend, HOST, router).await else {
        return;
    };
    let token_url = format!("https://{HOST}/oauth/token");
    let credential = |extra: Value| {
        let mut body = json!({ "kind": "secret", "connector_id": "conn_airbyte_manifest", "hosts": [HOST],
            "secret": CLIENT_SECRET });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        srv.post("/v1/credentials", body).send()
    };
    let refreshing = |token_url: &str, client_id: &str| {
        json!({ "exchange": { "grant": "refresh_token", "token_url": token_url, "client_id": client_id },
            "refresh_token": FIRST })
    };
    // Stored without its refresh token, or with one on another grant.
    for (extra, why) in [
        (
            json!({ "exchange": { "grant": "refresh_token", "token_url": token_url, "client_id": "client-7" } }),
            "holds the refresh token",
        ),
        (
            json!({ "exchange": { "grant": "client_credentials", "token_url": token_url, "client_id": "client-7" },
                "refresh_token": FIRST }),
            "only a credential traded by the refresh_token grant",
        ),
        (
            json!({ "exchange": { "grant": "refresh_token", "token_url": token_url, "client_id": "client-7" },
                "refresh_token": "short" }),
            "refresh token must be",
        ),
    ] {
        let resp = credential(extra).await.unwrap();
        assert_eq!(resp.status(), 400);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["details"]["field"], "refresh_token", "{body}");
        assert!(body.to_string().contains(why), "{why}: {body}");
        assert!(!body.to_string().contains(FIRST), "{body}");
    }
    let handle = |resp: reqwest::Response| async {
        json_ok(resp).await["data"]["credential_handle"].as_str().unwrap().to_owned()
    };
    let rotating = handle(credential(refreshing(&token_url, "client-7")).await.unwrap()).await;
    let manifest = {
        let oauth = json!({ "type": "OAuthAuthenticator", "token_refresh_endpoint": token_url, "client_id": "client-7",
            "client_secret": "{{ config['client_secret'] }}", "refresh_token": "{{ config['refresh_token'] }}" });
        let mut m = one_stream(HOST, oauth, json!({}));
        m["spec"]["connection_specification"]["properties"] = json!({
            "client_secret": { "type": "string", "airbyte_secret": true },
            "refresh_token": { "type": "string", "airbyte_secret": true } });
        m
    };
    let save = |secret_handle: &str, refresh_handle: Option<&str>| {
        let mut handles = vec![json!({ "field": "/client_secret", "credential_handle": secret_handle })];
        if let Some(h) = refresh_handle {
            handles.push(json!({ "field": "/refresh_token", "credential_handle": h }));
        }
        let configuration = json!({ "manifest": manifest, "config": {}, "credentials": handles });
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_airbyte_manifest", "name": "rotating", "configuration": configuration }),
        )
        .send()
    };
    // Saved with a credential of another grant, client or endpoint, or
    // with the refresh token's field naming another credential or none.
    let client_credentials = handle(
        credential(
            json!({ "exchange": { "grant": "client_credentials", "token_url": token_url, "client_id": "client-7" } }),
        )
        .await
        .unwrap(),
    )
    .await;
    let other_client = handle(credential(refreshing(&token_url, "client-8")).await.unwrap()).await;
    let other_endpoint =
        handle(credential(refreshing(&format!("https://{HOST}/other/token"), "client-7")).await.unwrap()).await;
    for (secret, refresh, at, why) in [
        (&client_credentials, Some(&client_credentials), "/credentials/0", "refresh_token grant"),
        (&other_client, Some(&other_client), "/credentials/0", "client id"),
        (&other_endpoint, Some(&other_endpoint), "/credentials/0", "/other/token"),
        (&rotating, Some(&other_client), "/credentials/1", "/refresh_token"),
        (&rotating, None, "/credentials", "/refresh_token"),
    ] {
        let resp = save(secret, refresh.map(String::as_str)).await.unwrap();
        assert_eq!(resp.status(), 400);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["details"]["errors"][0]["path"], at, "{why}: {body}");
        assert!(body.to_string().contains(why), "{why}: {body}");
    }
    assert!(provider.lock().unwrap().traded.is_empty(), "nothing is traded before a sync");

    let source = json_ok(save(&rotating, Some(&rotating)).await.unwrap()).await;
    let pipeline_id = items_pipeline(&srv, &source, "rotating").await;
    for round in 1..=2 {
        let job = sync(&srv, &pipeline_id).await;
        assert_eq!(job["status"], "succeeded", "sync {round}: {job}");
        for secret in [CLIENT_SECRET, "refresh-token-", "access-token-"] {
            assert!(!job.to_string().contains(secret), "{job}");
        }
    }
    // Each refresh token was traded once, the rotated one the second time.
    assert_eq!(provider.lock().unwrap().traded, [FIRST, "refresh-token-1-abcdef"]);
    let records = read_lines(&srv.exports(&ws, "rotating"), "items");
    assert_eq!(records.len(), 1);
    assert!(!records[0].contains("access-token-") && records[0].contains("[REDACTED]"), "{}", records[0]);
    let listed = srv.get("/v1/credentials").send().await.unwrap().text().await.unwrap();
    for secret in [CLIENT_SECRET, "refresh-token-"] {
        assert!(!listed.contains(secret), "{listed}");
    }
    srv.stop().await;
}

on_both_backends!(a_secret_framed_in_a_header_or_sent_as_the_basic_username_is_placed_by_the_host);
/// An API that wants `Authorization: Token token="<key>"`, or its key as
/// the Basic username beside a password that is none, or as both: the
/// credential is stored so (`header_prefix`/`header_suffix`, or `basic`
/// with `password` or `secret_as`), the manifest's request must match it, and the host writes
/// the secret there — the provider sees it, the records and the job never
/// do. A Basic username and password that are two secret fields name one
/// credential holding the pair; the provider echoing the username alone
/// is scrubbed too. A manifest saved with a credential stored for
/// another Basic is refused by pointer. A credential cannot frame a secret elsewhere than a header, nor
/// take a password that is itself shaped like a secret.
async fn a_secret_framed_in_a_header_or_sent_as_the_basic_username_is_placed_by_the_host(backend: Backend) {
    use std::sync::{Arc, Mutex};
    const HOST: &str = "api.framed.test";
    const KEY: &str = "framed-key-0123456789";
    const ACCOUNT: &str = "AC0123456789abcdef";
    let seen: Arc<Mutex<Vec<String>>> = Default::default();
    let router = axum::Router::new().fallback({
        let seen = seen.clone();
        move |headers: axum::http::HeaderMap| {
            let seen = seen.clone();
            async move {
                let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                seen.lock().unwrap().push(auth.clone());
                // The Basic pair decoded, as a provider echoes the account
                // it authenticated.
                let decoded = auth
                    .strip_prefix("Basic ")
                    .and_then(|b| {
                        use base64::Engine;
                        base64::engine::general_purpose::STANDARD.decode(b).ok()
                    })
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                let account = decoded.split(':').next().unwrap_or_default().to_owned();
                axum::Json(json!({ "data": [{ "id": 1, "echo": auth, "account": account }] }))
            }
        }
    });
    let Some((srv, _fake, ws)) = behind_fake(backend, HOST, router).await else {
        return;
    };
    let credential = |extra: Value| {
        let mut body = json!({ "connector_id": "conn_airbyte_manifest", "hosts": [HOST], "secret": KEY });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        srv.post("/v1/credentials", body).send()
    };
    let framed = json!({ "type": "ApiKeyAuthenticator", "api_token": "Token token=\"{{ config['api_key'] }}\"",
        "inject_into": { "type": "RequestOption", "inject_into": "header", "field_name": "Authorization" } });
    let username = json!({ "type": "BasicHttpAuthenticator", "username": "{{ config['api_key'] }}", "password": "x" });
    let both = json!({ "type": "BasicHttpAuthenticator", "username": "{{ config['api_key'] }}",
        "password": "{{ config['api_key'] }}" });
    let pair = json!({ "type": "BasicHttpAuthenticator", "username": "{{ config['account_id'] }}",
        "password": "{{ config['api_key'] }}" });
    let basic = |pair: &str| {
        use base64::Engine;
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
    };
    let cases = [
        (
            framed,
            json!({ "kind": "secret", "header": "Authorization", "header_prefix": "Token token=\"", "header_suffix": "\"" }),
            format!("Token token=\"{KEY}\""),
        ),
        (username.clone(), json!({ "kind": "basic", "password": "x" }), basic(&format!("{KEY}:x"))),
        (
            both.clone(),
            json!({ "kind": "basic", "secret_as": "username_and_password" }),
            basic(&format!("{KEY}:{KEY}")),
        ),
        // Two secret fields, one credential holding the pair.
        (
            pair.clone(),
            json!({ "kind": "basic", "secret_as": "username:password", "secret": format!("{ACCOUNT}:{KEY}") }),
            basic(&format!("{ACCOUNT}:{KEY}")),
        ),
    ];
    // A manifest whose Basic username is a secret field of its own.
    let with_account = |authenticator: Value| {
        let mut manifest = one_stream(HOST, authenticator, json!({}));
        manifest["spec"]["connection_specification"]["properties"]["account_id"] =
            json!({ "type": "string", "airbyte_secret": true });
        manifest
    };
    for (i, (authenticator, stored, expected)) in cases.into_iter().enumerate() {
        let handle = json_ok(credential(stored).await.unwrap()).await["data"]["credential_handle"].clone();
        let manifest = with_account(authenticator);
        let mut handles = vec![json!({ "field": "/api_key", "credential_handle": handle })];
        if i == 3 {
            handles.push(json!({ "field": "/account_id", "credential_handle": handle }));
        }
        let configuration = json!({ "manifest": manifest, "config": {}, "credentials": handles });
        let source = json_ok(
            srv.post(
                "/v1/sources",
                json!({ "connector_id": "conn_airbyte_manifest", "name": format!("framed {i}"),
                "configuration": configuration }),
            )
            .send()
            .await
            .unwrap(),
        )
        .await;
        let directory = format!("framed-{i}");
        let pipeline_id = items_pipeline(&srv, &source, &directory).await;
        seen.lock().unwrap().clear();
        let job = sync(&srv, &pipeline_id).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        assert_eq!(
            seen.lock().unwrap().as_slice(),
            std::slice::from_ref(&expected),
            "the provider got the secret where it wants it"
        );
        // The provider echoed it: the record holds it scrubbed.
        let records = read_lines(&srv.exports(&ws, &directory), "items");
        assert_eq!(records.len(), 1);
        assert!(!records[0].contains(KEY) && records[0].contains("[REDACTED]"), "{}", records[0]);
        assert!(!records[0].contains(ACCOUNT), "{}", records[0]);
        assert!(!job.to_string().contains(KEY));
    }
    // Each Basic manifest saved with a credential stored for another
    // Basic: refused, so the host never sends a secret as a part the
    // manifest did not name; the pair's two fields must name one
    // credential.
    let stored =
        |extra: Value| async { json_ok(credential(extra).await.unwrap()).await["data"]["credential_handle"].clone() };
    let as_username = stored(json!({ "kind": "basic", "password": "x" })).await;
    let as_both = stored(json!({ "kind": "basic", "secret_as": "username_and_password" })).await;
    let as_pair =
        stored(json!({ "kind": "basic", "secret_as": "username:password", "secret": format!("{ACCOUNT}:{KEY}") }))
            .await;
    let as_pair_too =
        stored(json!({ "kind": "basic", "secret_as": "username:password", "secret": format!("{ACCOUNT}:{KEY}") }))
            .await;
    let one = |h: &Value| vec![json!({ "field": "/api_key", "credential_handle": h })];
    let two = |a: &Value, b: &Value| {
        vec![
            json!({ "field": "/account_id", "credential_handle": a }),
            json!({ "field": "/api_key", "credential_handle": b }),
        ]
    };
    for (authenticator, handles, at) in [
        (both.clone(), one(&as_username), "/credentials/0"),
        (username.clone(), one(&as_both), "/credentials/0"),
        (both.clone(), one(&as_pair), "/credentials/0"),
        (pair.clone(), two(&as_both, &as_both), "/credentials/0"),
        (pair.clone(), two(&as_pair, &as_pair_too), "/credentials/1"),
        (pair.clone(), one(&as_pair), "/credentials"),
    ] {
        let configuration = json!({ "manifest": with_account(authenticator.clone()), "config": {},
            "credentials": handles });
        let refused = srv
            .post(
                "/v1/sources",
                json!({ "connector_id": "conn_airbyte_manifest", "name": "other basic", "configuration": configuration }),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400, "{authenticator}");
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["details"]["errors"][0]["path"], at, "{authenticator}: {body}");
    }
    // A pair that is no pair, or whose parts are too short to scrub.
    for secret in [KEY.to_owned(), format!("short:{KEY}"), format!("{ACCOUNT}:short")] {
        let body = crate::support::expect_error(
            credential(json!({ "kind": "basic", "secret_as": "username:password", "secret": secret })).await.unwrap(),
            400,
            "VALIDATION_FAILED",
        )
        .await;
        assert_eq!(body["details"]["field"], "secret", "{body}");
    }

    // Refused: a frame without a header, a frame on another kind, a
    // password beside a username, a password shaped like a secret.
    for (extra, field) in [
        (json!({ "kind": "secret", "query_parameter": "key", "header_prefix": "Token " }), "header_prefix"),
        (json!({ "kind": "api_token", "header_prefix": "Token " }), "kind"),
        (json!({ "kind": "basic", "username": "me", "password": "x" }), "password"),
        (json!({ "kind": "basic", "username": "me", "secret_as": "username_and_password" }), "secret_as"),
        (json!({ "kind": "basic", "secret_as": "password" }), "secret_as"),
        (json!({ "kind": "secret", "header": "X-Key", "secret_as": "username_and_password" }), "secret_as"),
        (json!({ "kind": "api_token", "secret_as": "username_and_password" }), "kind"),
    ] {
        let body =
            crate::support::expect_error(credential(extra.clone()).await.unwrap(), 400, "VALIDATION_FAILED").await;
        assert_eq!(body["details"]["field"], field, "{extra}: {body}");
    }
    let body = crate::support::expect_error(
        credential(json!({ "kind": "basic", "password": "sk_live_0123456789abcdefghij" })).await.unwrap(),
        400,
        "SECRET_NOT_ACCEPTED",
    )
    .await;
    assert_eq!(body["details"]["field"], "password", "{body}");
    // The manifest's frame must be the credential's.
    let handle = json_ok(
        credential(json!({ "kind": "secret", "header": "Authorization", "header_prefix": "Bearer " })).await.unwrap(),
    )
    .await["data"]["credential_handle"]
        .clone();
    let other_frame = json!({ "type": "ApiKeyAuthenticator", "api_token": "Token {{ config['api_key'] }}",
        "inject_into": { "type": "RequestOption", "inject_into": "header", "field_name": "Authorization" } });
    let configuration = json!({ "manifest": one_stream(HOST, other_frame, json!({})), "config": {},
        "credentials": [{ "field": "/api_key", "credential_handle": handle }] });
    let refused = srv
        .post(
            "/v1/sources",
            json!({ "connector_id": "conn_airbyte_manifest", "name": "other frame", "configuration": configuration }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["details"]["errors"][0]["path"], "/credentials/0", "{body}");
}

/// A paginator that asks for the page the answer's `next` names, as the
/// query parameter `page`, until there is none.
fn paged_by_next() -> Value {
    json!({ "type": "DefaultPaginator",
        "pagination_strategy": { "type": "CursorPagination", "cursor_value": "{{ response.next }}",
            "stop_condition": "{{ not response.next }}" },
        "page_token_option": { "type": "RequestOption", "inject_into": "request_parameter", "field_name": "page" } })
}

/// A fake's answer to `page` (its query) of a list of two records on
/// two pages, paged by `next` ([`paged_by_next`]).
fn two_pages(page: &str) -> Value {
    match page {
        "page=1" => json!({ "data": [{ "id": 1 }], "next": "2" }),
        _ => json!({ "data": [{ "id": 2 }], "next": null }),
    }
}

on_both_backends!(a_session_token_from_a_login_opens_each_request);
/// A manifest's `SessionTokenAuthenticator` whose login sends no secret:
/// the guest logs in and sends the token in the manifest's header — once
/// for the read with an `expiration_duration`, before every request
/// without one, as Airbyte's CDK does. A token meant for a header only
/// the host sets (`Authorization`, or `Cookie` named by a template), a
/// template around the token, a login that would send a secret and a
/// login on a host the operator does not allow are refused when the
/// source is saved, by pointer.
async fn a_session_token_from_a_login_opens_each_request(backend: Backend) {
    use std::sync::{Arc, Mutex};
    const HOST: &str = "api.session.test";
    // What the provider saw: each login, and each page with the token it
    // carried (the provider's latest, or another).
    let seen: Arc<Mutex<Vec<String>>> = Default::default();
    let router = axum::Router::new()
        .route(
            "/v1/login",
            axum::routing::get({
                let seen = seen.clone();
                move |uri: axum::http::Uri| {
                    let seen = seen.clone();
                    async move {
                        let mut seen = seen.lock().unwrap();
                        seen.push(format!("login {}", uri.query().unwrap_or_default()));
                        let n = seen.iter().filter(|s| s.starts_with("login")).count();
                        axum::Json(json!({ "session": { "token": format!("s-{n}") } }))
                    }
                }
            }),
        )
        .route(
            "/v1/items",
            axum::routing::get({
                let seen = seen.clone();
                move |uri: axum::http::Uri, headers: axum::http::HeaderMap| {
                    let seen = seen.clone();
                    async move {
                        let mut seen = seen.lock().unwrap();
                        let latest = format!("s-{}", seen.iter().filter(|s| s.starts_with("login")).count());
                        let carried = headers.get("x-session").and_then(|v| v.to_str().ok()).unwrap_or("none");
                        let page = uri.query().unwrap_or("page=1").to_owned();
                        seen.push(format!("{page} {}", if carried == latest { "latest" } else { carried }));
                        if carried != latest {
                            return (axum::http::StatusCode::UNAUTHORIZED, axum::Json(json!({})));
                        }
                        (axum::http::StatusCode::OK, axum::Json(two_pages(&page)))
                    }
                }
            }),
        );
    let Some((srv, _fake, ws)) = behind_fake(backend, HOST, router).await else {
        return;
    };
    let session = |expiration: Option<&str>, header: &str| {
        let mut auth = json!({ "type": "SessionTokenAuthenticator",
            "login_requester": { "type": "HttpRequester", "url_base": format!("https://{HOST}/v1"), "path": "/login",
                "http_method": "GET", "request_parameters": { "region": "{{ config['region'] }}" } },
            "session_token_path": ["session", "token"],
            "request_authentication": { "type": "ApiKey",
                "inject_into": { "type": "RequestOption", "inject_into": "header", "field_name": header } } });
        if let Some(e) = expiration {
            auth["expiration_duration"] = json!(e);
        }
        let mut m = one_stream(HOST, auth, json!({}));
        m["streams"][0]["retriever"]["paginator"] = paged_by_next();
        m
    };
    let save = |manifest: Value, credentials: Value| {
        let configuration = json!({ "manifest": manifest, "config": { "region": "eu" }, "credentials": credentials });
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_airbyte_manifest", "name": "session", "configuration": configuration }),
        )
        .send()
    };

    // Refused: the token in the host's header, and a login sending a secret.
    let mut bearer = session(None, "X-Session");
    bearer["streams"][0]["retriever"]["requester"]["authenticator"]["request_authentication"] =
        json!({ "type": "Bearer" });
    let mut secret_login = session(None, "X-Session");
    secret_login["streams"][0]["retriever"]["requester"]["authenticator"]["login_requester"]["request_parameters"]["key"] =
        json!("{{ config['api_key'] }}");
    let mut with_template = session(None, "X-Session");
    with_template["streams"][0]["retriever"]["requester"]["authenticator"]["request_authentication"]["api_token"] =
        json!("Token {{ session_token }}");
    let mut elsewhere = session(None, "X-Session");
    elsewhere["streams"][0]["retriever"]["requester"]["authenticator"]["login_requester"]["url_base"] =
        json!("https://login.elsewhere.test/v1");
    let key = json_ok(
        srv.post(
            "/v1/credentials",
            json!({ "kind": "secret", "connector_id": "conn_airbyte_manifest", "hosts": [HOST],
                "secret": "key-0123456789", "query_parameter": "key" }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await["data"]["credential_handle"]
        .clone();
    for (manifest, credentials, at, why) in [
        (
            bearer,
            json!([]),
            "/manifest/streams/0/retriever/requester/authenticator/request_authentication",
            "only the host sets that header",
        ),
        (
            session(None, "Authorization"),
            json!([]),
            "/manifest/streams/0/retriever/requester/authenticator/request_authentication",
            "in the Authorization header",
        ),
        (
            session(None, "{{ 'Cook' + 'ie' }}"),
            json!([]),
            "/manifest/streams/0/retriever/requester/authenticator/request_authentication",
            "in the Cookie header",
        ),
        (
            with_template,
            json!([]),
            "/manifest/streams/0/retriever/requester/authenticator/request_authentication/api_token",
            "not supported yet",
        ),
        (
            secret_login,
            json!([{ "field": "/api_key", "credential_handle": key }]),
            "/manifest/streams/0",
            "login would send a secret",
        ),
        (elsewhere, json!([]), "/manifest", "not a host the operator allows"),
    ] {
        let resp = save(manifest, credentials).await.unwrap();
        assert_eq!(resp.status(), 400);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["details"]["errors"][0]["path"], at, "{why}: {body}");
        assert!(body.to_string().contains(why), "{why}: {body}");
    }

    // Read: with an expiration, one login; without, one before each page.
    for (expiration, directory, expected) in [
        (Some("PT1H"), "kept", vec!["login region=eu", "page=1 latest", "page=2 latest"]),
        (None, "each", vec!["login region=eu", "page=1 latest", "login region=eu", "page=2 latest"]),
    ] {
        seen.lock().unwrap().clear();
        let source = json_ok(save(session(expiration, "X-Session"), json!([])).await.unwrap()).await;
        let pipeline_id = items_pipeline(&srv, &source, directory).await;
        let job = sync(&srv, &pipeline_id).await;
        assert_eq!(job["status"], "succeeded", "{expiration:?}: {job}");
        assert_eq!(*seen.lock().unwrap(), expected, "{expiration:?}");
        assert_eq!(read_lines(&srv.exports(&ws, directory), "items").len(), 2, "{expiration:?}");
    }
    srv.stop().await;
}

on_both_backends!(a_login_that_sends_a_secret_is_made_by_the_host);
/// A `SessionTokenAuthenticator` whose login sends a password (a secret
/// field): the host logs in with the credential's `login` exchange, which
/// must say what the manifest says, and puts the token in each request —
/// in the manifest's header, or as a bearer token, logging in again when
/// the API refuses a spent session. The guest never sends the login, nor
/// holds the password or the token; the provider sees the password in
/// the login alone.
async fn a_login_that_sends_a_secret_is_made_by_the_host(backend: Backend) {
    use std::sync::{Arc, Mutex};
    const HOST: &str = "api.login.test";
    const PASSWORD: &str = "pw-0123456789-login";
    // What the provider saw: each login (its body), and each page with
    // the token it carried (the latest, or what it was).
    let seen: Arc<Mutex<Vec<String>>> = Default::default();
    let router = axum::Router::new()
        .route(
            "/v1/login",
            axum::routing::post({
                let seen = seen.clone();
                move |body: String| {
                    let seen = seen.clone();
                    async move {
                        let mut seen = seen.lock().unwrap();
                        seen.push(format!("login {body}"));
                        let sent: Value = serde_json::from_str(&body).unwrap_or_default();
                        if sent != json!({ "user": "ana", "password": PASSWORD }) {
                            return (axum::http::StatusCode::UNAUTHORIZED, axum::Json(json!({})));
                        }
                        let n = seen.iter().filter(|s| s.starts_with("login")).count();
                        (axum::http::StatusCode::OK, axum::Json(json!({ "auth": { "token": format!("s-{n}") } })))
                    }
                }
            }),
        )
        .route(
            "/v1/items",
            axum::routing::get({
                let seen = seen.clone();
                move |uri: axum::http::Uri, headers: axum::http::HeaderMap| {
                    let seen = seen.clone();
                    async move {
                        let mut seen = seen.lock().unwrap();
                        let latest = format!("s-{}", seen.iter().filter(|s| s.starts_with("login")).count());
                        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
                        let carried = match (header("x-session"), header("authorization")) {
                            (Some(token), None) => format!("x-session {token}"),
                            (None, Some(auth)) => format!("authorization {auth}"),
                            (a, b) => format!("{a:?} {b:?}"),
                        };
                        let fresh = carried == format!("x-session {latest}")
                            || carried == format!("authorization Bearer {latest}");
                        // A session opens one page: the next asks for a
                        // login again.
                        let spent = seen.last().is_some_and(|last| last.ends_with(" latest"));
                        let page = uri.query().unwrap_or("page=1").to_owned();
                        let said = match (fresh, spent) {
                            (true, false) => "latest",
                            (true, true) => "spent",
                            (false, _) => &carried,
                        };
                        seen.push(format!("{page} {said}"));
                        if said != "latest" {
                            return (axum::http::StatusCode::UNAUTHORIZED, axum::Json(json!({})));
                        }
                        (axum::http::StatusCode::OK, axum::Json(two_pages(&page)))
                    }
                }
            }),
        );
    let Some((srv, _fake, ws)) = behind_fake(backend, HOST, router).await else {
        return;
    };
    let session = |sent: Value| {
        let auth = json!({ "type": "SessionTokenAuthenticator",
            "login_requester": { "type": "HttpRequester", "url_base": format!("https://{HOST}/v1"), "path": "/login",
                "http_method": "POST",
                "request_body_json": { "user": "{{ config['username'] }}", "password": "{{ config['password'] }}" } },
            "session_token_path": ["auth", "token"], "expiration_duration": "PT1H",
            "request_authentication": sent });
        let mut m = one_stream(HOST, auth, json!({}));
        m["streams"][0]["retriever"]["paginator"] = paged_by_next();
        m["spec"]["connection_specification"]["properties"] = json!({ "username": { "type": "string" },
            "password": { "type": "string", "airbyte_secret": true } });
        m
    };
    let in_header = json!({ "type": "ApiKey",
        "inject_into": { "type": "RequestOption", "inject_into": "header", "field_name": "X-Session" } });
    let save = |manifest: Value, credentials: Value| {
        let configuration =
            json!({ "manifest": manifest, "config": { "username": "ana" }, "credentials": credentials });
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_airbyte_manifest", "name": "login", "configuration": configuration }),
        )
        .send()
    };
    let credential = |extra: Value| {
        let mut body = json!({ "kind": "secret", "connector_id": "conn_airbyte_manifest", "hosts": [HOST],
            "secret": PASSWORD });
        body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap());
        async {
            json_ok(srv.post("/v1/credentials", body).send().await.unwrap()).await["data"]["credential_handle"].clone()
        }
    };
    let login = |username: &str, header: Option<&str>, lifetime: u64| {
        let mut exchange = json!({ "grant": "login", "token_url": format!("https://{HOST}/v1/login"),
            "username": username, "username_field": "user", "password_field": "password",
            "token_pointer": "/auth/token", "lifetime_secs": lifetime });
        if let Some(h) = header {
            exchange["header"] = json!(h);
        }
        json!({ "exchange": exchange })
    };

    // Refused when saved, at the credential: none given, one that trades
    // the secret otherwise, and logins that say otherwise than the
    // manifest.
    let oauth = credential(json!({ "exchange": { "grant": "client_credentials",
        "token_url": format!("https://{HOST}/v1/login"), "client_id": "app", "header": "X-Session" } }))
    .await;
    let someone_else = credential(login("bob", Some("X-Session"), 3600)).await;
    let shorter = credential(login("ana", Some("X-Session"), 60)).await;
    let elsewhere = credential(login("ana", Some("X-Other"), 3600)).await;
    for (handle, why) in [
        (None, "/password"),
        (Some(&oauth), "an exchange of the login grant"),
        (Some(&someone_else), "username is not the credential's"),
        (Some(&shorter), "expiration_duration"),
        (Some(&elsewhere), "x-session"),
    ] {
        let credentials = match handle {
            Some(h) => json!([{ "field": "/password", "credential_handle": h }]),
            None => json!([]),
        };
        let resp = save(session(in_header.clone()), credentials).await.unwrap();
        assert_eq!(resp.status(), 400, "{why}");
        let body: Value = resp.json().await.unwrap();
        assert!(body.to_string().to_lowercase().contains(&why.to_lowercase()), "{why}: {body}");
        assert!(!body.to_string().contains(PASSWORD), "{body}");
    }

    // Read: one login by the host, then the token in each request, in the
    // manifest's header or as a bearer token.
    for (sent, header, directory, carried) in [
        (in_header.clone(), Some("X-Session"), "header", "x-session"),
        (json!({ "type": "Bearer" }), None, "bearer", "authorization"),
    ] {
        seen.lock().unwrap().clear();
        let handle = credential(login("ana", header, 3600)).await;
        let source =
            json_ok(save(session(sent), json!([{ "field": "/password", "credential_handle": handle }])).await.unwrap())
                .await;
        assert!(!source.to_string().contains(PASSWORD), "{source}");
        let pipeline_id = items_pipeline(&srv, &source, directory).await;
        let job = sync(&srv, &pipeline_id).await;
        assert_eq!(job["status"], "succeeded", "{carried}: {job}");
        // The session spent, the API's 401 has the host log in again and
        // send the page's request once more.
        let login = format!("login {}", json!({ "user": "ana", "password": PASSWORD }));
        let expected = [&login, "page=1 latest", "page=2 spent", &login, "page=2 latest"].map(str::to_owned);
        assert_eq!(*seen.lock().unwrap(), expected, "{carried}");
        assert_eq!(read_lines(&srv.exports(&ws, directory), "items").len(), 2, "{carried}");
        assert!(!job.to_string().contains(PASSWORD) && !job.to_string().contains("s-1"), "{job}");
    }
    srv.stop().await;
}

on_both_backends!(a_secret_in_an_array_of_the_configuration_takes_a_credential_per_item);
/// A spec whose array items hold a secret field (an API key per app): the
/// item's field (`/apps/1/key`) takes a credential of its own, which the
/// host places; the same field given in the clear is refused.
async fn a_secret_in_an_array_of_the_configuration_takes_a_credential_per_item(backend: Backend) {
    use std::sync::{Arc, Mutex};
    const HOST: &str = "api.apps.test";
    const KEY: &str = "app-key-0123456789";
    let seen: Arc<Mutex<Vec<String>>> = Default::default();
    let router = axum::Router::new().route(
        "/v1/items",
        axum::routing::get({
            let seen = seen.clone();
            move |uri: axum::http::Uri, headers: axum::http::HeaderMap| {
                let seen = seen.clone();
                async move {
                    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("none");
                    seen.lock().unwrap().push(format!("{} {auth}", uri.query().unwrap_or_default()));
                    axum::Json(json!({ "data": [{ "id": 1 }] }))
                }
            }
        }),
    );
    let Some((srv, _fake, ws)) = behind_fake(backend, HOST, router).await else {
        return;
    };
    let mut manifest = one_stream(
        HOST,
        json!({ "type": "BearerAuthenticator", "api_token": "{{ config['apps'][1]['key'] }}" }),
        json!({}),
    );
    manifest["streams"][0]["retriever"]["requester"]["request_parameters"] =
        json!({ "app": "{{ config['apps'][1]['id'] }}" });
    manifest["spec"]["connection_specification"]["properties"] = json!({ "apps": { "type": "array",
        "items": { "type": "object", "properties": {
            "id": { "type": "string" }, "key": { "type": "string", "airbyte_secret": true } } } } });
    let save = |apps: Value, credentials: Value| {
        let configuration =
            json!({ "manifest": manifest.clone(), "config": { "apps": apps }, "credentials": credentials });
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_airbyte_manifest", "name": "apps", "configuration": configuration }),
        )
        .send()
    };
    let resp = save(json!([{ "id": "a" }, { "id": "b", "key": KEY }]), json!([])).await.unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(body.to_string().contains("apps") && !body.to_string().contains(KEY), "{body}");
    let handle = json_ok(
        srv.post(
            "/v1/credentials",
            json!({ "kind": "api_token", "connector_id": "conn_airbyte_manifest", "hosts": [HOST], "secret": KEY }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await["data"]["credential_handle"]
        .clone();
    let source = json_ok(
        save(json!([{ "id": "a" }, { "id": "b" }]), json!([{ "field": "/apps/1/key", "credential_handle": handle }]))
            .await
            .unwrap(),
    )
    .await;
    let pipeline_id = items_pipeline(&srv, &source, "apps").await;
    let job = sync(&srv, &pipeline_id).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(*seen.lock().unwrap(), [format!("app=b Bearer {KEY}")]);

    // Through a list router's values: each item's requests need that
    // item's credential, which is known when the source is saved.
    let mut routed = one_stream(HOST, json!({ "type": "NoAuth" }), json!({}));
    routed["streams"][0]["retriever"]["requester"]["request_headers"] =
        json!({ "X-Key": "{{ stream_partition['app']['key'] }}" });
    routed["streams"][0]["retriever"]["partition_router"] =
        json!({ "type": "ListPartitionRouter", "values": "{{ config['apps'] }}", "cursor_field": "app" });
    let handle = json_ok(
        srv.post(
            "/v1/credentials",
            json!({ "kind": "secret", "connector_id": "conn_airbyte_manifest", "hosts": [HOST], "header": "X-Key",
                "secret": KEY }),
        )
        .send()
        .await
        .unwrap(),
    )
    .await["data"]["credential_handle"]
        .clone();
    routed["spec"] = manifest["spec"].clone();
    let save_routed = |credentials: Value| {
        let configuration = json!({ "manifest": routed.clone(), "config": { "apps": [{ "id": "a" }, { "id": "b" }] },
            "credentials": credentials });
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_airbyte_manifest", "name": "routed", "configuration": configuration }),
        )
        .send()
    };
    let resp = save_routed(json!([{ "field": "/apps/1/key", "credential_handle": handle }])).await.unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["details"]["errors"][0]["path"], "/credentials", "{body}");
    assert!(body.to_string().contains("/apps/0/key"), "{body}");
    let resp = save_routed(json!([{ "field": "/apps/0/key", "credential_handle": handle },
        { "field": "/apps/1/key", "credential_handle": handle }]))
    .await
    .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    assert_eq!(read_lines(&srv.exports(&ws, "apps"), "items").len(), 1);
    srv.stop().await;
}

on_both_backends!(an_api_budget_paces_the_requests_its_policies_match);
/// A manifest's `api_budget`: the guest keeps to the first policy that
/// matches each request (here two calls in any second, the limit read
/// from the configuration), so the provider never sees a third request
/// within a second. A limit that reads a secret, which the guest could
/// only set knowing it, is refused when the source is saved, by pointer.
async fn an_api_budget_paces_the_requests_its_policies_match(backend: Backend) {
    use std::sync::{Arc, Mutex};
    const HOST: &str = "api.budget.test";
    let seen: Arc<Mutex<Vec<std::time::Instant>>> = Default::default();
    let router = axum::Router::new().route(
        "/v1/items",
        axum::routing::get({
            let seen = seen.clone();
            move |uri: axum::http::Uri| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(std::time::Instant::now());
                    let page: u64 = uri.query().and_then(|q| q.strip_prefix("page=")).map_or(1, |p| p.parse().unwrap());
                    let next = if page < 5 { json!((page + 1).to_string()) } else { json!(null) };
                    axum::Json(json!({ "data": [{ "id": page }], "next": next }))
                }
            }
        }),
    );
    let Some((srv, _fake, ws)) = behind_fake(backend, HOST, router).await else {
        return;
    };
    let budgeted = |limit: &str| {
        let mut m = one_stream(HOST, json!({ "type": "NoAuth" }), json!({}));
        m["streams"][0]["retriever"]["paginator"] = paged_by_next();
        m["api_budget"] = json!({ "type": "HTTPAPIBudget", "policies": [
            { "type": "UnlimitedCallRatePolicy", "matchers": [{ "method": "POST" }] },
            { "type": "MovingWindowCallRatePolicy", "rates": [{ "limit": limit, "interval": "PT1S" }],
              "matchers": [{ "method": "GET", "url_path_pattern": "^/v1/items$" }] }] });
        m
    };
    let save = |manifest: Value| {
        let configuration =
            json!({ "manifest": manifest, "config": { "region": "eu", "per_second": 2 }, "credentials": [] });
        srv.post(
            "/v1/sources",
            json!({ "connector_id": "conn_airbyte_manifest", "name": "budget", "configuration": configuration }),
        )
        .send()
    };

    let resp = save(budgeted("{{ 100 if 'sk_test_' in config['api_key'] else 25 }}")).await.unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["details"]["errors"][0]["path"], "/manifest/api_budget/policies/1/rates/0/limit", "{body}");
    assert!(body.to_string().contains("reads a secret"), "{body}");

    let source = json_ok(save(budgeted("{{ config['per_second'] }}")).await.unwrap()).await;
    let pipeline_id = items_pipeline(&srv, &source, "paced").await;
    let job = sync(&srv, &pipeline_id).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(read_lines(&srv.exports(&ws, "paced"), "items").len(), 5);
    let times = seen.lock().unwrap().clone();
    assert_eq!(times.len(), 5);
    for (i, pair) in times.windows(3).enumerate() {
        let apart = pair[2].duration_since(pair[0]);
        // The guest lets the third go a second after it let the first go;
        // the first may have been slower on its way (a new connection).
        assert!(apart >= std::time::Duration::from_millis(900), "requests {i} and {}: {apart:?} apart", i + 2);
    }
    srv.stop().await;
}
