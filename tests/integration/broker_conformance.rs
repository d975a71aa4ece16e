//! The broker conformance suite: one sequence of checks, written once
//! against the [`Broker`] trait, that every broker (SQLite, Redis, RabbitMQ,
//! NATS JetStream, SQS, Kafka) runs unchanged, one test per broker at the
//! end.
//!
//! Where a broker's model departs from the trait's plain reading, it says
//! so in [`Broker::semantics`] and the suite checks what it promises
//! instead: a delivery that is not acked comes back after the visibility it
//! was fetched with (`Visibility::PerDelivery`: SQLite, Redis, SQS), after the
//! timeout fixed when the broker was built (`Visibility::Fixed`: NATS), or
//! only once the connection holding it closes
//! (`Visibility::UntilDisconnect`: RabbitMQ, Kafka). Where counts are exact
//! only at the consumer that owns a message (`exact_only_at_owner`: Kafka),
//! the other consumer's figures are checked for what they promise. Nothing
//! is skipped.
//!
//! The suite takes a way to connect consumers of one queue, each with its
//! own connection as another worker process would have, and leaves one
//! delayed message (an hour away) in the queue. When a check fails, every
//! broker call the suite made (which consumer, when, what it answered) is
//! printed before the failed check's message: a failure that a loaded
//! machine alone brings about can be read from one log.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::FutureExt;
use idem_host::broker::sqlite::SqliteBroker;
use idem_host::broker::{Broker, BrokerError, Semantics};
use idem_host::config::Config;
use idem_host::envelope::{Delivery, Envelope};

use crate::common::brokers::{self, envelope, fetch_n, fetch_until, ids, receipts, PATIENCE};
use crate::common::{unique_namespace, wait_for};

/// A visibility that never runs out during a test.
const LONG: Duration = Duration::from_secs(60);
/// A visibility short enough to wait out.
const SHORT: Duration = Duration::from_millis(200);
/// How long a redelivery may take on a loaded 2-core machine (a server's
/// redelivery timer can run late).
const LATE: Duration = Duration::from_secs(20);
/// How much earlier than its visibility a redelivery may be seen (clock
/// granularity), when checking that it did not come back too soon.
const SLACK: Duration = Duration::from_millis(10);
/// The delay of a delayed publish (long enough for the checks that it is
/// not due yet on a loaded machine).
const DELAY: Duration = Duration::from_millis(1_000);
/// The delay of a delayed nack, and how much earlier it may be seen.
const NACK_DELAY: Duration = Duration::from_millis(1_000);
const NACK_SLACK: Duration = Duration::from_millis(50);

/// Run the suite. Each call of `connect` connects a new consumer of the
/// same queue.
pub async fn broker_conformance<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Broker>>,
{
    let trace = Trace::default();
    let consumers = AtomicUsize::new(0);
    let traced = || async {
        Arc::new(Traced {
            inner: connect().await,
            who: consumers.fetch_add(1, Ordering::SeqCst),
            trace: trace.clone(),
        }) as Arc<dyn Broker>
    };
    if let Err(panic) = std::panic::AssertUnwindSafe(checks(traced)).catch_unwind().await {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(a panic without text)");
        eprintln!("{}the failed check: {message}", trace.calls());
        std::panic::resume_unwind(panic);
    }
}

