//! Wire format: the message body is the payload (base64 when it is not
//! text SQS can carry), and message attributes carry the envelope's id,
//! handler and headers.
//!
//! Attributes (all of type `String`):
//! - `Idem-Id`, `Idem-Handler`: the envelope's id and handler;
//! - `Idem-Headers`: the producer's headers as a JSON array of
//!   `[name, value]` pairs (SQS allows ten attributes a message and no
//!   empty values, so headers travel together, in order, empty values and
//!   repeated names included);
//! - `Idem-Body`: `base64` when the body is the base64 of the payload;
//! - `Idem-Not-Before`: unix ms, on a publish delayed past what SQS can
//!   delay (15 minutes), or on any delayed publish to a FIFO queue.
//!
//! Errors: a batch entry whose receipt handle SQS no longer accepts is a
//! fenced-out delivery, not a failure.
//!
//! A message from another producer is read too: without `Idem-Id` its id is
//! SQS's `MessageId`; its other `String` attributes are its headers.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use base64::Engine;

use crate::broker::BrokerError;
use crate::envelope::Envelope;

pub(super) const ID: &str = "Idem-Id";
pub(super) const HANDLER: &str = "Idem-Handler";
pub(super) const HEADERS: &str = "Idem-Headers";
pub(super) const BODY: &str = "Idem-Body";
pub(super) const NOT_BEFORE: &str = "Idem-Not-Before";

/// The longest a message may stay invisible: a visibility asked for, and
/// its total counted from the message's receive.
pub(super) const MAX_VISIBILITY_SECS: i64 = 43_200;

/// The longest a group or deduplication id may be.
const MAX_ID: usize = 128;

/// The attributes of one envelope.
pub(super) fn attributes(e: &Envelope, not_before: Option<i64>) -> Result<HashMap<String, MessageAttributeValue>, BrokerError> {
    let mut out = HashMap::new();
    let mut put = |name: &str, value: String| -> Result<(), BrokerError> {
        let v = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .map_err(|err| BrokerError::Unavailable(format!("SQS: message {:?}: attribute {name}: {err}", e.id)))?;
        out.insert(name.to_string(), v);
        Ok(())
    };
    if e.id.is_empty() || e.handler.is_empty() {
        return Err(BrokerError::Unavailable(format!(
            "SQS: message {:?} needs a non-empty id and handler (SQS refuses empty attribute values)",
            e.id
        )));
    }
    put(ID, e.id.clone())?;
    put(HANDLER, e.handler.clone())?;
    if !e.headers.is_empty() {
        put(HEADERS, serde_json::to_string(&e.headers).expect("headers serialise"))?;
    }
    if body_text(&e.payload).is_none() {
        put(BODY, "base64".into())?;
    }
    if let Some(at) = not_before {
        put(NOT_BEFORE, at.to_string())?;
    }
    Ok(out)
}

/// The body of an envelope: its payload when SQS can carry it as it is
/// (UTF-8 without the characters XML 1.0 excludes), else its base64.
pub(super) fn body(payload: &[u8]) -> String {
    match body_text(payload) {
        Some(text) => text.to_string(),
        None => base64::engine::general_purpose::STANDARD.encode(payload),
    }
}

fn body_text(payload: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(payload).ok()?;
    let allowed = |c: char| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..);
    // SQS also needs a non-empty body.
    (!text.is_empty() && text.chars().all(allowed)).then_some(text)
}

/// The envelope a received message carries, or why it cannot be read (the
/// worker dead-letters it with that reason).
pub(super) fn envelope(m: &Message) -> (Envelope, Option<String>) {
    let attrs = m.message_attributes();
    let text = |name: &str| attrs.and_then(|a| a.get(name)).and_then(|v| v.string_value()).map(str::to_string);
    let mut refused = None;
    let id = text(ID).or_else(|| m.message_id().map(str::to_string)).unwrap_or_default();
    let handler = text(HANDLER).unwrap_or_default();
    if handler.is_empty() {
        refused = Some(format!(
            "SQS message {id:?} has no {HANDLER} attribute naming the plugin to run (publish with `idem publish`, or set the attribute)"
        ));
    }
    let mut headers: Vec<(String, String)> = Vec::new();
    match text(HEADERS) {
        Some(json) => match serde_json::from_str(&json) {
            Ok(h) => headers = h,
            Err(err) => refused = Some(format!("attribute {HEADERS} is not a JSON array of [name, value] pairs: {err}")),
        },
        None => {
            // Another producer's attributes are its headers.
            if let Some(a) = attrs {
                headers = a
                    .iter()
                    .filter(|(name, _)| !name.starts_with("Idem-"))
                    .filter_map(|(name, v)| Some((name.clone(), v.string_value()?.to_string())))
                    .collect();
                headers.sort();
            }
        }
    }
    let raw = m.body().unwrap_or_default();
    let payload = if text(BODY).as_deref() == Some("base64") {
        match base64::engine::general_purpose::STANDARD.decode(raw) {
            Ok(p) => p,
            Err(err) => {
                refused = Some(format!("attribute {BODY} says base64 but the body is not: {err}"));
                raw.as_bytes().to_vec()
            }
        }
    } else {
        raw.as_bytes().to_vec()
    };
    (
        Envelope {
            id,
            handler,
            headers,
            payload,
        },
        refused,
    )
}

/// `Idem-Not-Before` of a received message: when it is due (`None`
/// without the attribute), or why it is refused: not a time, or more than
/// `max_delay_ms` (what the queue keeps a message for, less an hour) after
/// `now`, where it would be deferred at every receive until SQS deleted it.
pub(super) fn not_before(m: &Message, now: i64, max_delay_ms: i64) -> Option<Result<i64, String>> {
    let value = m.message_attributes()?.get(NOT_BEFORE)?.string_value()?;
    Some(crate::broker::read_not_before(NOT_BEFORE, value, now, max_delay_ms, HELD))
}

