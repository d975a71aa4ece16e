//! What travels through the broker, and what a worker derives from it.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A message as a producer publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The producer's id for this logical message. Publishing the same id
    /// twice is a duplicate, not a second message.
    pub id: String,
    /// Name of the plugin that handles it.
    pub handler: String,
    /// Producer-supplied headers.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// The body; handlers usually expect JSON.
    #[serde(with = "payload_json")]
    pub payload: Vec<u8>,
}

/// A payload is written as JSON when it is JSON, as a string otherwise.
pub mod payload_json {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(payload: &[u8], s: S) -> Result<S::Ok, S::Error> {
        match serde_json::from_slice::<serde_json::Value>(payload) {
            Ok(v) => v.serialize(s),
            Err(_) => String::from_utf8_lossy(payload).serialize(s),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(match v {
            serde_json::Value::String(s) => s.into_bytes(),
            other => serde_json::to_vec(&other).map_err(serde::de::Error::custom)?,
        })
    }
}

/// One delivery of an envelope by a broker.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message.
    pub envelope: Envelope,
    /// Opaque handle the broker needs to ack, nack or extend this delivery.
    pub receipt: String,
    /// How many times the broker has delivered it (1 = first).
    pub delivery_count: u32,
    /// Set when the broker could not read the message as one its producers
    /// send (a malformed Celery task, say): the worker dead-letters it with
    /// this reason instead of running it.
    pub refused: Option<String>,
}

/// Hex SHA-256 of a payload: a key reused with a different payload is a
/// conflict, not a duplicate.
pub fn payload_hash(payload: &[u8]) -> String {
    hex::encode(Sha256::digest(payload))
}

/// The stable `Idempotency-Key` sent with every attempt of one external
/// call step: a hash of the deployment's namespace, the endpoint's name, the
/// plugin, the message key and the step. The namespace keeps two
/// deployments (staging and production) that call one API from sharing
/// keys, and so each other's cached answers; the endpoint keeps two APIs
/// behind one step name apart.
pub fn idempotency_key(namespace: &str, endpoint: &str, plugin: &str, key: &str, step: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"idem/v2");
    for part in [namespace, endpoint, plugin, key, step] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(&h.finalize()[..16])
}

/// Most bytes a message's headers may take, names and values together,
/// each header counted [`HEADER_OVERHEAD`] bytes more: they go to the
/// handler, into the claim and into a dead letter with it. A broker that
/// holds records before the worker sees them stops keeping headers past it.
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// What one header costs beyond its name and value (about what it takes in
/// memory), so a million empty headers are not free.
pub const HEADER_OVERHEAD: usize = 32;

/// A header's size as [`MAX_HEADER_BYTES`] counts it.
pub fn header_cost((name, value): &(String, String)) -> usize {
    name.len() + value.len() + HEADER_OVERHEAD
}

/// Longest idempotency key or message id, in bytes. A key is part of the
/// claims' primary key (Postgres refuses index entries much over 2 KB) and
/// is sent to endpoints in the `Idem-Message-Key` header.
pub const MAX_KEY_BYTES: usize = 512;

/// Check an idempotency key or message id (`what` names it in the error):
/// 1 to [`MAX_KEY_BYTES`] bytes of UTF-8 without control characters (no
/// NUL, which Postgres text cannot hold; no line breaks, which HTTP headers
/// cannot carry).
pub fn check_key(what: &str, key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "{what} is {} bytes long, over the limit of {MAX_KEY_BYTES} bytes (starts {:?})",
            key.len(),
            printable(key, 40)
        ));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{what} {:?} contains the control character U+{:04X}; keys and message ids must be printable text",
            printable(key, 80),
            c as u32
        ));
    }
    Ok(())
}

