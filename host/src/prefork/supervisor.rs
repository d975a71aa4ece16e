//! The supervisor's side of `worker.processes`: start each worker process,
//! wait for its readiness report, pass signals on, start it again when it
//! dies.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

use super::{ORPHANED, PROCESS_ENV, READY_ENV, READY_FD};

/// A process that ran this long before dying is restarted after the first
/// delay again.
const STABLE: Duration = Duration::from_secs(60);
const FIRST_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(30);

/// What to start.
pub struct Plan {
    /// How many processes.
    pub processes: usize,
    /// Pin each to its own CPU.
    pub pin: bool,
    /// The `idem` binary.
    pub program: PathBuf,
    /// Arguments of every process (`run --config FILE`, global options).
    pub args: Vec<OsString>,
    /// `http.listen`: process K serves on its port + K (port 0 stays 0).
    pub listen: Option<String>,
    /// How long a process may take to report ready before it is killed.
    pub start_timeout: Duration,
    /// Asked before each process is started: why it must not be (settings
    /// changed that the processes started before do not have), or nothing.
    /// On a first start that stops the whole start; a process started again
    /// after it died is held back, and asked again after the next delay.
    pub restart_check: Option<RestartCheck>,
}

/// See [`Plan::restart_check`].
pub type RestartCheck = Arc<dyn Fn() -> std::result::Result<(), String> + Send + Sync>;

