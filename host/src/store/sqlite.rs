//! The data store in the embedded SQLite database, beside the claims, so a
//! write and its fence check commit in one transaction.

use async_trait::async_trait;
use sqlx::{Row, Sqlite, SqlitePool, Transaction};

use super::{DataError, DataStore, Inserted};
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

#[async_trait]
impl DataStore for SqliteData {
    async fn insert_unique(&self, claim: Option<&ClaimRef>, collection: &str, key: &str, value: &[u8]) -> Result<Inserted, DataError> {
        let mut tx = self.guarded(claim).await?;
        let r = sqlx::query(include_str!("../../queries/sqlite/kv_insert_unique.sql"))
            .bind(collection)
            .bind(key)
            .bind(value)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        let out = if r.rows_affected() == 1 {
            Inserted::Inserted
        } else {
            let existing: Vec<u8> = sqlx::query_scalar(include_str!("../../queries/sqlite/kv_get.sql"))
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
        sqlx::query(include_str!("../../queries/sqlite/kv_upsert.sql"))
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
        Ok(sqlx::query_scalar(include_str!("../../queries/sqlite/kv_get.sql"))
            .bind(collection)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn delete(&self, claim: Option<&ClaimRef>, collection: &str, key: &str) -> Result<bool, DataError> {
        let mut tx = self.guarded(claim).await?;
        let r = sqlx::query(include_str!("../../queries/sqlite/kv_delete.sql"))
            .bind(collection)
            .bind(key)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(r.rows_affected() == 1)
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
