//! Celery interop: Idem consumes the tasks Celery producers send
//! (`send_task`, `delay`, `apply_async`) from the same queues Celery workers
//! read, on Celery's Redis transport ([`redis`]) or its AMQP transport on
//! RabbitMQ ([`amqp`]), and answers through Celery's Redis result backend
//! ([`results`]). What a handler sees of a task is in [`wire`].
//!
//! What happens to a task, whatever the transport:
//! - due later (`eta`, `countdown`): held by the transport until due,
//!   instead of being held unacked in memory as Celery workers do (whose
//!   redelivery after the visibility timeout runs it twice);
//! - `expires` in the past: dead-lettered unrun and reported `REVOKED`, as
//!   Celery does;
//! - a task name no plugin serves, a canvas, protocol 1, a non-JSON body:
//!   dead-lettered with the reason (and `FAILURE` when it has an id): Idem
//!   consumes only `broker.queues`, so such a task was routed to Idem;
//! - a retry: requeued with Celery's `retries` header one higher, shown as
//!   `RETRY` in the result backend meanwhile.
//!
//! Receipts are `r:<transport receipt>`, or `e:<…>` for an expired task
//! (answered `REVOKED`).

pub mod amqp;
pub mod redis;
pub mod results;
pub use idem_wire::celery as wire;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::bail;
use async_trait::async_trait;

use self::results::{Overwrite, RedisResults, Report, Status};
use self::wire::{Message, Task, Unreadable};
use super::{Answer, Broker, BrokerError, Semantics, Verdict};
use crate::envelope::{Delivery, Envelope};
use crate::now_ms;

/// What the Celery broker needs from the configuration.
#[derive(Debug, Clone)]
pub struct CeleryOptions {
    /// `broker.url`: `redis://` or `amqp://`.
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
    /// The deployment's namespace: Idem's own keys and queues live under it.
    pub namespace: String,
}

/// A message a transport took off a queue.
pub(crate) struct Taken {
    /// The transport's receipt.
    pub(crate) receipt: String,
    /// Times delivered.
    pub(crate) count: u32,
    /// The task, or why it cannot run.
    pub(crate) task: Result<Task, Unreadable>,
    /// The message as it came, kept in the dead letter of one that cannot run.
    pub(crate) raw: Vec<u8>,
}

/// How Celery messages travel: the Redis lists or RabbitMQ queues of
/// Celery's transports. Receipts are the transport's own.
#[async_trait]
pub(crate) trait Transport: Send + Sync {
    /// Take up to `max` messages, each invisible to others for `visibility`
    /// (as [`Transport::semantics`] says).
    async fn take(&self, max: usize, visibility: Duration) -> Result<Vec<Taken>, BrokerError>;
    /// Put a taken message back until `due_ms`, without counting it as a
    /// delivery (a task waiting for its ETA).
    async fn hold(&self, receipt: &str, due_ms: i64) -> Result<(), BrokerError>;
    /// Send tasks to the first queue, visible after `delay`.
    async fn publish(&self, messages: &[Message], delay: Duration) -> Result<(), BrokerError>;
    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError>;
    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError>;
    /// Requeue a taken task after `delay` with `retries` one higher; its
    /// task id, or `None` for a receipt no longer held.
    async fn retry(&self, receipt: &str, delay: Duration) -> Result<Option<String>, BrokerError>;
    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError>;
    async fn pending(&self) -> Result<u64, BrokerError>;
    fn semantics(&self) -> Semantics;
}

/// Celery tasks from a Celery transport (see the module documentation).
pub struct CeleryBroker {
    transport: Box<dyn Transport>,
    tasks: HashMap<String, String>,
    /// Plugin → task name, for publishing.
    names: HashMap<String, String>,
    results: Option<RedisResults>,
    origin: String,
}

