//! The Redis claim store's answers to the console's questions: one claim
//! in full, the claims in one state, a message's journal, the dead
//! letters (in full, or in brief without their payloads), and the
//! namespace's activity per minute.
//!
//! Claims are hashes with no index by state, so listing the running or
//! retrying ones scans the namespace's claim keys (SCAN looks at up to
//! [`SCAN_LIMIT`] keys per listing; settled claims stay until retention
//! removes them, so a large namespace may list only part of them).
//! Activity is one hash per minute, `{ns}:activity:{minute}`, expiring a
//! day after its minute.

use std::collections::HashMap;

use redis::AsyncCommands;

use super::redis::{split_claim_suffix, RedisClaims};
use super::{ClaimError, ClaimInfo, ClaimState, DeadLetter, DeadLetterSummary, JournalStep};

/// Keys one listing asks SCAN to look at, at most.
pub const SCAN_LIMIT: usize = 100_000;

/// Keys per SCAN call.
const SCAN_COUNT: usize = 1_000;

/// `text` with SCAN's glob characters escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\' | '^') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// How long a minute of activity is kept.
const ACTIVITY_TTL_SECS: i64 = 24 * 3600;

impl RedisClaims {
    pub(super) async fn dead_letters_in_full(&self, limit: i64) -> Result<Vec<DeadLetter>, ClaimError> {
        let hashes = self.dead_letter_hashes(limit, None).await?;
        Ok(hashes.iter().filter_map(|(id, m)| dead_letter_from(*id, m)).collect())
    }

    pub(super) async fn dead_letters_in_brief(&self, limit: i64) -> Result<Vec<DeadLetterSummary>, ClaimError> {
        let hashes = self.dead_letter_hashes(limit, Some(&SUMMARY_FIELDS)).await?;
        Ok(hashes.iter().filter_map(|(id, m)| summary_from(*id, m)).collect())
    }

    /// The hashes of the newest `limit` dead letters (of those still there),
    /// with every field or only `fields`; one round trip per 100 records.
    async fn dead_letter_hashes(&self, limit: i64, fields: Option<&[&str]>) -> Result<Vec<(i64, DeadFields)>, ClaimError> {
        let mut conn = self.conn.clone();
        let ids: Vec<i64> = conn.lrange(self.dead_ids(), 0, list_stop(limit)).await?;
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(100) {
            let mut pipe = redis::pipe();
            for id in chunk {
                let key = format!("{}{id}", self.dead_prefix());
                match fields {
                    None => pipe.hgetall(key),
                    Some(fields) => pipe.cmd("HMGET").arg(key).arg(fields),
                };
            }
            let hashes: Vec<DeadFields> = match fields {
                None => pipe.query_async(&mut conn).await?,
                Some(fields) => {
                    let values: Vec<Vec<Option<Vec<u8>>>> = pipe.query_async(&mut conn).await?;
                    values
                        .into_iter()
                        .map(|v| fields.iter().zip(v).filter_map(|(f, v)| Some((f.to_string(), v?))).collect())
                        .collect()
                }
            };
            out.extend(chunk.iter().copied().zip(hashes));
        }
        Ok(out)
    }

    pub(super) async fn dead_letter_in_full(&self, id: i64) -> Result<Option<DeadLetter>, ClaimError> {
        let mut conn = self.conn.clone();
        let m: DeadFields = conn.hgetall(format!("{}{id}", self.dead_prefix())).await?;
        Ok(dead_letter_from(id, &m))
    }

    pub(super) async fn claim_info(&self, plugin: &str, key: &str) -> Result<Option<ClaimInfo>, ClaimError> {
        let mut conn = self.conn.clone();
        let fields: HashMap<String, String> = conn.hgetall(self.claim_key(plugin, key)).await?;
        claim_from(plugin, key, &fields)
    }

    pub(super) async fn claims_in_state(&self, state: ClaimState, plugin: Option<&str>, limit: i64) -> Result<Vec<ClaimInfo>, ClaimError> {
        let mut conn = self.conn.clone();
        let prefix = self.claim_prefix();
        let pattern = match plugin {
            Some(p) => format!("{}{}:{}:*", glob_escape(&prefix), p.len(), glob_escape(p)),
            None => format!("{}*", glob_escape(&prefix)),
        };
        let (mut cursor, mut out) = (0u64, Vec::new());
        for _ in 0..SCAN_LIMIT / SCAN_COUNT {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(&mut conn)
                .await?;
            cursor = next;
            if !keys.is_empty() {
                let mut states = redis::pipe();
                for k in &keys {
                    states.hget(k, "state");
                }
                let names: Vec<Option<String>> = states.query_async(&mut conn).await?;
                let wanted: Vec<(String, String, &String)> = keys
                    .iter()
                    .zip(names)
                    .filter(|(_, name)| name.as_deref() == Some(state.as_str()))
                    .filter_map(|(k, _)| k.strip_prefix(&prefix).and_then(split_claim_suffix).map(|(p, key)| (p, key, k)))
                    .filter(|(p, _, _)| plugin.is_none_or(|want| want == p))
                    .collect();
                if !wanted.is_empty() {
                    let mut reads = redis::pipe();
                    for (_, _, k) in &wanted {
                        reads.hgetall(*k);
                    }
                    let all: Vec<HashMap<String, String>> = reads.query_async(&mut conn).await?;
                    for ((p, key, _), fields) in wanted.iter().zip(&all) {
                        out.extend(claim_from(p, key, fields)?);
                    }
                }
            }
            if cursor == 0 {
                break;
            }
        }
        out.sort_by_key(|c| {
            (
                if c.state == ClaimState::Retry { c.not_before } else { c.updated_at },
                c.plugin.clone(),
                c.key.clone(),
            )
        });
        out.truncate(limit.max(0) as usize);
        Ok(out)
    }

