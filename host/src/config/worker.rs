//! The `[worker]` section: one process's pool, and how many processes
//! `idem run` starts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest visibility the Redis broker can give a delivery (its claim
/// horizon, `broker::redis::CLAIM_HORIZON`): 24 hours.
pub const REDIS_MAX_VISIBILITY_MS: u64 = 24 * 60 * 60 * 1000;

/// The worker pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Handlers running at once in this process.
    pub concurrency: usize,
    /// Deliveries fetched (and claimed) per round trip.
    pub batch_size: usize,
    /// Places in hand per handler slot: messages claimed and waiting for a
    /// slot, or running. As many more may be settling (their writes
    /// committing, then their confirm and ack), bounded apart. Fetching and
    /// claiming for free places in hand rather than free slots keeps the
    /// slots fed while a fetch and its claim round trip are under way.
    pub prefetch: usize,
    /// How long a claim is owned without a heartbeat. Set it well above the
    /// handler's p99 duration; the heartbeat extends it while a handler runs.
    pub lease_ms: u64,
    /// How often in-flight claims (and broker deliveries) are extended.
    /// Default: a third of the lease.
    pub heartbeat_ms: Option<u64>,
    /// How long a fetched delivery stays invisible to other consumers before
    /// the broker redelivers it.
    pub visibility_ms: u64,
    /// When a delivery finds its key busy, how long until it is redelivered.
    pub busy_retry_ms: u64,
    /// How long to wait before polling again when the queue is empty.
    pub poll_idle_ms: u64,
    /// What to do when the claim store is unreachable (G8): `reject` leaves
    /// the delivery unacked and backs off.
    pub outage_policy: OutagePolicy,
    /// On SIGTERM/SIGINT, how long running handlers may take to finish
    /// before they are stopped, their claims released and their deliveries
    /// handed back for redelivery.
    pub shutdown_grace_ms: u64,
    /// Watch the plugin files and reload a changed component while running.
    /// SIGHUP reloads whether or not this is on.
    pub watch_plugins: bool,
    /// Where compiled components are kept across restarts and reloads;
    /// unset: beside the embedded database file (`idem.db-compiled/`).
    pub compile_cache_dir: Option<std::path::PathBuf>,
    /// How many worker processes `idem run` starts on this machine, each
    /// with `concurrency` handler slots, supervised and restarted by the
    /// first: a number, or `"auto"` for one per CPU it may run on.
    pub processes: Processes,
    /// With more than one process, and one per CPU this process may run on,
    /// pin each to its own CPU.
    pub pin: bool,
    /// With more than one process: how long a worker process may take from
    /// its start to serving (connecting, compiling its plugins) before the
    /// supervisor kills it. A first start that times out stops the pool's
    /// start; a restart that does is started again later.
    pub start_timeout_ms: u64,
}

/// `worker.processes`: a count, or `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Processes {
    /// This many.
    Count(usize),
    /// One per CPU the process may run on (its affinity mask).
    Auto(AutoWord),
}

/// The word `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoWord {
    /// `"auto"`.
    Auto,
}

impl Processes {
    /// The count, `"auto"` resolved against the CPUs this process may use.
    pub fn count(self) -> usize {
        match self {
            Processes::Count(n) => n,
            Processes::Auto(_) => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        }
    }
}

impl std::str::FromStr for Processes {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Processes::Auto(AutoWord::Auto)),
            n => match n.parse() {
                Ok(0) => Err("worker processes must be at least 1, or \"auto\"".into()),
                Ok(n) => Ok(Processes::Count(n)),
                Err(_) => Err(format!("{s:?} is neither a number of processes nor \"auto\"")),
            },
        }
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 16,
            batch_size: 64,
            prefetch: 16,
            lease_ms: 30_000,
            heartbeat_ms: None,
            visibility_ms: 60_000,
            busy_retry_ms: 1_000,
            poll_idle_ms: 50,
            outage_policy: OutagePolicy::Reject,
            shutdown_grace_ms: 30_000,
            watch_plugins: true,
            compile_cache_dir: None,
            processes: Processes::Count(1),
            pin: true,
            start_timeout_ms: 300_000,
        }
    }
}

impl WorkerConfig {
    /// The lease as a duration.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
    /// The heartbeat interval: the configured one, or a third of the lease.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms.unwrap_or(self.lease_ms / 3).max(1))
    }
    /// The visibility timeout as a duration.
    pub fn visibility(&self) -> Duration {
        Duration::from_millis(self.visibility_ms)
    }
}

/// G8: what to do when the claim store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutagePolicy {
    /// Leave the delivery unacked and back off (default).
    Reject,
    /// Run the handler without a claim. Only for plugins whose effects are
    /// all naturally idempotent.
    RunUnguarded,
}
