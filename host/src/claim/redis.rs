//! Claims, journal and dead letters in Redis.
//!
//! Every guarded change is one Lua script (`host/lua/claims_*.lua`), so a
//! fence check and the change it guards are atomic. Keys live under the
//! namespace: `{ns}:claim:…` (a hash per claim), `{ns}:journal:…` (a hash
//! per message), `{ns}:dead:…` (a hash per dead letter, ids in a list,
//! and for one no claim retires, `{ns}:dead:delivery:…` naming its record
//! by what identifies its message), and `{ns}:counts` (claims by state).
//! Data written under these claims is fenced at the data store with the
//! same fence numbers (a fencing token).
//!
//! Redis acknowledges a write before it is on disk unless it runs with
//! `appendonly yes` and `appendfsync always`; run it that way (or accept
//! that a Redis crash can forget recent claims, which then run again).

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script, Value};

use super::{
    ClaimAdmin, ClaimCounts, ClaimError, ClaimInfo, ClaimOutcome, ClaimRef, ClaimRequest, ClaimState, ClaimStore, DeadLetter,
    DeadLetterRequest, DeadLetterSummary, JournalEntry, JournalStep, Swept,
};

/// The Redis claim store.
pub struct RedisClaims {
    pub(super) conn: ConnectionManager,
    pub(super) ns: String,
    claim: Script,
    extend: Script,
    confirm: Script,
    release: Script,
    dead_letter: Script,
    dead_letter_release: Script,
    journal_put: Script,
    revive: Script,
    sweep: Script,
}

impl From<redis::RedisError> for ClaimError {
    fn from(e: redis::RedisError) -> Self {
        ClaimError::Unavailable(e.to_string())
    }
}

impl RedisClaims {
    /// Connect (the connection is re-established after Redis restarts).
    pub async fn connect(url: &str, namespace: &str) -> anyhow::Result<Self> {
        use anyhow::Context;
        let client = redis::Client::open(url).with_context(|| {
            format!(
                "claims.url {:?} is not a valid Redis URL (redis://host:port)",
                crate::text::redact_url(url)
            )
        })?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(2)))
            .set_response_timeout(Some(std::time::Duration::from_secs(5)))
            .set_number_of_retries(2);
        let conn = ConnectionManager::new_with_config(client, config).await.with_context(|| {
            format!(
                "cannot connect to Redis at claims.url = {:?}: is the server running?",
                crate::text::redact_url(url)
            )
        })?;
        Ok(RedisClaims {
            conn,
            ns: namespace.to_string(),
            claim: Script::new(concat!(
                include_str!("../../lua/dead_letter_record.lua"),
                include_str!("../../lua/claims_claim.lua")
            )),
            extend: Script::new(include_str!("../../lua/claims_extend.lua")),
            confirm: Script::new(include_str!("../../lua/claims_confirm.lua")),
            release: Script::new(include_str!("../../lua/claims_release.lua")),
            dead_letter: Script::new(concat!(
                include_str!("../../lua/dead_letter_record.lua"),
                include_str!("../../lua/claims_dead_letter.lua")
            )),
            dead_letter_release: Script::new(include_str!("../../lua/claims_dead_letter_release.lua")),
            revive: Script::new(include_str!("../../lua/claims_revive.lua")),
            journal_put: Script::new(include_str!("../../lua/claims_journal_put.lua")),
            sweep: Script::new(include_str!("../../lua/claims_sweep.lua")),
        })
    }

    pub(super) fn claim_key(&self, plugin: &str, key: &str) -> String {
        // Length-prefixed so that no (plugin, key) pair can collide.
        format!("{}:claim:{}:{plugin}:{key}", self.ns, plugin.len())
    }
    pub(super) fn journal_key(&self, plugin: &str, key: &str) -> String {
        format!("{}:journal:{}:{plugin}:{key}", self.ns, plugin.len())
    }
    pub(super) fn claim_prefix(&self) -> String {
        format!("{}:claim:", self.ns)
    }
    fn journal_prefix(&self) -> String {
        format!("{}:journal:", self.ns)
    }
    /// Settled claims by the time they settled (what retention sweeps).
    fn settled_key(&self) -> String {
        format!("{}:settled", self.ns)
    }
    fn key_pointers_key(&self) -> String {
        format!("{}:key_pointers", self.ns)
    }
    fn counts_key(&self) -> String {
        format!("{}:counts", self.ns)
    }
    fn dead_seq(&self) -> String {
        format!("{}:dead:seq", self.ns)
    }
    pub(super) fn dead_ids(&self) -> String {
        format!("{}:dead:ids", self.ns)
    }
    pub(super) fn dead_prefix(&self) -> String {
        format!("{}:dead:", self.ns)
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => text(other).parse().unwrap_or(0),
    }
}

