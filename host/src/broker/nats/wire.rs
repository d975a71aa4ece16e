//! Wire format: the body is the payload, the envelope's id and handler and
//! the producer's headers travel as NATS headers.

use async_nats::{HeaderMap, HeaderName, HeaderValue};

use crate::broker::BrokerError;
use crate::envelope::Envelope;

/// Header carrying the envelope id.
const ID_HEADER: &str = "Idem-Id";
/// Header carrying the handler name.
const HANDLER_HEADER: &str = "Idem-Handler";
/// Header carrying the earliest delivery time (unix ms) of a delayed publish.
pub(super) const NOT_BEFORE_HEADER: &str = "Idem-Not-Before";
/// The longest delay a NATS message is held for: a delayed message waits in
/// the consumer's ack-pending set until due, so a stamp further ahead (one
/// in microseconds, the end of time) would hold a slot there for good.
pub(super) const MAX_DELAY_MS: i64 = 7 * 24 * 60 * 60 * 1000;

const HELD: &str = "a JetStream message is held in the consumer's ack-pending set until due, so Idem takes delays of at most 7 days";

/// A delayed publish's stamp, or the reason a delay that long is refused.
pub(super) fn stamp(now: i64, delay: std::time::Duration) -> Result<Option<i64>, BrokerError> {
    crate::broker::stamp(
        now,
        delay,
        MAX_DELAY_MS,
        "a JetStream message may be held (in the consumer's ack-pending set)",
    )
}

/// A delivered message's `Idem-Not-Before`, checked against this worker's
/// clock: when it is due (`None` without the header), or why it is refused.
pub(super) fn due(msg: &async_nats::Message, now: i64) -> Result<Option<i64>, String> {
    header(&msg.headers, NOT_BEFORE_HEADER)
        .map(|v| crate::broker::read_not_before(NOT_BEFORE_HEADER, &v, now, MAX_DELAY_MS, HELD))
        .transpose()
}

/// JetStream's own dedupe id: read as the envelope id of messages published
/// by other tools, never written.
const NATS_MSG_ID: &str = "Nats-Msg-Id";

/// Build the wire headers of one envelope.
pub(super) fn wire_headers(e: &Envelope, not_before: Option<i64>) -> Result<HeaderMap, BrokerError> {
    let bad = |what: &str, why: &str| BrokerError::Unavailable(format!("message {:?}: {what} cannot travel as a NATS header: {why}", e.id));
    let value = |what: &str, v: &str| v.parse::<HeaderValue>().map_err(|_| bad(what, "it contains a line break"));
    let mut h = HeaderMap::new();
    h.insert(ID_HEADER, value("the id", &e.id)?);
    h.insert(HANDLER_HEADER, value("the handler name", &e.handler)?);
    if let Some(at) = not_before {
        h.insert(NOT_BEFORE_HEADER, HeaderValue::from(at));
    }
    for (name, v) in &e.headers {
        if is_reserved(name) {
            return Err(bad(
                &format!("header {name:?}"),
                "Idem-Id, Idem-Handler, Idem-Not-Before and Nats-* are reserved (Nats-* headers change how JetStream stores the message)",
            ));
        }
        let n = name
            .parse::<HeaderName>()
            .map_err(|_| bad(&format!("header name {name:?}"), "names are printable ASCII without spaces or ':'"))?;
        h.append(n, value(&format!("the value of header {name:?}"), v)?);
    }
    Ok(h)
}

/// The envelope a delivered message carries. Missing Idem headers yield
/// empty fields rather than an error, so the worker dead-letters the message
/// as bad input instead of fetching failing forever.
pub(super) fn envelope(msg: &async_nats::Message) -> Envelope {
    let id = header(&msg.headers, ID_HEADER)
        .or_else(|| header(&msg.headers, NATS_MSG_ID))
        .unwrap_or_default();
    let handler = header(&msg.headers, HANDLER_HEADER).unwrap_or_default();
    let mut headers: Vec<(String, String)> = Vec::new();
    if let Some(map) = &msg.headers {
        for (name, values) in map.iter() {
            let name = name.to_string();
            if is_reserved(&name) {
                continue;
            }
            headers.extend(values.iter().map(|v| (name.clone(), v.as_str().to_string())));
        }
    }
    // NATS keeps headers in a hash map: sort by name for a stable order
    // (values of one name keep theirs).
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    Envelope {
        id,
        handler,
        headers,
        payload: msg.payload.to_vec(),
    }
}

/// The first value of header `name`, matched case-insensitively (other
/// producers may not spell Idem's headers exactly).
pub(super) fn header(headers: &Option<HeaderMap>, name: &str) -> Option<String> {
    let map = headers.as_ref()?;
    map.iter()
        .find(|(n, _)| n.to_string().eq_ignore_ascii_case(name))
        .and_then(|(_, values)| values.first())
        .map(|v| v.as_str().to_string())
}

/// Headers that are not the producer's: Idem's own, and `Nats-*`, which
/// steer JetStream itself.
fn is_reserved(name: &str) -> bool {
    [ID_HEADER, HANDLER_HEADER, NOT_BEFORE_HEADER]
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
        || name.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("nats-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_headers() {
        assert!(is_reserved("idem-id"));
        assert!(is_reserved("Nats-Msg-Id"));
        assert!(is_reserved("NATS-TTL"));
        assert!(!is_reserved("traceparent"));
        assert!(!is_reserved("Nat"));
    }
}
