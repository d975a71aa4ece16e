//! Operating a running pool, with real `idem run` processes: hot reload
//! (file watcher and SIGHUP), metrics and health over HTTP, graceful
//! shutdown with a grace period, dead-letter tools, `idem verify`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idem_host::backend::{self, Backends};
use idem_host::claim::ClaimState;
use idem_host::config::{Config, StoreKind};
use serde_json::json;

use crate::common::*;

/// A running `idem run`: its config file, log file and HTTP address.
struct Running {
    child: Child,
    log: PathBuf,
    http: String,
}

impl Running {
    fn spawn(config: &Config, dir: &Path, name: &str, extra: &[&str]) -> Running {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let http = format!("127.0.0.1:{port}");
        let config_path = dir.join(format!("{name}.toml"));
        std::fs::write(&config_path, toml::to_string(config).unwrap()).unwrap();
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(extra)
            .args(["run", "--listen", &http, "--config"])
            .arg(&config_path)
            .env("IDEM_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn idem run");
        Running { child, log, http }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn wait_for_log(&self, needle: &str, after: usize) {
        wait_until(Duration::from_secs(30), &format!("{needle:?} in the worker's log"), || async {
            self.log().matches(needle).count() > after
        })
        .await;
    }

    async fn get(&self, path: &str) -> (u16, String) {
        match reqwest::get(format!("http://{}{path}", self.http)).await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    async fn wait_ready(&self) {
        wait_until(Duration::from_secs(30), "the worker to answer /readyz", || async {
            self.get("/readyz").await.0 == 200
        })
        .await;
    }

    async fn loaded_version(&self, plugin: &str) -> Option<String> {
        let (status, body) = self.get("/plugins").await;
        if status != 200 {
            return None;
        }
        let list: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        list.iter()
            .find(|p| p["name"] == plugin)
            .map(|p| p["version"].as_str().unwrap().to_string())
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap();
        assert!(ok.success());
    }

    async fn wait_exit(mut self) -> std::process::ExitStatus {
        tokio::task::spawn_blocking(move || self.child.wait().unwrap()).await.unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `bytes` with a custom section appended: another version (content hash)
/// of the same component, behaving the same.
fn with_custom_section(bytes: &[u8], tag: &str) -> Vec<u8> {
    let name = b"idem-test-version";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.extend_from_slice(tag.as_bytes());
    let mut out = bytes.to_vec();
    out.push(0); // custom section id
    let mut len = payload.len();
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(&payload);
    out
}

fn grants_batch(from: usize, to: usize) -> Vec<idem_host::envelope::Envelope> {
    (from..to)
        .map(|i| envelope(&format!("g-{i}"), "grant-credits", json!({ "user": format!("u{i}"), "balance": i })))
        .collect()
}

/// The version recorded with each claim of grant-credits, by key.
async fn claim_versions(db: &Path) -> std::collections::HashMap<String, String> {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display())).await.unwrap();
    let versions = versions_in(&pool).await;
    pool.close().await;
    versions
}

/// The version each grant-credits claim recorded, read through `pool`.
async fn versions_in(pool: &sqlx::SqlitePool) -> std::collections::HashMap<String, String> {
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT key, plugin_version FROM claims WHERE plugin = 'grant-credits'")
        .fetch_all(pool)
        .await
        .unwrap();
    rows.into_iter().collect()
}

async fn all_done(backends: &Backends, n: u64) -> bool {
    let c = backends.admin.counts().await.unwrap();
    c.done >= n && backends.broker.pending().await.unwrap() == 0
}

async fn check_credits(backends: &Backends, n: usize) {
    let credits = backends.data.scan("credits").await.unwrap();
    assert_eq!(credits.len(), n, "one balance per message");
    for (user, value) in credits {
        let i: usize = user[1..].parse().unwrap();
        assert_eq!(value, i.to_string().into_bytes(), "balance of {user}");
    }
}

/// An environment whose grant-credits component is a copy the test can
/// replace.
async fn reload_env(watch: bool) -> (Env, PathBuf, Vec<u8>) {
    let mut env = Env::new().await;
    let file = env.dir.path().join("grant_credits.wasm");
    let original = std::fs::read(plugin_dir().join("grant_credits.wasm")).unwrap();
    std::fs::write(&file, &original).unwrap();
    env.config.plugins.get_mut("grant-credits").unwrap().path = file.clone();
    env.config.worker.watch_plugins = watch;
    (env, file, original)
}

/// A runtime with `config`'s plugins loaded, and a reloader over it; with
/// `config_file`, `config` is written there first and a SIGHUP re-reads it.
async fn loaded_reloader(
    config: &idem_host::config::Config,
    config_file: Option<&std::path::Path>,
) -> (
    std::sync::Arc<idem_host::runtime::Runtime>,
    std::sync::Arc<idem_host::reload::Reloader>,
) {
    let runtime = std::sync::Arc::new(idem_host::runtime::Runtime::new(idem_host::app::runtime_options(config)).unwrap());
    idem_host::app::load_plugins(config, &runtime).await.unwrap();
    if let Some(file) = config_file {
        std::fs::write(file, toml::to_string(config).unwrap()).unwrap();
    }
    let backends = backend::open(config).await.unwrap();
    let reloader = idem_host::reload::Reloader::new(runtime.clone(), backends.admin.clone(), config.clone(), config_file.map(Into::into));
    (runtime, reloader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_replaced_while_messages_flow_is_swapped_without_losing_any() {
    let (env, file, original) = reload_env(true).await;
    let backends = backend::open(&env.config).await.unwrap();
    let worker = Running::spawn(&env.config, env.dir.path(), "reload", &[]);
    worker.wait_ready().await;
    let v1 = worker.loaded_version("grant-credits").await.unwrap();

    // Messages keep arriving during the whole replacement.
    let stop = tokio_util::sync::CancellationToken::new();
    let publisher = {
        let (backends, stop) = (backends.clone(), stop.clone());
        tokio::spawn(async move {
            let mut sent = 0;
            while !stop.is_cancelled() {
                backends
                    .broker
                    .publish(&grants_batch(sent, sent + 20), Duration::ZERO)
                    .await
                    .unwrap();
                sent += 20;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            sent
        })
    };
    wait_until(Duration::from_secs(30), "messages flowing on the first version", || async {
        backends.admin.counts().await.unwrap().done >= 100
    })
    .await;

    // A half-written file (as a slow copy leaves it) is refused...
    let v2_bytes = with_custom_section(&original, "v2");
    let refused_before = worker.log().matches("new plugin component refused").count();
    std::fs::write(&file, &v2_bytes[..v2_bytes.len() / 2]).unwrap();
    worker.wait_for_log("new plugin component refused", refused_before).await;
    assert_eq!(worker.loaded_version("grant-credits").await.as_deref(), Some(v1.as_str()));
    // ...and the write that completes it is loaded.
    std::fs::write(&file, &v2_bytes).unwrap();
    wait_until(Duration::from_secs(30), "the new version to be loaded", || async {
        worker.loaded_version("grant-credits").await.is_some_and(|v| v != v1)
    })
    .await;
    let v2 = worker.loaded_version("grant-credits").await.unwrap();
    assert_eq!(v2, idem_host::plugin::version_of(&v2_bytes));
    // Messages admitted before the swap still finish on v1; wait for the
    // claims themselves to show the flow on v2.
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", env.config.database.path.display()))
        .await
        .unwrap();
    wait_until(Duration::from_secs(30), "messages flowing on the new version", || async {
        versions_in(&db).await.values().filter(|v| **v == v2).count() >= 200
    })
    .await;
    stop.cancel();
    let sent = publisher.await.unwrap();

    wait_until(Duration::from_secs(60), "every message done", || all_done(&backends, sent as u64)).await;
    check_credits(&backends, sent).await;
    let counts = backends.admin.counts().await.unwrap();
    assert_eq!((counts.done, counts.dead, counts.dead_letters), (sent as u64, 0, 0));
    let versions = versions_in(&db).await;
    assert_eq!(versions.len(), sent);
    for (key, version) in &versions {
        assert!(
            version == &v1 || version == &v2,
            "{key} ran version {version}, neither {v1} nor {v2}"
        );
    }
    let on_v1 = versions.values().filter(|v| **v == v1).count();
    let on_v2 = versions.values().filter(|v| **v == v2).count();
    assert!(
        on_v1 >= 100 && on_v2 >= 100,
        "both versions served the flow: {on_v1} on v1, {on_v2} on v2"
    );

    // `idem plugin list` asks the running pool.
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["plugin", "list", "--json", "--url", &worker.http])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        listed.iter().any(|p| p["name"] == "grant-credits" && p["version"] == v2.as_str()),
        "{listed:?}"
    );
    assert!(listed.iter().any(|p| p["name"] == "record-payment"), "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_replacement_is_refused_and_the_old_version_keeps_serving() {
    // No file watcher here: SIGHUP triggers the reload.
    let (env, file, original) = reload_env(false).await;
    let backends = backend::open(&env.config).await.unwrap();
    let worker = Running::spawn(&env.config, env.dir.path(), "refuse", &[]);
    worker.wait_ready().await;
    let v1 = worker.loaded_version("grant-credits").await.unwrap();
    assert_eq!(v1, idem_host::plugin::version_of(&original));

    // A component that imports sockets is refused at the check, by name.
    std::fs::copy(plugin_dir().join("sneaky_net.wasm"), &file).unwrap();
    worker.signal("-HUP");
    worker.wait_for_log("new plugin component refused", 0).await;
    let log = worker.log();
    assert!(log.contains("wasi:sockets"), "the refusal names the import:\n{log}");
    // Garbage is refused as not a component.
    std::fs::write(&file, b"not a component").unwrap();
    worker.signal("-HUP");
    worker.wait_for_log("new plugin component refused", 1).await;
    assert!(worker.log().contains("not a valid WebAssembly component"));

    backends.broker.publish(&grants_batch(0, 50), Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(30), "50 messages done", || all_done(&backends, 50)).await;
    check_credits(&backends, 50).await;
    assert_eq!(worker.loaded_version("grant-credits").await, Some(v1.clone()));
    let versions = claim_versions(&env.config.database.path).await;
    assert!(
        versions.values().all(|v| v == &v1),
        "every message ran the old version: {versions:?}"
    );
    let counts = backends.admin.counts().await.unwrap();
    assert_eq!((counts.done, counts.dead_letters), (50, 0));
}

/// A plugin a SIGHUP adds from a directory the watcher was not watching is
/// watched from then on: replacing its file swaps it in without another
/// SIGHUP. (Before, only the directories of the plugins configured at start
/// were watched, and the new plugin reloaded on SIGHUP alone.) Stopping the
/// watcher drops it and what it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_added_by_sighup_in_a_new_directory_is_watched() {
    let (env, _, original) = reload_env(true).await;
    let path = env.dir.path().join("idem.toml");
    let (runtime, reloader) = loaded_reloader(&env.config, Some(&path)).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let watching = reloader.watch(stop.clone()).unwrap();

    let elsewhere = env.dir.path().join("added");
    std::fs::create_dir(&elsewhere).unwrap();
    let file = elsewhere.join("grant_credits_too.wasm");
    std::fs::write(&file, &original).unwrap();
    let mut config = env.config.clone();
    let mut added = config.plugins["grant-credits"].clone();
    added.path = file.clone();
    config.plugins.insert("grant-credits-too".to_string(), added);
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    let report = reloader.reload_config().await;
    assert!(report.swapped.iter().any(|(name, _, _)| name == "grant-credits-too"), "{report:?}");
    let v1 = runtime.plugin("grant-credits-too").unwrap().version.clone();

    let v2_bytes = with_custom_section(&original, "v2");
    std::fs::write(&file, &v2_bytes).unwrap();
    let v2 = idem_host::plugin::version_of(&v2_bytes);
    wait_until(Duration::from_secs(30), "the added plugin's new file to be swapped in", || async {
        runtime.plugin("grant-credits-too").is_some_and(|p| p.version == v2)
    })
    .await;
    assert_ne!(v1, v2);
    // Stopping the watcher lets go of the reloader (its callback held it).
    stop.cancel();
    watching.await.unwrap();
    assert_eq!(
        std::sync::Arc::strong_count(&reloader),
        1,
        "the stopped watcher still holds the reloader"
    );
}

/// A plugin file reached through a link that a deploy swaps (the layout
/// of a Kubernetes ConfigMap or Secret volume: `name -> ..data/name`,
/// `..data -> ..<timestamp>`, and a deploy renames a new `..data` over the
/// old) is reloaded by the watcher: no event names the plugin file. Before,
/// only events naming a plugin file counted and the old version served on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_deployed_by_swapping_a_link_is_swapped_in() {
    use std::os::unix::fs::symlink;
    let (mut env, _, original) = reload_env(true).await;
    let mounted = env.dir.path().join("mounted");
    let deploy = |version: &str, bytes: &[u8]| {
        let dir = mounted.join(format!("..{version}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("grant_credits.wasm"), bytes).unwrap();
        symlink(format!("..{version}"), mounted.join("..data_tmp")).unwrap();
        std::fs::rename(mounted.join("..data_tmp"), mounted.join("..data")).unwrap();
    };
    deploy("2026_12_07_v1", &original);
    symlink("..data/grant_credits.wasm", mounted.join("grant_credits.wasm")).unwrap();
    env.config.plugins.get_mut("grant-credits").unwrap().path = mounted.join("grant_credits.wasm");
    let (runtime, reloader) = loaded_reloader(&env.config, None).await;
    let v1 = runtime.plugin("grant-credits").unwrap().version.clone();
    assert_eq!(v1, idem_host::plugin::version_of(&original));
    let stop = tokio_util::sync::CancellationToken::new();
    let watching = reloader.watch(stop.clone()).unwrap();

    let v2_bytes = with_custom_section(&original, "v2");
    deploy("2026_12_07_v2", &v2_bytes);
    std::fs::remove_dir_all(mounted.join("..2026_12_07_v1")).unwrap();
    let v2 = idem_host::plugin::version_of(&v2_bytes);
    wait_until(
        Duration::from_secs(30),
        "the version behind the swapped link to be swapped in",
        || async { runtime.plugin("grant-credits").is_some_and(|p| p.version == v2) },
    )
    .await;
    assert_ne!(v1, v2);
    stop.cancel();
    watching.await.unwrap();
}

/// A plugin directory that never stays quiet (here a directory beside the
/// plugin made and removed every 40 ms, each an event the watcher counts)
/// does not hold a replaced plugin back: a burst of changes is applied
/// once it has lasted two seconds. Before, the watcher waited for 200 ms
/// without an event, which never came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_replaced_in_a_directory_that_never_stays_quiet_is_swapped_in() {
    let (env, file, original) = reload_env(true).await;
    let (runtime, reloader) = loaded_reloader(&env.config, None).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let watching = reloader.watch(stop.clone()).unwrap();
    let churn = {
        let (dir, stop) = (env.dir.path().join("churn"), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                std::fs::create_dir(&dir).unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
                std::fs::remove_dir(&dir).unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let v2_bytes = with_custom_section(&original, "v2");
    std::fs::write(&file, &v2_bytes).unwrap();
    let v2 = idem_host::plugin::version_of(&v2_bytes);
    wait_until(Duration::from_secs(30), "the replaced plugin to be swapped in", || async {
        runtime.plugin("grant-credits").is_some_and(|p| p.version == v2)
    })
    .await;
    assert!(!churn.is_finished(), "swapped in while the directory still changed");
    stop.cancel();
    churn.await.unwrap();
    watching.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_broken_configuration_reloads_nothing_and_new_limit_defaults_are_reported() {
    let (env, file, original) = reload_env(false).await;
    let path = env.dir.path().join("idem.toml");
    let (runtime, reloader) = loaded_reloader(&env.config, Some(&path)).await;
    let v1 = runtime.plugin("grant-credits").unwrap().version.clone();

    // A new component on disk, and a configuration that no longer parses:
    // nothing is re-read, the old version keeps serving.
    std::fs::write(&file, with_custom_section(&original, "v2")).unwrap();
    std::fs::write(&path, "[worker\nconcurrency = ").unwrap();
    let report = reloader.reload_config().await;
    assert!(report.config_refused.is_some(), "{report:?}");
    assert!(report.swapped.is_empty() && report.refused.is_empty(), "{report:?}");
    assert_eq!(runtime.plugin("grant-credits").unwrap().version, v1);

    // A valid configuration with a new CPU default: applied, and reported
    // setting by setting.
    let mut config = env.config.clone();
    config.limits.cpu_ms += 100;
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    let report = reloader.reload_config().await;
    assert_eq!(report.config_refused, None);
    assert_eq!(
        report.limits_changed,
        vec![(
            "cpu_ms".to_string(),
            env.config.limits.cpu_ms.to_string(),
            config.limits.cpu_ms.to_string()
        )]
    );
    assert!(report.swapped.iter().any(|(name, _, _)| name == "grant-credits"), "{report:?}");
    assert_eq!(runtime.plugin("grant-credits").unwrap().limits.cpu_ms, config.limits.cpu_ms);
    assert!(report.needs_restart.is_empty(), "{report:?}");

    // Settings a running pool cannot take (the worker's, the retry
    // policy's) are named, not applied, and named again at the next
    // reload while the file still differs; the limits in the same file
    // are applied.
    let mut restart = config.clone();
    restart.worker.concurrency += 3;
    restart.retry.max_attempts += 1;
    restart.limits.cpu_ms += 50;
    std::fs::write(&path, toml::to_string(&restart).unwrap()).unwrap();
    let before = reloader.history().len();
    for _ in 0..2 {
        let report = reloader.reload_config().await;
        assert_eq!(report.config_refused, None, "{report:?}");
        assert_eq!(report.needs_restart, ["retry.max_attempts", "worker.concurrency"], "{report:?}");
        assert_eq!(runtime.plugin("grant-credits").unwrap().limits.cpu_ms, restart.limits.cpu_ms);
    }
    // In the reload history the console shows: once; the same file again
    // adds nothing.
    let history = reloader.history();
    assert_eq!(history.len(), before + 1, "{history:?}");
    let last = &history.last().unwrap().1;
    assert_eq!(last.needs_restart, ["retry.max_attempts", "worker.concurrency"], "{last:?}");
    let config = restart;

    // More memory than the pool reserved at start cannot be given by a
    // reload: the file is refused, naming the limit and the restart, and
    // the plugins keep serving with what they had; a new component is
    // still swapped in under the configuration running.
    let before = runtime.plugin("grant-credits").unwrap().limits.memory_bytes;
    let mut greedy = config.clone();
    greedy.limits.memory_bytes = runtime.max_memory_bytes() + 1;
    greedy.limits.cpu_ms += 100;
    std::fs::write(&path, toml::to_string(&greedy).unwrap()).unwrap();
    let report = reloader.reload_config().await;
    let why = report.config_refused.clone().unwrap_or_else(|| panic!("{report:?}"));
    assert!(why.contains("limits.memory_bytes") && why.contains("restart"), "{why}");
    assert!(report.limits_changed.is_empty(), "{report:?}");
    let running = runtime.plugin("grant-credits").unwrap();
    assert_eq!((running.limits.memory_bytes, running.limits.cpu_ms), (before, config.limits.cpu_ms));
    std::fs::write(&file, with_custom_section(&original, "v3")).unwrap();
    let report = reloader.reload(false).await;
    assert!(report.swapped.iter().any(|(name, _, _)| name == "grant-credits"), "{report:?}");
    assert!(report.refused.is_empty(), "{report:?}");
}

/// A SIGHUP that narrows a plugin's grants and limits applies them to the
/// version serving even when its file cannot be loaded then (half copied,
/// missing): the new file is refused, the settings are not. Before, they
/// took effect only with a new compile, and the wider grant kept serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_narrowing_grants_applies_them_while_the_file_cannot_be_loaded() {
    let (env, file, original) = reload_env(false).await;
    let path = env.dir.path().join("idem.toml");
    let (runtime, reloader) = loaded_reloader(&env.config, Some(&path)).await;
    let serving = runtime.plugin("grant-credits").unwrap();
    assert!(!serving.grants.collections.is_empty(), "{:?}", serving.grants);
    // A SIGHUP that changes nothing leaves the plugin serving as it is.
    let report = reloader.reload_config().await;
    assert!(report.refused.is_empty() && report.swapped.is_empty(), "{report:?}");
    let same = runtime.plugin("grant-credits").unwrap();
    assert!(std::sync::Arc::ptr_eq(&same, &serving), "unchanged: the same plugin serves");

    let mut narrowed = env.config.clone();
    let plugin = narrowed.plugins.get_mut("grant-credits").unwrap();
    plugin.collections.clear();
    plugin.limits = Some(idem_host::config::LimitsOverride {
        cpu_ms: Some(env.config.limits.cpu_ms / 2),
        ..Default::default()
    });
    std::fs::write(&path, toml::to_string(&narrowed).unwrap()).unwrap();
    for (broken, what) in [(&original[..original.len() / 2], "half copied"), (&[][..], "emptied")] {
        std::fs::write(&file, broken).unwrap();
        let report = reloader.reload_config().await;
        assert!(report.refused.iter().any(|(name, _)| name == "grant-credits"), "{what}: {report:?}");
        let now = runtime.plugin("grant-credits").unwrap();
        assert_eq!(now.version, serving.version, "{what}: the version serving stays");
        assert!(
            now.grants.collections.is_empty(),
            "{what}: the narrowed grant applies: {:?}",
            now.grants
        );
        assert_eq!(now.limits.cpu_ms, env.config.limits.cpu_ms / 2, "{what}");
        assert_eq!(
            now.loaded_at, serving.loaded_at,
            "{what}: the version serving was loaded when it was"
        );
    }
    std::fs::remove_file(&file).unwrap();
    let report = reloader.reload_config().await;
    assert!(
        report.refused.iter().any(|(name, _)| name == "grant-credits"),
        "missing: {report:?}"
    );
    assert!(runtime.plugin("grant-credits").unwrap().grants.collections.is_empty());
}

/// The value of one metric line (`name{labels} value`), if present.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_report_a_known_run() {
    let env = Env::new().await;
    let backends = backend::open(&env.config).await.unwrap();
    let worker = Running::spawn(&env.config, env.dir.path(), "metrics", &["--log-format", "json"]);
    assert_eq!(worker_healthz(&worker).await, 200);
    worker.wait_ready().await;
    let (_, ready) = worker.get("/readyz").await;
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready, json!({ "ready": true, "broker": "ok", "claims": "ok", "data": "ok" }));

    // 20 grants, one of them published twice, and one permanent failure.
    let mut batch = grants_batch(0, 20);
    batch.push(envelope("poison-p", "poison", json!({ "mode": "permanent" })));
    backends.broker.publish(&batch, Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(30), "21 messages settled", || async {
        let c = backends.admin.counts().await.unwrap();
        c.done == 20 && c.dead == 1
    })
    .await;
    backends.broker.publish(&grants_batch(7, 8), Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(30), "the duplicate acked", || async {
        backends.broker.pending().await.unwrap() == 0
    })
    .await;

    let text = wait_for(Duration::from_secs(30), "the metrics to show the run", || async {
        let text = worker.get("/metrics").await.1;
        (metric(&text, "idem_messages_total{outcome=\"duplicate\"}") == Some(1.0)).then_some(text)
    })
    .await;
    let m = |series: &str| metric(&text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"));
    assert_eq!(m("idem_messages_total{outcome=\"done\"}"), 20.0);
    assert_eq!(m("idem_messages_total{outcome=\"dead_lettered\"}"), 1.0);
    assert_eq!(m("idem_messages_total{outcome=\"conflict\"}"), 0.0);
    assert_eq!(m("idem_messages_total{outcome=\"retry\"}"), 0.0);
    assert_eq!(m("idem_executions_total"), 21.0);
    assert_eq!(m("idem_permanent_errors_total"), 1.0);
    assert_eq!(m("idem_fence_rejections_total"), 0.0);
    assert_eq!(m("idem_dead_letters"), 1.0);
    assert_eq!(m("idem_in_flight"), 0.0);
    assert_eq!(m("idem_handler_duration_seconds_count{plugin=\"grant-credits\"}"), 20.0);
    assert_eq!(m("idem_handler_duration_seconds_count{plugin=\"poison\"}"), 1.0);
    assert!(
        text.contains("idem_plugin_loaded_at_seconds{plugin=\"grant-credits\",version=\""),
        "{text}"
    );

    // Logs are JSON lines; a message's lines carry its span.
    let log = worker.log();
    let dead = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["fields"]["message"] == "dead-lettered")
        .unwrap_or_else(|| panic!("no JSON dead-letter line in:\n{log}"));
    assert_eq!(dead["span"]["plugin"], "poison");
    assert_eq!(dead["span"]["key"], "poison-p");
    assert_eq!(dead["span"]["attempt"], 1);
}

async fn worker_healthz(worker: &Running) -> u16 {
    wait_for(Duration::from_secs(30), "the worker to answer /healthz", || async {
        let status = worker.get("/healthz").await.0;
        (status != 0).then_some(status)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_releases_what_outlives_the_grace_period_and_loses_nothing() {
    let mut env = Env::new().await;
    env.config.worker.shutdown_grace_ms = 300;
    // This order's reservation step hangs until released: its handler is
    // still running when the grace period ends.
    env.mock.state.lock().unwrap().held.insert("inventory/ord-term".into());
    let backends = backend::open(&env.config).await.unwrap();
    env.mock.watch_journal(backends.claims.clone());
    let mut batch = vec![envelope(
        "msg-ord-term",
        "fulfil-order",
        json!({ "order_id": "ord-term", "customer": "c", "email": "c@example.com", "sku": "s", "quantity": 1, "amount_cents": 900 }),
    )];
    batch.extend(grants_batch(0, 200));
    backends.broker.publish(&batch, Duration::ZERO).await.unwrap();

    let first = Running::spawn(&env.config, env.dir.path(), "term-1", &[]);
    crate::common::wait_for_held(&env.mock, "the order's handler reached the held step").await;
    first.signal("-TERM");
    let status = first.wait_exit().await;
    assert!(status.success(), "exit 0 after SIGTERM: {status:?}");
    // The held handler outlived the grace period: its claim was released
    // (not left running until the lease ends) and its delivery not acked.
    assert_eq!(
        backends
            .admin
            .state("fulfil-order", "ord-term")
            .await
            .unwrap()
            .map(ClaimState::as_str),
        Some("retry")
    );
    let log = std::fs::read_to_string(env.dir.path().join("term-1.log")).unwrap();
    assert!(log.contains("shutdown grace period over"), "{log}");
    assert!(log.contains("claim released for redelivery"), "{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
    assert!(backends.broker.pending().await.unwrap() >= 1);

    // A second worker finishes everything; the journaled charge is not repeated.
    env.mock.release();
    let second = Running::spawn(&env.config, env.dir.path(), "term-2", &[]);
    wait_until(Duration::from_secs(60), "everything done", || all_done(&backends, 201)).await;
    check_credits(&backends, 200).await;
    for api in ["payments", "inventory", "email"] {
        assert_eq!(env.mock.performed(api, "ord-term"), 1, "{api}");
    }
    assert_eq!(env.mock.calls_after_journal(), 0);
    let counts = backends.admin.counts().await.unwrap();
    assert_eq!((counts.done, counts.dead, counts.running, counts.retry), (201, 0, 0, 0));
    second.signal("-TERM");
    assert!(second.wait_exit().await.success());
}

/// Dead-letter a payment whose API keeps failing, replay it once the API
/// works, and purge a poison message, on the given claim store.
async fn dead_letter_round_trip(mut env: Env, tag: &str) {
    env.config.retry.max_attempts = 2;
    let config_path = env.dir.path().join(format!("{tag}.toml"));
    std::fs::write(&config_path, toml::to_string(&env.config).unwrap()).unwrap();
    // The payments API fails the first two requests for pay-dl.
    env.mock.state.lock().unwrap().flaky.insert("pay-dl".into(), 2);
    let pool = env.start().await;
    pool.backends
        .broker
        .publish(
            &[
                envelope(
                    "msg-pay-dl",
                    "record-payment",
                    json!({ "payment_id": "pay-dl", "customer": "c", "amount_cents": 700 }),
                ),
                envelope("msg-poison", "poison", json!({ "mode": "permanent" })),
            ],
            Duration::ZERO,
        )
        .await
        .unwrap();
    drain(&pool).await;
    assert_eq!(state(&pool, "record-payment", "pay-dl").await, Some("dead"));

    let (ok, out, err) = idem(&config_path, &["dlq", "list", "--json"]);
    assert!(ok, "{err}");
    let letters: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(letters.len(), 2, "{letters:?}");
    let pay = letters.iter().find(|d| d["plugin"] == "record-payment").unwrap();
    let id = pay["id"].as_i64().unwrap().to_string();

    let (ok, out, err) = idem(&config_path, &["dlq", "show", &id, "--json"]);
    assert!(ok, "{err}");
    let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["msg_id"], "msg-pay-dl");
    assert_eq!(shown["attempts"], 2);
    assert!(shown["reason"].as_str().unwrap().contains("503"), "{shown}");
    assert_eq!(
        shown["plugin_version"].as_str(),
        Some(pool.runtime.plugin("record-payment").unwrap().version.as_str())
    );
    let payload: serde_json::Value = serde_json::from_str(shown["payload"].as_str().unwrap()).unwrap();
    assert_eq!(payload["payment_id"], "pay-dl");
    let (ok, out, _) = idem(&config_path, &["dlq", "show", &id]);
    assert!(ok && out.contains("msg-pay-dl") && out.contains("attempts        2"), "{out}");
    let (ok, _, err) = idem(&config_path, &["dlq", "show", "999999"]);
    assert!(!ok && err.contains("no dead letter with id 999999"), "{err}");

    // Replay: the API works now; the message completes.
    let (ok, out, err) = idem(&config_path, &["dlq", "replay", &id]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("replayed dead letter {id}")), "{out}");
    wait_until(Duration::from_secs(30), "the replayed payment to be done", || async {
        state(&pool, "record-payment", "pay-dl").await == Some("done")
    })
    .await;
    drain(&pool).await;
    assert_eq!(env.mock.performed("payments", "pay-dl"), 1);
    let stored = pool.backends.data.get("payments", "pay-dl").await.unwrap();
    assert!(stored.is_some(), "the replayed handler ran to the end");
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1, "the replayed record is gone: {letters:?}");
    assert_eq!(letters[0].plugin, "poison");

    // Purge the rest of one plugin's dead letters.
    let (ok, _, err) = idem(&config_path, &["dlq", "purge", "--all", "--plugin", "poison"]);
    assert!(ok, "{err}");
    assert!(err.contains("1 dead letter(s) deleted"), "{err}");
    assert!(pool.backends.admin.dead_letters(10).await.unwrap().is_empty());
    assert_eq!(
        state(&pool, "poison", "msg-poison").await,
        Some("dead"),
        "purge keeps the claim dead"
    );
    pool.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replay_and_purge_on_sqlite() {
    dead_letter_round_trip(Env::new().await, "dlq-sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replay_and_purge_on_postgres() {
    let mut env = Env::new().await;
    env.config.namespace = unique_namespace("dlqpg");
    env.config.claims.kind = StoreKind::Postgres;
    env.config.claims.url = Some(services::postgres());
    env.config.data.kind = StoreKind::Postgres;
    env.config.data.url = Some(services::postgres());
    dead_letter_round_trip(env, "dlq-postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replay_and_purge_on_redis_claims() {
    let mut env = Env::new().await;
    env.config.namespace = unique_namespace("dlqredis");
    env.config.claims.kind = StoreKind::Redis;
    env.config.claims.url = Some(services::redis());
    env.config.data.kind = StoreKind::Postgres;
    env.config.data.url = Some(services::postgres());
    dead_letter_round_trip(env, "dlq-redis").await;
}

fn verify(plugin: &str, input: &str) -> (bool, String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let plugins = plugin_dir();
    // The example configuration, its plugin paths pointed at this build.
    let text = std::fs::read_to_string(root.join("examples/embedded.toml"))
        .unwrap()
        .replace("../target/plugins/wasm32-wasip2/plugin", plugins.to_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("embedded.toml");
    std::fs::write(&config, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["verify", plugin, "--json", "--input"])
        .arg(root.join("examples/verify").join(input))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn verify_catches_the_non_idempotent_example() {
    let (ok, out, err) = verify("add-credits", "add-credits.jsonl");
    assert!(!ok, "verify must fail on add-credits:\n{out}\n{err}");
    let report: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let findings = report["findings"].as_array().unwrap();
    let kinds: Vec<&str> = findings.iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"second-run-changed-state"), "{out}");
    // The balance doubled and the attempt number changed on the second run.
    let changed = findings.iter().find(|f| f["kind"] == "second-run-changed-state").unwrap();
    let detail = changed["detail"].as_str().unwrap();
    assert!(detail.contains("accounts/alice"), "{detail}");
    assert!(
        detail.contains(r#"{"balance":100,"last_attempt":1} → {"balance":200,"last_attempt":2}"#),
        "{detail}"
    );
    assert!(out.contains("NOT IDEMPOTENT"), "{out}");
}

#[test]
fn verify_passes_the_idempotent_examples() {
    for (plugin, input) in [
        ("grant-credits", "grant-credits.jsonl"),
        ("record-payment", "record-payment.jsonl"),
        ("fulfil-order", "fulfil-order.jsonl"),
    ] {
        let (ok, out, err) = verify(plugin, input);
        assert!(ok, "{plugin}:\n{out}\n{err}");
        let report: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(report["findings"], json!([]), "{plugin}");
        assert!(report["messages"].as_u64().unwrap() >= 2, "{plugin}");
        // The reference runs themselves worked: each ended ok and wrote.
        for run in report["runs"].as_array().unwrap() {
            assert_eq!(run["outcome"], "ok", "{plugin}: {run}");
            assert!(run["changed"].as_u64().unwrap() >= 1, "{plugin}: {run}");
        }
        if plugin != "grant-credits" {
            assert!(
                report["runs"].as_array().unwrap().iter().all(|r| r["calls"].as_u64().unwrap() >= 1),
                "{plugin}: {report}"
            );
        }
    }
}

#[test]
fn verify_names_a_plugin_it_cannot_find() {
    let (ok, _, err) = verify("no-such-plugin", "grant-credits.jsonl");
    assert!(!ok);
    assert!(err.contains("\"no-such-plugin\" is neither a plugin of the configuration"), "{err}");
}

/// A plugin's key pointer is recorded in the namespace and checked on every
/// start and reload: removing a plugin and adding it back with another
/// pointer (which the old-config comparison cannot see) is refused, and so
/// is a restart with another pointer, until `idem plugin rekey` records it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_pointer_stays_fixed_for_the_namespace_across_reloads_and_restarts() {
    let env = Env::new().await;
    let pool = env.start().await;
    let path = env.dir.path().join("idem.toml");
    let reloader = idem_host::reload::Reloader::new(
        pool.runtime.clone(),
        pool.backends.admin.clone(),
        env.config.clone(),
        Some(path.clone()),
    );
    // SIGHUP without record-payment, then SIGHUP with it back, keyed by
    // another field.
    let mut without = env.config.clone();
    without.plugins.remove("record-payment");
    std::fs::write(&path, toml::to_string(&without).unwrap()).unwrap();
    let report = reloader.reload_config().await;
    assert!(report.refused.is_empty() && report.config_refused.is_none(), "{report:?}");
    assert_eq!(report.needs_restart, ["plugins.record-payment"], "it stays loaded: {report:?}");
    let mut rekeyed = env.config.clone();
    rekeyed.plugins.get_mut("record-payment").unwrap().key_pointer = Some("/customer".into());
    std::fs::write(&path, toml::to_string(&rekeyed).unwrap()).unwrap();
    let report = reloader.reload_config().await;
    let refused: Vec<&str> = report.refused.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(refused, vec!["record-payment"], "{report:?}");
    let why = &report.refused[0].1;
    assert!(
        why.contains("\"/customer\"") && why.contains("\"/payment_id\"") && why.contains("idem plugin rekey record-payment"),
        "{why}"
    );
    assert_eq!(
        pool.runtime.plugin("record-payment").unwrap().key_pointer.as_deref(),
        Some("/payment_id"),
        "the running plugin keeps its keys"
    );
    pool.stop().await.unwrap();

    // A restart with the other pointer is refused, naming both and the fix.
    let err = idem_host::app::Pool::start(&rekeyed).await.err().expect("refused");
    let msg = format!("{err:#}");
    assert!(msg.contains("plugins.record-payment.key_pointer") && msg.contains("rekey"), "{msg}");

    // The operator records the new pointer (queue drained): it starts.
    pool_admin(&rekeyed)
        .await
        .set_key_pointer("record-payment", "/customer", 0)
        .await
        .unwrap();
    let pool = idem_host::app::Pool::start(&rekeyed)
        .await
        .expect("starts with the recorded pointer");
    pool.stop().await.unwrap();
}

async fn pool_admin(config: &idem_host::config::Config) -> std::sync::Arc<dyn idem_host::claim::ClaimAdmin> {
    backend::open(config).await.unwrap().admin
}

/// An execution keeps the version it started with: a reload that swaps the
/// plugin while a handler runs (held inside its charge) does not change the
/// code or the version that execution records; the next message runs the
/// new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_finishes_on_the_version_it_started_with_across_a_swap() {
    let mut env = Env::new().await;
    let file = env.dir.path().join("record_payment.wasm");
    let original = std::fs::read(plugin_dir().join("record_payment.wasm")).unwrap();
    std::fs::write(&file, &original).unwrap();
    env.config.plugins.get_mut("record-payment").unwrap().path = file.clone();
    env.mock.state.lock().unwrap().held.insert("payments/pay-pin".into());
    let pool = env.start().await;
    let reloader = idem_host::reload::Reloader::new(pool.runtime.clone(), pool.backends.admin.clone(), env.config.clone(), None);
    let v1 = pool.runtime.plugin("record-payment").unwrap().version.clone();
    let pay = |id: &str| {
        envelope(
            id,
            "record-payment",
            json!({ "payment_id": id, "customer": "c", "amount_cents": 5 }),
        )
    };
    pool.backends.broker.publish(&[pay("pay-pin")], Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(30), "the charge to reach the API and be held", || async {
        env.mock.total_requests() >= 1
    })
    .await;

    std::fs::write(&file, with_custom_section(&original, "v2")).unwrap();
    let report = reloader.reload(false).await;
    assert_eq!(report.swapped.len(), 1, "{report:?}");
    let v2 = pool.runtime.plugin("record-payment").unwrap().version.clone();
    assert_ne!(v1, v2);
    env.mock.release();
    pool.backends.broker.publish(&[pay("pay-after")], Duration::ZERO).await.unwrap();
    drain(&pool).await;

    let journal = |key: &'static str| {
        let db = env.config.database.path.clone();
        async move {
            let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display())).await.unwrap();
            let v: String = sqlx::query_scalar("SELECT plugin_version FROM journal WHERE plugin = 'record-payment' AND key = ?1")
                .bind(key)
                .fetch_one(&pool)
                .await
                .unwrap();
            v
        }
    };
    assert_eq!(journal("pay-pin").await, v1, "the running execution kept its version");
    assert_eq!(journal("pay-after").await, v2, "the next message ran the new one");
    assert_eq!(state(&pool, "record-payment", "pay-pin").await, Some("done"));
    pool.stop().await.unwrap();
}
