//! Network partitions for chaos runs: each worker reaches each server
//! through a [`FaultyProxy`] of its own on loopback, and a partition stalls
//! or cuts one worker's links (one server, or all of them) for longer than
//! a lease, then heals them: the other workers go on, take over the cut-off
//! worker's claims, and its late writes must be fenced out. The chaos
//! driver itself (publishing, counting, checking) connects directly.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use rand::Rng;

use crate::config::{BrokerKind, Config, StoreKind};
use crate::tools::kit::{FaultyProxy, Link};

/// The proxies in front of a deployment's servers, per worker slot:
/// (server, proxy).
pub(super) struct Partitions {
    slots: Vec<Vec<(String, Arc<FaultyProxy>)>>,
}

/// The port a URL's scheme uses when it names none.
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "postgres" | "postgresql" => Some(5432),
        "redis" => Some(6379),
        "amqp" => Some(5672),
        "nats" => Some(4222),
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

impl Partitions {
    /// Give each worker slot (one configuration each) proxies of its own in
    /// front of every server it reaches, rewriting its URLs to go through
    /// them.
    pub(super) async fn route(slots: &mut [Config]) -> Result<Partitions> {
        let mut all = Vec::with_capacity(slots.len());
        for config in slots.iter_mut() {
            all.push(Self::route_one(config).await?);
        }
        Ok(Partitions { slots: all })
    }

    /// One proxy per server `workers` reaches.
    async fn route_one(workers: &mut Config) -> Result<Vec<(String, Arc<FaultyProxy>)>> {
        let mut proxies: Vec<(String, Arc<FaultyProxy>)> = Vec::new();
        let mut urls: Vec<&mut Option<String>> = Vec::new();
        // Kafka clients reach the brokers at the addresses the cluster
        // advertises once bootstrapped, past any proxy: its links are not
        // partitioned (worker kills and rebalances are its faults).
        if !matches!(workers.broker.kind, BrokerKind::Sqlite | BrokerKind::Kafka) {
            urls.push(&mut workers.broker.url);
        }
        if workers.claims.kind != StoreKind::Sqlite {
            urls.push(&mut workers.claims.url);
        }
        if workers.data.kind != StoreKind::Sqlite {
            urls.push(&mut workers.data.url);
        }
        for slot in urls {
            let Some(text) = slot.as_deref() else { continue };
            let mut url = url::Url::parse(text).with_context(|| format!("chaos: cannot parse {}", crate::text::redact_url(text)))?;
            let host = url.host_str().unwrap_or("127.0.0.1").to_string();
            let port = url
                .port()
                .or_else(|| default_port(url.scheme()))
                .context("chaos: a server URL without a port")?;
            let upstream: SocketAddr = (host.as_str(), port)
                .to_socket_addrs()?
                .next()
                .with_context(|| format!("chaos: cannot resolve {host}:{port}"))?;
            let name = format!("{}://{host}:{port}", url.scheme());
            let proxy = match proxies.iter().find(|(n, _)| *n == name) {
                Some((_, p)) => p.clone(),
                None => {
                    let p = FaultyProxy::start(upstream).await?;
                    proxies.push((name, p.clone()));
                    p
                }
            };
            url.set_host(Some("127.0.0.1")).ok();
            url.set_port(Some(proxy.addr().port())).ok();
            *slot = Some(url.to_string());
        }
        Ok(proxies)
    }

    /// Whether there is anything to partition.
    pub(super) fn any(&self) -> bool {
        self.slots.iter().any(|s| !s.is_empty())
    }

    /// Stall or cut one worker's links (to one server, or to all), chosen
    /// at random, for one to two and a half leases, then heal them; say
    /// what was done, for the log.
    pub(super) async fn inject(&self, rng: &mut impl Rng, lease: Duration) -> String {
        let slot = rng.random_range(0..self.slots.len());
        let links = &self.slots[slot];
        let chosen: Vec<&(String, Arc<FaultyProxy>)> = if rng.random_bool(0.5) {
            links.iter().collect()
        } else {
            vec![&links[rng.random_range(0..links.len())]]
        };
        let how = if rng.random_bool(0.5) { Link::Stalled } else { Link::Cut };
        let how_long = lease.mul_f64(rng.random_range(1.0..2.5));
        futures::future::join_all(chosen.iter().map(|(_, p)| p.partition(how, how_long))).await;
        let names: Vec<&str> = chosen.iter().map(|(n, _)| n.as_str()).collect();
        format!("worker {slot}: {how:?} {} for {} ms", names.join(", "), how_long.as_millis())
    }
}
