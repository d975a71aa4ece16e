//! Settling an execution: the rule that maps an outcome to what happens to
//! the message (confirm, retry later, dead-letter, hand back), and the
//! broker side of it (ack, nack).
//!
//! Settling is ordered so that nothing is lost (G2): the claim is
//! confirmed, released or dead-lettered first, and the broker is acked only
//! after that is durable. A worker that lost its claim settles nothing:
//! whoever took the claim over settles the message.

use std::time::Duration;

use super::admit::Admission;
use super::confirm::AwaitingConfirm;
use super::{retry, Worker};
use crate::broker::{Answer, Verdict};
use crate::claim::{ClaimRef, DeadLetterRequest};
use crate::config::RetryConfig;
use crate::runtime::Outcome;
use crate::stats::Counters;

/// What happens to a claimed message after its execution.
#[derive(Debug, PartialEq)]
pub(super) enum Settlement {
    /// Done: confirm the claim (storing the handler's result), then ack.
    Confirm(Option<Vec<u8>>),
    /// No retry left or none would help: dead-letter with this reason, then ack.
    DeadLetter(String),
    /// Release the claim for a retry due at `not_before`, and redeliver
    /// after `delay`.
    Retry {
        /// Backoff before the next attempt.
        delay: Duration,
        /// When the claim may be taken again (ms, claim-store time).
        not_before: i64,
        /// Recorded as the claim's last error.
        reason: String,
        /// Counts towards `retry.max_traps`.
        trapped: bool,
    },
    /// The claim was taken over: hand the delivery back, settle nothing.
    HandBack,
    /// Fault injection stopped it as if the worker died: do nothing.
    Abandon,
}

/// The settle rule. `attempt` counts this execution and `traps` the traps
/// before it; `now` and `unit` (the jitter's random number in `[0, 1)`)
/// are injected so the rule is a pure function.
pub(super) fn settlement(outcome: Outcome, attempt: u32, traps: u32, policy: &RetryConfig, now: i64, unit: f64) -> Settlement {
    let (reason, trapped) = match outcome {
        Outcome::Done(result) => return Settlement::Confirm(result),
        Outcome::Permanent(reason) => return Settlement::DeadLetter(format!("permanent error: {reason}")),
        Outcome::FenceLost => return Settlement::HandBack,
        Outcome::Crashed => return Settlement::Abandon,
        Outcome::Transient(reason) => (reason, false),
        Outcome::Trapped(reason) => (reason, true),
        // Not the plugin's fault (e.g. no free instance slot): retried
        // without counting a trap.
        Outcome::HostError(reason) => (reason, false),
    };
    if attempt >= policy.max_attempts {
        return Settlement::DeadLetter(format!("attempts exhausted ({attempt} of {}): {reason}", policy.max_attempts));
    }
    let traps = traps + trapped as u32;
    if trapped && traps >= policy.max_traps {
        return Settlement::DeadLetter(format!("trapped {traps} times (retry.max_traps = {}): {reason}", policy.max_traps));
    }
    let delay = retry::backoff(policy, attempt, unit);
    Settlement::Retry {
        delay,
        not_before: now + delay.as_millis() as i64,
        reason,
        trapped,
    }
}

impl Worker {
    /// Settle one execution's outcome.
    pub(super) async fn settle(&self, a: Admission, outcome: Outcome) {
        let c = &self.counters;
        let Some(claim) = a.claim.clone() else {
            // Unguarded run (claim store down): ack only a success, unless
            // a shutdown has taken the delivery to hand back.
            if !a.held.finished() {
                return;
            }
            match outcome {
                Outcome::Done(result) => {
                    Counters::inc(&c.done);
                    let k = &a.candidate;
                    self.answer_and_ack(vec![Answer {
                        receipt: &k.receipt,
                        msg_id: &k.envelope.id,
                        verdict: Verdict::Done(result.as_deref()),
                    }])
                    .await;
                }
                _ => self.nack(&a.candidate.receipt, self.options.busy_retry).await,
            }
            return;
        };
        match &outcome {
            Outcome::Permanent(_) => Counters::inc(&c.permanent_errors),
            Outcome::Trapped(reason) => {
                Counters::inc(&c.traps);
                tracing::warn!(%reason, "handler trapped");
            }
            Outcome::HostError(reason) => tracing::warn!(%reason, "host error; retried without counting a trap"),
            _ => {}
        }
        match settlement(
            outcome,
            a.attempt,
            a.traps,
            &self.options.retry,
            self.backends.clock.now_ms(),
            rand::random::<f64>(),
        ) {
            Settlement::Confirm(result) => {
                let hook = self.caps.hooks.on_done.is_some();
                let k = a.candidate;
                let waiting = AwaitingConfirm {
                    claim,
                    receipt: k.receipt,
                    envelope: k.envelope,
                    result,
                    hook,
                    held: a.held,
                };
                self.await_confirm(waiting).await;
            }
            Settlement::DeadLetter(reason) => self.dead_letter(&a, &claim, &reason).await,
            Settlement::Retry {
                delay,
                not_before,
                reason,
                trapped,
            } => self.retry(&a, &claim, delay, not_before, &reason, trapped).await,
            Settlement::HandBack => {
                Counters::inc(&c.fence_rejections);
                tracing::warn!("execution stopped: the claim was taken over; handing the delivery back");
                self.hand_back(&a.candidate.receipt).await;
            }
            Settlement::Abandon => tracing::info!("simulated crash: abandoning the execution without settling"),
        }
    }

