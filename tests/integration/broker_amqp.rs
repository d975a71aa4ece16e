//! Conformance of the RabbitMQ broker against the real server
//! (`IDEM_TEST_AMQP_URL`), and what only AMQP can show: redelivery when a
//! connection closes, TTL delay queues, single and `multiple` acks, foreign
//! messages, a consumer that is cancelled under it. Each test declares its
//! own queues (a unique namespace) and deletes them afterwards, also on
//! failure.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use idem_host::backend::Backends;
use idem_host::broker::amqp::AmqpBroker;
use idem_host::broker::Broker;
use idem_host::config::{BrokerKind, Config};
use idem_host::envelope::{Delivery, Envelope};
use lapin::options::{BasicPublishOptions, ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

use crate::common::{services, unique_namespace, wait_until};

/// The delay buckets the broker declares (see `broker::amqp`).
const DELAY_BUCKETS_MS: [u64; 7] = [50, 250, 1_000, 5_000, 30_000, 120_000, 600_000];

async fn connect(namespace: &str) -> AmqpBroker {
    AmqpBroker::connect(&services::amqp(), namespace)
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ at IDEM_TEST_AMQP_URL ({}): {e:#}", services::amqp()))
}

/// A plain AMQP connection, as another producer or an operator has.
async fn raw() -> Connection {
    Connection::connect(&services::amqp(), ConnectionProperties::default())
        .await
        .expect("RabbitMQ for the test's own connection")
}

/// Delete a namespace's queues and exchange.
pub async fn delete_namespace(namespace: &str) -> lapin::Result<()> {
    let conn = raw().await;
    let ch = conn.create_channel().await?;
    let mut queues = vec![format!("{namespace}.queue"), format!("{namespace}.dead")];
    queues.extend(DELAY_BUCKETS_MS.iter().map(|ms| format!("{namespace}.delay.{ms}")));
    for q in queues {
        ch.queue_delete(q.into(), QueueDeleteOptions::default()).await?;
    }
    ch.exchange_delete(format!("{namespace}.dead").into(), ExchangeDeleteOptions::default())
        .await?;
    conn.close(200, "OK".into()).await
}

/// Run `body` with a fresh namespace; its queues and exchange are deleted
/// afterwards, whether the body passed or panicked.
async fn in_namespace<F, Fut>(body: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let namespace = unique_namespace("amqp");
    let outcome = std::panic::AssertUnwindSafe(body(namespace.clone())).catch_unwind().await;
    let deleted = delete_namespace(&namespace).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    deleted.unwrap_or_else(|e| panic!("deleting the queues of namespace {namespace}: {e}"));
}

/// Backends whose broker is RabbitMQ; claims and data are SQLite in a tempdir.
async fn backends(broker: AmqpBroker) -> (tempfile::TempDir, Backends) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.database.path = dir.path().join("amqp.db");
    let mut b = idem_host::backend::open(&config).await.unwrap();
    b.broker = Arc::new(broker);
    (dir, b)
}

fn envelope(id: &str) -> Envelope {
    Envelope {
        id: id.into(),
        handler: "h".into(),
        headers: vec![("k".into(), "v".into())],
        payload: id.as_bytes().to_vec(),
    }
}

fn ids(deliveries: &[Delivery]) -> Vec<&str> {
    deliveries.iter().map(|d| d.envelope.id.as_str()).collect()
}

/// Fetch until `n` deliveries came, or panic after 5 s: the server pushes
/// deliveries asynchronously, so one fetch right after a publish may see
/// only some of them.
async fn fetch_n(broker: &dyn Broker, n: usize, what: &str) -> Vec<Delivery> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < deadline, "timed out waiting for: {what} (got {:?})", ids(&got));
        got.extend(broker.fetch(n - got.len(), Duration::from_secs(60)).await.unwrap());
    }
    got
}

/// Fetch until something comes, or panic after 5 s.
async fn fetch_some(broker: &dyn Broker, what: &str) -> Vec<Delivery> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = broker.fetch(10, Duration::from_secs(60)).await.unwrap();
        if !got.is_empty() {
            return got;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
    }
}

