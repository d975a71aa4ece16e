//! Redis Streams broker: one stream per namespace, consumed through a
//! consumer group, with a sorted set for delayed messages.
//!
//! Keys (all under the namespace, so deployments sharing a server never
//! meet):
//! - `{namespace}:queue`, a stream read by the consumer group `idem`. Each
//!   broker instance is its own consumer (hostname and a random suffix), so
//!   Redis knows which process holds which delivery.
//! - `{namespace}:delayed`, a sorted set of entries published or given back
//!   with a delay, scored by their due time in milliseconds. Due entries are
//!   moved into the stream by a Lua script at the start of every fetch.
//!
//! Wire format: a stream entry has the fields `id`, `handler`, `headers` (a
//! JSON array of `[key, value]` pairs) and `payload` (raw bytes), so any
//! producer can publish with
//! `XADD {namespace}:queue * id <id> handler <plugin> payload <bytes>`.
//! Idem adds `delivered` (deliveries before the entry was given back) when
//! it re-queues an entry. An entry missing fields is still delivered, with
//! empty values, so the worker dead-letters it as bad input instead of it
//! blocking the queue.
//!
//! Visibility: a delivery stays in the group's pending list until it is
//! acked. Redis measures how long it has been idle and lets whoever calls
//! `XAUTOCLAIM` choose the idle threshold, but Idem's contract is that each
//! delivery is invisible for the visibility it was fetched (or extended)
//! with. So every claimer uses one fixed threshold, [`CLAIM_HORIZON`], and
//! a delivery's idle clock is started at `CLAIM_HORIZON - visibility`: it
//! becomes claimable exactly when its own visibility ends. (`XPENDING`
//! therefore shows an idle time of `CLAIM_HORIZON -` the time left.)
//!
//! Receipts are `<entry id>/<times delivered>`: the pair identifies one
//! delivery, so a stale receipt (its entry taken over by another consumer,
//! or redelivered to this one) cannot nack or extend the newer delivery.
//!
//! Every multi-step change is a Lua script in `host/lua/redis_broker_*.lua`,
//! so it is atomic: an entry is never both delayed and queued, nor lost in
//! between. Times of the delayed set come from the worker's clock (as in
//! the SQLite broker); visibility is measured by the Redis server's clock.
//! Needs Redis 6.2 or later (`XAUTOCLAIM`).

use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Pipeline, RedisError, Script, Value};

use super::{Broker, BrokerError};
use crate::envelope::{Delivery, Envelope};
use crate::now_ms;

/// The consumer group every Idem worker of a namespace reads through.
const GROUP: &str = "idem";

/// The idle time after which a delivery can be claimed by another consumer.
/// Each delivery's idle clock starts at `CLAIM_HORIZON - visibility`, so
/// this is also the longest visibility a fetch or extend can ask for.
pub const CLAIM_HORIZON: Duration = Duration::from_secs(24 * 60 * 60);

/// Longest a fetch waits for new entries when there is nothing to take, so
/// that the worker notices a shutdown promptly.
const MAX_BLOCK: Duration = Duration::from_millis(100);

/// Most delayed entries moved into the stream per fetch: the move is one
/// script, and Redis serves nobody else while it runs.
const PROMOTE_LIMIT: usize = 1_000;

/// Consumers idle this long and holding nothing are forgotten at connect.
const CONSUMER_GC_IDLE: Duration = Duration::from_secs(60 * 60);

/// The broker's Lua scripts, each documented in its file.
struct Scripts {
    promote: Script,
    fetch: Script,
    nack: Script,
    extend: Script,
    gc: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            promote: Script::new(include_str!("../../lua/redis_broker_promote.lua")),
            fetch: Script::new(include_str!("../../lua/redis_broker_fetch.lua")),
            nack: Script::new(include_str!("../../lua/redis_broker_nack.lua")),
            extend: Script::new(include_str!("../../lua/redis_broker_extend.lua")),
            gc: Script::new(include_str!("../../lua/redis_broker_gc.lua")),
        }
    }

    fn all(&self) -> [&Script; 5] {
        [&self.promote, &self.fetch, &self.nack, &self.extend, &self.gc]
    }
}

