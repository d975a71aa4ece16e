//! The worker pool, along a message's path:
//!
//! ```text
//! fetch (mod.rs) ─▶ admit.rs ─┬─ run.rs ─▶ settle.rs ─┬─ confirm.rs (batched confirm, then ack)
//!                             │                       ├─ retry later (release, nack)
//!                             │                       └─ dead-letter, then ack
//!                             ├─ bad input ─▶ dead-letter + ack
//!                             ├─ done / dead / conflict / exhausted ─▶ ack
//!                             └─ busy ─▶ redeliver later (no ack)
//! heartbeat.rs: extends the leases and visibility of what runs (G5)
//! ```
//!
//! This file holds the worker's options and the fetch loop: take a free
//! place in hand, fetch a batch of at most as many deliveries as there are
//! free places (`worker.prefetch` per slot), admit (claim) it, and spawn a
//! task per admitted message,
//! which waits for a handler slot to run. When its handler returns, a
//! message trades its slot and its place in hand for a place among those
//! settling (as many as there are places in hand) and keeps it until its
//! queued writes have committed and it is settled.

mod admit;
mod confirm;
mod durations;
mod heartbeat;
pub mod retry;
mod run;
mod settle;
mod validate;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::backend::Backends;
use crate::capabilities::Capabilities;
use crate::claim::ClaimRef;
use crate::config::{Config, OutagePolicy, RetryConfig};
use crate::runtime::Runtime;
use crate::stats::Counters;
use confirm::ConfirmQueue;
pub use durations::{percentile, Durations};
use heartbeat::InFlight;
use run::Held;

/// How a worker behaves.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Identifies this worker in claims.
    pub owner: String,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Deliveries fetched per round trip.
    pub batch_size: usize,
    /// Places in hand per handler slot (claimed and waiting, running); as
    /// many more may be settling.
    pub prefetch: usize,
    /// Claim lease.
    pub lease: Duration,
    /// Heartbeat interval; `None` disables the heartbeat (tests only).
    pub heartbeat: Option<Duration>,
    /// Broker visibility timeout.
    pub visibility: Duration,
    /// Redelivery delay for a busy key.
    pub busy_retry: Duration,
    /// Pause when the queue is empty.
    pub poll_idle: Duration,
    /// Retry policy.
    pub retry: RetryConfig,
    /// What to do when the claim store is unreachable.
    pub outage_policy: OutagePolicy,
    /// After shutdown begins, how long running handlers may take to finish.
    pub shutdown_grace: Duration,
}

impl WorkerOptions {
    /// Options from a configuration file.
    pub fn from_config(config: &Config) -> Self {
        let w = &config.worker;
        WorkerOptions {
            owner: format!("{}-{}", crate::text::hostname(), uuid::Uuid::new_v4().simple()),
            concurrency: w.concurrency,
            batch_size: w.batch_size,
            prefetch: w.prefetch,
            lease: w.lease(),
            heartbeat: Some(w.heartbeat()),
            visibility: w.visibility(),
            busy_retry: Duration::from_millis(w.busy_retry_ms),
            poll_idle: Duration::from_millis(w.poll_idle_ms),
            retry: config.retry.clone(),
            outage_policy: w.outage_policy,
            shutdown_grace: Duration::from_millis(w.shutdown_grace_ms),
        }
    }
}

/// One worker process's pool.
pub struct Worker {
    backends: Backends,
    runtime: Arc<Runtime>,
    caps: Arc<Capabilities>,
    options: WorkerOptions,
    counters: Arc<Counters>,
    /// Claims held now, from claim to settlement (what the heartbeat extends).
    in_flight: Arc<InFlight>,
    durations: Durations,
    /// Executions waiting for their confirm.
    confirms: ConfirmQueue,
    /// How long a busy key waits before it is received again: the busy
    /// retry, or, where every receive counts toward a redrive policy, no
    /// sooner than its claim can change. Fixed for the broker's life.
    busy_wait: Duration,
}

impl Worker {
    /// A worker over these backends and loaded plugins.
    pub fn new(backends: Backends, runtime: Arc<Runtime>, caps: Arc<Capabilities>, options: WorkerOptions) -> Arc<Self> {
        let counters = caps.counters.clone();
        let confirms = ConfirmQueue::new(caps.hooks.confirm_queue.unwrap_or(options.concurrency * 4 + confirm::CONFIRM_BATCH));
        let busy_wait = match backends.broker.semantics().receives_counted {
            true => Duration::MAX,
            false => options.busy_retry,
        };
        Arc::new(Worker {
            backends,
            runtime,
            caps,
            options,
            counters,
            in_flight: Arc::default(),
            durations: Durations::default(),
            confirms,
            busy_wait,
        })
    }

    /// Its options.
    pub fn options(&self) -> &WorkerOptions {
        &self.options
    }

    /// Recent handler durations per plugin.
    pub fn durations(&self) -> &Durations {
        &self.durations
    }

