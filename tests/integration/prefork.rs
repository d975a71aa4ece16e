//! `worker.processes`: one real `idem run` supervising pinned worker
//! processes; a worker process SIGKILLed mid-run is started again, a
//! process that cannot start stops the start with its error, and the worker
//! processes do not outlive a supervisor killed with SIGKILL.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use idem_host::config::Processes;
use idem_host::prefork::{stat_fields, worker_pids};
use idem_host::tools::demo::{verify, Schedule};

use crate::common::*;

/// Whether a process has exited (gone, or a zombie nobody reaped yet).
fn exited(pid: u32) -> bool {
    stat_fields(pid).is_none_or(|f| f.first().map(String::as_str) == Some("Z"))
}

/// The CPUs a process may run on, as /proc lists them ("0", "0-1").
fn cpus_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

fn log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

async fn wait_for_log(path: &Path, needle: &str, count: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while log(path).matches(needle).count() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {count} × {needle:?} in the log:\n{}",
            log(path)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    wait_for(Duration::from_secs(60), "the supervisor to exit", || {
        let status = child.try_wait().unwrap();
        async move { status }
    })
    .await
}

/// The supervisor's index of the worker process it started as `pid`.
fn index_of(log: &str, pid: u32) -> String {
    let line = log
        .lines()
        .find(|l| l.contains(" started (pid ") && (l.contains(&format!("(pid {pid},")) || l.contains(&format!("(pid {pid})"))))
        .unwrap_or_else(|| panic!("no start of pid {pid} in the log:\n{log}"));
    let at = line.find("worker process ").unwrap() + "worker process ".len();
    line[at..].split_whitespace().next().unwrap().to_string()
}

/// A pool of two processes, written to `dir/idem.toml`.
fn two_processes(env: &mut Env) -> std::path::PathBuf {
    env.config.worker.processes = Processes::Count(2);
    env.config.worker.concurrency = 4;
    let path = env.dir.path().join("idem.toml");
    std::fs::write(&path, toml::to_string(&env.config).unwrap()).unwrap();
    path
}

/// The supervisor of the pool `config_path` describes, once every worker
/// process is ready: its process, its log, and its two worker processes.
async fn ready_pool(env: &Env, config_path: &Path) -> (Spawned, std::path::PathBuf, Vec<u32>) {
    let log_path = env.dir.path().join("supervisor.log");
    let supervisor = spawn_idem_run(config_path, &log_path);
    wait_for_log(&log_path, "every worker process is ready", 1).await;
    let workers = worker_pids(supervisor.id());
    assert_eq!(workers.len(), 2, "{}", log(&log_path));
    (supervisor, log_path, workers)
}

