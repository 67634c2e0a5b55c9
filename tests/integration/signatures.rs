//! Plugin signatures, as an operator and a publisher meet them: the
//! publisher makes a key and signs a component with the `service` binary;
//! a server that requires signatures (the default) loads it, names its
//! signer, and refuses every component it should not run: unsigned, a
//! byte changed after signing, signed by a key it does not trust, a
//! signature moved to another identity. Bundled plugins need none.

use std::path::Path;
use std::process::Command;

use service::config::signatures::{SignaturePolicy, TrustedKey};
use service::plugin::registry::{LoadError, PluginSource};
use service::plugin::signature::SignatureError;

use crate::support::process::BIN;
use crate::support::{Backend, TestServer, json_ok, test_plugin};

/// Runs the `service` binary; its standard output and error, after
/// checking it succeeded.
fn run(args: &[&str]) -> (String, String) {
    let out = Command::new(BIN).args(args).env("SERVICE_LOG", "warn").output().unwrap();
    assert!(out.status.success(), "service {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

fn service(args: &[&str]) -> String {
    run(args).0
}

/// A publisher's key made with `service plugins keygen`: its file and the
/// line operators trust it with.
fn publisher(dir: &Path, name: &str) -> (std::path::PathBuf, TrustedKey) {
    let key = dir.join(format!("{name}.key"));
    let (line, said) = run(&["plugins", "keygen", "--out", key.to_str().unwrap(), "--name", name]);
    assert!(line.trim().starts_with(&format!("{name}=")), "{line}");
    let private = std::fs::read_to_string(&key).unwrap();
    assert!(private.starts_with("# service plugin signing key"), "{private}");
    let secret = private.lines().nth(1).unwrap().trim();
    assert!(secret.len() > 40 && !line.contains(secret) && !said.contains(secret), "the private key is never printed");
    #[cfg(unix)]
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions()) & 0o077,
        0,
        "only its owner may read it"
    );
    (key, TrustedKey::parse(line.trim(), "test").unwrap())
}

/// A copy of a test plugin in `dir`, signed with `key` when one is given.
fn component(dir: &Path, name: &str, key: Option<&Path>) -> std::path::PathBuf {
    let file = dir.join(format!("{name}.wasm"));
    std::fs::copy(test_plugin("test_noop"), &file).unwrap();
    if let Some(key) = key {
        let said = service(&["plugins", "sign", file.to_str().unwrap(), "--key", key.to_str().unwrap()]);
        assert!(said.contains("signed test_noop"), "{said}");
    }
    file
}

async fn load(srv: &TestServer, file: &Path) -> Result<String, LoadError> {
    srv.state.plugins.load_bytes(&std::fs::read(file).unwrap(), PluginSource::File(file.to_owned())).await
}