impl Plan {
    fn listen_of(&self, index: usize) -> Result<Option<String>> {
        let Some(listen) = &self.listen else { return Ok(None) };
        let (host, port) = listen
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .with_context(|| format!("http.listen {listen:?} has no port: give it as HOST:PORT"))?;
        if port == 0 {
            return Ok(Some(listen.clone()));
        }
        let port = u16::try_from(port as usize + index)
            .ok()
            .with_context(|| format!("http.listen {listen:?}: process {index} would serve on port {port} + {index}, past 65535"))?;
        Ok(Some(format!("{host}:{port}")))
    }
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity writes into the zeroed set it is given.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size is the set's.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: reading bits of an initialised set.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// One process's place: its index, CPU and arguments.
struct Slot {
    index: usize,
    cpu: Option<usize>,
    args: Vec<OsString>,
    start_timeout: Duration,
    restart_check: Option<RestartCheck>,
}

/// How one process ended.
struct Ended {
    status: ExitStatus,
    /// It had reported ready.
    was_ready: bool,
    /// It was killed for not reporting ready in time.
    timed_out: bool,
}

enum Event {
    /// A process reported ready (first time for its slot: `first`).
    Ready { index: usize, first: bool },
    /// A slot's first process ended before it was ready.
    StartFailed { index: usize, why: String },
    /// A slot is done: its last process exited after a stop (`None`: no
    /// process was running then).
    Stopped { index: usize, status: Option<ExitStatus> },
}

/// What every slot's task watches: stops (1 = drain, 2 = at once) and
/// SIGHUPs, each a count.
#[derive(Clone)]
struct Orders {
    stop: watch::Receiver<u32>,
    hup: watch::Receiver<u32>,
}

/// Start `plan.processes` processes and supervise them until a signal
/// stops them all.
pub async fn supervise(plan: Plan) -> Result<()> {
    let mut term = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot install the SIGHUP handler")?;
    let n = plan.processes;
    let cpus = allowed_cpus();
    // Pin only a pool that has the CPUs it may use to itself: with fewer
    // processes than CPUs (a container's quota, or a choice), pinning to the
    // first CPUs would crowd every such pool onto the same ones.
    let pinned = plan.pin && n == cpus.len();
    if plan.pin && !pinned {
        tracing::warn!(
            processes = n,
            cpus = cpus.len(),
            "not pinning: {n} worker processes for the {} CPUs this process may run on (pinning needs one process per CPU)",
            cpus.len()
        );
    }
    let mut slots = Vec::with_capacity(n);
    for index in 0..n {
        let mut args = plan.args.clone();
        if let Some(listen) = plan.listen_of(index)? {
            args.extend(["--listen".into(), listen.into()]);
        }
        let cpu = if pinned { cpus.get(index).copied() } else { None };
        slots.push(Slot {
            index,
            cpu,
            args,
            start_timeout: plan.start_timeout,
            restart_check: plan.restart_check.clone(),
        });
    }
    let program = Arc::new(plan.program);
    let (stop_tx, stop_rx) = watch::channel(0u32);
    let (hup_tx, hup_rx) = watch::channel(0u32);
    let orders = Orders {
        stop: stop_rx,
        hup: hup_rx,
    };
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut waiting: Vec<Slot> = slots.into_iter().rev().collect();
    let spawn_slot = |slot: Slot| {
        tokio::spawn(keep(slot, program.clone(), orders.clone(), events_tx.clone()));
    };
    spawn_slot(waiting.pop().expect("at least one process"));
    let mut running = 1;
    let mut ready = 0;
    let mut stops = 0u32;
    let mut failure: Option<String> = None;
    let mut statuses: Vec<(usize, Option<ExitStatus>)> = Vec::new();
    while running > 0 {
        tokio::select! {
            Some(event) = events.recv() => match event {
                Event::Ready { index, first } => {
                    if first {
                        ready += 1;
                        if index == 0 && stops == 0 {
                            running += waiting.len();
                            waiting.drain(..).rev().for_each(&spawn_slot);
                        }
                        if ready == n {
                            tracing::info!(processes = n, "every worker process is ready");
                        }
                    }
                }
                Event::StartFailed { index, why } => {
                    if failure.is_none() {
                        failure = Some(format!("worker process {index} {why}; its error is above"));
                    }
                    if stops == 0 {
                        stops = 1;
                        let _ = stop_tx.send(stops);
                    }
                }
                Event::Stopped { index, status } => {
                    running -= 1;
                    statuses.push((index, status));
                }
            },
            _ = term.recv() => stops = stop(&stop_tx, stops),
            _ = int.recv() => stops = stop(&stop_tx, stops),
            _ = hup.recv() => {
                tracing::info!("SIGHUP: passed on to every worker process");
                hup_tx.send_modify(|n| *n += 1);
            }
        }
    }
    if let Some(failure) = failure {
        bail!(failure);
    }
    if stops >= 2 {
        tracing::warn!("stopped at once on a second signal");
        std::process::exit(130);
    }
    let unclean: Vec<String> = statuses
        .iter()
        .filter_map(|(i, s)| s.filter(|s| !s.success()).map(|s| format!("process {i} {}", describe(s))))
        .collect();
    if !unclean.is_empty() {
        bail!("not every worker process stopped cleanly: {}", unclean.join(", "));
    }
    tracing::info!("every worker process stopped cleanly");
    Ok(())
}

fn stop(stop_tx: &watch::Sender<u32>, stops: u32) -> u32 {
    let stops = stops + 1;
    if stops == 1 {
        tracing::info!("shutting down: every worker process drains and stops");
    } else {
        tracing::warn!("second signal: every worker process exits at once; unsettled deliveries are redelivered");
    }
    let _ = stop_tx.send(stops);
    stops
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (_, Some(sig)) => format!("was killed by signal {sig}"),
        _ => format!("ended ({status})"),
    }
}