fn outcome(v: &Value) -> Result<ClaimOutcome, ClaimError> {
    let Value::Array(items) = v else {
        return Err(ClaimError::Unavailable(format!("unexpected claim script answer {v:?}")));
    };
    let tag = items.first().map(text).unwrap_or_default();
    let n = |i: usize| items.get(i).map(int).unwrap_or(0);
    Ok(match tag.as_str() {
        "acquired" => ClaimOutcome::Acquired {
            fence: n(1),
            attempt: n(2) as u32,
            traps: n(3) as u32,
        },
        "done" => ClaimOutcome::Done,
        "dead" => ClaimOutcome::DeadLettered,
        "busy" => ClaimOutcome::Busy { retry_after_ms: n(1) },
        "conflict" => ClaimOutcome::Conflict,
        "exhausted" => ClaimOutcome::Exhausted {
            attempts: n(1) as u32,
            fence: n(2),
        },
        other => return Err(ClaimError::Unavailable(format!("unexpected claim outcome {other:?}"))),
    })
}

#[async_trait]
impl ClaimStore for RedisClaims {
    async fn claim(&self, requests: &[ClaimRequest<'_>], now: i64) -> Result<Vec<ClaimOutcome>, ClaimError> {
        let mut inv = self.claim.prepare_invoke();
        inv.key(self.counts_key()).key(self.dead_seq()).key(self.dead_ids());
        inv.arg(now).arg(self.dead_prefix());
        for r in requests {
            inv.key(self.claim_key(r.plugin, r.key));
            inv.arg(r.plugin)
                .arg(r.key)
                .arg(r.msg_id)
                .arg(r.payload_hash)
                .arg(r.owner)
                .arg(now + r.lease_ms)
                .arg(r.max_attempts)
                .arg(r.plugin_version)
                .arg(serde_json::to_string(r.headers).unwrap_or_else(|_| "[]".into()))
                .arg(r.payload);
        }
        inv.key(self.settled_key());
        let mut conn = self.conn.clone();
        let answer: Vec<Value> = inv.invoke_async(&mut conn).await?;
        answer.iter().map(outcome).collect()
    }

    async fn extend(&self, claims: &[ClaimRef], lease_ms: i64, now: i64) -> Result<Vec<bool>, ClaimError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = self.extend.prepare_invoke();
        inv.arg(now + lease_ms).arg(now);
        for c in claims {
            inv.key(self.claim_key(&c.plugin, &c.key)).arg(c.fence);
        }
        let mut conn = self.conn.clone();
        let answer: Vec<i64> = inv.invoke_async(&mut conn).await?;
        Ok(answer.into_iter().map(|x| x == 1).collect())
    }

