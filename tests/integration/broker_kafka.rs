//! What only Kafka can show, against a real Kafka-protocol server
//! (`IDEM_TEST_KAFKA_URL`; `scripts/services.sh` starts one): per-key
//! order across retries while other keys flow, commits that never pass an
//! unsettled record, what a new member of the group is handed after
//! another leaves or loses a partition in a rebalance, records from other
//! producers, and the errors wrong settings give at start. What every
//! broker does is checked by `broker_conformance`. Each test has its own
//! topic and consumer group, deleted afterwards, also on failure.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_host::broker::kafka::{KafkaBroker, KafkaOptions};
use idem_host::broker::Broker;
use idem_host::config::KafkaOrdering;
use idem_host::envelope::{Delivery, Envelope};

use crate::common::brokers::{self, in_kafka_topic, receipts};
use crate::common::{services, unique_namespace, wait_for, wait_until};

/// How long a rebalance may take on the test server (a join takes about
/// five seconds there).
const REBALANCE: Duration = Duration::from_secs(60);

fn step(stream: u32, seq: u32) -> Envelope {
    Envelope {
        id: format!("s{stream}-{seq}"),
        handler: "h".into(),
        headers: vec![],
        payload: serde_json::to_vec(&serde_json::json!({"stream": format!("s{stream}"), "seq": seq})).unwrap(),
    }
}

fn stream_and_seq(d: &Delivery) -> (String, u64) {
    let p: serde_json::Value = serde_json::from_slice(&d.envelope.payload).unwrap();
    (p["stream"].as_str().unwrap().to_string(), p["seq"].as_u64().unwrap())
}

fn ordered(topic: &str, ordering: KafkaOrdering) -> KafkaOptions {
    let mut options = brokers::kafka_options(topic, ordering);
    options.key_pointer = Some("/stream".into());
    options
}

/// Six streams of ten steps over four partitions, `ordering = "key"`.
/// Every third step fails its first attempt and is given back for a
/// retry 300 ms later. A stream never has two steps out at once, its steps
/// settle in order, retries included, and while a stream waits for its
/// retry the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_keys_run_in_order_across_retries_while_other_keys_flow() {
    in_kafka_topic(4, |topic| async move {
        let b = brokers::kafka(&ordered(&topic, KafkaOrdering::Key)).await;
        let (streams, steps) = (6u32, 10u32);
        let all: Vec<Envelope> = (0..steps).flat_map(|s| (0..streams).map(move |k| step(k, s))).collect();
        b.publish(&all, Duration::ZERO).await.unwrap();

        let mut done: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        // Streams waiting for a retry: the id given back, and when.
        let mut waiting: HashMap<String, (String, Instant)> = HashMap::new();
        let mut failed_once = HashSet::new();
        let mut flowed_past_a_retry = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while done.values().map(Vec::len).sum::<usize>() < all.len() {
            assert!(Instant::now() < deadline, "timed out: {done:?}");
            let got = b.fetch(16, Duration::from_secs(30)).await.unwrap();
            let mut out = HashSet::new();
            for d in &got {
                let (stream, _) = stream_and_seq(d);
                assert!(out.insert(stream.clone()), "two steps of {stream} out at once: {got:?}");
            }
            for d in got {
                let (stream, seq) = stream_and_seq(&d);
                if let Some((id, since)) = waiting.remove(&stream) {
                    assert_eq!(d.envelope.id, id, "{stream}: the step given back runs before the next");
                    assert!(since.elapsed() >= Duration::from_millis(290), "{stream} retried early");
                    assert_eq!(d.delivery_count, 2);
                } else if !waiting.is_empty() {
                    flowed_past_a_retry += 1;
                }
                if seq % 3 == 1 && failed_once.insert(d.envelope.id.clone()) {
                    b.nack(&d.receipt, Duration::from_millis(300)).await.unwrap();
                    waiting.insert(stream, (d.envelope.id.clone(), Instant::now()));
                    continue;
                }
                done.entry(stream).or_default().push(seq);
                b.ack(&[&d.receipt]).await.unwrap();
            }
        }
        let in_order: Vec<u64> = (0..u64::from(steps)).collect();
        for (stream, seqs) in &done {
            assert_eq!(seqs, &in_order, "{stream} settled in order");
        }
        assert!(flowed_past_a_retry > 0, "other streams ran while one waited for its retry");
        wait_for(Duration::from_secs(10), "the lag to reach 0", || async {
            (b.pending().await.unwrap() == 0).then_some(())
        })
        .await;
    })
    .await;
}

