//! The time leases are measured in: the claim store's clock.
//!
//! Lease ends, retry times and the moments a claim is compared with them
//! are written by one worker and read by another, so they must come from
//! one clock. Each pool reads the claim store's clock (Postgres
//! `clock_timestamp()`, Redis `TIME`; for the embedded SQLite file, on the
//! same machine as every worker using it, the machine's clock, read each
//! time) and counts from that reading with its own monotonic clock, which no NTP step, manual
//! change or virtual-machine pause of the wall clock moves. It reads the
//! store again every [`RESYNC`], keeping the reading with the shortest round
//! trip of a few, and takes the middle of that round trip as the store's
//! time: workers then agree with the store, and so with each other, to
//! within half a round trip plus the drift of their monotonic clocks over
//! [`RESYNC`] (microseconds). A worker whose wall clock is off by hours
//! still neither takes over a live lease nor lets its own expire early.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::claim::{ClaimAdmin, ClaimError};

/// How often a pool reads the claim store's clock again.
pub const RESYNC: Duration = Duration::from_secs(10);

/// Readings per sync; the one with the shortest round trip is kept.
const SAMPLES: usize = 3;

/// A clock that reads the claim store's time.
pub struct StoreClock {
    /// (store time in ms, the instant it was read at); `None` while the
    /// store has no clock of its own: the wall clock is read each time.
    anchor: Mutex<Option<(i64, Instant)>>,
    /// Added to every wall-clock reading this clock makes: fault injection,
    /// to show that the wall clock does not matter where the store has one.
    wall_offset_ms: i64,
}

impl StoreClock {
    /// Milliseconds since the Unix epoch, by the claim store's clock.
    pub fn now_ms(&self) -> i64 {
        match *self.anchor.lock().expect("clock poisoned") {
            Some((at, instant)) => at + instant.elapsed().as_millis() as i64,
            None => crate::now_ms() + self.wall_offset_ms,
        }
    }

    /// The local wall clock (shifted by `wall_offset_ms`), until
    /// [`sync`](Self::sync) reads the store's.
    pub fn local(wall_offset_ms: i64) -> Arc<Self> {
        Arc::new(StoreClock {
            anchor: Mutex::new(None),
            wall_offset_ms,
        })
    }

    /// Read `admin`'s clock ([`SAMPLES`] times, keeping the shortest round
    /// trip) and count from there. A store without a clock of its own
    /// (SQLite) answers `None`: the machine's wall clock is the store's, and
    /// this returns `false`.
    pub async fn sync(&self, admin: &dyn ClaimAdmin) -> Result<bool, ClaimError> {
        let mut best: Option<(Duration, i64, Instant)> = None;
        for _ in 0..SAMPLES {
            let sent = Instant::now();
            let Some(store) = admin.clock_ms().await? else {
                return Ok(false);
            };
            let rtt = sent.elapsed();
            if best.is_none_or(|(b, _, _)| rtt < b) {
                best = Some((rtt, store, sent + rtt / 2));
            }
        }
        if let Some((_, store, at)) = best {
            *self.anchor.lock().expect("clock poisoned") = Some((store, at));
        }
        Ok(true)
    }

    /// Sync now, then (if the store has a clock) every [`RESYNC`] for as
    /// long as the clock is in use. A failed read keeps counting from the
    /// last one.
    pub async fn start(admin: Arc<dyn ClaimAdmin>, wall_offset_ms: i64) -> Result<Arc<Self>, ClaimError> {
        let clock = Self::local(wall_offset_ms);
        if !clock.sync(admin.as_ref()).await? {
            return Ok(clock);
        }
        let weak: Weak<StoreClock> = Arc::downgrade(&clock);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RESYNC).await;
                let Some(clock) = weak.upgrade() else { return };
                if let Err(e) = clock.sync(admin.as_ref()).await {
                    tracing::debug!(error = %e, "cannot read the claim store's clock; counting on from the last reading");
                }
            }
        });
        Ok(clock)
    }
}

impl std::fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreClock").field("now_ms", &self.now_ms()).finish()
    }
}
