//! Helpers shared by the integration tests.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use idem_host::app::Pool;
use idem_host::config::{Config, Limits, OutagePolicy, PluginConfig, RetryConfig, WorkerConfig};
use idem_host::demo::mock::Mock;
use idem_host::envelope::Envelope;
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
    /// Every example plugin, granted what it needs, on a fresh database.
    pub async fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let mock = Mock::start(Duration::from_millis(700)).await.expect("mock");
        // The demo's deployment (every example plugin, endpoints at the
        // mock), with test-sized timings and the hostile plugin added.
        let mut config = idem_host::demo::demo_config(dir.path().join("idem.db"), &plugin_dir(), &mock, 8);
        config.worker = WorkerConfig {
            concurrency: 8,
            batch_size: 16,
            lease_ms: 2_000,
            heartbeat_ms: Some(300),
            visibility_ms: 2_000,
            busy_retry_ms: 100,
            poll_idle_ms: 10,
            outage_policy: OutagePolicy::Reject,
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

    /// Start a pool with the environment's configuration.
    pub async fn start(&self) -> Pool {
        let pool = Pool::start(&self.config, None).await.expect("pool starts");
        self.mock.watch_journal(pool.backends.claims.clone());
        pool
    }

    /// Start a pool with adjusted worker options.
    pub async fn start_with(&self, f: impl FnOnce(&mut WorkerOptions)) -> Pool {
        let mut options = WorkerOptions::from_config(&self.config);
        f(&mut options);
        let pool = Pool::start_with(&self.config, options, None).await.expect("pool starts");
        self.mock.watch_journal(pool.backends.claims.clone());
        pool
    }
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

/// Wait until the queue is empty and nothing runs.
pub async fn drain(pool: &Pool) {
    wait_until(Duration::from_secs(30), "the queue to drain", || async {
        pool.backends.broker.pending().await.unwrap() == 0 && pool.worker.in_flight() == 0
    })
    .await;
}

/// The claim state of one key.
pub async fn state(pool: &Pool, plugin: &str, key: &str) -> Option<String> {
    pool.backends.claims.state(plugin, key).await.unwrap()
}

/// URLs of the real services the tests run against (the machine's own, or
/// the ones `.ci/run` started).
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
    /// NATS with JetStream.
    pub fn nats() -> String {
        var("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222")
    }
}

/// A namespace no other test uses: tests share servers, never keys,
/// schemas, queues or streams.
pub fn unique_namespace(tag: &str) -> String {
    format!("t_{tag}_{}", uuid::Uuid::new_v4().simple().to_string().get(..12).unwrap())
}
