//! What one broker instance remembers of its deliveries: the newest
//! receipt per message (to recognise stale receipts), and on a FIFO queue
//! which message groups have a delivery with the worker and which
//! deliveries wait behind it.
//!
//! FIFO order: SQS hands out several messages of one group in one receive,
//! in order, and no more of that group until they are deleted or visible
//! again. Run at once, they would finish out of order, and a retried first
//! message would come back after its successors had run. So a group has
//! at most one delivery with the worker; the others received with it wait
//! here, in order, still invisible to other consumers (the heartbeat's
//! extends cover them), and the next one goes out when the one before is
//! acked. When it is given back instead (a retry), the waiting ones are
//! given back too, and SQS delivers the group again from its first
//! message.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use super::wire::MAX_VISIBILITY_SECS;
use crate::envelope::Delivery;

/// Deliveries remembered for stale-receipt detection; the oldest are
/// forgotten first (their receipts are then treated as current).
const NEWEST_CAPACITY: usize = 100_000;

/// A receipt as this broker writes it: `<seq> <received> <message id>
/// <handle>`, `received` the unix ms at which it was received.
pub(super) struct Receipt<'a> {
    pub seq: u64,
    pub received: i64,
    pub message_id: &'a str,
    pub handle: &'a str,
}

impl<'a> Receipt<'a> {
    pub fn parse(text: &'a str) -> Option<Receipt<'a>> {
        let mut parts = text.splitn(4, ' ');
        let seq = parts.next()?.parse().ok()?;
        let received = parts.next()?.parse().ok()?;
        let message_id = parts.next()?;
        let handle = parts.next()?;
        Some(Receipt {
            seq,
            received,
            message_id,
            handle,
        })
    }

    /// The longest visibility SQS takes for this delivery at `now`: a
    /// message's visibility may not reach past 12 hours from its receive
    /// (SQS refuses the change, with the same error code as a stale
    /// receipt), less [`TOTAL_VISIBILITY_SLACK_SECS`] for the time between
    /// SQS's receive and this worker's reading of its clock.
    pub fn visibility_left(&self, now: i64) -> i32 {
        let elapsed = now.saturating_sub(self.received).max(0) / 1000;
        (MAX_VISIBILITY_SECS - TOTAL_VISIBILITY_SLACK_SECS - elapsed).clamp(0, MAX_VISIBILITY_SECS) as i32
    }
}

/// Kept off that bound: the receive is SQS's, the clock the worker's.
pub(super) const TOTAL_VISIBILITY_SLACK_SECS: i64 = 60;

#[derive(Default)]
pub(super) struct Track {
    next: u64,
    /// Message id → seq of its newest delivery.
    newest: HashMap<String, u64>,
    /// Seq → message id, oldest first, to bound `newest`.
    order: BTreeMap<u64, String>,
    /// FIFO: seq of a delivery with the worker → its group.
    out: HashMap<u64, String>,
    /// FIFO: groups with a delivery out.
    active: HashSet<String>,
    /// FIFO: deliveries received behind a group's delivery, in order.
    held: HashMap<String, VecDeque<Delivery>>,
}

impl Track {
    /// A receipt for a new delivery of `message_id`, received at `now`,
    /// now its newest.
    pub fn receipt(&mut self, message_id: &str, handle: &str, now: i64) -> String {
        self.next += 1;
        let seq = self.next;
        if let Some(old) = self.newest.insert(message_id.to_string(), seq) {
            self.order.remove(&old);
        }
        self.order.insert(seq, message_id.to_string());
        while self.order.len() > NEWEST_CAPACITY {
            if let Some((_, id)) = self.order.pop_first() {
                self.newest.remove(&id);
            }
        }
        format!("{seq} {now} {message_id} {handle}")
    }

    /// Whether a newer delivery of the same message was handed out since.
    pub fn is_stale(&self, r: &Receipt<'_>) -> bool {
        self.newest.get(r.message_id).is_some_and(|&newest| newest != r.seq)
    }

    /// The message was acked: forget it.
    pub fn forget(&mut self, r: &Receipt<'_>) {
        if self.newest.get(r.message_id) == Some(&r.seq) {
            self.newest.remove(r.message_id);
            self.order.remove(&r.seq);
        }
    }

    /// FIFO: whether a delivery of `group` may go to the worker now; if so
    /// it is recorded as the group's delivery out.
    pub fn admit(&mut self, group: &str, seq: u64) -> bool {
        let waiting = self.active.contains(group) || self.held.get(group).is_some_and(|q| !q.is_empty());
        if waiting {
            return false;
        }
        self.active.insert(group.to_string());
        self.out.insert(seq, group.to_string());
        true
    }

    /// FIFO: keep `d` behind its group's delivery out. A message received
    /// again while it waits (its visibility ran out) replaces its copy.
    pub fn hold(&mut self, group: &str, d: Delivery) {
        let queue = self.held.entry(group.to_string()).or_default();
        match queue.iter_mut().find(|h| h.envelope.id == d.envelope.id && same_message(h, &d)) {
            Some(h) => *h = d,
            None => queue.push_back(d),
        }
    }

