//! `idem bench`: throughput, latency, CPU and memory of the whole pipeline.
//!
//! Each run pre-publishes N messages to a fresh namespace, starts a pool,
//! and times it until all N are confirmed done (throughput, CPU seconds per
//! 1,000 messages, peak RSS). The pool then gets a paced stream at half that
//! rate, and each message's publish-to-done time gives the latency
//! percentiles (latency measured on a full queue would only measure the
//! queue). Runs alternate the component and its native twin (the same logic
//! compiled into the host, behind the same pipeline), so their ratio is
//! measured side by side. With `--lang python,js` the Python and JavaScript
//! ports of the plugin run in the same rotation.
//!
//! | scenario | broker | claims | data | handler |
//! |---|---|---|---|---|
//! | a | embedded SQLite | SQLite | SQLite | `noop` |
//! | b | Redis Streams | Redis | Postgres | `grant-credits` (one upsert) |
//! | c | RabbitMQ | Postgres | Postgres | `grant-credits` |
//! | d | NATS JetStream | Postgres | Postgres | `grant-credits` |
//! | e | SQS (a local SQS-compatible server) | Postgres | Postgres | `grant-credits` |
//! | f | Kafka (four partitions) | Postgres | Postgres | `grant-credits` |
//! | g | Redis Streams | Redis | Postgres | `noop` |
//!
//! Scenario f also runs, in the same rotation, a plain rdkafka consumer
//! doing the same upsert one record at a time (`kafka_loop`, reported as
//! `rdkafka-loop`); scenario g, a bare `XREADGROUP` + `XACK` loop on the
//! same stream (`redis_loop`, reported as `redis-loop`): what the
//! idempotency machinery costs over the broker alone; and that loop with a
//! claim and a confirm per message in Redis (`redis-claims-loop`): what
//! claiming there costs when nothing else is done.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::app::Pool;
use crate::config::{BrokerKind, Config, PluginConfig, StoreKind};
use crate::envelope::Envelope;
use crate::hooks::{Hooks, OnDone};
use crate::runtime::native::{GrantCredits, NativeHandler, Noop};
use crate::tools::sdk::Lang;
use crate::worker::percentile;
use crate::worker::WorkerOptions;

mod baseline;
mod kafka_loop;
mod process;
mod processes;
mod redis_loop;
mod report;

use self::process::{cpu_seconds, peak_rss_kib, reset_peak_rss};
use self::report::{print_table, summarize};

/// The header carrying a latency message's publish time (µs since the epoch).
const PUBLISHED_AT: &str = "bench-published-us";

/// Which deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Embedded SQLite, no-op plugin.
    A,
    /// Redis Streams, Redis claims, Postgres upsert.
    B,
    /// RabbitMQ, Postgres claims and data.
    C,
    /// NATS JetStream, Postgres claims and data.
    D,
    /// SQS (a local SQS-compatible server), Postgres claims and data.
    E,
    /// Kafka (a topic of four partitions), Postgres claims and data.
    F,
    /// Redis Streams and claims, no-op plugin (b without its upsert).
    G,
}

/// Component, native twin, or both alternating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HandlerChoice {
    /// The WebAssembly component.
    Wasm,
    /// The native twin.
    Native,
    /// Both, alternating run by run.
    Both,
}

