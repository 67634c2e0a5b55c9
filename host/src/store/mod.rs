//! Persistence: the only module that speaks SQL to the control database
//! (a tenant's warehouse is spoken to in `warehouse`).
//!
//! One [`Store`] wraps an `sqlx` [`AnyPool`] so the same queries run on the
//! embedded SQLite default and on PostgreSQL. The SQL is kept to the portable
//! subset both understand (`$n` parameters, `ON CONFLICT`, `RETURNING`,
//! partial indexes); ids are text, times are Unix milliseconds (`BIGINT`).
//!
//! Layout:
//! - this module: [`Store`] (connecting, migrating, the backend), time and
//!   id helpers, [`StoreError`];
//! - [`users`], [`workspaces`], [`sessions`], [`invitations`]: identity and
//!   access;
//! - [`approvals`]: proposals and approval policies;
//! - [`audit`]: the append-only audit log;
//! - [`idempotency`]: stored responses for `Idempotency-Key` replays;
//! - [`credentials`], [`entry_links`], [`oauth`]: sealed credentials,
//!   credential-entry links and OAuth flows in progress;
//! - [`sources`], [`destinations`], [`pipelines`]: sources, destinations,
//!   pipelines with their schedules and stream state;
//! - [`jobs`]: jobs with their leases and attempts; [`job_streams`]: the
//!   streams of a sync spread over servers, each leased on its own;
//!   [`progress`]: what a job has done so far, as every reader shows it;
//! - [`reverse_etl`]: models, reverse-ETL destinations, activations, their
//!   runs and diff state;
//! - [`plugins`]: which connector plugins are enabled;
//! - [`budgets`]: provider rate budgets every server takes turns on;
//! - [`webhooks`]: outbound webhook subscriptions, the outbox of events
//!   (written in the transaction of their cause) and their deliveries;
//! - [`iceberg`]: the Iceberg catalog of lakehouse destinations (table
//!   pointers moved by compare-and-set);
//! - [`kinds`]: the statuses, kinds and triggers records carry, as types;
//! - [`caches`]: read caches in front of the database;
//! - [`notices`]: change notices between servers sharing PostgreSQL, which
//!   keep those caches right on every replica;
//! - [`sweep`]: removal of one-time records past any use;
//! - `testing` (tests only): fresh control databases of each kind.
//!
//! Constraint violations are turned into domain errors right where the query
//! runs (see [`StoreError`]), so callers never match on SQL error strings.

pub mod approvals;
pub(crate) mod audit;
pub mod budgets;
pub(crate) mod caches;
pub(crate) mod credentials;
pub(crate) mod destinations;
pub(crate) mod entry_links;
pub(crate) mod iceberg;
pub(crate) mod idempotency;
pub(crate) mod invitations;
pub(crate) mod job_streams;
pub(crate) mod jobs;
pub mod kinds;
pub mod notices;
pub mod oauth;
pub mod pipelines;
pub(crate) mod plugins;
pub(crate) mod progress;
pub(crate) mod reverse_etl;
pub(crate) mod sessions;
pub(crate) mod sources;
pub(crate) mod sweep;
pub(crate) mod users;
pub(crate) mod webhooks;
pub(crate) mod workspaces;

pub use workspaces::ClaimWeight;

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions, Executor};

/// Which database engine a [`Store`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// An SQLite file in the data directory (the embedded default).
    Sqlite,
    /// A PostgreSQL server named by `DATABASE_URL`.
    Postgres,
}

/// Errors of the persistence layer that callers act on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A uniqueness or foreign-key rule refused the write; the string names
    /// the rule so callers can turn it into the right client error.
    #[error("constraint violated: {0}")]
    Conflict(String),
    /// Anything else: connection loss, SQL errors. Never shown to clients
    /// (a job's error says which database failed).
    #[error("the control database: {0}")]
    Database(#[from] sqlx::Error),
}

/// The control database failing is a moment's trouble for whoever asked:
/// a connection lost, a server restarting. A conflict is not.
impl crate::retry::Transient for StoreError {
    fn is_transient(&self) -> bool {
        matches!(self, StoreError::Database(_))
    }
}

pub(crate) type StoreResult<T> = Result<T, StoreError>;

/// Turns the database's unique-violation into [`StoreError::Conflict`].
pub(crate) trait ResultExt<T> {
    fn on_conflict(self, rule: &str) -> StoreResult<T>;
}

impl<T> ResultExt<T> for Result<T, sqlx::Error> {
    fn on_conflict(self, rule: &str) -> StoreResult<T> {
        self.map_err(|e| match &e {
            sqlx::Error::Database(db) if db.is_unique_violation() || db.is_foreign_key_violation() => {
                StoreError::Conflict(rule.to_owned())
            }
            _ => StoreError::Database(e),
        })
    }
}

/// Handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// Bumped by every membership change made through this store (and,
    /// with PostgreSQL, every one another server announces), so in-process
    /// caches of who-belongs-where know when to drop entries.
    membership_generation: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The database URL, for the connection that listens for notices.
    url: std::sync::Arc<str>,
    /// Changes the servers confirm they applied: (change, server).
    confirmations: tokio::sync::broadcast::Sender<(String, String)>,
    /// Signalled when this process committed webhook deliveries, so its
    /// deliverer sends them at once rather than at its next poll.
    outbox: std::sync::Arc<tokio::sync::Notify>,
    /// How much webhooks may hold back (set by the server from its
    /// settings; the defaults otherwise).
    outbox_bounds: std::sync::Arc<std::sync::RwLock<webhooks::OutboxBounds>>,
    /// The pipelines `/metrics` lists, as last read (see
    /// [`Store::pipeline_freshness`]).
    freshness_snapshot: std::sync::Arc<tokio::sync::Mutex<Option<pipelines::FreshnessSnapshot>>>,
}

impl Store {
    /// Connects to `url` (`sqlite://...` or `postgres://...`) and runs the
    /// migrations.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            anyhow::bail!("unsupported database URL scheme (use postgres:// or sqlite://)");
        };
        let options = AnyConnectOptions::from_str(url)?.disable_statement_logging();
        let mut pool_options = AnyPoolOptions::new().acquire_timeout(Duration::from_secs(10));
        pool_options = match backend {
            // SQLite: write-ahead logging lets readers proceed during a write;
            // a busy timeout makes concurrent writers wait instead of failing.
            Backend::Sqlite => pool_options.max_connections(8).after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(
                        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                         PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000;",
                    )
                    .await?;
                    Ok(())
                })
            }),
            Backend::Postgres => pool_options.max_connections(16),
        };
        let pool = pool_options.connect_with(options).await?;
        sqlx::migrate!("../migrations").run(&pool).await?;
        destinations::admit_kinds(&pool, backend).await?;
        Ok(Store {
            pool,
            backend,
            membership_generation: Default::default(),
            url: url.into(),
            confirmations: tokio::sync::broadcast::channel(256).0,
            outbox: Default::default(),
            outbox_bounds: Default::default(),
            freshness_snapshot: Default::default(),
        })
    }

    /// The engine this store runs on.
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    /// The current membership generation (see the field).
    pub(crate) fn membership_generation(&self) -> u64 {
        self.membership_generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Drops this server's cached memberships and tells the others to.
    /// Drops this server's cached memberships and, with PostgreSQL, every
    /// other server's: returns once each listening server confirmed it (at
    /// most a second).
    pub(crate) async fn memberships_changed(&self) {
        self.memberships_changed_here();
        let confirmations = self.confirmations();
        let change = new_id("chg");
        match self.notify(&notices::Notice::MembershipsChanged(change.clone())).await {
            Ok(()) => self.confirmed_everywhere(&change, confirmations).await,
            // Other servers' profiles expire within the backstop anyway.
            Err(e) => tracing::warn!(error = %e, "could not announce a membership change"),
        }
    }

    /// Drops this server's cached memberships.
    pub(crate) fn memberships_changed_here(&self) {
        self.membership_generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The database URL (it may hold a password: never shown).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// True when the database answers a trivial query.
    pub(crate) async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Begins a transaction that reads and then writes. SQLite's default
    /// transaction takes the write lock only at its first write, and if
    /// another connection committed after the transaction's first read,
    /// that write fails at once with `SQLITE_BUSY` (the busy timeout does
    /// not apply: waiting could not help a stale snapshot). `BEGIN
    /// IMMEDIATE` takes the lock up front, so it waits its turn instead.
    pub(crate) async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await,
            Backend::Postgres => self.pool.begin().await,
        }
    }

    /// Closes every pooled connection (used by tests before dropping a
    /// database).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// A stored text as the enum it names; a text no variant has is a
/// corrupt row, reported as a decoding error.
pub(crate) fn decode<T>(text: &str, parse: fn(&str) -> Option<T>, column: &'static str) -> StoreResult<T> {
    parse(text).ok_or_else(|| {
        StoreError::Database(sqlx::Error::ColumnDecode {
            index: column.to_owned(),
            source: format!("unknown value '{text}'").into(),
        })
    })
}

