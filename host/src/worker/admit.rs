//! Admission: validate a fetched batch, claim it in one round trip, and
//! settle at once what needs no execution (bad input, duplicates, busy
//! keys, conflicts, exhausted attempts). What is left runs.
//!
//! When the claim store is unreachable, the outage policy decides (G8).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use super::heartbeat::Registered;
use super::validate::check;
use super::Worker;
use crate::broker::{self, Verdict};
use crate::claim::{delivery_identity, ClaimError, ClaimOutcome, ClaimRef, ClaimRequest, DeadLetterRequest};
use crate::config::OutagePolicy;
use crate::envelope::{payload_hash, printable, Delivery, Envelope, MAX_KEY_BYTES};
use crate::plugin::PluginInfo;
use crate::runtime::Plugin;
use crate::stats::Counters;

/// A fetched delivery that passed validation: it names a loaded plugin and
/// has a key. The next step is its claim.
pub(super) struct Candidate {
    /// The message, shared with its execution.
    pub envelope: Arc<Envelope>,
    /// The broker's handle for ack, nack and extend.
    pub receipt: String,
    /// Times the broker delivered it.
    pub delivery_count: u32,
    /// The plugin that will run it (this version, even if another is
    /// loaded meanwhile).
    pub plugin: Arc<Plugin>,
    /// Its idempotency key.
    pub key: String,
    /// Hash of its payload (a reused key with another payload conflicts).
    pub payload_hash: String,
}

/// A candidate admitted to run, under a claim (or unguarded, when the
/// claim store is down and the outage policy allows it).
pub(super) struct Admission {
    /// The candidate it was.
    pub candidate: Candidate,
    /// The claim every write presents; `None` when unguarded.
    pub claim: Option<ClaimRef>,
    /// 1 for the first execution (counted at claim time).
    pub attempt: u32,
    /// Traps so far.
    pub traps: u32,
    /// Keeps the claim's lease (if any) and the delivery's visibility
    /// extended from the admission until the settlement, and lets a
    /// shutdown hand the delivery back.
    pub held: Registered,
    /// Set by the heartbeat if the claim is lost: the instance stops.
    pub interrupt: Arc<AtomicBool>,
}

/// What a claim's outcome asks of a delivery that will not run now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// Run it with this fence and attempt.
    Run { fence: i64, attempt: u32, traps: u32 },
    /// Settled already (done, dead-lettered, conflicting, exhausted): ack.
    Ack(Settled),
    /// Another execution holds the key: redeliver after this delay.
    Redeliver(Duration),
}

/// Why a delivery is acked without running.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Settled {
    /// A duplicate of a message done or (`failed`) dead-lettered.
    Duplicate { failed: bool },
    /// The key was first seen with another payload: dead-lettered.
    Conflict,
    /// No attempt left: dead-lettered.
    Exhausted(u32),
}

/// The rule for each claim outcome. A busy key comes back after the lease
/// or retry delay it reported, but no later than `busy_retry` (the holder
/// may finish early; `Duration::MAX` waits for all of it) and no sooner
/// than 1 ms.
pub(super) fn answer(outcome: ClaimOutcome, busy_retry: Duration) -> Answer {
    match outcome {
        ClaimOutcome::Acquired { fence, attempt, traps } => Answer::Run { fence, attempt, traps },
        ClaimOutcome::Done => Answer::Ack(Settled::Duplicate { failed: false }),
        ClaimOutcome::DeadLettered => Answer::Ack(Settled::Duplicate { failed: true }),
        ClaimOutcome::Conflict => Answer::Ack(Settled::Conflict),
        ClaimOutcome::Exhausted { attempts, .. } => Answer::Ack(Settled::Exhausted(attempts)),
        ClaimOutcome::Busy { retry_after_ms } => Answer::Redeliver(Duration::from_millis(retry_after_ms.max(1) as u64).min(busy_retry)),
    }
}

/// What admitting a batch gave.
pub(super) struct Admitted {
    /// What runs now.
    pub run: Vec<Admission>,
    /// True when the claim store was unreachable (the fetch loop backs off).
    pub outage: bool,
}

