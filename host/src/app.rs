//! Wiring a configuration into a running pool.

use std::sync::Arc;

use anyhow::{Context, Result};
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backend::{self, Backends};
use crate::capabilities::{effects::Endpoints, Capabilities, Grants};
use crate::config::Config;
use crate::hooks::Hooks;
use crate::runtime::footprint::Footprint;
use crate::runtime::native::NativeHandler;
use crate::runtime::{Runtime, RuntimeOptions};
use crate::stats::Counters;
use crate::worker::{Worker, WorkerOptions};

/// A running worker pool.
pub struct Pool {
    /// Its backends.
    pub backends: Backends,
    /// Its runtime and loaded plugins.
    pub runtime: Arc<Runtime>,
    /// The worker.
    pub worker: Arc<Worker>,
    /// Its counters.
    pub counters: Arc<Counters>,
    /// Cancel to stop fetching; [`Pool::join`] then waits for running handlers.
    pub shutdown: CancellationToken,
    task: JoinHandle<Result<()>>,
    sweeper: JoinHandle<()>,
    recorder: (JoinHandle<()>, CancellationToken),
}

/// Runtime options that fit a configuration.
pub fn runtime_options(config: &Config) -> RuntimeOptions {
    let max_memory = config
        .plugins
        .keys()
        .map(|p| config.limits_for(p).memory_bytes)
        .chain(std::iter::once(config.limits.memory_bytes))
        .max()
        .unwrap_or(config.limits.memory_bytes);
    // Each slot sized for the largest component configured; a file that
    // cannot be read here is reported when it is loaded.
    let per_instance = config
        .plugins
        .values()
        .filter_map(|p| crate::plugin::read_component(&p.path).ok())
        .filter_map(|bytes| Footprint::of(&bytes).ok())
        .fold(Footprint::SMALL, Footprint::max);
    RuntimeOptions {
        max_instances: (config.worker.concurrency as u32 + 8).max(16),
        max_memory_bytes: max_memory,
        per_instance,
        compile_cache: Some(config.worker.compile_cache_dir.clone().unwrap_or_else(|| {
            let mut dir = config.database.path.clone().into_os_string();
            dir.push("-compiled");
            dir.into()
        })),
    }
}

/// A runtime for compiling and checking components only.
pub fn inspection_runtime() -> Result<Arc<Runtime>> {
    inspection_runtime_with(Footprint::SMALL, None)
}

/// A runtime for compiling and checking components as large as
/// `per_instance`, keeping compiled components in `compile_cache`.
pub fn inspection_runtime_with(per_instance: Footprint, compile_cache: Option<std::path::PathBuf>) -> Result<Arc<Runtime>> {
    Ok(Arc::new(Runtime::new(RuntimeOptions {
        max_instances: 2,
        per_instance,
        compile_cache,
        ..Default::default()
    })?))
}

/// Load every configured plugin into `runtime`.
pub async fn load_plugins(config: &Config, runtime: &Arc<Runtime>) -> Result<()> {
    for (name, p) in &config.plugins {
        let grants = Grants::new(p.collections.iter().cloned(), p.endpoints.iter().cloned());
        let plugin = runtime
            .load_file(name, &p.path, grants, config.limits_for(name), p.key_pointer.clone())
            .await?;
        tracing::info!(plugin = %name, version = %plugin.version, path = %p.path.display(), "plugin loaded");
    }
    Ok(())
}

impl Pool {
    /// Open the backends, load the plugins and start consuming.
    pub async fn start(config: &Config) -> Result<Pool> {
        Self::start_with(config, WorkerOptions::from_config(config), Hooks::default()).await
    }

    /// [`Pool::start`] with explicit worker options and the tools' hooks.
    pub async fn start_with(config: &Config, options: WorkerOptions, hooks: Hooks) -> Result<Pool> {
        Self::start_native(config, options, hooks, Vec::new()).await
    }

