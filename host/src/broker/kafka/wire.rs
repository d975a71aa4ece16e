//! Wire format: a record's value is the payload, its key is the ordering
//! key, and its headers carry the envelope.
//!
//! Headers:
//! - `Idem-Id`, `Idem-Handler`: the envelope's id and handler;
//! - `Idem-Not-Before`: unix ms, on a delayed publish (Kafka has no
//!   per-record delay: the consumer holds the record until then, and the
//!   records of its key, or of its partition, wait behind it). A delay is
//!   at most [`MAX_DELAY_MS`]: `publish` refuses a longer one, and a record
//!   stamped further ahead of the reading worker's clock (another
//!   producer's, or one writing microseconds) is dead-lettered
//!   with the reason instead of holding its key or partition for good;
//! - every other header is the producer's, in order, as Kafka keeps them.
//!   Names starting with `Idem-` are Idem's own: `publish` refuses an
//!   envelope header of that form.
//!
//! A record from another producer is read too: without `Idem-Id` its id is
//! `<topic>-<partition>-<offset>`, the same on every read of it; without
//! `Idem-Handler` it is dead-lettered with the reason (it names no plugin).

use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::Message;

use super::track::Record;
use crate::broker::BrokerError;
use crate::envelope::{header_cost, Envelope, HEADER_OVERHEAD, MAX_HEADER_BYTES};

pub(super) const ID: &str = "Idem-Id";
pub(super) const HANDLER: &str = "Idem-Handler";
pub(super) const NOT_BEFORE: &str = "Idem-Not-Before";

/// The longest delay a Kafka record may carry: the record is held in its
/// partition until due, and nothing after it is committed meanwhile.
pub(super) const MAX_DELAY_MS: i64 = 60 * 60 * 1000;

/// A delayed publish's stamp, or the reason a delay that long is refused.
pub(super) fn stamp(now: i64, delay: std::time::Duration) -> Result<Option<i64>, BrokerError> {
    crate::broker::stamp(
        now,
        delay,
        MAX_DELAY_MS,
        "a Kafka record may be held (its key or partition waits behind it)",
    )
}

/// A read `Idem-Not-Before` value, checked against the reader's clock:
/// the time the record is due, or why it is refused.
fn due(value: &str, now: i64) -> Result<i64, String> {
    crate::broker::read_not_before(
        NOT_BEFORE,
        value,
        now,
        MAX_DELAY_MS,
        "a Kafka record is held in its partition until due, so Idem takes delays of at most an hour",
    )
}

fn reserved(name: &str) -> bool {
    name.as_bytes().get(..5).is_some_and(|p| p.eq_ignore_ascii_case(b"idem-"))
}

/// The headers of one envelope.
pub(super) fn headers(e: &Envelope, not_before: Option<i64>) -> Result<OwnedHeaders, BrokerError> {
    if e.id.is_empty() || e.handler.is_empty() {
        return Err(BrokerError::Unavailable(format!(
            "Kafka: message {:?} needs a non-empty id and handler",
            e.id
        )));
    }
    let mut h = OwnedHeaders::new_with_capacity(e.headers.len() + 3)
        .insert(Header {
            key: ID,
            value: Some(&e.id),
        })
        .insert(Header {
            key: HANDLER,
            value: Some(&e.handler),
        });
    if let Some(at) = not_before {
        h = h.insert(Header {
            key: NOT_BEFORE,
            value: Some(&at.to_string()),
        });
    }
    for (name, value) in &e.headers {
        if reserved(name) {
            return Err(BrokerError::Unavailable(format!(
                "Kafka: message {:?} has a header {name:?}: names starting with Idem- are Idem's own; rename it",
                e.id
            )));
        }
        h = h.insert(Header {
            key: name,
            value: Some(value),
        });
    }
    Ok(h)
}

/// The record a consumed message carries, and why it cannot run if it
/// cannot (the worker dead-letters it with that reason). Never panics: a
/// record whose headers cannot be read (rdkafka panics on a header name
/// that is not UTF-8) is refused with that reason.
pub(super) fn record(m: &BorrowedMessage<'_>) -> Record {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(m))) {
        Ok(record) => record,
        Err(_) => Record {
            envelope: Envelope {
                id: format!("{}-{}-{}", m.topic(), m.partition(), m.offset()),
                handler: String::new(),
                headers: Vec::new(),
                payload: m.payload().unwrap_or_default().to_vec(),
            },
            refused: Some("Kafka record has a header whose name is not UTF-8: Idem cannot read its headers".into()),
            key: m.key().map(<[u8]>::to_vec),
            not_before: None,
        },
    }
}

