//! `idem chaos`: a real deployment under injected faults, checked exactly.
//!
//! It takes one of the example configurations, points it at a namespace of
//! its own, a local mock of the payment/inventory/email APIs and the built
//! plugins, starts several `idem run` processes, publishes a seeded
//! schedule (every message 1 to 3 times, some copies concurrent), and while
//! the workers run it injects faults at random moments: SIGKILL of a worker
//! (restarted after a pause), SIGKILL and restart of Redis (a Redis of its
//! own, persisting every write, so a restart is a crash, not a wipe),
//! a restart (SIGTERM) or a crash (SIGKILL) of NATS (a server of its own,
//! its streams on disk, every write synced),
//! termination of the deployment's Postgres connections, closing of the
//! broker connections, and network partitions (a proxy in front of each
//! server stalls or cuts every connection for longer than a lease). When the queue has drained it checks every
//! message (done or dead-lettered, only the poison message dead), every
//! effect (stored once, performed once at the mock), and that no journaled
//! call reached an endpoint again. The seed is printed so a failing run can
//! be replayed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::config::{BrokerKind, Config, StoreKind};
use crate::tools::demo::{demo_config, use_lang, verify, Schedule};
use crate::tools::kit::{Mock, OwnNats, OwnRedis};
use crate::tools::sdk::Lang;
use partitions::Partitions;
use workers::Workers;

mod partitions;
mod services;
mod workers;

pub use services::{cleanup, prepare_broker};
use services::{disconnect_broker, terminate_postgres};

/// Arguments of `idem chaos`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// The deployment to torment: one of the example configurations.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Distinct messages.
    #[arg(long, default_value_t = 10_000)]
    pub messages: usize,
    /// Seed of the schedule and of the faults (random when omitted; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Directory holding the built plugin components.
    #[arg(long, env = "IDEM_PLUGIN_DIR", default_value = "target/plugins/wasm32-wasip2/plugin")]
    pub plugins: PathBuf,
    /// Print one JSON object as the last line.
    #[arg(long)]
    pub json: bool,
    /// Give up if the queue has not drained after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout_secs: u64,
    /// Inject faults for at most this many seconds (they also stop once
    /// 90% of the messages have settled); then the run must drain.
    #[arg(long, default_value_t = 120)]
    pub fault_secs: u64,
    /// The language of the demo's plugins (see `idem demo --lang`).
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
}

/// What a chaos run did and found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosReport {
    /// Replays the run.
    pub seed: u64,
    /// The configuration file.
    pub config: String,
    /// The language of the plugins.
    pub lang: String,
    /// Distinct messages.
    pub messages: u64,
    /// Publishes, duplicates included.
    pub published: u64,
    /// Publishes beyond one per message.
    pub duplicates: u64,
    /// Worker processes.
    pub workers: u64,
    /// Workers SIGKILLed (each restarted).
    pub kills: u64,
    /// Redis SIGKILLed and restarted.
    pub redis_restarts: u64,
    /// Rounds of Postgres connection termination.
    pub postgres_terminations: u64,
    /// Rounds of broker connections closed by the server.
    pub broker_disconnects: u64,
    /// Network partitions (a server stalled or cut off, then healed).
    pub partitions: u64,
    /// NATS stopped (SIGTERM) and restarted.
    pub nats_restarts: u64,
    /// NATS killed (SIGKILL) and restarted.
    pub nats_crashes: u64,
    /// Distinct messages whose effect is stored.
    pub effects: u64,
    /// Distinct effectful messages.
    pub expected_effects: u64,
    /// Effects performed more than once at the mock (must be 0).
    pub double_effects: u64,
    /// Requests for a step already journaled (must be 0).
    pub calls_after_journal: u64,
    /// Steps answered more than once, whatever their keys: a worker killed
    /// between an answer and its journal write sends the step again, with
    /// the same key (reported; the endpoint's key makes it harmless).
    pub resent_steps: u64,
    /// Messages neither done nor dead-lettered (must be 0).
    pub lost: u64,
    /// Effectful messages with a missing effect (must be 0).
    pub missing_effects: u64,
    /// Dead letters.
    pub dead_letters: u64,
    /// Dead letters other than the poison message (must be 0).
    pub unexpected_dead_letters: u64,
    /// Requests that reached the mock APIs.
    pub external_calls: u64,
    /// Wall time.
    pub elapsed_ms: u64,
    /// Every check held.
    pub ok: bool,
}

/// Kills per run at least, whatever the size.
const MIN_KILLS: u64 = 3;

