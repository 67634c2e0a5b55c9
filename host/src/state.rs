//! The state every request handler and background task shares:
//! [`AppState`], cheap to clone, made of `Arc` parts; no globals. It is
//! put together in `server` (the composition root).

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::config::ServerConfig;
use crate::credentials::Vault;
use crate::egress::Egress;
use crate::plugin::registry::Registry;
use crate::store::Store;

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
    /// The tenants' warehouses: writers for jobs, queries for models.
    pub warehouses: Arc<crate::warehouse::Warehouses>,
    /// OAuth flows; also refreshes tokens for the vault (held here,
    /// weakly there).
    pub oauth: Arc<crate::credentials::OAuth>,
    /// Recently verified sessions (with PostgreSQL, used while this server
    /// hears the other servers' change notices).
    pub session_cache: Arc<crate::store::caches::SessionCache>,
    /// Recently read `GET /me` profiles (the same).
    pub me_cache: Arc<crate::store::caches::MeCache>,
    /// Wakes this server's job runner when it queues a job, so the job
    /// starts now rather than at the runner's next poll.
    pub jobs_queued: Arc<tokio::sync::Notify>,
    /// Keys the fingerprints of idempotent requests (their bodies may hold
    /// secrets).
    pub fingerprint_key: Arc<crate::credentials::keyring::DerivedKey>,
    /// Binds the CSRF tokens of the browser pages to their pre-session
    /// cookie, so a client cannot choose a pair that matches.
    pub csrf_key: Arc<crate::credentials::keyring::DerivedKey>,
    /// Request rate limits.
    pub throttle: Arc<crate::access::throttle::Throttle>,
    /// How tenants appear in `/metrics` labels.
    pub metric_labels: Arc<crate::telemetry::labels::MetricLabels>,
}