    /// [`Pool::start_with`], with some plugins served by native handlers
    /// instead of their components (the benchmarks' baseline). A native
    /// handler takes its plugin's grants and limits from the configuration.
    pub async fn start_native(
        config: &Config,
        options: WorkerOptions,
        hooks: Hooks,
        natives: Vec<(String, Arc<dyn NativeHandler>)>,
    ) -> Result<Pool> {
        let mut backends = backend::open(config).await?;
        if hooks.wall_clock_offset_ms != 0 {
            backends.clock = crate::clock::StoreClock::start(backends.admin.clone(), hooks.wall_clock_offset_ms)
                .await
                .map_err(|e| anyhow::anyhow!("cannot read the claim store's clock: {e}"))?;
        }
        for (name, p) in &config.plugins {
            crate::claim::check_key_pointer(backends.admin.as_ref(), name, p.key_pointer.as_deref()).await?;
        }
        let runtime = Arc::new(Runtime::new(runtime_options(config))?);
        let mut components = config.clone();
        for (name, handler) in natives {
            let grants = components
                .plugins
                .remove(&name)
                .map(|p| Grants::new(p.collections, p.endpoints))
                .unwrap_or_default();
            runtime.install_native(&name, handler, grants, config.limits_for(&name));
        }
        load_plugins(&components, &runtime).await?;
        let counters = Arc::new(Counters::default());
        let caps = Arc::new(Capabilities {
            data: backends.data.clone(),
            claims: backends.claims.clone(),
            effects: Endpoints::new(&config.namespace, config.endpoints.clone()).context("effects")?,
            counters: counters.clone(),
            hooks,
        });
        let worker = Worker::new(backends.clone(), runtime.clone(), caps, options);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(worker.clone().run(shutdown.clone()));
        let sweeper = tokio::spawn(crate::retention::sweep_loop(
            backends.clone(),
            config.retention.clone(),
            shutdown.clone(),
        ));
        let recorded = CancellationToken::new();
        let recorder = tokio::spawn(crate::activity::record(
            backends.admin.clone(),
            backends.clock.clone(),
            counters.clone(),
            recorded.clone(),
        ));
        Ok(Pool {
            backends,
            runtime,
            worker,
            counters,
            shutdown,
            task,
            sweeper,
            recorder: (recorder, recorded),
        })
    }

    /// Wait until the pool has stopped (after `shutdown` is cancelled).
    pub async fn join(self) -> Result<()> {
        let worker = self.task.await.context("worker task panicked");
        // The last counts, once nothing runs any more.
        self.recorder.1.cancel();
        self.recorder.0.await.context("activity recorder panicked")?;
        let worker = worker?;
        self.sweeper.await.context("retention sweeper panicked")?;
        worker
    }

    /// Stop fetching and wait for running handlers.
    pub async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.join().await
    }
}

/// What `idem stats` reports.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Stats {
    /// Deliveries not yet acked (queued or in flight).
    pub pending: u64,
    /// Claims held by a running execution.
    pub in_flight: u64,
    /// Claims waiting for a retry.
    pub retry: u64,
    /// Messages done.
    pub done: u64,
    /// Dead-letter records.
    pub dead_lettered: u64,
    /// Claims kept for duplicate detection (done and dead), until the
    /// retention sweeper removes them.
    pub settled_claims: u64,
    /// Journaled external-call responses.
    pub journal_entries: u64,
    /// `pending` per part of the broker, where it has parts (Kafka: the
    /// consumer group's lag per `topic/partition`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backlog: Vec<(String, u64)>,
    /// What the namespace's workers did in the last hour (done, duplicates
    /// suppressed, busy redeliveries, retries, dead letters).
    pub last_hour: crate::activity::Minute,
}

/// Read the counts from the backends.
pub async fn stats(backends: &Backends) -> Result<Stats> {
    let backlog = backends.broker.backlog().await?;
    let pending = if backlog.is_empty() {
        backends.broker.pending().await?
    } else {
        backlog.iter().map(|(_, n)| n).sum()
    };
    let c = backends.admin.counts().await?;
    let last_hour = crate::activity::last_hour(backends.admin.as_ref(), backends.clock.now_ms())
        .await?
        .total;
    Ok(Stats {
        last_hour,
        pending,
        in_flight: c.running,
        retry: c.retry,
        done: c.done,
        dead_lettered: c.dead_letters,
        settled_claims: c.done + c.dead,
        journal_entries: c.journal,
        backlog,
    })
}
