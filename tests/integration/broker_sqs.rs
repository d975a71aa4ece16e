//! What only SQS can show, against a real SQS-compatible server
//! (`IDEM_TEST_SQS_URL`; `scripts/services.sh` starts one): FIFO order
//! within a group across retries and consumers, FIFO deduplication and
//! replays, expired receipts, and the errors a wrong queue, missing
//! credentials or a redrive policy that would pre-empt Idem's dead letters
//! give at start. What every broker does is checked by
//! `broker_conformance`. Each test creates its own queue and deletes it
//! afterwards, also on failure.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_host::broker::sqs::SqsBroker;
use idem_host::broker::Broker;
use idem_host::envelope::Envelope;

use crate::common::brokers::{self, fetch_until, in_sqs_queue};
use crate::common::{services, unique_namespace, wait_for};

fn message(group: u32, seq: u32) -> Envelope {
    Envelope {
        id: format!("g{group}-m{seq}"),
        handler: "h".into(),
        headers: vec![],
        payload: serde_json::to_vec(&serde_json::json!({"account": format!("acct-{group}"), "seq": seq})).unwrap(),
    }
}

/// Three groups of eight messages, consumed by two consumers that run
/// what they fetch at once, each in a task of its own; every third message
/// fails its first attempt and is given back for a retry. Each group's
/// messages still complete in publish order, and a group never has two
/// deliveries running at once, across both consumers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_groups_keep_their_order_across_retries_and_consumers() {
    in_sqs_queue(true, |queue| async move {
        let mut options = brokers::sqs_options(&queue);
        options.group_pointer = Some("/account".into());
        let consumers: Vec<Arc<SqsBroker>> = vec![Arc::new(brokers::sqs(&options).await), Arc::new(brokers::sqs(&options).await)];
        assert!(consumers[0].is_fifo());
        let (groups, per_group) = (3u32, 8u32);
        // Interleaved, as producers of several accounts would publish.
        let all: Vec<Envelope> = (0..per_group).flat_map(|s| (0..groups).map(move |g| message(g, s))).collect();
        consumers[0].publish(&all, Duration::ZERO).await.unwrap();

        let done: Arc<Mutex<BTreeMap<String, Vec<u64>>>> = Arc::default();
        let running: Arc<Mutex<HashSet<String>>> = Arc::default();
        let failed_once: Arc<Mutex<HashSet<String>>> = Arc::default();
        let retries = Arc::new(Mutex::new(0u32));
        let total = all.len();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut tasks = tokio::task::JoinSet::new();
        while done.lock().unwrap().values().map(Vec::len).sum::<usize>() < total {
            assert!(Instant::now() < deadline, "timed out: {:?}", done.lock().unwrap());
            for c in &consumers {
                for d in c.fetch(10, Duration::from_secs(10)).await.unwrap() {
                    let payload: serde_json::Value = serde_json::from_slice(&d.envelope.payload).unwrap();
                    let group = payload["account"].as_str().unwrap().to_string();
                    let seq = payload["seq"].as_u64().unwrap();
                    assert!(
                        running.lock().unwrap().insert(group.clone()),
                        "{group} has two deliveries running at once ({})",
                        d.envelope.id
                    );
                    let (c, done, running, failed_once, retries) =
                        (c.clone(), done.clone(), running.clone(), failed_once.clone(), retries.clone());
                    tasks.spawn(async move {
                        tokio::time::sleep(Duration::from_millis(20 + seq * 7 % 30)).await;
                        let fail = seq.is_multiple_of(3) && failed_once.lock().unwrap().insert(d.envelope.id.clone());
                        running.lock().unwrap().remove(&group);
                        if fail {
                            *retries.lock().unwrap() += 1;
                            c.retry(&d.receipt, Duration::from_secs(1), "transient").await.unwrap();
                        } else {
                            done.lock().unwrap().entry(group).or_default().push(seq);
                            c.ack(&[&d.receipt]).await.unwrap();
                        }
                    });
                }
            }
            while let Some(t) = tasks.try_join_next() {
                t.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
        let done = done.lock().unwrap().clone();
        let in_order: Vec<u64> = (0..u64::from(per_group)).collect();
        for g in 0..groups {
            assert_eq!(done[&format!("acct-{g}")], in_order, "group acct-{g} in publish order");
        }
        assert_eq!(*retries.lock().unwrap(), groups * 3, "every third message was retried once");
        assert_eq!(consumers[0].pending().await.unwrap(), 0);
    })
    .await;
}

/// A FIFO message received again while its first delivery still runs
/// (its visibility ran out) waits behind that delivery; when the first is
/// then given back, its receipt stale, the group is free again and the
/// message comes back. Before, the stale give-back did nothing and the
/// group stayed taken for good, the copy held and extended forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_a_stale_give_back_frees_its_group() {
    in_sqs_queue(true, |queue| async move {
        let b = brokers::sqs(&brokers::sqs_options(&queue)).await;
        b.publish(&[message(1, 1)], Duration::ZERO).await.unwrap();
        let first = fetch_until(&b, 10, Duration::from_secs(1), "the first delivery").await;
        assert_eq!(first.len(), 1);
        wait_for(Duration::from_secs(30), "the first delivery's visibility to run out", || async {
            (visible(&queue).await == "1").then_some(())
        })
        .await;
        assert!(
            b.fetch(10, Duration::from_secs(60)).await.unwrap().is_empty(),
            "the copy waits behind the first delivery"
        );
        assert_eq!(visible(&queue).await, "0", "the copy was received");

        b.nack(&first[0].receipt, Duration::ZERO).await.unwrap();
        let again = fetch_until(&b, 10, Duration::from_secs(60), "the message, after its stale give-back").await;
        assert_eq!(again.iter().map(|d| d.envelope.id.as_str()).collect::<Vec<_>>(), ["g1-m1"]);
        b.ack(&[&again[0].receipt]).await.unwrap();
        assert_eq!(b.pending().await.unwrap(), 0);
    })
    .await;
}

