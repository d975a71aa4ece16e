//! The embedded broker: a SQLite table with a visibility timeout.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Row, SqlitePool};

use super::{Broker, BrokerError};
use crate::envelope::{Delivery, Envelope};
use crate::now_ms;

/// A queue in the embedded SQLite database.
pub struct SqliteBroker {
    pool: SqlitePool,
}

impl SqliteBroker {
    /// Use the queue table of this pool's database.
    pub fn new(pool: SqlitePool) -> Self {
        SqliteBroker { pool }
    }
}

fn parse_receipt(receipt: &str) -> Result<(i64, &str), BrokerError> {
    let (id, token) = receipt
        .split_once(':')
        .ok_or_else(|| BrokerError::Unavailable(format!("malformed receipt {receipt:?}")))?;
    let id = id
        .parse()
        .map_err(|_| BrokerError::Unavailable(format!("malformed receipt {receipt:?}")))?;
    Ok((id, token))
}

#[async_trait]
impl Broker for SqliteBroker {
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError> {
        let now = now_ms();
        let visible_at = super::due_at(now, delay);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for e in envelopes {
            let headers = serde_json::to_string(&e.headers).unwrap_or_else(|_| "[]".into());
            sqlx::query(include_str!("../../queries/sqlite/queue_publish.sql"))
                .bind(&e.id)
                .bind(&e.handler)
                .bind(headers)
                .bind(&e.payload)
                .bind(visible_at)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn fetch(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, BrokerError> {
        let now = now_ms();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let rows = sqlx::query(include_str!("../../queries/sqlite/queue_fetch.sql"))
            .bind(now)
            .bind(now + visibility.as_millis() as i64)
            .bind(max as i64)
            .bind(&token)
            .fetch_all(&self.pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let id: i64 = row.try_get("id")?;
            let headers: String = row.try_get("headers")?;
            out.push(Delivery {
                envelope: Envelope {
                    id: row.try_get("msg_id")?,
                    handler: row.try_get("handler")?,
                    headers: serde_json::from_str(&headers).unwrap_or_default(),
                    payload: row.try_get("payload")?,
                },
                receipt: format!("{id}:{token}"),
                delivery_count: row.try_get::<i64, _>("deliveries")? as u32,
                refused: None,
            });
        }
        out.sort_by_key(|d| parse_receipt(&d.receipt).map(|r| r.0).unwrap_or(0));
        Ok(out)
    }

    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        if receipts.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for r in receipts {
            let (id, _) = parse_receipt(r)?;
            sqlx::query(include_str!("../../queries/sqlite/queue_ack.sql"))
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        let (id, token) = parse_receipt(receipt)?;
        sqlx::query(include_str!("../../queries/sqlite/queue_nack.sql"))
            .bind(id)
            .bind(token)
            .bind(super::due_at(now_ms(), delay))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError> {
        if receipts.is_empty() {
            return Ok(());
        }
        let until = now_ms() + visibility.as_millis() as i64;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for r in receipts {
            let (id, token) = parse_receipt(r)?;
            sqlx::query(include_str!("../../queries/sqlite/queue_nack.sql"))
                .bind(id)
                .bind(token)
                .bind(until)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn pending(&self) -> Result<u64, BrokerError> {
        let n: i64 = sqlx::query_scalar(include_str!("../../queries/sqlite/queue_pending.sql"))
            .fetch_one(&self.pool)
            .await?;
        Ok(n as u64)
    }
}
