//! Group commit: the writes of concurrently running handlers share one
//! transaction.
//!
//! A handler's guarded `upsert`, `insert-unique` or `delete` goes into a
//! queue. One task takes everything queued (up to [`MAX_BATCH`]) as a
//! batch and hands it to the store's [`DataStore::write_many`], with at
//! most [`IN_FLIGHT`] batches committing at once. Under light load a batch
//! is a single write and waits for nothing; under load the writes that
//! arrive while earlier batches commit form the next one, so the store
//! pays one commit per batch instead of one per write. Each caller gets its
//! own result: fences are still checked per item. Where the claims live in
//! the same database ([`DataStore::confirms_claims`]), the confirms of
//! executions whose writes were answered join the next batch, so a batch's
//! writes and the previous batch's confirms share one commit. [`DataStore::queue`]
//! returns as soon as the write is queued, which is what lets an upsert
//! return to the handler before it commits (write-behind, see
//! `capabilities::writes`). Reads and unguarded writes go straight to the
//! store.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};

use super::{Confirm, DataError, DataStore, Inserted, Queued, Write, WriteOp, Written};
use crate::claim::{ClaimError, ClaimRef};

/// Most writes in one batch.
pub const MAX_BATCH: usize = 256;

/// Batches committing at once. Measured with `idem bench` scenario b at
/// concurrency 8: 1, 2, 4 and 8 gave about 4.0k, 4.2k, 3.9k and 3.1k
/// messages/s (more batches in flight means smaller batches, more commits).
pub const IN_FLIGHT: usize = 2;

struct Pending {
    write: Write,
    /// Its place in the order writes were queued in.
    seq: u64,
    reply: oneshot::Sender<Result<Written, DataError>>,
}

/// Confirms waiting for the next batch.
struct Confirming {
    confirms: Vec<Confirm>,
    /// The claim store's time of the confirm.
    now: i64,
    reply: oneshot::Sender<Result<Vec<bool>, ClaimError>>,
}

/// What the batching task is handed.
enum Item {
    Write(Pending),
    Confirm(Confirming),
}

/// The keys with writes queued or committing. A key's writes commit in
/// the order they were queued: a write of a key that a batch in flight is
/// committing waits for the next batch. A `get` of a key waits for the
/// writes of it queued before the `get` (not those queued after, so a
/// busy key cannot starve a reader), so what one execution wrote (and was
/// told was queued) is what the next one reads, as when every write
/// committed before its handler went on.
#[derive(Default)]
struct Keys {
    state: Mutex<KeysState>,
    changed: Notify,
}

#[derive(Default)]
struct KeysState {
    next: u64,
    keys: HashMap<Key, KeyState>,
}

#[derive(Default)]
struct KeyState {
    /// Sequence numbers of its writes not yet answered.
    pending: BTreeSet<u64>,
    /// Of those, how many a batch in flight is committing.
    committing: usize,
}

type Key = (String, String);

fn key_of(w: &Write) -> Key {
    (w.collection.clone(), w.key.clone())
}

impl Keys {
    fn lock(&self) -> std::sync::MutexGuard<'_, KeysState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A write of `w`'s key is queued: its sequence number.
    fn queued(&self, w: &Write) -> u64 {
        let mut state = self.lock();
        let seq = state.next;
        state.next += 1;
        state.keys.entry(key_of(w)).or_default().pending.insert(seq);
        seq
    }

