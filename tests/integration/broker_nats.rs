//! Conformance of the NATS JetStream broker against the real server
//! (`IDEM_TEST_NATS_URL`, nats-server with `-js`). Each test declares its own
//! stream (a unique namespace) and deletes it afterwards, also on failure.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use idem_host::backend::Backends;
use idem_host::broker::nats::NatsBroker;
use idem_host::broker::Broker;
use idem_host::config::Config;
use idem_host::envelope::{Delivery, Envelope};

use crate::common::{services, unique_namespace, wait_until};

async fn connect(namespace: &str, ack_wait: Duration) -> NatsBroker {
    NatsBroker::connect(&services::nats(), namespace, ack_wait)
        .await
        .unwrap_or_else(|e| panic!("NATS with JetStream at {}: {e:#}", services::nats()))
}

/// Run `body` with a fresh namespace; its stream is deleted afterwards,
/// whether the body passed or panicked.
async fn in_namespace<F, Fut>(body: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let namespace = unique_namespace("nats");
    let outcome = std::panic::AssertUnwindSafe(body(namespace.clone())).catch_unwind().await;
    let client = async_nats::connect(services::nats()).await.expect("NATS for cleanup");
    let deleted = async_nats::jetstream::new(client).delete_stream(&namespace).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    deleted.unwrap_or_else(|e| panic!("deleting stream {namespace}: {e}"));
}

/// Backends whose broker is NATS; claims and data are SQLite in a tempdir.
async fn backends(broker: NatsBroker) -> (tempfile::TempDir, Backends) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.database.path = dir.path().join("nats.db");
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

/// Fetch until something arrives (at most 5 s).
async fn next_deliveries(broker: &NatsBroker, what: &str) -> Vec<Delivery> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = broker.fetch(10, Duration::from_secs(60)).await.unwrap();
        if !got.is_empty() {
            return got;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
    }
}

fn ids(deliveries: &[Delivery]) -> Vec<&str> {
    deliveries.iter().map(|d| d.envelope.id.as_str()).collect()
}

/// `crate::conformance::broker_conformance`, adapted where JetStream differs
/// by nature: the visibility timeout is the consumer's `ack_wait`, fixed at
/// creation, so the shared suite's per-fetch split (a and b fetched for 60 s,
/// c for 200 ms, then only c redelivered) cannot be expressed with
/// `visibility`. Here every fetch gets `ack_wait` (1 s) and a and b are kept
/// invisible the JetStream way, by extending them (`+WPI`) while c's
/// `ack_wait` runs out. Every other check is the shared suite's.
async fn nats_broker_conformance(b: &Backends) {
    let broker = &b.broker;
    let e = envelope;
    broker.publish(&[e("a"), e("b"), e("c")], Duration::ZERO).await.unwrap();
    broker.publish(&[e("later")], Duration::from_secs(3600)).await.unwrap();
    assert_eq!(broker.pending().await.unwrap(), 4);

    let got = broker.fetch(2, Duration::from_secs(60)).await.unwrap();
    assert_eq!(ids(&got), vec!["a", "b"]);
    assert_eq!(got[0].envelope, e("a"), "payload, handler and headers round-trip");
    assert_eq!(got[0].delivery_count, 1);
    let held = [got[0].receipt.as_str(), got[1].receipt.as_str()];
    let rest = broker.fetch(10, Duration::from_millis(200)).await.unwrap();
    assert_eq!(ids(&rest), vec!["c"], "in-flight and delayed messages are invisible");

    // Not acked within ack_wait: delivered again (a and b are extended).
    // The deadline is generous: on a loaded 2-core machine the server's
    // redelivery timer can run late.
    wait_until(Duration::from_secs(20), "c to be redelivered", || async {
        broker.extend(&held, Duration::from_secs(60)).await.unwrap();
        let again = broker.fetch(10, Duration::from_secs(60)).await.unwrap();
        if let Some(d) = again.first() {
            assert_eq!(ids(&again), vec!["c"], "only c's ack_wait ran out");
            assert_eq!(d.delivery_count, 2);
            broker.ack(&[&d.receipt]).await.unwrap();
            true
        } else {
            false
        }
    })
    .await;

    // Nack with a delay, extend, ack.
    broker.nack(&got[0].receipt, Duration::ZERO).await.unwrap();
    let a = broker.fetch(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].envelope.id, "a");
    broker.nack(&got[0].receipt, Duration::ZERO).await.unwrap(); // stale receipt: no effect
    assert!(broker.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty());
    broker
        .extend(&[&a[0].receipt, &got[1].receipt], Duration::from_secs(60))
        .await
        .unwrap();
    broker.ack(&[&a[0].receipt, &got[1].receipt]).await.unwrap();
    assert_eq!(broker.pending().await.unwrap(), 1, "only the delayed message is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_broker_conforms() {
    in_namespace(|ns| async move {
        let (_dir, b) = backends(connect(&ns, Duration::from_secs(1)).await).await;
        nats_broker_conformance(&b).await;
    })
    .await;
}

