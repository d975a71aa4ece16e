//! Services failing under a running pool: the claim store's Redis killed
//! and restarted (G8, outage policy `reject`), and Postgres connections
//! terminated by the server.

use std::path::Path;
use std::time::Duration;

use idem_host::app::Pool;
use idem_host::config::{BrokerKind, Config, OutagePolicy, StoreConfig, StoreKind};
use idem_host::tools::demo::{demo_config, verify, Schedule};
use idem_host::tools::kit::Mock;
use idem_host::tools::kit::OwnRedis;

use crate::common::*;

const MESSAGES: usize = 600;

async fn drained(pool: &Pool, messages: u64) -> bool {
    let Ok(c) = pool.backends.admin.counts().await else { return false };
    let Ok(pending) = pool.backends.broker.pending().await else {
        return false;
    };
    c.done + c.dead >= messages && c.running == 0 && c.retry == 0 && pending == 0 && pool.worker.in_flight() == 0
}

fn base_config(dir: &Path, mock: &Mock) -> Config {
    let mut config = demo_config(dir.join("idem.db"), &plugin_dir(), mock, 8);
    config.namespace = unique_namespace("outage");
    config.worker.lease_ms = 1_500;
    config.worker.heartbeat_ms = Some(300);
    config.worker.visibility_ms = 1_500;
    config.worker.busy_retry_ms = 200;
    config.worker.poll_idle_ms = 20;
    config
}

/// The broker on the machine's Redis, claims on a Redis of the test's own
/// (to kill), data in Postgres.
fn own_claims_config(dir: &Path, mock: &Mock, own: &OwnRedis) -> Config {
    let mut config = base_config(dir, mock);
    config.broker.kind = BrokerKind::Redis;
    config.broker.url = Some(services::redis());
    config.claims = StoreConfig {
        kind: StoreKind::Redis,
        url: Some(own.url()),
        max_connections: 8,
    };
    config.data = StoreConfig {
        kind: StoreKind::Postgres,
        url: Some(services::postgres()),
        max_connections: 8,
    };
    config
}

/// What each outage test starts from: a temporary directory, the mock APIs,
/// the claim store's own Redis, and [`own_claims_config`] with `policy`.
async fn own_claims_setup(policy: OutagePolicy) -> (tempfile::TempDir, Mock, OwnRedis, Config) {
    let dir = tempfile::tempdir().unwrap();
    let mock = Mock::start(Duration::from_millis(300)).await.unwrap();
    let own = OwnRedis::start().expect("redis-server is installed (scripts/services.sh installs it)");
    let mut config = own_claims_config(dir.path(), &mock, &own);
    config.worker.outage_policy = policy;
    (dir, mock, own, config)
}

/// G8 with `reject`: the claim store's Redis is SIGKILLed mid-run and
/// restarted; the broker (the machine's Redis) keeps delivering. Workers
/// leave deliveries unacked while claims are unreachable, count the
/// decisions, and finish every message once the store is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_store_outage_with_reject_loses_nothing_and_doubles_nothing() {
    let (_dir, mock, mut own, config) = own_claims_setup(OutagePolicy::Reject).await;

    let pool = Pool::start(&config).await.unwrap();
    mock.watch_journal(pool.backends.claims.clone());
    let schedule = Schedule::new(MESSAGES, 5, &mock);
    schedule.publish(pool.backends.broker.as_ref()).await.unwrap();

    wait_until(Duration::from_secs(60), "a quarter of the messages to settle", || async {
        pool.backends
            .admin
            .counts()
            .await
            .map(|c| c.done >= MESSAGES as u64 / 4)
            .unwrap_or(false)
    })
    .await;
    own.kill();
    wait_until(Duration::from_secs(30), "the worker to apply the outage policy", || async {
        pool.counters.snapshot().outage_decisions >= 3
    })
    .await;
    let during = pool.counters.snapshot();
    own.spawn().unwrap();
    wait_until(Duration::from_secs(120), "the queue to drain after the restart", || {
        drained(&pool, MESSAGES as u64)
    })
    .await;

    let report = verify(&pool.backends, &mock, &schedule).await.unwrap();
    pool.stop().await.unwrap();
    eprintln!("outage decisions {}, report {report:?}", during.outage_decisions);
    assert_eq!(report.lost, 0, "{report:?}");
    assert_eq!(report.double_effects, 0, "{report:?}");
    assert_eq!(report.calls_after_journal, 0, "{report:?}");
    assert_eq!(report.missing_effects, 0, "{report:?}");
    assert_eq!(report.effects, MESSAGES as u64 - 1, "{report:?}");
    crate::pool::cleanup(&config).await;
}

/// Have the server terminate every connection of `application` (a
/// deployment's application name); how many it terminated.
async fn terminate_connections(admin: &sqlx::PgPool, application: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
    )
    .bind(application)
    .fetch_one(admin)
    .await
    .unwrap()
}

