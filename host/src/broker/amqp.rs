//! RabbitMQ broker (AMQP 0-9-1): manual acks, prefetch, publisher confirms,
//! TTL delay queues and a dead-letter exchange.
//!
//! Topology, declared by [`AmqpBroker::connect`] (idempotent, all durable):
//! ```text
//! publish(delay 0) ─────────▶ {ns}.queue ──consume (prefetch, manual ack)──▶ fetch
//!                                ▲   └─ rejected without requeue ─▶ {ns}.dead (fanout exchange) ─▶ {ns}.dead (queue)
//! publish(delay > 0) ─▶ {ns}.delay.{ms} (x-message-ttl = ms)
//! nack(delay > 0)    ─▶    └─ expires ─▶ dead-lettered through the default exchange back to {ns}.queue
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
//!   `extend` has nothing to do.
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

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{anyhow, Context};
use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer, ExchangeKind, PublisherConfirm};

use super::{Broker, BrokerError};
use crate::envelope::{Delivery, Envelope};

/// Delay queues, in milliseconds. Few and fixed: every bucket is a queue
/// each worker declares, and the worker's retry delays (busy retry,
/// exponential backoff) land within a factor of about 5 of what they asked.
const DELAY_BUCKETS_MS: [u64; 7] = [50, 250, 1_000, 5_000, 30_000, 120_000, 600_000];

/// Deliveries the server may push to one consumer before they are acked:
/// enough to fill a few fetch batches without a round trip, few enough that
/// one worker does not hoard a queue that other workers could be serving.
const PREFETCH: u16 = 256;

/// The longest `fetch` waits for a first delivery: the worker checks for
/// shutdown between fetches.
const FETCH_WAIT: Duration = Duration::from_millis(100);

/// A connection attempt that takes longer is an outage, not a slow server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a publish waits for the server's confirm.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

const HANDLER_HEADER: &str = "idem-handler";
const DELIVERIES_HEADER: &str = "idem-deliveries";

/// Headers RabbitMQ adds when it dead-letters a message (here: each time a
/// delay expires). They are the server's, not the producer's, and a copy
/// republished by `nack` must not accumulate them.
const SERVER_HEADERS: [&str; 8] = [
    "x-death",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-first-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-last-death-exchange",
    "x-delivery-count",
];

/// AMQP delivery mode 2: the server writes the message to disk (in a
/// durable queue) before it confirms it.
const PERSISTENT: u8 = 2;

/// The names of one namespace's queues and exchange.
struct Names {
    queue: String,
    dead: String,
    delays: Vec<(u64, String)>,
}

impl Names {
    fn new(namespace: &str) -> Self {
        Names {
            queue: format!("{namespace}.queue"),
            dead: format!("{namespace}.dead"),
            delays: DELAY_BUCKETS_MS.iter().map(|ms| (*ms, format!("{namespace}.delay.{ms}"))).collect(),
        }
    }

    /// Where a message that should become visible after `delay` goes.
    fn route(&self, delay: Duration) -> &str {
        if delay.is_zero() {
            return &self.queue;
        }
        let ms = delay.as_millis();
        let bucket = self.delays.iter().find(|(bucket, _)| u128::from(*bucket) >= ms);
        &bucket.or(self.delays.last()).expect("there are delay buckets").1
    }
}

/// What `nack` needs to republish a delivery it has not acked yet.
struct Held {
    properties: BasicProperties,
    body: Vec<u8>,
    deliveries: u32,
    /// An ack or nack of this tag is under way: a second one would be an
    /// AMQP error that closes the channel, and a `multiple` ack must not
    /// cover it.
    settling: bool,
}

/// Deliveries the server pushed and `fetch` has not handed out yet.
struct Inbox {
    /// Started by the first `fetch`: a broker that only publishes or counts
    /// (`idem publish`, `idem stats`) must not take deliveries it never
    /// hands out.
    consumer: Option<Consumer>,
    arrived: VecDeque<AmqpDelivery>,
}

