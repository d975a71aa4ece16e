//! Retention: the sweeper every pool runs, removing settled claims (with
//! their journals and fencing tokens) older than the duplicate window and,
//! if configured, old dead letters. It deletes in small batches, each its
//! own short statement, so it never holds locks the hot path waits for; a
//! sweep repeats while full batches come back. Running claims and claims
//! waiting for a retry are never removed. Several pools sweeping the same
//! namespace skip each other's rows.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backend::Backends;
use crate::claim::ClaimError;
use crate::config::RetentionConfig;

/// What one sweep removed in all.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepTotals {
    /// Settled claims removed.
    pub claims: u64,
    /// Dead letters removed.
    pub dead_letters: u64,
}

/// Sweep until less than a full batch is left (or `stop`).
pub async fn sweep_once(backends: &Backends, r: &RetentionConfig, stop: &CancellationToken) -> Result<SweepTotals, ClaimError> {
    let mut totals = SweepTotals::default();
    while !stop.is_cancelled() {
        let now = backends.clock.now_ms();
        let settled_before = now - r.done_ms as i64;
        let dead_letters_before = r.dead_letters_ms.map(|ms| now - ms as i64);
        let swept = backends.admin.sweep(settled_before, dead_letters_before, r.sweep_batch).await?;
        if let Err(e) = backends.data.forget_fences(&swept.claims).await {
            tracing::warn!(
                error = %e,
                claims = swept.claims.len(),
                "retention: cannot drop the fencing tokens of swept claims; they stay, and a swept key delivered again can have its writes refused as stale until takeovers (a lease each) raise its fence past the old token"
            );
        }
        totals.claims += swept.claims.len() as u64;
        totals.dead_letters += swept.dead_letters;
        let full = swept.claims.len() >= r.sweep_batch as usize || swept.dead_letters >= u64::from(r.sweep_batch);
        if !full {
            break;
        }
        tokio::task::yield_now().await;
    }
    Ok(totals)
}

/// Every `sweep_every_ms`, sweep; until `stop`.
pub async fn sweep_loop(backends: Backends, r: RetentionConfig, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(r.sweep_every_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match sweep_once(&backends, &r, &stop).await {
            Ok(t) if t != SweepTotals::default() => {
                tracing::info!(
                    claims = t.claims,
                    dead_letters = t.dead_letters,
                    "retention: swept settled claims and dead letters"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention sweep failed; trying again at the next one"),
        }
    }
}
