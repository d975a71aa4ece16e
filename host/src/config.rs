//! Configuration: one TOML file, every setting with a default.
//!
//! With no file at all Idem runs on the embedded SQLite backend
//! (`idem.db` in the working directory), which is what `idem run` and
//! `idem demo` use out of the box. See docs/configuration.md for what each
//! setting is for and when to change it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

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
}

/// `[http]`: where `idem run` serves `/metrics`, `/healthz`, `/readyz` and
/// `/plugins`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address to listen on, e.g. `0.0.0.0:9464`; off when unset.
    /// `idem run --listen ADDR` overrides it.
    pub listen: Option<String>,
}

/// A URL with its password replaced by `***`, for error messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.find(':') {
                Some(colon) => format!("{}{}:***{}", &url[..scheme + 3], &creds[..colon], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
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
}

/// `[broker]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// `sqlite` (default), `redis`, `rabbitmq` or `nats`.
    pub kind: BrokerKind,
    /// Server URL, e.g. `redis://127.0.0.1:6379`,
    /// `amqp://guest:guest@127.0.0.1:5672/%2f`, `nats://127.0.0.1:4222`.
    pub url: Option<String>,
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

/// The worker pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Handlers running at once in this process.
    pub concurrency: usize,
    /// Deliveries fetched (and claimed) per round trip.
    pub batch_size: usize,
    /// How long a claim is owned without a heartbeat. Set it well above the
    /// handler's p99 duration; the heartbeat extends it while a handler runs.
    pub lease_ms: u64,
    /// How often in-flight claims (and broker deliveries) are extended.
    /// Default: a third of the lease.
    pub heartbeat_ms: Option<u64>,
    /// How long a fetched delivery stays invisible to other consumers before
    /// the broker redelivers it.
    pub visibility_ms: u64,
    /// When a delivery finds its key busy, how long until it is redelivered.
    pub busy_retry_ms: u64,
    /// How long to wait before polling again when the queue is empty.
    pub poll_idle_ms: u64,
    /// What to do when the claim store is unreachable (G8): `reject` leaves
    /// the delivery unacked and backs off.
    pub outage_policy: OutagePolicy,
    /// On SIGTERM/SIGINT, how long running handlers may take to finish
    /// before they are stopped, their claims released and their deliveries
    /// handed back for redelivery.
    pub shutdown_grace_ms: u64,
    /// Watch the plugin files and reload a changed component while running.
    /// SIGHUP reloads whether or not this is on.
    pub watch_plugins: bool,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 16,
            batch_size: 32,
            lease_ms: 30_000,
            heartbeat_ms: None,
            visibility_ms: 60_000,
            busy_retry_ms: 1_000,
            poll_idle_ms: 50,
            outage_policy: OutagePolicy::Reject,
            shutdown_grace_ms: 30_000,
            watch_plugins: true,
        }
    }
}

impl WorkerConfig {
    /// The lease as a duration.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
    /// The heartbeat interval: the configured one, or a third of the lease.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms.unwrap_or(self.lease_ms / 3).max(1))
    }
    /// The visibility timeout as a duration.
    pub fn visibility(&self) -> Duration {
        Duration::from_millis(self.visibility_ms)
    }
}

/// G8: what to do when the claim store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutagePolicy {
    /// Leave the delivery unacked and back off (default).
    Reject,
    /// Run the handler without a claim. Only for plugins whose effects are
    /// all naturally idempotent.
    RunUnguarded,
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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

