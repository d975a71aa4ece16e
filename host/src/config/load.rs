//! Reading a configuration: the file, then `IDEM_*` overrides, then
//! validation with errors that name the setting and the fix.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::*;

impl Config {
    /// Read and check a config file; relative plugin paths are resolved
    /// against the file's directory. Environment variables override:
    /// `IDEM_DATABASE_PATH`, `IDEM_WORKER_CONCURRENCY`, `IDEM_HTTP_TOKEN`, ….
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}: check the --config path", path.display()))?;
        let mut config: Config = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!(parse_error(&text, &e)))
            .with_context(|| format!("config file {} is not valid", path.display()))?;
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
        if let Ok(v) = std::env::var("IDEM_HTTP_TOKEN") {
            self.http.token = Some(super::Secret(v));
        }
        if let Ok(v) = std::env::var("IDEM_DATABASE_PATH") {
            self.database.path = PathBuf::from(v);
        }
        if let Ok(v) = std::env::var("IDEM_WORKER_CONCURRENCY") {
            self.worker.concurrency = v
                .parse()
                .with_context(|| format!("IDEM_WORKER_CONCURRENCY={v:?} is not a number"))?;
        }
        if let Ok(v) = std::env::var("IDEM_WORKER_PROCESSES") {
            self.worker.processes = v.parse().map_err(|e: String| anyhow::anyhow!("IDEM_WORKER_PROCESSES: {e}"))?;
        }
        Ok(())
    }

    /// Check the settings that would otherwise fail later and less clearly.
    pub fn validate(&self) -> Result<()> {
        if let Some(token) = &self.http.token {
            if token.0.chars().count() < 16 {
                bail!("http.token (or IDEM_HTTP_TOKEN) is shorter than 16 characters: the console's token must not be guessable; use a long random one, e.g. `openssl rand -hex 24`");
            }
        }
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
        // SQS without a url is AWS's own endpoint for the region.
        if !matches!(self.broker.kind, BrokerKind::Sqlite | BrokerKind::Sqs) {
            check_broker_url(self.broker.kind, self.broker.url()?)?;
        }
        if self.broker.kind == BrokerKind::Sqs {
            if self.broker.wait_secs > 20 {
                bail!(
                    "broker.wait_secs = {} is over SQS's longest wait: set 0 to 20",
                    self.broker.wait_secs
                );
            }
            if self.worker.visibility_ms > 43_200_000 {
                bail!(
                    "worker.visibility_ms = {} is over SQS's longest visibility (12 hours): lower it",
                    self.worker.visibility_ms
                );
            }
        }
        if let Some(p) = self.broker.group_pointer.as_deref().filter(|p| !p.starts_with('/')) {
            bail!("broker.group_pointer = {p:?} is not a JSON pointer: write it as /field or /field/sub");
        }
        if self.broker.kind == BrokerKind::Kafka {
            let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
            for t in &self.broker.topics {
                if t.is_empty() || t.len() > 249 || !t.chars().all(legal) {
                    bail!("broker.topics: {t:?} is not a Kafka topic name (1 to 249 letters, digits, '.', '_' and '-')");
                }
            }
            if self.broker.group.as_deref() == Some("") {
                bail!("broker.group is empty: name the consumer group, or leave it unset for the namespace");
            }
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
        if self.worker.prefetch == 0 {
            bail!("worker.prefetch must be at least 1 (messages held per handler slot)");
        }
        if self.worker.batch_size == 0 {
            bail!("worker.batch_size must be at least 1");
        }
        if self.worker.processes.count() == 0 {
            bail!("worker.processes must be at least 1, or \"auto\" for one per CPU");
        }
        if self.worker.start_timeout_ms == 0 {
            bail!("worker.start_timeout_ms must be at least 1: how long a worker process may take to start serving");
        }
        self.validate_timings_and_limits()?;
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
        let r = &self.retention;
        if r.done_ms < self.worker.lease_ms.saturating_add(self.retry.max_delay_ms) {
            bail!(
                "retention.done_ms ({}) must be at least worker.lease_ms + retry.max_delay_ms ({}): a duplicate delivered within a lease or a retry delay of its message settling would run again; the default keeps settled claims 7 days",
                r.done_ms,
                self.worker.lease_ms.saturating_add(self.retry.max_delay_ms)
            );
        }
        if r.dead_letters_ms == Some(0) || r.sweep_every_ms == 0 || r.sweep_batch == 0 {
            bail!("retention.dead_letters_ms, retention.sweep_every_ms and retention.sweep_batch must be above 0 (leave dead_letters_ms unset to keep dead letters until purged)");
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
        self.validate_celery()
    }

    /// Timings and limits at 0 (or past what the broker can hold) that
    /// would be accepted and then fail or spin on every message.
    fn validate_timings_and_limits(&self) -> Result<()> {
        let w = &self.worker;
        for (key, value, what) in [
            (
                "lease_ms",
                w.lease_ms,
                "a claim would expire as it is taken, and a redelivery take over a running handler",
            ),
            (
                "visibility_ms",
                w.visibility_ms,
                "the broker would hand every delivery out again at once",
            ),
            (
                "busy_retry_ms",
                w.busy_retry_ms,
                "a busy key would be fetched and handed back without a pause",
            ),
            (
                "poll_idle_ms",
                w.poll_idle_ms,
                "an idle worker would poll its broker in a busy loop",
            ),
        ] {
            if value == 0 {
                bail!("worker.{key} must be at least 1 ms: at 0 {what}");
            }
        }
        if w.heartbeat_ms == Some(0) {
            bail!("worker.heartbeat_ms must be at least 1 ms: at 0 the heartbeat would extend every lease and visibility in a busy loop; leave it unset for lease_ms / 3");
        }
        let r = &self.retention;
        for (key, value) in [
            ("worker.lease_ms", w.lease_ms),
            ("worker.visibility_ms", w.visibility_ms),
            ("worker.busy_retry_ms", w.busy_retry_ms),
            ("worker.poll_idle_ms", w.poll_idle_ms),
            ("worker.shutdown_grace_ms", w.shutdown_grace_ms),
            ("worker.start_timeout_ms", w.start_timeout_ms),
            ("worker.heartbeat_ms", w.heartbeat_ms.unwrap_or(0)),
            ("retry.base_delay_ms", self.retry.base_delay_ms),
            ("retry.max_delay_ms", self.retry.max_delay_ms),
            ("retention.done_ms", r.done_ms),
            ("retention.dead_letters_ms", r.dead_letters_ms.unwrap_or(0)),
            ("retention.sweep_every_ms", r.sweep_every_ms),
            ("broker.rebalance_grace_ms", self.broker.rebalance_grace_ms),
        ] {
            check_ms(key, value)?;
        }
        for (name, endpoint) in &self.endpoints {
            check_ms(&format!("endpoints.{name}.timeout_ms"), endpoint.timeout_ms)?;
        }
        if w.concurrency > MAX_CONCURRENCY {
            bail!(
                "worker.concurrency = {} is more than {MAX_CONCURRENCY}: each handler slot reserves an instance of the largest plugin in the sandbox's pool; run more worker processes instead",
                w.concurrency
            );
        }
        let horizon = REDIS_MAX_VISIBILITY_MS;
        if self.broker.kind == BrokerKind::Redis && w.visibility_ms > horizon {
            bail!(
                "worker.visibility_ms = {} is longer than the Redis broker's longest visibility, {horizon} ms (24 h); a longer handler keeps its delivery through the heartbeat, which extends it",
                w.visibility_ms
            );
        }
        let scopes = std::iter::once(("limits".to_string(), self.limits.clone())).chain(
            self.plugins
                .keys()
                .map(|name| (format!("plugins.{name}.limits"), self.limits_for(name))),
        );
        for (scope, limits) in scopes {
            for (key, zero) in [
                ("cpu_ms", limits.cpu_ms == 0),
                ("timeout_ms", limits.timeout_ms == 0),
                ("max_payload_bytes", limits.max_payload_bytes == 0),
                ("max_value_bytes", limits.max_value_bytes == 0),
            ] {
                if zero {
                    bail!("{scope}.{key} must be above 0: at 0 every message of the plugin fails and is dead-lettered");
                }
            }
            if limits.memory_bytes > MAX_MEMORY_BYTES {
                bail!(
                    "{scope}.memory_bytes = {} is more than a WebAssembly memory can hold ({MAX_MEMORY_BYTES} bytes, 4 GiB): lower it",
                    limits.memory_bytes
                );
            }
            check_ms(&format!("{scope}.cpu_ms"), limits.cpu_ms)?;
            check_ms(&format!("{scope}.timeout_ms"), limits.timeout_ms)?;
        }
        for (name, endpoint) in &self.endpoints {
            let parsed = url::Url::parse(&endpoint.url);
            if !matches!(parsed.as_ref().map(url::Url::scheme), Ok("http" | "https")) {
                bail!(
                    "endpoints.{name}.url = {:?} is not an http:// or https:// URL (e.g. \"https://payments.internal/charge\")",
                    crate::text::redact_url(&endpoint.url)
                );
            }
            if endpoint.timeout_ms == 0 {
                bail!("endpoints.{name}.timeout_ms must be above 0 (the default is 10000)");
            }
        }
        Ok(())
    }

    /// `celery_task` settings make sense only with the celery broker, and
    /// each task name belongs to one plugin.
    fn validate_celery(&self) -> Result<()> {
        let mut served: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, plugin) in &self.plugins {
            let Some(task) = plugin.celery_task.as_deref() else { continue };
            if self.broker.kind != BrokerKind::Celery {
                bail!("plugins.{name}.celery_task = {task:?} is set but broker.kind is {:?}: set broker.kind = \"celery\" or remove celery_task", self.broker.kind);
            }
            if task.is_empty() {
                bail!("plugins.{name}.celery_task is empty: set it to the Celery task name (e.g. \"billing.record_payment\")");
            }
            if let Some(other) = served.insert(task, name) {
                bail!("Celery task {task:?} is served by two plugins, {other} and {name}: give it to one");
            }
        }
        if self.broker.kind == BrokerKind::Celery && served.is_empty() && !self.plugins.is_empty() {
            bail!(
                "broker.kind = \"celery\" but no plugin serves a Celery task: set celery_task = \"module.task_name\" under [plugins.NAME]"
            );
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

/// The longest any millisecond setting may be (ten years): longer ones are
/// a slip (microseconds for milliseconds, say), and added to a clock
/// reading they would overflow.
const MAX_MS: u64 = 10 * 365 * 24 * 60 * 60 * 1000;

/// The most a WebAssembly memory can hold (32-bit addresses).
const MAX_MEMORY_BYTES: u64 = 4 << 30;

/// The most handler slots one worker process runs.
const MAX_CONCURRENCY: usize = 10_000;

/// Refuse a millisecond setting past [`MAX_MS`], naming it.
fn check_ms(key: &str, value: u64) -> Result<()> {
    if value > MAX_MS {
        bail!("{key} = {value} is more than ten years in milliseconds ({MAX_MS}): write it in milliseconds");
    }
    Ok(())
}

/// A broker URL of the scheme its kind reads. Client libraries quote a URL
/// they cannot parse whole in their errors, password included: a wrong
/// one is refused here, shown redacted.
fn check_broker_url(kind: BrokerKind, url: &str) -> Result<()> {
    let (schemes, example): (&[&str], &str) = match kind {
        BrokerKind::Redis => (&["redis", "rediss", "redis+unix", "unix"], "redis://127.0.0.1:6379"),
        BrokerKind::Rabbitmq => (&["amqp", "amqps"], "amqp://guest:guest@127.0.0.1:5672/%2f"),
        BrokerKind::Celery => (&["redis", "rediss", "amqp", "amqps"], "redis://127.0.0.1:6379/0"),
        BrokerKind::Kafka => {
            // Servers, with or without `kafka://`: no credentials.
            if url.contains('@') {
                bail!(
                    "broker.url = {} holds credentials, which Kafka does not take from the URL: give the servers alone, e.g. kafka://127.0.0.1:9092",
                    crate::text::redact_url(url)
                );
            }
            return Ok(());
        }
        BrokerKind::Sqlite | BrokerKind::Nats | BrokerKind::Sqs => return Ok(()),
    };
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    if !scheme.is_some_and(|s| schemes.contains(&s.as_str())) {
        bail!(
            "broker.url = {} is not a {kind:?} URL: it must start with {}:// (e.g. {example})",
            crate::text::redact_url(url),
            schemes.join("://, ")
        );
    }
    Ok(())
}

/// Where a file failed to parse and why: `line L, column C: message`.
/// toml's own report quotes the line, and a configuration's lines hold
/// URLs with passwords: this error is logged, and shown by the console when
/// a reload refuses the file.
fn parse_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end();
    let Some(before) = e.span().and_then(|span| text.get(..span.start)) else {
        return message.to_string();
    };
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A valid configuration with `extra` appended (a later TOML table
    /// wins over the default for the keys it sets).
    fn with(extra: &str) -> Config {
        toml::from_str(&format!("[plugins.a]\npath = \"a.wasm\"\n{extra}")).unwrap()
    }

    #[test]
    fn zero_timings_and_limits_are_refused_naming_the_key() {
        with("").validate().expect("the defaults are valid");
        for (extra, named) in [
            ("[worker]\nlease_ms = 0", "worker.lease_ms"),
            ("[worker]\nvisibility_ms = 0", "worker.visibility_ms"),
            ("[worker]\nbusy_retry_ms = 0", "worker.busy_retry_ms"),
            ("[worker]\npoll_idle_ms = 0", "worker.poll_idle_ms"),
            ("[worker]\nheartbeat_ms = 0", "worker.heartbeat_ms"),
            ("[limits]\ncpu_ms = 0", "limits.cpu_ms"),
            ("[limits]\nmax_payload_bytes = 0", "limits.max_payload_bytes"),
            ("[plugins.a.limits]\ntimeout_ms = 0", "plugins.a.limits.timeout_ms"),
            ("[plugins.a.limits]\nmax_value_bytes = 0", "plugins.a.limits.max_value_bytes"),
            ("[endpoints.pay]\nurl = \"payments.local/charge\"", "endpoints.pay.url"),
            ("[endpoints.pay]\nurl = \"ftp://payments.local\"", "endpoints.pay.url"),
            (
                "[endpoints.pay]\nurl = \"https://payments.local\"\ntimeout_ms = 0",
                "endpoints.pay.timeout_ms",
            ),
        ] {
            let err = with(extra).validate().expect_err(extra).to_string();
            assert!(err.contains(named), "{extra}: {err}");
        }
        with("[endpoints.pay]\nurl = \"https://payments.local/charge\"")
            .validate()
            .expect("an https endpoint");
    }

    #[test]
    fn a_redis_visibility_past_the_claim_horizon_is_refused() {
        let redis = "[broker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n[worker]\nvisibility_ms = ";
        with(&format!("{redis}86400000")).validate().expect("24 h");
        let err = with(&format!("{redis}86400001")).validate().unwrap_err().to_string();
        assert!(err.contains("worker.visibility_ms") && err.contains("24 h"), "{err}");
    }

    #[test]
    fn a_broker_url_of_another_scheme_is_refused_without_its_password() {
        let broker = |kind: &str, url: &str| {
            let task = if kind == "celery" {
                "celery_task = \"billing.charge\"\n"
            } else {
                ""
            };
            with(&format!("{task}[broker]\nkind = \"{kind}\"\nurl = \"{url}\""))
        };
        for (kind, url) in [
            ("rabbitmq", "amqp://guest:guest@127.0.0.1:5672/%2f"),
            ("rabbitmq", "AMQPS://rabbit.local"),
            ("redis", "rediss://:pw@redis.local:6380"),
            ("celery", "amqp://guest:guest@127.0.0.1:5672//"),
            ("kafka", "kafka://k1:9092,k2:9092"),
            ("kafka", "k1:9092"),
            ("nats", "127.0.0.1:4222"),
        ] {
            broker(kind, url).validate().unwrap_or_else(|e| panic!("{kind} {url}: {e}"));
        }
        for (kind, url, expected) in [
            ("rabbitmq", "guest:s3cret@rabbit:5672", "amqp://"),
            ("rabbitmq", "redis://:s3cret@rabbit:5672", "amqp://"),
            ("redis", "s3cret@redis.local:6379", "redis://"),
            ("celery", "http://u:s3cret@redis.local", "amqp://"),
            ("kafka", "kafka://u:s3cret@k1:9092", "servers alone"),
        ] {
            let err = broker(kind, url).validate().unwrap_err().to_string();
            assert!(err.contains("broker.url") && err.contains(expected), "{kind} {url}: {err}");
            assert!(!err.contains("s3cret"), "{kind} {url}: the password is not printed: {err}");
        }
    }

    #[test]
    fn values_no_sandbox_or_clock_can_hold_are_refused_by_name() {
        for (text, named) in [
            ("[limits]\nmemory_bytes = 4294967297", "limits.memory_bytes"),
            ("[plugins.p.limits]\nmemory_bytes = 8589934592", "plugins.p.limits.memory_bytes"),
            ("[worker]\nlease_ms = 9223372036854775807", "worker.lease_ms"),
            ("[retry]\nmax_delay_ms = 315360000001", "retry.max_delay_ms"),
            ("[limits]\ntimeout_ms = 1000000000000000", "limits.timeout_ms"),
            ("[worker]\nconcurrency = 10001", "worker.concurrency"),
        ] {
            let text = text.replace("[plugins.p.limits]", "[plugins.p]\npath = \"p.wasm\"\n[plugins.p.limits]");
            let err = with(&text).validate().unwrap_err().to_string();
            assert!(err.contains(named), "{text}: {err}");
        }
        with("[limits]\nmemory_bytes = 4294967296").validate().expect("4 GiB");
        with("[retention]\ndone_ms = 315360000000").validate().expect("ten years");
    }

    #[test]
    fn unknown_settings_are_refused_by_name() {
        let err = toml::from_str::<Config>("[worker]\nconcurency = 2\n").unwrap_err().to_string();
        assert!(err.contains("concurency"), "{err}");
    }

    #[test]
    fn a_file_that_does_not_parse_is_placed_without_quoting_its_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.toml");
        std::fs::write(&path, "[broker]\nkind = \"redis\"\nurl = \"redis://:hunter2@10.0.0.5:6379\n").unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(err.contains("idem.toml is not valid") && err.contains("line 3, column "), "{err}");
        assert!(!err.contains("hunter2"), "the line's text is not quoted: {err}");
        std::fs::write(&path, "[worker]\nconcurency = 2\n").unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(err.contains("line 2, column 1: unknown field `concurency`"), "{err}");
    }
}
