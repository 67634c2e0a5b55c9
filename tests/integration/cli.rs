//! The `service` binary: configuration errors, offline admin commands and
//! first-run bootstrap, run as a new user would.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;

const BIN: &str = env!("CARGO_BIN_EXE_service");

fn service(data_dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SERVICE_DATA_DIR", data_dir)
        .stdin(Stdio::null());
    cmd
}

#[test]
fn bad_configuration_is_one_line_naming_the_setting() {
    let dir = crate::support::private_dir();
    let out = service(dir.path()).env("DATABASE_URL", "mysql://localhost/x").args(["serve"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("DATABASE_URL") && err.contains("mysql"), "{err}");

    let out = service(dir.path()).env("SERVICE_BIND", "not-an-address").args(["serve"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--bind"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let out = service(dir.path()).env("SERVICE_BOOTSTRAP_TOKEN", "short").env("SERVICE_BIND", "127.0.0.1:0").args(["serve"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("SERVICE_BOOTSTRAP_TOKEN"), "{err}");
}

/// Starts `service serve` on a free port and returns it with the child.
fn spawn_server(data_dir: &std::path::Path) -> (std::process::Child, String, Vec<String>) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = service(data_dir)
        .env("SERVICE_BIND", format!("127.0.0.1:{port}"))
        .args(["serve"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    // Collect stdout until the server answers.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let client = reqwest::blocking::Client::new();
    let mut lines = Vec::new();
    for _ in 0..200 {
        while let Ok(l) = rx.try_recv() {
            lines.push(l);
        }
        if client.get(format!("{base}/healthz")).send().is_ok() {
            std::thread::sleep(Duration::from_millis(50));
            while let Ok(l) = rx.try_recv() {
                lines.push(l);
            }
            return (child, base, lines);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("server did not start; stdout: {lines:?}");
}

#[test]
fn first_start_prints_a_one_time_login_link_that_yields_an_admin_token() {
    crate::support::init_crypto();
    let dir = crate::support::private_dir();
    let (mut child, base, lines) = spawn_server(dir.path());
    let link = lines.iter().find_map(|l| l.trim().strip_prefix(&format!("{base}/login/")).map(|c| format!("{base}/login/{c}")));
    let client = reqwest::blocking::Client::new();
    let result = (|| {
        let link = link.ok_or("no login link printed")?;
        let page = client.post(&link).send().map_err(|e| e.to_string())?;
        if page.status() != StatusCode::OK {
            return Err(format!("login POST answered {}", page.status()));
        }
        let html = page.text().unwrap();
        let start = html.find("<code>svc_").ok_or("no token on page")? + 6;
        let token = &html[start..start + html[start..].find("</code>").unwrap()];
        let me = client.get(format!("{base}/v1/me")).bearer_auth(token).send().unwrap();
        if me.status() != StatusCode::OK {
            return Err(format!("token rejected: {}", me.status()));
        }
        let again = client.post(&link).send().unwrap();
        if again.status() != StatusCode::GONE {
            return Err(format!("login link reusable: {}", again.status()));
        }
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result.unwrap();
}

#[test]
fn admin_commands_mint_a_working_token_offline() {
    crate::support::init_crypto();
    let dir = crate::support::private_dir();
    // Initialise the database through a first start, then stop.
    let (mut child, _, _) = spawn_server(dir.path());
    let _ = child.kill();
    let _ = child.wait();

    let out = service(dir.path()).args(["admin", "create-user", "--email", "Robot@Example.test", "--name", "Robot", "--role", "editor"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = service(dir.path()).args(["admin", "create-user", "--email", "robot@example.test"]).output().unwrap();
    assert!(!out.status.success(), "duplicate user refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--email"));

    let out = service(dir.path()).args(["admin", "create-token", "--email", "robot@example.test", "--label", "ci"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(token.starts_with("svc_"), "stdout holds the token alone");

    let (mut child, base, _) = spawn_server(dir.path());
    let client = reqwest::blocking::Client::new();
    let me = client.get(format!("{base}/v1/me")).bearer_auth(&token).send().unwrap();
    let status = me.status();
    let body: serde_json::Value = me.json().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["data"]["user"]["email"], "robot@example.test");
    assert_eq!(body["data"]["workspaces"][0]["role"], "editor");
}

#[test]
fn a_data_directory_other_users_can_enter_stops_the_server() {
    use std::os::unix::fs::PermissionsExt;
    let dir = crate::support::private_dir();
    // Created right by an earlier start, then opened up.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = service(dir.path()).env("SERVICE_BIND", "127.0.0.1:0").args(["serve"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SERVICE_DATA_DIR") && err.contains("chmod 700"), "{err}");
    assert!(!dir.path().join("master.key").exists(), "nothing was written into it");
}