    async fn retry(&self, a: &Admission, claim: &ClaimRef, delay: Duration, not_before: i64, reason: &str, trapped: bool) {
        let receipt = &a.candidate.receipt;
        match self
            .backends
            .claims
            .release(claim, not_before, reason, trapped, self.backends.clock.now_ms())
            .await
        {
            Ok(true) => {
                Counters::inc(&self.counters.retries);
                tracing::info!(?delay, %reason, "retrying later");
                if let Err(e) = self.backends.broker.retry(receipt, delay, reason).await {
                    tracing::warn!(error = %e, "giving the delivery back failed; it becomes visible when its visibility timeout ends");
                }
            }
            Ok(false) => {
                Counters::inc(&self.counters.fence_rejections);
                tracing::warn!("release refused: the claim was taken over");
                self.hand_back(receipt).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "release failed; the lease will expire and the message be redelivered");
                self.hand_back(receipt).await;
            }
        }
    }

    async fn dead_letter(&self, a: &Admission, claim: &ClaimRef, reason: &str) {
        let k = &a.candidate;
        let item = DeadLetterRequest {
            plugin: &k.plugin.name,
            key: &k.key,
            msg_id: &k.envelope.id,
            headers: &k.envelope.headers,
            payload: &k.envelope.payload,
            reason,
            fence: Some(claim.fence),
            plugin_version: Some(&k.plugin.version),
            delivery: None,
        };
        match self.backends.claims.dead_letter(&[item], self.backends.clock.now_ms()).await {
            Ok(v) if v.first() == Some(&true) => {
                Counters::inc(&self.counters.dead_lettered);
                tracing::warn!(%reason, "dead-lettered");
                self.answer_and_ack(vec![Answer {
                    receipt: &k.receipt,
                    msg_id: &k.envelope.id,
                    verdict: Verdict::Failed(reason),
                }])
                .await;
            }
            Ok(_) => {
                Counters::inc(&self.counters.fence_rejections);
                tracing::warn!("dead-letter refused: the claim was taken over");
                self.hand_back(&k.receipt).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "dead-letter failed; the message will be redelivered");
                self.hand_back(&k.receipt).await;
            }
        }
    }

    /// Tell producers how settled messages ended, where the broker answers
    /// them (Celery's result backend), then ack. An answer that cannot be
    /// written leaves the deliveries unacked: their redelivery is a
    /// duplicate, which answers again.
    pub(super) async fn answer_and_ack(&self, answers: Vec<Answer<'_>>) {
        if answers.is_empty() {
            return;
        }
        let broker = &self.backends.broker;
        if broker.answers() {
            if let Err(e) = broker.answer(&answers).await {
                tracing::warn!(error = %e, count = answers.len(), "cannot answer the producers; handing the deliveries back to answer them on redelivery");
                for a in &answers {
                    self.hand_back(a.receipt).await;
                }
                return;
            }
        }
        self.ack(answers.iter().map(|a| a.receipt).collect()).await;
    }

    /// The results stored with these done claims, for a broker that answers
    /// duplicates with them (one round trip; none asked otherwise). A
    /// result that cannot be read is answered as none, with a warning.
    pub(super) async fn stored_results(&self, keys: &[(&str, &str)]) -> Vec<Option<Vec<u8>>> {
        if keys.is_empty() || !self.backends.broker.answers() {
            return vec![None; keys.len()];
        }
        self.backends.claims.results(keys).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the stored results of duplicates; answering them without one");
            vec![None; keys.len()]
        })
    }

    /// Ack settled deliveries (one round trip).
    pub(super) async fn ack(&self, receipts: Vec<&str>) {
        if receipts.is_empty() {
            return;
        }
        if let Err(e) = self.backends.broker.ack(&receipts).await {
            // The outcome is durable already: a redelivery finds it settled.
            tracing::warn!(error = %e, "ack failed; the settled message will be redelivered and acked as a duplicate");
        }
    }

    /// A delivery this worker will not settle goes back to the broker
    /// (never acked): the claim's owner settles the message, and the
    /// redelivery then finds it done (a duplicate) or busy. Without this a
    /// broker with no visibility timeout (RabbitMQ) would hold it until the
    /// connection closed.
    pub(super) async fn hand_back(&self, receipt: &str) {
        self.nack(receipt, self.options.busy_retry).await;
    }

    /// Make a delivery visible again after `delay`.
    pub(super) async fn nack(&self, receipt: &str, delay: Duration) {
        if let Some(slow) = self.caps.hooks.delay_nack {
            tokio::time::sleep(slow).await;
        }
        if let Err(e) = self.backends.broker.nack(receipt, delay).await {
            tracing::warn!(error = %e, "nack failed; the delivery becomes visible when its visibility timeout ends");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn policy() -> RetryConfig {
        RetryConfig {
            max_attempts: 3,
            max_traps: 2,
            base_delay_ms: 100,
            max_delay_ms: 1_000,
            jitter: 0.5,
        }
    }

    fn settle(outcome: Outcome, attempt: u32, traps: u32) -> Settlement {
        settlement(outcome, attempt, traps, &policy(), NOW, 0.0)
    }

    #[test]
    fn done_confirms_whatever_the_attempt() {
        assert_eq!(settle(Outcome::Done(None), 3, 1), Settlement::Confirm(None));
        assert_eq!(
            settle(Outcome::Done(Some(b"7".to_vec())), 1, 0),
            Settlement::Confirm(Some(b"7".to_vec()))
        );
    }

    #[test]
    fn a_permanent_error_dead_letters_at_once() {
        assert_eq!(
            settle(Outcome::Permanent("bad card".into()), 1, 0),
            Settlement::DeadLetter("permanent error: bad card".into())
        );
    }

    #[test]
    fn a_transient_error_retries_with_backoff_from_the_injected_clock() {
        let expected = Settlement::Retry {
            delay: Duration::from_millis(200),
            not_before: NOW + 200,
            reason: "timeout".into(),
            trapped: false,
        };
        assert_eq!(settle(Outcome::Transient("timeout".into()), 2, 0), expected);
        let jittered = settlement(Outcome::Transient("timeout".into()), 2, 0, &policy(), NOW, 1.0);
        assert!(
            matches!(jittered, Settlement::Retry { delay, not_before, .. } if delay == Duration::from_millis(100) && not_before == NOW + 100)
        );
    }

    #[test]
    fn the_last_attempt_dead_letters_with_the_error() {
        assert_eq!(
            settle(Outcome::Transient("timeout".into()), 3, 0),
            Settlement::DeadLetter("attempts exhausted (3 of 3): timeout".into())
        );
        assert_eq!(
            settle(Outcome::HostError("no slot".into()), 3, 0),
            Settlement::DeadLetter("attempts exhausted (3 of 3): no slot".into())
        );
    }

    #[test]
    fn traps_are_bounded_separately_and_host_errors_do_not_count_as_traps() {
        assert!(matches!(
            settle(Outcome::Trapped("oom".into()), 1, 0),
            Settlement::Retry { trapped: true, .. }
        ));
        assert_eq!(
            settle(Outcome::Trapped("oom".into()), 2, 1),
            Settlement::DeadLetter("trapped 2 times (retry.max_traps = 2): oom".into())
        );
        assert!(matches!(
            settle(Outcome::HostError("no slot".into()), 2, 1),
            Settlement::Retry { trapped: false, .. }
        ));
    }

    #[test]
    fn a_lost_claim_settles_nothing() {
        assert_eq!(settle(Outcome::FenceLost, 3, 0), Settlement::HandBack);
        assert_eq!(settle(Outcome::Crashed, 3, 0), Settlement::Abandon);
    }
}
