//! Guest CPU time: what `limits.cpu_ms` is charged against.
//!
//! A guest runs only inside a poll of its execution's future, and a poll
//! runs on one thread from start to end, so the thread's CPU clock over a
//! poll measures the guest and the host code the poll ran, and nothing
//! else: time the worker thread was preempted is not in it, nor other
//! tasks' work between polls. Time in the host's capabilities (`store`,
//! `effects`, `log`) is measured with the monotonic clock. A stretch
//! between two readings of the CPU clock is charged the smaller of its CPU
//! time and its wall time outside capabilities: both are at least the
//! guest's CPU time in it, so the guest is never charged less than that,
//! however often it calls the host, and more only by the host's CPU time
//! in a stretch where the guest was also preempted.
//!
//! The thread's CPU clock is a system call (about half a microsecond here);
//! the monotonic clock is not. So the CPU clock is read where it must be:
//!
//! - [`Metered`] (around instantiation and the call) reads it at the top
//!   of each poll, and at the bottom charges what lies between; a poll
//!   that ends less than [`SHORT_NS`] of wall time after the last reading
//!   (an instantiation and a call that does not wait, as most are) is
//!   charged that stretch's wall time outside capabilities instead, with
//!   no second reading: never less than the guest's CPU time in it, and
//!   more only by what the thread was preempted in those few
//!   microseconds;
//! - the epoch callback charges up to the tick, every tick, and checks the
//!   budget;
//! - [`GuestMeter::enter_host`] checks the budget on entry to a capability,
//!   and first charges up to there when a millisecond or more has passed
//!   since the last reading (so a budget is never overrun by more than
//!   that between host calls); [`GuestMeter::leave_host`] only notes the
//!   time.
//!
//! Only the WASI calls Idem wires to nothing (clocks, random, stdio)
//! are left in guest time; they never wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// `cpu_mark` outside a poll; `host_since` outside a capability.
const NONE: u64 = u64::MAX;

/// Wall time after which a capability call reads the CPU clock before it
/// checks the budget.
const STALE_NS: u64 = 1_000_000;

/// A poll that ends less than this wall time after the last reading is
/// charged the stretch's wall time outside capabilities, with no reading
/// at its end: the reading would cost a large part of the stretch.
const SHORT_NS: u64 = 100_000;

/// One execution's guest CPU time against its budget.
#[derive(Debug)]
pub struct GuestMeter {
    budget_ns: u64,
    charged_ns: AtomicU64,
    /// The monotonic clock's origin for the marks below.
    origin: Instant,
    /// Thread CPU time at the last reading in the running poll, or [`NONE`].
    cpu_mark: AtomicU64,
    /// Monotonic time of that reading.
    wall_mark: AtomicU64,
    /// Monotonic time spent in capabilities since that reading.
    host_ns: AtomicU64,
    /// Monotonic time at which the running capability call started (or the
    /// poll that resumed it), or [`NONE`].
    host_since: AtomicU64,
}

