//! Celery's Redis transport: Idem consumes the tasks Celery producers send
//! (`send_task`, `delay`, `apply_async`) from the same lists Celery workers
//! read, and answers through Celery's Redis result backend.
//!
//! Lists: a queue `celery` is the Redis list `celery`, plus kombu's priority
//! lists `celery\x06\x163`, `…6` and `…9`, read in that order (kombu's
//! default priority steps; 0 is the highest priority).
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
//! ETA and countdown: a task due later is moved to the delayed set
//! (`{namespace}:celery:delayed`) until it is due, instead of being held
//! unacked in memory as Celery workers do (whose redelivery after the
//! visibility timeout runs it twice). `expires`: a task taken after it
//! expired is dead-lettered unrun and reported `REVOKED`, as Celery does.
//! Retries increment the task's `retries` header, so Celery tooling sees
//! what Celery workers would write. Lists are polled: an idle fetch waits
//! [`IDLE_WAIT`] before it looks again.
//!
//! Receipts are `r:<tag>`, or `e:<tag>` for an expired task (answered
//! `REVOKED`), where the tag is a fresh id per delivery.

pub mod results;
pub mod wire;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context};
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{Script, Value};

use self::results::{RedisResults, Report, Status};
use super::{Answer, Broker, BrokerError, Verdict};
use crate::envelope::{Delivery, Envelope};
use crate::now_ms;

/// How long an idle fetch waits before it looks at the lists again.
pub const IDLE_WAIT: Duration = Duration::from_millis(20);

/// Most restored or promoted entries per fetch.
const MOVE_LIMIT: usize = 1_000;

/// kombu's separator and default priority steps for priority lists.
const PRIORITY_LISTS: &[&str] = &["", "\x06\x163", "\x06\x166", "\x06\x169"];

/// What the Celery broker needs from the configuration.
#[derive(Debug, Clone)]
pub struct CeleryOptions {
    /// `broker.url`, a `redis://` URL.
    pub url: String,
    /// The queues consumed (`broker.queues`); the first is where `idem
    /// publish` sends.
    pub queues: Vec<String>,
    /// Task name → plugin (`celery_task` of each plugin).
    pub tasks: HashMap<String, String>,
    /// `broker.result_backend`; `None` writes no results.
    pub result_backend: Option<String>,
    /// How long results are kept (`broker.result_expires_secs`).
    pub result_expires: Duration,
    /// The deployment's namespace: Idem's own keys live under it.
    pub namespace: String,
}

/// Celery tasks from Redis lists (see the module documentation).
pub struct CeleryBroker {
    conn: ConnectionManager,
    /// Every list read, in order.
    lists: Vec<String>,
    publish_to: String,
    /// unacked hash, unacked index, delayed set, delivery counts.
    keys: [String; 4],
    tasks: HashMap<String, String>,
    /// Plugin → task name, for publishing.
    names: HashMap<String, String>,
    results: Option<RedisResults>,
    take: Script,
    settle: Script,
    origin: String,
}

