//! Server configuration, from flags and the environment.
//!
//! Every setting has a default that works on a fresh clone; a bad value is
//! reported in one line naming the setting (see [`ConfigError`]). This is
//! a leaf: it parses and checks settings, and imports nothing of the
//! layers that enforce them.
//!
//! Layout:
//! - this module: the command-line and environment settings, the resolved
//!   [`ServerConfig`], [`ConfigError`] and the data directory;
//! - [`egress`]: host patterns and the egress policy connectors run under;
//! - [`warehouse`]: where PostgreSQL destinations may connect;
//! - [`oauth`]: the operator's OAuth clients;
//! - [`signatures`]: trusted plugin publishers and the signature policy;
//! - [`limits`]: connection, rate, job and plugin-call limits;
//! - [`secrets`]: the operator's secret stores (OpenBao or Vault, listed
//!   environment variables, a directory of files);
//! - [`environment`]: the server's own `PG*` settings, kept for the
//!   control database.

pub(crate) mod egress;
pub(crate) mod environment;
pub mod limits;
pub mod oauth;
pub mod secrets;
pub mod signatures;
pub mod warehouse;

pub use environment::isolate_postgres_environment;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use secrecy::{ExposeSecret, SecretString};
use url::Url;

/// Settings shared by every command that opens the database.
#[derive(Debug, Clone, Args)]
pub struct StorageArgs {
    /// Directory for the SQLite database, the key file and other state.
    #[arg(long, env = "SERVICE_DATA_DIR", default_value = "./.service", global = true)]
    pub data_dir: PathBuf,
    /// Database URL: a postgres:// URL selects PostgreSQL; unset means an
    /// SQLite file in the data directory.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<String>,
    /// The master key credentials are sealed with (32 bytes, base64), for
    /// installations that keep it out of the data directory. Unset: the
    /// key file in the data directory (created on first start). Set it in
    /// the environment; a flag's value is visible to other local users.
    #[arg(long, env = "SERVICE_MASTER_KEY", hide_env_values = true, global = true, value_parser = secret)]
    pub master_key: Option<SecretString>,
}

/// A setting that is a secret: held redacted from the moment it is parsed.
pub(crate) fn secret(text: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(text.to_owned()))
}

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// Readable lines for a terminal.
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

/// How tenants appear in `/metrics` labels.
#[derive(Debug, Clone, Copy, Default, ValueEnum, PartialEq, Eq)]
pub enum MetricLabelMode {
    /// Keyed digests of workspace ids and stream names.
    #[default]
    Opaque,
    /// Workspace ids and stream names as they are.
    Clear,
}

/// Who may read `/metrics`, and what its labels show.
#[derive(Debug, Clone, Default)]
pub struct MetricsSettings {
    /// The bearer token `/metrics` asks for (`SERVICE_METRICS_TOKEN`);
    /// without one it answers whoever reaches it.
    pub token: Option<SecretString>,
    /// `SERVICE_METRICS_LABELS`.
    pub labels: MetricLabelMode,
}

/// Flags of `service serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address and port to listen on.
    #[arg(long, env = "SERVICE_BIND", default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,
    /// Public base URL of this server, used in links it hands out
    /// (invitations, login). Default: http://<bind>/.
    #[arg(long, env = "SERVICE_PUBLIC_URL")]
    pub public_url: Option<Url>,
    /// Log format.
    #[arg(long, env = "SERVICE_LOG_FORMAT", value_enum, default_value = "human")]
    pub log_format: LogFormat,
    /// Hours an interactive session lasts.
    #[arg(long, env = "SERVICE_SESSION_HOURS", default_value_t = 24 * 7, value_parser = clap::value_parser!(u32).range(1..=8760))]
    pub session_hours: u32,
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// OAuth clients per connector, as JSON:
    /// `{"<connector_id>": {"client_id": "...", "client_secret": "..."}}`.
    #[arg(long, env = "SERVICE_OAUTH_CLIENTS", hide_env_values = true)]
    pub oauth_clients: Option<String>,
    /// The task app's OAuth provider, as JSON: `{"authorize_url", "token_url",
    /// "scopes", "client_id", "client_secret"}`.
    #[arg(long, env = "SERVICE_TASKAPP_OAUTH", hide_env_values = true)]
    pub taskapp_oauth: Option<String>,
    /// A token that becomes the first administrator's API token on a
    /// fresh installation (at least 24 characters), for scripted installs.
    #[arg(long, env = "SERVICE_BOOTSTRAP_TOKEN", hide_env_values = true, value_parser = secret)]
    pub bootstrap_token: Option<SecretString>,
    /// E-mail address of the administrator created on a fresh installation.
    #[arg(long, env = "SERVICE_BOOTSTRAP_EMAIL", default_value = "admin@localhost.localdomain")]
    pub bootstrap_email: String,
    /// A bearer token `/metrics` asks for (at least 24 characters); unset,
    /// `/metrics` answers whoever reaches it.
    #[arg(long, env = "SERVICE_METRICS_TOKEN", hide_env_values = true, value_parser = secret)]
    pub metrics_token: Option<SecretString>,
    /// How tenants appear in `/metrics` labels: `opaque` (keyed digests of
    /// workspace ids and stream names) or `clear`.
    #[arg(long, env = "SERVICE_METRICS_LABELS", value_enum, default_value = "opaque")]
    pub metrics_labels: MetricLabelMode,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub secret_stores: secrets::SecretStoreArgs,
}