#[cfg(test)]
thread_local! {
    /// Readings of the CPU clock this thread took (what the tests count).
    static READINGS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// CPU time consumed by the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    #[cfg(test)]
    READINGS.with(|r| r.set(r.get() + 1));
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
            origin: Instant::now(),
            cpu_mark: AtomicU64::new(NONE),
            wall_mark: AtomicU64::new(0),
            host_ns: AtomicU64::new(0),
            host_since: AtomicU64::new(NONE),
        })
    }

    fn wall_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// A poll starts: take the readings the next charge starts from (the
    /// wall clock first, so its stretch holds the CPU clock's).
    fn poll_started(&self) {
        let wall = self.wall_ns();
        self.cpu_mark.store(thread_cpu_ns(), Ordering::Relaxed);
        self.wall_mark.store(wall, Ordering::Relaxed);
        self.host_ns.store(0, Ordering::Relaxed);
        if self.host_since.load(Ordering::Relaxed) != NONE {
            // A capability call is still waiting: the host runs first.
            self.host_since.store(wall, Ordering::Relaxed);
        }
    }

    /// Charge the stretch since the last reading (the smaller of its CPU
    /// time and its wall time outside capabilities) and take a new reading.
    pub fn charge(&self) {
        let mark = self.cpu_mark.load(Ordering::Relaxed);
        if mark == NONE {
            return;
        }
        // Wall, CPU, wall: each stretch's wall time holds its CPU time.
        let next_wall = self.wall_ns();
        let now = thread_cpu_ns();
        let wall = self.wall_ns();
        let outside = self.outside_host(wall);
        let guest = now.saturating_sub(mark).min(outside);
        self.charged_ns.fetch_add(guest, Ordering::Relaxed);
        self.cpu_mark.store(now, Ordering::Relaxed);
        self.wall_mark.store(next_wall, Ordering::Relaxed);
    }

    /// The wall time from the last reading to `wall`, less the time spent
    /// in capabilities in it (which is then counted as taken off).
    fn outside_host(&self, wall: u64) -> u64 {
        let mut host = self.host_ns.swap(0, Ordering::Relaxed);
        let since = self.host_since.load(Ordering::Relaxed);
        if since != NONE {
            host += wall.saturating_sub(since);
            // From where this stretch's count stopped, so no host time is
            // taken off twice.
            self.host_since.store(wall, Ordering::Relaxed);
        }
        wall.saturating_sub(self.wall_mark.load(Ordering::Relaxed)).saturating_sub(host)
    }

    /// A poll ends: charge it; the thread may run other work next. A
    /// stretch shorter than [`SHORT_NS`] is charged its wall time outside
    /// capabilities (which holds the guest's CPU time in it) without
    /// reading the CPU clock again.
    fn poll_ended(&self) {
        let wall = self.wall_ns();
        if self.cpu_mark.load(Ordering::Relaxed) != NONE && wall.saturating_sub(self.wall_mark.load(Ordering::Relaxed)) < SHORT_NS {
            let outside = self.outside_host(wall);
            self.charged_ns.fetch_add(outside, Ordering::Relaxed);
        } else {
            self.charge();
        }
        self.cpu_mark.store(NONE, Ordering::Relaxed);
    }

    /// Has the guest used up its budget?
    pub fn exhausted(&self) -> bool {
        self.charged_ns.load(Ordering::Relaxed) > self.budget_ns
    }

    /// Guest CPU time charged so far.
    pub fn charged(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.charged_ns.load(Ordering::Relaxed))
    }

    /// The guest calls a capability. Returns `false` if the budget is spent
    /// (the call must trap instead).
    pub fn enter_host(&self) -> bool {
        let mut wall = self.wall_ns();
        if wall.saturating_sub(self.wall_mark.load(Ordering::Relaxed)) >= STALE_NS {
            self.charge();
            wall = self.wall_ns();
        }
        self.host_since.store(wall, Ordering::Relaxed);
        !self.exhausted()
    }

    /// The capability returns to the guest.
    pub fn leave_host(&self) {
        let since = self.host_since.swap(NONE, Ordering::Relaxed);
        if since != NONE {
            let spent = self.wall_ns().saturating_sub(since);
            self.host_ns.fetch_add(spent, Ordering::Relaxed);
        }
    }
}

/// A future whose polls run guest code: each poll is measured with the
/// thread's CPU clock and charged as the module's doc says (capability time
/// is not charged, guest CPU time always is).
pub struct Metered<F> {
    meter: Arc<GuestMeter>,
    inner: Pin<Box<F>>,
}

impl<F> Metered<F> {
    /// Meter `inner` (whose first poll starts the guest).
    pub fn new(meter: Arc<GuestMeter>, inner: F) -> Self {
        Metered {
            meter,
            inner: Box::pin(inner),
        }
    }
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.meter.poll_started();
        let out = this.inner.as_mut().poll(cx);
        this.meter.poll_ended();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin_us(us: u64) {
        let start = thread_cpu_ns();
        while thread_cpu_ns() - start < us * 1_000 {
            std::hint::black_box(0u64);
        }
    }

    #[tokio::test]
    async fn guest_time_is_charged_and_host_time_and_waits_are_not() {
        let meter = GuestMeter::new(1_000);
        let m = meter.clone();
        Metered::new(meter.clone(), async move {
            spin_us(20_000); // guest
            assert!(m.enter_host());
            spin_us(30_000); // host work: not charged
            tokio::task::yield_now().await; // a wait inside the host
            m.leave_host();
            spin_us(20_000); // guest again
        })
        .await;
        let charged = meter.charged().as_millis();
        assert!(
            (40..50).contains(&charged),
            "charged {charged} ms, expected the 40 ms of guest time"
        );
    }

