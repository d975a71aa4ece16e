//! Celery's AMQP transport (RabbitMQ). kombu publishes a task to the
//! queue's exchange with the queue's name as routing key; the message has
//! `content_type`, `correlation_id` (the task id) and the protocol 2 headers
//! as AMQP properties, and the raw JSON `[args, kwargs, embed]` as its body.
//!
//! Idem consumes the configured queues with manual acks, through the same
//! connection handling as the `rabbitmq` broker (prefetch, publisher
//! confirms, a reconnect that invalidates old receipts): a task stays with
//! the connection that received it until it is acked, and a worker that
//! dies gives its tasks back when its connection drops. The queues are
//! Celery's: Idem declares one only if it is missing, durable and without
//! arguments, as Celery does, and never changes one that exists.
//!
//! Retries, ETA and countdown: RabbitMQ has no per-message delay, so a task
//! due later is republished (confirmed, then the delivery acked) into one of
//! Idem's delay queues for that queue (`{namespace}.celery.{queue}.retry.{ms}`),
//! which expire it back into the queue; a task due after the longest delay
//! comes back and waits again. This replaces the Celery worker's way of
//! holding ETA tasks unacked in memory. A retry's copy carries `retries`
//! one higher.

use std::time::Duration;

use async_trait::async_trait;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use lapin::BasicProperties;
use serde_json::{Map, Number, Value};

use super::wire::{self, Message, Parts};
use super::{Taken, Transport};
use crate::broker::amqp::{copy_properties, value_string, AmqpBroker, Incoming};
use crate::broker::{Broker, BrokerError, Semantics};
use crate::now_ms;

/// Celery queues on RabbitMQ.
pub(super) struct AmqpTasks {
    broker: AmqpBroker,
}

impl AmqpTasks {
    pub(super) async fn connect(url: &str, queues: &[String], namespace: &str) -> anyhow::Result<Self> {
        Ok(AmqpTasks {
            broker: AmqpBroker::connect_foreign(url, namespace, queues).await?,
        })
    }
}

/// What a delivery is to the Celery broker.
fn taken(d: Incoming<'_>) -> Taken {
    let headers = match d.properties.headers() {
        Some(table) => table_json(table),
        None => Map::new(),
    };
    let text = |s: Option<&lapin::types::ShortString>| s.map(|s| s.to_string()).unwrap_or_default();
    let correlation_id = text(d.properties.correlation_id().as_ref());
    let content_type = text(d.properties.content_type().as_ref());
    let task = wire::read(Parts {
        headers: &headers,
        correlation_id: &correlation_id,
        content_type: &content_type,
        body: d.body,
    });
    Taken {
        receipt: d.receipt,
        count: d.deliveries,
        task,
        raw: d.body.to_vec(),
    }
}

/// An AMQP table as JSON, as kombu reads it (void is None).
fn table_json(table: &FieldTable) -> Map<String, Value> {
    table.inner().iter().map(|(k, v)| (k.to_string(), value_json(v))).collect()
}

fn value_json(v: &AMQPValue) -> Value {
    match v {
        AMQPValue::Void => Value::Null,
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => (*n).into(),
        AMQPValue::Timestamp(n) => (*n).into(),
        AMQPValue::Float(n) => Number::from_f64(f64::from(*n)).map_or(Value::Null, Value::Number),
        AMQPValue::Double(n) => Number::from_f64(*n).map_or(Value::Null, Value::Number),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(value_json).collect()),
        AMQPValue::FieldTable(t) => Value::Object(table_json(t)),
        other => Value::String(value_string(other)),
    }
}

/// JSON as an AMQP value, as kombu writes it.
fn json_value(v: &Value) -> AMQPValue {
    match v {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => AMQPValue::LongLongInt(i),
            (None, Some(f)) => AMQPValue::Double(f),
            (None, None) => AMQPValue::Void,
        },
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        Value::Array(a) => AMQPValue::FieldArray(FieldArray::from(a.iter().map(json_value).collect::<Vec<_>>())),
        Value::Object(m) => AMQPValue::FieldTable(json_table(m)),
    }
}

