//! NATS JetStream broker: one WorkQueue stream per namespace and one durable
//! pull consumer shared by every worker of that namespace.
//!
//! How the [`Broker`] contract maps onto JetStream:
//!
//! - The visibility timeout is the consumer's `ack_wait`, fixed when the
//!   consumer is created (`worker.visibility_ms`). JetStream has no
//!   per-fetch or per-message ack wait, so the `visibility` arguments of
//!   [`Broker::fetch`] and [`Broker::extend`] cannot change it;
//!   [`Broker::semantics`] reports it ([`Visibility::Fixed`]).
//! - `extend` sends `+WPI` (in progress), which restarts `ack_wait` for
//!   that delivery; `nack` sends `-NAK` with a delay, JetStream's own
//!   delayed redelivery; `ack` sends `+ACK`, and WorkQueue retention then
//!   removes the message from the stream.
//! - A delivery's receipt is its ack subject (`$JS.ACK.…`), which names the
//!   stream sequence, the delivery sequence and the delivery count. Every
//!   ack, nak and in-progress is sent with a reply subject and waits for the
//!   server's answer, so when a call returns the server has applied it.
//! - JetStream addresses acks by stream sequence, so on its own it would
//!   apply a stale receipt (from an earlier delivery of the same message) to
//!   the current delivery. This broker remembers the newest delivery it
//!   handed out per message and ignores `nack` and `extend` on older ones,
//!   as the SQLite queue does; an `ack` is applied whatever the receipt,
//!   which is safe because Idem only acks what is settled durably. Stale
//!   receipts held by *another* process cannot be recognised.
//! - Delayed publishing: the servers Idem supports (2.9 to 2.11) have no
//!   per-message delay, so a delayed message carries `Idem-Not-Before`
//!   (unix ms) and a fetch that meets it early naks it for the time left.
//!   A delay is at most [`wire::MAX_DELAY_MS`] (7 days): `publish` refuses
//!   a longer one, and a message stamped further ahead of the reading
//!   worker's clock (another producer's, or one writing microseconds) is
//!   dead-lettered with the reason instead of holding an ack-pending slot
//!   for good.
//!   Each early meeting counts as a delivery in JetStream's delivery count
//!   ([`Semantics::early_fetches_count`]), and the due time is read against
//!   this host's clock.
//! - Delayed messages (and nacked ones) wait in the consumer's ack-pending
//!   set, which is why `max_ack_pending` is large.
//!
//! Wire format: the body is the payload; headers are `Idem-Id`,
//! `Idem-Handler`, `Idem-Not-Before` (delayed only) and the producer's
//! headers. `Nats-Msg-Id` is never set: JetStream would silently drop a
//! duplicate publish, and Idem must see duplicates to suppress them itself.
//!
//! Files: `setup` declares the stream and the consumer, `ack` answers
//! deliveries (ack, nak, in progress) and recognises stale receipts, `wire`
//! maps envelopes onto messages and headers.

mod ack;
mod setup;
mod wire;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream, AckKind};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use self::ack::AckRef;
use self::wire::{envelope, wire_headers};
use super::{Broker, BrokerError, Semantics, Visibility};
use crate::envelope::{Delivery, Envelope};
use crate::now_ms;

/// Name of the durable pull consumer every worker of a namespace shares.
const CONSUMER: &str = "idem";
/// The longest a fetch waits when nothing is available, so the worker's
/// loop stays responsive to shutdown.
const FETCH_WAIT: Duration = Duration::from_millis(100);
/// Publish acks awaited per round: bounds what is in flight (async-nats
/// blocks publishing beyond its own in-flight limit).
const PUBLISH_CHUNK: usize = 256;
/// Deliveries remembered for stale-receipt detection; the oldest messages
/// are forgotten first (their receipts are then treated as current).
const NEWEST_CAPACITY: usize = 100_000;

