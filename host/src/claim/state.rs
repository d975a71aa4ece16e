//! A claim's states and the one decision every backend makes when a
//! delivery arrives for a key that is already claimed.

use super::{ClaimOutcome, ClaimRequest};

/// Where a claim stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimState {
    /// An execution holds it (until its lease ends).
    Running,
    /// Released for a retry (no earlier than its `not_before`).
    Retry,
    /// Confirmed: every later delivery is a duplicate.
    Done,
    /// Dead-lettered.
    Dead,
}

impl ClaimState {
    /// Every state, in the order of a message's life.
    pub const ALL: [ClaimState; 4] = [ClaimState::Running, ClaimState::Retry, ClaimState::Done, ClaimState::Dead];

    /// The name stored in the claim tables and hashes.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimState::Running => "running",
            ClaimState::Retry => "retry",
            ClaimState::Done => "done",
            ClaimState::Dead => "dead",
        }
    }

    /// The state a stored name stands for.
    pub fn parse(name: &str) -> Option<ClaimState> {
        ClaimState::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl std::fmt::Display for ClaimState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored claim, as far as deciding a new delivery of its key needs it.
pub(crate) struct Stored<'a> {
    pub payload_hash: &'a str,
    pub state: ClaimState,
    pub lease_until: i64,
    pub not_before: i64,
    pub attempts: i64,
    pub last_error: Option<&'a str>,
}

/// What a delivery of an already-claimed key gets. One function for the SQL
/// backends; the Redis backend makes the same decision in
/// `lua/claims_claim.lua`.
pub(crate) enum Decision {
    /// Answer without changing the claim.
    Answer(ClaimOutcome),
    /// Dead-letter this delivery (the claim stays as it is).
    Conflict(String),
    /// Mark the claim dead and dead-letter the message: no attempt is left.
    Exhaust(String),
    /// Take the claim over: fence and attempts grow.
    TakeOver,
}

pub(crate) fn decide(s: &Stored, r: &ClaimRequest, now: i64) -> Decision {
    if s.payload_hash != r.payload_hash {
        return Decision::Conflict(format!(
            "conflict: key {:?} of plugin {} was first seen with a different payload (sha256 {}…, this delivery {}…); a reused key is not a duplicate",
            r.key,
            r.plugin,
            &s.payload_hash[..12.min(s.payload_hash.len())],
            &r.payload_hash[..12.min(r.payload_hash.len())]
        ));
    }
    match s.state {
        ClaimState::Done => Decision::Answer(ClaimOutcome::Done),
        ClaimState::Dead => Decision::Answer(ClaimOutcome::DeadLettered),
        ClaimState::Running if s.lease_until > now => Decision::Answer(ClaimOutcome::Busy {
            retry_after_ms: s.lease_until - now,
        }),
        ClaimState::Retry if s.not_before > now => Decision::Answer(ClaimOutcome::Busy {
            retry_after_ms: s.not_before - now,
        }),
        _ if s.attempts >= r.max_attempts as i64 => Decision::Exhaust(format!(
            "attempts exhausted: {} of {} made; last error: {}",
            s.attempts,
            r.max_attempts,
            s.last_error
                .unwrap_or("the worker running it stopped (crash or kill) before settling")
        )),
        _ => Decision::TakeOver,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn request(hash: &str) -> ClaimRequest<'_> {
        ClaimRequest {
            plugin: "p",
            key: "k",
            msg_id: "m",
            payload_hash: hash,
            headers: &[],
            payload: b"",
            owner: "w",
            lease_ms: 1_000,
            max_attempts: 3,
            plugin_version: "v",
        }
    }

    fn stored(state: ClaimState, attempts: i64) -> Stored<'static> {
        Stored {
            payload_hash: "h",
            state,
            lease_until: NOW + 500,
            not_before: NOW + 200,
            attempts,
            last_error: None,
        }
    }

    fn answer(d: Decision) -> ClaimOutcome {
        match d {
            Decision::Answer(o) => o,
            _ => panic!("expected an answer"),
        }
    }

    #[test]
    fn states_round_trip_through_their_stored_names() {
        for s in ClaimState::ALL {
            assert_eq!(ClaimState::parse(s.as_str()), Some(s));
        }
        assert_eq!(ClaimState::parse("pending"), None);
    }

    #[test]
    fn settled_keys_answer_without_running() {
        assert_eq!(answer(decide(&stored(ClaimState::Done, 1), &request("h"), NOW)), ClaimOutcome::Done);
        assert_eq!(
            answer(decide(&stored(ClaimState::Dead, 3), &request("h"), NOW)),
            ClaimOutcome::DeadLettered
        );
    }

    #[test]
    fn a_live_lease_or_a_retry_not_yet_due_is_busy_until_it_ends() {
        let busy = answer(decide(&stored(ClaimState::Running, 1), &request("h"), NOW));
        assert_eq!(busy, ClaimOutcome::Busy { retry_after_ms: 500 });
        let waiting = answer(decide(&stored(ClaimState::Retry, 1), &request("h"), NOW));
        assert_eq!(waiting, ClaimOutcome::Busy { retry_after_ms: 200 });
    }

    #[test]
    fn an_expired_lease_is_taken_over_while_attempts_remain() {
        assert!(matches!(
            decide(&stored(ClaimState::Running, 2), &request("h"), NOW + 501),
            Decision::TakeOver
        ));
        assert!(matches!(
            decide(&stored(ClaimState::Retry, 2), &request("h"), NOW + 200),
            Decision::TakeOver
        ));
    }

    #[test]
    fn no_attempt_left_exhausts_with_the_last_error_or_the_crash_reason() {
        let Decision::Exhaust(reason) = decide(&stored(ClaimState::Running, 3), &request("h"), NOW + 501) else {
            panic!("expected exhaustion");
        };
        assert!(reason.contains("3 of 3") && reason.contains("stopped (crash or kill)"), "{reason}");
        let mut s = stored(ClaimState::Retry, 3);
        s.last_error = Some("boom");
        let Decision::Exhaust(reason) = decide(&s, &request("h"), NOW + 200) else {
            panic!("expected exhaustion");
        };
        assert!(reason.ends_with("last error: boom"), "{reason}");
    }

    #[test]
    fn a_key_reused_with_another_payload_is_a_conflict_whatever_the_state() {
        for s in ClaimState::ALL {
            assert!(matches!(decide(&stored(s, 1), &request("other"), NOW), Decision::Conflict(_)));
        }
    }
}
