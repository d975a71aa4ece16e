//! `idem demo`: everything that goes wrong under at-least-once delivery, in
//! one process, checked exactly.
//!
//! The example plugins run against a local mock of payment, inventory and
//! email APIs. The run injects duplicates (some published back to back so
//! they run concurrently, some published late), a broker visibility timeout
//! shorter than the slowest handler (so the broker redelivers messages that
//! are still running), flaky endpoint answers (transient retries), simulated
//! worker crashes right after a charge was journaled, and one poison
//! message. When the queue has drained it counts effects in the store and
//! at the mock, and checks that none is doubled and no message is lost.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::app::Pool;
use crate::claim::ClaimState;
use crate::config::{Config, EndpointConfig, OutagePolicy, PluginConfig, RetryConfig, WorkerConfig};
use crate::hooks::{CrashInjector, Hooks};
use crate::tools::kit::Mock;
use crate::tools::sdk::Lang;
use crate::worker::WorkerOptions;
use schedule::Kind;
pub use schedule::Schedule;

mod schedule;

/// Arguments of `idem demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Distinct messages to publish (duplicates come on top).
    #[arg(long, default_value_t = 1000)]
    pub messages: usize,
    /// Seed of the schedule (which messages are duplicated, slow, flaky or crash).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Handlers running at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Directory holding the built plugin components.
    #[arg(long, env = "IDEM_PLUGIN_DIR", default_value = "target/plugins/wasm32-wasip2/plugin")]
    pub plugins: PathBuf,
    /// Keep the demo database here instead of a temporary directory.
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Print one JSON object as the last line.
    #[arg(long)]
    pub json: bool,
    /// Give up if the queue has not drained after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// The language of the example plugins to run: the Rust ones
    /// (plugins/), or their ports under guest-sdk/python/examples or
    /// guest-sdk/js/examples.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
}

/// What the demo measured.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct DemoReport {
    /// Distinct messages published.
    pub messages: u64,
    /// Publishes including duplicates.
    pub published: u64,
    /// Deliveries fetched from the broker (duplicates and redeliveries included).
    pub deliveries: u64,
    /// Handler executions started.
    pub executions: u64,
    /// Deliveries of already-settled messages, acked without running.
    pub duplicates_suppressed: u64,
    /// Deliveries of messages still running elsewhere, redelivered later.
    pub busy_redeliveries: u64,
    /// Transient failures and traps retried with backoff.
    pub retries: u64,
    /// Simulated worker crashes.
    pub crashes: u64,
    /// External call results replayed from the journal instead of re-sent.
    pub journal_replays: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Distinct messages whose effect is in the store.
    pub effects: u64,
    /// Distinct effectful messages published (what `effects` must equal).
    pub expected_effects: u64,
    /// Requests received by the mock APIs.
    pub external_calls: u64,
    /// External effects performed at the mock APIs (one per step).
    pub external_effects: u64,
    /// Effects performed more than once (must be 0).
    pub double_effects: u64,
    /// Requests for a step whose response was already journaled (must be 0).
    pub calls_after_journal: u64,
    /// Executions stopped because their claim was taken over: their lease
    /// lapsed (a heartbeat held up longer than the lease's margin, as on a
    /// loaded machine) and another delivery of the message took it.
    pub fenced_out: u64,
    /// Steps answered more than once, whatever their keys. The demo's
    /// crashes come after the journal write, so the only way a step is sent
    /// again is an execution fenced out between its answer and its journal
    /// write (which the write refuses): at most one per fenced-out
    /// execution, and 0 when no lease lapsed.
    pub resent_steps: u64,
    /// Messages neither done nor dead-lettered (must be 0).
    pub lost: u64,
    /// Effectful messages whose store or external effect is missing (must be 0).
    pub missing_effects: u64,
    /// Wall time of the run, in milliseconds.
    pub elapsed_ms: u64,
}

