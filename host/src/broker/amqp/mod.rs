//! RabbitMQ broker (AMQP 0-9-1): manual acks, prefetch, publisher confirms,
//! TTL delay queues and a dead-letter exchange.
//!
//! Topology, declared by [`AmqpBroker::connect`] (idempotent, all durable):
//! ```text
//! publish(delay 0) ─────────▶ {ns}.queue ──consume (prefetch, manual ack)──▶ fetch
//!                                ▲   └─ rejected without requeue ─▶ {ns}.dead (fanout exchange) ─▶ {ns}.dead (queue)
//! publish(delay > 0) ─▶ {ns}.retry.{ms} (quorum, x-message-ttl = ms)
//! nack(delay > 0)    ─▶    └─ expires ─▶ dead-lettered (at least once) through the default exchange back to {ns}.queue
//! ```
//! Idem itself never rejects a delivery (its dead letters go to the claim
//! store, then the delivery is acked); `{ns}.dead` keeps what is rejected
//! or dead-lettered by anything else (another client, an operator, a queue
//! limit) instead of dropping it.
//!
//! How RabbitMQ's model maps onto the [`Broker`] contract:
//! - **No visibility timeout.** A delivery stays with the channel that
//!   received it until it is acked, or until that channel or its connection
//!   closes; then the server requeues it (with `redelivered` set) for another
//!   consumer. A worker that dies therefore gives its deliveries back when its
//!   TCP connection drops (at once on a crash, after the heartbeat timeout on
//!   a network partition). The server's `consumer_timeout` (30 min by
//!   default) closes a channel that holds one delivery longer than that; raise
//!   it for handlers that run longer. So `fetch` ignores `visibility` and
//!   `extend` has nothing to do; [`Broker::semantics`] says so
//!   ([`Visibility::UntilDisconnect`]).
//! - **Prefetch.** The server pushes up to 256 deliveries to this consumer
//!   ahead of `fetch`; they are invisible to other consumers while they wait
//!   here, exactly like fetched ones.
//! - **Delays.** RabbitMQ has no per-message "visible at". A message waits in
//!   a delay queue whose TTL expires it back into the main queue. TTLs expire
//!   only at the head of a queue, so each delay queue has one fixed TTL (then
//!   queue order is expiry order) and a delay rounds up to the next bucket
//!   (50 ms, 250 ms, 1 s, 5 s, 30 s, 2 min, 10 min; the largest for anything
//!   longer).
//! - **Delivery count.** AMQP only says "redelivered or not": a first
//!   delivery counts 1, a redelivered one 2. A copy republished by `nack`
//!   carries an `idem-deliveries` header one higher than the delivery it
//!   replaces; the count is the larger of the two. Idem counts attempts in
//!   its claim store, so this number is informational.
//! - **Receipts** are `{epoch}.{delivery tag}`. Delivery tags are per channel
//!   and restart at 1 on a new one; the epoch names the consumer channel, so
//!   a receipt from before a reconnect can never ack a different message
//!   that reuses its tag (the server already requeued the old one).
//!
//! Wire format: the body is the raw payload, `message_id` is the envelope id,
//! the headers table carries `idem-handler` and the producer's headers as
//! strings. Header names starting with `idem-` are reserved for Idem; a
//! table has one value per name, ordered by name.
//!
//! Another system's queues: [`AmqpBroker::connect_foreign`] opens the same
//! machinery on queues Idem does not own (Celery's, for the `celery`
//! broker): several consumed queues, each with its own delay buckets
//! (`{ns}.celery.{queue}.retry.{ms}`) that expire back into it, no
//! dead-letter exchange, and the queues declared only when missing, durable
//! and without arguments, as their owner declares them. Deliveries are
//! handed out raw ([`AmqpBroker::take_with`]) for the owner's format.
//!
//! The files follow that model: `topology` declares the queues, `link`
//! holds the connections and publishes with confirms, `consume` takes what
//! the server pushes, `settle` acks and gives deliveries back, `wire` maps
//! envelopes onto AMQP messages.

