//! Kafka broker: a consumer group over configured topics, on librdkafka
//! (`rdkafka`, its vendored build).
//!
//! How the [`Broker`] contract maps onto Kafka, which has offsets instead
//! of per-message acks:
//!
//! - One consumer thread (see `consumer`) polls the group's partitions
//!   (cooperative-sticky assignment, `enable.auto.commit = false`) into the
//!   `track`. `fetch` hands out the records that may run now: with
//!   `broker.ordering = "key"` (default) records of one partition run
//!   concurrently when their keys differ and in order when they share one;
//!   `"partition"` runs a partition one record at a time; `"none"` runs
//!   everything at once.
//! - `ack` settles offsets; the consumer commits, per partition, the lowest
//!   offset not yet settled, so a crash or a rebalance re-delivers only
//!   unsettled records (and the claims make those re-deliveries harmless).
//! - Retries (`nack`, `retry`) do not re-publish: the record waits in this
//!   consumer for its delay and runs again, its offset uncommitted, while
//!   the partition's other keys flow on and later records of its key wait
//!   behind it. Chosen over retry topics and over re-publishing because it
//!   keeps per-key order through crashes and rebalances with nothing more
//!   to provision: the log itself still holds the order, and a new owner
//!   re-reads the record before its followers. The cost: a partition's
//!   committed offset waits behind a retrying record (at most
//!   `retry.max_delay_ms` per attempt), so a crash then re-reads more
//!   settled records, each answered by its claim as a duplicate.
//! - Delayed publishes carry `Idem-Not-Before` and are held until due.
//! - Visibility: a delivery is this consumer's until its partition is
//!   revoked ([`Visibility::UntilDisconnect`]); `extend` has nothing to do.
//!   On a revocation, nothing more of the partition is handed out, running
//!   deliveries get `broker.rebalance_grace_ms` to settle, what is settled
//!   is committed, and nothing is ever committed for a partition no longer
//!   owned (receipts carry the assignment's epoch). A delivery that
//!   outlives the grace runs on; its claim fences it against the new
//!   owner's execution.
//! - `pending` is the group's lag: the partitions' end offsets minus the
//!   committed ones (`backlog` gives it per partition).
//!
//! The group is joined on the first `fetch`, so `idem stats`, `publish`
//! and `dlq replay` never trigger a rebalance of the running workers.

mod commit;
mod consumer;
mod track;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use self::consumer::{Ctx, Shared};
use self::track::{Seed, Track};
use super::{Broker, BrokerError, Semantics, Visibility};
use crate::config::KafkaOrdering;
use crate::envelope::{Delivery, Envelope};

/// The longest a fetch waits on a quiet partition, in ms: librdkafka's
/// default, 500 ms, becomes a record's latency when the server waits the
/// whole time (tansu does), and a stall of a one-record-at-a-time consumer
/// each time a partition runs dry.
pub const FETCH_WAIT_MAX_MS: &str = "20";

/// How long metadata and offset queries wait.
const QUERY: Duration = Duration::from_secs(10);

/// What the kafka broker takes from a configuration.
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    /// Bootstrap servers, `host:port[,host:port…]` (`broker.url`, with or
    /// without `kafka://`).
    pub servers: String,
    /// Topics consumed (`broker.topics`); `publish` sends to the first.
    pub topics: Vec<String>,
    /// Consumer group (`broker.group`).
    pub group: String,
    /// `broker.ordering`.
    pub ordering: KafkaOrdering,
    /// `broker.rebalance_grace_ms`.
    pub grace: Duration,
    /// `broker.group_pointer`: where in a payload `publish` finds the
    /// record key.
    pub key_pointer: Option<String>,
    /// Each plugin's `key_pointer`: the record key without a group
    /// pointer.
    pub key_pointers: HashMap<String, String>,
}

impl KafkaOptions {
    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.servers)
            .set("client.id", "idem")
            .set("log_level", "4");
        c
    }
}

/// Kafka topics consumed by one consumer group.
pub struct KafkaBroker {
    options: KafkaOptions,
    shared: Arc<Shared>,
    /// Offsets and metadata, without joining the group.
    meta: Arc<BaseConsumer>,
    joined: OnceLock<Result<(), String>>,
    /// The group member, once joined (taken on `close`).
    consumer: Mutex<Option<Arc<BaseConsumer<Ctx>>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    producer: tokio::sync::OnceCell<FutureProducer>,
}

