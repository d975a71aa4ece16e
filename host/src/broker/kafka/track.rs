//! What this consumer holds of each partition it owns: the offsets read and
//! not yet settled, which of them may run now, and the offset that may be
//! committed.
//!
//! An offset is *open* from the moment it is read until the worker settles
//! it (acks it: done, dead-lettered or a duplicate). A retry does not settle
//! it: the delivery waits here for its delay and runs again, so the
//! committed offset never passes a message whose effects are not durable,
//! and a crash or a rebalance re-reads it in the partition's order (see the
//! module documentation of `kafka` for why retries are not re-published).
//!
//! The offset committed for a partition is its lowest open offset, or the
//! offset after the highest read when none is open: every message below it
//! is settled.
//!
//! Each commit also carries, in the offset's metadata, what Kafka's offset
//! alone cannot say: which offsets above it are settled already, and how
//! many times each open one was handed out (`idem1;s=5-6,9-9;d=4:2`). The
//! next owner of the partition (after a rebalance or a crash) skips the
//! settled ones and counts deliveries on from there, so it re-delivers only
//! unsettled work, and the group's lag counts only unsettled records.
//!
//! Each assignment of a partition to this consumer has its own epoch, part
//! of every receipt with the delivery's number; a receipt of an earlier
//! epoch (the partition was revoked since) or an earlier delivery settles
//! nothing and commits nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::commit::encode;
pub(super) use super::commit::{Commit, Seed};
use crate::config::KafkaOrdering;
use crate::envelope::{header_cost, Delivery, Envelope};

/// A record read from a partition, as the worker will see it.
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub envelope: Envelope,
    /// Why the worker must dead-letter it instead of running it.
    pub refused: Option<String>,
    /// The record's Kafka key: records of one key run in order.
    pub key: Option<Vec<u8>>,
    /// Published with a delay: not to run before this (unix ms).
    pub not_before: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Read, not yet handed to the worker.
    Ready,
    /// At the worker.
    Out,
    /// Given back for a retry: runs again from this time (unix ms).
    Waiting(i64),
}

#[derive(Debug)]
struct Slot {
    record: Record,
    state: State,
    deliveries: u32,
}

impl Record {
    /// What it holds in memory, as the read-ahead counts it: the payload,
    /// the headers (each as [`header_cost`] counts it), the id, the handler
    /// and the key (kept twice: here and in its partition's index by key).
    pub(super) fn bytes(&self) -> usize {
        let e = &self.envelope;
        let headers: usize = e.headers.iter().map(header_cost).sum();
        e.payload.len() + headers + e.id.len() + e.handler.len() + 2 * self.key.as_ref().map_or(0, Vec::len)
    }
}

impl Slot {
    /// What its record holds in memory, as the read-ahead counts it.
    fn bytes(&self) -> usize {
        self.record.bytes()
    }
}

#[derive(Debug, Default)]
struct Part {
    epoch: u64,
    /// From the last commit before this consumer owned the partition.
    seed: Seed,
    open: BTreeMap<i64, Slot>,
    by_key: HashMap<Vec<u8>, BTreeSet<i64>>,
    /// The offset after the highest read.
    read_to: Option<i64>,
    /// The offset and metadata last committed by this consumer.
    committed: Option<(i64, String)>,
    /// Being revoked: nothing more is handed out.
    revoking: bool,
}

impl Part {
    /// Every offset below this is settled.
    fn watermark(&self) -> Option<i64> {
        match (self.open.keys().next().copied(), self.read_to) {
            (Some(open), Some(read)) => Some(open.min(read)),
            (open, read) => open.or(read),
        }
    }

    fn close(&mut self, offset: i64) -> Option<Slot> {
        let slot = self.open.remove(&offset)?;
        if let Some(key) = &slot.record.key {
            if let Some(set) = self.by_key.get_mut(key) {
                set.remove(&offset);
                if set.is_empty() {
                    self.by_key.remove(key);
                }
            }
        }
        Some(slot)
    }

