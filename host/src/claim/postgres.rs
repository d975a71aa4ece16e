//! Claims, journal and dead letters in Postgres.
//!
//! A batch of claims: the keys seen for the first time are inserted in one
//! statement, committed on its own (a batch of first deliveries is one
//! round trip); the rest are then locked (`FOR UPDATE`) and decided one by
//! one in a transaction, and if that fails the new claims are withdrawn.
//! Both go in key order. Every statement or transaction that locks several
//! claim rows does so in one key order, the bytes of (plugin, key) whatever
//! the database's collation (claims, extensions, confirms, dead letters,
//! and the data store's group commit, which locks the rows it writes under
//! and confirms in one pass), so any two of them queue behind each other
//! instead of deadlocking.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use sqlx::{Connection, PgConnection, PgPool, Postgres, Row, Transaction};

use super::{
    decide, delivery_identity, ClaimError, ClaimOutcome, ClaimRef, ClaimRequest, ClaimStore, DeadLetterRequest, Decision, JournalEntry,
    Stored,
};

/// What a request whose key had no claim is answered.
const FIRST_ATTEMPT: ClaimOutcome = ClaimOutcome::Acquired {
    fence: 1,
    attempt: 1,
    traps: 0,
};

/// The Postgres claim store.
pub struct PgClaims {
    pool: PgPool,
}

impl PgClaims {
    /// Use the claim tables of this pool's schema.
    pub fn new(pool: PgPool) -> Self {
        PgClaims { pool }
    }
}

#[allow(clippy::too_many_arguments)]
async fn insert_dead_letter(
    conn: &mut PgConnection,
    plugin: &str,
    key: &str,
    msg_id: &str,
    headers: &[(String, String)],
    payload: &[u8],
    reason: &str,
    attempts: i32,
    plugin_version: Option<&str>,
    first_seen_at: i64,
    now: i64,
    delivery: Option<&str>,
) -> Result<(), ClaimError> {
    sqlx::query(include_str!("../../queries/postgres/dead_letter_insert.sql"))
        .bind(plugin)
        .bind(key)
        .bind(msg_id)
        .bind(serde_json::to_string(headers).unwrap_or_else(|_| "[]".into()))
        .bind(payload)
        .bind(reason)
        .bind(attempts)
        .bind(plugin_version)
        .bind(first_seen_at)
        .bind(now)
        .bind(delivery)
        .execute(conn)
        .await?;
    Ok(())
}

/// Insert the batch's keys that have no claim yet, in one statement: the
/// common case, a batch of first deliveries, is this one round trip (a
/// transaction of its own: nothing else is decided with it). Answers
/// the positions (in `requests`) acquired with fence 1. Only the first
/// request for a key is tried here; the rest (and every key that exists)
/// are locked and decided one by one.
async fn insert_new_keys<'a>(conn: &mut PgConnection, requests: &[ClaimRequest<'a>], now: i64) -> Result<HashSet<usize>, ClaimError> {
    let mut first: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, r) in requests.iter().enumerate() {
        first.entry((r.plugin, r.key)).or_insert(i);
    }
    let items: Vec<&ClaimRequest<'a>> = first.values().map(|&i| &requests[i]).collect();
    let column = |f: fn(&ClaimRequest<'a>) -> &'a str| items.iter().map(|r| f(r)).collect::<Vec<&str>>();
    let rows = sqlx::query(include_str!("../../queries/postgres/claim_insert_many.sql"))
        .bind(column(|r| r.plugin))
        .bind(column(|r| r.key))
        .bind(column(|r| r.msg_id))
        .bind(column(|r| r.payload_hash))
        .bind(column(|r| r.owner))
        .bind(items.iter().map(|r| now + r.lease_ms).collect::<Vec<_>>())
        .bind(column(|r| r.plugin_version))
        .bind(now)
        .fetch_all(conn)
        .await?;
    let mut acquired = HashSet::with_capacity(rows.len());
    for row in rows {
        let (plugin, key): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        acquired.extend(first.get(&(plugin.as_str(), key.as_str())));
    }
    Ok(acquired)
}

/// Dead-letter the message of claim request `r`, first seen at
/// `first_seen_at`, after `attempts` attempts; `delivery` for one no claim
/// retires (see [`super::delivery_identity`]).
async fn dead_letter_of(
    conn: &mut PgConnection,
    r: &ClaimRequest<'_>,
    reason: &str,
    attempts: i32,
    first_seen_at: i64,
    now: i64,
    delivery: Option<&str>,
) -> Result<(), ClaimError> {
    let version = Some(r.plugin_version);
    insert_dead_letter(
        conn,
        r.plugin,
        r.key,
        r.msg_id,
        r.headers,
        r.payload,
        reason,
        attempts,
        version,
        first_seen_at,
        now,
        delivery,
    )
    .await
}

