//! Helpers shared by the integration tests.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use idem_host::app::Pool;
use idem_host::claim::{ClaimAdmin, ClaimState};
use idem_host::config::{Config, Limits, OutagePolicy, PluginConfig, RetryConfig, WorkerConfig};
use idem_host::envelope::Envelope;
use idem_host::tools::kit::Mock;
use idem_host::worker::WorkerOptions;

/// Where `cargo xtask test` put the plugin components.
pub fn plugin_dir() -> PathBuf {
    let dir = std::env::var_os("IDEM_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugins/wasm32-wasip2/plugin"));
    assert!(
        dir.join("record_payment.wasm").exists(),
        "plugins not built in {}: run the tests with `cargo xtask test`",
        dir.display()
    );
    dir
}

/// One plugin's configuration.
pub fn plugin(file: &str, collections: &[&str], endpoints: &[&str], key: Option<&str>) -> PluginConfig {
    PluginConfig {
        path: plugin_dir().join(file),
        collections: collections.iter().map(|s| s.to_string()).collect(),
        endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
        key_pointer: key.map(str::to_string),
        celery_task: None,
        limits: None,
    }
}

/// A test environment: its own database directory and mock APIs.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub mock: Mock,
    pub config: Config,
}

impl Env {
    /// Requests the mock received for one step of one message: those that
    /// carried the step's `Idempotency-Key` in this environment's namespace.
    pub fn step_requests(&self, endpoint: &str, plugin: &str, key: &str, step: &str) -> u32 {
        let idem_key = idem_host::envelope::idempotency_key(&self.config.namespace, endpoint, plugin, key, step);
        self.mock.requests_for(&idem_key)
    }

    /// Every example plugin, granted what it needs, on a fresh database.
    pub async fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let mock = Mock::start(Duration::from_millis(700)).await.expect("mock");
        // The demo's deployment (every example plugin, endpoints at the
        // mock), with test-sized timings and the hostile plugin added.
        let mut config = idem_host::tools::demo::demo_config(dir.path().join("idem.db"), &plugin_dir(), &mock, 8);
        config.worker = WorkerConfig {
            concurrency: 8,
            batch_size: 16,
            lease_ms: 2_000,
            heartbeat_ms: Some(300),
            visibility_ms: 2_000,
            busy_retry_ms: 100,
            poll_idle_ms: 10,
            outage_policy: OutagePolicy::Reject,
            compile_cache_dir: Some(plugin_dir().join(".compiled")),
            ..WorkerConfig::default()
        };
        config.retry = RetryConfig {
            max_attempts: 5,
            max_traps: 2,
            base_delay_ms: 20,
            max_delay_ms: 500,
            jitter: 0.0,
        };
        config
            .plugins
            .insert("hostile".to_string(), plugin("hostile.wasm", &["hostile"], &[], None));
        config.limits = Limits {
            cpu_ms: 300,
            memory_bytes: 16 << 20,
            ..Limits::default()
        };
        Env { dir, mock, config }
    }

    /// Every example plugin, with claims and data in the test Postgres, in
    /// a fresh namespace named after `tag`.
    pub async fn on_postgres(tag: &str, max_connections: u32) -> Env {
        let mut env = Env::new().await;
        env.config.namespace = unique_namespace(tag);
        env.use_postgres(max_connections);
        env
    }

    /// Keep claims and data in the test Postgres (in the namespace's schema)
    /// instead of the SQLite file.
    pub fn use_postgres(&mut self, max_connections: u32) {
        let postgres = idem_host::config::StoreConfig {
            kind: idem_host::config::StoreKind::Postgres,
            url: Some(services::postgres()),
            max_connections,
        };
        self.config.claims = postgres.clone();
        self.config.data = postgres;
    }

    /// Claims in the test Redis, data in the test Postgres, fenced by the
    /// tokens the Redis claims hand out (as in examples/redis-postgres.toml).
    pub fn use_redis_claims_postgres_data(&mut self) {
        self.use_postgres(idem_host::config::StoreConfig::default().max_connections);
        self.config.claims = idem_host::config::StoreConfig {
            kind: idem_host::config::StoreKind::Redis,
            url: Some(services::redis()),
            ..Default::default()
        };
    }

    /// Start a pool with the environment's configuration.
    pub async fn start(&self) -> Pool {
        let pool = Pool::start(&self.config).await.expect("pool starts");
        self.mock.watch_journal(pool.backends.claims.clone());
        pool
    }

    /// Start a pool with adjusted worker options.
    pub async fn start_with(&self, f: impl FnOnce(&mut WorkerOptions)) -> Pool {
        let mut options = WorkerOptions::from_config(&self.config);
        f(&mut options);
        let pool = Pool::start_with(&self.config, options, Default::default())
            .await
            .expect("pool starts");
        self.mock.watch_journal(pool.backends.claims.clone());
        pool
    }
}

