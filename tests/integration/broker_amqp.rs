//! What only AMQP can show, against the real RabbitMQ server
//! (`IDEM_TEST_AMQP_URL`): single and `multiple` acks, foreign messages, a
//! consumer that is cancelled under it, the worker pool end to end. What
//! every broker does (including redelivery when a connection closes and the
//! TTL delay queues) is checked by `broker_conformance`. Each test declares
//! its own queues (a unique namespace) and deletes them afterwards, also on
//! failure.

use std::time::Duration;

use idem_host::broker::amqp::AmqpBroker;
use idem_host::broker::Broker;
use idem_host::config::BrokerKind;
use idem_host::envelope::Envelope;
use lapin::options::{BasicPublishOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;

use crate::common::brokers::{self, envelope, fetch_n, fetch_until, ids, in_amqp_namespace, receipts};
use crate::common::{services, wait_until};

/// Delete a namespace's queues and exchange (the pool tests clean up with it).
pub use crate::common::brokers::delete_amqp_namespace as delete_namespace;

/// Acks take effect, `multiple` acks cover only what they should (also
/// when one call acks the lowest held deliveries in a `multiple` ack and
/// the others singly), and a second ack of one delivery is harmless (in
/// AMQP it would close the channel). Checked from a second connection
/// after the first closes: the only message that comes back is the one
/// never acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_acks_single_and_multiple() {
    in_amqp_namespace(|ns| async move {
        let broker = brokers::amqp(&ns).await;
        let all: Vec<Envelope> = (0..9).map(|i| envelope(&format!("m{i}"))).collect();
        broker.publish(&all, Duration::ZERO).await.unwrap();
        let got = fetch_n(&broker, 9, Duration::from_secs(60), "nine deliveries").await;
        assert_eq!(ids(&got), vec!["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8"]);
        let r = receipts(&got);

        broker.ack(&[r[1], r[0]]).await.unwrap(); // every unacked tag up to m1: one multiple ack
        broker.ack(&[r[3]]).await.unwrap(); // m2 still held: a single ack
        broker.ack(&[r[5], r[4]]).await.unwrap(); // m2 still held: single acks
        broker.ack(&[r[0], r[3]]).await.unwrap(); // acked already: no effect
        assert_eq!(broker.pending().await.unwrap(), 4, "m2, m6, m7 and m8 are left");
        // m2 and m6 are the lowest held: one multiple ack up to m6 (m3 – m5
        // acked already), and m8 alone, as m7 is still held.
        broker.ack(&[r[8], r[6], r[2]]).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 1, "m7 is left, and the channel survived");
        assert!(broker.ack(&["not-a-receipt"]).await.is_err(), "malformed receipts are refused");

        drop(broker);
        let other = brokers::amqp(&ns).await;
        let back = fetch_until(&other, 10, Duration::from_secs(60), "the unacked m7 to come back").await;
        assert_eq!(ids(&back), vec!["m7"]);
        assert_eq!(back[0].delivery_count, 2);
        // The server requeues all of a closed channel's unacked deliveries
        // at once, and m7 came back: anything else it requeued would be
        // ready in the queue now.
        assert_eq!(other.pending().await.unwrap(), 1, "only m7, held here: acked messages stay acked");
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
    in_amqp_namespace(|ns| async move {
        let broker = brokers::amqp(&ns).await;
        let conn = brokers::amqp_raw().await;
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

        let got = fetch_n(&broker, 2, Duration::from_secs(60), "the two foreign messages").await;
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

/// A message that leaves its delay bucket before the time it is stamped
/// with (RabbitMQ's expiry timers can run a little ahead) is held until
/// then, and so is everything behind it: nothing is handed out early, and
/// what is handed out stays in arrival order. Simulated with a message
/// published straight to the queue, stamped 0.9 s ahead. A stamp further
/// ahead than a timer runs early (an hour) is not held: a producer's
/// header cannot stall the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_holds_a_message_out_of_its_delay_bucket_early_until_due() {
    in_amqp_namespace(|ns| async move {
        let broker = brokers::amqp(&ns).await;
        let conn = brokers::amqp_raw().await;
        let ch = conn.create_channel().await.unwrap();
        // Publisher confirms: a publish below returns once the message is in
        // the queue, so "early" is queued before "behind", which goes through
        // another connection (without them the two could swap, and "behind"
        // would rightly come first).
        ch.confirm_select(lapin::options::ConfirmSelectOptions::default()).await.unwrap();
        let stamped = |id: &str, due: i64| {
            let mut headers = FieldTable::default();
            headers.insert("idem-handler".into(), AMQPValue::LongString("h".into()));
            headers.insert("idem-not-before".into(), AMQPValue::LongLongInt(due));
            let (ch, queue, id) = (ch.clone(), format!("{ns}.queue"), id.to_string());
            async move {
                let properties = BasicProperties::default().with_message_id(id.into()).with_headers(headers);
                ch.basic_publish("".into(), queue.as_str().into(), BasicPublishOptions::default(), b"{}", properties)
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
        };
        stamped("far", idem_host::now_ms() + 3_600_000).await;
        let far = fetch_n(&broker, 1, Duration::from_secs(60), "the message stamped an hour ahead").await;
        assert_eq!(ids(&far), vec!["far"]);
        broker.ack(&receipts(&far)).await.unwrap();

        let due = idem_host::now_ms() + 900;
        stamped("early", due).await;
        broker.publish(&[envelope("behind")], Duration::ZERO).await.unwrap();
        while idem_host::now_ms() < due - 200 {
            let got = broker.fetch(10, Duration::from_secs(60)).await.unwrap();
            assert!(got.is_empty(), "handed out {:?} at {} before {due}", ids(&got), idem_host::now_ms());
        }
        let got = fetch_n(&broker, 2, Duration::from_secs(60), "both messages once due").await;
        assert!(idem_host::now_ms() >= due, "not before its stamp");
        assert_eq!(ids(&got), vec!["early", "behind"], "in arrival order");
        broker.ack(&receipts(&got)).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 0);
        conn.close(200, "OK".into()).await.unwrap();
    })
    .await;
}

/// Text another client wrote that is not UTF-8 (a message id, a header
/// name; RabbitMQ passes short strings on as bytes) no longer closes the
/// consumer's connection: the message arrives with its text read lossily,
/// and the message behind it too. Before, the frame failed to parse, the
/// connection closed, and RabbitMQ sent the message first to every new
/// connection: nothing behind it ran. Published with py-amqp (the Celery
/// test environment's), which writes bytes as given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_text_that_is_not_utf8_does_not_stop_the_consumer() {
    in_amqp_namespace(|ns| async move {
        let broker = brokers::amqp(&ns).await;
        let queue = format!("{ns}.queue");
        let python = crate::celery::venv().join("bin/python");
        let url = url::Url::parse(&services::amqp()).unwrap();
        let host = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5672));
        let (user, password) = (url.username().to_string(), url.password().unwrap_or_default().to_string());
        let script = "import amqp, sys\n\
            c = amqp.Connection(host=sys.argv[2], userid=sys.argv[3], password=sys.argv[4]); c.connect()\n\
            ch = c.channel()\n\
            ch.basic_publish(amqp.Message(b'{}', message_id=b'\\xff\\xfe-raw', \
            application_headers={'idem-handler': 'h', b'x-\\xe9': 'v'}), exchange='', routing_key=sys.argv[1])\n\
            c.close()\n";
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(python)
                .args(["-c", script, &queue, &host, &user, &password])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        broker.publish(&[envelope("behind")], Duration::ZERO).await.unwrap();
        let got = fetch_n(&broker, 2, Duration::from_secs(60), "both messages").await;
        assert_eq!(ids(&got), vec!["\u{fffd}\u{fffd}-raw", "behind"]);
        assert_eq!(got[0].envelope.handler, "h");
        assert!(
            got[0].envelope.headers.contains(&("x-\u{fffd}".to_string(), "v".to_string())),
            "{:?}",
            got[0].envelope.headers
        );
        broker.ack(&receipts(&got)).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 0, "acked on the same connection");
    })
    .await;
}

