//! How two readings of the configuration file differ: what a running pool
//! takes of a fresh one at SIGHUP, and what waits for a restart.

use super::Config;

/// The settings of `fresh` that a pool running `running` takes only when
/// it restarts, by dotted name: a plugin removed (it stays loaded), a
/// plugin's `key_pointer` (it decides the idempotency keys, which must stay
/// the same while messages are in flight), and every setting outside
/// `[limits]` and the plugin sections ([`reloadable_part`]). A worker
/// process started again beside others still running must not take them
/// either (`worker.processes`).
pub fn restart_only_changes(running: &Config, fresh: &Config) -> Vec<String> {
    take_reloadable(running, fresh).restart_only()
}

/// What a SIGHUP makes of a fresh configuration file.
pub(crate) struct Taken {
    /// The configuration the pool runs with from now on.
    pub next: Config,
    /// Plugins of the running configuration the file no longer has.
    pub removed: Vec<String>,
    /// Plugins whose `key_pointer` the file changes (kept as it runs).
    pub key_pointers: Vec<String>,
    /// Other settings changed and left as they run, by dotted name.
    pub left_out: Vec<String>,
}

impl Taken {
    /// Every setting changed that waits for a restart, by dotted name.
    pub fn restart_only(&self) -> Vec<String> {
        let mut out: Vec<String> = self.removed.iter().map(|n| format!("plugins.{n}")).collect();
        out.extend(self.key_pointers.iter().map(|n| format!("plugins.{n}.key_pointer")));
        out.extend(self.left_out.iter().cloned());
        out.sort();
        out.dedup();
        out
    }
}

/// [`reloadable_part`] of `fresh` with each running plugin's key pointer
/// kept, and what was kept back.
pub(crate) fn take_reloadable(running: &Config, fresh: &Config) -> Taken {
    let (mut removed, mut key_pointers) = (Vec::new(), Vec::new());
    let mut same_keys = fresh.clone();
    for (name, old) in &running.plugins {
        match same_keys.plugins.get_mut(name) {
            None => removed.push(name.clone()),
            Some(p) if p.key_pointer != old.key_pointer => {
                key_pointers.push(name.clone());
                p.key_pointer = old.key_pointer.clone();
            }
            Some(_) => {}
        }
    }
    let (next, left_out) = reloadable_part(running, &same_keys);
    Taken {
        next,
        removed,
        key_pointers,
        left_out,
    }
}

/// What a running pool takes of `fresh`: the running configuration with
/// `fresh`'s `[limits]` and plugin sections, each plugin's `celery_task` as
/// it runs (the Celery broker routes the task names it started with) and
/// its grants of endpoints the pool started with; and the settings of
/// `fresh` left out, by dotted name.
fn reloadable_part(running: &Config, fresh: &Config) -> (Config, Vec<String>) {
    let mut next = running.clone();
    next.limits = fresh.limits.clone();
    next.plugins = fresh.plugins.clone();
    for (name, p) in &mut next.plugins {
        p.celery_task = running.plugins.get(name).and_then(|old| old.celery_task.clone());
        // Endpoints are set up at start: a grant of one the pool does not
        // have would only fail every call.
        p.endpoints.retain(|e| running.endpoints.contains_key(e));
    }
    let mut left_out = Vec::new();
    differences(&as_toml(&next), &as_toml(fresh), "", &mut left_out);
    (next, left_out)
}

/// The dotted names under which two TOML values differ, down to the
/// innermost table holding each difference.
fn differences(old: &toml::Value, new: &toml::Value, at: &str, out: &mut Vec<String>) {
    match (old, new) {
        (toml::Value::Table(a), toml::Value::Table(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => differences(x, y, &path, out),
                    (x, y) if x != y => out.push(path),
                    _ => {}
                }
            }
        }
        (a, b) if a != b => out.push(at.to_string()),
        _ => {}
    }
}

/// `v` as a TOML value (an empty table if it has no TOML form).
fn as_toml<T: serde::Serialize>(v: &T) -> toml::Value {
    toml::Value::try_from(v).unwrap_or(toml::Value::Table(toml::Table::new()))
}

