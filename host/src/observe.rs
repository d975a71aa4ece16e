//! What a running pool shows the outside: Prometheus metrics, health and
//! readiness probes, the loaded plugins, and the lease-risk warning.
//!
//! `idem run` serves these over HTTP when `[http] listen` (or `--listen`) is
//! set:
//!
//! | path       | answers                                                        |
//! |------------|----------------------------------------------------------------|
//! | `/metrics` | Prometheus text: outcomes, durations, claims, leases, fences   |
//! | `/healthz` | 200 while the process runs                                     |
//! | `/readyz`  | 200 when the broker, claim store and data store answer, else 503 |
//! | `/plugins` | JSON: each loaded plugin, its version (content hash), when loaded |
//! | `/console` | the web console ([`crate::console`])                           |

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::backend::Backends;
use crate::runtime::Runtime;
use crate::stats::Counters;
use crate::worker::Worker;

/// Buckets of `idem_handler_duration_seconds`: 100 µs to 60 s.
const DURATION_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A plugin's duration p99 within this fraction of the lease (or the
/// visibility timeout) raises the lease-risk warning.
pub const LEASE_RISK_FRACTION: f64 = 0.8;

/// The process's Prometheus recorder (installed once; later calls reuse it).
pub fn prometheus() -> Result<PrometheusHandle> {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full("idem_handler_duration_seconds".into()), DURATION_BUCKETS)
        .context("duration buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    Ok(HANDLE.get_or_init(|| handle).clone())
}

/// Is a p99 within [`LEASE_RISK_FRACTION`] of the shorter of lease and
/// visibility timeout?
pub fn lease_at_risk(p99: Duration, lease: Duration, visibility: Duration) -> bool {
    p99.as_secs_f64() >= LEASE_RISK_FRACTION * lease.min(visibility).as_secs_f64()
}

/// Check every plugin's p99 against the lease and visibility timeout every
/// `every`: log a warning when one comes close (once per transition) and
/// set `idem_lease_risk{plugin}` to 1 (0 when it is clear again).
pub async fn watch_lease_risk(worker: Arc<Worker>, every: Duration, stop: CancellationToken) {
    let (lease, visibility) = (worker.options().lease, worker.options().visibility);
    let mut warned: HashMap<String, bool> = HashMap::new();
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        for (plugin, p99) in worker.durations().p99s() {
            let p99 = Duration::from_secs_f64(p99);
            let risk = lease_at_risk(p99, lease, visibility);
            metrics::gauge!("idem_handler_p99_seconds", "plugin" => plugin.clone()).set(p99.as_secs_f64());
            metrics::gauge!("idem_lease_risk", "plugin" => plugin.clone()).set(if risk { 1.0 } else { 0.0 });
            let was = warned.insert(plugin.clone(), risk).unwrap_or(false);
            if risk && !was {
                tracing::warn!(
                    %plugin,
                    p99_ms = p99.as_millis() as u64,
                    lease_ms = lease.as_millis() as u64,
                    visibility_ms = visibility.as_millis() as u64,
                    "handler p99 is within 80% of the lease or the visibility timeout: a slow run will be redelivered while it still runs; raise worker.lease_ms / worker.visibility_ms or speed the handler up"
                );
            } else if !risk && was {
                tracing::info!(%plugin, p99_ms = p99.as_millis() as u64, "handler p99 is clear of the lease again");
            }
        }
    }
}

/// A loaded plugin, as `/plugins` and `idem plugin list` show it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LoadedPlugin {
    /// The name messages are published to.
    pub name: String,
    /// Content hash of the component.
    pub version: String,
    /// When this version was loaded (Unix ms).
    pub loaded_at: i64,
}

/// Everything the HTTP endpoint reads.
#[derive(Clone)]
pub struct HttpState {
    /// The metrics recorder's handle.
    pub metrics: PrometheusHandle,
    /// The pool's backends (readiness).
    pub backends: Backends,
    /// The loaded plugins.
    pub runtime: Arc<Runtime>,
    /// The worker (in-flight count).
    pub worker: Arc<Worker>,
    /// The worker's counters.
    pub counters: Arc<Counters>,
}

/// Bind `addr` (the `http.listen` setting or `--listen`).
pub async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (http.listen / --listen): is another process using the port?"))
}

/// The probes', metrics' and plugins' routes.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/plugins", get(plugins))
        .with_state(state)
}