/// `crate::conformance::broker_conformance`, adapted where RabbitMQ
/// differs by nature: it has no visibility timeout. A delivery stays with
/// the connection that received it until it is acked or that connection
/// closes, so "not acked within the visibility timeout: delivered again"
/// becomes "still held after its visibility ran out; delivered again to
/// another consumer once its connection closes", tested last because it
/// closes the broker. Every other check is the shared suite's; `pending`
/// counts c, which this broker still holds at that point.
async fn amqp_broker_conformance(b: Backends, namespace: &str) {
    let broker = b.broker.clone();
    let e = envelope;
    broker.publish(&[e("a"), e("b"), e("c")], Duration::ZERO).await.unwrap();
    broker.publish(&[e("later")], Duration::from_secs(3600)).await.unwrap();
    assert_eq!(broker.pending().await.unwrap(), 4);

    let got = fetch_n(&*broker, 2, "a and b").await;
    assert_eq!(ids(&got), vec!["a", "b"]);
    assert_eq!(got[0].envelope, e("a"), "payload, handler and headers round-trip");
    assert_eq!(got[0].delivery_count, 1);
    let rest = fetch_some(&*broker, "c").await;
    assert_eq!(ids(&rest), vec!["c"], "in-flight and delayed messages are invisible");

    // No visibility timeout: c, fetched "for 200 ms", is still held.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        broker.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty(),
        "held until acked or the connection closes"
    );

    // Nack with a delay, extend, ack.
    broker.nack(&got[0].receipt, Duration::ZERO).await.unwrap();
    let a = fetch_some(&*broker, "a after its nack").await;
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].envelope.id, "a");
    assert_eq!(a[0].delivery_count, 2, "requeued: redelivered");
    broker.nack(&got[0].receipt, Duration::ZERO).await.unwrap(); // stale receipt: no effect
    assert!(broker.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty());
    broker
        .extend(&[&a[0].receipt, &got[1].receipt], Duration::from_secs(60))
        .await
        .unwrap();
    broker.ack(&[&a[0].receipt, &got[1].receipt]).await.unwrap();
    assert_eq!(broker.pending().await.unwrap(), 2, "c (held) and the delayed message are left");

    // Redelivery: another consumer does not get c while this connection
    // holds it, and gets it once the connection closes.
    let other = connect(namespace).await;
    assert!(other.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty());
    drop(broker);
    drop(b);
    let again = fetch_some(&other, "c to be redelivered to the other consumer").await;
    assert_eq!(ids(&again), vec!["c"]);
    assert_eq!(again[0].delivery_count, 2);
    other.ack(&[&again[0].receipt]).await.unwrap();
    assert_eq!(other.pending().await.unwrap(), 1, "only the delayed message is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_broker_conforms() {
    in_namespace(|ns| async move {
        let (_dir, b) = backends(connect(&ns).await).await;
        amqp_broker_conformance(b, &ns).await;
    })
    .await;
}

/// A delayed publish waits in a TTL queue, then arrives intact (RabbitMQ's
/// dead-letter headers do not leak into the envelope); a delayed nack
/// moves the message there and counts one more delivery each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_delayed_publish_and_nack() {
    in_namespace(|ns| async move {
        let broker = connect(&ns).await;
        let e = Envelope {
            payload: (0..=255u8).collect(),
            ..envelope("delayed")
        };
        let published = Instant::now();
        broker.publish(std::slice::from_ref(&e), Duration::from_millis(200)).await.unwrap();
        assert!(broker.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty(), "not due yet");
        assert_eq!(broker.pending().await.unwrap(), 1, "a delayed message is pending");

        let got = fetch_some(&broker, "the delayed message").await;
        assert!(
            published.elapsed() >= Duration::from_millis(200),
            "delivered after {:?}",
            published.elapsed()
        );
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].envelope, e);
        assert_eq!(got[0].delivery_count, 1);

        let nacked = Instant::now();
        broker.nack(&got[0].receipt, Duration::from_millis(300)).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 1, "moved, not lost or doubled");
        assert!(broker.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty(), "not due yet");
        let back = fetch_some(&broker, "the nacked message").await;
        assert!(
            nacked.elapsed() >= Duration::from_millis(300),
            "redelivered {:?} after a 300 ms nack",
            nacked.elapsed()
        );
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].envelope, e);
        assert_eq!(back[0].delivery_count, 2);
        broker.nack(&got[0].receipt, Duration::from_millis(1)).await.unwrap(); // stale: no effect

        broker.nack(&back[0].receipt, Duration::from_millis(1)).await.unwrap();
        let third = fetch_some(&broker, "the message nacked twice").await;
        assert_eq!(third[0].envelope, e);
        assert_eq!(third[0].delivery_count, 3);
        broker.ack(&[&third[0].receipt]).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 0);
        assert!(
            broker.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty(),
            "no copy left behind"
        );
    })
    .await;
}

