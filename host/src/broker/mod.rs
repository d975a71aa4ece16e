//! Brokers: where deliveries come from and where acks go.
//!
//! Every broker is at-least-once: a delivery that is not acked before its
//! visibility timeout is delivered again, possibly while the first delivery
//! is still being handled. Idem never relies on a broker delivering once.
//!
//! The [`Broker`] trait is the contract every broker passes the same
//! conformance suite on (`tests/integration/broker_conformance.rs`). Where a
//! broker's own model cannot follow the contract's plain reading, it says so
//! in [`Broker::semantics`] instead of quietly ignoring an argument:
//!
//! - **Visibility.** SQLite and Redis make each delivery invisible for the
//!   `visibility` that `fetch` and `extend` pass
//!   ([`Visibility::PerDelivery`]); so does SQS, in whole seconds. NATS JetStream fixes it when the
//!   consumer is created (`ack_wait`, from `worker.visibility_ms`), so there
//!   the argument is only a hint and `extend` restarts the fixed timeout
//!   ([`Visibility::Fixed`]). RabbitMQ has no timeout at all: a delivery
//!   stays with the connection that received it until it is acked, nacked or
//!   that connection closes ([`Visibility::UntilDisconnect`]); nor has
//!   Kafka, where a record stays with the consumer that owns its
//!   partition.
//! - **Delivery counts of delayed publishes.** JetStream (before 2.12) has
//!   no per-message delay, so a delayed message is delivered to every fetch
//!   that meets it early and deferred again, and each of those counts in
//!   its delivery count ([`Semantics::early_fetches_count`]).
//! - **Counts seen from elsewhere.** Kafka's `pending` and delivery counts
//!   are exact at the consumer that owns a partition; another consumer
//!   sees what the server kept of its commits
//!   ([`Semantics::exact_only_at_owner`]).

pub mod amqp;
pub mod celery;
pub mod kafka;
pub mod nats;
pub mod redis;
pub mod sqlite;
pub mod sqs;

use std::time::Duration;

use async_trait::async_trait;

use crate::envelope::{Delivery, Envelope};

/// When a message delayed by `delay` at `now` (a wall-clock reading in whole
/// milliseconds) is due: never before the delay has passed. A reading is up
/// to a millisecond behind the true time and a consumer takes what is due
/// at its own reading, so the delay is rounded up to whole milliseconds and
/// one more is added; no delay is due at once.
pub(crate) fn due_at(now: i64, delay: Duration) -> i64 {
    if delay.is_zero() {
        return now;
    }
    now.saturating_add(i64::try_from(delay.as_micros().div_ceil(1_000)).unwrap_or(i64::MAX))
        .saturating_add(1)
}

/// A delayed publish's `Idem-Not-Before` stamp (`None` without a delay), or
/// the reason a delay that long is refused: longer than `max_delay_ms`, the
/// longest `what` holds a message for.
pub(crate) fn stamp(now: i64, delay: Duration, max_delay_ms: i64, what: &str) -> Result<Option<i64>, BrokerError> {
    if delay.is_zero() {
        return Ok(None);
    }
    if delay.as_millis() > max_delay_ms as u128 {
        return Err(BrokerError::Unavailable(format!(
            "a delay of {} ms is longer than the {max_delay_ms} ms {what}; publish it later instead",
            delay.as_millis()
        )));
    }
    Ok(Some(due_at(now, delay)))
}

/// How far apart the clocks of a publisher and a reader may be before a
/// stamp with a broker's longest delay is taken for a wrong one.
pub(crate) const CLOCK_SLACK_MS: i64 = 60 * 1000;

/// A read `Idem-Not-Before` value (`header`), checked against the reader's
/// clock and the longest delay the broker holds a message for
/// (`max_delay_ms`, `why` saying what holding costs there): the time the
/// message is due, or why it is refused, naming the header and the fix. A
/// stamp too far ahead (another producer's, one in microseconds, the end of
/// time) would otherwise be held for good.
pub(crate) fn read_not_before(header: &str, value: &str, now: i64, max_delay_ms: i64, why: &str) -> Result<i64, String> {
    let at = value
        .trim()
        .parse::<i64>()
        .map_err(|_| format!("header {header} is not unix milliseconds: {value:?}"))?;
    if at.saturating_sub(now) > max_delay_ms.saturating_add(CLOCK_SLACK_MS) {
        return Err(format!(
            "header {header} is {at}, more than {max_delay_ms} ms after this worker's clock ({now}): {why} (check that the producer writes unix milliseconds and that its clock is right)"
        ));
    }
    Ok(at)
}

/// Broker failures.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The broker could not be reached or failed.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
}

impl From<sqlx::Error> for BrokerError {
    fn from(e: sqlx::Error) -> Self {
        BrokerError::Unavailable(e.to_string())
    }
}

/// How long a fetched delivery stays invisible to other consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Visibility {
    /// Each `fetch` and `extend` sets it: the delivery is invisible for the
    /// `visibility` passed, from that call on.
    #[default]
    PerDelivery,
    /// Fixed when the broker was built (NATS: the consumer's `ack_wait`).
    /// The `visibility` arguments are hints the broker cannot honour;
    /// `extend` restarts this timeout.
    Fixed(Duration),
    /// No timeout (RabbitMQ): a delivery is held until it is acked or
    /// nacked, or until the connection that received it closes; `extend`
    /// has nothing to do.
    UntilDisconnect,
}

impl Visibility {
    /// How long a delivery fetched or extended with `requested` stays
    /// invisible if nothing else happens to it; `None` when only its
    /// connection closing gives it back.
    pub fn timeout(self, requested: Duration) -> Option<Duration> {
        match self {
            Visibility::PerDelivery => Some(requested),
            Visibility::Fixed(d) => Some(d),
            Visibility::UntilDisconnect => None,
        }
    }
}

