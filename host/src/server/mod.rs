//! The composition root: puts the shared state together (bootstrap, keys,
//! vault, egress, plugins, OAuth), binds, serves connections under their
//! limits, runs the background tasks, and shuts down gracefully.
//!
//! Layout:
//! - this module: the state, the listener, the application and shutdown;
//! - [`connections`]: connections per address and each connection's
//!   activity, for the per-address cap and the idle timeout.

use std::net::SocketAddr;
use std::sync::Arc;

use secrecy::ExposeSecret;
use tokio::net::TcpListener;

use crate::access::admin::{self, Bootstrap};
use crate::config::ServerConfig;
use crate::credentials::Vault;
use crate::credentials::keyring::Keyring;
use crate::egress::Egress;
use crate::plugin::Runtime;
use crate::plugin::registry::Registry;
use crate::state::AppState;
use crate::store::Store;

mod connections;

/// The plugins built with the server (see `build.rs`).
mod bundled {
    include!(concat!(env!("OUT_DIR"), "/bundled.rs"));
}

/// The bundled plugins as the registry takes them.
pub(crate) fn bundled_plugins() -> Vec<(&'static str, &'static [u8])> {
    bundled::BUNDLED.to_vec()
}

/// The compiled-plugin cache in `dir`, authenticated with a key derived
/// from the master key.
pub(crate) fn compile_cache(dir: &std::path::Path, vault: &Vault) -> crate::plugin::CompileCache {
    crate::plugin::CompileCache { dir: dir.to_owned(), key: vault.derived_key("plugin-cache").into_secret() }
}

/// How often the plugins directory and the database's plugin states are
/// checked for changes.
const PLUGIN_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

impl AppState {
    /// Opens the database (running migrations) and performs first-run
    /// bootstrap.
    pub async fn open(config: ServerConfig) -> anyhow::Result<Self> {
        // The recorder comes first: a meter registered before it (every
        // plugin's, prepared at load) would count into nothing for good.
        let metrics = crate::telemetry::metrics_handle();
        crate::config::ensure_data_dir(&config.data_dir)?;
        crate::config::check_data_dir(&config.data_dir)?;
        let store = Store::connect(&config.database_url)
            .await
            .map_err(|e| anyhow::anyhow!("DATABASE_URL: cannot open the database: {e}"))?;
        crate::warehouse::relocate_shared_files(&store, &config.data_dir).await;
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
        let webhook_limits = &config.limits.webhooks;
        store.set_outbox_bounds(crate::store::webhooks::OutboxBounds {
            pending_per_subscription: webhook_limits.pending_per_subscription,
            pending_per_workspace: webhook_limits.pending_per_workspace,
        });
        let keyring = Keyring::load(&config.data_dir, config.master_key.as_ref())?;
        let stores =
            crate::credentials::stores::SecretStores::reaching(config.secret_stores.clone(), &config.plugins.egress)?;
        let vault = Vault::new(store.clone(), keyring).with_stores(Arc::new(stores));
        let egress = Egress::new(config.plugins.egress.clone(), Arc::new(vault.clone()))?.budgeted(store.clone());
        let cache = Some(compile_cache(&config.plugins.compile_cache_dir, &vault));
        let runtime = match &config.plugins.guest_memories {
            Some(memories) => Runtime::with_memories(config.plugins.limits.clone(), cache, memories.0.clone())?,
            None => Runtime::new(config.plugins.limits.clone(), cache)?,
        };
        let runtime = match config.plugins.guest_clock {
            Some(at) => {
                tracing::warn!(
                    at_unix_nanos = at.as_nanos() as u64,
                    "plugins' clocks are frozen (SERVICE_GUEST_CLOCK): a setting for tests only"
                );
                runtime.with_guest_time(crate::plugin::sandbox::GuestTime::Frozen(at))
            }
            None => runtime,
        };
        if let Err(e) = crate::config::ensure_data_dir(&config.plugins.plugins_dir) {
            tracing::warn!(error = %e, "plugins directory unavailable");
        }
        let plugins = Arc::new(Registry::new(
            Arc::new(runtime),
            egress.clone(),
            store.clone(),
            bundled_plugins(),
            Some(config.plugins.plugins_dir.clone()),
            config.plugins.signatures.clone(),
        ));
        plugins.load_all().await;
        let warehouses = Arc::new(crate::warehouse::Warehouses::new(
            config.data_dir.clone(),
            config.plugins.warehouses.clone(),
            config.plugins.egress.extra_roots.clone(),
            Arc::new(vault.clone()),
            store.clone(),
        ));
        let config = Arc::new(config);
        let oauth = Arc::new(crate::credentials::OAuth::new(
            config.oauth.clone(),
            &config.public_url,
            plugins.clone(),
            egress.clone(),
            store.clone(),
        )?);
        let refresher: Arc<dyn crate::credentials::TokenRefresher> = oauth.clone();
        vault.set_refresher(&refresher);
        // On SQLite this process is the only server: its caches are right
        // from the start. With PostgreSQL they are used once this server
        // hears the others' change notices (`store::notices::follow`).
        let alone = store.backend() == crate::store::Backend::Sqlite;
        let session_cache = Arc::new(crate::store::caches::SessionCache::new(alone));
        let me_cache = Arc::new(crate::store::caches::MeCache::new(alone));
        let fingerprint_key = Arc::new(vault.derived_key("idempotency-fingerprint"));
        let csrf_key = Arc::new(vault.derived_key("web-csrf"));
        let throttle = Arc::new(crate::access::throttle::Throttle::new(config.limits.throttle));
        let metric_labels = Arc::new(crate::telemetry::labels::MetricLabels::new(
            config.metrics.labels,
            vault.derived_key("metric-labels").into_secret(),
        ));
        Ok(AppState {
            store,
            config,
            metrics,
            vault,
            egress,
            plugins,
            warehouses,
            oauth,
            session_cache,
            me_cache,
            jobs_queued: Arc::new(tokio::sync::Notify::new()),
            fingerprint_key,
            csrf_key,
            throttle,
            metric_labels,
        })
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
    deliverer: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
    notices: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// Stops accepting, lets running requests finish, and waits.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.watcher.abort();
        self.runner.abort();
        self.deliverer.abort();
        self.sweeper.abort();
        self.notices.abort();
        let _ = self.shutdown.send(true);
        self.task.await??;
        Ok(())
    }
}