/// `idem bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Scenarios to run (comma-separated): a, b, c, d, e, f, g (e: SQS,
    /// against the server at --sqs-url; f: Kafka, at --kafka-url; g: b's
    /// deployment with the no-op plugin, beside a bare consume-and-ack loop).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "a,b,c,d")]
    pub scenario: Vec<Scenario>,
    /// Messages per run.
    #[arg(long, default_value_t = 5_000)]
    pub messages: usize,
    /// Runs per scenario and handler (the report quotes medians).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Handlers running at once (worker.concurrency).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Deliveries fetched and claimed per round trip (worker.batch_size).
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Messages held per handler slot (worker.prefetch); default: the
    /// configuration's default.
    #[arg(long, default_value_t = crate::config::WorkerConfig::default().prefetch)]
    pub prefetch: usize,
    /// Component, native twin, or both.
    #[arg(long, value_enum, default_value_t = HandlerChoice::Both)]
    pub handler: HandlerChoice,
    /// Languages of the components (comma-separated): rust, python, js.
    /// Each language's port of the plugin runs beside the others and the
    /// native twin; reported as `wasm` (Rust), `python` and `js`.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "rust")]
    pub lang: Vec<Lang>,
    /// Run each component's pool as `idem run` with this many pinned
    /// worker processes (worker.processes), --concurrency divided among
    /// them; needs --handler wasm, and measures no latency.
    #[arg(long, default_value_t = 1)]
    pub processes: usize,
    /// Messages in the paced latency phase (0 to skip it).
    #[arg(long, default_value_t = 1_000)]
    pub latency_messages: usize,
    /// Where the plugin components are.
    #[arg(long, env = "IDEM_PLUGIN_DIR", default_value = "target/plugins/wasm32-wasip2/plugin")]
    pub plugins: PathBuf,
    /// PostgreSQL (scenarios b, c, d).
    #[arg(long, env = "IDEM_BENCH_POSTGRES_URL", default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub postgres_url: String,
    /// Redis (scenarios b and g).
    #[arg(long, env = "IDEM_BENCH_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// RabbitMQ (scenario c).
    #[arg(long, env = "IDEM_BENCH_AMQP_URL", default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,
    /// NATS with JetStream (scenario d).
    #[arg(long, env = "IDEM_BENCH_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// An SQS endpoint (scenario e), with AWS credentials in the
    /// environment.
    #[arg(long, env = "IDEM_BENCH_SQS_URL", default_value = "http://127.0.0.1:4566")]
    pub sqs_url: String,
    /// Kafka's bootstrap servers (scenario f).
    #[arg(long, env = "IDEM_BENCH_KAFKA_URL", default_value = "kafka://127.0.0.1:9092")]
    pub kafka_url: String,
    /// Print the whole report as JSON (last line).
    #[arg(long)]
    pub json: bool,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    /// Scenario.
    pub scenario: Scenario,
    /// `wasm` or `native`.
    pub handler: &'static str,
    /// Messages processed in the throughput phase.
    pub messages: usize,
    /// Seconds from pool start to the last confirm.
    pub seconds: f64,
    /// Messages per second.
    pub rate: f64,
    /// Median publish-to-done latency in the paced phase (ms).
    pub p50_ms: f64,
    /// 99th percentile of the same (ms).
    pub p99_ms: f64,
    /// CPU seconds (user + system) of this process per 1,000 messages.
    pub cpu_s_per_1k: f64,
    /// Peak resident memory of this process during the run (MiB).
    pub peak_rss_mib: f64,
}

/// Medians of one scenario and handler.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Scenario.
    pub scenario: Scenario,
    /// `wasm` or `native`.
    pub handler: &'static str,
    /// Runs.
    pub runs: usize,
    /// Median messages per second.
    pub rate: f64,
    /// Median p50 latency (ms).
    pub p50_ms: f64,
    /// Median p99 latency (ms).
    pub p99_ms: f64,
    /// Median CPU seconds per 1,000 messages.
    pub cpu_s_per_1k: f64,
    /// Largest peak RSS (MiB).
    pub peak_rss_mib: f64,
    /// For a component: median rate over the native twin's median rate.
    pub wasm_over_native: Option<f64>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Messages per run.
    pub messages: usize,
    /// Concurrency (handler slots in all).
    pub concurrency: usize,
    /// Worker processes the slots were divided among.
    pub processes: usize,
    /// Every run, in the order run.
    pub runs: Vec<RunFigures>,
    /// Medians.
    pub summary: Vec<Summary>,
}