    pub(super) async fn journal_steps(&self, plugin: &str, key: &str) -> Result<Vec<JournalStep>, ClaimError> {
        let mut conn = self.conn.clone();
        let fields: HashMap<String, Vec<u8>> = conn.hgetall(self.journal_key(plugin, key)).await?;
        let mut steps: Vec<JournalStep> = fields
            .iter()
            .filter_map(|(f, response)| {
                let step = f.strip_suffix("\0r")?;
                let request_hash = fields.get(&format!("{step}\0h")).map(|h| String::from_utf8_lossy(h).into_owned())?;
                Some(JournalStep {
                    step: step.to_string(),
                    request_hash,
                    response: response.clone(),
                    plugin_version: None,
                    created_at: None,
                })
            })
            .collect();
        steps.sort_by(|a, b| a.step.cmp(&b.step));
        Ok(steps)
    }

    pub(super) async fn add_activity(&self, minute: i64, counts: &[(&str, u64)]) -> Result<(), ClaimError> {
        let mut conn = self.conn.clone();
        let key = format!("{}:activity:{minute}", self.ns);
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (outcome, n) in counts.iter().filter(|(_, n)| *n > 0) {
            pipe.hincr(&key, *outcome, *n).ignore();
        }
        pipe.expire_at(&key, minute / 1000 + ACTIVITY_TTL_SECS).ignore();
        let () = pipe.query_async(&mut conn).await?;
        Ok(())
    }

    pub(super) async fn activity_since(&self, since: i64, now: i64) -> Result<Vec<(i64, String, u64)>, ClaimError> {
        let mut conn = self.conn.clone();
        // Only the last day is kept.
        let since = since.max(now - ACTIVITY_TTL_SECS * 1000);
        let minutes: Vec<i64> = (since.div_euclid(60_000)..=now.div_euclid(60_000)).map(|m| m * 60_000).collect();
        let mut pipe = redis::pipe();
        for m in &minutes {
            pipe.hgetall(format!("{}:activity:{m}", self.ns));
        }
        let maps: Vec<HashMap<String, i64>> = pipe.query_async(&mut conn).await?;
        let mut out = Vec::new();
        for (m, map) in minutes.iter().zip(maps) {
            let mut row: Vec<(i64, String, u64)> = map.into_iter().map(|(o, n)| (*m, o, n.max(0) as u64)).collect();
            row.sort();
            out.extend(row);
        }
        Ok(out)
    }
}

/// A claim from its hash's fields (`None` when the hash is empty: no claim).
fn claim_from(plugin: &str, key: &str, f: &HashMap<String, String>) -> Result<Option<ClaimInfo>, ClaimError> {
    let Some(name) = f.get("state") else {
        return Ok(None);
    };
    let state =
        ClaimState::parse(name).ok_or_else(|| ClaimError::Unavailable(format!("the claim store holds an unknown claim state {name:?}")))?;
    let int = |field: &str| f.get(field).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    let text = |field: &str| f.get(field).filter(|v| !v.is_empty()).cloned();
    Ok(Some(ClaimInfo {
        plugin: plugin.to_string(),
        key: key.to_string(),
        msg_id: f.get("msg_id").cloned().unwrap_or_default(),
        state,
        fence: int("fence"),
        owner: text("owner"),
        lease_until: int("lease_until"),
        not_before: int("not_before"),
        attempts: int("attempts").max(0) as u32,
        traps: int("traps").max(0) as u32,
        last_error: text("last_error"),
        plugin_version: text("plugin_version"),
        created_at: int("created_at"),
        updated_at: int("updated_at"),
    }))
}

/// A dead letter's hash.
type DeadFields = std::collections::HashMap<String, Vec<u8>>;

/// The last index of an `LRANGE` reading `limit` items (all when `limit`
/// is not positive or is `i64::MAX`).
fn list_stop(limit: i64) -> isize {
    if limit <= 0 || limit == i64::MAX {
        -1
    } else {
        isize::try_from(limit - 1).unwrap_or(-1)
    }
}

/// The fields of a dead letter's hash that its summary reads.
const SUMMARY_FIELDS: [&str; 8] = [
    "plugin",
    "key",
    "msg_id",
    "reason",
    "attempts",
    "plugin_version",
    "first_seen_at",
    "dead_at",
];

/// A dead letter from its hash (`None` when the hash is gone).
fn dead_letter_from(id: i64, m: &DeadFields) -> Option<DeadLetter> {
    Some(DeadLetter {
        summary: summary_from(id, m)?,
        headers: super::admin::parse_headers(&String::from_utf8_lossy(m.get("headers").map_or(&[][..], |v| v))),
        payload: m.get("payload").cloned().unwrap_or_default(),
    })
}

/// A dead letter's summary from (some of) its hash's fields (`None` when
/// the hash is gone).
fn summary_from(id: i64, m: &DeadFields) -> Option<DeadLetterSummary> {
    if m.is_empty() {
        return None;
    }
    let s = |k: &str| m.get(k).map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
    let n = |k: &str| s(k).parse::<i64>().unwrap_or(0);
    let version = s("plugin_version");
    Some(DeadLetterSummary {
        id,
        plugin: s("plugin"),
        key: s("key"),
        msg_id: s("msg_id"),
        reason: s("reason"),
        attempts: n("attempts") as u32,
        plugin_version: (!version.is_empty()).then_some(version),
        first_seen_at: n("first_seen_at"),
        dead_at: n("dead_at"),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn glob_characters_match_only_themselves() {
        assert_eq!(super::glob_escape("a*b?[c]\\d^"), "a\\*b\\?\\[c\\]\\\\d\\^");
        assert_eq!(super::glob_escape("plain-name_1"), "plain-name_1");
    }
}
