//! A NATS server (JetStream on) of one's own, for runs that kill and
//! restart it. It syncs every write of its store to disk
//! (`sync_interval: always`, NATS 2.10+), the setting under which a crash
//! of the server must lose nothing it acknowledged (docs/RELIABILITY.md).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
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
        let config = self.dir.path().join("nats.conf");
        // JSON is valid NATS configuration, and quotes the path whatever it holds.
        let store = serde_json::to_string(&self.dir.path().join("store").to_string_lossy())?;
        std::fs::write(
            &config,
            format!(
                "listen: \"127.0.0.1:{}\"\njetstream {{\n  store_dir: {store}\n  sync_interval: always\n}}\n",
                self.port
            ),
        )
        .with_context(|| format!("cannot write {}", config.display()))?;
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context(
                "cannot start nats-server: is one on PATH? (Idem's repository installs one with \
                 scripts/services.sh, under target/tools/bin, which cargo xtask chaos puts first on PATH)",
            )?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                bail!("nats-server on port {} did not start", self.port);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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
