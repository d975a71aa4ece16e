//! Many workers on real servers: for each example configuration, two
//! `idem run` processes share one queue; 2,000 messages with duplicates
//! (some concurrent, some late) flow through them; one worker is SIGKILLed
//! mid-run and restarted. Every message must end done or dead-lettered,
//! every effect must be stored once and performed once at the mock APIs,
//! and no journaled call may be sent again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use idem_host::config::{BrokerKind, Config, StoreKind};
use idem_host::tools::demo::{demo_config, verify, Schedule};
use idem_host::tools::kit::Mock;

use crate::common::*;

const MESSAGES: usize = 2_000;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name)
}

/// The example file, pointed at this test's mock, plugins and namespace.
fn config_from_example(file: &str, dir: &Path, mock: &Mock) -> Config {
    let example = Config::load(&example(file)).unwrap_or_else(|e| panic!("{file} loads: {e:#}"));
    let demo = demo_config(dir.join("idem.db"), &plugin_dir(), mock, 8);
    let mut config = example;
    config.namespace = unique_namespace("pool");
    config.database.path = dir.join("idem.db");
    config.endpoints = demo.endpoints;
    // The suite's servers (`IDEM_TEST_*`), not the example's default ports.
    let broker = match config.broker.kind {
        BrokerKind::Redis => Some(services::redis()),
        BrokerKind::Rabbitmq => Some(services::amqp()),
        BrokerKind::Nats => Some(services::nats()),
        BrokerKind::Sqs => Some(services::sqs()),
        BrokerKind::Kafka => Some(services::kafka()),
        _ => None,
    };
    config.broker.url = broker.or(config.broker.url);
    for store in [&mut config.claims, &mut config.data] {
        store.url = match store.kind {
            StoreKind::Postgres => Some(services::postgres()),
            StoreKind::Redis => Some(services::redis()),
            _ => store.url.take(),
        };
    }
    for (name, plugin) in config.plugins.iter_mut() {
        plugin.path = match demo.plugins.get(name) {
            Some(p) => p.path.clone(),
            None => plugin_dir().join(plugin.path.file_name().expect("a plugin file")),
        };
    }
    config.worker.concurrency = 8;
    config.worker.lease_ms = 2_000;
    config.worker.heartbeat_ms = Some(400);
    config.worker.visibility_ms = 2_000;
    config.worker.busy_retry_ms = 200;
    config.worker.poll_idle_ms = 20;
    config.retry.base_delay_ms = 50;
    config.retry.max_delay_ms = 1_000;
    config
}

fn terminate(mut child: Spawned) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Two workers, one SIGKILLed mid-run and restarted; then check everything.
async fn two_workers_survive_a_kill(example_file: &str) {
    two_workers_survive_a_kill_with(example_file, Duration::from_millis(300), |_| {}).await;
}

/// [`two_workers_survive_a_kill`] with the mock APIs' slow answers taking
/// `slow_for`, and the configuration changed by `tweak`.
async fn two_workers_survive_a_kill_with(example_file: &str, slow_for: Duration, tweak: impl FnOnce(&mut Config)) {
    survive(example_file, slow_for, tweak, Ordered::default()).await;
}

/// Ordered streams published beside the schedule, run by the
/// `record-sequence` plugin (which dead-letters a step that comes out of
/// order), and whether a third worker joins when the first is killed.
#[derive(Default, Clone, Copy)]
struct Ordered {
    streams: u32,
    steps: u32,
    third_joins: bool,
}

impl Ordered {
    fn messages(&self) -> u64 {
        u64::from(self.streams * self.steps)
    }
}

