//! Running an admitted message: register it with the heartbeat, run the
//! handler in the runtime, record its duration, and hand the outcome to
//! settling.

use std::sync::Arc;

use tracing::Instrument;

use super::admit::Admission;
use super::Worker;
use crate::capabilities::Execution;
use crate::stats::Counters;

impl Worker {
    /// Run one admission to its settlement.
    pub(super) async fn execute(self: Arc<Self>, a: Admission) {
        Counters::inc(&self.counters.executions);
        let k = &a.candidate;
        let span = tracing::info_span!("message", plugin = %k.plugin.name, key = %k.key, attempt = a.attempt, fence = a.claim.as_ref().map(|c| c.fence));
        let exec = Execution {
            envelope: k.envelope.clone(),
            key: k.key.clone(),
            attempt: a.attempt,
            claim: a.claim.clone(),
            interrupt: a.interrupt.clone(),
        };
        let started = std::time::Instant::now();
        let outcome = self.runtime.execute(&self.caps, &k.plugin, exec).instrument(span.clone()).await;
        self.durations.record(&k.plugin.name, started.elapsed().as_secs_f64());
        self.settle(a, outcome).instrument(span).await;
    }
}