/// A delay queue that will not take a delivery's copy (here: declared again
/// full, at most 0 messages, so RabbitMQ nacks the copy) does not strand
/// the delivery: it is held here for its delay, then requeued, and comes
/// back on the same connection (the receipt's epoch is unchanged). Before,
/// it stayed unacked until the connection closed, RabbitMQ having no
/// visibility timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_a_delay_queue_refusing_a_copy_does_not_strand_the_delivery() {
    in_amqp_namespace(|ns| async move {
        let broker = brokers::amqp(&ns).await;
        broker.publish(&[envelope("stuck")], Duration::ZERO).await.unwrap();
        let got = fetch_n(&broker, 1, Duration::from_secs(60), "the message").await;
        let conn = brokers::amqp_raw().await;
        let ch = conn.create_channel().await.unwrap();
        let delay_queue = format!("{ns}.retry.1000");
        ch.queue_delete(delay_queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        // Idem's arguments for the queue, and a length of 0.
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(1000));
        args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(format!("{ns}.queue").into()),
        );
        args.insert("x-dead-letter-strategy".into(), AMQPValue::LongString("at-least-once".into()));
        args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
        args.insert("x-max-length".into(), AMQPValue::LongLongInt(0));
        let durable = lapin::options::QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(delay_queue.as_str().into(), durable, args).await.unwrap();
        broker.nack(&got[0].receipt, Duration::from_millis(600)).await.unwrap();
        let back = fetch_until(&broker, 10, Duration::from_secs(60), "the message, requeued").await;
        assert_eq!(ids(&back), vec!["stuck"]);
        assert_eq!(back[0].delivery_count, 2);
        let epoch = |receipt: &str| receipt.split('.').next().unwrap().to_string();
        assert_eq!(epoch(&back[0].receipt), epoch(&got[0].receipt), "no reconnect: held, then requeued");
        broker.ack(&receipts(&back)).await.unwrap();
        assert_eq!(broker.pending().await.unwrap(), 0);
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
    in_amqp_namespace(|ns| async move {
        let broker = brokers::amqp(&ns).await;
        broker.publish(&[envelope("x")], Duration::ZERO).await.unwrap();
        let old = fetch_until(&broker, 10, Duration::from_secs(60), "x").await;

        let conn = brokers::amqp_raw().await;
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
        let new = fetch_until(&broker, 10, Duration::from_secs(60), "y on the new connection").await;
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
    in_amqp_namespace(|ns| async move {
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
        crate::common::wait_for_held(&env.mock, "the held charge to arrive").await;
        wait_until(Duration::from_secs(10), "the other copies to find the key busy", || async {
            pool.counters.snapshot().busy >= 4
        })
        .await;
        env.mock.release();
        crate::common::drain(&pool).await;
        let c = pool.counters.snapshot();
        assert_eq!((c.executions, c.duplicates, c.done), (1, 4, 1), "{c:?}");
        assert_eq!(env.mock.performed("payments", "pay-amqp"), 1);
        assert_eq!(crate::common::state(&pool, "record-payment", "pay-amqp").await, Some("done"));
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

/// Retry delays cannot lose a message: the delay queues are quorum queues
/// whose expired messages are dead-lettered at least once (kept until the
/// main queue confirms the copy). RabbitMQ refuses to declare an existing
/// queue with other arguments, so declaring each delay queue as a classic
/// queue, or with fire-and-forget dead-lettering, must fail; and a delayed
/// message still comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_delay_queues_dead_letter_at_least_once() {
    in_amqp_namespace(|ns| async move {
        let broker = brokers::amqp(&ns).await;
        let conn = brokers::amqp_raw().await;
        let declare = |ms: u64, queue_type: &str, strategy: &str| {
            let mut args = FieldTable::default();
            args.insert("x-queue-type".into(), AMQPValue::LongString(queue_type.into()));
            args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ms as i64));
            args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
            args.insert(
                "x-dead-letter-routing-key".into(),
                AMQPValue::LongString(format!("{ns}.queue").into()),
            );
            args.insert("x-dead-letter-strategy".into(), AMQPValue::LongString(strategy.into()));
            args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
            let conn = &conn;
            let name = format!("{ns}.retry.{ms}");
            async move {
                let ch = conn.create_channel().await.unwrap();
                let durable = lapin::options::QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                ch.queue_declare(name.as_str().into(), durable, args).await.map(|_| ())
            }
        };
        for ms in [50, 250, 1_000, 5_000, 30_000, 120_000, 600_000] {
            declare(ms, "quorum", "at-least-once")
                .await
                .unwrap_or_else(|e| panic!("{ns}.retry.{ms} is a quorum queue dead-lettering at least once: {e}"));
            let classic = declare(ms, "classic", "at-least-once").await;
            assert!(classic.is_err(), "{ns}.retry.{ms} must not be a classic queue");
            let at_most_once = declare(ms, "quorum", "at-most-once").await;
            assert!(at_most_once.is_err(), "{ns}.retry.{ms} must not dead-letter at most once");
        }
        broker.publish(&[envelope("later")], Duration::from_millis(200)).await.unwrap();
        let got = fetch_until(&broker, 1, Duration::from_secs(30), "the delayed message to come back").await;
        assert_eq!(ids(&got), vec!["later"]);
        broker.ack(&receipts(&got)).await.unwrap();
    })
    .await;
}
