//! Connecting, loading the Lua scripts, and recovering from what a Redis
//! restart leaves behind.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Pipeline, RedisError, Script, Value};

use super::{unavailable, RedisBroker, GROUP};
use crate::broker::BrokerError;

/// Consumers idle this long and holding nothing are forgotten at connect.
const CONSUMER_GC_IDLE: Duration = Duration::from_secs(60 * 60);

/// The broker's Lua scripts, each documented in its file.
pub(super) struct Scripts {
    pub(super) promote: Script,
    pub(super) fetch: Script,
    pub(super) nack: Script,
    pub(super) extend: Script,
    pub(super) gc: Script,
    pub(super) pending: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            promote: Script::new(include_str!("../../../lua/redis_broker_promote.lua")),
            fetch: Script::new(include_str!("../../../lua/redis_broker_fetch.lua")),
            nack: Script::new(include_str!("../../../lua/redis_broker_nack.lua")),
            extend: Script::new(include_str!("../../../lua/redis_broker_extend.lua")),
            gc: Script::new(include_str!("../../../lua/redis_broker_gc.lua")),
            pending: Script::new(include_str!("../../../lua/redis_broker_pending.lua")),
        }
    }

    fn all(&self) -> [&Script; 6] {
        [&self.promote, &self.fetch, &self.nack, &self.extend, &self.gc, &self.pending]
    }
}

impl RedisBroker {
    /// Connect, create the stream and consumer group if they do not exist,
    /// and forget consumers of stopped workers that hold nothing.
    pub async fn connect(url: &str, namespace: &str) -> anyhow::Result<Self> {
        let shown = crate::text::redact_url(url);
        let client = redis::Client::open(url)
            .with_context(|| format!("broker.url {shown:?} is not a valid Redis URL (redis://[:password@]host:port[/db])"))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            // Above MAX_BLOCK and a busy server's script time; the default
            // (500 ms) turns a slow moment into a failed fetch.
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2);
        let hint = || format!("cannot connect to Redis at broker.url = {shown:?}: is the server running?");
        let conn = ConnectionManager::new_with_config(client.clone(), config.clone())
            .await
            .with_context(hint)?;
        let waiter = ConnectionManager::new_with_config(client, config).await.with_context(hint)?;
        let broker = RedisBroker {
            conn,
            waiter,
            stream: format!("{namespace}:queue"),
            delayed: format!("{namespace}:delayed"),
            consumer: format!("{}-{}", crate::text::hostname(), uuid::Uuid::new_v4().simple()),
            scripts: Scripts::new(),
            scan: Mutex::new(super::fetch::Scan::new()),
        };
        broker.ensure_group().await.with_context(|| {
            format!(
                "cannot create the consumer group {GROUP:?} of stream {:?} at broker.url = {shown:?}",
                broker.stream
            )
        })?;
        broker
            .load_scripts()
            .await
            .with_context(|| format!("cannot load the broker's Lua scripts into Redis at broker.url = {shown:?}"))?;
        let mut gc = broker.scripts.gc.key(&broker.stream);
        gc.arg(GROUP).arg(CONSUMER_GC_IDLE.as_millis() as u64).arg(&broker.consumer);
        match gc.invoke_async::<u64>(&mut broker.conn.clone()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(stream = %broker.stream, removed = n, "forgot consumers of stopped workers"),
            // Only housekeeping: the queue works without it.
            Err(e) => tracing::warn!(error = %e, stream = %broker.stream, "cannot forget idle consumers"),
        }
        Ok(broker)
    }

    /// Create the stream and group. Starting the group at `0` delivers
    /// what was published before any worker started; a group that exists
    /// already (BUSYGROUP) is kept as it is.
    async fn ensure_group(&self) -> Result<(), RedisError> {
        let created: Result<Value, RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn.clone())
            .await;
        match created {
            Err(e) if e.code() == Some("BUSYGROUP") || e.to_string().contains("BUSYGROUP") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    async fn load_scripts(&self) -> Result<(), RedisError> {
        let mut pipe = redis::pipe();
        for s in self.scripts.all() {
            pipe.load_script(s).ignore();
        }
        pipe.query_async::<()>(&mut self.conn.clone()).await
    }

    /// Run a pipeline, recovering once from what a Redis restart leaves
    /// behind: scripts no longer cached (NOSCRIPT) and, when the data was
    /// lost too, a missing consumer group (NOGROUP). Every pipeline sent
    /// through here is safe to run again: its scripts check before they
    /// change anything.
    pub(super) async fn query<T: redis::FromRedisValue>(&self, pipe: &Pipeline) -> Result<T, BrokerError> {
        let mut conn = self.conn.clone();
        let mut recovered = 0;
        loop {
            let err = match pipe.query_async::<T>(&mut conn).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let text = err.to_string();
            let recovery = if recovered >= 2 {
                None
            } else if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) || text.contains("NOSCRIPT") {
                Some(self.load_scripts().await)
            } else if err.code() == Some("NOGROUP") || text.contains("NOGROUP") {
                tracing::warn!(stream = %self.stream, "the consumer group is gone (Redis lost its data?); creating it again");
                Some(self.ensure_group().await)
            } else {
                None
            };
            match recovery {
                Some(Ok(())) => recovered += 1,
                Some(Err(e)) => return Err(unavailable(e)),
                None => return Err(unavailable(err)),
            }
        }
    }
}