/// Limits that keep one client or tenant from exhausting the server.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Open connections at most; more are closed at once.
    #[arg(long, env = "SERVICE_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// Open connections from one client address at most (trusted proxies
    /// are exempt); more are closed at once.
    #[arg(long, env = "SERVICE_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections_per_address: u32,
    /// Seconds a client has to send a request's headers.
    #[arg(long, env = "SERVICE_HEADER_READ_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub header_read_timeout_secs: u64,
    /// Seconds a client has to send a request's whole body.
    #[arg(long, env = "SERVICE_BODY_READ_TIMEOUT_SECS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub body_read_timeout_secs: u64,
    /// Seconds a connection may stay open with no request in flight.
    #[arg(long, env = "SERVICE_IDLE_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub idle_timeout_secs: u64,
    /// Reverse proxies whose `Forwarded` or `X-Forwarded-For` header names
    /// the client, comma-separated addresses or networks (`10.0.0.0/8`).
    /// Empty: every request is counted by the address it came from, so
    /// behind a proxy all clients share the proxy's limits.
    #[arg(long, env = "SERVICE_TRUSTED_PROXIES", default_value = "")]
    pub trusted_proxies: String,
    /// Seconds a request may take before it is answered 503.
    #[arg(long, env = "SERVICE_REQUEST_TIMEOUT_SECS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub request_timeout_secs: u64,
    /// Requests per second from one client address (bursts of twice
    /// that); 0 switches the limit off.
    #[arg(long, env = "SERVICE_RATE_LIMIT_PER_ADDRESS", default_value_t = 500)]
    pub rate_limit_per_address: u32,
    /// Requests per second with one session's token (bursts of twice
    /// that); 0 switches the limit off.
    #[arg(long, env = "SERVICE_RATE_LIMIT_PER_SESSION", default_value_t = 200)]
    pub rate_limit_per_session: u32,
    /// Requests with invalid tokens one address (or one token) may make
    /// per minute (and at once) before further invalid ones are answered
    /// 429; a valid token is never refused by this limit.
    #[arg(long, env = "SERVICE_RATE_LIMIT_FAILED_AUTH", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub rate_limit_failed_auth: u32,
    /// Jobs this server runs at once.
    #[arg(long, env = "SERVICE_JOB_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub job_concurrency: u32,
    /// Jobs of one workspace running at once on all servers together; 0
    /// (the default) sets no such cap. Runners are shared by the
    /// workspaces' claim weights (`service admin set-claim-weight`) and a
    /// lone workspace uses every runner; a cap keeps runners free for
    /// other tenants' jobs when one tenant's jobs run for long.
    #[arg(long, env = "SERVICE_JOB_CONCURRENCY_PER_WORKSPACE", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub job_concurrency_per_workspace: u32,
    /// Spreads a sync of several streams over every server's runners:
    /// each stream is leased on its own and read by whichever runner
    /// (of any server) has a free slot; a failed stream is retried alone.
    /// Off, a sync reads its streams one after another on one runner.
    #[arg(long, env = "SERVICE_JOB_SPREAD_STREAMS", default_value_t = false)]
    pub job_spread_streams: bool,
    /// Seconds a job's runner may go without a heartbeat before another
    /// runner takes the job over.
    #[arg(long, env = "SERVICE_JOB_LEASE_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub job_lease_secs: u64,
    /// Rows a reverse-ETL model may return to one run; a larger model
    /// fails the run before anything is sent.
    #[arg(long, env = "SERVICE_RETL_MAX_ROWS", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub retl_max_rows: u64,
    /// The largest value a reverse-ETL run reads, in bytes; a row holding
    /// a larger one is invalid and never sent.
    #[arg(long, env = "SERVICE_RETL_MAX_VALUE_BYTES", default_value_t = 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..=1_000_000_000))]
    pub retl_max_value_bytes: u64,
    /// Bytes of rows one workspace's reverse-ETL runs may spool to disk at
    /// once on this server, in MiB.
    #[arg(long, env = "SERVICE_RETL_SPOOL_MB", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub retl_spool_mb: u64,
    /// Directory reverse-ETL runs spool to; default `<data-dir>/spool`.
    #[arg(long, env = "SERVICE_RETL_SPOOL_DIR")]
    pub retl_spool_dir: Option<PathBuf>,
    /// The largest value a reverse-ETL preview shows, in bytes; larger
    /// ones are replaced by a marker with their size.
    #[arg(long, env = "SERVICE_RETL_PREVIEW_CELL_BYTES", default_value_t = 64 * 1024, value_parser = clap::value_parser!(u64).range(16..=16 * 1024 * 1024))]
    pub retl_preview_cell_bytes: u64,
    /// The largest sample a reverse-ETL preview answers with, in bytes.
    #[arg(long, env = "SERVICE_RETL_PREVIEW_BYTES", default_value_t = 4 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..=256 * 1024 * 1024))]
    pub retl_preview_bytes: u64,
    /// The longest wait between two attempts of a webhook delivery, in
    /// seconds (waits double from one second, with jitter, up to this).
    #[arg(long, env = "SERVICE_WEBHOOK_MAX_BACKOFF_SECS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub webhook_max_backoff_secs: u64,
    /// How long a webhook delivery is retried before it is given up, in
    /// hours.
    #[arg(long, env = "SERVICE_WEBHOOK_RETRY_HOURS", default_value_t = 24, value_parser = clap::value_parser!(u64).range(1..=720))]
    pub webhook_retry_hours: u64,
    /// Webhook subscriptions one workspace may have.
    #[arg(long, env = "SERVICE_WEBHOOKS_PER_WORKSPACE", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub webhooks_per_workspace: u32,
    /// Subscriptions of one workspace sent to at once, on every server
    /// together, so one tenant's slow receivers cannot hold every slot.
    #[arg(long, env = "SERVICE_WEBHOOK_SLOTS_PER_WORKSPACE", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub webhook_slots_per_workspace: u32,
    /// Undelivered events one subscription may hold; beyond it the
    /// subscription is disabled, saying why, and its events are counted as
    /// dropped.
    #[arg(long, env = "SERVICE_WEBHOOK_MAX_PENDING", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub webhook_max_pending: u32,
    /// Undelivered events one workspace's subscriptions may hold together.
    #[arg(long, env = "SERVICE_WEBHOOK_MAX_PENDING_PER_WORKSPACE", default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub webhook_max_pending_per_workspace: u32,
}

