//! The sandbox: wasmtime components, one pre-linked instance template per
//! plugin, a fresh store per message.
//!
//! What a handler can reach is exactly what the linker holds: Idem's
//! `store`, `effects` and `log` interfaces, plus the part of WASI a Rust
//! standard library links against, wired to nothing (no environment, no
//! arguments, no preopened directories, no sockets), a frozen clock and a
//! random source seeded from the message key. A component that imports
//! anything else is refused at load, naming the import.

pub mod bindings;
pub mod native;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config as WasmConfig, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::capabilities::{Capabilities, Grants, HostAbort};
use crate::claim::ClaimRef;
use crate::config::Limits;
use bindings::{Handler, HandlerPre};

/// How often the epoch advances: the granularity of CPU deadlines and of
/// the yields that keep a busy guest from holding a tokio worker thread.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Bytes of stdout/stderr kept per execution (a panic message lands here).
const STDIO_CAPACITY: usize = 64 * 1024;

/// The WASI interfaces a Rust `wasm32-wasip2` standard library may import,
/// each wired to nothing useful (see the module docs).
const ALLOWED_WASI: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
];

/// Idem's own interfaces.
const ALLOWED_IDEM: &[&str] = &[
    "idem:handler/types",
    "idem:handler/store",
    "idem:handler/effects",
    "idem:handler/log",
];

/// Is this import (e.g. `wasi:sockets/tcp@0.2.6`) one Idem provides?
pub fn import_allowed(name: &str) -> bool {
    let base = name.split('@').next().unwrap_or(name);
    ALLOWED_WASI.contains(&base) || ALLOWED_IDEM.contains(&base)
}

/// Why an import is refused, with what to do instead.
fn refusal(name: &str) -> String {
    let base = name.split('@').next().unwrap_or(name);
    let hint = if base.starts_with("wasi:sockets") || base.starts_with("wasi:http") {
        "handlers reach the network only through idem:handler/effects (effects::call), which journals each response; remove the code that opens connections (std::net, an HTTP client)"
    } else {
        "handlers may import only idem:handler/{store,effects,log} and the WASI interfaces the Rust standard library needs; remove the dependency that imports it"
    };
    format!("imports `{name}`, which Idem does not provide: {hint}")
}

/// A plugin ready to run: compiled, checked and pre-linked.
pub struct Plugin {
    /// The name messages are published to.
    pub name: String,
    /// Content hash of the component (first 12 hex digits of its SHA-256),
    /// recorded with each claim, journal entry and dead letter.
    pub version: String,
    /// Collections and endpoints it may use.
    pub grants: Grants,
    /// Its sandbox limits.
    pub limits: Limits,
    /// JSON pointer of its natural idempotency key, if any.
    pub key_pointer: Option<String>,
    /// Every import of the component (for `idem plugin check`).
    pub imports: Vec<String>,
    /// When it was compiled (Unix ms).
    pub loaded_at: i64,
    code: Code,
}

/// How a plugin's handler runs.
enum Code {
    /// A WebAssembly component, pre-linked: a fresh instance per message.
    Wasm(HandlerPre<HostState>),
    /// A handler compiled into the host: the native baseline of the
    /// benchmarks, with the same capabilities and no sandbox.
    Native(Arc<dyn native::NativeHandler>),
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("version", &self.version)
            .finish()
    }
}

/// What one execution is about.
#[derive(Debug, Clone)]
pub struct Execution {
    /// The message id.
    pub msg_id: String,
    /// The idempotency key.
    pub key: String,
    /// Attempt number, counted at claim time.
    pub attempt: u32,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Payload.
    pub payload: Vec<u8>,
    /// The claim (fence) every write presents; `None` when unguarded.
    pub claim: Option<ClaimRef>,
    /// Set by the heartbeat when the claim was taken over: the instance is
    /// interrupted at its next epoch check.
    pub interrupt: Arc<AtomicBool>,
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The handler returned `ok`.
    Done,
    /// The handler returned a transient error.
    Transient(String),
    /// The handler returned a permanent error.
    Permanent(String),
    /// The instance trapped: a panic, a sandbox limit, or a host bug.
    Trapped(String),
    /// The claim was taken over mid-run; nothing may be settled.
    FenceLost,
    /// Fault injection stopped the execution as if the worker had died.
    Crashed,
    /// The host could not run the handler (e.g. no free instance slot).
    HostError(String),
}

/// Per-store state: WASI plumbing, limits and Idem's capabilities.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    pub(crate) caps: Arc<Capabilities>,
    pub(crate) plugin: Arc<Plugin>,
    pub(crate) exec: Execution,
    cpu_ticks_left: u64,
    /// Set by every host call: the tick that elapsed while the host worked
    /// is not charged to the guest's CPU budget.
    pub(crate) in_host: bool,
    pub(crate) log_lines: u32,
    pub(crate) log_dropped: u32,
    pub(crate) abort: Option<HostAbort>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

