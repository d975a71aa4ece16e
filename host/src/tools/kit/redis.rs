//! A Redis server of one's own, for runs that kill and restart it.

use std::net::TcpListener;
use std::process::{Child, Command};

use anyhow::Result;

/// A Redis server of one's own on a free port, persisting every write
/// (`appendfsync always`), so that SIGKILL and a restart is a crash, not a
/// wipe. Used by chaos runs and the outage tests.
pub struct OwnRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnRedis {
    /// Start it.
    pub fn start() -> Result<OwnRedis> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut r = OwnRedis {
            port,
            dir: tempfile::tempdir()?,
            child: None,
        };
        r.spawn()?;
        Ok(r)
    }

    /// Start it again (after [`kill`](Self::kill)).
    pub fn spawn(&mut self) -> Result<()> {
        let child = super::spawn_listening(
            Command::new("redis-server")
                .args([
                    "--port",
                    &self.port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                    "--save",
                    "",
                ])
                .arg("--dir")
                .arg(self.dir.path()),
            "redis-server",
            self.port,
            &self.dir.path().join("redis.log"),
            "install Debian's redis-server package",
        )?;
        self.child = Some(child);
        Ok(())
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
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
