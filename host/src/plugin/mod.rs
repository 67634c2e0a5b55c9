//! The connector runtime: loads Wasm components, keeps them ready, and
//! invokes them in a fresh sandbox per call.
//!
//! Layout:
//! - [`types`]: the host's own types for everything crossing the boundary;
//! - [`v1`]: bindings of `service:connector@1.0.0` and their conversions
//!   (one module per supported interface version);
//! - [`v1_1`]: what `service:connector@1.1.0` adds (`http-ahead`), on top
//!   of 1.0.0's bindings;
//! - [`v1_2`]: what `service:connector@1.2.0` adds (`http-placed`, whose
//!   credentials also go into a query parameter or a body field);
//! - [`v1_3`]: what `service:connector@1.3.0` adds (`http-multi`, requests
//!   that name several credentials);
//! - [`sandbox`]: the per-invocation store, limits and WASI context;
//! - [`registry`]: which plugins are loaded, their aliases, their enabled
//!   state and installed versions (kept in the database so replicas agree
//!   and run the same bytes);
//! - [`signature`]: publishers' signatures over a component's digest and
//!   identity, checked before a plugins-directory file is compiled;
//! - [`oci`]: pulling and pushing components as OCI artifacts, checked
//!   against every digest involved;
//! - [`probe`]: a test harness's look into guests' linear memory at the
//!   end of each call;
//! - [`usage`]: what each invocation costs (guest CPU, memory, requests,
//!   bytes, host time), for the plugin's meters and the job it runs for;
//! - [`connector`]: a plugin bound to a workspace and the egress, as the
//!   registry hands it out for work;
//! - this module: the engine, the compile cache and the invocation API.
//!
//! One [`wasmtime::Engine`] serves every plugin. A component is compiled
//! once; the compiled artefact is cached on disk under a key made of the
//! component's content hash and the engine's compatibility hash, so a
//! restart or a second replica loads it without compiling. Each plugin is
//! kept pre-instantiated (`InstancePre`); every call gets a new `Store`.

/// The host side of an HTTP interface whose request only converts to the
/// egress's own (`$outbound`): sent, or started ahead against the same
/// limit, and finished or dropped as any other version's. Versions past
/// 1.1.0 differ only in what their request can say.
macro_rules! converted_http {
    ($http:ident, $outbound:ident) => {
        impl $http::Host for HostState {
            async fn send(
                &mut self,
                req: $http::Request,
            ) -> wasmtime::Result<Result<http_1_0::Response, http_1_0::HttpError>> {
                Ok(self.send_request($outbound(req)).await)
            }

            async fn start(
                &mut self,
                req: $http::Request,
            ) -> wasmtime::Result<Result<Resource<Pending>, http_1_0::HttpError>> {
                self.start_request($outbound(req))
            }
        }

        impl $http::HostPending for HostState {
            async fn finish(
                &mut self,
                this: Resource<Pending>,
            ) -> wasmtime::Result<Result<http_1_0::Response, http_1_0::HttpError>> {
                self.finish_pending(this).await
            }

            async fn drop(&mut self, this: Resource<Pending>) -> wasmtime::Result<()> {
                self.drop_pending(this)
            }
        }
    };
}

pub(crate) mod connector;
pub(crate) mod oci;
pub mod probe;
pub mod registry;
pub mod sandbox;
pub mod signature;
pub mod types;
pub(crate) mod usage;
pub(crate) mod v1;
pub(crate) mod v1_1;
pub(crate) mod v1_2;
pub(crate) mod v1_3;

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};

use crate::egress::Egress;
use sandbox::{HostState, Invocation, Limits, RecordSink};
use types::{
    CheckResult, ConnectorError, ConnectorInfo, EntityOption, Operation, ReadRequest, Stream, WriteRequest, WriteResult,
};

/// A prepared plugin.
pub struct LoadedPlugin {
    /// The canonical connector id.
    pub plugin_id: Arc<str>,
    pub info: types::ConnectorInfo,
    pub declared_hosts: Arc<[crate::egress::HostPattern]>,
    pub version: InterfaceVersion,
    pub pre: Pre,
    /// SHA-256 of the component.
    pub digest: String,
    /// What its invocations cost, on `/metrics`.
    pub meters: Arc<usage::PluginMeters>,
}