/// The checks, in order, on consumers `connect` makes.
async fn checks<F, Fut>(connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Broker>>,
{
    let one = connect().await;
    let semantics = one.semantics();
    publish_fetch_and_settle(&*one, semantics).await;
    delays_keep_messages_intact_and_count_deliveries(&*one, semantics).await;
    // From here on two consumers share the queue. Where the server pushes
    // deliveries (RabbitMQ), any of them may be the one that has a message.
    let consumers = vec![one, connect().await];
    two_consumers_never_hold_the_same_delivery(&consumers, semantics).await;
    extend_keeps_a_delivery_from_other_consumers(&consumers, semantics).await;
    a_vanished_consumers_delivery_goes_to_another(consumers, semantics).await;
}

/// Publish, fetch in order, visibility, nack, stale receipts, extend, ack,
/// and what `pending` counts along the way.
async fn publish_fetch_and_settle(b: &dyn Broker, semantics: Semantics) {
    let e = envelope;
    b.publish(&[e("a"), e("b"), e("c")], Duration::ZERO).await.unwrap();
    b.publish(&[e("later")], Duration::from_secs(3600)).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 4);

    let got = fetch_n(b, 2, LONG, "a and b").await;
    assert_eq!(ids(&got), ["a", "b"]);
    assert_eq!(got[0].envelope, e("a"), "payload, handler and headers round-trip");
    assert_eq!(got[0].delivery_count, 1);
    let c_fetched = Instant::now();
    let rest = fetch_until(b, 10, SHORT, "c").await;
    assert_eq!(ids(&rest), ["c"], "in-flight and delayed messages are invisible");
    assert_eq!(b.pending().await.unwrap(), 4, "in flight still counts as pending");

    // c is not acked within the visibility it was fetched with. a and b are
    // extended meanwhile: where the visibility is fixed, that is the only
    // way to keep them while c's runs out.
    let held = receipts(&got);
    match semantics.visibility.timeout(SHORT) {
        Some(visibility) => {
            let again = wait_for(LATE, "c to be redelivered", || async {
                b.extend(&held, LONG).await.unwrap();
                let again = b.fetch(10, LONG).await.unwrap();
                (!again.is_empty()).then_some(again)
            })
            .await;
            let waited = c_fetched.elapsed();
            assert!(
                waited + SLACK >= visibility,
                "redelivered after {waited:?}, before its visibility ({visibility:?}) ended"
            );
            assert_eq!(ids(&again), ["c"], "only c's visibility ran out");
            assert_eq!(again[0].delivery_count, 2);
            assert_ne!(again[0].receipt, rest[0].receipt, "each delivery has its own receipt");
            b.ack(&[&again[0].receipt]).await.unwrap();
        }
        None => {
            // No visibility timeout: c is still held after the visibility it
            // was fetched with ran out (it comes back to another consumer
            // only when this one's connection closes: see the last check).
            while c_fetched.elapsed() < SHORT + Duration::from_millis(100) {
                b.extend(&held, LONG).await.unwrap();
                assert!(
                    b.fetch(10, LONG).await.unwrap().is_empty(),
                    "held until acked or the connection closes"
                );
            }
            b.ack(&[&rest[0].receipt]).await.unwrap();
        }
    }

    // Nack, a stale receipt, extend, ack.
    b.nack(&got[0].receipt, Duration::ZERO).await.unwrap();
    let a = fetch_until(b, 10, LONG, "a after its nack").await;
    assert_eq!(ids(&a), ["a"]);
    assert_eq!(a[0].delivery_count, 2, "given back: delivered again");
    b.nack(&got[0].receipt, Duration::ZERO).await.unwrap(); // stale receipt: no effect
    assert!(b.fetch(10, LONG).await.unwrap().is_empty());
    b.extend(&[&a[0].receipt, &got[1].receipt], LONG).await.unwrap();
    b.ack(&[&a[0].receipt, &got[1].receipt]).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 1, "only the delayed message is left");
}

