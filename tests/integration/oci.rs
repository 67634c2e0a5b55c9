//! Components distributed through an OCI registry: a real one (Debian's
//! `docker-registry`, the CNCF Distribution registry) on loopback. The
//! publisher pushes a signed component; the operator loads it by tag (the
//! tag resolves once to a digest) and the installation keeps the bytes, so
//! a server with no file and no registry runs it. The registry is trusted
//! for nothing: bytes that do not match their digest, a manifest that does
//! not match the digest asked for, and an unsigned artifact are refused.
//!
//! Without `docker-registry` the test says it skipped, unless
//! `SERVICE_TEST_REQUIRE_REGISTRY` is set (as CI sets it): then it fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use service::config::signatures::{SignaturePolicy, TrustedKey};

use crate::support::process::command;
use crate::support::{Backend, TestServer, test_plugin};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A registry on a loopback port, storing into a directory of its own;
/// stopped when dropped.
struct LocalRegistry {
    child: Child,
    address: String,
    storage: tempfile::TempDir,
}

impl LocalRegistry {
    async fn start() -> Option<LocalRegistry> {
        if !Path::new(REGISTRY_BIN).exists() {
            assert!(
                std::env::var_os("SERVICE_TEST_REQUIRE_REGISTRY").is_none(),
                "SERVICE_TEST_REQUIRE_REGISTRY is set but {REGISTRY_BIN} is missing (apt-get install docker-registry)"
            );
            eprintln!("skipped: no {REGISTRY_BIN} (apt-get install docker-registry)");
            return None;
        }
        let storage = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let address = format!("127.0.0.1:{port}");
        let config = storage.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {address}\n",
                storage.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let registry = LocalRegistry { child, address, storage };
        let probe = format!("http://{}/v2/", registry.address);
        for _ in 0..200 {
            if reqwest::get(&probe).await.is_ok_and(|r| r.status().is_success()) {
                return Some(registry);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the registry did not start on {}", registry.address);
    }

    /// Where the registry keeps the blob with `digest` (hex).
    fn blob(&self, digest: &str) -> PathBuf {
        self.storage.path().join("data/docker/registry/v2/blobs/sha256").join(&digest[..2]).join(digest).join("data")
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `service` in an installation whose data directory is `data`,
/// trusting `trusted`; its output, and whether it succeeded.
fn service(data: &Path, trusted: &str, args: &[&str]) -> (bool, String) {
    let out = command()
        .args(args)
        .env("SERVICE_DATA_DIR", data)
        .env("SERVICE_PLUGIN_TRUSTED_KEYS", trusted)
        .env("SERVICE_LOG", "warn")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn ok(data: &Path, trusted: &str, args: &[&str]) -> String {
    let (success, text) = service(data, trusted, args);
    assert!(success, "service {args:?}: {text}");
    text
}

fn refused(data: &Path, trusted: &str, args: &[&str]) -> String {
    let (success, text) = service(data, trusted, args);
    assert!(!success, "service {args:?} should have failed: {text}");
    text
}

/// Flips the last byte of a file: same length, other bytes.
fn flip_last_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_travel_through_a_registry_and_every_digest_is_checked() {
    crate::support::init_crypto();
    let Some(registry) = LocalRegistry::start().await else { return };
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    let key = work.path().join("acme.key");
    let trusted = ok(&data, "", &["plugins", "keygen", "--out", key.to_str().unwrap(), "--name", "acme"]);
    let trusted = trusted.lines().find(|l| l.starts_with("acme=")).unwrap().trim().to_owned();
    let file = work.path().join("versioned.wasm");
    std::fs::copy(test_plugin("test_versioned_one"), &file).unwrap();
    ok(&data, &trusted, &["plugins", "sign", file.to_str().unwrap(), "--key", key.to_str().unwrap()]);
    let component_digest = service::plugin::signature::digest(&std::fs::read(&file).unwrap());

    // Pushed without a tag: tagged with the version it declares.
    let repo = format!("oci://{}/acme/versioned", registry.address);
    let pushed = ok(&data, &trusted, &["plugins", "push", file.to_str().unwrap(), &repo]);
    let pinned = pushed.lines().find(|l| l.starts_with("oci://")).unwrap().trim().to_owned();
    assert!(pinned.starts_with(&format!("{repo}@sha256:")), "{pushed}");
    assert!(pushed.contains("signed"), "{pushed}");

    // Loaded by tag: resolved once to the manifest's digest, installed and
    // made current; the installation names where it came from.
    let loaded = ok(&data, &trusted, &["plugins", "load", &format!("{repo}:1.0.0")]);
    assert!(loaded.contains(&format!("from {pinned}")) && loaded.contains(&component_digest), "{loaded}");
    let listing = ok(&data, &trusted, &["plugins", "versions", "test_versioned"]);
    let line = listing.lines().find(|l| l.contains(&component_digest)).unwrap_or_default();
    assert!(line.starts_with('*') && line.contains("acme") && line.contains(&pinned), "{listing}");

    // Unsigned: refused where signatures are required, naming the digest.
    let unsigned = work.path().join("unsigned.wasm");
    std::fs::copy(test_plugin("test_versioned_two"), &unsigned).unwrap();
    let unsigned_ref = ok(&data, &trusted, &["plugins", "push", unsigned.to_str().unwrap(), &format!("{repo}:two")]);
    assert!(unsigned_ref.contains("unsigned"), "{unsigned_ref}");
    let said = refused(&data, &trusted, &["plugins", "load", &format!("{repo}:two")]);
    let unsigned_digest = service::plugin::signature::digest(&std::fs::read(&unsigned).unwrap());
    assert!(said.contains(&unsigned_digest) && said.contains("not signed"), "{said}");

    // The registry serves a component that is not the layer's digest.
    let layer = registry.blob(&component_digest);
    flip_last_byte(&layer);
    let said = refused(&data, &trusted, &["plugins", "load", &pinned]);
    assert!(said.contains("does not match its digest") && said.contains(&component_digest), "{said}");
    flip_last_byte(&layer);
    // ... or a manifest that is not the one asked for by digest.
    let manifest_digest = pinned.rsplit_once("@sha256:").unwrap().1.to_owned();
    let manifest = registry.blob(&manifest_digest);
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("wasm.config.v0", "wasm.config.v9")).unwrap();
    let said = refused(&data, &trusted, &["plugins", "load", &pinned]);
    assert!(said.contains("a manifest that does not match its digest"), "{said}");
    assert!(refused(&data, &trusted, &["plugins", "load", "oci://not a reference"]).contains("not a reference"));

    // With the registry gone, a server on the installation's database and
    // with no file of its own runs the installed bytes.
    drop(registry);
    let url = format!("sqlite://{}?mode=rwc", data.join("service.db").display());
    let key = TrustedKey::parse(&trusted, "test").unwrap();
    let srv = TestServer::start_with(Backend::Sqlite, |c| {
        c.database_url = url;
        c.plugins.signatures = SignaturePolicy { required: true, trusted: vec![key] };
    })
    .await
    .unwrap();
    let plugin = srv.state.plugins.available("test_versioned").await.expect("runs from the database");
    assert_eq!(plugin.digest, component_digest);
    assert_eq!(plugin.info.version, "1.0.0");
    srv.stop().await;
}
