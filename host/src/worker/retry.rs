//! Exponential backoff with jitter.

use std::time::Duration;

use crate::config::RetryConfig;

/// The delay before retry number `attempt` (1 = after the first failure).
///
/// `base * 2^(attempt-1)`, capped at `max_delay_ms`, then reduced by up to
/// `jitter` of itself using `unit` (a random number in `[0, 1)`, injected so
/// tests can pin it). Jitter spreads the retries of a burst of failures so
/// they do not hit a recovering dependency at the same moment.
pub fn backoff(policy: &RetryConfig, attempt: u32, unit: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(32);
    let raw = policy.base_delay_ms.saturating_mul(1u64 << exp).min(policy.max_delay_ms);
    let unit = unit.clamp(0.0, 1.0);
    let jittered = raw as f64 * (1.0 - policy.jitter * unit);
    Duration::from_millis(jittered.round().max(1.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryConfig {
        RetryConfig {
            max_attempts: 10,
            max_traps: 2,
            base_delay_ms: 100,
            max_delay_ms: 1_000,
            jitter: 0.5,
        }
    }

    #[test]
    fn grows_exponentially_without_jitter() {
        let p = policy();
        let d: Vec<u64> = (1..=5).map(|a| backoff(&p, a, 0.0).as_millis() as u64).collect();
        assert_eq!(d, vec![100, 200, 400, 800, 1000]);
    }

    #[test]
    fn is_capped() {
        assert_eq!(backoff(&policy(), 40, 0.0), Duration::from_millis(1000));
    }

    #[test]
    fn jitter_reduces_by_at_most_its_fraction() {
        let p = policy();
        assert_eq!(backoff(&p, 3, 1.0), Duration::from_millis(200));
        assert_eq!(backoff(&p, 3, 0.5), Duration::from_millis(300));
        let full = RetryConfig { jitter: 1.0, ..p };
        assert_eq!(backoff(&full, 1, 1.0), Duration::from_millis(1));
    }
}