/// The fields of two flat tables that differ ([`differences`]), each as
/// (name, old, new).
pub(crate) fn changed_settings<T: serde::Serialize>(old: &T, new: &T) -> Vec<(String, String, String)> {
    let (old, new) = (as_toml(old), as_toml(new));
    let mut names = Vec::new();
    differences(&old, &new, "", &mut names);
    let show = |v: &toml::Value, k: &str| v.get(k).map(ToString::to_string).unwrap_or_else(|| "unset".into());
    names
        .into_iter()
        .map(|k| {
            let (was, is) = (show(&old, &k), show(&new, &k));
            (k, was, is)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Limits, PluginConfig};

    #[test]
    fn settings_a_running_pool_cannot_take_are_named_and_left_as_they_run() {
        let mut running = Config::default();
        running.plugins.insert(
            "pay".into(),
            PluginConfig {
                path: "pay.wasm".into(),
                collections: vec!["payments".into()],
                endpoints: Vec::new(),
                key_pointer: None,
                celery_task: Some("billing.pay".into()),
                limits: None,
            },
        );
        let mut fresh = running.clone();
        fresh.worker.concurrency += 1;
        fresh.namespace = "other".into();
        fresh.limits.cpu_ms += 1;
        fresh.endpoints.insert(
            "bank".into(),
            crate::config::EndpointConfig {
                url: "http://127.0.0.1:9/".into(),
                timeout_ms: 1000,
            },
        );
        let pay = fresh.plugins.get_mut("pay").unwrap();
        pay.celery_task = Some("billing.pay_v2".into());
        pay.collections.push("ledger".into());
        pay.endpoints.push("bank".into());
        let mut added = pay.clone();
        added.celery_task = Some("billing.refund".into());
        fresh.plugins.insert("refund".into(), added);

        let (next, left_out) = reloadable_part(&running, &fresh);
        assert_eq!(
            left_out,
            [
                "endpoints.bank",
                "namespace",
                "plugins.pay.celery_task",
                "plugins.pay.endpoints",
                "plugins.refund.celery_task",
                "plugins.refund.endpoints",
                "worker.concurrency"
            ]
        );
        assert_eq!(
            (next.namespace.as_str(), next.worker.concurrency),
            (running.namespace.as_str(), running.worker.concurrency)
        );
        assert_eq!(next.limits.cpu_ms, fresh.limits.cpu_ms, "limits are reloadable");
        assert_eq!(next.plugins["pay"].collections, ["payments", "ledger"], "grants are reloadable");
        assert_eq!(next.plugins["pay"].celery_task.as_deref(), Some("billing.pay"));
        assert!(next.plugins["pay"].endpoints.is_empty(), "no grant of an endpoint the pool lacks");
        assert_eq!(next.plugins["refund"].celery_task, None);
        assert!(reloadable_part(&running, &running).1.is_empty());
    }

    #[test]
    fn a_changed_key_pointer_and_a_removed_plugin_wait_for_a_restart() {
        let mut running = Config::default();
        for name in ["pay", "refund"] {
            running.plugins.insert(
                name.into(),
                PluginConfig {
                    path: format!("{name}.wasm").into(),
                    collections: vec!["payments".into()],
                    endpoints: Vec::new(),
                    key_pointer: Some("/id".into()),
                    celery_task: None,
                    limits: None,
                },
            );
        }
        let mut fresh = running.clone();
        fresh.plugins.remove("refund");
        let pay = fresh.plugins.get_mut("pay").unwrap();
        pay.key_pointer = Some("/order".into());
        pay.collections.push("ledger".into());

        let taken = take_reloadable(&running, &fresh);
        assert_eq!(
            (taken.removed.as_slice(), taken.key_pointers.as_slice()),
            (&["refund".to_string()][..], &["pay".to_string()][..])
        );
        assert!(taken.left_out.is_empty(), "{:?}", taken.left_out);
        assert_eq!(taken.restart_only(), ["plugins.pay.key_pointer", "plugins.refund"]);
        assert_eq!(restart_only_changes(&running, &fresh), taken.restart_only());
        let pay = &taken.next.plugins["pay"];
        assert_eq!(pay.key_pointer.as_deref(), Some("/id"), "the key pointer is kept as it runs");
        assert_eq!(pay.collections, ["payments", "ledger"], "the rest of the section is taken");
        assert!(restart_only_changes(&running, &running).is_empty());
    }

    #[test]
    fn changed_settings_lists_each_difference_by_name() {
        let old = Limits::default();
        let new = Limits {
            cpu_ms: old.cpu_ms + 1,
            max_log_lines: old.max_log_lines + 2,
            ..old.clone()
        };
        let changed = changed_settings(&old, &new);
        let names: Vec<&str> = changed.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, vec!["cpu_ms", "max_log_lines"]);
        assert_eq!(changed[0].1, old.cpu_ms.to_string());
        assert_eq!(changed[0].2, (old.cpu_ms + 1).to_string());
        assert!(changed_settings(&old, &old.clone()).is_empty());
    }
}
