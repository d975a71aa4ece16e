//! Consuming: the server pushes deliveries to this connection's consumer
//! (up to the prefetch); `fetch` hands them out and `pending` counts them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::stream::{self, SelectAll};
use futures::{FutureExt, StreamExt};
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

use super::link::{Arrival, Inbox, Link};
use super::wire::{delivery_count, due_prefix, not_before, unavailable, Held, Incoming};
use super::AmqpBroker;
use crate::broker::BrokerError;

/// The longest `fetch` waits for a first delivery: the worker checks for
/// shutdown between fetches.
const FETCH_WAIT: Duration = Duration::from_millis(100);

impl Link {
    /// Take one item of the merged consumer streams into the inbox.
    pub(super) fn arrive(&self, inbox: &mut Inbox, item: Option<Arrival>) -> Result<(), BrokerError> {
        match item {
            Some((queue, Some(Ok(delivery)))) => {
                // Kept in delivery-tag order, the order the server sent them
                // on the channel. The merged streams (one per queue) can
                // yield them out of it, and a fetch hands out the front of
                // the inbox: whatever stays behind must have higher tags than
                // anything handed out, or a `multiple` ack of what was handed
                // out would also ack a delivery still waiting here.
                let tag = delivery.delivery_tag;
                let at = inbox.arrived.partition_point(|(_, d)| d.delivery_tag < tag);
                inbox.arrived.insert(at, (queue, delivery));
                Ok(())
            }
            Some((_, Some(Err(e)))) => {
                self.broken.store(true, Ordering::Relaxed);
                Err(unavailable("consume", e))
            }
            Some((queue, None)) => {
                self.broken.store(true, Ordering::Relaxed);
                Err(BrokerError::Unavailable(format!(
                    "RabbitMQ cancelled Idem's consumer of queue {} (was the queue deleted?); reconnecting",
                    self.queues[queue]
                )))
            }
            None => {
                self.broken.store(true, Ordering::Relaxed);
                Err(BrokerError::Unavailable("RabbitMQ cancelled Idem's consumers; reconnecting".into()))
            }
        }
    }

    /// Move every delivery that has already arrived into the inbox, without
    /// waiting. Bounded: the server pushes at most the consumer's prefetch unacked
    /// (default [`PREFETCH`](super::link::PREFETCH)).
    pub(super) fn drain(&self, inbox: &mut Inbox) -> Result<(), BrokerError> {
        while let Some(item) = inbox.consumers.as_mut().and_then(|c| c.next().now_or_never()) {
            self.arrive(inbox, item)?;
        }
        Ok(())
    }

    /// Start consuming every queue, once.
    pub(super) async fn consume(&self, inbox: &mut Inbox) -> Result<(), BrokerError> {
        if inbox.consumers.is_some() {
            return Ok(());
        }
        let mut merged = SelectAll::new();
        for (index, queue) in self.queues.iter().enumerate() {
            let tag = format!("idem-{}", uuid::Uuid::new_v4().simple());
            let consumer = self
                .consumer_channel
                .basic_consume(
                    queue.as_str().into(),
                    tag.into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    self.broken.store(true, Ordering::Relaxed);
                    unavailable(&format!("consume queue {queue}"), e)
                })?;
            // A stream that ends was cancelled by the server: say which.
            let cancelled = stream::once(async move { (index, None) });
            merged.push(consumer.map(move |item| (index, Some(item))).chain(cancelled).boxed());
        }
        inbox.consumers = Some(merged);
        Ok(())
    }
}

impl AmqpBroker {
    /// What [`Broker::fetch`](crate::broker::Broker::fetch) does: up to
    /// `max` deliveries, each converted by `convert` and held until it is
    /// settled.
    pub(crate) async fn take_with<T>(&self, max: usize, mut convert: impl FnMut(Incoming<'_>) -> T) -> Result<Vec<T>, BrokerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let link = self.link().await?;
        let mut inbox = link.inbox.lock().await;
        link.consume(&mut inbox).await?;
        if inbox.arrived.is_empty() {
            let consumers = inbox.consumers.as_mut().expect("consuming");
            match tokio::time::timeout(FETCH_WAIT, consumers.next()).await {
                Err(_) => return Ok(Vec::new()),
                Ok(item) => link.arrive(&mut inbox, item)?,
            }
        }
        link.drain(&mut inbox)?;
        let now = crate::now_ms();
        let n = due_prefix(inbox.arrived.iter().map(|(_, d)| &d.properties), max, now);
        if n == 0 {
            // The oldest delivery left its delay bucket before its time:
            // wait for it (briefly; the worker checks for shutdown between
            // fetches), with the inbox free for other fetches.
            let head = inbox.arrived.front().and_then(|(_, d)| not_before(&d.properties)).unwrap_or(now);
            drop(inbox);
            let early = Duration::from_millis(u64::try_from(head - now).unwrap_or(0));
            tokio::time::sleep(early.min(FETCH_WAIT)).await;
            return Ok(Vec::new());
        }
        // Registered before the inbox is released: every unacked tag below
        // one the worker holds is in `held`, which `ack` relies on.
        let mut held = link.held();
        let out = inbox
            .arrived
            .drain(..n)
            .map(|(queue, d)| {
                let deliveries = delivery_count(&d);
                let out = convert(Incoming {
                    receipt: format!("{}.{}", link.epoch, d.delivery_tag),
                    deliveries,
                    properties: &d.properties,
                    body: &d.data,
                });
                let entry = Held {
                    properties: d.properties,
                    body: d.data,
                    deliveries,
                    queue,
                    settling: false,
                };
                held.insert(d.delivery_tag, entry);
                out
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
        for (_, name) in self.names.delays.iter().flatten() {
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
        for queue in &self.names.queues {
            let q = link
                .consumer_channel
                .queue_declare(queue.as_str().into(), passive, FieldTable::default())
                .await
                .map_err(|e| unavailable(&format!("count queue {queue}"), e))?;
            total += u64::from(q.message_count());
        }
        let mut inbox = link.inbox.lock().await;
        link.drain(&mut inbox)?;
        total += inbox.arrived.len() as u64;
        drop(inbox);
        total += link.held().len() as u64;
        Ok(total)
    }
}
