//! What a chaos run does to the services themselves: create and drop a
//! run's namespace on them, terminate its Postgres connections, close its
//! broker connections.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use redis::AsyncCommands;

use crate::config::{BrokerKind, Config, StoreKind};
use crate::tools::kit::OwnRedis;

/// The Postgres URL of whichever role lives there.
fn postgres_url(config: &Config) -> Option<String> {
    if config.data.kind == StoreKind::Postgres {
        config.data.url.clone()
    } else if config.claims.kind == StoreKind::Postgres {
        config.claims.url.clone()
    } else {
        None
    }
}

pub(super) async fn terminate_postgres(config: &Config) -> Result<()> {
    let url = postgres_url(config).context("the deployment uses no Postgres")?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await?;
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()")
        .bind(format!("idem {}", config.namespace))
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(())
}

/// Close the deployment's broker connections from the server side; false
/// when the broker offers no way to do that here.
pub(super) async fn disconnect_broker(config: &Config, redis: Option<&OwnRedis>) -> Result<bool> {
    match config.broker.kind {
        BrokerKind::Redis => {
            let Some(r) = redis else { return Ok(false) };
            let client = ::redis::Client::open(r.url())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            // Every client but this one: workers reconnect.
            let _: i64 = ::redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("normal")
                .arg("SKIPME")
                .arg("yes")
                .query_async(&mut conn)
                .await?;
            Ok(true)
        }
        BrokerKind::Rabbitmq => {
            let out = Command::new("rabbitmqctl")
                .args(["-q", "list_connections", "--no-table-headers", "pid", "client_properties"])
                .output();
            let Ok(out) = out else { return Ok(false) };
            let text = String::from_utf8_lossy(&out.stdout);
            let mut closed = false;
            for line in text.lines().filter(|l| l.contains(&format!("{}.queue", config.namespace))) {
                if let Some(pid) = line.split_whitespace().next() {
                    let _ = Command::new("rabbitmqctl")
                        .args(["-q", "close_connection", pid, "idem chaos"])
                        .status();
                    closed = true;
                }
            }
            Ok(closed)
        }
        BrokerKind::Nats | BrokerKind::Sqlite | BrokerKind::Celery | BrokerKind::Sqs | BrokerKind::Kafka => Ok(false),
    }
}

/// Create what a run's namespace needs on a broker where Idem creates
/// nothing itself: the SQS queue (FIFO when the example's queue is), the
/// Kafka topic (four partitions).
pub async fn prepare_broker(config: &Config) -> Result<()> {
    if config.broker.kind == BrokerKind::Sqs {
        crate::broker::sqs::SqsBroker::create_queue(&crate::backend::sqs_options(config), &[]).await?;
    }
    if config.broker.kind == BrokerKind::Kafka {
        let options = crate::backend::kafka_options(config)?;
        for topic in &options.topics {
            crate::broker::kafka::KafkaBroker::create_topic(&options, topic, 4).await?;
        }
    }
    Ok(())
}

/// Drop a namespace's resources on its servers: the Postgres schema, the
/// RabbitMQ queues, the NATS stream, the SQS queue, the Kafka topic, the
/// Redis keys. Best
/// effort.
pub async fn cleanup(config: &Config) {
    let ns = &config.namespace;
    if config.broker.kind == BrokerKind::Sqs {
        crate::broker::sqs::SqsBroker::delete_queue(&crate::backend::sqs_options(config)).await;
    }
    if config.broker.kind == BrokerKind::Kafka {
        if let Ok(options) = crate::backend::kafka_options(config) {
            for topic in &options.topics {
                crate::broker::kafka::KafkaBroker::delete_topic(&options, topic).await;
            }
        }
    }
    if config.claims.kind == StoreKind::Postgres || config.data.kind == StoreKind::Postgres {
        if let Some(url) = postgres_url(config) {
            if let Ok(pool) = sqlx::PgPool::connect(&url).await {
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{ns}\" CASCADE")))
                    .execute(&pool)
                    .await;
            }
        }
    }
    if let (BrokerKind::Rabbitmq, Some(url)) = (config.broker.kind, &config.broker.url) {
        let _ = crate::broker::amqp::AmqpBroker::delete_namespace(url, ns).await;
    }
    if let (BrokerKind::Celery, Some(url)) = (config.broker.kind, &config.broker.url) {
        if url.starts_with("amqp") {
            // Idem's delay queues only: the Celery queues are Celery's.
            let _ = crate::broker::amqp::AmqpBroker::delete_foreign(url, ns, &config.broker.queues).await;
        }
    }
    if let (BrokerKind::Nats, Some(url)) = (config.broker.kind, &config.broker.url) {
        if let Ok(client) = async_nats::connect(url.as_str()).await {
            let _ = async_nats::jetstream::new(client).delete_stream(ns).await;
        }
    }
    let redis_urls = [
        matches!(config.broker.kind, BrokerKind::Redis | BrokerKind::Celery).then_some(&config.broker.url),
        (config.claims.kind == StoreKind::Redis).then_some(&config.claims.url),
    ];
    for url in redis_urls.into_iter().flatten().flatten() {
        let Ok(client) = redis::Client::open(url.as_str()) else { continue };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            continue;
        };
        // SCAN, not KEYS: a Redis shared with other work is not blocked
        // while a large keyspace is walked.
        let keys: Vec<String> = match conn.scan_match::<_, String>(format!("{ns}:*")).await {
            Ok(iter) => iter.filter_map(|k| async move { k.ok() }).collect().await,
            Err(_) => Vec::new(),
        };
        for chunk in keys.chunks(1000) {
            let _: redis::RedisResult<()> = redis::cmd("UNLINK").arg(chunk).query_async(&mut conn).await;
        }
    }
}