    /// The metadata of a commit at `watermark`: settled ranges above it (of
    /// what was read, and what the seed knew beyond that) and the counts of
    /// open offsets handed out.
    fn metadata(&self, watermark: i64) -> String {
        let mut settled = Vec::new();
        let read = self.read_to.unwrap_or(watermark);
        let mut from = watermark;
        for &o in self.open.keys().filter(|o| **o >= watermark && **o < read) {
            if o > from {
                settled.push((from, o - 1));
            }
            from = o + 1;
        }
        if read > from {
            settled.push((from, read - 1));
        }
        settled.extend(
            self.seed
                .settled
                .iter()
                .filter(|(_, b)| *b >= read)
                .map(|(a, b)| ((*a).max(read), *b)),
        );
        // Open records handed out, and records known from the seed or
        // dropped at a revocation that are not settled.
        let mut counts: BTreeMap<i64, u32> = self
            .seed
            .counts
            .iter()
            .filter(|(o, _)| **o >= watermark)
            .map(|(o, n)| (*o, *n))
            .collect();
        counts.extend(self.open.iter().filter(|(_, s)| s.deliveries > 0).map(|(o, s)| (*o, s.deliveries)));
        encode(&settled, &counts)
    }

    fn commit(&mut self, id: &PartId) -> Option<Commit> {
        let offset = self.watermark()?;
        let metadata = self.metadata(offset);
        let last = (offset, metadata.clone());
        if self.committed.as_ref() == Some(&last) {
            return None;
        }
        self.committed = Some(last);
        Some(Commit {
            topic: id.0.clone(),
            partition: id.1,
            offset,
            metadata,
        })
    }

    /// Whether the slot at `offset` is the next of its order to run.
    fn in_turn(&self, ordering: KafkaOrdering, offset: i64, key: Option<&Vec<u8>>) -> bool {
        match ordering {
            KafkaOrdering::None => true,
            KafkaOrdering::Partition => self.open.keys().next() == Some(&offset),
            KafkaOrdering::Key => match key {
                Some(key) => self.by_key.get(key).and_then(|s| s.first()) == Some(&offset),
                None => true,
            },
        }
    }
}

/// A topic and partition.
pub(super) type PartId = (String, i32);

/// The partitions this consumer owns.
#[derive(Debug)]
pub(super) struct Track {
    ordering: KafkaOrdering,
    parts: BTreeMap<PartId, Part>,
    epochs: u64,
    /// Records read and not at the worker (ready or waiting).
    buffered: usize,
    /// Their payloads' bytes.
    buffered_bytes: usize,
    /// Where the next `take` starts, so every partition gets its turn.
    cursor: usize,
}

/// Why a receipt settles nothing.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stale {
    /// Not a receipt this broker hands out.
    Malformed,
    /// Its partition was revoked (and maybe assigned again) since.
    Revoked,
}

impl Track {
    pub fn new(ordering: KafkaOrdering) -> Track {
        Track {
            ordering,
            parts: BTreeMap::new(),
            epochs: 0,
            buffered: 0,
            buffered_bytes: 0,
            cursor: 0,
        }
    }

    /// Partitions assigned to this consumer (kept if already owned), with
    /// what their last commits say.
    pub fn assign(&mut self, parts: Vec<(PartId, Seed)>) {
        for (id, seed) in parts {
            if !self.parts.contains_key(&id) {
                self.epochs += 1;
                let part = Part {
                    epoch: self.epochs,
                    seed,
                    ..Part::default()
                };
                self.parts.insert(id, part);
            }
        }
    }

    /// A revocation starts: nothing more of these partitions is handed out,
    /// and what was read but is not at the worker is dropped (the next
    /// owner reads it again from the committed offset).
    pub fn revoke_begin(&mut self, parts: &[PartId]) {
        for id in parts {
            if let Some(part) = self.parts.get_mut(id) {
                part.revoking = true;
                let idle: Vec<i64> = part.open.iter().filter(|(_, s)| s.state != State::Out).map(|(o, _)| *o).collect();
                // Nothing from the first dropped offset on may be committed.
                if let (Some(first), Some(read)) = (idle.first(), part.read_to) {
                    part.read_to = Some(read.min(*first));
                }
                for offset in idle {
                    let Some(slot) = part.close(offset) else { continue };
                    self.buffered -= 1;
                    self.buffered_bytes -= slot.bytes();
                    // Its count goes on in the commit's metadata.
                    if slot.deliveries > 0 {
                        part.seed.counts.insert(offset, slot.deliveries);
                    }
                }
            }
        }
    }