/// A delayed publish and a delayed nack hold a message back for their
/// delay, then deliver it intact (binary payload, separators in every
/// field, an empty header value); each nack counts one more delivery. Two
/// publishes of one message are two messages: no broker may dedupe them,
/// Idem must see duplicates to suppress them itself.
async fn delays_keep_messages_intact_and_count_deliveries(b: &dyn Broker, semantics: Semantics) {
    let e = Envelope {
        id: "bin:1".into(),
        handler: "h:andler".into(),
        headers: vec![("a-b".into(), "1:2".into()), ("empty".into(), String::new())],
        payload: (0..=255u8).chain(b"12:\0x".iter().copied()).collect(),
    };
    let dup = envelope("dup");
    let published = Instant::now();
    b.publish(std::slice::from_ref(&e), DELAY).await.unwrap();
    assert!(b.fetch(10, LONG).await.unwrap().is_empty(), "not due yet");
    b.publish(&[dup.clone(), dup.clone()], Duration::ZERO).await.unwrap();
    let dups = fetch_n(b, 2, LONG, "both copies of a duplicate publish").await;
    assert_eq!(
        [&dups[0].envelope, &dups[1].envelope],
        [&dup, &dup],
        "both copies of a duplicate publish arrive; the delayed message waits"
    );
    b.ack(&receipts(&dups)).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 2, "a delayed message is pending");

    let got = fetch_due(b, "the delayed message").await;
    assert!(published.elapsed() >= DELAY, "delivered after {:?}", published.elapsed());
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].envelope, e);
    let first = got[0].delivery_count;
    if semantics.early_fetches_count {
        assert!(first >= 1, "{first}");
    } else {
        assert_eq!(first, 1, "withheld until due, then delivered once");
    }

    let nacked = Instant::now();
    b.nack(&got[0].receipt, NACK_DELAY).await.unwrap();
    assert!(b.fetch(10, LONG).await.unwrap().is_empty(), "not due yet");
    assert_eq!(b.pending().await.unwrap(), 2, "moved, not lost or doubled");
    let back = fetch_due(b, "the nacked message").await;
    assert!(
        nacked.elapsed() + NACK_SLACK >= NACK_DELAY,
        "redelivered {:?} after a {NACK_DELAY:?} nack",
        nacked.elapsed()
    );
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].envelope, e);
    assert_eq!(back[0].delivery_count, first + 1);
    b.nack(&got[0].receipt, Duration::from_millis(1)).await.unwrap(); // stale: no effect

    b.nack(&back[0].receipt, Duration::from_millis(1)).await.unwrap();
    let third = fetch_due(b, "the message nacked twice").await;
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].envelope, e);
    assert_eq!(third[0].delivery_count, first + 2);
    b.ack(&[&third[0].receipt]).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 1, "only the first delayed message is left");
    assert!(b.fetch(10, LONG).await.unwrap().is_empty(), "no copy left behind");
}

/// Fetch until a delayed or nacked message comes back: its time is kept by
/// the server's redelivery timer, which can run late on a loaded 2-core
/// machine, so this waits up to [`LATE`] (when it came is checked by the
/// caller: never before its delay).
async fn fetch_due(b: &dyn Broker, what: &str) -> Vec<Delivery> {
    wait_for(LATE, what, || async {
        let got = b.fetch(10, LONG).await.unwrap();
        (!got.is_empty()).then_some(got)
    })
    .await
}

/// Both consumers fetch at once, in small batches, until every message was
/// handed out: none goes to both while it is held (each consumer extends
/// what it holds, as a worker's heartbeat does).
async fn two_consumers_never_hold_the_same_delivery(consumers: &[Arc<dyn Broker>], semantics: Semantics) {
    let (one, two) = (&*consumers[0], &*consumers[1]);
    let all: Vec<Envelope> = (0..60).map(|i| envelope(&format!("m{i}"))).collect();
    one.publish(&all, Duration::ZERO).await.unwrap();

    let handed_out = AtomicUsize::new(0);
    let (got1, got2) = tokio::join!(
        consume_share(one, &handed_out, all.len()),
        consume_share(two, &handed_out, all.len())
    );
    let mut seen = HashSet::new();
    for d in got1.iter().chain(&got2) {
        assert!(seen.insert(d.envelope.id.clone()), "{} delivered twice while held", d.envelope.id);
        assert_eq!(d.delivery_count, 1);
    }
    assert_eq!(seen.len(), all.len(), "every message was delivered");
    for (b, got) in [(one, &got1), (two, &got2)] {
        b.extend(&receipts(got), LONG).await.unwrap();
        assert!(b.fetch(10, LONG).await.unwrap().is_empty(), "nothing more");
    }

    two.ack(&receipts(&got2)).await.unwrap();
    assert_eq!(
        one.pending().await.unwrap(),
        got1.len() as u64 + 1,
        "what a consumer holds still counts as pending; what is acked does not"
    );
    one.ack(&receipts(&got1)).await.unwrap();
    assert_eq!(one.pending().await.unwrap(), 1);
    if semantics.exact_only_at_owner {
        // What the other consumer sees is what the server kept.
        assert!(two.pending().await.unwrap() >= 1);
    } else {
        assert_eq!(two.pending().await.unwrap(), 1);
    }
}

