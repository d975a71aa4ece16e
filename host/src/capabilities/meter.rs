//! Guest CPU time: what `limits.cpu_ms` is charged against.
//!
//! A guest runs only inside a poll of its execution's future, and a poll
//! runs on one thread from start to end, so the thread's CPU clock measures
//! it exactly: time the worker thread was preempted is not charged, time
//! spent in the host's capabilities (`store`, `effects`, `log`) is not
//! charged, and everything else the guest does is, however often it calls
//! the host. The meter is told where guest time starts and stops:
//!
//! - [`Metered`] (around instantiation and the call) starts it at the top
//!   of each poll and charges it at the bottom;
//! - the epoch callback charges it every tick and checks the budget;
//! - [`GuestMeter::enter_host`] charges it and checks the budget on entry
//!   to a capability, [`GuestMeter::leave_host`] restarts it on return.
//!
//! Only the WASI calls Idem wires to nothing (clocks, random, stdio) are
//! left in guest time; they never wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// `mark` while the host (not the guest) is running.
const IN_HOST: u64 = u64::MAX;

/// One execution's guest CPU time against its budget.
#[derive(Debug)]
pub struct GuestMeter {
    budget_ns: u64,
    charged_ns: AtomicU64,
    /// Thread CPU time at which the running guest segment started, or
    /// [`IN_HOST`].
    mark: AtomicU64,
}

/// CPU time consumed by the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is
    // supported on every Linux and macOS the host builds for.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

impl GuestMeter {
    /// A meter with `budget_ms` of guest CPU time, not yet started.
    pub fn new(budget_ms: u64) -> Arc<Self> {
        Arc::new(GuestMeter {
            budget_ns: budget_ms.saturating_mul(1_000_000),
            charged_ns: AtomicU64::new(0),
            mark: AtomicU64::new(IN_HOST),
        })
    }

    /// The guest (re)starts on this thread, unless the host is mid-call.
    fn resume(&self, host_running: bool) {
        if !host_running {
            self.mark.store(thread_cpu_ns(), Ordering::Relaxed);
        }
    }

    /// Charge the guest segment running since the mark and start a new one.
    pub fn charge(&self) {
        let mark = self.mark.load(Ordering::Relaxed);
        if mark == IN_HOST {
            return;
        }
        let now = thread_cpu_ns();
        self.charged_ns.fetch_add(now.saturating_sub(mark), Ordering::Relaxed);
        self.mark.store(now, Ordering::Relaxed);
    }

    /// Has the guest used up its budget?
    pub fn exhausted(&self) -> bool {
        self.charged_ns.load(Ordering::Relaxed) > self.budget_ns
    }

    /// Guest CPU time charged so far.
    pub fn charged(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.charged_ns.load(Ordering::Relaxed))
    }

    /// The guest calls a capability: charge its time up to here. Returns
    /// `false` if the budget is spent (the call must trap instead).
    pub fn enter_host(&self) -> bool {
        self.charge();
        self.mark.store(IN_HOST, Ordering::Relaxed);
        !self.exhausted()
    }

    /// The capability returns to the guest.
    pub fn leave_host(&self) {
        self.mark.store(thread_cpu_ns(), Ordering::Relaxed);
    }

    fn in_host(&self) -> bool {
        self.mark.load(Ordering::Relaxed) == IN_HOST
    }
}

/// A future whose polls run guest code: each poll starts the meter (unless
/// a capability is mid-call) and charges it when the poll returns.
pub struct Metered<F> {
    meter: Arc<GuestMeter>,
    inner: Pin<Box<F>>,
    started: bool,
}

impl<F> Metered<F> {
    /// Meter `inner` (whose first poll starts the guest).
    pub fn new(meter: Arc<GuestMeter>, inner: F) -> Self {
        Metered {
            meter,
            inner: Box::pin(inner),
            started: false,
        }
    }
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // The first poll starts the guest; later ones resume it unless it is
        // waiting in a capability.
        let host_running = this.started && this.meter.in_host();
        this.started = true;
        this.meter.resume(host_running);
        let out = this.inner.as_mut().poll(cx);
        this.meter.charge();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(ms: u64) {
        let start = thread_cpu_ns();
        while thread_cpu_ns() - start < ms * 1_000_000 {
            std::hint::black_box(0u64);
        }
    }

    #[tokio::test]
    async fn guest_time_is_charged_and_host_time_and_waits_are_not() {
        let meter = GuestMeter::new(1_000);
        let m = meter.clone();
        Metered::new(meter.clone(), async move {
            spin(20); // guest
            assert!(m.enter_host());
            spin(30); // host work: not charged
            tokio::task::yield_now().await; // a wait inside the host
            m.leave_host();
            spin(20); // guest again
        })
        .await;
        let charged = meter.charged().as_millis();
        assert!(
            (40..50).contains(&charged),
            "charged {charged} ms, expected the 40 ms of guest time"
        );
    }

    #[tokio::test]
    async fn frequent_host_calls_do_not_hide_guest_time() {
        // The guest's CPU time is measured with the meter's own clock around
        // each 1 ms of work, so what the loop itself costs (clock reads,
        // interrupts a busy machine charges to this thread) is not taken
        // for a wrong charge.
        let meter = GuestMeter::new(50);
        let m = meter.clone();
        let (calls, spun) = Metered::new(meter.clone(), async move {
            let (mut calls, mut spun) = (0u64, 0u64);
            loop {
                let start = thread_cpu_ns();
                spin(1);
                spun += thread_cpu_ns() - start;
                calls += 1;
                if !m.enter_host() {
                    return (calls, spun);
                }
                m.leave_host();
            }
        })
        .await;
        assert!(meter.exhausted());
        let charged = meter.charged().as_nanos() as u64;
        assert!(
            charged >= spun,
            "{spun} ns of guest work but only {charged} ns charged: host calls hid guest time"
        );
        assert!(calls <= 60, "{calls} calls of 1 ms before a 50 ms budget ran out");
        assert!(
            charged - spun < 10_000_000,
            "{charged} ns charged for {spun} ns of guest work in {calls} calls"
        );
    }
}
