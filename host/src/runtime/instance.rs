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

use super::Outcome;
use crate::bindings::idem::handler::types::{HandlerError, Message};
use crate::bindings::{v0_1, HandlerPre};
use crate::capabilities::meter::{GuestMeter, Metered};
use crate::capabilities::{Capabilities, Execution, ExecutionCaps, HostAbort};
use crate::plugin::PluginInfo;
use crate::text::{tail_chars, truncate_utf8};

/// Bytes of stdout/stderr kept per execution (a panic message lands here).
const STDIO_CAPACITY: usize = 64 * 1024;

/// Error text kept in a reason (a handler's, a host panic's) is cut to 4 KiB.
pub const MAX_ERROR_BYTES: usize = 4096;

/// A component pre-linked against the world version it was built for.
#[derive(Clone)]
pub(super) enum Pre {
    /// `idem:handler@0.2.0`: `handle` may return a result.
    Current(HandlerPre<HostState>),
    /// `idem:handler@0.1.0`: `handle` returns nothing.
    V0_1(v0_1::HandlerPre<HostState>),
}

impl Pre {
    /// The pre-linked component as the world it exports `handle` for.
    pub(super) fn new(pre: wasmtime::component::InstancePre<HostState>) -> wasmtime::Result<Self> {
        match HandlerPre::new(pre.clone()) {
            Ok(current) => Ok(Pre::Current(current)),
            Err(e) => v0_1::HandlerPre::new(pre).map(Pre::V0_1).map_err(|_| e),
        }
    }

    /// The world's version, as `idem plugin check` shows it.
    pub(super) fn world(&self) -> &'static str {
        match self {
            Pre::Current(_) => "idem:handler@0.2.0",
            Pre::V0_1(_) => "idem:handler@0.1.0",
        }
    }

    /// Instantiate into `store` and call `handle`, both within `timeout`
    /// (a component's start functions may call the host too). The outer
    /// error is the instantiation's, the middle one the call's (a trap).
    async fn call(
        &self,
        store: &mut Store<HostState>,
        meter: &Arc<GuestMeter>,
        timeout: Duration,
        msg: Message,
    ) -> Result<Result<Result<Option<Vec<u8>>, HandlerError>, Called>, wasmtime::Error> {
        // Instantiation and the call are metered as one future: one reading
        // of the CPU clock at each end of a poll, not one per stage.
        macro_rules! run {
            ($pre:expr, $msg:expr, $map:expr) => {{
                Metered::new(meter.clone(), async {
                    let run = async {
                        let instance = $pre.instantiate_async(&mut *store).await?;
                        Ok::<_, wasmtime::Error>(instance.call_handle(&mut *store, &$msg).await)
                    };
                    Ok(match tokio::time::timeout(timeout, run).await {
                        Ok(Ok(Ok(r))) => Ok($map(r)),
                        Ok(Ok(Err(e))) => Err(Called::Trap(e)),
                        Ok(Err(e)) => return Err(e),
                        Err(_) => Err(Called::Timeout),
                    })
                })
                .await
            }};
        }
        match self {
            Pre::Current(pre) => run!(pre, msg, |r| r),
            Pre::V0_1(pre) => {
                use v0_1::idem::handler::types as old;
                let msg = old::Message {
                    id: msg.id,
                    key: msg.key,
                    attempt: msg.attempt,
                    headers: msg.headers,
                    payload: msg.payload,
                };
                run!(pre, msg, |r: Result<(), old::HandlerError>| r.map(|()| None).map_err(|e| match e {
                    old::HandlerError::Transient(m) => HandlerError::Transient(m),
                    old::HandlerError::Permanent(m) => HandlerError::Permanent(m),
                }))
            }
        }
    }
}

/// How a call that did not return ended.
enum Called {
    Trap(wasmtime::Error),
    Timeout,
}

/// Per-store state: WASI plumbing, limits and the execution's capabilities.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
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

/// One memory budget per instance, however many linear memories its core
/// modules declare: a component with several memories shares the budget.
struct MemoryLimiter {
    max: usize,
    /// Bytes of every memory of the instance, together.
    total: usize,
    hit: bool,
}