impl DemoReport {
    /// Whether the run upheld the guarantees.
    pub fn ok(&self) -> bool {
        self.double_effects == 0
            && self.calls_after_journal == 0
            && self.resent_steps <= self.fenced_out
            && self.lost == 0
            && self.missing_effects == 0
            && self.effects == self.expected_effects
    }
}

/// The demo's configuration: short leases and a visibility timeout shorter
/// than the slowest handler, so redeliveries happen during the run.
pub fn demo_config(db: PathBuf, plugins: &std::path::Path, mock: &Mock, concurrency: usize) -> Config {
    let plugin = |file: &str, collections: &[&str], endpoints: &[&str], key: Option<&str>| PluginConfig {
        path: plugins.join(file),
        collections: collections.iter().map(|s| s.to_string()).collect(),
        endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
        key_pointer: key.map(str::to_string),
        celery_task: None,
        limits: None,
    };
    let endpoint = |api: &str| EndpointConfig {
        url: mock.url(api),
        timeout_ms: 5_000,
    };
    let mut config = Config::default();
    config.database.path = db;
    config.worker = WorkerConfig {
        concurrency,
        batch_size: 32,
        lease_ms: 1_000,
        heartbeat_ms: Some(300),
        visibility_ms: 250,
        busy_retry_ms: 200,
        poll_idle_ms: 20,
        outage_policy: OutagePolicy::Reject,
        // Compiled once beside the components, for every demo, chaos run
        // and test that loads them (an 18 MB Python component compiles in
        // seconds and loads from the cache in milliseconds).
        compile_cache_dir: Some(plugins.join(".compiled")),
        ..WorkerConfig::default()
    };
    config.retry = RetryConfig {
        max_attempts: 5,
        max_traps: 2,
        base_delay_ms: 50,
        max_delay_ms: 1_000,
        jitter: 0.5,
    };
    config.endpoints = BTreeMap::from([
        ("payments-api".to_string(), endpoint("payments")),
        ("inventory-api".to_string(), endpoint("inventory")),
        ("email-api".to_string(), endpoint("email")),
    ]);
    config.plugins = BTreeMap::from([
        (
            "record-payment".to_string(),
            plugin(
                "record_payment.wasm",
                &["payments", "receipts"],
                &["payments-api"],
                Some("/payment_id"),
            ),
        ),
        ("grant-credits".to_string(), plugin("grant_credits.wasm", &["credits"], &[], None)),
        (
            "fulfil-order".to_string(),
            plugin(
                "fulfil_order.wasm",
                &["orders"],
                &["payments-api", "inventory-api", "email-api"],
                Some("/order_id"),
            ),
        ),
        ("poison".to_string(), plugin("poison.wasm", &[], &[], None)),
    ]);
    config
}

/// Run the demo's plugins in `lang`: each Rust component `NAME.wasm` is
/// replaced by its port, `NAME_py.wasm` or `NAME_js.wasm`, from the same
/// directory.
pub fn use_lang(config: &mut Config, lang: Lang) {
    let suffix = match lang {
        Lang::Rust => return,
        Lang::Python => "_py",
        Lang::Js => "_js",
    };
    for name in ["record-payment", "grant-credits", "fulfil-order", "poison"] {
        if let Some(plugin) = config.plugins.get_mut(name) {
            let stem = name.replace('-', "_");
            plugin.path.set_file_name(format!("{stem}{suffix}.wasm"));
        }
    }
}

