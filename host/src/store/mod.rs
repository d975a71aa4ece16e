//! The plugin data store: collections of opaque values, with writes that
//! commit only while the writer's claim is current.

pub mod batch;
pub mod postgres;
pub mod sqlite;
pub mod tokens;

use async_trait::async_trait;

use crate::claim::{ClaimError, ClaimRef};

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

#[cfg(test)]
impl DataError {
    /// A refusal for a stale fence, for tests.
    pub(crate) fn stale() -> Self {
        DataError::FenceLost {
            plugin: "p".into(),
            key: "k".into(),
            fence: 1,
        }
    }
}

impl From<sqlx::Error> for DataError {
    fn from(e: sqlx::Error) -> Self {
        DataError::Unavailable(e.to_string())
    }
}

/// What a guarded write does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Set the key to the value.
    Upsert(Vec<u8>),
    /// Insert unless the key exists.
    InsertUnique(Vec<u8>),
    /// Delete the key.
    Delete,
}

/// What a guarded write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The upsert committed.
    Upserted,
    /// The insert-unique committed, or found the key taken.
    Inserted(Inserted),
    /// The delete committed; whether the key existed.
    Deleted(bool),
}

/// One write of a batch, under its claim.
#[derive(Debug, Clone)]
pub struct Write {
    /// The claim the write presents.
    pub claim: ClaimRef,
    /// Collection.
    pub collection: String,
    /// Key in the collection.
    pub key: String,
    /// What to do.
    pub op: WriteOp,
}

impl Write {
    /// The refusal of this write for a stale fence.
    pub fn fence_lost(&self) -> DataError {
        DataError::FenceLost {
            plugin: self.claim.plugin.clone(),
            key: self.claim.key.clone(),
            fence: self.claim.fence,
        }
    }
}

/// A claim to mark done, with the result its handler returned.
#[derive(Debug, Clone)]
pub struct Confirm {
    /// The claim, confirmed only if its fence is current.
    pub claim: ClaimRef,
    /// Stored with the claim; duplicates are answered with it.
    pub result: Option<Vec<u8>>,
}

/// The answers to a batch of writes and confirms: one per write, and one
/// per confirm (`false` where the fence is stale) or the error that failed
/// them all.
pub type WrittenAndConfirmed = (Vec<Result<Written, DataError>>, Result<Vec<bool>, ClaimError>);

/// A write handed to the store, committing now or later; [`Queued::wait`]
/// answers once it has committed or failed.
pub struct Queued(QueuedState);

enum QueuedState {
    Done(Result<Written, DataError>),
    Waiting(tokio::sync::oneshot::Receiver<Result<Written, DataError>>),
}

impl Queued {
    /// A write that has already committed or failed.
    pub fn done(result: Result<Written, DataError>) -> Self {
        Queued(QueuedState::Done(result))
    }

    /// A write whose result will be sent on `rx`.
    pub fn waiting(rx: tokio::sync::oneshot::Receiver<Result<Written, DataError>>) -> Self {
        Queued(QueuedState::Waiting(rx))
    }

    /// Wait until the write has committed or failed.
    pub async fn wait(mut self) -> Result<Written, DataError> {
        self.answered().await;
        self.answer()
    }

    /// The answer of a write [`Queued::answered`] has waited for; one not
    /// waited for that is still pending reads as not committed.
    pub fn answer(self) -> Result<Written, DataError> {
        match self.0 {
            QueuedState::Done(r) => r,
            QueuedState::Waiting(_) => Err(DataError::Unavailable("a queued write was read before it answered".into())),
        }
    }

    /// Wait until the write has committed or failed, keeping the answer for
    /// [`Queued::wait`]. Cancel-safe: dropped before the answer, the write
    /// is still waiting, as it was.
    pub async fn answered(&mut self) {
        if let QueuedState::Waiting(rx) = &mut self.0 {
            let r = rx
                .await
                .unwrap_or_else(|_| Err(DataError::Unavailable("the group-commit task stopped".into())));
            self.0 = QueuedState::Done(r);
        }
    }
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
    /// Hand a guarded write to the store to commit; the answer comes when
    /// it has. Stores that commit concurrent writes together
    /// ([`batch::GroupCommit`]) return at once; the default commits it
    /// before returning.
    async fn queue(&self, write: Write) -> Queued {
        Queued::done(self.write_one(&write).await)
    }
    /// One guarded write, on its own.
    async fn write_one(&self, w: &Write) -> Result<Written, DataError> {
        let claim = Some(&w.claim);
        match &w.op {
            WriteOp::Upsert(v) => self.upsert(claim, &w.collection, &w.key, v).await.map(|()| Written::Upserted),
            WriteOp::InsertUnique(v) => self.insert_unique(claim, &w.collection, &w.key, v).await.map(Written::Inserted),
            WriteOp::Delete => self.delete(claim, &w.collection, &w.key).await.map(Written::Deleted),
        }
    }
    /// Many writes, each under its own claim, with one result per item in
    /// order (a stale fence fails only its own item). Stores that can
    /// commit a batch in one transaction override this; the default writes
    /// one at a time.
    async fn write_many(&self, items: &[Write]) -> Vec<Result<Written, DataError>> {
        write_each(self, items).await
    }
    /// Whether the claims live in this store's database, so that
    /// [`DataStore::confirm`] can commit confirms in the transactions of its
    /// writes (one commit fewer per batch than confirming them in the claim
    /// store on their own).
    fn confirms_claims(&self) -> bool {
        false
    }
    /// Confirm claims, as [`crate::claim::ClaimStore::confirm_with_results`]
    /// does (`false` where the fence is stale), where
    /// [`DataStore::confirms_claims`]; stores whose writes are
    /// group-committed commit them with the next batch. Only call it for
    /// executions whose writes have all been answered: the confirm may
    /// commit in a later batch than they did, never in an earlier one.
    async fn confirm(&self, confirms: Vec<Confirm>, now: i64) -> Result<Vec<bool>, ClaimError> {
        let _ = (confirms, now);
        Err(ClaimError::Unavailable(
            "this data store does not hold the claims; confirm them in the claim store".into(),
        ))
    }
    /// [`DataStore::write_many`] and [`DataStore::confirm`] in one
    /// transaction where the store can; the default does one, then the
    /// other.
    async fn write_and_confirm(&self, items: &[Write], confirms: Vec<Confirm>, now: i64) -> WrittenAndConfirmed {
        let written = self.write_many(items).await;
        (written, self.confirm(confirms, now).await)
    }
    /// Every key and value of a collection (for inspection and tests).
    async fn scan(&self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, DataError>;
}

/// Write `items` one at a time, each in its own transaction, so each error
/// lands on its own item: the default [`DataStore::write_many`], and what
/// a batch falls back to when its transaction failed as a whole.
pub async fn write_each<S: DataStore + ?Sized>(store: &S, items: &[Write]) -> Vec<Result<Written, DataError>> {
    let mut out = Vec::with_capacity(items.len());
    for w in items {
        out.push(store.write_one(w).await);
    }
    out
}

/// A batch's answers, or, when its transaction failed as a whole (one bad
/// item, a deadlock abort), the batch written one item at a time so each
/// error lands on its own item only.
pub async fn or_each<S: DataStore + ?Sized>(
    store: &S,
    items: &[Write],
    batch: Result<Vec<Result<Written, DataError>>, sqlx::Error>,
) -> Vec<Result<Written, DataError>> {
    match batch {
        Ok(results) => results,
        Err(e) => {
            tracing::debug!(error = %e, items = items.len(), "group commit failed; writing the batch item by item");
            write_each(store, items).await
        }
    }
}
