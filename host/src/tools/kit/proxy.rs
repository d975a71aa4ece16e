//! A TCP proxy on loopback that can partition what goes through it: the
//! chaos runs put one between the workers and each server, then stall or
//! cut it for longer than a lease, and heal it.
//!
//! - **Stall**: nothing is forwarded in either direction, on every open
//!   connection, and new connections are accepted but wait: what a network
//!   that silently drops packets looks like to both ends (their TCP
//!   buffers fill, their calls time out or hang). When it heals, the held
//!   bytes flow on.
//! - **Cut**: every open connection is closed and new ones are refused
//!   until it heals: a partition the ends notice.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Forward everything.
    Up,
    /// Forward nothing; hold connections open.
    Stalled,
    /// Close every connection; refuse new ones.
    Cut,
}

/// A proxy from a loopback port to `upstream`.
pub struct FaultyProxy {
    addr: SocketAddr,
    link: watch::Sender<Link>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultyProxy {
    /// Listen on a free loopback port and forward to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Arc<Self>> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("cannot bind the chaos proxy")?;
        let addr = listener.local_addr()?;
        let (link, watch) = watch::channel(Link::Up);
        let task = tokio::spawn(accept(listener, upstream, watch));
        Ok(Arc::new(FaultyProxy { addr, link, task }))
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stall or cut the link for `how_long`, then heal it.
    pub async fn partition(&self, how: Link, how_long: Duration) {
        self.set(how);
        tokio::time::sleep(how_long).await;
        self.set(Link::Up);
    }

    /// Stall, cut or heal the link until told otherwise.
    pub fn set(&self, how: Link) {
        self.link.send_replace(how);
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, link: watch::Receiver<Link>) {
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        if *link.borrow() == Link::Cut {
            drop(client);
            continue;
        }
        let link = link.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else { return };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            // Either direction ending (or a cut) ends both.
            tokio::select! {
                _ = pipe(cr, sw, link.clone()) => {}
                _ = pipe(sr, cw, link.clone()) => {}
                _ = cut(link) => {}
            }
        });
    }
}

/// Copy `from` to `to`, holding each chunk while the link is stalled.
async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, mut link: watch::Receiver<Link>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if link.wait_for(|l| *l != Link::Stalled).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if link.wait_for(|l| *l != Link::Stalled).await.is_err() || *link.borrow() == Link::Cut {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Resolves when the link is cut.
async fn cut(mut link: watch::Receiver<Link>) {
    let _ = link.wait_for(|l| *l == Link::Cut).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
        s.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).await.unwrap();
        got
    }

    #[tokio::test]
    async fn a_stall_holds_traffic_until_it_heals_and_a_cut_closes_connections() {
        let proxy = FaultyProxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s, b"up").await, b"up");

        proxy.link.send_replace(Link::Stalled);
        s.write_all(b"held").await.unwrap();
        let mut got = [0u8; 4];
        let waited = tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut got)).await;
        assert!(waited.is_err(), "nothing comes back while stalled");
        proxy.link.send_replace(Link::Up);
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"held", "the held bytes flow on after healing");

        proxy.link.send_replace(Link::Cut);
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "a cut closes open connections (end of stream or reset)");
        proxy.link.send_replace(Link::Up);
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut again, b"healed").await, b"healed");
    }
}