    /// Take from `waiting`, in order, up to `max` writes whose key no batch
    /// in flight is committing; they are committing from now on. A key's
    /// writes in one batch are all of one kind: a store runs each kind as
    /// one statement (Postgres: upserts, then insert-uniques, then
    /// deletes), so a delete and an upsert of one key in one batch could
    /// commit out of the order they were queued in; the later one waits for
    /// the next batch.
    fn take_ready(&self, waiting: &mut VecDeque<Pending>, max: usize) -> Vec<Pending> {
        let mut state = self.lock();
        let mut batch = Vec::new();
        let mut held = VecDeque::new();
        let mut blocked: HashSet<Key> = HashSet::new();
        let mut kinds: HashMap<Key, std::mem::Discriminant<WriteOp>> = HashMap::new();
        while let Some(p) = waiting.pop_front() {
            let key = key_of(&p.write);
            let kind = std::mem::discriminant(&p.write.op);
            let busy = state.keys.get(&key).is_some_and(|k| k.committing > 0);
            let other_kind = kinds.get(&key).is_some_and(|k| *k != kind);
            if batch.len() >= max || busy || other_kind || blocked.contains(&key) {
                blocked.insert(key);
                held.push_back(p);
            } else {
                kinds.insert(key, kind);
                batch.push(p);
            }
        }
        for p in &batch {
            state.keys.entry(key_of(&p.write)).or_default().committing += 1;
        }
        *waiting = held;
        batch
    }

    /// These writes are answered.
    fn done(&self, items: &[(Key, u64)]) {
        let mut state = self.lock();
        for (key, seq) in items {
            if let Some(k) = state.keys.get_mut(key) {
                k.pending.remove(seq);
                k.committing = k.committing.saturating_sub(1);
                if k.pending.is_empty() {
                    state.keys.remove(key);
                }
            }
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Wait until every write of the key queued before now is answered.
    async fn settled(&self, collection: &str, key: &str) {
        let key = (collection.to_string(), key.to_string());
        let before = self.lock().next;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let waiting = self
                .lock()
                .keys
                .get(&key)
                .and_then(|k| k.pending.first().copied())
                .is_some_and(|oldest| oldest < before);
            if !waiting {
                return;
            }
            changed.await;
        }
    }
}

/// Marks a batch's writes answered when dropped, so a batch whose store
/// call panicked does not leave its keys held for ever.
struct Answered {
    keys: Arc<Keys>,
    items: Vec<(Key, u64)>,
}

impl Drop for Answered {
    fn drop(&mut self) {
        self.keys.done(&self.items);
    }
}

/// A data store whose guarded writes are group-committed.
pub struct GroupCommit {
    inner: Arc<dyn DataStore>,
    queue: mpsc::UnboundedSender<Item>,
    keys: Arc<Keys>,
}

impl GroupCommit {
    /// Wrap `inner`; the batching task runs on the current tokio runtime
    /// until the wrapper is dropped.
    pub fn new(inner: Arc<dyn DataStore>) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let keys = Arc::new(Keys::default());
        tokio::spawn(gather(inner.clone(), keys.clone(), rx));
        GroupCommit { inner, queue, keys }
    }

    /// Queue a guarded write and wait for it.
    async fn guarded(&self, claim: &ClaimRef, collection: &str, key: &str, op: WriteOp) -> Result<Written, DataError> {
        let write = Write {
            claim: claim.clone(),
            collection: collection.to_string(),
            key: key.to_string(),
            op,
        };
        self.queue(write).await.wait().await
    }
}

