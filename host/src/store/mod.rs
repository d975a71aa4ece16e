//! The plugin data store: collections of opaque values, with writes that
//! commit only while the writer's claim is current.

pub mod batch;
pub mod postgres;
pub mod sqlite;
pub mod tokens;

use async_trait::async_trait;

use crate::claim::ClaimRef;

/// The outcome of an insert-unique.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inserted {
    /// The key was free.
    Inserted,
    /// The key was taken; its value.
    Existed(Vec<u8>),
}

/// Why a data-store operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The writer's fence is stale: another execution took the claim over.
    #[error("claim {plugin}/{key} was taken over (fence {fence} is stale); the write was refused")]
    FenceLost {
        /// Plugin.
        plugin: String,
        /// Key.
        key: String,
        /// The stale fence.
        fence: i64,
    },
    /// The store could not be reached or failed.
    #[error("data store unavailable: {0}")]
    Unavailable(String),
}

impl From<sqlx::Error> for DataError {
    fn from(e: sqlx::Error) -> Self {
        DataError::Unavailable(e.to_string())
    }
}

/// One upsert of a batch: a value written under a claim.
#[derive(Debug, Clone)]
pub struct Upsert {
    /// The claim the write presents.
    pub claim: ClaimRef,
    /// Collection.
    pub collection: String,
    /// Key in the collection.
    pub key: String,
    /// Value.
    pub value: Vec<u8>,
}

/// The data store. A write with `Some(claim)` commits only if the claim's
/// fence is current, atomically with the check; `None` is an unguarded
/// write (outage policy `run-unguarded`).
#[async_trait]
pub trait DataStore: Send + Sync + 'static {
    /// Insert unless the key exists.
    async fn insert_unique(&self, claim: Option<&ClaimRef>, collection: &str, key: &str, value: &[u8]) -> Result<Inserted, DataError>;
    /// Set the key to the value.
    async fn upsert(&self, claim: Option<&ClaimRef>, collection: &str, key: &str, value: &[u8]) -> Result<(), DataError>;
    /// Read the key.
    async fn get(&self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, DataError>;
    /// Delete the key; true if it existed.
    async fn delete(&self, claim: Option<&ClaimRef>, collection: &str, key: &str) -> Result<bool, DataError>;
    /// Tell the store that `claim`'s fence is now the current one (a
    /// takeover, or a claim retired when it was dead-lettered). Stores that
    /// check fences against claims in another system (fencing tokens, see
    /// [`tokens`]) refuse lower fences from then on. `FenceLost` if the store
    /// has already seen a higher fence for the claim. Stores that check the
    /// claim row itself need nothing.
    async fn advance_fence(&self, _claim: &ClaimRef) -> Result<(), DataError> {
        Ok(())
    }
    /// Retention: the claim store swept these claims (plugin, key); stores
    /// that keep fencing tokens drop theirs, so a key delivered again after
    /// the window starts over at fence 1.
    async fn forget_fences(&self, _claims: &[(String, String)]) -> Result<(), DataError> {
        Ok(())
    }
    /// Upsert many values, each under its own claim, with one result per
    /// item in order (a stale fence fails only its own item). Stores that
    /// can write a batch in one statement and one transaction override
    /// this; the default writes one at a time.
    async fn upsert_many(&self, items: &[Upsert]) -> Vec<Result<(), DataError>> {
        let mut out = Vec::with_capacity(items.len());
        for u in items {
            out.push(self.upsert(Some(&u.claim), &u.collection, &u.key, &u.value).await);
        }
        out
    }
    /// Every key and value of a collection (for inspection and tests).
    async fn scan(&self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, DataError>;
}