/// One consumer's share of [`two_consumers_never_hold_the_same_delivery`].
async fn consume_share(b: &dyn Broker, handed_out: &AtomicUsize, n: usize) -> Vec<Delivery> {
    let deadline = Instant::now() + PATIENCE;
    let mut got: Vec<Delivery> = Vec::new();
    while handed_out.load(Ordering::SeqCst) < n {
        assert!(
            Instant::now() < deadline,
            "timed out: {} of {n} messages handed out",
            handed_out.load(Ordering::SeqCst)
        );
        let batch = b.fetch(3, LONG).await.unwrap();
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        handed_out.fetch_add(batch.len(), Ordering::SeqCst);
        got.extend(batch);
        b.extend(&receipts(&got), LONG).await.unwrap();
    }
    got
}

/// A heartbeat's extends keep a delivery from other consumers for several
/// times its visibility; its receipt stays valid (an extend is not a
/// delivery), and its nack takes effect at once.
async fn extend_keeps_a_delivery_from_other_consumers(consumers: &[Arc<dyn Broker>], semantics: Semantics) {
    consumers[0].publish(&[envelope("long")], Duration::ZERO).await.unwrap();
    // Five heartbeats per visibility, so that a slow one does not lose it.
    let visibility = Duration::from_millis(500);
    let (h, got) = fetch_from_any(&[&*consumers[0], &*consumers[1]], visibility, "long").await;
    let (holder, other) = (&*consumers[h], &*consumers[1 - h]);
    let receipt = got[0].receipt.as_str();

    let keep = semantics.visibility.timeout(visibility).unwrap_or(visibility) * 4;
    let start = Instant::now();
    let mut heartbeat = tokio::time::interval(Duration::from_millis(100));
    while start.elapsed() < keep {
        heartbeat.tick().await;
        holder.extend(&[receipt], visibility).await.unwrap();
        assert!(
            other.fetch(1, LONG).await.unwrap().is_empty(),
            "taken while extended, after {:?}",
            start.elapsed()
        );
    }

    // Extended for long first: now only the nack can make it visible.
    holder.extend(&[receipt], LONG).await.unwrap();
    let nacked = Instant::now();
    holder.nack(receipt, Duration::ZERO).await.unwrap();
    let (i, again) = fetch_from_any(&[other, holder], LONG, "long after its nack").await;
    if let Some(extended) = semantics.visibility.timeout(LONG) {
        assert!(nacked.elapsed() < extended, "came back when its extension ran out, not by the nack");
    }
    assert_eq!(ids(&again), ["long"], "the nack of the extended receipt took effect");
    assert_eq!(again[0].delivery_count, 2, "counts carry over a nack; an extend is not a delivery");
    [other, holder][i].ack(&[&again[0].receipt]).await.unwrap();
    assert_eq!(holder.pending().await.unwrap(), 1);
}

