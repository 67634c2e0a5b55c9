//! Installed plugin versions through the API: making another version
//! current goes through the approval gate, the proposal shows what the new
//! version may do that the current one may not, loads and switches are
//! audited with the component's digest, version and signer, rolling back
//! is one request, and only installation operators see or switch versions.
//! (Jobs keeping their version across two servers: `pipelines.rs`.)

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use service::access::Role;

use crate::on_both_backends;
use crate::support::{Backend, TestServer, expect_error, json_ok, test_plugin};

/// Drops a test plugin's component into the server's plugins directory
/// and has the server look; returns its digest.
async fn install(srv: &TestServer, plugin: &str, file: &str) -> String {
    let dir = srv.state.config.plugins.plugins_dir.clone();
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(test_plugin(plugin)).unwrap();
    std::fs::write(dir.join(file), &bytes).unwrap();
    srv.state.plugins.scan_dir().await;
    service::plugin::signature::digest(&bytes)
}

async fn running(srv: &TestServer) -> String {
    srv.state.plugins.available("test_versioned").await.unwrap().digest.clone()
}

async fn audited(srv: &TestServer, action: &str) -> Value {
    let logs =
        json_ok(srv.get(&format!("/v1/audit-logs?action={action}&outcome=succeeded")).send().await.unwrap()).await;
    logs["data"]["items"][0].clone()
}

on_both_backends!(
    a_version_that_widens_what_a_plugin_may_do_waits_for_an_approval_that_says_how,
    a_dropped_in_file_is_never_enabled_and_only_the_running_versions_file_switches_a_plugin_off,
);

/// A file dropped into the plugins directory waits for an operator: not
/// listed enabled, not runnable, at any moment of the scan that finds it.
/// Once enabled, removing the file of another version leaves the plugin
/// running; removing the running version's file switches it off.
async fn a_dropped_in_file_is_never_enabled_and_only_the_running_versions_file_switches_a_plugin_off(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let dir = srv.state.config.plugins.plugins_dir.clone();
    std::fs::create_dir_all(&dir).unwrap();
    // Watch every moment of the scans that find the files.
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = tokio::spawn({
        let (plugins, watching) = (srv.state.plugins.clone(), watching.clone());
        async move {
            let mut looks = 0u64;
            while watching.load(std::sync::atomic::Ordering::SeqCst) {
                assert!(plugins.available("test_versioned").await.is_err(), "runnable after {looks} looks");
                let listed = plugins.list().await.unwrap();
                assert!(!listed.iter().any(|p| p.info.id == "test_versioned" && p.enabled), "listed enabled");
                looks += 1;
                tokio::task::yield_now().await;
            }
            looks
        }
    });
    let one = test_plugin("test_versioned_one");
    let two = test_plugin("test_versioned_two");
    std::fs::copy(&one, dir.join("one.wasm")).unwrap();
    srv.state.plugins.scan_dir().await;
    watching.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(watcher.await.unwrap() > 0);
    let listed = srv.state.plugins.summary("test_versioned").await.unwrap().expect("registered");
    assert!(!listed.enabled, "waits for an operator");

    // Enabled on the first file's component; the second is another
    // version, installed and not run.
    srv.state.plugins.load("test_versioned", None).await.unwrap();
    let first = service::plugin::signature::digest(&std::fs::read(&one).unwrap());
    assert_eq!(running(&srv).await, first);
    std::fs::copy(&two, dir.join("two.wasm")).unwrap();
    srv.state.plugins.scan_dir().await;
    assert_eq!(running(&srv).await, first);

    // Its file removed, the other version changes nothing.
    std::fs::remove_file(dir.join("two.wasm")).unwrap();
    srv.state.plugins.scan_dir().await;
    assert_eq!(running(&srv).await, first, "another version's file going keeps the plugin running");
    assert!(srv.state.plugins.summary("test_versioned").await.unwrap().unwrap().enabled);
    // The running version's file removed: the operator switched it off.
    std::fs::remove_file(dir.join("one.wasm")).unwrap();
    srv.state.plugins.scan_dir().await;
    assert!(srv.state.plugins.available("test_versioned").await.is_err());
    assert!(!srv.state.plugins.summary("test_versioned").await.unwrap().unwrap().enabled);
    srv.stop().await;
}

