//! Configuration: one TOML file, every setting with a default.
//!
//! With no file at all Idem runs on the embedded SQLite backend
//! (`idem.db` in the working directory), which is what `idem run` and
//! `idem demo` use out of the box. See docs/configuration.md for what each
//! setting is for and when to change it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

mod changes;
mod load;
mod worker;

pub use changes::restart_only_changes;
pub(crate) use changes::{changed_settings, take_reloadable};
pub use worker::{OutagePolicy, Processes, WorkerConfig, REDIS_MAX_VISIBILITY_MS};

/// The whole configuration file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Names this deployment's resources: the Postgres schema, the Redis
    /// key prefix, the RabbitMQ queue names, the NATS stream. Workers that
    /// share a queue share a namespace.
    pub namespace: String,
    /// Where deliveries come from.
    pub broker: BrokerConfig,
    /// Where claims, the effect journal and dead letters live.
    pub claims: StoreConfig,
    /// Where plugin data lives.
    pub data: StoreConfig,
    /// The embedded SQLite file (used by every role whose kind is `sqlite`).
    pub database: DatabaseConfig,
    /// Worker pool: concurrency, leases, heartbeat.
    pub worker: WorkerConfig,
    /// Retry policy for transient failures and traps.
    pub retry: RetryConfig,
    /// Sandbox limits applied to every plugin unless the plugin overrides them.
    pub limits: Limits,
    /// External endpoints, by name, that plugins may be granted.
    pub endpoints: BTreeMap<String, EndpointConfig>,
    /// Loaded plugins, by name (the name messages are published to).
    pub plugins: BTreeMap<String, PluginConfig>,
    /// The HTTP endpoint of `idem run`: metrics, health, loaded plugins.
    pub http: HttpConfig,
    /// How long settled claims (the duplicate window) and dead letters are kept.
    pub retention: RetentionConfig,
}

/// `[retention]`: what the pool's sweeper removes, and how often.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// How long a settled claim (done or dead) and its journal are kept:
    /// the duplicate-detection window. A duplicate delivered later than
    /// this after its message settled runs again. Default 7 days.
    pub done_ms: u64,
    /// How long dead letters are kept; unset = until purged (`idem dlq`).
    pub dead_letters_ms: Option<u64>,
    /// How often each worker pool sweeps.
    pub sweep_every_ms: u64,
    /// Most claims (and most dead letters) removed per sweep statement;
    /// a sweep repeats until less than this is left.
    pub sweep_batch: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            done_ms: 7 * 24 * 3600 * 1000,
            dead_letters_ms: None,
            sweep_every_ms: 60_000,
            sweep_batch: 500,
        }
    }
}

/// `[http]`: where `idem run` serves `/metrics`, `/healthz`, `/readyz`,
/// `/plugins` and the console (`/console`), and how the console is guarded.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address to listen on, e.g. `127.0.0.1:9464`; off when unset.
    /// `idem run --listen ADDR` overrides it.
    pub listen: Option<String>,
    /// The console's token (a bearer token, or typed into its login form).
    /// Required to serve the console on an address other than loopback;
    /// `IDEM_HTTP_TOKEN` overrides it.
    pub token: Option<Secret>,
    /// Console without replay and purge: every action is refused.
    pub read_only: bool,
}

/// A setting that is never printed (`Debug` shows `***`).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: "idem".into(),
            broker: BrokerConfig::default(),
            claims: StoreConfig::default(),
            data: StoreConfig::default(),
            database: DatabaseConfig::default(),
            worker: WorkerConfig::default(),
            retry: RetryConfig::default(),
            limits: Limits::default(),
            endpoints: BTreeMap::new(),
            plugins: BTreeMap::new(),
            http: HttpConfig::default(),
            retention: RetentionConfig::default(),
        }
    }
}

/// Which broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BrokerKind {
    /// A queue table in the embedded SQLite file.
    #[default]
    Sqlite,
    /// Redis Streams with a consumer group.
    Redis,
    /// RabbitMQ (AMQP 0.9.1).
    Rabbitmq,
    /// NATS JetStream, durable pull consumer.
    Nats,
    /// Celery tasks on Celery's Redis or AMQP (RabbitMQ) transport,
    /// answered through Celery's Redis result backend.
    Celery,
    /// Amazon SQS (standard or FIFO queue), or an SQS-compatible server.
    Sqs,
    /// Kafka topics, consumed by a consumer group.
    Kafka,
}

