//! What only a shared Redis stream can show, against the real server: a
//! consumer whose delivery was taken over, entries written by other
//! producers, a consumer group Redis lost, and the worker end to end. What
//! every broker does is checked by `broker_conformance`.

use std::time::Duration;

use idem_host::broker::Broker;
use idem_host::envelope::{Delivery, Envelope};

use crate::common::brokers::{self, envelope, fetch_until, ids, receipts, redis_conn, RedisKeys};
use crate::common::{services, unique_namespace};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_consumer_cannot_touch_a_taken_over_delivery() {
    let ns = unique_namespace("redis");
    let _keys = RedisKeys(ns.clone());
    let (b1, b2) = (brokers::redis(&ns).await, brokers::redis(&ns).await);
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
    let b3 = brokers::redis(&ns).await;
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
async fn foreign_and_malformed_entries_are_still_delivered() {
    let ns = unique_namespace("redis");
    let _keys = RedisKeys(ns.clone());
    let b = brokers::redis(&ns).await;
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

    b.ack(&receipts(&got)).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 0);
}

/// An entry with thousands of fields (another producer's, or a hostile
/// one) given back with a delay comes back with the fields Idem reads; a
/// delayed-set member of thousands of items is delivered as bad input.
/// Neither stops the fetches: before, the copy's XADD passed every field to
/// Lua's `unpack`, past its 8,000-value limit, so the member stayed due and
/// failed every fetch of the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_entries_given_back_or_delayed_do_not_stop_fetches() {
    let ns = unique_namespace("redis");
    let _keys = RedisKeys(ns.clone());
    let b = brokers::redis(&ns).await;
    let mut conn = redis_conn().await;
    let mut wide = redis::cmd("XADD");
    wide.arg(format!("{ns}:queue")).arg("*");
    wide.arg("id").arg("wide").arg("handler").arg("h").arg("payload").arg("{}");
    for i in 0..5_000 {
        wide.arg(format!("f{i}")).arg("v");
    }
    wide.exec_async(&mut conn).await.unwrap();
    let first = fetch_until(&b, 10, Duration::from_secs(60), "the wide entry").await;
    assert_eq!(ids(&first), vec!["wide"]);
    b.nack(&first[0].receipt, Duration::from_millis(10)).await.unwrap();

    // A member of 9,001 items, written into the delayed set by hand.
    let mut member = String::from("1:t");
    for _ in 0..4_500 {
        member.push_str("1:f1:v");
    }
    redis::cmd("ZADD")
        .arg(format!("{ns}:delayed"))
        .arg(0)
        .arg(&member)
        .exec_async(&mut conn)
        .await
        .unwrap();
    b.publish(&[envelope("after")], Duration::ZERO).await.unwrap();

    let mut got = Vec::new();
    while got.len() < 3 {
        got.extend(fetch_until(&b, 10, Duration::from_secs(60), "three deliveries").await);
    }
    let again = got.iter().find(|d| d.envelope.id == "wide").expect("the wide entry, again");
    assert_eq!(
        (again.envelope.handler.as_str(), again.envelope.payload.as_slice()),
        ("h", &b"{}"[..])
    );
    assert!(got.iter().any(|d| d.envelope.id == "after"));
    assert!(
        got.iter()
            .any(|d| d.envelope.handler.is_empty() && d.envelope.payload == member.as_bytes()),
        "the wide member, as bad input with its bytes"
    );
    b.ack(&receipts(&got)).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 0);
}

/// An ack is XACK alone: the settled entries stay in the stream until a
/// fetch's scan trims them, and `pending` counts the group's pending list
/// and lag, not the stream's length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_entries_are_trimmed_by_a_later_fetch() {
    let ns = unique_namespace("redis");
    let _keys = RedisKeys(ns.clone());
    let b = brokers::redis(&ns).await;
    let conn = redis_conn().await;
    let stream = format!("{ns}:queue");
    let xlen = |mut conn: redis::aio::MultiplexedConnection| {
        let stream = stream.clone();
        async move { redis::cmd("XLEN").arg(&stream).query_async::<u64>(&mut conn).await.unwrap() }
    };
    const N: usize = 300;
    let all: Vec<Envelope> = (0..N).map(|i| envelope(&format!("m{i}"))).collect();
    b.publish(&all, Duration::ZERO).await.unwrap();
    let mut got = Vec::new();
    while got.len() < N {
        got.extend(fetch_until(&b, N, Duration::from_secs(60), "the published entries").await);
    }
    assert_eq!(got.len(), N);
    assert_eq!(b.pending().await.unwrap(), N as u64);
    b.ack(&receipts(&got)).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 0, "acked entries are not pending");
    assert_eq!(xlen(conn.clone()).await, N as u64, "acked, not deleted one by one");
    // Nothing is pending now, so a scan trims every entry read. A short
    // visibility: scans come every 100 ms.
    let visibility = Duration::from_millis(400);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while xlen(conn.clone()).await > 0 {
        assert!(std::time::Instant::now() < deadline, "settled entries were never trimmed");
        assert!(b.fetch(10, visibility).await.unwrap().is_empty());
    }
    // An entry published since is not trimmed, and counts.
    b.publish(&[envelope("late")], Duration::ZERO).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 1);
    let late = fetch_until(&b, 1, visibility, "late").await;
    assert_eq!(ids(&late), vec!["late"]);
    b.ack(&receipts(&late)).await.unwrap();
    assert_eq!(b.pending().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_is_recreated_when_redis_loses_it() {
    let ns = unique_namespace("redis");
    let _keys = RedisKeys(ns.clone());
    let b = brokers::redis(&ns).await;
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
    use serde_json::json;

    use crate::common::{drain, envelope as message, Env};

    let ns = unique_namespace("redis");
    let _keys = RedisKeys(ns.clone());
    let mut env = Env::new().await;
    env.config.namespace = ns.clone();
    env.config.broker.kind = BrokerKind::Redis;
    env.config.broker.url = Some(services::redis());
    env.config.worker.lease_ms = 1_000;
    env.config.worker.heartbeat_ms = Some(100);
    env.config.worker.visibility_ms = 1_000;
    env.config.retry.max_attempts = 3;
    env.config.retry.base_delay_ms = 50;
    env.mock.state.lock().unwrap().slow_for = Duration::from_millis(3_800);
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

    assert_eq!(env.step_requests("payments-api", "record-payment", "pay-long", "charge"), 1);
    assert_eq!(env.mock.performed("payments", "pay-dup"), 1);
    assert_eq!(pool.backends.data.scan("credits").await.unwrap().len(), 10);
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!((letters[0].key.as_str(), letters[0].attempts), ("poison-t", 3));
    assert_eq!(pool.backends.broker.pending().await.unwrap(), 0);
    pool.stop().await.unwrap();
}
