//! G7: what a plugin cannot do, with real hostile components.

use std::time::{Duration, Instant};

use idem_host::app::{inspection_runtime, Pool};
use idem_host::capabilities::Grants;
use idem_host::config::Limits;
use idem_host::envelope::Envelope;
use serde_json::json;

use crate::common::*;

/// Run one hostile mode and return its dead letter's reason.
async fn attack(mode: &str) -> (String, idem_host::stats::Snapshot) {
    attack_in(Env::new().await, mode).await
}

/// [`attack`] in `env`, set up by the caller.
async fn attack_in(mut env: Env, mode: &str) -> (String, idem_host::stats::Snapshot) {
    env.config.retry.max_traps = 1;
    env.config.retry.max_attempts = 1;
    let pool = env.start().await;
    let reason = dead_letter_of(&pool, envelope(&format!("attack-{mode}"), "hostile", json!({ "mode": mode }))).await;
    let c = pool.counters.snapshot();
    pool.stop().await.unwrap();
    (reason, c)
}

/// Publish `message`, wait until the pool has nothing left to do, and
/// return the reason of the one dead letter it left.
async fn dead_letter_of(pool: &Pool, message: Envelope) -> String {
    let id = message.id.clone();
    pool.backends.broker.publish(&[message], Duration::ZERO).await.unwrap();
    drain(pool).await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{id}: {letters:?}");
    letters[0].reason.clone()
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
    let reason = dead_letter_of(&pool, envelope("attack-host-loop", "hostile", json!({ "mode": "host-call-loop" }))).await;
    assert!(reason.contains("limits.timeout_ms = 1000"), "{reason}");
    pool.stop().await.unwrap();
}

