//! The sandbox: wasmtime components, one pre-linked instance template per
//! plugin, a fresh store per message.
//!
//! What a handler can reach is exactly what the linker holds (see
//! [`world`]): Idem's capabilities, added by
//! [`crate::capabilities::add_to_linker`], and a WASI subset wired to
//! nothing. [`instance`] runs one message; [`native`] runs the benchmarks'
//! handlers compiled into the host through the same capabilities.

pub mod cache;
pub mod footprint;
mod instance;
pub mod native;
mod outcome;
mod world;

use std::collections::HashMap;
use std::ops::Deref;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config as WasmConfig, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::capabilities::{Capabilities, Execution, Grants};
use crate::config::Limits;
use crate::plugin::{version_of, PluginInfo};
use footprint::{Capacity, Footprint};
use instance::Pre;
pub use instance::{HostState, MAX_ERROR_BYTES};
pub use outcome::Outcome;
pub use world::{component_imports, import_allowed};

/// How often the epoch advances: the granularity of CPU deadlines and of
/// the yields that keep a busy guest from holding a tokio worker thread.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// A plugin ready to run: what it is ([`PluginInfo`], reached through
/// `Deref`) and its code, compiled, checked and pre-linked.
pub struct Plugin {
    info: Arc<PluginInfo>,
    code: Code,
}

impl Deref for Plugin {
    type Target = PluginInfo;
    fn deref(&self) -> &PluginInfo {
        &self.info
    }
}

impl Plugin {
    /// The version of the `idem:handler` world the plugin was built against
    /// (`native` for handlers compiled into the host).
    pub fn world(&self) -> &'static str {
        match &self.code {
            Code::Wasm(pre, _) => pre.world(),
            Code::Native(_) => "native",
        }
    }
}

/// How a plugin's handler runs.
enum Code {
    /// A WebAssembly component, pre-linked: a fresh instance per message,
    /// which takes this much of the pool.
    Wasm(Pre, Footprint),
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

/// Engine settings.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Instances alive at once (the pooling allocator's slots).
    pub max_instances: u32,
    /// The largest memory limit of any plugin.
    pub max_memory_bytes: u64,
    /// What one instance of the largest plugin takes (core instances,
    /// memories, tables): each slot of the pool is sized for it.
    pub per_instance: Footprint,
    /// Where compiled components are kept across restarts (none: compile
    /// every time).
    pub compile_cache: Option<std::path::PathBuf>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            max_instances: 256,
            max_memory_bytes: Limits::default().memory_bytes,
            per_instance: Footprint::SMALL,
            compile_cache: None,
        }
    }
}

/// How a pool slot's memory is reset between instances.
#[derive(Clone, Copy)]
enum Reset {
    /// Scan for the pages written and copy back only those, keeping up to
    /// 4 MiB resident per slot, however many separate runs they make (the
    /// reset of wasmtime 48.0.11: see vendor/README.md).
    PageMapScan,
    /// Reset the first 256 KiB with a memset and decommit the rest.
    Prefix,
}

/// The linear memory each pool slot reserves.
fn pool_memory_bytes(options: &RuntimeOptions) -> u64 {
    options.max_memory_bytes.max(4 << 20)
}

/// The size under which wasmtime makes a copy-on-write image of any heap,
/// however sparse: the default `limits.memory_bytes`. It shapes the
/// compiled code and is not in the engine's compatibility hash, so it is
/// one value for every engine: a component compiled into the cache by
/// `idem plugin check` is the one a worker with other limits would compile.
const DENSE_IMAGE_BYTES: u64 = 64 << 20;

/// The engine's configuration: component model, epoch interruption and a
/// pooling allocator sized for `max_instances` instances of `per`.
fn engine_config(options: &RuntimeOptions, per: Footprint, reset: Reset) -> WasmConfig {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(options.max_instances)
        .total_core_instances(options.max_instances * per.core_instances)
        .total_memories(options.max_instances * per.memories)
        .total_tables(options.max_instances * per.tables)
        .total_stacks(options.max_instances)
        .max_memory_size(pool_memory_bytes(options) as usize)
        .max_memories_per_component(per.memories)
        .max_tables_per_component(per.tables)
        .max_core_instances_per_component(per.core_instances)
        // A fresh instance per message: what it touched must be reset
        // cheaply. Memory kept resident is reset by copying instead of
        // madvise + page faults. Without the scan, 256 KiB covers a
        // component built with a 128 KiB shadow stack (see
        // .cargo/config.toml) plus its data and first heap pages.
        // Decommits are batched so the TLB shootdowns they cost are paid
        // once per 32 instances.
        .table_keep_resident(16 << 10)
        .async_stack_keep_resident(64 << 10)
        .decommit_batch_size(32);
    match reset {
        Reset::PageMapScan => pool.pagemap_scan(Enabled::Yes).linear_memory_keep_resident(4 << 20),
        Reset::Prefix => pool.linear_memory_keep_resident(256 << 10),
    };
    let mut config = WasmConfig::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        // A pre-initialised heap (a Python or JavaScript component is an
        // interpreter whose heap was snapshotted at build time: megabytes
        // of data segments) is mapped copy-on-write from the compiled
        // image, not copied into each instance: an instance pays only
        // for the pages it writes.
        .memory_init_cow(true)
        // wasmtime makes such an image only for a dense enough heap unless
        // it is under this size; an interpreter's snapshot is sparse and
        // can pass 16 MiB, and without an image every instance would copy
        // it.
        .memory_guaranteed_dense_image_size(DENSE_IMAGE_BYTES)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

/// A compiled component and what one instance of it takes.
pub struct Compiled {
    pub component: Component,
    pub footprint: Footprint,
}

/// The engine, the linker and the loaded plugins.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    plugins: RwLock<HashMap<String, Arc<Plugin>>>,
    /// The pool's slots, reserved by each execution before it instantiates.
    capacity: Capacity,
    /// What one instance may take at most (the pool's per-component limits).
    per_instance: Footprint,
    /// The linear memory the pool reserved for each instance: no plugin's
    /// `limits.memory_bytes` can be more.
    max_memory_bytes: u64,
    /// Compiled components on disk.
    cache: Option<cache::CompileCache>,
}