/// The server terminates every Postgres connection of the pool mid-run;
/// the workers reconnect and finish, nothing lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_terminated_mid_run_are_survived() {
    let dir = tempfile::tempdir().unwrap();
    let mock = Mock::start(Duration::from_millis(300)).await.unwrap();
    let mut config = base_config(dir.path(), &mock);
    config.claims = StoreConfig {
        kind: StoreKind::Postgres,
        url: Some(services::postgres()),
        max_connections: 8,
    };
    config.data = StoreConfig {
        kind: StoreKind::Postgres,
        url: Some(services::postgres()),
        max_connections: 8,
    };

    let pool = Pool::start(&config).await.unwrap();
    mock.watch_journal(pool.backends.claims.clone());
    let schedule = Schedule::new(MESSAGES, 6, &mock);
    schedule.publish(pool.backends.broker.as_ref()).await.unwrap();

    let admin = sqlx::PgPool::connect(&services::postgres()).await.unwrap();
    let application = format!("idem {}", config.namespace);
    let mut terminated = 0i64;
    for round in 1..=3u64 {
        wait_until(Duration::from_secs(60), "more messages to settle", || async {
            pool.backends
                .admin
                .counts()
                .await
                .map(|c| c.done >= round * MESSAGES as u64 / 5)
                .unwrap_or(false)
        })
        .await;
        terminated += terminate_connections(&admin, &application).await;
    }
    assert!(terminated > 0, "the pool's connections were found by application_name");
    wait_until(Duration::from_secs(120), "the queue to drain", || drained(&pool, MESSAGES as u64)).await;
    let report = verify(&pool.backends, &mock, &schedule).await.unwrap();
    pool.stop().await.unwrap();
    eprintln!("terminated {terminated} connections, report {report:?}");
    assert_eq!(report.lost, 0, "{report:?}");
    assert_eq!(report.double_effects, 0, "{report:?}");
    assert_eq!(report.calls_after_journal, 0, "{report:?}");
    assert_eq!(report.missing_effects, 0, "{report:?}");
    crate::pool::cleanup(&config).await;
}

/// G8 with `run-unguarded`: while the claim store is down, messages of a
/// plugin with no endpoints (grant-credits: an absolute assignment) run
/// without a claim and are acked; messages of a plugin that calls an API
/// (record-payment) are never run unguarded: they wait, and run once, with
/// a claim, when the store is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_store_outage_with_run_unguarded_runs_only_endpoint_free_plugins() {
    use serde_json::json;
    let (_dir, mock, mut own, config) = own_claims_setup(OutagePolicy::RunUnguarded).await;
    let pool = Pool::start(&config).await.unwrap();
    mock.watch_journal(pool.backends.claims.clone());
    own.kill();

    let grants: Vec<_> = (0..20)
        .map(|i| {
            envelope(
                &format!("grant-{i}"),
                "grant-credits",
                json!({ "user": format!("u{i}"), "balance": i * 10 }),
            )
        })
        .collect();
    let payments: Vec<_> = (0..5)
        .map(|i| {
            let id = format!("pay-unguarded-{i}");
            envelope(
                &id,
                "record-payment",
                json!({ "payment_id": id, "customer": "c", "amount_cents": 100 }),
            )
        })
        .collect();
    pool.backends.broker.publish(&payments, Duration::ZERO).await.unwrap();
    pool.backends.broker.publish(&grants, Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(60), "the grants to run unguarded", || async {
        pool.backends
            .data
            .scan("credits")
            .await
            .map(|rows| rows.len() == 20)
            .unwrap_or(false)
    })
    .await;
    let during = pool.counters.snapshot();
    assert!(during.outage_decisions >= 20, "{during:?}");
    assert_eq!(mock.total_requests(), 0, "no payment ran without a claim");
    for i in 0..20u64 {
        let stored = pool.backends.data.get("credits", &format!("u{i}")).await.unwrap();
        assert_eq!(stored, Some((i * 10).to_string().into_bytes()));
    }

    own.spawn().unwrap();
    wait_until(Duration::from_secs(120), "the payments to run once the store is back", || async {
        let mut done = 0;
        for i in 0..5 {
            if pool
                .backends
                .admin
                .state("record-payment", &format!("pay-unguarded-{i}"))
                .await
                .ok()
                .flatten()
                == Some(idem_host::claim::ClaimState::Done)
            {
                done += 1;
            }
        }
        done == 5 && pool.backends.broker.pending().await.unwrap_or(1) == 0
    })
    .await;
    for i in 0..5 {
        let key = format!("pay-unguarded-{i}");
        assert_eq!(mock.performed("payments", &key), 1, "{key} charged once");
    }
    assert_eq!(mock.calls_after_journal(), 0);
    pool.stop().await.unwrap();
    crate::pool::cleanup(&config).await;
}

