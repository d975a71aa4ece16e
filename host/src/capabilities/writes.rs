//! Write-behind: a guarded `upsert` returns to the handler as soon as it is
//! queued for the group commit (`store::batch`), and commits while the
//! handler goes on and after it returns.
//!
//! What keeps the guarantees:
//! - an execution's queued writes are kept here, and settling waits for all
//!   of them ([`Writes::wait_all`]) before it confirms, releases or
//!   dead-letters anything: nothing is confirmed or acked before its
//!   effects are durable;
//! - a `get`, `insert-unique`, `delete` or another `upsert` of a key this
//!   execution has a queued write for waits for that write first, so a
//!   handler reads its own writes and its writes to one key land in order;
//! - a queued write that is refused for a stale fence makes the execution
//!   a fenced-out one (its delivery is handed back, nothing settled); one
//!   that fails for an outage makes it a transient failure (retried; see
//!   `runtime::Outcome::after_writes`). The
//!   handler learns of either at its next store call on that key (the
//!   instance is stopped there) or not at all, never as an error it could
//!   swallow.

use std::sync::Mutex;

use crate::store::{DataError, Queued};

struct Pending {
    collection: String,
    key: String,
    queued: Queued,
}

/// One execution's writes that are queued and not yet known to have
/// committed.
#[derive(Default)]
pub struct Writes {
    pending: Mutex<Vec<Pending>>,
}

impl std::fmt::Debug for Writes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writes").field("pending", &self.len()).finish()
    }
}

impl Writes {
    /// Keep a queued write of `collection`/`key`.
    pub fn push(&self, collection: &str, key: &str, queued: Queued) {
        self.lock().push(Pending {
            collection: collection.to_string(),
            key: key.to_string(),
            queued,
        });
    }

    /// Writes queued and not yet waited for.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for the queued writes of one key.
    pub async fn wait_for(&self, collection: &str, key: &str) -> Result<(), DataError> {
        let mine = {
            let mut pending = self.lock();
            let (mine, rest) = std::mem::take(&mut *pending)
                .into_iter()
                .partition(|p| p.collection == collection && p.key == key);
            *pending = rest;
            mine
        };
        wait(mine).await
    }

    /// Wait for every queued write.
    pub async fn wait_all(&self) -> Result<(), DataError> {
        let all = std::mem::take(&mut *self.lock());
        wait(all).await
    }
}

/// Wait for every write in `pending`; a stale fence outranks an outage.
async fn wait(pending: Vec<Pending>) -> Result<(), DataError> {
    let mut first_error = None;
    for p in pending {
        match p.queued.wait().await {
            Ok(_) => {}
            Err(e @ DataError::FenceLost { .. }) => first_error = Some(e),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Written;

    #[tokio::test]
    async fn waiting_for_a_key_takes_only_that_keys_writes() {
        let w = Writes::default();
        w.push("c", "a", Queued::done(Ok(Written::Upserted)));
        w.push("c", "b", Queued::done(Err(DataError::stale())));
        w.push("d", "a", Queued::done(Ok(Written::Upserted)));
        assert!(w.wait_for("c", "a").await.is_ok());
        assert_eq!(w.len(), 2);
        assert!(matches!(w.wait_for("c", "b").await, Err(DataError::FenceLost { .. })));
        assert_eq!(w.len(), 1);
        assert!(w.wait_all().await.is_ok());
        assert!(w.is_empty());
    }
}