/// Which faults a run still injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Any fault the deployment has.
    AnyFault,
    /// Worker kills only, until there have been MIN_KILLS.
    KillsOnly,
    /// None: the run drains.
    Over,
}

impl Phase {
    /// Faults go on until 90% has settled or the fault window has passed,
    /// and then kills until there have been MIN_KILLS, so that the run ends
    /// with every worker up. The window matters where crashes can stop all
    /// progress: a Kafka group hands a killed member's partitions on only
    /// after its session timeout, so kills every second or two keep it
    /// rebalancing and 90% would never settle.
    fn at(settled: u64, messages: u64, kills: u64, in_window: bool) -> Phase {
        if in_window && settled < messages * 9 / 10 {
            Phase::AnyFault
        } else if kills < MIN_KILLS {
            Phase::KillsOnly
        } else {
            Phase::Over
        }
    }
}

#[derive(Clone, Copy)]
enum Fault {
    Kill,
    RedisRestart,
    PostgresTerminate,
    BrokerDisconnect,
    Partition,
    NatsRestart,
    NatsCrash,
}

/// The example configuration, pointed at the run's namespace, mock,
/// plugins and (where Redis is used) its own Redis.
fn chaos_config(
    args: &ChaosArgs,
    dir: &Path,
    mock: &Mock,
    (redis, nats): (Option<&OwnRedis>, Option<&OwnNats>),
    seed: u64,
) -> Result<Config> {
    let mut config = Config::load(&args.config)?;
    // Absolute: the workers read the config from another directory.
    let plugins = std::fs::canonicalize(&args.plugins).with_context(|| {
        format!(
            "plugin directory {} not found: build the plugins with `cargo xtask plugins`",
            args.plugins.display()
        )
    })?;
    let mut demo = demo_config(dir.join("idem.db"), &plugins, mock, 8);
    use_lang(&mut demo, args.lang);
    config.namespace = format!("chaos_{}_{}", seed % 1_000_000, &uuid::Uuid::new_v4().simple().to_string()[..6]);
    if config.broker.kind == BrokerKind::Sqs {
        // A queue of the run's own, FIFO if the example's is.
        let fifo = config.broker.queue.as_deref().is_some_and(|q| q.ends_with(".fifo"));
        config.broker.queue = Some(format!("{}{}", config.namespace, if fifo { ".fifo" } else { "" }));
    }
    if config.broker.kind == BrokerKind::Kafka {
        // A topic and a consumer group of the run's own.
        config.broker.topics = vec![config.namespace.clone()];
        config.broker.group = None;
    }
    config.database.path = dir.join("idem.db");
    config.endpoints = demo.endpoints;
    // Every plugin from the built directory, by file name: the workers read
    // their configuration from another directory, where the example's
    // relative paths would not resolve.
    for (name, plugin) in config.plugins.iter_mut() {
        plugin.path = match demo.plugins.get(name) {
            Some(p) => p.path.clone(),
            None => plugins.join(plugin.path.file_name().context("a plugin path without a file name")?),
        };
    }
    if let Some(r) = redis {
        if config.broker.kind == BrokerKind::Redis {
            config.broker.url = Some(r.url());
        }
        if config.claims.kind == StoreKind::Redis {
            config.claims.url = Some(r.url());
        }
    }
    if let (Some(n), BrokerKind::Nats) = (nats, config.broker.kind) {
        config.broker.url = Some(n.url());
    }
    // Leases and visibility shorter than the slow handlers: the heartbeat
    // must carry them, and a killed worker's work comes back quickly.
    config.worker.concurrency = 8;
    config.worker.lease_ms = 1_500;
    config.worker.heartbeat_ms = Some(400);
    config.worker.visibility_ms = 1_200;
    config.worker.busy_retry_ms = 250;
    config.worker.poll_idle_ms = 20;
    config.worker.compile_cache_dir = demo.worker.compile_cache_dir.clone();
    config.retry.base_delay_ms = 50;
    config.retry.max_delay_ms = 1_000;
    config.retry.max_attempts = 8;
    config.validate()?;
    Ok(config)
}