/// Keep one slot's process running until the supervisor stops.
async fn keep(slot: Slot, program: Arc<PathBuf>, mut orders: Orders, events: mpsc::UnboundedSender<Event>) {
    let index = slot.index;
    let mut first = true;
    let mut delay = FIRST_DELAY;
    let status = loop {
        // Before every start: the file may have changed since the
        // supervisor read it, and the processes started before read it then.
        let held_back = slot.restart_check.as_ref().and_then(|check| check().err());
        if let Some(why) = held_back {
            if first {
                let _ = events.send(Event::StartFailed {
                    index,
                    why: format!("was not started: {why}"),
                });
                break None;
            }
            tracing::error!("worker process {index} is not started again: {why}; asking again in {delay:?}");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = orders.stop.wait_for(|s| *s > 0) => break None,
            }
            delay = (delay * 2).min(MAX_DELAY);
            continue;
        }
        let started = Instant::now();
        let outcome = run_once(&slot, &program, &mut orders, &events, first).await;
        let stopping = *orders.stop.borrow() > 0;
        let late = |timed_out: bool| {
            if timed_out {
                format!(" (not ready within {:?}, worker.start_timeout_ms)", slot.start_timeout)
            } else {
                String::new()
            }
        };
        match outcome {
            Ok(Ended { status, .. }) if stopping => break Some(status),
            Err(_) if stopping => break None,
            Err(e) if first => {
                let _ = events.send(Event::StartFailed {
                    index,
                    why: format!("could not be started: {e:#}"),
                });
                break None;
            }
            Ok(Ended {
                status,
                was_ready: false,
                timed_out,
            }) if first => {
                let _ = events.send(Event::StartFailed {
                    index,
                    why: describe(status) + " before it was ready" + &late(timed_out),
                });
                break Some(status);
            }
            Ok(Ended {
                status,
                was_ready,
                timed_out,
            }) => {
                first &= !was_ready;
                delay = if started.elapsed() >= STABLE { FIRST_DELAY } else { delay };
                tracing::warn!(
                    "worker process {index} {}{}; starting it again in {delay:?} (it ran {:?})",
                    describe(status),
                    late(timed_out),
                    started.elapsed()
                );
            }
            Err(e) => tracing::error!("cannot start worker process {index} again: {e:#}; trying again in {delay:?}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = orders.stop.wait_for(|s| *s > 0) => break None,
        }
        delay = (delay * 2).min(MAX_DELAY);
    };
    let _ = events.send(Event::Stopped { index, status });
}