impl CeleryBroker {
    /// Connect to the broker and, when one is set, the result backend.
    pub async fn connect(o: CeleryOptions) -> anyhow::Result<Self> {
        let shown = crate::text::redact_url(&o.url);
        if !(o.url.starts_with("redis://") || o.url.starts_with("rediss://")) {
            bail!("broker.url {shown:?}: the celery broker reads Celery's Redis transport and needs a redis:// URL (Celery over RabbitMQ is not supported yet)");
        }
        if o.queues.is_empty() || o.queues.iter().any(String::is_empty) {
            bail!("broker.queues must name at least one Celery queue (Celery's default is \"celery\")");
        }
        let client = redis::Client::open(o.url.as_str())
            .with_context(|| format!("broker.url {shown:?} is not a valid Redis URL (redis://[:password@]host:port[/db])"))?;
        let conn = ConnectionManager::new(client)
            .await
            .with_context(|| format!("cannot connect to Redis at broker.url = {shown:?}: is the server running?"))?;
        let results = match &o.result_backend {
            Some(url) => Some(RedisResults::connect(url, o.result_expires).await?),
            None => None,
        };
        let ns = &o.namespace;
        Ok(CeleryBroker {
            conn,
            lists: o
                .queues
                .iter()
                .flat_map(|q| PRIORITY_LISTS.iter().map(move |p| format!("{q}{p}")))
                .collect(),
            publish_to: o.queues[0].clone(),
            keys: ["unacked", "unacked_index", "delayed", "delivered"].map(|k| format!("{ns}:celery:{k}")),
            names: o.tasks.iter().map(|(t, p)| (p.clone(), t.clone())).collect(),
            tasks: o.tasks,
            results,
            take: Script::new(include_str!("../../../lua/celery_take.lua")),
            settle: Script::new(include_str!("../../../lua/celery_settle.lua")),
            origin: format!("idem@{}", crate::text::hostname()),
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

    /// Move tasks into the unacked hash: `(tag, times delivered, envelope)`.
    async fn take(&self, max: usize, visibility: Duration) -> Result<Vec<TakenEntry>, BrokerError> {
        let mut call = self.take.prepare_invoke();
        for k in self.keys.iter().chain(&self.lists) {
            call.key(k);
        }
        call.arg(now_ms())
            .arg(visibility.as_millis() as u64)
            .arg(MOVE_LIMIT)
            .arg(max)
            .arg(uuid::Uuid::new_v4().simple().to_string());
        let (restored, taken): (u64, Vec<TakenEntry>) = call.invoke_async(&mut self.conn.clone()).await.map_err(unavailable)?;
        if restored > 0 {
            tracing::info!(
                restored,
                "Celery tasks whose visibility ended (their worker stopped or stalled) went back to their queues"
            );
        }
        Ok(taken)
    }

    /// The delivery of one envelope taken with `tag`, or `None` when it is
    /// due later and was moved to the delayed set.
    async fn deliver(&self, tag: String, count: u32, raw: Vec<u8>, now: i64) -> Result<Option<Delivery>, BrokerError> {
        let refused = |id: String, handler: String, reason: String, receipt: String, raw: Vec<u8>| Delivery {
            envelope: Envelope {
                id,
                handler,
                headers: Vec::new(),
                payload: raw,
            },
            receipt,
            delivery_count: count,
            refused: Some(reason),
        };
        let task = match wire::decode(&raw) {
            Ok(task) => task,
            Err(bad) => {
                let handler = self.tasks.get(&bad.name).cloned().unwrap_or_default();
                return Ok(Some(refused(bad.id, handler, bad.reason, format!("r:{tag}"), raw)));
            }
        };
        if let Some(eta) = task.eta_ms.filter(|eta| *eta > now) {
            self.settle(&[b"defer", tag.as_bytes(), eta.to_string().as_bytes(), b"", b"1"])
                .await?;
            return Ok(None);
        }
        let Some(plugin) = self.tasks.get(&task.name) else {
            let reason = format!(
                "no plugin serves Celery task {:?}: set celery_task = {:?} under the plugin's [plugins.NAME] section, or route the task to a queue Idem does not consume (broker.queues)",
                task.name, task.name
            );
            return Ok(Some(refused(task.id, String::new(), reason, format!("r:{tag}"), raw)));
        };
        if let Some(expires) = task.expires_ms.filter(|e| *e <= now) {
            let reason = format!(
                "expired at {} (the task's expires), dropped unrun as Celery does",
                wire::format_time(expires)
            );
            return Ok(Some(refused(task.id, plugin.clone(), reason, format!("e:{tag}"), task.payload)));
        }
        Ok(Some(Delivery {
            envelope: Envelope {
                id: task.id,
                handler: plugin.clone(),
                headers: task.headers,
                payload: task.payload,
            },
            receipt: format!("r:{tag}"),
            delivery_count: count,
            refused: None,
        }))
    }
}

/// One task the take script moved: tag, times delivered, envelope.
type TakenEntry = (String, u32, Vec<u8>);

fn unavailable(e: redis::RedisError) -> BrokerError {
    BrokerError::Unavailable(e.to_string())
}

/// The tag of a receipt, and whether it is an expired task's.
fn parse_receipt(receipt: &str) -> Result<(&str, bool), BrokerError> {
    match receipt.split_once(':') {
        Some(("r", tag)) if !tag.is_empty() => Ok((tag, false)),
        Some(("e", tag)) if !tag.is_empty() => Ok((tag, true)),
        _ => Err(BrokerError::Unavailable(format!("malformed Celery receipt {receipt:?}"))),
    }
}

#[async_trait]
impl Broker for CeleryBroker {
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError> {
        if envelopes.is_empty() {
            return Ok(());
        }
        let due = now_ms() + delay.as_millis() as i64;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for e in envelopes {
            let task = self.names.get(&e.handler).ok_or_else(|| {
                BrokerError::Unavailable(format!(
                    "plugin {:?} has no celery_task: set one under [plugins.{}] to publish to it through Celery",
                    e.handler, e.handler
                ))
            })?;
            let raw = wire::encode(&e.id, task, &self.publish_to, &e.headers, &e.payload, &self.origin);
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

    async fn fetch(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, BrokerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        for round in 0..2 {
            if round == 1 {
                tokio::time::sleep(IDLE_WAIT).await;
            }
            let taken = self.take(max, visibility).await?;
            let now = now_ms();
            let mut out = Vec::with_capacity(taken.len());
            for (tag, count, raw) in taken {
                if let Some(d) = self.deliver(tag, count, raw, now).await? {
                    out.push(d);
                }
            }
            if !out.is_empty() {
                return Ok(out);
            }
        }
        Ok(Vec::new())
    }

    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        if receipts.is_empty() {
            return Ok(());
        }
        let mut args: Vec<&[u8]> = vec![b"ack"];
        for r in receipts {
            args.push(parse_receipt(r)?.0.as_bytes());
        }
        self.settle(&args).await.map(drop)
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        let (tag, _) = parse_receipt(receipt)?;
        let due = (now_ms() + delay.as_millis() as i64).to_string();
        self.settle(&[b"defer", tag.as_bytes(), due.as_bytes(), b"", b"0"]).await.map(drop)
    }

    async fn retry(&self, receipt: &str, delay: Duration, reason: &str) -> Result<(), BrokerError> {
        let (tag, _) = parse_receipt(receipt)?;
        let held: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&self.keys[0])
            .arg(tag)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        // The entry is "<len>:<list><envelope>".
        let Some(envelope) = held.as_deref().and_then(|item| {
            let colon = item.iter().position(|b| *b == b':')?;
            let len: usize = std::str::from_utf8(&item[..colon]).ok()?.parse().ok()?;
            item.get(colon + 1 + len..)
        }) else {
            return Ok(()); // settled or restored meanwhile: a stale receipt
        };
        let bumped = wire::with_retry(envelope);
        let due = (now_ms() + delay.as_millis() as i64).to_string();
        let held = self.settle(&[b"defer", tag.as_bytes(), due.as_bytes(), &bumped, b"0"]).await?;
        // As a Celery worker's retry does: the task shows RETRY (not a final
        // state, so a waiting get() keeps waiting) until it ends.
        if let (1, Some(results), Ok(task)) = (held, &self.results, wire::decode(envelope)) {
            let retry = Report {
                task_id: &task.id,
                status: Status::Retry(reason),
                only_if_absent: false,
            };
            if let Err(e) = results.write(&[retry], now_ms()).await {
                tracing::warn!(error = %e, task = %task.id, "cannot record the RETRY state of a Celery task; its retry is queued");
            }
        }
        Ok(())
    }

    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError> {
        if receipts.is_empty() {
            return Ok(());
        }
        let deadline = (now_ms() + visibility.as_millis() as i64).to_string();
        let mut args: Vec<&[u8]> = vec![b"extend", deadline.as_bytes()];
        for r in receipts {
            args.push(parse_receipt(r)?.0.as_bytes());
        }
        self.settle(&args).await.map(drop)
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

    fn answers(&self) -> bool {
        self.results.is_some()
    }

    async fn answer(&self, answers: &[Answer<'_>]) -> Result<(), BrokerError> {
        let Some(results) = &self.results else {
            return Ok(());
        };
        let reports: Vec<Report> = answers
            .iter()
            .filter(|a| !a.msg_id.is_empty())
            .map(|a| {
                let expired = parse_receipt(a.receipt).is_ok_and(|(_, e)| e);
                let (status, only_if_absent) = match a.verdict {
                    Verdict::Done(result) => (Status::Success(result), false),
                    Verdict::Failed(reason) if expired => (Status::Revoked(reason), false),
                    Verdict::Failed(reason) => (Status::Failure(reason), false),
                    Verdict::Duplicate { failed: false, result } => (Status::Success(result), true),
                    Verdict::Duplicate { failed: true, .. } => (
                        Status::Failure("dead-lettered by an earlier delivery of this task; see idem dlq"),
                        true,
                    ),
                };
                Report {
                    task_id: a.msg_id,
                    status,
                    only_if_absent,
                }
            })
            .collect();
        results.write(&reports, now_ms()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_name_their_tag_and_whether_the_task_expired() {
        assert_eq!(parse_receipt("r:abc").unwrap(), ("abc", false));
        assert_eq!(parse_receipt("e:abc").unwrap(), ("abc", true));
        for bad in ["", "abc", "r:", "x:abc"] {
            assert!(parse_receipt(bad).is_err(), "{bad:?}");
        }
    }
}
