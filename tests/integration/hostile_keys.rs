//! Keys and message ids a claim store cannot hold (a NUL, 10 KB) are
//! dead-lettered at admission with their reason, alone: their batch-mates
//! run, and nothing is mistaken for a claim-store outage. A handler's error
//! holding a NUL is dead-lettered with it escaped. On SQLite,
//! Postgres and Redis claims (each as a deployment combines them).

use std::time::Duration;

use idem_host::app::Pool;
use idem_host::config::{StoreConfig, StoreKind};
use serde_json::json;

use crate::common::*;

async fn bad_keys_are_dead_lettered_alone(kind: StoreKind) {
    let mut env = Env::new().await;
    env.config.namespace = unique_namespace("keys");
    match kind {
        StoreKind::Sqlite => {}
        StoreKind::Postgres => env.use_postgres(16),
        // As in examples/redis-postgres.toml: data in Postgres, fenced by
        // the tokens the Redis claims hand out.
        StoreKind::Redis => env.use_redis_claims_postgres_data(),
    }
    let pool = Pool::start(&env.config).await.unwrap();
    // record-payment takes its key from /payment_id: one with a NUL, one of
    // 10 KB, and ten good ones, published in one batch.
    let mut batch = vec![
        envelope(
            "m-nul",
            "record-payment",
            json!({ "payment_id": "pay\u{0}x", "customer": "c", "amount_cents": 1 }),
        ),
        envelope(
            "m-long",
            "record-payment",
            json!({ "payment_id": "p".repeat(10_000), "customer": "c", "amount_cents": 1 }),
        ),
    ];
    // A handler's error holding a NUL, which Postgres refuses in text.
    batch.push(envelope("m-nul-error", "poison", json!({ "mode": "permanent", "why": "a\u{0}b" })));
    for i in 0..10 {
        batch.push(envelope(
            &format!("m-{i}"),
            "record-payment",
            json!({ "payment_id": format!("pay-key-{i}"), "customer": "c", "amount_cents": 100 + i }),
        ));
    }
    pool.backends.broker.publish(&batch, Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(30), "10 done and 3 dead letters", || async {
        let c = pool.backends.admin.counts().await.unwrap();
        c.done == 10 && c.dead_letters == 3
    })
    .await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    let reason = |id: &str| {
        letters
            .iter()
            .find(|d| d.msg_id == id)
            .map(|d| d.reason.clone())
            .unwrap_or_default()
    };
    assert!(reason("m-nul").contains("control character U+0000"), "{letters:?}");
    assert!(reason("m-long").contains("10000 bytes long"), "{letters:?}");
    // Dead-lettered at once, its NUL escaped (before, Postgres refused the
    // dead letter, and the claim ran on until its lease ran out).
    let nul_error = letters
        .iter()
        .find(|d| d.msg_id == "m-nul-error")
        .expect("m-nul-error dead-lettered");
    assert_eq!(
        (nul_error.reason.as_str(), nul_error.attempts),
        ("permanent error: poison: this message is refused: a\\0b", 1)
    );
    let counters = pool.counters.snapshot();
    assert_eq!(counters.outage_decisions, 0, "{counters:?}");
    assert_eq!(env.mock.double_effects(), 0);
    pool.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_dead_lettered_alone_on_sqlite_claims() {
    bad_keys_are_dead_lettered_alone(StoreKind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_dead_lettered_alone_on_postgres_claims() {
    bad_keys_are_dead_lettered_alone(StoreKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_dead_lettered_alone_on_redis_claims() {
    bad_keys_are_dead_lettered_alone(StoreKind::Redis).await;
}

/// Behind the admission check, the store itself tells a refusal of the
/// data from an outage: Postgres refuses a NUL in a key as data (SQLSTATE
/// class 22), which is never counted as the store being down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refusing_a_key_is_not_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = idem_host::config::Config {
        namespace: unique_namespace("refuse"),
        claims: StoreConfig {
            kind: StoreKind::Postgres,
            url: Some(services::postgres()),
            ..StoreConfig::default()
        },
        ..idem_host::config::Config::default()
    };
    config.database.path = dir.path().join("idem.db");
    let backends = idem_host::backend::open(&config).await.unwrap();
    let request = |key: &'static str| idem_host::claim::ClaimRequest {
        plugin: "p",
        key,
        msg_id: "m",
        payload_hash: "h",
        headers: &[],
        payload: b"",
        owner: "w",
        lease_ms: 1_000,
        max_attempts: 3,
        plugin_version: "v",
    };
    let err = backends
        .claims
        .claim(&[request("ok"), request("bad\0key")], 1_000)
        .await
        .unwrap_err();
    assert!(matches!(err, idem_host::claim::ClaimError::Rejected(_)), "{err:?}");
    // The statement failed as a whole: the good key was not claimed either.
    let again = backends.claims.claim(&[request("ok")], 1_000).await.unwrap();
    assert!(
        matches!(again[0], idem_host::claim::ClaimOutcome::Acquired { fence: 1, .. }),
        "{again:?}"
    );
    // Refused after the batch's new keys were claimed (a repeat of a key is
    // decided after them, and its message id has a NUL): those claims are
    // withdrawn, so claiming the batch again acquires them as first attempts
    // rather than finding them busy until their lease expires.
    let refused_repeat = idem_host::claim::ClaimRequest {
        msg_id: "m\0",
        ..request("twice")
    };
    let err = backends
        .claims
        .claim(&[request("new"), request("twice"), refused_repeat], 2_000)
        .await
        .unwrap_err();
    assert!(matches!(err, idem_host::claim::ClaimError::Rejected(_)), "{err:?}");
    let again = backends.claims.claim(&[request("new"), request("twice")], 2_000).await.unwrap();
    let first = idem_host::claim::ClaimOutcome::Acquired {
        fence: 1,
        attempt: 1,
        traps: 0,
    };
    assert_eq!(again, vec![first.clone(), first], "the refused batch's new claims were withdrawn");
}