struct MemoryLimiter {
    max: usize,
    hit: bool,
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.max {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// A clock stopped at the Unix epoch: handlers must not depend on time.
struct FrozenClock;

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Instances alive at once (the pooling allocator's slots).
    pub max_instances: u32,
    /// The largest memory limit of any plugin.
    pub max_memory_bytes: u64,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            max_instances: 256,
            max_memory_bytes: Limits::default().memory_bytes,
        }
    }
}

/// The engine, the linker and the loaded plugins.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    plugins: RwLock<HashMap<String, Arc<Plugin>>>,
}

impl Runtime {
    /// Build the engine (pooling allocator, epoch interruption, async) and
    /// the linker holding exactly the allowed world.
    pub fn new(options: RuntimeOptions) -> Result<Runtime> {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(options.max_instances)
            .total_core_instances(options.max_instances * 4)
            .total_memories(options.max_instances * 2)
            .total_tables(options.max_instances * 4)
            .total_stacks(options.max_instances)
            .max_memory_size(options.max_memory_bytes.max(4 << 20) as usize)
            .max_memories_per_component(4)
            .max_tables_per_component(8)
            .max_core_instances_per_component(64)
            // A fresh instance per message: what it touched must be reset
            // cheaply. Memory kept resident is reset with a memset instead of
            // madvise + page faults; 256 KiB covers a component built with a
            // 128 KiB shadow stack (see .cargo/config.toml) plus its data and
            // first heap pages. Decommits are batched so the TLB shootdowns
            // they cost are paid once per 32 instances.
            .linear_memory_keep_resident(256 << 10)
            .table_keep_resident(16 << 10)
            .async_stack_keep_resident(64 << 10)
            .decommit_batch_size(32);
        let mut config = WasmConfig::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| anyhow!("cannot create the WebAssembly engine: {e:#}"))?;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("idem-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })
            .context("cannot start the epoch thread")?;

        let mut linker: Linker<HostState> = Linker::new(&engine);
        add_wasi_subset(&mut linker)?;
        Handler::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(&mut linker, |s| s)?;
        Ok(Runtime {
            engine,
            linker,
            plugins: RwLock::new(HashMap::new()),
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Compile, check and pre-link a component. Compilation runs on a
    /// blocking thread, off the hot path.
    pub async fn compile(
        self: &Arc<Self>,
        name: &str,
        bytes: Vec<u8>,
        grants: Grants,
        limits: Limits,
        key_pointer: Option<String>,
    ) -> Result<Arc<Plugin>> {
        let this = self.clone();
        let name = name.to_string();
        tokio::task::spawn_blocking(move || this.compile_blocking(&name, &bytes, grants, limits, key_pointer))
            .await
            .context("plugin compilation panicked")?
    }

    /// [`compile`](Self::compile) on the current thread.
    pub fn compile_blocking(
        &self,
        name: &str,
        bytes: &[u8],
        grants: Grants,
        limits: Limits,
        key_pointer: Option<String>,
    ) -> Result<Arc<Plugin>> {
        let version = crate::reload::version_of(bytes);
        let component = Component::new(&self.engine, bytes).map_err(|e| {
            anyhow!("plugin {name}: not a valid WebAssembly component ({e:#}); build it with `cargo build --target wasm32-wasip2` against idem-sdk")
        })?;
        let imports = component_imports(&self.engine, &component);
        let refused: Vec<String> = imports.iter().filter(|i| !import_allowed(i)).map(|i| refusal(i)).collect();
        if !refused.is_empty() {
            bail!("plugin {name} refused: it {}", refused.join("; it "));
        }
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| anyhow!("plugin {name} cannot be linked: {e:#}"))?;
        let pre = HandlerPre::new(pre).map_err(|e| {
            anyhow!("plugin {name} does not export the idem:handler world's `handle` function ({e:#}); export it with idem_sdk::handler!")
        })?;
        if limits.memory_bytes < (2 << 20) {
            bail!(
                "plugin {name}: limits.memory_bytes = {} is below the 2 MiB a Rust component needs to start",
                limits.memory_bytes
            );
        }
        Ok(Arc::new(Plugin {
            name: name.to_string(),
            version,
            grants,
            limits,
            key_pointer,
            imports,
            loaded_at: crate::now_ms(),
            code: Code::Wasm(pre),
        }))
    }

    /// Load a plugin file and make it available under `name`, replacing any
    /// previous version (executions in flight keep the version they have).
    pub async fn load_file(
        self: &Arc<Self>,
        name: &str,
        path: &Path,
        grants: Grants,
        limits: Limits,
        key_pointer: Option<String>,
    ) -> Result<Arc<Plugin>> {
        let bytes = tokio::fs::read(path).await.with_context(|| {
            format!(
                "plugin {name}: cannot read {} (plugins.{name}.path); build the plugins first",
                path.display()
            )
        })?;
        let plugin = self.compile(name, bytes, grants, limits, key_pointer).await?;
        self.plugins
            .write()
            .expect("plugin map poisoned")
            .insert(name.to_string(), plugin.clone());
        Ok(plugin)
    }

    /// Make a native handler available under `name` (benchmarks: the same
    /// pipeline and capabilities as a component, without the sandbox).
    pub fn install_native(&self, name: &str, handler: Arc<dyn native::NativeHandler>, grants: Grants, limits: Limits) -> Arc<Plugin> {
        let plugin = Arc::new(Plugin {
            name: name.to_string(),
            version: "native".into(),
            grants,
            limits,
            key_pointer: None,
            imports: Vec::new(),
            loaded_at: crate::now_ms(),
            code: Code::Native(handler),
        });
        self.install(plugin.clone());
        plugin
    }

    /// Make an already compiled plugin available.
    pub fn install(&self, plugin: Arc<Plugin>) {
        self.plugins
            .write()
            .expect("plugin map poisoned")
            .insert(plugin.name.clone(), plugin);
    }

    /// The plugin serving `name`, if loaded.
    pub fn plugin(&self, name: &str) -> Option<Arc<Plugin>> {
        self.plugins.read().expect("plugin map poisoned").get(name).cloned()
    }

    /// Names of loaded plugins, sorted.
    pub fn plugin_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.plugins.read().expect("plugin map poisoned").keys().cloned().collect();
        names.sort();
        names
    }

    /// Run one message through a plugin in a fresh store.
    pub async fn execute(&self, caps: &Arc<Capabilities>, plugin: &Arc<Plugin>, exec: Execution) -> Outcome {
        let pre = match &plugin.code {
            Code::Wasm(pre) => pre,
            Code::Native(handler) => return native::execute(handler.as_ref(), caps, plugin, exec).await,
        };
        let limits = &plugin.limits;
        let stdout = MemoryOutputPipe::new(STDIO_CAPACITY);
        let stderr = MemoryOutputPipe::new(STDIO_CAPACITY);
        let seed: [u8; 32] = Sha256::digest(exec.key.as_bytes()).into();
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .secure_random(wasmtime_wasi::Deterministic::new(seed.to_vec()))
            .insecure_random(wasmtime_wasi::Deterministic::new(seed.to_vec()))
            .insecure_random_seed(u128::from_le_bytes(seed[..16].try_into().expect("16 bytes")))
            .wall_clock(FrozenClock)
            .monotonic_clock(FrozenClock)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let cpu_ticks = (limits.cpu_ms / EPOCH_TICK.as_millis() as u64).max(1);
        let state = HostState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter {
                max: limits.memory_bytes as usize,
                hit: false,
            },
            caps: caps.clone(),
            plugin: plugin.clone(),
            exec: exec.clone(),
            cpu_ticks_left: cpu_ticks,
            in_host: false,
            log_lines: 0,
            log_dropped: 0,
            abort: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            let s = ctx.data_mut();
            if s.exec.interrupt.load(Ordering::Relaxed) {
                s.abort = Some(HostAbort::FenceLost);
                return Err(wasmtime::Error::new(HostAbort::FenceLost));
            }
            if s.cpu_ticks_left == 0 {
                s.abort = Some(HostAbort::CpuDeadline(s.plugin.limits.cpu_ms));
                return Err(wasmtime::Error::new(HostAbort::CpuDeadline(s.plugin.limits.cpu_ms)));
            }
            if std::mem::take(&mut s.in_host) {
                return Ok(UpdateDeadline::Yield(1));
            }
            s.cpu_ticks_left -= 1;
            Ok(UpdateDeadline::Yield(1))
        });

