//! What only NATS JetStream can show, against the real server
//! (`IDEM_TEST_NATS_URL`, nats-server with `-js`): foreign messages and
//! headers that cannot travel, the consumer's ack wait following the
//! configuration. What every broker does is checked by
//! `broker_conformance`. Each test declares its own stream (a unique
//! namespace) and deletes it afterwards, also on failure.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use idem_host::broker::nats::NatsBroker;
use idem_host::broker::{Broker, Visibility};

use crate::common::brokers::{self, envelope, in_nats_namespace};
use crate::common::services;

/// A message another tool published without Idem's headers is still a
/// delivery (empty handler and id) for the worker to dead-letter, and
/// headers that cannot travel are refused at publish, not sent broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_foreign_messages_and_bad_headers() {
    in_nats_namespace(|ns| async move {
        let broker = brokers::nats(&ns, Duration::from_secs(5)).await;
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

/// Headers another client wrote that the NATS client library could not
/// read (a value that is not UTF-8, a name with a space, a line without a
/// colon, a status that is not a number, a lone carriage return in a value,
/// which panicked; nats-server passes them on as they came) no longer reset the
/// worker's connection: the message arrives with the headers that could be
/// read, and the message beside it too. Before, each pull that met it
/// failed the connection, and it came back after every ack wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_headers_another_client_wrote_badly_do_not_reset_the_connection() {
    use std::io::Write;
    in_nats_namespace(|ns| async move {
        let broker = brokers::nats(&ns, Duration::from_secs(5)).await;
        let url = services::nats();
        let address = url.trim_start_matches("nats://").to_string();
        let header: &[u8] =
            b"NATS/1.0 abc\r\nIdem-Id: raw-1\r\nIdem-Handler: h\r\nbad name: x\r\nno colon here\r\nX-Cr: a\rb\r\nX-Latin: caf\xe9\r\n\r\n";
        let body: &[u8] = b"{}";
        let mut wire = format!(
            "CONNECT {{\"verbose\":false,\"headers\":true,\"protocol\":1}}\r\nHPUB {ns}.queue {} {}\r\n",
            header.len(),
            header.len() + body.len()
        )
        .into_bytes();
        wire.extend_from_slice(header);
        wire.extend_from_slice(body);
        wire.extend_from_slice(b"\r\nPING\r\n");
        tokio::task::spawn_blocking(move || {
            let mut raw = std::net::TcpStream::connect(address).unwrap();
            raw.write_all(&wire).unwrap();
            // PONG: the server has the publish.
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&seen).contains("PONG") {
                let n = std::io::Read::read(&mut raw, &mut buf).unwrap();
                assert!(n > 0, "the server closed: {}", String::from_utf8_lossy(&seen));
                seen.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .unwrap();
        broker.publish(&[envelope("good")], Duration::ZERO).await.unwrap();

        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while got.len() < 2 {
            assert!(std::time::Instant::now() < deadline, "only {got:?}");
            got.extend(broker.fetch(10, Duration::from_secs(5)).await.unwrap());
        }
        let raw = got.iter().find(|d| d.envelope.id == "raw-1").expect("the message with bad headers");
        assert_eq!(raw.envelope.handler, "h");
        assert_eq!(raw.envelope.headers, vec![("X-Latin".to_string(), "caf\u{fffd}".to_string())]);
        assert!(got.iter().any(|d| d.envelope.id == "good"));
        broker
            .ack(&got.iter().map(|d| d.receipt.as_str()).collect::<Vec<_>>())
            .await
            .unwrap();
        assert_eq!(broker.pending().await.unwrap(), 0, "acked on the same connection");
    })
    .await;
}

/// A stamp another producer wrote too far ahead (the end of time, one in
/// microseconds) or not as a time is refused at fetch, for the worker to
/// dead-letter with the reason, and the message beside it runs; a stamp
/// within the bound is still held. Before, the far stamps were nacked for
/// their whole delay (past Go's Duration, an immediate redelivery every
/// fetch) and held an ack-pending slot for good. `publish` refuses a
/// delay past the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_stamps_too_far_ahead_are_refused() {
    in_nats_namespace(|ns| async move {
        let broker = brokers::nats(&ns, Duration::from_secs(5)).await;
        let client = async_nats::connect(services::nats()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let now = idem_host::now_ms();
        let stamps = [
            ("end", i64::MAX.to_string()),
            ("micros", (now * 1_000).to_string()),
            ("soon", "soon".to_string()),
            ("held", (now + 60 * 60 * 1000).to_string()),
        ];
        for (id, stamp) in &stamps {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Idem-Id", id.to_string().as_str());
            headers.insert("Idem-Handler", "h");
            headers.insert("Idem-Not-Before", stamp.as_str());
            js.publish_with_headers(format!("{ns}.queue"), headers, "{}".into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        broker.publish(&[envelope("now")], Duration::ZERO).await.unwrap();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while got.len() < 4 {
            assert!(std::time::Instant::now() < deadline, "only {} deliveries: {got:?}", got.len());
            got.extend(broker.fetch(10, Duration::from_secs(5)).await.unwrap());
        }
        let mut refused: Vec<(&str, &str)> = got
            .iter()
            .filter_map(|d| Some((d.envelope.id.as_str(), d.refused.as_deref()?)))
            .collect();
        refused.sort();
        assert_eq!(
            refused.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            ["end", "micros", "soon"],
            "{got:?}"
        );
        assert!(
            refused
                .iter()
                .all(|(_, why)| why.contains("Idem-Not-Before") && why.contains("unix milliseconds")),
            "{refused:?}"
        );
        let runs: Vec<&str> = got.iter().filter(|d| d.refused.is_none()).map(|d| d.envelope.id.as_str()).collect();
        assert_eq!(runs, ["now"], "the message stamped an hour ahead is held");
        broker
            .ack(&got.iter().map(|d| d.receipt.as_str()).collect::<Vec<_>>())
            .await
            .unwrap();
        assert_eq!(broker.pending().await.unwrap(), 1, "the held one waits");

        let err = broker
            .publish(&[envelope("late")], Duration::from_secs(8 * 24 * 3600))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("a JetStream message may be held"), "{err}");
    })
    .await;
}

/// The consumer's ack_wait is the configured visibility timeout: a worker
/// started with another `worker.visibility_ms` updates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_reconnect_updates_ack_wait() {
    in_nats_namespace(|ns| async move {
        let _first = brokers::nats(&ns, Duration::from_millis(500)).await;
        let second = brokers::nats(&ns, Duration::from_millis(800)).await;
        assert_eq!(
            second.semantics().visibility,
            Visibility::Fixed(Duration::from_millis(800)),
            "the broker reports the ack_wait in force"
        );
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

/// Delivery counts stay exact when redeliveries meet pull requests that
/// run out: six workers' fetches expire every 100 ms while nothing is
/// due, and each ack wait that runs out redelivers what was held. Servers
/// before the fixes of nats-server#5305 and #5338 (April 2024; 2.9.10 is
/// one) count a redelivery that found only an expired pull, then deliver it
/// with a count skipped, or step back and hand the newest message out again
/// counted 1 (the suite's servers: `scripts/services.sh`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_delivery_counts_stay_exact_when_redeliveries_meet_expiring_pulls() {
    in_nats_namespace(|ns| async move {
        const WORKERS: usize = 6;
        // Longer than a fetch's pull (100 ms), so no pull outlives a
        // delivery it received and none is dropped as superseded.
        let ack_wait = Duration::from_millis(200);
        let mut workers = Vec::new();
        for _ in 0..WORKERS {
            workers.push(brokers::nats(&ns, ack_wait).await);
        }
        let server = async_nats::connect(services::nats()).await.unwrap().server_info().version;
        let all: Vec<_> = (0..20).map(|i| envelope(&format!("m{i}"))).collect();
        workers[0].publish(&all, Duration::ZERO).await.unwrap();

        // Nothing is acked: every delivery's ack wait runs out (the stream
        // goes with the namespace). Workers may record deliveries out of
        // order; each message's counts, in order, must be 1, 2, 3… with
        // none missing or repeated.
        let deliveries: Mutex<HashMap<String, Vec<u32>>> = Mutex::default();
        let until = Instant::now() + ack_wait * 30;
        futures::future::join_all(workers.iter().map(|b| record_deliveries(b, &deliveries, until))).await;
        let deliveries = deliveries.into_inner().unwrap();
        assert_eq!(deliveries.len(), all.len(), "every message was delivered");
        for (id, mut counts) in deliveries {
            counts.sort();
            assert!(counts.len() >= 3, "{id} was redelivered more than once: {counts:?}");
            assert!(
                counts.iter().copied().eq(1..=counts.len() as u32),
                "{id}'s deliveries were counted {counts:?} by nats-server {server}"
            );
        }
    })
    .await;
}

/// Fetch until `until` without acking, recording each delivery's count
/// under its message.
async fn record_deliveries(b: &NatsBroker, deliveries: &Mutex<HashMap<String, Vec<u32>>>, until: Instant) {
    while Instant::now() < until {
        for d in b.fetch(2, Duration::from_secs(1)).await.unwrap() {
            let mut deliveries = deliveries.lock().unwrap();
            deliveries.entry(d.envelope.id).or_default().push(d.delivery_count);
        }
    }
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
