//! The connector author's kit, as an author uses it: `service plugins new`,
//! `cargo build`, `validate`, `record` against a fake provider over real
//! HTTPS, and `test` replaying offline inside a network namespace with no
//! usable interface; a plugin broken on purpose fails; a recording made
//! while the provider echoes the secret holds no byte of it; bad input is
//! one line naming the file and position; the cassettes checked in for the
//! example source and both bundled connectors replay, and recording them
//! again against the fakes gives them back.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::support::process::BIN;
use crate::support::provider::{FakeProvider, TestCa};
use crate::support::{hubspot, mailcoach};
use testkit::jsonplaceholder::{self, Placeholder};
use testkit::plugins::{bundled_plugin, example_plugin, repository, wasm_target_dir};

/// `service` with nothing of the developer's environment but `PATH` (and
/// what cargo needs to find its toolchain).
fn service(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).stdin(Stdio::null());
    cmd
}

/// `service plugins record` of `component` with `config` into `out`,
/// reaching the providers through `env`.
fn record(component: impl AsRef<std::ffi::OsStr>, config: &Path, out: &Path, env: &[(String, String)]) -> Command {
    let mut cmd = service(&["plugins", "record", "--component"]);
    cmd.arg(component).arg("--config").arg(config).arg("--out").arg(out).envs(env.iter().cloned());
    cmd
}

/// `service` inside a new network namespace: only a loopback interface,
/// and that one down. Nothing it tries on the network can succeed.
fn offline(args: &[&str]) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--map-root-user", "--net", "--", BIN])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::null());
    cmd
}

/// Runs `cmd` off the runtime's threads (the fake providers serve on
/// them meanwhile).
async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("run a command")).await.unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The error lines a failed command printed: exactly one, no panic.
fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{err}");
    errors[0].to_owned()
}

/// A fake JSONPlaceholder over HTTPS and the settings that reach it.
struct Provider {
    _fake: FakeProvider,
    state: Arc<Placeholder>,
    env: Vec<(String, String)>,
    _ca_file: tempfile::NamedTempFile,
}

async fn placeholder(state: Placeholder) -> Provider {
    let ca = TestCa::new();
    let state = Arc::new(state);
    let fake = FakeProvider::start(&ca, &[jsonplaceholder::HOST], jsonplaceholder::router(state.clone())).await;
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), &ca.pem).unwrap();
    let env = vec![
        ("SERVICE_EGRESS_RESOLVE".to_owned(), fake.pins(&[jsonplaceholder::HOST])),
        ("SERVICE_EGRESS_EXTRA_ROOTS".to_owned(), ca_file.path().display().to_string()),
    ];
    Provider { _fake: fake, state, env, _ca_file: ca_file }
}

/// A config for the example source naming `handle`, written in `dir`.
fn placeholder_config(dir: &Path, handle: &str) -> PathBuf {
    let config = dir.join("config.json");
    let text = json!({ "base_url": "https://jsonplaceholder.typicode.com", "credential_handle": handle });
    std::fs::write(&config, text.to_string()).unwrap();
    config
}

/// `cargo build` of a scaffolded crate, into the shared guest target
/// directory so the dependencies are built once.
async fn cargo_build(dir: &Path) -> Output {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(dir)
        .arg("build")
        .env("CARGO_TARGET_DIR", wasm_target_dir())
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    run(cmd).await
}

