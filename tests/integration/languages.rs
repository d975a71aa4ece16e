//! Handlers in other languages, through the same pipeline: the Python
//! record-payment (guest-sdk/python/examples, built by `cargo xtask
//! plugins` with componentize-py) on the embedded backend.

use std::time::Duration;

use serde_json::json;

use crate::common::*;

/// A Python component holds dozens of core instances and several memories;
/// the instance pool is sized from the component and an execution waits for
/// room instead of failing. At concurrency 16, 2,000 payments (100 of them
/// published twice) all end done, none dead-lettered for a host-side limit,
/// each charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_handler_runs_at_concurrency_16_without_host_failures() {
    let mut env = Env::new().await;
    env.config.plugins.get_mut("record-payment").unwrap().path = plugin_dir().join("record_payment_py.wasm");
    env.config.worker.concurrency = 16;
    env.config.worker.lease_ms = 30_000;
    env.config.worker.visibility_ms = 30_000;
    env.config.worker.heartbeat_ms = Some(2_000);
    let pool = env.start().await;
    let pay = |i: usize| {
        let id = format!("py-{i}");
        envelope(
            &id,
            "record-payment",
            json!({ "payment_id": id, "customer": "c", "amount_cents": i }),
        )
    };
    let mut batch: Vec<_> = (0..2_000).map(pay).collect();
    batch.extend((0..100).map(pay));
    for chunk in batch.chunks(500) {
        pool.backends.broker.publish(chunk, Duration::ZERO).await.unwrap();
    }
    wait_until(Duration::from_secs(600), "2,000 payments to settle", || async {
        let c = pool.backends.admin.counts().await.unwrap();
        c.done + c.dead >= 2_000 && pool.backends.broker.pending().await.unwrap() == 0 && pool.worker.in_flight() == 0
    })
    .await;
    let counts = pool.backends.admin.counts().await.unwrap();
    let c = pool.counters.snapshot();
    assert_eq!((counts.done, counts.dead_letters), (2_000, 0), "{counts:?} {c:?}");
    assert_eq!(c.traps, 0, "{c:?}");
    assert_eq!(env.mock.double_effects(), 0);
    assert_eq!(env.mock.performed("payments", "py-7"), 1);
    assert_eq!(pool.backends.data.scan("receipts").await.unwrap().len(), 2_000);
    let stored: serde_json::Value = serde_json::from_slice(&pool.backends.data.get("payments", "py-7").await.unwrap().unwrap()).unwrap();
    assert_eq!(stored, json!({ "payment_id": "py-7", "customer": "c", "amount_cents": 7 }));
    pool.stop().await.unwrap();
}
