//! `worker.processes`: `idem run` as the supervisor of several worker
//! processes on one machine, each pinned to its own CPU.
//!
//! Why: an interpreter's instance (Python, JavaScript) writes pages of its
//! copy-on-write heap image on every message, and each such fault makes the
//! kernel flush the TLB of every other core running a thread of the same
//! process. Processes pinned one per core never interrupt each other
//! (docs/BENCHMARKS.md, "One process per core").
//!
//! The supervisor opens no backend and loads no plugin. It starts `idem run`
//! again for each process, with the same configuration file and
//! [`PROCESS_ENV`] naming the process, so that one runs the pool itself;
//! waits for it to report ready on an inherited pipe; and starts it again
//! when it dies. The first process starts alone, so the others find its
//! compiled components in the compile cache instead of compiling them too.
//! A process that fails before it is first ready stops the whole start, as
//! a single `idem run` would; one that dies later is restarted after 1 s,
//! doubling up to 30 s while it keeps dying within a minute.
//!
//! Signals: the first SIGTERM or SIGINT is passed on to every process, which
//! drains as a single `idem run` does; a second is passed on again (each
//! exits at once). SIGHUP is passed on (reload). A process gets signals only
//! once it is ready. The processes run in a process group of their own, so
//! a terminal's Ctrl-C reaches the supervisor alone, and each drains and
//! stops if the supervisor dies ([`ORPHANED`]). Pinning needs one process
//! per CPU this process may run on; otherwise they run unpinned.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

mod supervisor;

pub use supervisor::{supervise, Plan, RestartCheck};

/// Set in a supervised process's environment: its index (0, 1, …).
pub const PROCESS_ENV: &str = "IDEM_WORKER_PROCESS";
/// Set in a supervised process's environment: the descriptor to report
/// readiness on.
const READY_ENV: &str = "IDEM_READY_FD";
/// The descriptor a supervised process inherits for its readiness report.
const READY_FD: i32 = 3;
/// The signal a supervised process gets when its supervisor dies. Not
/// SIGTERM: Linux sends it again each time the process is handed to another
/// of the dying supervisor's threads, and a second SIGTERM means "exit at
/// once"; the process drains on the first and ignores the rest.
pub const ORPHANED: i32 = libc::SIGUSR2;

/// This process's place under a supervisor: its index and the readiness
/// pipe, until it reports.
static SUPERVISED: OnceLock<(usize, Mutex<Option<OwnedFd>>)> = OnceLock::new();
/// Whether this process was started with [`PROCESS_ENV`] set, pipe or not.
static STARTED_AS_WORKER: AtomicBool = AtomicBool::new(false);

/// Call first thing in `main`, before any thread starts: if the supervisor
/// started this process, take its index and readiness pipe. Both variables
/// are removed from the environment (nothing this process starts inherits
/// them), and descriptor 3 is taken only if it is the write end of a pipe,
/// so a stray variable cannot make this process write into, or close, a
/// descriptor that is not the supervisor's.
pub fn take_supervision() {
    use std::os::fd::FromRawFd;
    let index = std::env::var(PROCESS_ENV).ok().and_then(|v| v.parse::<usize>().ok());
    let fd = std::env::var(READY_ENV).ok();
    STARTED_AS_WORKER.store(std::env::var_os(PROCESS_ENV).is_some(), Ordering::Relaxed);
    std::env::remove_var(PROCESS_ENV);
    std::env::remove_var(READY_ENV);
    let (Some(index), Some("3")) = (index, fd.as_deref()) else { return };
    // SAFETY: fstat and fcntl only read the descriptor's state into `stat`.
    let is_pipe_end = unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        libc::fstat(READY_FD, &mut stat) == 0
            && stat.st_mode & libc::S_IFMT == libc::S_IFIFO
            && libc::fcntl(READY_FD, libc::F_GETFL) & libc::O_ACCMODE == libc::O_WRONLY
    };
    if !is_pipe_end {
        return;
    }
    // SAFETY: descriptor 3 is an open pipe's write end that nothing else in
    // this process owns (no thread has started, and the runtime opens its
    // descriptors after this); it is owned from here on and closed once.
    let pipe = unsafe { OwnedFd::from_raw_fd(READY_FD) };
    // SAFETY: fcntl on a descriptor owned here.
    unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    let _ = SUPERVISED.set((index, Mutex::new(Some(pipe))));
}

/// Whether this process was started as a worker process: then it runs the
/// pool itself, whatever `worker.processes` says (a worker process never
/// starts workers of its own).
pub fn started_as_worker() -> bool {
    STARTED_AS_WORKER.load(Ordering::Relaxed)
}

/// Which supervised process this is, if the supervisor started it.
pub fn supervised() -> Option<usize> {
    SUPERVISED.get().map(|(index, _)| *index)
}

/// Tell the supervisor this process is serving (nothing when unsupervised).
pub fn ready() {
    use std::io::Write;
    let Some((_, pipe)) = SUPERVISED.get() else { return };
    let Some(pipe) = pipe.lock().expect("readiness pipe poisoned").take() else {
        return;
    };
    if let Err(e) = std::fs::File::from(pipe).write_all(b"ready\n") {
        tracing::warn!(error = %e, "cannot report readiness to the supervisor");
    }
}

/// The worker processes a supervisor (`pid`) has started and not yet
/// reaped, sorted: the processes whose parent it is, from /proc.
pub fn worker_pids(supervisor: u32) -> Vec<u32> {
    let parent_of = |pid: u32| -> Option<u32> { stat_fields(pid)?.get(1)?.parse().ok() };
    let mut out: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| parent_of(p) == Some(supervisor))
        .collect();
    out.sort_unstable();
    out
}

/// The fields of /proc/PID/stat after the command name (the state first,
/// then the parent's pid, …); `None` once the process is reaped. The
/// command name is skipped past its last ')', as it may hold spaces.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}
