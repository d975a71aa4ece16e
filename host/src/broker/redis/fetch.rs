//! Taking deliveries: due delayed entries are promoted into the stream,
//! then the fetch script reads new entries and, about once a second,
//! claims expired ones and trims settled entries.

use std::time::{Duration, Instant};

use redis::Value;

use super::{RedisBroker, CLAIM_HORIZON, GROUP};
use crate::broker::BrokerError;
use crate::envelope::{Delivery, Envelope};
use crate::now_ms;

/// Most delayed entries moved into the stream per fetch: the move is one
/// script, and Redis serves nobody else while it runs.
const PROMOTE_LIMIT: usize = 1_000;

/// Longest time between two scans of the pending list for expired
/// deliveries (and trims of settled entries). Each scan walks the stream for
/// every pending delivery it looks at, so it is not done on every fetch; an
/// expired delivery waits at most this long (or a quarter of the
/// visibility, if that is shorter) past its visibility to be taken.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// Where the scan of the pending list is.
pub(super) struct Scan {
    /// Where the last `XAUTOCLAIM` stopped; the next scan resumes there so
    /// every pending entry is looked at in turn.
    cursor: String,
    /// When the next scan is due.
    due: Instant,
}

impl Scan {
    pub(super) fn new() -> Self {
        Scan {
            cursor: "0-0".into(),
            due: Instant::now(),
        }
    }
}

impl RedisBroker {
    /// Move due delayed entries into the stream, then take what is there.
    pub(super) async fn take(&self, max: usize, visibility: Duration) -> Result<Taken, BrokerError> {
        let now = now_ms();
        let (scan, cursor) = {
            let s = self.scan.lock().expect("scan lock poisoned");
            (Instant::now() >= s.due, s.cursor.clone())
        };
        let idle = CLAIM_HORIZON.saturating_sub(visibility);
        let mut promote = self.scripts.promote.key(&self.delayed);
        promote.key(&self.stream).arg(now).arg(PROMOTE_LIMIT);
        let mut fetch = self.scripts.fetch.key(&self.stream);
        fetch
            .arg(GROUP)
            .arg(&self.consumer)
            .arg(max)
            .arg(CLAIM_HORIZON.as_millis() as u64)
            .arg(idle.as_millis() as u64)
            .arg(&cursor)
            .arg(if scan { "1" } else { "0" });
        // One round trip: the promotion is its own script so that it stays
        // atomic on its own, whatever the fetch does after it.
        let mut pipe = redis::pipe();
        pipe.invoke_script(&promote).ignore().invoke_script(&fetch);
        let (reply,): (Value,) = self.query(&pipe).await?;
        let taken = parse_taken(reply)?;
        if scan {
            let mut s = self.scan.lock().expect("scan lock poisoned");
            // A scan that stopped inside the pending list goes on at the next
            // fetch; one that reached its end waits.
            s.due = if taken.cursor == "0-0" {
                Instant::now() + SCAN_EVERY.min(visibility / 4)
            } else {
                Instant::now()
            };
            s.cursor = taken.cursor.clone();
        }
        Ok(taken)
    }
}

/// What one run of the fetch script returned.
pub(super) struct Taken {
    cursor: String,
    /// The stream's last entry id, set when nothing was taken.
    pub(super) last: String,
    pub(super) deliveries: Vec<Delivery>,
}

fn bad_reply(what: &str, v: &Value) -> BrokerError {
    BrokerError::Unavailable(format!("unexpected reply from Redis ({what}): {v:?}"))
}

fn bytes(v: Value) -> Result<Vec<u8>, BrokerError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        Value::Int(i) => Ok(i.to_string().into_bytes()),
        Value::Okay => Ok(b"OK".to_vec()),
        other => Err(bad_reply("expected a string", &other)),
    }
}

fn text(v: Value) -> Result<String, BrokerError> {
    Ok(String::from_utf8_lossy(&bytes(v)?).into_owned())
}

fn array(v: Value, what: &str) -> Result<Vec<Value>, BrokerError> {
    match v {
        Value::Array(items) => Ok(items),
        // A Lua script's empty table.
        Value::Nil => Ok(Vec::new()),
        other => Err(bad_reply(what, &other)),
    }
}

fn parse_taken(reply: Value) -> Result<Taken, BrokerError> {
    let mut parts = array(reply, "fetch script").map(Vec::into_iter)?;
    let (Some(cursor), Some(last), Some(entries)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(BrokerError::Unavailable("the fetch script returned too few values".into()));
    };
    let mut deliveries = Vec::new();
    for entry in array(entries, "fetch script entries")? {
        let mut e = array(entry, "fetch script entry")?.into_iter();
        let (Some(id), Some(count), Some(fields)) = (e.next(), e.next(), e.next()) else {
            return Err(BrokerError::Unavailable("the fetch script returned an incomplete entry".into()));
        };
        let id = text(id)?;
        let count: u64 = text(count)?.parse().unwrap_or(1);
        deliveries.push(delivery(&id, count, array(fields, "entry fields")?)?);
    }
    Ok(Taken {
        cursor: text(cursor)?,
        last: text(last)?,
        deliveries,
    })
}

/// One stream entry as a delivery. Missing or malformed fields become
/// empty values, never an error: an entry that cannot be read must still
/// reach the worker, which dead-letters it, or it would be fetched forever.
fn delivery(entry_id: &str, count: u64, fields: Vec<Value>) -> Result<Delivery, BrokerError> {
    let mut envelope = Envelope {
        id: String::new(),
        handler: String::new(),
        headers: Vec::new(),
        payload: Vec::new(),
    };
    let mut delivered: u64 = 0;
    let mut fields = fields.into_iter();
    while let (Some(k), Some(v)) = (fields.next(), fields.next()) {
        let v = bytes(v)?;
        match bytes(k)?.as_slice() {
            b"id" => envelope.id = String::from_utf8_lossy(&v).into_owned(),
            b"handler" => envelope.handler = String::from_utf8_lossy(&v).into_owned(),
            b"headers" => {
                envelope.headers = serde_json::from_slice(&v).unwrap_or_else(|e| {
                    tracing::warn!(entry = entry_id, error = %e, "stream entry has malformed headers (want a JSON array of [key, value]); ignoring them");
                    Vec::new()
                })
            }
            b"payload" => envelope.payload = v,
            b"delivered" => delivered = std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
            _ => {}
        }
    }
    Ok(Delivery {
        envelope,
        receipt: format!("{entry_id}/{count}"),
        delivery_count: (delivered + count).min(u32::MAX as u64) as u32,
        refused: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_missing_fields_still_deliver() {
        let d = delivery(
            "1-0",
            1,
            vec![Value::BulkString(b"junk".to_vec()), Value::BulkString(b"1".to_vec())],
        )
        .unwrap();
        assert_eq!(d.envelope.handler, "");
        assert_eq!(d.receipt, "1-0/1");
        assert_eq!(d.delivery_count, 1);
    }
}