impl KafkaBroker {
    /// Connect and check that the topics exist (Idem does not create
    /// them: partitions and retention are the operator's).
    pub async fn connect(options: KafkaOptions) -> Result<KafkaBroker> {
        if options.topics.is_empty() {
            bail!("[broker] kind = \"kafka\" needs topics: set broker.topics");
        }
        let meta: BaseConsumer = options
            .config()
            .set("group.id", &options.group)
            .create()
            .with_context(|| format!("cannot create a Kafka client for broker.url = {:?}", options.servers))?;
        let meta = Arc::new(meta);
        let partitions = blocking({
            let meta = meta.clone();
            let options = options.clone();
            move || partitions(&meta, &options)
        })
        .await?;
        tracing::debug!(?partitions, "kafka: topics found");
        let shared = Arc::new(Shared {
            track: Mutex::new(Track::new(options.ordering)),
            gate: Mutex::new(()),
            settled: Condvar::new(),
            arrived: tokio::sync::Notify::new(),
            stop: Default::default(),
            commit_failed: Default::default(),
            rebalances: Default::default(),
            grace: options.grace,
        });
        Ok(KafkaBroker {
            options,
            shared,
            meta,
            joined: OnceLock::new(),
            consumer: Mutex::new(None),
            thread: Mutex::new(None),
            producer: tokio::sync::OnceCell::new(),
        })
    }

    /// Create a topic with this many partitions, for tests and chaos runs;
    /// one that exists already is left as it is.
    pub async fn create_topic(options: &KafkaOptions, topic: &str, partitions: i32) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = options.config().create()?;
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let results = admin.create_topics([&new], &AdminOptions::new()).await?;
        for r in results {
            match r {
                Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, e)) => bail!("cannot create Kafka topic {t:?}: {e}"),
            }
        }
        Ok(())
    }

    /// Delete a topic; best effort.
    pub async fn delete_topic(options: &KafkaOptions, topic: &str) {
        if let Ok(admin) = options.config().create::<AdminClient<DefaultClientContext>>() {
            let _ = admin.delete_topics(&[topic], &AdminOptions::new()).await;
        }
    }

    /// Join the group (once) and start the consumer thread.
    fn join(&self) -> Result<(), BrokerError> {
        let started = self.joined.get_or_init(|| {
            let ctx = Ctx {
                shared: self.shared.clone(),
            };
            let consumer: BaseConsumer<Ctx> = self
                .options
                .config()
                .set("group.id", &self.options.group)
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                .set("auto.offset.reset", "earliest")
                .set("partition.assignment.strategy", "cooperative-sticky")
                .set("session.timeout.ms", "10000")
                .set("heartbeat.interval.ms", "1000")
                .set("fetch.wait.max.ms", FETCH_WAIT_MAX_MS)
                .create_with_context(ctx)
                .map_err(|e| format!("cannot create the Kafka consumer: {e}"))?;
            let topics: Vec<&str> = self.options.topics.iter().map(String::as_str).collect();
            consumer
                .subscribe(&topics)
                .map_err(|e| format!("cannot subscribe to broker.topics {topics:?}: {e}"))?;
            let consumer = Arc::new(consumer);
            *self.consumer.lock().expect("kafka consumer poisoned") = Some(consumer.clone());
            let shared = self.shared.clone();
            let handle = std::thread::Builder::new()
                .name("idem-kafka".into())
                .spawn(move || consumer::run(consumer, shared))
                .map_err(|e| format!("cannot start the Kafka consumer thread: {e}"))?;
            *self.thread.lock().expect("kafka thread poisoned") = Some(handle);
            Ok(())
        });
        match started {
            Ok(_) => Ok(()),
            Err(e) => Err(BrokerError::Unavailable(e.clone())),
        }
    }

    /// Join the group now and wait until its first rebalance gave this
    /// member its partitions (none, if the group has more members than
    /// partitions). `fetch` joins on its own; this is for callers that must
    /// know the member is in (tests, benchmarks).
    pub async fn join_group(&self, timeout: Duration) -> Result<()> {
        self.join()?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let arrived = self.shared.arrived.notified();
            if self.shared.rebalances.load(AtomicOrdering::Relaxed) > 0 {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                bail!("group {:?} gave this member no assignment within {timeout:?}", self.options.group);
            }
        }
    }

    /// Whether a rebalance is revoking this member's partitions now (it
    /// waits up to `broker.rebalance_grace_ms` for deliveries still at the
    /// worker). Tests wait on it to act during a revocation.
    pub fn revoking(&self) -> bool {
        self.shared.track().revoking()
    }

    async fn producer(&self) -> Result<&FutureProducer, BrokerError> {
        self.producer
            .get_or_try_init(|| async {
                self.options
                    .config()
                    .set("acks", "all")
                    .set("message.timeout.ms", "30000")
                    .set("linger.ms", "2")
                    .create::<FutureProducer>()
                    .map_err(|e| BrokerError::Unavailable(format!("cannot create the Kafka producer: {e}")))
            })
            .await
    }

    /// Unsettled records per partition: exact for the partitions this
    /// member owns (it knows which it read and settled); for the others,
    /// the group's lag (end offset minus committed), less the records the
    /// last commit's metadata says are settled above it.
    async fn lag(&self) -> Result<Vec<(String, u64)>, BrokerError> {
        let meta = self.meta.clone();
        let options = self.options.clone();
        let shared = self.shared.clone();
        blocking(move || {
            let parts = partitions(&meta, &options)?;
            let mut tpl = TopicPartitionList::new();
            for (topic, p) in &parts {
                tpl.add_partition(topic, *p);
            }
            let committed = meta
                .committed_offsets(tpl, QUERY)
                .map_err(|e| anyhow::anyhow!("cannot read the committed offsets of group {:?}: {e}", options.group))?;
            let mut out = Vec::new();
            for (topic, p) in parts {
                let (low, high) = meta
                    .fetch_watermarks(&topic, p, QUERY)
                    .map_err(|e| anyhow::anyhow!("cannot read the end offsets of {topic}/{p}: {e}"))?;
                let mine = committed.find_partition(&topic, p);
                let (from, seed) = match mine.as_ref().map(|e| (e.offset(), e.metadata())) {
                    Some((Offset::Offset(o), metadata)) => (o.max(low), Seed::decode(metadata)),
                    _ => (low, Seed::default()),
                };
                let name = format!("{topic}/{p}");
                if let Some(n) = shared.track().unsettled(&(topic, p), high, from) {
                    out.push((name, n));
                    continue;
                }
                // Records above the commit already settled do not count.
                let settled: i64 = seed.settled.iter().map(|(a, b)| ((*b + 1).min(high) - (*a).max(from)).max(0)).sum();
                out.push((name, (high - from - settled).max(0) as u64));
            }
            Ok(out)
        })
        .await
        .map_err(|e| BrokerError::Unavailable(format!("{e:#}")))
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        // The consumer thread commits, leaves the group and closes the
        // consumer, holding its last reference; waited for, so no client
        // of this broker outlives it (and asks the cluster about a topic
        // that may be gone by then).
        self.shared.stop.store(true, AtomicOrdering::Relaxed);
        drop(self.consumer.lock().map(|mut c| c.take()));
        if let Some(h) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = h.join();
        }
    }
}