    /// Handlers running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Consume until `shutdown` is cancelled, then wait for running
    /// handlers to settle.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<()> {
        // The heartbeat has its own token: it must keep extending leases
        // until the last running handler has settled, after shutdown began.
        let heartbeat_stop = CancellationToken::new();
        let heartbeat = self.options.heartbeat.map(|every| {
            let this = self.clone();
            let stop = heartbeat_stop.clone();
            tokio::spawn(async move { this.heartbeat_loop(every, stop).await })
        });
        let confirm_stop = CancellationToken::new();
        let confirmer = self.confirms.rx.lock().expect("confirm receiver poisoned").take().map(|rx| {
            let this = self.clone();
            let stop = confirm_stop.clone();
            tokio::spawn(async move { this.confirm_loop(rx, stop).await })
        });
        let slots = Arc::new(Semaphore::new(self.options.concurrency));
        let in_hand = Arc::new(Semaphore::new(self.options.concurrency * self.options.prefetch));
        // Executions whose handler has returned and whose writes, confirm
        // and ack are still under way: bounded apart from the places in
        // hand, so the commit's wait does not keep the next messages out.
        let settling = Arc::new(Semaphore::new(self.options.concurrency * self.options.prefetch));
        let mut tasks = tokio::task::JoinSet::new();
        let mut backoff = self.options.poll_idle;
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => break,
                held = in_hand.clone().acquire_owned() => held.expect("semaphore closed"),
            };
            let want = (1 + in_hand.available_permits()).min(self.options.batch_size);
            let deliveries = match self.backends.broker.fetch(want, self.options.visibility).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "fetch failed; retrying");
                    drop(first);
                    sleep_or_cancel(backoff, &shutdown).await;
                    backoff = next_backoff(backoff);
                    continue;
                }
            };
            if deliveries.is_empty() {
                drop(first);
                sleep_or_cancel(self.options.poll_idle, &shutdown).await;
                continue;
            }
            let mut held = vec![first];
            while held.len() < deliveries.len() {
                match in_hand.clone().try_acquire_owned() {
                    Ok(p) => held.push(p),
                    Err(_) => break,
                }
            }
            let admitted = self.admit(deliveries).await;
            for admission in admitted.run {
                let place = held.pop().expect("a place in hand per fetched delivery");
                let this = self.clone();
                let slots = slots.clone();
                let settling = settling.clone();
                tasks.spawn(async move {
                    let slot = slots.acquire_owned().await.expect("semaphore closed");
                    this.execute(admission, Held { slot, place, settling }).await;
                });
            }
            while let Some(done) = tasks.try_join_next() {
                if let Err(e) = done {
                    tracing::error!(error = %e, "a handler task panicked; its delivery will be redelivered");
                }
            }
            if admitted.outage {
                // G8 reject: back off instead of fetching and nacking in a loop.
                sleep_or_cancel(backoff, &shutdown).await;
                backoff = next_backoff(backoff);
            } else {
                backoff = self.options.poll_idle;
            }
        }
        let grace = self.options.shutdown_grace;
        let drained = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            self.stop_running(&mut tasks).await;
        }
        confirm_stop.cancel();
        if let Some(c) = confirmer {
            let _ = c.await;
        }
        heartbeat_stop.cancel();
        if let Some(h) = heartbeat {
            let _ = h.await;
        }
        self.backends.broker.close().await;
        Ok(())
    }

    /// The grace period is over: stop the handlers still running, release
    /// their claims (a retry is due at once) and hand their deliveries back
    /// for redelivery, those running unguarded (no claim) included. Nothing
    /// is acked, so nothing is lost; a handler stopped half-way left only
    /// fenced, repeat-safe effects. Executions whose handler finished and
    /// that wait for their batched confirm are left to it (the confirm
    /// task flushes after this).
    async fn stop_running(&self, tasks: &mut tokio::task::JoinSet<()>) {
        let running = self.in_flight.close();
        tracing::warn!(
            running = tasks.len(),
            grace_ms = self.options.shutdown_grace.as_millis() as u64,
            "shutdown grace period over: stopping the handlers still running and releasing their claims"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        let now = self.backends.clock.now_ms();
        for (claim, receipt) in running {
            if let Some(claim) = claim {
                self.release_at_shutdown(&claim, now).await;
            }
            self.nack(&receipt, Duration::ZERO).await;
        }
    }

    /// Release a claim whose handler the shutdown stopped: a retry is due
    /// at once.
    async fn release_at_shutdown(&self, claim: &ClaimRef, now: i64) {
        match self
            .backends
            .claims
            .release(claim, now, "the worker shut down before the handler finished", false, now)
            .await
        {
            Ok(true) => tracing::info!(plugin = %claim.plugin, key = %claim.key, "claim released for redelivery"),
            Ok(false) => tracing::info!(plugin = %claim.plugin, key = %claim.key, "claim already settled or taken over"),
            Err(e) => {
                tracing::warn!(error = %e, plugin = %claim.plugin, key = %claim.key, "cannot release the claim; it expires with its lease")
            }
        }
    }
}

/// The fetch loop's backoff after a failure: doubled, between 50 ms and 5 s.
fn next_backoff(current: Duration) -> Duration {
    (current * 2).clamp(Duration::from_millis(50), Duration::from_secs(5))
}

async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) {
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = tokio::time::sleep(d) => {}
    }
}
