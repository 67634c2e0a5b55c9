//! The per-invocation sandbox: a fresh store holding the plugin's only
//! ambient state, and the limits every invocation runs under.
//!
//! - CPU: an epoch deadline of one tick, renewed by a callback that counts
//!   the ticks during which guest code was running. Time blocked in a host
//!   call advances the epoch but runs no guest code: the tick that then
//!   ends in the guest is not counted when the call was one of the host's
//!   own that block (a request, records written, a checkpoint), and costs
//!   at most one tick for any other (a WASI sleep between retries). A long
//!   sync of many quick requests that mostly waits on the network is not
//!   cut short, while a busy loop is.
//! - Memory: a resource limiter on linear memories and tables, counting all
//!   of an invocation's memories against one budget; refusals are
//!   remembered so a memory bomb is reported as such.
//! - Wall clock: a timeout around the whole call, since epochs cannot
//!   interrupt a blocked host call.
//! - Sizes: outputs, single records and log volume are capped.
//! - WASI: no environment, no arguments, no preopened directories, no
//!   sockets, no name lookups; stdout and stderr are captured (capped) and
//!   forwarded to the host log tagged with the plugin id.
//! - Time and randomness: the machine's, or under [`GuestTime::Frozen`] a
//!   wall clock that stands still and randomness from a fixed seed, so a
//!   replay asks exactly what its recording asked.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::types::SinkRefusal;
use super::usage::{self, EgressUsage, PluginMeters, Usage};
use crate::egress::{Egress, HostPattern};

pub use crate::config::limits::PluginLimits as Limits;

/// The wall clock and randomness a guest sees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GuestTime {
    /// The machine's clock and its secure randomness.
    #[default]
    Live,
    /// A wall clock standing still at this instant (since the Unix
    /// epoch), and randomness from a fixed seed: what the authoring kit's
    /// recordings and replays run with. The monotonic clock still runs,
    /// so waits and timeouts behave.
    Frozen(std::time::Duration),
}

/// A wall clock that always reads the same instant.
struct StoppedClock(std::time::Duration);

impl wasmtime_wasi::HostWallClock for StoppedClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(1)
    }

    fn now(&self) -> std::time::Duration {
        self.0
    }
}

/// The seed of a frozen guest's randomness: any fixed value does.
const FROZEN_SEED: u64 = 0x5eed_0fc0_55e7_7e00;

/// Where a read's records and checkpoints go.
pub trait RecordSink: Send {
    /// Takes a batch of records (each the text of a JSON object).
    fn emit<'a>(
        &'a mut self,
        stream: &'a str,
        records: Vec<String>,
    ) -> Pin<Box<dyn Future<Output = Result<(), SinkRefusal>> + Send + 'a>>;
    /// Persists the stream's state with every record emitted before it.
    fn checkpoint<'a>(
        &'a mut self,
        stream: &'a str,
        state: String,
    ) -> Pin<Box<dyn Future<Output = Result<(), SinkRefusal>> + Send + 'a>>;
}

/// Refuses linear-memory and table growth past the limits and remembers
/// that it did. The memory limit is for the whole call: a component holds
/// several linear memories (one per core instance, the WASI adapter's
/// among them), and each counts against the same budget.
pub(crate) struct MemoryLimiter {
    memory_bytes: usize,
    /// Bytes of every linear memory of the call together.
    in_use: usize,
    /// The most they held at once.
    pub(crate) peak: usize,
    pub(crate) hit: bool,
}

impl MemoryLimiter {
    pub(crate) fn new(memory_bytes: usize) -> Self {
        MemoryLimiter { memory_bytes, in_use: 0, peak: 0, hit: false }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let total = self.in_use.saturating_sub(current).saturating_add(desired);
        if total > self.memory_bytes {
            self.hit = true;
            return Ok(false);
        }
        self.in_use = total;
        self.peak = self.peak.max(total);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > 100_000 {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }
}

/// Captured stdout/stderr: keeps the first `cap` bytes, silently drops the
/// rest (a plugin that prints too much is not killed for it).
#[derive(Clone)]
pub(crate) struct CapturedOutput {
    buf: Arc<Mutex<Vec<u8>>>,
    cap: usize,
}

impl CapturedOutput {
    fn new(cap: usize) -> Self {
        CapturedOutput { buf: Arc::new(Mutex::new(Vec::new())), cap }
    }

