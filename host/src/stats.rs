//! Counters of what a worker did, shared by the pool, the capabilities and
//! the demo's summary.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters (relaxed atomics).
        #[derive(Debug, Default)]
        pub struct Counters {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// A copy of [`Counters`] at one moment.
        #[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
        pub struct Snapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Counters {
            /// Read every counter.
            pub fn snapshot(&self) -> Snapshot {
                Snapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Deliveries fetched from the broker.
    deliveries,
    /// Handler executions started.
    executions,
    /// Executions that returned ok and were confirmed.
    done,
    /// Deliveries of messages already done, acked without running.
    duplicates,
    /// Deliveries whose key was held by a live claim, redelivered later.
    busy,
    /// Transient failures and traps released for a retry.
    retries,
    /// Messages dead-lettered.
    dead_lettered,
    /// Deliveries whose key was reused with a different payload.
    conflicts,
    /// Executions that returned a permanent error.
    permanent_errors,
    /// Executions that trapped.
    traps,
    /// Guarded operations refused because the fence was stale.
    fence_rejections,
    /// Lease extensions sent by the heartbeat.
    lease_extensions,
    /// External requests actually sent.
    external_calls,
    /// External call results replayed from the journal.
    journal_replays,
    /// Upserts that waited for their execution's queued writes (it held
    /// as many as one execution may).
    writes_paced,
    /// Executions stopped by fault injection (demo crashes).
    crashes,
    /// Times the claim store was unreachable and the outage policy applied.
    outage_decisions,
    /// Executions during which the host panicked (a host bug).
    host_panics,
}

impl Counters {
    /// Add one.
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