/// A real `idem run` process on `config`, logging at info to `log`.
pub fn spawn_idem_run(config: &std::path::Path, log: &std::path::Path) -> Spawned {
    Spawned(
        std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["run", "--config"])
            .arg(config)
            .env("IDEM_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("spawn idem run"),
    )
}

/// A process a test started: killed and reaped when dropped if it still
/// runs, so a test that fails half-way leaves no workers behind to take
/// the next tests' connections and CPU.
pub struct Spawned(pub std::process::Child);

impl std::ops::Deref for Spawned {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Spawned {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Run the `idem` binary with `--config config` after `args`; (success,
/// stdout, stderr).
pub fn idem(config: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A message.
pub fn envelope(id: &str, handler: &str, payload: serde_json::Value) -> Envelope {
    Envelope {
        id: id.into(),
        handler: handler.into(),
        headers: vec![],
        payload: serde_json::to_vec(&payload).unwrap(),
    }
}

/// Wait for a request the mock holds (`MockState::held`) to arrive, for at
/// most 30 s: `what` names it in the failure.
pub async fn wait_for_held(mock: &Mock, what: &str) {
    if tokio::time::timeout(Duration::from_secs(30), mock.wait_for_held()).await.is_err() {
        panic!("timed out after 30 s waiting for: {what}");
    }
}

/// Poll `check` until it returns true, or panic after `timeout` with `what`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Poll `check` until it returns a value, or panic after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The owner id (what its running claims carry) that a worker logged in
/// its `idem worker running` line, the first such line of `log` that
/// contains `tag` (a supervisor's log tags each process's lines
/// `[process K]`).
async fn logged_owner(log: &std::path::Path, tag: &str) -> String {
    wait_for(
        Duration::from_secs(60),
        &format!("an `idem worker running` line with {tag:?} in {}", log.display()),
        || async {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            assert!(!text.contains('\x1b'), "a log file holds no terminal colour codes:\n{text}");
            let line = text.lines().find(|l| l.contains("idem worker running") && l.contains(tag))?;
            let at = line.find("owner=")? + "owner=".len();
            line[at..].split_whitespace().next().map(str::to_string)
        },
    )
    .await
}

/// SIGKILL the worker process `pid`, which logs to `log` (its lines marked
/// with `tag`, or `""`), at a moment it holds running claims, so that a
/// test of a crash kills a worker in the middle of its work rather than
/// between two batches: stop it (SIGSTOP), count the running claims its
/// owner id (from its log) holds in the claim store, and kill it if there
/// are any; if not, let it go on (SIGCONT) and look again.
pub async fn kill_holding_claims(pid: u32, log: &std::path::Path, tag: &str, admin: &dyn ClaimAdmin) {
    let owner = logged_owner(log, tag).await;
    let signal = |sig: libc::c_int| {
        // SAFETY: kill(2) takes no pointers; `pid` is a worker process this
        // test started (itself or through a supervisor) and has not reaped.
        let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    };
    wait_until(
        Duration::from_secs(60),
        &format!("worker {owner} to hold running claims"),
        || async {
            signal(libc::SIGSTOP);
            let running = admin.claims_in(ClaimState::Running, None, 1_000_000).await.unwrap();
            let held = running.iter().any(|c| c.owner.as_deref() == Some(owner.as_str()));
            if !held {
                signal(libc::SIGCONT);
            }
            held
        },
    )
    .await;
    signal(libc::SIGKILL);
}

/// Wait until the queue is empty and nothing runs.
pub async fn drain(pool: &Pool) {
    wait_until(Duration::from_secs(30), "the queue to drain", || async {
        pool.backends.broker.pending().await.unwrap() == 0 && pool.worker.in_flight() == 0
    })
    .await;
}

/// The claim state of one key.
pub async fn state(pool: &Pool, plugin: &str, key: &str) -> Option<&'static str> {
    pool.backends.admin.state(plugin, key).await.unwrap().map(|s| s.as_str())
}

/// URLs of the real services the tests run against (`IDEM_TEST_*`, or the
/// ones `scripts/services.sh` checked or started).
pub mod services {
    fn var(name: &str, default: &str) -> String {
        std::env::var(name).unwrap_or_else(|_| default.to_string())
    }
    /// Postgres.
    pub fn postgres() -> String {
        var("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
    }
    /// Redis.
    pub fn redis() -> String {
        var("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379")
    }
    /// RabbitMQ.
    pub fn amqp() -> String {
        var("IDEM_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
    }
    /// NATS with JetStream (`scripts/services.sh` starts one, pinned).
    pub fn nats() -> String {
        var("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4223")
    }
    /// An SQS-compatible server (`scripts/services.sh` starts one), reached
    /// with the AWS credentials of the environment.
    pub fn sqs() -> String {
        var("IDEM_TEST_SQS_URL", "http://127.0.0.1:4566")
    }
    /// A Kafka-protocol server (`scripts/services.sh` starts one).
    pub fn kafka() -> String {
        var("IDEM_TEST_KAFKA_URL", "kafka://127.0.0.1:9092")
    }
}

/// A namespace no other test uses: tests share servers, never keys,
/// schemas, queues or streams.
pub fn unique_namespace(tag: &str) -> String {
    format!("t_{tag}_{}", uuid::Uuid::new_v4().simple().to_string().get(..12).unwrap())
}

/// What the broker tests share: envelopes, fetching until deliveries
/// arrive, and each server's connection and clean-up.
pub mod brokers {
    use std::fmt::Display;
    use std::future::Future;
    use std::time::{Duration, Instant};

    use futures::FutureExt;
    use idem_host::broker::amqp::AmqpBroker;
    use idem_host::broker::kafka::{KafkaBroker, KafkaOptions};
    use idem_host::broker::nats::NatsBroker;
    use idem_host::broker::redis::RedisBroker;
    use idem_host::broker::sqs::{SqsBroker, SqsOptions};
    use idem_host::broker::Broker;
    use idem_host::envelope::{Delivery, Envelope};

    use super::{services, unique_namespace, wait_for};

    /// How long the fetch helpers wait for deliveries before failing.
    pub const PATIENCE: Duration = Duration::from_secs(5);

    /// A message for handler `h` with one header, whose payload is its id.
    pub fn envelope(id: &str) -> Envelope {
        Envelope {
            id: id.into(),
            handler: "h".into(),
            headers: vec![("k".into(), "v".into())],
            payload: id.as_bytes().to_vec(),
        }
    }

    /// The envelope ids of `deliveries`, in order.
    pub fn ids(deliveries: &[Delivery]) -> Vec<&str> {
        deliveries.iter().map(|d| d.envelope.id.as_str()).collect()
    }

    /// The receipts of `deliveries`, in order.
    pub fn receipts(deliveries: &[Delivery]) -> Vec<&str> {
        deliveries.iter().map(|d| d.receipt.as_str()).collect()
    }

    /// Fetch until something comes, or panic after [`PATIENCE`] with `what`.
    pub async fn fetch_until(broker: &dyn Broker, max: usize, visibility: Duration, what: &str) -> Vec<Delivery> {
        wait_for(PATIENCE, what, || async {
            let got = broker.fetch(max, visibility).await.unwrap();
            (!got.is_empty()).then_some(got)
        })
        .await
    }

    /// Fetch until `n` deliveries came, never asking for more than are
    /// missing, or panic after [`PATIENCE`]: RabbitMQ pushes deliveries
    /// asynchronously, so one fetch right after a publish may see only some.
    pub async fn fetch_n(broker: &dyn Broker, n: usize, visibility: Duration, what: &str) -> Vec<Delivery> {
        let deadline = Instant::now() + PATIENCE;
        let mut got = Vec::new();
        while got.len() < n {
            assert!(Instant::now() < deadline, "timed out waiting for: {what} (got {:?})", ids(&got));
            let batch = broker.fetch(n - got.len(), visibility).await.unwrap();
            if batch.is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            got.extend(batch);
        }
        got
    }

    /// Run `body` with a fresh namespace (named after `tag`), then `delete`
    /// it, whether the body passed or panicked.
    pub async fn in_namespace<B, Fut, D, DFut, E>(tag: &str, body: B, delete: D)
    where
        B: FnOnce(String) -> Fut,
        Fut: Future<Output = ()>,
        D: FnOnce(String) -> DFut,
        DFut: Future<Output = Result<(), E>>,
        E: Display,
    {
        let namespace = unique_namespace(tag);
        let outcome = std::panic::AssertUnwindSafe(body(namespace.clone())).catch_unwind().await;
        let deleted = delete(namespace.clone()).await;
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
        deleted.unwrap_or_else(|e| panic!("deleting namespace {namespace}: {e}"));
    }

    /// A Redis broker on namespace `ns`.
    pub async fn redis(ns: &str) -> RedisBroker {
        RedisBroker::connect(&services::redis(), ns)
            .await
            .expect("Redis at IDEM_TEST_REDIS_URL (default 127.0.0.1:6379)")
    }

    /// A plain Redis connection, as another producer or an operator has.
    pub async fn redis_conn() -> redis::aio::MultiplexedConnection {
        redis::Client::open(services::redis())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Deletes a namespace's Redis broker keys when dropped, even when the
    /// test fails.
    pub struct RedisKeys(pub String);

    impl Drop for RedisKeys {
        fn drop(&mut self) {
            let deleted = redis::Client::open(services::redis())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| {
                    redis::cmd("DEL")
                        .arg(format!("{}:queue", self.0))
                        .arg(format!("{}:delayed", self.0))
                        .exec(&mut c)
                });
            if let Err(e) = deleted {
                eprintln!("cannot delete the test keys of namespace {}: {e}", self.0);
            }
        }
    }

    /// A RabbitMQ broker on namespace `ns`.
    pub async fn amqp(ns: &str) -> AmqpBroker {
        AmqpBroker::connect(&services::amqp(), ns)
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ at IDEM_TEST_AMQP_URL ({}): {e:#}", services::amqp()))
    }

    /// A plain AMQP connection, as another producer or an operator has.
    pub async fn amqp_raw() -> lapin::Connection {
        lapin::Connection::connect(&services::amqp(), lapin::ConnectionProperties::default())
            .await
            .expect("RabbitMQ for the test's own connection")
    }

    /// Delete a namespace's RabbitMQ queues and exchange.
    pub async fn delete_amqp_namespace(ns: &str) -> anyhow::Result<()> {
        AmqpBroker::delete_namespace(&services::amqp(), ns).await
    }

    /// Delete RabbitMQ queues, and the exchanges of the same names that
    /// Celery producers declare for them. Best effort.
    pub async fn delete_amqp_queues(names: &[String]) {
        use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
        let Ok(conn) = lapin::Connection::connect(&services::amqp(), lapin::ConnectionProperties::default()).await else {
            return;
        };
        for name in names {
            // A missing queue or exchange closes the channel: one each.
            if let Ok(ch) = conn.create_channel().await {
                let _ = ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await;
            }
            if let Ok(ch) = conn.create_channel().await {
                let _ = ch.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default()).await;
            }
        }
        let _ = conn.close(200, "OK".into()).await;
    }

    /// [`in_namespace`] for RabbitMQ: the queues and exchange are deleted.
    pub async fn in_amqp_namespace<B, Fut>(body: B)
    where
        B: FnOnce(String) -> Fut,
        Fut: Future<Output = ()>,
    {
        in_namespace("amqp", body, |ns| async move { delete_amqp_namespace(&ns).await }).await;
    }

    /// A NATS JetStream broker on namespace `ns` whose consumer's ack wait
    /// (its visibility timeout) is `ack_wait`.
    pub async fn nats(ns: &str, ack_wait: Duration) -> NatsBroker {
        NatsBroker::connect(&services::nats(), ns, ack_wait)
            .await
            .unwrap_or_else(|e| panic!("NATS with JetStream at {}: {e:#}", services::nats()))
    }

    /// The options of an SQS broker on queue `queue` of the test server,
    /// receiving without waiting (the suite's checks that nothing is due
    /// must not wait for what becomes due meanwhile).
    pub fn sqs_options(queue: &str) -> SqsOptions {
        SqsOptions {
            endpoint: Some(services::sqs()),
            region: None,
            queue: queue.to_string(),
            wait_secs: 0,
            max_attempts: 5,
            max_retry_delay_ms: 60_000,
            group_pointer: None,
            key_pointers: Default::default(),
        }
    }

    /// An SQS broker with these options.
    pub async fn sqs(options: &SqsOptions) -> SqsBroker {
        SqsBroker::connect(options.clone())
            .await
            .unwrap_or_else(|e| panic!("SQS at IDEM_TEST_SQS_URL ({}): {e:#}", services::sqs()))
    }

    /// [`in_namespace`] for SQS: a queue named after the namespace (FIFO
    /// when `fifo`) is created first and deleted after.
    pub async fn in_sqs_queue<B, Fut>(fifo: bool, body: B)
    where
        B: FnOnce(String) -> Fut,
        Fut: Future<Output = ()>,
    {
        in_namespace(
            "sqs",
            |ns| async move {
                let queue = if fifo { format!("{ns}.fifo") } else { ns };
                SqsBroker::create_queue(&sqs_options(&queue), &[])
                    .await
                    .unwrap_or_else(|e| panic!("SQS at IDEM_TEST_SQS_URL ({}): {e:#}", services::sqs()));
                body(queue).await
            },
            |ns| async move {
                for queue in [format!("{ns}.fifo"), ns] {
                    SqsBroker::delete_queue(&sqs_options(&queue)).await;
                }
                Ok::<(), String>(())
            },
        )
        .await;
    }

    /// The options of a Kafka broker on topic `topic` of the test server,
    /// in consumer group `topic`.
    pub fn kafka_options(topic: &str, ordering: idem_host::config::KafkaOrdering) -> KafkaOptions {
        let url = services::kafka();
        KafkaOptions {
            servers: url.strip_prefix("kafka://").unwrap_or(&url).to_string(),
            topics: vec![topic.to_string()],
            group: topic.to_string(),
            ordering,
            grace: Duration::from_secs(10),
            key_pointer: None,
            key_pointers: Default::default(),
        }
    }

    /// A Kafka broker with these options, a member of its group (joining
    /// takes seconds on the test server, longer than the fetch helpers
    /// wait).
    pub async fn kafka(options: &KafkaOptions) -> KafkaBroker {
        let broker = KafkaBroker::connect(options.clone())
            .await
            .unwrap_or_else(|e| panic!("Kafka at IDEM_TEST_KAFKA_URL ({}): {e:#}", services::kafka()));
        broker
            .join_group(Duration::from_secs(60))
            .await
            .expect("joining the consumer group");
        broker
    }

    /// [`in_namespace`] for Kafka: a topic named after the namespace, with
    /// `partitions` partitions, is created first and deleted after. Each
    /// test has its own topic and consumer group.
    pub async fn in_kafka_topic<B, Fut>(partitions: i32, body: B)
    where
        B: FnOnce(String) -> Fut,
        Fut: Future<Output = ()>,
    {
        use idem_host::config::KafkaOrdering;
        in_namespace(
            "kafka",
            |ns| async move {
                KafkaBroker::create_topic(&kafka_options(&ns, KafkaOrdering::Key), &ns, partitions)
                    .await
                    .unwrap_or_else(|e| panic!("Kafka at IDEM_TEST_KAFKA_URL ({}): {e:#}", services::kafka()));
                body(ns).await
            },
            |ns| async move {
                KafkaBroker::delete_topic(&kafka_options(&ns, KafkaOrdering::Key), &ns).await;
                Ok::<(), String>(())
            },
        )
        .await;
    }

    /// [`in_namespace`] for NATS: the stream is deleted.
    pub async fn in_nats_namespace<B, Fut>(body: B)
    where
        B: FnOnce(String) -> Fut,
        Fut: Future<Output = ()>,
    {
        in_namespace("nats", body, |ns| async move {
            let client = async_nats::connect(services::nats()).await.expect("NATS for cleanup");
            async_nats::jetstream::new(client).delete_stream(&ns).await.map(|_| ())
        })
        .await;
    }
}
