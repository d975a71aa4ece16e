//! Handlers compiled into the host: the benchmarks' native baseline.
//!
//! A native handler runs through the same pipeline as a component (fetch,
//! claim, execute, settle) and reaches the store through the same checks
//! (grants, sizes, fences), so the difference between the two is the cost
//! of the sandbox: instantiation, the component-model boundary, guest code.
//! Native handlers are not a way to deploy handlers: they are not isolated.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::bindings::idem::handler::store::StoreError;
use super::bindings::idem::handler::types::{HandlerError, Message};
use super::{Execution, Outcome, Plugin};
use crate::capabilities::{collection_denied, too_large, Capabilities};
use crate::stats::Counters;
use crate::store::DataError;

/// A handler written in Rust and linked into the host.
#[async_trait]
pub trait NativeHandler: Send + Sync + 'static {
    /// Handle one message.
    async fn handle(&self, ctx: &NativeCtx<'_>, msg: &Message) -> Result<(), HandlerError>;
}

/// What a native handler can do: the store operations a component has,
/// with the same checks.
pub struct NativeCtx<'a> {
    caps: &'a Capabilities,
    plugin: &'a Plugin,
    exec: &'a Execution,
    fence_lost: AtomicBool,
}

impl NativeCtx<'_> {
    fn failed(&self, e: DataError) -> StoreError {
        match e {
            DataError::FenceLost { .. } => {
                Counters::inc(&self.caps.counters.fence_rejections);
                self.fence_lost.store(true, Ordering::Relaxed);
                StoreError::Unavailable("the claim was taken over".into())
            }
            DataError::Unavailable(m) => StoreError::Unavailable(m),
        }
    }

    /// `store.upsert`.
    pub async fn upsert(&self, collection: &str, key: &str, value: &[u8]) -> Result<(), StoreError> {
        if let Some(m) = collection_denied(self.plugin, collection) {
            return Err(StoreError::AccessDenied(m));
        }
        if let Some(m) = too_large(self.plugin, key, value) {
            return Err(StoreError::TooLarge(m));
        }
        self.caps
            .data
            .upsert(self.exec.claim.as_ref(), collection, key, value)
            .await
            .map_err(|e| self.failed(e))
    }

    /// `store.get`.
    pub async fn get(&self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(m) = collection_denied(self.plugin, collection) {
            return Err(StoreError::AccessDenied(m));
        }
        self.caps.data.get(collection, key).await.map_err(|e| self.failed(e))
    }
}

/// Run one message through a native handler.
pub(super) async fn execute(handler: &dyn NativeHandler, caps: &Arc<Capabilities>, plugin: &Arc<Plugin>, exec: Execution) -> Outcome {
    let msg = Message {
        id: exec.msg_id.clone(),
        key: exec.key.clone(),
        attempt: exec.attempt,
        headers: exec.headers.clone(),
        payload: exec.payload.clone(),
    };
    let ctx = NativeCtx {
        caps,
        plugin,
        exec: &exec,
        fence_lost: AtomicBool::new(false),
    };
    let timeout = Duration::from_millis(plugin.limits.timeout_ms);
    let result = match tokio::time::timeout(timeout, handler.handle(&ctx, &msg)).await {
        Ok(r) => r,
        Err(_) => return Outcome::Trapped(format!("timeout: ran longer than limits.timeout_ms = {}", plugin.limits.timeout_ms)),
    };
    if ctx.fence_lost.load(Ordering::Relaxed) {
        return Outcome::FenceLost;
    }
    match result {
        Ok(()) => Outcome::Done,
        Err(HandlerError::Transient(m)) => Outcome::Transient(m),
        Err(HandlerError::Permanent(m)) => Outcome::Permanent(m),
    }
}

/// The native twin of `plugins/grant-credits`: parse `{"user", "balance"}`
/// and upsert the balance into `credits`.
pub struct GrantCredits;

#[async_trait]
impl NativeHandler for GrantCredits {
    async fn handle(&self, ctx: &NativeCtx<'_>, msg: &Message) -> Result<(), HandlerError> {
        #[derive(serde::Deserialize)]
        struct Grant {
            user: String,
            balance: u64,
        }
        let grant: Grant =
            serde_json::from_slice(&msg.payload).map_err(|e| HandlerError::Permanent(format!("payload is not the expected JSON: {e}")))?;
        let value = serde_json::to_vec(&grant.balance).expect("a number serializes");
        ctx.upsert("credits", &grant.user, &value).await.map_err(|e| match e {
            StoreError::Unavailable(m) => HandlerError::Transient(m),
            other => HandlerError::Permanent(format!("{other:?}")),
        })
    }
}

/// The native twin of `plugins/noop`: accept every message, touch nothing.
pub struct Noop;

#[async_trait]
impl NativeHandler for Noop {
    async fn handle(&self, _ctx: &NativeCtx<'_>, _msg: &Message) -> Result<(), HandlerError> {
        Ok(())
    }
}
