//! Scenario f's baseline: a plain rdkafka consumer that takes one record
//! at a time, does the same work as `grant-credits` (one Postgres upsert of
//! the user's balance) and commits the record's offset before the next,
//! as a one-message-at-a-time consumer does. It has none of Idem's
//! guarantees: no claims (a redelivered record runs again), no journal, no
//! dead letters, no sandbox.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::Message;

use super::process::{cpu_seconds, peak_rss_kib, reset_peak_rss};
use super::{RunFigures, Scenario};
use crate::config::Config;

/// The handler name the baseline's figures carry.
pub(super) const NAME: &str = "rdkafka-loop";

/// Consume the `n` records already published to the configuration's topic
/// and time it from the first record (joining the group is not counted).
pub(super) async fn run(config: &Config, n: usize, postgres_url: &str) -> Result<RunFigures> {
    let options = crate::backend::kafka_options(config)?;
    let ns = &config.namespace;
    let pool = sqlx::PgPool::connect(postgres_url).await.context("the baseline's Postgres")?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA IF NOT EXISTS \"{ns}\"")))
        .execute(&pool)
        .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS \"{ns}\".credits_loop (k TEXT PRIMARY KEY, v BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    let upsert = format!("INSERT INTO \"{ns}\".credits_loop (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v");
    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &options.servers)
        .set("group.id", format!("{}-loop", options.group))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // The same wait as Idem's consumer, so the server's answer to a
        // fetch on a drained partition holds neither back longer.
        .set("fetch.wait.max.ms", crate::broker::kafka::FETCH_WAIT_MAX_MS)
        .create()?;
    let topics: Vec<&str> = options.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    reset_peak_rss();
    let mut started = None;
    let mut cpu0 = 0.0;
    for _ in 0..n {
        let m = tokio::time::timeout(Duration::from_secs(120), consumer.recv())
            .await
            .context("the baseline loop waited 120 s for a record")??;
        if started.is_none() {
            started = Some(Instant::now());
            cpu0 = cpu_seconds();
        }
        let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default())?;
        let user = v["user"].as_str().unwrap_or_default();
        let balance = v["balance"].as_i64().unwrap_or_default();
        sqlx::query(sqlx::AssertSqlSafe(upsert.as_str()))
            .bind(user)
            .bind(balance)
            .execute(&pool)
            .await?;
        tokio::task::block_in_place(|| consumer.commit_message(&m, CommitMode::Sync))?;
    }
    let seconds = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
    let counted = n.saturating_sub(1).max(1);
    Ok(RunFigures {
        scenario: Scenario::F,
        handler: NAME,
        messages: n,
        seconds,
        rate: counted as f64 / seconds.max(f64::EPSILON),
        p50_ms: 0.0,
        p99_ms: 0.0,
        cpu_s_per_1k: (cpu_seconds() - cpu0) / counted as f64 * 1000.0,
        peak_rss_mib: peak_rss_kib() as f64 / 1024.0,
    })
}
