//! Hooks that tools put into the pipeline: the demo's simulated crashes and
//! the benchmarks' per-message timing. A production pool runs with
//! [`Hooks::default`] (none).

use std::sync::Arc;

use crate::envelope::Envelope;

/// Decides whether an execution "crashes" right after a journaled step:
/// (plugin, key, attempt, step) → crash?
pub type CrashInjector = Arc<dyn Fn(&str, &str, u32, &str) -> bool + Send + Sync>;

/// A callback for each message confirmed done, after its ack.
pub type OnDone = Arc<dyn Fn(&Envelope) + Send + Sync>;

/// Everything a tool may hook into a pool.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Fault injection (the demo): stop an execution as if its worker died,
    /// right after a step's response was journaled.
    pub crash_after_step: Option<CrashInjector>,
    /// Called with each message confirmed done, after its ack (the
    /// benchmarks measure latency with it).
    pub on_done: Option<OnDone>,
    /// Fault injection (tests): hold each confirm batch this long, as a
    /// slow claim store would.
    pub delay_confirm: Option<std::time::Duration>,
    /// Fault injection (tests): take this long over each nack, as a slow
    /// broker would (a NATS nak, a delayed RabbitMQ nack).
    pub delay_nack: Option<std::time::Duration>,
    /// Fault injection (tests): the queue of executions waiting for their
    /// confirm holds at most this many, so a slow confirm backs up into
    /// the finished handlers sooner.
    pub confirm_queue: Option<usize>,
    /// Fault injection (tests): this worker's wall clock runs this many ms
    /// ahead (negative: behind). Where the claim store has a clock of its
    /// own, lease times do not depend on it.
    pub wall_clock_offset_ms: i64,
}

impl Hooks {
    /// Hooks that inject crashes.
    pub fn crashing(injector: CrashInjector) -> Self {
        Hooks {
            crash_after_step: Some(injector),
            ..Hooks::default()
        }
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("crash_after_step", &self.crash_after_step.is_some())
            .field("on_done", &self.on_done.is_some())
            .field("delay_confirm", &self.delay_confirm)
            .field("delay_nack", &self.delay_nack)
            .field("confirm_queue", &self.confirm_queue)
            .field("wall_clock_offset_ms", &self.wall_clock_offset_ms)
            .finish()
    }
}
