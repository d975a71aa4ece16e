//! One execution of a component: a fresh store and instance per message,
//! with its memory limit, CPU budget (epoch deadline), wall-clock timeout
//! and captured stdio; and the outcome, with a reason an operator can act
//! on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::{Outcome, EPOCH_TICK};
use crate::bindings::idem::handler::types::HandlerError;
use crate::bindings::HandlerPre;
use crate::capabilities::{Capabilities, Execution, ExecutionCaps, HostAbort};
use crate::plugin::PluginInfo;
use crate::text::{tail_chars, truncate_utf8};

/// Bytes of stdout/stderr kept per execution (a panic message lands here).
const STDIO_CAPACITY: usize = 64 * 1024;

/// Handler-supplied error text is kept to 4 KiB.
const MAX_ERROR_BYTES: usize = 4096;

/// Per-store state: WASI plumbing, limits and the execution's capabilities.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    cpu_ticks_left: u64,
    pub(super) caps: ExecutionCaps,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl HostState {
    /// The store's resource table (where `wasi:io` resources live).
    pub(super) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    /// The WASI context (for the random sources).
    pub(super) fn wasi(&mut self) -> &mut WasiCtx {
        &mut self.wasi
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

/// Run one message through a pre-linked component in a fresh store.
pub(super) async fn run(
    engine: &Engine,
    pre: &HandlerPre<HostState>,
    shared: &Arc<Capabilities>,
    plugin: &Arc<PluginInfo>,
    exec: Execution,
) -> Outcome {
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
    let msg = exec.message();
    let state = HostState {
        wasi,
        table: ResourceTable::new(),
        limiter: MemoryLimiter {
            max: limits.memory_bytes as usize,
            hit: false,
        },
        cpu_ticks_left: (limits.cpu_ms / EPOCH_TICK.as_millis() as u64).max(1),
        caps: ExecutionCaps::new(shared.clone(), plugin.clone(), exec),
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limiter);
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut ctx| {
        let s = ctx.data_mut();
        if s.caps.execution().interrupt.load(Ordering::Relaxed) {
            return Err(s.caps.stop(HostAbort::FenceLost).into());
        }
        if s.cpu_ticks_left == 0 {
            let cpu_ms = s.caps.plugin().limits.cpu_ms;
            return Err(s.caps.stop(HostAbort::CpuDeadline(cpu_ms)).into());
        }
        if !s.caps.take_in_host() {
            s.cpu_ticks_left -= 1;
        }
        Ok(UpdateDeadline::Yield(1))
    });

    let instance = match pre.instantiate_async(&mut store).await {
        Ok(i) => i,
        Err(e) if e.downcast_ref::<wasmtime::Trap>().is_none() && store.data().caps.abort().is_none() => {
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
    if state.caps.log_dropped() > 0 {
        tracing::warn!(plugin = %plugin.name, key = %state.caps.execution().key, dropped = state.caps.log_dropped(), "log lines over the limit were dropped");
    }
    match result {
        Ok(Ok(())) => Outcome::Done,
        Ok(Err(HandlerError::Transient(m))) => Outcome::Transient(truncate_utf8(m, MAX_ERROR_BYTES)),
        Ok(Err(HandlerError::Permanent(m))) => Outcome::Permanent(truncate_utf8(m, MAX_ERROR_BYTES)),
        Err(err) => classify_trap(err, state, &stderr),
    }
}

/// Turn a wasmtime error into an outcome with a reason an operator can act on.
fn classify_trap(err: wasmtime::Error, state: &HostState, stderr: &MemoryOutputPipe) -> Outcome {
    let abort = state
        .caps
        .abort()
        .cloned()
        .or_else(|| err.chain().find_map(|c| c.downcast_ref::<HostAbort>().cloned()));
    match abort {
        Some(HostAbort::FenceLost) => return Outcome::FenceLost,
        Some(HostAbort::SimulatedCrash) => return Outcome::Crashed,
        Some(other) => return Outcome::Trapped(other.to_string()),
        None => {}
    }
    let limits = &state.caps.plugin().limits;
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
        reason.push_str(": ");
        reason.push_str(tail_chars(&text, 2000));
    }
    Outcome::Trapped(reason)
}