/// Acks take effect, `multiple` acks cover only what they should, and a
/// second ack of one delivery is harmless (in AMQP it would close the
/// channel). Checked from a second connection after the first closes: the
/// only message that comes back is the one never acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_acks_single_and_multiple() {
    in_namespace(|ns| async move {
        let broker = connect(&ns).await;
        let all: Vec<Envelope> = (0..6).map(|i| envelope(&format!("m{i}"))).collect();
        broker.publish(&all, Duration::ZERO).await.unwrap();
        let got = fetch_n(&broker, 6, "six deliveries").await;
        assert_eq!(ids(&got), vec!["m0", "m1", "m2", "m3", "m4", "m5"]);
        let r: Vec<&str> = got.iter().map(|d| d.receipt.as_str()).collect();

        broker.ack(&[r[1], r[0]]).await.unwrap(); // every unacked tag up to m1: one multiple ack
        broker.ack(&[r[3]]).await.unwrap(); // m2 still held: a single ack
        broker.ack(&[r[5], r[4]]).await.unwrap(); // m2 still held: single acks
        broker.ack(&[r[0], r[3]]).await.unwrap(); // acked already: no effect
        assert_eq!(broker.pending().await.unwrap(), 1, "m2 is left, and the channel survived");
        assert!(broker.ack(&["not-a-receipt"]).await.is_err(), "malformed receipts are refused");

        drop(broker);
        let other = connect(&ns).await;
        let back = fetch_some(&other, "the unacked m2 to come back").await;
        assert_eq!(ids(&back), vec!["m2"]);
        assert_eq!(back[0].delivery_count, 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            other.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty(),
            "acked messages stay acked"
        );
        other.ack(&[&back[0].receipt]).await.unwrap();
        assert_eq!(other.pending().await.unwrap(), 0);
    })
    .await;
}

/// Messages another tool published: without Idem's headers they are still
/// deliveries (empty id and handler) for the worker to dead-letter as bad
/// input, and header values of any type arrive as strings. An id AMQP
/// cannot carry is refused at publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_foreign_messages_and_long_ids() {
    in_namespace(|ns| async move {
        let broker = connect(&ns).await;
        let conn = raw().await;
        let ch = conn.create_channel().await.unwrap();
        let queue = format!("{ns}.queue");
        ch.basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            b"raw",
            BasicProperties::default(),
        )
        .await
        .unwrap();
        let mut headers = FieldTable::default();
        headers.insert("idem-handler".into(), AMQPValue::LongString("h".into()));
        headers.insert("n".into(), AMQPValue::LongInt(7));
        headers.insert("flag".into(), AMQPValue::Boolean(true));
        ch.basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            b"{}",
            BasicProperties::default().with_message_id("ext-1".into()).with_headers(headers),
        )
        .await
        .unwrap();

        let got = fetch_n(&broker, 2, "the two foreign messages").await;
        let bare = &got[0].envelope;
        assert_eq!(
            (bare.id.as_str(), bare.handler.as_str(), bare.payload.as_slice()),
            ("", "", &b"raw"[..])
        );
        assert!(bare.headers.is_empty());
        let ext = &got[1].envelope;
        assert_eq!((ext.id.as_str(), ext.handler.as_str()), ("ext-1", "h"));
        assert_eq!(
            ext.headers,
            vec![("flag".to_string(), "true".to_string()), ("n".to_string(), "7".to_string())]
        );
        broker.ack(&[&got[0].receipt, &got[1].receipt]).await.unwrap();

        let long = envelope(&"x".repeat(300));
        let err = broker.publish(&[envelope("fine"), long], Duration::ZERO).await.unwrap_err();
        assert!(err.to_string().contains("message_id"), "{err}");
        assert_eq!(broker.pending().await.unwrap(), 0, "nothing of the refused batch was sent");
        conn.close(200, "OK".into()).await.unwrap();
    })
    .await;
}