/// How often expired one-time records are swept.
const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(600);

/// How long an idle connection gets to say goodbye before it is dropped.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long running requests get to finish when the server stops.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(30);

/// Accepts connections until `shutdown`: at most `max_connections` open at
/// once and at most `max_connections_per_address` from one address (more
/// are closed at once rather than queued), each with a deadline for its
/// request headers, a bound on HTTP/2 streams, and closed once it has had
/// no request in flight for the idle timeout, so neither slow nor idle
/// clients can hold the server.
async fn serve_connections(
    listener: TcpListener,
    app: axum::Router,
    limits: crate::config::limits::ServerLimits,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::ServiceExt;
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let per_address = Arc::new(connections::PerAddress::new(limits.max_connections_per_address));
    let trusted = Arc::new(limits.trusted_proxies.clone());
    // Every connection task holds a sender; when the last is gone, all
    // connections have ended.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<()>(1);
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(std::time::Duration::from_secs(30)))
        .max_concurrent_streams(limits.http2_max_concurrent_streams);
    let builder = Arc::new(builder);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    metrics::counter!("http_connections_refused_total", "reason" => "server").increment(1);
                    drop(stream);
                    continue;
                };
                // A trusted proxy carries everyone's connections.
                let slot = if trusted.iter().any(|n| n.contains(peer.ip())) { None } else {
                    match per_address.clone().enter(peer.ip()) {
                        Some(slot) => Some(slot),
                        None => {
                            metrics::counter!("http_connections_refused_total", "reason" => "address").increment(1);
                            drop(stream);
                            continue;
                        }
                    }
                };
                let _ = stream.set_nodelay(true);
                let activity = Arc::new(connections::Activity::new());
                let service = {
                    let activity = activity.clone();
                    let trusted = trusted.clone();
                    let app = app.clone();
                    tower::service_fn(move |mut req: axum::extract::Request<hyper::body::Incoming>| {
                        // In flight from here; dropped with the request if
                        // it is abandoned, else handed to its answer.
                        let in_flight = activity.begin();
                        let client = crate::access::address::resolve(peer.ip(), req.headers(), &trusted);
                        req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                        req.extensions_mut().insert(crate::access::address::ClientAddress(client));
                        let answer = app.clone().oneshot(req);
                        async move { answer.await.map(|response| in_flight.until_sent(response)) }
                    })
                };
                let builder = builder.clone();
                let idle = limits.idle_timeout;
                let mut stop = shutdown.clone();
                let open = open_tx.clone();
                tokio::spawn(async move {
                    let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), hyper_util::service::TowerToHyperService::new(service));
                    let mut connection = std::pin::pin!(connection);
                    let mut tick = tokio::time::interval((idle / 4).clamp(std::time::Duration::from_millis(100), std::time::Duration::from_secs(5)));
                    let mut closing = false;
                    // When an idle connection must be gone by, whether or
                    // not its client plays along with the goodbye (an
                    // HTTP/2 client that never answers the final ping).
                    let mut gone_by: Option<tokio::time::Instant> = None;
                    loop {
                        tokio::select! {
                            _ = connection.as_mut() => break,
                            _ = tick.tick() => {
                                if gone_by.is_some_and(|t| tokio::time::Instant::now() >= t) {
                                    break;
                                }
                                if !closing && activity.idle_for() >= idle {
                                    connection.as_mut().graceful_shutdown();
                                    closing = true;
                                    gone_by = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                                }
                            }
                            _ = stop.wait_for(|s| *s), if !closing => {
                                connection.as_mut().graceful_shutdown();
                                closing = true;
                            }
                        }
                    }
                    drop((permit, slot, open));
                });
            }
            () = async { let _ = shutdown.wait_for(|stop| *stop).await; } => break,
        }
    }
    drop(listener);
    drop(open_tx);
    tokio::select! {
        _ = open_rx.recv() => {}
        _ = tokio::time::sleep(DRAIN_TIME) => tracing::warn!("connections still open after the drain time; closing them"),
    }
    Ok(())
}