/// The reason a load was refused, after checking it names the digest.
fn refusal(result: Result<String, LoadError>, bytes_of: &Path) -> SignatureError {
    match result {
        Err(LoadError::Signature { digest, reason, .. }) => {
            let expected = service::plugin::signature::digest(&std::fs::read(bytes_of).unwrap());
            assert_eq!(digest, expected, "the refusal names the component's digest");
            reason
        }
        other => panic!("expected a signature refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_components_signed_by_a_trusted_publisher_load_where_signatures_are_required() {
    let dir = tempfile::tempdir().unwrap();
    let (acme_key, acme) = publisher(dir.path(), "acme");
    let (stranger_key, _) = publisher(dir.path(), "stranger");
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.plugins.signatures = SignaturePolicy { required: true, trusted: vec![acme] };
    })
    .await
    .unwrap();
    // Bundled plugins are built with the server: no signature needed.
    assert!(srv.state.plugins.available("conn_rest_manifest").await.is_ok());

    let unsigned = component(dir.path(), "unsigned", None);
    assert!(matches!(refusal(load(&srv, &unsigned).await, &unsigned), SignatureError::Unsigned(_)));

    let stranger = component(dir.path(), "stranger", Some(&stranger_key));
    assert!(matches!(refusal(load(&srv, &stranger).await, &stranger), SignatureError::UnknownKey(_)));

    // A byte changed after signing: refused before it is compiled.
    let tampered = component(dir.path(), "tampered", Some(&acme_key));
    let mut bytes = std::fs::read(&tampered).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&tampered, &bytes).unwrap();
    assert!(matches!(refusal(load(&srv, &tampered).await, &tampered), SignatureError::OtherComponent(_)));

    // A signature edited to claim another version no longer verifies.
    let moved = component(dir.path(), "moved", Some(&acme_key));
    let sig = service::plugin::signature::sidecar(&moved);
    let text = std::fs::read_to_string(&sig).unwrap();
    std::fs::write(&sig, text.replace("\"version\": \"", "\"version\": \"9")).unwrap();
    assert_eq!(refusal(load(&srv, &moved).await, &moved), SignatureError::Invalid);

    // A trusted signature over these very bytes, but for another version
    // than the component declares: refused once it describes itself.
    let relabelled = component(dir.path(), "relabelled", None);
    let digest = service::plugin::signature::digest(&std::fs::read(&relabelled).unwrap());
    let identity = service::plugin::signature::Identity {
        connector_id: "test_noop".into(),
        version: "9.9.9".into(),
        interface: "service:connector@1.0.0".into(),
    };
    let signed = service::plugin::signature::sign(&acme_key, &digest, &identity).unwrap();
    std::fs::write(service::plugin::signature::sidecar(&relabelled), serde_json::to_vec(&signed).unwrap()).unwrap();
    assert!(matches!(refusal(load(&srv, &relabelled).await, &relabelled), SignatureError::OtherIdentity { .. }));

    // A signature file that is a pipe is refused without waiting on it.
    let piped = component(dir.path(), "piped", None);
    let fifo = service::plugin::signature::sidecar(&piped);
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    assert!(matches!(refusal(load(&srv, &piped).await, &piped), SignatureError::Unreadable(_)));

    // Signed by the trusted publisher: loads, and says by whom.
    let signed = component(dir.path(), "signed", Some(&acme_key));
    assert_eq!(load(&srv, &signed).await.unwrap(), "test_noop");
    assert_eq!(srv.state.plugins.summary("test_noop").await.unwrap().unwrap().signer.as_deref(), Some("acme"));
    let listed = json_ok(srv.get("/v1/admin/plugins").send().await.unwrap()).await;
    let noop = listed["data"]["items"].as_array().unwrap().iter().find(|p| p["connector_id"] == "test_noop").unwrap();
    assert_eq!(noop["signer"], "acme", "{noop}");
    let bundled =
        listed["data"]["items"].as_array().unwrap().iter().find(|p| p["connector_id"] == "conn_rest_manifest").unwrap();
    assert!(bundled["signer"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugins_directory_registers_no_unsigned_file_and_allowed_still_refuses_a_bad_signature() {
    let dir = tempfile::tempdir().unwrap();
    let (acme_key, acme) = publisher(dir.path(), "acme");
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.plugins.signatures = SignaturePolicy { required: true, trusted: vec![acme.clone()] };
    })
    .await
    .unwrap();
    // Dropped into the watched directory unsigned: never registered.
    let dropped = srv.state.config.plugins.plugins_dir.join("noop.wasm");
    std::fs::copy(test_plugin("test_noop"), &dropped).unwrap();
    srv.state.plugins.scan_dir().await;
    assert!(srv.state.plugins.summary("test_noop").await.unwrap().is_none(), "an unsigned file is not even listed");
    // Its signature copied in after it: the next scan registers it.
    let signed = component(dir.path(), "noop", Some(&acme_key));
    std::fs::copy(service::plugin::signature::sidecar(&signed), service::plugin::signature::sidecar(&dropped)).unwrap();
    srv.state.plugins.scan_dir().await;
    let summary = srv.state.plugins.summary("test_noop").await.unwrap().expect("registered once signed");
    assert_eq!(summary.signer.as_deref(), Some("acme"));
    assert!(!summary.enabled, "registered, disabled until an operator loads it");

    // Where unsigned components are allowed, a signature present must
    // still hold: a tampered signed component is refused all the same.
    let relaxed = TestServer::start_with(Backend::Sqlite, |c| {
        c.plugins.signatures = SignaturePolicy { required: false, trusted: vec![acme] };
    })
    .await
    .unwrap();
    let tampered = component(dir.path(), "tampered", Some(&acme_key));
    let mut bytes = std::fs::read(&tampered).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&tampered, &bytes).unwrap();
    assert!(matches!(refusal(load(&relaxed, &tampered).await, &tampered), SignatureError::OtherComponent(_)));
    let unsigned = component(dir.path(), "unsigned", None);
    assert_eq!(load(&relaxed, &unsigned).await.unwrap(), "test_noop");
    assert_eq!(relaxed.state.plugins.summary("test_noop").await.unwrap().unwrap().signer, None);
}

/// An installed version carries its signature into the control database
/// and is checked again by every server that prepares it there: a server
/// that does not trust the publisher (or trusts nobody) does not run it,
/// even though another server enabled it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_runs_an_installed_version_only_under_its_own_trust() {
    let dir = tempfile::tempdir().unwrap();
    let (acme_key, acme) = publisher(dir.path(), "acme");
    let trusting = move |c: &mut service::config::ServerConfig| {
        c.plugins.signatures = SignaturePolicy { required: true, trusted: vec![acme] };
    };
    let srv = TestServer::start_with(Backend::Sqlite, trusting.clone()).await.unwrap();
    let signed = component(dir.path(), "noop", Some(&acme_key));
    load(&srv, &signed).await.unwrap();
    srv.state.plugins.load("test_noop", None).await.unwrap();
    assert!(srv.state.plugins.available("test_noop").await.is_ok());

    // Servers with no plugins directory of their own, on the same database.
    let url = srv.state.config.database_url.clone();
    let distrusting = TestServer::start_with(Backend::Sqlite, |c| {
        c.database_url = url.clone();
        c.plugins.signatures = SignaturePolicy { required: true, trusted: vec![] };
    })
    .await
    .unwrap();
    assert!(distrusting.state.plugins.available("test_noop").await.is_err(), "not trusted here: not run");
    let replica = TestServer::start_with(Backend::Sqlite, |c| {
        c.database_url = url.clone();
        trusting(c);
    })
    .await
    .unwrap();
    let summary = replica.state.plugins.summary("test_noop").await.unwrap().expect("learned from the database");
    assert_eq!((summary.signer.as_deref(), summary.available), (Some("acme"), true), "{summary:?}");
    for s in [replica, distrusting, srv] {
        s.stop().await;
    }
}