/// Where a broker's model departs from the plain reading of [`Broker`]'s
/// documentation. The default is that plain reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Semantics {
    /// How the `visibility` arguments of `fetch` and `extend` are honoured.
    pub visibility: Visibility,
    /// False: a message published with a delay is withheld until it is due,
    /// and its first delivery counts 1. True: it is delivered to each fetch
    /// that meets it early and deferred again there, and each of those
    /// deliveries counts in `delivery_count` (NATS JetStream).
    pub early_fetches_count: bool,
    /// False: `pending` and `delivery_count` are the same whichever
    /// consumer asks or receives. True (Kafka): they are exact at the
    /// consumer that owns the messages; another sees what the server kept.
    /// Kafka keeps a committed offset per partition and Idem adds, in the
    /// commit's metadata, which records above it are settled and how many
    /// times each unsettled one was handed out; a server that drops commit
    /// metadata (tansu, the test server) makes another consumer count
    /// settled records above the offset as pending, and start delivery
    /// counts again at 1 when it takes a partition over.
    pub exact_only_at_owner: bool,
    /// False: a message given back and received again costs nothing. True
    /// (SQS): every receive counts toward the queue's redrive policy, which
    /// moves a message to the queue's own dead-letter queue, running or
    /// not, once it has been received `maxReceiveCount` times; a busy key
    /// then waits out the whole lease or retry delay its claim reports
    /// rather than `worker.busy_retry_ms`.
    pub receives_counted: bool,
}

/// A queue Idem consumes. Batch methods take and answer many deliveries in
/// one round trip where the broker allows it.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Publish envelopes, visible after `delay`.
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError>;
    /// Fetch up to `max` deliveries, each invisible to others for
    /// `visibility` (as [`Semantics::visibility`] says).
    async fn fetch(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, BrokerError>;
    /// Acknowledge: the message will not be delivered again.
    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError>;
    /// Make a delivery visible again after `delay` (no ack).
    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError>;
    /// Push back the visibility deadline of deliveries still being handled
    /// (to `visibility` from now, as [`Semantics::visibility`] says).
    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError>;
    /// Messages not yet acked (visible or in flight).
    async fn pending(&self) -> Result<u64, BrokerError>;
    /// `pending` part by part where the broker has parts (Kafka: the lag of
    /// each partition), for `idem stats`; empty where it has none.
    async fn backlog(&self) -> Result<Vec<(String, u64)>, BrokerError> {
        Ok(Vec::new())
    }
    /// The worker stops: settle what the broker holds for it (Kafka commits
    /// what is settled and leaves its group, so its partitions move at
    /// once instead of after a session timeout). Called once the worker's
    /// deliveries are settled or given back; the default does nothing.
    async fn close(&self) {}
    /// Publish a message again that was published before (a dead letter's
    /// replay). Brokers that drop a second publish of one id (SQS FIFO's
    /// deduplication window) must still deliver it; the default is a plain
    /// `publish`.
    async fn republish(&self, envelope: &Envelope) -> Result<(), BrokerError> {
        self.publish(std::slice::from_ref(envelope), Duration::ZERO).await
    }
    /// Whether a dead letter's message can be published again, or why not
    /// (a replay keeps such a record, before it changes anything). The
    /// default: always.
    fn republishable(&self, _envelope: &Envelope) -> Result<(), String> {
        Ok(())
    }
    /// Where this broker departs from the plain reading of the methods
    /// above.
    fn semantics(&self) -> Semantics {
        Semantics::default()
    }
    /// Give a delivery back for a retry of its message after `delay` (the
    /// handler failed with `reason` and will run again). Brokers whose
    /// producers count retries (Celery's `retries` header and `RETRY`
    /// state) record it here; the default is a plain `nack`.
    async fn retry(&self, receipt: &str, delay: Duration, _reason: &str) -> Result<(), BrokerError> {
        self.nack(receipt, delay).await
    }
    /// Whether [`Broker::answer`] does anything: only then does the worker
    /// tell it how messages ended.
    fn answers(&self) -> bool {
        false
    }
    /// Tell producers how messages ended (Celery's result backend), after
    /// the outcome is durable and before the ack. An error leaves the
    /// deliveries unacked: their redelivery answers again, as duplicates.
    async fn answer(&self, _answers: &[Answer<'_>]) -> Result<(), BrokerError> {
        Ok(())
    }
}

/// How one message ended, for [`Broker::answer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer<'a> {
    /// The delivery being settled.
    pub receipt: &'a str,
    /// Its message id.
    pub msg_id: &'a str,
    pub verdict: Verdict<'a>,
}

/// What became of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// The handler succeeded and its effects are confirmed, with its
    /// result if it returned one.
    Done(Option<&'a [u8]>),
    /// Dead-lettered, for this reason.
    Failed(&'a str),
    /// A duplicate of a message settled before; `failed` if that one was
    /// dead-lettered, else with the result stored when it was confirmed.
    /// Its first settling answered already, unless the worker died before
    /// it could.
    Duplicate { failed: bool, result: Option<&'a [u8]> },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delayed_message_is_never_due_before_its_delay() {
        assert_eq!(due_at(1_000, Duration::ZERO), 1_000, "no delay: due at once");
        // A reading of 1,000 may be taken at 1,000.9: 50 ms later is 1,050.9.
        assert_eq!(due_at(1_000, Duration::from_millis(50)), 1_051);
        assert_eq!(
            due_at(1_000, Duration::from_micros(1_500)),
            1_003,
            "part of a millisecond rounds up"
        );
        assert_eq!(due_at(i64::MAX - 5, Duration::from_secs(10)), i64::MAX);
    }
}