    #[tokio::test]
    async fn a_short_poll_reads_the_cpu_clock_once_and_is_charged_its_wall_time() {
        // 20 polls of 10 µs of guest work each. Those that end within
        // SHORT_NS of their first reading take no second one and are
        // charged their wall time (at least the work); a poll preempted
        // past it may be charged from a second reading, as before, which
        // counts only the CPU time it had. Before, every poll read the
        // clock at both ends.
        let mut short = 0;
        for _ in 0..20 {
            let meter = GuestMeter::new(1_000);
            let before = READINGS.with(|r| r.get());
            let started = Instant::now();
            Metered::new(meter.clone(), async {
                let start = Instant::now();
                while start.elapsed() < std::time::Duration::from_micros(10) {
                    std::hint::black_box(0u64);
                }
            })
            .await;
            let wall = started.elapsed().as_nanos() as u64;
            let readings = READINGS.with(|r| r.get()) - before;
            let charged = meter.charged().as_nanos() as u64;
            assert!(charged <= wall, "{charged} ns charged for a poll of {wall} ns");
            if wall < SHORT_NS {
                assert_eq!(readings, 1, "a poll of {wall} ns read the CPU clock {readings} times");
                // Its wall time, which holds the 10 µs the loop ran for.
                assert!(charged >= 10_000, "a poll of 10 µs of guest work, {charged} ns charged");
                short += 1;
            } else {
                // Preempted: the meter's own stretch (inside this one) may
                // or may not have passed SHORT_NS.
                assert!(
                    (1..=2).contains(&readings),
                    "a poll of {wall} ns read the CPU clock {readings} times"
                );
            }
        }
        assert!(short > 0, "no poll of the 20 ended within {SHORT_NS} ns");
    }

    #[tokio::test]
    async fn a_host_call_that_loses_its_core_hides_no_guest_time() {
        // Guest work on both sides of a capability call inside one stretch
        // (less than a millisecond apart, so no reading in between), and a
        // call that spends 20 ms off the core, as a preempted thread does:
        // taking the call's wall time off the stretch's CPU time would
        // charge nothing.
        let meter = GuestMeter::new(1_000);
        let m = meter.clone();
        let spun = Metered::new(meter.clone(), async move {
            let mut spun = 0;
            for _ in 0..2 {
                let start = thread_cpu_ns();
                spin_us(300);
                spun += thread_cpu_ns() - start;
                assert!(m.enter_host());
                std::thread::sleep(std::time::Duration::from_millis(20));
                m.leave_host();
            }
            spun
        })
        .await;
        let charged = meter.charged().as_nanos() as u64;
        assert!(charged >= spun, "{spun} ns of guest work, {charged} ns charged");
        assert!(charged < spun + 5_000_000, "{spun} ns of guest work, {charged} ns charged");
    }

    /// A guest that works `work_us` of CPU between host calls, never
    /// yielding, under a 50 ms budget: how many calls it made before a call
    /// was refused, the CPU time it worked, and what was charged.
    async fn work_between_host_calls(work_us: u64) -> (u64, u64, u64) {
        // The guest's CPU time is measured with the meter's own clock around
        // each stretch of work, so what the loop itself costs (clock reads,
        // interrupts a busy machine charges to this thread) is not taken
        // for a wrong charge.
        let meter = GuestMeter::new(50);
        let m = meter.clone();
        let (calls, spun) = Metered::new(meter.clone(), async move {
            let (mut calls, mut spun) = (0u64, 0u64);
            loop {
                let start = thread_cpu_ns();
                spin_us(work_us);
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
        assert!(
            charged - spun < 10_000_000,
            "{charged} ns charged for {spun} ns of guest work in {calls} calls"
        );
        (calls, spun, charged)
    }

    #[tokio::test]
    async fn frequent_host_calls_do_not_hide_guest_time() {
        let (calls, _, _) = work_between_host_calls(1_000).await;
        assert!(calls <= 60, "{calls} calls of 1 ms before a 50 ms budget ran out");
    }

    #[tokio::test]
    async fn host_calls_closer_than_a_reading_still_meet_the_budget() {
        // Calls 200 µs apart read the CPU clock about every fifth call: the
        // budget is overrun by at most the millisecond between readings.
        let (calls, spun, _) = work_between_host_calls(200).await;
        assert!(
            spun <= 52_000_000,
            "{spun} ns of guest work in {calls} calls of 200 µs before a 50 ms budget ran out"
        );
    }
}