/// A queue on a NATS JetStream server: stream `{namespace}` with subject
/// `{namespace}.queue` and WorkQueue retention, consumed through the durable
/// pull consumer `idem` (explicit ack, `ack_wait` = the visibility timeout,
/// unlimited deliveries: Idem counts attempts itself).
pub struct NatsBroker {
    client: async_nats::Client,
    js: jetstream::Context,
    stream: stream::Stream,
    consumer: consumer::PullConsumer,
    stream_name: String,
    subject: String,
    /// Stream sequence → delivery (consumer) sequence of the newest delivery
    /// this instance handed out, to recognise stale receipts.
    newest: Mutex<BTreeMap<u64, u64>>,
    /// The consumer's `ack_wait` when this broker connected: the
    /// visibility timeout of every delivery.
    ack_wait: Duration,
}

#[async_trait]
impl Broker for NatsBroker {
    /// Publish each envelope and wait for JetStream's publish ack: a message
    /// is accepted only once the stream has stored it. A `delay` is carried
    /// as `Idem-Not-Before` and honoured at fetch time.
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError> {
        let not_before = wire::stamp(now_ms(), delay)?;
        for chunk in envelopes.chunks(PUBLISH_CHUNK) {
            let mut acks = Vec::with_capacity(chunk.len());
            for e in chunk {
                let headers = wire_headers(e, not_before)?;
                let ack = self
                    .js
                    .publish_with_headers(self.subject.clone(), headers, Bytes::copy_from_slice(&e.payload))
                    .await
                    .map_err(|err| unavailable(&format!("cannot publish message {:?}", e.id), err))?;
                acks.push((e, ack));
            }
            for (e, ack) in acks {
                let ack = ack
                    .await
                    .map_err(|err| unavailable(&format!("JetStream did not store message {:?}", e.id), err))?;
                if ack.stream != self.stream_name {
                    return Err(BrokerError::Unavailable(format!(
                        "message {:?} was stored by stream {:?}, not {:?}: another stream takes subject {:?}",
                        e.id, ack.stream, self.stream_name, self.subject
                    )));
                }
            }
        }
        Ok(())
    }

