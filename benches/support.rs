//! What the benchmarks share: the test plugins and a server state over a
//! fresh SQLite database with a given egress policy.

use std::path::Path;

use service::config::{PluginSettings, ServerConfig};
use service::egress::EgressPolicy;
use service::state::AppState;

#[path = "../tests/integration/support/plugins.rs"]
// Not every benchmark loads a test plugin.
#[allow(dead_code)]
mod plugins;
#[allow(unused_imports)]
pub use plugins::test_plugin;

/// A server state (no listener) in `dir`, bootstrapped with an
/// administrator `bench@example.test`.
pub async fn state(dir: &Path, egress: EgressPolicy) -> AppState {
    // The server refuses a data directory other users can enter.
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let config = ServerConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_owned(),
        database_url: format!("sqlite://{}/service.db?mode=rwc", dir.display()),
        public_url: url::Url::parse("http://127.0.0.1/").unwrap(),
        session_ttl_ms: 3_600_000,
        bootstrap_token: Some("svc_bench_bootstrap_token_0123456789".to_owned().into()),
        bootstrap_email: "bench@example.test".into(),
        master_key: None,
        plugins: PluginSettings {
            plugins_dir: dir.join("plugins"),
            egress,
            limits: Default::default(),
            // The benchmark's PostgreSQL (BENCH_POSTGRES_URL) is local.
            warehouses: service::config::warehouse::WarehousePolicy::from_settings("127.0.0.1,::1,localhost").unwrap(),
        },
        oauth: Default::default(),
        limits: Default::default(),
    };
    AppState::open(config).await.unwrap()
}
