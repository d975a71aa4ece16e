//! The worker pool: fetch, claim, run, settle.
//!
//! ```text
//! fetch (batch) ─▶ validate ─▶ claim (batch) ─┬─ acquired ─▶ run ─▶ settle
//!                     │                       ├─ done / dead / conflict / exhausted ─▶ ack
//!                     └─ bad input ─▶ dead-letter + ack   └─ busy ─▶ redeliver later (no ack)
//! ```
//!
//! Settling is ordered so that nothing is lost: the claim is confirmed (or
//! released, or dead-lettered) first and the broker is acked only after that
//! is durable. A worker that loses its claim settles nothing: whoever took
//! the claim over settles the message.

pub mod retry;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::Backends;
use crate::capabilities::Capabilities;
use crate::claim::{ClaimOutcome, ClaimRef, ClaimRequest, DeadLetterRequest};
use crate::config::{Config, OutagePolicy, RetryConfig};
use crate::envelope::{derive_key, payload_hash, Delivery};
use crate::now_ms;
use crate::observe::Durations;
use crate::runtime::{Execution, Outcome, Plugin, Runtime};
use crate::stats::Counters;

/// How a worker behaves.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Identifies this worker in claims.
    pub owner: String,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Deliveries fetched per round trip.
    pub batch_size: usize,
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
    /// Called with each message confirmed done, after its ack (benchmarks
    /// measure latency with it).
    pub on_done: Option<OnDone>,
}

/// A callback for each message confirmed done.
#[derive(Clone)]
pub struct OnDone(pub Arc<dyn Fn(&crate::envelope::Envelope) + Send + Sync>);

impl std::fmt::Debug for OnDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnDone(..)")
    }
}

