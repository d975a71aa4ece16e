//! Celery interop against the real thing: tasks sent by Celery's own
//! producer API (`send_task`, `apply_async`) into Redis or RabbitMQ,
//! consumed by Idem's `celery` broker, answered through Celery's Redis
//! result backend and read back with `AsyncResult(id).get()`; a Celery
//! worker beside Idem on the same broker; malformed messages a real Celery
//! can send. The Celery side is `tests/celery/celery_side.py`, run in the
//! virtualenv of `bench/celery/venv`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use idem_host::config::{BrokerConfig, BrokerKind, Config};
use serde_json::Value;

use crate::common::*;

/// The Rust port of bench/celery's task.
const TASK: &str = "billing.grant_credits";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The virtualenv with Celery (made on first use; it also has py-amqp).
pub(crate) fn venv() -> PathBuf {
    let out = Command::new("bash")
        .arg(root().join("bench/celery/venv"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run bench/celery/venv");
    assert!(out.status.success(), "bench/celery/venv failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Which of Celery's transports a test runs on.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Redis,
    Amqp,
}

impl Transport {
    /// A queue name in a test's namespace: on Redis, one its clean-up
    /// (every key `{ns}:*`) deletes.
    fn queue(self, ns: &str, name: &str) -> String {
        match self {
            Transport::Redis => format!("{ns}:{name}"),
            Transport::Amqp => format!("{ns}.{name}"),
        }
    }

    /// The broker URL as Idem reads it.
    fn url(self) -> String {
        match self {
            Transport::Redis => services::redis(),
            Transport::Amqp => services::amqp(),
        }
    }
}

/// The Celery side, for one test's queues.
struct CelerySide {
    venv: PathBuf,
    transport: Transport,
    idem_queue: String,
    celery_queue: String,
}

impl CelerySide {
    fn new(ns: &str, transport: Transport) -> Self {
        CelerySide {
            venv: venv(),
            transport,
            idem_queue: transport.queue(ns, "idem"),
            celery_queue: transport.queue(ns, "celery"),
        }
    }

    /// The broker URL as kombu reads it (vhost `/` written `//`).
    fn kombu_url(&self) -> String {
        let url = self.transport.url();
        url.strip_suffix("/%2f").map_or(url.clone(), |base| format!("{base}//"))
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.venv.join("bin").join(program));
        cmd.current_dir(root().join("tests/celery"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("CELERY_BROKER", self.kombu_url())
            .env("CELERY_BACKEND", services::redis())
            .env("IDEM_QUEUE", &self.idem_queue)
            .env("CELERY_QUEUE", &self.celery_queue)
            .env("TASK_PREFIX", &self.idem_queue);
        cmd
    }

    /// Run one command of celery_side.py (off the async runtime: it blocks).
    async fn run(&self, args: &[&str]) -> Value {
        let mut cmd = self.command("python");
        cmd.arg("celery_side.py").args(args).stderr(Stdio::inherit());
        let what = args.join(" ");
        let out = tokio::task::spawn_blocking(move || cmd.output().expect("run celery_side.py"))
            .await
            .unwrap();
        assert!(out.status.success(), "celery_side.py {what} failed");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("celery_side.py {what} printed no JSON ({e})"))
    }

    /// A Celery worker serving the Celery queue.
    fn worker(&self, log: &Path) -> Spawned {
        Spawned(
            self.command("celery")
                .args(["-A", "celery_side", "worker", "--pool", "solo", "--loglevel", "warning", "-Q"])
                .arg(&self.celery_queue)
                .args(["--without-gossip", "--without-mingle", "--without-heartbeat"])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(log).unwrap())
                .spawn()
                .expect("spawn a Celery worker"),
        )
    }
}

/// A test's Celery side and environment: the celery broker on Idem's
/// queue, the grant_credits port serving its task, claims and data in
/// Postgres or SQLite; and what deletes its keys and queues afterwards.
async fn celery_env(tag: &str, transport: Transport, postgres: bool) -> (CelerySide, Env, Cleanup) {
    let ns = unique_namespace(tag);
    let side = CelerySide::new(&ns, transport);
    let mut env = Env::new().await;
    env.config.namespace = ns.clone();
    env.config.broker = BrokerConfig {
        kind: BrokerKind::Celery,
        url: Some(transport.url()),
        queues: vec![side.idem_queue.clone()],
        result_backend: Some(services::redis()),
        result_expires_secs: 600,
        ..BrokerConfig::default()
    };
    if postgres {
        env.use_postgres(8);
    }
    let mut credits = plugin("celery_grant_credits.wasm", &["credits"], &[], None);
    credits.celery_task = Some(TASK.into());
    env.config.plugins.insert("celery-credits".into(), credits);
    let cleanup = Cleanup(env.config.clone(), vec![side.idem_queue.clone(), side.celery_queue.clone()]);
    (side, env, cleanup)
}

/// Deletes the test's keys, results, schema and (on RabbitMQ) the Celery
/// queues and exchanges the producer declared, even when it fails.
struct Cleanup(Config, Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (config, queues) = (self.0.clone(), self.1.clone());
        let _ = std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                idem_host::tools::chaos::cleanup(&config).await;
                if config.broker.url.as_deref().is_some_and(|u| u.starts_with("amqp")) {
                    brokers::delete_amqp_queues(&queues).await;
                }
                let mut conn = brokers::redis_conn().await;
                let results: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("celery-task-meta-{}*", config.namespace))
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                if !results.is_empty() {
                    let _: redis::RedisResult<()> = redis::cmd("DEL").arg(results).query_async(&mut conn).await;
                }
            })
        })
        .join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn celery_tasks_on_redis_run_once_and_answer_asyncresult_through_a_sigkill() {
    tasks_run_once_through_a_sigkill(Transport::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn celery_tasks_on_rabbitmq_run_once_and_answer_asyncresult_through_a_sigkill() {
    tasks_run_once_through_a_sigkill(Transport::Amqp).await;
}

async fn tasks_run_once_through_a_sigkill(transport: Transport) {
    let (side, env, _cleanup) = celery_env("celery", transport, true).await;
    let config_path = env.dir.path().join("idem.toml");
    std::fs::write(&config_path, toml::to_string(&env.config).unwrap()).unwrap();
    let backends = idem_host::backend::open(&env.config).await.unwrap();

    // 1,000 tasks, 100 of them sent twice with the same id, 143 with a
    // countdown, and one already expired.
    let sent = side.run(&["send", "1000"]).await;
    assert_eq!(sent["sent"], 1101);

    let log = |n: u32| env.dir.path().join(format!("worker-{n}.log"));
    // The first worker starts alone and is killed at a moment it holds
    // claims, with most of the tasks still to do: the tasks it had taken
    // must be run by the others, once. (Killing it only after 300 were done
    // by two workers raced the backlog: on a fast day the last task was
    // done before a look caught the first worker holding a claim.)
    let mut first = spawn_idem_run(&config_path, &log(1));
    kill_holding_claims(first.id(), &log(1), "", backends.admin.as_ref()).await;
    first.wait().unwrap();
    let second = spawn_idem_run(&config_path, &log(2));
    let third = spawn_idem_run(&config_path, &log(3));

    // Every result as a Celery client reads it: the value the handler
    // returned (the re-sent ones too), and the expired task revoked. On
    // RabbitMQ, Celery gave the expired task a TTL of 0, so the server
    // dropped it before any consumer saw it, as it does for Celery workers.
    let results = side.run(&["wait", "1000", "120"]).await;
    assert_eq!(results["statuses"], serde_json::json!({"SUCCESS": 1000}), "{results}");
    let expired_letters = match transport {
        Transport::Redis => {
            assert_eq!(results["expired"], "REVOKED");
            assert_eq!(results["expired_error"], "TaskRevokedError");
            1
        }
        Transport::Amqp => {
            assert_eq!(results["expired"], "PENDING");
            0
        }
    };

    // Each task's effect once, with its own arguments; nothing left behind.
    let credits: HashMap<String, Vec<u8>> = backends.data.scan("credits").await.unwrap().into_iter().collect();
    assert_eq!(credits.len(), 1000);
    for i in 0..1000 {
        assert_eq!(credits[&format!("u{i}")], i.to_string().as_bytes(), "u{i}");
    }
    wait_until(Duration::from_secs(30), "the broker to hold nothing", || async {
        backends.broker.pending().await.unwrap() == 0
    })
    .await;
    let counts = backends.admin.counts().await.unwrap();
    assert_eq!(
        (counts.done, counts.running, counts.retry, counts.dead_letters),
        (1000, 0, 0, expired_letters),
        "{counts:?}"
    );
    for letter in backends.admin.dead_letters(10).await.unwrap() {
        assert!(letter.reason.contains("expired at"), "{}", letter.reason);
    }

    for mut worker in [second, third] {
        worker.kill().unwrap();
        worker.wait().unwrap();
    }
    // On Redis, the killed worker's deliveries went back to the queue when
    // their visibility ended, and were run by the others (RabbitMQ requeues
    // a dead connection's deliveries itself).
    if transport == Transport::Redis {
        let restored = (2..=3).any(|n| std::fs::read_to_string(log(n)).unwrap().contains("went back to their queues"));
        assert!(restored, "no worker restored the killed worker's deliveries");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_celery_worker_and_idem_share_one_redis() {
    celery_and_idem_share_one_broker(Transport::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_celery_worker_and_idem_share_one_rabbitmq() {
    celery_and_idem_share_one_broker(Transport::Amqp).await;
}

async fn celery_and_idem_share_one_broker(transport: Transport) {
    let (side, env, _cleanup) = celery_env("celery_mixed", transport, false).await;
    let pool = env.start().await;
    let mut celery = side.worker(&env.dir.path().join("celery.log"));

    let out = side.run(&["mixed", "20", "60"]).await;
    celery.kill().unwrap();
    celery.wait().unwrap();
    assert_eq!(out["sums_ok"], true, "the Celery worker answered its tasks: {out}");
    assert_eq!(out["idem"], 20, "Idem answered its tasks: {out}");
    assert_eq!(out["idem_values_ok"], true, "Idem's answers are the handler's values: {out}");
    assert_eq!(pool.backends.data.scan("credits").await.unwrap().len(), 20);
    pool.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_task_answers_with_the_result_stored_with_its_claim() {
    let (side, mut env, _cleanup) = celery_env("celery_natural", Transport::Redis, false).await;
    env.config.plugins.get_mut("celery-credits").unwrap().key_pointer = Some("/args/0".into());
    let pool = env.start().await;

    let out = side.run(&["natural", "60"]).await;
    let granted = serde_json::json!({"user": "nu", "balance": 42});
    assert_eq!(out["first"], granted, "{out}");
    assert_eq!(out["second"], granted, "{out}");
    assert_eq!(out["status"], "SUCCESS");
    let c = pool.counters.snapshot();
    assert_eq!((c.executions, c.duplicates), (1, 1), "the second task did not run: {c:?}");
    pool.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_celery_messages_on_redis_are_dead_lettered_with_their_reasons() {
    malformed_messages_are_dead_lettered(Transport::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_celery_messages_on_rabbitmq_are_dead_lettered_with_their_reasons() {
    malformed_messages_are_dead_lettered(Transport::Amqp).await;
}

async fn malformed_messages_are_dead_lettered(transport: Transport) {
    let (side, env, _cleanup) = celery_env("celery_bad", transport, false).await;
    let pool = env.start().await;

    let out = side.run(&["malformed", "60"]).await;
    assert_eq!(out["good"], "SUCCESS", "the good task after the bad ones ran: {out}");
    let failure = |id: &str| out["failures"][id].as_str().unwrap_or_default().to_string();
    // The body of a message with task headers cannot be read: on Redis its
    // base64, on RabbitMQ (raw bodies) its JSON.
    let unreadable_body = match transport {
        Transport::Redis => "not valid base64",
        Transport::Amqp => "the task body is not JSON",
    };
    for (id, why) in [
        ("unknown", "no plugin serves Celery task \"nobody.serves_this\""),
        ("chain", "canvas (chain)"),
        ("protocol1", "protocol 1 is not supported"),
        ("base64", unreadable_body),
    ] {
        let f = failure(id);
        assert!(f.starts_with("IdemDeadLettered") && f.contains(why), "{id}: {f}");
    }
    wait_until(Duration::from_secs(30), "every bad message settled", || async {
        pool.backends.broker.pending().await.unwrap() == 0
    })
    .await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    let reasons: Vec<&str> = letters.iter().map(|l| l.reason.as_str()).collect();
    assert_eq!(letters.len(), 5, "{reasons:?}");
    let headerless = match transport {
        Transport::Redis => "not a kombu JSON envelope",
        Transport::Amqp => "not a Celery task: the message has no task header",
    };
    assert!(reasons.iter().any(|r| r.contains(headerless)), "{reasons:?}");
    assert_eq!(
        pool.backends.data.scan("credits").await.unwrap().len(),
        1,
        "only the good task wrote"
    );
    // A replay of all of them keeps each record, untouched, saying why:
    // published again, its whole text would be a task's argument (before,
    // it ran so).
    let all = idem_host::dlq::Selection {
        all: true,
        ..Default::default()
    };
    let done = idem_host::dlq::replay(&pool.backends, &all).await.unwrap();
    assert!(done.replayed.is_empty(), "{done:?}");
    assert_eq!(done.kept.len(), 5, "{done:?}");
    assert!(done.kept.iter().all(|k| k.why.contains("Idem refused when it read it")), "{done:?}");
    assert_eq!(pool.backends.admin.dead_letter_count().await.unwrap(), 5);
    pool.stop().await.unwrap();
}

/// A task dead-lettered as bad input while the result backend cannot be
/// reached: its answer fails, so the delivery is handed back and comes
/// again until the backend answers. It is recorded once, however often it
/// came (before, once per delivery).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_task_delivered_again_while_its_answer_fails_is_dead_lettered_once() {
    use idem_host::tools::kit::{FaultyProxy, Link};
    let (_side, mut env, _cleanup) = celery_env("celery_dl_once", Transport::Redis, false).await;
    // The result backend through a proxy (the test server's credentials
    // and database kept).
    let mut backend = url::Url::parse(&services::redis()).unwrap();
    let upstream = (backend.host_str().unwrap().to_string(), backend.port().unwrap_or(6379));
    let upstream = tokio::net::lookup_host(upstream).await.unwrap().next().unwrap();
    let proxy = FaultyProxy::start(upstream).await.unwrap();
    backend.set_host(Some("127.0.0.1")).unwrap();
    backend.set_port(Some(proxy.addr().port())).unwrap();
    env.config.broker.result_backend = Some(backend.to_string());
    env.config.limits.max_payload_bytes = 8;
    let pool = env.start().await;

    proxy.set(Link::Cut);
    // Named under the namespace, so the cleanup removes its result.
    let id = format!("{}-too-big", env.config.namespace);
    let task = envelope(&id, "celery-credits", serde_json::json!({ "user": "u", "balance": 1 }));
    pool.backends.broker.publish(&[task], Duration::ZERO).await.unwrap();
    // Each failed answer may wait out the result backend's reconnects.
    wait_until(Duration::from_secs(120), "the bad task delivered three times", || async {
        pool.counters.snapshot().deliveries >= 3
    })
    .await;
    proxy.set(Link::Up);
    wait_until(Duration::from_secs(120), "the bad task answered and acked", || async {
        pool.backends.broker.pending().await.unwrap() == 0
    })
    .await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].msg_id, id);
    assert!(letters[0].reason.contains("limits.max_payload_bytes"), "{}", letters[0].reason);
    pool.stop().await.unwrap();
}

/// A Celery broker on one queue, as one worker process has it.
async fn celery_broker(ns: &str) -> idem_host::broker::celery::CeleryBroker {
    celery_broker_on(ns, Transport::Redis).await
}

async fn celery_broker_on(ns: &str, transport: Transport) -> idem_host::broker::celery::CeleryBroker {
    celery_broker_of(ns, transport, vec![transport.queue(ns, "q")]).await
}

/// As [`celery_broker_on`], consuming `queues` (and publishing to the first).
async fn celery_broker_of(ns: &str, transport: Transport, queues: Vec<String>) -> idem_host::broker::celery::CeleryBroker {
    idem_host::broker::celery::CeleryBroker::connect(idem_host::broker::celery::CeleryOptions {
        url: transport.url(),
        queues,
        tasks: HashMap::from([("t.h".to_string(), "h".to_string())]),
        result_backend: Some(services::redis()),
        result_expires: Duration::from_secs(60),
        namespace: ns.to_string(),
    })
    .await
    .unwrap()
}

/// Celery's `retries` header of a delivery.
fn retries(d: &idem_host::envelope::Delivery) -> Option<String> {
    d.envelope
        .headers
        .iter()
        .find(|(k, _)| k == "celery.retries")
        .map(|(_, v)| v.clone())
}

/// Retry `held`: it comes back after its delay with Celery's retries header
/// one higher and shows as RETRY in the result backend meanwhile; then a
/// hand-back (nack after `hand_back`) does not count as a retry. Returns
/// the retried delivery (its receipt now stale) and the handed-back one.
async fn retry_then_hand_back(
    broker: &dyn idem_host::broker::Broker,
    held: &idem_host::envelope::Delivery,
    hand_back: Duration,
) -> (idem_host::envelope::Delivery, idem_host::envelope::Delivery) {
    let before: u64 = retries(held).unwrap().parse().unwrap();
    broker.retry(&held.receipt, Duration::from_millis(200), "timeout").await.unwrap();
    let meta: String = redis::cmd("GET")
        .arg(format!("celery-task-meta-{}", held.envelope.id))
        .query_async(&mut brokers::redis_conn().await)
        .await
        .unwrap();
    let meta: Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(
        (meta["status"].as_str(), &meta["result"]["exc_message"]),
        (Some("RETRY"), &serde_json::json!(["timeout"]))
    );
    let visibility = Duration::from_secs(30);
    let mut retried = brokers::fetch_until(broker, 10, visibility, "the retried task").await;
    assert_eq!(brokers::ids(&retried), [held.envelope.id.as_str()]);
    assert_eq!(retried[0].envelope.payload, held.envelope.payload);
    let after = (before + 1).to_string();
    assert_eq!(retries(&retried[0]).as_deref(), Some(after.as_str()));
    broker.nack(&retried[0].receipt, hand_back).await.unwrap();
    let mut again = brokers::fetch_until(broker, 10, visibility, "the handed-back task").await;
    assert_eq!(retries(&again[0]).as_deref(), Some(after.as_str()));
    (retried.remove(0), again.remove(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_workers_tasks_come_back_and_retries_count_in_the_task() {
    use idem_host::broker::Broker;
    let ns = unique_namespace("celery_broker");
    let config = Config {
        namespace: ns.clone(),
        broker: BrokerConfig {
            kind: BrokerKind::Celery,
            url: Some(services::redis()),
            ..BrokerConfig::default()
        },
        ..Config::default()
    };
    let _cleanup = Cleanup(config, Vec::new());
    let (one, two) = (celery_broker(&ns).await, celery_broker(&ns).await);
    let sent = [
        envelope(&format!("{ns}-a"), "h", serde_json::json!({"args": [1], "kwargs": {}})),
        envelope(&format!("{ns}-b"), "h", serde_json::json!({"args": [2], "kwargs": {}})),
    ];
    one.publish(&sent, Duration::ZERO).await.unwrap();

    let short = Duration::from_millis(300);
    let held = brokers::fetch_n(&one, 2, short, "both tasks").await;
    assert_eq!(held.iter().map(|d| d.delivery_count).collect::<Vec<_>>(), [1, 1]);
    assert!(two.fetch(10, short).await.unwrap().is_empty(), "held deliveries are invisible");
    // `one` keeps extending the first and vanishes with the second.
    let (kept, lost) = (&held[0], &held[1]);
    let redelivered = wait_for(Duration::from_secs(10), "the lost delivery to come back", || async {
        one.extend(&[&kept.receipt], short).await.unwrap();
        let got = two.fetch(10, Duration::from_secs(30)).await.unwrap();
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(brokers::ids(&redelivered), [lost.envelope.id.as_str()]);
    assert_eq!(redelivered[0].delivery_count, 2);
    assert_eq!(redelivered[0].envelope.payload, lost.envelope.payload);
    one.ack(&[&kept.receipt]).await.unwrap();

    let (_, again) = retry_then_hand_back(&two, &redelivered[0], Duration::ZERO).await;
    // A stale receipt settles nothing; the current one empties the queue.
    one.ack(&[&lost.receipt]).await.unwrap();
    assert_eq!(two.pending().await.unwrap(), 1);
    two.ack(&[&again.receipt]).await.unwrap();
    assert_eq!(two.pending().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_a_dropped_connections_tasks_come_back_and_retries_count_in_the_task() {
    use idem_host::broker::Broker;
    let ns = unique_namespace("celery_amqp_broker");
    let config = Config {
        namespace: ns.clone(),
        broker: BrokerConfig {
            kind: BrokerKind::Celery,
            url: Some(services::amqp()),
            queues: vec![format!("{ns}.q")],
            ..BrokerConfig::default()
        },
        ..Config::default()
    };
    let _cleanup = Cleanup(config, vec![format!("{ns}.q")]);
    let (one, two) = (
        celery_broker_on(&ns, Transport::Amqp).await,
        celery_broker_on(&ns, Transport::Amqp).await,
    );
    let sent = [
        envelope(&format!("{ns}-a"), "h", serde_json::json!({"args": [1], "kwargs": {}})),
        envelope(&format!("{ns}-b"), "h", serde_json::json!({"args": [2], "kwargs": {}})),
    ];
    one.publish(&sent, Duration::ZERO).await.unwrap();
    let visibility = Duration::from_secs(30);
    let held = brokers::fetch_n(&one, 2, visibility, "both tasks").await;
    assert_eq!(brokers::ids(&held), [sent[0].id.as_str(), sent[1].id.as_str()]);
    assert_eq!(held[0].envelope.payload, br#"{"args":[1],"kwargs":{}}"#);
    assert!(two.fetch(10, visibility).await.unwrap().is_empty(), "held deliveries are invisible");

    // A worker whose connection closes gives its tasks back at once.
    drop(one);
    let back = brokers::fetch_n(&two, 2, visibility, "the dropped connection's tasks").await;
    let mut ids = brokers::ids(&back);
    ids.sort();
    assert_eq!(ids, [sent[0].id.as_str(), sent[1].id.as_str()]);
    assert!(back.iter().all(|d| d.delivery_count == 2), "redelivered");

    assert_eq!(retries(&back[0]).as_deref(), Some("0"));
    let (retried, again) = retry_then_hand_back(&two, &back[0], Duration::from_millis(100)).await;
    // A stale receipt settles nothing; the current ones empty the queue.
    two.ack(&[&retried.receipt]).await.unwrap();
    assert_eq!(two.pending().await.unwrap(), 2);
    two.ack(&[&again.receipt, &back[1].receipt]).await.unwrap();
    assert_eq!(two.pending().await.unwrap(), 0);
}

/// A worker consuming several queues on RabbitMQ gets their deliveries on
/// one channel, numbered in the order the server sent them, through one
/// consumer per queue; a fetch that takes only some of them must take the
/// lowest tags, or the `multiple` ack of what it took would also ack a
/// delivery it never handed out (lost if the worker then stops). Here a1
/// and a2 wait in queue a and b1 in queue b before the worker starts
/// consuming; it fetches two, acks them, and its connection closes: the
/// third comes back. Before deliveries were kept in tag order, the merged
/// consumers yielded a1, b1, a2, the fetch handed out a1 and b1, their
/// multiple ack covered a2, and a2 never came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_a_fetch_of_some_deliveries_of_several_queues_acks_only_those() {
    use idem_host::broker::Broker;
    use lapin::options::QueueDeclareOptions;
    let ns = unique_namespace("celery_amqp_queues");
    let (a, b) = (Transport::Amqp.queue(&ns, "a"), Transport::Amqp.queue(&ns, "b"));
    let config = Config {
        namespace: ns.clone(),
        broker: BrokerConfig {
            kind: BrokerKind::Celery,
            url: Some(services::amqp()),
            queues: vec![a.clone(), b.clone()],
            ..BrokerConfig::default()
        },
        ..Config::default()
    };
    let _cleanup = Cleanup(config, vec![a.clone(), b.clone()]);
    let on = |queues: Vec<String>| celery_broker_of(&ns, Transport::Amqp, queues);
    // The worker consumes both queues (its first fetch starts the
    // consumers) before anything is published, so the server numbers a1,
    // a2, b1 in that order on its channel.
    let worker = on(vec![a.clone(), b.clone()]).await;
    let visibility = Duration::from_secs(30);
    assert!(worker.fetch(2, visibility).await.unwrap().is_empty());
    // Publishing goes to a broker's first queue.
    let to_a = on(vec![a.clone()]).await;
    let to_b = on(vec![b.clone()]).await;
    let task = |name: &str| envelope(&format!("{ns}-{name}"), "h", serde_json::json!({"args": [name], "kwargs": {}}));
    to_a.publish(&[task("a1"), task("a2")], Duration::ZERO).await.unwrap();
    to_b.publish(&[task("b1")], Duration::ZERO).await.unwrap();
    drop((to_a, to_b));
    // Wait until the server has pushed all three to the worker's consumers
    // (none left ready in either queue), so one fetch sees them together.
    let raw = brokers::amqp_raw().await;
    let ch = raw.create_channel().await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    wait_until(Duration::from_secs(30), "all three tasks pushed to the worker", || {
        let (ch, a, b) = (ch.clone(), a.clone(), b.clone());
        async move {
            let mut ready = 0;
            for q in [a, b] {
                ready += ch
                    .queue_declare(q.as_str().into(), passive, Default::default())
                    .await
                    .unwrap()
                    .message_count();
            }
            ready == 0
        }
    })
    .await;
    let first = worker.fetch(2, visibility).await.unwrap();
    let taken = brokers::ids(&first);
    assert_eq!(taken, [format!("{ns}-a1"), format!("{ns}-a2")], "the two lowest tags");
    worker.ack(&brokers::receipts(&first)).await.unwrap();
    drop(worker);

    let other = on(vec![a.clone(), b.clone()]).await;
    let back = brokers::fetch_n(&other, 1, visibility, "the task the first worker never handed out").await;
    assert_eq!(brokers::ids(&back), [format!("{ns}-b1")], "not acked with the others");
    other.ack(&brokers::receipts(&back)).await.unwrap();
    assert_eq!(other.pending().await.unwrap(), 0, "the two acked tasks stayed acked");
    raw.close(200, "OK".into()).await.unwrap();
}

/// Neither a failure nor a retry replaces how a task ended: a message
/// reusing a finished task's id (another payload, an `expires` in the past,
/// an unknown task name) leaves that task's result as it was. A failure
/// does replace a `RETRY`, and a duplicate's answer replaces nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_never_overwrites_how_a_task_with_its_id_ended() {
    use idem_host::broker::celery::results::{Overwrite, RedisResults, Report, Status};
    let results = RedisResults::connect(&services::redis(), Duration::from_secs(60)).await.unwrap();
    let mut conn = redis::Client::open(services::redis())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let id = format!("overwrite-{}", uuid::Uuid::new_v4());
    let key = format!("celery-task-meta-{id}");
    let write = |status: Status<'static>, overwrite: Overwrite| {
        let results = &results;
        let id = id.clone();
        async move {
            let report = Report {
                task_id: &id,
                status,
                overwrite,
            };
            results.write(&[report], 0).await.unwrap();
        }
    };
    let stored = || {
        let key = key.clone();
        let mut conn = conn.clone();
        async move {
            let text: String = redis::AsyncCommands::get(&mut conn, &key).await.unwrap();
            let meta: Value = serde_json::from_str(&text).unwrap();
            meta["status"].as_str().unwrap().to_string()
        }
    };

    write(Status::Retry("first attempt failed"), Overwrite::UnlessFinal).await;
    assert_eq!(stored().await, "RETRY");
    write(Status::Failure("attempts exhausted"), Overwrite::UnlessFinal).await;
    assert_eq!(stored().await, "FAILURE", "a failure replaces a RETRY");
    write(Status::Success(Some(b"1")), Overwrite::Always).await;
    assert_eq!(stored().await, "SUCCESS", "a replayed task's success replaces its failure");
    for status in [Status::Failure("conflict"), Status::Revoked("expired"), Status::Retry("failed")] {
        write(status, Overwrite::UnlessFinal).await;
        assert_eq!(stored().await, "SUCCESS", "a failure never replaces how the task ended");
    }
    write(Status::Failure("dead-lettered by an earlier delivery"), Overwrite::Never).await;
    assert_eq!(stored().await, "SUCCESS");
    let _: () = redis::AsyncCommands::del(&mut conn, &key).await.unwrap();
}
