//! What a handler can do: the host side of `idem:handler/{store,effects,log}`.
//!
//! Shaped like wasmtime's `wasi-keyvalue`: [`Capabilities`] is what every
//! execution shares (the stores, the endpoints, the counters, the hooks);
//! [`ExecutionCaps`] is one execution's view of them (the plugin's grants
//! and limits, the message key, the claim whose fence every write presents,
//! the log budget, why the host stopped it). `ExecutionCaps` implements the
//! WIT host traits and [`add_to_linker`] wires them into any linker through
//! a closure from the store's state, so the runtime depends on the
//! capabilities and never the other way round. The native baseline calls
//! the same checked operations.
//!
//! Each operation checks the plugin's grants first (access-denied
//! otherwise), then its size limits, then does the work with the
//! execution's fence. A stale fence is never reported to the guest as an
//! error it could handle: the host traps the instance, so a fenced-out
//! execution stops where it is.

pub mod effects;
mod legacy;
mod log;
pub mod meter;
mod store;
pub mod writes;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker};

use crate::bindings::idem::handler::types::Message;
use crate::bindings::Handler;
use crate::claim::{ClaimRef, ClaimStore};
use crate::envelope::Envelope;
use crate::hooks::Hooks;
pub use crate::plugin::Grants;
use crate::plugin::PluginInfo;
use crate::stats::Counters;
use crate::store::DataStore;
use meter::GuestMeter;

/// Why the host stopped an instance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostAbort {
    /// The execution's claim was taken over.
    #[error("the claim was taken over by another worker (fence is stale)")]
    FenceLost,
    /// The guest used up its CPU budget.
    #[error("CPU deadline: the handler ran past limits.cpu_ms = {0} ms of guest time")]
    CpuDeadline(u64),
    /// Fault injection (the demo's simulated crashes).
    #[error("simulated worker crash")]
    SimulatedCrash,
    /// A write queued earlier in the execution (write-behind) failed; the
    /// handler was told it was queued, so it cannot go on.
    #[error("a store write queued earlier failed: {0}")]
    WriteFailed(String),
    /// The handler named a key no store can hold (a plugin bug, failed as
    /// a trap is).
    #[error("{0}")]
    Unstorable(String),
}

/// Shared by every execution of a pool.
pub struct Capabilities {
    /// The plugin data store.
    pub data: Arc<dyn DataStore>,
    /// The claim store (its journal records external call responses).
    pub claims: Arc<dyn ClaimStore>,
    /// Configured endpoints and the HTTP client.
    pub effects: effects::Endpoints,
    /// Counters.
    pub counters: Arc<Counters>,
    /// What tools hooked into the pipeline (none in production).
    pub hooks: Hooks,
}

/// What one execution is about.
#[derive(Debug, Clone)]
pub struct Execution {
    /// The message as delivered, shared (not copied) with the worker that
    /// settles it.
    pub envelope: Arc<Envelope>,
    /// The idempotency key.
    pub key: String,
    /// Attempt number, counted at claim time.
    pub attempt: u32,
    /// The claim (fence) every write presents; `None` when unguarded.
    pub claim: Option<ClaimRef>,
    /// Set by the heartbeat when the claim was taken over: the instance is
    /// interrupted at its next epoch check.
    pub interrupt: Arc<AtomicBool>,
    /// Its writes queued for the group commit and not yet committed
    /// (write-behind); settling waits for them.
    pub writes: Arc<writes::Writes>,
}

impl Execution {
    /// The WIT message handed to the handler: the one copy of the payload
    /// an execution makes.
    pub fn message(&self) -> Message {
        let e = &self.envelope;
        Message {
            id: e.id.clone(),
            key: self.key.clone(),
            attempt: self.attempt,
            headers: e.headers.clone(),
            payload: e.payload.clone(),
        }
    }
}

/// One execution's capabilities: what the WIT host traits are implemented
/// on.
pub struct ExecutionCaps {
    shared: Arc<Capabilities>,
    plugin: Arc<PluginInfo>,
    exec: Execution,
    /// The guest's CPU time (none for native handlers).
    meter: Option<Arc<GuestMeter>>,
    log_lines: u32,
    log_dropped: u32,
    /// External calls made (journal replays included).
    calls: u32,
    abort: Option<HostAbort>,
}

impl ExecutionCaps {
    /// Capabilities for one execution of `plugin`.
    pub fn new(shared: Arc<Capabilities>, plugin: Arc<PluginInfo>, exec: Execution) -> Self {
        ExecutionCaps {
            shared,
            plugin,
            exec,
            meter: None,
            log_lines: 0,
            log_dropped: 0,
            calls: 0,
            abort: None,
        }
    }

    /// The plugin running.
    pub fn plugin(&self) -> &PluginInfo {
        &self.plugin
    }

    /// The execution.
    pub fn execution(&self) -> &Execution {
        &self.exec
    }

    /// Why the host stopped the execution, if it did.
    pub fn abort(&self) -> Option<&HostAbort> {
        self.abort.as_ref()
    }

    /// Stop the execution: remembered, and returned as the trap to raise.
    pub fn stop(&mut self, why: HostAbort) -> HostAbort {
        self.abort = Some(why.clone());
        why
    }