impl WorkerOptions {
    /// Options from a configuration file.
    pub fn from_config(config: &Config) -> Self {
        let w = &config.worker;
        WorkerOptions {
            owner: format!("{}-{}", hostname(), uuid::Uuid::new_v4().simple()),
            concurrency: w.concurrency,
            batch_size: w.batch_size,
            lease: w.lease(),
            heartbeat: Some(w.heartbeat()),
            visibility: w.visibility(),
            busy_retry: Duration::from_millis(w.busy_retry_ms),
            poll_idle: Duration::from_millis(w.poll_idle_ms),
            retry: config.retry.clone(),
            outage_policy: w.outage_policy,
            shutdown_grace: Duration::from_millis(w.shutdown_grace_ms),
            on_done: None,
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "worker".into())
}

/// An execution that returned ok, waiting for its confirm and ack.
struct Settled {
    claim: ClaimRef,
    receipt: String,
    envelope: Option<crate::envelope::Envelope>,
}

/// Most confirmations sent to the claim store (and acks to the broker) in
/// one round trip.
const SETTLE_BATCH: usize = 256;

struct InFlight {
    claim: ClaimRef,
    receipt: String,
    interrupt: Arc<AtomicBool>,
}

/// One worker process's pool.
pub struct Worker {
    backends: Backends,
    runtime: Arc<Runtime>,
    caps: Arc<Capabilities>,
    options: WorkerOptions,
    counters: Arc<Counters>,
    in_flight: Mutex<HashMap<u64, InFlight>>,
    next_id: AtomicU64,
    durations: Durations,
    settle_tx: tokio::sync::mpsc::Sender<Settled>,
    settle_rx: Mutex<Option<tokio::sync::mpsc::Receiver<Settled>>>,
}

impl Worker {
    /// A worker over these backends and loaded plugins.
    pub fn new(backends: Backends, runtime: Arc<Runtime>, caps: Arc<Capabilities>, options: WorkerOptions) -> Arc<Self> {
        let counters = caps.counters.clone();
        let (settle_tx, settle_rx) = tokio::sync::mpsc::channel(options.concurrency * 4 + SETTLE_BATCH);
        Arc::new(Worker {
            backends,
            runtime,
            caps,
            options,
            counters,
            in_flight: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            durations: Durations::default(),
            settle_tx,
            settle_rx: Mutex::new(Some(settle_rx)),
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
        self.in_flight.lock().expect("in-flight map poisoned").len()
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
        // Successful executions are confirmed and acked in batches by one
        // task, off the handler slots: a slot is free again as soon as its
        // handler returns.
        let settler_stop = CancellationToken::new();
        let settler = self.settle_rx.lock().expect("settle receiver poisoned").take().map(|rx| {
            let this = self.clone();
            let stop = settler_stop.clone();
            tokio::spawn(async move { this.settle_loop(rx, stop).await })
        });
        let slots = Arc::new(Semaphore::new(self.options.concurrency));
        let mut tasks = tokio::task::JoinSet::new();
        let mut backoff = self.options.poll_idle;
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => break,
                permit = slots.clone().acquire_owned() => permit.expect("semaphore closed"),
            };
            let want = (1 + slots.available_permits()).min(self.options.batch_size);
            let deliveries = match self.backends.broker.fetch(want, self.options.visibility).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "fetch failed; retrying");
                    drop(first);
                    sleep_or_cancel(backoff, &shutdown).await;
                    backoff = (backoff * 2).clamp(Duration::from_millis(50), Duration::from_secs(5));
                    continue;
                }
            };
            if deliveries.is_empty() {
                drop(first);
                sleep_or_cancel(self.options.poll_idle, &shutdown).await;
                continue;
            }
            let mut permits = vec![first];
            while permits.len() < deliveries.len() {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let (admitted, outage) = self.admit(deliveries).await;
            for (delivery, run) in admitted {
                let permit = permits.pop().expect("one slot per fetched delivery");
                let this = self.clone();
                tasks.spawn(async move {
                    this.execute(delivery, run).await;
                    drop(permit);
                });
            }
            while let Some(done) = tasks.try_join_next() {
                if let Err(e) = done {
                    tracing::error!(error = %e, "a handler task panicked; its delivery will be redelivered");
                }
            }
            if outage {
                // G8 reject: back off instead of fetching and nacking in a loop.
                sleep_or_cancel(backoff, &shutdown).await;
                backoff = (backoff * 2).clamp(Duration::from_millis(50), Duration::from_secs(5));
            } else {
                backoff = self.options.poll_idle;
            }
        }
        let grace = self.options.shutdown_grace;
        let drained = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            self.stop_running(&mut tasks).await;
        }
        settler_stop.cancel();
        if let Some(s) = settler {
            let _ = s.await;
        }
        heartbeat_stop.cancel();
        if let Some(h) = heartbeat {
            let _ = h.await;
        }
        Ok(())
    }

    /// The grace period is over: stop the handlers still running, release
    /// their claims (a retry is due at once) and hand their deliveries back
    /// for redelivery. Nothing is acked, so nothing is lost; a handler
    /// stopped half-way left only fenced, repeat-safe effects.
    async fn stop_running(&self, tasks: &mut tokio::task::JoinSet<()>) {
        let running: Vec<(ClaimRef, String)> = self
            .in_flight
            .lock()
            .expect("in-flight map poisoned")
            .values()
            .map(|f| (f.claim.clone(), f.receipt.clone()))
            .collect();
        tracing::warn!(
            running = tasks.len(),
            grace_ms = self.options.shutdown_grace.as_millis() as u64,
            "shutdown grace period over: stopping the handlers still running and releasing their claims"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        let now = now_ms();
        for (claim, receipt) in running {
            match self
                .backends
                .claims
                .release(&claim, now, "the worker shut down before the handler finished", false, now)
                .await
            {
                Ok(true) => tracing::info!(plugin = %claim.plugin, key = %claim.key, "claim released for redelivery"),
                Ok(false) => tracing::info!(plugin = %claim.plugin, key = %claim.key, "claim already settled or taken over"),
                Err(e) => {
                    tracing::warn!(error = %e, plugin = %claim.plugin, key = %claim.key, "cannot release the claim; it expires with its lease")
                }
            }
            self.nack(&receipt, Duration::ZERO).await;
        }
    }

    /// Validate and claim a batch; settle what needs no execution and
    /// return what should run.
    /// The flag is true when the claim store was unreachable.
    async fn admit(&self, deliveries: Vec<Delivery>) -> (Vec<(Delivery, Admitted)>, bool) {
        let c = &self.counters;
        c.deliveries.fetch_add(deliveries.len() as u64, Ordering::Relaxed);
        let mut to_claim: Vec<(Delivery, Arc<Plugin>, String, String)> = Vec::new();
        let mut rejected: Vec<(Delivery, String, String)> = Vec::new();
        for d in deliveries {
            match self.validate(&d) {
                Ok((plugin, key)) => {
                    let hash = payload_hash(&d.envelope.payload);
                    to_claim.push((d, plugin, key, hash));
                }
                Err(reason) => {
                    let key = d.envelope.id.clone();
                    rejected.push((d, key, reason));
                }
            }
        }
        if !rejected.is_empty() {
            let items: Vec<DeadLetterRequest> = rejected
                .iter()
                .map(|(d, key, reason)| DeadLetterRequest {
                    plugin: &d.envelope.handler,
                    key,
                    msg_id: &d.envelope.id,
                    headers: &d.envelope.headers,
                    payload: &d.envelope.payload,
                    reason,
                    fence: None,
                    plugin_version: None,
                })
                .collect();
            match self.backends.claims.dead_letter(&items, now_ms()).await {
                Ok(_) => {
                    for (d, _, reason) in &rejected {
                        tracing::warn!(msg_id = %d.envelope.id, handler = %d.envelope.handler, %reason, "dead-lettered bad input");
                    }
                    c.dead_lettered.fetch_add(rejected.len() as u64, Ordering::Relaxed);
                    self.ack(rejected.iter().map(|(d, _, _)| d.receipt.as_str()).collect()).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot record dead letters; leaving the deliveries unacked");
                    for (d, _, _) in &rejected {
                        self.nack(&d.receipt, self.options.busy_retry).await;
                    }
                }
            }
        }
        if to_claim.is_empty() {
            return (Vec::new(), false);
        }
        let requests: Vec<ClaimRequest> = to_claim
            .iter()
            .map(|(d, plugin, key, hash)| ClaimRequest {
                plugin: &plugin.name,
                key,
                msg_id: &d.envelope.id,
                payload_hash: hash,
                headers: &d.envelope.headers,
                payload: &d.envelope.payload,
                owner: &self.options.owner,
                lease_ms: self.options.lease.as_millis() as i64,
                max_attempts: self.options.retry.max_attempts,
                plugin_version: &plugin.version,
            })
            .collect();
        let outcomes = match self.backends.claims.claim(&requests, now_ms()).await {
            Ok(o) => o,
            Err(e) => return (self.claim_outage(to_claim, e).await, true),
        };
        let mut run = Vec::new();
        let mut acks = Vec::new();
        for ((d, plugin, key, _), outcome) in to_claim.into_iter().zip(outcomes) {
            match outcome {
                ClaimOutcome::Acquired { fence, attempt, traps } => {
                    let claim = ClaimRef {
                        plugin: plugin.name.clone(),
                        key: key.clone(),
                        fence,
                    };
                    run.push((
                        d,
                        Admitted {
                            plugin,
                            key,
                            claim: Some(claim),
                            attempt,
                            traps,
                        },
                    ));
                }
                ClaimOutcome::Done | ClaimOutcome::DeadLettered => {
                    Counters::inc(&c.duplicates);
                    tracing::debug!(msg_id = %d.envelope.id, %key, "duplicate delivery of a settled message; acking");
                    acks.push(d.receipt);
                }
                ClaimOutcome::Conflict => {
                    Counters::inc(&c.conflicts);
                    Counters::inc(&c.dead_lettered);
                    tracing::warn!(msg_id = %d.envelope.id, %key, "key reused with a different payload; dead-lettered");
                    acks.push(d.receipt);
                }
                ClaimOutcome::Exhausted { attempts } => {
                    Counters::inc(&c.dead_lettered);
                    tracing::warn!(msg_id = %d.envelope.id, %key, attempts, "attempts exhausted; dead-lettered");
                    acks.push(d.receipt);
                }
                ClaimOutcome::Busy { retry_after_ms } => {
                    Counters::inc(&c.busy);
                    let delay = Duration::from_millis(retry_after_ms.max(1) as u64).min(self.options.busy_retry);
                    tracing::debug!(msg_id = %d.envelope.id, %key, ?delay, "key is busy; redelivering later");
                    self.nack(&d.receipt, delay).await;
                }
            }
        }
        self.ack(acks.iter().map(String::as_str).collect()).await;
        (run, false)
    }

    /// G8: the claim store is unreachable.
    async fn claim_outage(
        &self,
        batch: Vec<(Delivery, Arc<Plugin>, String, String)>,
        error: crate::claim::ClaimError,
    ) -> Vec<(Delivery, Admitted)> {
        let mut run = Vec::new();
        for (d, plugin, key, _) in batch {
            Counters::inc(&self.counters.outage_decisions);
            let unguarded = self.options.outage_policy == OutagePolicy::RunUnguarded && plugin.grants.endpoints.is_empty();
            if unguarded {
                tracing::warn!(error = %error, msg_id = %d.envelope.id, "claim store unreachable: running unguarded (outage_policy = run-unguarded)");
                let attempt = d.delivery_count.max(1);
                run.push((
                    d,
                    Admitted {
                        plugin,
                        key,
                        claim: None,
                        attempt,
                        traps: 0,
                    },
                ));
            } else {
                tracing::warn!(error = %error, msg_id = %d.envelope.id, "claim store unreachable: leaving the delivery unacked (outage_policy = reject)");
                self.nack(&d.receipt, self.options.busy_retry).await;
            }
        }
        run
    }

    fn validate(&self, d: &Delivery) -> Result<(Arc<Plugin>, String), String> {
        let e = &d.envelope;
        if e.handler.is_empty() {
            return Err(format!(
                "malformed envelope: the delivery names no handler (message id {:?}); publish with `idem publish` or set the idem handler header/field",
                e.id
            ));
        }
        let Some(plugin) = self.runtime.plugin(&e.handler) else {
            return Err(format!(
                "unknown handler {:?}: no plugin of that name is loaded (loaded: {}); publish to one of them or add it under [plugins]",
                e.handler,
                self.runtime.plugin_names().join(", ")
            ));
        };
        if e.payload.len() > plugin.limits.max_payload_bytes {
            return Err(format!(
                "payload of {} bytes exceeds limits.max_payload_bytes = {} of plugin {}",
                e.payload.len(),
                plugin.limits.max_payload_bytes,
                plugin.name
            ));
        }
        if e.id.is_empty() {
            return Err("message id is empty".into());
        }
        let key = derive_key(e, plugin.key_pointer.as_deref())?;
        Ok((plugin, key))
    }

    async fn execute(self: Arc<Self>, d: Delivery, a: Admitted) {
        let c = &self.counters;
        Counters::inc(&c.executions);
        let interrupt = Arc::new(AtomicBool::new(false));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let _registered = InFlightGuard { worker: &self, id };
        if let Some(claim) = &a.claim {
            self.in_flight.lock().expect("in-flight map poisoned").insert(
                id,
                InFlight {
                    claim: claim.clone(),
                    receipt: d.receipt.clone(),
                    interrupt: interrupt.clone(),
                },
            );
        }
        let span = tracing::info_span!("message", plugin = %a.plugin.name, key = %a.key, attempt = a.attempt, fence = a.claim.as_ref().map(|c| c.fence));
        let exec = Execution {
            msg_id: d.envelope.id.clone(),
            key: a.key.clone(),
            attempt: a.attempt,
            headers: d.envelope.headers.clone(),
            payload: d.envelope.payload.clone(),
            claim: a.claim.clone(),
            interrupt,
        };
        let started = std::time::Instant::now();
        let outcome = match &a.claim {
            // A takeover: make the data store refuse the previous owner first.
            Some(claim) if claim.fence > 1 => match self.backends.data.advance_fence(claim).await {
                Ok(()) => self.runtime.execute(&self.caps, &a.plugin, exec).instrument(span.clone()).await,
                Err(e) => Outcome::HostError(format!("cannot advance the fence in the data store: {e}")),
            },
            _ => self.runtime.execute(&self.caps, &a.plugin, exec).instrument(span.clone()).await,
        };
        self.durations.record(&a.plugin.name, started.elapsed().as_secs_f64());
        drop(_registered);
        self.settle(d, a, outcome).instrument(span).await;
    }

    async fn settle(&self, d: Delivery, a: Admitted, outcome: Outcome) {
        let c = &self.counters;
        let Some(claim) = a.claim.clone() else {
            // Unguarded run (claim store down): ack only a success.
            match outcome {
                Outcome::Done => {
                    Counters::inc(&c.done);
                    self.ack(vec![&d.receipt]).await;
                }
                _ => self.nack(&d.receipt, self.options.busy_retry).await,
            }
            return;
        };
        match outcome {
            Outcome::Done => {
                let settled = Settled {
                    claim,
                    receipt: d.receipt,
                    envelope: self.options.on_done.is_some().then_some(d.envelope),
                };
                if let Err(unsent) = self.settle_tx.send(settled).await {
                    // The settler is gone (cannot happen while `run` runs):
                    // confirm this one on its own.
                    self.confirm_batch(vec![unsent.0]).await;
                }
            }
            Outcome::Permanent(reason) => {
                Counters::inc(&c.permanent_errors);
                self.dead_letter(&d, &a, &claim, &format!("permanent error: {reason}")).await;
            }
            Outcome::Transient(reason) => self.retry_or_dead_letter(&d, &a, &claim, &reason, false).await,
            Outcome::Trapped(reason) => {
                Counters::inc(&c.traps);
                tracing::warn!(%reason, "handler trapped");
                self.retry_or_dead_letter(&d, &a, &claim, &reason, true).await
            }
            Outcome::FenceLost => {
                Counters::inc(&c.fence_rejections);
                tracing::warn!("execution stopped: the claim was taken over; handing the delivery back");
                self.hand_back(&d.receipt).await;
            }
            Outcome::Crashed => {
                tracing::info!("simulated crash: abandoning the execution without settling");
            }
            Outcome::HostError(reason) => {
                // Not the plugin's fault (e.g. no free instance slot): retry
                // without counting a trap.
                tracing::warn!(%reason, "host error before the handler ran");
                self.retry_or_dead_letter(&d, &a, &claim, &reason, false).await
            }
        }
    }

    /// Confirm and ack successful executions in batches until `stop`, then
    /// flush what is queued.
    async fn settle_loop(&self, mut rx: tokio::sync::mpsc::Receiver<Settled>, stop: CancellationToken) {
        let mut batch = Vec::with_capacity(SETTLE_BATCH);
        loop {
            tokio::select! {
                biased;
                n = rx.recv_many(&mut batch, SETTLE_BATCH) => if n == 0 { return },
                _ = stop.cancelled() => {
                    rx.close();
                    while rx.recv_many(&mut batch, SETTLE_BATCH).await > 0 {
                        self.confirm_batch(std::mem::take(&mut batch)).await;
                    }
                    return;
                }
            }
            self.confirm_batch(std::mem::take(&mut batch)).await;
        }
    }

    /// Confirm claims (one round trip), then ack what was confirmed (one
    /// more). A refused confirm means the claim was taken over: its
    /// delivery is handed back.
    async fn confirm_batch(&self, items: Vec<Settled>) {
        let c = &self.counters;
        let claims: Vec<ClaimRef> = items.iter().map(|s| s.claim.clone()).collect();
        match self.backends.claims.confirm(&claims, now_ms()).await {
            Ok(confirmed) => {
                let mut done = Vec::with_capacity(items.len());
                for (item, ok) in items.iter().zip(confirmed) {
                    if ok {
                        Counters::inc(&c.done);
                        done.push(item);
                    } else {
                        Counters::inc(&c.fence_rejections);
                        let claim = &item.claim;
                        tracing::warn!(plugin = %claim.plugin, key = %claim.key, fence = claim.fence, "confirm refused: the claim was taken over; handing the delivery back");
                        self.hand_back(&item.receipt).await;
                    }
                }
                self.ack(done.iter().map(|i| i.receipt.as_str()).collect()).await;
                if let Some(hook) = &self.options.on_done {
                    for e in done.iter().filter_map(|i| i.envelope.as_ref()) {
                        (hook.0)(e);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, count = items.len(), "confirm failed; handing the deliveries back");
                for item in &items {
                    self.hand_back(&item.receipt).await;
                }
            }
        }
    }

    async fn retry_or_dead_letter(&self, d: &Delivery, a: &Admitted, claim: &ClaimRef, reason: &str, trapped: bool) {
        let policy = &self.options.retry;
        let traps = a.traps + trapped as u32;
        if a.attempt >= policy.max_attempts {
            let why = format!("attempts exhausted ({} of {}): {reason}", a.attempt, policy.max_attempts);
            return self.dead_letter(d, a, claim, &why).await;
        }
        if trapped && traps >= policy.max_traps {
            let why = format!("trapped {traps} times (retry.max_traps = {}): {reason}", policy.max_traps);
            return self.dead_letter(d, a, claim, &why).await;
        }
        let delay = retry::backoff(policy, a.attempt, rand::random::<f64>());
        let now = now_ms();
        match self
            .backends
            .claims
            .release(claim, now + delay.as_millis() as i64, reason, trapped, now)
            .await
        {
            Ok(true) => {
                Counters::inc(&self.counters.retries);
                tracing::info!(?delay, %reason, "retrying later");
                self.nack(&d.receipt, delay).await;
            }
            Ok(false) => {
                Counters::inc(&self.counters.fence_rejections);
                tracing::warn!("release refused: the claim was taken over");
                self.hand_back(&d.receipt).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "release failed; the lease will expire and the message be redelivered");
                self.hand_back(&d.receipt).await;
            }
        }
    }

    async fn dead_letter(&self, d: &Delivery, a: &Admitted, claim: &ClaimRef, reason: &str) {
        let item = DeadLetterRequest {
            plugin: &a.plugin.name,
            key: &a.key,
            msg_id: &d.envelope.id,
            headers: &d.envelope.headers,
            payload: &d.envelope.payload,
            reason,
            fence: Some(claim.fence),
            plugin_version: Some(&a.plugin.version),
        };
        match self.backends.claims.dead_letter(&[item], now_ms()).await {
            Ok(v) if v.first() == Some(&true) => {
                Counters::inc(&self.counters.dead_lettered);
                tracing::warn!(%reason, "dead-lettered");
                self.ack(vec![&d.receipt]).await;
            }
            Ok(_) => {
                Counters::inc(&self.counters.fence_rejections);
                tracing::warn!("dead-letter refused: the claim was taken over");
                self.hand_back(&d.receipt).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "dead-letter failed; the message will be redelivered");
                self.hand_back(&d.receipt).await;
            }
        }
    }

    async fn ack(&self, receipts: Vec<&str>) {
        if receipts.is_empty() {
            return;
        }
        if let Err(e) = self.backends.broker.ack(&receipts).await {
            // The outcome is durable already: a redelivery finds it settled.
            tracing::warn!(error = %e, "ack failed; the settled message will be redelivered and acked as a duplicate");
        }
    }

    /// A delivery this worker will not settle goes back to the broker
    /// (never acked): the claim's owner settles the message, and the
    /// redelivery then finds it done (a duplicate) or busy. Without this a
    /// broker with no visibility timeout (RabbitMQ) would hold it until the
    /// connection closed.
    async fn hand_back(&self, receipt: &str) {
        self.nack(receipt, self.options.busy_retry).await;
    }

    async fn nack(&self, receipt: &str, delay: Duration) {
        if let Err(e) = self.backends.broker.nack(receipt, delay).await {
            tracing::warn!(error = %e, "nack failed; the delivery becomes visible when its visibility timeout ends");
        }
    }

    async fn heartbeat_loop(&self, every: Duration, stop: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (ids, claims, receipts): (Vec<u64>, Vec<ClaimRef>, Vec<String>) = {
                let map = self.in_flight.lock().expect("in-flight map poisoned");
                let mut ids = Vec::with_capacity(map.len());
                let mut claims = Vec::with_capacity(map.len());
                let mut receipts = Vec::with_capacity(map.len());
                for (id, f) in map.iter() {
                    ids.push(*id);
                    claims.push(f.claim.clone());
                    receipts.push(f.receipt.clone());
                }
                (ids, claims, receipts)
            };
            if claims.is_empty() {
                continue;
            }
            match self
                .backends
                .claims
                .extend(&claims, self.options.lease.as_millis() as i64, now_ms())
                .await
            {
                Ok(held) => {
                    let map = self.in_flight.lock().expect("in-flight map poisoned");
                    for ((ok, id), claim) in held.iter().zip(&ids).zip(&claims) {
                        if *ok {
                            Counters::inc(&self.counters.lease_extensions);
                        } else if let Some(f) = map.get(id) {
                            // Still running, yet the lease is gone: taken over.
                            tracing::warn!(plugin = %claim.plugin, key = %claim.key, fence = claim.fence, "lease lost to another worker; interrupting the execution");
                            f.interrupt.store(true, Ordering::Relaxed);
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "lease extension failed; will retry at the next heartbeat"),
            }
            let refs: Vec<&str> = receipts.iter().map(String::as_str).collect();
            if let Err(e) = self.backends.broker.extend(&refs, self.options.visibility).await {
                tracing::warn!(error = %e, "visibility extension failed");
            }
        }
    }
}

/// Removes an execution from the heartbeat's map however it ends (a panic
/// included), so a dead execution's lease is never extended.
struct InFlightGuard<'a> {
    worker: &'a Worker,
    id: u64,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.worker.in_flight.lock() {
            map.remove(&self.id);
        }
    }
}

/// An admitted delivery: what runs, under which claim.
struct Admitted {
    plugin: Arc<Plugin>,
    key: String,
    claim: Option<ClaimRef>,
    attempt: u32,
    traps: u32,
}

async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) {
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = tokio::time::sleep(d) => {}
    }
}