async fn gather(store: Arc<dyn DataStore>, keys: Arc<Keys>, mut rx: mpsc::UnboundedReceiver<Item>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut waiting: VecDeque<Pending> = VecDeque::new();
    let mut confirming: Vec<Confirming> = Vec::new();
    let mut incoming = Vec::with_capacity(MAX_BATCH);
    let mut open = true;
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (batch, confirms) = loop {
            let changed = keys.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if waiting.is_empty() && confirming.is_empty() {
                if !open || rx.recv_many(&mut incoming, MAX_BATCH).await == 0 {
                    return;
                }
            } else if open {
                while incoming.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(p) => incoming.push(p),
                        Err(_) => break,
                    }
                }
            }
            for item in incoming.drain(..) {
                match item {
                    Item::Write(p) => waiting.push_back(p),
                    Item::Confirm(c) => confirming.push(c),
                }
            }
            let batch = keys.take_ready(&mut waiting, MAX_BATCH);
            if !batch.is_empty() || !confirming.is_empty() {
                break (batch, std::mem::take(&mut confirming));
            }
            // Everything waiting writes keys a batch in flight commits:
            // wait for it to finish, or for more to arrive.
            tokio::select! {
                _ = changed => {}
                n = rx.recv_many(&mut incoming, MAX_BATCH), if open => open = n > 0,
            }
        };
        let store = store.clone();
        let keys = keys.clone();
        tokio::spawn(async move {
            let answered = Answered {
                keys,
                items: batch.iter().map(|p| (key_of(&p.write), p.seq)).collect(),
            };
            let (items, replies): (Vec<Write>, Vec<_>) = batch.into_iter().map(|p| (p.write, p.reply)).unzip();
            let (results, confirmed) = if confirms.is_empty() {
                (store.write_many(&items).await, None)
            } else {
                let now = confirms.iter().map(|c| c.now).max().unwrap_or_default();
                let all = confirms.iter().flat_map(|c| c.confirms.iter().cloned()).collect();
                let (results, confirmed) = store.write_and_confirm(&items, all, now).await;
                (results, Some(confirmed))
            };
            // Answered before the replies: a caller that waits for its
            // write and then reads the key must not wait for itself.
            drop(answered);
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
            if let Some(confirmed) = confirmed {
                answer_confirms(confirms, confirmed);
            }
            drop(slot);
        });
    }
}

/// Answer each batch of confirms with its own part of `confirmed`.
fn answer_confirms(confirms: Vec<Confirming>, confirmed: Result<Vec<bool>, ClaimError>) {
    let mut answers = confirmed.as_ref().map(|all| all.iter().copied());
    for c in confirms {
        let answer = match &mut answers {
            Ok(all) => {
                let mine: Vec<bool> = all.by_ref().take(c.confirms.len()).collect();
                if mine.len() == c.confirms.len() {
                    Ok(mine)
                } else {
                    Err(ClaimError::Unavailable(
                        "the store answered fewer confirms than it was given".into(),
                    ))
                }
            }
            Err(e) => Err(e.clone()),
        };
        let _ = c.reply.send(answer);
    }
}

/// The answer a write of `op` expects, or the store's own error.
fn expect<T>(written: Result<Written, DataError>, pick: fn(Written) -> Option<T>) -> Result<T, DataError> {
    written.and_then(|w| pick(w).ok_or_else(|| DataError::Unavailable("the store answered a write with another kind's result".into())))
}

#[async_trait]
impl DataStore for GroupCommit {
    async fn insert_unique(&self, claim: Option<&ClaimRef>, collection: &str, key: &str, value: &[u8]) -> Result<Inserted, DataError> {
        let Some(claim) = claim else {
            return self.inner.insert_unique(None, collection, key, value).await;
        };
        let w = self.guarded(claim, collection, key, WriteOp::InsertUnique(value.to_vec())).await;
        expect(w, |w| match w {
            Written::Inserted(i) => Some(i),
            _ => None,
        })
    }

    async fn upsert(&self, claim: Option<&ClaimRef>, collection: &str, key: &str, value: &[u8]) -> Result<(), DataError> {
        let Some(claim) = claim else {
            return self.inner.upsert(None, collection, key, value).await;
        };
        let w = self.guarded(claim, collection, key, WriteOp::Upsert(value.to_vec())).await;
        expect(w, |w| matches!(w, Written::Upserted).then_some(()))
    }

    async fn get(&self, collection: &str, key: &str) -> Result<Option<Vec<u8>>, DataError> {
        self.keys.settled(collection, key).await;
        self.inner.get(collection, key).await
    }

    async fn delete(&self, claim: Option<&ClaimRef>, collection: &str, key: &str) -> Result<bool, DataError> {
        let Some(claim) = claim else {
            return self.inner.delete(None, collection, key).await;
        };
        let w = self.guarded(claim, collection, key, WriteOp::Delete).await;
        expect(w, |w| match w {
            Written::Deleted(existed) => Some(existed),
            _ => None,
        })
    }