impl CeleryBroker {
    /// Connect to the broker and, when one is set, the result backend.
    pub async fn connect(o: CeleryOptions) -> anyhow::Result<Self> {
        let shown = crate::text::redact_url(&o.url);
        if o.queues.is_empty() || o.queues.iter().any(String::is_empty) {
            bail!("broker.queues must name at least one Celery queue (Celery's default is \"celery\")");
        }
        let transport: Box<dyn Transport> = match o.url.split_once("://").map(|(scheme, _)| scheme) {
            Some("redis" | "rediss") => Box::new(redis::RedisLists::connect(&o.url, &o.queues, &o.namespace).await?),
            Some("amqp" | "amqps") => Box::new(amqp::AmqpTasks::connect(&o.url, &o.queues, &o.namespace).await?),
            _ => bail!(
                "broker.url {shown:?}: the celery broker reads Celery's Redis or AMQP (RabbitMQ) transport and needs a redis:// or amqp:// URL"
            ),
        };
        let results = match &o.result_backend {
            Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                Some(RedisResults::connect(url, o.result_expires).await?)
            }
            Some(url) => bail!(
                "broker.result_backend {:?}: Idem writes results to Celery's Redis result backend only (redis://); \
                 set broker.result_backend = \"\" to write none",
                crate::text::redact_url(url)
            ),
            None => None,
        };
        Ok(CeleryBroker {
            transport,
            names: o.tasks.iter().map(|(t, p)| (p.clone(), t.clone())).collect(),
            tasks: o.tasks,
            results,
            origin: format!("idem@{}", crate::text::hostname()),
        })
    }

    /// The delivery of one message taken, or `None` when it is due later
    /// and was held back.
    async fn deliver(&self, t: Taken, now: i64) -> Result<Option<Delivery>, BrokerError> {
        let count = t.count;
        let refused = |id: String, handler: String, reason: String, receipt: String, raw: Vec<u8>| Delivery {
            envelope: Envelope {
                id,
                handler,
                headers: vec![(REFUSED_HEADER.to_string(), "the payload is the message as it came".to_string())],
                payload: raw,
            },
            receipt,
            delivery_count: count,
            refused: Some(reason),
        };
        let task = match t.task {
            Ok(task) => task,
            Err(bad) => {
                let handler = self.tasks.get(&bad.name).cloned().unwrap_or_default();
                return Ok(Some(refused(bad.id, handler, bad.reason, format!("r:{}", t.receipt), t.raw)));
            }
        };
        if let Some(eta) = task.eta_ms.filter(|eta| *eta > now) {
            self.transport.hold(&t.receipt, eta).await?;
            return Ok(None);
        }
        let Some(plugin) = self.tasks.get(&task.name) else {
            let reason = format!(
                "no plugin serves Celery task {:?}: set celery_task = {:?} under the plugin's [plugins.NAME] section, or route the task to a queue Idem does not consume (broker.queues)",
                task.name, task.name
            );
            return Ok(Some(refused(task.id, String::new(), reason, format!("r:{}", t.receipt), t.raw)));
        };
        if let Some(expires) = task.expires_ms.filter(|e| *e <= now) {
            let reason = format!(
                "expired at {} (the task's expires), dropped unrun as Celery does",
                wire::format_time(expires)
            );
            return Ok(Some(refused(
                task.id,
                plugin.clone(),
                reason,
                format!("e:{}", t.receipt),
                task.payload,
            )));
        }
        Ok(Some(Delivery {
            envelope: Envelope {
                id: task.id,
                handler: plugin.clone(),
                headers: task.headers,
                payload: task.payload,
            },
            receipt: format!("r:{}", t.receipt),
            delivery_count: count,
            refused: None,
        }))
    }
}

/// The transport's receipt, and whether the task expired.
fn parse_receipt(receipt: &str) -> Result<(&str, bool), BrokerError> {
    match receipt.split_once(':') {
        Some(("r", inner)) if !inner.is_empty() => Ok((inner, false)),
        Some(("e", inner)) if !inner.is_empty() => Ok((inner, true)),
        _ => Err(BrokerError::Unavailable(format!("malformed Celery receipt {receipt:?}"))),
    }
}

