//! What the benchmarks share: the test plugins, a server state over a
//! fresh SQLite database with a given egress policy, the native baseline of
//! a sync, and processes' CPU time.

use std::path::Path;
use std::sync::Arc;

use service::config::oauth::OAuthSettings;
use service::config::{PluginSettings, ServerConfig};
use service::egress::EgressPolicy;
use service::jobs::queue::{QUEUE_BYTES, Work, gather, queue};
use service::state::AppState;
use service::store::pipelines::StreamSyncMode;
use service::warehouse::{DestinationConfig, Loader, Place, Writer};

// Not every benchmark loads a test plugin.
#[allow(unused_imports)]
pub use testkit::plugins::test_plugin;

/// A server state (no listener) in `dir`, bootstrapped with an
/// administrator `bench@example.test`.
#[allow(dead_code)]
pub async fn state(dir: &Path, egress: EgressPolicy) -> AppState {
    state_with_oauth(dir, egress, OAuthSettings::default()).await
}

/// [`state`] with operator OAuth clients, for connectors whose credentials
/// come from an OAuth flow.
pub async fn state_with_oauth(dir: &Path, egress: EgressPolicy, oauth: OAuthSettings) -> AppState {
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
            compile_cache_dir: dir.join("plugin-cache"),
            egress,
            limits: Default::default(),
            // The benchmark's PostgreSQL (BENCH_POSTGRES_URL) is local.
            warehouses: service::config::warehouse::WarehousePolicy::from_settings("127.0.0.1,::1,localhost").unwrap(),
            // The benchmarks' test plugins are built unsigned.
            signatures: service::config::signatures::SignaturePolicy::allowed(),
            guest_memories: None,
            guest_clock: None,
        },
        oauth,
        limits: Default::default(),
        metrics: Default::default(),
        secret_stores: Default::default(),
    };
    AppState::open(config).await.unwrap()
}

/// Where a native baseline writes: the destination, the workspace's place,
/// and an object store's access key (id, secret) when it is one.
pub struct Target<'a> {
    pub destination: &'a DestinationConfig,
    pub place: &'a Place<'a>,
    pub access_key: Option<&'a (String, String)>,
}

/// The native baseline: the same HTTPS fetch of a provider's pages and the
/// same write of their records as a sync, with no plugin and no API.
#[allow(dead_code)]
pub struct Native {
    /// A client that reaches the fake provider and trusts its CA.
    pub client: reqwest::Client,
}

#[allow(dead_code)]
impl Native {
    /// Reads every page from `first_url` into a full refresh of `table`;
    /// `page` cuts a page's body into its records' JSON text and names the
    /// next page's URL; `schema` is the stream's JSON Schema (typed
    /// destinations take their columns from it). Returns the records
    /// written.
    ///
    /// Built the way the job runner is: the read runs on a task of the
    /// runtime's workers (as the plugin's invocation does, not on the
    /// benchmark's main thread, which would give it a thread of its own
    /// for the CPU the writer competes for), pages are fetched while the
    /// previous one is written, through the same queue, batches that
    /// queued meanwhile share a transaction, and each batch is prepared
    /// while the one before it is applied. Opening the destination and
    /// emptying the stream count too, as they do in the job.
    pub async fn sync(
        &self,
        first_url: String,
        mut page: impl FnMut(&[u8]) -> (Vec<String>, Option<String>) + Send + 'static,
        table: &'static str,
        schema: &serde_json::Value,
        target: Target<'_>,
    ) -> u64 {
        let revealed = target.access_key.map(|(id, secret)| service::warehouse::config::Revealed::AccessKey {
            id: id.clone(),
            secret: secret.clone().into(),
        });
        let writer = Writer::open(target.destination, target.place, revealed).await.unwrap();
        writer.begin_stream("bench", table, StreamSyncMode::FullRefreshOverwrite, schema).await.unwrap();
        let (tx, mut rx) = queue(QUEUE_BYTES);
        let writer = Arc::new(writer);
        let write_task = tokio::spawn(async move {
            let mut loader =
                Loader::new(writer.clone(), "bench", table, StreamSyncMode::FullRefreshOverwrite, Vec::new());
            while let Some(first) = rx.recv().await {
                let (records, _) = gather(first, &mut rx);
                loader.write(records).await.unwrap();
            }
            loader.drain().await.unwrap();
            drop(loader);
            writer.end_stream(table).await.unwrap();
            if let Ok(writer) = Arc::try_unwrap(writer) {
                writer.close().await;
            }
        });
        let client = self.client.clone();
        let read_task = tokio::spawn(async move {
            let (mut url, mut records) = (first_url, 0u64);
            loop {
                let body = client.get(&url).send().await.unwrap().bytes().await.unwrap();
                let (batch, next) = page(&body);
                records += batch.len() as u64;
                tx.send(Work::Records(batch)).await.unwrap();
                match next {
                    Some(next) => url = next,
                    None => return records,
                }
            }
        });
        let records = read_task.await.unwrap();
        write_task.await.unwrap();
        records
    }
}

/// Clock ticks per second of `/proc`'s times (`USER_HZ`: 100 on Linux for
/// every architecture the project builds on).
const TICKS_PER_SECOND: f64 = 100.0;

/// What `/proc/<pid>/stat` says of a process (Linux).
#[allow(dead_code)]
pub struct ProcessStat {
    /// Its parent's pid.
    pub parent: String,
    /// Clock ticks it ran, user and system.
    pub ticks: u64,
    /// Clock ticks of the children it has waited for.
    pub reaped_ticks: u64,
    /// When it started, in clock ticks since the machine booted.
    pub started: u64,
}

/// The statistics of process `pid` (or `self`); `None` when there is no
/// such process (any more).
#[allow(dead_code)]
pub fn process_stat(pid: &str) -> Option<ProcessStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's name (which is in parentheses and
    // may hold anything), from the state on: proc(5)'s field n is at n - 3.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let number = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some(ProcessStat {
        parent: fields.get(1)?.to_string(),
        ticks: number(14)? + number(15)?,
        reaped_ticks: number(16)? + number(17)?,
        started: number(22)?,
    })
}

/// CPU seconds this process has used so far, all threads, user and
/// system.
#[allow(dead_code)]
pub fn cpu_seconds() -> f64 {
    process_stat("self").map_or(0.0, |s| seconds(s.ticks))
}

/// Seconds since the epoch at which a process that started `ticks` after
/// boot started (`btime` of `/proc/stat`).
#[allow(dead_code)]
pub fn started_at(ticks: u64) -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let boot: f64 = stat.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
    Some(boot + seconds(ticks))
}

/// Seconds from clock ticks.
#[allow(dead_code)]
pub fn seconds(ticks: u64) -> f64 {
    ticks as f64 / TICKS_PER_SECOND
}

/// A memory figure of process `pid`'s (or `self`'s) `/proc/<pid>/status`
/// in MB (Linux): `VmHWM`, the peak resident memory since the last reset,
/// or `VmRSS`, the current.
#[allow(dead_code)]
pub fn memory_mb(pid: &str, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// Starts measuring the peak resident memory (`VmHWM`) of process `pid`
/// (or `self`) afresh.
#[allow(dead_code)]
pub fn reset_peak_rss(pid: &str) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}
