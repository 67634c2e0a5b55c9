//! The pages in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`) driven over WebDriver. `service auth login
//! --no-browser` signed in by a browser that opens the printed address,
//! signs in and confirms; a wrong password; the credential-entry page
//! creating a credential; a proposal approved on the approvals page; and
//! a form posted from another site, refused. Each page is saved as a
//! screenshot under the target directory's `tmp/screenshots`.
//!
//! Without `chromedriver` the test says it skipped, unless
//! `SERVICE_TEST_REQUIRE_BROWSER` is set (CI sets it): then it fails.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::support::{Backend, TestServer, json_ok, process};

const EMAIL: &str = "admin@example.test";
const PASSWORD: &str = "a passphrase long enough";
const REQUIRED_ENV: &str = "SERVICE_TEST_REQUIRE_BROWSER";

/// chromedriver on a free port, stopped on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_program(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|p| p.join(name)).find(|p| p.is_file()))
}

/// The driver, or `None` (after saying so) when it is not installed and
/// not required.
fn driver() -> Option<Driver> {
    let Some(program) = find_program("chromedriver") else {
        let required = std::env::var(REQUIRED_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
        assert!(
            !required,
            "{REQUIRED_ENV} is set but chromedriver is not installed (apt-get install chromium chromium-driver)"
        );
        eprintln!("skipped: no chromedriver (apt-get install chromium chromium-driver)");
        return None;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(program)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Driver { child, url: format!("http://127.0.0.1:{port}") })
}

async fn chromium(driver: &Driver) -> Client {
    let mut options = json!({ "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900"] });
    if let Some(binary) = find_program("chromium") {
        options["binary"] = json!(binary);
    }
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), options);
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a Chromium session")
}

/// Saves what the browser shows as `name.png`.
async fn screenshot(c: &Client, name: &str) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), c.screenshot().await.unwrap()).unwrap();
}

/// Waits until the page's text holds `needle`; returns the page source.
async fn wait_for_text(c: &Client, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let source = c.source().await.unwrap();
        if source.contains(needle) {
            return source;
        }
        assert!(Instant::now() < deadline, "the page never showed {needle:?}: {source}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn fill(c: &Client, css: &str, text: &str) {
    let field = c.find(Locator::Css(css)).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(text).await.unwrap();
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css)).await.unwrap().click().await.unwrap();
}