    async fn advance_fence(&self, claim: &ClaimRef) -> Result<(), DataError> {
        self.inner.advance_fence(claim).await
    }

    async fn forget_fences(&self, claims: &[(String, String)]) -> Result<(), DataError> {
        self.inner.forget_fences(claims).await
    }

    fn confirms_claims(&self) -> bool {
        self.inner.confirms_claims()
    }

    async fn confirm(&self, confirms: Vec<Confirm>, now: i64) -> Result<Vec<bool>, ClaimError> {
        if confirms.is_empty() || !self.confirms_claims() {
            return self.inner.confirm(confirms, now).await;
        }
        let (reply, answer) = oneshot::channel();
        match self.queue.send(Item::Confirm(Confirming { confirms, now, reply })) {
            Ok(()) => answer
                .await
                .unwrap_or_else(|_| Err(ClaimError::Unavailable("the group-commit task stopped".into()))),
            // The batching task is gone (the runtime is shutting down):
            // confirm directly.
            Err(unsent) => match unsent.0 {
                Item::Confirm(c) => self.inner.confirm(c.confirms, now).await,
                Item::Write(_) => unreachable!("a confirm was sent"),
            },
        }
    }

    async fn queue(&self, write: Write) -> Queued {
        let (reply, answer) = oneshot::channel();
        let seq = self.keys.queued(&write);
        match self.queue.send(Item::Write(Pending { write, seq, reply })) {
            Ok(()) => Queued::waiting(answer),
            // The batching task is gone (the runtime is shutting down):
            // write it directly.
            Err(unsent) => {
                let Item::Write(unsent) = unsent.0 else {
                    unreachable!("a write was sent")
                };
                let write = unsent.write;
                let result = self.inner.write_one(&write).await;
                self.keys.done(&[(key_of(&write), seq)]);
                Queued::done(result)
            }
        }
    }

    async fn write_many(&self, items: &[Write]) -> Vec<Result<Written, DataError>> {
        self.inner.write_many(items).await
    }

    async fn scan(&self, collection: &str) -> Result<Vec<(String, Vec<u8>)>, DataError> {
        self.inner.scan(collection).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(keys: &Keys, key: &str, op: WriteOp) -> Pending {
        let write = Write {
            claim: ClaimRef {
                plugin: "p".into(),
                key: key.into(),
                fence: 1,
            },
            collection: "c".into(),
            key: key.into(),
            op,
        };
        let seq = keys.queued(&write);
        Pending {
            write,
            seq,
            reply: oneshot::channel().0,
        }
    }

    fn taken(batch: &[Pending]) -> Vec<(&str, u64)> {
        batch.iter().map(|p| (p.write.key.as_str(), p.seq)).collect()
    }

    /// Writes of one key of different kinds go in different batches, in
    /// the order they were queued; writes of one kind share one.
    #[test]
    fn a_batch_holds_one_kind_of_write_per_key() {
        let keys = Keys::default();
        let mut waiting: VecDeque<Pending> = VecDeque::from([
            pending(&keys, "k", WriteOp::Delete),
            pending(&keys, "k", WriteOp::Upsert(b"v".to_vec())),
            pending(&keys, "j", WriteOp::Upsert(b"1".to_vec())),
            pending(&keys, "j", WriteOp::Upsert(b"2".to_vec())),
            pending(&keys, "k", WriteOp::Delete),
        ]);
        let first = keys.take_ready(&mut waiting, MAX_BATCH);
        assert_eq!(taken(&first), [("k", 0), ("j", 2), ("j", 3)]);
        // The rest of k waits behind its upsert, in order.
        assert_eq!(taken(waiting.make_contiguous()), [("k", 1), ("k", 4)]);
        let done: Vec<(Key, u64)> = first.iter().map(|p| (key_of(&p.write), p.seq)).collect();
        keys.done(&done);
        assert_eq!(taken(&keys.take_ready(&mut waiting, MAX_BATCH)), [("k", 1)]);
    }
}
