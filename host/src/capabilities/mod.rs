//! What a handler can do: the host side of `idem:handler/{store,effects,log}`.
//!
//! Each operation checks the plugin's grants first (access-denied otherwise),
//! then its size limits, then does the work with the execution's fence. A
//! stale fence is never reported to the guest as an error it could handle:
//! the host traps the instance, so a fenced-out execution stops where it is.

pub mod effects;

use std::collections::BTreeSet;
use std::sync::Arc;

use tracing::Level;

use crate::claim::ClaimStore;
use crate::runtime::bindings::idem::handler::{effects as wit_effects, log as wit_log, store as wit_store, types as wit_types};
use crate::runtime::{HostState, Plugin};
use crate::stats::Counters;
use crate::store::{DataError, DataStore, Inserted};

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
}

/// Collections and endpoints a plugin may use.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Collection names.
    pub collections: BTreeSet<String>,
    /// Endpoint names.
    pub endpoints: BTreeSet<String>,
}

impl Grants {
    /// Grants from lists of names.
    pub fn new<S: Into<String>>(collections: impl IntoIterator<Item = S>, endpoints: impl IntoIterator<Item = S>) -> Self {
        Grants {
            collections: collections.into_iter().map(Into::into).collect(),
            endpoints: endpoints.into_iter().map(Into::into).collect(),
        }
    }
}

/// Decides whether an execution "crashes" right after a journaled step:
/// (plugin, key, attempt, step) → crash?
pub type CrashInjector = Arc<dyn Fn(&str, &str, u32, &str) -> bool + Send + Sync>;

/// Shared by every execution of a runtime.
pub struct Capabilities {
    /// The plugin data store.
    pub data: Arc<dyn DataStore>,
    /// The claim store (its journal records external call responses).
    pub claims: Arc<dyn ClaimStore>,
    /// Configured endpoints and the HTTP client.
    pub effects: effects::Endpoints,
    /// Counters.
    pub counters: Arc<Counters>,
    /// Fault injection, for the demo.
    pub crash_injector: Option<CrashInjector>,
}

/// Access-denied message if `plugin` may not use `collection`.
pub(crate) fn collection_denied(plugin: &Plugin, collection: &str) -> Option<String> {
    if plugin.grants.collections.contains(collection) {
        return None;
    }
    Some(format!(
        "plugin {} may not use collection {collection:?}; grant it in plugins.{}.collections",
        plugin.name, plugin.name
    ))
}

/// Too-large message if a key or value exceeds `plugin`'s limits.
pub(crate) fn too_large(plugin: &Plugin, key: &str, value: &[u8]) -> Option<String> {
    let limit = plugin.limits.max_value_bytes;
    if value.len() > limit {
        return Some(format!("value of {} bytes exceeds limits.max_value_bytes = {limit}", value.len()));
    }
    if key.len() > 1024 {
        return Some(format!("key of {} bytes exceeds 1024 bytes", key.len()));
    }
    None
}

impl HostState {
    fn collection_denied(&self, collection: &str) -> Option<String> {
        collection_denied(&self.plugin, collection)
    }

    fn too_large(&self, key: &str, value: &[u8]) -> Option<String> {
        too_large(&self.plugin, key, value)
    }

    /// Map a data-store failure: a stale fence traps, an outage is reported.
    fn data_error(&mut self, e: DataError) -> wasmtime::Result<wit_store::StoreError> {
        match e {
            DataError::FenceLost { .. } => {
                Counters::inc(&self.caps.counters.fence_rejections);
                tracing::warn!(plugin = %self.plugin.name, key = %self.exec.key, "store write refused: fence is stale, interrupting the instance");
                self.abort = Some(HostAbort::FenceLost);
                Err(HostAbort::FenceLost.into())
            }
            DataError::Unavailable(m) => Ok(wit_store::StoreError::Unavailable(m)),
        }
    }
}

impl wit_types::Host for HostState {}

