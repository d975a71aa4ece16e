//! Wire format: how an envelope travels as an AMQP message (see the module
//! docs of [`super`]), receipts, and error texts.

use lapin::message::Delivery as AmqpDelivery;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;

use crate::broker::BrokerError;
use crate::envelope::{Delivery, Envelope};

const HANDLER_HEADER: &str = "idem-handler";
const DELIVERIES_HEADER: &str = "idem-deliveries";
/// When a message sent through a delay bucket is due, in milliseconds
/// since the epoch on the sender's clock ([`crate::broker::due_at`]).
const NOT_BEFORE_HEADER: &str = "idem-not-before";

/// Headers RabbitMQ adds when it dead-letters a message (here: each time a
/// delay expires). They are the server's, not the producer's, and a copy
/// republished by `nack` must not accumulate them.
const SERVER_HEADERS: [&str; 8] = [
    "x-death",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-first-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-last-death-exchange",
    "x-delivery-count",
];

/// AMQP delivery mode 2: the server writes the message to disk (in a
/// durable queue) before it confirms it.
const PERSISTENT: u8 = 2;

/// The AMQP properties that carry an envelope.
pub(super) fn properties(e: &Envelope) -> Result<BasicProperties, BrokerError> {
    let id = ShortString::try_new(e.id.as_str()).map_err(|_| {
        BrokerError::Unavailable(format!(
            "message id of {} bytes does not fit AMQP's message_id (255 bytes at most): use a shorter id",
            e.id.len()
        ))
    })?;
    let mut headers = FieldTable::default();
    for (name, value) in &e.headers {
        let name = ShortString::try_new(name.as_str()).map_err(|_| {
            BrokerError::Unavailable(format!(
                "header name of {} bytes does not fit an AMQP table (255 bytes at most): use a shorter name",
                name.len()
            ))
        })?;
        headers.insert(name, string_value(value));
    }
    headers.insert(HANDLER_HEADER.into(), string_value(&e.handler));
    Ok(BasicProperties::default()
        .with_message_id(id)
        .with_delivery_mode(PERSISTENT)
        .with_headers(headers))
}