/// When the server cancels the consumer (here: an operator deletes the
/// queue), fetch reports it, the next call reconnects and declares the
/// queue again, and receipts from before have no effect on the new
/// connection's deliveries (whose delivery tags start again at 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_reconnects_after_the_consumer_is_cancelled() {
    in_namespace(|ns| async move {
        let broker = connect(&ns).await;
        broker.publish(&[envelope("x")], Duration::ZERO).await.unwrap();
        let old = fetch_some(&broker, "x").await;

        let conn = raw().await;
        let ch = conn.create_channel().await.unwrap();
        ch.queue_delete(format!("{ns}.queue").into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        conn.close(200, "OK".into()).await.unwrap();
        wait_until(Duration::from_secs(5), "fetch to report the cancelled consumer", || async {
            broker.fetch(10, Duration::from_secs(60)).await.is_err()
        })
        .await;

        broker.publish(&[envelope("y")], Duration::ZERO).await.unwrap();
        let new = fetch_some(&broker, "y on the new connection").await;
        assert_eq!(ids(&new), vec!["y"]);
        broker.ack(&[&old[0].receipt]).await.unwrap();
        broker.nack(&old[0].receipt, Duration::ZERO).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 1, "the old receipt did not touch y");
        broker.ack(&[&new[0].receipt]).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 0);
    })
    .await;
}

/// The worker pool end to end on RabbitMQ: five copies of one message at
/// once run once; the copies that find the key busy go through the delay
/// queues and are then acked as duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_pool_runs_concurrent_duplicates_once() {
    in_namespace(|ns| async move {
        let mut env = crate::common::Env::new().await;
        env.config.namespace = ns.clone();
        env.config.broker.kind = BrokerKind::Rabbitmq;
        env.config.broker.url = Some(services::amqp());
        env.mock.state.lock().unwrap().held.insert("payments/pay-amqp".into());
        let pool = env.start().await;
        let payment = crate::common::envelope(
            "msg-pay-amqp",
            "record-payment",
            serde_json::json!({ "payment_id": "pay-amqp", "customer": "c1", "amount_cents": 1250 }),
        );
        let copies: Vec<_> = (0..5).map(|_| payment.clone()).collect();
        pool.backends.broker.publish(&copies, Duration::ZERO).await.unwrap();
        env.mock.wait_for_held().await;
        wait_until(Duration::from_secs(10), "the other copies to find the key busy", || async {
            pool.counters.snapshot().busy >= 4
        })
        .await;
        env.mock.release();
        crate::common::drain(&pool).await;
        let c = pool.counters.snapshot();
        assert_eq!((c.executions, c.duplicates, c.done), (1, 4, 1), "{c:?}");
        assert_eq!(env.mock.performed("payments", "pay-amqp"), 1);
        assert_eq!(
            crate::common::state(&pool, "record-payment", "pay-amqp").await.as_deref(),
            Some("done")
        );
        pool.stop().await.unwrap();
    })
    .await;
}

/// Connecting where no server listens says which setting to fix, without
/// the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_connect_error_names_the_setting() {
    let err = AmqpBroker::connect("amqp://guest:sekrit@127.0.0.1:1/%2f", "idem")
        .await
        .err()
        .expect("nothing listens on port 1");
    let text = format!("{err:#}");
    assert!(text.contains("broker.url") && text.contains("user/password/vhost"), "{text}");
    assert!(!text.contains("sekrit"), "the password is not shown: {text}");
}