/// FIFO's own deduplication drops a second publish of one message id
/// within its window (Idem's claims would have answered it as a
/// duplicate anyway); a dead letter's replay is still delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_dedupes_a_republished_id_but_delivers_a_replay() {
    in_sqs_queue(true, |queue| async move {
        let b = brokers::sqs(&brokers::sqs_options(&queue)).await;
        let e = message(1, 1);
        for _ in 0..2 {
            b.publish(std::slice::from_ref(&e), Duration::ZERO).await.unwrap();
        }
        assert_eq!(b.pending().await.unwrap(), 1, "the second publish of the id was dropped");
        let got = fetch_until(&b, 10, Duration::from_secs(30), "the message").await;
        assert_eq!(got.len(), 1);

        // Within the window, as a replay soon after a dead-lettering is.
        b.republish(&e).await.unwrap();
        assert_eq!(b.pending().await.unwrap(), 2, "the replay was not dropped");
        b.ack(&[&got[0].receipt]).await.unwrap();
        let replayed = fetch_until(&b, 10, Duration::from_secs(30), "the replay").await;
        assert_eq!(replayed.len(), 1);
        assert_eq!(replayed[0].envelope, e);
        b.ack(&[&replayed[0].receipt]).await.unwrap();
    })
    .await;
}

/// A receipt SQS no longer accepts (the message was deleted, or its
/// delivery went to another consumer) is a fenced-out delivery: extending
/// or giving it back does nothing and is not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_expired_receipts_are_fenced_out_not_errors() {
    in_sqs_queue(false, |queue| async move {
        let b = brokers::sqs(&brokers::sqs_options(&queue)).await;
        b.publish(&[brokers::envelope("x")], Duration::ZERO).await.unwrap();
        let got = fetch_until(&b, 10, Duration::from_secs(30), "x").await;
        b.ack(&[&got[0].receipt]).await.unwrap();
        b.extend(&[&got[0].receipt], Duration::from_secs(30)).await.unwrap();
        b.nack(&got[0].receipt, Duration::ZERO).await.unwrap();
        b.ack(&[&got[0].receipt]).await.unwrap();
        assert_eq!(b.pending().await.unwrap(), 0);
        assert!(b.fetch(10, Duration::from_secs(30)).await.unwrap().is_empty());
    })
    .await;
}