/// The connections with their channels. Replaced as a whole when any part
/// of it fails, so receipts, tags and channels always belong together.
struct Link {
    epoch: u64,
    /// Consuming and publishing use separate connections, as RabbitMQ
    /// advises: during a memory or disk alarm the server stops reading from
    /// connections that publish, and acks on such a connection would wait
    /// too, while acking is what frees the server's memory.
    consuming: Connection,
    publishing: Connection,
    /// In confirm mode: every publish waits for the server's confirm.
    publisher: Channel,
    /// Consumes the main queue; deliveries are acked on it.
    consumer_channel: Channel,
    /// Passive declares of the delay queues for `pending` (a missing queue
    /// closes the channel it is asked on, so not one that matters).
    admin: Mutex<Option<Channel>>,
    inbox: tokio::sync::Mutex<Inbox>,
    /// Fetched deliveries not yet acked, by delivery tag.
    held: Mutex<BTreeMap<u64, Held>>,
    /// The main queue's name.
    queue: String,
    /// The consumer was cancelled or failed, or a queue is missing.
    broken: AtomicBool,
}

impl Link {
    async fn open(url: &str, names: &Names, epoch: u64) -> anyhow::Result<Link> {
        let hint = || {
            format!(
                "cannot connect to RabbitMQ at broker.url = {}: check the server is running and the user/password/vhost",
                redact(url)
            )
        };
        let dial = |role: &str| {
            // No lapin auto-recovery: it would reopen channels whose delivery
            // tags restart at 1 under receipts the worker still holds. A
            // broken link is replaced as a whole, with a new epoch, instead.
            let properties = ConnectionProperties::default().with_connection_name(format!("idem {} {role}", names.queue).into());
            async move {
                tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(url, properties))
                    .await
                    .map_err(|_| anyhow!("no answer within {CONNECT_TIMEOUT:?}"))
                    .and_then(|r| r.map_err(anyhow::Error::from))
                    .with_context(hint)
            }
        };
        let publishing = dial("publisher").await?;
        let consuming = dial("consumer").await?;

        let publisher = publishing.create_channel().await.with_context(hint)?;
        declare(&publisher, names).await?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .context("cannot enable publisher confirms on RabbitMQ")?;

        let consumer_channel = consuming.create_channel().await.with_context(hint)?;
        consumer_channel
            .basic_qos(PREFETCH, BasicQosOptions::default())
            .await
            .context("cannot set the prefetch (basic.qos) on RabbitMQ")?;

