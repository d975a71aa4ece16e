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

/// Most writes one execution may have queued: past it, the next write
/// waits for those queued first. With [`MAX_QUEUED_BYTES`] this bounds
/// what a handler that writes in a loop holds in the host's memory (and
/// what each store call scans here), whatever it writes.
pub const MAX_QUEUED_WRITES: usize = 64;

/// Most bytes of values one execution may have queued (a single larger
/// value, within `limits.max_value_bytes`, is queued alone).
pub const MAX_QUEUED_BYTES: usize = 1 << 20;

struct Pending {
    collection: String,
    key: String,
    bytes: usize,
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
    /// Keep a queued write of `collection`/`key` carrying `bytes` of value.
    pub fn push(&self, collection: &str, key: &str, bytes: usize, queued: Queued) {
        self.lock().push(Pending {
            collection: collection.to_string(),
            key: key.to_string(),
            bytes,
            queued,
        });
    }

    /// Whether a write of `bytes` more must first wait for those queued
    /// (see [`MAX_QUEUED_WRITES`]).
    pub fn full_for(&self, bytes: usize) -> bool {
        let pending = self.lock();
        let queued: usize = pending.iter().map(|p| p.bytes).sum();
        !pending.is_empty() && (pending.len() >= MAX_QUEUED_WRITES || queued.saturating_add(bytes) > MAX_QUEUED_BYTES)
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
        self.wait(mine).await
    }

    /// Wait for every queued write.
    pub async fn wait_all(&self) -> Result<(), DataError> {
        let all = std::mem::take(&mut *self.lock());
        self.wait(all).await
    }

    /// Wait for every write in `taken` (taken out of this execution's);
    /// a stale fence outranks an outage. Cancelled (the execution's
    /// timeout ends a store call that waits here), the writes go back, so
    /// settling still waits for them.
    async fn wait(&self, taken: Vec<Pending>) -> Result<(), DataError> {
        let mut back = PutBack { writes: self, taken };
        for p in &mut back.taken {
            p.queued.answered().await;
        }
        answer(std::mem::take(&mut back.taken))
    }
}

/// Writes taken out of a [`Writes`] to be waited for, put back if the wait
/// is dropped before they all answered.
struct PutBack<'a> {
    writes: &'a Writes,
    taken: Vec<Pending>,
}

impl Drop for PutBack<'_> {
    fn drop(&mut self) {
        if !self.taken.is_empty() {
            self.writes.lock().append(&mut self.taken);
        }
    }
}

/// The answer of writes that have all answered; a stale fence outranks an
/// outage.
fn answer(pending: Vec<Pending>) -> Result<(), DataError> {
    let mut first_error = None;
    for p in pending {
        match p.queued.answer() {
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
        w.push("c", "a", 1, Queued::done(Ok(Written::Upserted)));
        w.push("c", "b", 1, Queued::done(Err(DataError::stale())));
        w.push("d", "a", 1, Queued::done(Ok(Written::Upserted)));
        assert!(w.wait_for("c", "a").await.is_ok());
        assert_eq!(w.len(), 2);
        assert!(matches!(w.wait_for("c", "b").await, Err(DataError::FenceLost { .. })));
        assert_eq!(w.len(), 1);
        assert!(w.wait_all().await.is_ok());
        assert!(w.is_empty());
    }

    /// A wait cut short (the execution's timeout during a store call) puts
    /// the writes it took back: settling still waits for them. Before, they
    /// were dropped, and `wait_all` answered at once.
    #[tokio::test]
    async fn a_cancelled_wait_leaves_its_writes_for_settling() {
        let w = Writes::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        w.push("c", "a", 1, Queued::done(Ok(Written::Upserted)));
        w.push("c", "a", 1, Queued::waiting(rx));
        let cut = tokio::time::timeout(std::time::Duration::from_millis(10), w.wait_for("c", "a")).await;
        assert!(cut.is_err(), "the second write has not answered");
        assert_eq!(w.len(), 2);
        let all = w.wait_all();
        tokio::pin!(all);
        assert!(futures::poll!(all.as_mut()).is_pending(), "settling waits for the write");
        tx.send(Err(DataError::stale())).unwrap();
        assert!(matches!(all.await, Err(DataError::FenceLost { .. })));
        assert!(w.is_empty());
    }

    #[test]
    fn an_execution_holds_a_bounded_number_and_size_of_queued_writes() {
        let w = Writes::default();
        assert!(!w.full_for(MAX_QUEUED_BYTES * 4), "a first write is queued whatever its size");
        for i in 0..MAX_QUEUED_WRITES - 1 {
            w.push("c", &i.to_string(), 10, Queued::done(Ok(Written::Upserted)));
            assert!(!w.full_for(10), "{} queued", i + 1);
        }
        w.push("c", "last", 10, Queued::done(Ok(Written::Upserted)));
        assert!(w.full_for(0), "{MAX_QUEUED_WRITES} writes queued");

        let w = Writes::default();
        w.push("c", "a", MAX_QUEUED_BYTES / 2, Queued::done(Ok(Written::Upserted)));
        assert!(!w.full_for(MAX_QUEUED_BYTES / 2));
        assert!(w.full_for(MAX_QUEUED_BYTES / 2 + 1));
    }
}