/// Messages another producer sent without Idem's attributes: the SQS
/// message id is the id, their attributes the headers, and a message
/// naming no handler is refused with the attribute to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_messages_from_other_producers() {
    in_sqs_queue(false, |queue| async move {
        let b = brokers::sqs(&brokers::sqs_options(&queue)).await;
        let client = sdk_client().await;
        let url = client.get_queue_url().queue_name(&queue).send().await.unwrap().queue_url.unwrap();
        let attr = |v: &str| {
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value(v)
                .build()
                .unwrap()
        };
        let sent = client
            .send_message()
            .queue_url(&url)
            .message_body(r#"{"user":"u1","balance":5}"#)
            .message_attributes("Idem-Handler", attr("grant-credits"))
            .message_attributes("traceparent", attr("00-abc-01"))
            .send()
            .await
            .unwrap();
        client
            .send_message()
            .queue_url(&url)
            .message_body("no handler")
            .send()
            .await
            .unwrap();
        let mut got = brokers::fetch_n(&b, 2, Duration::from_secs(30), "both").await;
        got.sort_by_key(|d| d.refused.is_some());
        let e = &got[0].envelope;
        assert_eq!(e.id, sent.message_id.unwrap());
        assert_eq!(e.handler, "grant-credits");
        assert_eq!(e.headers, vec![("traceparent".to_string(), "00-abc-01".to_string())]);
        assert_eq!(got[0].refused, None);
        let refused = got[1].refused.as_deref().unwrap();
        assert!(refused.contains("Idem-Handler"), "{refused}");
        b.ack(&brokers::receipts(&got)).await.unwrap();

        // Stamps at the end of time, in microseconds, or not a time at
        // all: refused at once, naming the attribute (before, each was
        // deferred at every receive until SQS deleted it).
        let micros = (idem_host::now_ms() * 1_000).to_string();
        for stamp in [i64::MAX.to_string(), micros, "soon".to_string()] {
            client
                .send_message()
                .queue_url(&url)
                .message_body(r#"{"user":"u2","balance":1}"#)
                .message_attributes("Idem-Handler", attr("grant-credits"))
                .message_attributes("Idem-Not-Before", attr(&stamp))
                .send()
                .await
                .unwrap();
        }
        let got = brokers::fetch_n(&b, 3, Duration::from_secs(30), "the three stamped messages").await;
        for d in &got {
            let refused = d.refused.as_deref().unwrap_or_default();
            assert!(
                refused.contains("Idem-Not-Before") && refused.contains("unix milliseconds"),
                "{refused:?}"
            );
        }
        b.ack(&brokers::receipts(&got)).await.unwrap();

        // A delay past what the queue keeps a message (4 days here) is
        // refused when published.
        let err = b
            .publish(&[brokers::envelope("late")], Duration::from_secs(5 * 24 * 3600))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("MessageRetentionPeriod"), "{err}");
    })
    .await;
}

/// Every receive on SQS counts toward the queue's redrive policy. A message
/// whose handler outlasts its visibility between two heartbeats is received
/// again while it runs and answered busy; it then waits out its claim's
/// lease (not `busy_retry_ms`), so it is received a few times, not dozens,
/// and SQS does not move it to its own dead-letter queue while it runs.
/// Before, it came back every `busy_retry_ms` and was moved within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_a_message_received_again_while_it_runs_is_not_redriven() {
    use crate::common::{envelope, wait_until, Env};
    in_sqs_queue(false, |dlq| async move {
        let queue = redriving_to(&dlq, 6).await;

        let mut env = Env::new().await;
        env.config.broker.kind = idem_host::config::BrokerKind::Sqs;
        env.config.broker.url = Some(services::sqs());
        env.config.broker.queue = Some(queue.clone());
        env.config.broker.wait_secs = 0;
        // The visibility lapses between heartbeats; the lease does not.
        env.config.worker.visibility_ms = 1_000;
        env.config.worker.heartbeat_ms = Some(5_000);
        env.config.worker.lease_ms = 6_000;
        // Calls the host until its 8 s timeout ends it, then dead-lettered.
        env.config.limits.timeout_ms = 8_000;
        env.config.limits.cpu_ms = 60_000;
        env.config.retry.max_attempts = 1;
        env.config.retry.max_traps = 1;
        let pool = env.start().await;
        let long = envelope("long-runner", "hostile", serde_json::json!({ "mode": "host-call-loop" }));
        pool.backends.broker.publish(&[long], Duration::ZERO).await.unwrap();
        wait_until(Duration::from_secs(60), "Idem to dead-letter it and the queue to empty", || async {
            pool.backends.admin.dead_letters(10).await.unwrap().len() == 1 && pool.backends.broker.pending().await.unwrap() == 0
        })
        .await;
        let letters = pool.backends.admin.dead_letters(10).await.unwrap();
        assert!(letters[0].reason.contains("limits.timeout_ms = 8000"), "{}", letters[0].reason);
        pool.stop().await.unwrap();
        assert_eq!(visible(&dlq).await, "0", "moved to SQS's dead-letter queue while it ran");
        SqsBroker::delete_queue(&brokers::sqs_options(&queue)).await;
    })
    .await;
}