/// The run behind [`two_workers_survive_a_kill_with`].
async fn survive(example_file: &str, slow_for: Duration, tweak: impl FnOnce(&mut Config), ordered: Ordered) {
    let dir = tempfile::tempdir().unwrap();
    let mock = Mock::start(slow_for).await.unwrap();
    let mut config = config_from_example(example_file, dir.path(), &mock);
    tweak(&mut config);
    let config_path = dir.path().join("idem.toml");
    std::fs::write(&config_path, toml::to_string(&config).unwrap()).unwrap();
    idem_host::tools::chaos::prepare_broker(&config).await.unwrap();

    let backends = idem_host::backend::open(&config).await.unwrap();
    mock.watch_journal(backends.claims.clone());
    let schedule = Schedule::new(MESSAGES, 11, &mock);
    let logs: Vec<PathBuf> = (0..4).map(|i| dir.path().join(format!("worker-{i}.log"))).collect();
    let a = spawn_idem_run(&config_path, &logs[0]);
    let b = spawn_idem_run(&config_path, &logs[1]);
    let published = schedule.publish(backends.broker.as_ref()).await.unwrap();
    assert!(published > MESSAGES as u64);
    // Interleaved, as producers of many streams would publish.
    let steps: Vec<idem_host::envelope::Envelope> = (0..ordered.steps)
        .flat_map(|q| {
            (0..ordered.streams).map(move |s| {
                envelope(
                    &format!("st{s}-{q}"),
                    "record-sequence",
                    serde_json::json!({"stream": format!("st{s}"), "seq": q}),
                )
            })
        })
        .collect();
    for chunk in steps.chunks(100) {
        backends.broker.publish(chunk, Duration::ZERO).await.unwrap();
    }
    let total = MESSAGES as u64 + ordered.messages();

    // Kill A once a third of the messages are settled, at a moment it holds
    // claims: it dies with handlers in flight, mid external call or mid
    // write.
    let settled = || async {
        let c = backends.admin.counts().await.unwrap();
        c.done + c.dead
    };
    wait_until(Duration::from_secs(120), "a third of the messages to settle", || async {
        settled().await >= total / 3
    })
    .await;
    let mut a = a;
    kill_holding_claims(a.id(), &logs[0], "", backends.admin.as_ref()).await;
    a.wait().unwrap();
    let killed_at = settled().await;
    // B goes on alone for a while, then A comes back.
    wait_until(Duration::from_secs(120), "worker B to make progress alone", || async {
        settled().await >= killed_at + 200
    })
    .await;
    let a2 = spawn_idem_run(&config_path, &logs[2]);
    let third = ordered.third_joins.then(|| spawn_idem_run(&config_path, &logs[3]));

    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let c = backends.admin.counts().await.unwrap();
        let pending = backends.broker.pending().await.unwrap();
        if c.done + c.dead >= total && c.running == 0 && c.retry == 0 && pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "{example_file}: did not drain: {c:?}, pending {pending}\n--- worker 0\n{}\n--- worker 1\n{}\n--- worker 2\n{}",
                tail(&logs[0]),
                tail(&logs[1]),
                tail(&logs[2])
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    terminate(b);
    terminate(a2);
    if let Some(third) = third {
        terminate(third);
    }

    // What an operator sees.
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["stats", "--json", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["pending"], 0, "{stats}");
    assert_eq!(stats["in_flight"], 0, "{stats}");
    assert_eq!(stats["done"], total - 1, "{stats}");
    assert_eq!(stats["dead_lettered"], 1, "{stats}");
    if config.broker.kind == idem_host::config::BrokerKind::Kafka {
        // The group's lag per partition of the topic (four).
        let backlog = stats["backlog"].as_array().expect("a backlog per partition");
        assert_eq!(backlog.len(), 4, "{stats}");
        assert!(backlog.iter().all(|p| p[1] == 0), "{stats}");
    }

    let report = verify(&backends, &mock, &schedule).await.unwrap();
    eprintln!("{example_file}: published {published}, killed at {killed_at} settled: {report:?}");
    assert_eq!(report.lost, 0, "{example_file}: {report:?}");
    assert_eq!(report.double_effects, 0, "{example_file}: {report:?}");
    assert_eq!(report.calls_after_journal, 0, "{example_file}: {report:?}");
    assert_eq!(report.missing_effects, 0, "{example_file}: {report:?}");
    assert_eq!(report.effects, MESSAGES as u64 - 1, "{example_file}: {report:?}");
    let letters = backends.admin.dead_letters(100).await.unwrap();
    assert_eq!(letters.len(), 1, "only the poison message: {letters:?}");
    assert_eq!(letters[0].plugin, "poison");
    if ordered.streams > 0 {
        let last = backends.data.scan("sequences").await.unwrap();
        assert_eq!(last.len(), ordered.streams as usize, "{last:?}");
        for (stream, seq) in last {
            let seq: u64 = serde_json::from_slice(&seq).unwrap();
            assert_eq!(seq, u64::from(ordered.steps) - 1, "{stream} ran every step, in order");
        }
    }
    cleanup(&config).await;
}