/// Run a blocking librdkafka call off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.context("kafka query task failed")?
}

/// The partitions of the configured topics, or an error naming what to fix.
fn partitions(meta: &BaseConsumer, options: &KafkaOptions) -> Result<Vec<(String, i32)>> {
    let mut out = Vec::new();
    for topic in &options.topics {
        // One topic at a time: a cluster's whole metadata can be large, and
        // a server's answer for every topic may include ones being deleted.
        let md = meta.fetch_metadata(Some(topic), QUERY).with_context(|| {
            format!(
                "cannot reach Kafka at broker.url = {:?}: check the address and that the brokers run",
                options.servers
            )
        })?;
        let found = md.topics().iter().find(|t| t.name() == topic && t.error().is_none());
        match found {
            Some(t) if !t.partitions().is_empty() => {
                out.extend(t.partitions().iter().map(|p| (topic.clone(), p.id())));
            }
            _ => bail!(
                "Kafka topic {topic:?} (broker.topics) does not exist on {}: create it (Idem does not create topics; choose its partitions, which bound how many workers share it)",
                options.servers
            ),
        }
    }
    Ok(out)
}

#[async_trait]
impl Broker for KafkaBroker {
    async fn publish(&self, envelopes: &[Envelope], delay: Duration) -> Result<(), BrokerError> {
        let producer = self.producer().await?;
        let topic = &self.options.topics[0];
        let not_before = wire::stamp(crate::now_ms(), delay)?;
        let mut sends = Vec::with_capacity(envelopes.len());
        for e in envelopes {
            let headers = wire::headers(e, not_before)?;
            let pointer = self.options.key_pointer.as_deref();
            let key = wire::key_of(e, pointer.or(self.options.key_pointers.get(&e.handler).map(String::as_str)));
            let id = e.id.clone();
            sends.push(async move {
                let record = FutureRecord::to(topic).key(&key).payload(&e.payload).headers(headers);
                producer
                    .send(record, Duration::from_secs(30))
                    .await
                    .map(|_| ())
                    .map_err(|(err, _)| BrokerError::Unavailable(format!("Kafka: cannot publish {id:?} to {topic:?}: {err}")))
            });
        }
        futures::future::try_join_all(sends).await?;
        Ok(())
    }