    /// Pull up to `max` deliveries. Returns as soon as any are available and
    /// waits at most ~100 ms when none are. `visibility` is ignored: the
    /// consumer's `ack_wait` is the visibility timeout.
    async fn fetch(&self, max: usize, _visibility: Duration) -> Result<Vec<Delivery>, BrokerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        // no_wait + expires: the server answers at once with what it has, or
        // waits up to `expires` for the first message.
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(max)
            .expires(FETCH_WAIT)
            .messages()
            .await
            .map_err(|e| unavailable("cannot pull from the JetStream consumer", e))?;
        let now = now_ms();
        let mut out: Vec<Delivery> = Vec::new();
        let mut seen = std::collections::HashMap::new();
        while let Some(next) = batch.next().await {
            let msg = match next {
                Ok(msg) => msg,
                // Deliveries already received stay valid: return them rather
                // than leaving them to wait out ack_wait.
                Err(e) if !out.is_empty() => {
                    tracing::debug!(error = %e, "pull ended early");
                    break;
                }
                Err(e) => return Err(unavailable("cannot pull from the JetStream consumer", e)),
            };
            let Some(receipt) = msg.reply.as_ref().map(|s| s.to_string()) else {
                continue;
            };
            let Some(ack) = AckRef::parse(&receipt) else {
                tracing::warn!(%receipt, "a delivery without a JetStream ack subject; ignoring it");
                continue;
            };
            // A stamp refused (not a time, or too far ahead) is dead-lettered
            // at once with the reason, not held until it.
            let (due, refused) = match wire::due(&msg, now) {
                Ok(due) => (due, None),
                Err(why) => (None, Some(why)),
            };
            if let Some(due) = due.filter(|due| *due > now) {
                // Not yet due: hand it back for the time left. Unanswered,
                // because a lost nak only means an early redelivery.
                let left = Duration::from_millis(due.saturating_sub(now) as u64);
                if let Err(e) = self.client.publish(receipt.clone(), AckKind::Nak(Some(left)).into()).await {
                    tracing::debug!(error = %e, "cannot defer a delayed message; it comes back after ack_wait");
                }
                continue;
            }
            {
                let mut newest = self.newest.lock().expect("newest-delivery map poisoned");
                newest.insert(ack.stream_seq, ack.delivery_seq);
                while newest.len() > NEWEST_CAPACITY {
                    newest.pop_first();
                }
            }
            let delivery_count = u32::try_from(ack.delivered.max(1)).unwrap_or(u32::MAX);
            let seq = ack.stream_seq;
            let delivery = Delivery {
                envelope: envelope(&msg),
                receipt,
                delivery_count,
                refused,
            };
            // A message redelivered while this pull was open (its ack_wait
            // ran out) comes twice: keep only the newer delivery, whose
            // receipt is the one the server now answers to.
            match seen.get(&seq) {
                Some(&i) => out[i] = delivery,
                None => {
                    seen.insert(seq, out.len());
                    out.push(delivery);
                }
            }
        }
        Ok(out)
    }

    /// `+ACK` each delivery and wait for the server to confirm; WorkQueue
    /// retention then removes the message. An acked message is gone for
    /// good, which is also all Idem needs for one it has dead-lettered
    /// (JetStream's `+TERM` would add nothing).
    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        let refs = receipts.iter().map(|r| self.receipt(r)).collect::<Result<Vec<_>, _>>()?;
        let items: Vec<(&str, Bytes)> = receipts.iter().map(|r| (*r, Bytes::from(AckKind::Ack))).collect();
        self.answer(&items, "ack").await?;
        let mut newest = self.newest.lock().expect("newest-delivery map poisoned");
        for r in refs {
            newest.remove(&r.stream_seq);
        }
        Ok(())
    }

    /// `-NAK` with `delay`: JetStream redelivers the message after it. A
    /// receipt older than a delivery this instance has handed out since is
    /// ignored.
    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        let r = self.receipt(receipt)?;
        if self.is_stale(&r) {
            return Ok(());
        }
        let kind = if delay.is_zero() {
            AckKind::Nak(None)
        } else {
            AckKind::Nak(Some(delay))
        };
        self.answer(&[(receipt, kind.into())], "nak").await
    }

    /// `+WPI` (in progress) for each current delivery, which restarts its
    /// `ack_wait`. `visibility` cannot be honoured: the extension is always
    /// the consumer's `ack_wait`, so the heartbeat must run more often than
    /// that (the configuration checks `worker.heartbeat_ms`).
    async fn extend(&self, receipts: &[&str], _visibility: Duration) -> Result<(), BrokerError> {
        let mut items = Vec::with_capacity(receipts.len());
        for r in receipts {
            if !self.is_stale(&self.receipt(r)?) {
                items.push((*r, Bytes::from(AckKind::Progress)));
            }
        }
        self.answer(&items, "in-progress").await
    }

    /// Messages not yet delivered plus deliveries not yet acked (including
    /// delayed and nacked messages waiting to be due).
    async fn pending(&self) -> Result<u64, BrokerError> {
        let info = self
            .stream
            .consumer_info(CONSUMER)
            .await
            .map_err(|e| unavailable("cannot read the JetStream consumer's state", e))?;
        Ok(info.num_pending + info.num_ack_pending as u64)
    }

    /// The visibility timeout is the consumer's `ack_wait`; a delayed
    /// publish is met (and counted) by each fetch before it is due.
    fn semantics(&self) -> Semantics {
        Semantics {
            visibility: Visibility::Fixed(self.ack_wait),
            early_fetches_count: true,
            exact_only_at_owner: false,
            receives_counted: false,
        }
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Unavailable(format!("NATS: {what}: {e}"))
}
