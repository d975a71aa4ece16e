//! Celery's Redis transport. A queue `celery` is the Redis list `celery`,
//! plus kombu's priority lists `celery\x06\x163`, `…6` and `…9`, read in
//! that order (kombu's default priority steps; 0 is the highest priority).
//! Each entry is a JSON envelope whose body is base64 (see [`wire`]).
//!
//! At least once: kombu's own consumer pops a task (`BRPOP`) and records it
//! as unacked in a second step, so a worker killed in between loses it.
//! Idem moves each task in one Lua script from its list into Idem's unacked
//! hash (`{namespace}:celery:unacked`, with a visibility deadline in
//! `{namespace}:celery:unacked_index`): at every moment a task is in its
//! list, in that hash, or in Idem's delayed set, never in between. A
//! delivery whose visibility ends (its worker died) goes back to the head
//! of its list at the next fetch of any Idem worker. Idem keeps its own hash
//! rather than kombu's `unacked`, because Celery workers restore kombu's
//! entries after their own `visibility_timeout` (an hour by default) and
//! Idem restores its own after `worker.visibility_ms`: neither takes the
//! other's running tasks.
//!
//! ETA and countdown wait in the delayed set (`{namespace}:celery:delayed`)
//! until due. Lists are polled: an idle fetch waits [`IDLE_WAIT`] before it
//! looks again. Receipts are fresh tags, one per delivery.

use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{Script, Value};

use super::wire::{self, Message};
use super::{Taken, Transport};
use crate::broker::{BrokerError, Semantics};
use crate::now_ms;

/// How long an idle fetch waits before it looks at the lists again.
pub const IDLE_WAIT: Duration = Duration::from_millis(20);

/// Most restored or promoted entries per fetch.
const MOVE_LIMIT: usize = 1_000;

/// kombu's separator and default priority steps for priority lists.
const PRIORITY_LISTS: &[&str] = &["", "\x06\x163", "\x06\x166", "\x06\x169"];

/// Celery queues as Redis lists.
pub(super) struct RedisLists {
    conn: ConnectionManager,
    /// Every list read, in order.
    lists: Vec<String>,
    publish_to: String,
    /// unacked hash, unacked index, delayed set, delivery counts.
    keys: [String; 4],
    take: Script,
    settle: Script,
}

impl RedisLists {
    pub(super) async fn connect(url: &str, queues: &[String], namespace: &str) -> anyhow::Result<Self> {
        let shown = crate::text::redact_url(url);
        let client = redis::Client::open(url)
            .with_context(|| format!("broker.url {shown:?} is not a valid Redis URL (redis://[:password@]host:port[/db])"))?;
        let conn = ConnectionManager::new(client)
            .await
            .with_context(|| format!("cannot connect to Redis at broker.url = {shown:?}: is the server running?"))?;
        Ok(RedisLists {
            conn,
            lists: queues
                .iter()
                .flat_map(|q| PRIORITY_LISTS.iter().map(move |p| format!("{q}{p}")))
                .collect(),
            publish_to: queues[0].clone(),
            keys: ["unacked", "unacked_index", "delayed", "delivered"].map(|k| format!("{namespace}:celery:{k}")),
            take: Script::new(include_str!("../../../lua/celery_take.lua")),
            settle: Script::new(include_str!("../../../lua/celery_settle.lua")),
        })
    }

    /// Run the settle script (`op` and its arguments).
    async fn settle(&self, args: &[&[u8]]) -> Result<u64, BrokerError> {
        let mut call = self.settle.prepare_invoke();
        for k in &self.keys {
            call.key(k);
        }
        for a in args {
            call.arg(*a);
        }
        call.invoke_async(&mut self.conn.clone()).await.map_err(unavailable)
    }

    /// Run the settle script on receipts.
    async fn settle_tags(&self, mut args: Vec<&[u8]>, receipts: &[&str]) -> Result<(), BrokerError> {
        if receipts.is_empty() {
            return Ok(());
        }
        args.extend(receipts.iter().map(|r| r.as_bytes()));
        self.settle(&args).await.map(drop)
    }