    async fn fetch(&self, max: usize, _visibility: Duration) -> Result<Vec<Delivery>, BrokerError> {
        self.join()?;
        let arrived = self.shared.arrived.notified();
        let (got, due) = {
            let mut track = self.shared.track();
            let got = track.take(max, crate::now_ms());
            (got, track.next_due())
        };
        if !got.is_empty() {
            return Ok(got);
        }
        // Nothing may run now: wait a little for records to arrive or a
        // retry to come due.
        let mut wait = Duration::from_millis(100);
        if let Some(due) = due {
            let left = due.saturating_add(1).saturating_sub(crate::now_ms()).max(0);
            wait = wait.min(Duration::from_millis(left as u64));
        }
        let _ = tokio::time::timeout(wait, arrived).await;
        Ok(self.shared.track().take(max, crate::now_ms()))
    }

    async fn ack(&self, receipts: &[&str]) -> Result<(), BrokerError> {
        let Some(consumer) = self.consumer.lock().expect("kafka consumer poisoned").clone() else {
            // Never joined: no receipt of this broker can be settled.
            return Ok(());
        };
        let shared = self.shared.clone();
        let receipts: Vec<String> = receipts.iter().map(|r| r.to_string()).collect();
        let committed = tokio::task::spawn_blocking(move || {
            // Under the gate: a revocation cannot end between the settling
            // and the commit, and commits of one partition go out in order.
            let _gate = shared.gate();
            let commits = {
                let mut track = shared.track();
                let mut touched = Vec::new();
                for r in &receipts {
                    match track.settle(r) {
                        Ok(id) => {
                            if !touched.contains(&id) {
                                touched.push(id);
                            }
                        }
                        Err(e) => tracing::debug!(receipt = r, ?e, "kafka: ack of a delivery no longer ours: nothing to commit"),
                    }
                }
                track.commits(&touched)
            };
            // A revocation may be waiting for these; a fetch for the next
            // record of their keys.
            shared.settled.notify_all();
            shared.arrived.notify_waiters();
            consumer::send(&consumer, &shared, &commits)
        })
        .await
        .map_err(|e| BrokerError::Unavailable(format!("kafka ack task failed: {e}")))?;
        // A failed commit loses nothing: the records stay settled here, and
        // the consumer thread sends it again within a second (or the next
        // commit of their partitions: an ack, the revocation, the close).
        if let Err(e) = committed {
            tracing::warn!(error = %e, "kafka: commit failed; it is sent again");
        }
        Ok(())
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<(), BrokerError> {
        let at = crate::broker::due_at(crate::now_ms(), delay);
        if let Err(e) = self.shared.track().give_back(receipt, at) {
            tracing::debug!(receipt, ?e, "kafka: nack of a delivery no longer ours: its next owner runs it");
        }
        self.shared.settled.notify_all();
        self.shared.arrived.notify_waiters();
        Ok(())
    }

    async fn extend(&self, _receipts: &[&str], _visibility: Duration) -> Result<(), BrokerError> {
        Ok(())
    }

    async fn pending(&self) -> Result<u64, BrokerError> {
        Ok(self.lag().await?.iter().map(|(_, n)| n).sum())
    }

    async fn backlog(&self) -> Result<Vec<(String, u64)>, BrokerError> {
        self.lag().await
    }

    fn semantics(&self) -> Semantics {
        Semantics {
            visibility: Visibility::UntilDisconnect,
            early_fetches_count: false,
            exact_only_at_owner: true,
            receives_counted: false,
        }
    }

    async fn close(&self) {
        self.shared.stop.store(true, AtomicOrdering::Relaxed);
        drop(self.consumer.lock().expect("kafka consumer poisoned").take());
        let handle = self.thread.lock().expect("kafka thread poisoned").take();
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
    }
}