/// Run the chaos schedule and return the report (no printing besides logs).
pub async fn run(args: &ChaosArgs) -> Result<ChaosReport> {
    let started = Instant::now();
    let seed = args.seed.unwrap_or_else(rand::random);
    eprintln!("idem chaos: seed {seed} (replay with --seed {seed}), {} plugins", args.lang);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    let dir = tempfile::tempdir()?;
    let mock = Mock::start(Duration::from_millis(1_500)).await?;

    let probe = Config::load(&args.config)?;
    let uses_redis = probe.broker.kind == BrokerKind::Redis || probe.claims.kind == StoreKind::Redis;
    let mut redis = if uses_redis { Some(OwnRedis::start()?) } else { None };
    let mut nats = if probe.broker.kind == BrokerKind::Nats {
        Some(OwnNats::start()?)
    } else {
        None
    };
    let config = chaos_config(args, dir.path(), &mock, (redis.as_ref(), nats.as_ref()), seed)?;
    // Each worker reaches every server through proxies of its own that
    // partition; this process (publishing, counting, checking) connects
    // directly.
    let mut slots = vec![config.clone(); args.workers];
    let partitions = Partitions::route(&mut slots).await?;
    let mut config_paths = Vec::with_capacity(args.workers);
    for (slot, c) in slots.iter().enumerate() {
        let path = dir.path().join(format!("idem-{slot}.toml"));
        std::fs::write(&path, toml::to_string(c)?)?;
        config_paths.push(path);
    }
    let uses_postgres = config.claims.kind == StoreKind::Postgres || config.data.kind == StoreKind::Postgres;
    prepare_broker(&config).await?;

    let backends = crate::backend::open(&config).await?;
    mock.watch_journal(backends.claims.clone());
    let schedule = Schedule::chaos(args.messages, seed, &mock);
    let mut report = ChaosReport {
        seed,
        config: args.config.display().to_string(),
        lang: args.lang.to_string(),
        messages: schedule.messages(),
        duplicates: schedule.duplicates(),
        workers: args.workers as u64,
        ..Default::default()
    };

    let mut workers = Workers::new(config_paths, dir.path().to_path_buf());
    for slot in 0..args.workers {
        workers.spawn(slot)?;
    }
    report.published = schedule.publish(backends.broker.as_ref()).await?;

    let messages = schedule.messages();
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let mut next_fault = Instant::now() + Duration::from_millis(rng.random_range(800..2_000));
    let faults_until = Instant::now() + Duration::from_secs(args.fault_secs);
    loop {
        if let Some(why) = workers.exited() {
            workers.stop_all();
            bail!("seed {seed}: {why}");
        }
        let counts = backends.admin.counts().await.ok();
        let settled = counts.as_ref().map(|c| c.done + c.dead).unwrap_or(0);
        let phase = Phase::at(settled, messages, report.kills, Instant::now() < faults_until);
        if phase != Phase::Over && settled < messages && Instant::now() >= next_fault {
            let mut menu = vec![Fault::Kill, Fault::Kill];
            if phase == Phase::AnyFault {
                if redis.is_some() {
                    menu.push(Fault::RedisRestart);
                }
                if uses_postgres {
                    menu.push(Fault::PostgresTerminate);
                }
                if matches!(config.broker.kind, BrokerKind::Redis | BrokerKind::Rabbitmq) {
                    menu.push(Fault::BrokerDisconnect);
                }
                if partitions.any() {
                    menu.push(Fault::Partition);
                }
                if nats.is_some() {
                    menu.push(Fault::NatsRestart);
                    menu.push(Fault::NatsCrash);
                }
            }
            let fault = menu[rng.random_range(0..menu.len())];
            match fault {
                Fault::Kill => {
                    let slot = rng.random_range(0..args.workers);
                    workers.kill(slot);
                    report.kills += 1;
                    tokio::time::sleep(Duration::from_millis(rng.random_range(100..800))).await;
                    workers.spawn(slot)?;
                }
                Fault::RedisRestart => {
                    let r = redis.as_mut().expect("on the menu only with a Redis");
                    r.kill();
                    tokio::time::sleep(Duration::from_millis(rng.random_range(100..800))).await;
                    r.spawn()?;
                    report.redis_restarts += 1;
                }
                // A fault that could not be injected is reported, not fatal.
                Fault::PostgresTerminate => match terminate_postgres(&config).await {
                    Ok(()) => report.postgres_terminations += 1,
                    Err(e) => eprintln!("idem chaos: could not terminate Postgres connections: {e:#}"),
                },
                Fault::Partition => {
                    let what = partitions.inject(&mut rng, config.worker.lease()).await;
                    tracing::info!(%what, "chaos: partition healed");
                    report.partitions += 1;
                }
                // An operator's restart, or a crash: the server syncs every
                // write (docs/RELIABILITY.md), so neither may lose a message.
                Fault::NatsRestart | Fault::NatsCrash => {
                    let n = nats.as_mut().expect("on the menu only with a NATS");
                    if matches!(fault, Fault::NatsCrash) {
                        n.kill();
                        report.nats_crashes += 1;
                    } else {
                        n.stop();
                        report.nats_restarts += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(rng.random_range(100..800))).await;
                    n.spawn()?;
                }
                Fault::BrokerDisconnect => match disconnect_broker(&config, redis.as_ref()).await {
                    Ok(true) => report.broker_disconnects += 1,
                    Ok(false) => {}
                    Err(e) => eprintln!("idem chaos: could not disconnect the broker: {e:#}"),
                },
            }
            next_fault = Instant::now() + Duration::from_millis(rng.random_range(300..1_200));
        }
        if let Some(c) = &counts {
            let pending = backends.broker.pending().await.unwrap_or(u64::MAX);
            if settled >= messages && c.running == 0 && c.retry == 0 && pending == 0 {
                break;
            }
        }
        if Instant::now() > deadline {
            workers.stop_all();
            bail!(
                "seed {seed}: the queue did not drain within {} s ({counts:?}); worker logs in {}",
                args.timeout_secs,
                dir.keep().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    workers.stop_all();

    let checked = verify(&backends, &mock, &schedule).await?;
    let letters = backends.admin.dead_letter_summaries(i64::MAX).await?;
    report.effects = checked.effects;
    report.expected_effects = checked.expected_effects;
    report.double_effects = checked.double_effects;
    report.calls_after_journal = checked.calls_after_journal;
    report.resent_steps = checked.resent_steps;
    report.lost = checked.lost;
    report.missing_effects = checked.missing_effects;
    report.external_calls = checked.external_calls;
    report.dead_letters = letters.len() as u64;
    report.unexpected_dead_letters = letters.iter().filter(|d| d.plugin != "poison").count() as u64;
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    report.ok = report.double_effects == 0
        && report.calls_after_journal == 0
        && report.lost == 0
        && report.missing_effects == 0
        && report.unexpected_dead_letters == 0
        && report.effects == report.expected_effects;
    if report.ok {
        cleanup(&config).await;
    } else {
        eprintln!("idem chaos: worker logs kept in {}", dir.keep().display());
    }
    drop(redis);
    drop(nats);
    Ok(report)
}

/// `idem chaos`: run, print the report, exit non-zero on any violation.
pub async fn main(args: ChaosArgs) -> Result<ExitCode> {
    let report = run(&args).await?;
    eprintln!(
        "idem chaos: {} messages ({} publishes), {} workers, {} kills, {} Redis restarts, {} NATS restarts, {} NATS crashes, {} Postgres terminations, {} broker disconnects, {} partitions",
        report.messages,
        report.published,
        report.workers,
        report.kills,
        report.redis_restarts,
        report.nats_restarts,
        report.nats_crashes,
        report.postgres_terminations,
        report.broker_disconnects,
        report.partitions
    );
    eprintln!(
        "idem chaos: effects {}/{}, double effects {}, calls after journal {}, re-sent steps {}, lost {}, missing {}, dead letters {} ({} unexpected) in {:.1} s: {}",
        report.effects,
        report.expected_effects,
        report.double_effects,
        report.calls_after_journal,
        report.resent_steps,
        report.lost,
        report.missing_effects,
        report.dead_letters,
        report.unexpected_dead_letters,
        report.elapsed_ms as f64 / 1000.0,
        if report.ok { "OK" } else { "VIOLATION" }
    );
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(if report.ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[cfg(test)]
mod tests {
    use super::{Phase, MIN_KILLS};

    #[test]
    fn faults_stop_at_ninety_percent_or_at_the_end_of_the_window() {
        assert_eq!(Phase::at(0, 2_000, 10, true), Phase::AnyFault);
        assert_eq!(Phase::at(1_799, 2_000, 10, true), Phase::AnyFault);
        assert_eq!(Phase::at(1_800, 2_000, 10, true), Phase::Over);
        // Seed 108's Kafka run: little settled, the window over.
        assert_eq!(Phase::at(1_279, 2_000, 78, false), Phase::Over);
    }

    #[test]
    fn a_run_has_its_minimum_kills_whatever_settles() {
        assert_eq!(Phase::at(2_000, 2_000, 0, true), Phase::KillsOnly);
        assert_eq!(Phase::at(10, 2_000, MIN_KILLS - 1, false), Phase::KillsOnly);
        assert_eq!(Phase::at(10, 2_000, MIN_KILLS, false), Phase::Over);
    }
}
