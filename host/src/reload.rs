//! Hot reload: swap a plugin's component while the pool runs.
//!
//! A reload reads each configured plugin's file and compares its content
//! hash with the version serving now. A changed component is compiled on a
//! blocking thread (off the hot path), checked against the allowed world,
//! and swapped in atomically: deliveries admitted after the swap run the new
//! version, executions already running finish on the one they started with
//! (each holds its own `Arc<Plugin>`). A component that fails to compile or
//! check is refused with a log line saying why, and the old version keeps
//! serving. A half-written file is just such a refusal; the write that
//! completes it triggers the next reload.
//!
//! Reloads happen when a plugin file changes (the `notify` crate watches
//! the plugin directories, those of plugins a SIGHUP adds included,
//! `worker.watch_plugins`) and on SIGHUP, which also
//! re-reads the configuration file for new or changed `[plugins.NAME]`
//! sections.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::capabilities::Grants;
use crate::claim::ClaimAdmin;
use crate::config::{changed_settings, take_reloadable, Config, PluginConfig};
use crate::runtime::Runtime;

/// Changes are applied once the plugin files have been quiet this long.
const QUIET: Duration = Duration::from_millis(200);

/// ...or once this long has passed since the first change of a burst, so
/// that a directory that never stays quiet does not hold reloads back.
const LONGEST_BURST: Duration = Duration::from_secs(2);

/// What one reload did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    /// Plugins swapped to a new version: (name, old version, new version).
    pub swapped: Vec<(String, Option<String>, String)>,
    /// Plugins whose new component was refused: (name, why).
    pub refused: Vec<(String, String)>,
    /// The configuration file was re-read but refused (it does not parse
    /// or is not valid): why. Nothing was reloaded then.
    pub config_refused: Option<String>,
    /// Global `[limits]` that changed: (setting, old, new), as logged.
    pub limits_changed: Vec<(String, String, String)>,
    /// Settings the file changed that a running pool cannot take (the
    /// backends, the worker, a plugin's `celery_task` or `key_pointer`, a
    /// plugin removed, which stays loaded…), by dotted name, as logged: not
    /// applied until a restart. Their values are not shown, as a URL may
    /// hold a password.
    pub needs_restart: Vec<String>,
}

/// Reloads the plugins of one pool.
pub struct Reloader {
    runtime: Arc<Runtime>,
    /// Where each plugin's key pointer is recorded.
    admin: Arc<dyn ClaimAdmin>,
    config_path: Option<PathBuf>,
    config: Mutex<Config>,
    /// One reload at a time.
    running: tokio::sync::Mutex<()>,
    /// The reloads that changed or refused something, newest last.
    history: Mutex<std::collections::VecDeque<(i64, ReloadReport)>>,
    /// The file watcher, once [`Reloader::watch`] started it, and the
    /// directories it watches: a plugin a SIGHUP adds in another directory
    /// is watched from then on.
    watching: Mutex<Option<(notify::RecommendedWatcher, BTreeSet<PathBuf>)>>,
}

/// Reloads kept in [`Reloader::history`].
const HISTORY: usize = 50;

impl Reloader {
    /// A reloader for a pool started from `config` (read from `config_path`,
    /// if it came from a file).
    pub fn new(runtime: Arc<Runtime>, admin: Arc<dyn ClaimAdmin>, config: Config, config_path: Option<PathBuf>) -> Arc<Self> {
        Arc::new(Reloader {
            runtime,
            admin,
            config_path,
            config: Mutex::new(config),
            running: tokio::sync::Mutex::new(()),
            history: Mutex::default(),
            watching: Mutex::default(),
        })
    }