/// A component whose start function never returns: its core module's
/// `start` runs while the instance is made, before `handle` is called.
const SPIN_AT_START: &str = r#"
(component
  (core module $m
    (memory (export "memory") 1)
    (func $spin (loop $forever (br $forever)))
    (start $spin)
    (func (export "handle") (param i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32) unreachable)
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) unreachable))
  (core instance $i (instantiate $m))
  (type $message' (record
    (field "id" string)
    (field "key" string)
    (field "attempt" u32)
    (field "headers" (list (tuple string string)))
    (field "payload" (list u8))))
  (export $message "message" (type $message'))
  (type $error' (variant (case "transient" string) (case "permanent" string)))
  (export $error "handler-error" (type $error'))
  (func $handle (param "msg" $message) (result (result (option (list u8)) (error $error)))
    (canon lift (core func $i "handle") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (export "handle" (func $handle)))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_function_that_never_returns_is_stopped_by_the_timeout() {
    let mut env = Env::new().await;
    let path = env.dir.path().join("spin_at_start.wasm");
    std::fs::write(&path, wat::parse_str(SPIN_AT_START).expect("the fixture is valid text")).unwrap();
    let mut spin = plugin("hostile.wasm", &[], &[], None);
    spin.path = path;
    env.config.plugins.insert("spin-at-start".to_string(), spin);
    // The CPU budget far above the timeout: only the timeout can stop it
    // in time, and only if it covers making the instance.
    env.config.limits.cpu_ms = 60_000;
    env.config.limits.timeout_ms = 200;
    env.config.retry.max_traps = 1;
    env.config.retry.max_attempts = 1;
    let pool = env.start().await;
    let reason = dead_letter_of(&pool, envelope("spin-at-start-1", "spin-at-start", json!({}))).await;
    assert!(reason.contains("limits.timeout_ms = 200"), "{reason}");
    assert_eq!(pool.counters.snapshot().traps, 1);
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

/// G1's isolation between executions: every message gets a fresh
/// instance, and a pool slot reused by the next message is reset first
/// (written pages copied back from the image or decommitted), so nothing
/// one message wrote to memory is seen by the next, in the data segment
/// or beyond it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_message_sees_memory_an_earlier_one_wrote() {
    let mut env = Env::new().await;
    // One handler slot, and more messages than the pool's decommit batch
    // (32 freed slots are reset together before any is reused), so most
    // instances run in a slot an earlier one used.
    env.config.worker.concurrency = 1;
    let pool = env.start().await;
    let batch: Vec<_> = (0..100)
        .map(|i| envelope(&format!("residue-{i}"), "hostile", json!({ "mode": "residue" })))
        .collect();
    pool.backends.broker.publish(&batch, Duration::ZERO).await.unwrap();
    drain(&pool).await;
    for i in 0..100 {
        let key = format!("residue-{i}");
        assert_eq!(state(&pool, "hostile", &key).await, Some("done"), "{key}");
        let raw = pool.backends.data.get("hostile", &key).await.unwrap();
        assert_eq!(raw.as_deref(), Some(&b"\"clean\""[..]), "{key}");
    }
    assert_eq!(pool.counters.snapshot().dead_lettered, 0);
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

/// A key no data store can hold (Postgres refuses a NUL in text, and one
/// refused row would fail a whole group commit of every plugin's writes) is
/// refused before any store sees it, on reads as on writes, and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_key_holding_a_nul_is_refused_naming_it() {
    for mode in ["nul-key", "nul-key-get"] {
        let (reason, c) = attack(mode).await;
        assert!(reason.contains("store key") && reason.contains("U+0000"), "{mode}: {reason}");
        assert_eq!(c.traps, 1, "{mode}: failed as a trap, not retried as an outage");
    }
}

/// A handler that writes in a loop is held to its queued writes' pace (at
/// most `MAX_QUEUED_WRITES` or `MAX_QUEUED_BYTES` in the host at once), and
/// every write still lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_flood_is_paced_and_every_write_lands() {
    let env = Env::new().await;
    let pool = env.start().await;
    pool.backends
        .broker
        .publish(&[envelope("flood", "hostile", json!({ "mode": "write-flood" }))], Duration::ZERO)
        .await
        .unwrap();
    drain(&pool).await;
    assert_eq!(state(&pool, "hostile", "flood").await, Some("done"));
    // 16 values of 64 KiB fill the 1 MiB an execution may hold queued:
    // the 17th upsert waits for those 16, then every 16th after it (the
    // 17th, 33rd, ... 497th of 500).
    assert_eq!(pool.counters.snapshot().writes_paced, 31);
    let stored = pool.backends.data.scan("hostile").await.unwrap();
    assert_eq!(stored.len(), 500);
    assert!(stored.iter().all(|(_, v)| v.len() == 64 << 10));
    pool.stop().await.unwrap();
}

/// An HTTP server for `effects.call`: `/redirect` answers 307 to
/// `/elsewhere` (which counts what reaches it), `/endless` streams a body
/// that never ends.
async fn endpoint_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicU32>) {
    use axum::response::IntoResponse;
    use std::sync::atomic::{AtomicU32, Ordering};
    let reached = std::sync::Arc::new(AtomicU32::new(0));
    let seen = reached.clone();
    let app = axum::Router::new()
        .route(
            "/redirect",
            axum::routing::post(|| async { (axum::http::StatusCode::TEMPORARY_REDIRECT, [("location", "/elsewhere")]).into_response() }),
        )
        .route(
            "/elsewhere",
            axum::routing::post(move || {
                seen.fetch_add(1, Ordering::SeqCst);
                async { "{}" }
            }),
        )
        .route(
            "/endless",
            axum::routing::post(|| async {
                let chunk = axum::body::Bytes::from(vec![b' '; 64 << 10]);
                axum::body::Body::from_stream(futures::stream::repeat_with(move || {
                    Ok::<_, std::convert::Infallible>(chunk.clone())
                }))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), reached)
}

/// `env` with the hostile plugin granted endpoint `echo` at `url`.
async fn with_echo_at(url: String) -> Env {
    let mut env = Env::new().await;
    env.config
        .endpoints
        .insert("echo".into(), idem_host::config::EndpointConfig { url, timeout_ms: 60_000 });
    env.config.plugins.get_mut("hostile").unwrap().endpoints.push("echo".into());
    env
}

/// A redirect is not followed: the request (with its Idempotency-Key)
/// never reaches an address no one configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoints_redirect_is_not_followed() {
    let (base, reached) = endpoint_server().await;
    let (reason, _) = attack_in(with_echo_at(format!("{base}/redirect")).await, "call-echo").await;
    assert!(
        reason.contains("307") && reason.contains("redirects are not followed") && reason.contains("endpoints.echo.url"),
        "{reason}"
    );
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// A response is read only up to `limits.max_value_bytes`: an endless body
/// is refused as too large, not buffered until the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_response_is_cut_at_the_value_limit() {
    let (base, _) = endpoint_server().await;
    let (reason, _) = attack_in(with_echo_at(format!("{base}/endless")).await, "call-echo").await;
    assert!(reason.contains("answered more than limits.max_value_bytes"), "{reason}");
}

/// A step is printable text (it goes out as the `Idem-Step` header): a
/// control character in it is a permanent error, and nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_with_a_line_break_is_refused_and_nothing_is_sent() {
    let (base, reached) = endpoint_server().await;
    let (reason, _) = attack_in(with_echo_at(format!("{base}/elsewhere")).await, "call-bad-step").await;
    assert!(reason.contains("control character U+000A"), "{reason}");
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// An execution makes a bounded number of external calls: each answer is
/// journaled with the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_calls_per_execution_are_bounded() {
    let (base, reached) = endpoint_server().await;
    let (reason, _) = attack_in(with_echo_at(format!("{base}/elsewhere")).await, "call-loop").await;
    assert!(reason.contains("more than 256 external calls"), "{reason}");
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 256);
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

/// Publish one hostile message under `env`, wait for it to settle, and say
/// how long that took and what became of it.
async fn settle_one(env: &Env, id: &str, mode: &str) -> (Duration, Option<&'static str>, Vec<String>) {
    let pool = env.start().await;
    let started = Instant::now();
    pool.backends
        .broker
        .publish(&[envelope(id, "hostile", json!({ "mode": mode }))], Duration::ZERO)
        .await
        .unwrap();
    let took = wait_for(Duration::from_secs(60), "the hostile message to settle", || async {
        match state(&pool, "hostile", id).await {
            Some("done" | "dead") => Some(started.elapsed()),
            _ => None,
        }
    })
    .await;
    let settled = state(&pool, "hostile", id).await;
    let reasons = pool
        .backends
        .admin
        .dead_letter_summaries(10)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.reason)
        .collect();
    pool.stop().await.unwrap();
    (took, settled, reasons)
}

/// G7: guest time is measured, not sampled, so a guest that calls the host
/// every millisecond is charged for the work between the calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_is_charged_however_often_the_guest_calls_the_host() {
    let mut env = Env::new().await;
    env.config.limits.cpu_ms = 300;
    env.config.limits.timeout_ms = 20_000;
    env.config.retry.max_traps = 1;
    env.config.retry.max_attempts = 1;
    let (took, settled, reasons) = settle_one(&env, "attack-spin-call", "spin-and-call").await;
    assert_eq!(settled, Some("dead"));
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0].contains("CPU deadline"),
        "stopped by the CPU budget, not the timeout: {}",
        reasons[0]
    );
    assert!(took < Duration::from_secs(2), "a 300 ms budget took {took:?} to run out");
}

