//! The connections to the server and their channels, and publishing with
//! publisher confirms.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Context};
use futures::stream::{BoxStream, SelectAll};
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, PublisherConfirm};

use super::topology::{declare, Names};
use super::wire::{unavailable, Held};
use crate::broker::BrokerError;
use crate::text::redact_url as redact;

/// Deliveries the server may push to one consumer before they are acked,
/// unless the worker asks for another number ([`super::AmqpBroker::connect_with_prefetch`]):
/// enough to fill a few fetch batches without a round trip, few enough that
/// one worker does not hoard a queue that other workers could be serving.
pub(super) const PREFETCH: u16 = 256;

/// A connection attempt that takes longer is an outage, not a slow server.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a publish waits for the server's confirm.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// What one of the consumers yields: the index of its queue, and the next
/// delivery, an error, or `None` when the server cancelled it.
pub(super) type Arrival = (usize, Option<lapin::Result<AmqpDelivery>>);

/// Deliveries the server pushed and `fetch` has not handed out yet.
pub(super) struct Inbox {
    /// One consumer per queue, merged. Started by the first `fetch`: a
    /// broker that only publishes or counts (`idem publish`, `idem stats`)
    /// must not take deliveries it never hands out.
    pub(super) consumers: Option<SelectAll<BoxStream<'static, Arrival>>>,
    /// With the index of the queue each came from.
    pub(super) arrived: VecDeque<(usize, AmqpDelivery)>,
}

/// The connections with their channels. Replaced as a whole when any part
/// of it fails, so receipts, tags and channels always belong together.
pub(super) struct Link {
    pub(super) epoch: u64,
    /// Consuming and publishing use separate connections, as RabbitMQ
    /// advises: during a memory or disk alarm the server stops reading from
    /// connections that publish, and acks on such a connection would wait
    /// too, while acking is what frees the server's memory.
    pub(super) consuming: Connection,
    pub(super) publishing: Connection,
    /// In confirm mode: every publish waits for the server's confirm.
    pub(super) publisher: Channel,
    /// Consumes the queues; deliveries are acked on it.
    pub(super) consumer_channel: Channel,
    /// Passive declares of the delay queues for `pending` (a missing queue
    /// closes the channel it is asked on, so not one that matters).
    pub(super) admin: Mutex<Option<Channel>>,
    pub(super) inbox: tokio::sync::Mutex<Inbox>,
    /// Fetched deliveries not yet acked, by delivery tag.
    pub(super) held: Mutex<BTreeMap<u64, Held>>,
    /// The queues consumed.
    pub(super) queues: Vec<String>,
    /// The consumer was cancelled or failed, or a queue is missing.
    pub(super) broken: AtomicBool,
}

impl Link {
    pub(super) async fn open(url: &str, names: &Names, epoch: u64, prefetch: u16) -> anyhow::Result<Link> {
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
            let properties = ConnectionProperties::default().with_connection_name(format!("idem {} {role}", names.queues.join(",")).into());
            async move {
                tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(url, properties))
                    .await
                    .map_err(|_| anyhow!("no answer within {CONNECT_TIMEOUT:?}"))
                    // lapin quotes a URL it cannot parse whole, password
                    // included.
                    .and_then(|r| r.map_err(|e| anyhow!(crate::text::without_credentials(&e.to_string(), url))))
                    .with_context(hint)
            }
        };
        let publishing = dial("publisher").await?;
        let consuming = dial("consumer").await?;

        let publisher = publishing.create_channel().await.with_context(hint)?;
        declare(&publishing, &publisher, names).await?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .context("cannot enable publisher confirms on RabbitMQ")?;

        let consumer_channel = consuming.create_channel().await.with_context(hint)?;
        consumer_channel
            .basic_qos(prefetch, BasicQosOptions::default())
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
                consumers: None,
                arrived: VecDeque::new(),
            }),
            queues: names.queues.clone(),
            held: Mutex::new(BTreeMap::new()),
            broken: AtomicBool::new(false),
        })
    }

    pub(super) fn healthy(&self) -> bool {
        !self.broken.load(Ordering::Relaxed)
            && self.consuming.status().connected()
            && self.publishing.status().connected()
            && self.publisher.status().connected()
            && self.consumer_channel.status().connected()
    }

    pub(super) fn held(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Send one message; the returned confirm resolves when the server has
    /// taken responsibility for it.
    pub(super) async fn send(&self, route: &str, body: &[u8], properties: BasicProperties) -> Result<PublisherConfirm, BrokerError> {
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
    pub(super) async fn confirmed(&self, confirm: PublisherConfirm, route: &str) -> Result<(), BrokerError> {
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

    /// A channel for passive declares, opened on demand.
    pub(super) async fn admin(&self) -> Result<Channel, BrokerError> {
        let cached = self.admin.lock().unwrap_or_else(|e| e.into_inner()).take();
        match cached {
            Some(ch) if ch.status().connected() => Ok(ch),
            _ => self.consuming.create_channel().await.map_err(|e| unavailable("open a channel", e)),
        }
    }

    pub(super) fn return_admin(&self, ch: Channel) {
        *self.admin.lock().unwrap_or_else(|e| e.into_inner()) = Some(ch);
    }
}
