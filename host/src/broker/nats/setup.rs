//! Declaring the namespace's stream and its durable pull consumer.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context as _};
use async_nats::jetstream::{self, consumer, stream};

use super::{NatsBroker, CONSUMER};

/// Delayed and nacked messages sit in the ack-pending set until due; the
/// server's default of 1,000 would stall delivery behind them.
const MAX_ACK_PENDING: i64 = 1_000_000;

impl NatsBroker {
    /// Connect to `url` and declare (idempotently) the namespace's stream and
    /// its durable pull consumer. `ack_wait` is the visibility timeout; if
    /// the consumer exists with another one it is updated, so the last
    /// worker to start decides (keep `worker.visibility_ms` equal across a
    /// namespace).
    pub async fn connect(url: &str, namespace: &str, ack_wait: Duration) -> anyhow::Result<Self> {
        let url_shown = crate::text::redact_url(url);
        if namespace.is_empty() || namespace.chars().any(|c| c.is_whitespace() || ".*>/\\".contains(c)) {
            bail!("namespace {namespace:?} cannot name a JetStream stream: use letters, digits and '_'");
        }
        if ack_wait.is_zero() {
            bail!("worker.visibility_ms must be above 0: it is the JetStream consumer's ack_wait");
        }
        let hint = || format!("cannot connect to NATS at broker.url = {url_shown:?}: is nats-server running with JetStream (-js)?");
        let client = async_nats::ConnectOptions::new()
            .name("idem")
            .connect(url)
            .await
            .with_context(hint)?;
        let js = jetstream::new(client.clone());
        let stream_name = namespace.to_string();
        let subject = format!("{namespace}.queue");

        let stream = js
            .get_or_create_stream(stream::Config {
                name: stream_name.clone(),
                subjects: vec![subject.clone()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .with_context(|| {
                format!(
                    "NATS at broker.url = {url_shown:?} cannot declare the stream {stream_name:?}: is nats-server running with JetStream (-js)?"
                )
            })?;
        let config = &stream.cached_info().config;
        if !config.subjects.iter().any(|s| subject_matches(s, &subject)) {
            bail!(
                "the JetStream stream {stream_name:?} at broker.url = {url_shown:?} exists but does not take subject {subject:?} \
                 (its subjects: {:?}): add the subject to it, delete it, or choose another namespace",
                config.subjects
            );
        }
        if config.retention != stream::RetentionPolicy::WorkQueue {
            tracing::warn!(
                stream = %stream_name,
                retention = ?config.retention,
                "the stream was not created by Idem with WorkQueue retention: acked messages stay in it until its limits remove them"
            );
        }

        let wanted = consumer::pull::Config {
            durable_name: Some(CONSUMER.to_string()),
            description: Some("Idem workers: ack_wait is worker.visibility_ms".to_string()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait,
            // Unlimited: poison messages are bounded by Idem's own attempt
            // count, which also survives a worker killed mid-run.
            max_deliver: -1,
            max_ack_pending: MAX_ACK_PENDING,
            ..Default::default()
        };
        let mut consumer: consumer::PullConsumer = stream.get_or_create_consumer(CONSUMER, wanted.clone()).await.with_context(|| {
            format!("cannot declare the JetStream consumer {CONSUMER:?} on stream {stream_name:?} at broker.url = {url_shown:?}")
        })?;
        let existing = consumer.cached_info().config.clone();
        if existing.ack_wait != ack_wait || existing.max_ack_pending < MAX_ACK_PENDING || existing.max_deliver > 0 {
            // Created earlier with other settings (another visibility_ms):
            // the configuration running now is the one to honour.
            match stream.create_consumer(wanted).await {
                Ok(updated) => {
                    tracing::info!(stream = %stream_name, was = ?existing.ack_wait, now = ?ack_wait, "updated the JetStream consumer's ack_wait to worker.visibility_ms");
                    consumer = updated;
                }
                Err(e) => tracing::warn!(
                    stream = %stream_name,
                    error = %e,
                    ack_wait = ?existing.ack_wait,
                    "cannot update the JetStream consumer to worker.visibility_ms; its existing ack_wait stays the visibility timeout"
                ),
            }
        }
        let ack_wait = consumer.cached_info().config.ack_wait;
        tracing::info!(stream = %stream_name, ?ack_wait, "NATS JetStream broker ready");
        Ok(NatsBroker {
            client,
            js,
            stream,
            consumer,
            stream_name,
            subject,
            newest: Mutex::new(BTreeMap::new()),
            ack_wait,
        })
    }
}

/// Whether a stream subject (possibly with `*` and `>` wildcards) takes
/// `subject`.
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_subjects() {
        assert!(subject_matches("ns.queue", "ns.queue"));
        assert!(subject_matches("ns.*", "ns.queue"));
        assert!(subject_matches("ns.>", "ns.queue"));
        assert!(subject_matches(">", "ns.queue"));
        assert!(!subject_matches("ns", "ns.queue"));
        assert!(!subject_matches("ns.queue.x", "ns.queue"));
        assert!(!subject_matches("other.queue", "ns.queue"));
    }
}