/// `text` with control characters escaped and cut to about `max` bytes: safe
/// to store and show whatever a producer sent.
pub fn printable(text: &str, max: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if out.len() >= max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Derive the idempotency key of a message: the value at `pointer` in the
/// JSON payload, or the message id when no pointer is configured.
pub fn derive_key(envelope: &Envelope, pointer: Option<&str>) -> Result<String, String> {
    let Some(pointer) = pointer else {
        return Ok(envelope.id.clone());
    };
    let value: serde_json::Value = serde_json::from_slice(&envelope.payload)
        .map_err(|e| format!("the plugin derives its key from {pointer} but the payload is not JSON: {e}"))?;
    match value.pointer(pointer) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
        Some(other) => Err(format!(
            "the key at {pointer} must be a non-empty string or a number, found {other}"
        )),
        None => Err(format!(
            "the payload has no value at {pointer}, which this plugin derives its key from"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(payload: &str) -> Envelope {
        Envelope {
            id: "m1".into(),
            handler: "h".into(),
            headers: vec![],
            payload: payload.as_bytes().to_vec(),
        }
    }

    #[test]
    fn key_is_message_id_without_pointer() {
        assert_eq!(derive_key(&env("{}"), None).unwrap(), "m1");
    }

    #[test]
    fn key_from_pointer() {
        assert_eq!(derive_key(&env(r#"{"p":{"id":"x7"}}"#), Some("/p/id")).unwrap(), "x7");
        assert_eq!(derive_key(&env(r#"{"n":42}"#), Some("/n")).unwrap(), "42");
        assert!(derive_key(&env(r#"{"n":null}"#), Some("/n")).unwrap_err().contains("/n"));
        assert!(derive_key(&env("not json"), Some("/n")).unwrap_err().contains("not JSON"));
        assert!(derive_key(&env("{}"), Some("/missing")).unwrap_err().contains("/missing"));
    }

    #[test]
    fn keys_are_bounded_printable_text() {
        assert_eq!(check_key("key", "pay-1"), Ok(()));
        assert_eq!(check_key("key", &"k".repeat(MAX_KEY_BYTES)), Ok(()));
        assert_eq!(check_key("message id", ""), Err("message id is empty".into()));
        let long = check_key("key", &"k".repeat(MAX_KEY_BYTES + 1)).unwrap_err();
        assert!(long.contains("513 bytes long") && long.contains("limit of 512"), "{long}");
        let nul = check_key("key", "a\0b").unwrap_err();
        assert!(nul.contains("U+0000") && nul.contains(r#""a\\u{0}b""#), "{nul}");
        assert!(check_key("key", "a\nb").unwrap_err().contains("U+000A"));
        assert_eq!(check_key("key", "ünïcödé ok"), Ok(()));
    }

    #[test]
    fn printable_escapes_and_cuts() {
        assert_eq!(printable("a\0b", 80), "a\\u{0}b");
        assert_eq!(printable(&"x".repeat(100), 10), format!("{}…", "x".repeat(10)));
    }

    #[test]
    fn idempotency_key_is_stable_and_distinct_per_step() {
        let a = idempotency_key("ns", "api", "p", "k", "charge");
        assert_eq!(a, idempotency_key("ns", "api", "p", "k", "charge"));
        assert_ne!(a, idempotency_key("ns", "api", "p", "k", "email"));
        assert_ne!(a, idempotency_key("ns", "api", "p", "k2", "charge"));
        assert_ne!(
            a,
            idempotency_key("staging", "api", "p", "k", "charge"),
            "namespaces never share keys"
        );
        assert_ne!(a, idempotency_key("ns", "other-api", "p", "k", "charge"), "nor do endpoints");
        assert_ne!(
            idempotency_key("ns", "api", "p", "k\0x", "y"),
            idempotency_key("ns", "api", "p", "k", "x\0y")
        );
        assert_eq!(a.len(), 32);
    }

    #[test]
    fn envelope_json_round_trip_keeps_payload() {
        let e = env(r#"{"a":1}"#);
        let s = serde_json::to_string(&e).unwrap();
        assert!(s.contains(r#""payload":{"a":1}"#));
        assert_eq!(serde_json::from_str::<Envelope>(&s).unwrap(), e);
        let raw = env("plain text");
        let back: Envelope = serde_json::from_str(&serde_json::to_string(&raw).unwrap()).unwrap();
        assert_eq!(back.payload, b"plain text");
    }
}