/// A consumer that disappears without acking (its process died) gives its
/// delivery back, to another consumer: once the visibility it was last
/// given ends, or, without a visibility timeout, once its connection
/// closes. Not before, and never to another consumer while it is held.
async fn a_vanished_consumers_delivery_goes_to_another(mut consumers: Vec<Arc<dyn Broker>>, semantics: Semantics) {
    let x = envelope("x");
    consumers[0].publish(std::slice::from_ref(&x), Duration::ZERO).await.unwrap();
    let visibility = Duration::from_secs(1);
    let (h, got) = fetch_from_any(&[&*consumers[0], &*consumers[1]], visibility, "x").await;
    let holder = consumers.swap_remove(h);
    let other = consumers.pop().expect("two consumers");
    assert!(
        other.fetch(10, LONG).await.unwrap().is_empty(),
        "not handed to another consumer while held"
    );
    let extended = Instant::now();
    holder.extend(&[&got[0].receipt], visibility).await.unwrap();
    drop(holder);

    // The other consumer asks with a long visibility of its own: what
    // counts is the visibility x was given. Where counts are exact only at
    // the owner, the new owner re-reads from the committed offset, which
    // the delayed message holds back: records settled above it come again
    // (answered by their claims as duplicates in a worker) unless the
    // server kept the commit's metadata. They are settled here as they come.
    let redelivered = std::sync::Mutex::new(Vec::new());
    let again = wait_for(LATE, "x to go to the other consumer", || async {
        let got = other.fetch(100, LONG).await.unwrap();
        let (x_again, settled): (Vec<Delivery>, Vec<Delivery>) = got.into_iter().partition(|d| d.envelope == x);
        if !settled.is_empty() {
            assert!(semantics.exact_only_at_owner, "only x was unsettled: {settled:?}");
            other.ack(&receipts(&settled)).await.unwrap();
            redelivered.lock().unwrap().extend(settled.into_iter().map(|d| d.envelope.id));
        }
        (!x_again.is_empty()).then_some(x_again)
    })
    .await;
    if let Some(visibility) = semantics.visibility.timeout(visibility) {
        let waited = extended.elapsed();
        assert!(
            waited + SLACK >= visibility,
            "taken over after {waited:?}, before its visibility ({visibility:?}) ended"
        );
    }
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].envelope, x);
    let redelivered = redelivered.into_inner().unwrap();
    assert!(
        !redelivered.contains(&"later".to_string()),
        "the delayed message is not due: {redelivered:?}"
    );
    if semantics.exact_only_at_owner {
        // Counted on only if the server kept the holder's commit metadata.
        assert!((1..=2).contains(&again[0].delivery_count), "{again:?}");
    } else {
        assert_eq!(again[0].delivery_count, 2);
    }
    other.ack(&[&again[0].receipt]).await.unwrap();
    assert_eq!(other.pending().await.unwrap(), 1, "only the delayed message is left");
}

/// Fetch from each consumer in turn until one hands something out; returns
/// which one did.
async fn fetch_from_any(consumers: &[&dyn Broker], visibility: Duration, what: &str) -> (usize, Vec<Delivery>) {
    wait_for(PATIENCE, what, || async {
        for (i, b) in consumers.iter().enumerate() {
            let got = b.fetch(10, visibility).await.unwrap();
            if !got.is_empty() {
                return Some((i, got));
            }
        }
        None
    })
    .await
}

/// The broker calls of one run of the suite, each with the consumer that
/// made it, when it started (from the suite's start), how long it took and
/// what it answered. Deliveries are shown as `id#count`, and a receipt as
/// the delivery it came with to that consumer.
#[derive(Clone)]
struct Trace(Arc<Mutex<TraceLog>>);

struct TraceLog {
    start: Instant,
    calls: Vec<Call>,
    /// (consumer, receipt) → `id#count`: receipts of different consumers
    /// can be equal (RabbitMQ's delivery tags start at 1 on each channel).
    deliveries: HashMap<(usize, String), String>,
}