impl Config {
    /// Read and check a config file; relative plugin paths are resolved
    /// against the file's directory. Environment variables override:
    /// `IDEM_DATABASE_PATH`, `IDEM_WORKER_CONCURRENCY`.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}: check the --config path", path.display()))?;
        let mut config: Config = toml::from_str(&text).with_context(|| format!("config file {} is not valid", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        for plugin in config.plugins.values_mut() {
            if plugin.path.is_relative() {
                plugin.path = base.join(&plugin.path);
            }
        }
        if config.database.path.is_relative() && !base.as_os_str().is_empty() {
            config.database.path = base.join(&config.database.path);
        }
        config.apply_env()?;
        config.validate()?;
        Ok(config)
    }

    /// Apply `IDEM_*` environment overrides.
    pub fn apply_env(&mut self) -> Result<()> {
        if let Ok(v) = std::env::var("IDEM_NAMESPACE") {
            self.namespace = v;
        }
        if let Ok(v) = std::env::var("IDEM_BROKER_URL") {
            self.broker.url = Some(v);
        }
        if let Ok(v) = std::env::var("IDEM_CLAIMS_URL") {
            self.claims.url = Some(v);
        }
        if let Ok(v) = std::env::var("IDEM_DATA_URL") {
            self.data.url = Some(v);
        }
        if let Ok(v) = std::env::var("IDEM_DATABASE_PATH") {
            self.database.path = PathBuf::from(v);
        }
        if let Ok(v) = std::env::var("IDEM_WORKER_CONCURRENCY") {
            self.worker.concurrency = v
                .parse()
                .with_context(|| format!("IDEM_WORKER_CONCURRENCY={v:?} is not a number"))?;
        }
        Ok(())
    }

    /// Check the settings that would otherwise fail later and less clearly.
    pub fn validate(&self) -> Result<()> {
        let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
        if self.namespace.is_empty() || self.namespace.len() > 48 || !self.namespace.chars().all(valid) {
            bail!(
                "namespace must be 1 to 48 lowercase letters, digits and '_' (it names a Postgres schema, Redis keys, queues and streams), got {:?}",
                self.namespace
            );
        }
        match (self.claims.kind, self.data.kind) {
            (StoreKind::Redis, StoreKind::Redis) | (_, StoreKind::Redis) => {
                bail!("data.kind = \"redis\" is not supported: plugin data lives in sqlite or postgres")
            }
            (StoreKind::Sqlite, StoreKind::Postgres) | (StoreKind::Postgres, StoreKind::Sqlite) | (StoreKind::Redis, StoreKind::Sqlite) => {
                bail!(
                    "claims.kind = {:?} with data.kind = {:?} is not supported: use the same database for both, or redis claims with postgres data",
                    self.claims.kind,
                    self.data.kind
                )
            }
            _ => {}
        }
        if self.broker.kind != BrokerKind::Sqlite {
            self.broker.url()?;
        }
        if self.claims.kind != StoreKind::Sqlite {
            self.claims.url("claims")?;
        }
        if self.data.kind != StoreKind::Sqlite {
            self.data.url("data")?;
        }
        if self.worker.concurrency == 0 {
            bail!("worker.concurrency must be at least 1");
        }
        if self.worker.batch_size == 0 {
            bail!("worker.batch_size must be at least 1");
        }
        if self.worker.heartbeat() >= self.worker.lease() && self.worker.heartbeat_ms.is_some() {
            tracing::warn!(
                "worker.heartbeat_ms ({}) is not below worker.lease_ms ({}): leases of long handlers will expire and be taken over",
                self.worker.heartbeat().as_millis(),
                self.worker.lease_ms
            );
        }
        if self.worker.heartbeat() >= self.worker.visibility() {
            tracing::warn!(
                "worker.heartbeat_ms ({}) is not below worker.visibility_ms ({}): the broker will redeliver running messages (they are answered busy, but it costs round trips)",
                self.worker.heartbeat().as_millis(),
                self.worker.visibility_ms
            );
        }
        if self.retry.max_attempts == 0 {
            bail!("retry.max_attempts must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.retry.jitter) {
            bail!("retry.jitter must be between 0 and 1, got {}", self.retry.jitter);
        }
        for (name, plugin) in &self.plugins {
            for endpoint in &plugin.endpoints {
                if !self.endpoints.contains_key(endpoint) {
                    bail!(
                        "plugins.{name}.endpoints grants {endpoint:?}, which is not defined: add an [endpoints.{endpoint}] section with its url"
                    );
                }
            }
            if let Some(pointer) = &plugin.key_pointer {
                if !pointer.starts_with('/') {
                    bail!("plugins.{name}.key_pointer must be a JSON pointer starting with '/', got {pointer:?}");
                }
            }
        }
        Ok(())
    }

    /// The limits for one plugin.
    pub fn limits_for(&self, plugin: &str) -> Limits {
        match self.plugins.get(plugin).and_then(|p| p.limits.as_ref()) {
            Some(o) => o.apply(&self.limits),
            None => self.limits.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("amqp://guest:secret@h:5672/%2f"), "amqp://guest:***@h:5672/%2f");
        assert_eq!(redact("postgres://postgres@h/db"), "postgres://postgres@h/db");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
    }

    #[test]
    fn plugin_limits_override_only_what_they_set() {
        let text = r#"
            [limits]
            cpu_ms = 500
            max_log_lines = 7
            [plugins.a]
            path = "a.wasm"
            [plugins.a.limits]
            cpu_ms = 900
        "#;
        let config: Config = toml::from_str(text).unwrap();
        let a = config.limits_for("a");
        assert_eq!(a.cpu_ms, 900);
        assert_eq!(a.max_log_lines, 7, "unset fields keep the global value");
        assert_eq!(config.limits_for("other").cpu_ms, 500);
    }

    #[test]
    fn unknown_settings_are_refused_by_name() {
        let err = toml::from_str::<Config>("[worker]\nconcurency = 2\n").unwrap_err().to_string();
        assert!(err.contains("concurency"), "{err}");
    }
}