/// A member settles all but two of ten records (m3 and m7) and leaves:
/// the lag counts only those two while it owns the partition, and the next
/// member of the group starts at m3, never earlier. (Records settled above
/// m3 come again to it unless the server kept the commit's metadata, which
/// the test server does not; a worker answers them by their claims.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_commits_stay_below_unsettled_records_and_the_next_member_starts_there() {
    in_kafka_topic(1, |topic| async move {
        let options = brokers::kafka_options(&topic, KafkaOrdering::None);
        let a = brokers::kafka(&options).await;
        let all: Vec<Envelope> = (0..10).map(|i| brokers::envelope(&format!("m{i}"))).collect();
        a.publish(&all, Duration::ZERO).await.unwrap();
        let got = brokers::fetch_n(&a, 10, Duration::from_secs(30), "ten records").await;
        let (keep, settle): (Vec<&Delivery>, Vec<&Delivery>) = got.iter().partition(|d| d.envelope.id == "m3" || d.envelope.id == "m7");
        assert_eq!(keep.len(), 2);
        let settle: Vec<&str> = settle.iter().map(|d| d.receipt.as_str()).collect();
        a.ack(&settle).await.unwrap();
        assert_eq!(a.pending().await.unwrap(), 2, "only the unsettled records are pending");
        assert_eq!(a.backlog().await.unwrap(), vec![(format!("{topic}/0"), 2)]);
        // Leave without settling m3 and m7 (a worker stopping past its
        // grace period).
        a.close().await;
        drop(a);

        let b = brokers::kafka(&options).await;
        // Whatever comes is settled as it comes, until m7 has come and
        // nothing is pending: records arrive from the server in the
        // background, so one fetch may hold m7 and the next m8.
        let seen = std::sync::Mutex::new(Vec::<Delivery>::new());
        wait_for(REBALANCE, "the next member to be handed m7 and settle what came", || async {
            let got = b.fetch(100, Duration::from_secs(30)).await.unwrap();
            b.ack(&receipts(&got)).await.unwrap();
            let has_m7 = {
                let mut seen = seen.lock().unwrap();
                seen.extend(got);
                seen.iter().any(|d| d.envelope.id == "m7")
            };
            (has_m7 && b.pending().await.unwrap() == 0).then_some(())
        })
        .await;
        let again = seen.into_inner().unwrap();
        let ids: Vec<&str> = again.iter().map(|d| d.envelope.id.as_str()).collect();
        assert_eq!(ids[0], "m3", "the commit stayed below the first unsettled record: {ids:?}");
        assert!(!ids.iter().any(|id| ["m0", "m1", "m2"].contains(id)), "{ids:?}");
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len(), "each came once: {ids:?}");
        for d in again.iter().filter(|d| d.envelope.id == "m3" || d.envelope.id == "m7") {
            assert!((1..=2).contains(&d.delivery_count), "{d:?}");
        }
        assert!(b.fetch(10, Duration::from_secs(30)).await.unwrap().is_empty());
        assert_eq!(b.pending().await.unwrap(), 0);
    })
    .await;
}

