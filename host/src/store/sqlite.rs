//! The data store in the embedded SQLite database, beside the claims, so a
//! write and its fence check commit in one transaction.

use async_trait::async_trait;
use sqlx::{Row, Sqlite, SqlitePool, Transaction};

use super::{DataError, DataStore, Inserted, Write, WriteOp, Written};
use crate::claim::sqlite::fence_holds;
use crate::claim::ClaimRef;
use crate::now_ms;

/// The SQLite data store.
pub struct SqliteData {
    pool: SqlitePool,
}

impl SqliteData {
    /// Use the kv table of this pool's database.
    pub fn new(pool: SqlitePool) -> Self {
        SqliteData { pool }
    }

    /// Begin a write transaction, checking the fence first.
    async fn guarded(&self, claim: Option<&ClaimRef>) -> Result<Transaction<'static, Sqlite>, DataError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(c) = claim {
            if !fence_holds(&mut tx, c).await? {
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

impl SqliteData {
    /// A batch in one transaction (one commit, one fsync), each item under
    /// its own claim, in order: a stale fence fails its own item only. An
    /// error of SQLite's fails the whole batch; [`DataStore::write_many`]
    /// then writes item by item.
    pub async fn write_batch(&self, items: &[Write]) -> Result<Vec<Result<Written, DataError>>, sqlx::Error> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(items.len());
        for w in items {
            if !fence_holds(&mut tx, &w.claim).await? {
                out.push(Err(w.fence_lost()));
                continue;
            }
            out.push(Ok(match &w.op {
                WriteOp::Upsert(v) => {
                    Self::put(&mut tx, &w.collection, &w.key, v).await?;
                    Written::Upserted
                }
                WriteOp::InsertUnique(v) => Written::Inserted(Self::insert(&mut tx, &w.collection, &w.key, v).await?),
                WriteOp::Delete => Written::Deleted(Self::remove(&mut tx, &w.collection, &w.key).await?),
            }));
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn put(tx: &mut Transaction<'static, Sqlite>, collection: &str, key: &str, value: &[u8]) -> Result<(), sqlx::Error> {
        sqlx::query(include_str!("../../queries/sqlite/kv_upsert.sql"))
            .bind(collection)
            .bind(key)
            .bind(value)
            .bind(now_ms())
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn insert(tx: &mut Transaction<'static, Sqlite>, collection: &str, key: &str, value: &[u8]) -> Result<Inserted, sqlx::Error> {
        let r = sqlx::query(include_str!("../../queries/sqlite/kv_insert_unique.sql"))
            .bind(collection)
            .bind(key)
            .bind(value)
            .bind(now_ms())
            .execute(&mut **tx)
            .await?;
        if r.rows_affected() == 1 {
            return Ok(Inserted::Inserted);
        }
        let existing: Vec<u8> = sqlx::query_scalar(include_str!("../../queries/sqlite/kv_get.sql"))
            .bind(collection)
            .bind(key)
            .fetch_one(&mut **tx)
            .await?;
        Ok(Inserted::Existed(existing))
    }

    async fn remove(tx: &mut Transaction<'static, Sqlite>, collection: &str, key: &str) -> Result<bool, sqlx::Error> {
        let r = sqlx::query(include_str!("../../queries/sqlite/kv_delete.sql"))
            .bind(collection)
            .bind(key)
            .execute(&mut **tx)
            .await?;
        Ok(r.rows_affected() == 1)
    }
}

#[async_trait]
impl DataStore for SqliteData {
    async fn insert_unique(&self, claim: Option<&ClaimRef>, collection: &str, key: &str, value: &[u8]) -> Result<Inserted, DataError> {
        let mut tx = self.guarded(claim).await?;
        let out = Self::insert(&mut tx, collection, key, value).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn upsert(&self, claim: Option<&ClaimRef>, collection: &str, key: &str, value: &[u8]) -> Result<(), DataError> {
        let mut tx = self.guarded(claim).await?;
        Self::put(&mut tx, collection, key, value).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get(&self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, DataError> {
        Ok(sqlx::query_scalar(include_str!("../../queries/sqlite/kv_get.sql"))
            .bind(collection)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn delete(&self, claim: Option<&ClaimRef>, collection: &str, key: &str) -> Result<bool, DataError> {
        let mut tx = self.guarded(claim).await?;
        let existed = Self::remove(&mut tx, collection, key).await?;
        tx.commit().await?;
        Ok(existed)
    }

    async fn write_many(&self, items: &[Write]) -> Vec<Result<Written, DataError>> {
        super::or_each(self, items, self.write_batch(items).await).await
    }

    async fn scan(&self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, DataError> {
        let rows = sqlx::query(include_str!("../../queries/sqlite/kv_scan.sql"))
            .bind(collection)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| Ok((r.try_get("key")?, r.try_get("value")?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }
}