    /// Move tasks into the unacked hash: `(tag, times delivered, envelope)`.
    async fn take_entries(&self, max: usize, visibility: Duration) -> Result<Vec<(String, u32, Vec<u8>)>, BrokerError> {
        let mut call = self.take.prepare_invoke();
        for k in self.keys.iter().chain(&self.lists) {
            call.key(k);
        }
        call.arg(now_ms())
            .arg(visibility.as_millis() as u64)
            .arg(MOVE_LIMIT)
            .arg(max)
            .arg(uuid::Uuid::new_v4().simple().to_string());
        let (restored, taken): (u64, Vec<_>) = call.invoke_async(&mut self.conn.clone()).await.map_err(unavailable)?;
        if restored > 0 {
            tracing::info!(
                restored,
                "Celery tasks whose visibility ended (their worker stopped or stalled) went back to their queues"
            );
        }
        Ok(taken)
    }
}

fn unavailable(e: redis::RedisError) -> BrokerError {
    BrokerError::Unavailable(e.to_string())
}

#[async_trait]
impl Transport for RedisLists {
    async fn take(&self, max: usize, visibility: Duration) -> Result<Vec<Taken>, BrokerError> {
        for round in 0..2 {
            if round == 1 {
                tokio::time::sleep(IDLE_WAIT).await;
            }
            let taken = self.take_entries(max, visibility).await?;
            if !taken.is_empty() {
                return Ok(taken
                    .into_iter()
                    .map(|(receipt, count, raw)| Taken {
                        receipt,
                        count,
                        task: wire::decode(&raw),
                        raw,
                    })
                    .collect());
            }
        }
        Ok(Vec::new())
    }

    async fn hold(&self, receipt: &str, due_ms: i64) -> Result<(), BrokerError> {
        let due = due_ms.to_string();
        self.settle(&[b"defer", receipt.as_bytes(), due.as_bytes(), b"", b"1"])
            .await
            .map(drop)
    }

    async fn publish(&self, messages: &[Message], delay: Duration) -> Result<(), BrokerError> {
        let due = crate::broker::due_at(now_ms(), delay);
        let mut pipe = redis::pipe();
        pipe.atomic();
        for m in messages {
            let raw = wire::encode(m, &self.publish_to);
            if delay.is_zero() {
                pipe.cmd("LPUSH").arg(&self.publish_to).arg(raw).ignore();
            } else {
                let mut member = format!("{}:{}", self.publish_to.len(), self.publish_to).into_bytes();
                member.extend_from_slice(&raw);
                pipe.cmd("ZADD").arg(&self.keys[2]).arg(due).arg(member).ignore();
            }
        }
        pipe.query_async::<()>(&mut self.conn.clone()).await.map_err(unavailable)
    }

    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        self.settle_tags(vec![b"ack"], receipts).await
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        let due = (now_ms() + delay.as_millis() as i64).to_string();
        self.settle(&[b"defer", receipt.as_bytes(), due.as_bytes(), b"", b"0"])
            .await
            .map(drop)
    }

    async fn retry(&self, receipt: &str, delay: Duration) -> Result<Option<String>, BrokerError> {
        let held: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&self.keys[0])
            .arg(receipt)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        // The entry is "<len>:<list><envelope>".
        let Some(envelope) = held.as_deref().and_then(|item| {
            let colon = item.iter().position(|b| *b == b':')?;
            let len: usize = std::str::from_utf8(&item[..colon]).ok()?.parse().ok()?;
            item.get(colon + 1 + len..)
        }) else {
            return Ok(None); // settled or restored meanwhile: a stale receipt
        };
        let bumped = wire::with_retry(envelope);
        let due = (now_ms() + delay.as_millis() as i64).to_string();
        let held = self.settle(&[b"defer", receipt.as_bytes(), due.as_bytes(), &bumped, b"0"]).await?;
        Ok((held == 1).then(|| wire::decode(envelope).ok().map(|t| t.id)).flatten())
    }

    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError> {
        let deadline = (now_ms() + visibility.as_millis() as i64).to_string();
        self.settle_tags(vec![b"extend", deadline.as_bytes()], receipts).await
    }

    async fn pending(&self) -> Result<u64, BrokerError> {
        let mut pipe = redis::pipe();
        for l in &self.lists {
            pipe.cmd("LLEN").arg(l);
        }
        pipe.cmd("HLEN").arg(&self.keys[0]).cmd("ZCARD").arg(&self.keys[2]);
        let counts: Vec<Value> = pipe.query_async(&mut self.conn.clone()).await.map_err(unavailable)?;
        Ok(counts
            .into_iter()
            .map(|v| if let Value::Int(n) = v { n.max(0) as u64 } else { 0 })
            .sum())
    }

    fn semantics(&self) -> Semantics {
        Semantics::default()
    }
}
