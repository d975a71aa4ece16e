//! A real `idem run` process SIGKILLed in the middle of a multi-step
//! handler; a second process finishes the work without repeating the step
//! that was journaled.

use std::process::Command;
use std::time::Duration;

use idem_host::claim::ClaimState;
use serde_json::json;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_handler_resumes_without_repeating_the_charge() {
    let mut env = Env::new().await;
    env.config.worker.lease_ms = 1_000;
    env.config.worker.heartbeat_ms = Some(250);
    env.config.worker.visibility_ms = 1_000;
    // The reservation (step 2) of this order hangs: the worker is killed
    // while it waits, after the charge (step 1) was journaled.
    env.mock.state.lock().unwrap().held.insert("inventory/ord-crash".into());
    let config_path = env.dir.path().join("idem.toml");
    std::fs::write(&config_path, toml::to_string(&env.config).unwrap()).unwrap();

    let backends = idem_host::backend::open(&env.config).await.unwrap();
    env.mock.watch_journal(backends.claims.clone());
    let mut batch = vec![envelope(
        "msg-ord-crash",
        "fulfil-order",
        json!({ "order_id": "ord-crash", "customer": "c", "email": "c@example.com", "sku": "s", "quantity": 2, "amount_cents": 4200 }),
    )];
    batch.extend((0..10).map(|i| envelope(&format!("g-{i}"), "grant-credits", json!({ "user": format!("u{i}"), "balance": i }))));
    backends.broker.publish(&batch, Duration::ZERO).await.unwrap();

    let mut first = spawn_idem_run(&config_path, &env.dir.path().join("worker-1.log"));
    crate::common::wait_for_held(&env.mock, "the first worker reached the reservation step").await;
    assert!(
        backends
            .claims
            .journal_get("fulfil-order", "ord-crash", "charge")
            .await
            .unwrap()
            .is_some(),
        "the charge was journaled"
    );
    assert_eq!(
        backends
            .admin
            .state("fulfil-order", "ord-crash")
            .await
            .unwrap()
            .map(ClaimState::as_str),
        Some("running")
    );

    first.kill().expect("SIGKILL"); // Child::kill sends SIGKILL on Unix.
    let status = first.wait().unwrap();
    assert!(!status.success(), "killed: {status:?}");
    env.mock.release();

    let mut second = spawn_idem_run(&config_path, &env.dir.path().join("worker-2.log"));
    wait_until(Duration::from_secs(30), "the second worker to finish everything", || async {
        backends
            .admin
            .state("fulfil-order", "ord-crash")
            .await
            .unwrap()
            .map(ClaimState::as_str)
            == Some("done")
            && backends.broker.pending().await.unwrap() == 0
    })
    .await;

    // The charge was sent once and replayed from the journal after the crash.
    assert_eq!(env.step_requests("payments-api", "fulfil-order", "ord-crash", "charge"), 1);
    for api in ["payments", "inventory", "email"] {
        assert_eq!(env.mock.performed(api, "ord-crash"), 1, "{api}");
    }
    assert_eq!(env.mock.calls_after_journal(), 0);
    let orders = backends.data.scan("orders").await.unwrap();
    assert_eq!(orders.len(), 1);
    assert!(String::from_utf8_lossy(&orders[0].1).contains("fulfilled"));
    // Nothing lost: every grant is done too.
    assert_eq!(backends.data.scan("credits").await.unwrap().len(), 10);
    let counts = backends.admin.counts().await.unwrap();
    assert_eq!((counts.done, counts.dead, counts.running, counts.retry), (11, 0, 0, 0));

    // SIGTERM: a graceful stop, exit 0.
    let term = Command::new("kill").args(["-TERM", &second.id().to_string()]).status().unwrap();
    assert!(term.success());
    let status = tokio::task::spawn_blocking(move || second.wait().unwrap()).await.unwrap();
    assert!(status.success(), "graceful exit after SIGTERM: {status:?}");
}