/// Lock and decide, one by one in one transaction, the requests of a
/// batch (`order`, in key order) that its first statement did not claim:
/// keys that exist (redeliveries) and repeats within the batch.
async fn decide_rest(
    conn: &mut PgConnection,
    requests: &[ClaimRequest<'_>],
    order: Vec<usize>,
    out: &mut [ClaimOutcome],
    now: i64,
) -> Result<(), ClaimError> {
    let mut tx = conn.begin().await?;
    for i in order {
        let r = &requests[i];
        let inserted = sqlx::query(include_str!("../../queries/postgres/claim_insert.sql"))
            .bind(r.plugin)
            .bind(r.key)
            .bind(r.msg_id)
            .bind(r.payload_hash)
            .bind(r.owner)
            .bind(now + r.lease_ms)
            .bind(r.plugin_version)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        if inserted.is_some() {
            out[i] = FIRST_ATTEMPT;
            continue;
        }
        let row = sqlx::query(include_str!("../../queries/postgres/claim_lock.sql"))
            .bind(r.plugin)
            .bind(r.key)
            .fetch_one(&mut *tx)
            .await?;
        let hash: String = row.try_get("payload_hash")?;
        let state: String = row.try_get("state")?;
        let fence: i64 = row.try_get("fence")?;
        let attempts: i32 = row.try_get("attempts")?;
        let last_error: Option<String> = row.try_get("last_error")?;
        let created_at: i64 = row.try_get("created_at")?;
        let stored = Stored {
            payload_hash: &hash,
            state: super::sql_admin::state(&state)?,
            lease_until: row.try_get("lease_until")?,
            not_before: row.try_get("not_before")?,
            attempts: i64::from(attempts),
            last_error: last_error.as_deref(),
        };
        let outcome = match decide(&stored, r, now) {
            Decision::Answer(outcome) => outcome,
            Decision::Conflict(reason) => {
                let delivery = delivery_identity(r.plugin, r.key, r.msg_id, r.payload);
                dead_letter_of(&mut tx, r, &reason, 0, now, now, Some(&delivery)).await?;
                ClaimOutcome::Conflict
            }
            Decision::Exhaust(reason) => {
                let retired: i64 = sqlx::query_scalar(include_str!("../../queries/postgres/claim_mark_dead_any.sql"))
                    .bind(r.plugin)
                    .bind(r.key)
                    .bind(&reason)
                    .bind(now)
                    .fetch_one(&mut *tx)
                    .await?;
                dead_letter_of(&mut tx, r, &reason, attempts, created_at, now, None).await?;
                ClaimOutcome::Exhausted {
                    attempts: attempts as u32,
                    fence: retired,
                }
            }
            Decision::TakeOver => {
                let row = sqlx::query(include_str!("../../queries/postgres/claim_takeover.sql"))
                    .bind(r.plugin)
                    .bind(r.key)
                    .bind(fence)
                    .bind(r.owner)
                    .bind(now + r.lease_ms)
                    .bind(r.plugin_version)
                    .bind(now)
                    .fetch_one(&mut *tx)
                    .await?;
                ClaimOutcome::Acquired {
                    fence: row.try_get("fence")?,
                    attempt: row.try_get::<i32, _>("attempts")? as u32,
                    traps: row.try_get::<i32, _>("traps")? as u32,
                }
            }
        };
        out[i] = outcome;
    }
    tx.commit().await?;
    Ok(())
}

/// Check `claim`'s fence inside `tx`, share-locking the claim row.
pub(crate) async fn fence_holds(tx: &mut Transaction<'static, Postgres>, claim: &ClaimRef) -> Result<bool, sqlx::Error> {
    let row = sqlx::query(include_str!("../../queries/postgres/fence_check.sql"))
        .bind(&claim.plugin)
        .bind(&claim.key)
        .bind(claim.fence)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(row.is_some())
}

fn arrays(claims: &[ClaimRef]) -> (Vec<String>, Vec<String>, Vec<i64>) {
    (
        claims.iter().map(|c| c.plugin.clone()).collect(),
        claims.iter().map(|c| c.key.clone()).collect(),
        claims.iter().map(|c| c.fence).collect(),
    )
}

/// Which of `claims` the statement changed: rows are matched on plugin, key
/// and fence, so a stale fence in the same batch as the current one for the
/// same key is not mistaken for it.
fn answered(claims: &[ClaimRef], rows: Vec<sqlx::postgres::PgRow>) -> Result<Vec<bool>, sqlx::Error> {
    let mut hit = HashSet::new();
    for r in rows {
        hit.insert((r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?, r.try_get::<i64, _>(2)?));
    }
    Ok(claims
        .iter()
        .map(|c| hit.contains(&(c.plugin.clone(), c.key.clone(), c.fence)))
        .collect())
}

/// Confirm `claims` (storing `results[i]` with `claims[i]`) on `conn`: the
/// claim store's own pool, or the transaction of a batch of data writes
/// when the data lives in the same database (`store::postgres`).
pub(crate) async fn confirm_in<'c, E>(
    conn: E,
    claims: &[ClaimRef],
    results: Vec<Option<Vec<u8>>>,
    now: i64,
) -> Result<Vec<bool>, sqlx::Error>
where
    E: sqlx::Executor<'c, Database = Postgres>,
{
    let (p, k, f) = arrays(claims);
    let rows = sqlx::query(super::locking::CONFIRM.as_str())
        .bind(p)
        .bind(k)
        .bind(f)
        .bind(now)
        .bind(results)
        .fetch_all(conn)
        .await?;
    answered(claims, rows)
}