/// Binds `config.bind` and serves the application until stopped.
pub(crate) async fn start(state: AppState) -> anyhow::Result<RunningServer> {
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
    let deliverer = crate::webhooks::deliver::spawn(state.clone());
    let sweeper = {
        let store = state.store.clone();
        tokio::spawn(async move {
            loop {
                match store.sweep_expired(crate::store::now_ms()).await {
                    Ok(n) if n > 0 => tracing::info!(records = n, "swept expired one-time records"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "could not sweep expired records"),
                }
                tokio::time::sleep(SWEEP_INTERVAL).await;
            }
        })
    };
    let caches: Vec<Arc<dyn crate::store::notices::Follower>> =
        vec![state.session_cache.clone(), state.me_cache.clone()];
    let notices = tokio::spawn(crate::store::notices::follow(state.store.clone(), caches));
    let limits = state.config.limits.clone();
    let app = app(state);
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(serve_connections(listener, app, limits, rx));
    Ok(RunningServer { addr, shutdown: tx, task, watcher, runner, deliverer, sweeper, notices })
}

/// The whole application: the API and the browser pages under the same
/// layers, and MCP, whose tools are the API's operations dispatched into
/// the API itself. Tests drive it directly; `serve` binds it.
pub(crate) fn app(state: AppState) -> axum::Router {
    let (api, openapi) = crate::http::api(&state, crate::web::router());
    let catalog = Arc::new(crate::mcp::Catalog::from_openapi(&serde_json::to_value(&*openapi).unwrap_or_default()));
    let mut hosts =
        vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned(), state.config.bind.ip().to_string()];
    if let Some(h) = state.config.public_url.host_str() {
        hosts.push(h.to_owned());
    }
    let mcp = axum::Router::new()
        .route_service("/mcp", crate::mcp::http_service(catalog, api.clone(), hosts))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), crate::http::middleware::authenticate))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), crate::http::middleware::read_body))
        .with_state(state);
    api.merge(mcp)
}

/// `service serve`: runs until Ctrl-C or SIGTERM.
pub(crate) async fn serve(config: ServerConfig) -> anyhow::Result<()> {
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
