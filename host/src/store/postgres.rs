//! The data store in Postgres.

use async_trait::async_trait;
use sqlx::{PgPool, Postgres, Row, Transaction};

use super::{DataError, DataStore, Inserted, Upsert};
use crate::claim::ClaimRef;
use crate::now_ms;

/// How a write proves its claim is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// The claims live in the same database: the write share-locks the claim
    /// row and checks its fence in the same transaction.
    ClaimRow,
    /// The claims live elsewhere (Redis): the store keeps the highest fence
    /// presented per claim and refuses a write presenting a lower one (a
    /// fencing token checked at the resource).
    Token,
}

/// The Postgres data store.
pub struct PgData {
    pool: PgPool,
    fencing: Fencing,
}

impl PgData {
    /// Use the kv table of this pool's schema.
    pub fn new(pool: PgPool, fencing: Fencing) -> Self {
        PgData { pool, fencing }
    }

    async fn guarded(&self, claim: Option<&ClaimRef>) -> Result<Transaction<'static, Postgres>, DataError> {
        let mut tx = self.pool.begin().await?;
        if let Some(c) = claim {
            let current = match self.fencing {
                Fencing::ClaimRow => crate::claim::postgres::fence_holds(&mut tx, c).await?,
                Fencing::Token => {
                    let highest: i64 = sqlx::query_scalar(include_str!("../../queries/postgres/fence_token.sql"))
                        .bind(&c.plugin)
                        .bind(&c.key)
                        .bind(c.fence)
                        .fetch_one(&mut *tx)
                        .await?;
                    highest == c.fence
                }
            };
            if !current {
                return Err(DataError::FenceLost {
                    plugin: c.plugin.clone(),
                    key: c.key.clone(),
                    fence: c.fence,
                });
            }
        }
        Ok(tx)
    }
}

impl PgData {
    /// Upsert a batch in one statement and one transaction, each item under
    /// its own claim: a stale fence fails its own item only; the last write
    /// to a row wins. An error of the statement (a bad item, a deadlock
    /// abort) fails the whole batch; [`DataStore::upsert_many`] then writes
    /// item by item.
    pub async fn upsert_batch(&self, items: &[Upsert]) -> Result<Vec<Result<(), DataError>>, sqlx::Error> {
        let query = match self.fencing {
            Fencing::Token => include_str!("../../queries/postgres/kv_upsert_batch_token.sql"),
            Fencing::ClaimRow => include_str!("../../queries/postgres/kv_upsert_batch_claim_row.sql"),
        };
        let col = |f: fn(&Upsert) -> String| items.iter().map(f).collect::<Vec<String>>();
        let positions: Vec<i64> = sqlx::query_scalar(query)
            .bind(col(|u| u.claim.plugin.clone()))
            .bind(col(|u| u.claim.key.clone()))
            .bind(items.iter().map(|u| u.claim.fence).collect::<Vec<i64>>())
            .bind(col(|u| u.collection.clone()))
            .bind(col(|u| u.key.clone()))
            .bind(items.iter().map(|u| u.value.clone()).collect::<Vec<Vec<u8>>>())
            .bind(now_ms())
            .fetch_all(&self.pool)
            .await?;
        let mut written = vec![false; items.len()];
        for p in positions {
            if let Some(slot) = written.get_mut((p - 1) as usize) {
                *slot = true;
            }
        }
        Ok(items
            .iter()
            .zip(written)
            .map(|(u, written)| {
                if written {
                    Ok(())
                } else {
                    Err(DataError::FenceLost {
                        plugin: u.claim.plugin.clone(),
                        key: u.claim.key.clone(),
                        fence: u.claim.fence,
                    })
                }
            })
            .collect())
    }
}

#[async_trait]
impl DataStore for PgData {
    async fn insert_unique(&self, claim: Option<&ClaimRef>, collection: &str, key: &str, value: &[u8]) -> Result<Inserted, DataError> {
        let mut tx = self.guarded(claim).await?;
        let r = sqlx::query(include_str!("../../queries/postgres/kv_insert_unique.sql"))
            .bind(collection)
            .bind(key)
            .bind(value)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        let out = if r.rows_affected() == 1 {
            Inserted::Inserted
        } else {
            let existing: Vec<u8> = sqlx::query_scalar(include_str!("../../queries/postgres/kv_get.sql"))
                .bind(collection)
                .bind(key)
                .fetch_one(&mut *tx)
                .await?;
            Inserted::Existed(existing)
        };
        tx.commit().await?;
        Ok(out)
    }

    async fn upsert(&self, claim: Option<&ClaimRef>, collection: &str, key: &str, value: &[u8]) -> Result<(), DataError> {
        let mut tx = self.guarded(claim).await?;
        sqlx::query(include_str!("../../queries/postgres/kv_upsert.sql"))
            .bind(collection)
            .bind(key)
            .bind(value)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get(&self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, DataError> {
        Ok(sqlx::query_scalar(include_str!("../../queries/postgres/kv_get.sql"))
            .bind(collection)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn delete(&self, claim: Option<&ClaimRef>, collection: &str, key: &str) -> Result<bool, DataError> {
        let mut tx = self.guarded(claim).await?;
        let r = sqlx::query(include_str!("../../queries/postgres/kv_delete.sql"))
            .bind(collection)
            .bind(key)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(r.rows_affected() == 1)
    }

    async fn advance_fence(&self, claim: &ClaimRef) -> Result<(), DataError> {
        if self.fencing == Fencing::Token {
            let highest: i64 = sqlx::query_scalar(include_str!("../../queries/postgres/fence_token.sql"))
                .bind(&claim.plugin)
                .bind(&claim.key)
                .bind(claim.fence)
                .fetch_one(&self.pool)
                .await?;
            if highest > claim.fence {
                return Err(DataError::FenceLost {
                    plugin: claim.plugin.clone(),
                    key: claim.key.clone(),
                    fence: claim.fence,
                });
            }
        }
        Ok(())
    }

    async fn forget_fences(&self, claims: &[(String, String)]) -> Result<(), DataError> {
        if self.fencing == Fencing::Token && !claims.is_empty() {
            let (plugins, keys): (Vec<&str>, Vec<&str>) = claims.iter().map(|(p, k)| (p.as_str(), k.as_str())).unzip();
            sqlx::query(include_str!("../../queries/postgres/fence_forget.sql"))
                .bind(plugins)
                .bind(keys)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    async fn upsert_many(&self, items: &[Upsert]) -> Vec<Result<(), DataError>> {
        match self.upsert_batch(items).await {
            Ok(results) => results,
            Err(e) => {
                // One bad item (or a deadlock abort) must not fail the
                // others: write this batch one item at a time, so each error
                // lands on its own item only.
                tracing::debug!(error = %e, items = items.len(), "group commit failed; writing the batch item by item");
                let mut out = Vec::with_capacity(items.len());
                for u in items {
                    out.push(self.upsert(Some(&u.claim), &u.collection, &u.key, &u.value).await);
                }
                out
            }
        }
    }

    async fn scan(&self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, DataError> {
        let rows = sqlx::query(include_str!("../../queries/postgres/kv_scan.sql"))
            .bind(collection)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| Ok((r.try_get("key")?, r.try_get("value")?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }
}
