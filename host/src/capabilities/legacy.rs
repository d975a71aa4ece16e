//! The imports of `idem:handler@0.1.0`, for components built against the
//! first version of the world. Its interfaces are the current ones under an
//! older version, type for type, so each call converts its arguments and
//! answer and goes through the current implementation: grants, limits,
//! fences and the journal behave the same for both.

use super::ExecutionCaps;
use crate::bindings::idem::handler as current;
use crate::bindings::v0_1::idem::handler as old;

impl old::types::Host for ExecutionCaps {}

fn store_error(e: current::store::StoreError) -> old::store::StoreError {
    use current::store::StoreError as E;
    match e {
        E::AccessDenied(m) => old::store::StoreError::AccessDenied(m),
        E::TooLarge(m) => old::store::StoreError::TooLarge(m),
        E::Unavailable(m) => old::store::StoreError::Unavailable(m),
    }
}

impl old::store::Host for ExecutionCaps {
    async fn insert_unique(
        &mut self,
        collection: String,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<old::store::Inserted, old::store::StoreError>> {
        let r = current::store::Host::insert_unique(self, collection, key, value).await?;
        Ok(r.map(|i| match i {
            current::store::Inserted::Inserted => old::store::Inserted::Inserted,
            current::store::Inserted::Existed(v) => old::store::Inserted::Existed(v),
        })
        .map_err(store_error))
    }

    async fn upsert(&mut self, collection: String, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), old::store::StoreError>> {
        Ok(current::store::Host::upsert(self, collection, key, value)
            .await?
            .map_err(store_error))
    }

    async fn get(&mut self, collection: String, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, old::store::StoreError>> {
        Ok(current::store::Host::get(self, collection, key).await?.map_err(store_error))
    }

    async fn delete(&mut self, collection: String, key: String) -> wasmtime::Result<Result<bool, old::store::StoreError>> {
        Ok(current::store::Host::delete(self, collection, key).await?.map_err(store_error))
    }
}

impl old::effects::Host for ExecutionCaps {
    async fn call(
        &mut self,
        endpoint: String,
        step: String,
        request: Vec<u8>,
    ) -> wasmtime::Result<Result<Vec<u8>, old::effects::CallError>> {
        use current::effects::CallError as E;
        Ok(current::effects::Host::call(self, endpoint, step, request)
            .await?
            .map_err(|e| match e {
                E::AccessDenied(m) => old::effects::CallError::AccessDenied(m),
                E::Transient(m) => old::effects::CallError::Transient(m),
                E::Permanent(m) => old::effects::CallError::Permanent(m),
            }))
    }
}

impl old::log::Host for ExecutionCaps {
    async fn log(&mut self, level: old::log::Level, message: String) -> wasmtime::Result<()> {
        use old::log::Level as L;
        let level = match level {
            L::Trace => current::log::Level::Trace,
            L::Debug => current::log::Level::Debug,
            L::Info => current::log::Level::Info,
            L::Warn => current::log::Level::Warn,
            L::Error => current::log::Level::Error,
        };
        current::log::Host::log(self, level, message).await
    }
}