/// A message running unguarded (claim store down, `run-unguarded`) when
/// the shutdown grace period ends is handed back to the broker, as one
/// running under a claim is: another consumer receives it at once, not
/// after the visibility timeout (a minute here) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_back_a_delivery_running_unguarded() {
    use idem_host::config::LimitsOverride;
    use serde_json::json;
    let (_dir, _mock, mut own, mut config) = own_claims_setup(OutagePolicy::RunUnguarded).await;
    config.worker.shutdown_grace_ms = 300;
    config.worker.visibility_ms = 60_000;
    // The hostile plugin (no endpoints, so it may run unguarded) spins in a
    // loop its limits let run for minutes.
    let mut hostile = plugin("hostile.wasm", &["hostile"], &[], None);
    hostile.limits = Some(LimitsOverride {
        cpu_ms: Some(300_000),
        timeout_ms: Some(300_000),
        ..Default::default()
    });
    config.plugins.insert("hostile".into(), hostile);
    let pool = Pool::start(&config).await.unwrap();
    own.kill();

    let spin = envelope("spin-unguarded", "hostile", json!({ "mode": "loop" }));
    pool.backends.broker.publish(&[spin], Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(30), "the message to run unguarded", || async {
        pool.counters.snapshot().outage_decisions >= 1
    })
    .await;
    let broker = pool.backends.broker.clone();
    pool.stop().await.unwrap();
    let again = wait_for(Duration::from_secs(10), "the delivery to be handed back", || {
        let broker = broker.clone();
        async move {
            let got = broker.fetch(10, Duration::from_secs(60)).await.unwrap();
            (!got.is_empty()).then_some(got)
        }
    })
    .await;
    let ids: Vec<&str> = again.iter().map(|d| d.envelope.id.as_str()).collect();
    assert_eq!(ids, ["spin-unguarded"]);
    let refs: Vec<&str> = again.iter().map(|d| d.receipt.as_str()).collect();
    broker.ack(&refs).await.unwrap();
    crate::pool::cleanup(&config).await;
}

/// A pooled Postgres connection the server closed while it sat idle is
/// found broken before it is handed out, and replaced: the first claim
/// after the idle second succeeds (a claim batch is not retried: a broken
/// connection would make it an outage), and so do the write and the read
/// after it. (A connection is tested before use only after it sat idle,
/// see `idem_host::backend::PING_AFTER_IDLE`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_closed_while_idle_are_replaced_before_use() {
    use idem_host::claim::ClaimRef;
    use idem_host::store::{Write, WriteOp};
    let dir = tempfile::tempdir().unwrap();
    let mut config = idem_host::config::Config {
        namespace: crate::common::unique_namespace("idle"),
        ..Default::default()
    };
    config.database.path = dir.path().join("idem.db");
    for store in [&mut config.claims, &mut config.data] {
        *store = StoreConfig {
            kind: StoreKind::Postgres,
            url: Some(services::postgres()),
            max_connections: 2,
        };
    }
    let backends = idem_host::backend::open(&config).await.unwrap();
    let hash = idem_host::envelope::payload_hash(b"{}");
    async fn claim(backends: &idem_host::backend::Backends, hash: &str, key: &str) -> ClaimRef {
        let out = backends
            .claims
            .claim(&[crate::conformance::request(key, hash, b"{}", 5)], backends.clock.now_ms())
            .await
            .unwrap();
        match out[0] {
            idem_host::claim::ClaimOutcome::Acquired { fence, .. } => ClaimRef {
                plugin: "p".into(),
                key: key.into(),
                fence,
            },
            ref other => panic!("{key}: {other:?}"),
        }
    }
    let write = |claim: ClaimRef, value: &'static [u8]| Write {
        claim,
        collection: "idle".into(),
        key: "row".into(),
        op: WriteOp::Upsert(value.to_vec()),
    };
    let first = claim(&backends, &hash, "k1").await;
    backends.data.write_many(&[write(first, b"1")]).await.remove(0).unwrap();

    let admin = sqlx::PgPool::connect(&services::postgres()).await.unwrap();
    let application = format!("idem {}", config.namespace);
    let terminated = terminate_connections(&admin, &application).await;
    assert!(terminated > 0, "the deployment's connections were found by application_name");
    // What is tested here is idleness itself: the pooled connections sit
    // unused for longer than the threshold.
    tokio::time::sleep(idem_host::backend::PING_AFTER_IDLE + Duration::from_millis(200)).await;

    let second = claim(&backends, &hash, "k2").await;
    let written = backends.data.write_many(&[write(second, b"2")]).await.remove(0);
    assert!(written.is_ok(), "{written:?}");
    assert_eq!(backends.data.get("idle", "row").await.unwrap(), Some(b"2".to_vec()));
    admin.close().await;
    crate::pool::cleanup(&config).await;
}
