//! Settling deliveries: acks (batched into one `multiple` ack where that
//! is exact) and nacks (requeue, or a confirmed copy to a delay queue).

use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicNackOptions};

use super::wire::{copy_properties, parse_receipt, unavailable};
use super::AmqpBroker;
use crate::broker::BrokerError;

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
        let multiple = {
            let mut held = link.held();
            tags.retain(|t| match held.get_mut(t) {
                Some(h) if !h.settling => {
                    h.settling = true;
                    true
                }
                _ => false,
            });
            let Some(&highest) = tags.last() else {
                return Ok(());
            };
            // Nothing else unacked (fetched or being settled) at or below the
            // highest tag: later deliveries all have higher tags.
            tags.len() > 1 && held.range(..=highest).count() == tags.len()
        };
        let result = if multiple {
            let highest = *tags.last().expect("not empty");
            link.consumer_channel.basic_ack(highest, BasicAckOptions { multiple: true }).await
        } else {
            let mut result = Ok(());
            for tag in &tags {
                result = link.consumer_channel.basic_ack(*tag, BasicAckOptions::default()).await;
                if result.is_err() {
                    break;
                }
            }
            result
        };
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
        let link = self.current();
        let (epoch, tag) = parse_receipt(receipt)?;
        if epoch != link.epoch {
            return Ok(());
        }
        let (properties, body, deliveries) = {
            let mut held = link.held();
            match held.get_mut(&tag) {
                Some(h) if !h.settling => {
                    h.settling = true;
                    (h.properties.clone(), h.body.clone(), h.deliveries)
                }
                _ => return Ok(()),
            }
        };
        if delay.is_zero() {
            let options = BasicNackOptions {
                multiple: false,
                requeue: true,
            };
            let result = link.consumer_channel.basic_nack(tag, options).await;
            link.held().remove(&tag);
            return result.map_err(|e| unavailable("nack", e));
        }

        let route = self.names.route(delay);
        let copy = copy_properties(properties, deliveries + 1);
        let sent = async {
            let confirm = link.send(route, &body, copy).await?;
            link.confirmed(confirm, route).await
        }
        .await;
        if let Err(e) = sent {
            // Still held, unacked: the caller may nack again, and if this
            // connection goes the server redelivers it.
            if let Some(h) = link.held().get_mut(&tag) {
                h.settling = false;
            }
            return Err(e);
        }
        let result = link.consumer_channel.basic_ack(tag, BasicAckOptions::default()).await;
        link.held().remove(&tag);
        tracing::debug!(tag, route, "delivery moved to a delay queue");
        result.map_err(|e| unavailable("ack after a delayed requeue", e))
    }
}