/// Wrong settings fail at start with the setting to change: a queue that
/// does not exist, a redrive policy whose maxReceiveCount could move a
/// message to SQS's dead-letter queue before Idem's attempts are made, and
/// (in an `idem` process without them) missing credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_wrong_settings_are_refused_at_start_with_the_fix() {
    let missing = brokers::sqs_options(&unique_namespace("missing"));
    let err = SqsBroker::connect(missing)
        .await
        .err()
        .expect("a missing queue is refused")
        .to_string();
    assert!(err.contains("does not exist") && err.contains("broker.queue"), "{err}");

    in_sqs_queue(false, |dlq| async move {
        let options = brokers::sqs_options(&redriving_to(&dlq, 3).await);
        let err = SqsBroker::connect(options.clone()).await.err().map(|e| e.to_string());
        SqsBroker::delete_queue(&options).await;
        let err = err.expect("a redrive policy that pre-empts Idem is refused");
        assert!(err.contains("maxReceiveCount = 3") && err.contains("retry.max_attempts"), "{err}");

        // A redrive policy leaving four 12-hour deferrals after 5 attempts
        // and one more receive: a publish delayed three days is refused.
        redriving_to(&dlq, 10).await;
        let b = brokers::sqs(&options).await;
        let three_days = Duration::from_secs(3 * 24 * 3600);
        let err = b.publish(&[brokers::envelope("d")], three_days).await.unwrap_err().to_string();
        assert!(err.contains("maxReceiveCount"), "{err}");
        b.publish(&[brokers::envelope("d")], Duration::from_secs(24 * 3600)).await.unwrap();
        SqsBroker::delete_queue(&options).await;

        // A queue keeping messages a minute cannot hold a retry of one.
        let short = brokers::sqs_options(&format!("{dlq}-short"));
        SqsBroker::create_queue(&short, &[("MessageRetentionPeriod", "60")]).await.unwrap();
        let err = SqsBroker::connect(short.clone()).await.err().map(|e| e.to_string());
        SqsBroker::delete_queue(&short).await;
        let err = err.expect("a retry delay past the queue's retention is refused");
        assert!(
            err.contains("retry.max_delay_ms = 60000") && err.contains("MessageRetentionPeriod"),
            "{err}"
        );

        // No credentials anywhere the standard chain looks.
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("idem.toml");
        std::fs::write(
            &config,
            format!(
                "namespace = \"{dlq}\"\n[broker]\nkind = \"sqs\"\nurl = \"{}\"\n[database]\npath = \"{}\"\n",
                services::sqs(),
                dir.path().join("idem.db").display()
            ),
        )
        .unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_idem"));
        cmd.args(["stats", "--config"]).arg(&config);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_")) {
            cmd.env_remove(k);
        }
        let out = cmd
            .env("AWS_CONFIG_FILE", dir.path().join("none"))
            .env("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("none"))
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            stderr.contains("no AWS credentials were found") && stderr.contains("AWS_ACCESS_KEY_ID"),
            "{stderr}"
        );
    })
    .await;
}

/// Create queue `<dlq>-main`, whose redrive policy moves a message to
/// queue `dlq` once it has been received `max_receives` times; its name.
async fn redriving_to(dlq: &str, max_receives: u32) -> String {
    let arn = attribute(dlq, aws_sdk_sqs::types::QueueAttributeName::QueueArn).await;
    let queue = format!("{dlq}-main");
    let policy = format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{max_receives}"}}"#);
    SqsBroker::create_queue(&brokers::sqs_options(&queue), &[("RedrivePolicy", &policy)])
        .await
        .unwrap();
    queue
}

/// The SDK's own client for the test server, as another producer or an
/// operator has (the broker's settings, without its queue checks).
async fn sdk_client() -> aws_sdk_sqs::Client {
    SqsBroker::sdk_client(&brokers::sqs_options("unused")).await
}

/// How many messages of `queue` the server counts as visible.
async fn visible(queue: &str) -> String {
    attribute(queue, aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages).await
}

/// One attribute of queue `queue`, as the server gives it ("" if none).
async fn attribute(queue: &str, name: aws_sdk_sqs::types::QueueAttributeName) -> String {
    let client = sdk_client().await;
    let url = client.get_queue_url().queue_name(queue).send().await.unwrap().queue_url.unwrap();
    let out = client
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(name.clone())
        .send()
        .await
        .unwrap();
    out.attributes().and_then(|a| a.get(&name)).cloned().unwrap_or_default()
}