async fn a_version_that_widens_what_a_plugin_may_do_waits_for_an_approval_that_says_how(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else { return };
    let one = install(&srv, "test_versioned_one", "versioned.wasm").await;
    json_ok(srv.post("/v1/admin/plugins/test_versioned/load", json!({})).send().await.unwrap()).await;
    let load = audited(&srv, "plugins.load").await;
    assert_eq!(load["target_id"], "test_versioned", "{load}");
    assert_eq!(load["details"], json!({ "digest": one, "version": "1.0.0", "signer": null }), "{load}");
    let two = install(&srv, "test_versioned_two", "versioned-2.wasm").await;
    assert_eq!(running(&srv).await, one, "a new file is installed, not run");

    // Asked for as a proposal: nothing changes until an operator approves,
    // and the proposal names the component and how it widens the plugin.
    let use_two = json!({ "version": "2.0.0" });
    let resp = srv
        .post("/v1/admin/plugins/test_versioned/use", use_two.clone())
        .header("x-service-execution-mode", "proposal")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let approval = json_ok(resp).await["data"]["approval"].clone();
    let summary = approval["summary"].as_str().unwrap();
    for expected in [two.as_str(), "now 1.0.0", "may send requests to *.mirror.test", "adds the preview operation"] {
        assert!(summary.contains(expected), "{expected:?} in {summary:?}");
    }
    assert_eq!(approval["category"], "plugins", "{approval}");
    assert_eq!(running(&srv).await, one, "not switched by a proposal");
    let id = approval["approval_id"].as_str().unwrap();
    let done = json_ok(
        srv.request_as(&srv.approver_token, Method::POST, &format!("/v1/approvals/{id}/approve")).send().await.unwrap(),
    )
    .await;
    assert_eq!(done["data"]["result"]["version"], "2.0.0", "{done}");
    assert_eq!(running(&srv).await, two);
    let switched = audited(&srv, "plugins.use").await;
    assert_eq!(switched["approval_id"], id, "{switched}");
    assert_eq!((&switched["details"]["digest"], &switched["details"]["version"]), (&json!(two), &json!("2.0.0")));
    assert_eq!(switched["details"]["previous"], json!({ "version": "1.0.0", "digest": one }), "{switched}");

    // Rolling back is one request, audited; it widens nothing.
    let back =
        json_ok(srv.post("/v1/admin/plugins/test_versioned/use", json!({ "version": "1.0.0" })).send().await.unwrap())
            .await;
    assert_eq!(back["data"]["version"], "1.0.0", "{back}");
    assert_eq!(running(&srv).await, one);
    assert_eq!(audited(&srv, "plugins.use").await["details"]["version"], "1.0.0");
    let versions = json_ok(srv.get("/v1/admin/plugins/test_versioned/versions").send().await.unwrap()).await;
    let current: Vec<&Value> =
        versions["data"]["items"].as_array().unwrap().iter().filter(|v| v["current"] == true).collect();
    assert_eq!(current.len(), 1, "{versions}");
    assert_eq!(current[0]["version"], "1.0.0", "{versions}");

    // A workspace administrator who is no installation operator neither
    // sees nor switches versions.
    let ws = srv.workspace_id().await;
    let (_, admin) = srv.user_in(&ws, Role::Administrator).await;
    let e = srv.request_as(&admin, Method::GET, "/v1/admin/plugins/test_versioned/versions").send().await.unwrap();
    expect_error(e, 403, "403").await;
    let e = srv
        .request_as(&admin, Method::POST, "/v1/admin/plugins/test_versioned/use")
        .header("x-service-workspace", &ws)
        .json(&use_two)
        .send()
        .await
        .unwrap();
    expect_error(e, 403, "403").await;
    assert_eq!(running(&srv).await, one);
    srv.stop().await;
}

