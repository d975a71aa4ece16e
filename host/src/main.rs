//! `idem`: the command line.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use idem_host::config::{Config, Processes};
use idem_host::envelope::Envelope;
use idem_host::reload::Reloader;
use idem_host::tools::{bench, chaos, demo, kit, verify};
use idem_host::{app, console, observe, prefork};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// Run broker messages through sandboxed WebAssembly handlers, safely under
/// at-least-once delivery.
mod cli;

use cli::dlq::DlqCommand;
use cli::logging::{init_tracing, LogFormat};
use cli::plugin::PluginCommand;
use cli::ConfigArg;

#[derive(Parser)]
#[command(name = "idem", version, about, long_about = None)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the worker pool until interrupted (SIGINT/SIGTERM); SIGHUP
    /// reloads the plugins and the configuration's plugin sections.
    Run(RunArgs),
    /// Publish messages to the queue.
    Publish(PublishArgs),
    /// Inspect plugin components.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Counts of queued, running, done and dead-lettered messages.
    Stats {
        #[command(flatten)]
        config: ConfigArg,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Inspect the dead-letter store.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Serve the web console without running workers: counts, claims,
    /// retries, dead letters (replay, purge). `idem run` serves it too.
    Console(ConsoleArgs),
    /// The demo: duplicates, concurrent redeliveries, crashes and poison
    /// against the example plugins, on a throwaway embedded database.
    Demo(demo::DemoArgs),
    /// Run an example deployment (several worker processes) under injected
    /// faults and check that nothing was lost or doubled.
    Chaos(chaos::ChaosArgs),
    /// Serve mock payment, inventory and email APIs that honour
    /// Idempotency-Key and count every effect (for the example configs).
    MockApi(kit::mock_api::MockApiArgs),
    /// Check that a plugin is idempotent: run each message of a file twice
    /// in a row and twice at once on scratch stores and compare the effects.
    Verify(verify::VerifyArgs),
    /// Throughput, latency, CPU and memory of the pipeline: embedded SQLite,
    /// Redis, RabbitMQ and NATS deployments, each component against its
    /// native twin.
    Bench(bench::BenchArgs),
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Serve /metrics, /healthz, /readyz and /plugins on this address
    /// (overrides http.listen), e.g. 127.0.0.1:9464. With several
    /// processes, process K serves on the port + K.
    #[arg(long)]
    listen: Option<String>,
    /// Worker processes to start, each pinned to its own CPU and restarted
    /// if it dies: a number or `auto`, one per CPU (overrides
    /// worker.processes).
    #[arg(long)]
    processes: Option<Processes>,
}

#[derive(Args)]
struct ConsoleArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Address to serve on (overrides http.listen; default 127.0.0.1:9464).
    /// Any address but loopback needs http.token (or IDEM_HTTP_TOKEN).
    #[arg(long)]
    listen: Option<String>,
}

#[derive(Args)]
struct PublishArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Plugin that handles the message (with --file: of every line that
    /// names none).
    #[arg(long, required_unless_present = "file")]
    handler: Option<String>,
    /// Message id (a random one if omitted; publishing an id twice is a
    /// duplicate of one message).
    #[arg(long)]
    id: Option<String>,
    /// Payload (usually JSON).
    #[arg(long, required_unless_present = "file")]
    payload: Option<String>,
    /// A header, `name=value`; repeatable.
    #[arg(long = "header", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// Publish every line of this message file (JSON Lines:
    /// {"payload", "id"?, "handler"?, "headers"?: [["name", "value"]]}, the
    /// format `idem verify --input` reads).
    #[arg(long, conflicts_with_all = ["payload", "id"])]
    file: Option<PathBuf>,
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("header {s:?} must be name=value"))
}