    /// FIFO: up to `max` waiting deliveries whose group has none out, each
    /// recorded as its group's delivery out.
    pub fn ready(&mut self, max: usize) -> Vec<Delivery> {
        let mut out = Vec::new();
        let groups: Vec<String> = self
            .held
            .iter()
            .filter(|(g, q)| !q.is_empty() && !self.active.contains(*g))
            .map(|(g, _)| g.clone())
            .collect();
        for g in groups {
            if out.len() >= max {
                break;
            }
            let Some(d) = self.held.get_mut(&g).and_then(VecDeque::pop_front) else {
                continue;
            };
            if let Some(r) = Receipt::parse(&d.receipt) {
                self.out.insert(r.seq, g.clone());
            }
            self.active.insert(g.clone());
            if self.held.get(&g).is_some_and(VecDeque::is_empty) {
                self.held.remove(&g);
            }
            out.push(d);
        }
        out
    }

    /// FIFO: the delivery with seq `seq` is settled (acked, or given back
    /// when `given_back`); returns the receipts of the deliveries waiting
    /// behind it that must be given back with it.
    pub fn settled(&mut self, seq: u64, given_back: bool) -> Vec<String> {
        let Some(group) = self.out.remove(&seq) else {
            return Vec::new();
        };
        self.active.remove(&group);
        if !given_back {
            return Vec::new();
        }
        self.held
            .remove(&group)
            .map(|q| q.into_iter().map(|d| d.receipt).collect())
            .unwrap_or_default()
    }

    /// Receipts of every delivery waiting behind its group's (extended with
    /// the deliveries out).
    pub fn held_receipts(&self) -> Vec<String> {
        self.held.values().flatten().map(|d| d.receipt.clone()).collect()
    }
}

/// Two deliveries of one SQS message (same message id in their receipts).
fn same_message(a: &Delivery, b: &Delivery) -> bool {
    match (Receipt::parse(&a.receipt), Receipt::parse(&b.receipt)) {
        (Some(x), Some(y)) => x.message_id == y.message_id,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Envelope;

    fn delivery(track: &mut Track, id: &str) -> (Delivery, u64) {
        let receipt = track.receipt(id, &format!("handle-{id}"), 0);
        let seq = Receipt::parse(&receipt).unwrap().seq;
        let envelope = Envelope {
            id: id.into(),
            handler: "h".into(),
            headers: vec![],
            payload: vec![],
        };
        (
            Delivery {
                envelope,
                receipt,
                delivery_count: 1,
                refused: None,
            },
            seq,
        )
    }

    #[test]
    fn a_group_has_one_delivery_out_and_the_rest_wait_in_order() {
        let mut t = Track::default();
        let (_a1, s1) = delivery(&mut t, "a1");
        let (a2, _) = delivery(&mut t, "a2");
        let (a3, _) = delivery(&mut t, "a3");
        let (_b1, sb) = delivery(&mut t, "b1");
        assert!(t.admit("A", s1));
        assert!(!t.admit("A", 0));
        t.hold("A", a2);
        t.hold("A", a3);
        assert!(t.admit("B", sb));
        assert!(t.ready(10).is_empty(), "both groups have one out");
        assert_eq!(t.held_receipts().len(), 2);

        assert!(t.settled(s1, false).is_empty(), "acked: nothing to give back");
        let next = t.ready(10);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].envelope.id, "a2", "the next of the group, in order");
        assert!(t.ready(10).is_empty(), "one at a time");

        // a2 is retried: a3 goes back with it, and the group is free.
        let s2 = Receipt::parse(&next[0].receipt).unwrap().seq;
        let back = t.settled(s2, true);
        assert_eq!(back.len(), 1);
        assert!(back[0].contains("a3"));
        assert!(t.held_receipts().is_empty());
        let (_again, s) = delivery(&mut t, "a2");
        assert!(t.admit("A", s));
    }

    #[test]
    fn stale_receipts_are_recognised_until_the_message_is_acked() {
        let mut t = Track::default();
        let first = t.receipt("m", "h1", 0);
        let second = t.receipt("m", "h2", 0);
        let (r1, r2) = (Receipt::parse(&first).unwrap(), Receipt::parse(&second).unwrap());
        assert!(t.is_stale(&r1));
        assert!(!t.is_stale(&r2));
        assert_eq!(r2.handle, "h2");
        t.forget(&r2);
        assert!(!t.is_stale(&r1), "forgotten once acked");
    }

    /// SQS refuses a visibility reaching past 12 hours from the receive:
    /// what is left shrinks as the delivery is held, and never goes below
    /// nothing.
    #[test]
    fn visibility_is_bounded_by_twelve_hours_from_the_receive() {
        let mut t = Track::default();
        let received = 1_765_000_000_000;
        let text = t.receipt("m", "handle with spaces", received);
        let r = Receipt::parse(&text).unwrap();
        assert_eq!((r.received, r.message_id, r.handle), (received, "m", "handle with spaces"));
        assert_eq!(r.visibility_left(received), 43_140);
        assert_eq!(r.visibility_left(received + 3_600_000), 39_540, "an hour held");
        assert_eq!(r.visibility_left(received + 43_200_000), 0, "twelve hours held");
        assert_eq!(r.visibility_left(received - 5_000), 43_140, "a clock stepped back");
        assert_eq!(r.visibility_left(i64::MAX), 0);
    }
}