/// A proxy in front of the test server that answers 503 (as SQS does when
/// it is overloaded) to the requests `fail` picks by their operation
/// (`X-Amz-Target`, such as `AmazonSQS.ReceiveMessage`) and passes the
/// others through; its address.
async fn proxy(fail: impl Fn(&str) -> bool + Clone + Send + Sync + 'static) -> String {
    let upstream = services::sqs();
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let (fail, upstream, http) = (fail.clone(), upstream.clone(), http.clone());
        async move {
            use axum::response::IntoResponse;
            let target = req.headers().get("x-amz-target").and_then(|t| t.to_str().ok()).unwrap_or_default();
            if fail(target) {
                let body = r#"{"__type":"com.amazonaws.sqs#ServiceUnavailable","message":"try again"}"#;
                return (axum::http::StatusCode::SERVICE_UNAVAILABLE, body).into_response();
            }
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let mut out = http.post(format!("{upstream}{}", parts.uri.path()));
            for (k, v) in &parts.headers {
                if k != axum::http::header::HOST {
                    out = out.header(k, v);
                }
            }
            let answer = out.body(body).send().await.unwrap();
            let status = answer.status();
            let headers = answer.headers().clone();
            let bytes = answer.bytes().await.unwrap();
            let mut response = (status, bytes).into_response();
            for (k, v) in &headers {
                if k == "content-type" || k.as_str().starts_with("x-amz") {
                    response.headers_mut().insert(k, v.clone());
                }
            }
            response
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// On a FIFO queue, a failed delete or receive still settles what the
/// worker is done with: after an ack whose delete failed, the next message
/// of the group goes out; a fetch whose receive fails hands out the
/// message it took from behind its group rather than dropping it. Before,
/// either left the group taken for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_groups_go_on_after_a_failed_delete_or_receive() {
    in_sqs_queue(true, |queue| async move {
        let failing = Arc::new(Mutex::new(None::<&'static str>));
        let faults = failing.clone();
        let mut options = brokers::sqs_options(&queue);
        options.endpoint = Some(proxy(move |target| faults.lock().unwrap().is_some_and(|f| target.ends_with(f))).await);
        options.group_pointer = Some("/account".into());
        let b = brokers::sqs(&options).await;
        b.publish(&[message(1, 1), message(1, 2), message(1, 3)], Duration::ZERO)
            .await
            .unwrap();
        let ids = |got: &[idem_host::envelope::Delivery]| got.iter().map(|d| d.envelope.id.clone()).collect::<Vec<_>>();
        let first = fetch_until(&b, 10, Duration::from_secs(60), "the group's first message").await;
        assert_eq!(ids(&first), ["g1-m1"], "one of the group at a time");
        assert_eq!(visible(&queue).await, "0", "the rest wait in hand");

        *failing.lock().unwrap() = Some(".DeleteMessageBatch");
        let err = b.ack(&[&first[0].receipt]).await.unwrap_err().to_string();
        assert!(err.contains("cannot delete acked messages"), "{err}");
        *failing.lock().unwrap() = None;
        let second = fetch_until(&b, 10, Duration::from_secs(60), "the next message, after a failed delete").await;
        assert_eq!(ids(&second), ["g1-m2"]);
        b.ack(&[&second[0].receipt]).await.unwrap();

        *failing.lock().unwrap() = Some(".ReceiveMessage");
        let third = b.fetch(10, Duration::from_secs(60)).await;
        *failing.lock().unwrap() = None;
        assert_eq!(ids(&third.unwrap()), ["g1-m3"], "handed out although the receive failed");
    })
    .await;
}

/// Throttling and 5xx answers are retried with backoff before a call
/// fails: in front of the server, a proxy answers the first two requests
/// of every three with 503 (as SQS does when it is overloaded), then
/// passes the third through. Publishing, receiving and deleting all get
/// through, each after its retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_throttling_and_5xx_are_retried_with_backoff() {
    in_sqs_queue(false, |queue| async move {
        let seen = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = seen.clone();
        let endpoint = proxy(move |_| counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 3 != 2).await;
        let mut options = brokers::sqs_options(&queue);
        options.endpoint = Some(endpoint);
        let b = brokers::sqs(&options).await;
        b.publish(&[brokers::envelope("x")], Duration::ZERO).await.unwrap();
        let got = fetch_until(&b, 10, Duration::from_secs(30), "x").await;
        b.ack(&[&got[0].receipt]).await.unwrap();
        assert_eq!(b.pending().await.unwrap(), 0);
        let requests = seen.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            requests >= 15,
            "each of the 5+ calls was answered 503 twice first: {requests} requests"
        );
    })
    .await;
}
