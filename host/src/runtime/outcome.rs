//! How an execution ended, and what its queued writes make of that.

use crate::capabilities::writes::Writes;
use crate::store::DataError;

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The handler returned `ok`, with the message's result if it gave
    /// one (always `None` from a component of `idem:handler@0.1.0`).
    Done(Option<Vec<u8>>),
    /// The handler returned a transient error.
    Transient(String),
    /// The handler returned a permanent error.
    Permanent(String),
    /// The instance trapped: a panic, a sandbox limit, or a host bug.
    Trapped(String),
    /// The claim was taken over mid-run; nothing may be settled.
    FenceLost,
    /// Fault injection stopped the execution as if the worker had died.
    Crashed,
    /// The host could not run the handler (e.g. no free instance slot), or
    /// panicked while it ran.
    HostError(String),
}

impl Outcome {
    /// The outcome once the execution's queued writes (write-behind) have
    /// committed: unchanged if they all did; fenced out if one was refused
    /// for a stale fence; a transient failure if a write of an execution
    /// that succeeded or failed permanently failed otherwise (not counted
    /// as a trap; a trap or transient failure stays what it was).
    pub async fn after_writes(self, writes: &Writes) -> Outcome {
        match (writes.wait_all().await, self) {
            (Ok(()), outcome) => outcome,
            (Err(_), Outcome::Crashed) => Outcome::Crashed,
            (Err(DataError::FenceLost { .. }), _) => Outcome::FenceLost,
            // The handler was told its write was queued: whatever it
            // decided after that, the write did not land; try again.
            (Err(DataError::Unavailable(m)), Outcome::Done(_) | Outcome::Permanent(_)) => {
                Outcome::Transient(format!("a store write failed after the handler returned: {m}"))
            }
            (Err(DataError::Unavailable(_)), outcome) => outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Inserted, Queued, Written};

    #[tokio::test]
    async fn a_write_that_commits_later_is_waited_for() {
        let w = Writes::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        w.push("c", "a", 1, Queued::waiting(rx));
        let settle = tokio::spawn(async move { Outcome::Done(None).after_writes(&w).await });
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
                w.push("c", "k", 1, Queued::done(r));
            }
            outcome.after_writes(&w).await
        };
        let down = || DataError::Unavailable("connection refused".into());
        assert_eq!(
            settle(vec![Ok(Written::Upserted), Err(DataError::stale())], Outcome::Done(None)).await,
            Outcome::FenceLost
        );
        assert_eq!(
            settle(vec![Err(down()), Err(DataError::stale())], Outcome::Permanent("no".into())).await,
            Outcome::FenceLost,
            "a stale fence outranks an outage: someone else owns the message"
        );
        let retried = settle(vec![Err(down())], Outcome::Done(None)).await;
        assert!(
            matches!(&retried, Outcome::Transient(m) if m.contains("after the handler returned") && m.contains("connection refused")),
            "{retried:?}"
        );
        assert!(
            matches!(
                settle(vec![Err(down())], Outcome::Permanent("bad".into())).await,
                Outcome::Transient(_)
            ),
            "a permanent failure whose write did not land is tried again, not dead-lettered without it"
        );
        assert_eq!(
            settle(vec![Err(down())], Outcome::Trapped("oom".into())).await,
            Outcome::Trapped("oom".into())
        );
        assert_eq!(settle(vec![Err(DataError::stale())], Outcome::Crashed).await, Outcome::Crashed);
    }
}