/// `service auth login --no-browser`: the child, the printed address, and
/// the rest of what it writes to standard error.
fn cli_login(srv: &TestServer, config: &std::path::Path) -> (Child, String) {
    let mut child = process::command()
        .env_remove("SERVICE_TOKEN")
        .env("SERVICE_APP_URL", format!("{}/", srv.base))
        .env("SERVICE_API_BASE_URL", format!("{}/v1/", srv.base))
        .env("SERVICE_CONFIG_DIR", config)
        .args(["auth", "login", "--no-browser"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("the CLI prints the address to open").unwrap();
        if let Some(rest) = line.trim().strip_prefix("http") {
            break format!("http{rest}");
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    (child, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_work_in_a_real_browser() {
    let Some(driver) = driver() else { return };
    let srv = TestServer::start(Backend::Sqlite).await.unwrap();
    service::access::admin::set_password(
        &srv.state.store,
        EMAIL,
        SecretString::from(PASSWORD),
        service::access::admin::OnPasswordChange::KeepSessions,
    )
    .await
    .unwrap();
    let c = chromium(&driver).await;
    let config = crate::support::private_dir();

    // `service auth login --no-browser`: the browser opens the printed
    // address, is sent to sign in, and a wrong password is refused first.
    let (child, url) = cli_login(&srv, config.path());
    c.goto(&url).await.unwrap();
    wait_for_text(&c, "Password").await;
    screenshot(&c, "01-sign-in").await;
    fill(&c, "input[name=email]", EMAIL).await;
    fill(&c, "input[name=password]", "not the right passphrase").await;
    click(&c, "button[type=submit]").await;
    let refused = wait_for_text(&c, "do not match an account").await;
    assert!(!refused.contains("not the right passphrase"), "the typed password is not rendered back");
    screenshot(&c, "02-sign-in-refused").await;
    fill(&c, "input[name=password]", PASSWORD).await;
    click(&c, "button[type=submit]").await;
    wait_for_text(&c, "Allow").await;
    screenshot(&c, "03-cli-confirmation").await;
    click(&c, "button[value=allow]").await;
    wait_for_text(&c, "close this window").await;
    screenshot(&c, "04-cli-done").await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    assert!(out.status.success(), "the CLI signed in: {}", String::from_utf8_lossy(&out.stdout));
    let status = process::command()
        .env_remove("SERVICE_TOKEN")
        .env("SERVICE_APP_URL", format!("{}/", srv.base))
        .env("SERVICE_CONFIG_DIR", config.path())
        .args(["auth", "status"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success() && said.contains(EMAIL) && said.contains("client cli"), "{said}");
    let sessions = json_ok(srv.get("/v1/sessions").send().await.unwrap()).await;
    assert!(
        sessions["data"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["client_source"] == "cli" && s["label"].as_str().is_some_and(|l| l.starts_with("CLI on "))),
        "{sessions}"
    );

    // The account page, signed in by the browser session.
    c.goto(&format!("{}/account", srv.base)).await.unwrap();
    wait_for_text(&c, EMAIL).await;
    screenshot(&c, "05-account").await;

    // A form posted from another site carries neither cookie nor token:
    // refused, and the session stays.
    let forged = format!(
        "data:text/html,<form method=post action='{}/sign-out'><input name=csrf value=guess></form><script>document.forms[0].submit()</script>",
        srv.base
    );
    c.goto(&forged).await.unwrap();
    wait_for_text(&c, "Form expired").await;
    screenshot(&c, "06-forged-post-refused").await;
    c.goto(&format!("{}/account", srv.base)).await.unwrap();
    wait_for_text(&c, "Signed in as").await;

    // The credential-entry page creates a credential the API then shows.
    let link = json_ok(
        srv.post("/v1/credentials/entry-links", json!({ "hosts": ["team.mailcoach.app"], "label": "browser test" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    c.goto(link["data"]["url"].as_str().unwrap()).await.unwrap();
    wait_for_text(&c, "Secret").await;
    screenshot(&c, "07-credential-entry").await;
    fill(&c, "input[name=secret]", "typed-in-the-browser-0123456789").await;
    click(&c, "button[type=submit]").await;
    let stored = wait_for_text(&c, "Secret stored").await;
    assert!(!stored.contains("typed-in-the-browser"), "the secret is never shown back");
    screenshot(&c, "08-credential-stored").await;
    let poll = json_ok(srv.get(link["data"]["poll"].as_str().unwrap()).send().await.unwrap()).await;
    assert!(poll["data"]["credential_handle"].as_str().is_some_and(|h| stored.contains(h)), "{poll}");
    // A basic credential's page asks for the username the link left open.
    let link = srv.post("/v1/credentials/entry-links", json!({ "kind": "basic", "hosts": ["team.mailcoach.app"] }));
    let link = json_ok(link.send().await.unwrap()).await;
    c.goto(link["data"]["url"].as_str().unwrap()).await.unwrap();
    wait_for_text(&c, "Username").await;
    fill(&c, "input[name=username]", "typed-user").await;
    fill(&c, "input[name=secret]", "typed-password-0123456789").await;
    click(&c, "button[type=submit]").await;
    wait_for_text(&c, "Secret stored").await;
    let poll = json_ok(srv.get(link["data"]["poll"].as_str().unwrap()).send().await.unwrap()).await;
    let id = poll["data"]["credential_id"].as_str().unwrap_or_else(|| panic!("{poll}"));
    let stored = json_ok(srv.get(&format!("/v1/credentials/{id}")).send().await.unwrap()).await;
    assert_eq!(stored["data"]["metadata"]["username"], "typed-user", "{stored}");

    // A proposal approved on the approvals page runs once.
    let proposed = json_ok(
        srv.post(
            &format!("/v1/workspaces/{}/members/invitations", srv.workspace_id().await),
            json!({ "email": "browser-invitee@example.test", "role": "viewer" }),
        )
        .header("x-service-execution-mode", "proposal")
        .header("x-service-client", "cli")
        .send()
        .await
        .unwrap(),
    )
    .await;
    let approval_id = proposed["data"]["approval"]["approval_id"].as_str().unwrap().to_owned();
    c.goto(&format!("{}/approvals", srv.base)).await.unwrap();
    wait_for_text(&c, "browser-invitee@example.test").await;
    screenshot(&c, "09-approvals").await;
    click(&c, &format!("form[action='/approvals/{approval_id}/approve'] button")).await;
    wait_for_text(&c, "Approved").await;
    screenshot(&c, "10-approved").await;
    let listed = json_ok(srv.get("/v1/approvals").send().await.unwrap()).await;
    let approval: &Value =
        listed["data"]["items"].as_array().unwrap().iter().find(|a| a["approval_id"] == approval_id.as_str()).unwrap();
    assert_eq!(approval["status"], "executed", "{approval}");

    // Signing out ends the browser session.
    c.goto(&format!("{}/account", srv.base)).await.unwrap();
    click(&c, "form[action='/sign-out'] button").await;
    wait_for_text(&c, "You are signed out").await;
    c.goto(&format!("{}/account", srv.base)).await.unwrap();
    wait_for_text(&c, "E-mail").await;
    c.close().await.unwrap();
}

/// The watching pages in Chromium: the pipelines list, a pipeline, and a
/// job's page whose progress is redrawn from its event stream while the
/// sync runs, without the page being loaded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_page_follows_its_sync_live() {
    use std::sync::atomic::Ordering;
    let Some(driver) = driver() else { return };
    let fx = crate::support::events::events_source_beside(
        Backend::Sqlite,
        3000,
        &crate::support::provider::TestCa::new(),
        "",
        |_| {},
    )
    .await;
    let srv = &fx.srv;
    service::access::admin::set_password(
        &srv.state.store,
        EMAIL,
        SecretString::from(PASSWORD),
        service::access::admin::OnPasswordChange::KeepSessions,
    )
    .await
    .unwrap();
    let dest = fx.destination("sqlite", json!({ "file": "w.db" })).await;
    let pipeline = fx.pipeline(&dest, "incremental_append").await;
    json_ok(
        srv.request(reqwest::Method::PATCH, &format!("/v1/pipelines/{pipeline}"))
            .json(&json!({ "freshness_minutes": 60 }))
            .send()
            .await
            .unwrap(),
    )
    .await;

    let c = chromium(&driver).await;
    c.goto(&format!("{}/sign-in?next=/pipelines", srv.base)).await.unwrap();
    wait_for_text(&c, "Password").await;
    fill(&c, "input[name=email]", EMAIL).await;
    fill(&c, "input[name=password]", PASSWORD).await;
    click(&c, "button[type=submit]").await;
    wait_for_text(&c, "never run").await;
    screenshot(&c, "11-pipelines").await;

    // A slow sync: ten pages, a third of a second each.
    fx.events.delay_ms.store(300, Ordering::SeqCst);
    let job =
        json_ok(srv.request(reqwest::Method::POST, &format!("/v1/pipelines/{pipeline}/sync")).send().await.unwrap())
            .await;
    let job_id = job["data"]["job_id"].as_str().unwrap().to_owned();
    c.goto(&format!("{}/jobs/{job_id}", srv.base)).await.unwrap();
    wait_for_text(&c, "Progress").await;
    // Marks this very page: a reload would lose it.
    c.execute("window.stillTheSamePage = true; return true;", vec![]).await.unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let written = c
            .execute(
                "var cell = document.querySelector('#streams tbody tr td:nth-child(4)'); return cell ? cell.textContent : '';",
                vec![],
            )
            .await
            .unwrap();
        let written = written.as_str().unwrap_or("").parse::<u64>().unwrap_or(0);
        if seen.last() != Some(&written) {
            seen.push(written);
            if written > 0 && written < 3000 {
                screenshot(&c, "12-job-running").await;
            }
        }
        let status = c.find(Locator::Id("status")).await.unwrap().text().await.unwrap();
        if status == "succeeded" && written == 3000 {
            break;
        }
        assert!(Instant::now() < deadline, "the page never showed the end: {seen:?} {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen.iter().any(|&n| n > 0 && n < 3000), "the page showed the sync part-way: {seen:?}");
    let same = c.execute("return window.stillTheSamePage === true;", vec![]).await.unwrap();
    assert_eq!(same, Value::Bool(true), "updated in place, not reloaded");
    // The ledger, drawn by the script when the job ended.
    let ledger_row = "var r = document.querySelector('#ledger tbody tr'); \
        return r ? Array.from(r.cells).map(function (c) { return c.textContent; }) : [];";
    let mut row = Value::Null;
    for _ in 0..50 {
        row = c.execute(ledger_row, vec![]).await.unwrap();
        if row.as_array().is_some_and(|r| !r.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(row, json!(["events", "3000", "3000", "0", "0", "0", "0", "0", ""]), "stream, read, loaded, …");
    let summary = c.find(Locator::Id("ledger-summary")).await.unwrap().text().await.unwrap();
    assert_eq!(summary, "Attempt 1: balanced");
    screenshot(&c, "13-job-done").await;
    // Served with the page once the job ended.
    c.goto(&format!("{}/jobs/{job_id}", srv.base)).await.unwrap();
    wait_for_text(&c, "Ledger").await;
    let served = c.execute(ledger_row, vec![]).await.unwrap();
    assert_eq!(served, row, "the page as served shows the same ledger");

    c.goto(&format!("{}/pipelines/{pipeline}", srv.base)).await.unwrap();
    wait_for_text(&c, &job_id).await;
    screenshot(&c, "14-pipeline").await;
    c.close().await.unwrap();
}
