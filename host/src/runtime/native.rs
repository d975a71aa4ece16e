//! Handlers compiled into the host: the benchmarks' native baseline.
//!
//! A native handler runs through the same pipeline as a component (fetch,
//! claim, execute, settle) and reaches the store through the same checks
//! (grants, sizes, fences), so the difference between the two is the cost
//! of the sandbox: instantiation, the component-model boundary, guest code.
//! Native handlers are not a way to deploy handlers: they are not isolated.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::Outcome;
use crate::bindings::idem::handler::store::StoreError;
use crate::bindings::idem::handler::types::{HandlerError, Message};
use crate::capabilities::{Capabilities, Execution, ExecutionCaps, HostAbort};
use crate::plugin::PluginInfo;

/// A handler written in Rust and linked into the host.
#[async_trait]
pub trait NativeHandler: Send + Sync + 'static {
    /// Handle one message.
    async fn handle(&self, ctx: &mut NativeCtx, msg: &Message) -> Result<(), HandlerError>;
}

/// What a native handler can do: the store operations a component has,
/// through the same [`ExecutionCaps`] (grants, sizes, fences).
pub struct NativeCtx {
    caps: ExecutionCaps,
}

/// What a component sees as a trap, a native handler sees as an error it
/// cannot recover from; the execution's outcome says why.
fn stopped(why: HostAbort) -> StoreError {
    StoreError::Unavailable(why.to_string())
}

impl NativeCtx {
    /// `store.upsert`.
    pub async fn upsert(&mut self, collection: &str, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.caps
            .store_upsert(collection, key, value)
            .await
            .unwrap_or_else(|a| Err(stopped(a)))
    }

    /// `store.get`.
    pub async fn get(&mut self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.caps.store_get(collection, key).await.unwrap_or_else(|a| Err(stopped(a)))
    }
}

/// Run one message through a native handler.
pub(super) async fn execute(handler: &dyn NativeHandler, shared: &Arc<Capabilities>, plugin: &Arc<PluginInfo>, exec: Execution) -> Outcome {
    let msg = exec.message();
    let mut ctx = NativeCtx {
        caps: ExecutionCaps::new(shared.clone(), plugin.clone(), exec),
    };
    let timeout = Duration::from_millis(plugin.limits.timeout_ms);
    let result = match tokio::time::timeout(timeout, handler.handle(&mut ctx, &msg)).await {
        Ok(r) => r,
        Err(_) => return Outcome::Trapped(format!("timeout: ran longer than limits.timeout_ms = {}", plugin.limits.timeout_ms)),
    };
    match ctx.caps.abort() {
        Some(HostAbort::FenceLost) => return Outcome::FenceLost,
        Some(failed @ HostAbort::WriteFailed(_)) => return Outcome::Transient(failed.to_string()),
        Some(refused @ HostAbort::Unstorable(_)) => return Outcome::Trapped(refused.to_string()),
        _ => {}
    }
    match result {
        Ok(()) => Outcome::Done(None),
        Err(HandlerError::Transient(m)) => Outcome::Transient(m),
        Err(HandlerError::Permanent(m)) => Outcome::Permanent(m),
    }
}

/// The native twin of `plugins/grant-credits`: parse `{"user", "balance"}`
/// and upsert the balance into `credits`.
pub struct GrantCredits;

#[async_trait]
impl NativeHandler for GrantCredits {
    async fn handle(&self, ctx: &mut NativeCtx, msg: &Message) -> Result<(), HandlerError> {
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
    async fn handle(&self, _ctx: &mut NativeCtx, _msg: &Message) -> Result<(), HandlerError> {
        Ok(())
    }
}