fn main() -> ExitCode {
    // Before any thread starts: the supervisor's variables and pipe.
    prefork::take_supervision();
    let cli = Cli::parse();
    let default_level = match &cli.command {
        Command::Run(_) => "info",
        // The demo's warnings (traps, lost leases) are its planned faults.
        Command::Demo(_) | Command::Chaos(_) | Command::Verify(_) | Command::Bench(_) => "error",
        _ => "warn",
    };
    init_tracing(cli.log_format, default_level);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command, cli.log_format)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command, log_format: LogFormat) -> Result<ExitCode> {
    match command {
        Command::Run(r) => {
            let config = r.config.load()?;
            let processes = r.processes.unwrap_or(config.worker.processes).count();
            if prefork::started_as_worker() && prefork::supervised().is_none() {
                tracing::warn!(
                    "{} is set but this process has no supervisor's pipe: running as one worker process",
                    prefork::PROCESS_ENV
                );
            }
            if processes > 1 && !prefork::started_as_worker() {
                supervise(config, processes, r, log_format).await?;
            } else {
                run(config, r.config.config.clone(), r.listen).await?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Publish(p) => {
            publish(p).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(cmd) => cli::plugin::main(cmd).await,
        Command::Console(args) => serve_console(args).await,
        Command::Stats { config, json } => {
            let config = config.load()?;
            let backends = idem_host::backend::open(&config).await?;
            let stats = app::stats(&backends).await?;
            if json {
                println!("{}", serde_json::to_string(&stats)?);
            } else {
                println!(
                    "pending {}  in-flight {}  retry {}  done {}  dead-lettered {}  settled-claims {}  journal {}",
                    stats.pending,
                    stats.in_flight,
                    stats.retry,
                    stats.done,
                    stats.dead_lettered,
                    stats.settled_claims,
                    stats.journal_entries
                );
                for (part, n) in &stats.backlog {
                    println!("  {part}: {n} pending");
                }
                let h = &stats.last_hour;
                println!(
                    "last hour: done {}  duplicates {}  busy {}  retries {}  dead-lettered {}",
                    h.done, h.duplicates, h.busy, h.retries, h.dead_lettered
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Dlq(cmd) => cli::dlq::main(cmd).await,
        Command::Verify(args) => verify::main(args).await,
        Command::Bench(args) => bench::main(args).await,
        Command::Demo(args) => demo::main(args).await,
        Command::Chaos(args) => chaos::main(args).await,
        Command::MockApi(args) => kit::mock_api::main(args).await,
    }
}

async fn run(config: Config, config_path: Option<PathBuf>, listen: Option<String>) -> Result<()> {
    if config.plugins.is_empty() {
        bail!("no plugins configured: pass --config FILE with a [plugins.NAME] section per plugin (see examples/embedded.toml)");
    }
    let listen = listen.or_else(|| config.http.listen.clone());
    // Before the pool takes its first message: a signal that arrives while
    // it starts is kept, and stops it once started, rather than killing it.
    let mut stops = Stops::install()?;
    let mut hangup = signal(SignalKind::hangup()).context("cannot install the SIGHUP handler")?;
    // Install the recorder first, so the pool's first durations are kept.
    let metrics = listen.as_ref().map(|_| observe::prometheus()).transpose()?;
    let pool = app::Pool::start(&config).await?;
    let aux = CancellationToken::new();
    let reloader = Reloader::new(pool.runtime.clone(), pool.backends.admin.clone(), config.clone(), config_path);
    if let (Some(addr), Some(metrics)) = (listen, metrics) {
        let state = observe::HttpState {
            metrics,
            backends: pool.backends.clone(),
            runtime: pool.runtime.clone(),
            worker: pool.worker.clone(),
            counters: pool.counters.clone(),
        };
        let listener = observe::bind(&addr).await?;
        let bound = listener.local_addr()?;
        let live = console::Live {
            runtime: pool.runtime.clone(),
            worker: pool.worker.clone(),
            reloader: reloader.clone(),
        };
        let console = console::Console::new(pool.backends.clone(), config.clone(), Some(live), bound);
        match console.off() {
            Some(why) => tracing::warn!("{why}"),
            None => tracing::info!(url = %format!("http://{bound}/console"), "console"),
        }
        observe::serve(listener, observe::router(state).merge(console::router(console)), aux.clone());
        tracing::info!(%bound, "serving /metrics, /healthz, /readyz, /plugins and /console");
    }
    tokio::spawn(observe::watch_lease_risk(pool.worker.clone(), Duration::from_secs(5), aux.clone()));
    if config.worker.watch_plugins {
        reloader.watch(aux.clone())?;
        // A plugin file replaced while the pool started (a Python one
        // compiles for seconds) sent its event before the watch began.
        let reloader = reloader.clone();
        tokio::spawn(async move { reloader.reload(false).await });
    }
    {
        let reloader = reloader.clone();
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the configuration and the plugins");
                reloader.reload_config().await;
            }
        });
    }
    tracing::info!(
        plugins = %pool.runtime.plugin_names().join(", "),
        namespace = %config.namespace,
        broker = ?config.broker.kind,
        claims = ?config.claims.kind,
        data = ?config.data.kind,
        concurrency = config.worker.concurrency,
        // What its running claims (and `idem console`) name this worker by.
        owner = %pool.worker.options().owner,
        "idem worker running"
    );
    let shutdown = pool.shutdown.clone();
    let grace = config.worker.shutdown_grace_ms;
    tokio::spawn(async move {
        stops.first().await;
        tracing::info!(grace_ms = grace, "shutting down: no new deliveries; waiting for running handlers");
        shutdown.cancel();
        stops.second().await;
        tracing::warn!("second signal: exiting at once; unsettled deliveries are redelivered");
        std::process::exit(130);
    });
    prefork::ready();
    let result = pool.join().await;
    aux.cancel();
    if result.is_ok() {
        tracing::info!("stopped cleanly");
    }
    result
}

/// Before a worker process is started again beside those still running:
/// it would read the configuration file as it is now, and must not take
/// settings they took only at start (another claim store, say, would let
/// one message run on both sides).
fn restart_check(started: Config, path: PathBuf) -> prefork::RestartCheck {
    std::sync::Arc::new(move || {
        let fresh = Config::load(&path).map_err(|e| format!("{} does not load ({e:#}); fix it", path.display()))?;
        let pending = idem_host::config::restart_only_changes(&started, &fresh);
        if pending.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{} changes settings the processes still running took at start ({}); stop and start `idem run` to apply them to every process, or put them back",
            path.display(),
            pending.join(", ")
        ))
    })
}

/// `worker.processes` > 1: start and supervise that many `idem run`s.
async fn supervise(config: Config, processes: usize, r: RunArgs, log_format: LogFormat) -> Result<()> {
    let Some(path) = r.config.config.clone() else {
        bail!("worker.processes needs a configuration file: pass --config FILE");
    };
    let format = log_format.arg();
    let plan = prefork::Plan {
        processes,
        pin: config.worker.pin,
        // This very binary, even if an upgrade replaced the file since.
        program: PathBuf::from("/proc/self/exe"),
        args: ["--log-format", format, "run", "--config"]
            .map(OsString::from)
            .into_iter()
            .chain([path.clone().into_os_string()])
            .collect(),
        listen: r.listen.or_else(|| config.http.listen.clone()),
        start_timeout: std::time::Duration::from_millis(config.worker.start_timeout_ms),
        restart_check: Some(restart_check(config.clone(), path.clone())),
    };
    tracing::info!(
        processes,
        pin = config.worker.pin,
        concurrency = config.worker.concurrency,
        "starting worker processes"
    );
    prefork::supervise(plan).await
}

async fn serve_console(args: ConsoleArgs) -> Result<ExitCode> {
    let config = args.config.load()?;
    let backends = idem_host::backend::open(&config).await?;
    let addr = args
        .listen
        .or_else(|| config.http.listen.clone())
        .unwrap_or_else(|| "127.0.0.1:9464".into());
    let listener = observe::bind(&addr).await?;
    let bound = listener.local_addr()?;
    let console = console::Console::new(backends, config, None, bound);
    console.refuse_unguarded()?;
    tracing::info!(url = %format!("http://{bound}/console"), "console");
    let stop = CancellationToken::new();
    let served = observe::serve(listener, console::router(console), stop.clone());
    wait_for_signal().await;
    stop.cancel();
    served.await.context("console task panicked")?;
    Ok(ExitCode::SUCCESS)
}

/// The signals that stop `idem run`, installed once: SIGTERM and SIGINT,
/// and for a supervised worker process the one its supervisor's death sends
/// (which the kernel may send more than once: only the first counts).
struct Stops {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    orphaned: Option<tokio::signal::unix::Signal>,
}

impl Stops {
    fn install() -> Result<Stops> {
        Ok(Stops {
            term: signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?,
            orphaned: match prefork::supervised() {
                Some(_) => Some(signal(SignalKind::from_raw(prefork::ORPHANED)).context("cannot install the orphan signal handler")?),
                None => None,
            },
        })
    }

    /// The first stop: SIGTERM, SIGINT or the supervisor's death.
    async fn first(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
            Some(_) = async { self.orphaned.as_mut()?.recv().await } => tracing::warn!("the supervisor is gone"),
        }
    }

    /// A second SIGTERM or SIGINT.
    async fn second(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

async fn wait_for_signal() {
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn publish(p: PublishArgs) -> Result<()> {
    let config = p.config.load()?;
    let backends = idem_host::backend::open(&config).await?;
    let envelopes = match &p.file {
        Some(file) => idem_host::message_file::read(file, p.handler.as_deref())?,
        None => vec![Envelope {
            id: p.id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            handler: p.handler.expect("clap requires --handler"),
            headers: p.headers,
            payload: p.payload.expect("clap requires --payload").into_bytes(),
        }],
    };
    backends.broker.publish(&envelopes, Duration::ZERO).await?;
    eprintln!("published {} message(s)", envelopes.len());
    Ok(())
}
