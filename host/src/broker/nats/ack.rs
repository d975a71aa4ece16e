//! Answering deliveries: receipts are JetStream ack subjects, answered with
//! a reply subject so that a returned call has been applied.

use std::collections::HashSet;
use std::time::Duration;

use async_nats::StatusCode;
use bytes::Bytes;
use futures::StreamExt;

use super::{unavailable, NatsBroker, CONSUMER};
use crate::broker::BrokerError;

/// How long an ack, nak or in-progress waits for the server's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// What a receipt (a JetStream ack subject) says about its delivery.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct AckRef<'a> {
    pub(super) stream: &'a str,
    pub(super) consumer: &'a str,
    pub(super) delivered: i64,
    pub(super) stream_seq: u64,
    pub(super) delivery_seq: u64,
}

impl<'a> AckRef<'a> {
    /// Parse `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<delivery seq>.<ts>.<pending>`,
    /// or the longer form that puts a domain and an account hash before the
    /// stream (servers 2.10+ may send it; tokens after `pending` are ignored).
    pub(super) fn parse(receipt: &'a str) -> Option<AckRef<'a>> {
        let tokens: Vec<&str> = receipt.strip_prefix("$JS.ACK.")?.split('.').collect();
        let t = match tokens.len() {
            7 => &tokens[..],
            n if n >= 9 => &tokens[2..],
            _ => return None,
        };
        Some(AckRef {
            stream: t[0],
            consumer: t[1],
            delivered: t[2].parse().ok()?,
            stream_seq: t[3].parse().ok()?,
            delivery_seq: t[4].parse().ok()?,
        })
    }
}

impl NatsBroker {
    /// Parse and check a receipt: only this stream's and consumer's ack
    /// subjects are answered, never an arbitrary subject.
    pub(super) fn receipt<'a>(&self, receipt: &'a str) -> Result<AckRef<'a>, BrokerError> {
        AckRef::parse(receipt)
            .filter(|r| r.stream == self.stream_name && r.consumer == CONSUMER)
            .ok_or_else(|| {
                BrokerError::Unavailable(format!(
                    "malformed receipt {receipt:?}: not an ack subject of stream {:?}",
                    self.stream_name
                ))
            })
    }

    /// True when this instance has handed out a newer delivery of the same
    /// message than `r`.
    pub(super) fn is_stale(&self, r: &AckRef<'_>) -> bool {
        let newest = self.newest.lock().expect("newest-delivery map poisoned");
        newest.get(&r.stream_seq).is_some_and(|&seq| seq > r.delivery_seq)
    }

    /// Send each (ack subject, answer) with a reply subject and wait until
    /// the server has answered all of them: a returned call is applied.
    pub(super) async fn answer(&self, items: &[(&str, Bytes)], what: &str) -> Result<(), BrokerError> {
        if items.is_empty() {
            return Ok(());
        }
        let inbox = self.client.new_inbox();
        let mut replies = self
            .client
            .subscribe(format!("{inbox}.*"))
            .await
            .map_err(|e| unavailable(&format!("cannot subscribe for {what} confirmations"), e))?;
        for (i, (subject, body)) in items.iter().enumerate() {
            self.client
                .publish_with_reply(subject.to_string(), format!("{inbox}.{i}"), body.clone())
                .await
                .map_err(|e| unavailable(&format!("cannot send {what}"), e))?;
        }
        let mut answered = HashSet::with_capacity(items.len());
        let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
        while answered.len() < items.len() {
            let reply = match tokio::time::timeout_at(deadline, replies.next()).await {
                Ok(Some(reply)) => reply,
                Ok(None) => {
                    return Err(BrokerError::Unavailable(format!(
                        "NATS connection closed while waiting for {what} confirmations"
                    )))
                }
                Err(_) => {
                    return Err(BrokerError::Unavailable(format!(
                        "NATS confirmed {} of {} {what}s within {ANSWER_TIMEOUT:?}",
                        answered.len(),
                        items.len()
                    )))
                }
            };
            if reply.status == Some(StatusCode::NO_RESPONDERS) {
                return Err(BrokerError::Unavailable(format!(
                    "no JetStream consumer answers {what}s on stream {:?}: was the consumer {CONSUMER:?} deleted?",
                    self.stream_name
                )));
            }
            answered.insert(reply.subject.to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_ack_subject_forms() {
        let v1 = AckRef::parse("$JS.ACK.q.idem.3.100.7.1790230470084404000.42").unwrap();
        assert_eq!(
            v1,
            AckRef {
                stream: "q",
                consumer: "idem",
                delivered: 3,
                stream_seq: 100,
                delivery_seq: 7
            }
        );
        let v2 = AckRef::parse("$JS.ACK._.hash.q.idem.3.100.7.1790230470084404000.42.tok").unwrap();
        assert_eq!(v2, v1);
        assert_eq!(AckRef::parse("$JS.ACK.q.idem.x.100.7.1.0"), None);
        assert_eq!(AckRef::parse("orders.created"), None);
        assert_eq!(AckRef::parse("$JS.ACK.q.idem.1.2"), None);
    }
}