/// One call, as recorded when it returned.
struct Call {
    at: u128,
    took: u128,
    who: usize,
    what: String,
}

/// How many lines [`Trace::calls`] prints at most: the first
/// [`SHOWN_FIRST`] and the last (where the failure is) the rest.
const SHOWN: usize = 400;
const SHOWN_FIRST: usize = 100;

impl Default for Trace {
    fn default() -> Self {
        Trace(Arc::new(Mutex::new(TraceLog {
            start: Instant::now(),
            calls: Vec::new(),
            deliveries: HashMap::new(),
        })))
    }
}

impl Trace {
    fn note<T>(&self, who: usize, started: Instant, call: String, result: &Result<T, BrokerError>, answer: impl FnOnce(&T) -> String) {
        let took = started.elapsed().as_millis();
        // `answer` may lock (to remember deliveries): called before locking.
        let answer = match result {
            Ok(v) => answer(v),
            Err(e) => format!("error: {e}"),
        };
        let mut log = self.0.lock().unwrap();
        let at = started.duration_since(log.start).as_millis();
        log.calls.push(Call {
            at,
            took,
            who,
            what: format!("{call} -> {answer}"),
        });
    }

    fn remember(&self, who: usize, deliveries: &[Delivery]) -> String {
        let mut log = self.0.lock().unwrap();
        let shown: Vec<String> = deliveries
            .iter()
            .map(|d| format!("{}#{}", d.envelope.id, d.delivery_count))
            .collect();
        for (d, s) in deliveries.iter().zip(&shown) {
            log.deliveries.insert((who, d.receipt.clone()), s.clone());
        }
        format!("[{}]", shown.join(", "))
    }

    fn receipts(&self, who: usize, receipts: &[&str]) -> String {
        let log = self.0.lock().unwrap();
        let shown: Vec<&str> = receipts
            .iter()
            .map(|r| {
                log.deliveries
                    .get(&(who, r.to_string()))
                    .map_or("(unknown receipt)", String::as_str)
            })
            .collect();
        format!("[{}]", shown.join(", "))
    }

    /// The calls by start time. A block of up to four calls repeated
    /// (a polling loop) is shown once, with how often it came again and
    /// until when; past [`SHOWN`] lines, the middle is left out.
    fn calls(&self) -> String {
        let mut log = self.0.lock().unwrap();
        log.calls.sort_by_key(|c| c.at);
        let calls = &log.calls;
        let same = |a: &Call, b: &Call| a.who == b.who && a.what == b.what;
        let mut lines = Vec::new();
        let mut i = 0;
        while i < calls.len() {
            // The block length that covers the most calls by repeating.
            let (mut period, mut repeats) = (1, 1);
            for p in 1..=4 {
                let mut r = 1;
                while i + (r + 1) * p <= calls.len() && (0..p).all(|k| same(&calls[i + k], &calls[i + r * p + k])) {
                    r += 1;
                }
                if r > 1 && r * p > repeats * period {
                    (period, repeats) = (p, r);
                }
            }
            for c in &calls[i..i + period] {
                lines.push(format!("{:>6} ms +{:<4} consumer {}: {}", c.at, c.took, c.who, c.what));
            }
            if repeats > 1 {
                let last = &calls[i + repeats * period - 1];
                lines.push(format!(
                    "          (the {period} call(s) above came {} more time(s), the last at {} ms)",
                    repeats - 1,
                    last.at
                ));
            }
            i += repeats * period;
        }
        if lines.len() > SHOWN {
            let left_out = lines.len() - SHOWN;
            lines.splice(
                SHOWN_FIRST..SHOWN_FIRST + left_out,
                [format!("          ({left_out} lines left out)")],
            );
        }
        let mut out = String::from("broker calls of the suite (start ms, +duration ms), by start time:\n");
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
        out
    }
}