impl MemoryLimiter {
    fn new(max: usize) -> Self {
        MemoryLimiter { max, total: 0, hit: false }
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let total = self.total.saturating_sub(current).saturating_add(desired);
        if total > self.max {
            self.hit = true;
            return Ok(false);
        }
        self.total = total;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// A wall clock stopped at the Unix epoch: handlers must not depend on time
/// (the monotonic clock is stopped too, see `world`).
struct FrozenClock;

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// Run one message through a pre-linked component in a fresh store.
pub(super) async fn run(engine: &Engine, pre: &Pre, shared: &Arc<Capabilities>, plugin: &Arc<PluginInfo>, exec: Execution) -> Outcome {
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
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build();
    let msg = exec.message();
    let meter = GuestMeter::new(limits.cpu_ms);
    let state = HostState {
        wasi,
        table: ResourceTable::new(),
        limiter: MemoryLimiter::new(limits.memory_bytes as usize),
        caps: ExecutionCaps::new(shared.clone(), plugin.clone(), exec).with_meter(meter.clone()),
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limiter);
    store.set_epoch_deadline(1);
    let tick_meter = meter.clone();
    store.epoch_deadline_callback(move |mut ctx| {
        let s = ctx.data_mut();
        if s.caps.execution().interrupt.load(Ordering::Relaxed) {
            return Err(s.caps.stop(HostAbort::FenceLost).into());
        }
        // Epoch callbacks run only in guest code: charge it, and stop it
        // once its budget is spent.
        tick_meter.charge();
        if tick_meter.exhausted() {
            let cpu_ms = s.caps.plugin().limits.cpu_ms;
            return Err(s.caps.stop(HostAbort::CpuDeadline(cpu_ms)).into());
        }
        Ok(UpdateDeadline::Yield(1))
    });

    let timeout = Duration::from_millis(limits.timeout_ms);
    let result = match pre.call(&mut store, &meter, timeout, msg).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(Called::Trap(e))) => Err(e),
        Ok(Err(Called::Timeout)) => {
            return Outcome::Trapped(format!(
                "timeout: the execution ran longer than limits.timeout_ms = {} (guest time plus host calls)",
                limits.timeout_ms
            ))
        }
        // Not a trap and not the limiter's refusal of the instance's
        // starting memory (as deterministic as a trap, and classified as
        // one, naming the limit).
        Err(e) if e.downcast_ref::<wasmtime::Trap>().is_none() && store.data().caps.abort().is_none() && !store.data().limiter.hit => {
            return Outcome::HostError(format!("cannot instantiate plugin {}: {e:#}", plugin.name));
        }
        Err(e) => return classify_trap(e, store.data(), &stderr),
    };
    let state = store.data();
    if state.caps.log_dropped() > 0 {
        tracing::warn!(plugin = %plugin.name, key = %state.caps.execution().key, dropped = state.caps.log_dropped(), "log lines over the limit were dropped");
    }
    match result {
        // An interpreter (Python's MemoryError, a JavaScript engine's
        // out-of-memory) can survive a refused memory grow and report it as
        // an error of its own: it is still the memory limit, and counts as a
        // trap, as it does for a Rust guest that aborts.
        Ok(Err(HandlerError::Transient(m) | HandlerError::Permanent(m))) if state.limiter.hit => Outcome::Trapped(truncate_utf8(
            format!(
                "memory limit: the instance tried to grow past limits.memory_bytes = {}; the handler then failed with: {m}",
                state.caps.plugin().limits.memory_bytes
            ),
            MAX_ERROR_BYTES,
        )),
        Ok(Ok(Some(result))) if result.len() > state.caps.plugin().limits.max_value_bytes => Outcome::Permanent(format!(
            "the handler's result of {} bytes exceeds limits.max_value_bytes = {}",
            result.len(),
            state.caps.plugin().limits.max_value_bytes
        )),
        Ok(Ok(result)) => Outcome::Done(result),
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
        // Not the plugin's fault: retried without counting a trap.
        Some(failed @ HostAbort::WriteFailed(_)) => return Outcome::Transient(failed.to_string()),
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

#[cfg(test)]
mod tests {
    use super::MemoryLimiter;
    use wasmtime::{Engine, Linker, Module, Store};

    /// Instantiate a core module with `memories` memories of `pages` 64 KiB
    /// pages each, under one 4-page budget.
    fn instantiate(memories: usize, pages: u32) -> (bool, bool) {
        let engine = Engine::default();
        // The binary of `(module (memory N) ...)`: a memory section only.
        let mut section = vec![memories as u8];
        for _ in 0..memories {
            section.extend([0x00, pages as u8]); // no maximum, `pages` minimum
        }
        let mut wasm = b"\0asm\x01\0\0\0".to_vec();
        wasm.extend([0x05, section.len() as u8]);
        wasm.extend(section);
        let module = Module::new(&engine, &wasm).unwrap();
        let mut store = Store::new(&engine, MemoryLimiter::new(4 << 16));
        store.limiter(|l| l);
        let ok = Linker::new(&engine).instantiate(&mut store, &module).is_ok();
        (ok, store.data().hit)
    }

    #[test]
    fn several_memories_share_one_budget() {
        assert_eq!(instantiate(1, 4), (true, false), "one memory within the budget");
        assert_eq!(instantiate(2, 2), (true, false), "two memories within the budget together");
        assert_eq!(instantiate(2, 3), (false, true), "two memories of 3 pages exceed a 4-page budget");
        assert_eq!(instantiate(4, 2), (false, true), "four memories of 2 pages exceed it");
    }
}