fn edit(path: &Path, from: &str, to: &str) {
    let source = std::fs::read_to_string(path).unwrap();
    assert!(source.contains(from), "{} has no `{from}`", path.display());
    std::fs::write(path, source.replace(from, to)).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_plugin_builds_records_and_replays_offline_and_a_broken_one_fails() {
    let work = tempfile::tempdir().unwrap();
    let crate_dir = work.path().join("my-source");
    let made = run(service(&["plugins", "new", "my-source", "--dir", crate_dir.to_str().unwrap()])).await;
    assert!(made.status.success(), "{}", text(&made));
    assert!(stdout(&made).contains("conn_my_source"), "{}", text(&made));

    let built = cargo_build(&crate_dir).await;
    assert!(built.status.success(), "the new crate builds without edits:\n{}", text(&built));
    let component = wasm_target_dir().join("wasm32-wasip2/debug/my_source.wasm");
    let validated = run(service(&["plugins", "validate", component.to_str().unwrap()])).await;
    assert!(validated.status.success(), "{}", text(&validated));
    assert!(stdout(&validated).contains("connector: conn_my_source"), "{}", text(&validated));
    assert!(stdout(&validated).contains("description: valid"), "{}", text(&validated));

    // Record, as the crate's README says, against the provider.
    let provider = placeholder(Placeholder::with_posts(120)).await;
    let cassette = crate_dir.join("cassettes/posts");
    // Pointed at a provider the connector does not declare yet: said up
    // front, with what to change, and nothing is asked of anyone.
    let elsewhere = crate_dir.join("config.elsewhere.json");
    std::fs::write(
        &elsewhere,
        r#"{"base_url": "https://api.my-provider.example", "credential_handle": "my_api_token"}"#,
    )
    .unwrap();
    let mut refused = record(&component, &elsewhere, &crate_dir.join("cassettes/elsewhere"), &provider.env);
    refused.env("SERVICE_RECORD_SECRET", "a-token-of-mine");
    let refused = run(refused).await;
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    let said = one_error_line(&refused);
    assert!(
        said.contains("at /base_url")
            && said.contains(
                "api.my-provider.example is not among the hosts the connector declares (jsonplaceholder.typicode.com)"
            )
            && said.contains("with_hosts"),
        "{said}"
    );
    assert_eq!(provider.state.requests.load(std::sync::atomic::Ordering::SeqCst), 0);
    let recorded = run(record(&component, &crate_dir.join("config.example.json"), &cassette, &provider.env)).await;
    assert!(recorded.status.success(), "{}", text(&recorded));
    assert!(
        stdout(&recorded).contains("stream posts: 120 record(s), 4 checkpoint(s), complete"),
        "{}",
        text(&recorded)
    );
    let asked = provider.state.requests.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        asked, 11,
        "check, pages 1 to 4 (the fourth empty), then the reads resumed from ids 50, 100 and 120: 3, 2 and 1 pages"
    );
    let exchanges = std::fs::read_to_string(cassette.join("exchanges.jsonl")).unwrap();
    let lines: Vec<Value> = exchanges.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let resumed: Vec<&str> =
        lines.iter().map(|l| l["call"].as_str().unwrap()).filter(|c| c.starts_with("resume posts from ")).collect();
    assert_eq!(resumed.len(), 6, "{exchanges}");
    assert!(lines[5..].iter().all(|l| l["call"].as_str().unwrap().starts_with("resume ")), "resumed reads come last");
    assert_eq!(lines[0]["call"], "check");
    assert_eq!(
        lines[4]["url"],
        "https://jsonplaceholder.typicode.com/posts?_sort=id&_order=asc&_limit=50&id_gte=1&_page=4"
    );
    let posts = std::fs::read_to_string(cassette.join("streams/posts.jsonl")).unwrap();
    assert_eq!(posts.lines().filter(|l| l.starts_with("{\"record\"")).count(), 120);
    let manifest: Value = serde_json::from_slice(&std::fs::read(cassette.join("cassette.json")).unwrap()).unwrap();
    assert_eq!(manifest["connector"]["id"], "conn_my_source");
    let expected = format!("{}/wasm32-wasip2/debug/my_source.wasm", relative_target(&cassette));
    assert_eq!(manifest["component"], expected.as_str());
    drop(provider);

    // Offline: no provider, no network at all.
    let tested = run(offline(&["plugins", "test", crate_dir.join("cassettes").to_str().unwrap()])).await;
    assert!(tested.status.success(), "{}", text(&tested));
    assert!(stdout(&tested).starts_with("ok  "), "{}", text(&tested));
    // The step after: the conformance suite, as the crate's README says.
    let conformed = run(offline(&["plugins", "conform", crate_dir.join("cassettes").to_str().unwrap()])).await;
    assert!(conformed.status.success(), "{}", text(&conformed));
    assert!(stdout(&conformed).contains("4 checkpoint(s) crashed"), "{}", text(&conformed));
    assert!(stdout(&conformed).contains("ok   crash posts"), "{}", text(&conformed));

    // Paging broken: the plugin asks for a page the cassette never saw.
    let lib = crate_dir.join("src/lib.rs");
    edit(&lib, "Pagination::page_number(\"_page\")", "Pagination::page_number(\"page\")");
    assert!(cargo_build(&crate_dir).await.status.success());
    let broken = run(offline(&["plugins", "test", cassette.to_str().unwrap()])).await;
    assert_eq!(broken.status.code(), Some(1), "{}", text(&broken));
    let report = stdout(&broken);
    assert!(
        report.contains("no recorded answer for GET https://jsonplaceholder.typicode.com/posts?_sort=id&_order=asc&_limit=50&id_gte=1&page=1 (in read posts)"),
        "{report}"
    );
    assert!(report.contains("the closest recorded request is exchange 2 GET https://jsonplaceholder.typicode.com/posts?_sort=id&_order=asc&_limit=50&id_gte=1&_page=1"), "{report}");
    // Named once: a miss is a refusal the plugin does not retry.
    assert_eq!(report.matches("no recorded answer for").count(), 1, "{report}");
    assert!(report.contains("streams/posts.jsonl differs"), "{report}");
    edit(&lib, "Pagination::page_number(\"page\")", "Pagination::page_number(\"_page\")");

    // The cursor broken: the same requests, the wrong checkpoints.
    edit(&lib, "last_id = newest.unwrap_or(last_id);", "last_id = newest.unwrap_or(last_id) + 1;");
    assert!(cargo_build(&crate_dir).await.status.success());
    let broken = run(offline(&["plugins", "test", cassette.to_str().unwrap()])).await;
    assert_eq!(broken.status.code(), Some(1), "{}", text(&broken));
    let report = stdout(&broken);
    assert!(!report.contains("no recorded answer"), "{report}");
    assert!(
        report.contains("  - {\"checkpoint\":{\"last_id\":50}}\n  + {\"checkpoint\":{\"last_id\":51}}"),
        "{report}"
    );

    // A deliberate change: --update rewrites the expectations, then it passes.
    let updated = run(offline(&["plugins", "test", cassette.to_str().unwrap(), "--update"])).await;
    assert!(updated.status.success(), "{}", text(&updated));
    let posts = std::fs::read_to_string(cassette.join("streams/posts.jsonl")).unwrap();
    assert!(posts.contains("{\"checkpoint\":{\"last_id\":51}}"), "{posts}");
    assert!(run(offline(&["plugins", "test", cassette.to_str().unwrap()])).await.status.success());
}

/// The shared guest target directory as the cassette's manifest names it.
fn relative_target(cassette: &Path) -> String {
    let target = std::path::absolute(wasm_target_dir()).unwrap();
    let cassette = std::path::absolute(cassette).unwrap();
    let common = target.components().zip(cassette.components()).take_while(|(a, b)| a == b).count();
    let ups = cassette.components().count() - common;
    let mut out: Vec<String> = vec!["..".into(); ups];
    out.extend(target.components().skip(common).map(|c| c.as_os_str().to_string_lossy().into_owned()));
    out.join("/")
}