    /// Charge the guest's CPU time to `meter` (host time excluded).
    pub fn with_meter(mut self, meter: Arc<GuestMeter>) -> Self {
        self.meter = Some(meter);
        self
    }

    /// Log lines dropped for being over the per-execution limit.
    pub fn log_dropped(&self) -> u32 {
        self.log_dropped
    }

    /// The guest calls a capability: its CPU time up to here is charged,
    /// and a spent budget stops it here.
    fn enter_host(&mut self) -> Result<(), HostAbort> {
        match &self.meter {
            Some(meter) if !meter.enter_host() => Err(self.stop(HostAbort::CpuDeadline(self.plugin.limits.cpu_ms))),
            _ => Ok(()),
        }
    }

    /// The capability returns to the guest.
    fn leave_host(&self) {
        if let Some(meter) = &self.meter {
            meter.leave_host();
        }
    }

    /// Access-denied message if the plugin may not use `collection`.
    fn collection_denied(&self, collection: &str) -> Option<String> {
        collection_denied(&self.plugin, collection)
    }
}

/// Access-denied message if `plugin` may not use `collection`.
fn collection_denied(plugin: &PluginInfo, collection: &str) -> Option<String> {
    if plugin.grants.collections.contains(collection) {
        return None;
    }
    Some(format!(
        "plugin {} may not use collection {collection:?}; grant it in plugins.{}.collections",
        plugin.name, plugin.name
    ))
}

/// Longest key a handler may write, in bytes.
pub const MAX_STORE_KEY_BYTES: usize = 1024;

/// Too-large message if a key or value exceeds `plugin`'s limits.
fn too_large(plugin: &PluginInfo, key: &str, value: &[u8]) -> Option<String> {
    let limit = plugin.limits.max_value_bytes;
    if value.len() > limit {
        return Some(format!("value of {} bytes exceeds limits.max_value_bytes = {limit}", value.len()));
    }
    if key.len() > MAX_STORE_KEY_BYTES {
        return Some(format!("key of {} bytes exceeds {MAX_STORE_KEY_BYTES} bytes", key.len()));
    }
    None
}

/// Why a store key cannot be stored, if it holds a NUL character:
/// Postgres refuses one in text, and a refused row would fail the whole
/// group-committed batch of every plugin's writes it rides in. Refused for
/// every store, so a plugin behaves alike on each.
fn unstorable(key: &str) -> Option<HostAbort> {
    key.contains('\0').then(|| {
        let shown = crate::text::truncate_utf8(key.to_string(), 64);
        HostAbort::Unstorable(format!(
            "store key {shown:?} contains a NUL character (U+0000), which no data store holds; use a key without it"
        ))
    })
}

/// Add `idem:handler/{types,store,effects,log}` to a linker whose store
/// state reaches an [`ExecutionCaps`] through `get`: version 0.2.0 and,
/// for components built against it, 0.1.0.
pub fn add_to_linker<T: Send + 'static>(linker: &mut Linker<T>, get: fn(&mut T) -> &mut ExecutionCaps) -> anyhow::Result<()> {
    Handler::add_to_linker::<T, HasSelf<ExecutionCaps>>(linker, get).map_err(|e| anyhow::anyhow!("{e:#}"))?;
    crate::bindings::v0_1::Handler::add_to_linker::<T, HasSelf<ExecutionCaps>>(linker, get).map_err(|e| anyhow::anyhow!("{e:#}"))
}

impl crate::bindings::idem::handler::types::Host for ExecutionCaps {}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::Limits;

    pub(crate) fn plugin(collections: &[&str], endpoints: &[&str]) -> PluginInfo {
        PluginInfo {
            name: "p".into(),
            version: "v1".into(),
            grants: Grants::new(collections.iter().copied(), endpoints.iter().copied()),
            limits: Limits {
                max_value_bytes: 16,
                ..Limits::default()
            },
            key_pointer: None,
            imports: Vec::new(),
            loaded_at: 0,
        }
    }

    #[test]
    fn a_collection_outside_the_grants_is_denied_with_the_setting_to_change() {
        let p = plugin(&["payments"], &[]);
        assert_eq!(collection_denied(&p, "payments"), None);
        let denied = collection_denied(&p, "orders").expect("denied");
        assert!(
            denied.contains("\"orders\"") && denied.contains("plugins.p.collections"),
            "{denied}"
        );
    }

    #[test]
    fn values_and_keys_are_bounded() {
        let p = plugin(&["c"], &[]);
        assert_eq!(too_large(&p, "k", &[0; 16]), None);
        let value = too_large(&p, "k", &[0; 17]).expect("value too large");
        assert!(
            value.contains("17 bytes") && value.contains("limits.max_value_bytes = 16"),
            "{value}"
        );
        let long_key = "k".repeat(MAX_STORE_KEY_BYTES + 1);
        assert_eq!(too_large(&p, &long_key[..MAX_STORE_KEY_BYTES], b""), None);
        assert!(too_large(&p, &long_key, b"").expect("key too large").contains("1025 bytes"));
    }

    #[test]
    fn a_nul_in_a_store_key_is_unstorable_and_named() {
        assert!(unstorable("order-17").is_none());
        let refused = unstorable("order\u{0}17").expect("refused").to_string();
        assert!(refused.contains("\"order\\017\"") && refused.contains("U+0000"), "{refused}");
    }
}