/// Run the demo and return its report (no printing).
pub async fn run(args: &DemoArgs, progress: Option<&indicatif::ProgressBar>) -> Result<DemoReport> {
    let started = Instant::now();
    let tmp = tempfile::tempdir().context("cannot create a temporary directory for the demo database")?;
    let db = args.db.clone().unwrap_or_else(|| tmp.path().join("demo.db"));
    if db.exists() {
        bail!(
            "{} already exists: the demo needs a fresh database; remove it or choose another --db",
            db.display()
        );
    }
    let mock = Mock::start(Duration::from_millis(700)).await?;
    let mut config = demo_config(db, &args.plugins, &mock, args.concurrency);
    use_lang(&mut config, args.lang);
    for plugin in config.plugins.values() {
        let path = &plugin.path;
        if !path.exists() {
            bail!(
                "plugin {} not found: build the plugins with `cargo xtask demo` (or pass --plugins DIR)",
                path.display()
            );
        }
    }

    let schedule = Schedule::new(args.messages, args.seed, &mock);
    let crash_keys = Arc::new(schedule.crash_keys.clone());
    let injector: CrashInjector = {
        let keys = crash_keys.clone();
        Arc::new(move |_plugin: &str, key: &str, attempt: u32, step: &str| attempt == 1 && step == "charge" && keys.contains(key))
    };
    let options = WorkerOptions::from_config(&config);
    let pool = Pool::start_with(&config, options, Hooks::crashing(injector)).await?;
    mock.watch_journal(pool.backends.claims.clone());
    let published = schedule.publish(pool.backends.broker.as_ref()).await?;

    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    loop {
        let counts = pool.backends.admin.counts().await?;
        if let Some(bar) = progress {
            bar.set_position((counts.done + counts.dead).min(args.messages as u64));
        }
        let pending = pool.backends.broker.pending().await?;
        if pending == 0 && pool.worker.in_flight() == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the queue did not drain within {} s ({pending} deliveries pending)",
                args.timeout_secs
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let backends = pool.backends.clone();
    let counters = pool.counters.clone();
    pool.stop().await?;
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }

    let mut report = verify(&backends, &mock, &schedule).await?;
    report.published = published;
    let c = counters.snapshot();
    report.deliveries = c.deliveries;
    report.executions = c.executions;
    report.duplicates_suppressed = c.duplicates;
    report.busy_redeliveries = c.busy;
    report.retries = c.retries;
    report.crashes = c.crashes;
    report.fenced_out = c.fence_rejections;
    report.journal_replays = c.journal_replays;
    report.dead_lettered = c.dead_lettered;
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Check a drained run against its schedule: every message settled (done
/// or dead-lettered), every effect stored once and performed once at the
/// mock APIs, no journaled call sent again.
pub async fn verify(backends: &crate::backend::Backends, mock: &Mock, schedule: &Schedule) -> Result<DemoReport> {
    // Check: every message settled, every effect present once.
    let payments: HashSet<String> = backends.data.scan("payments").await?.into_iter().map(|(k, _)| k).collect();
    let credits: HashSet<String> = backends.data.scan("credits").await?.into_iter().map(|(k, _)| k).collect();
    let orders: HashSet<String> = backends
        .data
        .scan("orders")
        .await?
        .into_iter()
        .filter(|(_, v)| {
            serde_json::from_slice::<serde_json::Value>(v)
                .ok()
                .and_then(|v| v.get("status").cloned())
                == Some("fulfilled".into())
        })
        .map(|(k, _)| k)
        .collect();
    let letters = backends.admin.dead_letter_summaries(i64::MAX).await?;
    let dead: HashSet<(String, String)> = letters.iter().map(|d| (d.plugin.clone(), d.key.clone())).collect();
    let mut report = DemoReport {
        messages: schedule.messages(),
        ..Default::default()
    };
    for p in &schedule.planned {
        let (plugin, key) = (p.envelope.handler.as_str(), p.reference.as_str());
        let claim_key = match p.kind {
            Kind::Grant | Kind::Poison => p.envelope.id.as_str(),
            _ => key,
        };
        let state = backends.admin.state(plugin, claim_key).await?;
        let settled = state == Some(ClaimState::Done)
            || (state == Some(ClaimState::Dead) && dead.contains(&(plugin.to_string(), claim_key.to_string())));
        if !settled {
            report.lost += 1;
        }
        let (stored, external_ok) = match p.kind {
            Kind::Payment => (payments.contains(key), mock.performed("payments", key) == 1),
            Kind::Grant => (credits.contains(key), true),
            Kind::Order => (
                orders.contains(key),
                ["payments", "inventory", "email"].iter().all(|api| mock.performed(api, key) == 1),
            ),
            Kind::Poison => continue,
        };
        report.expected_effects += 1;
        report.effects += stored as u64;
        if !stored || !external_ok {
            report.missing_effects += 1;
        }
    }
    report.external_calls = mock.total_requests();
    report.external_effects = mock
        .state
        .lock()
        .expect("mock state poisoned")
        .performed
        .values()
        .map(|&n| n as u64)
        .sum();
    report.double_effects = mock.double_effects();
    report.calls_after_journal = mock.calls_after_journal();
    report.resent_steps = mock.resent();
    Ok(report)
}

/// `idem demo`: run, print a summary table, and the JSON line with `--json`.
pub async fn main(args: DemoArgs) -> Result<ExitCode> {
    let bar = indicatif::ProgressBar::new(args.messages as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:40}] {pos}/{len} settled ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message("idem demo");
    bar.enable_steady_tick(Duration::from_millis(120));
    let report = run(&args, Some(&bar)).await?;
    print_table(&report);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn print_table(r: &DemoReport) {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    t.set_header(vec!["", "count", "what it means"]);
    let rows: [(&str, u64, &str); 20] = [
        ("messages", r.messages, "distinct messages published"),
        ("published", r.published, "publishes, duplicates included"),
        ("deliveries", r.deliveries, "deliveries by the broker, redeliveries included"),
        ("executions", r.executions, "handler runs (retries and crashed runs included)"),
        (
            "duplicates suppressed",
            r.duplicates_suppressed,
            "deliveries of settled messages, acked without running",
        ),
        (
            "busy redeliveries",
            r.busy_redeliveries,
            "deliveries of messages still running elsewhere",
        ),
        ("retries", r.retries, "transient failures and traps retried with backoff"),
        ("simulated crashes", r.crashes, "runs that died right after a journaled charge"),
        ("journal replays", r.journal_replays, "external results replayed instead of re-sent"),
        ("dead-lettered", r.dead_lettered, "the poison message, after its attempts"),
        ("effects", r.effects, "distinct messages whose effect is stored"),
        ("expected effects", r.expected_effects, "distinct effectful messages"),
        ("external calls", r.external_calls, "requests that reached the mock APIs"),
        ("external effects", r.external_effects, "charges, reservations and emails performed"),
        ("double effects", r.double_effects, "must be 0"),
        (
            "calls after journal",
            r.calls_after_journal,
            "journaled calls sent again: must be 0",
        ),
        ("fenced out", r.fenced_out, "runs stopped: their lease lapsed and was taken over"),
        (
            "re-sent steps",
            r.resent_steps,
            "steps answered twice: at most 1 per fenced-out run",
        ),
        ("lost", r.lost, "must be 0"),
        ("missing effects", r.missing_effects, "must be 0"),
    ];
    for (name, n, what) in rows {
        t.add_row(vec![name.to_string(), n.to_string(), what.to_string()]);
    }
    println!("{t}");
    println!(
        "{} in {:.1} s",
        if r.ok() {
            "OK: every message settled once, no effect doubled"
        } else {
            "FAILED: see the counts above"
        },
        r.elapsed_ms as f64 / 1000.0
    );
}

#[cfg(test)]
mod tests {
    use super::DemoReport;

    #[test]
    fn a_step_sent_again_passes_only_beside_an_execution_fenced_out() {
        let clean = DemoReport {
            messages: 3,
            effects: 2,
            expected_effects: 2,
            ..Default::default()
        };
        assert!(clean.ok());
        let resent = DemoReport {
            resent_steps: 1,
            ..clean.clone()
        };
        assert!(!resent.ok(), "a step sent again while every lease held");
        assert!(DemoReport { fenced_out: 1, ..resent }.ok());
    }
}