    /// Whether a revocation has started and not ended.
    pub fn revoking(&self) -> bool {
        self.parts.values().any(|p| p.revoking)
    }

    /// Deliveries of these partitions still at the worker.
    pub fn out(&self, parts: &[PartId]) -> usize {
        parts
            .iter()
            .filter_map(|id| self.parts.get(id))
            .map(|p| p.open.values().filter(|s| s.state == State::Out).count())
            .sum()
    }

    /// A revocation ends: the partitions are forgotten; returns the offsets
    /// to commit for them (what their settled deliveries allow).
    pub fn revoke_end(&mut self, parts: &[PartId]) -> Vec<Commit> {
        let mut commits = Vec::new();
        for id in parts {
            if let Some(mut part) = self.parts.remove(id) {
                // Deliveries still out are abandoned: the watermark stays
                // below them, and their claims fence them off.
                commits.extend(part.commit(id));
                for slot in part.open.values().filter(|s| s.state != State::Out) {
                    self.buffered -= 1;
                    self.buffered_bytes -= slot.bytes();
                }
            }
        }
        commits
    }

    /// A record read from an owned partition; false when it is not taken
    /// (the partition is not owned or is being revoked, or the offset was
    /// read before).
    pub fn insert(&mut self, id: &PartId, offset: i64, record: Record) -> bool {
        let Some(part) = self.parts.get_mut(id) else { return false };
        if part.revoking || part.read_to.is_some_and(|r| offset < r) {
            return false;
        }
        part.read_to = Some(offset + 1);
        if part.seed.settles(offset) {
            // Settled before this consumer owned the partition.
            return false;
        }
        let deliveries = part.seed.counts.remove(&offset).unwrap_or(0);
        if let Some(key) = &record.key {
            part.by_key.entry(key.clone()).or_default().insert(offset);
        }
        self.buffered += 1;
        self.buffered_bytes += record.bytes();
        part.open.insert(
            offset,
            Slot {
                record,
                state: State::Ready,
                deliveries,
            },
        );
        true
    }

    /// Up to `max` deliveries that may run at `now` (unix ms), each the
    /// next of its order.
    pub fn take(&mut self, max: usize, now: i64) -> Vec<Delivery> {
        let mut out = Vec::new();
        let ids: Vec<PartId> = self.parts.keys().cloned().collect();
        if ids.is_empty() {
            return out;
        }
        self.cursor = (self.cursor + 1) % ids.len();
        let ordering = self.ordering;
        for i in 0..ids.len() {
            if out.len() >= max {
                break;
            }
            let id = &ids[(self.cursor + i) % ids.len()];
            let part = self.parts.get_mut(id).expect("listed above");
            if part.revoking {
                continue;
            }
            let candidates: Vec<i64> = part
                .open
                .iter()
                .filter(|(_, s)| match s.state {
                    // Strictly after: times are whole milliseconds, and a
                    // delay must not end up to one millisecond early.
                    State::Ready => s.record.not_before.is_none_or(|nb| nb < now),
                    State::Waiting(at) => at < now,
                    State::Out => false,
                })
                .map(|(o, _)| *o)
                .collect();
            for offset in candidates {
                if out.len() >= max {
                    break;
                }
                let key = part.open[&offset].record.key.clone();
                if !part.in_turn(ordering, offset, key.as_ref()) {
                    continue;
                }
                let epoch = part.epoch;
                let slot = part.open.get_mut(&offset).expect("listed above");
                slot.state = State::Out;
                slot.deliveries += 1;
                self.buffered -= 1;
                self.buffered_bytes -= slot.bytes();
                out.push(Delivery {
                    envelope: slot.record.envelope.clone(),
                    receipt: receipt(id, offset, epoch, slot.deliveries),
                    delivery_count: slot.deliveries,
                    refused: slot.record.refused.clone(),
                });
            }
        }
        out
    }

