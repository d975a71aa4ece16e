//! The test kit the tools and the test suite share: mock external APIs that
//! count every request and effect (also served by `idem mock-api`), private
//! Redis and NATS servers that can be killed and restarted, and a TCP proxy
//! that partitions the network.

pub mod mock;
pub mod mock_api;
mod nats;
mod proxy;
mod redis;

pub use mock::{Counts, Mock};
pub use nats::OwnNats;
pub use proxy::{FaultyProxy, Link};
pub use redis::OwnRedis;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Spawn a server with its output in `log`, and wait (up to 10 s) until it
/// listens on 127.0.0.1:`port`. One that exits first, or never listens, is
/// stopped and reported with the last line it logged and `hint`.
fn spawn_listening(cmd: &mut Command, name: &str, port: u16, log: &Path, hint: &str) -> Result<Child> {
    let out = std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut child = cmd
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("cannot start {name}: {hint}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let said = std::fs::read_to_string(log).unwrap_or_default();
            let last = said.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(nothing)");
            let how = match exited {
                Some(status) => format!("it exited, {status}"),
                None => "not listening after 10 s".to_string(),
            };
            bail!("{name} on port {port} did not start ({how}); it said: {last} ({hint})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_exits_at_once_is_reported_with_what_it_said() {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let started = Instant::now();
        let err = spawn_listening(
            Command::new("sh").args(["-c", "echo starting; echo 'unknown field \"x\"' >&2; exit 3"]),
            "test-server",
            port,
            &dir.path().join("log"),
            "the hint",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("test-server on port"), "{err}");
        assert!(err.contains("it exited"), "{err}");
        assert!(err.contains("it said: unknown field \"x\""), "{err}");
        assert!(err.contains("(the hint)"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "reported when it exited, not at the deadline"
        );
    }
}
