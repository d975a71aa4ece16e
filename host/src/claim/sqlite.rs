//! Claims, journal and dead letters in the embedded SQLite database.
//!
//! Every transaction that changes state starts with `BEGIN IMMEDIATE`, so
//! SQLite's single write lock serialises claims and guarded writes: a check
//! and the write it guards can never interleave with a takeover.

use async_trait::async_trait;
use sqlx::{Row, Sqlite, SqlitePool, Transaction};

use super::{
    decide, delivery_identity, ClaimError, ClaimOutcome, ClaimRef, ClaimRequest, ClaimStore, DeadLetterRequest, Decision, JournalEntry,
    Stored,
};

/// The SQLite claim store.
pub struct SqliteClaims {
    pool: SqlitePool,
}

impl SqliteClaims {
    /// Use the claim tables of this pool's database.
    pub fn new(pool: SqlitePool) -> Self {
        SqliteClaims { pool }
    }
}

#[allow(clippy::too_many_arguments)]
async fn insert_dead_letter(
    tx: &mut Transaction<'static, Sqlite>,
    plugin: &str,
    key: &str,
    msg_id: &str,
    headers: &[(String, String)],
    payload: &[u8],
    reason: &str,
    attempts: i64,
    plugin_version: Option<&str>,
    first_seen_at: i64,
    now: i64,
    delivery: Option<&str>,
) -> Result<(), ClaimError> {
    sqlx::query(include_str!("../../queries/sqlite/dead_letter_insert.sql"))
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
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Check `claim`'s fence and take the write lock, inside `tx`.
pub(crate) async fn fence_holds(tx: &mut Transaction<'static, Sqlite>, claim: &ClaimRef) -> Result<bool, sqlx::Error> {
    let r = sqlx::query(include_str!("../../queries/sqlite/fence_check.sql"))
        .bind(&claim.plugin)
        .bind(&claim.key)
        .bind(claim.fence)
        .execute(&mut **tx)
        .await?;
    Ok(r.rows_affected() == 1)
}

impl SqliteClaims {
    /// Remove up to `limit` settled claims older than `before`, then their
    /// journal entries, in one transaction.
    async fn sweep_settled(&self, before: i64, limit: u32) -> Result<Vec<(String, String)>, ClaimError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let swept: Vec<(String, String)> = sqlx::query_as(include_str!("../../queries/sqlite/retention_claims.sql"))
            .bind(before)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        for (plugin, key) in &swept {
            sqlx::query(include_str!("../../queries/sqlite/retention_journal.sql"))
                .bind(plugin)
                .bind(key)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(swept)
    }
}

#[async_trait]
impl ClaimStore for SqliteClaims {
    async fn claim(&self, requests: &[ClaimRequest<'_>], now: i64) -> Result<Vec<ClaimOutcome>, ClaimError> {
        let waiting = std::time::Instant::now();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        // Leases start when the lock is held, not when it was asked for.
        let now = now + waiting.elapsed().as_millis() as i64;
        let mut out = Vec::with_capacity(requests.len());
        for r in requests {
            let existing = sqlx::query(include_str!("../../queries/sqlite/claim_get.sql"))
                .bind(r.plugin)
                .bind(r.key)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = existing else {
                sqlx::query(include_str!("../../queries/sqlite/claim_insert.sql"))
                    .bind(r.plugin)
                    .bind(r.key)
                    .bind(r.msg_id)
                    .bind(r.payload_hash)
                    .bind(r.owner)
                    .bind(now + r.lease_ms)
                    .bind(r.plugin_version)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                out.push(ClaimOutcome::Acquired {
                    fence: 1,
                    attempt: 1,
                    traps: 0,
                });
                continue;
            };
            let hash: String = row.try_get("payload_hash")?;
            let state: String = row.try_get("state")?;
            let fence: i64 = row.try_get("fence")?;
            let attempts: i64 = row.try_get("attempts")?;
            let last_error: Option<String> = row.try_get("last_error")?;
            let created_at: i64 = row.try_get("created_at")?;
            let stored = Stored {
                payload_hash: &hash,
                state: super::sql_admin::state(&state)?,
                lease_until: row.try_get("lease_until")?,
                not_before: row.try_get("not_before")?,
                attempts,
                last_error: last_error.as_deref(),
            };
            let outcome = match decide(&stored, r, now) {
                Decision::Answer(outcome) => outcome,
                Decision::Conflict(reason) => {
                    let delivery = delivery_identity(r.plugin, r.key, r.msg_id, r.payload);
                    insert_dead_letter(
                        &mut tx,
                        r.plugin,
                        r.key,
                        r.msg_id,
                        r.headers,
                        r.payload,
                        &reason,
                        0,
                        Some(r.plugin_version),
                        now,
                        now,
                        Some(&delivery),
                    )
                    .await?;
                    ClaimOutcome::Conflict
                }
                Decision::Exhaust(reason) => {
                    let retired: i64 = sqlx::query_scalar(include_str!("../../queries/sqlite/claim_mark_dead_any.sql"))
                        .bind(r.plugin)
                        .bind(r.key)
                        .bind(&reason)
                        .bind(now)
                        .fetch_one(&mut *tx)
                        .await?;
                    insert_dead_letter(
                        &mut tx,
                        r.plugin,
                        r.key,
                        r.msg_id,
                        r.headers,
                        r.payload,
                        &reason,
                        attempts,
                        Some(r.plugin_version),
                        created_at,
                        now,
                        None,
                    )
                    .await?;
                    ClaimOutcome::Exhausted {
                        attempts: attempts as u32,
                        fence: retired,
                    }
                }
                Decision::TakeOver => {
                    let row = sqlx::query(include_str!("../../queries/sqlite/claim_takeover.sql"))
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
                        attempt: row.try_get::<i64, _>("attempts")? as u32,
                        traps: row.try_get::<i64, _>("traps")? as u32,
                    }
                }
            };
            out.push(outcome);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn extend(&self, claims: &[ClaimRef], lease_ms: i64, now: i64) -> Result<Vec<bool>, ClaimError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(claims.len());
        for c in claims {
            let r = sqlx::query(include_str!("../../queries/sqlite/claim_extend.sql"))
                .bind(&c.plugin)
                .bind(&c.key)
                .bind(c.fence)
                .bind(now + lease_ms)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            out.push(r.rows_affected() == 1);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn confirm_with_results(&self, claims: &[ClaimRef], results: &[Option<&[u8]>], now: i64) -> Result<Vec<bool>, ClaimError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(claims.len());
        for (c, result) in claims.iter().zip(results) {
            let r = sqlx::query(include_str!("../../queries/sqlite/claim_confirm.sql"))
                .bind(&c.plugin)
                .bind(&c.key)
                .bind(c.fence)
                .bind(now)
                .bind(*result)
                .execute(&mut *tx)
                .await?;
            let confirmed = r.rows_affected() == 1
                || sqlx::query(include_str!("../../queries/sqlite/claim_confirmed.sql"))
                    .bind(&c.plugin)
                    .bind(&c.key)
                    .bind(c.fence)
                    .fetch_optional(&mut *tx)
                    .await?
                    .is_some();
            out.push(confirmed);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn results(&self, keys: &[(&str, &str)]) -> Result<Vec<Option<Vec<u8>>>, ClaimError> {
        let mut out = Vec::with_capacity(keys.len());
        for (plugin, key) in keys {
            let result: Option<Option<Vec<u8>>> = sqlx::query_scalar(include_str!("../../queries/sqlite/claim_result.sql"))
                .bind(plugin)
                .bind(key)
                .fetch_optional(&self.pool)
                .await?;
            out.push(result.flatten());
        }
        Ok(out)
    }

    async fn release(&self, claim: &ClaimRef, not_before: i64, error: &str, trapped: bool, now: i64) -> Result<bool, ClaimError> {
        let error = super::storable(error);
        let r = sqlx::query(include_str!("../../queries/sqlite/claim_release.sql"))
            .bind(&claim.plugin)
            .bind(&claim.key)
            .bind(claim.fence)
            .bind(not_before)
            .bind(error.as_ref())
            .bind(trapped as i64)
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn dead_letter(&self, items: &[DeadLetterRequest<'_>], now: i64) -> Result<Vec<bool>, ClaimError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(items.len());
        for d in items {
            let reason = super::storable(d.reason);
            let (attempts, first_seen, version) = match d.fence {
                Some(fence) => {
                    let row = sqlx::query(include_str!("../../queries/sqlite/claim_mark_dead.sql"))
                        .bind(d.plugin)
                        .bind(d.key)
                        .bind(fence)
                        .bind(reason.as_ref())
                        .bind(now)
                        .fetch_optional(&mut *tx)
                        .await?;
                    match row {
                        Some(row) => (
                            row.try_get::<i64, _>("attempts")?,
                            row.try_get::<i64, _>("created_at")?,
                            row.try_get::<Option<String>, _>("plugin_version")?,
                        ),
                        None => {
                            out.push(false);
                            continue;
                        }
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
            out.push(true);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn journal_get(&self, plugin: &str, key: &str, step: &str) -> Result<Option<JournalEntry>, ClaimError> {
        let row = sqlx::query(include_str!("../../queries/sqlite/journal_get.sql"))
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
        let n: i64 = sqlx::query_scalar(include_str!("../../queries/sqlite/fence_read.sql"))
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        if !fence_holds(&mut tx, claim).await? {
            return Ok(false);
        }
        sqlx::query(include_str!("../../queries/sqlite/journal_put.sql"))
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

super::sql_admin::sql_claim_admin!(SqliteClaims, "sqlite");