impl Runtime {
    /// Build the engine (pooling allocator, epoch interruption, async) and
    /// the linker holding exactly the allowed world.
    pub fn new(options: RuntimeOptions) -> Result<Runtime> {
        let per = options.per_instance.max(Footprint::SMALL);
        // With the kernel's page-map scan (Linux 6.7+) a slot's reset finds
        // the pages the last instance wrote and copies them back from the
        // image, keeping them resident: the next instance in that slot
        // writes them without a page fault (an interpreter writes hundreds
        // of pages of its snapshot per message). Without it, what is kept
        // resident is reset whole, so only a little is.
        let reset = if PoolingAllocationConfig::is_pagemap_scan_available() {
            Reset::PageMapScan
        } else {
            Reset::Prefix
        };
        let engine =
            Engine::new(&engine_config(&options, per, reset)).map_err(|e| anyhow!("cannot create the WebAssembly engine: {e:#}"))?;
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
        world::add_wasi_subset(&mut linker)?;
        crate::capabilities::add_to_linker(&mut linker, |s: &mut HostState| &mut s.caps)?;
        Ok(Runtime {
            engine,
            linker,
            plugins: RwLock::new(HashMap::new()),
            capacity: Capacity::new(options.max_instances, per),
            per_instance: per,
            max_memory_bytes: pool_memory_bytes(&options),
            cache: options.compile_cache.map(cache::CompileCache::new),
        })
    }

    /// The linear memory the pool reserved for each instance when it was
    /// made: the most any plugin's `limits.memory_bytes` can be.
    pub fn max_memory_bytes(&self) -> u64 {
        self.max_memory_bytes
    }

    /// Refuse `memory_bytes` for plugin `name` past what the pool reserved
    /// when it started: the limiter would grant it and the pool refuse it,
    /// failing as a misleading trap.
    pub fn memory_fits(&self, name: &str, memory_bytes: u64) -> Result<()> {
        if memory_bytes > self.max_memory_bytes {
            bail!(
                "plugins.{name}: limits.memory_bytes = {memory_bytes} is more than the {} this process reserved for an instance when it started; restart the pool to raise it",
                self.max_memory_bytes
            );
        }
        Ok(())
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
        let compiled = self.component(name, bytes)?;
        self.prepare(name, bytes, &compiled, grants, limits, key_pointer)
    }

    /// The compiled component for `bytes` (from the compile cache when it
    /// holds it) and what one instance of it takes, if it fits the pool.
    pub fn component(&self, name: &str, bytes: &[u8]) -> Result<Compiled> {
        let invalid = |e: anyhow::Error| {
            anyhow!("plugin {name}: not a valid WebAssembly component ({e:#}); build it with `idem plugin build` or `cargo build --target wasm32-wasip2` against idem-sdk")
        };
        let footprint = Footprint::of(bytes).map_err(invalid)?;
        if footprint.largest_memory > self.max_memory_bytes {
            bail!(
                "plugin {name}: a memory of an instance starts at {} bytes, more than the {} this process reserves for one (the largest limits.memory_bytes when it started); raise limits.memory_bytes (plugins.{name}.limits.memory_bytes for this plugin alone) and restart",
                footprint.largest_memory,
                self.max_memory_bytes
            );
        }
        if !footprint.fits(self.per_instance) {
            bail!(
                "plugin {name}: one instance needs {} core instances, {} memories and {} tables, more than this process sized its instance pool for ({}, {}, {}); restart the pool so it sizes the pool for the new component",
                footprint.core_instances,
                footprint.memories,
                footprint.tables,
                self.per_instance.core_instances,
                self.per_instance.memories,
                self.per_instance.tables
            );
        }
        let started = std::time::Instant::now();
        let compiled = match &self.cache {
            Some(cache) => cache
                .component(&self.engine, bytes)
                .map(|(c, source)| (c, source == cache::Source::Cached)),
            None => Component::new(&self.engine, bytes)
                .map(|c| (c, false))
                .map_err(|e| anyhow!("{e:#}")),
        };
        let (component, cached) = compiled.map_err(invalid)?;
        tracing::debug!(plugin = %name, cached, ms = started.elapsed().as_millis() as u64, "component ready");
        Ok(Compiled { component, footprint })
    }

