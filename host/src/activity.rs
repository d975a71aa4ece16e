//! What the workers of a namespace did, per minute: done, duplicates
//! suppressed, busy redeliveries, retries and dead letters.
//!
//! Each pool adds what its counters gained to the claim store every
//! [`FLUSH_EVERY`] (and once more when it stops), under the minute the
//! counts were taken in. Every worker of the namespace adds to the same
//! minutes, so `idem stats` and the console show the whole pool's last
//! hour, whichever process asks. Counts that cannot be written (the store
//! is down) are kept and added with the next flush. The store keeps a day.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::claim::ClaimAdmin;
use crate::clock::StoreClock;
use crate::stats::{Counters, Snapshot};

/// How often a pool adds its counts.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// How long the store keeps a minute.
const KEEP_MS: i64 = 24 * 3600 * 1000;

const MINUTE_MS: i64 = 60_000;

/// The outcomes recorded, as named in the store.
pub const OUTCOMES: [&str; 5] = ["done", "duplicates", "busy", "retries", "dead_lettered"];

fn outcome_counts(s: &Snapshot) -> [u64; 5] {
    [s.done, s.duplicates, s.busy, s.retries, s.dead_lettered]
}

/// Counts of one minute (or a total).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Minute {
    /// Unix ms of the minute's start (0 for a total).
    pub minute: i64,
    /// Messages done.
    pub done: u64,
    /// Deliveries of done messages, acked unrun.
    pub duplicates: u64,
    /// Deliveries whose key was running elsewhere, redelivered later.
    pub busy: u64,
    /// Executions released for a retry.
    pub retries: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
}

impl Minute {
    fn add(&mut self, outcome: &str, n: u64) {
        match outcome {
            "done" => self.done += n,
            "duplicates" => self.duplicates += n,
            "busy" => self.busy += n,
            "retries" => self.retries += n,
            "dead_lettered" => self.dead_lettered += n,
            _ => {}
        }
    }
}

/// The last hour: one entry per minute (oldest first, empty minutes
/// included) and their total.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct LastHour {
    /// Per minute.
    pub minutes: Vec<Minute>,
    /// Their sum.
    pub total: Minute,
}

/// Read the namespace's last hour (the current minute included).
pub async fn last_hour(admin: &dyn ClaimAdmin, now: i64) -> Result<LastHour, crate::claim::ClaimError> {
    let current = now.div_euclid(MINUTE_MS) * MINUTE_MS;
    let since = current - 59 * MINUTE_MS;
    let mut minutes: Vec<Minute> = (0..60)
        .map(|i| Minute {
            minute: since + i * MINUTE_MS,
            ..Minute::default()
        })
        .collect();
    let mut total = Minute::default();
    for (minute, outcome, n) in admin.activity(since).await? {
        let i = (minute - since).div_euclid(MINUTE_MS);
        if let Some(m) = usize::try_from(i).ok().and_then(|i| minutes.get_mut(i)) {
            m.add(&outcome, n);
            total.add(&outcome, n);
        }
    }
    Ok(LastHour { minutes, total })
}

/// Add what `counters` gained since the last flush every [`FLUSH_EVERY`]
/// until `stop`, then once more.
pub async fn record(admin: Arc<dyn ClaimAdmin>, clock: Arc<StoreClock>, counters: Arc<Counters>, stop: CancellationToken) {
    let mut written = [0u64; 5];
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        flush(admin.as_ref(), clock.now_ms(), &counters, &mut written).await;
        if stopping {
            return;
        }
    }
}

async fn flush(admin: &dyn ClaimAdmin, now: i64, counters: &Counters, written: &mut [u64; 5]) {
    let current = outcome_counts(&counters.snapshot());
    let delta: Vec<(&str, u64)> = OUTCOMES
        .iter()
        .zip(current.iter().zip(written.iter()))
        .map(|(o, (c, w))| (*o, c.saturating_sub(*w)))
        .collect();
    if delta.iter().all(|(_, n)| *n == 0) {
        return;
    }
    let minute = now.div_euclid(MINUTE_MS) * MINUTE_MS;
    match admin.activity_add(minute, &delta, minute - KEEP_MS).await {
        Ok(()) => *written = current,
        Err(e) => tracing::warn!(error = %e, "cannot record this worker's activity; it is added with the next flush"),
    }
}
