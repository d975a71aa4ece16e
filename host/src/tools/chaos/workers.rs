//! The worker processes of a chaos run: `idem run` children, each with its
//! own log, killed with SIGKILL and respawned.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

pub(super) struct Workers {
    /// Each slot's configuration file.
    configs: Vec<PathBuf>,
    logs: PathBuf,
    children: Vec<Option<Child>>,
    log_of: Vec<PathBuf>,
    spawned: usize,
}

impl Workers {
    /// One worker slot per configuration file, each running `idem run
    /// --config FILE`, logging into `logs`.
    pub(super) fn new(configs: Vec<PathBuf>, logs: PathBuf) -> Self {
        let count = configs.len();
        Workers {
            configs,
            logs,
            children: (0..count).map(|_| None).collect(),
            log_of: vec![PathBuf::new(); count],
            spawned: 0,
        }
    }

    pub(super) fn spawn(&mut self, slot: usize) -> Result<()> {
        self.spawned += 1;
        self.log_of[slot] = self.logs.join(format!("worker-{}.log", self.spawned));
        let log = std::fs::File::create(&self.log_of[slot])?;
        let child = Command::new(std::env::current_exe()?)
            .args(["run", "--config"])
            .arg(&self.configs[slot])
            .env("IDEM_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start a worker process")?;
        self.children[slot] = Some(child);
        Ok(())
    }

    /// A worker that exited on its own: its log's last lines.
    pub(super) fn exited(&mut self) -> Option<String> {
        for slot in 0..self.children.len() {
            if let Some(c) = &mut self.children[slot] {
                if let Ok(Some(status)) = c.try_wait() {
                    let text = std::fs::read_to_string(&self.log_of[slot]).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(5).collect();
                    return Some(format!(
                        "a worker exited by itself ({status}): {}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    ));
                }
            }
        }
        None
    }

    pub(super) fn kill(&mut self, slot: usize) {
        if let Some(mut c) = self.children[slot].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub(super) fn stop_all(&mut self) {
        for slot in 0..self.children.len() {
            if let Some(c) = &self.children[slot] {
                let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for slot in 0..self.children.len() {
            if let Some(mut c) = self.children[slot].take() {
                while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for slot in 0..self.children.len() {
            self.kill(slot);
        }
    }
}
