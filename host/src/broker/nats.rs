//! NATS JetStream broker: one WorkQueue stream per namespace and one durable
//! pull consumer shared by every worker of that namespace.
//!
//! How the [`Broker`] contract maps onto JetStream:
//!
//! - The visibility timeout is the consumer's `ack_wait`, fixed when the
//!   consumer is created (`worker.visibility_ms`). JetStream has no
//!   per-fetch or per-message ack wait, so the `visibility` arguments of
//!   [`Broker::fetch`] and [`Broker::extend`] cannot change it.
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
//!   Each early meeting counts as a delivery in JetStream's delivery count,
//!   and the due time is read against this host's clock.
//! - Delayed messages (and nacked ones) wait in the consumer's ack-pending
//!   set, which is why `max_ack_pending` is large.
//!
//! Wire format: the body is the payload; headers are `Idem-Id`,
//! `Idem-Handler`, `Idem-Not-Before` (delayed only) and the producer's
//! headers. `Nats-Msg-Id` is never set: JetStream would silently drop a
//! duplicate publish, and Idem must see duplicates to suppress them itself.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context as _};
use async_nats::jetstream::{self, consumer, stream, AckKind};
use async_nats::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use super::{Broker, BrokerError};
use crate::envelope::{Delivery, Envelope};
use crate::now_ms;

/// Name of the durable pull consumer every worker of a namespace shares.
const CONSUMER: &str = "idem";
/// Header carrying the envelope id.
const ID_HEADER: &str = "Idem-Id";
/// Header carrying the handler name.
const HANDLER_HEADER: &str = "Idem-Handler";
/// Header carrying the earliest delivery time (unix ms) of a delayed publish.
const NOT_BEFORE_HEADER: &str = "Idem-Not-Before";
/// JetStream's own dedupe id: read as the envelope id of messages published
/// by other tools, never written.
const NATS_MSG_ID: &str = "Nats-Msg-Id";
/// The longest a fetch waits when nothing is available, so the worker's
/// loop stays responsive to shutdown.
const FETCH_WAIT: Duration = Duration::from_millis(100);
/// How long an ack, nak or in-progress waits for the server's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Publish acks awaited per round: bounds what is in flight (async-nats
/// blocks publishing beyond its own in-flight limit).
const PUBLISH_CHUNK: usize = 256;
/// Delayed and nacked messages sit in the ack-pending set until due; the
/// server's default of 1,000 would stall delivery behind them.
const MAX_ACK_PENDING: i64 = 1_000_000;
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
}