    /// The earliest time a waiting record becomes due.
    pub fn next_due(&self) -> Option<i64> {
        self.parts
            .values()
            .filter(|p| !p.revoking)
            .flat_map(|p| p.open.values())
            .filter_map(|s| match s.state {
                State::Waiting(at) => Some(at),
                State::Ready => s.record.not_before,
                State::Out => None,
            })
            .min()
    }

    /// Settle a delivery (the worker is done with its message).
    pub fn settle(&mut self, receipt: &str) -> Result<PartId, Stale> {
        let (id, offset, epoch, n) = parse(receipt).ok_or(Stale::Malformed)?;
        let part = self.parts.get_mut(&id).filter(|p| p.epoch == epoch).ok_or(Stale::Revoked)?;
        match part.open.get(&offset) {
            Some(slot) if slot.state == State::Out && slot.deliveries == n => {
                part.close(offset);
                Ok(id)
            }
            _ => Err(Stale::Revoked),
        }
    }

    /// Give a delivery back, to run again at `at` (unix ms).
    pub fn give_back(&mut self, receipt: &str, at: i64) -> Result<(), Stale> {
        let (id, offset, epoch, n) = parse(receipt).ok_or(Stale::Malformed)?;
        let part = self.parts.get_mut(&id).filter(|p| p.epoch == epoch).ok_or(Stale::Revoked)?;
        match part.open.get_mut(&offset) {
            Some(slot) if slot.state == State::Out && slot.deliveries == n => {
                slot.state = State::Waiting(at);
                self.buffered += 1;
                self.buffered_bytes += slot.bytes();
                Ok(())
            }
            _ => Err(Stale::Revoked),
        }
    }

    /// What these partitions may commit now, where it says more than
    /// their last commit; recorded as committed.
    pub fn commits<'a>(&mut self, parts: impl IntoIterator<Item = &'a PartId>) -> Vec<Commit> {
        parts.into_iter().filter_map(|id| self.parts.get_mut(id)?.commit(id)).collect()
    }

    /// Records of an owned partition not yet settled, given its end offset
    /// and where reading started when nothing was read yet: what is open
    /// here, and what is not read yet. `None` when not owned.
    pub fn unsettled(&self, id: &PartId, end: i64, from: i64) -> Option<u64> {
        let part = self.parts.get(id)?;
        let unread = (end - part.read_to.unwrap_or(from)).max(0);
        Some(part.open.len() as u64 + unread as u64)
    }

    /// Commits that failed: what they said is not committed after all, so
    /// the next commit of their partitions says it again.
    pub fn uncommit(&mut self, commits: &[Commit]) {
        for c in commits {
            if let Some(part) = self.parts.get_mut(&(c.topic.clone(), c.partition)) {
                if part.committed.as_ref().is_some_and(|(o, m)| *o == c.offset && *m == c.metadata) {
                    part.committed = None;
                }
            }
        }
    }

    /// Every owned partition.
    pub fn owned(&self) -> Vec<PartId> {
        self.parts.keys().cloned().collect()
    }

    /// Records read and not at the worker, and their payloads' bytes.
    pub fn buffered(&self) -> (usize, usize) {
        (self.buffered, self.buffered_bytes)
    }
}

/// `topic/partition/offset/epoch/delivery` (Kafka topic names have no
/// `/`).
fn receipt(id: &PartId, offset: i64, epoch: u64, delivery: u32) -> String {
    format!("{}/{}/{offset}/{epoch}/{delivery}", id.0, id.1)
}

fn parse(receipt: &str) -> Option<(PartId, i64, u64, u32)> {
    let mut it = receipt.rsplitn(5, '/');
    let delivery = it.next()?.parse().ok()?;
    let epoch = it.next()?.parse().ok()?;
    let offset = it.next()?.parse().ok()?;
    let partition = it.next()?.parse().ok()?;
    let topic = it.next()?.to_string();
    Some(((topic, partition), offset, epoch, delivery))
}

#[cfg(test)]
#[path = "track_tests.rs"]
mod tests;