        Ok(Link {
            epoch,
            consuming,
            publishing,
            publisher,
            consumer_channel,
            admin: Mutex::new(None),
            inbox: tokio::sync::Mutex::new(Inbox {
                consumer: None,
                arrived: VecDeque::new(),
            }),
            queue: names.queue.clone(),
            held: Mutex::new(BTreeMap::new()),
            broken: AtomicBool::new(false),
        })
    }

    fn healthy(&self) -> bool {
        !self.broken.load(Ordering::Relaxed)
            && self.consuming.status().connected()
            && self.publishing.status().connected()
            && self.publisher.status().connected()
            && self.consumer_channel.status().connected()
    }

    fn held(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Send one message; the returned confirm resolves when the server has
    /// taken responsibility for it.
    async fn send(&self, route: &str, body: &[u8], properties: BasicProperties) -> Result<PublisherConfirm, BrokerError> {
        // Mandatory: a message no queue takes is returned, not dropped, and
        // the confirm says so.
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        self.publisher
            .basic_publish("".into(), route.into(), options, body, properties)
            .await
            .map_err(|e| unavailable("publish", e))
    }

    /// Whether the server confirmed a message as stored.
    async fn confirmed(&self, confirm: PublisherConfirm, route: &str) -> Result<(), BrokerError> {
        // Bounded: a server in a resource alarm holds confirms back, and a
        // settling worker must not hang on it. A confirm that comes after
        // the timeout leaves a copy that the claim store answers as a
        // duplicate.
        let confirmation = tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await.map_err(|_| {
            BrokerError::Unavailable(format!(
                "RabbitMQ did not confirm a message sent to queue {route} within {CONFIRM_TIMEOUT:?}: check the server's memory and disk alarms"
            ))
        })?;
        match confirmation.map_err(|e| unavailable("publisher confirm", e))? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => {
                // The queue was deleted behind our back: reconnecting
                // declares it again.
                self.broken.store(true, Ordering::Relaxed);
                Err(BrokerError::Unavailable(format!(
                    "RabbitMQ returned a message sent to queue {route} ({} {}): the queue is missing; it is declared again on reconnect",
                    returned.reply_code, returned.reply_text
                )))
            }
            Confirmation::Nack(_) => Err(BrokerError::Unavailable(format!(
                "RabbitMQ refused a message sent to queue {route} (publisher confirm nack): check the server's disk and memory alarms"
            ))),
            Confirmation::NotRequested => Err(BrokerError::Unavailable(
                "RabbitMQ publisher confirms are not enabled on the publishing channel".into(),
            )),
        }
    }

    /// Take one item of the consumer stream into the inbox.
    fn arrive(&self, inbox: &mut Inbox, item: Option<lapin::Result<AmqpDelivery>>) -> Result<(), BrokerError> {
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
    /// waiting. Bounded: the server pushes at most [`PREFETCH`] unacked.
    fn drain(&self, inbox: &mut Inbox) -> Result<(), BrokerError> {
        while let Some(item) = inbox.consumer.as_mut().and_then(|c| c.next().now_or_never()) {
            self.arrive(inbox, item)?;
        }
        Ok(())
    }

    /// Start consuming, once.
    async fn consume(&self, inbox: &mut Inbox) -> Result<(), BrokerError> {
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

    /// A channel for passive declares, opened on demand.
    async fn admin(&self) -> Result<Channel, BrokerError> {
        let cached = self.admin.lock().unwrap_or_else(|e| e.into_inner()).take();
        match cached {
            Some(ch) if ch.status().connected() => Ok(ch),
            _ => self.consuming.create_channel().await.map_err(|e| unavailable("open a channel", e)),
        }
    }

    fn return_admin(&self, ch: Channel) {
        *self.admin.lock().unwrap_or_else(|e| e.into_inner()) = Some(ch);
    }
}

/// Declare the namespace's exchange and queues.
async fn declare(ch: &Channel, names: &Names) -> anyhow::Result<()> {
    let mismatch = |what: &str, name: &str| {
        format!(
            "cannot declare RabbitMQ {what} {name}: if it exists with other settings (durability, x-message-ttl, dead-letter arguments), \
             delete it or choose another namespace"
        )
    };
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    ch.exchange_declare(
        names.dead.as_str().into(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .with_context(|| mismatch("exchange", &names.dead))?;
    ch.queue_declare(names.dead.as_str().into(), durable, FieldTable::default())
        .await
        .with_context(|| mismatch("queue", &names.dead))?;
    ch.queue_bind(
        names.dead.as_str().into(),
        names.dead.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .with_context(|| format!("cannot bind RabbitMQ queue {0} to exchange {0}", names.dead))?;

    let mut main = FieldTable::default();
    main.insert("x-dead-letter-exchange".into(), string_value(&names.dead));
    ch.queue_declare(names.queue.as_str().into(), durable, main)
        .await
        .with_context(|| mismatch("queue", &names.queue))?;

    for (ms, name) in &names.delays {
        let mut args = FieldTable::default();
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(*ms as i64));
        // The default exchange ("") routes by queue name: expired messages
        // go straight back to the main queue.
        args.insert("x-dead-letter-exchange".into(), string_value(""));
        args.insert("x-dead-letter-routing-key".into(), string_value(&names.queue));
        ch.queue_declare(name.as_str().into(), durable, args)
            .await
            .with_context(|| mismatch("queue", name))?;
    }
    Ok(())
}

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
    link: RwLock<Arc<Link>>,
    /// One reconnect at a time.
    reconnecting: tokio::sync::Mutex<()>,
}

impl AmqpBroker {
    /// Delete a namespace's queues and exchange (tests and chaos runs).
    pub async fn delete_namespace(url: &str, namespace: &str) -> anyhow::Result<()> {
        let conn = Connection::connect(url, ConnectionProperties::default()).await?;
        let ch = conn.create_channel().await?;
        let mut queues = vec![format!("{namespace}.queue"), format!("{namespace}.dead")];
        queues.extend(DELAY_BUCKETS_MS.iter().map(|ms| format!("{namespace}.delay.{ms}")));
        for q in queues {
            ch.queue_delete(q.as_str().into(), lapin::options::QueueDeleteOptions::default())
                .await?;
        }
        ch.exchange_delete(
            format!("{namespace}.dead").as_str().into(),
            lapin::options::ExchangeDeleteOptions::default(),
        )
        .await?;
        conn.close(200, "OK".into()).await?;
        Ok(())
    }

    /// Connect to the server at `url` (`amqp://user:password@host:port/vhost`,
    /// vhost `/` written `%2f`) and declare the queues and exchange of
    /// `namespace` (idempotent; workers sharing a namespace share them).
    pub async fn connect(url: &str, namespace: &str) -> anyhow::Result<Self> {
        let names = Names::new(namespace);
        let link = Link::open(url, &names, 1).await?;
        Ok(AmqpBroker {
            url: url.to_string(),
            names,
            link: RwLock::new(Arc::new(link)),
            reconnecting: tokio::sync::Mutex::new(()),
        })
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
            Link::open(&self.url, &self.names, epoch)
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
        let link = self.link().await?;
        let route = self.names.route(delay);
        // Send the whole batch, then wait: the confirms arrive together.
        let mut confirms = Vec::with_capacity(envelopes.len());
        for (e, p) in envelopes.iter().zip(properties) {
            confirms.push(link.send(route, &e.payload, p).await?);
        }
        for confirm in confirms {
            link.confirmed(confirm, route).await?;
        }
        Ok(())
    }

    /// Hand out up to `max` deliveries the server has pushed to this
    /// consumer, waiting at most 100 ms for the first. `visibility` has no
    /// AMQP equivalent (see the module docs): a delivery stays with this
    /// connection until it is acked or the connection closes.
    async fn fetch(&self, max: usize, _visibility: Duration) -> Result<Vec<Delivery>, BrokerError> {
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

    /// `basic.ack` the deliveries. One `multiple` ack when the receipts are
    /// every unacked delivery up to the highest of them, single acks
    /// otherwise. Receipts from a closed connection have no effect: the
    /// server has requeued those messages already.
    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
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

    /// Make the delivery visible again after `delay`. Zero: `basic.nack`
    /// with requeue. Otherwise a copy goes to the delay bucket at or above
    /// `delay` and the original is acked only once the copy is confirmed, so
    /// the message exists somewhere at every moment (a crash in between
    /// leaves two copies, which the claim store answers as a duplicate).
    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
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

/// The AMQP properties that carry an envelope.
fn properties(e: &Envelope) -> Result<BasicProperties, BrokerError> {
    let id = ShortString::try_new(e.id.as_str()).map_err(|_| {
        BrokerError::Unavailable(format!(
            "message id of {} bytes does not fit AMQP's message_id (255 bytes at most): use a shorter id",
            e.id.len()
        ))
    })?;
    let mut headers = FieldTable::default();
    for (name, value) in &e.headers {
        let name = ShortString::try_new(name.as_str()).map_err(|_| {
            BrokerError::Unavailable(format!(
                "header name of {} bytes does not fit an AMQP table (255 bytes at most): use a shorter name",
                name.len()
            ))
        })?;
        headers.insert(name, string_value(value));
    }
    headers.insert(HANDLER_HEADER.into(), string_value(&e.handler));
    Ok(BasicProperties::default()
        .with_message_id(id)
        .with_delivery_mode(PERSISTENT)
        .with_headers(headers))
}

/// The properties of a copy republished by `nack`: the same, with the
/// delivery count it stands for and without the server's dead-letter trail.
fn copy_properties(properties: BasicProperties, deliveries: u32) -> BasicProperties {
    let mut headers = FieldTable::default();
    if let Some(old) = properties.headers() {
        for (name, value) in old {
            if !SERVER_HEADERS.contains(&name.as_str()) {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
    headers.insert(DELIVERIES_HEADER.into(), AMQPValue::LongUInt(deliveries));
    properties.with_headers(headers).with_delivery_mode(PERSISTENT)
}

/// An AMQP delivery as Idem's [`Delivery`], and what `nack` needs to keep.
/// Never fails: a delivery without Idem's headers becomes one with an empty
/// handler (or id), which the worker dead-letters as bad input.
fn convert(d: AmqpDelivery, epoch: u64) -> (Delivery, (u64, Held)) {
    let mut handler = String::new();
    let mut counted = 0u32;
    let mut headers = Vec::new();
    if let Some(table) = d.properties.headers() {
        for (name, value) in table {
            match name.as_str() {
                HANDLER_HEADER => handler = value_string(value),
                DELIVERIES_HEADER => counted = value_string(value).parse().unwrap_or(0),
                n if n.starts_with("idem-") || SERVER_HEADERS.contains(&n) => {}
                n => headers.push((n.to_string(), value_string(value))),
            }
        }
    }
    let delivery_count = (if d.redelivered { 2 } else { 1 }).max(counted);
    let id = d.properties.message_id().as_ref().map(|s| s.to_string()).unwrap_or_default();
    let delivery = Delivery {
        envelope: Envelope {
            id,
            handler,
            headers,
            payload: d.data.clone(),
        },
        receipt: format!("{epoch}.{}", d.delivery_tag),
        delivery_count,
    };
    let held = Held {
        properties: d.properties,
        body: d.data,
        deliveries: delivery_count,
        settling: false,
    };
    (delivery, (d.delivery_tag, held))
}

fn string_value(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A header value as a string, whatever type a foreign producer gave it.
fn value_string(v: &AMQPValue) -> String {
    match v {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.to_string(),
        AMQPValue::ByteArray(b) => String::from_utf8_lossy(b.as_slice()).into_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        AMQPValue::Void => String::new(),
        other => format!("{other:?}"),
    }
}

fn parse_receipt(receipt: &str) -> Result<(u64, u64), BrokerError> {
    let malformed = || BrokerError::Unavailable(format!("malformed receipt {receipt:?}"));
    let (epoch, tag) = receipt.split_once('.').ok_or_else(malformed)?;
    Ok((epoch.parse().map_err(|_| malformed())?, tag.parse().map_err(|_| malformed())?))
}

fn unavailable(what: &str, e: lapin::Error) -> BrokerError {
    BrokerError::Unavailable(format!("RabbitMQ {what}: {e}"))
}

/// The URL without its password, for error messages and logs.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_to_a_bucket() {
        let n = Names::new("ns");
        assert_eq!(n.route(Duration::ZERO), "ns.queue");
        assert_eq!(n.route(Duration::from_millis(1)), "ns.delay.50");
        assert_eq!(n.route(Duration::from_millis(50)), "ns.delay.50");
        assert_eq!(n.route(Duration::from_millis(51)), "ns.delay.250");
        assert_eq!(n.route(Duration::from_secs(4)), "ns.delay.5000");
        assert_eq!(n.route(Duration::from_secs(3600)), "ns.delay.600000");
    }

    #[test]
    fn receipts_and_redaction() {
        assert_eq!(parse_receipt("3.17").unwrap(), (3, 17));
        assert!(parse_receipt("17").is_err());
        assert!(parse_receipt("a.b").is_err());
        assert_eq!(redact("amqp://guest:secret@h:5672/%2f"), "amqp://guest:***@h:5672/%2f");
        assert_eq!(redact("amqp://h:5672/%2f?x=a@b"), "amqp://h:5672/%2f?x=a@b");
        assert_eq!(redact("amqp://user@h"), "amqp://user@h");
    }
}
