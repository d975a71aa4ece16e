//! What only NATS JetStream can show, against the real server
//! (`IDEM_TEST_NATS_URL`, nats-server with `-js`): foreign messages and
//! headers that cannot travel, the consumer's ack wait following the
//! configuration. What every broker does is checked by
//! `broker_conformance`. Each test declares its own stream (a unique
//! namespace) and deletes it afterwards, also on failure.

use std::time::Duration;

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