/// A second member joins while the first holds records of both
/// partitions: the partition that moves is handed over after its running
/// records settle within the grace period (none of those goes to the new
/// member), except its last, held past the grace, which the new member
/// runs again; the first member's late ack of it commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_a_rebalance_waits_for_running_records_within_its_grace() {
    in_kafka_topic(2, |topic| async move {
        let mut options = ordered(&topic, KafkaOrdering::None);
        options.grace = Duration::from_secs(3);
        let a = Arc::new(brokers::kafka(&options).await);
        let all: Vec<Envelope> = (0..2).flat_map(|s| (0..12).map(move |k| step(k, s))).collect();
        a.publish(&all, Duration::ZERO).await.unwrap();
        let got = brokers::fetch_n(&*a, all.len(), Duration::from_secs(30), "every record").await;
        // Hold the last record of each partition; settle the rest while
        // the second member joins, within the grace period.
        let partition = |d: &Delivery| d.receipt.rsplit('/').nth(3).unwrap().to_string();
        let offset = |d: &Delivery| d.receipt.rsplit('/').nth(2).unwrap().parse::<i64>().unwrap();
        let mut held: BTreeMap<String, Delivery> = BTreeMap::new();
        let mut rest = Vec::new();
        for d in got {
            match held.get(&partition(&d)) {
                Some(h) if offset(h) > offset(&d) => rest.push(d),
                _ => {
                    if let Some(before) = held.insert(partition(&d), d) {
                        rest.push(before);
                    }
                }
            }
        }
        assert_eq!(held.len(), 2, "records on both partitions");
        // Half of the rest settled before the second member joins, half
        // while the revocation the join starts waits for them.
        let (before, during) = rest.split_at(rest.len() / 2);
        for d in before {
            a.ack(&[&d.receipt]).await.unwrap();
        }
        let joining = tokio::spawn({
            let options = options.clone();
            async move { brokers::kafka(&options).await }
        });
        wait_until(REBALANCE, "the first member's partitions to be revoked", || async { a.revoking() }).await;
        for d in during {
            a.ack(&[&d.receipt]).await.unwrap();
        }
        let b = joining.await.unwrap();
        let moved = wait_for(REBALANCE, "the held record of the moved partition at the new member", || async {
            let got = b.fetch(10, Duration::from_secs(30)).await.unwrap();
            (!got.is_empty()).then_some(got)
        })
        .await;
        assert_eq!(moved.len(), 1, "only the record held past the grace: {moved:?}");
        let moved_from = held.remove(&partition(&moved[0])).expect("a held record");
        assert_eq!(moved[0].envelope, moved_from.envelope);
        // Counted on only where the server keeps commit metadata.
        assert!((1..=2).contains(&moved[0].delivery_count), "{moved:?}");
        let stayed = held.into_values().next().unwrap();
        // The old member's late ack of the moved record commits nothing;
        // its ack of the record it kept does.
        a.ack(&[&moved_from.receipt, &stayed.receipt]).await.unwrap();
        // Asked of its owner (the test server understates another
        // member's view: its end offsets lag behind batched writes).
        assert_eq!(b.pending().await.unwrap(), 1, "the moved record is still unsettled");
        b.ack(&[&moved[0].receipt]).await.unwrap();
        assert_eq!(b.pending().await.unwrap(), 0);
        assert_eq!(a.pending().await.unwrap(), 0);
        assert!(a.fetch(10, Duration::from_secs(30)).await.unwrap().is_empty());
        assert!(b.fetch(10, Duration::from_secs(30)).await.unwrap().is_empty());
    })
    .await;
}

