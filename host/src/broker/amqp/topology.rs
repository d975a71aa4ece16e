//! The namespace's queues and exchange: declared by every worker at connect
//! (idempotently), deleted by tests and chaos runs.

use std::time::Duration;

use anyhow::Context;
use lapin::options::{ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use super::wire::string_value;

/// Delay queues, in milliseconds. Few and fixed: every bucket is a queue
/// each worker declares, and the worker's retry delays (busy retry,
/// exponential backoff) land within a factor of about 5 of what they asked.
const DELAY_BUCKETS_MS: [u64; 7] = [50, 250, 1_000, 5_000, 30_000, 120_000, 600_000];

/// The queues and exchange one broker uses.
pub(super) struct Names {
    /// The queues consumed; the first is where `publish` sends.
    pub(super) queues: Vec<String>,
    /// Idem's own dead-letter exchange and queue (Idem's own topology);
    /// `None` when the queues belong to another system (Celery's), whose
    /// queues Idem declares only as that system does.
    pub(super) dead: Option<String>,
    /// Each consumed queue's delay buckets, which expire back into it.
    pub(super) delays: Vec<Vec<(u64, String)>>,
}

impl Names {
    /// Idem's own queues in `namespace`.
    pub(super) fn new(namespace: &str) -> Self {
        Names {
            queues: vec![format!("{namespace}.queue")],
            dead: Some(format!("{namespace}.dead")),
            // `retry`, not the `delay` of earlier versions: those were
            // classic queues, and a queue cannot change its type.
            delays: vec![buckets(&format!("{namespace}.retry"))],
        }
    }

    /// Another system's `queues` (Celery's), with Idem's delay buckets for
    /// each under `namespace`.
    pub(super) fn foreign(namespace: &str, queues: &[String]) -> Self {
        Names {
            delays: queues.iter().map(|q| buckets(&format!("{namespace}.celery.{q}.retry"))).collect(),
            queues: queues.to_vec(),
            dead: None,
        }
    }

    /// Where a message for consumed queue `queue` that should become
    /// visible after `delay` goes.
    pub(super) fn route(&self, queue: usize, delay: Duration) -> &str {
        if delay.is_zero() {
            return &self.queues[queue];
        }
        let ms = delay.as_millis();
        let delays = &self.delays[queue];
        let bucket = delays.iter().find(|(bucket, _)| u128::from(*bucket) >= ms);
        &bucket.or(delays.last()).expect("there are delay buckets").1
    }
}

fn buckets(prefix: &str) -> Vec<(u64, String)> {
    DELAY_BUCKETS_MS.iter().map(|ms| (*ms, format!("{prefix}.{ms}"))).collect()
}

/// Declare the exchange and queues: Idem's own with its dead-letter
/// exchange; another system's as that system declares them (durable, no
/// arguments) unless they exist already, whatever their settings.
pub(super) async fn declare(conn: &Connection, ch: &Channel, names: &Names) -> anyhow::Result<()> {
    let mismatch = |what: &str, name: &str| {
        format!(
            "cannot declare RabbitMQ {what} {name}: if it exists with other settings (durability, x-message-ttl, dead-letter arguments), \
             delete it or choose another namespace"
        )
    };
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    if let Some(dead) = &names.dead {
        ch.exchange_declare(
            dead.as_str().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .with_context(|| mismatch("exchange", dead))?;
        ch.queue_declare(dead.as_str().into(), durable, FieldTable::default())
            .await
            .with_context(|| mismatch("queue", dead))?;
        ch.queue_bind(
            dead.as_str().into(),
            dead.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("cannot bind RabbitMQ queue {dead} to exchange {dead}"))?;
        let mut main = FieldTable::default();
        main.insert("x-dead-letter-exchange".into(), string_value(dead));
        for queue in &names.queues {
            ch.queue_declare(queue.as_str().into(), durable, main.clone())
                .await
                .with_context(|| mismatch("queue", queue))?;
        }
    } else {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        for queue in &names.queues {
            // A missing queue closes the channel it is asked about on.
            let probe = conn.create_channel().await.context("cannot open a RabbitMQ channel")?;
            if probe
                .queue_declare(queue.as_str().into(), passive, FieldTable::default())
                .await
                .is_ok()
            {
                let _ = probe.close(200, "OK".into()).await;
                continue;
            }
            ch.queue_declare(queue.as_str().into(), durable, FieldTable::default())
                .await
                .with_context(|| format!("cannot declare RabbitMQ queue {queue} (durable, as Celery declares it)"))?;
        }
    }
    for (queue, delays) in names.queues.iter().zip(&names.delays) {
        for (ms, name) in delays {
            ch.queue_declare(name.as_str().into(), durable, delay_queue_arguments(*ms, queue))
                .await
                .with_context(|| mismatch("queue", name))?;
        }
    }
    Ok(())
}

/// A delay queue: messages expire after `ms` and are dead-lettered back to
/// `target`. A quorum queue with at-least-once dead-lettering: the
/// broker keeps an expired message until the main queue has confirmed its
/// copy, so a retry delay never loses a message (a classic queue's
/// dead-lettering is fire-and-forget, and a broker crash mid-way drops it).
pub(super) fn delay_queue_arguments(ms: u64, target: &str) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), string_value("quorum"));
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ms as i64));
    // The default exchange ("") routes by queue name: expired messages go
    // straight back to the main queue.
    args.insert("x-dead-letter-exchange".into(), string_value(""));
    args.insert("x-dead-letter-routing-key".into(), string_value(target));
    args.insert("x-dead-letter-strategy".into(), string_value("at-least-once"));
    // Required by at-least-once dead-lettering (nothing is ever dropped
    // from the head to make room).
    args.insert("x-overflow".into(), string_value("reject-publish"));
    args
}

/// Delete the queues and exchange Idem owns of `names`: all of them for
/// Idem's own topology, only the delay queues for another system's.
pub(super) async fn delete(url: &str, names: &Names) -> anyhow::Result<()> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let delays = names.delays.iter().flatten().map(|(_, name)| name);
    let own = names.dead.iter().chain(names.dead.iter().flat_map(|_| &names.queues));
    for q in own.chain(delays) {
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await?;
    }
    if let Some(dead) = &names.dead {
        ch.exchange_delete(dead.as_str().into(), ExchangeDeleteOptions::default()).await?;
    }
    conn.close(200, "OK".into()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_to_a_bucket() {
        let n = Names::new("ns");
        assert_eq!(n.route(0, Duration::ZERO), "ns.queue");
        assert_eq!(n.route(0, Duration::from_millis(1)), "ns.retry.50");
        assert_eq!(n.route(0, Duration::from_millis(50)), "ns.retry.50");
        assert_eq!(n.route(0, Duration::from_millis(51)), "ns.retry.250");
        assert_eq!(n.route(0, Duration::from_secs(4)), "ns.retry.5000");
        assert_eq!(n.route(0, Duration::from_secs(3600)), "ns.retry.600000");
        let celery = Names::foreign("ns", &["a".into(), "b".into()]);
        assert_eq!(celery.route(1, Duration::ZERO), "b");
        assert_eq!(celery.route(1, Duration::from_secs(1)), "ns.celery.b.retry.1000");
        assert_eq!(celery.dead, None);
    }
}