mod consume;
mod link;
mod settle;
mod topology;
mod wire;

pub(crate) use self::wire::{copy_properties, value_string, Incoming};

use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use lapin::BasicProperties;

use self::link::{Link, CONNECT_TIMEOUT};
use self::topology::Names;
use self::wire::{properties, with_not_before};
use super::{Broker, BrokerError, Semantics, Visibility};
use crate::envelope::{Delivery, Envelope};

/// A queue on a RabbitMQ server.
///
/// Two connections per broker: one with a publishing channel (publisher
/// confirms), one with a consuming channel (prefetch, manual acks). When
/// either fails, the next `fetch`, `publish` or `pending` opens new ones;
/// the server has requeued what the old consumer held, and receipts from it
/// have no effect any more. Dropping the broker closes the connections,
/// which hands every unacked delivery back to the server.
pub struct AmqpBroker {
    url: String,
    names: Names,
    /// The consumer channel's prefetch (basic.qos).
    prefetch: u16,
    link: RwLock<Arc<Link>>,
    /// One reconnect at a time.
    reconnecting: tokio::sync::Mutex<()>,
}

impl AmqpBroker {
    /// Delete a namespace's queues and exchange (tests and chaos runs).
    pub async fn delete_namespace(url: &str, namespace: &str) -> anyhow::Result<()> {
        topology::delete(url, &Names::new(namespace)).await
    }

    /// Connect to the server at `url` (`amqp://user:password@host:port/vhost`,
    /// vhost `/` written `%2f`) and declare the queues and exchange of
    /// `namespace` (idempotent; workers sharing a namespace share them).
    pub async fn connect(url: &str, namespace: &str) -> anyhow::Result<Self> {
        Self::open(url, Names::new(namespace), link::PREFETCH).await
    }

    /// [`AmqpBroker::connect`], with the server pushing at most `prefetch`
    /// unacked deliveries to this worker (a worker sizes it from its places
    /// in hand, `worker.concurrency × worker.prefetch`: see
    /// `backend::open`).
    pub async fn connect_with_prefetch(url: &str, namespace: &str, prefetch: u16) -> anyhow::Result<Self> {
        Self::open(url, Names::new(namespace), prefetch.max(1)).await
    }

    /// Connect to consume another system's `queues` (Celery's): they are
    /// declared only if missing, as that system declares them, and Idem's
    /// delay queues for them live under `namespace`. Deliveries are handed
    /// out raw, through [`AmqpBroker::take_with`].
    pub(crate) async fn connect_foreign(url: &str, namespace: &str, queues: &[String]) -> anyhow::Result<Self> {
        Self::open(url, Names::foreign(namespace, queues), link::PREFETCH).await
    }

    /// Delete the delay queues Idem declared for another system's `queues`.
    pub async fn delete_foreign(url: &str, namespace: &str, queues: &[String]) -> anyhow::Result<()> {
        topology::delete(url, &Names::foreign(namespace, queues)).await
    }

    async fn open(url: &str, names: Names, prefetch: u16) -> anyhow::Result<Self> {
        let link = Link::open(url, &names, 1, prefetch).await?;
        Ok(AmqpBroker {
            url: url.to_string(),
            names,
            prefetch,
            link: RwLock::new(Arc::new(link)),
            reconnecting: tokio::sync::Mutex::new(()),
        })
    }

    /// Publish persistent messages `(body, properties)` to consumed queue
    /// `queue` (no delay) or to its delay bucket at or above `delay`, and
    /// return once the server has confirmed every one of them.
    pub(crate) async fn send_all(&self, queue: usize, messages: Vec<(&[u8], BasicProperties)>, delay: Duration) -> Result<(), BrokerError> {
        let link = self.link().await?;
        let route = self.names.route(queue, delay);
        // Send the whole batch, then wait: the confirms arrive together.
        let mut confirms = Vec::with_capacity(messages.len());
        for (body, p) in messages {
            confirms.push(link.send(route, body, with_not_before(p, delay)).await?);
        }
        for confirm in confirms {
            link.confirmed(confirm, route).await?;
        }
        Ok(())
    }