/// Drop the test's namespace on the servers.
pub async fn cleanup(config: &Config) {
    use idem_host::config::{BrokerKind, StoreKind};
    let ns = &config.namespace;
    if config.claims.kind == StoreKind::Postgres || config.data.kind == StoreKind::Postgres {
        let pool = sqlx::PgPool::connect(&services::postgres()).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{ns}\" CASCADE")))
            .execute(&pool)
            .await
            .unwrap();
    }
    if config.broker.kind == BrokerKind::Rabbitmq {
        crate::broker_amqp::delete_namespace(ns).await.unwrap();
    }
    if config.broker.kind == BrokerKind::Sqs {
        idem_host::broker::sqs::SqsBroker::delete_queue(&idem_host::backend::sqs_options(config)).await;
    }
    if config.broker.kind == BrokerKind::Kafka {
        let options = idem_host::backend::kafka_options(config).unwrap();
        for topic in &options.topics {
            idem_host::broker::kafka::KafkaBroker::delete_topic(&options, topic).await;
        }
    }
    if config.broker.kind == BrokerKind::Nats {
        let client = async_nats::connect(services::nats()).await.unwrap();
        async_nats::jetstream::new(client).delete_stream(ns).await.unwrap();
    }
    if config.claims.kind == StoreKind::Redis || config.broker.kind == BrokerKind::Redis {
        let client = redis::Client::open(services::redis()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{ns}:*")).query_async(&mut conn).await.unwrap();
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL").arg(keys).query_async(&mut conn).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_postgres_two_workers_survive_sigkill() {
    two_workers_survive_a_kill("redis-postgres.toml").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_postgres_two_workers_survive_sigkill() {
    two_workers_survive_a_kill("rabbitmq-postgres.toml").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_postgres_two_workers_survive_sigkill() {
    two_workers_survive_a_kill("nats-postgres.toml").await;
}

/// The article's scenario on SQS: the visibility timeout (1 s) is shorter
/// than the slowest handlers (their API answers after 1.5 s) and than the
/// heartbeat that would extend it (2 s), so SQS hands running messages to
/// the other worker; the claims answer those deliveries busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_postgres_two_workers_survive_sigkill_with_a_visibility_shorter_than_handlers() {
    two_workers_survive_a_kill_with("sqs-postgres.toml", Duration::from_millis(1_500), |c| {
        c.broker.queue = Some(c.namespace.clone());
        c.broker.wait_secs = 1;
        c.worker.visibility_ms = 1_000;
        c.worker.heartbeat_ms = Some(2_000);
        c.worker.lease_ms = 6_000;
    })
    .await;
}

/// Kafka, four partitions: two workers, one SIGKILLed mid-run (its
/// partitions move when its session times out) and restarted while a third
/// joins (two more rebalances). Beside the schedule, 40 streams of 25
/// ordered steps keyed by stream: each stream's steps run in order, through
/// the kill and the rebalances (`record-sequence` dead-letters a step that
/// comes out of order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_postgres_workers_survive_sigkill_and_rebalances_keeping_key_order() {
    let ordered = Ordered {
        streams: 40,
        steps: 25,
        third_joins: true,
    };
    let tweak = |c: &mut Config| {
        c.broker.topics = vec![c.namespace.clone()];
        c.broker.group = None;
        c.broker.group_pointer = Some("/stream".into());
        c.plugins
            .insert("record-sequence".into(), plugin("record_sequence.wasm", &["sequences"], &[], None));
    };
    survive("kafka-postgres.toml", Duration::from_millis(300), tweak, ordered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_two_workers_survive_sigkill() {
    two_workers_survive_a_kill("embedded.toml").await;
}