    async fn confirm_with_results(&self, claims: &[ClaimRef], results: &[Option<&[u8]>], now: i64) -> Result<Vec<bool>, ClaimError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = self.confirm.prepare_invoke();
        inv.key(self.counts_key()).arg(now);
        for (c, result) in claims.iter().zip(results) {
            // A result is stored with a leading byte, so an empty result
            // and none stay apart.
            let stored = result.map(|r| [b"=", r].concat()).unwrap_or_default();
            inv.key(self.claim_key(&c.plugin, &c.key)).arg(c.fence).arg(stored);
        }
        inv.key(self.settled_key());
        let mut conn = self.conn.clone();
        let answer: Vec<i64> = inv.invoke_async(&mut conn).await?;
        Ok(answer.into_iter().map(|x| x == 1).collect())
    }

    async fn results(&self, keys: &[(&str, &str)]) -> Result<Vec<Option<Vec<u8>>>, ClaimError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (plugin, key) in keys {
            pipe.cmd("HMGET").arg(self.claim_key(plugin, key)).arg("state").arg("result");
        }
        let mut conn = self.conn.clone();
        let rows: Vec<(Option<String>, Option<Vec<u8>>)> = pipe.query_async(&mut conn).await?;
        Ok(rows
            .into_iter()
            .map(|(state, result)| match (state.as_deref(), result) {
                (Some("done"), Some(r)) if r.first() == Some(&b'=') => Some(r[1..].to_vec()),
                _ => None,
            })
            .collect())
    }

    async fn release(&self, claim: &ClaimRef, not_before: i64, error: &str, trapped: bool, now: i64) -> Result<bool, ClaimError> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .release
            .key(self.counts_key())
            .key(self.claim_key(&claim.plugin, &claim.key))
            .arg(claim.fence)
            .arg(not_before)
            .arg(super::storable(error).as_ref())
            .arg(trapped as i64)
            .arg(now)
            .invoke_async(&mut conn)
            .await?;
        Ok(n == 1)
    }

    async fn dead_letter(&self, items: &[DeadLetterRequest<'_>], now: i64) -> Result<Vec<bool>, ClaimError> {
        let mut out = Vec::with_capacity(items.len());
        let mut conn = self.conn.clone();
        for d in items {
            let n: i64 = self
                .dead_letter
                .key(self.counts_key())
                .key(self.dead_seq())
                .key(self.dead_ids())
                .key(self.claim_key(d.plugin, d.key))
                .key(self.settled_key())
                .arg(d.fence.map(|f| f.to_string()).unwrap_or_default())
                .arg(d.plugin)
                .arg(d.key)
                .arg(d.msg_id)
                .arg(serde_json::to_string(d.headers).unwrap_or_else(|_| "[]".into()))
                .arg(d.payload)
                .arg(super::storable(d.reason).as_ref())
                .arg(d.plugin_version.unwrap_or(""))
                .arg(now)
                .arg(self.dead_prefix())
                .arg(
                    d.delivery
                        .as_ref()
                        .map(|h| format!("{}delivery:{h}", self.dead_prefix()))
                        .unwrap_or_default(),
                )
                .invoke_async(&mut conn)
                .await?;
            out.push(n == 1);
        }
        Ok(out)
    }

    async fn journal_get(&self, plugin: &str, key: &str, step: &str) -> Result<Option<JournalEntry>, ClaimError> {
        let mut conn = self.conn.clone();
        let (hash, response): (Option<String>, Option<Vec<u8>>) = redis::cmd("HMGET")
            .arg(self.journal_key(plugin, key))
            .arg(format!("{step}\0h"))
            .arg(format!("{step}\0r"))
            .query_async(&mut conn)
            .await?;
        Ok(match (hash, response) {
            (Some(request_hash), Some(response)) => Some(JournalEntry { request_hash, response }),
            _ => None,
        })
    }

    async fn fence_holds(&self, claim: &ClaimRef) -> Result<bool, ClaimError> {
        let mut conn = self.conn.clone();
        let (fence, state): (Option<i64>, Option<String>) = redis::cmd("HMGET")
            .arg(self.claim_key(&claim.plugin, &claim.key))
            .arg("fence")
            .arg("state")
            .query_async(&mut conn)
            .await?;
        Ok(fence == Some(claim.fence) && state.as_deref() == Some("running"))
    }

    async fn journal_put(
        &self,
        claim: &ClaimRef,
        step: &str,
        request_hash: &str,
        response: &[u8],
        _plugin_version: &str,
        _now: i64,
    ) -> Result<bool, ClaimError> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .journal_put
            .key(self.claim_key(&claim.plugin, &claim.key))
            .key(self.journal_key(&claim.plugin, &claim.key))
            .key(self.counts_key())
            .arg(claim.fence)
            .arg(step)
            .arg(request_hash)
            .arg(response)
            .invoke_async(&mut conn)
            .await?;
        Ok(n == 1)
    }
}

#[async_trait]
impl ClaimAdmin for RedisClaims {
    async fn ping(&self) -> Result<(), ClaimError> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    async fn clock_ms(&self) -> Result<Option<i64>, ClaimError> {
        let mut conn = self.conn.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        Ok(Some(secs * 1000 + micros / 1000))
    }

    async fn state(&self, plugin: &str, key: &str) -> Result<Option<ClaimState>, ClaimError> {
        let mut conn = self.conn.clone();
        let name: Option<String> = conn.hget(self.claim_key(plugin, key), "state").await?;
        name.map(|n| {
            ClaimState::parse(&n).ok_or_else(|| ClaimError::Unavailable(format!("the claim store holds an unknown claim state {n:?}")))
        })
        .transpose()
    }

    async fn counts(&self) -> Result<ClaimCounts, ClaimError> {
        let mut conn = self.conn.clone();
        let map: std::collections::HashMap<String, i64> = conn.hgetall(self.counts_key()).await?;
        let mut counts = ClaimCounts {
            dead_letters: self.dead_letter_count().await?,
            journal: map.get("journal").copied().unwrap_or(0).max(0) as u64,
            ..ClaimCounts::default()
        };
        for state in ClaimState::ALL {
            counts.set(state, map.get(state.as_str()).copied().unwrap_or(0).max(0) as u64);
        }
        Ok(counts)
    }

    async fn dead_letter_count(&self) -> Result<u64, ClaimError> {
        let mut conn = self.conn.clone();
        Ok(conn.llen(self.dead_ids()).await?)
    }