        let msg = bindings::idem::handler::types::Message {
            id: exec.msg_id.clone(),
            key: exec.key.clone(),
            attempt: exec.attempt,
            headers: exec.headers.clone(),
            payload: exec.payload.clone(),
        };
        let instance = match pre.instantiate_async(&mut store).await {
            Ok(i) => i,
            Err(e) if e.downcast_ref::<wasmtime::Trap>().is_none() && store.data().abort.is_none() => {
                return Outcome::HostError(format!("cannot instantiate plugin {}: {e:#}", plugin.name));
            }
            Err(e) => return classify_trap(e, store.data(), &stderr),
        };
        let timeout = Duration::from_millis(limits.timeout_ms);
        let result = match tokio::time::timeout(timeout, instance.call_handle(&mut store, &msg)).await {
            Ok(r) => r,
            Err(_) => {
                return Outcome::Trapped(format!(
                    "timeout: the execution ran longer than limits.timeout_ms = {} (guest time plus host calls)",
                    limits.timeout_ms
                ))
            }
        };
        let state = store.data();
        if state.log_dropped > 0 {
            tracing::warn!(plugin = %plugin.name, key = %exec.key, dropped = state.log_dropped, "log lines over the limit were dropped");
        }
        match result {
            Ok(Ok(())) => Outcome::Done,
            Ok(Err(bindings::idem::handler::types::HandlerError::Transient(m))) => Outcome::Transient(bounded(m)),
            Ok(Err(bindings::idem::handler::types::HandlerError::Permanent(m))) => Outcome::Permanent(bounded(m)),
            Err(err) => classify_trap(err, state, &stderr),
        }
    }
}

