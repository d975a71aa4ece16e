//! `idem:handler/store`: grant and size checks, then the data store with
//! the execution's fence.

use super::{too_large, unstorable, ExecutionCaps, HostAbort};
use crate::bindings::idem::handler::store::{self as wit_store, StoreError};
use crate::stats::Counters;
use crate::store::{DataError, Inserted, Write, WriteOp};

/// A guest-visible answer, or the reason the host stops the execution.
pub type Checked<T> = Result<Result<T, StoreError>, HostAbort>;

impl ExecutionCaps {
    /// Map a data-store failure: a stale fence stops the execution, an
    /// outage is reported to the handler.
    fn data_error(&mut self, e: DataError) -> Result<StoreError, HostAbort> {
        match e {
            DataError::FenceLost { .. } => {
                Counters::inc(&self.shared.counters.fence_rejections);
                tracing::warn!(plugin = %self.plugin.name, key = %self.exec.key, "store write refused: fence is stale, interrupting the instance");
                Err(self.stop(HostAbort::FenceLost))
            }
            DataError::Unavailable(m) => Ok(StoreError::Unavailable(m)),
        }
    }

    /// Wait for this execution's queued writes of a key before touching
    /// it again; one that failed stops the execution (the handler was told
    /// it had been queued).
    async fn after_queued(&mut self, collection: &str, key: &str) -> Result<(), HostAbort> {
        let waited = self.exec.writes.wait_for(collection, key).await;
        self.queued_failed(waited)
    }

    fn queued_failed(&mut self, waited: Result<(), DataError>) -> Result<(), HostAbort> {
        match waited {
            Ok(()) => Ok(()),
            Err(e @ DataError::FenceLost { .. }) => self.data_error(e).map(|_| ()),
            Err(DataError::Unavailable(m)) => Err(self.stop(HostAbort::WriteFailed(m))),
        }
    }

    /// Wait for all of this execution's queued writes (before an external
    /// call); one that failed stops the execution.
    pub(super) async fn after_all_queued(&mut self) -> Result<(), HostAbort> {
        let waited = self.exec.writes.wait_all().await;
        self.queued_failed(waited)
    }

    /// The checks every store call makes before touching the store: the
    /// grant, then the key (a key no store can hold stops the execution;
    /// one too long is refused to the handler), then the value's size.
    fn check(&mut self, collection: &str, key: &str, value: &[u8]) -> Result<Result<(), StoreError>, HostAbort> {
        if let Some(m) = self.collection_denied(collection) {
            return Ok(Err(StoreError::AccessDenied(m)));
        }
        if let Some(abort) = unstorable(key) {
            return Err(self.stop(abort));
        }
        if let Some(m) = too_large(&self.plugin, key, value) {
            return Ok(Err(StoreError::TooLarge(m)));
        }
        Ok(Ok(()))
    }

    /// `store.insert-unique`, checked.
    pub async fn store_insert_unique(&mut self, collection: &str, key: &str, value: &[u8]) -> Checked<Inserted> {
        if let Err(e) = self.check(collection, key, value)? {
            return Ok(Err(e));
        }
        self.after_queued(collection, key).await?;
        let data = self.shared.data.clone();
        match data.insert_unique(self.exec.claim.as_ref(), collection, key, value).await {
            Ok(inserted) => Ok(Ok(inserted)),
            Err(e) => self.data_error(e).map(Err),
        }
    }

    /// `store.upsert`, checked. Under a claim it is write-behind: queued
    /// for the group commit and answered at once (see [`super::writes`]).
    pub async fn store_upsert(&mut self, collection: &str, key: &str, value: &[u8]) -> Checked<()> {
        if let Err(e) = self.check(collection, key, value)? {
            return Ok(Err(e));
        }
        self.after_queued(collection, key).await?;
        let data = self.shared.data.clone();
        let Some(claim) = self.exec.claim.clone() else {
            return match data.upsert(None, collection, key, value).await {
                Ok(()) => Ok(Ok(())),
                Err(e) => self.data_error(e).map(Err),
            };
        };
        // A handler writing in a loop waits for its queued writes rather
        // than queueing without bound in the host's memory.
        if self.exec.writes.full_for(value.len()) {
            Counters::inc(&self.shared.counters.writes_paced);
            self.after_all_queued().await?;
        }
        let write = Write {
            claim,
            collection: collection.to_string(),
            key: key.to_string(),
            op: WriteOp::Upsert(value.to_vec()),
        };
        let queued = data.queue(write).await;
        self.exec.writes.push(collection, key, value.len(), queued);
        Ok(Ok(()))
    }

    /// `store.get`, checked.
    pub async fn store_get(&mut self, collection: &str, key: &str) -> Checked<Option<Vec<u8>>> {
        if let Err(e) = self.check(collection, key, b"")? {
            return Ok(Err(e));
        }
        self.after_queued(collection, key).await?;
        let data = self.shared.data.clone();
        match data.get(collection, key).await {
            Ok(v) => Ok(Ok(v)),
            Err(e) => self.data_error(e).map(Err),
        }
    }

    /// `store.delete`, checked.
    pub async fn store_delete(&mut self, collection: &str, key: &str) -> Checked<bool> {
        if let Err(e) = self.check(collection, key, b"")? {
            return Ok(Err(e));
        }
        self.after_queued(collection, key).await?;
        let data = self.shared.data.clone();
        match data.delete(self.exec.claim.as_ref(), collection, key).await {
            Ok(existed) => Ok(Ok(existed)),
            Err(e) => self.data_error(e).map(Err),
        }
    }
}

impl wit_store::Host for ExecutionCaps {
    async fn insert_unique(
        &mut self,
        collection: String,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<wit_store::Inserted, StoreError>> {
        self.enter_host()?;
        let r = self.store_insert_unique(&collection, &key, &value).await;
        self.leave_host();
        Ok(r?.map(|i| match i {
            Inserted::Inserted => wit_store::Inserted::Inserted,
            Inserted::Existed(v) => wit_store::Inserted::Existed(v),
        }))
    }

    async fn upsert(&mut self, collection: String, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), StoreError>> {
        self.enter_host()?;
        let r = self.store_upsert(&collection, &key, &value).await;
        self.leave_host();
        Ok(r?)
    }

    async fn get(&mut self, collection: String, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, StoreError>> {
        self.enter_host()?;
        let r = self.store_get(&collection, &key).await;
        self.leave_host();
        Ok(r?)
    }

    async fn delete(&mut self, collection: String, key: String) -> wasmtime::Result<Result<bool, StoreError>> {
        self.enter_host()?;
        let r = self.store_delete(&collection, &key).await;
        self.leave_host();
        Ok(r?)
    }
}
