//! Scenario g's baseline: a bare consume-and-ack loop on the same Redis
//! stream. `XREADGROUP` takes up to `batch_size` entries (the pool's
//! `worker.batch_size`), one `XACK` acks them all, and the next read
//! follows: what the broker costs with nothing around it. No claims, no
//! store, no handler, not even parsing the entries: the ceiling the
//! idempotency machinery is measured against.
//!
//! `redis-claims-loop` is the same loop with a claim and a confirm a message
//! in Redis and nothing else: per batch, one script that claims each entry
//! (one string set only if absent, holding what a claim must: state, fence,
//! lease, attempts, payload hash) and one that confirms each (reads it,
//! checks the state and fence, marks it done). No visibility per delivery,
//! no counts, no retention index, no dead letters, no parsing, no handler,
//! and the cheapest form a claim can take in Redis. It is a reference, not
//! a lower bound: it makes four round trips a batch, one batch at a time,
//! where a consumer could read and claim in one script, confirm and ack in
//! another, and keep several batches in flight.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;

use super::process::{cpu_seconds, peak_rss_kib, reset_peak_rss};
use super::{RunFigures, Scenario};

/// The handler name the bare loop's figures carry.
pub(super) const NAME: &str = "redis-loop";
/// The handler name of the loop with a claim and a confirm per message.
pub(super) const CLAIMS_NAME: &str = "redis-claims-loop";

/// Claim each key named: a new claim is written running with fence 1,
/// `state|fence|lease|attempts|payload hash`; an existing one is left as
/// it is and answered 0 (it would be busy or done).
/// KEYS: claims; ARGV[1]: lease end (ms); ARGV[1+i]: payload hash i.
const CLAIM: &str = r"
local out = {}
for i, k in ipairs(KEYS) do
  if redis.call('SET', k, 'running|1|' .. ARGV[1] .. '|1|' .. ARGV[1 + i], 'NX') then
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";

/// Confirm each claim that is running with fence 1.
const CONFIRM: &str = r"
local out = {}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if v and string.sub(v, 1, 10) == 'running|1|' then
    redis.call('SET', k, 'done|1')
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";

/// Consume the `n` entries already published to `stream` through a consumer
/// group of its own, `batch` at a time, timed from the first read; with
/// `claims`, claiming each entry before its ack and confirming it after
/// (claims under the key prefix `claims`).
pub(super) async fn run(redis_url: &str, stream: &str, n: usize, batch: usize, claims: Option<&str>) -> Result<RunFigures> {
    let client = redis::Client::open(redis_url).context("the baseline's Redis URL")?;
    let mut conn = client.get_multiplexed_async_connection().await.context("the baseline's Redis")?;
    let group = "bench-loop";
    let _: () = conn
        .xgroup_create(stream, group, "0")
        .await
        .context("creating the baseline's consumer group")?;
    let options = StreamReadOptions::default().group(group, "loop").count(batch);
    let (claim, confirm) = (redis::Script::new(CLAIM), redis::Script::new(CONFIRM));
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
        if let Some(prefix) = claims {
            let keys: Vec<String> = ids.iter().map(|id| format!("{prefix}{id}")).collect();
            let lease = crate::now_ms() + 30_000;
            let mut invocation = claim.prepare_invoke();
            invocation.arg(lease);
            for (key, id) in keys.iter().zip(&ids) {
                // As long as a SHA-256 in hex, as a claim's payload hash is.
                invocation.key(key).arg(format!("{id:0>64}"));
            }
            let claimed: Vec<i64> = invocation.invoke_async(&mut conn).await?;
            anyhow::ensure!(claimed.iter().all(|&c| c == 1), "the claims loop found an entry claimed twice");
            let mut invocation = confirm.prepare_invoke();
            for key in &keys {
                invocation.key(key);
            }
            let confirmed: Vec<i64> = invocation.invoke_async(&mut conn).await?;
            anyhow::ensure!(
                confirmed.iter().all(|&c| c == 1),
                "the claims loop could not confirm a claim it held"
            );
        }
        let _: u64 = conn.xack(stream, group, &ids).await?;
        done += ids.len();
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(RunFigures {
        scenario: Scenario::G,
        handler: if claims.is_some() { CLAIMS_NAME } else { NAME },
        messages: n,
        seconds,
        rate: n as f64 / seconds.max(f64::EPSILON),
        p50_ms: 0.0,
        p99_ms: 0.0,
        cpu_s_per_1k: (cpu_seconds() - cpu0) / n as f64 * 1000.0,
        peak_rss_mib: peak_rss_kib() as f64 / 1024.0,
    })
}
