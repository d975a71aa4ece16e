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

/// One held delivery, as the heartbeat sees it.
struct Running {
    /// Its claim; `None` for a run without one (`outage_policy =
    /// run-unguarded` while the claim store is down): only the delivery's
    /// visibility is extended, and a shutdown only hands it back.
    claim: Option<ClaimRef>,
    receipt: String,
    /// Set when the lease was lost: the instance stops at its next epoch.
    interrupt: Arc<AtomicBool>,
    /// Its own task settles it from here (a guarded run that returned ok
    /// waits only for its batched confirm); a shutdown leaves it alone.
    finished: bool,
}

/// Deliveries held now (with their claims, where they have one), by
/// registration id.
#[derive(Default)]
pub(super) struct InFlight {
    running: Mutex<HashMap<u64, Running>>,
    next_id: AtomicU64,
    /// Set (under `running`'s lock) when a shutdown has taken the
    /// executions it releases: none is marked finished after that.
    closed: AtomicBool,
}

impl InFlight {
    /// Register a delivery (and its claim, unless it runs unguarded) from
    /// the moment it is admitted until the returned guard drops (when it
    /// is settled, or its task ends however it ends, a panic included), so
    /// a lease and a visibility are extended exactly while they are held.
    pub(super) fn register(self: &Arc<Self>, claim: Option<&ClaimRef>, receipt: &str, interrupt: &Arc<AtomicBool>) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            id,
            Running {
                claim: claim.cloned(),
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

    /// How many deliveries are held now.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    /// At the end of a shutdown's grace period: the claims (if any) and
    /// receipts held now by executions not marked finished (those are
    /// settled by their own tasks: queued for their confirm, or acked).
    /// From here on no execution is marked finished, so every execution
    /// is either in this list (released by the shutdown) or settled by its
    /// own task, never both and never neither.
    pub(super) fn close(&self) -> Vec<(Option<ClaimRef>, String)> {
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
    /// The execution is about to be settled by its own task (a guarded one
    /// that returned ok: queued for its confirm; an unguarded one: acked or
    /// handed back): its lease and visibility are still extended, but a
    /// shutdown leaves it to that task instead of releasing it. False once
    /// a shutdown has taken the executions it releases
    /// ([`InFlight::close`]): this one is among them and its task must not
    /// settle it.
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
        // Leases for the runs with a claim; visibility for every delivery.
        let (ids, claims, receipts): (Vec<u64>, Vec<ClaimRef>, Vec<String>) = {
            let map = self.in_flight.lock();
            let mut ids = Vec::with_capacity(map.len());
            let mut claims = Vec::with_capacity(map.len());
            let mut receipts = Vec::with_capacity(map.len());
            for (id, r) in map.iter() {
                if let Some(claim) = &r.claim {
                    ids.push(*id);
                    claims.push(claim.clone());
                }
                receipts.push(r.receipt.clone());
            }
            (ids, claims, receipts)
        };
        if receipts.is_empty() {
            return;
        }
        if !claims.is_empty() {
            self.extend_leases(&ids, &claims).await;
        }
        let refs: Vec<&str> = receipts.iter().map(String::as_str).collect();
        if let Err(e) = self.backends.broker.extend(&refs, self.options.visibility).await {
            tracing::warn!(error = %e, "visibility extension failed");
        }
    }

    /// Extend the leases of `claims` (registered as `ids`); interrupt the
    /// executions whose lease was lost.
    async fn extend_leases(&self, ids: &[u64], claims: &[ClaimRef]) {
        let lease_ms = self.options.lease.as_millis() as i64;
        match self.backends.claims.extend(claims, lease_ms, self.backends.clock.now_ms()).await {
            Ok(held) => {
                let map = self.in_flight.lock();
                for ((ok, id), claim) in held.iter().zip(ids).zip(claims) {
                    if *ok {
                        Counters::inc(&self.counters.lease_extensions);
                    } else if let Some(r) = map.get(id).filter(|r| !r.finished) {
                        // Still running, yet the lease is gone: taken over.
                        // (A finished one's claim may just have been
                        // confirmed; if it was taken over, its confirm is
                        // refused and says so.)
                        tracing::warn!(plugin = %claim.plugin, key = %claim.key, fence = claim.fence, "lease lost to another worker; interrupting the execution");
                        r.interrupt.store(true, Ordering::Relaxed);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "lease extension failed; will retry at the next heartbeat"),
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
        let a = registry.register(Some(&claim("a")), "r-a", &interrupt);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _b = registry.register(Some(&claim("b")), "r-b", &interrupt);
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
        let (done, running, unguarded) = (
            registry.register(Some(&claim("done")), "r-done", &interrupt),
            registry.register(Some(&claim("running")), "r-running", &interrupt),
            registry.register(None, "r-unguarded", &interrupt),
        );
        assert!(done.finished(), "before the shutdown, a finished execution may be queued");
        assert_eq!(registry.len(), 3, "a finished execution keeps its lease extended");
        let mut released = registry.close();
        released.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            released,
            vec![(Some(claim("running")), "r-running".to_string()), (None, "r-unguarded".to_string()),],
            "the finished one is left to its confirm; a run without a claim is handed back too"
        );
        assert!(!running.finished(), "after it, one the shutdown releases is not queued too");
        assert!(!unguarded.finished(), "nor acked by its own task");
        drop((done, running, unguarded));
        assert_eq!(registry.len(), 0);
    }
}
