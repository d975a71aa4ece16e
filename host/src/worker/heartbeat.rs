//! Leases follow the work (G5): the registry of claims this worker holds,
//! from the moment each is taken until it is settled (through the wait for
//! a batched confirm), and the heartbeat that extends their leases and
//! broker visibility.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Worker;
use crate::claim::ClaimRef;
use crate::stats::Counters;

/// One held claim, as the heartbeat sees it.
struct Running {
    claim: ClaimRef,
    receipt: String,
    /// Set when the lease was lost: the instance stops at its next epoch.
    interrupt: Arc<AtomicBool>,
    /// The handler returned ok: only the batched confirm is left.
    finished: bool,
}

/// Claims held now, by registration id.
#[derive(Default)]
pub(super) struct InFlight {
    running: Mutex<HashMap<u64, Running>>,
    next_id: AtomicU64,
    /// Set (under `running`'s lock) when a shutdown has taken the
    /// executions it releases: none is marked finished after that.
    closed: AtomicBool,
}

impl InFlight {
    /// Register a claim from the moment it is taken until the returned
    /// guard drops (when it is settled, or its task ends however it ends,
    /// a panic included), so a lease is extended exactly while the claim
    /// is held.
    pub(super) fn register(self: &Arc<Self>, claim: &ClaimRef, receipt: &str, interrupt: &Arc<AtomicBool>) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            id,
            Running {
                claim: claim.clone(),
                receipt: receipt.to_string(),
                interrupt: interrupt.clone(),
                finished: false,
            },
        );
        Registered {
            registry: self.clone(),
            id,
        }
    }

    /// How many claims are held now.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    /// At the end of a shutdown's grace period: the claims and receipts held
    /// now by executions not marked finished (those are queued for their
    /// confirm and left to it). From here on no execution is marked
    /// finished, so every execution is either in this list (released by the
    /// shutdown) or queued for its confirm, never both and never neither.
    pub(super) fn close(&self) -> Vec<(ClaimRef, String)> {
        let map = self.lock();
        self.closed.store(true, Ordering::Relaxed);
        map.values()
            .filter(|r| !r.finished)
            .map(|r| (r.claim.clone(), r.receipt.clone()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Running>> {
        self.running.lock().expect("in-flight map poisoned")
    }
}

/// Removes a claim from the registry when dropped.
pub(super) struct Registered {
    registry: Arc<InFlight>,
    id: u64,
}

impl Registered {
    /// The handler returned ok and the execution is about to be queued for
    /// its confirm: its lease is still extended, but a shutdown leaves it to
    /// the confirm instead of releasing it for a retry. False once a
    /// shutdown has taken the executions it releases ([`InFlight::close`]):
    /// this one is among them and must not be queued.
    pub(super) fn finished(&self) -> bool {
        let mut map = self.registry.lock();
        if self.registry.closed.load(Ordering::Relaxed) {
            return false;
        }
        if let Some(r) = map.get_mut(&self.id) {
            r.finished = true;
        }
        true
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut map) = self.registry.running.lock() {
            map.remove(&self.id);
        }
    }
}

impl Worker {
    /// Every `every`, extend the lease and visibility of what runs, and
    /// interrupt what lost its lease, until `stop`.
    pub(super) async fn heartbeat_loop(&self, every: Duration, stop: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.beat().await;
        }
    }

    async fn beat(&self) {
        let (ids, claims, receipts): (Vec<u64>, Vec<ClaimRef>, Vec<String>) = {
            let map = self.in_flight.lock();
            let mut ids = Vec::with_capacity(map.len());
            let mut claims = Vec::with_capacity(map.len());
            let mut receipts = Vec::with_capacity(map.len());
            for (id, r) in map.iter() {
                ids.push(*id);
                claims.push(r.claim.clone());
                receipts.push(r.receipt.clone());
            }
            (ids, claims, receipts)
        };
        if claims.is_empty() {
            return;
        }
        let lease_ms = self.options.lease.as_millis() as i64;
        match self.backends.claims.extend(&claims, lease_ms, self.backends.clock.now_ms()).await {
            Ok(held) => {
                let map = self.in_flight.lock();
                for ((ok, id), claim) in held.iter().zip(&ids).zip(&claims) {
                    if *ok {
                        Counters::inc(&self.counters.lease_extensions);
                    } else if let Some(r) = map.get(id) {
                        // Still running, yet the lease is gone: taken over.
                        tracing::warn!(plugin = %claim.plugin, key = %claim.key, fence = claim.fence, "lease lost to another worker; interrupting the execution");
                        r.interrupt.store(true, Ordering::Relaxed);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "lease extension failed; will retry at the next heartbeat"),
        }
        let refs: Vec<&str> = receipts.iter().map(String::as_str).collect();
        if let Err(e) = self.backends.broker.extend(&refs, self.options.visibility).await {
            tracing::warn!(error = %e, "visibility extension failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(key: &str) -> ClaimRef {
        ClaimRef {
            plugin: "p".into(),
            key: key.into(),
            fence: 1,
        }
    }

    #[test]
    fn an_execution_leaves_the_registry_however_it_ends() {
        let registry = Arc::new(InFlight::default());
        let interrupt = Arc::new(AtomicBool::new(false));
        let a = registry.register(&claim("a"), "r-a", &interrupt);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _b = registry.register(&claim("b"), "r-b", &interrupt);
            assert_eq!(registry.len(), 2);
            panic!("the handler task panicked");
        }));
        assert!(outcome.is_err());
        assert_eq!(registry.len(), 1, "the panicked task's claim left the registry");
        drop(a);
        assert_eq!(registry.len(), 0);
    }

    #[test]
    fn a_shutdown_releases_exactly_the_executions_not_queued_for_their_confirm() {
        let registry = Arc::new(InFlight::default());
        let interrupt = Arc::new(AtomicBool::new(false));
        let (done, running) = (
            registry.register(&claim("done"), "r-done", &interrupt),
            registry.register(&claim("running"), "r-running", &interrupt),
        );
        assert!(done.finished(), "before the shutdown, a finished execution may be queued");
        assert_eq!(registry.len(), 2, "a finished execution keeps its lease extended");
        assert_eq!(
            registry.close(),
            vec![(claim("running"), "r-running".to_string())],
            "the finished one is left to its confirm"
        );
        assert!(!running.finished(), "after it, one the shutdown releases is not queued too");
        drop((done, running));
        assert_eq!(registry.len(), 0);
    }
}