/// Kafka: which records of a partition may run at the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KafkaOrdering {
    /// Records with different keys run concurrently; records of one key
    /// run in order, retries included.
    #[default]
    Key,
    /// One record of a partition at a time, in offset order.
    Partition,
    /// No order: every record may run at once.
    None,
}

/// `[broker]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// `sqlite` (default), `redis`, `rabbitmq`, `nats`, `celery`, `sqs` or
    /// `kafka`.
    pub kind: BrokerKind,
    /// Server URL, e.g. `redis://127.0.0.1:6379`,
    /// `amqp://guest:guest@127.0.0.1:5672/%2f`, `nats://127.0.0.1:4222`.
    /// SQS: an endpoint other than AWS's own (a local SQS-compatible
    /// server); unset: AWS's endpoint for the region. Kafka: the bootstrap
    /// servers, `kafka://host:port[,host:port…]`.
    pub url: Option<String>,
    /// SQS: the queue's name or URL (a name ending in `.fifo` is a FIFO
    /// queue). Unset: the namespace. Idem does not create it.
    pub queue: Option<String>,
    /// SQS: the AWS region. Unset: the environment's (`AWS_REGION`, the
    /// profile), or `us-east-1` with a `url` of a local server.
    pub region: Option<String>,
    /// SQS: how long a receive waits for messages when the queue is empty
    /// (long polling), 0 to 20 seconds. Longer waits make fewer empty
    /// receives; a stopping worker waits for its receive to end.
    pub wait_secs: u64,
    /// SQS FIFO and Kafka: JSON pointer into the payload whose value
    /// orders messages: the FIFO message group, or the Kafka record key
    /// `idem publish` gives (messages of one group or key run in order).
    /// Unset: the plugin's `key_pointer`, else the message id (no order
    /// across messages).
    pub group_pointer: Option<String>,
    /// Celery: the queues consumed (the first is where `idem publish`
    /// sends). Only tasks in these queues are taken.
    pub queues: Vec<String>,
    /// Celery: the Redis result backend results are written to (Celery's
    /// `result_backend`). Unset: the broker's URL if it is Redis, else
    /// none. `""`: write no results.
    pub result_backend: Option<String>,
    /// Celery: how long results are kept, in seconds (Celery's
    /// `result_expires`, one day by default).
    pub result_expires_secs: u64,
    /// Kafka: the topics consumed (the first is where `idem publish`
    /// sends). Unset: one topic named as the namespace. Idem does not
    /// create them.
    pub topics: Vec<String>,
    /// Kafka: the consumer group. Unset: the namespace.
    pub group: Option<String>,
    /// Kafka: `key` (default), `partition` or `none`.
    pub ordering: KafkaOrdering,
    /// Kafka: how long a revoked partition's running deliveries may take
    /// to settle before the partition is handed over, in ms.
    pub rebalance_grace_ms: u64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            kind: BrokerKind::default(),
            url: None,
            queues: vec!["celery".into()],
            result_backend: None,
            result_expires_secs: 86_400,
            queue: None,
            region: None,
            wait_secs: 5,
            group_pointer: None,
            topics: Vec::new(),
            group: None,
            ordering: KafkaOrdering::default(),
            rebalance_grace_ms: 10_000,
        }
    }
}

/// Which store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// The embedded SQLite file.
    #[default]
    Sqlite,
    /// PostgreSQL.
    Postgres,
    /// Redis (claims only).
    Redis,
}

/// `[claims]` and `[data]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite` (default), `postgres`, or `redis` (claims only).
    pub kind: StoreKind,
    /// Server URL, e.g. `postgres://user@127.0.0.1:5432/db`.
    pub url: Option<String>,
    /// Connections in the pool (Postgres).
    pub max_connections: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Sqlite,
            url: None,
            max_connections: 16,
        }
    }
}

impl StoreConfig {
    /// The URL, or an error naming the setting.
    pub fn url(&self, section: &str) -> Result<&str> {
        self.url
            .as_deref()
            .with_context(|| format!("[{section}] kind = {:?} needs a url: set {section}.url", self.kind))
    }
}

impl BrokerConfig {
    /// The URL, or an error naming the setting.
    pub fn url(&self) -> Result<&str> {
        self.url
            .as_deref()
            .with_context(|| format!("[broker] kind = {:?} needs a url: set broker.url", self.kind))
    }
}