fn inner_receipts<'a>(receipts: &[&'a str]) -> Result<Vec<&'a str>, BrokerError> {
    receipts.iter().map(|r| parse_receipt(r).map(|(inner, _)| inner)).collect()
}

/// The header of a Celery message refused when read (its dead letter's):
/// its payload is the message as it came, not a task's arguments, so it is
/// not published again as a task (a replay of it is refused).
pub const REFUSED_HEADER: &str = "idem-celery-refused";

#[async_trait]
impl Broker for CeleryBroker {
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError> {
        if envelopes.is_empty() {
            return Ok(());
        }
        let mut messages = Vec::with_capacity(envelopes.len());
        for e in envelopes {
            self.republishable(e).map_err(BrokerError::Unavailable)?;
            let task = self.names.get(&e.handler).ok_or_else(|| {
                BrokerError::Unavailable(format!(
                    "plugin {:?} has no celery_task: set one under [plugins.{}] to publish to it through Celery",
                    e.handler, e.handler
                ))
            })?;
            messages.push(wire::message(&e.id, task, &e.headers, &e.payload, &self.origin));
        }
        self.transport.publish(&messages, delay).await
    }

    fn republishable(&self, e: &Envelope) -> Result<(), String> {
        if e.headers.iter().any(|(name, _)| name == REFUSED_HEADER) {
            return Err(format!(
                "message {:?} is a Celery message Idem refused when it read it, kept as it came: sent again, its whole text would be a task's argument; fix what its dead letter's reason names and send the task again from its producer",
                e.id
            ));
        }
        Ok(())
    }

    async fn fetch(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, BrokerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let taken = self.transport.take(max, visibility).await?;
        let now = now_ms();
        let mut out = Vec::with_capacity(taken.len());
        for t in taken {
            if let Some(d) = self.deliver(t, now).await? {
                out.push(d);
            }
        }
        Ok(out)
    }

    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        self.transport.ack(&inner_receipts(receipts)?).await
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        self.transport.nack(parse_receipt(receipt)?.0, delay).await
    }

    async fn retry(&self, receipt: &str, delay: Duration, reason: &str) -> Result<(), BrokerError> {
        let Some(task_id) = self.transport.retry(parse_receipt(receipt)?.0, delay).await? else {
            return Ok(()); // settled or given back meanwhile: a stale receipt
        };
        // As a Celery worker's retry does: the task shows RETRY (not a final
        // state, so a waiting get() keeps waiting) until it ends.
        if let Some(results) = &self.results {
            let retry = Report {
                task_id: &task_id,
                status: Status::Retry(reason),
                overwrite: Overwrite::UnlessFinal,
            };
            if let Err(e) = results.write(&[retry], now_ms()).await {
                tracing::warn!(error = %e, task = %task_id, "cannot record the RETRY state of a Celery task; its retry is queued");
            }
        }
        Ok(())
    }

    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError> {
        self.transport.extend(&inner_receipts(receipts)?, visibility).await
    }

    async fn pending(&self) -> Result<u64, BrokerError> {
        self.transport.pending().await
    }

    fn semantics(&self) -> Semantics {
        self.transport.semantics()
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
                let (status, overwrite) = match a.verdict {
                    Verdict::Done(result) => (Status::Success(result), Overwrite::Always),
                    Verdict::Failed(reason) if expired => (Status::Revoked(reason), Overwrite::UnlessFinal),
                    Verdict::Failed(reason) => (Status::Failure(reason), Overwrite::UnlessFinal),
                    Verdict::Duplicate { failed: false, result } => (Status::Success(result), Overwrite::Never),
                    Verdict::Duplicate { failed: true, .. } => (
                        Status::Failure("dead-lettered by an earlier delivery of this task; see idem dlq"),
                        Overwrite::Never,
                    ),
                };
                Report {
                    task_id: a.msg_id,
                    status,
                    overwrite,
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
        assert_eq!(parse_receipt("r:3.17").unwrap(), ("3.17", false));
        for bad in ["", "abc", "r:", "x:abc"] {
            assert!(parse_receipt(bad).is_err(), "{bad:?}");
        }
    }
}
