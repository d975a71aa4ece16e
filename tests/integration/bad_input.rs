//! Bad input ends in the dead-letter store with a reason; nothing crashes,
//! nothing is lost.

use std::sync::Arc;
use std::time::Duration;

use idem_host::app::Pool;
use idem_host::bindings::idem::handler::types::{HandlerError, Message};
use idem_host::envelope::Envelope;
use idem_host::hooks::Hooks;
use idem_host::runtime::native::{NativeCtx, NativeHandler};
use idem_host::worker::WorkerOptions;
use serde_json::json;

use crate::common::*;

async fn dead_letter_reason(env: &Env, e: Envelope) -> String {
    let pool = env.start().await;
    pool.backends
        .broker
        .publish(std::slice::from_ref(&e), Duration::ZERO)
        .await
        .unwrap();
    drain(&pool).await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    pool.stop().await.unwrap();
    let d = letters
        .iter()
        .find(|d| d.msg_id == e.id)
        .unwrap_or_else(|| panic!("{} dead-lettered: {letters:?}", e.id));
    assert_eq!(d.payload, e.payload, "the payload is kept byte for byte");
    d.reason.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_payload_is_dead_lettered() {
    let env = Env::new().await;
    let e = Envelope {
        id: "bad-json".into(),
        handler: "grant-credits".into(),
        headers: vec![],
        payload: b"{not json".to_vec(),
    };
    let reason = dead_letter_reason(&env, e).await;
    assert!(reason.contains("not valid JSON"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_payload_is_dead_lettered() {
    let env = Env::new().await;
    let e = Envelope {
        id: "bad-utf8".into(),
        handler: "grant-credits".into(),
        headers: vec![],
        payload: vec![0xff, 0xfe, 0x00, 0x80],
    };
    let pool = env.start().await;
    pool.backends.broker.publish(&[e], Duration::ZERO).await.unwrap();
    drain(&pool).await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert!(letters[0].reason.contains("not valid JSON"), "{}", letters[0].reason);
    pool.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_handler_is_dead_lettered_naming_the_loaded_ones() {
    let env = Env::new().await;
    let reason = dead_letter_reason(&env, envelope("who", "no-such-plugin", json!({}))).await;
    assert!(reason.contains("unknown handler \"no-such-plugin\""), "{reason}");
    assert!(reason.contains("record-payment"), "lists the loaded plugins: {reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_payload_is_dead_lettered() {
    let mut env = Env::new().await;
    env.config.limits.max_payload_bytes = 1024;
    let big = "x".repeat(4096);
    let reason = dead_letter_reason(
        &env,
        envelope("big", "grant-credits", json!({ "user": "u", "balance": 1, "pad": big })),
    )
    .await;
    assert!(reason.contains("exceeds limits.max_payload_bytes = 1024"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_natural_key_is_dead_lettered() {
    let env = Env::new().await;
    let reason = dead_letter_reason(&env, envelope("nokey", "record-payment", json!({ "customer": "c" }))).await;
    assert!(reason.contains("/payment_id"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_reused_with_a_different_payload_is_a_conflict() {
    let env = Env::new().await;
    let pool = env.start().await;
    let first = envelope(
        "m1",
        "record-payment",
        json!({ "payment_id": "pay-x", "customer": "c", "amount_cents": 1 }),
    );
    pool.backends.broker.publish(&[first], Duration::ZERO).await.unwrap();
    drain(&pool).await;
    let second = envelope(
        "m2",
        "record-payment",
        json!({ "payment_id": "pay-x", "customer": "c", "amount_cents": 999 }),
    );
    pool.backends.broker.publish(&[second], Duration::ZERO).await.unwrap();
    drain(&pool).await;
    let c = pool.counters.snapshot();
    assert_eq!(c.conflicts, 1, "{c:?}");
    assert_eq!(c.executions, 1, "{c:?}");
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert!(letters[0].reason.starts_with("conflict:"), "{}", letters[0].reason);
    assert!(String::from_utf8_lossy(&letters[0].payload).contains("999"));
    assert_eq!(env.mock.performed("payments", "pay-x"), 1);
    assert_eq!(state(&pool, "record-payment", "pay-x").await, Some("done"));
    pool.stop().await.unwrap();
}

/// Entries written to the Redis stream by something other than Idem, with
/// fields missing: dead-lettered with a reason, the pool goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_envelopes_from_the_broker_are_dead_lettered() {
    let mut env = Env::new().await;
    env.config.namespace = unique_namespace("badenv");
    env.config.broker.kind = idem_host::config::BrokerKind::Redis;
    env.config.broker.url = Some(services::redis());
    let pool = env.start().await;
    let client = redis::Client::open(services::redis()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("{}:queue", env.config.namespace);
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("garbage")
        .arg("\u{0}\u{1}")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("id")
        .arg("no-handler")
        .arg("payload")
        .arg("{}")
        .query_async(&mut conn)
        .await
        .unwrap();
    pool.backends
        .broker
        .publish(
            &[envelope("fine", "grant-credits", json!({ "user": "u", "balance": 1 }))],
            Duration::ZERO,
        )
        .await
        .unwrap();
    drain(&pool).await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert!(letters.iter().all(|d| d.reason.starts_with("malformed envelope")), "{letters:?}");
    assert_eq!(pool.backends.data.scan("credits").await.unwrap().len(), 1);
    pool.stop().await.unwrap();
    crate::pool::cleanup(&env.config).await;
}

/// A native handler that panics on the message with id `.0`: a host bug
/// on the message path, inside the handler's run.
struct PanicsOn(&'static str);

#[async_trait::async_trait]
impl NativeHandler for PanicsOn {
    async fn handle(&self, _ctx: &mut NativeCtx, msg: &Message) -> Result<(), HandlerError> {
        if msg.id == self.0 {
            panic!("the test's handler panics on {}: {}", msg.id, "x".repeat(10_000));
        }
        Ok(())
    }
}

/// A panic in the host while a handler runs is a host error: retried
/// without counting a trap, dead-lettered once its attempts are spent with
/// the panic's text (cut to 4 KiB), counted apart; the message beside it
/// is done. Before, the panic unwound the task: the delivery and its claim
/// stayed held until their timeouts, and the message came back until its
/// attempts ran out, dead-lettered with no word of why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_host_while_a_handler_runs_is_retried_as_a_host_error() {
    let env = Env::new().await;
    let config = &env.config;
    let natives: Vec<(String, Arc<dyn NativeHandler>)> = vec![("grant-credits".into(), Arc::new(PanicsOn("panics")))];
    let pool = Pool::start_native(config, WorkerOptions::from_config(config), Hooks::default(), natives)
        .await
        .unwrap();
    let messages = [
        envelope("panics", "grant-credits", json!({ "user": "u1", "balance": 1 })),
        envelope("fine", "grant-credits", json!({ "user": "u2", "balance": 2 })),
    ];
    pool.backends.broker.publish(&messages, Duration::ZERO).await.unwrap();
    drain(&pool).await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].msg_id, "panics");
    assert!(
        letters[0]
            .reason
            .contains("the host panicked while running the handler: the test's handler panics on panics: xxx"),
        "{}",
        letters[0].reason
    );
    assert!(
        letters[0].reason.len() < 4096 + 200,
        "cut to 4 KiB: {} bytes",
        letters[0].reason.len()
    );
    let c = pool.counters.snapshot();
    assert_eq!((c.host_panics, c.traps), (u64::from(config.retry.max_attempts), 0));
    assert_eq!(pool.backends.admin.counts().await.unwrap().done, 1);
    pool.stop().await.unwrap();
}
