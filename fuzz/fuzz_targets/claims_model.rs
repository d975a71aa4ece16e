//! The claim state machine against a model (shared by the `claims` fuzz
//! target and the integration test `claims_model`): random sequences of claims,
//! extensions, confirms, releases and dead letters, at random times, on the
//! SQLite claim store. Invariants: at most one live owner per key, fences
//! only grow, a stale fence never changes anything, a settled key is never
//! acquired again, attempts never exceed the limit.
use std::collections::HashMap;

use arbitrary::{Arbitrary, Unstructured};
use idem_host::claim::{ClaimOutcome, ClaimRef, ClaimRequest, DeadLetterRequest};
use idem_host::config::Config;

#[derive(Debug)]
pub enum Op {
    Claim { key: u8, other_payload: bool, advance: u16 },
    Extend { key: u8, stale: bool, advance: u16 },
    Confirm { key: u8, stale: bool },
    Release { key: u8, stale: bool, delay: u16 },
    DeadLetter { key: u8, stale: bool },
}

// Written out rather than derived: the derive feature of `arbitrary` would
// change the features the host's dependencies are built with in tests
// (cranelift depends on `arbitrary`), and the test build would compile
// wasmtime a second time.
impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Op> {
        let key = u.arbitrary()?;
        Ok(match u.int_in_range(0..=4u8)? {
            0 => Op::Claim {
                key,
                other_payload: u.arbitrary()?,
                advance: u.arbitrary()?,
            },
            1 => Op::Extend {
                key,
                stale: u.arbitrary()?,
                advance: u.arbitrary()?,
            },
            2 => Op::Confirm {
                key,
                stale: u.arbitrary()?,
            },
            3 => Op::Release {
                key,
                stale: u.arbitrary()?,
                delay: u.arbitrary()?,
            },
            _ => Op::DeadLetter {
                key,
                stale: u.arbitrary()?,
            },
        })
    }
}

#[derive(Default, Clone)]
struct Model {
    fence: i64,
    attempts: u32,
    lease_until: i64,
    settled: bool,
    /// Which payload created the claim (the other one is a conflict).
    created_by_other: Option<bool>,
}

const LEASE: i64 = 1_000;
const MAX_ATTEMPTS: u32 = 4;

/// Run `ops` on a fresh SQLite claim store, checking every invariant.
pub fn check(ops: Vec<Op>) {
    if ops.len() > 64 {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.database.path = dir.path().join("fuzz.db");
        let b = idem_host::backend::open(&config).await.unwrap();
        let claims = b.claims;
        let mut now: i64 = 1_000_000;
        let mut model: HashMap<u8, Model> = HashMap::new();
        let payload = b"p".to_vec();
        let hash = idem_host::envelope::payload_hash(&payload);
        let other_hash = idem_host::envelope::payload_hash(b"q");
        for op in ops {
            match op {
                Op::Claim {
                    key,
                    other_payload,
                    advance,
                } => {
                    now += advance as i64;
                    let k = format!("k{}", key % 4);
                    let h = if other_payload { &other_hash } else { &hash };
                    let req = ClaimRequest {
                        plugin: "p",
                        key: &k,
                        msg_id: &k,
                        payload_hash: h,
                        headers: &[],
                        payload: &payload,
                        owner: "w",
                        lease_ms: LEASE,
                        max_attempts: MAX_ATTEMPTS,
                        plugin_version: "v",
                    };
                    let out = claims.claim(&[req], now).await.unwrap().remove(0);
                    let m = model.entry(key % 4).or_default();
                    if let ClaimOutcome::Acquired { fence, attempt, .. } = out {
                        assert!(!m.settled, "a settled key was acquired again");
                        assert!(m.fence == 0 || m.lease_until <= now, "acquired while a lease was live");
                        assert!(fence > m.fence, "fences only grow");
                        assert!(attempt <= MAX_ATTEMPTS, "attempts past the limit");
                        assert_eq!(
                            *m.created_by_other.get_or_insert(other_payload),
                            other_payload,
                            "a conflicting payload was acquired"
                        );
                        m.fence = fence;
                        m.attempts = attempt;
                        m.lease_until = now + LEASE;
                    }
                    if matches!(out, ClaimOutcome::Exhausted { .. }) {
                        m.settled = true;
                    }
                    if matches!(out, ClaimOutcome::Done | ClaimOutcome::DeadLettered) {
                        assert!(m.settled, "reported settled but never settled");
                    }
                }
                Op::Extend { key, stale, advance } => {
                    now += advance as i64;
                    let m = model.entry(key % 4).or_default();
                    let c = ClaimRef {
                        plugin: "p".into(),
                        key: format!("k{}", key % 4),
                        fence: m.fence - stale as i64,
                    };
                    let ok = claims.extend(&[c], LEASE, now).await.unwrap()[0];
                    if stale || m.fence == 0 {
                        assert!(!ok, "a stale fence extended a lease");
                    }
                    if ok {
                        m.lease_until = now + LEASE;
                    }
                }
                Op::Confirm { key, stale } => {
                    let m = model.entry(key % 4).or_default();
                    let c = ClaimRef {
                        plugin: "p".into(),
                        key: format!("k{}", key % 4),
                        fence: m.fence - stale as i64,
                    };
                    let ok = claims.confirm(&[c], now).await.unwrap()[0];
                    if stale || m.fence == 0 {
                        assert!(!ok, "a stale fence confirmed");
                    }
                    if ok {
                        m.settled = true;
                    }
                }
                Op::Release { key, stale, delay } => {
                    let m = model.entry(key % 4).or_default();
                    let c = ClaimRef {
                        plugin: "p".into(),
                        key: format!("k{}", key % 4),
                        fence: m.fence - stale as i64,
                    };
                    let ok = claims.release(&c, now + delay as i64, "e", false, now).await.unwrap();
                    if stale || m.fence == 0 {
                        assert!(!ok, "a stale fence released");
                    }
                    if ok {
                        m.lease_until = now + delay as i64;
                    }
                }
                Op::DeadLetter { key, stale } => {
                    let m = model.entry(key % 4).or_default();
                    let k = format!("k{}", key % 4);
                    let d = DeadLetterRequest {
                        plugin: "p",
                        key: &k,
                        msg_id: &k,
                        headers: &[],
                        payload: &payload,
                        reason: "r",
                        fence: Some(m.fence - stale as i64),
                        plugin_version: None,
                        delivery: None,
                    };
                    let ok = claims.dead_letter(&[d], now).await.unwrap()[0];
                    if stale || m.fence == 0 {
                        assert!(!ok, "a stale fence dead-lettered");
                    }
                    if ok {
                        m.settled = true;
                    }
                }
            }
        }
    });
}