    /// Check a compiled component's imports and exports and pre-link it as
    /// plugin `name`.
    pub fn prepare(
        &self,
        name: &str,
        bytes: &[u8],
        compiled: &Compiled,
        grants: Grants,
        limits: Limits,
        key_pointer: Option<String>,
    ) -> Result<Arc<Plugin>> {
        let Compiled { component, footprint } = compiled;
        let version = version_of(bytes);
        let imports = world::component_imports(&self.engine, component);
        let refused: Vec<String> = imports.iter().filter(|i| !import_allowed(i)).map(|i| world::refusal(i)).collect();
        if !refused.is_empty() {
            bail!("plugin {name} refused: it {}", refused.join("; it "));
        }
        let pre = self
            .linker
            .instantiate_pre(component)
            .map_err(|e| anyhow!("plugin {name} cannot be linked: {e:#}"))?;
        let pre = Pre::new(pre).map_err(|e| {
            anyhow!("plugin {name} does not export the idem:handler world's `handle` function ({e:#}); export it with idem_sdk::handler!")
        })?;
        self.check_limits(name, footprint, &limits)?;
        Ok(Arc::new(Plugin {
            info: Arc::new(PluginInfo {
                name: name.to_string(),
                version,
                grants,
                limits,
                key_pointer,
                imports,
                loaded_at: crate::now_ms(),
            }),
            code: Code::Wasm(pre, *footprint),
        }))
    }

    /// Whether an instance of a component taking `footprint` can start
    /// under `limits` in this pool.
    fn check_limits(&self, name: &str, footprint: &Footprint, limits: &Limits) -> Result<()> {
        if limits.memory_bytes < (2 << 20) {
            bail!(
                "plugin {name}: limits.memory_bytes = {} is below the 2 MiB a Rust component needs to start",
                limits.memory_bytes
            );
        }
        self.memory_fits(name, limits.memory_bytes)?;
        if footprint.starting_memory > limits.memory_bytes {
            bail!(
                "plugin {name}: an instance's memories start at {} bytes together, more than its limits.memory_bytes = {}; raise it (plugins.{name}.limits.memory_bytes)",
                footprint.starting_memory,
                limits.memory_bytes
            );
        }
        Ok(())
    }

    /// `plugin`'s code (the same version, nothing compiled or read) with
    /// other grants and limits: a change of settings alone, which must
    /// not wait on the plugin's file (being copied, missing) to apply.
    /// It keeps `loaded_at`: the version is the one loaded then.
    pub fn with_settings(&self, plugin: &Plugin, grants: Grants, limits: Limits) -> Result<Arc<Plugin>> {
        let code = match &plugin.code {
            Code::Wasm(pre, footprint) => {
                self.check_limits(&plugin.name, footprint, &limits)?;
                Code::Wasm(pre.clone(), *footprint)
            }
            Code::Native(handler) => Code::Native(handler.clone()),
        };
        Ok(Arc::new(Plugin {
            info: Arc::new(PluginInfo {
                grants,
                limits,
                ..(*plugin.info).clone()
            }),
            code,
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
        let file = path.to_path_buf();
        let bytes = tokio::task::spawn_blocking(move || crate::plugin::read_component(&file))
            .await
            .map_err(anyhow::Error::from)
            .and_then(|r| r)
            .map_err(|e| anyhow::anyhow!("plugin {name}: {e:#} (plugins.{name}.path); build the plugins first"))?;
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
            info: Arc::new(PluginInfo {
                name: name.to_string(),
                version: "native".into(),
                grants,
                limits,
                key_pointer: None,
                imports: Vec::new(),
                loaded_at: crate::now_ms(),
            }),
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

    /// Run one message through a plugin in a fresh store, and wait for the
    /// writes it queued: the outcome is final.
    pub async fn execute(&self, caps: &Arc<Capabilities>, plugin: &Arc<Plugin>, exec: Execution) -> Outcome {
        let writes = exec.writes.clone();
        self.run(caps, plugin, exec).await.after_writes(&writes).await
    }

    /// Run one message through a plugin in a fresh store, returning when
    /// the handler does: writes it queued may still be committing, and
    /// the outcome is final only after [`Outcome::after_writes`] (the worker
    /// frees the handler slot in between).
    pub async fn run(&self, caps: &Arc<Capabilities>, plugin: &Arc<Plugin>, exec: Execution) -> Outcome {
        match &plugin.code {
            Code::Wasm(pre, footprint) => {
                // Wait for room in the pool rather than fail to instantiate.
                let _slots = self.capacity.reserve(*footprint).await;
                instance::run(&self.engine, pre, caps, &plugin.info, exec).await
            }
            Code::Native(handler) => native::execute(handler.as_ref(), caps, &plugin.info, exec).await,
        }
    }
}
