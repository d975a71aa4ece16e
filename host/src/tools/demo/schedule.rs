//! What a demo or chaos run publishes: the messages, their duplicates, and
//! which references are slow or flaky at the mock or crash in the worker.

use std::collections::HashSet;

use std::time::Duration;

use anyhow::Result;
use rand::{Rng, SeedableRng};

use crate::envelope::Envelope;
use crate::tools::kit::Mock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Payment,
    Grant,
    Order,
    Poison,
}

pub(super) struct Planned {
    pub(super) envelope: Envelope,
    pub(super) kind: Kind,
    pub(super) reference: String,
}

/// What a run publishes: messages, their duplicates, and which are slow,
/// flaky (at the mock) or crash (in-process fault injection).
pub struct Schedule {
    pub(super) planned: Vec<Planned>,
    now_batch: Vec<Envelope>,
    late_batch: Vec<Envelope>,
    /// Keys whose first execution "crashes" after the charge was journaled.
    pub crash_keys: HashSet<String>,
}

impl Schedule {
    /// A seeded schedule of `messages` distinct messages (one poison), with
    /// ~10% duplicated; marks slow and flaky references at the mock.
    pub fn new(messages: usize, seed: u64, mock: &Mock) -> Schedule {
        Self::build(messages, seed, mock, |rng| {
            let roll: f64 = rng.random();
            if roll < 0.05 {
                (1, 0)
            } else if roll < 0.10 {
                (0, 1)
            } else {
                (0, 0)
            }
        })
    }

    /// The chaos schedule: every message published 1 to 3 times; each extra
    /// copy either right behind the first (concurrent) or a few seconds
    /// later.
    pub fn chaos(messages: usize, seed: u64, mock: &Mock) -> Schedule {
        Self::build(messages, seed, mock, |rng| {
            let extra = rng.random_range(0..=2u32);
            let now = (0..extra).filter(|_| rng.random::<bool>()).count() as u32;
            (now, extra - now)
        })
    }

    /// Publishes beyond one per message.
    pub fn duplicates(&self) -> u64 {
        (self.now_batch.len() + self.late_batch.len()) as u64 - self.messages()
    }

    fn build(messages: usize, seed: u64, mock: &Mock, mut copies: impl FnMut(&mut rand::rngs::StdRng) -> (u32, u32)) -> Schedule {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let planned = plan(messages, &mut rng);
        let mut crash_keys = HashSet::new();
        {
            let mut s = mock.state.lock().expect("mock state poisoned");
            for p in &planned {
                if matches!(p.kind, Kind::Payment | Kind::Order) {
                    let roll: f64 = rng.random();
                    if roll < 0.04 {
                        s.slow.insert(p.reference.clone());
                    } else if roll < 0.08 {
                        s.flaky.insert(p.reference.clone(), 1);
                    } else if roll < 0.08 + if p.kind == Kind::Order { 0.06 } else { 0.03 } {
                        crash_keys.insert(p.reference.clone());
                    }
                }
            }
        }
        // Extra copies right behind the first run concurrently with it;
        // late ones arrive after it is (usually) done.
        let mut now_batch = Vec::new();
        let mut late_batch = Vec::new();
        for p in &planned {
            now_batch.push(p.envelope.clone());
            let (now, late) = copies(&mut rng);
            for _ in 0..now {
                now_batch.push(p.envelope.clone());
            }
            for _ in 0..late {
                late_batch.push(p.envelope.clone());
            }
        }
        Schedule {
            planned,
            now_batch,
            late_batch,
            crash_keys,
        }
    }

    /// Distinct messages.
    pub fn messages(&self) -> u64 {
        self.planned.len() as u64
    }

    /// Publish everything; returns the number of publishes.
    pub async fn publish(&self, broker: &dyn crate::broker::Broker) -> Result<u64> {
        for chunk in self.now_batch.chunks(500) {
            broker.publish(chunk, Duration::ZERO).await?;
        }
        for chunk in self.late_batch.chunks(500) {
            broker.publish(chunk, Duration::from_secs(2)).await?;
        }
        Ok((self.now_batch.len() + self.late_batch.len()) as u64)
    }
}

fn plan(messages: usize, rng: &mut rand::rngs::StdRng) -> Vec<Planned> {
    let poison_at = messages / 2;
    (0..messages)
        .map(|i| {
            let (kind, handler, reference, payload) = if i == poison_at {
                (Kind::Poison, "poison", format!("poison-{i}"), serde_json::json!({ "mode": "trap" }))
            } else {
                match i % 10 {
                    0..=3 => {
                        let r = format!("pay-{i}");
                        let p = serde_json::json!({ "payment_id": r, "customer": format!("cust-{}", i % 97), "amount_cents": 100 + i });
                        (Kind::Payment, "record-payment", r, p)
                    }
                    4..=6 => {
                        let r = format!("user-{i}");
                        let p = serde_json::json!({ "user": r, "balance": rng.random_range(0..10_000) });
                        (Kind::Grant, "grant-credits", r, p)
                    }
                    _ => {
                        let r = format!("ord-{i}");
                        let p = serde_json::json!({
                            "order_id": r, "customer": format!("cust-{}", i % 97), "email": format!("c{i}@example.com"),
                            "sku": format!("sku-{}", i % 13), "quantity": 1 + i % 3, "amount_cents": 500 + i,
                        });
                        (Kind::Order, "fulfil-order", r, p)
                    }
                }
            };
            Planned {
                envelope: Envelope {
                    id: format!("msg-{i}"),
                    handler: handler.into(),
                    headers: vec![("source".into(), "idem-demo".into())],
                    payload: serde_json::to_vec(&payload).expect("JSON"),
                },
                kind,
                reference,
            }
        })
        .collect()
}
