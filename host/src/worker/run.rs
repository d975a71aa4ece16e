//! Running an admitted message: register it with the heartbeat, make the
//! data store refuse the previous owner on a takeover, run the handler in
//! the runtime, record its duration, and hand the outcome to settling.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tracing::Instrument;

use super::admit::Admission;
use super::Worker;
use crate::capabilities::Execution;
use crate::runtime::Outcome;
use crate::stats::Counters;

impl Worker {
    /// Run one admission to its settlement.
    pub(super) async fn execute(self: Arc<Self>, a: Admission) {
        Counters::inc(&self.counters.executions);
        let k = &a.candidate;
        let interrupt = Arc::new(AtomicBool::new(false));
        let registered = a.claim.as_ref().map(|claim| self.in_flight.register(claim, &k.receipt, &interrupt));
        let span = tracing::info_span!("message", plugin = %k.plugin.name, key = %k.key, attempt = a.attempt, fence = a.claim.as_ref().map(|c| c.fence));
        let exec = Execution {
            envelope: k.envelope.clone(),
            key: k.key.clone(),
            attempt: a.attempt,
            claim: a.claim.clone(),
            interrupt,
        };
        let started = std::time::Instant::now();
        let outcome = match &a.claim {
            // A takeover: make the data store refuse the previous owner first.
            Some(claim) if claim.fence > 1 => match self.backends.data.advance_fence(claim).await {
                Ok(()) => self.runtime.execute(&self.caps, &k.plugin, exec).instrument(span.clone()).await,
                Err(e) => Outcome::HostError(format!("cannot advance the fence in the data store: {e}")),
            },
            _ => self.runtime.execute(&self.caps, &k.plugin, exec).instrument(span.clone()).await,
        };
        self.durations.record(&k.plugin.name, started.elapsed().as_secs_f64());
        drop(registered);
        self.settle(a, outcome).instrument(span).await;
    }
}