/// A queue in a Redis stream, consumed through a consumer group: deliveries
/// of a worker that dies are claimed by the others (`XAUTOCLAIM`) once
/// their visibility ends. See the module documentation for the key layout
/// and wire format.
pub struct RedisBroker {
    /// Every command but the blocking wait. A multiplexed connection that
    /// reconnects by itself after Redis restarts.
    conn: ConnectionManager,
    /// The blocking `XREAD` of an idle fetch, on its own connection so it
    /// never delays the acks and heartbeats queued behind it.
    waiter: ConnectionManager,
    stream: String,
    delayed: String,
    consumer: String,
    scripts: Scripts,
    /// Where the last `XAUTOCLAIM` stopped scanning the pending list; the
    /// next fetch resumes there so every pending entry is looked at in turn.
    cursor: Mutex<String>,
}

impl RedisBroker {
    /// Connect, create the stream and consumer group if they do not exist,
    /// and forget consumers of stopped workers that hold nothing.
    pub async fn connect(url: &str, namespace: &str) -> anyhow::Result<Self> {
        let shown = redact(url);
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
            consumer: format!("{}-{}", hostname(), uuid::Uuid::new_v4().simple()),
            scripts: Scripts::new(),
            cursor: Mutex::new("0-0".into()),
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
    async fn query<T: redis::FromRedisValue>(&self, pipe: &Pipeline) -> Result<T, BrokerError> {
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

    /// Move due delayed entries into the stream, then take what is there.
    async fn take(&self, max: usize, visibility: Duration) -> Result<Taken, BrokerError> {
        let now = now_ms();
        let cursor = self.cursor.lock().expect("cursor lock poisoned").clone();
        let idle = CLAIM_HORIZON.saturating_sub(visibility);
        let mut promote = self.scripts.promote.key(&self.delayed);
        promote.key(&self.stream).arg(now).arg(PROMOTE_LIMIT);
        let mut fetch = self.scripts.fetch.key(&self.stream);
        fetch
            .arg(GROUP)
            .arg(&self.consumer)
            .arg(max)
            .arg(CLAIM_HORIZON.as_millis() as u64)
            .arg(idle.as_millis() as u64)
            .arg(&cursor);
        // One round trip: the promotion is its own script so that it stays
        // atomic on its own, whatever the fetch does after it.
        let mut pipe = redis::pipe();
        pipe.invoke_script(&promote).ignore().invoke_script(&fetch);
        let (reply,): (Value,) = self.query(&pipe).await?;
        let taken = parse_taken(reply)?;
        *self.cursor.lock().expect("cursor lock poisoned") = taken.cursor.clone();
        Ok(taken)
    }
}

/// What one run of the fetch script returned.
struct Taken {
    cursor: String,
    /// The stream's last entry id, set when nothing was taken.
    last: String,
    deliveries: Vec<Delivery>,
}

#[async_trait]
impl Broker for RedisBroker {
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError> {
        if envelopes.is_empty() {
            return Ok(());
        }
        // MULTI/EXEC: a batch is queued whole or not at all.
        let mut pipe = redis::pipe();
        pipe.atomic();
        let due = now_ms() + delay.as_millis() as i64;
        for e in envelopes {
            let headers = serde_json::to_string(&e.headers).unwrap_or_else(|_| "[]".into());
            if delay.is_zero() {
                pipe.cmd("XADD")
                    .arg(&self.stream)
                    .arg("*")
                    .arg("id")
                    .arg(&e.id)
                    .arg("handler")
                    .arg(&e.handler)
                    .arg("headers")
                    .arg(&headers)
                    .arg("payload")
                    .arg(e.payload.as_slice())
                    .ignore();
            } else {
                let token = uuid::Uuid::new_v4().simple().to_string();
                let member = encode_member(
                    &token,
                    &[
                        ("id", e.id.as_bytes()),
                        ("handler", e.handler.as_bytes()),
                        ("headers", headers.as_bytes()),
                        ("payload", &e.payload),
                    ],
                );
                pipe.cmd("ZADD").arg(&self.delayed).arg(due).arg(member.as_slice()).ignore();
            }
        }
        self.query::<()>(&pipe).await
    }

    async fn fetch(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, BrokerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let taken = self.take(max, visibility).await?;
        if !taken.deliveries.is_empty() {
            return Ok(taken.deliveries);
        }
        // Nothing to take: wait (briefly) for an entry newer than the last
        // one the script saw, then take again. Waiting with XREAD rather
        // than XREADGROUP BLOCK keeps every read of the group inside the
        // script, where its visibility is set atomically.
        let woke: Value = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(MAX_BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(if taken.last.is_empty() { "$" } else { taken.last.as_str() })
            .query_async(&mut self.waiter.clone())
            .await
            .map_err(unavailable)?;
        if matches!(woke, Value::Nil) {
            return Ok(Vec::new());
        }
        Ok(self.take(max, visibility).await?.deliveries)
    }

    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        if receipts.is_empty() {
            return Ok(());
        }
        let ids = receipts
            .iter()
            .map(|r| parse_receipt(r).map(|(id, _)| id))
            .collect::<Result<Vec<_>, _>>()?;
        // No ownership check, as in the SQLite broker: the worker acks only
        // once the outcome is durable, and then nobody needs the entry.
        // XDEL as well as XACK, so the stream holds only unsettled entries
        // and XLEN counts them.
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("XACK")
            .arg(&self.stream)
            .arg(GROUP)
            .arg(&ids)
            .ignore()
            .cmd("XDEL")
            .arg(&self.stream)
            .arg(&ids)
            .ignore();
        self.query::<()>(&pipe).await
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        let (id, count) = parse_receipt(receipt)?;
        let now = now_ms();
        let mut nack = self.scripts.nack.key(&self.stream);
        nack.key(&self.delayed)
            .arg(GROUP)
            .arg(&self.consumer)
            .arg(id)
            .arg(count)
            .arg(now + delay.as_millis() as i64)
            .arg(now);
        let mut pipe = redis::pipe();
        pipe.invoke_script(&nack);
        let (given_back,): (u64,) = self.query(&pipe).await?;
        if given_back == 0 {
            tracing::debug!(
                receipt,
                "nack of a stale receipt: the delivery was settled or taken over; nothing to do"
            );
        }
        Ok(())
    }

    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError> {
        if receipts.is_empty() {
            return Ok(());
        }
        let idle = CLAIM_HORIZON.saturating_sub(visibility);
        let mut extend = self.scripts.extend.key(&self.stream);
        extend.arg(GROUP).arg(&self.consumer).arg(idle.as_millis() as u64);
        for r in receipts {
            let (id, count) = parse_receipt(r)?;
            extend.arg(id).arg(count);
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(&extend);
        let (_extended,): (u64,) = self.query(&pipe).await?;
        Ok(())
    }

    async fn pending(&self) -> Result<u64, BrokerError> {
        let mut pipe = redis::pipe();
        pipe.cmd("XLEN").arg(&self.stream).cmd("ZCARD").arg(&self.delayed);
        let (queued, delayed): (u64, u64) = self.query(&pipe).await?;
        Ok(queued + delayed)
    }
}

fn unavailable(e: RedisError) -> BrokerError {
    BrokerError::Unavailable(e.to_string())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "worker".into())
}

/// The URL without its password, for error messages and logs.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}

/// A receipt is `<entry id>/<times delivered by the group>`.
fn parse_receipt(receipt: &str) -> Result<(&str, u64), BrokerError> {
    let malformed = || BrokerError::Unavailable(format!("malformed Redis receipt {receipt:?}"));
    let (id, count) = receipt.split_once('/').ok_or_else(malformed)?;
    let (ms, seq) = id.split_once('-').ok_or_else(malformed)?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(ms) || !digits(seq) {
        return Err(malformed());
    }
    Ok((id, count.parse().map_err(|_| malformed())?))
}

/// A delayed-set member: length-prefixed items, a unique token then field,
/// value, ... (decoded by `redis_broker_promote.lua`).
fn encode_member(token: &str, fields: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + fields.iter().map(|(k, v)| k.len() + v.len() + 16).sum::<usize>());
    let mut push = |item: &[u8]| {
        out.extend_from_slice(item.len().to_string().as_bytes());
        out.push(b':');
        out.extend_from_slice(item);
    };
    push(token.as_bytes());
    for (k, v) in fields {
        push(k.as_bytes());
        push(v);
    }
    out
}

fn bad_reply(what: &str, v: &Value) -> BrokerError {
    BrokerError::Unavailable(format!("unexpected reply from Redis ({what}): {v:?}"))
}

fn bytes(v: Value) -> Result<Vec<u8>, BrokerError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        Value::Okay => Ok(b"OK".to_vec()),
        other => Err(bad_reply("expected a string", &other)),
    }
}

