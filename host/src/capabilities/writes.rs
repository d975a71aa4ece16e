//! Write-behind: a guarded `upsert` returns to the handler as soon as it is
//! queued for the group commit (`store::batch`), and commits while the
//! handler goes on and after it returns.
//!
//! What keeps the guarantees:
//! - an execution's queued writes are kept here, and settling waits for all
//!   of them ([`Writes::settle`]) before it confirms, releases or
//!   dead-letters anything: nothing is confirmed or acked before its
//!   effects are durable;
//! - a `get`, `insert-unique`, `delete` or another `upsert` of a key this
//!   execution has a queued write for waits for that write first, so a
//!   handler reads its own writes and its writes to one key land in order;
//! - a queued write that is refused for a stale fence makes the execution
//!   a fenced-out one (its delivery is handed back, nothing settled); one
//!   that fails for an outage makes it a transient failure (retried). The
//!   handler learns of either at its next store call on that key (the
//!   instance is stopped there) or not at all, never as an error it could
//!   swallow.

use std::sync::Mutex;

use crate::runtime::Outcome;
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

    /// The outcome of an execution once its queued writes have committed:
    /// unchanged if they all did; fenced out if one was refused for a stale
    /// fence; a transient failure if a successful execution's write failed
    /// otherwise.
    pub async fn settle(&self, outcome: Outcome) -> Outcome {
        match (self.wait_all().await, outcome) {
            (Ok(()), outcome) => outcome,
            (Err(_), Outcome::Crashed) => Outcome::Crashed,
            (Err(DataError::FenceLost { .. }), _) => Outcome::FenceLost,
            (Err(DataError::Unavailable(m)), Outcome::Done(_)) => {
                Outcome::Transient(format!("a store write failed after the handler returned: {m}"))
            }
            (Err(DataError::Unavailable(_)), outcome) => outcome,
        }
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
    use crate::store::{Inserted, Written};

    fn refused() -> DataError {
        DataError::FenceLost {
            plugin: "p".into(),
            key: "k".into(),
            fence: 1,
        }
    }

    #[tokio::test]
    async fn waiting_for_a_key_takes_only_that_keys_writes() {
        let w = Writes::default();
        w.push("c", "a", Queued::done(Ok(Written::Upserted)));
        w.push("c", "b", Queued::done(Err(refused())));
        w.push("d", "a", Queued::done(Ok(Written::Upserted)));
        assert!(w.wait_for("c", "a").await.is_ok());
        assert_eq!(w.len(), 2);
        assert!(matches!(w.wait_for("c", "b").await, Err(DataError::FenceLost { .. })));
        assert_eq!(w.len(), 1);
        assert!(w.wait_all().await.is_ok());
        assert!(w.is_empty());
    }

    #[tokio::test]
    async fn a_write_that_commits_later_is_waited_for() {
        let w = Writes::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        w.push("c", "a", Queued::waiting(rx));
        let settle = tokio::spawn(async move { w.settle(Outcome::Done(None)).await });
        tokio::task::yield_now().await;
        assert!(!settle.is_finished(), "settling must wait for the queued write");
        tx.send(Ok(Written::Inserted(Inserted::Inserted))).unwrap();
        assert_eq!(settle.await.unwrap(), Outcome::Done(None));
    }

    #[tokio::test]
    async fn a_refused_write_fences_the_execution_out_and_an_outage_retries_it() {
        let settle = |results: Vec<Result<Written, DataError>>, outcome: Outcome| async move {
            let w = Writes::default();
            for r in results {
                w.push("c", "k", Queued::done(r));
            }
            w.settle(outcome).await
        };
        let down = || DataError::Unavailable("connection refused".into());
        assert_eq!(
            settle(vec![Ok(Written::Upserted), Err(refused())], Outcome::Done(None)).await,
            Outcome::FenceLost
        );
        assert_eq!(
            settle(vec![Err(down()), Err(refused())], Outcome::Permanent("no".into())).await,
            Outcome::FenceLost,
            "a stale fence outranks an outage: someone else owns the message"
        );
        let retried = settle(vec![Err(down())], Outcome::Done(None)).await;
        assert!(
            matches!(&retried, Outcome::Transient(m) if m.contains("after the handler returned") && m.contains("connection refused")),
            "{retried:?}"
        );
        assert_eq!(
            settle(vec![Err(down())], Outcome::Permanent("bad".into())).await,
            Outcome::Permanent("bad".into())
        );
        assert_eq!(settle(vec![Err(refused())], Outcome::Crashed).await, Outcome::Crashed);
    }
}
