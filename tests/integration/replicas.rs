//! Server processes as an installation runs them, several on one
//! control database: jobs taken over after `kill -9`, one job of a
//! pipeline at a time across processes, a job keeping its plugin version,
//! the server's own PostgreSQL settings kept from destinations, and
//! exactly once when a process is killed mid-read.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::events::{routes, slow_events};
use crate::support::fakepg::FakePostgres;
use crate::support::process::ServerProcess;
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::replicas::{CrashInto, CrashTarget, Processes};
use crate::support::{json, json_ok, test_plugin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_server_was_killed_is_taken_over_without_duplicate_rows() {
    crate::support::init_crypto();
    let ca = TestCa::new();
    let events = slow_events("crash-test-source-token", 1200, 150);
    let provider = FakeProvider::start(&ca, &["api.source.test"], routes(events.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("SERVICE_JOB_LEASE_SECS", "2".into()));
    let mut first = ServerProcess::start(procs.env.clone()).await;
    let base = first.base.clone();
    let pipeline = procs.pipeline(&base, &events, 60).await;
    let job =
        json_ok(procs.api(&base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let job_id = job["data"]["job_id"].as_str().unwrap().to_owned();
    // Kill the server once some records are written.
    for _ in 0..400 {
        let j = json_ok(procs.api(&base, Method::GET, &format!("/v1/jobs/{job_id}")).send().await.unwrap()).await;
        if j["data"]["progress"]["records"].as_u64().unwrap_or(0) >= 120 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    first.kill();
    events.delay_ms.store(0, Ordering::SeqCst);

    let second = ServerProcess::start(procs.env.clone()).await;
    let last = procs.wait(&second.base, &job_id).await;
    let attempts =
        json_ok(procs.api(&second.base, Method::GET, &format!("/v1/jobs/{job_id}/attempts")).send().await.unwrap())
            .await;
    drop(second);
    assert_eq!(last["status"], "succeeded", "{last}");
    assert_eq!(last["attempts"], 2, "taken over after the lease expired: {last}");
    let a = &attempts["data"]["items"];
    assert_eq!((a[0]["attempt"].as_i64(), a[0]["outcome"].as_str()), (Some(1), Some("abandoned")), "{attempts}");
    assert!(a[0]["error"].as_str().unwrap().contains("lease"));
    assert_eq!((a[1]["attempt"].as_i64(), a[1]["outcome"].as_str()), (Some(2), Some("succeeded")), "{attempts}");
    assert_eq!(procs.rows().await, 1200, "every record once, no duplicates");
}

/// Two `service serve` processes on one PostgreSQL database, both with
/// runners: sync requests spread over both make one job per round, and
/// only one runner ever reads for it. Needs `SERVICE_TEST_DATABASE_URL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_on_one_postgres_never_run_two_jobs_of_one_pipeline() {
    crate::support::init_crypto();
    // None has printed why it skipped.
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let ca = TestCa::new();
    let events = slow_events("replica-test-source-token", 600, 80);
    let provider = FakeProvider::start(&ca, &["api.source.test"], routes(events.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("DATABASE_URL", db.url.clone()));
    // One after the other: the first creates the shared key file.
    let a = ServerProcess::start(procs.env.clone()).await;
    let b = ServerProcess::start(procs.env.clone()).await;
    let (base_a, base_b) = (a.base.clone(), b.base.clone());
    let pipeline = procs.pipeline(&base_a, &events, 100).await;
    for round in 0..3 {
        // The round's job reads nothing until every request is answered, so
        // however slowly the servers answer, each request meets it active.
        events.hold_page_size.store(100, Ordering::SeqCst);
        let mut requests = Vec::new();
        for i in 0..20 {
            let req = procs.api(
                if i % 2 == 0 { &base_a } else { &base_b },
                Method::POST,
                &format!("/v1/pipelines/{pipeline}/sync"),
            );
            requests.push(tokio::spawn(async move { json(req.send().await.unwrap()).await }));
        }
        let mut created = Vec::new();
        for r in requests {
            let (status, body) = r.await.unwrap();
            match status {
                StatusCode::CREATED => created.push(body["data"]["job_id"].as_str().unwrap().to_owned()),
                StatusCode::CONFLICT => assert_eq!(body["code"], "EXECUTION_CONFLICT", "{body}"),
                other => panic!("round {round}: unexpected {other}: {body}"),
            }
        }
        assert_eq!(created.len(), 1, "round {round}: one job across both servers: {created:?}");
        events.hold_page_size.store(0, Ordering::SeqCst);
        let job = procs.wait(&base_b, &created[0]).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        assert_eq!(job["attempts"], 1, "never claimed twice: {job}");
    }
    drop((a, b));
    assert_eq!(events.max_in_flight.load(Ordering::SeqCst), 1, "only one runner read at a time");
    assert_eq!(procs.rows().await, 600, "every record once");
}

/// Upgrades drain, on two server processes sharing one PostgreSQL
/// database: a sync that started on version 1 finishes on version 1 while
/// version 2 is made current mid-sync, even when its server dies and
/// another takes the job over; the next sync runs version 2. Only the
/// first server ever has the plugin's files: the second runs what the
/// database holds. Needs `SERVICE_TEST_DATABASE_URL` (or the local server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_finishes_on_the_plugin_version_it_started_with_while_another_becomes_current() {
    crate::support::init_crypto();
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let ca = TestCa::new();
    // Slow pages (24 of them) until the first server is gone, then quick.
    let events = slow_events("upgrade-test-source-token", 1200, 600);
    let provider = FakeProvider::start(&ca, &["api.source.test"], routes(events.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("DATABASE_URL", db.url.clone()));
    procs.env.push(("SERVICE_JOB_LEASE_SECS", "2".into()));
    let files = procs.dir().join("plugins");
    std::fs::copy(test_plugin("test_versioned_one"), files.join("versioned.wasm")).unwrap();
    let mut a = ServerProcess::start(procs.env.clone()).await;
    let base_a = a.base.clone();
    let destination = json!({ "name": "w", "kind": "sqlite", "configuration": { "file": "w.db" } });
    let pipeline =
        procs.pipeline_of(&base_a, "test_versioned", &events.token, 50, destination, "full_refresh_overwrite").await;
    let sync = |base: &str| {
        let req = procs.api(base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync"));
        async move { json_ok(req.send().await.unwrap()).await["data"]["job_id"].as_str().unwrap().to_owned() }
    };
    let job_id = sync(&base_a).await;
    let job_path = format!("/v1/jobs/{job_id}");
    for _ in 0..400 {
        let j = json_ok(procs.api(&base_a, Method::GET, &job_path).send().await.unwrap()).await;
        if j["data"]["progress"]["records"].as_u64().unwrap_or(0) >= 100 {
            assert_eq!(j["data"]["plugin"]["version"], "1.0.0", "{j}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // Version 2 arrives; it is installed, not run, until made current.
    std::fs::copy(test_plugin("test_versioned_two"), files.join("versioned-2.wasm")).unwrap();
    let versions_path = "/v1/admin/plugins/test_versioned/versions";
    let mut versions = Value::Null;
    for _ in 0..200 {
        versions = json_ok(procs.api(&base_a, Method::GET, versions_path).send().await.unwrap()).await;
        if versions["data"]["items"].as_array().unwrap().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let items = versions["data"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{versions}");
    assert_eq!((items[0]["version"].as_str(), items[0]["current"].as_bool()), (Some("1.0.0"), Some(true)));
    assert_eq!((items[1]["version"].as_str(), items[1]["current"].as_bool()), (Some("2.0.0"), Some(false)));
    let used = procs.api(&base_a, Method::POST, "/v1/admin/plugins/test_versioned/use");
    let used = json_ok(used.json(&json!({ "version": "2.0.0" })).send().await.unwrap()).await;
    assert_eq!((used["data"]["version"].as_str(), used["data"]["available"].as_bool()), (Some("2.0.0"), Some(true)));
    let running = json_ok(procs.api(&base_a, Method::GET, &job_path).send().await.unwrap()).await;
    assert_eq!(running["data"]["status"], "running", "version 2 became current mid-sync: {running}");

    // The first server dies mid-sync; the second, with no plugin file,
    // takes the job over and finishes it on version 1.
    a.kill();
    events.delay_ms.store(0, Ordering::SeqCst);
    let elsewhere = procs.dir().join("plugins-b");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let mut env_b = procs.env.clone();
    env_b.retain(|(k, _)| *k != "SERVICE_PLUGINS_DIR");
    env_b.push(("SERVICE_PLUGINS_DIR", elsewhere.display().to_string()));
    let b = ServerProcess::start(env_b).await;
    let first = procs.wait(&b.base, &job_id).await;
    assert_eq!((first["status"].as_str(), first["attempts"].as_i64()), (Some("succeeded"), Some(2)), "{first}");
    assert_eq!(first["plugin"]["version"], "1.0.0", "{first}");
    assert_eq!(stamps(&procs.warehouse()).await, vec![("1.0.0".to_owned(), 1200)], "every record read by version 1");

    // The next sync runs version 2.
    let next = sync(&b.base).await;
    let second = procs.wait(&b.base, &next).await;
    assert_eq!((second["status"].as_str(), second["plugin"]["version"].as_str()), (Some("succeeded"), Some("2.0.0")));
    assert_eq!(stamps(&procs.warehouse()).await, vec![("2.0.0".to_owned(), 1200)]);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_never_get_the_servers_own_postgres_settings_or_an_unverified_password() {
    crate::support::init_crypto();
    let ca = TestCa::new();
    let events = slow_events("ambient-test-source-token", 10, 0);
    let provider = FakeProvider::start(&ca, &["api.source.test"], routes(events.clone())).await;
    let pg = FakePostgres::start().await;
    let mut procs = Processes::new(&ca, &provider);
    // The server's own settings, as an operator might have them for the
    // control database, and a pgpass file in its home.
    let home = crate::support::private_dir();
    std::fs::write(home.path().join(".pgpass"), "*:*:*:*:canary-pgpass-password\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(home.path().join(".pgpass"), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    for (k, v) in [
        ("PGPASSWORD", "canary-env-password".to_owned()),
        ("PGUSER", "canary_env_user".to_owned()),
        ("PGDATABASE", "canary_env_db".to_owned()),
        ("PGOPTIONS", "-c search_path=canary".to_owned()),
        ("PGAPPNAME", "canary-app".to_owned()),
        ("HOME", home.path().display().to_string()),
        ("PGPASSFILE", home.path().join(".pgpass").display().to_string()),
        ("SERVICE_WAREHOUSE_ALLOWED_HOSTS", "127.0.0.1".to_owned()),
    ] {
        procs.env.push((k, v));
    }
    let server = ServerProcess::start(procs.env.clone()).await;
    let base = server.base.clone();
    let url = format!("postgres://loader@127.0.0.1:{}/warehouse", pg.addr.port());
    let pipeline = procs
        .pipeline_into(&base, &events, 50, json!({ "name": "pg", "kind": "postgres", "configuration": { "url": url } }))
        .await;
    let job =
        json_ok(procs.api(&base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let job = procs.wait(&base, job["data"]["job_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "failed", "{job}");
    let seen = pg.connections();
    assert!(!seen.is_empty(), "the destination was tried");
    for s in &seen {
        assert_eq!(s.startup.get("user").map(String::as_str), Some("loader"), "{s:?}");
        assert_eq!(s.startup.get("database").map(String::as_str), Some("warehouse"), "{s:?}");
        assert_eq!(s.password.as_deref(), Some(""), "no password from the environment or pgpass: {s:?}");
        assert!(!format!("{s:?}").contains("canary"), "{s:?}");
    }

    // With a stored password, the connection must verify TLS first: this
    // server offers none, so the password never leaves.
    let before = seen.len();
    let cred = json_ok(
        procs
            .api(&base, Method::POST, "/v1/credentials")
            .json(&json!({ "hosts": ["127.0.0.1"], "secret": "canary-stored-password" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let dest = json!({ "name": "pg2", "kind": "postgres", "configuration": { "url": url, "credential_handle": cred["data"]["credential_handle"] } });
    let pipeline = procs.pipeline_into(&base, &events, 50, dest).await;
    let job =
        json_ok(procs.api(&base, Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap()).await;
    let job = procs.wait(&base, job["data"]["job_id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "failed", "{job}");
    let seen = pg.connections();
    assert!(seen.len() > before, "tried again");
    for s in &seen[before..] {
        assert!(s.asked_for_tls, "{s:?}");
        assert!(s.password.is_none() && s.startup.is_empty(), "nothing was sent without TLS: {s:?}");
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_database_still_takes_the_servers_postgres_settings() {
    // None has printed why it skipped.
    let Some(db) = crate::support::PgDatabase::create().await else { return };
    let name = url::Url::parse(&db.url).unwrap().path().trim_start_matches('/').to_owned();
    let admin = url::Url::parse(&db.url).unwrap();
    let dir = crate::support::private_dir();
    let env = vec![
        ("SERVICE_DATA_DIR", dir.path().display().to_string()),
        ("DATABASE_URL", format!("postgres:///{name}")),
        ("PGHOST", admin.host_str().unwrap().to_owned()),
        ("PGPORT", admin.port().unwrap_or(5432).to_string()),
        ("PGUSER", admin.username().to_owned()),
    ];
    let server = ServerProcess::start(env).await;
    let ready = reqwest::get(format!("{}/readyz", server.base)).await.unwrap();
    drop(server);
    assert!(ready.status().is_success(), "the control database was reached through PGHOST/PGPORT/PGUSER");
}

/// Exactly once for the bundled REST source in an append: its pages
/// checkpoint the state the read started from (they need not come in
/// cursor order), so nothing they hold may be committed before the read's
/// end. A server killed (`kill -9`) in the middle of a first read, and of
/// a read resumed from a saved state, finishes the job on restart with
/// every record in the table once: into SQLite, PostgreSQL and an Iceberg
/// table (read back by pyiceberg and DuckDB).
async fn a_rest_manifest_append_killed_mid_read_leaves_every_record_once(into: CrashInto) {
    crate::support::init_crypto();
    let Some(mut target) = CrashTarget::new(into).await else { return };
    let ca = TestCa::new();
    let token = format!("rest-crash-{}", uuid::Uuid::new_v4().simple());
    let api = Arc::new(testkit::restapi::RestApi::new(3000).with_token(token.clone()));
    let provider = FakeProvider::start(&ca, &["api.source.test"], testkit::restapi::router(api.clone())).await;
    let mut procs = Processes::new(&ca, &provider);
    procs.env.push(("SERVICE_JOB_LEASE_SECS", "1".into()));
    procs.env.extend(target.env());
    let mut server = ServerProcess::start(procs.env.clone()).await;
    let destination = target.destination("w.db");
    let pipeline =
        procs.rest_manifest_pipeline_into(&server.base, &token, 100, "incremental_append", destination).await;
    let post = |base: &str, path: &str, body: Value| procs.api(base, Method::POST, path).json(&body);
    // Pages of 100, 30 ms each: a read of 3,000 records takes a second.
    api.page_delay_ms.store(30, Ordering::SeqCst);
    for (round, total) in [("first read", 3000), ("resumed read", 6000)] {
        let before = api.requests();
        let job =
            json_ok(post(&server.base, &format!("/v1/pipelines/{pipeline}/sync"), json!({})).send().await.unwrap())
                .await;
        let job_id = job["data"]["job_id"].as_str().unwrap().to_owned();
        // Killed once ten pages were read (and, before the fix, written),
        // the job showing records read and none written yet.
        let mut shown = Value::Null;
        for _ in 0..300 {
            shown = json_ok(procs.api(&server.base, Method::GET, &format!("/v1/jobs/{job_id}")).send().await.unwrap())
                .await["data"]["progress"]["streams"]["items"]
                .clone();
            if api.requests() >= before + 10 && shown["records_read"].as_u64().unwrap_or(0) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        server.kill();
        assert!(shown["records_read"].as_u64().unwrap_or(0) > 0, "{into:?}, {round}: reading shows: {shown}");
        assert_eq!(shown["records"], 0, "{into:?}, {round}: nothing the state does not cover is written: {shown}");
        server = ServerProcess::start(procs.env.clone()).await;
        let last = procs.wait(&server.base, &job_id).await;
        assert_eq!(last["status"], "succeeded", "{into:?}, {round}: {last}");
        let (n, ids) = target.count(&procs, "w.db", "items", "id").await;
        assert_eq!((n, ids), (total, total), "{into:?}, {round}: {n} rows for {ids} ids");
        // 3,000 new records for the next read to resume.
        api.add(3000);
    }
    server.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_manifest_append_killed_mid_read_leaves_every_record_once_in_sqlite() {
    a_rest_manifest_append_killed_mid_read_leaves_every_record_once(CrashInto::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_manifest_append_killed_mid_read_leaves_every_record_once_in_postgres() {
    a_rest_manifest_append_killed_mid_read_leaves_every_record_once(CrashInto::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_manifest_append_killed_mid_read_leaves_every_record_once_in_iceberg() {
    a_rest_manifest_append_killed_mid_read_leaves_every_record_once(CrashInto::Iceberg).await;
}

/// The plugin versions stamped on the destination's events, with counts.
async fn stamps(url: &str) -> Vec<(String, i64)> {
    use sqlx::{Connection, Row};
    sqlx::any::install_default_drivers();
    let mut c = sqlx::AnyConnection::connect(url).await.unwrap();
    let rows = sqlx::query("SELECT plugin_version AS v, COUNT(*) AS n FROM events GROUP BY plugin_version ORDER BY 1")
        .fetch_all(&mut c)
        .await
        .unwrap();
    rows.iter().map(|r| (r.try_get("v").unwrap(), r.try_get("n").unwrap())).collect()
}
