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

/// The names of one namespace's queues and exchange.
pub(super) struct Names {
    pub(super) queue: String,
    pub(super) dead: String,
    pub(super) delays: Vec<(u64, String)>,
}

impl Names {
    pub(super) fn new(namespace: &str) -> Self {
        Names {
            queue: format!("{namespace}.queue"),
            dead: format!("{namespace}.dead"),
            // `retry`, not the `delay` of earlier versions: those were
            // classic queues, and a queue cannot change its type.
            delays: DELAY_BUCKETS_MS.iter().map(|ms| (*ms, format!("{namespace}.retry.{ms}"))).collect(),
        }
    }

    /// Where a message that should become visible after `delay` goes.
    pub(super) fn route(&self, delay: Duration) -> &str {
        if delay.is_zero() {
            return &self.queue;
        }
        let ms = delay.as_millis();
        let bucket = self.delays.iter().find(|(bucket, _)| u128::from(*bucket) >= ms);
        &bucket.or(self.delays.last()).expect("there are delay buckets").1
    }
}

/// Declare the namespace's exchange and queues.
pub(super) async fn declare(ch: &Channel, names: &Names) -> anyhow::Result<()> {
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
    ch.exchange_declare(
        names.dead.as_str().into(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .with_context(|| mismatch("exchange", &names.dead))?;
    ch.queue_declare(names.dead.as_str().into(), durable, FieldTable::default())
        .await
        .with_context(|| mismatch("queue", &names.dead))?;
    ch.queue_bind(
        names.dead.as_str().into(),
        names.dead.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .with_context(|| format!("cannot bind RabbitMQ queue {0} to exchange {0}", names.dead))?;

    let mut main = FieldTable::default();
    main.insert("x-dead-letter-exchange".into(), string_value(&names.dead));
    ch.queue_declare(names.queue.as_str().into(), durable, main)
        .await
        .with_context(|| mismatch("queue", &names.queue))?;

    for (ms, name) in &names.delays {
        ch.queue_declare(name.as_str().into(), durable, delay_queue_arguments(*ms, names))
            .await
            .with_context(|| mismatch("queue", name))?;
    }
    Ok(())
}

/// A delay queue: messages expire after `ms` and are dead-lettered back to
/// the main queue. A quorum queue with at-least-once dead-lettering: the
/// broker keeps an expired message until the main queue has confirmed its
/// copy, so a retry delay never loses a message (a classic queue's
/// dead-lettering is fire-and-forget, and a broker crash mid-way drops it).
pub(super) fn delay_queue_arguments(ms: u64, names: &Names) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), string_value("quorum"));
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ms as i64));
    // The default exchange ("") routes by queue name: expired messages go
    // straight back to the main queue.
    args.insert("x-dead-letter-exchange".into(), string_value(""));
    args.insert("x-dead-letter-routing-key".into(), string_value(&names.queue));
    args.insert("x-dead-letter-strategy".into(), string_value("at-least-once"));
    // Required by at-least-once dead-lettering (nothing is ever dropped
    // from the head to make room).
    args.insert("x-overflow".into(), string_value("reject-publish"));
    args
}

/// Delete the queues and exchange `names` declares.
pub(super) async fn delete(url: &str, names: &Names) -> anyhow::Result<()> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let delays = names.delays.iter().map(|(_, name)| name);
    for q in [&names.queue, &names.dead].into_iter().chain(delays) {
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default()).await?;
    }
    ch.exchange_delete(names.dead.as_str().into(), ExchangeDeleteOptions::default())
        .await?;
    conn.close(200, "OK".into()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_up_to_a_bucket() {
        let n = Names::new("ns");
        assert_eq!(n.route(Duration::ZERO), "ns.queue");
        assert_eq!(n.route(Duration::from_millis(1)), "ns.retry.50");
        assert_eq!(n.route(Duration::from_millis(50)), "ns.retry.50");
        assert_eq!(n.route(Duration::from_millis(51)), "ns.retry.250");
        assert_eq!(n.route(Duration::from_secs(4)), "ns.retry.5000");
        assert_eq!(n.route(Duration::from_secs(3600)), "ns.retry.600000");
    }
}
