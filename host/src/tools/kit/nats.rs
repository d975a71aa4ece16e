//! A NATS server (JetStream on) of one's own, for runs that kill and
//! restart it. It syncs every write of its store to disk
//! (`sync_interval: always`, NATS 2.10+), the setting under which a crash
//! of the server must lose nothing it acknowledged (docs/RELIABILITY.md).

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A `nats-server -js` on a free port, its JetStream store in a directory
/// of its own, kept across restarts.
pub struct OwnNats {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnNats {
    /// Start it.
    pub fn start() -> Result<OwnNats> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut n = OwnNats {
            port,
            dir: tempfile::tempdir()?,
            child: None,
        };
        n.spawn()?;
        Ok(n)
    }

    /// Start it again (after [`kill`](Self::kill)).
    pub fn spawn(&mut self) -> Result<()> {
        let dir = self.dir.path();
        let store = dir.join("store");
        // Written inside NATS's double quotes, which take no escapes but
        // a few: a path needing any is refused rather than changed.
        let Some(store) = store
            .to_str()
            .filter(|s| !s.chars().any(|c| c.is_control() || c == '"' || c == '\\'))
        else {
            bail!(
                "cannot give nats-server the store directory {} (not UTF-8, or holding quotes, backslashes or control characters): set TMPDIR to a plain path",
                store.display()
            );
        };
        let config = dir.join("nats.conf");
        std::fs::write(
            &config,
            format!(
                "listen: \"127.0.0.1:{}\"\njetstream {{\n  store_dir: \"{store}\"\n  sync_interval: always\n}}\n",
                self.port
            ),
        )
        .with_context(|| format!("cannot write {}", config.display()))?;
        let child = super::spawn_listening(
            Command::new("nats-server").arg("-c").arg(&config),
            "nats-server",
            self.port,
            &dir.join("nats.log"),
            "it must be 2.10 or later, for JetStream's sync_interval: scripts/services.sh installs 2.11.11 \
             under target/tools/bin, which cargo xtask chaos puts first on PATH",
        )?;
        self.child = Some(child);
        Ok(())
    }

    /// Stop it as an operator's restart does (SIGTERM: it flushes its
    /// streams and consumers and exits), waiting up to 10 s, then SIGKILL.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for OwnNats {
    fn drop(&mut self) {
        self.kill();
    }
}
