//! The `service` binary: configuration errors, offline admin commands and
//! first-run bootstrap, run as a new user would.

use std::process::Command;

use crate::support::process::{self, ServerProcess};

use reqwest::StatusCode;

/// `service` over `data_dir`, with nothing else of the environment.
fn service(data_dir: &std::path::Path) -> Command {
    let mut cmd = process::command();
    cmd.env("SERVICE_DATA_DIR", data_dir);
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

    let out = service(dir.path())
        .env("SERVICE_BOOTSTRAP_TOKEN", "short")
        .env("SERVICE_BIND", "127.0.0.1:0")
        .args(["serve"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("SERVICE_BOOTSTRAP_TOKEN"), "{err}");
}

/// Starts `service serve` over `data_dir`.
fn spawn_server(data_dir: &std::path::Path) -> ServerProcess {
    ServerProcess::start_blocking([("SERVICE_DATA_DIR", data_dir)])
}

#[test]
fn first_start_prints_a_one_time_login_link_that_yields_an_admin_token() {
    crate::support::init_crypto();
    let dir = crate::support::private_dir();
    let server = spawn_server(dir.path());
    let base = server.base.clone();
    let printed = server.output_containing(&format!("{base}/login/"));
    let link = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{base}/login/")).map(|c| format!("{base}/login/{c}")));
    let client = reqwest::blocking::Client::new();
    let result = (|| {
        let link = link.ok_or("no login link printed")?;
        // A password too short is refused and spends nothing.
        let refused = client.post(&link).form(&[("password", "tiny")]).send().map_err(|e| e.to_string())?;
        if refused.status() != StatusCode::BAD_REQUEST {
            return Err(format!("a short password answered {}", refused.status()));
        }
        let page =
            client.post(&link).form(&[("password", "first admin passphrase")]).send().map_err(|e| e.to_string())?;
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
        // The password chosen on the first-start page signs in on the web.
        let browser = reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let form = browser.get(format!("{base}/sign-in")).send().unwrap();
        let cookie = form
            .headers()
            .get("set-cookie")
            .unwrap()
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .trim_start_matches("service_csrf=")
            .to_owned();
        let csrf = crate::support::form_csrf(&form.text().unwrap()).unwrap();
        let me =
            client.get(format!("{base}/v1/me")).bearer_auth(token).send().unwrap().json::<serde_json::Value>().unwrap();
        let email = me["data"]["user"]["email"].as_str().unwrap().to_owned();
        let signed_in = browser
            .post(format!("{base}/sign-in"))
            .header("cookie", format!("service_csrf={cookie}"))
            .form(&[("csrf", csrf.as_str()), ("email", email.as_str()), ("password", "first admin passphrase")])
            .send()
            .unwrap();
        if signed_in.status() != StatusCode::SEE_OTHER {
            return Err(format!("sign-in with the first-start password answered {}", signed_in.status()));
        }
        Ok(())
    })();
    drop(server);
    result.unwrap();
}

#[test]
fn admin_commands_mint_a_working_token_offline() {
    crate::support::init_crypto();
    let dir = crate::support::private_dir();
    // Initialise the database through a first start, then stop.
    drop(spawn_server(dir.path()));

    let out = service(dir.path())
        .args(["admin", "create-user", "--email", "Robot@Example.test", "--name", "Robot", "--role", "editor"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = service(dir.path()).args(["admin", "create-user", "--email", "robot@example.test"]).output().unwrap();
    assert!(!out.status.success(), "duplicate user refused");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--email"));

    let out = service(dir.path())
        .args(["admin", "create-token", "--email", "robot@example.test", "--label", "ci"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(token.starts_with("svc_"), "stdout holds the token alone");

    // A password from standard input, never from the command line.
    let set_password = |password: &str, extra: &[&str]| {
        use std::io::Write;
        let mut child = service(dir.path())
            .args(["admin", "set-password", "--email", "robot@example.test"])
            .args(extra)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(format!("{password}\n").as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let out = set_password("short", &[]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("at least 12"));
    // Setting a password revokes every session and token of the user
    // (someone else may hold the account), unless told to keep them.
    let out = set_password("robot passphrase 2026", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 session(s) and token(s) revoked"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("passphrase")
            && !String::from_utf8_lossy(&out.stderr).contains("passphrase"),
        "never echoed"
    );
    let revoked = token;
    let out = service(dir.path())
        .args(["admin", "create-token", "--email", "robot@example.test", "--label", "ci"])
        .output()
        .unwrap();
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let out = set_password("robot passphrase 2026", &["--keep-sessions"]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stderr).contains("sessions kept"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let server = spawn_server(dir.path());
    let client = reqwest::blocking::Client::new();
    let old = client.get(format!("{}/v1/me", server.base)).bearer_auth(&revoked).send().unwrap().status();
    assert_eq!(old, StatusCode::UNAUTHORIZED, "the token from before the reset is revoked");
    let me = client.get(format!("{}/v1/me", server.base)).bearer_auth(&token).send().unwrap();
    let status = me.status();
    let body: serde_json::Value = me.json().unwrap();
    // The password signs the user in on the web pages.
    let browser = reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let form = browser.get(format!("{}/sign-in", server.base)).send().unwrap();
    let cookie = form
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("service_csrf=")
        .to_owned();
    let csrf = crate::support::form_csrf(&form.text().unwrap()).unwrap();
    let signed_in = browser
        .post(format!("{}/sign-in", server.base))
        .header("cookie", format!("service_csrf={cookie}"))
        .form(&[("csrf", csrf.as_str()), ("email", "robot@example.test"), ("password", "robot passphrase 2026")])
        .send()
        .unwrap();
    drop(server);
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["data"]["user"]["email"], "robot@example.test");
    assert_eq!(body["data"]["workspaces"][0]["role"], "editor");
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    assert!(signed_in.headers().get("set-cookie").unwrap().to_str().unwrap().starts_with("service_session=svc_"));
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

/// Every setting the server names is one `--help` lists (none is read
/// behind the command line's back), and secrets set in the environment
/// are never shown there. The test suite's own settings are not the
/// server's.
#[test]
fn every_setting_is_listed_in_help_and_secret_values_are_not() {
    let dir = crate::support::private_dir();
    let mut named = std::collections::BTreeSet::new();
    for (_, text) in crate::support::host_sources() {
        for piece in text.split('"').skip(1).step_by(2) {
            // (`SERVICE_TEST_…` are the test suite's own settings, read by
            // the host's unit tests, never by the server.)
            let is_setting =
                (piece.starts_with("SERVICE_") && !piece.starts_with("SERVICE_TEST_")) || piece == "DATABASE_URL";
            if is_setting && piece.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') {
                named.insert(piece.to_owned());
            }
        }
    }
    assert!(named.contains("SERVICE_JOB_LEASE_SECS") && named.contains("SERVICE_NEW_MASTER_KEY"), "{named:?}");

    let canary = "canary-master-key-value-in-the-environment";
    let mut help = String::new();
    for args in [
        &["serve", "--help"][..],
        &["admin", "rotate-master-key", "--help"],
        &["mcp", "--help"],
        &["plugins", "load", "--help"],
        &["plugins", "record", "--help"],
        &["auth", "login", "--help"],
        &["sources", "list", "--help"],
    ] {
        let out = service(dir.path())
            .env("SERVICE_MASTER_KEY", canary)
            .env("SERVICE_NEW_MASTER_KEY", canary)
            .env("SERVICE_TOKEN", canary)
            .env("SERVICE_BOOTSTRAP_TOKEN", canary)
            .env("SERVICE_RECORD_SECRET", canary)
            .env("DATABASE_URL", format!("postgres://u:{canary}@db/x"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        help.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    for setting in &named {
        assert!(
            help.contains(&format!("env: {setting}")) || help.contains(&format!("env: {setting}=")),
            "{setting} is not in --help"
        );
    }
    assert!(!help.contains(canary), "a secret's value was shown in --help");
}
