//! Brokers: where deliveries come from and where acks go.
//!
//! Every broker is at-least-once: a delivery that is not acked before its
//! visibility timeout is delivered again, possibly while the first delivery
//! is still being handled. Idem never relies on a broker delivering once.

pub mod amqp;
pub mod nats;
pub mod redis;
pub mod sqlite;

use std::time::Duration;

use async_trait::async_trait;

use crate::envelope::{Delivery, Envelope};

/// Broker failures.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The broker could not be reached or failed.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
}

impl From<sqlx::Error> for BrokerError {
    fn from(e: sqlx::Error) -> Self {
        BrokerError::Unavailable(e.to_string())
    }
}

/// A queue Idem consumes. Batch methods take and answer many deliveries in
/// one round trip where the broker allows it.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Publish envelopes, visible after `delay`.
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError>;
    /// Fetch up to `max` deliveries, each invisible to others for `visibility`.
    async fn fetch(&self, max: usize, visibility: Duration) -> Result<Vec<Delivery>, BrokerError>;
    /// Acknowledge: the message will not be delivered again.
    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError>;
    /// Make a delivery visible again after `delay` (no ack).
    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError>;
    /// Push back the visibility deadline of deliveries still being handled.
    async fn extend(&self, receipts: &[&str], visibility: Duration) -> Result<(), BrokerError>;
    /// Messages not yet acked (visible or in flight).
    async fn pending(&self) -> Result<u64, BrokerError>;
}