/// What holding a message costs on SQS, for a refused stamp's reason.
const HELD: &str = "an SQS queue deletes a message once its MessageRetentionPeriod has passed, due or not";

/// How many times SQS has handed the message out (`ApproximateReceiveCount`).
pub(super) fn receive_count(m: &Message) -> u32 {
    m.attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// The FIFO message group of a received message.
pub(super) fn group(m: &Message) -> String {
    m.attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
        .cloned()
        .unwrap_or_default()
}

/// A group or deduplication id SQS accepts: `text` itself when it is 1 to
/// 128 printable ASCII characters without spaces, else the hex SHA-256 of
/// it (stable, so equal inputs still meet).
pub(super) fn fifo_id(text: &str) -> String {
    let fits = !text.is_empty() && text.len() <= MAX_ID && text.bytes().all(|b| b.is_ascii_graphic());
    if fits {
        text.to_string()
    } else {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(text.as_bytes()))
    }
}

/// The message group of an envelope on a FIFO queue: the value at `pointer`
/// in its JSON payload (a string or number), else its id.
pub(super) fn group_of(e: &Envelope, pointer: Option<&str>) -> String {
    let key = pointer.and_then(|p| crate::envelope::derive_key(e, Some(p)).ok());
    fifo_id(key.as_deref().unwrap_or(&e.id))
}

/// Whether an error (code and message) means the receipt handle is no
/// longer valid: the delivery was fenced out (its visibility ran out and
/// the message went to another consumer, or it was deleted). SQS answers
/// an expired handle with `InvalidParameterValue` naming the receipt
/// handle, and uses the same code for other values it refuses (a
/// visibility past 12 hours from the receive): those are failures.
pub(super) fn fenced_out(code: &str, message: &str) -> bool {
    let names_the_handle = message.contains("ReceiptHandle") || message.to_ascii_lowercase().contains("receipt handle");
    ["ReceiptHandleIsInvalid", "MessageNotInflight"].iter().any(|c| code.contains(c))
        || (code.contains("InvalidParameterValue") && names_the_handle)
}

/// Fail on a batch entry's failure, except fenced-out deliveries.
pub(super) fn check_entries(failed: &[aws_sdk_sqs::types::BatchResultErrorEntry], what: &str) -> Result<(), BrokerError> {
    for f in failed {
        if fenced_out(f.code(), f.message().unwrap_or_default()) {
            tracing::debug!(code = f.code(), "a delivery was fenced out (its receipt handle expired)");
            continue;
        }
        return Err(BrokerError::Unavailable(format!(
            "SQS: {what}: {} {}",
            f.code(),
            f.message().unwrap_or_default()
        )));
    }
    Ok(())
}

pub(super) fn unavailable<E: ProvideErrorMetadata + std::error::Error + 'static>(what: &str, e: SdkError<E>) -> BrokerError {
    BrokerError::Unavailable(format!("SQS: {what}: {}", DisplayErrorContext(&e)))
}

/// A duration in SQS's whole seconds, rounded up, at most 12 hours.
pub(super) fn secs(d: Duration) -> i32 {
    (d.as_millis().div_ceil(1000) as u64).min(MAX_VISIBILITY_SECS as u64) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_that_sqs_cannot_carry_travel_as_base64() {
        assert_eq!(body(b"{\"a\":1}"), "{\"a\":1}");
        assert!(body_text(b"").is_none(), "SQS refuses an empty body");
        assert!(body_text(b"a\0b").is_none(), "NUL is not XML text");
        assert!(body_text(&[0xff, 0xfe]).is_none(), "not UTF-8");
        assert_eq!(body(&[0xff]), "/w==");
    }

    #[test]
    fn only_errors_about_the_receipt_handle_are_fenced_out() {
        assert!(fenced_out("ReceiptHandleIsInvalid", ""));
        assert!(fenced_out("AWS.SimpleQueueService.MessageNotInflight", ""));
        assert!(fenced_out(
            "InvalidParameterValue",
            "Value AQEB... for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."
        ));
        assert!(!fenced_out(
            "InvalidParameterValue",
            "Value 43200 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the message is beyond the limit [43200 seconds]"
        ));
        assert!(!fenced_out("AccessDenied", "receipt"));
    }

    #[test]
    fn fifo_ids_are_kept_when_sqs_takes_them_and_hashed_when_not() {
        assert_eq!(fifo_id("order-7:a"), "order-7:a");
        for bad in ["has space", "", "é", &"x".repeat(129)] {
            let id = fifo_id(bad);
            assert_eq!(id.len(), 64, "{bad:?}");
            assert_eq!(id, fifo_id(bad), "stable");
        }
        let e = Envelope {
            id: "m1".into(),
            handler: "h".into(),
            headers: vec![],
            payload: br#"{"account": 42}"#.to_vec(),
        };
        assert_eq!(group_of(&e, Some("/account")), "42");
        assert_eq!(group_of(&e, Some("/missing")), "m1", "no value there: the id");
        assert_eq!(group_of(&e, None), "m1");
    }

    #[test]
    fn durations_are_whole_seconds_rounded_up_and_bounded() {
        assert_eq!(secs(Duration::ZERO), 0);
        assert_eq!(secs(Duration::from_millis(1)), 1);
        assert_eq!(secs(Duration::from_millis(1_000)), 1);
        assert_eq!(secs(Duration::from_millis(1_001)), 2);
        assert_eq!(secs(Duration::from_secs(86_400)), 43_200);
    }
}