/// Two workers on one namespace share the durable consumer: within
/// `ack_wait` no message goes to both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_two_brokers_never_share_a_delivery() {
    in_namespace(|ns| async move {
        let ack_wait = Duration::from_secs(3);
        let one = Arc::new(connect(&ns, ack_wait).await);
        let two = Arc::new(connect(&ns, ack_wait).await);
        let all: Vec<Envelope> = (0..60).map(|i| envelope(&format!("m{i}"))).collect();
        one.publish(&all, Duration::ZERO).await.unwrap();

        let start = Instant::now();
        let total = Arc::new(AtomicUsize::new(0));
        let seen: Arc<Mutex<Vec<(usize, String, String)>>> = Arc::default();
        let mut tasks = Vec::new();
        for (who, broker) in [(1, one.clone()), (2, two.clone())] {
            let (total, seen) = (total.clone(), seen.clone());
            tasks.push(tokio::spawn(async move {
                // Stop well inside ack_wait: after it, redelivery is allowed.
                while total.load(Ordering::SeqCst) < 60 && start.elapsed() < Duration::from_millis(1_500) {
                    let got = broker.fetch(7, ack_wait).await.unwrap();
                    total.fetch_add(got.len(), Ordering::SeqCst);
                    let mut seen = seen.lock().unwrap();
                    seen.extend(got.into_iter().map(|d| (who, d.envelope.id, d.receipt)));
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(start.elapsed() < ack_wait, "the check must finish inside ack_wait");
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let mut by_id: HashMap<&str, Vec<usize>> = HashMap::new();
        for (who, id, _) in &seen {
            by_id.entry(id.as_str()).or_default().push(*who);
        }
        let twice: Vec<_> = by_id.iter().filter(|(_, w)| w.len() > 1).collect();
        assert!(twice.is_empty(), "delivered more than once within ack_wait: {twice:?}");
        assert_eq!(by_id.len(), 60, "every message was delivered");
        let shares: HashSet<usize> = seen.iter().map(|(w, _, _)| *w).collect();
        eprintln!("brokers that received deliveries: {shares:?}");

        for (who, broker) in [(1, &one), (2, &two)] {
            let receipts: Vec<&str> = seen.iter().filter(|(w, _, _)| *w == who).map(|(_, _, r)| r.as_str()).collect();
            broker.ack(&receipts).await.unwrap();
        }
        assert_eq!(one.pending().await.unwrap(), 0);
        assert_eq!(two.pending().await.unwrap(), 0);
    })
    .await;
}

/// A delivery that is neither acked nor extended comes back after ack_wait,
/// not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_unacked_delivery_returns_after_ack_wait() {
    in_namespace(|ns| async move {
        let ack_wait = Duration::from_millis(500);
        let broker = connect(&ns, ack_wait).await;
        broker.publish(&[envelope("m")], Duration::ZERO).await.unwrap();
        let first = broker.fetch(10, ack_wait).await.unwrap();
        let fetched_at = Instant::now();
        assert_eq!(ids(&first), vec!["m"]);
        assert_eq!(first[0].delivery_count, 1);

        let again = next_deliveries(&broker, "m to be redelivered").await;
        let waited = fetched_at.elapsed();
        assert!(
            waited >= Duration::from_millis(450),
            "redelivered after {waited:?}, before ack_wait"
        );
        assert_eq!(ids(&again), vec!["m"]);
        assert_eq!(again[0].delivery_count, 2);
        assert_ne!(again[0].receipt, first[0].receipt, "each delivery has its own receipt");
        broker.ack(&[&again[0].receipt]).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 0);
    })
    .await;
}

/// The heartbeat's extend (`+WPI`) keeps a running delivery invisible for
/// several ack_waits; once it stops, the message comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_extend_keeps_a_delivery_past_ack_wait() {
    in_namespace(|ns| async move {
        let ack_wait = Duration::from_millis(500);
        let broker = connect(&ns, ack_wait).await;
        broker.publish(&[envelope("long")], Duration::ZERO).await.unwrap();
        let first = broker.fetch(10, ack_wait).await.unwrap();
        assert_eq!(ids(&first), vec!["long"]);
        let receipt = first[0].receipt.as_str();

        let start = Instant::now();
        let mut last_extend = Instant::now();
        while start.elapsed() < ack_wait * 4 {
            broker.extend(&[receipt], ack_wait).await.unwrap();
            last_extend = Instant::now();
            let got = broker.fetch(10, ack_wait).await.unwrap();
            assert!(got.is_empty(), "redelivered while extended, after {:?}", start.elapsed());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let again = next_deliveries(&broker, "the delivery to return once no longer extended").await;
        assert!(
            last_extend.elapsed() >= Duration::from_millis(450),
            "returned {:?} after the last extend",
            last_extend.elapsed()
        );
        assert_eq!(again[0].delivery_count, 2);
        broker.ack(&[&again[0].receipt]).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 0);
    })
    .await;
}

/// Delayed publish (`Idem-Not-Before`) and delayed nack (`-NAK` with a
/// delay) both hold a message back for the delay and then deliver it.
/// Duplicate publishes are two messages: JetStream must not dedupe them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_delays_and_duplicates() {
    in_namespace(|ns| async move {
        let ack_wait = Duration::from_secs(5);
        let broker = connect(&ns, ack_wait).await;
        let published = Instant::now();
        broker.publish(&[envelope("delayed")], Duration::from_millis(800)).await.unwrap();
        broker.publish(&[envelope("dup"), envelope("dup")], Duration::ZERO).await.unwrap();

        let got = broker.fetch(10, ack_wait).await.unwrap();
        assert_eq!(
            ids(&got),
            vec!["dup", "dup"],
            "both copies of a duplicate publish arrive; the delayed one waits"
        );
        broker.ack(&[&got[0].receipt, &got[1].receipt]).await.unwrap();

        let delayed = next_deliveries(&broker, "the delayed message").await;
        assert!(
            published.elapsed() >= Duration::from_millis(800),
            "delivered after {:?}",
            published.elapsed()
        );
        assert_eq!(delayed[0].envelope, envelope("delayed"), "Idem-Not-Before is not a producer header");

        let nacked = Instant::now();
        broker.nack(&delayed[0].receipt, Duration::from_millis(600)).await.unwrap();
        let back = next_deliveries(&broker, "the nacked message").await;
        assert!(
            nacked.elapsed() >= Duration::from_millis(550),
            "redelivered {:?} after a 600 ms nack",
            nacked.elapsed()
        );
        assert_eq!(ids(&back), vec!["delayed"]);
        broker.ack(&[&back[0].receipt]).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 0);
    })
    .await;
}