/// Handler-supplied error text is kept to 4 KiB.
fn bounded(mut message: String) -> String {
    const MAX: usize = 4096;
    if message.len() > MAX {
        let mut cut = MAX;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("… [truncated]");
    }
    message
}

/// Turn a wasmtime error into an outcome with a reason an operator can act on.
fn classify_trap(err: wasmtime::Error, state: &HostState, stderr: &MemoryOutputPipe) -> Outcome {
    let abort = state
        .abort
        .clone()
        .or_else(|| err.chain().find_map(|c| c.downcast_ref::<HostAbort>().cloned()));
    match abort {
        Some(HostAbort::FenceLost) => return Outcome::FenceLost,
        Some(HostAbort::SimulatedCrash) => return Outcome::Crashed,
        Some(other) => return Outcome::Trapped(other.to_string()),
        None => {}
    }
    let limits = &state.plugin.limits;
    let mut reason = if state.limiter.hit {
        format!(
            "memory limit: the instance tried to grow past limits.memory_bytes = {}",
            limits.memory_bytes
        )
    } else if let Some(trap) = err.downcast_ref::<wasmtime::Trap>() {
        match trap {
            wasmtime::Trap::StackOverflow => "stack overflow (unbounded recursion?)".to_string(),
            wasmtime::Trap::UnreachableCodeReached => "the handler panicked or aborted".to_string(),
            wasmtime::Trap::MemoryOutOfBounds => {
                "out-of-bounds memory access (in Rust guests usually a shadow-stack overflow from unbounded recursion)".to_string()
            }
            other => format!("trap: {other}"),
        }
    } else if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
        format!("the handler called exit({}); return an error instead", exit.0)
    } else {
        format!("trap: {err:#}")
    };
    let text = String::from_utf8_lossy(&stderr.contents()).trim().to_string();
    if !text.is_empty() {
        let tail: String = text.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect();
        reason.push_str(": ");
        reason.push_str(&tail);
    }
    Outcome::Trapped(reason)
}

/// Every import of a component, as `package/interface@version` names.
pub fn component_imports(engine: &Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// `wasi:io` resources live in the store's resource table.
struct HasIo;

impl wasmtime::component::HasData for HasIo {
    type Data<'a> = &'a mut ResourceTable;
}

/// Add the allowed WASI subset (see [`ALLOWED_WASI`]) and nothing else.
fn add_wasi_subset(linker: &mut Linker<HostState>) -> Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView};
    use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView};
    use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random};
    use wasmtime_wasi::random::WasiRandom;

    let l = linker;
    wasmtime_wasi_io::bindings::wasi::io::error::add_to_linker::<HostState, HasIo>(l, |t| &mut t.table)?;
    wasmtime_wasi_io::bindings::wasi::io::poll::add_to_linker::<HostState, HasIo>(l, |t| &mut t.table)?;
    wasmtime_wasi_io::bindings::wasi::io::streams::add_to_linker::<HostState, HasIo>(l, |t| &mut t.table)?;
    clocks::wall_clock::add_to_linker::<HostState, WasiClocks>(l, HostState::clocks)?;
    clocks::monotonic_clock::add_to_linker::<HostState, WasiClocks>(l, HostState::clocks)?;
    filesystem::types::add_to_linker::<HostState, WasiFilesystem>(l, HostState::filesystem)?;
    filesystem::preopens::add_to_linker::<HostState, WasiFilesystem>(l, HostState::filesystem)?;
    random::random::add_to_linker::<HostState, WasiRandom>(l, |t| t.wasi.random())?;
    random::insecure::add_to_linker::<HostState, WasiRandom>(l, |t| t.wasi.random())?;
    random::insecure_seed::add_to_linker::<HostState, WasiRandom>(l, |t| t.wasi.random())?;
    cli::exit::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::environment::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_input::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_output::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    Ok(())
}