fn text(v: Value) -> Result<String, BrokerError> {
    Ok(String::from_utf8_lossy(&bytes(v)?).into_owned())
}

fn array(v: Value, what: &str) -> Result<Vec<Value>, BrokerError> {
    match v {
        Value::Array(items) => Ok(items),
        // A Lua script's empty table.
        Value::Nil => Ok(Vec::new()),
        other => Err(bad_reply(what, &other)),
    }
}

fn parse_taken(reply: Value) -> Result<Taken, BrokerError> {
    let mut parts = array(reply, "fetch script").map(Vec::into_iter)?;
    let (Some(cursor), Some(last), Some(entries)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(BrokerError::Unavailable("the fetch script returned too few values".into()));
    };
    let mut deliveries = Vec::new();
    for entry in array(entries, "fetch script entries")? {
        let mut e = array(entry, "fetch script entry")?.into_iter();
        let (Some(id), Some(count), Some(fields)) = (e.next(), e.next(), e.next()) else {
            return Err(BrokerError::Unavailable("the fetch script returned an incomplete entry".into()));
        };
        let id = text(id)?;
        let count: u64 = text(count)?.parse().unwrap_or(1);
        deliveries.push(delivery(&id, count, array(fields, "entry fields")?)?);
    }
    Ok(Taken {
        cursor: text(cursor)?,
        last: text(last)?,
        deliveries,
    })
}