    /// The current link, as it is (for acks: a new link could not ack
    /// deliveries of the old one anyway).
    fn current(&self) -> Arc<Link> {
        self.link.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The current link, replaced first if it failed.
    async fn link(&self) -> Result<Arc<Link>, BrokerError> {
        let link = self.current();
        if link.healthy() {
            return Ok(link);
        }
        let _one = self.reconnecting.lock().await;
        let old = self.current();
        if old.healthy() {
            return Ok(old);
        }
        let epoch = old.epoch + 1;
        let fresh = Arc::new(
            Link::open(&self.url, &self.names, epoch, self.prefetch)
                .await
                .map_err(|e| BrokerError::Unavailable(format!("{e:#}")))?,
        );
        *self.link.write().unwrap_or_else(|e| e.into_inner()) = fresh.clone();
        tracing::warn!(
            epoch,
            "reconnected to RabbitMQ; deliveries held by the old connection are redelivered"
        );
        // Close the old connections now, so the server requeues what the
        // consumer still held at once rather than when it notices the silence.
        tokio::spawn(async move {
            for connection in [&old.consuming, &old.publishing] {
                let close = connection.close(200, "Idem reconnected".into());
                let _ = tokio::time::timeout(CONNECT_TIMEOUT, close).await;
            }
        });
        Ok(fresh)
    }
}

#[async_trait]
impl Broker for AmqpBroker {
    /// Publish persistent messages to the main queue (no delay) or to the
    /// delay bucket at or above `delay`, and return once the server has
    /// confirmed every one of them.
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError> {
        if envelopes.is_empty() {
            return Ok(());
        }
        // All or none are malformed before anything is sent.
        let properties = envelopes.iter().map(properties).collect::<Result<Vec<_>, _>>()?;
        let messages = envelopes.iter().map(|e| e.payload.as_slice()).zip(properties).collect();
        self.send_all(0, messages, delay).await
    }

    /// Hand out up to `max` deliveries the server has pushed to this
    /// consumer, waiting at most 100 ms for the first. `visibility` has no
    /// AMQP equivalent (see the module docs): a delivery stays with this
    /// connection until it is acked or the connection closes.
    async fn fetch(&self, max: usize, _visibility: Duration) -> Result<Vec<Delivery>, BrokerError> {
        self.take_with(max, wire::convert).await
    }

    /// `basic.ack` the deliveries: those that are every unacked delivery
    /// up to the highest of them in one `multiple` ack, the others in
    /// single acks, all sent together. Receipts from a closed connection
    /// have no effect: the server has requeued those messages already.
    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        self.settle(receipts).await
    }

    /// Make the delivery visible again after `delay`. Zero: `basic.nack`
    /// with requeue. Otherwise a copy goes to the delay bucket at or above
    /// `delay` and the original is acked only once the copy is confirmed, so
    /// the message exists somewhere at every moment (a crash in between
    /// leaves two copies, which the claim store answers as a duplicate).
    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        self.give_back(receipt, delay).await
    }

    /// Nothing to extend: RabbitMQ has no per-delivery visibility timeout.
    /// A delivery stays with this connection until it is acked or the
    /// connection closes (bounded by the server's `consumer_timeout`).
    async fn extend(&self, _receipts: &[&str], _visibility: Duration) -> Result<(), BrokerError> {
        Ok(())
    }

    /// Messages ready in the main queue and the delay queues, plus the
    /// deliveries this broker holds (pushed or fetched, not acked). Other
    /// consumers' unacked deliveries are not visible through AMQP, so with
    /// several workers this counts what is left for all of them plus what
    /// this one holds.
    async fn pending(&self) -> Result<u64, BrokerError> {
        self.count().await
    }

    /// No visibility timeout: deliveries are held until their connection
    /// closes.
    fn semantics(&self) -> Semantics {
        Semantics {
            visibility: Visibility::UntilDisconnect,
            early_fetches_count: false,
            exact_only_at_owner: false,
            receives_counted: false,
        }
    }
}
