//! Confirming successful executions in batches: one task, off the handler
//! slots, confirms many claims in one round trip to the claim store and
//! acks what was confirmed in one more. A slot is free again as soon as
//! its handler returns.

use std::sync::Arc;

use tokio::sync::mpsc::{Receiver, Sender};
use tokio_util::sync::CancellationToken;

use super::Worker;
use crate::broker::{Answer, Verdict};
use crate::claim::ClaimRef;
use crate::envelope::Envelope;
use crate::stats::Counters;
use crate::store::Confirm;

/// Most confirmations sent to the claim store (and acks to the broker) in
/// one round trip.
pub(super) const CONFIRM_BATCH: usize = 256;

/// An execution that returned ok, waiting for its confirm and ack.
pub(super) struct AwaitingConfirm {
    /// Its claim, confirmed only if the fence still holds.
    pub claim: ClaimRef,
    /// The broker's handle, acked after the confirm.
    pub receipt: String,
    /// The message (its id answers the producer).
    pub envelope: Arc<Envelope>,
    /// The handler's result, stored with the claim.
    pub result: Option<Vec<u8>>,
    /// Whether the `on_done` hook wants the message after the ack.
    pub hook: bool,
    /// Keeps the lease extended until the confirm: a finished execution
    /// waiting for its batch is never taken for a crashed one.
    pub held: super::heartbeat::Registered,
}

/// The queue of executions waiting for their confirm.
pub(super) struct ConfirmQueue {
    pub tx: Sender<AwaitingConfirm>,
    pub rx: std::sync::Mutex<Option<Receiver<AwaitingConfirm>>>,
}

impl ConfirmQueue {
    /// Room for `capacity` executions (the worker gives every slot's result
    /// several times over, plus a batch).
    pub(super) fn new(capacity: usize) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
        ConfirmQueue {
            tx,
            rx: std::sync::Mutex::new(Some(rx)),
        }
    }
}

impl Worker {
    /// Queue a successful execution for the batched confirm, once the queue
    /// has room. It is marked finished and queued in one step, with no
    /// await between: a shutdown's grace period ending meanwhile finds it
    /// either still running (and releases it; it is not queued) or queued
    /// (and the confirm task's flush confirms it).
    pub(super) async fn await_confirm(&self, waiting: AwaitingConfirm) {
        match self.confirms.tx.reserve().await {
            Ok(room) => {
                if waiting.held.finished() {
                    room.send(waiting);
                }
            }
            // The confirm task is gone (cannot happen while `run` runs):
            // confirm this one on its own.
            Err(_) => self.confirm_batch(vec![waiting]).await,
        }
    }

    /// Confirm and ack in batches until `stop`, then flush what is queued.
    pub(super) async fn confirm_loop(&self, mut rx: Receiver<AwaitingConfirm>, stop: CancellationToken) {
        let mut batch = Vec::with_capacity(CONFIRM_BATCH);
        loop {
            tokio::select! {
                biased;
                n = rx.recv_many(&mut batch, CONFIRM_BATCH) => if n == 0 { return },
                _ = stop.cancelled() => {
                    rx.close();
                    while rx.recv_many(&mut batch, CONFIRM_BATCH).await > 0 {
                        self.confirm_batch(std::mem::take(&mut batch)).await;
                    }
                    return;
                }
            }
            if let Some(delay) = self.caps.hooks.delay_confirm {
                tokio::time::sleep(delay).await;
            }
            self.confirm_batch(std::mem::take(&mut batch)).await;
        }
    }

    /// Confirm claims (one round trip, or none of its own where the data
    /// store commits them with its next batch of writes), then ack what was
    /// confirmed (one more). A refused confirm means the claim was taken
    /// over: its delivery is handed back.
    async fn confirm_batch(&self, items: Vec<AwaitingConfirm>) {
        let c = &self.counters;
        let now = self.backends.clock.now_ms();
        let data = &self.backends.data;
        let confirmed = if data.confirms_claims() {
            let confirms = items
                .iter()
                .map(|s| Confirm {
                    claim: s.claim.clone(),
                    result: s.result.clone(),
                })
                .collect();
            data.confirm(confirms, now).await
        } else {
            let claims: Vec<ClaimRef> = items.iter().map(|s| s.claim.clone()).collect();
            let results: Vec<Option<&[u8]>> = items.iter().map(|s| s.result.as_deref()).collect();
            self.backends.claims.confirm_with_results(&claims, &results, now).await
        };
        match confirmed {
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
                self.answer_and_ack(
                    done.iter()
                        .map(|i| Answer {
                            receipt: &i.receipt,
                            msg_id: &i.envelope.id,
                            verdict: Verdict::Done(i.result.as_deref()),
                        })
                        .collect(),
                )
                .await;
                if let Some(hook) = &self.caps.hooks.on_done {
                    for i in done.iter().filter(|i| i.hook) {
                        hook(&i.envelope);
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
}
