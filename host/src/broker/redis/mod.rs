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
//! Expired deliveries are looked for about once a second (a scan of the
//! pending list walks the stream for each entry it looks at), so one is
//! taken up to a second (or a quarter of its visibility) after it expires.
//!
//! Settling: an ack is `XACK`. Settled entries stay in the stream until the
//! same scan trims the stream's head below the oldest pending delivery
//! (`XDEL` of each would walk the stream once per entry), so `XLEN` counts
//! them meanwhile; [`Broker::pending`] counts the group's pending list and
//! its lag instead.
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
//!
//! Files: `connection` connects, loads the scripts and recovers from a
//! Redis restart; `fetch` runs the fetch script and reads its entries.

mod connection;
mod fetch;

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{RedisError, Value};

use self::connection::Scripts;
use super::{Broker, BrokerError};
use crate::envelope::{Delivery, Envelope};
use crate::now_ms;

/// The consumer group every Idem worker of a namespace reads through.
const GROUP: &str = "idem";

/// The idle time after which a delivery can be claimed by another consumer.
/// Each delivery's idle clock starts at `CLAIM_HORIZON - visibility`, so
/// this is also the longest visibility a fetch or extend can ask for.
pub const CLAIM_HORIZON: Duration = Duration::from_millis(crate::config::REDIS_MAX_VISIBILITY_MS);

/// Longest a fetch waits for new entries when there is nothing to take, so
/// that the worker notices a shutdown promptly.
const MAX_BLOCK: Duration = Duration::from_millis(100);

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
    /// The scan of the pending list for expired deliveries.
    scan: Mutex<fetch::Scan>,
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
        let due = crate::broker::due_at(now_ms(), delay);
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
        // once the outcome is durable, and then nobody needs the entry. The
        // entries stay in the stream until a fetch trims its settled head:
        // deleting each (XDEL) would walk the stream for every one.
        let mut pipe = redis::pipe();
        pipe.cmd("XACK").arg(&self.stream).arg(GROUP).arg(&ids).ignore();
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
            .arg(crate::broker::due_at(now, delay))
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
        let mut count = self.scripts.pending.key(&self.stream);
        count.key(&self.delayed).arg(GROUP);
        let mut pipe = redis::pipe();
        pipe.invoke_script(&count);
        let (pending,): (u64,) = self.query(&pipe).await?;
        Ok(pending)
    }
}

fn unavailable(e: RedisError) -> BrokerError {
    BrokerError::Unavailable(e.to_string())
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
}