impl NatsBroker {
    /// Connect to `url` and declare (idempotently) the namespace's stream and
    /// its durable pull consumer. `ack_wait` is the visibility timeout; if
    /// the consumer exists with another one it is updated, so the last
    /// worker to start decides (keep `worker.visibility_ms` equal across a
    /// namespace).
    pub async fn connect(url: &str, namespace: &str, ack_wait: Duration) -> anyhow::Result<Self> {
        let url_shown = crate::config::redact(url);
        if namespace.is_empty() || namespace.chars().any(|c| c.is_whitespace() || ".*>/\\".contains(c)) {
            bail!("namespace {namespace:?} cannot name a JetStream stream: use letters, digits and '_'");
        }
        if ack_wait.is_zero() {
            bail!("worker.visibility_ms must be above 0: it is the JetStream consumer's ack_wait");
        }
        let hint = || format!("cannot connect to NATS at broker.url = {url_shown:?}: is nats-server running with JetStream (-js)?");
        let client = async_nats::ConnectOptions::new()
            .name("idem")
            .connect(url)
            .await
            .with_context(hint)?;
        let js = jetstream::new(client.clone());
        let stream_name = namespace.to_string();
        let subject = format!("{namespace}.queue");

        let stream = js
            .get_or_create_stream(stream::Config {
                name: stream_name.clone(),
                subjects: vec![subject.clone()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .with_context(|| {
                format!(
                    "NATS at broker.url = {url_shown:?} cannot declare the stream {stream_name:?}: is nats-server running with JetStream (-js)?"
                )
            })?;
        let config = &stream.cached_info().config;
        if !config.subjects.iter().any(|s| subject_matches(s, &subject)) {
            bail!(
                "the JetStream stream {stream_name:?} at broker.url = {url_shown:?} exists but does not take subject {subject:?} \
                 (its subjects: {:?}): add the subject to it, delete it, or choose another namespace",
                config.subjects
            );
        }
        if config.retention != stream::RetentionPolicy::WorkQueue {
            tracing::warn!(
                stream = %stream_name,
                retention = ?config.retention,
                "the stream was not created by Idem with WorkQueue retention: acked messages stay in it until its limits remove them"
            );
        }

        let wanted = consumer::pull::Config {
            durable_name: Some(CONSUMER.to_string()),
            description: Some("Idem workers: ack_wait is worker.visibility_ms".to_string()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait,
            // Unlimited: poison messages are bounded by Idem's own attempt
            // count, which also survives a worker killed mid-run.
            max_deliver: -1,
            max_ack_pending: MAX_ACK_PENDING,
            ..Default::default()
        };
        let mut consumer: consumer::PullConsumer = stream.get_or_create_consumer(CONSUMER, wanted.clone()).await.with_context(|| {
            format!("cannot declare the JetStream consumer {CONSUMER:?} on stream {stream_name:?} at broker.url = {url_shown:?}")
        })?;
        let existing = consumer.cached_info().config.clone();
        if existing.ack_wait != ack_wait || existing.max_ack_pending < MAX_ACK_PENDING || existing.max_deliver > 0 {
            // Created earlier with other settings (another visibility_ms):
            // the configuration running now is the one to honour.
            match stream.create_consumer(wanted).await {
                Ok(updated) => {
                    tracing::info!(stream = %stream_name, was = ?existing.ack_wait, now = ?ack_wait, "updated the JetStream consumer's ack_wait to worker.visibility_ms");
                    consumer = updated;
                }
                Err(e) => tracing::warn!(
                    stream = %stream_name,
                    error = %e,
                    ack_wait = ?existing.ack_wait,
                    "cannot update the JetStream consumer to worker.visibility_ms; its existing ack_wait stays the visibility timeout"
                ),
            }
        }
        tracing::info!(stream = %stream_name, ack_wait = ?consumer.cached_info().config.ack_wait, "NATS JetStream broker ready");
        Ok(NatsBroker {
            client,
            js,
            stream,
            consumer,
            stream_name,
            subject,
            newest: Mutex::new(BTreeMap::new()),
        })
    }

    /// Build the wire headers of one envelope.
    fn wire_headers(e: &Envelope, not_before: Option<i64>) -> Result<HeaderMap, BrokerError> {
        let bad =
            |what: &str, why: &str| BrokerError::Unavailable(format!("message {:?}: {what} cannot travel as a NATS header: {why}", e.id));
        let value = |what: &str, v: &str| v.parse::<HeaderValue>().map_err(|_| bad(what, "it contains a line break"));
        let mut h = HeaderMap::new();
        h.insert(ID_HEADER, value("the id", &e.id)?);
        h.insert(HANDLER_HEADER, value("the handler name", &e.handler)?);
        if let Some(at) = not_before {
            h.insert(NOT_BEFORE_HEADER, HeaderValue::from(at));
        }
        for (name, v) in &e.headers {
            if is_reserved(name) {
                return Err(bad(
                    &format!("header {name:?}"),
                    "Idem-Id, Idem-Handler, Idem-Not-Before and Nats-* are reserved (Nats-* headers change how JetStream stores the message)",
                ));
            }
            let n = name
                .parse::<HeaderName>()
                .map_err(|_| bad(&format!("header name {name:?}"), "names are printable ASCII without spaces or ':'"))?;
            h.append(n, value(&format!("the value of header {name:?}"), v)?);
        }
        Ok(h)
    }

    /// Parse and check a receipt: only this stream's and consumer's ack
    /// subjects are answered, never an arbitrary subject.
    fn receipt<'a>(&self, receipt: &'a str) -> Result<AckRef<'a>, BrokerError> {
        AckRef::parse(receipt)
            .filter(|r| r.stream == self.stream_name && r.consumer == CONSUMER)
            .ok_or_else(|| {
                BrokerError::Unavailable(format!(
                    "malformed receipt {receipt:?}: not an ack subject of stream {:?}",
                    self.stream_name
                ))
            })
    }

    /// True when this instance has handed out a newer delivery of the same
    /// message than `r`.
    fn is_stale(&self, r: &AckRef<'_>) -> bool {
        let newest = self.newest.lock().expect("newest-delivery map poisoned");
        newest.get(&r.stream_seq).is_some_and(|&seq| seq > r.delivery_seq)
    }

    /// Send each (ack subject, answer) with a reply subject and wait until
    /// the server has answered all of them: a returned call is applied.
    async fn answer(&self, items: &[(&str, Bytes)], what: &str) -> Result<(), BrokerError> {
        if items.is_empty() {
            return Ok(());
        }
        let inbox = self.client.new_inbox();
        let mut replies = self
            .client
            .subscribe(format!("{inbox}.*"))
            .await
            .map_err(|e| unavailable(&format!("cannot subscribe for {what} confirmations"), e))?;
        for (i, (subject, body)) in items.iter().enumerate() {
            self.client
                .publish_with_reply(subject.to_string(), format!("{inbox}.{i}"), body.clone())
                .await
                .map_err(|e| unavailable(&format!("cannot send {what}"), e))?;
        }
        let mut answered = HashSet::with_capacity(items.len());
        let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
        while answered.len() < items.len() {
            let reply = match tokio::time::timeout_at(deadline, replies.next()).await {
                Ok(Some(reply)) => reply,
                Ok(None) => {
                    return Err(BrokerError::Unavailable(format!(
                        "NATS connection closed while waiting for {what} confirmations"
                    )))
                }
                Err(_) => {
                    return Err(BrokerError::Unavailable(format!(
                        "NATS confirmed {} of {} {what}s within {ANSWER_TIMEOUT:?}",
                        answered.len(),
                        items.len()
                    )))
                }
            };
            if reply.status == Some(StatusCode::NO_RESPONDERS) {
                return Err(BrokerError::Unavailable(format!(
                    "no JetStream consumer answers {what}s on stream {:?}: was the consumer {CONSUMER:?} deleted?",
                    self.stream_name
                )));
            }
            answered.insert(reply.subject.to_string());
        }
        Ok(())
    }
}

#[async_trait]
impl Broker for NatsBroker {
    /// Publish each envelope and wait for JetStream's publish ack: a message
    /// is accepted only once the stream has stored it. A `delay` is carried
    /// as `Idem-Not-Before` and honoured at fetch time.
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError> {
        let not_before = (!delay.is_zero()).then(|| now_ms() + delay.as_millis() as i64);
        for chunk in envelopes.chunks(PUBLISH_CHUNK) {
            let mut acks = Vec::with_capacity(chunk.len());
            for e in chunk {
                let headers = Self::wire_headers(e, not_before)?;
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
        let mut out = Vec::new();
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
            if let Some(due) = header(&msg.headers, NOT_BEFORE_HEADER).and_then(|v| v.trim().parse::<i64>().ok()) {
                if due > now {
                    // Not yet due: hand it back for the time left. Unanswered,
                    // because a lost nak only means an early redelivery.
                    let left = Duration::from_millis((due - now) as u64);
                    if let Err(e) = self.client.publish(receipt.clone(), AckKind::Nak(Some(left)).into()).await {
                        tracing::debug!(error = %e, "cannot defer a delayed message; it comes back after ack_wait");
                    }
                    continue;
                }
            }
            {
                let mut newest = self.newest.lock().expect("newest-delivery map poisoned");
                newest.insert(ack.stream_seq, ack.delivery_seq);
                while newest.len() > NEWEST_CAPACITY {
                    newest.pop_first();
                }
            }
            let delivery_count = u32::try_from(ack.delivered.max(1)).unwrap_or(u32::MAX);
            out.push(Delivery {
                envelope: envelope(&msg),
                receipt,
                delivery_count,
            });
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
}

/// What a receipt (a JetStream ack subject) says about its delivery.
#[derive(Debug, PartialEq, Eq)]
struct AckRef<'a> {
    stream: &'a str,
    consumer: &'a str,
    delivered: i64,
    stream_seq: u64,
    delivery_seq: u64,
}

impl<'a> AckRef<'a> {
    /// Parse `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<delivery seq>.<ts>.<pending>`,
    /// or the longer form that puts a domain and an account hash before the
    /// stream (servers 2.10+ may send it; tokens after `pending` are ignored).
    fn parse(receipt: &'a str) -> Option<AckRef<'a>> {
        let tokens: Vec<&str> = receipt.strip_prefix("$JS.ACK.")?.split('.').collect();
        let t = match tokens.len() {
            7 => &tokens[..],
            n if n >= 9 => &tokens[2..],
            _ => return None,
        };
        Some(AckRef {
            stream: t[0],
            consumer: t[1],
            delivered: t[2].parse().ok()?,
            stream_seq: t[3].parse().ok()?,
            delivery_seq: t[4].parse().ok()?,
        })
    }
}

/// The envelope a delivered message carries. Missing Idem headers yield
/// empty fields rather than an error, so the worker dead-letters the message
/// as bad input instead of fetching failing forever.
fn envelope(msg: &async_nats::Message) -> Envelope {
    let id = header(&msg.headers, ID_HEADER)
        .or_else(|| header(&msg.headers, NATS_MSG_ID))
        .unwrap_or_default();
    let handler = header(&msg.headers, HANDLER_HEADER).unwrap_or_default();
    let mut headers: Vec<(String, String)> = Vec::new();
    if let Some(map) = &msg.headers {
        for (name, values) in map.iter() {
            let name = name.to_string();
            if is_reserved(&name) {
                continue;
            }
            headers.extend(values.iter().map(|v| (name.clone(), v.as_str().to_string())));
        }
    }
    // NATS keeps headers in a hash map: sort by name for a stable order
    // (values of one name keep theirs).
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    Envelope {
        id,
        handler,
        headers,
        payload: msg.payload.to_vec(),
    }
}

/// The first value of header `name`, matched case-insensitively (other
/// producers may not spell Idem's headers exactly).
fn header(headers: &Option<HeaderMap>, name: &str) -> Option<String> {
    let map = headers.as_ref()?;
    map.iter()
        .find(|(n, _)| n.to_string().eq_ignore_ascii_case(name))
        .and_then(|(_, values)| values.first())
        .map(|v| v.as_str().to_string())
}

/// Headers that are not the producer's: Idem's own, and `Nats-*`, which
/// steer JetStream itself.
fn is_reserved(name: &str) -> bool {
    [ID_HEADER, HANDLER_HEADER, NOT_BEFORE_HEADER]
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
        || name.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("nats-"))
}

/// Whether a stream subject (possibly with `*` and `>` wildcards) takes
/// `subject`.
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Unavailable(format!("NATS: {what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_ack_subject_forms() {
        let v1 = AckRef::parse("$JS.ACK.q.idem.3.100.7.1790230470084404000.42").unwrap();
        assert_eq!(
            v1,
            AckRef {
                stream: "q",
                consumer: "idem",
                delivered: 3,
                stream_seq: 100,
                delivery_seq: 7
            }
        );
        let v2 = AckRef::parse("$JS.ACK._.hash.q.idem.3.100.7.1790230470084404000.42.tok").unwrap();
        assert_eq!(v2, v1);
        assert_eq!(AckRef::parse("$JS.ACK.q.idem.x.100.7.1.0"), None);
        assert_eq!(AckRef::parse("orders.created"), None);
        assert_eq!(AckRef::parse("$JS.ACK.q.idem.1.2"), None);
    }

    #[test]
    fn wildcard_subjects() {
        assert!(subject_matches("ns.queue", "ns.queue"));
        assert!(subject_matches("ns.*", "ns.queue"));
        assert!(subject_matches("ns.>", "ns.queue"));
        assert!(subject_matches(">", "ns.queue"));
        assert!(!subject_matches("ns", "ns.queue"));
        assert!(!subject_matches("ns.queue.x", "ns.queue"));
        assert!(!subject_matches("other.queue", "ns.queue"));
    }

    #[test]
    fn reserved_headers() {
        assert!(is_reserved("idem-id"));
        assert!(is_reserved("Nats-Msg-Id"));
        assert!(is_reserved("NATS-TTL"));
        assert!(!is_reserved("traceparent"));
        assert!(!is_reserved("Nat"));
    }
}
