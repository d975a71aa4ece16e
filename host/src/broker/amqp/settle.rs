//! Settling deliveries: acks (batched into one `multiple` ack where that
//! is exact) and nacks (requeue, or a confirmed copy to a delay queue).

use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicNackOptions};

use lapin::BasicProperties;

use super::link::Link;
use super::wire::{copy_properties, parse_receipt, unavailable, with_not_before};
use super::AmqpBroker;
use crate::broker::BrokerError;

/// Longest a delivery whose delay copy failed is held here before it is
/// requeued (RabbitMQ closes a channel holding a delivery unacked past its
/// `consumer_timeout`, 30 minutes by default).
const FALLBACK_HOLD: Duration = Duration::from_secs(30);

impl AmqpBroker {
    /// What [`Broker::ack`](crate::broker::Broker::ack) does.
    pub(super) async fn settle(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        let link = self.current();
        let mut tags = Vec::with_capacity(receipts.len());
        for r in receipts {
            let (epoch, tag) = parse_receipt(r)?;
            if epoch == link.epoch {
                tags.push(tag);
            }
        }
        tags.sort_unstable();
        tags.dedup();
        // The lowest unacked deliveries of the channel, when they are all
        // among these, go in one `multiple` ack of the highest of them:
        // nothing else unacked (fetched, or being settled by another call)
        // lies at or below it, and later deliveries all have higher tags.
        let covered = {
            let mut held = link.held();
            tags.retain(|t| match held.get_mut(t) {
                Some(h) if !h.settling => {
                    h.settling = true;
                    true
                }
                _ => false,
            });
            if tags.is_empty() {
                return Ok(());
            }
            held.keys().zip(&tags).take_while(|(h, t)| h == t).count()
        };
        // The rest one by one, sent together: each ack resolves once its
        // frame is written, and awaiting them in turn would wait for the
        // connection's I/O loop once per delivery.
        let (lowest, rest) = tags.split_at(covered);
        let channel = &link.consumer_channel;
        let multiple = lowest
            .last()
            .map(|&highest| channel.basic_ack(highest, BasicAckOptions { multiple: true }));
        let single = rest.iter().map(|&tag| channel.basic_ack(tag, BasicAckOptions::default()));
        let result = futures::future::try_join_all(multiple.into_iter().chain(single)).await.map(drop);
        // Forgotten whatever the outcome: a failed ack means the channel is
        // gone, and with it the server's record of these deliveries.
        let mut held = link.held();
        for tag in &tags {
            held.remove(tag);
        }
        result.map_err(|e| unavailable("ack", e))
    }

    /// What [`Broker::nack`](crate::broker::Broker::nack) does.
    pub(super) async fn give_back(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        if !delay.is_zero() {
            return self.copy_back(receipt, delay, |p, n| copy_properties(p, n + 1)).await.map(drop);
        }
        let link = self.current();
        let (epoch, tag) = parse_receipt(receipt)?;
        if epoch != link.epoch || link.hold(tag).is_none() {
            return Ok(());
        }
        let options = BasicNackOptions {
            multiple: false,
            requeue: true,
        };
        let result = link.consumer_channel.basic_nack(tag, options).await;
        link.held().remove(&tag);
        result.map_err(|e| unavailable("nack", e))
    }

    /// Replace a held delivery by a copy that becomes visible in its queue
    /// after `delay` (through the delay bucket at or above it), with the
    /// properties `copy` makes of the original's and its delivery count.
    /// The original is acked only once the copy is confirmed, so the
    /// message exists somewhere at every moment (a crash in between leaves
    /// two copies, which the claim store answers as a duplicate); a copy
    /// the delay queue does not take leaves the delivery held here for the
    /// delay (at most [`FALLBACK_HOLD`]), then requeued. Returns
    /// the original's properties, or `None` for a receipt no longer held
    /// (settled already, or from a closed connection).
    pub(crate) async fn copy_back(
        &self,
        receipt: &str,
        delay: Duration,
        copy: impl FnOnce(BasicProperties, u32) -> BasicProperties,
    ) -> Result<Option<BasicProperties>, BrokerError> {
        let link = self.current();
        let (epoch, tag) = parse_receipt(receipt)?;
        if epoch != link.epoch {
            return Ok(None);
        }
        let Some((properties, body, deliveries, queue)) = link.hold(tag) else {
            return Ok(None);
        };
        let route = self.names.route(queue, delay);
        let sent = async {
            let confirm = link
                .send(route, &body, with_not_before(copy(properties.clone(), deliveries), delay))
                .await?;
            link.confirmed(confirm, route).await
        }
        .await;
        if let Err(e) = sent {
            // The delay queue would not take the copy (an alarm, a policy,
            // a queue deleted). RabbitMQ has no visibility timeout, so a
            // delivery left unacked here would wait for its connection to
            // close: it is held here for its delay instead (at most
            // FALLBACK_HOLD), then requeued, and comes back to be tried
            // again.
            let hold = delay.min(FALLBACK_HOLD);
            tracing::warn!(
                error = %e,
                route,
                ?hold,
                "cannot copy a delivery to its delay queue; holding it here, then requeuing it"
            );
            let held = link.clone();
            tokio::spawn(async move {
                tokio::time::sleep(hold).await;
                let options = BasicNackOptions {
                    multiple: false,
                    requeue: true,
                };
                // Answered first, forgotten after, as everywhere: a
                // `multiple` ack counts the held tags below its own, and must
                // not take this one for settled before the nack is sent.
                if let Err(e) = held.consumer_channel.basic_nack(tag, options).await {
                    tracing::debug!(error = %e, "requeue after a failed delay copy: the channel is gone, and the server requeued it");
                }
                held.held().remove(&tag);
            });
            return Ok(Some(properties));
        }
        let result = link.consumer_channel.basic_ack(tag, BasicAckOptions::default()).await;
        link.held().remove(&tag);
        tracing::debug!(tag, route, "delivery moved to a delay queue");
        result.map_err(|e| unavailable("ack after a delayed requeue", e))?;
        Ok(Some(properties))
    }
}

impl Link {
    /// Mark a held delivery as being settled, and what a copy needs of it:
    /// properties, body, delivery count, queue. `None` if it is not held or
    /// already being settled.
    fn hold(&self, tag: u64) -> Option<(BasicProperties, Vec<u8>, u32, usize)> {
        let mut held = self.held();
        match held.get_mut(&tag) {
            Some(h) if !h.settling => {
                h.settling = true;
                Some((h.properties.clone(), h.body.clone(), h.deliveries, h.queue))
            }
            _ => None,
        }
    }
}
