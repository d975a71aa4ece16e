//! Scenario g's baseline: a bare consume-and-ack loop on the same Redis
//! stream. `XREADGROUP` takes up to `batch_size` entries (the pool's
//! `worker.batch_size`), one `XACK` acks them all, and the next read
//! follows: what the broker costs with nothing around it. No claims, no
//! store, no handler, not even parsing the entries: the ceiling the
//! idempotency machinery is measured against.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;

use super::process::{cpu_seconds, peak_rss_kib, reset_peak_rss};
use super::{RunFigures, Scenario};

/// The handler name the baseline's figures carry.
pub(super) const NAME: &str = "redis-loop";

/// Consume the `n` entries already published to `stream` through a consumer
/// group of its own, `batch` at a time, timed from the first read.
pub(super) async fn run(redis_url: &str, stream: &str, n: usize, batch: usize) -> Result<RunFigures> {
    let client = redis::Client::open(redis_url).context("the baseline's Redis URL")?;
    let mut conn = client.get_multiplexed_async_connection().await.context("the baseline's Redis")?;
    let group = "bench-loop";
    let _: () = conn
        .xgroup_create(stream, group, "0")
        .await
        .context("creating the baseline's consumer group")?;
    let options = StreamReadOptions::default().group(group, "loop").count(batch);
    reset_peak_rss();
    let started = Instant::now();
    let cpu0 = cpu_seconds();
    let mut done = 0;
    while done < n {
        let reply: StreamReadReply = conn.xread_options(&[stream], &[">"], &options).await?;
        let ids: Vec<String> = reply.keys.into_iter().flat_map(|k| k.ids).map(|e| e.id).collect();
        if ids.is_empty() {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(120),
                "the baseline loop found only {done} of {n} entries"
            );
            continue;
        }
        let _: u64 = conn.xack(stream, group, &ids).await?;
        done += ids.len();
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(RunFigures {
        scenario: Scenario::G,
        handler: NAME,
        messages: n,
        seconds,
        rate: n as f64 / seconds.max(f64::EPSILON),
        p50_ms: 0.0,
        p99_ms: 0.0,
        cpu_s_per_1k: (cpu_seconds() - cpu0) / n as f64 * 1000.0,
        peak_rss_mib: peak_rss_kib() as f64 / 1024.0,
    })
}