/// Every form in which a secret could be written down.
fn forms(secret: &str) -> Vec<Vec<u8>> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let percent: String = url::form_urlencoded::byte_serialize(secret.as_bytes()).collect();
    vec![
        secret.as_bytes().to_vec(),
        b64.encode(secret).into_bytes(),
        b64.encode(secret).trim_end_matches('=').as_bytes().to_vec(),
        percent.into_bytes(),
        // A distinctive inner part, in case a form is cut or wrapped.
        secret.as_bytes()[4..secret.len() - 4].to_vec(),
    ]
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() { found.extend(files_under(&path)) } else { found.push(path) }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recording_holds_no_byte_of_the_secret_even_when_the_provider_echoes_it() {
    let canary = format!("canary-{}-secret", uuid::Uuid::new_v4().simple());
    let provider =
        placeholder(Placeholder { token: Some(canary.clone()), echo_credential: true, ..Placeholder::with_posts(60) })
            .await;
    let work = tempfile::tempdir().unwrap();
    let config = placeholder_config(work.path(), "cred_canary");
    let cassette = work.path().join("cassette");
    let component = example_plugin();
    let mut record = record(&component, &config, &cassette, &provider.env);
    // The secret on standard input, as a script would pipe it.
    record.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let recorded = tokio::task::spawn_blocking({
        let canary = canary.clone();
        move || {
            use std::io::Write;
            let mut child = record.spawn().unwrap();
            child.stdin.take().unwrap().write_all(format!("{canary}\n").as_bytes()).unwrap();
            child.wait_with_output().unwrap()
        }
    })
    .await
    .unwrap();
    assert!(recorded.status.success(), "{}", text(&recorded));
    assert!(
        stdout(&recorded).contains("stream posts: 60 record(s)"),
        "the provider took the secret (no 401):\n{}",
        text(&recorded)
    );

    // The provider did echo it: the records show where, scrubbed.
    let posts = std::fs::read_to_string(cassette.join("streams/posts.jsonl")).unwrap();
    assert!(posts.contains("\"requested_by\":\"Bearer [REDACTED]\""), "{posts}");
    let exchanges = std::fs::read_to_string(cassette.join("exchanges.jsonl")).unwrap();
    assert!(exchanges.contains("\"credential\":{\"handle\":\"cred_canary\",\"placement\":\"bearer\"}"), "{exchanges}");
    assert!(!exchanges.contains("x-echo-authorization") && !exchanges.contains("x-echo-base64"), "{exchanges}");

    let files = files_under(&cassette);
    assert!(files.len() >= 6, "{files:?}");
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        for form in forms(&canary) {
            assert!(
                memchr::memmem::find(&bytes, &form).is_none(),
                "{} holds the secret as {}",
                file.display(),
                String::from_utf8_lossy(&form)
            );
        }
        assert!(!file.to_string_lossy().contains(&canary[4..canary.len() - 4]));
    }
    assert!(!text(&recorded).contains(&canary[4..canary.len() - 4]), "nor does the output");

    // The handle, not the secret, is what the replay matches on. The echo
    // is a field the example never declared: the test says so until the
    // cassette accepts it.
    drop(provider);
    let tested = run(offline(&["plugins", "test", cassette.to_str().unwrap()])).await;
    assert_eq!(tested.status.code(), Some(1), "{}", text(&tested));
    assert!(
        stdout(&tested)
            .contains("schema: stream posts, field requested_by: not declared, but present in 60 of 60 record(s)"),
        "{}",
        text(&tested)
    );
    let accepted = run(offline(&["plugins", "test", cassette.to_str().unwrap(), "--accept-schema"])).await;
    assert!(accepted.status.success(), "{}", text(&accepted));
    let manifest: Value = serde_json::from_slice(&std::fs::read(cassette.join("cassette.json")).unwrap()).unwrap();
    assert_eq!(
        manifest["accepted"],
        json!([{ "stream": "posts", "field": "requested_by", "disagreement": "undeclared" }])
    );
    let tested = run(offline(&["plugins", "test", cassette.to_str().unwrap()])).await;
    assert!(tested.status.success(), "{}", text(&tested));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recording_holds_no_byte_of_the_secret_when_the_provider_compresses_its_echo() {
    let work = tempfile::tempdir().unwrap();
    let config = placeholder_config(work.path(), "cred_canary");
    for coding in testkit::codings::ALL {
        // A provider that compresses whatever it was asked for, and
        // echoes the Authorization header into every record.
        let canary = format!("canary-{}-secret", uuid::Uuid::new_v4().simple());
        let provider = placeholder(Placeholder {
            token: Some(canary.clone()),
            echo_credential: true,
            compress: Some(coding),
            ..Placeholder::with_posts(30)
        })
        .await;
        let cassette = work.path().join(coding);
        let mut env = provider.env.clone();
        env.push(("SERVICE_RECORD_SECRET".into(), canary.clone()));
        let recorded = run(record(example_plugin(), &config, &cassette, &env)).await;
        assert!(recorded.status.success(), "{coding}: {}", text(&recorded));
        assert!(stdout(&recorded).contains("stream posts: 30 record(s)"), "{coding}: {}", text(&recorded));
        let posts = std::fs::read_to_string(cassette.join("streams/posts.jsonl")).unwrap();
        assert!(posts.contains("\"requested_by\":\"Bearer [REDACTED]\""), "{coding}: {posts}");

        // No file holds the secret, however it is decoded.
        for file in files_under(&cassette) {
            let bytes = std::fs::read(&file).unwrap();
            for form in forms(&canary) {
                assert!(!testkit::codings::holds(&bytes, &form), "{coding}: {} holds the secret", file.display());
            }
        }
        // Each answer is recorded decoded, at its own length: the
        // provider's length would tell the secret's.
        let exchanges = std::fs::read_to_string(cassette.join("exchanges.jsonl")).unwrap();
        for line in exchanges.lines() {
            let exchange: Value = serde_json::from_str(line).unwrap();
            let response = &exchange["response"];
            let headers: Vec<(String, String)> = serde_json::from_value(response["headers"].clone()).unwrap();
            assert!(!headers.iter().any(|(n, _)| n == "content-encoding"), "{coding}: {line}");
            let length = headers.iter().find(|(n, _)| n == "content-length").map(|(_, v)| v.clone());
            let Some(name) = response["body"].as_str() else { continue };
            let body = std::fs::read(cassette.join(name)).unwrap();
            assert_eq!(length, Some(body.len().to_string()), "{coding}: {line}");
        }
    }
}