impl wit_store::Host for HostState {
    async fn insert_unique(
        &mut self,
        collection: String,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<wit_store::Inserted, wit_store::StoreError>> {
        self.in_host = true;
        if let Some(m) = self.collection_denied(&collection) {
            return Ok(Err(wit_store::StoreError::AccessDenied(m)));
        }
        if let Some(m) = self.too_large(&key, &value) {
            return Ok(Err(wit_store::StoreError::TooLarge(m)));
        }
        let caps = self.caps.clone();
        match caps.data.insert_unique(self.exec.claim.as_ref(), &collection, &key, &value).await {
            Ok(Inserted::Inserted) => Ok(Ok(wit_store::Inserted::Inserted)),
            Ok(Inserted::Existed(v)) => Ok(Ok(wit_store::Inserted::Existed(v))),
            Err(e) => self.data_error(e).map(Err),
        }
    }

    async fn upsert(&mut self, collection: String, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), wit_store::StoreError>> {
        self.in_host = true;
        if let Some(m) = self.collection_denied(&collection) {
            return Ok(Err(wit_store::StoreError::AccessDenied(m)));
        }
        if let Some(m) = self.too_large(&key, &value) {
            return Ok(Err(wit_store::StoreError::TooLarge(m)));
        }
        let caps = self.caps.clone();
        match caps.data.upsert(self.exec.claim.as_ref(), &collection, &key, &value).await {
            Ok(()) => Ok(Ok(())),
            Err(e) => self.data_error(e).map(Err),
        }
    }

    async fn get(&mut self, collection: String, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, wit_store::StoreError>> {
        self.in_host = true;
        if let Some(m) = self.collection_denied(&collection) {
            return Ok(Err(wit_store::StoreError::AccessDenied(m)));
        }
        let caps = self.caps.clone();
        match caps.data.get(&collection, &key).await {
            Ok(v) => Ok(Ok(v)),
            Err(e) => self.data_error(e).map(Err),
        }
    }

    async fn delete(&mut self, collection: String, key: String) -> wasmtime::Result<Result<bool, wit_store::StoreError>> {
        self.in_host = true;
        if let Some(m) = self.collection_denied(&collection) {
            return Ok(Err(wit_store::StoreError::AccessDenied(m)));
        }
        let caps = self.caps.clone();
        match caps.data.delete(self.exec.claim.as_ref(), &collection, &key).await {
            Ok(existed) => Ok(Ok(existed)),
            Err(e) => self.data_error(e).map(Err),
        }
    }
}

impl wit_effects::Host for HostState {
    async fn call(
        &mut self,
        endpoint: String,
        step: String,
        request: Vec<u8>,
    ) -> wasmtime::Result<Result<Vec<u8>, wit_effects::CallError>> {
        self.in_host = true;
        let result = effects::call(self, endpoint, step, request).await;
        self.in_host = true;
        result
    }
}

impl wit_log::Host for HostState {
    async fn log(&mut self, level: wit_log::Level, message: String) -> wasmtime::Result<()> {
        let limits = &self.plugin.limits;
        if self.log_lines >= limits.max_log_lines {
            self.log_dropped += 1;
            return Ok(());
        }
        self.log_lines += 1;
        let mut message = message;
        if message.len() > limits.max_log_line_bytes {
            let mut cut = limits.max_log_line_bytes;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str("… [truncated]");
        }
        let (plugin, key, attempt) = (&self.plugin.name, &self.exec.key, self.exec.attempt);
        macro_rules! emit {
            ($lvl:expr) => {
                tracing::event!(target: "idem::plugin", $lvl, plugin = %plugin, key = %key, attempt, "{message}")
            };
        }
        match level {
            wit_log::Level::Trace => emit!(Level::TRACE),
            wit_log::Level::Debug => emit!(Level::DEBUG),
            wit_log::Level::Info => emit!(Level::INFO),
            wit_log::Level::Warn => emit!(Level::WARN),
            wit_log::Level::Error => emit!(Level::ERROR),
        }
        Ok(())
    }
}
