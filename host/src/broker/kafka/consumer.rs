//! The consumer thread: it polls librdkafka, keeps the group membership
//! alive, answers rebalances and sends the commits the acks allow.
//!
//! All of it runs on one thread of its own, so a rebalance callback (which
//! librdkafka runs inside `poll`) may wait for in-flight deliveries of the
//! partitions it loses without stalling the async workers. Commits are
//! sent under `Shared::gate`, which a revocation takes for its last step:
//! a commit is never sent for a partition once its revocation has ended,
//! and the track's lock (which fetches and nacks take) is never held
//! across a round trip to the server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::track::{Commit, PartId, Seed, Track};
use super::wire;

/// Records read and not yet handed out: above this, the partitions are
/// paused.
const BUFFER: usize = 2_000;
/// Their bytes (payloads, headers, keys; `Record::bytes`): above this too
/// (records of a megabyte would otherwise fill 2 GB before the count
/// paused them).
const BUFFER_BYTES: usize = 64 << 20;

/// Whether the read-ahead is full: paused at a limit, resumed under half
/// of both.
fn over_buffer(paused: bool, (records, bytes): (usize, usize)) -> bool {
    records >= BUFFER || bytes >= BUFFER_BYTES || (paused && (records > BUFFER / 2 || bytes > BUFFER_BYTES / 2))
}
/// How long one `poll` waits; also the longest a queued commit waits.
const POLL: Duration = Duration::from_millis(20);
/// How long after a failed commit the consumer thread sends what is
/// settled again (an ack of the partitions would too, but after a queue's
/// last records none comes: the group would lag behind for good).
const COMMIT_RETRY: Duration = Duration::from_secs(1);

/// What the consumer thread and the broker share.
pub(super) struct Shared {
    pub track: Mutex<Track>,
    /// Held while a commit is computed and sent (after the track's lock,
    /// never the other way round).
    pub gate: Mutex<()>,
    /// Signalled when a delivery is settled or given back (a revocation
    /// waits on it).
    pub settled: Condvar,
    /// Woken when records arrive.
    pub arrived: tokio::sync::Notify,
    pub stop: AtomicBool,
    /// Set when an ack's commit failed: the consumer thread sends the
    /// owned partitions' commits again.
    pub commit_failed: AtomicBool,
    /// Rebalances this member has been through (assignments received,
    /// empty ones included).
    pub rebalances: std::sync::atomic::AtomicU64,
    /// How long a revocation waits for deliveries still at the worker.
    pub grace: Duration,
}

impl Shared {
    pub fn track(&self) -> MutexGuard<'_, Track> {
        self.track.lock().expect("kafka track poisoned")
    }

    pub fn gate(&self) -> MutexGuard<'_, ()> {
        self.gate.lock().expect("kafka commit gate poisoned")
    }
}

/// The consumer's context: rebalance callbacks.
pub(super) struct Ctx {
    pub shared: Arc<Shared>,
}

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else { return };
        let parts = part_ids(tpl);
        let shared = &self.shared;
        let lost = consumer.assignment_lost();
        {
            let mut track = shared.track();
            track.revoke_begin(&parts);
            let deadline = Instant::now() + shared.grace;
            while !lost && !shared.stop.load(Ordering::Relaxed) && track.out(&parts) > 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    tracing::warn!(
                        partitions = ?parts,
                        running = track.out(&parts),
                        grace_ms = shared.grace.as_millis() as u64,
                        "kafka: partitions revoked with deliveries still running; their offsets stay uncommitted and the next owner runs them again (their claims keep the two executions apart)"
                    );
                    break;
                }
                track = shared.settled.wait_timeout(track, left).expect("kafka track poisoned").0;
            }
        }
        // No ack commits for these partitions after this.
        let _gate = shared.gate();
        let commits = shared.track().revoke_end(&parts);
        if lost {
            tracing::warn!(partitions = ?parts, "kafka: partitions lost (session timed out); nothing committed for them");
            return;
        }
        // Still owned until this callback returns: commit what is settled.
        if let Err(e) = commit(consumer, &commits, CommitMode::Sync) {
            tracing::warn!(error = %e, partitions = ?parts, "kafka: cannot commit revoked partitions; the next owner re-reads from the last commit");
        }
        tracing::info!(partitions = ?parts, "kafka: partitions revoked");
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let parts = part_ids(tpl);
                let seeds = seeds(consumer, tpl);
                let assigned = parts.iter().cloned().zip(seeds).collect();
                self.shared.track().assign(assigned);
                self.shared.rebalances.fetch_add(1, Ordering::Relaxed);
                self.shared.arrived.notify_waiters();
                tracing::info!(partitions = ?parts, "kafka: partitions assigned");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!(error = %e, "kafka: rebalance failed"),
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = result {
            tracing::warn!(error = %e, offsets = ?part_ids(offsets), "kafka: commit failed; sent again while the partitions are ours, else their next owner re-reads from the last commit");
        }
    }
}