/// Serve `app` on `listener` until `stop` is cancelled.
pub fn serve(listener: TcpListener, app: Router, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the HTTP endpoint stopped");
        }
    })
}

async fn metrics_page(State(s): State<HttpState>) -> Response {
    publish_counters(&s.counters);
    metrics::gauge!("idem_in_flight").set(s.worker.in_flight() as f64);
    for name in s.runtime.plugin_names() {
        if let Some(p) = s.runtime.plugin(&name) {
            metrics::gauge!("idem_plugin_loaded_at_seconds", "plugin" => name.clone(), "version" => p.version.clone())
                .set(p.loaded_at as f64 / 1000.0);
        }
    }
    // The dead letters alone: counting every claim and journal row on each
    // scrape of each process would scan those tables.
    match tokio::time::timeout(Duration::from_secs(2), s.backends.admin.dead_letter_count()).await {
        Ok(Ok(n)) => metrics::gauge!("idem_dead_letters").set(n as f64),
        Ok(Err(e)) => tracing::warn!(error = %e, "metrics: cannot count dead letters"),
        Err(_) => tracing::warn!("metrics: counting dead letters took over 2 s"),
    }
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

/// Copy the worker's counters into the recorder.
fn publish_counters(c: &Counters) {
    let s = c.snapshot();
    for (outcome, value) in [
        ("done", s.done),
        ("duplicate", s.duplicates),
        ("busy", s.busy),
        ("retry", s.retries),
        ("dead_lettered", s.dead_lettered),
        ("conflict", s.conflicts),
    ] {
        metrics::counter!("idem_messages_total", "outcome" => outcome).absolute(value);
    }
    metrics::counter!("idem_deliveries_total").absolute(s.deliveries);
    metrics::counter!("idem_executions_total").absolute(s.executions);
    metrics::counter!("idem_traps_total").absolute(s.traps);
    metrics::counter!("idem_permanent_errors_total").absolute(s.permanent_errors);
    metrics::counter!("idem_claim_conflicts_total").absolute(s.busy + s.conflicts);
    metrics::counter!("idem_lease_extensions_total").absolute(s.lease_extensions);
    metrics::counter!("idem_fence_rejections_total").absolute(s.fence_rejections);
    metrics::counter!("idem_outage_decisions_total").absolute(s.outage_decisions);
    metrics::counter!("idem_host_panics_total").absolute(s.host_panics);
    metrics::counter!("idem_external_calls_total").absolute(s.external_calls);
    metrics::counter!("idem_journal_replays_total").absolute(s.journal_replays);
    metrics::counter!("idem_writes_paced_total").absolute(s.writes_paced);
}

/// What `/readyz` reports per dependency.
#[derive(Debug, Serialize)]
struct Readiness {
    ready: bool,
    broker: String,
    claims: String,
    data: String,
}

async fn ready(State(s): State<HttpState>) -> Response {
    const LIMIT: Duration = Duration::from_secs(2);
    fn verdict<T, E: std::fmt::Display>(r: Result<Result<T, E>, tokio::time::error::Elapsed>) -> String {
        match r {
            Ok(Ok(_)) => "ok".into(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} s", LIMIT.as_secs()),
        }
    }
    let (broker, claims, data) = tokio::join!(
        tokio::time::timeout(LIMIT, s.backends.broker.pending()),
        tokio::time::timeout(LIMIT, s.backends.admin.ping()),
        tokio::time::timeout(LIMIT, s.backends.data.get("idem-readyz", "idem-readyz")),
    );
    let r = Readiness {
        broker: verdict(broker),
        claims: verdict(claims),
        data: verdict(data),
        ready: false,
    };
    let ready = r.broker == "ok" && r.claims == "ok" && r.data == "ok";
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(Readiness { ready, ..r })).into_response()
}

async fn plugins(State(s): State<HttpState>) -> Json<Vec<LoadedPlugin>> {
    Json(
        s.runtime
            .plugin_names()
            .into_iter()
            .filter_map(|n| s.runtime.plugin(&n))
            .map(|p| LoadedPlugin {
                name: p.name.clone(),
                version: p.version.clone(),
                loaded_at: p.loaded_at,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_risk_starts_at_80_percent_of_the_shorter_bound() {
        let ms = Duration::from_millis;
        assert!(!lease_at_risk(ms(790), ms(1_000), ms(5_000)));
        assert!(lease_at_risk(ms(800), ms(1_000), ms(5_000)));
        assert!(lease_at_risk(ms(400), ms(30_000), ms(500)));
    }
}