    /// What was captured, as text.
    pub(crate) fn take(&self) -> String {
        let mut b = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&std::mem::take(&mut *b)).into_owned()
    }
}

impl tokio::io::AsyncWrite for CapturedOutput {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let mut b = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        let room = self.cap.saturating_sub(b.len());
        b.extend_from_slice(&data[..data.len().min(room)]);
        Poll::Ready(Ok(data.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// Everything one invocation's store holds.
pub struct HostState {
    wasi: WasiCtx,
    pub(super) table: ResourceTable,
    /// Requests started through `http-ahead` and not yet finished.
    pub(super) pending: u32,
    pub(crate) limiter: MemoryLimiter,
    /// The plugin, for log lines and egress decisions.
    pub(crate) plugin_id: Arc<str>,
    pub(crate) declared_hosts: Arc<[HostPattern]>,
    /// The workspace the invocation runs for; `None` for `describe`.
    pub(crate) workspace_id: Option<Arc<str>>,
    pub(crate) egress: Option<Egress>,
    pub(crate) sink: Option<Box<dyn RecordSink>>,
    pub(crate) limits: Arc<Limits>,
    /// Epoch ticks during which guest code ran.
    guest_ticks: u64,
    /// The engine's epoch, as its ticker counts it.
    epochs: Epochs,
    /// Whether the epoch advanced during the last blocking host call: the
    /// next tick the guest sees ended there.
    tick_in_host: bool,
    /// The invocation's requests, shared with those started ahead.
    pub(crate) egress_usage: Arc<EgressUsage>,
    /// The plugin version's meters (none for `describe`).
    meters: Option<Arc<PluginMeters>>,
    pub(crate) cpu_exceeded: bool,
    pub(crate) log_bytes: usize,
    pub(crate) log_dropped: u64,
    pub(crate) output: CapturedOutput,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// What an invocation runs with.
pub struct Invocation {
    pub plugin_id: Arc<str>,
    pub declared_hosts: Arc<[HostPattern]>,
    pub workspace_id: Option<Arc<str>>,
    pub egress: Option<Egress>,
    pub sink: Option<Box<dyn RecordSink>>,
    /// Where its usage is counted (none for `describe`).
    pub meters: Option<Arc<PluginMeters>>,
    pub time: GuestTime,
}

/// Epoch ticks per second (the engine's epoch is advanced by a thread).
pub(crate) const TICKS_PER_SECOND: u64 = 200;

/// The engine's epoch as its ticker counts it (the engine does not tell),
/// so a host call can see whether a tick passed while it blocked.
#[derive(Debug, Clone, Default)]
pub(crate) struct Epochs(Arc<std::sync::atomic::AtomicU64>);

impl Epochs {
    /// One tick passed (the ticker advanced the engine's epoch too).
    pub(crate) fn tick(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn now(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl HostState {
    /// A fresh store for one invocation, with limits and the CPU deadline
    /// armed.
    pub(crate) fn store(
        engine: &wasmtime::Engine,
        epochs: &Epochs,
        limits: Arc<Limits>,
        inv: Invocation,
    ) -> Store<HostState> {
        let output = CapturedOutput::new(limits.max_log_bytes);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(output.clone())
            .stderr(output.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if let GuestTime::Frozen(at) = inv.time {
            use guest_rand::SeedableRng;
            wasi.wall_clock(StoppedClock(at))
                .secure_random(guest_rand::rngs::StdRng::seed_from_u64(FROZEN_SEED))
                .insecure_random(guest_rand::rngs::StdRng::seed_from_u64(FROZEN_SEED + 1))
                .insecure_random_seed(u128::from(FROZEN_SEED));
        }
        let wasi = wasi.build();
        let state = HostState {
            wasi,
            table: ResourceTable::new(),
            pending: 0,
            limiter: MemoryLimiter::new(limits.memory_bytes),
            plugin_id: inv.plugin_id,
            declared_hosts: inv.declared_hosts,
            workspace_id: inv.workspace_id,
            egress: inv.egress,
            sink: inv.sink,
            limits,
            guest_ticks: 0,
            epochs: epochs.clone(),
            tick_in_host: false,
            egress_usage: Arc::default(),
            meters: inv.meters,
            cpu_exceeded: false,
            log_bytes: 0,
            log_dropped: 0,
            output,
        };
        let mut store = Store::new(engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            let s = ctx.data_mut();
            if std::mem::take(&mut s.tick_in_host) {
                return Ok(UpdateDeadline::Yield(1));
            }
            s.guest_ticks += 1;
            let budget = (s.limits.cpu.as_millis() as u64 * TICKS_PER_SECOND / 1000).max(1);
            if s.guest_ticks > budget {
                s.cpu_exceeded = true;
                return Ok(UpdateDeadline::Interrupt);
            }
            // Yield to the executor each tick so a busy plugin does not
            // starve other tasks on this thread.
            Ok(UpdateDeadline::Yield(1))
        });
        store
    }

    /// The epoch as a blocking host call starts.
    pub(crate) fn host_call_starts(&self) -> u64 {
        self.epochs.now()
    }

    /// A blocking host call that started at epoch `started` ends: a tick
    /// that passed while it blocked is not the guest's.
    pub(crate) fn host_call_ends(&mut self, started: u64) {
        if self.epochs.now() != started {
            self.tick_in_host = true;
        }
    }

    /// What the invocation cost; counted on the plugin's meters and the
    /// job it runs for. Called once, when it ends.
    pub(crate) fn account(&self) -> Usage {
        let guest_cpu =
            std::time::Duration::from_nanos(self.guest_ticks.saturating_mul(1_000_000_000 / TICKS_PER_SECOND));
        let usage = self.egress_usage.usage(guest_cpu, self.limiter.peak as u64);
        if let Some(meters) = &self.meters {
            meters.record(&usage);
            usage::charge(&usage);
        }
        usage
    }

    /// Accepts a log message within the per-invocation budget.
    pub fn log(&mut self, level: tracing::Level, message: &str) {
        let message: String = message.chars().take(2048).filter(|c| !c.is_control() || *c == '\t').collect();
        if self.log_bytes + message.len() > self.limits.max_log_bytes {
            self.log_dropped += 1;
            return;
        }
        self.log_bytes += message.len();
        let plugin = &*self.plugin_id;
        match level {
            tracing::Level::ERROR => tracing::error!(plugin, "{message}"),
            tracing::Level::WARN => tracing::warn!(plugin, "{message}"),
            tracing::Level::INFO => tracing::info!(plugin, "{message}"),
            tracing::Level::DEBUG => tracing::debug!(plugin, "{message}"),
            _ => tracing::trace!(plugin, "{message}"),
        }
    }

    /// Forwards captured stdout/stderr to the host log and reports dropped
    /// log lines; called when an invocation ends.
    pub(crate) fn flush_output(&mut self) {
        let out = self.output.take();
        for line in out.lines().filter(|l| !l.trim().is_empty()).take(200) {
            tracing::info!(
                plugin = &*self.plugin_id,
                stream = "stdout",
                "{}",
                line.chars().take(2048).collect::<String>()
            );
        }
        if self.log_dropped > 0 {
            tracing::warn!(
                plugin = &*self.plugin_id,
                dropped = self.log_dropped,
                "plugin log budget exhausted; messages dropped"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_memory_of_a_call_counts_against_one_budget() {
        let mut limiter = MemoryLimiter::new(100);
        assert!(limiter.memory_growing(0, 60, None).unwrap(), "a first memory");
        assert!(!limiter.memory_growing(0, 60, None).unwrap(), "a second one would pass the budget together");
        assert!(limiter.hit);
        let mut limiter = MemoryLimiter::new(100);
        assert!(limiter.memory_growing(0, 30, None).unwrap());
        assert!(limiter.memory_growing(0, 30, None).unwrap());
        assert!(limiter.memory_growing(30, 40, None).unwrap(), "growth counts only what it adds");
        assert!(!limiter.memory_growing(40, 90, None).unwrap(), "70 + 50 more would pass it");
    }
}