impl Worker {
    /// Validate and claim a batch; settle what needs no execution and
    /// return what should run.
    pub(super) async fn admit(&self, deliveries: Vec<Delivery>) -> Admitted {
        let c = &self.counters;
        c.deliveries
            .fetch_add(deliveries.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut candidates = Vec::new();
        let mut rejected: Vec<(Delivery, String)> = Vec::new();
        for d in deliveries {
            let plugin = self.runtime.plugin(&d.envelope.handler);
            match check(&d, plugin.as_deref().map(|p| &**p), || self.runtime.plugin_names()) {
                Ok(key) => {
                    let plugin = plugin.expect("checked above");
                    candidates.push(Candidate {
                        payload_hash: payload_hash(&d.envelope.payload),
                        envelope: Arc::new(d.envelope),
                        receipt: d.receipt,
                        delivery_count: d.delivery_count,
                        plugin,
                        key,
                    });
                }
                Err(reason) => rejected.push((d, reason)),
            }
        }
        if !rejected.is_empty() {
            self.reject(rejected).await;
        }
        if candidates.is_empty() {
            return Admitted {
                run: Vec::new(),
                outage: false,
            };
        }
        self.claim(candidates).await
    }

    /// Dead-letter deliveries that failed validation, then ack them. What
    /// identifies them (handler, id) is stored escaped and bounded: it is
    /// what may have made them invalid. Each is recorded once per message
    /// (its identity taken from it as delivered), so one delivered again
    /// after its answer or ack failed is acked without a second record.
    async fn reject(&self, rejected: Vec<(Delivery, String)>) {
        let names: Vec<(String, String)> = rejected
            .iter()
            .map(|(d, _)| (printable(&d.envelope.handler, 128), printable(&d.envelope.id, MAX_KEY_BYTES)))
            .collect();
        let items: Vec<DeadLetterRequest> = rejected
            .iter()
            .zip(&names)
            .map(|((d, reason), (handler, id))| DeadLetterRequest {
                plugin: handler,
                key: id,
                msg_id: id,
                headers: super::validate::bounded_headers(&d.envelope.headers),
                payload: &d.envelope.payload,
                reason,
                fence: None,
                plugin_version: None,
                delivery: (!d.envelope.id.is_empty())
                    .then(|| delivery_identity(&d.envelope.handler, &d.envelope.id, &d.envelope.id, &d.envelope.payload)),
            })
            .collect();
        match self.backends.claims.dead_letter(&items, self.backends.clock.now_ms()).await {
            Ok(_) => {
                for ((_, reason), (handler, id)) in rejected.iter().zip(&names) {
                    tracing::warn!(msg_id = %id, %handler, %reason, "dead-lettered bad input");
                }
                self.counters
                    .dead_lettered
                    .fetch_add(rejected.len() as u64, std::sync::atomic::Ordering::Relaxed);
                self.answer_and_ack(
                    rejected
                        .iter()
                        .map(|(d, reason)| broker::Answer {
                            receipt: &d.receipt,
                            msg_id: &d.envelope.id,
                            verdict: Verdict::Failed(reason),
                        })
                        .collect(),
                )
                .await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot record dead letters; leaving the deliveries unacked");
                for (d, _) in &rejected {
                    self.nack(&d.receipt, self.options.busy_retry).await;
                }
            }
        }
    }

    /// Claim the candidates in one round trip and act on each outcome.
    async fn claim(&self, candidates: Vec<Candidate>) -> Admitted {
        let c = &self.counters;
        let outcomes = match self.claim_batch(&candidates).await {
            Ok(o) => o,
            Err(e) => {
                return Admitted {
                    run: self.claim_outage(candidates, e).await,
                    outage: true,
                }
            }
        };
        let mut run = Vec::new();
        let mut acks = Vec::new();
        for (k, outcome) in candidates.into_iter().zip(outcomes) {
            let (msg_id, key) = (&k.envelope.id, &k.key);
            let outcome = match outcome {
                Ok(o) => o,
                Err(why) => {
                    self.refused_by_the_store(k, &why).await;
                    continue;
                }
            };
            match answer(outcome, self.busy_wait) {
                Answer::Run { fence, attempt, traps } => {
                    let claim = ClaimRef {
                        plugin: k.plugin.name.clone(),
                        key: k.key.clone(),
                        fence,
                    };
                    // Heartbeated from now, not from when the handler starts:
                    // acking and nacking the rest of the batch may take a
                    // while (a slow broker nack, a busy duplicate's delay).
                    let interrupt = Arc::new(AtomicBool::new(false));
                    let held = self.in_flight.register(Some(&claim), &k.receipt, &interrupt);
                    run.push(Admission {
                        candidate: k,
                        claim: Some(claim),
                        attempt,
                        traps,
                        held,
                        interrupt,
                    });
                }
                Answer::Ack(why) => {
                    let verdict = match why {
                        Settled::Duplicate { failed } => {
                            Counters::inc(&c.duplicates);
                            tracing::debug!(%msg_id, %key, "duplicate delivery of a settled message; acking");
                            Verdict::Duplicate { failed, result: None }
                        }
                        Settled::Conflict => {
                            Counters::inc(&c.conflicts);
                            Counters::inc(&c.dead_lettered);
                            tracing::warn!(%msg_id, %key, "key reused with a different payload; dead-lettered");
                            Verdict::Failed("the key was first seen with a different payload")
                        }
                        Settled::Exhausted(attempts) => {
                            Counters::inc(&c.dead_lettered);
                            tracing::warn!(%msg_id, %key, attempts, "attempts exhausted; dead-lettered");
                            Verdict::Failed("attempts exhausted")
                        }
                    };
                    acks.push((k, verdict));
                }
                Answer::Redeliver(delay) => {
                    Counters::inc(&c.busy);
                    tracing::debug!(%msg_id, %key, ?delay, "key is busy; redelivering later");
                    self.nack(&k.receipt, delay).await;
                }
            }
        }
        let keys: Vec<(&str, &str)> = acks
            .iter()
            .filter(|(_, v)| matches!(v, Verdict::Duplicate { failed: false, .. }))
            .map(|(k, _)| (k.plugin.name.as_str(), k.key.as_str()))
            .collect();
        let results = self.stored_results(&keys).await;
        let mut results = results.iter();
        self.answer_and_ack(
            acks.iter()
                .map(|(k, verdict)| broker::Answer {
                    receipt: &k.receipt,
                    msg_id: &k.envelope.id,
                    verdict: match verdict {
                        Verdict::Duplicate { failed: false, .. } => Verdict::Duplicate {
                            failed: false,
                            result: results.next().and_then(|r| r.as_deref()),
                        },
                        other => *other,
                    },
                })
                .collect(),
        )
        .await;
        Admitted { run, outage: false }
    }

    /// Claim a batch in one round trip. If the store refuses the batch for
    /// what one of its items holds, claim the items one by one, so the bad
    /// one is refused alone (its error is its outcome) and the others run.
    /// Only an unreachable store is an outage.
    async fn claim_batch(&self, candidates: &[Candidate]) -> Result<Vec<Result<ClaimOutcome, String>>, ClaimError> {
        let requests: Vec<ClaimRequest> = candidates
            .iter()
            .map(|k| ClaimRequest {
                plugin: &k.plugin.name,
                key: &k.key,
                msg_id: &k.envelope.id,
                payload_hash: &k.payload_hash,
                headers: &k.envelope.headers,
                payload: &k.envelope.payload,
                owner: &self.options.owner,
                lease_ms: self.options.lease.as_millis() as i64,
                max_attempts: self.options.retry.max_attempts,
                plugin_version: &k.plugin.version,
            })
            .collect();
        match self.backends.claims.claim(&requests, self.backends.clock.now_ms()).await {
            Ok(outcomes) => Ok(outcomes.into_iter().map(Ok).collect()),
            Err(ClaimError::Rejected(why)) if requests.len() > 1 => {
                tracing::warn!(%why, count = requests.len(), "the claim store refused a batch; claiming its messages one by one");
                let mut out = Vec::with_capacity(requests.len());
                for r in &requests {
                    match self
                        .backends
                        .claims
                        .claim(std::slice::from_ref(r), self.backends.clock.now_ms())
                        .await
                    {
                        Ok(mut o) => out.push(Ok(o.pop().expect("one outcome per request"))),
                        Err(ClaimError::Rejected(why)) => out.push(Err(why)),
                        Err(e) => return Err(e),
                    }
                }
                Ok(out)
            }
            Err(ClaimError::Rejected(why)) => Ok(vec![Err(why)]),
            Err(e) => Err(e),
        }
    }

    /// The claim store refused this message's claim for what it holds:
    /// dead-letter it (what identifies it escaped and bounded) and ack.
    async fn refused_by_the_store(&self, k: Candidate, why: &str) {
        let reason = format!("the claim store refused this message's claim: {why}");
        let (plugin, key, msg_id) = (
            printable(&k.plugin.name, 128),
            printable(&k.key, MAX_KEY_BYTES),
            printable(&k.envelope.id, MAX_KEY_BYTES),
        );
        let item = DeadLetterRequest {
            plugin: &plugin,
            key: &key,
            msg_id: &msg_id,
            headers: &k.envelope.headers,
            payload: &k.envelope.payload,
            reason: &reason,
            fence: None,
            plugin_version: Some(&k.plugin.version),
            delivery: Some(delivery_identity(&k.plugin.name, &k.key, &k.envelope.id, &k.envelope.payload)),
        };
        match self.backends.claims.dead_letter(&[item], self.backends.clock.now_ms()).await {
            Ok(_) => {
                Counters::inc(&self.counters.dead_lettered);
                tracing::warn!(%msg_id, %key, %reason, "dead-lettered");
                self.answer_and_ack(vec![broker::Answer {
                    receipt: &k.receipt,
                    msg_id: &k.envelope.id,
                    verdict: Verdict::Failed(&reason),
                }])
                .await;
            }
            Err(e) => {
                tracing::warn!(error = %e, %msg_id, "cannot record the dead letter; leaving the delivery unacked");
                self.nack(&k.receipt, self.options.busy_retry).await;
            }
        }
    }

    /// G8: the claim store is unreachable.
    async fn claim_outage(&self, candidates: Vec<Candidate>, error: ClaimError) -> Vec<Admission> {
        let mut run = Vec::new();
        for k in candidates {
            Counters::inc(&self.counters.outage_decisions);
            if runs_unguarded(self.options.outage_policy, &k.plugin) {
                tracing::warn!(error = %error, msg_id = %k.envelope.id, "claim store unreachable: running unguarded (outage_policy = run-unguarded)");
                let attempt = k.delivery_count.max(1);
                // No lease to extend, but the delivery's visibility is, and
                // a shutdown hands it back.
                let interrupt = Arc::new(AtomicBool::new(false));
                let held = self.in_flight.register(None, &k.receipt, &interrupt);
                run.push(Admission {
                    candidate: k,
                    claim: None,
                    attempt,
                    traps: 0,
                    held,
                    interrupt,
                });
            } else {
                tracing::warn!(error = %error, msg_id = %k.envelope.id, "claim store unreachable: leaving the delivery unacked (outage_policy = reject)");
                self.nack(&k.receipt, self.options.busy_retry).await;
            }
        }
        run
    }
}

/// Under `run-unguarded`, only plugins without external calls run: their
/// effects (store writes) are all naturally idempotent.
fn runs_unguarded(policy: OutagePolicy, plugin: &PluginInfo) -> bool {
    policy == OutagePolicy::RunUnguarded && plugin.grants.endpoints.is_empty()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::capabilities::Grants;
    use crate::config::Limits;

    pub(in crate::worker) fn plugin(key_pointer: Option<&str>, endpoints: &[&str]) -> PluginInfo {
        PluginInfo {
            name: "p".into(),
            version: "v".into(),
            grants: Grants::new(Vec::<String>::new(), endpoints.iter().map(|s| s.to_string())),
            limits: Limits {
                max_payload_bytes: 32,
                ..Limits::default()
            },
            key_pointer: key_pointer.map(str::to_string),
            imports: Vec::new(),
            loaded_at: 0,
        }
    }

    #[test]
    fn each_claim_outcome_has_one_answer() {
        let busy_retry = Duration::from_millis(100);
        assert_eq!(
            answer(
                ClaimOutcome::Acquired {
                    fence: 2,
                    attempt: 3,
                    traps: 1
                },
                busy_retry
            ),
            Answer::Run {
                fence: 2,
                attempt: 3,
                traps: 1
            }
        );
        assert_eq!(
            answer(ClaimOutcome::Done, busy_retry),
            Answer::Ack(Settled::Duplicate { failed: false })
        );
        assert_eq!(
            answer(ClaimOutcome::DeadLettered, busy_retry),
            Answer::Ack(Settled::Duplicate { failed: true })
        );
        assert_eq!(answer(ClaimOutcome::Conflict, busy_retry), Answer::Ack(Settled::Conflict));
        assert_eq!(
            answer(ClaimOutcome::Exhausted { attempts: 5, fence: 6 }, busy_retry),
            Answer::Ack(Settled::Exhausted(5))
        );
    }

    #[test]
    fn a_busy_key_comes_back_within_the_busy_retry_and_never_at_once() {
        let busy_retry = Duration::from_millis(100);
        let after = |ms| answer(ClaimOutcome::Busy { retry_after_ms: ms }, busy_retry);
        assert_eq!(after(30), Answer::Redeliver(Duration::from_millis(30)));
        assert_eq!(after(5_000), Answer::Redeliver(busy_retry));
        let whole = |ms| answer(ClaimOutcome::Busy { retry_after_ms: ms }, Duration::MAX);
        assert_eq!(
            whole(30_000),
            Answer::Redeliver(Duration::from_secs(30)),
            "receives counted: the whole lease"
        );
        assert_eq!(after(0), Answer::Redeliver(Duration::from_millis(1)));
        assert_eq!(after(-5), Answer::Redeliver(Duration::from_millis(1)));
    }

    #[test]
    fn only_plugins_without_external_calls_run_unguarded() {
        assert!(runs_unguarded(OutagePolicy::RunUnguarded, &plugin(None, &[])));
        assert!(!runs_unguarded(OutagePolicy::RunUnguarded, &plugin(None, &["payments"])));
        assert!(!runs_unguarded(OutagePolicy::Reject, &plugin(None, &[])));
    }
}
