//! Consuming: the server pushes deliveries to this connection's consumer
//! (up to the prefetch); `fetch` hands them out and `pending` counts them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

use super::link::{Inbox, Link};
use super::wire::{convert, unavailable};
use super::AmqpBroker;
use crate::broker::BrokerError;
use crate::envelope::Delivery;

/// The longest `fetch` waits for a first delivery: the worker checks for
/// shutdown between fetches.
const FETCH_WAIT: Duration = Duration::from_millis(100);

impl Link {
    /// Take one item of the consumer stream into the inbox.
    pub(super) fn arrive(&self, inbox: &mut Inbox, item: Option<lapin::Result<AmqpDelivery>>) -> Result<(), BrokerError> {
        match item {
            Some(Ok(delivery)) => {
                inbox.arrived.push_back(delivery);
                Ok(())
            }
            Some(Err(e)) => {
                self.broken.store(true, Ordering::Relaxed);
                Err(unavailable("consume", e))
            }
            None => {
                self.broken.store(true, Ordering::Relaxed);
                Err(BrokerError::Unavailable(
                    "RabbitMQ cancelled Idem's consumer (was the queue deleted?); reconnecting".into(),
                ))
            }
        }
    }

    /// Move every delivery that has already arrived into the inbox, without
    /// waiting. Bounded: the server pushes at most [`PREFETCH`](super::link::PREFETCH) unacked.
    pub(super) fn drain(&self, inbox: &mut Inbox) -> Result<(), BrokerError> {
        while let Some(item) = inbox.consumer.as_mut().and_then(|c| c.next().now_or_never()) {
            self.arrive(inbox, item)?;
        }
        Ok(())
    }

    /// Start consuming, once.
    pub(super) async fn consume(&self, inbox: &mut Inbox) -> Result<(), BrokerError> {
        if inbox.consumer.is_none() {
            let tag = format!("idem-{}", uuid::Uuid::new_v4().simple());
            let consumer = self
                .consumer_channel
                .basic_consume(
                    self.queue.as_str().into(),
                    tag.into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    self.broken.store(true, Ordering::Relaxed);
                    unavailable(&format!("consume queue {}", self.queue), e)
                })?;
            inbox.consumer = Some(consumer);
        }
        Ok(())
    }
}

impl AmqpBroker {
    /// What [`Broker::fetch`](crate::broker::Broker::fetch) does.
    pub(super) async fn take(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let link = self.link().await?;
        let mut inbox = link.inbox.lock().await;
        link.consume(&mut inbox).await?;
        if inbox.arrived.is_empty() {
            let consumer = inbox.consumer.as_mut().expect("consuming");
            match tokio::time::timeout(FETCH_WAIT, consumer.next()).await {
                Err(_) => return Ok(Vec::new()),
                Ok(item) => link.arrive(&mut inbox, item)?,
            }
        }
        link.drain(&mut inbox)?;
        let n = max.min(inbox.arrived.len());
        // Registered before the inbox is released: every unacked tag below
        // one the worker holds is in `held`, which `ack` relies on.
        let mut held = link.held();
        let out = inbox
            .arrived
            .drain(..n)
            .map(|d| {
                let (delivery, entry) = convert(d, link.epoch);
                held.insert(entry.0, entry.1);
                delivery
            })
            .collect();
        Ok(out)
    }

    /// What [`Broker::pending`](crate::broker::Broker::pending) does.
    pub(super) async fn count(&self) -> Result<u64, BrokerError> {
        let link = self.link().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let mut total = 0u64;
        // Delay queues before the main queue: a message expiring in between
        // is counted in the main queue rather than in neither.
        let admin = link.admin().await?;
        for (_, name) in &self.names.delays {
            let q = admin
                .queue_declare(name.as_str().into(), passive, FieldTable::default())
                .await
                .map_err(|e| {
                    // Most likely deleted behind our back: reconnecting
                    // declares it again.
                    link.broken.store(true, Ordering::Relaxed);
                    unavailable(&format!("count queue {name}"), e)
                })?;
            total += u64::from(q.message_count());
        }
        link.return_admin(admin);
        // Asked on the consuming channel: its answer comes after every
        // delivery the server sent that channel before counting, so each
        // message is either counted ready or already in the inbox below.
        let q = link
            .consumer_channel
            .queue_declare(self.names.queue.as_str().into(), passive, FieldTable::default())
            .await
            .map_err(|e| unavailable(&format!("count queue {}", self.names.queue), e))?;
        total += u64::from(q.message_count());
        let mut inbox = link.inbox.lock().await;
        link.drain(&mut inbox)?;
        total += inbox.arrived.len() as u64;
        drop(inbox);
        total += link.held().len() as u64;
        Ok(total)
    }
}
