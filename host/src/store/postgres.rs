//! The data store in Postgres.

use async_trait::async_trait;
use sqlx::{PgPool, Postgres, Row, Transaction};

use super::{Confirm, DataError, DataStore, Inserted, Write, WriteOp, Written, WrittenAndConfirmed};
use crate::claim::{ClaimError, ClaimRef};
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

/// A batch's answers: one per write, one per confirm.
type Answers = (Vec<Result<Written, DataError>>, Vec<bool>);

impl PgData {
    /// Write a batch in one transaction, each item under its own claim: a
    /// stale fence fails its own item only. A batch of upserts only is one
    /// statement; otherwise the fences are checked (and locked) by one
    /// statement, then each kind is one statement, in the order upserts,
    /// insert-uniques, deletes (the items come from concurrent executions,
    /// and group commit puts one kind of write of a key in a batch, so
    /// each key's writes still commit in the order they were queued). An
    /// error of a
    /// statement (a bad item, a deadlock abort) fails the whole batch;
    /// [`DataStore::write_many`] then writes item by item.
    pub async fn write_batch(&self, items: &[Write]) -> Result<Vec<Result<Written, DataError>>, sqlx::Error> {
        Ok(self.write_batch_confirming(items, &[], 0).await?.0)
    }

    /// [`PgData::write_batch`], confirming `confirms` (claims of this
    /// database, see [`DataStore::confirms_claims`]) in the same
    /// transaction: in the upsert statement itself when the batch is upserts
    /// only, as one more statement before the commit otherwise.
    pub async fn write_batch_confirming(&self, items: &[Write], confirms: &[Confirm], now: i64) -> Result<Answers, sqlx::Error> {
        if !confirms.is_empty() && !self.confirms_claims() {
            return Err(sqlx::Error::InvalidArgument(
                "confirms given to a data store whose claims live elsewhere".into(),
            ));
        }
        if items.is_empty() {
            let confirmed = confirm_in(&self.pool, confirms, now).await?;
            return Ok((Vec::new(), confirmed));
        }
        if items.iter().all(|w| matches!(w.op, WriteOp::Upsert(_))) {
            return self.upsert_batch(items, confirms, now).await;
        }
        let fence_query = match self.fencing {
            Fencing::Token => include_str!("../../queries/postgres/fence_batch_token.sql"),
            Fencing::ClaimRow => crate::claim::locking::FENCE_BATCH.as_str(),
        };
        let mut tx = self.pool.begin().await?;
        let fences = sqlx::query_scalar(fence_query)
            .bind(items.iter().map(|w| w.claim.plugin.clone()).collect::<Vec<String>>())
            .bind(items.iter().map(|w| w.claim.key.clone()).collect::<Vec<String>>())
            .bind(items.iter().map(|w| w.claim.fence).collect::<Vec<i64>>());
        // With the claims here, the rows of the confirms are locked in the
        // same pass.
        let fences = match self.fencing {
            Fencing::Token => fences,
            Fencing::ClaimRow => fences
                .bind(confirms.iter().map(|c| c.claim.plugin.clone()).collect::<Vec<String>>())
                .bind(confirms.iter().map(|c| c.claim.key.clone()).collect::<Vec<String>>()),
        };
        let held: Vec<i64> = fences.fetch_all(&mut *tx).await?;
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
        let confirmed = if confirms.is_empty() {
            Vec::new()
        } else {
            confirm_in(&mut *tx, confirms, now).await?
        };
        tx.commit().await?;
        Ok((out, confirmed))
    }

    /// A batch of upserts in one statement (fence check, write, and the
    /// confirms, one transaction); the last write to a row wins.
    async fn upsert_batch(&self, items: &[Write], confirms: &[Confirm], now: i64) -> Result<Answers, sqlx::Error> {
        let all: Vec<usize> = (0..items.len()).collect();
        let c = Columns::of(items, &all);
        let query = match self.fencing {
            Fencing::Token => sqlx::query_as(include_str!("../../queries/postgres/kv_upsert_batch_token.sql")),
            Fencing::ClaimRow => sqlx::query_as(crate::claim::locking::UPSERT_BATCH.as_str()),
        };
        let query = query
            .bind(items.iter().map(|w| w.claim.plugin.clone()).collect::<Vec<String>>())
            .bind(items.iter().map(|w| w.claim.key.clone()).collect::<Vec<String>>())
            .bind(items.iter().map(|w| w.claim.fence).collect::<Vec<i64>>())
            .bind(c.collections)
            .bind(c.keys)
            .bind(c.values)
            .bind(now_ms());
        let rows: Vec<(i64, bool)> = match self.fencing {
            // No confirms here (`write_batch_confirming` refuses them).
            Fencing::Token => query.fetch_all(&self.pool).await?,
            Fencing::ClaimRow => {
                query
                    .bind(confirms.iter().map(|c| c.claim.plugin.clone()).collect::<Vec<String>>())
                    .bind(confirms.iter().map(|c| c.claim.key.clone()).collect::<Vec<String>>())
                    .bind(confirms.iter().map(|c| c.claim.fence).collect::<Vec<i64>>())
                    .bind(confirms.iter().map(|c| c.result.clone()).collect::<Vec<_>>())
                    .bind(now)
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        let (mut written, mut confirmed) = (Vec::new(), Vec::new());
        for (position, confirm) in rows {
            if confirm { &mut confirmed } else { &mut written }.push(position);
        }
        let written = marked(items.len(), written);
        let confirmed = marked(confirms.len(), confirmed);
        let out = items
            .iter()
            .zip(written)
            .map(|(w, written)| if written { Ok(Written::Upserted) } else { Err(w.fence_lost()) })
            .collect();
        Ok((out, confirmed))
    }
}

/// Confirm claims of this database on `conn` (the pool, or a batch's
/// transaction), as the claim store does.
async fn confirm_in<'c, E>(conn: E, confirms: &[Confirm], now: i64) -> Result<Vec<bool>, sqlx::Error>
where
    E: sqlx::Executor<'c, Database = Postgres>,
{
    let claims: Vec<ClaimRef> = confirms.iter().map(|c| c.claim.clone()).collect();
    let results = confirms.iter().map(|c| c.result.clone()).collect();
    crate::claim::postgres::confirm_in(conn, &claims, results, now).await
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

    fn confirms_claims(&self) -> bool {
        self.fencing == Fencing::ClaimRow
    }

    async fn confirm(&self, confirms: Vec<Confirm>, now: i64) -> Result<Vec<bool>, ClaimError> {
        if !self.confirms_claims() {
            return Err(ClaimError::Unavailable("the claims are not in the data store's database".into()));
        }
        Ok(confirm_in(&self.pool, &confirms, now).await?)
    }

    async fn write_and_confirm(&self, items: &[Write], confirms: Vec<Confirm>, now: i64) -> WrittenAndConfirmed {
        if !self.confirms_claims() {
            return (self.write_many(items).await, self.confirm(confirms, now).await);
        }
        match self.write_batch_confirming(items, &confirms, now).await {
            Ok((written, confirmed)) => (written, Ok(confirmed)),
            // The transaction failed as a whole (a bad item, a deadlock
            // abort): the confirms on their own, first (their writes
            // committed in earlier batches, and their leases run), then
            // the writes item by item.
            Err(e) => {
                tracing::debug!(error = %e, items = items.len(), confirms = confirms.len(), "group commit failed; writing the batch item by item");
                let confirmed = self.confirm(confirms, now).await;
                (super::write_each(self, items).await, confirmed)
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
