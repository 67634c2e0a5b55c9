//! Start-up: shared state, bootstrap, binding and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use secrecy::ExposeSecret;
use tokio::net::TcpListener;

use crate::admin::{self, Bootstrap};
use crate::config::ServerConfig;
use crate::credentials::Vault;
use crate::credentials::keyring::Keyring;
use crate::egress::Egress;
use crate::plugin::Runtime;
use crate::plugin::registry::Registry;
use crate::store::Store;

/// The plugins built with the server (see `build.rs`).
mod bundled {
    include!(concat!(env!("OUT_DIR"), "/bundled.rs"));
}

/// The bundled plugins as the registry takes them.
pub fn bundled_plugins() -> Vec<(&'static str, &'static [u8])> {
    bundled::BUNDLED.to_vec()
}

/// How often the plugins directory and the database's plugin states are
/// checked for changes.
const PLUGIN_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// State shared by every request handler: cheap to clone, no globals.
#[derive(Clone)]
pub struct AppState {
    /// The database.
    pub store: Store,
    /// Resolved configuration.
    pub config: Arc<ServerConfig>,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// Sealed credentials.
    pub vault: Vault,
    /// Outbound requests of connectors, policed.
    pub egress: Egress,
    /// Loaded connector plugins.
    pub plugins: Arc<Registry>,
    /// Refreshes OAuth tokens for the vault (held here, weakly there).
    pub refresher: Arc<dyn crate::credentials::TokenRefresher>,
    /// Recently verified sessions (SQLite, single server, only).
    pub session_cache: Option<Arc<crate::access::SessionCache>>,
    /// Recently read `GET /me` profiles (SQLite, single server, only).
    pub me_cache: Option<Arc<crate::http::me::MeCache>>,
    /// Wakes this server's job runner when it queues a job, so the job
    /// starts now rather than at the runner's next poll.
    pub jobs_queued: Arc<tokio::sync::Notify>,
}

impl AppState {
    /// Opens the database (running migrations) and performs first-run
    /// bootstrap.
    pub async fn open(config: ServerConfig) -> anyhow::Result<Self> {
        let store = Store::connect(&config.database_url).await.map_err(|e| anyhow::anyhow!("DATABASE_URL: cannot open the database: {e}"))?;
        match admin::bootstrap(&store, &config).await? {
            Bootstrap::AlreadyInitialised => {}
            Bootstrap::WithToken { workspace_id, email } => {
                tracing::info!(%workspace_id, %email, "fresh installation: created the first workspace and administrator; SERVICE_BOOTSTRAP_TOKEN is their token");
            }
            Bootstrap::WithLoginLink { workspace_id, email, login_url } => {
                tracing::info!(%workspace_id, %email, "fresh installation: created the first workspace and administrator");
                // Printed on stdout, not logged: the link is a one-time
                // credential and log pipelines keep lines forever.
                println!(
                    "\nFirst start: open this one-time link within 30 minutes to sign in as the administrator and get an API token:\n\n    {}\n\n\
                     (Or run `service admin create-token --email {email}` against the same database.)\n",
                    login_url.expose_secret()
                );
            }
        }
        let keyring = Keyring::load(&config.data_dir)?;
        let vault = Vault::new(store.clone(), keyring);
        let egress = Egress::new(config.plugins.egress.clone(), Arc::new(vault.clone()))?;
        let runtime = Runtime::new(config.plugins.limits.clone(), Some(config.data_dir.join("plugin-cache")))?;
        if let Err(e) = crate::config::ensure_data_dir(&config.plugins.plugins_dir) {
            tracing::warn!(error = %e, "plugins directory unavailable");
        }
        let plugins = Arc::new(Registry::new(
            Arc::new(runtime),
            store.clone(),
            bundled_plugins(),
            Some(config.plugins.plugins_dir.clone()),
        ));
        plugins.load_all().await;
        let config = Arc::new(config);
        let refresher: Arc<dyn crate::credentials::TokenRefresher> =
            Arc::new(crate::oauth::Refresher { config: config.clone(), plugins: plugins.clone(), egress: egress.clone() });
        vault.set_refresher(&refresher);
        let session_cache = (store.backend() == crate::store::Backend::Sqlite)
            .then(|| Arc::new(crate::access::SessionCache::new(std::time::Duration::from_secs(5))));
        let me_cache = session_cache.as_ref().map(|_| Arc::new(crate::http::me::MeCache::new()));
        Ok(AppState { store, config, metrics: crate::telemetry::metrics_handle(), vault, egress, plugins, refresher, session_cache, me_cache, jobs_queued: Arc::new(tokio::sync::Notify::new()) })
    }
}

/// A server bound to its listener and running in the background.
pub struct RunningServer {
    /// The address it listens on (useful with port 0).
    pub addr: SocketAddr,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    watcher: tokio::task::JoinHandle<()>,
    runner: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// Stops accepting, lets running requests finish, and waits.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.watcher.abort();
        self.runner.abort();
        let _ = self.shutdown.send(true);
        self.task.await??;
        Ok(())
    }
}

/// Binds `config.bind` and serves the application until stopped.
pub async fn start(state: AppState) -> anyhow::Result<RunningServer> {
    let listener = TcpListener::bind(state.config.bind)
        .await
        .map_err(|e| anyhow::anyhow!("SERVICE_BIND: cannot listen on {}: {e}", state.config.bind))?;
    start_on(listener, state)
}

/// Serves the application on an already bound listener.
pub fn start_on(listener: TcpListener, state: AppState) -> anyhow::Result<RunningServer> {
    let addr = listener.local_addr()?;
    let plugins = state.plugins.clone();
    let watcher = tokio::spawn(async move {
        loop {
            tokio::time::sleep(PLUGIN_WATCH_INTERVAL).await;
            plugins.scan_dir().await;
            plugins.reconcile().await;
        }
    });
    let runner = crate::jobs::spawn(state.clone());
    let app = crate::http::app(state);
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async move {
                let _ = rx.wait_for(|stop| *stop).await;
            })
            .await
    });
    Ok(RunningServer { addr, shutdown: tx, task, watcher, runner })
}

/// `service serve`: runs until Ctrl-C or SIGTERM.
pub async fn serve(config: ServerConfig) -> anyhow::Result<()> {
    let state = AppState::open(config).await?;
    let server = start(state).await?;
    tracing::info!(addr = %server.addr, "listening");
    shutdown_signal().await;
    tracing::info!("shutting down");
    server.stop().await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
