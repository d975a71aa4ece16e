//! Running an admitted message: run the handler in the runtime, free its
//! handler slot as soon as the handler returns, wait for the writes it
//! queued (write-behind), and hand the outcome to settling.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use super::admit::Admission;
use super::Worker;
use crate::capabilities::Execution;
use crate::runtime::{Outcome, MAX_ERROR_BYTES};
use crate::stats::Counters;
use crate::text::truncate_utf8;

/// What a message holds while its handler runs.
pub(super) struct Held {
    /// Its handler slot.
    pub slot: OwnedSemaphorePermit,
    /// Its place in hand, taken when it was fetched.
    pub place: OwnedSemaphorePermit,
    /// The places of messages settling, one of which it takes when its
    /// handler returns.
    pub settling: Arc<Semaphore>,
}

impl Worker {
    /// Run one admission to its settlement.
    pub(super) async fn execute(self: Arc<Self>, a: Admission, held: Held) {
        Counters::inc(&self.counters.executions);
        let k = &a.candidate;
        let span = tracing::info_span!("message", plugin = %k.plugin.name, key = %k.key, attempt = a.attempt, fence = a.claim.as_ref().map(|c| c.fence));
        let exec = Execution {
            envelope: k.envelope.clone(),
            key: k.key.clone(),
            attempt: a.attempt,
            claim: a.claim.clone(),
            interrupt: a.interrupt.clone(),
            writes: Default::default(),
        };
        let writes = exec.writes.clone();
        let started = std::time::Instant::now();
        // A panic in the host while the handler runs (a host function, the
        // runtime) is a host error, settled as any other: retried without
        // counting a trap (the plugin is not at fault), dead-lettered once
        // `retry.max_attempts` are spent. Unwinding the task instead would
        // leave its delivery and claim held until their timeouts, and on
        // Kafka the partition's commits behind it.
        let run = AssertUnwindSafe(self.runtime.run(&self.caps, &k.plugin, exec)).catch_unwind();
        let outcome = run.instrument(span.clone()).await.unwrap_or_else(|panic| {
            Counters::inc(&self.counters.host_panics);
            let why = truncate_utf8(panic_text(panic.as_ref()).to_string(), MAX_ERROR_BYTES);
            tracing::error!(panic = %why, "the host panicked while running the handler: a bug in Idem; the message is retried");
            Outcome::HostError(format!("the host panicked while running the handler: {why}"))
        });
        self.durations.record(&k.plugin.name, started.elapsed().as_secs_f64());
        // The handler is done with its slot and its place in hand: its
        // attempt is spent, so a crash from here on costs no message an
        // attempt it did not run. Its queued writes commit without them,
        // and nothing is settled before they have. The slot goes at once;
        // the place only once a place among those settling is taken, so a
        // message always holds one of the two and what waits for commits
        // stays bounded.
        drop(held.slot);
        let settling = held.settling.acquire_owned().await.expect("semaphore closed");
        drop(held.place);
        let outcome = outcome.after_writes(&writes).await;
        self.settle(a, outcome).instrument(span).await;
        drop(settling);
    }
}

/// What a panic said, as `panic!` was given it.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}
