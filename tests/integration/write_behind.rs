//! Write-behind through the whole pipeline, with real components and a
//! real Postgres: an upsert returns to the handler once queued, and what
//! the guarantees need still holds.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use crate::common::*;

/// add-credits reads the balance and writes it back plus one. One slot,
/// so each message runs after the last one's handler returned, while that
/// one's upsert may still be queued: its `get` waits for the queued write
/// and no increment is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_message_reads_what_the_last_one_queued() {
    let mut env = Env::on_postgres("wb_seq", 8).await;
    env.config.worker.concurrency = 1;
    env.config
        .plugins
        .insert("add-credits".into(), plugin("add_credits.wasm", &["accounts"], &[], None));
    let pool = env.start().await;
    let n = 200;
    let batch: Vec<_> = (0..n)
        .map(|i| envelope(&format!("m-{i}"), "add-credits", json!({ "user": "u", "amount": 1 })))
        .collect();
    pool.backends.broker.publish(&batch, Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(60), "every add-credits message done", || {
        let done = pool.counters.done.load(Ordering::Relaxed);
        async move { done >= n }
    })
    .await;
    let account: serde_json::Value =
        serde_json::from_slice(&pool.backends.data.get("accounts", "u").await.unwrap().expect("the account exists")).unwrap();
    assert_eq!(account["balance"], json!(n), "every increment read the one before it");
    pool.stop().await.unwrap();
}

/// The data store has seen a higher fence for the message's claim than the
/// claim store hands out (Redis lost its claims): the handler's upsert is
/// queued, the handler returns ok, and the refusal arrives after. The
/// execution is fenced out: nothing is written, confirmed or acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_write_refused_after_the_handler_returned_confirms_nothing() {
    let mut env = Env::new().await;
    let ns = unique_namespace("wb_refused");
    env.config.namespace = ns.clone();
    env.use_redis_claims_postgres_data();
    let pool = env.start().await;
    let pg = sqlx::PgPool::connect(&services::postgres()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{ns}\".fences (plugin, key, fence) VALUES ('grant-credits', 'm-1', 5)"
    )))
    .execute(&pg)
    .await
    .unwrap();
    let m = envelope("m-1", "grant-credits", json!({ "user": "u1", "balance": 7 }));
    pool.backends.broker.publish(&[m], Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(30), "the queued write refused", || {
        let refused = pool.counters.fence_rejections.load(Ordering::Relaxed);
        async move { refused >= 1 }
    })
    .await;
    assert_eq!(pool.counters.done.load(Ordering::Relaxed), 0, "nothing confirmed");
    assert_eq!(pool.backends.data.get("credits", "u1").await.unwrap(), None, "nothing written");
    assert_ne!(
        state(&pool, "grant-credits", "m-1").await,
        Some("done"),
        "the claim is not confirmed"
    );
    pool.stop().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA \"{ns}\" CASCADE")))
        .execute(&pg)
        .await
        .unwrap();
}