impl PgClaims {
    /// Remove up to `limit` settled claims older than `before` with their
    /// journal entries, in one statement.
    async fn sweep_settled(&self, before: i64, limit: u32) -> Result<Vec<(String, String)>, ClaimError> {
        Ok(sqlx::query_as(include_str!("../../queries/postgres/retention_claims.sql"))
            .bind(before)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?)
    }

    /// Withdraw the new claims of a batch whose rest could not be decided:
    /// the caller gets an error and hands none of them out, so they must
    /// not stay held (each would wait for its lease to expire and then
    /// count an attempt that never ran). Best effort: one that cannot be
    /// withdrawn (the database unreachable) is taken over when its lease
    /// expires, as after a commit whose answer was lost.
    async fn withdraw<'a>(&self, requests: &[ClaimRequest<'a>], fresh: &HashSet<usize>, created_at: i64) {
        if fresh.is_empty() {
            return;
        }
        let column = |f: fn(&ClaimRequest<'a>) -> &'a str| fresh.iter().map(|&i| f(&requests[i])).collect::<Vec<&str>>();
        let withdrawn = sqlx::query(crate::claim::locking::WITHDRAW.as_str())
            .bind(column(|r| r.plugin))
            .bind(column(|r| r.key))
            .bind(column(|r| r.owner))
            .bind(created_at)
            .execute(&self.pool)
            .await;
        match withdrawn {
            Ok(done) => tracing::info!(
                withdrawn = done.rows_affected(),
                "a claim batch failed after claiming its new keys; those claims were withdrawn"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                claims = fresh.len(),
                "a claim batch failed after claiming its new keys, and they cannot be withdrawn; they are taken over when their lease expires"
            ),
        }
    }
}