/// One stream entry as a delivery. Missing or malformed fields become
/// empty values, never an error: an entry that cannot be read must still
/// reach the worker, which dead-letters it, or it would be fetched forever.
fn delivery(entry_id: &str, count: u64, fields: Vec<Value>) -> Result<Delivery, BrokerError> {
    let mut envelope = Envelope {
        id: String::new(),
        handler: String::new(),
        headers: Vec::new(),
        payload: Vec::new(),
    };
    let mut delivered: u64 = 0;
    let mut fields = fields.into_iter();
    while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
        let v = bytes(v)?;
        match bytes(k)?.as_slice() {
            b"id" => envelope.id = String::from_utf8_lossy(&v).into_owned(),
            b"handler" => envelope.handler = String::from_utf8_lossy(&v).into_owned(),
            b"headers" => {
                envelope.headers = serde_json::from_slice(&v).unwrap_or_else(|e| {
                    tracing::warn!(entry = entry_id, error = %e, "stream entry has malformed headers (want a JSON array of [key, value]); ignoring them");
                    Vec::new()
                })
            }
            b"payload" => envelope.payload = v,
            b"delivered" => delivered = std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
            _ => {}
        }
    }
    Ok(Delivery {
        envelope,
        receipt: format!("{entry_id}/{count}"),
        delivery_count: (delivered + count).min(u32::MAX as u64) as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_round_trip_and_reject_garbage() {
        assert_eq!(parse_receipt("1700000000000-3/2").unwrap(), ("1700000000000-3", 2));
        for bad in ["", "1-2", "1-2/", "x-1/1", "1/1", "1-2/x", "-1/1"] {
            assert!(parse_receipt(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn members_are_length_prefixed() {
        let m = encode_member("t", &[("payload", b"a:b\0")]);
        assert_eq!(m, b"1:t7:payload4:a:b\0");
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redact("redis://:s3cret@host:6379/0"), "redis://:***@host:6379/0");
        assert_eq!(redact("redis://u:p@h"), "redis://u:***@h");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }

    #[test]
    fn entries_missing_fields_still_deliver() {
        let d = delivery(
            "1-0",
            1,
            vec![Value::BulkString(b"junk".to_vec()), Value::BulkString(b"1".to_vec())],
        )
        .unwrap();
        assert_eq!(d.envelope.handler, "");
        assert_eq!(d.receipt, "1-0/1");
        assert_eq!(d.delivery_count, 1);
    }
}