/// Current time as stored: Unix milliseconds.
pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// Stored milliseconds back to a timestamp.
pub(crate) fn from_ms(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

/// A new random identifier with a readable prefix (`ws_`, `usr_`, ...).
/// UUIDv7 keeps ids roughly time-ordered, which pagination relies on.
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// Control databases for the store's own tests.
#[cfg(test)]
pub(crate) mod testing {
    use serde_json::json;
    use sqlx::Connection;

    use super::Store;
    use super::kinds::{DestinationKind, JobKind, Trigger};
    use super::pipelines::{Schedule, StreamSelection, StreamSyncMode};

    /// A workspace's running sync job of a pipeline with `streams`, held
    /// by `runner-job`, spread over its streams; the workspace and the
    /// job.
    pub(crate) async fn spread_job(store: &Store, streams: &[&str]) -> (String, String) {
        let ws = store.create_workspace("w").await.unwrap().workspace_id;
        let user = store.create_user("u@example.test", "u").await.unwrap().user_id;
        let source = store.create_source(&ws, "conn_events", "events", &json!({}), &user).await.unwrap();
        let destination = store
            .create_destination(&ws, DestinationKind::Jsonl, "f", &json!({ "directory": "out" }), None, &user)
            .await
            .unwrap();
        let selected: Vec<StreamSelection> = streams
            .iter()
            .map(|name| StreamSelection {
                name: (*name).into(),
                sync_mode: StreamSyncMode::FullRefreshOverwrite,
                cursor_field: None,
                primary_key: None,
                contract: None,
            })
            .collect();
        let (source, destination) = (&source.source_id, &destination.destination_id);
        let pipeline = store
            .create_pipeline(&ws, "p", source, destination, &selected, &Schedule::Manual, None, None)
            .await
            .unwrap();
        store.create_job(&ws, &pipeline.pipeline_id, JobKind::Sync, Trigger::Manual).await.unwrap().unwrap();
        let job = store.claim_job("runner-job", 60_000, 0).await.unwrap().unwrap();
        let names: Vec<String> = streams.iter().map(|s| (*s).to_owned()).collect();
        store.spread_streams(&job.job_id, &names).await.unwrap();
        // Spreading again (a coordinator taking the job over) adds nothing.
        store.spread_streams(&job.job_id, &names).await.unwrap();
        (ws, job.job_id)
    }

    /// A fresh control database, which several stores may share (as
    /// several servers do).
    pub(crate) struct ControlDatabase {
        pub(crate) url: String,
        /// A PostgreSQL database's server and name, dropped at the end.
        server: Option<(String, String)>,
        _dir: tempfile::TempDir,
    }

    impl ControlDatabase {
        /// One of each kind: SQLite, and PostgreSQL on the server the
        /// integration tests use (`SERVICE_TEST_DATABASE_URL`, or else the
        /// local one when it answers). Without one the PostgreSQL half
        /// prints `skipped: no PostgreSQL`, or fails with
        /// `SERVICE_TEST_REQUIRE_POSTGRES=1` (as CI sets).
        pub(crate) async fn each_kind() -> Vec<ControlDatabase> {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}?mode=rwc", dir.path().join("control.db").display());
            let mut all = vec![ControlDatabase { url, server: None, _dir: dir }];
            let server = std::env::var("SERVICE_TEST_DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
            let mut admin = match sqlx::PgConnection::connect(&server).await {
                Ok(admin) => admin,
                Err(e) if std::env::var("SERVICE_TEST_REQUIRE_POSTGRES").is_ok() => {
                    panic!("SERVICE_TEST_REQUIRE_POSTGRES is set but PostgreSQL is not there: {e}")
                }
                Err(_) => {
                    println!("skipped: no PostgreSQL");
                    return all;
                }
            };
            let name = format!("svc_unit_{}", uuid::Uuid::new_v4().simple());
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut admin).await.unwrap();
            let mut url = url::Url::parse(&server).unwrap();
            url.set_path(&name);
            all.push(ControlDatabase {
                url: url.to_string(),
                server: Some((server, name)),
                _dir: tempfile::tempdir().unwrap(),
            });
            all
        }

        /// A store on it (migrated by the first).
        pub(crate) async fn connect(&self) -> Store {
            Store::connect(&self.url).await.unwrap()
        }

        /// Drops a PostgreSQL database (a SQLite one goes with its folder).
        pub(crate) async fn drop(self) {
            if let Some((server, name)) = &self.server {
                let mut admin = sqlx::PgConnection::connect(server).await.unwrap();
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut admin).await.unwrap();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_transaction_survives_a_commit_between_its_read_and_its_write() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Store::connect(&format!("sqlite://{}?mode=rwc", dir.path().join("control.db").display())).await.unwrap();
        sqlx::query("CREATE TABLE scratch (n INTEGER)").execute(store.pool()).await.unwrap();

        let mut tx = store.begin_write().await.unwrap();
        sqlx::query("SELECT COUNT(*) FROM scratch").fetch_one(&mut *tx).await.unwrap();
        // Another connection writes meanwhile. With a deferred transaction it
        // would commit at once and leave `tx` on a stale snapshot.
        let other = tokio::spawn({
            let store = store.clone();
            async move { sqlx::query("INSERT INTO scratch (n) VALUES (1)").execute(store.pool()).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        sqlx::query("INSERT INTO scratch (n) VALUES (2)")
            .execute(&mut *tx)
            .await
            .expect("the transaction's write goes through");
        tx.commit().await.unwrap();
        other.await.unwrap().expect("the other write waited its turn");
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM scratch").fetch_one(store.pool()).await.unwrap();
        assert_eq!(n, 2);
        store.close().await;
    }
}