/// A message another tool published without Idem's headers is still a
/// delivery (empty handler and id) for the worker to dead-letter, and
/// headers that cannot travel are refused at publish, not sent broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_foreign_messages_and_bad_headers() {
    in_namespace(|ns| async move {
        let broker = connect(&ns, Duration::from_secs(5)).await;
        let client = async_nats::connect(services::nats()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("x-trace", "t1");
        js.publish_with_headers(format!("{ns}.queue"), headers, "raw".into())
            .await
            .unwrap()
            .await
            .unwrap();
        let got = broker.fetch(10, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1);
        let e = &got[0].envelope;
        assert_eq!((e.id.as_str(), e.handler.as_str(), e.payload.as_slice()), ("", "", &b"raw"[..]));
        assert_eq!(e.headers, vec![("x-trace".to_string(), "t1".to_string())]);
        broker.ack(&[&got[0].receipt]).await.unwrap();

        for (name, value) in [("Nats-Msg-Id", "x"), ("bad name", "x"), ("ok", "line\nbreak")] {
            let mut e = envelope("bad");
            e.headers = vec![(name.into(), value.into())];
            let err = broker.publish(&[e], Duration::ZERO).await.unwrap_err().to_string();
            assert!(err.contains("cannot travel as a NATS header"), "{err}");
        }
        assert_eq!(broker.pending().await.unwrap(), 0);
        assert!(
            broker.ack(&["$JS.ACK.other.idem.1.1.1.1.0"]).await.is_err(),
            "receipts of other streams are refused"
        );
    })
    .await;
}

/// The consumer's ack_wait is the configured visibility timeout: a worker
/// started with another `worker.visibility_ms` updates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_reconnect_updates_ack_wait() {
    in_namespace(|ns| async move {
        let _first = connect(&ns, Duration::from_millis(500)).await;
        let _second = connect(&ns, Duration::from_millis(800)).await;
        let client = async_nats::connect(services::nats()).await.unwrap();
        let stream = async_nats::jetstream::new(client).get_stream(&ns).await.unwrap();
        let info = stream.consumer_info("idem").await.unwrap();
        assert_eq!(info.config.ack_wait, Duration::from_millis(800));
        assert_eq!(info.config.max_deliver, -1, "Idem counts attempts itself");
        let config = stream.cached_info().config.clone();
        assert_eq!(config.retention, async_nats::jetstream::stream::RetentionPolicy::WorkQueue);
        assert_eq!(config.subjects, vec![format!("{ns}.queue")]);
    })
    .await;
}

/// Connecting where no server listens says which setting to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_connect_error_names_the_setting() {
    let err = NatsBroker::connect("nats://127.0.0.1:1", "idem", Duration::from_secs(1))
        .await
        .err()
        .expect("nothing listens on port 1");
    let text = format!("{err:#}");
    assert!(text.contains("broker.url") && text.contains("-js"), "{text}");
}
