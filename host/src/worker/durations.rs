//! Recent handler durations per plugin: the histogram `/metrics` exports
//! and the p99 the lease-risk warning compares with the lease.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Samples needed before a p99 is trusted.
const MIN_SAMPLES: usize = 20;

/// Durations kept per plugin for the p99.
const WINDOW: usize = 1024;

/// Recent handler durations per plugin.
#[derive(Debug, Default)]
pub struct Durations {
    windows: Mutex<HashMap<String, Window>>,
}

/// One plugin's recent durations and its histogram handle (registered once,
/// not per message).
#[derive(Debug)]
struct Window {
    histogram: metrics::Histogram,
    recent: VecDeque<f64>,
}

impl Durations {
    /// Record one execution's duration, in seconds.
    pub fn record(&self, plugin: &str, seconds: f64) {
        let mut w = self.windows.lock().expect("duration windows poisoned");
        if !w.contains_key(plugin) {
            let histogram = metrics::histogram!("idem_handler_duration_seconds", "plugin" => plugin.to_string());
            w.insert(
                plugin.to_string(),
                Window {
                    histogram,
                    recent: VecDeque::with_capacity(WINDOW),
                },
            );
        }
        let window = w.get_mut(plugin).expect("inserted above");
        window.histogram.record(seconds);
        if window.recent.len() == WINDOW {
            window.recent.pop_front();
        }
        window.recent.push_back(seconds);
    }

    /// The p99 of each plugin's recent durations (plugins with enough samples).
    pub fn p99s(&self) -> Vec<(String, f64)> {
        let w = self.windows.lock().expect("duration windows poisoned");
        let mut out: Vec<(String, f64)> = w
            .iter()
            .filter(|(_, v)| v.recent.len() >= MIN_SAMPLES)
            .map(|(p, v)| (p.clone(), percentile(v.recent.iter().copied().collect(), 0.99)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// The `q` quantile (nearest rank) of `values`.
pub fn percentile(mut values: Vec<f64>, q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_is_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(v.clone(), 0.99), 99.0);
        assert_eq!(percentile(v, 0.5), 50.0);
        assert_eq!(percentile(vec![3.0], 0.99), 3.0);
        assert_eq!(percentile(Vec::new(), 0.99), 0.0);
    }

    #[test]
    fn only_plugins_with_enough_samples_report_a_p99() {
        let d = Durations::default();
        for i in 0..MIN_SAMPLES {
            d.record("a", i as f64);
        }
        d.record("b", 1.0);
        let p = d.p99s();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0, "a");
    }

    #[test]
    fn the_p99_forgets_durations_older_than_its_window() {
        let d = Durations::default();
        for _ in 0..MIN_SAMPLES {
            d.record("p", 1.0);
        }
        for _ in 0..WINDOW {
            d.record("p", 0.5);
        }
        assert_eq!(d.p99s(), vec![("p".to_string(), 0.5)]);
    }
}
