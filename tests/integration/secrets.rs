//! Proof that secrets never leak: canaries enter through every credential
//! flow of a real `service serve` process, every endpoint that touches them
//! is exercised (success, provider errors that echo headers, validation
//! failures), and then no canary may appear in any response body or
//! header, any log line (debug level, JSON), any audit record, or the
//! database files except as ciphertext.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::mailcoach::{self, MailcoachState};
use crate::support::provider::{FakeProvider, TestCa};

const ADMIN: &str = "svc_leak_test_admin_token_0123456789";

/// Everything a client saw.
#[derive(Default)]
struct Seen(String);

impl Seen {
    async fn take(&mut self, resp: reqwest::Response) -> (u16, Value) {
        let status = resp.status().as_u16();
        for (k, v) in resp.headers() {
            self.0.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("")));
        }
        let text = resp.text().await.unwrap();
        self.0.push_str(&text);
        self.0.push('\n');
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_appear_in_no_response_log_audit_record_or_plaintext_column() {
    crate::support::init_crypto();
    let canary = |what: &str| format!("CANARY{what}{}", uuid::Uuid::new_v4().simple());
    let (c_generic, c_token, c_entry, c_bad, c_rejected) = (canary("generic"), canary("token"), canary("entry"), canary("bad"), canary("rejected"));

    // The provider accepts c_token and echoes whatever it gets in errors.
    let ca = TestCa::new();
    let mc = Arc::new(MailcoachState { token: c_token.clone(), campaigns: mailcoach::campaigns(12), echo_auth_in_errors: true, ..Default::default() });
    let names = ["mail.acme-corp.com"];
    let provider = FakeProvider::start(&ca, &names, mailcoach::router(mc.clone())).await;

    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    std::fs::write(&roots, &ca.pem).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_service"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SERVICE_DATA_DIR", dir.path().join("data"))
        .env("SERVICE_BIND", format!("127.0.0.1:{port}"))
        .env("SERVICE_BOOTSTRAP_TOKEN", ADMIN)
        .env("SERVICE_LOG", "debug")
        .env("SERVICE_LOG_FORMAT", "json")
        .env("SERVICE_EGRESS_ALLOWED_HOSTS", "mail.acme-corp.com")
        .env("SERVICE_EGRESS_RESOLVE", provider.pins(&names))
        .env("SERVICE_EGRESS_EXTRA_ROOTS", &roots)
        .args(["serve"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let logs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        let _ = stdout.read_to_string(&mut s);
        s
    });

    let client = reqwest::Client::new();
    let mut up = false;
    for _ in 0..200 {
        if client.get(format!("{base}/healthz")).send().await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "server started");
    let api = |m: reqwest::Method, p: &str| client.request(m, format!("{base}{p}")).bearer_auth(ADMIN);
    let mut seen = Seen::default();

    // Entry paths.
    let (s, v) = seen.take(api(reqwest::Method::POST, "/v1/credentials").json(&json!({ "hosts": ["mail.acme-corp.com"], "secret": c_generic })).send().await.unwrap()).await;
    assert_eq!(s, 201, "{v}");
    let generic = v["data"]["credential_handle"].as_str().unwrap().to_owned();
    let generic_id = v["data"]["credential_id"].as_str().unwrap().to_owned();
    let (s, v) = seen.take(api(reqwest::Method::POST, "/v1/credentials/emailcampaign/api-token").json(&json!({ "base_url": "https://mail.acme-corp.com/api", "api_token": c_token })).send().await.unwrap()).await;
    assert_eq!(s, 201, "{v}");
    let good = v["data"]["credential_handle"].as_str().unwrap().to_owned();
    let (_, v) = seen.take(api(reqwest::Method::POST, "/v1/credentials/emailcampaign/api-token").json(&json!({ "base_url": "https://mail.acme-corp.com/api", "api_token": c_bad })).send().await.unwrap()).await;
    let bad = v["data"]["credential_handle"].as_str().unwrap().to_owned();
    let (_, v) = seen.take(api(reqwest::Method::POST, "/v1/credentials/entry-links").json(&json!({ "hosts": ["mail.acme-corp.com"] })).send().await.unwrap()).await;
    let url = v["data"]["url"].as_str().unwrap().to_owned();
    seen.take(client.post(&url).form(&[("secret", c_entry.as_str())]).send().await.unwrap()).await;
    // A validation failure carrying a secret.
    let (s, _) = seen.take(api(reqwest::Method::POST, "/v1/credentials/emailcampaign/api-token").json(&json!({ "base_url": "http://127.0.0.1/api", "api_token": c_rejected })).send().await.unwrap()).await;
    assert_eq!(s, 400);
    let (s, _) = seen.take(api(reqwest::Method::POST, "/v1/credentials/entry-links").json(&json!({ "hosts": ["mail.acme-corp.com"], "token": c_rejected })).send().await.unwrap()).await;
    assert_eq!(s, 400);

    // Use them: success, a bad token the provider echoes back, outages
    // whose error bodies echo the Authorization header.
    for handle in [&good, &bad, &generic] {
        seen.take(api(reqwest::Method::POST, "/v1/connectors/emailcampaign/check").json(&json!({ "credential_handle": handle })).send().await.unwrap()).await;
        seen.take(api(reqwest::Method::POST, "/v1/connectors/emailcampaign/edm/preview").json(&json!({ "credential_handle": handle, "base_url": "https://mail.acme-corp.com/api" })).send().await.unwrap()).await;
    }
    mc.fail_next.store(50, Ordering::SeqCst);
    seen.take(api(reqwest::Method::POST, "/v1/connectors/emailcampaign/edm/preview").json(&json!({ "credential_handle": good })).send().await.unwrap()).await;
    mc.fail_next.store(0, Ordering::SeqCst);
    seen.take(api(reqwest::Method::GET, &format!("/v1/credentials/{generic_id}")).send().await.unwrap()).await;
    seen.take(api(reqwest::Method::GET, "/v1/credentials").send().await.unwrap()).await;
    seen.take(api(reqwest::Method::GET, "/v1/audit-logs?limit=200").send().await.unwrap()).await;
    seen.take(api(reqwest::Method::GET, "/v1/approvals").send().await.unwrap()).await;

    // The provider did receive the real token: injection works.
    assert!(mc.seen_auth.lock().unwrap().iter().any(|a| a.contains(&c_token)));

    let _ = child.kill();
    let _ = child.wait();
    let logs = logs.join().unwrap();
    assert!(logs.contains("\"level\""), "JSON logs were captured");

    let mut db = Vec::new();
    for entry in std::fs::read_dir(dir.path().join("data")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("service.db") {
            db.extend(std::fs::read(entry.path()).unwrap());
        }
    }
    assert!(!db.is_empty());
    let db = String::from_utf8_lossy(&db);
    for c in [&c_generic, &c_token, &c_entry, &c_bad, &c_rejected] {
        assert!(!seen.0.contains(c.as_str()), "{c} leaked into a response");
        assert!(!logs.contains(c.as_str()), "{c} leaked into the logs");
        assert!(!db.contains(c.as_str()), "{c} is in the database in plaintext");
    }
}