/// The command.
pub async fn main(args: BenchArgs) -> Result<ExitCode> {
    let report = run(&args).await?;
    print_table(&report);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// Run every scenario `runs` times, alternating handlers.
pub async fn run(args: &BenchArgs) -> Result<BenchReport> {
    if args.processes == 0 || !args.concurrency.is_multiple_of(args.processes) {
        anyhow::bail!(
            "--concurrency {} cannot be divided among --processes {}: give a multiple of it",
            args.concurrency,
            args.processes
        );
    }
    if args.processes > 1 && args.handler != HandlerChoice::Wasm {
        anyhow::bail!("--processes runs the pool as `idem run`, which loads components only: add --handler wasm");
    }
    let mut handlers: Vec<&'static str> = Vec::new();
    if args.handler != HandlerChoice::Native {
        let mut langs = args.lang.clone();
        langs.dedup();
        handlers.extend(langs.into_iter().map(|l| match l {
            Lang::Rust => "wasm",
            Lang::Python => "python",
            Lang::Js => "js",
        }));
    }
    if args.handler != HandlerChoice::Wasm {
        handlers.push("native");
    }
    let mut scenarios = args.scenario.clone();
    scenarios.sort();
    scenarios.dedup();
    let mut runs = Vec::new();
    for i in 0..args.runs {
        for &scenario in &scenarios {
            for &handler in &handlers {
                let figures = one_run(args, scenario, handler)
                    .await
                    .with_context(|| format!("scenario {scenario:?} ({handler}), run {}", i + 1))?;
                eprintln!(
                    "bench {:?} {:<6} run {}: {:>8.0} msg/s  p50 {:>6.2} ms  p99 {:>7.2} ms  cpu {:.3} s/1k  rss {:.0} MiB",
                    scenario,
                    handler,
                    i + 1,
                    figures.rate,
                    figures.p50_ms,
                    figures.p99_ms,
                    figures.cpu_s_per_1k,
                    figures.peak_rss_mib
                );
                runs.push(figures);
            }
            for &which in baseline::loops(scenario) {
                let figures = baseline::run(args, scenario, which)
                    .await
                    .with_context(|| format!("scenario {scenario:?} ({which:?} loop), run {}", i + 1))?;
                eprintln!(
                    "bench {:?} {:<6} run {}: {:>8.0} msg/s  cpu {:.3} s/1k",
                    scenario,
                    figures.handler,
                    i + 1,
                    figures.rate,
                    figures.cpu_s_per_1k
                );
                runs.push(figures);
            }
        }
    }
    let summary = summarize(&runs);
    Ok(BenchReport {
        messages: args.messages,
        concurrency: args.concurrency,
        processes: args.processes,
        runs,
        summary,
    })
}

/// The deployment of a scenario, in a fresh namespace.
fn scenario_config(args: &BenchArgs, scenario: Scenario, handler: &str, dir: &std::path::Path) -> Config {
    let mut c = Config {
        namespace: format!("idem_bench_{}", uuid::Uuid::new_v4().simple().to_string().get(..10).unwrap_or("x")),
        ..Config::default()
    };
    c.database.path = dir.join("bench.db");
    let pg = Some(args.postgres_url.clone());
    match scenario {
        Scenario::A => {}
        Scenario::B | Scenario::G => {
            c.broker.kind = BrokerKind::Redis;
            c.broker.url = Some(args.redis_url.clone());
            c.claims.kind = StoreKind::Redis;
            c.claims.url = Some(args.redis_url.clone());
            c.data.kind = StoreKind::Postgres;
            c.data.url = pg;
        }
        Scenario::C | Scenario::D | Scenario::E | Scenario::F => {
            (c.broker.kind, c.broker.url) = match scenario {
                Scenario::C => (BrokerKind::Rabbitmq, Some(args.amqp_url.clone())),
                Scenario::D => (BrokerKind::Nats, Some(args.nats_url.clone())),
                Scenario::E => (BrokerKind::Sqs, Some(args.sqs_url.clone())),
                _ => (BrokerKind::Kafka, Some(args.kafka_url.clone())),
            };
            c.claims.kind = StoreKind::Postgres;
            c.claims.url = pg.clone();
            c.data.kind = StoreKind::Postgres;
            c.data.url = pg;
        }
    }
    let (name, stem, collections) = plugin_of(scenario);
    let suffix = match handler {
        "python" => "_py",
        "js" => "_js",
        _ => "",
    };
    c.plugins.insert(
        name.to_string(),
        PluginConfig {
            path: args.plugins.join(format!("{stem}{suffix}.wasm")),
            collections: collections.iter().map(|s| s.to_string()).collect(),
            endpoints: Vec::new(),
            key_pointer: None,
            celery_task: None,
            limits: None,
        },
    );
    c.worker.concurrency = args.concurrency;
    c.worker.batch_size = args.batch_size;
    c.worker.prefetch = args.prefetch;
    c.worker.poll_idle_ms = 5;
    c.worker.watch_plugins = false;
    c.claims.max_connections = args.concurrency as u32 + 4;
    c.data.max_connections = args.concurrency as u32 + 4;
    c
}

fn plugin_of(scenario: Scenario) -> (&'static str, &'static str, &'static [&'static str]) {
    match scenario {
        Scenario::A | Scenario::G => ("noop", "noop", &[]),
        _ => ("grant-credits", "grant_credits", &["credits"]),
    }
}