    /// The directories holding the configured plugin files.
    pub fn watched_dirs(&self) -> BTreeSet<PathBuf> {
        let config = self.config.lock().expect("config poisoned");
        config
            .plugins
            .values()
            .map(|p| p.path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(".")))
            .map(|d| if d.as_os_str().is_empty() { PathBuf::from(".") } else { d })
            .collect()
    }

    /// Is `path` (as a watcher reports it) one of the configured plugin files?
    fn is_plugin_file(&self, path: &Path) -> bool {
        let Some(name) = path.file_name() else { return false };
        let config = self.config.lock().expect("config poisoned");
        config.plugins.values().any(|p| p.path.file_name() == Some(name))
    }

    /// Re-read the configuration file (SIGHUP): new plugin sections are
    /// loaded, changed grants and limits take effect (a change of the
    /// global `[limits]` is logged, setting by setting). Other settings need
    /// a restart: each one changed is logged by name and left as it runs,
    /// at every SIGHUP until the restart. A file that does not parse is
    /// refused and nothing is reloaded: the running plugins keep serving as
    /// they are.
    pub async fn reload_config(&self) -> ReloadReport {
        let mut limits_changed = Vec::new();
        let mut needs_restart = Vec::new();
        if let Some(path) = &self.config_path {
            match Config::load(path).and_then(|fresh| self.within_reservation(fresh)) {
                Ok(fresh) => {
                    let mut config = self.config.lock().expect("config poisoned");
                    limits_changed = changed_settings(&config.limits, &fresh.limits);
                    for (setting, old, new) in &limits_changed {
                        tracing::info!(setting = %format!("limits.{setting}"), %old, %new, "limit default changed: plugins without their own value run with the new one");
                    }
                    let taken = take_reloadable(&config, &fresh);
                    for name in &taken.removed {
                        tracing::warn!(plugin = %name, "plugin removed from the configuration; it stays loaded until the pool restarts");
                    }
                    for name in &taken.key_pointers {
                        tracing::error!(plugin = %name, "plugins.{name}.key_pointer changed: not applied, the idempotency keys must stay the same while messages are in flight; drain the queue and restart to change it");
                    }
                    for setting in &taken.left_out {
                        tracing::warn!(%setting, file = %path.display(), "setting changed in the configuration file but not applied: it takes a restart of the pool");
                    }
                    needs_restart = taken.restart_only();
                    *config = taken.next;
                    drop(config);
                    self.watch_new_dirs();
                }
                Err(e) => {
                    let why = format!("{e:#}");
                    tracing::error!(error = %why, file = %path.display(), "configuration not reloaded; the running plugins keep serving");
                    let report = ReloadReport {
                        config_refused: Some(why),
                        ..ReloadReport::default()
                    };
                    self.remember(&report);
                    return report;
                }
            }
        }
        let report = ReloadReport {
            limits_changed,
            needs_restart,
            ..self.reload_unrecorded(true).await
        };
        self.remember(&report);
        report
    }

    /// `fresh`, unless it gives a plugin more instance memory than the pool
    /// reserved at start: the whole file is then refused (as one that does
    /// not parse), so later reloads go on from the configuration running.
    fn within_reservation(&self, fresh: Config) -> Result<Config> {
        for name in fresh.plugins.keys() {
            self.runtime.memory_fits(name, fresh.limits_for(name).memory_bytes)?;
        }
        Ok(fresh)
    }

    /// Recompile every plugin whose file changed (or, with `force_settings`,
    /// whose grants or limits may have changed) and swap it in.
    pub async fn reload(&self, force_settings: bool) -> ReloadReport {
        let report = self.reload_unrecorded(force_settings).await;
        self.remember(&report);
        report
    }

    /// [`Reloader::reload`], leaving the report for the caller to record.
    async fn reload_unrecorded(&self, force_settings: bool) -> ReloadReport {
        let _one = self.running.lock().await;
        let (plugins, config) = {
            let config = self.config.lock().expect("config poisoned");
            (config.plugins.clone(), config.clone())
        };
        let mut report = ReloadReport::default();
        for (name, p) in plugins {
            let path = p.path.clone();
            let read = tokio::task::spawn_blocking(move || crate::plugin::read_component(&path)).await;
            let current = self.runtime.plugin(&name);
            // Grants and limits apply to the version serving whatever the
            // file holds: a narrowed grant must not wait on a file being
            // copied, missing, or one that does not compile.
            // (A plugin added back with another key pointer goes through
            // the compile and its check of the pointer instead.)
            let same_keys = current.as_ref().is_some_and(|c| c.key_pointer == p.key_pointer);
            let settings = |report: &mut ReloadReport| {
                if let (true, true, Some(current)) = (force_settings, same_keys, &current) {
                    self.apply_settings(&name, &p, current, &config, report);
                }
            };
            let bytes = match read.map_err(anyhow::Error::from).and_then(|r| r) {
                Ok(b) => b,
                Err(e) => {
                    refuse(&mut report, &name, &self.runtime, format!("{e:#}"));
                    settings(&mut report);
                    continue;
                }
            };
            let version = crate::plugin::version_of(&bytes);
            if current.as_ref().is_some_and(|c| c.version == version) && (same_keys || !force_settings) {
                settings(&mut report);
                continue;
            }
            match self.compile(&name, &p, bytes, &config).await {
                Err(e) => {
                    refuse(&mut report, &name, &self.runtime, format!("{e:#}"));
                    settings(&mut report);
                }
                Ok(plugin) => {
                    let old = current.map(|c| c.version.clone());
                    if old.as_deref() != Some(plugin.version.as_str()) {
                        tracing::info!(plugin = %name, old = old.as_deref().unwrap_or("none"), new = %plugin.version, "plugin reloaded: new deliveries run the new version");
                        metrics::counter!("idem_plugin_reloads_total", "plugin" => name.clone(), "result" => "swapped").increment(1);
                        report.swapped.push((name.clone(), old, plugin.version.clone()));
                    }
                    self.runtime.install(plugin);
                }
            }
        }
        report
    }

    /// Give the serving version of plugin `name` the grants and limits of
    /// `p` and `config`, without reading or compiling its file.
    fn apply_settings(&self, name: &str, p: &PluginConfig, current: &crate::runtime::Plugin, config: &Config, report: &mut ReloadReport) {
        let grants = Grants::new(p.collections.iter().cloned(), p.endpoints.iter().cloned());
        let limits = config.limits_for(name);
        if current.grants == grants && current.limits == limits {
            return;
        }
        match self.runtime.with_settings(current, grants, limits) {
            Ok(plugin) => self.runtime.install(plugin),
            Err(e) => refuse(report, name, &self.runtime, format!("{e:#}")),
        }
    }

    /// The last reloads that swapped or refused a plugin or refused the
    /// configuration, with when (Unix ms), oldest first.
    pub fn history(&self) -> Vec<(i64, ReloadReport)> {
        self.history.lock().expect("history poisoned").iter().cloned().collect()
    }

    /// Keep `report` in the history if it changed or refused something, or
    /// names settings waiting for a restart other than the last entry did
    /// (a SIGHUP repeated with the same file adds nothing).
    fn remember(&self, report: &ReloadReport) {
        if report.swapped.is_empty() && report.refused.is_empty() && report.config_refused.is_none() && report.needs_restart.is_empty() {
            return;
        }
        let mut history = self.history.lock().expect("history poisoned");
        let only_waiting = report.swapped.is_empty() && report.refused.is_empty() && report.config_refused.is_none();
        if only_waiting && history.back().is_some_and(|(_, last)| last.needs_restart == report.needs_restart) {
            return;
        }
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back((crate::now_ms(), report.clone()));
    }

    async fn compile(&self, name: &str, p: &PluginConfig, bytes: Vec<u8>, config: &Config) -> Result<Arc<crate::runtime::Plugin>> {
        // A plugin removed and added back, or new, must derive keys as the
        // namespace records.
        crate::claim::check_key_pointer(self.admin.as_ref(), name, p.key_pointer.as_deref()).await?;
        let grants = Grants::new(p.collections.iter().cloned(), p.endpoints.iter().cloned());
        self.runtime
            .compile(name, bytes, grants, config.limits_for(name), p.key_pointer.clone())
            .await
    }

    /// Watch the plugin directories; reload after each burst of changes.
    /// Runs until `stop` is cancelled, which also stops the watcher.
    pub fn watch(self: &Arc<Self>, stop: CancellationToken) -> Result<tokio::task::JoinHandle<()>> {
        let (tx, mut rx) = mpsc::unbounded_channel::<()>();
        // Weak: the reloader keeps the watcher, which keeps this callback.
        let files = Arc::downgrade(self);
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Only the plugin files count, and the links and directories
            // they may be reached through: other files in the directory (a
            // SQLite database, say) may change all the time.
            let (Ok(e), Some(files)) = (event, files.upgrade()) else { return };
            // (Writes to a file's data are no link's or directory's: the
            // writes of a database beside the plugins cost no look.)
            let written = matches!(e.kind, notify::EventKind::Modify(notify::event::ModifyKind::Data(_)));
            if !e.kind.is_access()
                && e.paths
                    .iter()
                    .any(|p| files.is_plugin_file(p) || (!written && may_lead_to_a_plugin(p)))
            {
                let _ = tx.send(());
            }
        })
        .context("cannot start watching the plugin files")?;
        let dirs = self.watched_dirs();
        for dir in &dirs {
            watcher.watch(dir, RecursiveMode::NonRecursive).with_context(|| {
                format!(
                    "cannot watch {} for plugin changes (set worker.watch_plugins = false to run without)",
                    dir.display()
                )
            })?;
        }
        *self.watching.lock().expect("watcher poisoned") = Some((watcher, dirs));
        let this = self.clone();
        Ok(tokio::spawn(async move {
            this.reload_on_changes(&mut rx, &stop).await;
            this.watching.lock().expect("watcher poisoned").take();
        }))
    }

    /// Reload after each burst of plugin file changes, until `stop`.
    async fn reload_on_changes(&self, rx: &mut mpsc::UnboundedReceiver<()>, stop: &CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = rx.recv() => if got.is_none() { return },
            }
            // Wait for the burst of events to end, or to have lasted
            // LONGEST_BURST (a file still being written then is refused,
            // and the write that completes it triggers the next reload).
            let ends = tokio::time::Instant::now() + LONGEST_BURST;
            loop {
                let quiet = QUIET.min(ends.saturating_duration_since(tokio::time::Instant::now()));
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(quiet) => break,
                    got = rx.recv() => if got.is_none() { return },
                }
            }
            self.reload(false).await;
        }
    }

    /// Watch the directories of plugins added since the watcher started (a
    /// SIGHUP's new sections). One that cannot be watched is logged, naming
    /// it: its plugin then reloads on SIGHUP only.
    fn watch_new_dirs(&self) {
        // The configuration's lock is not held here: the watcher's callback
        // takes it, and adding a watch waits for the watcher's thread.
        let dirs = self.watched_dirs();
        let mut watching = self.watching.lock().expect("watcher poisoned");
        let Some((watcher, watched)) = watching.as_mut() else { return };
        for dir in dirs {
            if watched.contains(&dir) {
                continue;
            }
            match watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "watching a new plugin directory");
                    watched.insert(dir);
                }
                Err(e) => tracing::warn!(
                    dir = %dir.display(),
                    error = %e,
                    "cannot watch the new plugin directory; its plugins reload on SIGHUP only"
                ),
            }
        }
    }
}

/// Is `path` (as a watcher reports it) a link or a directory? A plugin
/// file may be reached through one: a deploy that swaps a link (Kubernetes
/// mounts a ConfigMap as `name -> ..data/name`, and replaces `..data`)
/// changes the plugin without an event naming its file. A reload after one
/// compiles nothing unless a plugin's content changed.
fn may_lead_to_a_plugin(path: &Path) -> bool {
    path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink() || m.is_dir())
}

fn refuse(report: &mut ReloadReport, name: &str, runtime: &Runtime, why: String) {
    let serving = runtime.plugin(name).map(|p| p.version.clone());
    tracing::error!(
        plugin = %name,
        serving = serving.as_deref().unwrap_or("none"),
        reason = %why,
        "new plugin component refused; the loaded version keeps serving"
    );
    metrics::counter!("idem_plugin_reloads_total", "plugin" => name.to_string(), "result" => "refused").increment(1);
    report.refused.push((name.to_string(), why));
}