/// Why an invocation produced no answer of the connector's own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvocationError {
    /// The connector answered with a typed error.
    #[error(transparent)]
    Connector(#[from] ConnectorError),
    /// The call ran past its wall-clock limit.
    #[error("the connector did not finish within its time limit")]
    Timeout,
    /// The guest used up its CPU budget.
    #[error("the connector exceeded its CPU time limit")]
    CpuLimit,
    /// The guest asked for more memory than allowed.
    #[error("the connector exceeded its memory limit")]
    MemoryLimit,
    /// The guest trapped (panic, unreachable, stack overflow, ...).
    #[error("the connector crashed: {0}")]
    Trapped(String),
    /// A returned value exceeded the host's size limit.
    #[error("the connector's output exceeds the size limit")]
    OutputTooLarge,
    /// The connector does not offer this operation.
    #[error("the connector does not offer the {0} operation")]
    Unsupported(&'static str),
    /// The connector is unknown, unloaded or disabled.
    #[error("connector {0} is not available")]
    Unavailable(String),
    /// The host could not run the call (pool exhausted, database down).
    #[error("the connector could not be run: {0}")]
    Host(String),
}

impl crate::retry::Transient for InvocationError {
    /// Whether the same call may succeed later: a time-out, the host's own
    /// trouble, a provider limiting or down. Everything else (a bad
    /// credential, a crash, a limit) would fail the same way again.
    fn is_transient(&self) -> bool {
        matches!(
            self,
            InvocationError::Timeout
                | InvocationError::Host(_)
                | InvocationError::Connector(ConnectorError::RateLimited(_) | ConnectorError::ProviderUnavailable(_))
        )
    }
}

/// Why a component cannot be loaded as a plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPlugin {
    /// It is no component of a supported interface version.
    #[error("{0}")]
    Component(String),
    /// Its `describe` failed.
    #[error("describe failed: {0}")]
    Describe(InvocationError),
    /// It describes itself, invalidly.
    #[error("invalid description: {}", .0.join("; "))]
    Description(Vec<String>),
}

/// Interface versions this host loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterfaceVersion {
    V1_0_0,
    V1_1_0,
    V1_2_0,
    V1_3_0,
}

impl InterfaceVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            InterfaceVersion::V1_0_0 => "service:connector@1.0.0",
            InterfaceVersion::V1_1_0 => "service:connector@1.1.0",
            InterfaceVersion::V1_2_0 => "service:connector@1.2.0",
            InterfaceVersion::V1_3_0 => "service:connector@1.3.0",
        }
    }
}

/// A plugin ready to run, in the form of its interface version.
pub enum Pre {
    V1(v1::Pre),
}

/// Where compiled components are kept between runs, and the key that
/// authenticates them. Loading a compiled artefact runs its machine code
/// as it is, so one that someone else put there (another component's,
/// under this one's name) must never be loaded: each file carries an HMAC
/// of its contents, its component's digest and the engine, under a key
/// derived from the master key, and a file whose tag does not verify is
/// compiled anew.
pub struct CompileCache {
    pub dir: PathBuf,
    pub key: secrecy::SecretBox<[u8; 32]>,
}

