//! Amazon SQS broker (standard and FIFO queues), on the AWS SDK for Rust.
//!
//! How the [`Broker`] contract maps onto SQS:
//!
//! - `fetch` is `ReceiveMessage` with long polling (`broker.wait_secs`),
//!   up to ten messages a call, `VisibilityTimeout` = the visibility asked
//!   for, rounded up to whole seconds (SQS's unit). When the first receive
//!   comes back full and more are wanted, more receives follow at once
//!   without waiting. `delivery_count` is SQS's `ApproximateReceiveCount`.
//! - `extend` is `ChangeMessageVisibilityBatch`; `nack` and `retry` set the
//!   delivery's visibility to the delay, so the message is not re-sent and
//!   its receive count stays meaningful; `ack` is `DeleteMessageBatch`,
//!   each entry's failure handled on its own.
//! - A receipt handle SQS no longer accepts (the delivery's visibility ran
//!   out and the message went to another consumer) means this delivery
//!   was fenced out: its nack or extend does nothing, as Idem's claims
//!   already keep the two deliveries apart. Receipts are
//!   `<seq> <message id> <receipt handle>`, and a receipt older than a
//!   delivery of the same message this instance has handed out since is
//!   ignored by `nack` and `extend` (SQS itself may apply it).
//! - Delayed publishing: `DelaySeconds` up to SQS's 15 minutes on a
//!   standard queue. Longer delays, and any delay on a FIFO queue (which
//!   has no per-message delay), travel as `Idem-Not-Before`, and a fetch
//!   that meets such a message early makes it invisible for the time left;
//!   each early meeting is a receive ([`Semantics::early_fetches_count`] on
//!   FIFO queues). A delay is at most the queue's retention less an hour:
//!   longer ones are refused, and so are stamps further ahead when read.
//! - No visibility reaches past 12 hours from its receive (SQS refuses
//!   it): retries, extensions and deferrals are cut to what is left.
//! - FIFO queues: `MessageGroupId` is the value at `broker.group_pointer`
//!   in the payload, else at the plugin's `key_pointer`, else the message
//!   id; `MessageDeduplicationId` is the message id, so SQS drops a second
//!   publish of one id within its five-minute window (a dead letter's
//!   replay gets a fresh one). A group has one delivery at the worker at a
//!   time, so its messages run in order, retries included (see `track`).
//! - Throttling, 5xx answers and dropped connections are retried by the
//!   SDK with exponential backoff before a call fails.
//!
//! Files: `connect` builds the client and checks the queue, `wire` maps
//! envelopes onto bodies and attributes and SQS's errors onto broker
//! errors, `track` remembers receipts and FIFO groups.

mod connect;
mod track;
mod wire;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Result;
use async_trait::async_trait;
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::builders::SendMessageBatchRequestEntryBuilder;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;
use futures::future::{join_all, try_join_all};

use self::track::{Receipt, Track};
use self::wire::{check_entries, secs, unavailable};
use super::{Broker, BrokerError, Semantics, Visibility};
use crate::envelope::{Delivery, Envelope};
use crate::now_ms;

/// SQS's limits: entries per batch call, the longest `DelaySeconds`.
const BATCH: usize = 10;
const MAX_DELAY_SECS: u64 = 900;
/// The most payload bytes put in one `SendMessageBatch` (SQS takes 1 MiB
/// a call, attributes included).
const BATCH_BYTES: usize = 768 << 10;

/// What the sqs broker takes from a configuration.
#[derive(Debug, Clone)]
pub struct SqsOptions {
    /// A non-AWS endpoint (`broker.url`), e.g. a local SQS-compatible server.
    pub endpoint: Option<String>,
    /// `broker.region`; unset: the environment's (`AWS_REGION`, profile).
    pub region: Option<String>,
    /// Queue name or URL (`broker.queue`).
    pub queue: String,
    /// Long-poll wait of a receive (`broker.wait_secs`, 0 to 20).
    pub wait_secs: u64,
    /// `retry.max_attempts`, checked against the queue's redrive policy.
    pub max_attempts: u32,
    /// `retry.max_delay_ms`, checked against the queue's retention (a
    /// retry due after SQS deleted the message would be lost).
    pub max_retry_delay_ms: u64,
    /// FIFO: `broker.group_pointer`.
    pub group_pointer: Option<String>,
    /// FIFO: each plugin's `key_pointer`, the group when no group pointer
    /// is set.
    pub key_pointers: HashMap<String, String>,
}

