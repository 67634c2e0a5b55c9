//! What the benchmarks share: the test plugins and a server state over a
//! fresh SQLite database with a given egress policy.

use std::path::{Path, PathBuf};

use service::config::{PluginSettings, ServerConfig};
use service::egress::EgressPolicy;
use service::server::AppState;

/// Builds the test plugins (once per run) and returns `name`'s component.
pub fn test_plugin(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let target = PathBuf::from(env!("SERVICE_WASM_TARGET_DIR"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(root.join("tests/plugins"))
        .args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"])
        .arg(&target)
        .output()
        .expect("cargo");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    target.join(format!("wasm32-wasip2/release/{name}.wasm"))
}

/// A server state (no listener) in `dir`, bootstrapped with an
/// administrator `bench@example.test`.
pub async fn state(dir: &Path, egress: EgressPolicy) -> AppState {
    let config = ServerConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_owned(),
        database_url: format!("sqlite://{}/service.db?mode=rwc", dir.display()),
        public_url: url::Url::parse("http://127.0.0.1/").unwrap(),
        session_ttl_ms: 3_600_000,
        bootstrap_token: Some("svc_bench_bootstrap_token_0123456789".to_owned().into()),
        bootstrap_email: "bench@example.test".into(),
        plugins: PluginSettings { plugins_dir: dir.join("plugins"), egress, limits: Default::default() },
        oauth: Default::default(),
    };
    AppState::open(config).await.unwrap()
}