/// G7: a guest cannot sleep on the clock and hold its slot: timers are due
/// at once, so a one-minute sleep returns immediately.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_guest_does_not_hold_its_slot() {
    let mut env = Env::new().await;
    env.config.limits.timeout_ms = 20_000;
    env.config.retry.max_attempts = 1;
    let (took, settled, reasons) = settle_one(&env, "attack-sleep", "sleep").await;
    assert_eq!(settled, Some("done"), "{reasons:?}");
    assert!(took < Duration::from_secs(5), "a sleeping guest held its slot for {took:?}");
}

/// G7: what a handler sees of the world: clocks stopped at zero, random
/// numbers seeded from the message key (the same on every attempt, different
/// per key), no environment, no arguments, no files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_shows_stopped_clocks_keyed_randomness_and_nothing_else() {
    let mut env = Env::new().await;
    env.config.retry.max_attempts = 3;
    let pool = env.start().await;
    let batch: Vec<_> = ["probe-a", "probe-b"]
        .iter()
        .map(|id| envelope(id, "hostile", json!({ "mode": "probe" })))
        .collect();
    pool.backends.broker.publish(&batch, Duration::ZERO).await.unwrap();
    wait_until(Duration::from_secs(30), "both probes to be done", || async {
        state(&pool, "hostile", "probe-a").await == Some("done") && state(&pool, "hostile", "probe-b").await == Some("done")
    })
    .await;
    let mut seen = std::collections::HashMap::new();
    for key in ["probe-a#1", "probe-a#2", "probe-b#1", "probe-b#2"] {
        let raw = pool.backends.data.get("hostile", key).await.unwrap();
        let value: serde_json::Value = serde_json::from_slice(&raw.unwrap_or_else(|| panic!("{key} not recorded"))).unwrap();
        assert_eq!(value["wall_ns"], "0", "{key}: wall clock stopped at the epoch");
        assert_eq!(value["monotonic_ns"], "0", "{key}: monotonic clock stopped");
        assert_eq!(value["env"], json!([]), "{key}: empty environment");
        assert_eq!(value["args"], json!([]), "{key}: no arguments");
        assert_eq!(value["files"], json!([]), "{key}: no preopened directories, no files");
        seen.insert(key, value);
    }
    for field in ["secure_random", "seeded_hash"] {
        assert_eq!(
            seen["probe-a#1"][field], seen["probe-a#2"][field],
            "{field}: same key, same values on a retry"
        );
        assert_eq!(
            seen["probe-b#1"][field], seen["probe-b#2"][field],
            "{field}: same key, same values on a retry"
        );
        assert_ne!(
            seen["probe-a#1"][field], seen["probe-b#1"][field],
            "{field}: another key, other values"
        );
    }
    pool.stop().await.unwrap();
}
