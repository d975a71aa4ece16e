//! [`super::ClaimAdmin`] for the SQL claim stores. SQLite and Postgres hold
//! the same tables and answer the same questions; their statements differ
//! only in placeholders, so each dialect keeps its own files under
//! `queries/` and the code that runs them is written once here.

/// Implement `ClaimAdmin` for a claim store with a `pool` field of a SQL
/// database, reading statements from `queries/<dialect>/`.
macro_rules! sql_claim_admin {
    ($store:ty, $dialect:literal) => {
        #[async_trait::async_trait]
        impl $crate::claim::ClaimAdmin for $store {
            async fn ping(&self) -> Result<(), $crate::claim::ClaimError> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }

            async fn clock_ms(&self) -> Result<Option<i64>, $crate::claim::ClaimError> {
                let file = include_str!(concat!("../../queries/", $dialect, "/clock.sql"));
                let query: String = file.lines().filter(|l| !l.trim_start().starts_with("--")).collect();
                if query.trim().is_empty() {
                    return Ok(None);
                }
                Ok(Some(
                    sqlx::query_scalar(sqlx::AssertSqlSafe(query)).fetch_one(&self.pool).await?,
                ))
            }

            async fn state(&self, plugin: &str, key: &str) -> Result<Option<$crate::claim::ClaimState>, $crate::claim::ClaimError> {
                let name: Option<String> = sqlx::query_scalar(include_str!(concat!("../../queries/", $dialect, "/admin_state.sql")))
                    .bind(plugin)
                    .bind(key)
                    .fetch_optional(&self.pool)
                    .await?;
                name.map(|n| $crate::claim::sql_admin::state(&n)).transpose()
            }

            async fn counts(&self) -> Result<$crate::claim::ClaimCounts, $crate::claim::ClaimError> {
                use sqlx::Row;
                let rows = sqlx::query(include_str!(concat!("../../queries/", $dialect, "/admin_counts.sql")))
                    .fetch_all(&self.pool)
                    .await?;
                let mut c = $crate::claim::ClaimCounts::default();
                for row in rows {
                    let n = row.try_get::<i64, _>("n")? as u64;
                    c.set($crate::claim::sql_admin::state(&row.try_get::<String, _>("state")?)?, n);
                }
                c.dead_letters = $crate::claim::ClaimAdmin::dead_letter_count(self).await?;
                c.journal = sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM journal")
                    .fetch_one(&self.pool)
                    .await? as u64;
                Ok(c)
            }

            async fn dead_letter_count(&self) -> Result<u64, $crate::claim::ClaimError> {
                Ok(sqlx::query_scalar::<_, i64>(include_str!(concat!(
                    "../../queries/",
                    $dialect,
                    "/admin_dead_letter_count.sql"
                )))
                .fetch_one(&self.pool)
                .await? as u64)
            }

            async fn dead_letters(&self, limit: i64) -> Result<Vec<$crate::claim::DeadLetter>, $crate::claim::ClaimError> {
                let rows = sqlx::query(include_str!(concat!("../../queries/", $dialect, "/admin_dead_letters.sql")))
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows.iter().map(dead_letter_row).collect::<Result<_, sqlx::Error>>()?)
            }

            async fn dead_letter_summaries(&self, limit: i64) -> Result<Vec<$crate::claim::DeadLetterSummary>, $crate::claim::ClaimError> {
                let rows = sqlx::query(include_str!(concat!(
                    "../../queries/",
                    $dialect,
                    "/admin_dead_letter_summaries.sql"
                )))
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
                Ok(rows.iter().map(dead_letter_summary).collect::<Result<_, sqlx::Error>>()?)
            }

            async fn dead_letter_get(&self, id: i64) -> Result<Option<$crate::claim::DeadLetter>, $crate::claim::ClaimError> {
                let row = sqlx::query(include_str!(concat!(
                    "../../queries/",
                    $dialect,
                    "/admin_dead_letter_get.sql"
                )))
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
                Ok(row.as_ref().map(dead_letter_row).transpose()?)
            }

            async fn dead_letter_release(&self, id: i64) -> Result<(), $crate::claim::ClaimError> {
                sqlx::query(include_str!(concat!(
                    "../../queries/",
                    $dialect,
                    "/admin_dead_letter_release.sql"
                )))
                .bind(id)
                .execute(&self.pool)
                .await?;
                Ok(())
            }

            async fn dead_letter_remove(&self, ids: &[i64]) -> Result<u64, $crate::claim::ClaimError> {
                let mut tx = self.pool.begin().await?;
                let mut removed = 0;
                for id in ids {
                    removed += sqlx::query(include_str!(concat!(
                        "../../queries/",
                        $dialect,
                        "/admin_dead_letter_delete.sql"
                    )))
                    .bind(id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                }
                tx.commit().await?;
                Ok(removed)
            }

            async fn revive(&self, plugin: &str, key: &str, payload_hash: &str, now: i64) -> Result<bool, $crate::claim::ClaimError> {
                let r = sqlx::query(include_str!(concat!("../../queries/", $dialect, "/claim_revive.sql")))
                    .bind(plugin)
                    .bind(key)
                    .bind(now)
                    .bind(payload_hash)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn sweep(
                &self,
                settled_before: i64,
                dead_letters_before: Option<i64>,
                limit: u32,
            ) -> Result<$crate::claim::Swept, $crate::claim::ClaimError> {
                let claims = self.sweep_settled(settled_before, limit).await?;
                let dead_letters = match dead_letters_before {
                    Some(before) => sqlx::query(include_str!(concat!(
                        "../../queries/",
                        $dialect,
                        "/retention_dead_letters.sql"
                    )))
                    .bind(before)
                    .bind(i64::from(limit))
                    .execute(&self.pool)
                    .await?
                    .rows_affected(),
                    None => 0,
                };
                Ok($crate::claim::Swept { claims, dead_letters })
            }

            async fn key_pointer(&self, plugin: &str, pointer: &str, now: i64) -> Result<String, $crate::claim::ClaimError> {
                Ok(
                    sqlx::query_scalar(include_str!(concat!("../../queries/", $dialect, "/key_pointer_record.sql")))
                        .bind(plugin)
                        .bind(pointer)
                        .bind(now)
                        .fetch_one(&self.pool)
                        .await?,
                )
            }

            async fn claim(&self, plugin: &str, key: &str) -> Result<Option<$crate::claim::ClaimInfo>, $crate::claim::ClaimError> {
                let row = sqlx::query(include_str!(concat!("../../queries/", $dialect, "/admin_claim.sql")))
                    .bind(plugin)
                    .bind(key)
                    .fetch_optional(&self.pool)
                    .await?;
                row.as_ref().map(claim_row).transpose()
            }

            async fn claims_in(
                &self,
                state: $crate::claim::ClaimState,
                plugin: Option<&str>,
                limit: i64,
            ) -> Result<Vec<$crate::claim::ClaimInfo>, $crate::claim::ClaimError> {
                let rows = sqlx::query(include_str!(concat!("../../queries/", $dialect, "/admin_claims_in.sql")))
                    .bind(state.as_str())
                    .bind(plugin.unwrap_or(""))
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(claim_row).collect()
            }

            async fn journal(&self, plugin: &str, key: &str) -> Result<Vec<$crate::claim::JournalStep>, $crate::claim::ClaimError> {
                let rows = sqlx::query(include_str!(concat!("../../queries/", $dialect, "/admin_journal.sql")))
                    .bind(plugin)
                    .bind(key)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows.iter().map(journal_row).collect::<Result<_, sqlx::Error>>()?)
            }

            async fn activity_add(&self, minute: i64, counts: &[(&str, u64)], keep_since: i64) -> Result<(), $crate::claim::ClaimError> {
                let mut tx = self.pool.begin().await?;
                for (outcome, n) in counts.iter().filter(|(_, n)| *n > 0) {
                    sqlx::query(include_str!(concat!("../../queries/", $dialect, "/activity_add.sql")))
                        .bind(minute)
                        .bind(*outcome)
                        .bind(*n as i64)
                        .execute(&mut *tx)
                        .await?;
                }
                sqlx::query(include_str!(concat!("../../queries/", $dialect, "/activity_trim.sql")))
                    .bind(keep_since)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn activity(&self, since: i64) -> Result<Vec<(i64, String, u64)>, $crate::claim::ClaimError> {
                let rows: Vec<(i64, String, i64)> =
                    sqlx::query_as(include_str!(concat!("../../queries/", $dialect, "/activity_since.sql")))
                        .bind(since)
                        .fetch_all(&self.pool)
                        .await?;
                Ok(rows.into_iter().map(|(m, o, n)| (m, o, n.max(0) as u64)).collect())
            }

            async fn set_key_pointer(&self, plugin: &str, pointer: &str, now: i64) -> Result<(), $crate::claim::ClaimError> {
                sqlx::query(include_str!(concat!("../../queries/", $dialect, "/key_pointer_set.sql")))
                    .bind(plugin)
                    .bind(pointer)
                    .bind(now)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }
        }

        fn claim_row<R: sqlx::Row>(row: &R) -> Result<$crate::claim::ClaimInfo, $crate::claim::ClaimError>
        where
            for<'c> &'c str: sqlx::ColumnIndex<R>,
            for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        {
            Ok($crate::claim::ClaimInfo {
                plugin: row.try_get("plugin")?,
                key: row.try_get("key")?,
                msg_id: row.try_get("msg_id")?,
                state: $crate::claim::sql_admin::state(&row.try_get::<String, _>("state")?)?,
                fence: row.try_get("fence")?,
                owner: row.try_get::<Option<String>, _>("owner")?.filter(|o| !o.is_empty()),
                lease_until: row.try_get("lease_until")?,
                not_before: row.try_get("not_before")?,
                attempts: row.try_get::<i64, _>("attempts")? as u32,
                traps: row.try_get::<i64, _>("traps")? as u32,
                last_error: row.try_get("last_error")?,
                plugin_version: row.try_get("plugin_version")?,
                created_at: row.try_get("created_at")?,
                updated_at: row.try_get("updated_at")?,
            })
        }

        fn journal_row<R: sqlx::Row>(row: &R) -> Result<$crate::claim::JournalStep, sqlx::Error>
        where
            for<'c> &'c str: sqlx::ColumnIndex<R>,
            for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        {
            Ok($crate::claim::JournalStep {
                step: row.try_get("step")?,
                request_hash: row.try_get("request_hash")?,
                response: row.try_get("response")?,
                plugin_version: row.try_get("plugin_version")?,
                created_at: Some(row.try_get("created_at")?),
            })
        }

        fn dead_letter_row<R: sqlx::Row>(row: &R) -> Result<$crate::claim::DeadLetter, sqlx::Error>
        where
            for<'c> &'c str: sqlx::ColumnIndex<R>,
            for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        {
            Ok($crate::claim::DeadLetter {
                summary: dead_letter_summary(row)?,
                headers: $crate::claim::admin::parse_headers(&row.try_get::<String, _>("headers")?),
                payload: row.try_get("payload")?,
            })
        }

        fn dead_letter_summary<R: sqlx::Row>(row: &R) -> Result<$crate::claim::DeadLetterSummary, sqlx::Error>
        where
            for<'c> &'c str: sqlx::ColumnIndex<R>,
            for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
            for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        {
            Ok($crate::claim::DeadLetterSummary {
                id: row.try_get("id")?,
                plugin: row.try_get("plugin")?,
                key: row.try_get("key")?,
                msg_id: row.try_get("msg_id")?,
                reason: row.try_get("reason")?,
                attempts: row.try_get::<i64, _>("attempts")? as u32,
                plugin_version: row.try_get("plugin_version")?,
                first_seen_at: row.try_get("first_seen_at")?,
                dead_at: row.try_get("dead_at")?,
            })
        }
    };
}

pub(crate) use sql_claim_admin;

/// The state a stored name stands for; an unknown name is a store error
/// (a newer schema, or a row written by hand).
pub(crate) fn state(name: &str) -> Result<super::ClaimState, super::ClaimError> {
    super::ClaimState::parse(name)
        .ok_or_else(|| super::ClaimError::Unavailable(format!("the claim store holds an unknown claim state {name:?}")))
}