fn read(m: &BorrowedMessage<'_>) -> Record {
    let mut id = None;
    let mut handler = None;
    let mut not_before = None;
    let mut headers = Vec::new();
    let mut refused = None;
    // What the headers kept cost, and how many there were past the bound:
    // a record's headers are kept only up to MAX_HEADER_BYTES (a record
    // waiting behind its key's earlier ones is held in memory, headers and
    // all), and one whose headers pass it is refused.
    let (mut kept, mut over) = (0usize, 0usize);
    if let Some(hs) = m.headers() {
        for h in hs.iter() {
            let value = || h.value.map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
            match h.key {
                ID => id = Some(value()),
                HANDLER => handler = Some(value()),
                NOT_BEFORE => match due(&value(), crate::now_ms()) {
                    Ok(at) => not_before = Some(at),
                    Err(why) => refused = Some(why),
                },
                name => {
                    // Read (lossily, which may make it longer) only if its
                    // bytes fit; counted as read.
                    let raw = name.len() + h.value.map_or(0, <[u8]>::len) + HEADER_OVERHEAD;
                    if kept + raw > MAX_HEADER_BYTES {
                        over += raw;
                        continue;
                    }
                    let header = (name.to_string(), value());
                    let cost = header_cost(&header);
                    if kept + cost <= MAX_HEADER_BYTES {
                        kept += cost;
                        headers.push(header);
                    } else {
                        over += cost;
                    }
                }
            }
        }
    }
    if over > 0 {
        refused.get_or_insert(format!(
            "Kafka record's headers take {} bytes ({} kept; each counted {HEADER_OVERHEAD} bytes more than its name and value), over the limit of {MAX_HEADER_BYTES} bytes; carry large data in the payload",
            kept + over,
            headers.len()
        ));
    }
    let id = id
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| format!("{}-{}-{}", m.topic(), m.partition(), m.offset()));
    if refused.is_some() {
        // Refused: dead-lettered at once, not held until a stamp it has
        // been refused for.
        not_before = None;
    }
    let handler = handler.unwrap_or_default();
    if handler.is_empty() {
        refused = Some(format!(
            "Kafka record {id:?} has no {HANDLER} header naming the plugin to run (publish with `idem publish`, or set the header)"
        ));
    }
    Record {
        envelope: Envelope {
            id,
            handler,
            headers,
            payload: m.payload().unwrap_or_default().to_vec(),
        },
        refused,
        key: m.key().map(<[u8]>::to_vec),
        not_before,
    }
}

/// The record key of an envelope: the value at the plugin's key pointer
/// (so one entity's messages share a partition and run in order), else the
/// message id.
pub(super) fn key_of(e: &Envelope, pointer: Option<&str>) -> String {
    crate::envelope::derive_key(e, pointer).unwrap_or_else(|_| e.id.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idem_header_names_are_reserved() {
        let mut e = Envelope {
            id: "m1".into(),
            handler: "h".into(),
            headers: vec![("trace".into(), "t1".into())],
            payload: br#"{"account": 42}"#.to_vec(),
        };
        let h = headers(&e, Some(5)).unwrap();
        let names: Vec<&str> = h.iter().map(|h| h.key).collect();
        assert_eq!(names, vec![ID, HANDLER, NOT_BEFORE, "trace"]);
        e.headers.push(("größe".into(), "x".into()));
        assert!(headers(&e, None).is_ok(), "a name that is not ASCII is not Idem's");
        e.headers.push(("IDEM-id".into(), "x".into()));
        let err = headers(&e, None).unwrap_err().to_string();
        assert!(err.contains("IDEM-id") && err.contains("rename"), "{err}");
        assert_eq!(key_of(&e, Some("/account")), "42");
        assert_eq!(key_of(&e, Some("/missing")), "m1");
        assert_eq!(key_of(&e, None), "m1");
    }

    #[test]
    fn a_delay_is_at_most_an_hour_when_published_and_when_read() {
        use std::time::Duration;
        let now = 1_765_000_000_000;
        assert_eq!(stamp(now, Duration::ZERO).unwrap(), None);
        assert_eq!(stamp(now, Duration::from_millis(50)).unwrap(), Some(now + 51));
        let longest = Duration::from_millis(MAX_DELAY_MS as u64);
        let at = stamp(now, longest).unwrap().unwrap();
        let err = stamp(now, longest + Duration::from_millis(1)).unwrap_err().to_string();
        assert!(err.contains("Kafka record may be held"), "{err}");

        // The longest delay is taken, even by a reader whose clock is a
        // little behind the publisher's.
        assert_eq!(due(&at.to_string(), now), Ok(at));
        assert_eq!(due(&at.to_string(), now - crate::broker::CLOCK_SLACK_MS + 1), Ok(at));
        // A stamp far ahead (the end of time, microseconds, a clock a day
        // off) is refused with the header's name and the fix, without
        // overflowing.
        for far in [
            i64::MAX,
            now * 1_000,
            now + 24 * 60 * 60 * 1000,
            at + crate::broker::CLOCK_SLACK_MS + 1,
        ] {
            let why = due(&far.to_string(), now).unwrap_err();
            assert!(why.contains(NOT_BEFORE) && why.contains("unix milliseconds"), "{why}");
        }
        // Past stamps are due at once.
        assert_eq!(due(" 17 ", now), Ok(17));
        assert_eq!(due(&i64::MIN.to_string(), now), Ok(i64::MIN));
        assert!(due("soon", 1_000).unwrap_err().contains("not unix milliseconds"));
    }
}
