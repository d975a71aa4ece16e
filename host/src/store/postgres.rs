//! The data store in Postgres.

use async_trait::async_trait;
use sqlx::{PgPool, Postgres, Row, Transaction};

use super::{DataError, DataStore, Inserted, Write, WriteOp, Written};
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

/// The columns of a batch's items at `at`, for `unnest`.
struct Columns {
    collections: Vec<String>,
    keys: Vec<String>,
    values: Vec<Vec<u8>>,
}

impl Columns {
    fn of(items: &[Write], at: &[usize]) -> Self {
        let value = |w: &Write| match &w.op {
            WriteOp::Upsert(v) | WriteOp::InsertUnique(v) => v.clone(),
            WriteOp::Delete => Vec::new(),
        };
        Columns {
            collections: at.iter().map(|&i| items[i].collection.clone()).collect(),
            keys: at.iter().map(|&i| items[i].key.clone()).collect(),
            values: at.iter().map(|&i| value(&items[i])).collect(),
        }
    }
}

/// Positions (0-based) from the 1-based positions a statement returned.
fn marked(n: usize, positions: Vec<i64>) -> Vec<bool> {
    let mut out = vec![false; n];
    for p in positions {
        if let Some(slot) = usize::try_from(p - 1).ok().and_then(|i| out.get_mut(i)) {
            *slot = true;
        }
    }
    out
}

impl PgData {
    /// Write a batch in one transaction, each item under its own claim: a
    /// stale fence fails its own item only. A batch of upserts only is one
    /// statement; otherwise the fences are checked (and locked) by one
    /// statement, then each kind is one statement, in the order upserts,
    /// insert-uniques, deletes (the items come from concurrent executions,
    /// so any order is one they could have run in). An error of a
    /// statement (a bad item, a deadlock abort) fails the whole batch;
    /// [`DataStore::write_many`] then writes item by item.
    pub async fn write_batch(&self, items: &[Write]) -> Result<Vec<Result<Written, DataError>>, sqlx::Error> {
        if items.iter().all(|w| matches!(w.op, WriteOp::Upsert(_))) {
            return self.upsert_batch(items).await;
        }
        let fence_query = match self.fencing {
            Fencing::Token => include_str!("../../queries/postgres/fence_batch_token.sql"),
            Fencing::ClaimRow => include_str!("../../queries/postgres/fence_batch_claim_row.sql"),
        };
        let mut tx = self.pool.begin().await?;
        let held: Vec<i64> = sqlx::query_scalar(fence_query)
            .bind(items.iter().map(|w| w.claim.plugin.clone()).collect::<Vec<String>>())
            .bind(items.iter().map(|w| w.claim.key.clone()).collect::<Vec<String>>())
            .bind(items.iter().map(|w| w.claim.fence).collect::<Vec<i64>>())
            .fetch_all(&mut *tx)
            .await?;
        let held = marked(items.len(), held);
        let mut out: Vec<Result<Written, DataError>> = items.iter().map(|w| Err(w.fence_lost())).collect();
        let of_kind = |kind: fn(&WriteOp) -> bool| -> Vec<usize> { (0..items.len()).filter(|&i| held[i] && kind(&items[i].op)).collect() };

        let upserts = of_kind(|op| matches!(op, WriteOp::Upsert(_)));
        if !upserts.is_empty() {
            let c = Columns::of(items, &upserts);
            sqlx::query(include_str!("../../queries/postgres/kv_upsert_many.sql"))
                .bind(c.collections)
                .bind(c.keys)
                .bind(c.values)
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
            for i in upserts {
                out[i] = Ok(Written::Upserted);
            }
        }

        let inserts = of_kind(|op| matches!(op, WriteOp::InsertUnique(_)));
        if !inserts.is_empty() {
            let c = Columns::of(items, &inserts);
            let inserted: Vec<i64> = sqlx::query_scalar(include_str!("../../queries/postgres/kv_insert_unique_many.sql"))
                .bind(c.collections)
                .bind(c.keys)
                .bind(c.values)
                .bind(now_ms())
                .fetch_all(&mut *tx)
                .await?;
            let inserted = marked(inserts.len(), inserted);
            let taken: Vec<usize> = inserts.iter().zip(&inserted).filter(|(_, ins)| !**ins).map(|(&i, _)| i).collect();
            for (&i, _) in inserts.iter().zip(&inserted).filter(|(_, ins)| **ins) {
                out[i] = Ok(Written::Inserted(Inserted::Inserted));
            }
            if !taken.is_empty() {
                let c = Columns::of(items, &taken);
                let found: Vec<(i64, Vec<u8>)> = sqlx::query_as(include_str!("../../queries/postgres/kv_get_many.sql"))
                    .bind(c.collections)
                    .bind(c.keys)
                    .fetch_all(&mut *tx)
                    .await?;
                for &i in &taken {
                    out[i] = Err(DataError::Unavailable(format!(
                        "key {:?} of collection {:?} was deleted while an insert-unique read it; retry",
                        items[i].key, items[i].collection
                    )));
                }
                for (p, value) in found {
                    if let Some(&i) = usize::try_from(p - 1).ok().and_then(|j| taken.get(j)) {
                        out[i] = Ok(Written::Inserted(Inserted::Existed(value)));
                    }
                }
            }
        }

        let deletes = of_kind(|op| matches!(op, WriteOp::Delete));
        if !deletes.is_empty() {
            let c = Columns::of(items, &deletes);
            let deleted: Vec<i64> = sqlx::query_scalar(include_str!("../../queries/postgres/kv_delete_many.sql"))
                .bind(c.collections)
                .bind(c.keys)
                .fetch_all(&mut *tx)
                .await?;
            for (&i, existed) in deletes.iter().zip(marked(deletes.len(), deleted)) {
                out[i] = Ok(Written::Deleted(existed));
            }
        }
        tx.commit().await?;
        Ok(out)
    }

    /// A batch of upserts in one statement (fence check, write, one
    /// transaction); the last write to a row wins.
    async fn upsert_batch(&self, items: &[Write]) -> Result<Vec<Result<Written, DataError>>, sqlx::Error> {
        let query = match self.fencing {
            Fencing::Token => include_str!("../../queries/postgres/kv_upsert_batch_token.sql"),
            Fencing::ClaimRow => include_str!("../../queries/postgres/kv_upsert_batch_claim_row.sql"),
        };
        let all: Vec<usize> = (0..items.len()).collect();
        let c = Columns::of(items, &all);
        let positions: Vec<i64> = sqlx::query_scalar(query)
            .bind(items.iter().map(|w| w.claim.plugin.clone()).collect::<Vec<String>>())
            .bind(items.iter().map(|w| w.claim.key.clone()).collect::<Vec<String>>())
            .bind(items.iter().map(|w| w.claim.fence).collect::<Vec<i64>>())
            .bind(c.collections)
            .bind(c.keys)
            .bind(c.values)
            .bind(now_ms())
            .fetch_all(&self.pool)
            .await?;
        Ok(items
            .iter()
            .zip(marked(items.len(), positions))
            .map(|(w, written)| if written { Ok(Written::Upserted) } else { Err(w.fence_lost()) })
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

    async fn write_many(&self, items: &[Write]) -> Vec<Result<Written, DataError>> {
        super::or_each(self, items, self.write_batch(items).await).await
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