/// A queue on SQS.
pub struct SqsBroker {
    client: Client,
    url: String,
    fifo: bool,
    /// The longest delay a publish may ask for and a read stamp may carry
    /// (`connect::max_delay_ms`).
    max_delay_ms: i64,
    options: SqsOptions,
    track: Mutex<Track>,
}

impl SqsBroker {
    /// Connect and check the queue (it must exist: Idem does not create
    /// queues on SQS, whose attributes are the operator's).
    pub async fn connect(options: SqsOptions) -> Result<SqsBroker> {
        let client = connect::client(&options).await;
        let queue = connect::queue(&client, &options).await?;
        Ok(SqsBroker {
            client,
            url: queue.url,
            fifo: queue.fifo,
            max_delay_ms: queue.max_delay_ms,
            options,
            track: Mutex::new(Track::default()),
        })
    }

    /// The AWS SDK client these options give (endpoint, region, retries,
    /// timeouts), for tools and tests that speak to the queue's server
    /// directly, as another producer or an operator would.
    pub async fn sdk_client(options: &SqsOptions) -> Client {
        connect::client(options).await
    }

    /// Create a queue (FIFO when its name ends in `.fifo`) with these
    /// attributes, for tests and chaos runs; returns its URL.
    pub async fn create_queue(options: &SqsOptions, attributes: &[(&str, &str)]) -> Result<String> {
        let client = connect::client(options).await;
        let mut req = client.create_queue().queue_name(&options.queue);
        if options.queue.ends_with(".fifo") {
            req = req.attributes(QueueAttributeName::FifoQueue, "true");
        }
        for (k, v) in attributes {
            req = req.attributes(QueueAttributeName::from(*k), *v);
        }
        let out = req
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("cannot create SQS queue {:?}: {}", options.queue, DisplayErrorContext(&e)))?;
        out.queue_url
            .ok_or_else(|| anyhow::anyhow!("SQS created {:?} without a URL", options.queue))
    }

    /// Delete the queue `options` names; best effort.
    pub async fn delete_queue(options: &SqsOptions) {
        let client = connect::client(options).await;
        if let Ok(url) = client.get_queue_url().queue_name(&options.queue).send().await {
            if let Some(url) = url.queue_url {
                let _ = client.delete_queue().queue_url(url).send().await;
            }
        }
    }

    /// Whether the queue is a FIFO queue.
    pub fn is_fifo(&self) -> bool {
        self.fifo
    }

    fn track(&self) -> std::sync::MutexGuard<'_, Track> {
        self.track.lock().expect("sqs receipt tracking poisoned")
    }

    /// One receive of up to `max` messages, waiting up to `wait_secs`.
    async fn receive(&self, max: usize, visibility: i32, wait_secs: i32) -> Result<Vec<Message>, BrokerError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.min(BATCH) as i32)
            .visibility_timeout(visibility)
            .wait_time_seconds(wait_secs)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| unavailable("cannot receive messages", e))?;
        Ok(out.messages.unwrap_or_default())
    }

    /// Receive up to `n` messages into `into`: one call, and when it came
    /// back full, the rest in calls at once that do not wait. What came
    /// before a failure stays in `into`.
    async fn receive_into(&self, n: usize, visibility: i32, wait: i32, into: &mut Vec<Message>) -> Result<(), BrokerError> {
        let first = self.receive(n, visibility, wait).await?;
        let full = first.len() == BATCH;
        into.extend(first);
        let left = n.saturating_sub(into.len());
        if full && left > 0 {
            let more = (0..left.div_ceil(BATCH)).map(|i| self.receive((left - i * BATCH).min(BATCH), visibility, 0));
            for batch in try_join_all(more).await? {
                into.extend(batch);
            }
        }
        Ok(())
    }

    /// Set the visibility of deliveries (by receipt handle) to `secs`, ten
    /// to a call, the calls at once. Handles SQS no longer accepts are
    /// fenced-out deliveries, skipped.
    async fn change_visibility(&self, handles: &[&str], secs: i32, what: &str) -> Result<(), BrokerError> {
        let entries: Vec<(&str, i32)> = handles.iter().map(|h| (*h, secs)).collect();
        self.set_visibility(&entries, what).await
    }

    /// Set each delivery's visibility (handle, seconds), ten to a call, the
    /// calls at once; handles SQS no longer accepts are skipped.
    async fn set_visibility(&self, handles: &[(&str, i32)], what: &str) -> Result<(), BrokerError> {
        // Every call made, whatever another answers: one refused entry must
        // not leave the other calls' deliveries unextended.
        let answers = join_all(handles.chunks(BATCH).map(|chunk| async move {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, (h, secs))| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(*h)
                        .visibility_timeout(*secs)
                        .build()
                        .expect("id and handle are set")
                })
                .collect();
            let out = self
                .client
                .change_message_visibility_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| unavailable(what, e))?;
            check_entries(out.failed(), what)
        }))
        .await;
        answers.into_iter().collect()
    }

    /// Give a delivery back after `delay`: its visibility becomes the delay.
    /// On a FIFO queue, the deliveries waiting behind it go back too, also
    /// when the receipt is stale (its message was received again while it
    /// ran, and that copy waits behind it): the group is free again, and
    /// SQS delivers it again from its first message.
    async fn give_back(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        let r = parse(receipt)?;
        let (stale, behind) = {
            let mut t = self.track();
            (t.is_stale(&r), t.settled(r.seq, true))
        };
        if !stale {
            // At most what SQS allows from the receive: a retry due later
            // comes back early, and its claim holds it until then.
            let visibility = secs(delay).min(r.visibility_left(now_ms()));
            self.change_visibility(&[r.handle], visibility, "cannot give a delivery back")
                .await?;
        }
        let behind: Vec<Receipt<'_>> = behind.iter().filter_map(|b| Receipt::parse(b)).collect();
        let handles: Vec<&str> = behind.iter().map(|b| b.handle).collect();
        self.change_visibility(&handles, 0, "cannot give back the deliveries of a FIFO group")
            .await
    }

    /// Publish entries, ten (and at most [`BATCH_BYTES`]) to a call; each
    /// entry's failure fails the publish, naming the message.
    async fn send(&self, entries: Vec<(String, SendMessageBatchRequestEntryBuilder)>) -> Result<(), BrokerError> {
        let mut batches: Vec<Vec<(String, SendMessageBatchRequestEntryBuilder)>> = Vec::new();
        let mut bytes = 0;
        for entry in entries {
            let size = entry.1.get_message_body().as_ref().map_or(0, String::len);
            match batches.last_mut() {
                Some(b) if b.len() < BATCH && bytes + size <= BATCH_BYTES => {
                    bytes += size;
                    b.push(entry);
                }
                _ => {
                    bytes = size;
                    batches.push(vec![entry]);
                }
            }
        }
        for batch in batches {
            let ids: Vec<String> = batch.iter().map(|(id, _)| id.clone()).collect();
            let entries = batch
                .into_iter()
                .enumerate()
                .map(|(i, (id, b))| {
                    b.id(i.to_string())
                        .build()
                        .map_err(|err| BrokerError::Unavailable(format!("SQS: message {id:?}: {err}")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let out = self
                .client
                .send_message_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| unavailable(&format!("cannot publish messages {ids:?}"), e))?;
            if let Some(f) = out.failed().first() {
                let msg = f.id().parse::<usize>().ok().and_then(|i| ids.get(i)).cloned().unwrap_or_default();
                return Err(BrokerError::Unavailable(format!(
                    "SQS: cannot publish message {msg:?}: {} {}",
                    f.code(),
                    f.message().unwrap_or_default()
                )));
            }
        }
        Ok(())
    }

    /// The batch entry publishing `e`, with a dedupe id (FIFO) of `dedupe`.
    fn entry(&self, e: &Envelope, delay: Duration, dedupe: &str) -> Result<(String, SendMessageBatchRequestEntryBuilder), BrokerError> {
        let delay_secs = delay.as_millis().div_ceil(1000) as u64;
        let stamp = crate::broker::stamp(now_ms(), delay, self.max_delay_ms, connect::DELAY_BOUND)?;
        let not_before = stamp.filter(|_| self.fifo || delay_secs > MAX_DELAY_SECS);
        let mut b = SendMessageBatchRequestEntry::builder()
            .message_body(wire::body(&e.payload))
            .set_message_attributes(Some(wire::attributes(e, not_before)?));
        if self.fifo {
            let pointer = self
                .options
                .group_pointer
                .as_deref()
                .or_else(|| self.options.key_pointers.get(&e.handler).map(String::as_str));
            b = b
                .message_group_id(wire::group_of(e, pointer))
                .message_deduplication_id(wire::fifo_id(dedupe));
        } else if delay_secs > 0 {
            b = b.delay_seconds(delay_secs.min(MAX_DELAY_SECS) as i32);
        }
        Ok((e.id.clone(), b))
    }
}

#[async_trait]
impl Broker for SqsBroker {
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError> {
        let entries = envelopes
            .iter()
            .map(|e| self.entry(e, delay, &e.id))
            .collect::<Result<Vec<_>, BrokerError>>()?;
        self.send(entries).await
    }

    /// A replay on a FIFO queue gets a deduplication id of its own: SQS
    /// would drop a publish of the same id within five minutes of the
    /// first.
    async fn republish(&self, envelope: &Envelope) -> Result<(), BrokerError> {
        let dedupe = format!("{}#replay-{}", envelope.id, uuid::Uuid::new_v4().simple());
        self.send(vec![self.entry(envelope, Duration::ZERO, &dedupe)?]).await
    }

    async fn fetch(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, BrokerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut out = if self.fifo { self.track().ready(max) } else { Vec::new() };
        let visibility = secs(visibility);
        let mut received = Vec::new();
        if out.len() < max {
            // Wait only when nothing is in hand yet.
            let wait = if out.is_empty() { self.options.wait_secs.min(20) as i32 } else { 0 };
            let got = self.receive_into(max - out.len(), visibility, wait, &mut received).await;
            if let Err(e) = got {
                // What is in hand goes to the worker: deliveries taken from
                // behind their groups are their groups' deliveries out now,
                // and a receive that worked is not thrown away.
                if out.is_empty() && received.is_empty() {
                    return Err(e);
                }
                tracing::warn!(error = %e, "SQS: a receive failed; handing out what was received");
            }
        }
        let now = now_ms();
        let mut defer: Vec<(String, i32)> = Vec::new();
        let mut release: Vec<String> = Vec::new();
        let mut deferred_groups: Vec<String> = Vec::new();
        {
            let mut t = self.track();
            for m in received {
                let (Some(handle), Some(message_id)) = (m.receipt_handle(), m.message_id()) else {
                    continue;
                };
                let group = if self.fifo { Some(wire::group(&m)) } else { None };
                // A stamp too far ahead, or not a time, is refused (and
                // dead-lettered) rather than deferred again and again.
                let stamp = wire::not_before(&m, now, self.max_delay_ms);
                if let Some(&Ok(due)) = stamp.as_ref().filter(|due| due.as_ref().is_ok_and(|&due| due > now)) {
                    // Not due: invisible for the time left (at most what SQS
                    // allows from a receive; it meets a fetch again then),
                    // unanswered to the worker (it was never its delivery).
                    let left = Duration::from_millis(due.saturating_sub(now) as u64);
                    let most = (wire::MAX_VISIBILITY_SECS - track::TOTAL_VISIBILITY_SLACK_SECS) as i32;
                    defer.push((handle.to_string(), secs(left).min(most)));
                    deferred_groups.extend(group);
                    continue;
                }
                if group.as_ref().is_some_and(|g| deferred_groups.contains(g)) {
                    // Behind a message of its group that is not due.
                    release.push(handle.to_string());
                    continue;
                }
                let receipt = t.receipt(message_id, handle, now);
                let (envelope, refused) = wire::envelope(&m);
                let refused = refused.or(stamp.and_then(Result::err));
                let d = Delivery {
                    envelope,
                    receipt,
                    delivery_count: wire::receive_count(&m),
                    refused,
                };
                match group {
                    None => out.push(d),
                    Some(g) => {
                        let seq = Receipt::parse(&d.receipt).expect("written above").seq;
                        if t.admit(&g, seq) {
                            out.push(d);
                        } else {
                            t.hold(&g, d);
                        }
                    }
                }
            }
        }
        // Held back in batches; unanswered failures only mean an early
        // meeting again.
        let defer: Vec<(&str, i32)> = defer.iter().map(|(h, secs)| (h.as_str(), *secs)).collect();
        if let Err(e) = self.set_visibility(&defer, "cannot hold back delayed messages").await {
            tracing::debug!(error = %e, "delayed messages come back when their visibility ends");
        }
        let release: Vec<&str> = release.iter().map(String::as_str).collect();
        if let Err(e) = self
            .change_visibility(&release, 0, "cannot give back a FIFO group's messages")
            .await
        {
            tracing::debug!(error = %e, "FIFO messages come back when their visibility ends");
        }
        Ok(out)
    }

    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        let parsed = receipts.iter().map(|r| parse(r)).collect::<Result<Vec<_>, _>>()?;
        let deleted = join_all(parsed.chunks(BATCH).map(|chunk| async move {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(r.handle)
                        .build()
                        .expect("id and handle are set")
                })
                .collect();
            let out = self
                .client
                .delete_message_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| unavailable("cannot delete acked messages", e))?;
            check_entries(out.failed(), "cannot delete acked messages")
        }))
        .await
        .into_iter()
        .collect::<Result<(), BrokerError>>();
        // Settled whether or not the delete went through: the worker is
        // done with these messages (one not deleted comes back, and its
        // claim answers it), and a FIFO group's next message may go out.
        let mut t = self.track();
        for r in &parsed {
            t.forget(r);
            t.settled(r.seq, false);
        }
        deleted
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        self.give_back(receipt, delay).await
    }

    /// Extend the current deliveries among `receipts`, and on a FIFO queue
    /// the deliveries waiting behind their group's.
    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError> {
        let (current, held): (Vec<Receipt<'_>>, Vec<String>) = {
            let t = self.track();
            let mut current = Vec::with_capacity(receipts.len());
            for r in receipts {
                let r = parse(r)?;
                if !t.is_stale(&r) {
                    current.push(r);
                }
            }
            (current, t.held_receipts())
        };
        let held: Vec<Receipt<'_>> = held.iter().filter_map(|h| Receipt::parse(h)).collect();
        // Each at most what SQS allows from its receive; one held that long
        // already is left to become visible, and its claim answers it.
        let (asked, now) = (secs(visibility), now_ms());
        let entries: Vec<(&str, i32)> = current
            .iter()
            .chain(&held)
            .map(|r| (r.handle, asked.min(r.visibility_left(now))))
            .filter(|&(_, secs)| secs > 0)
            .collect();
        self.set_visibility(&entries, "cannot extend deliveries").await
    }

    /// Visible, in flight and delayed messages, as SQS approximates them.
    async fn pending(&self) -> Result<u64, BrokerError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
            .send()
            .await
            .map_err(|e| unavailable("cannot read the queue's attributes", e))?;
        Ok(out
            .attributes()
            .map(|a| a.values().filter_map(|v| v.parse::<u64>().ok()).sum())
            .unwrap_or(0))
    }

    /// Visibility per delivery; on a FIFO queue a delayed message is met
    /// (and counted) by fetches before it is due.
    fn semantics(&self) -> Semantics {
        Semantics {
            visibility: Visibility::PerDelivery,
            early_fetches_count: self.fifo,
            exact_only_at_owner: false,
            receives_counted: true,
        }
    }
}

fn parse(receipt: &str) -> Result<Receipt<'_>, BrokerError> {
    Receipt::parse(receipt).ok_or_else(|| BrokerError::Unavailable(format!("SQS: {receipt:?} is not a receipt of this broker")))
}