impl LimitArgs {
    /// The limits these settings describe.
    pub fn resolve(&self) -> Result<limits::ServerLimits, ConfigError> {
        use limits::Rate;
        let rate = |n: u32| if n == 0 { Rate::OFF } else { Rate::per_second(n) };
        let trusted_proxies = self
            .trusted_proxies
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| {
                limits::Network::parse(e).ok_or_else(|| {
                    ConfigError::new("SERVICE_TRUSTED_PROXIES", format!("'{e}' is not an IP address or network"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(limits::ServerLimits {
            max_connections: self.max_connections as usize,
            max_connections_per_address: self.max_connections_per_address as usize,
            header_read_timeout: std::time::Duration::from_secs(self.header_read_timeout_secs),
            body_read_timeout: std::time::Duration::from_secs(self.body_read_timeout_secs),
            idle_timeout: std::time::Duration::from_secs(self.idle_timeout_secs),
            http2_max_concurrent_streams: limits::ServerLimits::default().http2_max_concurrent_streams,
            trusted_proxies,
            request_timeout: std::time::Duration::from_secs(self.request_timeout_secs),
            throttle: limits::ThrottleSettings {
                per_address: rate(self.rate_limit_per_address),
                per_session: rate(self.rate_limit_per_session),
                failures_per_address: Rate {
                    per_second: f64::from(self.rate_limit_failed_auth) / 60.0,
                    burst: f64::from(self.rate_limit_failed_auth),
                },
            },
            job_concurrency: self.job_concurrency as usize,
            job_concurrency_per_workspace: i64::from(self.job_concurrency_per_workspace),
            job_lease: std::time::Duration::from_secs(self.job_lease_secs),
            job_spread_streams: self.job_spread_streams,
            reverse_etl: limits::ReverseEtlLimits {
                rows_per_run: self.retl_max_rows,
                value_bytes: usize::try_from(self.retl_max_value_bytes).unwrap_or(usize::MAX),
                spool_bytes_per_workspace: self.retl_spool_mb.saturating_mul(1024 * 1024),
                spool_dir: self.retl_spool_dir.clone(),
                preview_cell_bytes: usize::try_from(self.retl_preview_cell_bytes).unwrap_or(usize::MAX),
                preview_response_bytes: usize::try_from(self.retl_preview_bytes).unwrap_or(usize::MAX),
            },
            webhooks: limits::WebhookLimits {
                max_backoff: std::time::Duration::from_secs(self.webhook_max_backoff_secs),
                retry_window: std::time::Duration::from_secs(self.webhook_retry_hours * 3600),
                subscriptions_per_workspace: i64::from(self.webhooks_per_workspace),
                slots_per_workspace: i64::from(self.webhook_slots_per_workspace),
                pending_per_subscription: i64::from(self.webhook_max_pending),
                pending_per_workspace: i64::from(self.webhook_max_pending_per_workspace),
                ..Default::default()
            },
            streams: Default::default(),
        })
    }
}

/// Settings of the connector runtime and its egress policy.
#[derive(Debug, Clone, Args)]
pub struct PluginArgs {
    /// Directory watched for extra plugin components (`*.wasm`); default:
    /// `<data-dir>/plugins`.
    #[arg(long, env = "SERVICE_PLUGINS_DIR")]
    pub plugins_dir: Option<PathBuf>,
    /// Hosts connectors may reach, comma-separated exact names or
    /// `*.suffix` patterns. A connector reaches a host only if it also
    /// declared it. Self-hosted provider instances are added here.
    #[arg(long, env = "SERVICE_EGRESS_ALLOWED_HOSTS", default_value = egress::DEFAULT_ALLOWED_HOSTS)]
    pub egress_allowed_hosts: String,
    /// Hosts reverse-ETL webhooks may post to, comma-separated exact names
    /// or `*.suffix` patterns; separate from the connectors' list. Empty:
    /// no webhook destinations.
    #[arg(long, env = "SERVICE_WEBHOOK_ALLOWED_HOSTS", default_value = "")]
    pub webhook_allowed_hosts: String,
    /// Pins host names to addresses, like curl's --resolve:
    /// `api.example.com=10.0.0.5:443,...`. Pinned names skip the
    /// global-address rule (the operator vouches for them). For tests and
    /// staging.
    #[arg(long, env = "SERVICE_EGRESS_RESOLVE")]
    pub egress_resolve: Option<String>,
    /// PEM file of extra root certificates trusted for egress and for
    /// lakehouse object stores (tests, staging, private CAs).
    #[arg(long, env = "SERVICE_EGRESS_EXTRA_ROOTS")]
    pub egress_extra_roots: Option<PathBuf>,
    /// Directory of compiled plugins (authenticated with a key derived
    /// from the master key, so replicas sharing the key may share it);
    /// default: `<data-dir>/plugin-cache`.
    #[arg(long, env = "SERVICE_PLUGIN_CACHE_DIR")]
    pub plugin_cache_dir: Option<PathBuf>,
    /// Memory limit of one plugin invocation (all its memories together),
    /// in MiB.
    #[arg(long, env = "SERVICE_PLUGIN_MEMORY_MB", default_value_t = 256, value_parser = clap::value_parser!(u32).range(16..=4096))]
    pub plugin_memory_mb: u32,
    /// CPU budget of one plugin invocation, in milliseconds.
    #[arg(long, env = "SERVICE_PLUGIN_CPU_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub plugin_cpu_ms: u64,
    /// Wall-clock limit of short plugin calls (check, preview, ...), in seconds.
    #[arg(long, env = "SERVICE_PLUGIN_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub plugin_timeout_secs: u64,
    /// Plugin invocations running at once; more wait for a turn.
    #[arg(long, env = "SERVICE_PLUGIN_MAX_CONCURRENT", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub plugin_max_concurrent: u32,
    /// Hosts PostgreSQL destinations and lakehouse object stores may
    /// connect to, comma-separated: exact names, `*.suffix` patterns, IP
    /// addresses and networks (`10.0.0.0/8`). A name must resolve to global
    /// addresses, or to addresses in a listed network. Empty: no PostgreSQL
    /// destinations and no object-store warehouses.
    #[arg(long, env = "SERVICE_WAREHOUSE_ALLOWED_HOSTS", default_value = "")]
    pub warehouse_allowed_hosts: String,
    /// The largest table metadata file (or other object read whole) the
    /// server reads from an object-store warehouse, in MiB.
    #[arg(long, env = "SERVICE_WAREHOUSE_MAX_METADATA_MB", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub warehouse_max_metadata_mb: u32,
    /// The largest manifest or manifest list the server reads from an
    /// object-store warehouse, in MiB.
    #[arg(long, env = "SERVICE_WAREHOUSE_MAX_MANIFEST_MB", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub warehouse_max_manifest_mb: u32,
    /// The largest page of an object-store listing the server reads, in
    /// MiB.
    #[arg(long, env = "SERVICE_WAREHOUSE_MAX_LISTING_MB", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub warehouse_max_listing_mb: u32,
    /// Whether a component from the plugins directory must carry a
    /// signature by a trusted publisher (`required`) or may be unsigned
    /// (`allowed`; a signature present must still verify). Bundled plugins
    /// are built with the server and need none.
    #[arg(long, env = "SERVICE_PLUGIN_SIGNATURES", default_value = "required")]
    pub plugin_signatures: String,
    /// Trusted publishers' Ed25519 public keys, `NAME=BASE64,...` (see
    /// `service plugins keygen`).
    #[arg(long, env = "SERVICE_PLUGIN_TRUSTED_KEYS", default_value = "")]
    pub plugin_trusted_keys: String,
    /// A file of trusted publishers' keys, a `NAME BASE64` line each.
    #[arg(long, env = "SERVICE_PLUGIN_TRUSTED_KEYS_FILE")]
    pub plugin_trusted_keys_file: Option<PathBuf>,
    /// For tests and differential runs only: the instant (RFC 3339, e.g.
    /// `2026-11-20T12:00:00.123456Z`) every plugin's wall clock stands at,
    /// its randomness from a fixed seed. Refused unless
    /// `SERVICE_ALLOW_TEST_SETTINGS` is `true`.
    #[arg(long, env = "SERVICE_GUEST_CLOCK")]
    pub guest_clock: Option<String>,
    /// Allows the settings meant for tests only (`SERVICE_GUEST_CLOCK`).
    #[arg(long, env = "SERVICE_ALLOW_TEST_SETTINGS", default_value_t = false)]
    pub allow_test_settings: bool,
}

impl PluginArgs {
    /// The runtime limits and egress policy these settings describe.
    pub fn resolve(&self, data_dir: &Path) -> Result<PluginSettings, ConfigError> {
        let pem = match &self.egress_extra_roots {
            Some(p) => Some(
                std::fs::read(p)
                    .map_err(|e| ConfigError::new("SERVICE_EGRESS_EXTRA_ROOTS", format!("{}: {e}", p.display())))?,
            ),
            None => None,
        };
        let egress = egress::EgressPolicy::from_settings(
            &self.egress_allowed_hosts,
            self.egress_resolve.as_deref(),
            pem.as_deref(),
        )?
        .with_webhook_hosts(&self.webhook_allowed_hosts)?;
        let limits = limits::PluginLimits {
            cpu: std::time::Duration::from_millis(self.plugin_cpu_ms),
            memory_bytes: self.plugin_memory_mb as usize * 1024 * 1024,
            wall_short: std::time::Duration::from_secs(self.plugin_timeout_secs),
            max_concurrent: self.plugin_max_concurrent as usize,
            ..Default::default()
        };
        Ok(PluginSettings {
            plugins_dir: self.plugins_dir.clone().unwrap_or_else(|| data_dir.join("plugins")),
            compile_cache_dir: self.plugin_cache_dir.clone().unwrap_or_else(|| data_dir.join("plugin-cache")),
            egress,
            limits,
            warehouses: warehouse::WarehousePolicy::from_settings(&self.warehouse_allowed_hosts)?.with_reads(
                warehouse::ObjectReadLimits {
                    metadata_bytes: self.warehouse_max_metadata_mb as usize * 1024 * 1024,
                    manifest_bytes: self.warehouse_max_manifest_mb as usize * 1024 * 1024,
                    listing_page_bytes: self.warehouse_max_listing_mb as usize * 1024 * 1024,
                },
            ),
            signatures: signatures::SignaturePolicy::from_settings(
                &self.plugin_signatures,
                &self.plugin_trusted_keys,
                self.plugin_trusted_keys_file.as_deref(),
            )?,
            guest_memories: None,
            guest_clock: self.guest_clock()?,
        })
    }

    /// The frozen guest clock, since the Unix epoch, if asked for and
    /// allowed.
    fn guest_clock(&self) -> Result<Option<std::time::Duration>, ConfigError> {
        let Some(text) = &self.guest_clock else { return Ok(None) };
        if !self.allow_test_settings {
            return Err(ConfigError::new(
                "SERVICE_GUEST_CLOCK",
                "a frozen plugin clock is for tests only: set SERVICE_ALLOW_TEST_SETTINGS=true to use it",
            ));
        }
        let at = chrono::DateTime::parse_from_rfc3339(text.trim()).map_err(|e| {
            ConfigError::new("SERVICE_GUEST_CLOCK", format!("{text:?} is not an RFC 3339 instant: {e}"))
        })?;
        let nanos = at
            .timestamp_nanos_opt()
            .filter(|n| *n >= 0)
            .ok_or_else(|| ConfigError::new("SERVICE_GUEST_CLOCK", format!("{text:?} is before 1970 or after 2262")))?;
        Ok(Some(std::time::Duration::from_nanos(nanos as u64)))
    }
}

/// Resolved runtime settings.
#[derive(Debug, Clone)]
pub struct PluginSettings {
    pub plugins_dir: PathBuf,
    /// Where compiled plugins are cached.
    pub compile_cache_dir: PathBuf,
    pub egress: egress::EgressPolicy,
    pub limits: limits::PluginLimits,
    /// Where PostgreSQL destinations may connect.
    pub warehouses: warehouse::WarehousePolicy,
    /// What a component from the plugins directory must be signed with.
    pub signatures: signatures::SignaturePolicy,
    /// Who allocates guests' linear memories instead of the engine: a
    /// test harness's probe (`plugin::probe`). No setting reads it:
    /// always `None` from the environment or flags.
    pub guest_memories: Option<GuestMemories>,
    /// The instant (since the Unix epoch) plugins' wall clocks stand at
    /// (`SERVICE_GUEST_CLOCK`, for tests only); `None`: the machine's.
    pub guest_clock: Option<std::time::Duration>,
}

/// Allocates guests' linear memories (see [`PluginSettings::guest_memories`]).
#[derive(Clone)]
pub struct GuestMemories(pub std::sync::Arc<dyn wasmtime::MemoryCreator>);

impl std::fmt::Debug for GuestMemories {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GuestMemories")
    }
}

/// A configuration problem, reported as one line naming the setting.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {message}")]
pub struct ConfigError {
    pub setting: &'static str,
    pub message: String,
}

impl ConfigError {
    pub fn new(setting: &'static str, message: impl Into<String>) -> Self {
        ConfigError { setting, message: message.into() }
    }
}

/// Resolved configuration of a running server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub bind: SocketAddr,
    pub data_dir: PathBuf,
    /// The database actually used (SQLite URL filled in when unset).
    pub database_url: String,
    pub public_url: Url,
    pub session_ttl_ms: i64,
    /// `SERVICE_BOOTSTRAP_TOKEN`: becomes the first administrator's session
    /// token on a fresh installation.
    pub bootstrap_token: Option<SecretString>,
    /// E-mail address of the administrator created on a fresh installation.
    pub bootstrap_email: String,
    /// `SERVICE_MASTER_KEY`, when the key is not kept in the data directory.
    pub master_key: Option<SecretString>,
    /// Connector runtime and egress settings.
    pub plugins: PluginSettings,
    /// Operator OAuth clients.
    pub oauth: oauth::OAuthSettings,
    /// Connection, request, rate and job limits.
    pub limits: limits::ServerLimits,
    /// Who may read `/metrics`, and what its labels show.
    pub metrics: MetricsSettings,
    /// Where credentials that hold a reference find their secrets.
    pub secret_stores: secrets::SecretStoreSettings,
}

impl ServerConfig {
    /// Builds the configuration from parsed flags and the environment.
    pub(crate) fn from_args(storage: &StorageArgs, serve: &ServeArgs) -> Result<Self, ConfigError> {
        let database_url = database_url(storage)?;
        let public_url = match &serve.public_url {
            Some(u) if u.scheme() == "http" || u.scheme() == "https" => ensure_trailing_slash(u.clone()),
            Some(_) => return Err(ConfigError::new("SERVICE_PUBLIC_URL", "must be an http:// or https:// URL")),
            None => Url::parse(&format!("http://{}/", serve.bind))
                .map_err(|e| ConfigError::new("SERVICE_BIND", format!("cannot form a URL from it: {e}")))?,
        };
        let bootstrap_token = match &serve.bootstrap_token {
            Some(t) if t.expose_secret().len() < 24 => {
                return Err(ConfigError::new(
                    "SERVICE_BOOTSTRAP_TOKEN",
                    "must be at least 24 characters of random text",
                ));
            }
            Some(t) if t.expose_secret().chars().any(|c| c.is_whitespace() || c.is_control()) => {
                return Err(ConfigError::new(
                    "SERVICE_BOOTSTRAP_TOKEN",
                    "must not contain spaces or control characters",
                ));
            }
            other => other.clone(),
        };
        let metrics_token = match &serve.metrics_token {
            Some(t) if t.expose_secret().len() < 24 || t.expose_secret().chars().any(|c| c.is_whitespace()) => {
                return Err(ConfigError::new(
                    "SERVICE_METRICS_TOKEN",
                    "must be at least 24 characters of random text without spaces",
                ));
            }
            other => other.clone(),
        };
        Ok(ServerConfig {
            bind: serve.bind,
            data_dir: storage.data_dir.clone(),
            database_url,
            public_url,
            session_ttl_ms: i64::from(serve.session_hours) * 3_600_000,
            bootstrap_token,
            bootstrap_email: serve.bootstrap_email.clone(),
            master_key: storage.master_key.clone(),
            plugins: serve.plugins.resolve(&storage.data_dir)?,
            oauth: oauth::OAuthSettings::from_settings(serve.oauth_clients.as_deref(), serve.taskapp_oauth.as_deref())?,
            limits: serve.limits.resolve()?,
            metrics: MetricsSettings { token: metrics_token, labels: serve.metrics_labels },
            secret_stores: serve.secret_stores.resolve()?,
        })
    }
}

fn ensure_trailing_slash(mut u: Url) -> Url {
    if !u.path().ends_with('/') {
        let p = format!("{}/", u.path());
        u.set_path(&p);
    }
    u
}

/// The database URL to use: `DATABASE_URL` when set, else an SQLite file in
/// the data directory (created with owner-only permissions).
pub(crate) fn database_url(storage: &StorageArgs) -> Result<String, ConfigError> {
    match storage.database_url.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(url) => {
            let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
            match scheme {
                "postgres" | "postgresql" | "sqlite" => Ok(url.to_owned()),
                other => Err(ConfigError::new(
                    "DATABASE_URL",
                    format!(
                        "unsupported scheme '{other}': use postgres://... or leave it unset for SQLite in the data directory"
                    ),
                )),
            }
        }
        None => {
            ensure_data_dir(&storage.data_dir)?;
            let file = storage.data_dir.join("service.db");
            Ok(format!("sqlite://{}?mode=rwc", file.display()))
        }
    }
}

/// Refuses a data directory other users can enter: it holds the master
/// key, the SQLite database and the warehouses. Checked at every start,
/// since a directory created right can be opened up later.
pub(crate) fn check_data_dir(dir: &Path) -> Result<(), ConfigError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir)
            .map_err(|e| ConfigError::new("SERVICE_DATA_DIR", format!("cannot read {}: {e}", dir.display())))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(ConfigError::new(
                "SERVICE_DATA_DIR",
                format!(
                    "{} is open to other users (mode {:o}); it holds the master key and the data: run chmod 700 {}",
                    dir.display(),
                    mode & 0o777,
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Creates the data directory (mode 0700) if needed.
pub(crate) fn ensure_data_dir(dir: &Path) -> Result<(), ConfigError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
        .create(dir)
        .map_err(|e| ConfigError::new("SERVICE_DATA_DIR", format!("cannot create {}: {e}", dir.display())))
}