/// A recording's secret goes only to the hosts it is bound to, as a
/// server's credential does: a plugin that sends it to another host the
/// recording may reach gets a refusal, and that host never sees it.
#[tokio::test(flavor = "multi_thread")]
async fn a_recordings_secret_goes_only_to_the_hosts_it_is_bound_to() {
    use std::sync::Mutex;
    let ca = TestCa::new();
    let seen: Arc<Mutex<Vec<String>>> = Default::default();
    let router = axum::Router::new().fallback({
        let seen = seen.clone();
        move |headers: axum::http::HeaderMap| {
            let seen = seen.clone();
            async move {
                let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                seen.lock().unwrap().push(auth);
                "{}"
            }
        }
    });
    let hosts = ["api.provider.test", "echo.provider.test"];
    let fake = FakeProvider::start(&ca, &hosts, router).await;
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("ca.pem"), &ca.pem).unwrap();
    let config = work.path().join("config.json");
    std::fs::write(
        &config,
        json!({ "behave": "egress", "credential_handle": "cred_canary",
            "request": { "url": "https://echo.provider.test/x", "credential": { "handle": "cred_canary" } } })
        .to_string(),
    )
    .unwrap();
    let canary = format!("canary-{}-secret", uuid::Uuid::new_v4().simple());
    for (bound, sent) in [("api.provider.test", false), ("echo.provider.test", true)] {
        seen.lock().unwrap().clear();
        let env = vec![
            ("SERVICE_EGRESS_RESOLVE".to_owned(), fake.pins(&hosts)),
            ("SERVICE_EGRESS_EXTRA_ROOTS".to_owned(), work.path().join("ca.pem").display().to_string()),
            ("SERVICE_EGRESS_ALLOWED_HOSTS".to_owned(), hosts.join(",")),
            ("SERVICE_RECORD_SECRET".to_owned(), canary.clone()),
            ("SERVICE_RECORD_SECRET_HOSTS".to_owned(), bound.to_owned()),
        ];
        let cassette = work.path().join(bound);
        let recorded = run(record(testkit::plugins::test_plugin("test_misbehaving"), &config, &cassette, &env)).await;
        assert!(recorded.status.success(), "{bound}: {}", text(&recorded));
        let carried = seen.lock().unwrap().iter().filter(|a| a.contains(&canary)).count();
        if sent {
            assert!(carried > 0, "bound to the host it reached, the secret went: {:?}", seen.lock().unwrap());
        } else {
            assert_eq!(carried, 0, "bound elsewhere, the secret never left");
            let exchanges = std::fs::read_to_string(cassette.join("exchanges.jsonl")).unwrap();
            assert!(exchanges.contains("not bound to host echo.provider.test"), "{exchanges}");
        }
    }
}

/// A recording in which the provider refused every call is no green
/// test: `record` exits 1 naming the failures, unless the author keeps it
/// on purpose (`--accept-failures`).
#[tokio::test(flavor = "multi_thread")]
async fn a_recording_of_failure_exits_non_zero_unless_accepted() {
    let provider =
        placeholder(Placeholder { token: Some("the-real-token".into()), ..Placeholder::with_posts(5) }).await;
    let work = tempfile::tempdir().unwrap();
    let config = placeholder_config(work.path(), "cred_x");
    let mut env = provider.env.clone();
    env.push(("SERVICE_RECORD_SECRET".into(), "a-wrong-token".into()));
    let refused = run(record(example_plugin(), &config, &work.path().join("refused"), &env)).await;
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(one_error_line(&refused).contains("--accept-failures"), "{}", text(&refused));
    let mut kept = record(example_plugin(), &config, &work.path().join("kept"), &env);
    kept.arg("--accept-failures");
    let kept = run(kept).await;
    assert!(kept.status.success(), "{}", text(&kept));
}