    async fn dead_letters(&self, limit: i64) -> Result<Vec<DeadLetter>, ClaimError> {
        self.dead_letters_in_full(limit).await
    }

    async fn dead_letter_summaries(&self, limit: i64) -> Result<Vec<DeadLetterSummary>, ClaimError> {
        self.dead_letters_in_brief(limit).await
    }

    async fn dead_letter_get(&self, id: i64) -> Result<Option<DeadLetter>, ClaimError> {
        self.dead_letter_in_full(id).await
    }

    async fn dead_letter_remove(&self, ids: &[i64]) -> Result<u64, ClaimError> {
        let mut conn = self.conn.clone();
        let mut removed = 0;
        for id in ids {
            // The key naming the record's message goes first, so that
            // message, delivered again, is recorded again.
            self.dead_letter_release(*id).await?;
            let (deleted, _): (u64, i64) = redis::pipe()
                .atomic()
                .del(format!("{}{id}", self.dead_prefix()))
                .lrem(self.dead_ids(), 0, id)
                .query_async(&mut conn)
                .await?;
            removed += deleted;
        }
        Ok(removed)
    }

    async fn dead_letter_release(&self, id: i64) -> Result<(), ClaimError> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .dead_letter_release
            .key(format!("{}{id}", self.dead_prefix()))
            .arg(id)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    async fn revive(&self, plugin: &str, key: &str, payload_hash: &str, now: i64) -> Result<bool, ClaimError> {
        let mut conn = self.conn.clone();
        let r: i64 = self
            .revive
            .key(self.counts_key())
            .key(self.claim_key(plugin, key))
            .key(self.settled_key())
            .arg(now)
            .arg(payload_hash)
            .invoke_async(&mut conn)
            .await?;
        Ok(r == 1)
    }

    async fn sweep(&self, settled_before: i64, dead_letters_before: Option<i64>, limit: u32) -> Result<Swept, ClaimError> {
        let mut conn = self.conn.clone();
        let (dead_letters, suffixes): (u64, Vec<String>) = self
            .sweep
            .key(self.counts_key())
            .key(self.settled_key())
            .key(self.dead_ids())
            .arg(settled_before)
            .arg(limit)
            .arg(self.claim_prefix())
            .arg(self.journal_prefix())
            .arg(dead_letters_before.map(|t| t.to_string()).unwrap_or_default())
            .arg(self.dead_prefix())
            .invoke_async(&mut conn)
            .await?;
        Ok(Swept {
            claims: suffixes.iter().filter_map(|s| split_claim_suffix(s)).collect(),
            dead_letters,
        })
    }

    async fn key_pointer(&self, plugin: &str, pointer: &str, _now: i64) -> Result<String, ClaimError> {
        let mut conn = self.conn.clone();
        let (_, recorded): (bool, String) = redis::pipe()
            .atomic()
            .hset_nx(self.key_pointers_key(), plugin, pointer)
            .hget(self.key_pointers_key(), plugin)
            .query_async(&mut conn)
            .await?;
        Ok(recorded)
    }

    async fn claim(&self, plugin: &str, key: &str) -> Result<Option<ClaimInfo>, ClaimError> {
        self.claim_info(plugin, key).await
    }

    async fn claims_in(&self, state: ClaimState, plugin: Option<&str>, limit: i64) -> Result<Vec<ClaimInfo>, ClaimError> {
        self.claims_in_state(state, plugin, limit).await
    }

    async fn journal(&self, plugin: &str, key: &str) -> Result<Vec<JournalStep>, ClaimError> {
        self.journal_steps(plugin, key).await
    }

    async fn activity_add(&self, minute: i64, counts: &[(&str, u64)], _keep_since: i64) -> Result<(), ClaimError> {
        self.add_activity(minute, counts).await
    }

    async fn activity(&self, since: i64) -> Result<Vec<(i64, String, u64)>, ClaimError> {
        let now = self.clock_ms().await?.unwrap_or_else(crate::now_ms);
        self.activity_since(since, now).await
    }

    async fn set_key_pointer(&self, plugin: &str, pointer: &str, _now: i64) -> Result<(), ClaimError> {
        let mut conn = self.conn.clone();
        let _: () = conn.hset(self.key_pointers_key(), plugin, pointer).await?;
        Ok(())
    }
}

/// `plugin`, `key` from a claim key's suffix `{len(plugin)}:{plugin}:{key}`.
pub(super) fn split_claim_suffix(suffix: &str) -> Option<(String, String)> {
    let (len, rest) = suffix.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let plugin = rest.get(..len)?;
    let key = rest.get(len..)?.strip_prefix(':')?;
    Some((plugin.to_string(), key.to_string()))
}