impl CompileCache {
    fn tag(&self, digest: &str, compat: &str, artefact: &[u8]) -> [u8; 32] {
        use hmac::{Hmac, Mac};
        use secrecy::ExposeSecret;
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(self.key.expose_secret()).expect("HMAC takes any key length");
        for part in [digest.as_bytes(), compat.as_bytes(), artefact] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
}

/// Compares two tags in time independent of where they differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Length of the tag in front of a cached artefact.
const TAG_BYTES: usize = 32;

/// The engine, the linkers of every supported version and the limits.
pub struct Runtime {
    engine: Engine,
    linker_v1: Linker<HostState>,
    limits: Arc<Limits>,
    /// Turns to run: at most `limits.max_concurrent` invocations at once.
    turns: Arc<tokio::sync::Semaphore>,
    cache: Option<CompileCache>,
    compat_key: String,
    /// Whether the pooling allocator is in use (reported to operators).
    pub pooling: bool,
    /// The clock and randomness its guests see.
    time: sandbox::GuestTime,
    /// The engine's epoch, as its ticker counts it.
    epochs: sandbox::Epochs,
}

fn engine_config(pooling: Option<&Limits>, memories: Option<Arc<dyn wasmtime::MemoryCreator>>) -> Config {
    let mut cfg = Config::new();
    cfg.epoch_interruption(true);
    cfg.wasm_component_model(true);
    cfg.max_wasm_stack(1024 * 1024);
    if let Some(memories) = memories {
        // Memories another allocates (a test's probe): explicit bounds
        // checks, free to move (see `probe`).
        cfg.with_host_memory(memories)
            .memory_reservation(0)
            .memory_guard_size(0)
            .memory_reservation_for_growth(0)
            .memory_may_move(true)
            .memory_init_cow(false);
        return cfg;
    }
    if let Some(limits) = pooling {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(256)
            .total_core_instances(1024)
            .max_core_instances_per_component(16)
            .total_memories(512)
            .max_memories_per_component(8)
            .total_tables(1024)
            .total_stacks(256)
            .max_memory_size(limits.memory_bytes)
            // A slot is reset between invocations. By default that is an
            // madvise of the whole memory (and a cross-CPU TLB flush), and
            // the next call faults every page back in: most of a short
            // call's cost. Where the kernel has PAGEMAP_SCAN (Linux 6.7+),
            // only the pages the guest dirtied are found and reset with a
            // memset, up to these sizes; larger working sets still get
            // their excess decommitted. Older kernels fall back quietly.
            .pagemap_scan(wasmtime::Enabled::Auto)
            .linear_memory_keep_resident(1 << 20)
            .table_keep_resident(64 << 10);
        cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    cfg
}

impl Runtime {
    /// Builds the engine (with the pooling allocator where the machine
    /// allows it) and starts its epoch ticker. `cache` keeps compiled
    /// artefacts; `None` disables the cache.
    pub fn new(limits: Limits, cache: Option<CompileCache>) -> anyhow::Result<Self> {
        let (engine, pooling) = match Engine::new(&engine_config(Some(&limits), None)) {
            Ok(e) => (e, true),
            Err(e) => {
                tracing::warn!(error = %e, "pooling allocator unavailable; using on-demand allocation");
                (Engine::new(&engine_config(None, None))?, false)
            }
        };
        Self::with_engine(engine, pooling, limits, cache)
    }

    /// A runtime whose guests' memories `memories` allocates (a test
    /// harness's probe, [`probe::GuestMemoryProbe::memories`]; no setting
    /// makes one). They get no reservation and no guard region.
    pub fn with_memories(
        limits: Limits,
        cache: Option<CompileCache>,
        memories: Arc<dyn wasmtime::MemoryCreator>,
    ) -> anyhow::Result<Self> {
        let engine = Engine::new(&engine_config(None, Some(memories)))?;
        Self::with_engine(engine, false, limits, cache)
    }

    fn with_engine(engine: Engine, pooling: bool, limits: Limits, cache: Option<CompileCache>) -> anyhow::Result<Self> {
        let mut linker_v1 = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker_v1)?;
        v1::add_to_linker(&mut linker_v1)?;
        v1_1::add_to_linker(&mut linker_v1)?;
        v1_2::add_to_linker(&mut linker_v1)?;
        v1_3::add_to_linker(&mut linker_v1)?;

        // The epoch ticker: CPU deadlines are counted in its ticks.
        let weak = engine.weak();
        let epochs = sandbox::Epochs::default();
        let ticks = epochs.clone();
        std::thread::Builder::new().name("wasm-epoch".into()).spawn(move || {
            let tick = Duration::from_nanos(1_000_000_000 / sandbox::TICKS_PER_SECOND);
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                ticks.tick();
                drop(engine);
                std::thread::sleep(tick);
            }
        })?;

        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let compat_key = format!("{:016x}", h.finish());
        if let Some(c) = &cache {
            std::fs::create_dir_all(&c.dir)?;
        }
        let turns = Arc::new(tokio::sync::Semaphore::new(limits.max_concurrent.max(1)));
        Ok(Runtime {
            engine,
            linker_v1,
            limits: Arc::new(limits),
            turns,
            cache,
            compat_key,
            pooling,
            time: sandbox::GuestTime::Live,
            epochs,
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The same runtime, its guests seeing `time`.
    pub fn with_guest_time(mut self, time: sandbox::GuestTime) -> Self {
        self.time = time;
        self
    }

    /// Compiles (or loads from the cache) a component and prepares it.
    pub fn prepare(&self, bytes: &[u8]) -> anyhow::Result<(InterfaceVersion, Pre, String)> {
        let digest = hex::encode(Sha256::digest(bytes));
        let component = self.compile(bytes, &digest)?;
        let ty = component.component_type();
        let exports: Vec<String> = ty.exports(&self.engine).map(|(n, _)| n.to_owned()).collect();
        if exports.iter().any(|e| e == v1::EXPORT) {
            // 1.1.0, 1.2.0 and 1.3.0 only add imports: the same linker and
            // export bindings serve all four.
            let imports: Vec<String> = ty.imports(&self.engine).map(|(n, _)| n.to_owned()).collect();
            let version = if imports.iter().any(|name| name == v1_3::IMPORT) {
                InterfaceVersion::V1_3_0
            } else if imports.iter().any(|name| name == v1_2::IMPORT) {
                InterfaceVersion::V1_2_0
            } else if imports.iter().any(|name| name == v1_1::IMPORT) {
                InterfaceVersion::V1_1_0
            } else {
                InterfaceVersion::V1_0_0
            };
            let pre = self.linker_v1.instantiate_pre(&component)?;
            return Ok((version, Pre::V1(v1::Pre::new(pre)?), digest));
        }
        anyhow::bail!(
            "the component implements no supported interface version (supported: {}, {}, {}, {}; it exports: {})",
            InterfaceVersion::V1_0_0.as_str(),
            InterfaceVersion::V1_1_0.as_str(),
            InterfaceVersion::V1_2_0.as_str(),
            InterfaceVersion::V1_3_0.as_str(),
            if exports.is_empty() { "nothing".to_owned() } else { exports.join(", ") }
        )
    }

    /// Prepares, describes and validates a component: a plugin ready to
    /// run, registered nowhere. `label` names it in log lines.
    pub async fn load(&self, bytes: &[u8], label: &str) -> Result<LoadedPlugin, InvalidPlugin> {
        let (version, pre, digest) = self.prepare(bytes).map_err(|e| InvalidPlugin::Component(format!("{e:#}")))?;
        let info = self.describe(label, &pre).await.map_err(InvalidPlugin::Describe)?;
        let problems = registry::validate_info(&info);
        if !problems.is_empty() {
            return Err(InvalidPlugin::Description(problems));
        }
        Ok(LoadedPlugin {
            meters: Arc::new(usage::PluginMeters::new(&info.id, &info.version)),
            plugin_id: Arc::from(info.id.as_str()),
            declared_hosts: Arc::from(info.hosts.clone()),
            info,
            version,
            pre,
            digest,
        })
    }

    fn compile(&self, bytes: &[u8], digest: &str) -> anyhow::Result<Component> {
        let Some(cache) = &self.cache else {
            return Ok(Component::new(&self.engine, bytes)?);
        };
        let path = cache.dir.join(format!("{digest}-{}.cwasm", self.compat_key));
        if let Ok(file) = std::fs::read(&path) {
            match file.split_at_checked(TAG_BYTES) {
                Some((tag, artefact)) if same_bytes(&cache.tag(digest, &self.compat_key, artefact), tag) => {
                    // SAFETY: the artefact carries a tag only this
                    // installation's key makes, over this component's digest
                    // and this engine's compatibility hash: it is what
                    // `Component::serialize` wrote for this component.
                    match unsafe { Component::deserialize(&self.engine, artefact) } {
                        Ok(c) => return Ok(c),
                        Err(e) => {
                            tracing::warn!(error = %e, path = %path.display(), "discarding unusable compiled artefact")
                        }
                    }
                }
                _ => tracing::warn!(path = %path.display(), "discarding a compiled artefact whose tag does not verify"),
            }
        }
        let component = Component::new(&self.engine, bytes)?;
        // Unique even between servers of one process sharing the directory.
        let tmp = path.with_extension(format!("tmp{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()));
        let written = component
            .serialize()
            .map_err(|e| anyhow::anyhow!("{e}"))
            .and_then(|artefact| {
                let mut file = cache.tag(digest, &self.compat_key, &artefact).to_vec();
                file.extend_from_slice(&artefact);
                Ok(std::fs::write(&tmp, file)?)
            })
            .and_then(|()| Ok(std::fs::rename(&tmp, &path)?));
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not cache a compiled plugin");
        }
        Ok(component)
    }

    /// A fresh store for one call.
    fn store(
        &self,
        plugin: &LoadedPlugin,
        workspace_id: Option<&str>,
        egress: Option<Egress>,
        sink: Option<Box<dyn RecordSink>>,
    ) -> Store<HostState> {
        HostState::store(
            &self.engine,
            &self.epochs,
            self.limits.clone(),
            Invocation {
                plugin_id: plugin.plugin_id.clone(),
                declared_hosts: plugin.declared_hosts.clone(),
                workspace_id: workspace_id.map(Arc::from),
                egress,
                sink,
                meters: Some(plugin.meters.clone()),
                time: self.time,
            },
        )
    }

    /// Runs `call` under the wall-clock limit and turns traps and limit
    /// hits into typed errors.
    async fn run<R>(
        &self,
        mut store: Store<HostState>,
        wall: Duration,
        call: impl AsyncFnOnce(&mut Store<HostState>) -> wasmtime::Result<Result<R, ConnectorError>>,
    ) -> Result<R, InvocationError> {
        // A call waits for a turn within its own time limit; one that gets
        // none is refused as a host condition (retryable).
        let started = tokio::time::Instant::now();
        let _turn = match tokio::time::timeout(wall, self.turns.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            _ => return Err(InvocationError::Host("too many connector invocations at once; retry shortly".into())),
        };
        let outcome = tokio::time::timeout(wall.saturating_sub(started.elapsed()), call(&mut store)).await;
        store.data_mut().flush_output();
        store.data().account();
        let state = store.data();
        match outcome {
            Err(_) => Err(InvocationError::Timeout),
            Ok(Ok(Ok(r))) => Ok(r),
            Ok(Ok(Err(e))) => Err(InvocationError::Connector(e)),
            Ok(Err(_)) if state.cpu_exceeded => Err(InvocationError::CpuLimit),
            Ok(Err(_)) if state.limiter.hit => Err(InvocationError::MemoryLimit),
            Ok(Err(e)) => Err(trap(&e)),
        }
    }

    /// Asks a prepared plugin to describe itself (no imports available).
    pub async fn describe(&self, plugin_id: &str, pre: &Pre) -> Result<ConnectorInfo, InvocationError> {
        let store = HostState::store(
            &self.engine,
            &self.epochs,
            self.limits.clone(),
            Invocation {
                plugin_id: plugin_id.into(),
                declared_hosts: Arc::from(Vec::new()),
                workspace_id: None,
                egress: None,
                sink: None,
                meters: None,
                time: self.time,
            },
        );
        let r = self
            .run(store, self.limits.wall_short, async |s| match pre {
                Pre::V1(p) => Ok(v1::describe(p, s).await?.map_err(ConnectorError::Internal)),
            })
            .await?;
        Ok(r)
    }

    fn require(plugin: &LoadedPlugin, op: Operation) -> Result<(), InvocationError> {
        if plugin.info.operations.contains(&op) { Ok(()) } else { Err(InvocationError::Unsupported(op.as_str())) }
    }

    pub async fn check(
        &self,
        plugin: &LoadedPlugin,
        workspace_id: &str,
        egress: &Egress,
        config: &str,
    ) -> Result<CheckResult, InvocationError> {
        Self::require(plugin, Operation::Check)?;
        let store = self.store(plugin, Some(workspace_id), Some(egress.clone()), None);
        self.run(store, self.limits.wall_short, async |s| match &plugin.pre {
            Pre::V1(p) => v1::check(p, s, config).await,
        })
        .await
    }

    pub(crate) async fn discover(
        &self,
        plugin: &LoadedPlugin,
        workspace_id: &str,
        egress: &Egress,
        config: &str,
    ) -> Result<Vec<Stream>, InvocationError> {
        Self::require(plugin, Operation::Discover)?;
        let store = self.store(plugin, Some(workspace_id), Some(egress.clone()), None);
        self.run(store, self.limits.wall_short, async |s| match &plugin.pre {
            Pre::V1(p) => v1::discover(p, s, config).await,
        })
        .await
    }

    pub(crate) async fn entity_options(
        &self,
        plugin: &LoadedPlugin,
        workspace_id: &str,
        egress: &Egress,
        config: &str,
        field: &str,
    ) -> Result<Vec<EntityOption>, InvocationError> {
        Self::require(plugin, Operation::EntityOptions)?;
        let store = self.store(plugin, Some(workspace_id), Some(egress.clone()), None);
        self.run(store, self.limits.wall_short, async |s| match &plugin.pre {
            Pre::V1(p) => v1::entity_options(p, s, config, field).await,
        })
        .await
    }

    /// Runs a preview; the answer must be one JSON object within the output
    /// limit.
    pub async fn preview(
        &self,
        plugin: &LoadedPlugin,
        workspace_id: &str,
        egress: &Egress,
        config: &str,
    ) -> Result<serde_json::Value, InvocationError> {
        Self::require(plugin, Operation::Preview)?;
        let store = self.store(plugin, Some(workspace_id), Some(egress.clone()), None);
        let text = self
            .run(store, self.limits.wall_short, async |s| match &plugin.pre {
                Pre::V1(p) => v1::preview(p, s, config).await,
            })
            .await?;
        if text.len() > self.limits.max_output_bytes {
            return Err(InvocationError::OutputTooLarge);
        }
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v @ serde_json::Value::Object(_)) => Ok(v),
            _ => Err(InvocationError::Connector(ConnectorError::Internal("preview is not a JSON object".into()))),
        }
    }

    /// Reads one stream into `sink`.
    pub async fn read(
        &self,
        plugin: &LoadedPlugin,
        workspace_id: &str,
        egress: &Egress,
        req: &ReadRequest,
        sink: Box<dyn RecordSink>,
    ) -> Result<(), InvocationError> {
        Self::require(plugin, Operation::Read)?;
        let store = self.store(plugin, Some(workspace_id), Some(egress.clone()), Some(sink));
        self.run(store, self.limits.wall_long, async |s| match &plugin.pre {
            Pre::V1(p) => v1::read(p, s, req).await,
        })
        .await
    }

    pub async fn write(
        &self,
        plugin: &LoadedPlugin,
        workspace_id: &str,
        egress: &Egress,
        req: &WriteRequest,
    ) -> Result<WriteResult, InvocationError> {
        Self::require(plugin, Operation::Write)?;
        let store = self.store(plugin, Some(workspace_id), Some(egress.clone()), None);
        self.run(store, self.limits.wall_long, async |s| match &plugin.pre {
            Pre::V1(p) => v1::write(p, s, req).await,
        })
        .await
    }
}

/// A short, safe description of a trap (no host paths or backtraces).
fn trap(e: &wasmtime::Error) -> InvocationError {
    if let Some(t) = e.downcast_ref::<wasmtime::Trap>() {
        return InvocationError::Trapped(match t {
            wasmtime::Trap::StackOverflow => "stack overflow".into(),
            wasmtime::Trap::UnreachableCodeReached => "unreachable code reached (panic)".into(),
            wasmtime::Trap::Interrupt => "interrupted".into(),
            other => other.to_string(),
        });
    }
    if e.to_string().contains("concurrent") || e.to_string().contains("pooling") {
        return InvocationError::Host("too many connector invocations at once; retry shortly".into());
    }
    InvocationError::Trapped(e.to_string().lines().next().unwrap_or("trap").chars().take(300).collect())
}

/// Reads a component file (used for the plugins directory and the CLI).
pub(crate) fn read_component(path: &Path) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if !bytes.starts_with(b"\0asm") {
        anyhow::bail!("{}: not a WebAssembly file", path.display());
    }
    Ok(bytes)
}