/// The properties of a copy republished by `nack`: the same, with the
/// delivery count it stands for and without the server's dead-letter trail.
pub(crate) fn copy_properties(properties: BasicProperties, deliveries: u32) -> BasicProperties {
    let mut headers = FieldTable::default();
    if let Some(old) = properties.headers() {
        for (name, value) in old {
            if !SERVER_HEADERS.contains(&name.as_str()) {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
    headers.insert(DELIVERIES_HEADER.into(), AMQPValue::LongUInt(deliveries));
    properties.with_headers(headers).with_delivery_mode(PERSISTENT)
}

/// `properties` for a message sent now with `delay` (through a delay
/// bucket), stamped with when it is due. RabbitMQ's expiry timers can run
/// ahead of the real time by a fraction of the delay (seen: 6 ms early
/// on a 1 s bucket), so the consumer holds a message that arrives before
/// its stamp until then. Without a delay, `properties` as they are.
pub(super) fn with_not_before(properties: BasicProperties, delay: std::time::Duration) -> BasicProperties {
    if delay.is_zero() {
        return properties;
    }
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(
        NOT_BEFORE_HEADER.into(),
        AMQPValue::LongLongInt(crate::broker::due_at(crate::now_ms(), delay)),
    );
    properties.with_headers(headers)
}

/// When a delivery is due, if it came through a delay bucket.
pub(super) fn not_before(properties: &BasicProperties) -> Option<i64> {
    match properties.headers().as_ref()?.inner().get(NOT_BEFORE_HEADER)? {
        AMQPValue::LongLongInt(at) => Some(*at),
        other => value_string(other).parse().ok(),
    }
}

/// The most a delivery is held for its stamp. An expiry timer running
/// ahead is early by a small part of its delay; a stamp further ahead is
/// something else (a clock far off, or a producer's own header), and
/// holding the queue behind it would stall the worker: such a delivery is
/// handed out as it is.
pub(super) const MAX_HOLD_MS: i64 = 1_000;

/// How many of the first `max` deliveries (in arrival order) may be handed
/// out at `now`: those up to the first that is not due yet. One not due
/// holds back everything behind it, so the deliveries handed out are
/// always the oldest unacked ones (which a `multiple` ack relies on).
pub(super) fn due_prefix<'a>(arrived: impl Iterator<Item = &'a BasicProperties>, max: usize, now: i64) -> usize {
    arrived.take(max).take_while(|p| !held_back(p, now)).count()
}

/// Whether a delivery is stamped to be due after `now`, by no more than
/// [`MAX_HOLD_MS`].
pub(super) fn held_back(properties: &BasicProperties, now: i64) -> bool {
    not_before(properties).is_some_and(|at| at > now && at - now <= MAX_HOLD_MS)
}

/// A delivery as [`AmqpBroker::take_with`](super::AmqpBroker::take_with) shows it to its conversion.
pub(crate) struct Incoming<'a> {
    /// `{epoch}.{delivery tag}`.
    pub(crate) receipt: String,
    /// 1, or more for a redelivery (see the module documentation).
    pub(crate) deliveries: u32,
    pub(crate) properties: &'a BasicProperties,
    pub(crate) body: &'a [u8],
}

/// What `nack` needs to republish a delivery it has not acked yet.
pub(super) struct Held {
    pub(super) properties: BasicProperties,
    pub(super) body: Vec<u8>,
    pub(super) deliveries: u32,
    /// The index of the queue it came from (a delayed copy goes back there).
    pub(super) queue: usize,
    /// An ack or nack of this tag is under way: a second one would be an
    /// AMQP error that closes the channel, and a `multiple` ack must not
    /// cover it.
    pub(super) settling: bool,
}

/// How many times a delivery was delivered, as far as AMQP tells: 1, 2 if
/// the server redelivered it, or the count a republished copy carries.
pub(super) fn delivery_count(d: &AmqpDelivery) -> u32 {
    let counted = d
        .properties
        .headers()
        .as_ref()
        .and_then(|t| t.inner().get(DELIVERIES_HEADER))
        .map_or(0, |v| value_string(v).parse().unwrap_or(0));
    (if d.redelivered { 2 } else { 1 }).max(counted)
}

/// An AMQP delivery as Idem's [`Delivery`]. Never fails: a delivery
/// without Idem's headers becomes one with an empty handler (or id), which
/// the worker dead-letters as bad input.
pub(super) fn convert(d: Incoming<'_>) -> Delivery {
    let mut handler = String::new();
    let mut headers = Vec::new();
    if let Some(table) = d.properties.headers() {
        for (name, value) in table {
            match name.as_str() {
                HANDLER_HEADER => handler = value_string(value),
                n if n.starts_with("idem-") || SERVER_HEADERS.contains(&n) => {}
                n => headers.push((n.to_string(), value_string(value))),
            }
        }
    }
    let id = d.properties.message_id().as_ref().map(|s| s.to_string()).unwrap_or_default();
    Delivery {
        envelope: Envelope {
            id,
            handler,
            headers,
            payload: d.body.to_vec(),
        },
        receipt: d.receipt,
        delivery_count: d.deliveries,
        refused: None,
    }
}

pub(super) fn string_value(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A header value as a string, whatever type a foreign producer gave it.
pub(crate) fn value_string(v: &AMQPValue) -> String {
    match v {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.to_string(),
        AMQPValue::ByteArray(b) => String::from_utf8_lossy(b.as_slice()).into_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        AMQPValue::Void => String::new(),
        other => format!("{other:?}"),
    }
}

pub(super) fn parse_receipt(receipt: &str) -> Result<(u64, u64), BrokerError> {
    let malformed = || BrokerError::Unavailable(format!("malformed receipt {receipt:?}"));
    let (epoch, tag) = receipt.split_once('.').ok_or_else(malformed)?;
    Ok((epoch.parse().map_err(|_| malformed())?, tag.parse().map_err(|_| malformed())?))
}

pub(super) fn unavailable(what: &str, e: lapin::Error) -> BrokerError {
    BrokerError::Unavailable(format!("RabbitMQ {what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_parse() {
        assert_eq!(parse_receipt("3.17").unwrap(), (3, 17));
        assert!(parse_receipt("17").is_err());
        assert!(parse_receipt("a.b").is_err());
    }

    #[test]
    fn a_delivery_out_of_its_delay_bucket_early_holds_back_what_follows_it() {
        let plain = BasicProperties::default();
        let delayed = with_not_before(BasicProperties::default(), std::time::Duration::from_millis(1_000));
        let at = not_before(&delayed).expect("stamped");
        let now = crate::now_ms();
        assert!(
            at > now + 999 && at <= now + 1_002,
            "due a second from now, rounded up: {at} vs {now}"
        );
        assert_eq!(
            not_before(&with_not_before(plain.clone(), std::time::Duration::ZERO)),
            None,
            "no delay, no stamp"
        );
        let arrived = [plain.clone(), plain.clone(), delayed.clone(), plain.clone()];
        assert_eq!(
            due_prefix(arrived.iter(), 10, at - 6),
            2,
            "the early one and everything behind it wait"
        );
        assert_eq!(due_prefix(arrived.iter(), 10, at), 4, "due at its stamp");
        assert_eq!(due_prefix(arrived.iter(), 1, at - 6), 1, "never more than asked");
        assert_eq!(due_prefix([delayed.clone()].iter(), 10, at - 1), 0);
        assert_eq!(
            due_prefix([delayed].iter(), 10, at - MAX_HOLD_MS - 1),
            1,
            "a stamp further ahead than any timer runs early is not held"
        );
        // A copy republished with another delay carries the new stamp.
        let again = with_not_before(copy_properties(plain, 2), std::time::Duration::from_millis(50));
        assert!(not_before(&again).expect("stamped") < at);
    }

    /// A short string of 128 bytes that are not UTF-8 is read lossily and
    /// cut to a short string's 255 bytes (each replaced byte takes three:
    /// uncut, `ShortString::from` panicked on lapin's I/O thread).
    #[test]
    fn a_short_string_read_lossily_stays_short() {
        use lapin::types::parsing::parse_short_string;
        let mut wire = vec![128u8];
        wire.extend([0xffu8; 128]);
        let (rest, text) = parse_short_string(&wire[..]).expect("parsed");
        assert!(rest.is_empty());
        assert_eq!(text.as_str(), "\u{fffd}".repeat(85));
    }

    /// A header table nested 20,000 deep (it fits in one frame) is read on a
    /// 2 MiB stack, as lapin's I/O thread has, its depth cut at 32 levels.
    /// Before, the parse recursed once a level and overflowed the stack,
    /// aborting the process (see vendor/README.md).
    #[test]
    fn a_header_table_nested_without_end_is_read_cut_short() {
        use lapin::types::parsing::parse_field_table;
        // From the outside in: each table is its length, then one entry,
        // `k` holding the next table; the innermost is empty.
        let levels = 20_000u32;
        let mut table = Vec::new();
        for level in 0..levels {
            table.extend((7 * (levels - level)).to_be_bytes());
            table.extend([1, b'k', b'F']);
        }
        table.extend([0, 0, 0, 0]);
        let depth = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let (rest, parsed) = parse_field_table(&table[..]).expect("parsed");
                assert!(rest.is_empty());
                let mut depth = 0;
                let mut t = &parsed;
                while let Some(AMQPValue::FieldTable(inner)) = t.inner().get("k") {
                    depth += 1;
                    t = inner;
                }
                depth
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(depth, 32, "32 levels read, the rest read as empty");
    }
}
