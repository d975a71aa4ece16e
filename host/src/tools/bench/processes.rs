//! `idem bench --processes P`: the pool as users run it with
//! `worker.processes = P`, a real `idem run` supervising P pinned worker
//! processes, each with `concurrency / P` handler slots.
//!
//! Timed from the moment every process is ready (the supervisor says so in
//! its log) until the claim store counts all N messages done; what the
//! first process settled before the others were ready is left out of the
//! count, as the pool's start is left out of an in-process run. CPU is that
//! of the worker processes over the same stretch (from /proc), peak RSS the
//! sum of their high-water marks, reset when they are ready. Latency is not
//! measured (no hook reaches into the processes).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{message, BenchArgs, RunFigures, Scenario};
use crate::config::{Config, Processes};
use crate::envelope::Envelope;

pub(super) async fn measure(
    args: &BenchArgs,
    config: &Config,
    dir: &Path,
    scenario: Scenario,
    plugin: &str,
    handler: &'static str,
) -> Result<RunFigures> {
    let n = args.messages;
    let backends = crate::backend::open(config).await?;
    let all: Vec<Envelope> = (0..n).map(|i| message(i, plugin, None)).collect();
    super::baseline::publish(backends.broker.as_ref(), &all).await?;

    let mut config = config.clone();
    config.worker.processes = Processes::Count(args.processes);
    config.worker.concurrency = args.concurrency / args.processes;
    for p in config.plugins.values_mut() {
        p.path = std::path::absolute(&p.path)?;
    }
    // Compiled once, beside the components, as the demo and the tests do:
    // the pool's start is not what is measured.
    config.worker.compile_cache_dir = Some(std::path::absolute(args.plugins.join(".compiled"))?);
    let path = dir.join("bench.toml");
    std::fs::write(&path, toml::to_string(&config)?)?;
    let log = dir.join("bench.log");
    let mut supervisor = tokio::process::Command::new(std::env::current_exe()?)
        .args(["run", "--config"])
        .arg(&path)
        .env("IDEM_LOG", "warn,idem_host::prefork=info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start `idem run`")?;
    let pid = supervisor.id().context("`idem run` exited at once")?;
    let failed = |why: String| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
        anyhow::anyhow!("{why}; the end of its log:\n{}", tail.join("\n"))
    };

    let deadline = Instant::now() + Duration::from_secs(120);
    while !std::fs::read_to_string(&log)?.contains("every worker process is ready") {
        if let Some(status) = supervisor.try_wait()? {
            return Err(failed(format!("`idem run --processes {}` ended ({status})", args.processes)));
        }
        if Instant::now() > deadline {
            return Err(failed("the worker processes were not ready after 120 s".into()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let workers = crate::prefork::worker_pids(pid);
    for p in &workers {
        // Their start (loading components) is not the run's peak.
        super::process::reset_peak_rss_of(*p);
    }
    let done0 = backends.admin.counts().await?.done;
    let cpu0: f64 = workers.iter().map(|&p| cpu_seconds_of(p)).sum();
    let started = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let counts = backends.admin.counts().await?;
        if counts.dead > 0 {
            return Err(failed(format!("{} benchmark message(s) dead-lettered", counts.dead)));
        }
        if counts.done >= n as u64 {
            break;
        }
        if Instant::now() > deadline {
            return Err(failed(format!("only {} of {n} messages done after 600 s", counts.done)));
        }
        // Often enough to time a run of seconds within a percent; seldom
        // enough that the counting costs the pinned workers' CPUs little.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = workers.iter().map(|&p| cpu_seconds_of(p)).sum::<f64>() - cpu0;
    let peak_rss_kib: u64 = workers.iter().map(|&p| peak_rss_kib_of(p)).sum();
    if crate::prefork::worker_pids(pid) != workers {
        return Err(failed("a worker process was restarted during the run".into()));
    }
    // SAFETY: kill has no memory effects; the supervisor is our child and
    // not yet waited for.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(60), supervisor.wait())
        .await
        .map_err(|_| failed("`idem run` did not stop within 60 s of SIGTERM".into()))??;
    if !status.success() {
        return Err(failed(format!("`idem run` stopped with {status}")));
    }
    let counted = n - done0 as usize;
    if counted == 0 {
        bail!("every message was done before the last worker process was ready: raise --messages");
    }
    Ok(RunFigures {
        scenario,
        handler,
        messages: n,
        seconds,
        rate: counted as f64 / seconds,
        p50_ms: 0.0,
        p99_ms: 0.0,
        cpu_s_per_1k: cpu / counted as f64 * 1000.0,
        peak_rss_mib: peak_rss_kib as f64 / 1024.0,
    })
}

/// User + system CPU seconds of a process.
fn cpu_seconds_of(pid: u32) -> f64 {
    // SAFETY: sysconf has no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    crate::prefork::stat_fields(pid)
        .map(|f| {
            let field = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            (field(11) + field(12)) / ticks
        })
        .unwrap_or(0.0)
}

/// A process's peak resident set (KiB).
fn peak_rss_kib_of(pid: u32) -> u64 {
    super::process::peak_rss_kib_in(&format!("/proc/{pid}/status"))
}