fn json_table(m: &Map<String, Value>) -> FieldTable {
    let mut table = FieldTable::default();
    for (k, v) in m {
        table.insert(k.as_str().into(), json_value(v));
    }
    table
}

/// The properties kombu gives a task.
fn properties(m: &Message) -> BasicProperties {
    let headers = m.headers.as_object().map(json_table).unwrap_or_default();
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_content_encoding("utf-8".into())
        .with_correlation_id(m.id.as_str().into())
        .with_delivery_mode(2)
        .with_priority(0)
        .with_headers(headers)
}

/// The same properties with the task's `retries` header one higher.
fn with_retry(properties: BasicProperties) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    let retries = headers.inner().get("retries").and_then(|v| value_json(v).as_i64()).unwrap_or(0);
    headers.insert("retries".into(), AMQPValue::LongLongInt(retries + 1));
    properties.with_headers(headers)
}

/// The task id of a held delivery's properties.
fn task_id(properties: &BasicProperties) -> Option<String> {
    let headers = properties.headers().as_ref().map(table_json).unwrap_or_default();
    let id = headers.get("id").and_then(Value::as_str).map(str::to_string);
    id.or_else(|| properties.correlation_id().as_ref().map(|c| c.to_string()))
}

#[async_trait]
impl Transport for AmqpTasks {
    async fn take(&self, max: usize, _visibility: Duration) -> Result<Vec<Taken>, BrokerError> {
        self.broker.take_with(max, taken).await
    }

    async fn hold(&self, receipt: &str, due_ms: i64) -> Result<(), BrokerError> {
        let delay = Duration::from_millis(due_ms.saturating_sub(now_ms()).max(1) as u64);
        // Waiting for its ETA is not a delivery: the count stays.
        self.broker.copy_back(receipt, delay, copy_properties).await.map(drop)
    }

    async fn publish(&self, messages: &[Message], delay: Duration) -> Result<(), BrokerError> {
        let sent = messages.iter().map(|m| (m.body.as_slice(), properties(m))).collect();
        self.broker.send_all(0, sent, delay).await
    }

    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        self.broker.ack(receipts).await
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        self.broker.nack(receipt, delay).await
    }

    async fn retry(&self, receipt: &str, delay: Duration) -> Result<Option<String>, BrokerError> {
        let copy = |p: BasicProperties, n: u32| with_retry(copy_properties(p, n + 1));
        Ok(self.broker.copy_back(receipt, delay, copy).await?.as_ref().and_then(task_id))
    }

    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError> {
        self.broker.extend(receipts, visibility).await
    }

    async fn pending(&self) -> Result<u64, BrokerError> {
        self.broker.pending().await
    }

    fn semantics(&self) -> Semantics {
        self.broker.semantics()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn headers_round_trip_between_json_and_amqp_tables() {
        let headers = json!({"task": "t", "id": "x", "retries": 2, "eta": null, "timelimit": [null, 30.5],
                             "stamps": {"a": true}, "ignore_result": false});
        let table = json_table(headers.as_object().unwrap());
        assert_eq!(Value::Object(table_json(&table)), headers);
        let bumped = with_retry(BasicProperties::default().with_headers(table));
        assert_eq!(table_json(bumped.headers().as_ref().unwrap())["retries"], 3);
        assert_eq!(task_id(&bumped).as_deref(), Some("x"));
    }

    #[test]
    fn a_message_kombu_would_send_reads_back_as_its_task() {
        let m = wire::message("t-1", "billing.pay", &[], br#"{"args":[1],"kwargs":{}}"#, "o");
        let p = properties(&m);
        let t = taken(Incoming {
            receipt: "1.1".into(),
            deliveries: 1,
            properties: &p,
            body: &m.body,
        });
        let task = t.task.unwrap();
        assert_eq!((task.id.as_str(), task.name.as_str()), ("t-1", "billing.pay"));
        assert_eq!(task.payload, br#"{"args":[1],"kwargs":{}}"#);
    }
}