/// What the partitions' last commits say beyond their offsets (none, if
/// they cannot be read: then settled records run again as duplicates).
fn seeds(consumer: &BaseConsumer<Ctx>, tpl: &TopicPartitionList) -> Vec<Seed> {
    let committed = match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "kafka: cannot read the assigned partitions' commits; settled records above them run again as duplicates");
            return vec![Seed::default(); tpl.count()];
        }
    };
    tpl.elements()
        .iter()
        .map(|e| {
            committed
                .find_partition(e.topic(), e.partition())
                // rdkafka panics on metadata that is not UTF-8 (another
                // client's): no seed then.
                .and_then(|c| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Seed::decode(c.metadata()))).ok())
                .unwrap_or_default()
        })
        .collect()
}

fn part_ids(tpl: &TopicPartitionList) -> Vec<PartId> {
    tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect()
}

/// Commit offsets (nothing to do for none).
pub(super) fn commit<C: ConsumerContext>(consumer: &BaseConsumer<C>, commits: &[Commit], mode: CommitMode) -> KafkaResult<()> {
    if commits.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    for c in commits {
        tpl.add_partition_offset(&c.topic, c.partition, Offset::Offset(c.offset))?;
        if let Some(mut e) = tpl.find_partition(&c.topic, c.partition) {
            e.set_metadata(&c.metadata);
        }
    }
    consumer.commit(&tpl, mode)
}

/// Send commits the track has recorded (the caller holds the gate). A
/// failed one is not committed after all, and the consumer thread sends
/// the owned partitions' commits again [`COMMIT_RETRY`] later.
pub(super) fn send(consumer: &BaseConsumer<Ctx>, shared: &Shared, commits: &[Commit]) -> KafkaResult<()> {
    let result = commit(consumer, commits, CommitMode::Sync);
    if result.is_err() {
        shared.track().uncommit(commits);
        shared.commit_failed.store(true, Ordering::Relaxed);
    }
    result
}

/// Commit what the owned partitions have settled beyond their last
/// commits, under the gate.
fn commit_owned(consumer: &BaseConsumer<Ctx>, shared: &Shared) -> KafkaResult<()> {
    let _gate = shared.gate();
    let commits = {
        let mut track = shared.track();
        let owned = track.owned();
        track.commits(&owned)
    };
    send(consumer, shared, &commits)
}

/// The consumer thread's loop, until `shared.stop`; then it commits what is
/// settled and leaves the group (dropping the consumer closes it).
pub(super) fn run(consumer: Arc<BaseConsumer<Ctx>>, shared: Arc<Shared>) {
    let mut paused = false;
    let mut last_error: Option<Instant> = None;
    let mut retry_commit_at: Option<Instant> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        match consumer.poll(POLL) {
            Some(Ok(m)) => {
                let id = (rdkafka::Message::topic(&m).to_string(), rdkafka::Message::partition(&m));
                let offset = rdkafka::Message::offset(&m);
                let record = wire::record(&m);
                if shared.track().insert(&id, offset, record) {
                    shared.arrived.notify_waiters();
                }
            }
            // Connection trouble is retried by librdkafka; say so at most
            // every 10 s.
            Some(Err(e)) if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) => {
                tracing::warn!(error = %e, "kafka: consumer error (librdkafka retries)");
                last_error = Some(Instant::now());
            }
            Some(Err(_)) | None => {}
        }
        let buffered = shared.track().buffered();
        if over_buffer(paused, buffered) {
            // Over the buffer: pause the assignment (again, for partitions
            // assigned since), polling on to stay in the group.
            if let Ok(assignment) = consumer.assignment() {
                let _ = consumer.pause(&assignment);
            }
            paused = true;
        } else if paused {
            if let Ok(assignment) = consumer.assignment() {
                let _ = consumer.resume(&assignment);
            }
            paused = false;
        }
        if shared.commit_failed.swap(false, Ordering::Relaxed) {
            retry_commit_at.get_or_insert_with(|| Instant::now() + COMMIT_RETRY);
        }
        if retry_commit_at.is_some_and(|at| Instant::now() >= at) {
            retry_commit_at = None;
            if let Err(e) = commit_owned(&consumer, &shared) {
                tracing::warn!(error = %e, "kafka: commit failed again; sending it again in {COMMIT_RETRY:?}");
            }
        }
    }
    if let Err(e) = commit_owned(&consumer, &shared) {
        tracing::warn!(error = %e, "kafka: cannot commit on leaving; the next owner re-reads from the last commit");
    }
    // The last reference closes the consumer: it leaves the group.
    drop(consumer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_ahead_pauses_at_its_count_or_its_bytes() {
        assert!(!over_buffer(false, (BUFFER - 1, BUFFER_BYTES - 1)));
        assert!(over_buffer(false, (BUFFER, 0)));
        assert!(over_buffer(false, (64, BUFFER_BYTES)), "64 records of a megabyte");
        assert!(over_buffer(true, (0, BUFFER_BYTES / 2 + 1)), "paused until under half");
        assert!(over_buffer(true, (BUFFER / 2 + 1, 0)));
        assert!(!over_buffer(true, (BUFFER / 2, BUFFER_BYTES / 2)));
    }
}