/// A recording stops the connector's wall clock at the instant it names
/// and seeds its randomness: two recordings in two processes see the same
/// time and the same random keys, and a replay sees what they saw, so the
/// conformance suite's two replays agree.
#[tokio::test(flavor = "multi_thread")]
async fn a_recording_and_its_replays_see_one_instant_and_one_randomness() {
    let component = testkit::plugins::test_plugin("test_misbehaving");
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("config.json");
    std::fs::write(&config, r#"{"behave": "report"}"#).unwrap();
    let clock = "2026-11-20T12:00:00.123456Z";
    let mut previews = Vec::new();
    for n in 0..2 {
        let out = work.path().join(format!("c{n}"));
        let mut cmd = record(&component, &config, &out, &[]);
        cmd.args(["--clock", clock]);
        let recorded = run(cmd).await;
        assert!(recorded.status.success(), "{}", text(&recorded));
        let preview: Value = serde_json::from_slice(&std::fs::read(out.join("preview.json")).unwrap()).unwrap();
        previews.push(preview["ok"].clone());
    }
    assert_eq!(previews[0]["clock"]["unix_nanos"], "1795176000123456000", "{}", previews[0]);
    assert_eq!(previews[0]["clock"], previews[1]["clock"]);
    assert_eq!(previews[0]["random"], previews[1]["random"], "two processes, one seed");
    let replayed = run(offline(&["plugins", "conform", work.path().join("c0").to_str().unwrap()])).await;
    assert!(replayed.status.success(), "{}", text(&replayed));
    assert!(
        stdout(&replayed).contains(&format!("ok   determinism              two replays, clock stopped at {clock}")),
        "{}",
        text(&replayed)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_one_line_naming_the_file_and_position() {
    let provider = placeholder(Placeholder::with_posts(5)).await;
    let work = tempfile::tempdir().unwrap();
    let component = example_plugin();
    let config = work.path().join("config.json");
    let record_example = |config: &Path, out: &Path| record(&component, config, out, &provider.env);

    // A config that is not JSON, and one the plugin's schema refuses.
    std::fs::write(&config, "{\"base_url\": }").unwrap();
    let out = run(record_example(&config, &work.path().join("x"))).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(one_error_line(&out).contains("config.json:1:14: expected value"), "{}", text(&out));
    std::fs::write(&config, "{\"base_url\": 5}").unwrap();
    let out = run(record_example(&config, &work.path().join("x"))).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let line = one_error_line(&out);
    assert!(line.contains("config.json: at /base_url: does not match the plugin's config schema"), "{line}");
    assert!(!work.path().join("x").exists(), "nothing written for refused input");
    // A folder of something else is not written over.
    std::fs::write(&config, json!({ "base_url": "https://jsonplaceholder.typicode.com" }).to_string()).unwrap();
    let elsewhere = work.path().join("project");
    std::fs::create_dir_all(elsewhere.join("streams")).unwrap();
    std::fs::write(elsewhere.join("streams/mine.txt"), "keep me").unwrap();
    let out = run(record_example(&config, &elsewhere)).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(one_error_line(&out).contains("project: not empty and not a cassette"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(elsewhere.join("streams/mine.txt")).unwrap(), "keep me");
    // A secret where a handle belongs is refused before anything runs.
    std::fs::write(
        &config,
        json!({ "base_url": "https://jsonplaceholder.typicode.com", "api_token": "abc123def456" }).to_string(),
    )
    .unwrap();
    let out = run(record_example(&config, &work.path().join("x"))).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let line = one_error_line(&out);
    assert!(line.contains("config.json: at /api_token: looks like a secret"), "{line}");
    assert!(!line.contains("abc123def456") && !work.path().join("x").exists());

    // A component that does not validate.
    std::fs::write(&config, json!({ "base_url": "https://jsonplaceholder.typicode.com" }).to_string()).unwrap();
    let bad = crate::support::test_plugin("test_bad_describe");
    let out = run(record(&bad, &config, &work.path().join("x"), &provider.env)).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(one_error_line(&out).contains("test_bad_describe.wasm: not a usable plugin"), "{}", text(&out));

    // A good cassette, then each way of spoiling it.
    let good = work.path().join("good");
    let out = run(record_example(&config, &good)).await;
    assert!(out.status.success(), "{}", text(&out));
    drop(provider);
    let spoiled = |name: &str, file: &str, change: &dyn Fn(String) -> String| {
        let dir = work.path().join(name);
        copy_dir(&good, &dir);
        let path = dir.join(file);
        std::fs::write(&path, change(std::fs::read_to_string(&path).unwrap())).unwrap();
        dir
    };
    let last = std::fs::read_to_string(good.join("exchanges.jsonl")).unwrap().lines().count();
    let manifest: Value = serde_json::from_slice(&std::fs::read(good.join("cassette.json")).unwrap()).unwrap();
    let interface = manifest["connector"]["interface"].as_str().unwrap().to_owned();
    let cases: Vec<(PathBuf, String)> = vec![
        (spoiled("truncated", "cassette.json", &|t| t[..t.len() / 2].to_owned()), "cassette.json:".into()),
        (spoiled("cut", "exchanges.jsonl", &|t| t[..t.len() - 30].to_owned()), format!("exchanges.jsonl:{last}:")),
        (
            spoiled("other-id", "cassette.json", &|t| t.replace("conn_example_jsonplaceholder", "conn_other")),
            format!(
                "recorded for conn_other ({interface}), but the component is conn_example_jsonplaceholder ({interface})"
            ),
        ),
        (
            spoiled("other-interface", "cassette.json", &|t| t.replace(&interface, "service:connector@2.0.0")),
            "recorded for conn_example_jsonplaceholder (service:connector@2.0.0)".into(),
        ),
        (
            spoiled("other-format", "cassette.json", &|t| t.replace("service-cassette/1", "service-cassette/9")),
            "format service-cassette/9 is not one this host reads".into(),
        ),
        (
            spoiled("bad-config", "cassette.json", &|t| t.replace("\"https://jsonplaceholder.typicode.com\"", "7")),
            "cassette.json: config: at /base_url: does not match".into(),
        ),
    ];
    for (dir, expected) in cases {
        let out = run(offline(&["plugins", "test", dir.to_str().unwrap()])).await;
        assert_eq!(out.status.code(), Some(2), "{}: {}", dir.display(), text(&out));
        let line = one_error_line(&out);
        assert!(line.contains(&expected), "{}: {line}", dir.display());
        assert!(line.contains(dir.file_name().unwrap().to_str().unwrap()), "names the file: {line}");
    }
    let out = run(offline(&["plugins", "test", work.path().join("nowhere").to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    one_error_line(&out);
}

fn copy_dir(from: &Path, to: &Path) {
    for file in files_under(from) {
        let dest = to.join(file.strip_prefix(from).unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&file, dest).unwrap();
    }
}

/// The cassettes checked in, by connector: (folder, component stem).
fn checked_in() -> Vec<(PathBuf, &'static str)> {
    let root = repository().join("plugins");
    let mut found = Vec::new();
    for (plugin, stem) in [
        ("example-http-source", "example_http_source"),
        ("emailcampaign", "conn_emailcampaign"),
        ("socialmedia", "conn_socialmedia"),
        ("restmanifest", "conn_restmanifest"),
    ] {
        let dir = root.join(plugin).join("cassettes");
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
            if entry.path().join("cassette.json").is_file() {
                found.push((entry.path(), stem));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn the_checked_in_cassettes_replay_offline() {
    example_plugin();
    let cassettes = checked_in();
    for stem in ["example_http_source", "conn_emailcampaign", "conn_socialmedia", "conn_restmanifest"] {
        assert!(cassettes.iter().any(|(_, s)| *s == stem), "a cassette of {stem} is checked in");
    }
    for (dir, _) in cassettes {
        let out = run(offline(&["plugins", "test", dir.to_str().unwrap()])).await;
        assert!(out.status.success(), "{}: {}", dir.display(), text(&out));
        assert!(stdout(&out).starts_with("ok  "), "{}", text(&out));
    }
}

/// The conformance suite over every checked-in cassette: each passes,
/// every incremental stream is cut at its checkpoints, and every
/// connector given a secret is checked for echoes of it.
#[tokio::test(flavor = "multi_thread")]
async fn the_checked_in_cassettes_pass_the_conformance_suite() {
    example_plugin();
    for (dir, stem) in checked_in() {
        let out = run(offline(&["plugins", "conform", dir.to_str().unwrap()])).await;
        let report = stdout(&out);
        assert!(out.status.success(), "{}: {}", dir.display(), text(&out));
        assert!(report.starts_with("ok  "), "{report}");
        let crashed: usize = report
            .split(" checkpoint(s) crashed")
            .next()
            .and_then(|head| head.rsplit(", ").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no crash count: {report}"));
        assert!(crashed > 0, "{stem}: no checkpoint was cut: {report}");
        match stem {
            // jsonplaceholder takes no credential.
            "example_http_source" => assert!(report.contains("n/a  secrets"), "{report}"),
            _ => assert!(report.contains("ok   secrets"), "{stem}: {report}"),
        }
        assert!(report.contains("ok   determinism"), "{report}");
    }
}

/// A provider that serves a resumed read what was already written, or
/// drops what was not, fails the crash check, naming the records; a
/// cassette without the resumed reads says to record again.
#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_names_records_written_twice_or_lost_at_a_crash() {
    let example = example_plugin();
    let work = tempfile::tempdir().unwrap();
    let source = repository().join("plugins/example-http-source/cassettes/posts");
    // Each tampering of the first resumed read's answer, and what it shows.
    let resumed_answer = |dir: &Path| -> PathBuf {
        let exchanges = std::fs::read_to_string(dir.join("exchanges.jsonl")).unwrap();
        let line = exchanges
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|e| e["call"].as_str().unwrap().starts_with("resume posts from checkpoint"))
            .expect("the cassette records a resumed read of its own");
        dir.join(line["response"]["body"].as_str().unwrap())
    };
    for (case, tamper, finding) in [
        ("twice", "again", "record(s) written twice"),
        ("lost", "drop", "record(s) missing"),
        ("unrecorded", "unrecorded", "holds no read resumed from"),
    ] {
        let dir = work.path().join(case);
        copy_dir(&source, &dir);
        let mut manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("cassette.json")).unwrap()).unwrap();
        manifest["component"] = Value::String(example.display().to_string());
        std::fs::write(dir.join("cassette.json"), manifest.to_string()).unwrap();
        match tamper {
            "unrecorded" => {
                let kept: String = std::fs::read_to_string(dir.join("exchanges.jsonl"))
                    .unwrap()
                    .lines()
                    .filter(|l| !l.contains("\"call\":\"resume "))
                    .map(|l| format!("{l}\n"))
                    .collect();
                std::fs::write(dir.join("exchanges.jsonl"), kept).unwrap();
            }
            _ => {
                let body = resumed_answer(&dir);
                let mut page: Vec<Value> = serde_json::from_slice(&std::fs::read(&body).unwrap()).unwrap();
                if tamper == "again" {
                    // The last record written before the cut, served again.
                    let mut before = page[0].clone();
                    before["id"] = Value::from(page[0]["id"].as_i64().unwrap() - 1);
                    before["title"] = Value::from(format!("post number {}", before["id"]));
                    page.insert(0, before);
                } else {
                    page.remove(0);
                }
                std::fs::write(&body, serde_json::to_vec(&page).unwrap()).unwrap();
            }
        }
        let out = run(offline(&["plugins", "conform", dir.to_str().unwrap()])).await;
        assert_eq!(out.status.code(), Some(1), "{case}: {}", text(&out));
        let report = stdout(&out);
        assert!(report.starts_with("FAILED  "), "{case}: {report}");
        assert!(report.contains("FAIL crash posts"), "{case}: {report}");
        assert!(report.contains(finding), "{case}: {report}");
        assert!(report.contains("ok   replay"), "{case}: only the resumed read was touched: {report}");
    }
}

/// The fakes the checked-in cassettes were recorded against, on the names
/// their configs use, and the settings that reach them.
struct Fakes {
    _provider: FakeProvider,
    env: Vec<(String, String)>,
    _ca_file: tempfile::NamedTempFile,
}

/// A manifest source whose key goes in the query string, recorded against
/// a fake that takes it only there and keeps it in every `Link` it
/// answers: the recording holds the handle and the placement, never the
/// key, and it replays and passes the conformance suite offline.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_in_the_query_is_recorded_as_a_handle_and_replays_offline() {
    let key = format!("querykey{}", uuid::Uuid::new_v4().simple());
    let rest = Arc::new(testkit::restapi::RestApi::new(45).with_token(key.clone()).with_key_param("api_key"));
    let ca = TestCa::new();
    let provider = FakeProvider::start(&ca, &[testkit::restapi::HOST], testkit::restapi::router(rest.clone())).await;
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), &ca.pem).unwrap();
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("config.json");
    let manifest = json!({ "streams": [{ "name": "items", "path": "/link/items", "params": { "per_page": 20 },
        "primary_key": ["id"], "paging": { "type": "link_header" } }] });
    std::fs::write(
        &config,
        json!({ "base_url": format!("https://{}", testkit::restapi::HOST), "credential_handle": "cred_acme_key",
            "credential_placement": "query:api_key", "manifest": manifest })
        .to_string(),
    )
    .unwrap();
    let cassette = work.path().join("cassette");
    let env = vec![
        ("SERVICE_EGRESS_RESOLVE".to_owned(), provider.pins(&[testkit::restapi::HOST])),
        ("SERVICE_EGRESS_EXTRA_ROOTS".to_owned(), ca_file.path().display().to_string()),
        ("SERVICE_EGRESS_ALLOWED_HOSTS".to_owned(), testkit::restapi::HOST.to_owned()),
        ("SERVICE_RECORD_SECRET".to_owned(), key.clone()),
    ];
    let mut cmd = record("bundled:conn_restmanifest", &config, &cassette, &env);
    cmd.args(["--placement", "query:api_key"]);
    let recorded = run(cmd).await;
    assert!(recorded.status.success(), "{}", text(&recorded));
    assert!(stdout(&recorded).contains("stream items: 45 record(s)"), "{}", text(&recorded));
    let asked = rest.asked.lock().unwrap().clone();
    assert!(asked.iter().all(|uri| uri.matches(&key).count() == 1), "every request had the key once: {asked:?}");
    let exchanges = std::fs::read_to_string(cassette.join("exchanges.jsonl")).unwrap();
    assert!(
        exchanges.contains(r#""credential":{"handle":"cred_acme_key","placement":"query:api_key"}"#),
        "{exchanges}"
    );
    assert!(exchanges.contains("api_key=[REDACTED]"), "the links came back redacted: {exchanges}");
    for file in files_under(&cassette) {
        let bytes = std::fs::read(&file).unwrap();
        assert!(memchr::memmem::find(&bytes, key.as_bytes()).is_none(), "{} holds the key", file.display());
    }
    assert!(!text(&recorded).contains(&key), "nor does the output");
    drop(provider);
    let tested = run(offline(&["plugins", "test", cassette.to_str().unwrap()])).await;
    assert!(tested.status.success(), "{}", text(&tested));
    let conformed = run(offline(&["plugins", "conform", cassette.to_str().unwrap()])).await;
    assert!(conformed.status.success(), "{}", text(&conformed));
}

/// The API token of the email-campaign fake, and the access token the
/// social-media fake takes (no OAuth flow: the recording holds a token).
const MAILCOACH_TOKEN: &str = "mailcoach-recording-token";
const HUBSPOT_TOKEN: &str = "hubspot-recording-access-token";
const RESTAPI_TOKEN: &str = "acme-recording-api-token";

async fn fakes() -> Fakes {
    let ca = TestCa::new();
    let mc = Arc::new(mailcoach::MailcoachState {
        token: MAILCOACH_TOKEN.into(),
        campaigns: mailcoach::campaigns(12),
        subscribers: 30,
        ..Default::default()
    });
    let hub = hubspot::Hub::new();
    hub.access.lock().unwrap().insert(HUBSPOT_TOKEN.into(), None);
    let placeholder = Arc::new(Placeholder::with_posts(120));
    let rest = Arc::new(testkit::restapi::RestApi::new(40).with_token(RESTAPI_TOKEN));
    let names = ["mail.acme-corp.com", "api.hubapi.com", jsonplaceholder::HOST, testkit::restapi::HOST];
    let router = mailcoach::router(mc)
        .merge(hubspot::router(hub))
        .merge(jsonplaceholder::router(placeholder))
        .merge(testkit::restapi::router(rest));
    let provider = FakeProvider::start(&ca, &names, router).await;
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), &ca.pem).unwrap();
    let env = vec![
        ("SERVICE_EGRESS_RESOLVE".to_owned(), provider.pins(&names)),
        ("SERVICE_EGRESS_EXTRA_ROOTS".to_owned(), ca_file.path().display().to_string()),
        ("SERVICE_EGRESS_ALLOWED_HOSTS".to_owned(), names.join(",")),
    ];
    Fakes { _provider: provider, env, _ca_file: ca_file }
}

/// `exchanges.jsonl` with the value of every `date` response header
/// blanked: the one thing that changes with every answer.
fn without_dates(text: &str) -> String {
    const DATE: &str = "[\"date\",\"";
    let mut out = String::new();
    for line in text.lines() {
        let mut line = line.to_owned();
        let mut from = 0;
        while let Some(at) = line[from..].find(DATE) {
            let start = from + at + DATE.len();
            let len = line[start..].find('"').unwrap_or(0);
            line.replace_range(start..start + len, "");
            from = start;
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Records every checked-in cassette again against the fakes, with the
/// config, streams and limit it holds, and finds the same cassette (bar
/// the `date` headers). With `SERVICE_UPDATE_CASSETTES=1` it writes them
/// instead: that is how they are made.
#[tokio::test(flavor = "multi_thread")]
async fn recording_the_checked_in_cassettes_again_gives_them_back() {
    let fakes = fakes().await;
    let update = std::env::var("SERVICE_UPDATE_CASSETTES").is_ok_and(|v| v == "1");
    let example = example_plugin();
    for (dir, stem) in checked_in() {
        let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("cassette.json")).unwrap()).unwrap();
        // A manifest source is recorded with the bundled plugin, as its
        // author would (`bundled:conn_restmanifest`).
        let component = match stem {
            "example_http_source" => example.clone().into_os_string(),
            "conn_restmanifest" => format!("bundled:{stem}").into(),
            _ => bundled_plugin(stem).into_os_string(),
        };
        let work = tempfile::tempdir().unwrap();
        let config = work.path().join("config.json");
        std::fs::write(&config, manifest["config"].to_string()).unwrap();
        let out = if update { dir.clone() } else { work.path().join("again") };
        let streams: Vec<&str> =
            manifest["streams"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
        let limit = manifest["record_limit"].to_string();
        let mut cmd = record(&component, &config, &out, &fakes.env);
        cmd.args(["--record-limit", &limit]);
        // The connector's clock stands where it stood, so the requests
        // and records are the same.
        if let Some(clock) = manifest["recorded_at"].as_str() {
            cmd.args(["--clock", clock]);
        }
        // A new cassette's manifest may list no stream yet: all are read.
        if !streams.is_empty() {
            cmd.args(["--streams", &streams.join(",")]);
        }
        // Reads resumed from a saved state start from it again.
        let states: serde_json::Map<String, Value> = manifest["streams"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s.get("state").is_some())
            .map(|s| (s["name"].as_str().unwrap().to_owned(), s["state"].clone()))
            .collect();
        if !states.is_empty() {
            let file = work.path().join("state.json");
            std::fs::write(&file, Value::Object(states).to_string()).unwrap();
            cmd.arg("--state").arg(file);
        }
        let secret = match stem {
            "conn_socialmedia" => HUBSPOT_TOKEN,
            "conn_restmanifest" => RESTAPI_TOKEN,
            _ => MAILCOACH_TOKEN,
        };
        cmd.env("SERVICE_RECORD_SECRET", secret);
        let recorded = run(cmd).await;
        assert!(recorded.status.success(), "{}: {}", dir.display(), text(&recorded));
        if update {
            continue;
        }
        for file in files_under(&dir) {
            let relative = file.strip_prefix(&dir).unwrap();
            let again = out.join(relative);
            let (want, got) = (std::fs::read(&file).unwrap(), std::fs::read(&again).unwrap_or_default());
            if relative == Path::new("cassette.json") {
                // The same but for where the component is, seen from here.
                let without_component = |bytes: &[u8]| {
                    let mut manifest: Value = serde_json::from_slice(bytes).unwrap();
                    manifest.as_object_mut().unwrap().remove("component");
                    manifest
                };
                assert_eq!(without_component(&want), without_component(&got), "{}", file.display());
            } else if relative == Path::new("exchanges.jsonl") {
                assert_eq!(
                    without_dates(&String::from_utf8_lossy(&want)),
                    without_dates(&String::from_utf8_lossy(&got)),
                    "{}",
                    file.display()
                );
            } else {
                assert!(want == got, "{} differs when recorded again", file.display());
            }
        }
        assert_eq!(files_under(&dir).len(), files_under(&out).len(), "{}", dir.display());
    }
}

/// Every placement a credential can have, recorded with the bundled
/// manifest source against a fake that checks each as its API would: a
/// header, the query, a JSON body field, an HMAC signature (`--placement
/// @recipe.json` with a `signing` recipe), and a client secret, a JWT key
/// and a password each traded for a token (an `exchange` recipe). No
/// cassette holds the secret or a token it was traded for, and each
/// replays and passes the conformance suite offline, its canary placed
/// where the recording's secret went.
#[tokio::test(flavor = "multi_thread")]
async fn every_placement_records_as_a_handle_and_replays_offline() {
    use crate::canaries::{self, HOST};
    let secrets = canaries::Canaries::new();
    let p = Arc::new(canaries::Provider {
        canaries: secrets.clone(),
        issued: Default::default(),
        elsewhere_heard: Default::default(),
        control: "recorded".into(),
    });
    let ca = TestCa::new();
    let provider = FakeProvider::start(&ca, &[HOST], canaries::provider(p.clone())).await;
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), &ca.pem).unwrap();
    let work = tempfile::tempdir().unwrap();
    let all = work.path().join("cassettes");
    for case in canaries::cases() {
        let secret = secrets.by_key(case.key).to_owned();
        let placement = match case.kind {
            "header" => "header:X-Api-Key".to_owned(),
            "query" => "query:api_key".to_owned(),
            "body" => "body:/auth/password".to_owned(),
            _ => {
                let recipe = work.path().join(format!("{}.json", case.kind));
                std::fs::write(&recipe, case.fields.to_string()).unwrap();
                format!("@{}", recipe.display())
            }
        };
        let mut stream = json!({ "name": "items", "path": format!("/{}/items", case.kind), "records": "/data",
            "primary_key": ["id"], "paging": { "type": "page_number", "param": "page", "total_pages": "/meta/total_pages" } });
        if case.kind == "body" {
            stream["body"] = json!({ "query": "all", "auth": { "user": "me" } });
        }
        let config = work.path().join(format!("{}.config.json", case.kind));
        std::fs::write(
            &config,
            json!({ "base_url": format!("https://{HOST}"), "credential_handle": format!("cred_{}", case.kind),
                "credential_placement": case.placement, "manifest": { "streams": [stream] } })
            .to_string(),
        )
        .unwrap();
        let env = vec![
            ("SERVICE_EGRESS_RESOLVE".to_owned(), provider.pins(&[HOST])),
            ("SERVICE_EGRESS_EXTRA_ROOTS".to_owned(), ca_file.path().display().to_string()),
            ("SERVICE_EGRESS_ALLOWED_HOSTS".to_owned(), HOST.to_owned()),
            ("SERVICE_RECORD_SECRET".to_owned(), secret),
        ];
        let mut cmd = record("bundled:conn_restmanifest", &config, &all.join(case.kind), &env);
        cmd.args(["--placement", &placement]);
        let recorded = run(cmd).await;
        assert!(recorded.status.success(), "{}: {}", case.kind, text(&recorded));
        let total = canaries::PAGES * canaries::PER_PAGE;
        assert!(stdout(&recorded).contains(&format!("stream items: {total} record(s)")), "{}", text(&recorded));
        let exchanges = std::fs::read_to_string(all.join(case.kind).join("exchanges.jsonl")).unwrap();
        assert!(exchanges.contains(&format!("\"handle\":\"cred_{}\"", case.kind)), "{exchanges}");
        let scrubbed = files_under(&all.join(case.kind))
            .iter()
            .any(|f| memchr::memmem::find(&std::fs::read(f).unwrap(), b"[REDACTED]").is_some());
        assert!(scrubbed, "{}: the provider's echo came back scrubbed", case.kind);
        for (what, needle) in secrets.needles() {
            assert!(!text(&recorded).contains(&needle), "{}: the output holds the {what}", case.kind);
        }
    }
    assert!(p.issued.load(std::sync::atomic::Ordering::SeqCst) >= 3, "each exchange traded its secret");
    for file in files_under(&all) {
        let bytes = std::fs::read(&file).unwrap();
        for (what, needle) in secrets.needles() {
            assert!(memchr::memmem::find(&bytes, needle.as_bytes()).is_none(), "{} holds the {what}", file.display());
        }
    }
    let signed = std::fs::read_to_string(all.join("signed").join("cassette.json")).unwrap();
    assert!(signed.contains("\"secret_placement\"") && signed.contains("X-Signature"), "{signed}");
    drop(provider);
    let tested = run(offline(&["plugins", "test", all.to_str().unwrap()])).await;
    assert!(tested.status.success(), "{}", text(&tested));
    let conformed = run(offline(&["plugins", "conform", all.to_str().unwrap()])).await;
    assert!(conformed.status.success(), "{}", text(&conformed));
}