#[async_trait]
impl ClaimStore for PgClaims {
    async fn claim(&self, requests: &[ClaimRequest<'_>], now: i64) -> Result<Vec<ClaimOutcome>, ClaimError> {
        let waiting = std::time::Instant::now();
        let mut conn = self.pool.acquire().await?;
        let now = now + waiting.elapsed().as_millis() as i64;
        let fresh = insert_new_keys(&mut conn, requests, now).await?;
        let mut out = vec![ClaimOutcome::Done; requests.len()];
        for &i in &fresh {
            out[i] = FIRST_ATTEMPT;
        }
        if fresh.len() == requests.len() {
            return Ok(out);
        }
        let mut order: Vec<usize> = (0..requests.len()).filter(|i| !fresh.contains(i)).collect();
        order.sort_by(|&a, &b| {
            (requests[a].plugin, requests[a].key)
                .cmp(&(requests[b].plugin, requests[b].key))
                .then(a.cmp(&b))
        });
        let rest = decide_rest(&mut conn, requests, order, &mut out, now).await;
        if let Err(e) = rest {
            drop(conn);
            self.withdraw(requests, &fresh, now).await;
            return Err(e);
        }
        Ok(out)
    }

    async fn extend(&self, claims: &[ClaimRef], lease_ms: i64, now: i64) -> Result<Vec<bool>, ClaimError> {
        let (p, k, f) = arrays(claims);
        let rows = sqlx::query(super::locking::EXTEND.as_str())
            .bind(p)
            .bind(k)
            .bind(f)
            .bind(now + lease_ms)
            .bind(now)
            .fetch_all(&self.pool)
            .await?;
        Ok(answered(claims, rows)?)
    }

    async fn confirm_with_results(&self, claims: &[ClaimRef], results: &[Option<&[u8]>], now: i64) -> Result<Vec<bool>, ClaimError> {
        let results = results.iter().map(|r| r.map(<[u8]>::to_vec)).collect();
        Ok(confirm_in(&self.pool, claims, results, now).await?)
    }

    async fn results(&self, keys: &[(&str, &str)]) -> Result<Vec<Option<Vec<u8>>>, ClaimError> {
        let rows = sqlx::query(include_str!("../../queries/postgres/claim_results.sql"))
            .bind(keys.iter().map(|(p, _)| p.to_string()).collect::<Vec<_>>())
            .bind(keys.iter().map(|(_, k)| k.to_string()).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await?;
        let mut found = HashMap::new();
        for r in rows {
            found.insert(
                (r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?),
                r.try_get::<Option<Vec<u8>>, _>(2)?,
            );
        }
        Ok(keys
            .iter()
            .map(|(p, k)| found.get(&(p.to_string(), k.to_string())).cloned().flatten())
            .collect())
    }

    async fn release(&self, claim: &ClaimRef, not_before: i64, error: &str, trapped: bool, now: i64) -> Result<bool, ClaimError> {
        let error = super::storable(error);
        let r = sqlx::query(include_str!("../../queries/postgres/claim_release.sql"))
            .bind(&claim.plugin)
            .bind(&claim.key)
            .bind(claim.fence)
            .bind(not_before)
            .bind(error.as_ref())
            .bind(trapped as i32)
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn dead_letter(&self, items: &[DeadLetterRequest<'_>], now: i64) -> Result<Vec<bool>, ClaimError> {
        let mut tx = self.pool.begin().await?;
        let mut out = vec![false; items.len()];
        // Claim rows are locked in key order, as everywhere.
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_key(|&i| (items[i].plugin, items[i].key));
        for i in order {
            let d = &items[i];
            let reason = super::storable(d.reason);
            let (attempts, first_seen, version) = match d.fence {
                Some(fence) => {
                    let row = sqlx::query(include_str!("../../queries/postgres/claim_mark_dead.sql"))
                        .bind(d.plugin)
                        .bind(d.key)
                        .bind(fence)
                        .bind(reason.as_ref())
                        .bind(now)
                        .fetch_optional(&mut *tx)
                        .await?;
                    match row {
                        Some(row) => (
                            row.try_get::<i32, _>("attempts")?,
                            row.try_get::<i64, _>("created_at")?,
                            row.try_get::<Option<String>, _>("plugin_version")?,
                        ),
                        None => continue,
                    }
                }
                None => (0, now, d.plugin_version.map(str::to_string)),
            };
            insert_dead_letter(
                &mut tx,
                d.plugin,
                d.key,
                d.msg_id,
                d.headers,
                d.payload,
                &reason,
                attempts,
                version.as_deref(),
                first_seen,
                now,
                d.delivery.as_deref(),
            )
            .await?;
            out[i] = true;
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn journal_get(&self, plugin: &str, key: &str, step: &str) -> Result<Option<JournalEntry>, ClaimError> {
        let row = sqlx::query(include_str!("../../queries/postgres/journal_get.sql"))
            .bind(plugin)
            .bind(key)
            .bind(step)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => Some(JournalEntry {
                request_hash: r.try_get("request_hash")?,
                response: r.try_get("response")?,
            }),
            None => None,
        })
    }

    async fn fence_holds(&self, claim: &ClaimRef) -> Result<bool, ClaimError> {
        let n: i64 = sqlx::query_scalar(include_str!("../../queries/postgres/fence_read.sql"))
            .bind(&claim.plugin)
            .bind(&claim.key)
            .bind(claim.fence)
            .fetch_one(&self.pool)
            .await?;
        Ok(n == 1)
    }

    async fn journal_put(
        &self,
        claim: &ClaimRef,
        step: &str,
        request_hash: &str,
        response: &[u8],
        plugin_version: &str,
        now: i64,
    ) -> Result<bool, ClaimError> {
        let mut tx = self.pool.begin().await?;
        if !fence_holds(&mut tx, claim).await? {
            return Ok(false);
        }
        sqlx::query(include_str!("../../queries/postgres/journal_put.sql"))
            .bind(&claim.plugin)
            .bind(&claim.key)
            .bind(step)
            .bind(claim.fence)
            .bind(request_hash)
            .bind(response)
            .bind(plugin_version)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}

super::sql_admin::sql_claim_admin!(PgClaims, "postgres");