/// The operator's commands, offline against the database: `plugins load
/// FILE` installs and makes current, `plugins versions` marks the current
/// one, `plugins use` switches (back) and says what it widens.
#[test]
fn the_cli_lists_installed_versions_and_switches_between_them() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = crate::support::process::command()
            .args(args)
            .env("SERVICE_DATA_DIR", dir.path())
            .env("SERVICE_PLUGIN_SIGNATURES", "allowed")
            .env("SERVICE_LOG", "warn")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "service {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    let one = test_plugin("test_versioned_one");
    let two = test_plugin("test_versioned_two");
    let digest = |p: &std::path::Path| service::plugin::signature::digest(&std::fs::read(p).unwrap());
    run(&["plugins", "load", one.to_str().unwrap()]);
    run(&["plugins", "load", two.to_str().unwrap()]);
    let current = |listing: &str| {
        listing.lines().find(|l| l.starts_with('*')).map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
    };
    let listing = run(&["plugins", "versions", "test_versioned"]);
    assert!(listing.contains(&digest(&one)) && listing.contains(&digest(&two)), "{listing}");
    assert_eq!(current(&listing).as_deref(), Some("2.0.0"), "the file loaded last runs: {listing}");

    let back = run(&["plugins", "use", "test_versioned", "1.0.0"]);
    assert!(back.contains("now runs 1.0.0") && back.contains("(was 2.0.0)"), "{back}");
    assert_eq!(current(&run(&["plugins", "versions", "test_versioned"])).as_deref(), Some("1.0.0"));
    let forward = run(&["plugins", "use", "test_versioned", "2.0.0"]);
    assert!(forward.contains("widens: may send requests to *.mirror.test"), "{forward}");
    run(&["plugins", "unload", "test_versioned"]);

    // Each load, switch and unload is in the installation's audit, with
    // the operator, the host and the component it made current.
    let url = format!("sqlite://{}/service.db?mode=ro", dir.path().display());
    let rows: Vec<(String, String, String, String)> = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::query_as(
            "SELECT action, target_id, client_source, details FROM audit_logs WHERE workspace_id IS NULL ORDER BY created_at, id",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    });
    let actions: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(actions, ["plugins.load", "plugins.load", "plugins.use", "plugins.use", "plugins.unload"], "{rows:?}");
    for (_, target, client, details) in &rows {
        assert_eq!((target.as_str(), client.as_str()), ("test_versioned", "cli"));
        let details: serde_json::Value = serde_json::from_str(details).unwrap();
        assert!(
            details["operator"].is_string() && details["host"].as_str().is_some_and(|h| !h.is_empty()),
            "{details}"
        );
    }
    let back_record: serde_json::Value = serde_json::from_str(&rows[2].3).unwrap();
    assert_eq!(back_record["digest"], digest(&one));
    assert_eq!(back_record["version"], "1.0.0");

    let missing = crate::support::process::command()
        .args(["plugins", "use", "test_versioned", "3.0.0"])
        .env("SERVICE_DATA_DIR", dir.path())
        .env("SERVICE_PLUGIN_SIGNATURES", "allowed")
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("has no installed version 3.0.0"));
}

/// The control database failing while connectors are listed (here: the
/// table of the operator's switches gone and back, on PostgreSQL) fails
/// the listing: a connector the operator switched off is never shown on,
/// nor warmed up again, because its switch could not be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_that_cannot_read_the_operators_switches_fails_rather_than_show_a_switched_off_connector_on() {
    let Some(srv) = TestServer::start(Backend::Postgres).await else { return };
    let connector = "conn_emailcampaign_edm";
    json_ok(srv.request(Method::POST, &format!("/v1/admin/plugins/{connector}/unload")).send().await.unwrap()).await;
    use sqlx::Connection;
    sqlx::any::install_default_drivers();
    let mut db = sqlx::AnyConnection::connect(&srv.state.config.database_url).await.unwrap();
    sqlx::query("ALTER TABLE plugin_states RENAME TO plugin_states_away").execute(&mut db).await.unwrap();
    for path in ["/v1/admin/plugins".to_owned(), "/v1/connectors".to_owned(), format!("/v1/connectors/{connector}")] {
        let resp = srv.get(&path).send().await.unwrap();
        let status = resp.status();
        let body = resp.text().await.unwrap();
        assert_eq!(
            status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{path} answered while the switches were unreadable: {body}"
        );
        assert!(!body.contains(connector), "{path}: {body}");
    }
    assert!(srv.state.plugins.summary(connector).await.is_err());
    sqlx::query("ALTER TABLE plugin_states_away RENAME TO plugin_states").execute(&mut db).await.unwrap();
    let listed = json_ok(srv.get(&format!("/v1/connectors/{connector}")).send().await.unwrap()).await;
    assert_eq!(listed["data"]["status"], "unavailable", "{listed}");
    let plugins = json_ok(srv.get("/v1/admin/plugins").send().await.unwrap()).await;
    let entry = plugins["data"]["items"].as_array().unwrap().iter().find(|p| p["connector_id"] == connector).cloned();
    assert_eq!(entry.as_ref().map(|p| p["enabled"].clone()), Some(Value::Bool(false)), "{plugins}");
    db.close().await.unwrap();
    srv.stop().await;
}