/// A consumer whose calls go into the [`Trace`]. It forwards the calls the
/// suite makes; the trait's other methods keep their defaults (the suite
/// calls none of them).
struct Traced {
    inner: Arc<dyn Broker>,
    who: usize,
    trace: Trace,
}

impl Traced {
    /// Run one call of the inner broker and note it with its answer.
    async fn call<T>(
        &self,
        call: String,
        run: impl Future<Output = Result<T, BrokerError>>,
        answer: impl FnOnce(&T) -> String,
    ) -> Result<T, BrokerError> {
        let started = Instant::now();
        let result = run.await;
        self.trace.note(self.who, started, call, &result, answer);
        result
    }
}

#[async_trait]
impl Broker for Traced {
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError> {
        let ids: Vec<&str> = envelopes.iter().map(|e| e.id.as_str()).collect();
        let call = format!("publish {ids:?} delay {delay:?}");
        self.call(call, self.inner.publish(envelopes, delay), |_| "ok".into()).await
    }

    async fn fetch(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, BrokerError> {
        let call = format!("fetch {max} visibility {visibility:?}");
        self.call(call, self.inner.fetch(max, visibility), |got| self.trace.remember(self.who, got))
            .await
    }

    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        let call = format!("ack {}", self.trace.receipts(self.who, receipts));
        self.call(call, self.inner.ack(receipts), |_| "ok".into()).await
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        let call = format!("nack {} delay {delay:?}", self.trace.receipts(self.who, &[receipt]));
        self.call(call, self.inner.nack(receipt, delay), |_| "ok".into()).await
    }

    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError> {
        let call = format!("extend {} visibility {visibility:?}", self.trace.receipts(self.who, receipts));
        self.call(call, self.inner.extend(receipts, visibility), |_| "ok".into()).await
    }

    async fn pending(&self) -> Result<u64, BrokerError> {
        self.call("pending".into(), self.inner.pending(), |n| n.to_string()).await
    }

    fn semantics(&self) -> Semantics {
        self.inner.semantics()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_broker_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.database.path = dir.path().join("broker.db");
    // Each consumer opens the database on its own, as another process would.
    let config = &config;
    broker_conformance(move || async move {
        let pool = idem_host::backend::open_sqlite(config).await.unwrap();
        Arc::new(SqliteBroker::new(pool)) as Arc<dyn Broker>
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_broker_conforms() {
    let ns = unique_namespace("redis");
    let _keys = brokers::RedisKeys(ns.clone());
    let ns = ns.as_str();
    broker_conformance(move || async move { Arc::new(brokers::redis(ns).await) as Arc<dyn Broker> }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_broker_conforms() {
    brokers::in_amqp_namespace(|ns| async move {
        let ns = ns.as_str();
        broker_conformance(move || async move { Arc::new(brokers::amqp(ns).await) as Arc<dyn Broker> }).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_broker_conforms() {
    brokers::in_nats_namespace(|ns| async move {
        let ns = ns.as_str();
        // Long enough that a step of the suite on a loaded machine does not
        // outlast it (a late nak would count one more delivery).
        let ack_wait = Duration::from_secs(2);
        broker_conformance(move || async move { Arc::new(brokers::nats(ns, ack_wait).await) as Arc<dyn Broker> }).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_broker_conforms() {
    brokers::in_sqs_queue(false, |queue| async move {
        let options = &brokers::sqs_options(&queue);
        broker_conformance(move || async move { Arc::new(brokers::sqs(options).await) as Arc<dyn Broker> }).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_broker_conforms() {
    // One partition, and no ordering among its records: the suite counts on
    // a queue's order and publishes one id twice (one key, which
    // `ordering = "key"` would run one after the other).
    brokers::in_kafka_topic(1, |topic| async move {
        let options = &brokers::kafka_options(&topic, idem_host::config::KafkaOrdering::None);
        broker_conformance(move || async move { Arc::new(brokers::kafka(options).await) as Arc<dyn Broker> }).await;
    })
    .await;
}
