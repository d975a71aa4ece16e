//! G7: what a plugin cannot do, with real hostile components.

use std::time::{Duration, Instant};

use idem_host::app::inspection_runtime;
use idem_host::capabilities::Grants;
use idem_host::config::Limits;
use serde_json::json;

use crate::common::*;

/// Run one hostile mode and return its dead letter's reason.
async fn attack(mode: &str) -> (String, idem_host::stats::Snapshot) {
    let mut env = Env::new().await;
    env.config.retry.max_traps = 1;
    env.config.retry.max_attempts = 1;
    let pool = env.start().await;
    pool.backends
        .broker
        .publish(
            &[envelope(&format!("attack-{mode}"), "hostile", json!({ "mode": mode }))],
            Duration::ZERO,
        )
        .await
        .unwrap();
    drain(&pool).await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{mode}: {letters:?}");
    let c = pool.counters.snapshot();
    pool.stop().await.unwrap();
    (letters[0].reason.clone(), c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disallowed_import_is_refused_at_load_naming_it() {
    let runtime = inspection_runtime().unwrap();
    let bytes = std::fs::read(plugin_dir().join("sneaky_net.wasm")).unwrap();
    let err = runtime
        .compile("sneaky-net", bytes, Grants::default(), Limits::default(), None)
        .await
        .expect_err("a component importing wasi:sockets must be refused");
    let msg = format!("{err:#}");
    assert!(msg.contains("plugin sneaky-net refused"), "{msg}");
    assert!(msg.contains("wasi:sockets/"), "names the import: {msg}");
    assert!(msg.contains("effects"), "says what to use instead: {msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_plugins_load() {
    let runtime = inspection_runtime().unwrap();
    for file in [
        "record_payment.wasm",
        "grant_credits.wasm",
        "fulfil_order.wasm",
        "poison.wasm",
        "hostile.wasm",
    ] {
        let bytes = std::fs::read(plugin_dir().join(file)).unwrap();
        let p = runtime
            .compile(file, bytes, Grants::default(), Limits::default(), None)
            .await
            .unwrap();
        assert!(
            p.imports.iter().all(|i| idem_host::runtime::import_allowed(i)),
            "{file}: {:?}",
            p.imports
        );
        assert!(p.imports.iter().any(|i| i.starts_with("idem:handler/")), "{file}: {:?}", p.imports);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loop_is_interrupted_by_the_cpu_deadline() {
    let started = Instant::now();
    let (reason, c) = attack("loop").await;
    assert!(reason.contains("CPU deadline"), "{reason}");
    assert!(reason.contains("300 ms"), "{reason}");
    assert_eq!(c.traps, 1);
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_host_calls_are_stopped_by_the_timeout() {
    let mut env = Env::new().await;
    env.config.limits.timeout_ms = 1_000;
    env.config.retry.max_traps = 1;
    env.config.retry.max_attempts = 1;
    let pool = env.start().await;
    pool.backends
        .broker
        .publish(
            &[envelope("attack-host-loop", "hostile", json!({ "mode": "host-call-loop" }))],
            Duration::ZERO,
        )
        .await
        .unwrap();
    drain(&pool).await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert!(letters[0].reason.contains("limits.timeout_ms = 1000"), "{}", letters[0].reason);
    pool.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bomb_hits_the_memory_limit() {
    let (reason, c) = attack("memory").await;
    assert!(reason.contains("memory limit"), "{reason}");
    assert!(reason.contains(&(16u64 << 20).to_string()), "{reason}");
    assert_eq!(c.traps, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_recursion_overflows_the_stack() {
    let (reason, c) = attack("recursion").await;
    assert!(reason.contains("stack overflow"), "{reason}");
    assert_eq!(c.traps, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ungranted_collection_gets_access_denied() {
    let (reason, c) = attack("ungranted-collection").await;
    assert!(reason.contains("may not use collection \"secrets\""), "{reason}");
    assert_eq!(c.traps, 0, "access-denied is an error the guest sees, not a trap");
    assert_eq!(c.permanent_errors, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ungranted_endpoint_gets_access_denied() {
    let (reason, _) = attack("ungranted-endpoint").await;
    assert!(reason.contains("may not call endpoint \"exfiltrate\""), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_flood_is_bounded() {
    // Output past the 64 KiB buffer is refused; Rust's println! then panics.
    let (reason, c) = attack("huge-stdout").await;
    assert!(reason.contains("failed printing to stdout"), "{reason}");
    assert_eq!(c.traps, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_flood_is_truncated_and_the_message_completes() {
    let env = Env::new().await;
    let pool = env.start().await;
    pool.backends
        .broker
        .publish(&[envelope("attack-log", "hostile", json!({ "mode": "huge-log" }))], Duration::ZERO)
        .await
        .unwrap();
    drain(&pool).await;
    assert_eq!(state(&pool, "hostile", "attack-log").await, Some("done"));
    pool.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_message_does_not_stop_the_pool() {
    let env = Env::new().await;
    let pool = env.start().await;
    let mut batch = vec![envelope("attack-loop", "hostile", json!({ "mode": "loop" }))];
    batch.extend((0..30).map(|i| envelope(&format!("ok-{i}"), "hostile", json!({ "mode": "ok" }))));
    pool.backends.broker.publish(&batch, Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(20), "the 30 good messages to be done", || async {
        pool.backends.data.scan("hostile").await.unwrap().len() == 30
    })
    .await;
    drain(&pool).await;
    assert_eq!(state(&pool, "hostile", "attack-loop").await, Some("dead"));
    pool.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_error_text_is_truncated() {
    let (reason, c) = attack("huge-result").await;
    assert!(reason.len() < 5_000, "{} bytes", reason.len());
    assert!(reason.ends_with("[truncated]"), "{}", &reason[reason.len() - 40..]);
    assert_eq!(c.permanent_errors, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_value_is_refused_as_too_large() {
    let (reason, _) = attack("huge-value").await;
    assert!(reason.contains("exceeds limits.max_value_bytes"), "{reason}");
}

/// Collection names and keys are data, never SQL, on every store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_looking_collection_names_are_stored_literally() {
    let mut env = Env::new().await;
    let evil = "x'); DROP TABLE kv; --";
    env.config.plugins.get_mut("hostile").unwrap().collections.push(evil.into());
    let pool = env.start().await;
    pool.backends
        .broker
        .publish(
            &[
                envelope("inj", "hostile", json!({ "mode": "injection" })),
                envelope("ok-after", "hostile", json!({ "mode": "ok" })),
            ],
            Duration::ZERO,
        )
        .await
        .unwrap();
    drain(&pool).await;
    assert_eq!(
        pool.backends.data.scan(evil).await.unwrap(),
        vec![(evil.to_string(), b"\"stored literally\"".to_vec())]
    );
    assert_eq!(
        pool.backends.data.scan("hostile").await.unwrap().len(),
        1,
        "the kv table still works"
    );
    pool.stop().await.unwrap();
}