/// The embedded SQLite database.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// Path of the SQLite file (created if missing).
    pub path: PathBuf,
    /// Connections in the pool.
    pub max_connections: u32,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            path: PathBuf::from("idem.db"),
            max_connections: 8,
        }
    }
}

/// Retries of transient failures and traps.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Executions before a message that keeps failing is dead-lettered
    /// (counted at claim time, so a message that kills its worker counts).
    pub max_attempts: u32,
    /// Traps (sandbox violations, panics) before the message is
    /// dead-lettered, even if attempts remain.
    pub max_traps: u32,
    /// First retry delay.
    pub base_delay_ms: u64,
    /// Upper bound of a retry delay.
    pub max_delay_ms: u64,
    /// Fraction of each delay that is randomised (0 = none, 1 = full jitter).
    pub jitter: f64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 5,
            max_traps: 2,
            base_delay_ms: 500,
            max_delay_ms: 300_000,
            jitter: 0.5,
        }
    }
}

/// Sandbox limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Guest time per execution, in milliseconds: epoch ticks counted
    /// while guest code runs (a tick spent in a host call is not counted).
    pub cpu_ms: u64,
    /// Wall-clock time per execution, host calls included.
    pub timeout_ms: u64,
    /// Linear memory per instance, in bytes.
    pub memory_bytes: u64,
    /// Largest accepted message payload.
    pub max_payload_bytes: usize,
    /// Largest value a handler may store, and largest journaled response.
    pub max_value_bytes: usize,
    /// Log lines kept per execution; more are dropped and counted.
    pub max_log_lines: u32,
    /// Longest log line kept; longer ones are truncated.
    pub max_log_line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_ms: 2_000,
            timeout_ms: 300_000,
            memory_bytes: 64 << 20,
            max_payload_bytes: 1 << 20,
            max_value_bytes: 1 << 20,
            max_log_lines: 100,
            max_log_line_bytes: 4096,
        }
    }
}

/// An external endpoint a plugin may call through `effects.call`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// URL the request is POSTed to.
    pub url: String,
    /// Per-request timeout.
    #[serde(default = "default_endpoint_timeout")]
    pub timeout_ms: u64,
}

fn default_endpoint_timeout() -> u64 {
    10_000
}

/// One plugin.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// The component file (`.wasm`), relative to the config file.
    pub path: PathBuf,
    /// Collections the plugin may read and write.
    #[serde(default)]
    pub collections: Vec<String>,
    /// Endpoints (names from `[endpoints]`) the plugin may call.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// JSON pointer into the payload that yields the idempotency key (e.g.
    /// `/payment_id`); the message id when unset.
    #[serde(default)]
    pub key_pointer: Option<String>,
    /// With the `celery` broker: the Celery task name this plugin serves
    /// (e.g. `billing.record_payment`).
    #[serde(default)]
    pub celery_task: Option<String>,
    /// Overrides of the global sandbox limits; unset fields keep the
    /// global value.
    #[serde(default)]
    pub limits: Option<LimitsOverride>,
}

/// Per-plugin limits: each set field replaces the global one.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsOverride {
    /// See [`Limits::cpu_ms`].
    pub cpu_ms: Option<u64>,
    /// See [`Limits::timeout_ms`].
    pub timeout_ms: Option<u64>,
    /// See [`Limits::memory_bytes`].
    pub memory_bytes: Option<u64>,
    /// See [`Limits::max_payload_bytes`].
    pub max_payload_bytes: Option<usize>,
    /// See [`Limits::max_value_bytes`].
    pub max_value_bytes: Option<usize>,
    /// See [`Limits::max_log_lines`].
    pub max_log_lines: Option<u32>,
    /// See [`Limits::max_log_line_bytes`].
    pub max_log_line_bytes: Option<usize>,
}

impl LimitsOverride {
    /// `base` with this override's set fields.
    pub fn apply(&self, base: &Limits) -> Limits {
        Limits {
            cpu_ms: self.cpu_ms.unwrap_or(base.cpu_ms),
            timeout_ms: self.timeout_ms.unwrap_or(base.timeout_ms),
            memory_bytes: self.memory_bytes.unwrap_or(base.memory_bytes),
            max_payload_bytes: self.max_payload_bytes.unwrap_or(base.max_payload_bytes),
            max_value_bytes: self.max_value_bytes.unwrap_or(base.max_value_bytes),
            max_log_lines: self.max_log_lines.unwrap_or(base.max_log_lines),
            max_log_line_bytes: self.max_log_line_bytes.unwrap_or(base.max_log_line_bytes),
        }
    }
}