/// Start the slot's process and wait for it to end, passing on stops and
/// SIGHUPs. Returns how it ended.
///
/// Signals go only to a process that reported ready: before that it may
/// not have its handlers yet, and would die of them. A stop that comes
/// while it starts is passed on once it is ready; a second stop kills it,
/// and so does the start timeout.
/// The process is not reaped before the loop ends, so its pid cannot have
/// been reused by then.
async fn run_once(
    slot: &Slot,
    program: &PathBuf,
    orders: &mut Orders,
    events: &mpsc::UnboundedSender<Event>,
    first: bool,
) -> Result<Ended> {
    if *orders.stop.borrow() > 0 {
        bail!("stopping");
    }
    // SIGHUPs that come while the process starts are not passed on (it may
    // not have its handler yet, and would die of one); one is sent once it
    // is ready, so it reads what changed after it read its configuration.
    // Counted before it is spawned: any later one is after its read.
    let hups_at_spawn = *orders.hup.borrow_and_update();
    let (reader, writer) = std::io::pipe().context("cannot create the readiness pipe")?;
    let writer = OwnedFd::from(writer);
    let mut command = tokio::process::Command::new(program);
    command
        .arg0(std::env::current_exe().unwrap_or_else(|_| "idem".into()))
        .args(&slot.args)
        .env(PROCESS_ENV, slot.index.to_string())
        .env(READY_ENV, READY_FD.to_string())
        .process_group(0);
    let write_fd = writer.as_raw_fd();
    let cpu = slot.cpu;
    // SAFETY: getpid has no memory effects.
    let supervisor = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec and only
    // makes system calls (no allocation, no locks).
    unsafe {
        command.pre_exec(move || child_setup(write_fd, cpu, supervisor));
    }
    let mut child = command.spawn().with_context(|| format!("cannot run {}", program.display()))?;
    drop(writer);
    let Some(pid) = child.id() else {
        bail!("worker process {} ended as it started", slot.index);
    };
    let pid = pid as i32;
    let on = slot.cpu.map(|c| format!(", on CPU {c}")).unwrap_or_default();
    tracing::info!("worker process {} started (pid {pid}{on})", slot.index);
    let mut readiness =
        tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader)).context("cannot watch the readiness pipe")?;
    let mut report = Vec::new();
    let start_deadline = tokio::time::Instant::now() + slot.start_timeout;
    let mut timed_out = false;
    let mut was_ready = false;
    let mut reading = true;
    let mut passed_on = 0;
    let mut hups_seen = hups_at_spawn;
    let (mut watching_stop, mut watching_hup) = (true, true);
    let status = loop {
        let stops = *orders.stop.borrow();
        if was_ready {
            while passed_on < stops {
                passed_on += 1;
                // SAFETY: kill has no memory effects; `pid` is not reaped.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        } else if stops >= 2 && passed_on < stops {
            passed_on = stops;
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        tokio::select! {
            status = child.wait() => break status,
            read = readiness.read_to_end(&mut report), if reading => {
                reading = false;
                was_ready = read.is_ok() && report.starts_with(b"ready");
                if was_ready {
                    tracing::info!("worker process {} ready (pid {pid})", slot.index);
                    let _ = events.send(Event::Ready { index: slot.index, first });
                    if hups_seen > hups_at_spawn {
                        tracing::info!("worker process {}: passing on the SIGHUP that came while it started", slot.index);
                        // SAFETY: kill has no memory effects; `pid` is not reaped.
                        unsafe { libc::kill(pid, libc::SIGHUP) };
                    }
                }
            }
            _ = tokio::time::sleep_until(start_deadline), if !was_ready && !timed_out => {
                timed_out = true;
                tracing::error!(
                    "worker process {} did not report ready within {:?} (worker.start_timeout_ms): killing it",
                    slot.index,
                    slot.start_timeout
                );
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            changed = orders.stop.changed(), if watching_stop => watching_stop = changed.is_ok(),
            changed = orders.hup.changed(), if watching_hup => {
                watching_hup = changed.is_ok();
                let hups = *orders.hup.borrow_and_update();
                if was_ready && hups > hups_seen {
                    // SAFETY: as above.
                    unsafe { libc::kill(pid, libc::SIGHUP) };
                }
                hups_seen = hups;
            }
        }
    };
    Ok(Ended {
        status: status.context("cannot wait for a worker process")?,
        was_ready,
        timed_out,
    })
}

/// In the child before exec: put the readiness pipe on descriptor 3, stop
/// with the supervisor, pin to the CPU.
fn child_setup(write_fd: i32, cpu: Option<usize>, supervisor: libc::pid_t) -> std::io::Result<()> {
    let check = |r: i32| if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
    // SAFETY: plain system calls on descriptors and sets owned here.
    unsafe {
        if write_fd == READY_FD {
            check(libc::fcntl(READY_FD, libc::F_SETFD, 0))?;
        } else {
            check(libc::dup2(write_fd, READY_FD))?;
        }
        check(libc::prctl(libc::PR_SET_PDEATHSIG, ORPHANED))?;
        // The supervisor died before the line above: nobody would signal
        // this process, so it must not start.
        if libc::getppid() != supervisor {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        if let Some(cpu) = cpu {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            check(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(listen: Option<&str>) -> Plan {
        Plan {
            processes: 2,
            pin: true,
            program: PathBuf::from("idem"),
            args: Vec::new(),
            listen: listen.map(str::to_string),
            start_timeout: Duration::from_secs(1),
            restart_check: None,
        }
    }

    #[test]
    fn each_process_serves_on_its_own_port() {
        let p = plan(Some("127.0.0.1:9464"));
        assert_eq!(p.listen_of(0).unwrap().as_deref(), Some("127.0.0.1:9464"));
        assert_eq!(p.listen_of(3).unwrap().as_deref(), Some("127.0.0.1:9467"));
        assert_eq!(plan(Some("[::1]:0")).listen_of(5).unwrap().as_deref(), Some("[::1]:0"));
        assert_eq!(plan(None).listen_of(1).unwrap(), None);
        let err = plan(Some("127.0.0.1:65535")).listen_of(1).unwrap_err().to_string();
        assert!(err.contains("past 65535"), "{err}");
        let err = plan(Some("localhost")).listen_of(0).unwrap_err().to_string();
        assert!(err.contains("HOST:PORT"), "{err}");
    }

    #[test]
    fn this_process_may_run_on_some_cpu() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.len() <= std::thread::available_parallelism().map(|n| n.get()).unwrap_or(usize::MAX));
    }
}
