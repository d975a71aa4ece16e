//! Conformance of the redis broker against the real server, and what only
//! a shared Redis stream can show: several consumers of one group, a
//! consumer that disappears, entries written by other producers.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_host::backend::Backends;
use idem_host::broker::redis::RedisBroker;
use idem_host::broker::Broker;
use idem_host::config::Config;
use idem_host::envelope::{Delivery, Envelope};

use crate::common::{services, unique_namespace};

/// Deletes a namespace's keys when the test ends, even when it fails.
struct Keys(String);

impl Drop for Keys {
    fn drop(&mut self) {
        let deleted = redis::Client::open(services::redis())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| {
                redis::cmd("DEL")
                    .arg(format!("{}:queue", self.0))
                    .arg(format!("{}:delayed", self.0))
                    .exec(&mut c)
            });
        if let Err(e) = deleted {
            eprintln!("cannot delete the test keys of namespace {}: {e}", self.0);
        }
    }
}

async fn broker(ns: &str) -> RedisBroker {
    RedisBroker::connect(&services::redis(), ns)
        .await
        .expect("Redis at IDEM_TEST_REDIS_URL (default 127.0.0.1:6379)")
}

async fn redis_conn() -> redis::aio::MultiplexedConnection {
    redis::Client::open(services::redis())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn envelope(id: &str) -> Envelope {
    Envelope {
        id: id.into(),
        handler: "h".into(),
        headers: vec![],
        payload: id.as_bytes().to_vec(),
    }
}

/// Fetch until something comes, or panic after `timeout` with `what`.
async fn fetch_until(b: &RedisBroker, max: usize, visibility: Duration, what: &str) -> Vec<Delivery> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = b.fetch(max, visibility).await.unwrap();
        if !got.is_empty() {
            return got;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ids(ds: &[Delivery]) -> Vec<&str> {
    ds.iter().map(|d| d.envelope.id.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_broker_conforms() {
    let ns = unique_namespace("redis");
    let _keys = Keys(ns.clone());
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.database.path = dir.path().join("conformance.db");
    let sqlite = idem_host::backend::open(&config).await.unwrap();
    let backends = Backends {
        broker: Arc::new(broker(&ns).await),
        ..sqlite
    };
    crate::conformance::broker_conformance(&backends).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_never_hold_the_same_entry() {
    let ns = unique_namespace("redis");
    let _keys = Keys(ns.clone());
    let (b1, b2) = (broker(&ns).await, broker(&ns).await);
    let all: Vec<Envelope> = (0..40).map(|i| envelope(&format!("m{i}"))).collect();
    b1.publish(&all, Duration::ZERO).await.unwrap();

    // Both consume at once, in small batches, until the queue looks empty.
    async fn consume(b: &RedisBroker) -> Vec<Delivery> {
        let mut got = Vec::new();
        let mut empty = 0;
        while empty < 3 {
            let batch = b.fetch(3, Duration::from_secs(30)).await.unwrap();
            empty = if batch.is_empty() { empty + 1 } else { 0 };
            got.extend(batch);
        }
        got
    }
    let (got1, got2) = tokio::join!(consume(&b1), consume(&b2));
    let mut seen = HashSet::new();
    for d in got1.iter().chain(&got2) {
        assert!(
            seen.insert(d.envelope.id.clone()),
            "{} delivered twice within its visibility",
            d.envelope.id
        );
        assert_eq!(d.delivery_count, 1);
    }
    assert_eq!(seen.len(), all.len(), "every entry was delivered");
    assert!(b1.fetch(10, Duration::from_secs(30)).await.unwrap().is_empty());
    assert!(b2.fetch(10, Duration::from_secs(30)).await.unwrap().is_empty());
    assert_eq!(b1.pending().await.unwrap(), 40, "in flight still counts as pending");

    let r1: Vec<&str> = got1.iter().map(|d| d.receipt.as_str()).collect();
    let r2: Vec<&str> = got2.iter().map(|d| d.receipt.as_str()).collect();
    b1.ack(&r1).await.unwrap();
    b2.ack(&r2).await.unwrap();
    assert_eq!(b1.pending().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_consumers_delivery_goes_to_another_after_its_visibility() {
    let ns = unique_namespace("redis");
    let _keys = Keys(ns.clone());
    let (b1, b2) = (broker(&ns).await, broker(&ns).await);
    b1.publish(&[envelope("x")], Duration::ZERO).await.unwrap();

    let visibility = Duration::from_millis(400);
    let fetched_at = Instant::now();
    let got = b1.fetch(10, visibility).await.unwrap();
    assert_eq!(ids(&got), vec!["x"]);
    // The consumer disappears without acking (its process died).
    drop(b1);

    // The other consumer asks with a long visibility of its own: what
    // counts is the visibility x was fetched with.
    let again = fetch_until(&b2, 10, Duration::from_secs(60), "x to be claimed by the other consumer").await;
    assert_eq!(again.len(), 1, "{again:?}");
    let taken = &again[0];
    let waited = fetched_at.elapsed();
    assert!(
        waited >= visibility - Duration::from_millis(10),
        "claimed after {waited:?}, before its visibility ended"
    );
    assert_eq!(taken.envelope, envelope("x"));
    assert_eq!(taken.delivery_count, 2);
    assert_ne!(taken.receipt, got[0].receipt);
    b2.ack(&[&taken.receipt]).await.unwrap();
    assert_eq!(b2.pending().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_consumer_cannot_touch_a_taken_over_delivery() {
    let ns = unique_namespace("redis");
    let _keys = Keys(ns.clone());
    let (b1, b2) = (broker(&ns).await, broker(&ns).await);
    b1.publish(&[envelope("y")], Duration::ZERO).await.unwrap();
    let old = b1.fetch(1, Duration::from_millis(200)).await.unwrap();
    assert_eq!(ids(&old), vec!["y"]);

    // b1 stalls past its visibility; b2 takes the delivery over.
    let taken = fetch_until(&b2, 1, Duration::from_secs(60), "y to be taken over").await.remove(0);

    // b1 wakes up: its extend and nack change nothing.
    b1.extend(&[&old[0].receipt], Duration::from_secs(60)).await.unwrap();
    b1.nack(&old[0].receipt, Duration::ZERO).await.unwrap();
    assert!(
        b1.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty(),
        "the stale nack re-queued nothing"
    );
    assert!(b2.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty());
    assert_eq!(b1.pending().await.unwrap(), 1);

    // The same consumer's older receipt is stale too once it was redelivered.
    let b3 = broker(&ns).await;
    b3.publish(&[envelope("z")], Duration::ZERO).await.unwrap();
    let first = b3.fetch(1, Duration::from_millis(100)).await.unwrap();
    let second = fetch_until(&b3, 1, Duration::from_secs(60), "z to be redelivered").await.remove(0);
    assert_eq!((first[0].envelope.id.as_str(), second.envelope.id.as_str()), ("z", "z"));
    b3.nack(&first[0].receipt, Duration::ZERO).await.unwrap();
    assert!(
        b3.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty(),
        "the older receipt is stale"
    );

    b2.ack(&[&taken.receipt]).await.unwrap();
    b3.ack(&[&second.receipt]).await.unwrap();
    assert_eq!(b1.pending().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_a_running_delivery_from_other_consumers() {
    let ns = unique_namespace("redis");
    let _keys = Keys(ns.clone());
    let (b1, b2) = (broker(&ns).await, broker(&ns).await);
    b1.publish(&[envelope("long")], Duration::ZERO).await.unwrap();
    let got = b1.fetch(1, Duration::from_millis(300)).await.unwrap();
    assert_eq!(ids(&got), vec!["long"]);

    // A heartbeat every 100 ms keeps it for 1 s, three times its visibility.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        b1.extend(&[&got[0].receipt], Duration::from_millis(300)).await.unwrap();
        assert!(
            b2.fetch(1, Duration::from_secs(60)).await.unwrap().is_empty(),
            "taken while extended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The receipt is still b1's: an extend does not count as a delivery.
    b1.nack(&got[0].receipt, Duration::ZERO).await.unwrap();
    let again = b2.fetch(1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(ids(&again), vec!["long"], "the nack of the extended receipt took effect");
    assert_eq!(again[0].delivery_count, 2, "counts carry over a nack");
    b2.ack(&[&again[0].receipt]).await.unwrap();
    assert_eq!(b2.pending().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_payloads_survive_delay_and_nack() {
    let ns = unique_namespace("redis");
    let _keys = Keys(ns.clone());
    let b = broker(&ns).await;
    let e = Envelope {
        id: "bin:1".into(),
        handler: "h:andler".into(),
        headers: vec![("a:b".into(), "1:2".into()), ("empty".into(), String::new())],
        payload: (0..=255u8).chain(b"12:\0x".iter().copied()).collect(),
    };
    b.publish(std::slice::from_ref(&e), Duration::from_millis(150)).await.unwrap();
    assert!(b.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty(), "not due yet");
    assert_eq!(b.pending().await.unwrap(), 1);

    let got = fetch_until(&b, 10, Duration::from_secs(60), "the delayed entry to be due").await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].envelope, e);
    assert_eq!(got[0].delivery_count, 1);

    // Given back with a delay: copied into the delayed set, intact.
    let nacked_at = Instant::now();
    b.nack(&got[0].receipt, Duration::from_millis(200)).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 1, "moved, not lost or doubled");
    let again = fetch_until(&b, 10, Duration::from_secs(60), "the nacked entry to come back").await;
    assert!(
        nacked_at.elapsed() >= Duration::from_millis(190),
        "came back after {:?}",
        nacked_at.elapsed()
    );
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].envelope, e);
    assert_eq!(again[0].delivery_count, 2);
    b.ack(&[&again[0].receipt]).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_malformed_entries_are_still_delivered() {
    let ns = unique_namespace("redis");
    let _keys = Keys(ns.clone());
    let b = broker(&ns).await;
    let mut conn = redis_conn().await;
    // A producer outside Idem, with the documented fields (headers optional).
    redis::cmd("XADD")
        .arg(format!("{ns}:queue"))
        .arg("*")
        .arg("id")
        .arg("ext-1")
        .arg("handler")
        .arg("h")
        .arg("payload")
        .arg(&b"{\"n\":1}"[..])
        .exec_async(&mut conn)
        .await
        .unwrap();
    // Garbage: no handler, headers that are not JSON.
    redis::cmd("XADD")
        .arg(format!("{ns}:queue"))
        .arg("*")
        .arg("junk")
        .arg("1")
        .arg("headers")
        .arg("{oops")
        .exec_async(&mut conn)
        .await
        .unwrap();
    // Garbage in the delayed set, already due.
    redis::cmd("ZADD")
        .arg(format!("{ns}:delayed"))
        .arg(0)
        .arg("not an encoded entry")
        .exec_async(&mut conn)
        .await
        .unwrap();

    let mut got = Vec::new();
    while got.len() < 3 {
        got.extend(fetch_until(&b, 10, Duration::from_secs(60), "three deliveries").await);
    }
    assert_eq!(got.len(), 3, "{got:?}");
    let ext = got.iter().find(|d| d.envelope.id == "ext-1").expect("the foreign entry");
    assert_eq!(
        (ext.envelope.handler.as_str(), ext.envelope.payload.as_slice()),
        ("h", &b"{\"n\":1}"[..])
    );
    assert!(ext.envelope.headers.is_empty());
    let junk: Vec<&Delivery> = got.iter().filter(|d| d.envelope.id.is_empty()).collect();
    assert_eq!(junk.len(), 2);
    assert!(
        junk.iter().all(|d| d.envelope.handler.is_empty()),
        "bad input for the worker to dead-letter"
    );
    assert!(
        junk.iter().any(|d| d.envelope.payload == b"not an encoded entry"),
        "the bytes are kept"
    );

    let receipts: Vec<&str> = got.iter().map(|d| d.receipt.as_str()).collect();
    b.ack(&receipts).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_is_recreated_when_redis_loses_it() {
    let ns = unique_namespace("redis");
    let _keys = Keys(ns.clone());
    let b = broker(&ns).await;
    // What a restart without persistence leaves: no stream, no group.
    let mut conn = redis_conn().await;
    redis::cmd("DEL").arg(format!("{ns}:queue")).exec_async(&mut conn).await.unwrap();
    b.publish(&[envelope("after")], Duration::ZERO).await.unwrap();
    let got = b.fetch(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(ids(&got), vec!["after"]);
    b.ack(&[&got[0].receipt]).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 0);
}

/// The worker on Redis end to end: the heartbeat's extend keeps a long
/// handler's delivery from being redelivered, busy duplicates and retries
/// go through nack (and the delayed set), poison is dead-lettered, and the
/// queue drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_on_redis() {
    use idem_host::config::BrokerKind;
    use idem_host::envelope::idempotency_key;
    use serde_json::json;

    use crate::common::{drain, envelope as message, Env};

    let ns = unique_namespace("redis");
    let _keys = Keys(ns.clone());
    let mut env = Env::new().await;
    env.config.namespace = ns.clone();
    env.config.broker.kind = BrokerKind::Redis;
    env.config.broker.url = Some(services::redis());
    env.config.worker.lease_ms = 400;
    env.config.worker.heartbeat_ms = Some(100);
    env.config.worker.visibility_ms = 400;
    env.config.retry.max_attempts = 3;
    env.config.retry.base_delay_ms = 50;
    env.mock.slow_for = Duration::from_millis(1_500);
    env.mock.state.lock().unwrap().slow.insert("pay-long".into());
    let payment = |id: &str| {
        message(
            &format!("msg-{id}"),
            "record-payment",
            json!({ "payment_id": id, "customer": "c1", "amount_cents": 1250 }),
        )
    };
    let pool = env.start().await;

    // A handler running almost four times its visibility is not redelivered.
    pool.backends.broker.publish(&[payment("pay-long")], Duration::ZERO).await.unwrap();
    drain(&pool).await;
    let c = pool.counters.snapshot();
    assert_eq!((c.executions, c.done, c.busy), (1, 1, 0), "{c:?}");

    let mut batch: Vec<Envelope> = (0..5).map(|_| payment("pay-dup")).collect();
    batch.push(message("poison-t", "poison", json!({ "mode": "transient" })));
    batch.extend((0..10).map(|i| message(&format!("g-{i}"), "grant-credits", json!({ "user": format!("u{i}"), "balance": i }))));
    pool.backends.broker.publish(&batch, Duration::ZERO).await.unwrap();
    drain(&pool).await;

    assert_eq!(env.mock.requests_for(&idempotency_key("record-payment", "pay-long", "charge")), 1);
    assert_eq!(env.mock.performed("payments", "pay-dup"), 1);
    assert_eq!(pool.backends.data.scan("credits").await.unwrap().len(), 10);
    let letters = pool.backends.claims.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!((letters[0].key.as_str(), letters[0].attempts), ("poison-t", 3));
    assert_eq!(pool.backends.broker.pending().await.unwrap(), 0);
    pool.stop().await.unwrap();
}