fn message(i: usize, handler: &str, published_at: Option<i64>) -> Envelope {
    Envelope {
        id: format!("m-{i}"),
        handler: handler.to_string(),
        headers: published_at
            .map(|t| vec![(PUBLISHED_AT.to_string(), t.to_string())])
            .unwrap_or_default(),
        payload: format!(r#"{{"user":"u{}","balance":{i}}}"#, i % 1_000).into_bytes(),
    }
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

async fn one_run(args: &BenchArgs, scenario: Scenario, handler: &'static str) -> Result<RunFigures> {
    let dir = tempfile::tempdir()?;
    let config = scenario_config(args, scenario, handler, dir.path());
    let (plugin, _, _) = plugin_of(scenario);
    crate::tools::chaos::prepare_broker(&config).await?;
    let result = if args.processes > 1 {
        processes::measure(args, &config, dir.path(), scenario, plugin, handler).await
    } else {
        measure(args, &config, scenario, plugin, handler).await
    };
    crate::tools::chaos::cleanup(&config).await;
    result
}

async fn measure(args: &BenchArgs, config: &Config, scenario: Scenario, plugin: &str, handler: &'static str) -> Result<RunFigures> {
    let n = args.messages;
    {
        let backends = crate::backend::open(config).await?;
        let all: Vec<Envelope> = (0..n).map(|i| message(i, plugin, None)).collect();
        baseline::publish(backends.broker.as_ref(), &all).await?;
    }
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(args.latency_messages)));
    let options = WorkerOptions::from_config(config);
    let sink = latencies.clone();
    let on_done: OnDone = Arc::new(move |e: &Envelope| {
        if let Some((_, t)) = e.headers.iter().find(|(k, _)| k == PUBLISHED_AT) {
            if let Ok(t) = t.parse::<i64>() {
                sink.lock().expect("latency sink poisoned").push((now_us() - t) as f64 / 1000.0);
            }
        }
    });
    let hooks = Hooks {
        on_done: Some(on_done),
        ..Hooks::default()
    };
    let natives: Vec<(String, Arc<dyn NativeHandler>)> = match (handler, plugin) {
        ("native", "noop") => vec![(plugin.to_string(), Arc::new(Noop))],
        ("native", _) => vec![(plugin.to_string(), Arc::new(GrantCredits))],
        _ => Vec::new(),
    };
    reset_peak_rss();
    let pool = Pool::start_native(config, options, hooks, natives).await?;
    let mut cpu0 = cpu_seconds();
    let mut started = Instant::now();
    let mut counted = n;
    if config.broker.kind == BrokerKind::Kafka {
        // Joining the consumer group takes seconds (about five on the test
        // server): count from the first settled message.
        wait_done(&pool, 1, Duration::from_secs(120)).await?;
        (cpu0, started, counted) = (cpu_seconds(), Instant::now(), n - 1);
    }
    wait_done(&pool, n as u64, Duration::from_secs(600)).await?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let rate = counted as f64 / seconds;

    // Paced phase: half the measured rate, publish-to-done latency.
    let l = args.latency_messages;
    if l > 0 {
        let every = Duration::from_millis(10);
        let per_tick = ((rate / 2.0) * every.as_secs_f64()).max(1.0) as usize;
        let mut tick = tokio::time::interval(every);
        let mut sent = 0;
        while sent < l {
            tick.tick().await;
            let k = per_tick.min(l - sent);
            let t = now_us();
            let batch: Vec<Envelope> = (n + sent..n + sent + k).map(|i| message(i, plugin, Some(t))).collect();
            pool.backends.broker.publish(&batch, Duration::ZERO).await?;
            sent += k;
        }
        wait_done(&pool, (n + l) as u64, Duration::from_secs(600)).await?;
    }
    let peak_rss_mib = peak_rss_kib() as f64 / 1024.0;
    pool.stop().await?;
    let lat = std::mem::take(&mut *latencies.lock().expect("latency sink poisoned"));
    Ok(RunFigures {
        scenario,
        handler,
        messages: n,
        seconds,
        rate,
        p50_ms: percentile(lat.clone(), 0.5),
        p99_ms: percentile(lat, 0.99),
        cpu_s_per_1k: cpu / counted as f64 * 1000.0,
        peak_rss_mib,
    })
}

async fn wait_done(pool: &Pool, n: u64, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let c = pool.counters.snapshot();
        if c.done >= n {
            return Ok(());
        }
        if c.dead_lettered > 0 || c.traps > 0 {
            anyhow::bail!(
                "a benchmark message failed ({} dead-lettered, {} traps); see the log",
                c.dead_lettered,
                c.traps
            );
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "only {} of {n} messages done after {limit:?}",
                pool.counters.done.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