/// Records another producer wrote: with `Idem-Handler` they run, their id
/// the record's place; without, they are refused with the fix. A record
/// stamped due at the end of time is refused too, and the next record of
/// its key runs once it is settled (before, it was held for good, and its
/// key with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_records_from_other_producers() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    in_kafka_topic(1, |topic| async move {
        let b = brokers::kafka(&brokers::kafka_options(&topic, KafkaOrdering::Key)).await;
        let url = services::kafka();
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", url.strip_prefix("kafka://").unwrap())
            .create()
            .unwrap();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "Idem-Handler",
                value: Some("grant-credits"),
            })
            .insert(Header {
                key: "traceparent",
                value: Some("00-abc-01"),
            });
        let record = FutureRecord::to(&topic)
            .key("u1")
            .payload(r#"{"user":"u1","balance":5}"#)
            .headers(headers);
        producer.send(record, Duration::from_secs(10)).await.unwrap();
        let bare = FutureRecord::<(), _>::to(&topic).payload("no handler");
        producer.send(bare, Duration::from_secs(10)).await.unwrap();
        let got = brokers::fetch_n(&b, 2, Duration::from_secs(30), "both").await;
        let e = &got[0].envelope;
        assert_eq!(e.id, format!("{topic}-0-0"), "the record's place is its id");
        assert_eq!(e.handler, "grant-credits");
        assert_eq!(e.headers, vec![("traceparent".to_string(), "00-abc-01".to_string())]);
        assert_eq!(got[0].refused, None);
        let refused = got[1].refused.as_deref().unwrap();
        assert!(
            refused.contains("Idem-Handler") && refused.contains(&format!("{topic}-0-1")),
            "{refused}"
        );
        b.ack(&receipts(&got)).await.unwrap();

        let handled = |not_before: Option<&str>| {
            let h = OwnedHeaders::new().insert(Header {
                key: "Idem-Handler",
                value: Some("grant-credits"),
            });
            match not_before {
                Some(at) => h.insert(Header {
                    key: "Idem-Not-Before",
                    value: Some(at),
                }),
                None => h,
            }
        };
        let end_of_time = i64::MAX.to_string();
        for headers in [handled(Some(&end_of_time)), handled(None)] {
            let record = FutureRecord::to(&topic)
                .key("u2")
                .payload(r#"{"user":"u2","balance":1}"#)
                .headers(headers);
            producer.send(record, Duration::from_secs(10)).await.unwrap();
        }
        let got = brokers::fetch_n(&b, 1, Duration::from_secs(30), "the record stamped at the end of time").await;
        assert_eq!(got[0].envelope.id, format!("{topic}-0-2"));
        let refused = got[0].refused.as_deref().unwrap();
        assert!(
            refused.contains("Idem-Not-Before") && refused.contains("unix milliseconds"),
            "{refused}"
        );
        b.ack(&receipts(&got)).await.unwrap();
        let got = brokers::fetch_n(&b, 1, Duration::from_secs(30), "the next record of its key").await;
        assert_eq!(
            (got[0].envelope.id.as_str(), got[0].refused.as_deref()),
            (format!("{topic}-0-3").as_str(), None)
        );
        b.ack(&receipts(&got)).await.unwrap();

        // Thousands of empty headers (a record waiting behind its key is
        // held in memory with them): kept only up to the bound, and the
        // record refused for them.
        let mut many = handled(None);
        for _ in 0..5_000 {
            many = many.insert(Header::<&str> { key: "h", value: None });
        }
        let record = FutureRecord::to(&topic)
            .key("u3")
            .payload(r#"{"user":"u3","balance":1}"#)
            .headers(many);
        producer.send(record, Duration::from_secs(10)).await.unwrap();
        let got = brokers::fetch_n(&b, 1, Duration::from_secs(30), "the record of 5,000 headers").await;
        let refused = got[0].refused.as_deref().unwrap_or_default();
        assert!(
            refused.contains("headers take") && refused.contains("carry large data in the payload"),
            "{refused:?}"
        );
        let kept: usize = got[0].envelope.headers.iter().map(idem_host::envelope::header_cost).sum();
        assert!(kept <= idem_host::envelope::MAX_HEADER_BYTES, "{kept}");
        assert!(got[0].envelope.headers.len() < 5_000);
        b.ack(&receipts(&got)).await.unwrap();
    })
    .await;
}

/// Wrong settings fail at start with the setting to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_wrong_settings_are_refused_at_start_with_the_fix() {
    let missing = brokers::kafka_options(&unique_namespace("missing"), KafkaOrdering::Key);
    let err = KafkaBroker::connect(missing).await.err().expect("a missing topic").to_string();
    assert!(err.contains("does not exist") && err.contains("broker.topics"), "{err}");

    let mut unreachable = brokers::kafka_options("idem", KafkaOrdering::Key);
    unreachable.servers = "127.0.0.1:1".into();
    let err = format!("{:#}", KafkaBroker::connect(unreachable).await.err().expect("no server"));
    assert!(err.contains("cannot reach Kafka") && err.contains("broker.url"), "{err}");

    let mut config = idem_host::config::Config::default();
    config.broker.kind = idem_host::config::BrokerKind::Kafka;
    config.broker.url = Some(services::kafka());
    config.broker.topics = vec!["has space".into()];
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("broker.topics") && err.contains("has space"), "{err}");
    config.broker.topics = vec![];
    config.broker.url = None;
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("broker.url"), "{err}");
}