/// A pool of two processes (`two_processes`) whose first is starting:
/// compiling every plugin into an empty compile cache, a start of seconds.
/// Its supervisor, and the supervisor's log.
async fn while_the_first_starts(env: &mut Env) -> (Spawned, std::path::PathBuf) {
    env.config.worker.compile_cache_dir = Some(env.dir.path().join("compiled"));
    let config_path = two_processes(env);
    let log_path = env.dir.path().join("supervisor.log");
    let supervisor = spawn_idem_run(&config_path, &log_path);
    wait_for_log(&log_path, "worker process 0 started", 1).await;
    (supervisor, log_path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_worker_processes_share_the_queue_and_a_killed_one_is_started_again() {
    let mut env = Env::new().await;
    let config_path = two_processes(&mut env);
    let backends = idem_host::backend::open(&env.config).await.unwrap();
    env.mock.watch_journal(backends.claims.clone());
    const MESSAGES: u64 = 600;
    let schedule = Schedule::new(MESSAGES as usize, 7, &env.mock);
    let published = schedule.publish(backends.broker.as_ref()).await.unwrap();
    assert!(published > MESSAGES, "with duplicates");
    let (mut supervisor, log_path, workers) = ready_pool(&env, &config_path).await;
    let pid = supervisor.id();

    let text = log(&log_path);
    assert!(
        text.contains("[process 0] ") && text.contains("[process 1] "),
        "each process's lines are tagged: {text}"
    );
    let cpus: Vec<String> = workers.iter().map(|&p| cpus_of(p)).collect();
    for c in &cpus {
        assert!(c.parse::<usize>().is_ok(), "each worker process on one CPU: {cpus:?}");
    }
    if std::thread::available_parallelism().unwrap().get() >= 2 {
        assert_ne!(cpus[0], cpus[1], "on CPUs of their own");
    }

    // Kill one worker process mid-run, at a moment it holds claims: it
    // dies with handlers in flight.
    let settled = || async {
        let c = backends.admin.counts().await.unwrap();
        c.done + c.dead
    };
    wait_until(Duration::from_secs(120), "a third of the messages to settle", || async {
        settled().await >= MESSAGES / 3
    })
    .await;
    let killed = index_of(&log(&log_path), workers[0]);
    kill_holding_claims(workers[0], &log_path, &format!("[process {killed}] "), backends.admin.as_ref()).await;
    let replaced = wait_for(Duration::from_secs(60), "the killed worker process to be started again", || async {
        let now = worker_pids(pid);
        (now.len() == 2 && !now.contains(&workers[0])).then_some(now)
    })
    .await;
    let new = *replaced.iter().find(|p| **p != workers[1]).unwrap();
    let restarted = format!("worker process {killed} was killed by signal 9; starting it again");
    assert!(log(&log_path).contains(&restarted), "{}", log(&log_path));
    // The child pins itself between fork and exec, so it can be listed
    // before it is pinned: its CPU is read once it has reported ready.
    wait_for_log(&log_path, &format!("worker process {killed} ready"), 2).await;
    assert_eq!(cpus_of(new), cpus[0], "the new process takes the killed one's CPU");

    // SIGHUP reaches every worker process.
    signal(pid, "-HUP");
    wait_for_log(&log_path, "SIGHUP: reloading the configuration and the plugins", 2).await;

    wait_until(Duration::from_secs(180), "every message settled", || async {
        let c = backends.admin.counts().await.unwrap();
        c.done + c.dead >= MESSAGES && c.running == 0 && c.retry == 0 && backends.broker.pending().await.unwrap() == 0
    })
    .await;
    signal(pid, "-TERM");
    let status = wait_exit(&mut supervisor).await;
    assert!(status.success(), "{status:?}\n{}", log(&log_path));
    assert!(log(&log_path).contains("every worker process stopped cleanly"));
    assert!(
        replaced.iter().all(|&p| exited(p)),
        "the worker processes stopped with the supervisor"
    );

    let report = verify(&backends, &env.mock, &schedule).await.unwrap();
    assert_eq!(report.lost, 0, "{report:?}");
    assert_eq!(report.double_effects, 0, "{report:?}");
    assert_eq!(report.calls_after_journal, 0, "{report:?}");
    assert_eq!(report.missing_effects, 0, "{report:?}");
    assert_eq!(report.effects, MESSAGES - 1, "every message but the poison one: {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_that_cannot_start_stops_the_start_with_its_error() {
    let mut env = Env::new().await;
    env.config.plugins.get_mut("grant-credits").unwrap().path = env.dir.path().join("missing.wasm");
    let text = a_failed_start(&mut env).await;
    assert!(text.contains("missing.wasm"), "the worker process's own error: {text}");
    assert!(
        text.contains("worker process 0 exited with status 1 before it was ready; its error is above"),
        "{text}"
    );
}

/// A worker process that dies is not started again while the file holds
/// settings the other process took only at start (it would run with them
/// beside it: another claim store, say, would let one message run on both
/// sides); it is once the file agrees again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_is_not_started_again_with_settings_the_other_lacks() {
    let mut env = Env::new().await;
    let config_path = two_processes(&mut env);
    let (mut supervisor, log_path, workers) = ready_pool(&env, &config_path).await;
    let pid = supervisor.id();

    let started = std::fs::read_to_string(&config_path).unwrap();
    let mut changed = env.config.clone();
    changed.retry.max_attempts += 1;
    std::fs::write(&config_path, toml::to_string(&changed).unwrap()).unwrap();
    let killed = index_of(&log(&log_path), workers[0]);
    signal(workers[0], "-KILL");
    let held = format!("worker process {killed} is not started again");
    wait_for_log(&log_path, &held, 1).await;
    let text = log(&log_path);
    let line = text.lines().find(|l| l.contains(&held)).unwrap();
    assert!(line.contains("retry.max_attempts") && line.contains("put them back"), "{line}");
    assert_eq!(worker_pids(pid), vec![workers[1]], "only the process still running");

    std::fs::write(&config_path, started).unwrap();
    wait_for_log(&log_path, &format!("worker process {killed} ready"), 2).await;
    assert_eq!(worker_pids(pid).len(), 2);
    signal(pid, "-TERM");
    let status = wait_exit(&mut supervisor).await;
    assert!(status.success(), "{status:?}\n{}", log(&log_path));
}

/// A SIGHUP that comes while a worker process starts (here: compiling its
/// plugins into an empty cache) is passed on once it is ready, so it reads
/// what changed after it read its configuration. Before, it was dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_while_a_worker_process_starts_reaches_it_once_ready() {
    let mut env = Env::new().await;
    let (mut supervisor, log_path) = while_the_first_starts(&mut env).await;
    let pid = supervisor.id();
    assert!(!log(&log_path).contains("worker process 0 ready"), "{}", log(&log_path));
    signal(pid, "-HUP");
    wait_for_log(&log_path, "every worker process is ready", 1).await;
    wait_until(Duration::from_secs(30), "process 0 to reload", || async {
        log(&log_path)
            .lines()
            .any(|l| l.contains("[process 0] ") && l.contains("SIGHUP: reloading the configuration and the plugins"))
    })
    .await;
    assert!(
        log(&log_path).contains("worker process 0: passing on the SIGHUP that came while it started"),
        "{}",
        log(&log_path)
    );
    signal(pid, "-TERM");
    let status = wait_exit(&mut supervisor).await;
    assert!(status.success(), "{status:?}\n{}", log(&log_path));
}

/// Run a pool of two processes whose first cannot start; check the
/// supervisor failed without starting the second or retrying the first,
/// and return its log.
async fn a_failed_start(env: &mut Env) -> String {
    let config_path = two_processes(env);
    let log_path = env.dir.path().join("supervisor.log");
    let mut supervisor = spawn_idem_run(&config_path, &log_path);
    let status = wait_exit(&mut supervisor).await;
    let text = log(&log_path);
    assert!(!status.success(), "{text}");
    assert!(
        !text.contains("worker process 1 started"),
        "no second process after the first failed: {text}"
    );
    assert!(!text.contains("starting it again"), "a failed start is not retried: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_not_ready_within_the_start_timeout_is_killed_and_stops_the_start() {
    let mut env = Env::new().await;
    // An empty compile cache: the first process has plugins to compile, far
    // longer than the 1 ms it is given.
    env.config.worker.compile_cache_dir = Some(env.dir.path().join("compiled"));
    env.config.worker.start_timeout_ms = 1;
    let text = a_failed_start(&mut env).await;
    assert!(
        text.contains("worker process 0 did not report ready within 1ms (worker.start_timeout_ms): killing it"),
        "{text}"
    );
    assert!(
        text.contains("worker process 0 was killed by signal 9 before it was ready (not ready within 1ms, worker.start_timeout_ms)"),
        "{text}"
    );
}

/// A port P with P + 1 free too (for two processes' addresses).
fn two_free_ports() -> u16 {
    loop {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

async fn readyz(port: u16) -> u16 {
    match reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_processes_stop_when_their_supervisor_is_killed() {
    // One process in the file, two on the command line; each serves on its
    // own port.
    let env = Env::new().await;
    let config_path = env.dir.path().join("idem.toml");
    std::fs::write(&config_path, toml::to_string(&env.config).unwrap()).unwrap();
    let port = two_free_ports();
    let log_path = env.dir.path().join("supervisor.log");
    let mut supervisor = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["run", "--processes", "2", "--listen", &format!("127.0.0.1:{port}"), "--config"])
        .arg(&config_path)
        .env("IDEM_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    wait_for_log(&log_path, "every worker process is ready", 1).await;
    let workers = worker_pids(supervisor.id());
    assert_eq!(workers.len(), 2);
    assert_eq!(
        (readyz(port).await, readyz(port + 1).await),
        (200, 200),
        "process K serves on port + K"
    );
    supervisor.kill().unwrap();
    supervisor.wait().unwrap();
    wait_until(Duration::from_secs(60), "the orphaned worker processes to stop", || async {
        workers.iter().all(|&p| exited(p))
    })
    .await;
    // They stopped as on SIGTERM: drained, not killed, and not at once
    // (the kernel may signal an orphan more than once).
    wait_for_log(&log_path, "the supervisor is gone", 2).await;
    wait_for_log(&log_path, "stopped cleanly", 2).await;
    assert!(!log(&log_path).contains("second signal"), "{}", log(&log_path));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_worker_processes_start_lets_them_start_then_drain() {
    let mut env = Env::new().await;
    // At once: the first worker process is starting (it is not passed a
    // signal it may not have a handler for yet), the second not started.
    let (mut supervisor, log_path) = while_the_first_starts(&mut env).await;
    signal(supervisor.id(), "-TERM");
    let status = wait_exit(&mut supervisor).await;
    let text = log(&log_path);
    assert!(status.success(), "{status:?}\n{text}");
    assert!(text.contains("every worker process stopped cleanly"), "{text}");
    assert!(text.contains("[process 0] ") && text.contains("stopped cleanly"), "{text}");
    assert!(!text.contains("killed by signal"), "{text}");
    assert!(!text.contains("worker process 1 started"), "no process starts after a stop: {text}");
}
