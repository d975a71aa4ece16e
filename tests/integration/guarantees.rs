//! G1, G3, G4, G5, G6 end to end: real plugins, real SQLite, real HTTP.

use std::time::Duration;

use serde_json::json;

use crate::common::*;

fn payment(id: &str) -> idem_host::envelope::Envelope {
    envelope(
        &format!("msg-{id}"),
        "record-payment",
        json!({ "payment_id": id, "customer": "c1", "amount_cents": 1250 }),
    )
}

async fn receipts(pool: &idem_host::app::Pool) -> Vec<(String, Vec<u8>)> {
    pool.backends.data.scan("receipts").await.unwrap()
}

/// G1: five sequential deliveries of one message → one row, one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_sequential_duplicates_have_one_effect() {
    let env = Env::new().await;
    let pool = env.start().await;
    for _ in 0..5 {
        pool.backends.broker.publish(&[payment("pay-seq")], Duration::ZERO).await.unwrap();
        drain(&pool).await;
    }
    let c = pool.counters.snapshot();
    assert_eq!(c.executions, 1, "{c:?}");
    assert_eq!(c.duplicates, 4, "{c:?}");
    assert_eq!(pool.backends.data.scan("payments").await.unwrap().len(), 1);
    assert_eq!(receipts(&pool).await.len(), 1);
    assert_eq!(env.step_requests("payments-api", "record-payment", "pay-seq", "charge"), 1);
    assert_eq!(env.mock.performed("payments", "pay-seq"), 1);
    assert_eq!(env.mock.calls_after_journal(), 0);
    assert_eq!(state(&pool, "record-payment", "pay-seq").await, Some("done"));
    pool.stop().await.unwrap();
}

/// G1 + G3: five deliveries at once while the first is still running →
/// one execution; the others wait (busy) and are then suppressed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_concurrent_duplicates_run_once() {
    let env = Env::new().await;
    env.mock.state.lock().unwrap().held.insert("payments/pay-conc".into());
    let pool = env.start().await;
    let copies: Vec<_> = (0..5).map(|_| payment("pay-conc")).collect();
    pool.backends.broker.publish(&copies, Duration::ZERO).await.unwrap();
    // The first execution is now blocked inside its charge call.
    crate::common::wait_for_held(&env.mock, "the held charge to arrive").await;
    wait_until(Duration::from_secs(10), "the other copies to find the key busy", || async {
        pool.counters.snapshot().busy >= 4
    })
    .await;
    assert_eq!(pool.counters.snapshot().executions, 1);
    env.mock.release();
    drain(&pool).await;
    let c = pool.counters.snapshot();
    assert_eq!(c.executions, 1, "{c:?}");
    assert_eq!(c.duplicates, 4, "{c:?}");
    assert_eq!(c.done, 1, "{c:?}");
    assert_eq!(env.step_requests("payments-api", "record-payment", "pay-conc", "charge"), 1);
    assert_eq!(env.mock.performed("payments", "pay-conc"), 1);
    assert_eq!(env.mock.calls_after_journal(), 0);
    assert_eq!(pool.backends.data.scan("payments").await.unwrap().len(), 1);
    pool.stop().await.unwrap();
}

/// G4: a worker whose lease was taken over can neither journal, write nor
/// confirm; the new owner completes the message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g4_fenced_out_worker_cannot_write_or_confirm() {
    let mut env = Env::new().await;
    env.config.worker.lease_ms = 300;
    env.config.worker.visibility_ms = 300;
    env.mock.state.lock().unwrap().held.insert("payments/pay-fence".into());
    // Worker A has no heartbeat: its lease lapses while its handler is
    // paused. Its deliveries stay invisible for 2 s, so on a slow machine
    // A cannot be handed its own message again before its charge arrives.
    let a = env
        .start_with(|o| {
            o.heartbeat = None;
            o.visibility = Duration::from_secs(2);
        })
        .await;
    a.backends.broker.publish(&[payment("pay-fence")], Duration::ZERO).await.unwrap();
    crate::common::wait_for_held(&env.mock, "the held charge to arrive").await;
    a.shutdown.cancel(); // A fetches nothing more; its paused execution goes on.

    // Worker B takes the claim over once A's lease has expired.
    let b = env.start().await;
    // B counts a message done after its confirm commits: wait for both.
    wait_until(Duration::from_secs(30), "worker B to complete the message", || async {
        state(&b, "record-payment", "pay-fence").await == Some("done") && b.counters.snapshot().done >= 1
    })
    .await;
    assert_eq!(b.counters.snapshot().done, 1);

    // Now A's paused call returns: its journal write must be refused and
    // its execution stopped without confirming or acking.
    env.mock.release();
    let a_counters = a.counters.clone();
    a.join().await.unwrap();
    let ca = a_counters.snapshot();
    assert_eq!(ca.executions, 1, "{ca:?}");
    assert_eq!(ca.done, 0, "A must not confirm: {ca:?}");
    assert!(ca.fence_rejections >= 1, "A's journal write was refused: {ca:?}");
    drain(&b).await;
    b.stop().await.unwrap();

    // Exactly one charge was performed; both attempts carried the same key.
    assert_eq!(env.mock.performed("payments", "pay-fence"), 1);
    assert_eq!(env.step_requests("payments-api", "record-payment", "pay-fence", "charge"), 2);
    let pool = env.start().await;
    let rows = pool.backends.data.scan("receipts").await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(state(&pool, "record-payment", "pay-fence").await, Some("done"));
    pool.stop().await.unwrap();
}

/// G5: a handler that runs longer than its lease completes once, its lease
/// and visibility extended by the heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_long_handler_keeps_its_lease() {
    let mut env = Env::new().await;
    // Four leases long, extended every tenth of one: a scheduling stall of
    // most of a lease on a loaded machine is not a lost lease.
    env.config.worker.lease_ms = 1_000;
    env.config.worker.heartbeat_ms = Some(100);
    env.config.worker.visibility_ms = 1_000;
    env.mock.state.lock().unwrap().slow_for = Duration::from_millis(4_000);
    env.mock.state.lock().unwrap().slow.insert("pay-long".into());
    let pool = env.start().await;
    pool.backends.broker.publish(&[payment("pay-long")], Duration::ZERO).await.unwrap();
    drain(&pool).await;
    let c = pool.counters.snapshot();
    assert_eq!(c.executions, 1, "{c:?}");
    assert_eq!(c.done, 1, "{c:?}");
    assert_eq!(c.busy, 0, "no redelivery while the lease was extended: {c:?}");
    assert!(c.lease_extensions >= 5, "the heartbeat extended the lease: {c:?}");
    assert_eq!(env.step_requests("payments-api", "record-payment", "pay-long", "charge"), 1);
    pool.stop().await.unwrap();
}

/// G6: transient failures retry with growing delays, then succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_transient_errors_retry_with_growing_delays() {
    let mut env = Env::new().await;
    env.config.retry.base_delay_ms = 100;
    env.mock.state.lock().unwrap().flaky.insert("pay-flaky".into(), 3);
    let pool = env.start().await;
    pool.backends.broker.publish(&[payment("pay-flaky")], Duration::ZERO).await.unwrap();
    drain(&pool).await;
    let c = pool.counters.snapshot();
    assert_eq!(c.retries, 3, "{c:?}");
    assert_eq!(c.done, 1, "{c:?}");
    assert_eq!(state(&pool, "record-payment", "pay-flaky").await, Some("done"));
    let arrivals = env.mock.state.lock().unwrap().arrivals["pay-flaky"].clone();
    assert_eq!(arrivals.len(), 4);
    let gaps: Vec<Duration> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    // base 100 ms, no jitter: at least 100, 200, 400 ms apart. These
    // floors are the growth: delays that did not double would miss the
    // second or the third. (Comparing the gaps with each other would
    // compare scheduling stalls too: a stall of 100 ms in the first gap
    // would make it no shorter than the second.)
    for (gap, min) in gaps.iter().zip([100u64, 200, 400]) {
        assert!(*gap >= Duration::from_millis(min), "gaps {gaps:?}");
    }
    assert_eq!(env.mock.performed("payments", "pay-flaky"), 1);
    pool.stop().await.unwrap();
}

/// G6: a message that keeps failing is dead-lettered after the configured
/// attempts, with its payload and last error; others keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_poison_is_dead_lettered_and_the_pool_keeps_going() {
    let mut env = Env::new().await;
    env.config.retry.max_attempts = 3;
    let pool = env.start().await;
    let mut batch = vec![envelope("poison-t", "poison", json!({ "mode": "transient" }))];
    batch.extend((0..20).map(|i| envelope(&format!("g-{i}"), "grant-credits", json!({ "user": format!("u{i}"), "balance": i }))));
    pool.backends.broker.publish(&batch, Duration::ZERO).await.unwrap();
    drain(&pool).await;
    assert_eq!(pool.backends.data.scan("credits").await.unwrap().len(), 20);
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    let d = &letters[0];
    assert_eq!((d.plugin.as_str(), d.key.as_str(), d.attempts), ("poison", "poison-t", 3));
    assert!(d.reason.contains("attempts exhausted (3 of 3)"), "{}", d.reason);
    assert!(d.reason.contains("never succeeds"), "{}", d.reason);
    assert_eq!(d.payload, br#"{"mode":"transient"}"#);
    assert_eq!(state(&pool, "poison", "poison-t").await, Some("dead"));
    pool.stop().await.unwrap();
}

/// G6: a trap counts as an attempt; a permanent error dead-letters at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_traps_count_as_attempts_and_permanent_errors_stop_at_once() {
    let mut env = Env::new().await;
    env.config.retry.max_attempts = 3;
    env.config.retry.max_traps = 10;
    let pool = env.start().await;
    pool.backends
        .broker
        .publish(
            &[
                envelope("poison-trap", "poison", json!({ "mode": "trap" })),
                envelope("poison-perm", "poison", json!({ "mode": "permanent" })),
            ],
            Duration::ZERO,
        )
        .await
        .unwrap();
    drain(&pool).await;
    let letters = pool.backends.admin.dead_letters(10).await.unwrap();
    let trap = letters.iter().find(|d| d.key == "poison-trap").expect("trap dead-lettered");
    assert_eq!(trap.attempts, 3, "{trap:?}");
    assert!(trap.reason.contains("panicked"), "{}", trap.reason);
    let perm = letters.iter().find(|d| d.key == "poison-perm").expect("permanent dead-lettered");
    assert_eq!(perm.attempts, 1, "{perm:?}");
    assert!(
        perm.reason.starts_with("permanent error: poison: this message is refused"),
        "{}",
        perm.reason
    );
    let c = pool.counters.snapshot();
    assert_eq!(c.traps, 3, "{c:?}");
    assert_eq!(c.executions, 4, "{c:?}");
    pool.stop().await.unwrap();
}

/// Multi-step handlers resume: each retry replays the steps already
/// journaled and goes on with the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_step_retry_resumes_instead_of_restarting() {
    let env = Env::new().await;
    // Each API fails its first request for this order: charge, reserve and
    // email each cost one retry.
    env.mock.state.lock().unwrap().flaky.insert("ord-resume".into(), 1);
    let pool = env.start().await;
    let order = envelope(
        "msg-ord-resume",
        "fulfil-order",
        json!({ "order_id": "ord-resume", "customer": "c", "email": "c@example.com", "sku": "s", "quantity": 1, "amount_cents": 10 }),
    );
    pool.backends.broker.publish(&[order], Duration::ZERO).await.unwrap();
    drain(&pool).await;
    let c = pool.counters.snapshot();
    assert_eq!(c.retries, 3, "{c:?}");
    assert_eq!(
        c.journal_replays, 3,
        "attempt 3 replays the charge, attempt 4 the charge and the reservation: {c:?}"
    );
    for (api, step) in [("payments", "charge"), ("inventory", "reserve"), ("email", "send-email")] {
        assert_eq!(env.mock.performed(api, "ord-resume"), 1, "{api}");
        let endpoint = format!("{api}-api");
        assert_eq!(
            env.step_requests(&endpoint, "fulfil-order", "ord-resume", step),
            2,
            "{step}: one failure, one success"
        );
    }
    assert_eq!(env.mock.calls_after_journal(), 0, "journaled steps were replayed, not re-sent");
    assert_eq!(state(&pool, "fulfil-order", "ord-resume").await, Some("done"));
    pool.stop().await.unwrap();
}

/// Start a pool on `env` with fault-injecting hooks.
async fn start_hooked(env: &Env, hooks: idem_host::hooks::Hooks) -> idem_host::app::Pool {
    let options = idem_host::worker::WorkerOptions::from_config(&env.config);
    let pool = idem_host::app::Pool::start_with(&env.config, options, hooks)
        .await
        .expect("pool starts");
    env.mock.watch_journal(pool.backends.claims.clone());
    pool
}

/// G5: a claim is heartbeated from the moment it is taken. Here the worker
/// that claims a message spends one and a half leases nacking the busy
/// duplicates of its batch (a slow broker) before the handler starts;
/// a second worker keeps asking for the same key. The claim must still be
/// live: one execution, at fence 1, never taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_a_claim_is_heartbeated_from_the_moment_it_is_taken() {
    let env = Env::new().await;
    let lease = Duration::from_millis(env.config.worker.lease_ms);
    let hooks = idem_host::hooks::Hooks {
        delay_nack: Some(lease / 2),
        ..Default::default()
    };
    let first = start_hooked(&env, hooks.clone()).await;
    // One batch: the message and three duplicates, busy behind its claim.
    let batch: Vec<_> = (0..4).map(|_| payment("pay-slow-nack")).collect();
    first.backends.broker.publish(&batch, Duration::ZERO).await.unwrap();
    let second = start_hooked(&env, hooks).await;
    wait_until(
        Duration::from_secs(60),
        "the message to be done and every duplicate acked",
        || async {
            state(&first, "record-payment", "pay-slow-nack").await == Some("done")
                && first.backends.broker.pending().await.unwrap() == 0
                && first.worker.in_flight() == 0
                && second.worker.in_flight() == 0
        },
    )
    .await;
    let (a, b) = (first.counters.snapshot(), second.counters.snapshot());
    assert_eq!(a.executions + b.executions, 1, "one execution: {a:?} {b:?}");
    assert_eq!(a.fence_rejections + b.fence_rejections, 0, "never taken over: {a:?} {b:?}");
    assert_eq!(receipts(&first).await.len(), 1);
    assert_eq!(env.step_requests("payments-api", "record-payment", "pay-slow-nack", "charge"), 1);
    second.stop().await.unwrap();
    first.stop().await.unwrap();
}

/// A finished execution waiting for its batched confirm keeps its lease. On
/// the last attempt, a duplicate that arrives after the lease would have
/// ended finds the claim busy, not abandoned: the message ends done, never
/// dead-lettered as "stopped before settling".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_execution_awaiting_its_confirm_is_never_dead_lettered() {
    let mut env = Env::new().await;
    env.config.retry.max_attempts = 1;
    let lease = Duration::from_millis(env.config.worker.lease_ms);
    let hooks = idem_host::hooks::Hooks {
        delay_confirm: Some(lease * 3),
        ..Default::default()
    };
    let pool = start_hooked(&env, hooks).await;
    pool.backends
        .broker
        .publish(&[payment("pay-slow-confirm")], Duration::ZERO)
        .await
        .unwrap();
    // The duplicate arrives when the lease, unextended, would be over.
    pool.backends
        .broker
        .publish(&[payment("pay-slow-confirm")], lease * 3 / 2)
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(60),
        "the message to settle and its duplicate to be acked",
        || async {
            state(&pool, "record-payment", "pay-slow-confirm")
                .await
                .is_some_and(|s| s != "running")
                && pool.counters.snapshot().duplicates >= 1
                // Counted once the confirm's commit has returned, just
                // after the state shows it.
                && pool.counters.snapshot().done >= 1
        },
    )
    .await;
    assert_eq!(state(&pool, "record-payment", "pay-slow-confirm").await, Some("done"));
    assert_eq!(pool.backends.admin.dead_letters(10).await.unwrap().len(), 0);
    let c = pool.counters.snapshot();
    assert_eq!((c.done, c.dead_lettered, c.fence_rejections), (1, 0, 0), "{c:?}");
    pool.stop().await.unwrap();
}

/// Shutdown after the grace period: the handler still running is stopped
/// and its claim released for a retry, but an execution that finished and
/// waits for its batched confirm (held here by a slow confirm) is
/// confirmed, not released and run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_confirms_what_finished_and_releases_what_still_runs() {
    let mut env = Env::new().await;
    env.config.worker.shutdown_grace_ms = 300;
    env.mock.state.lock().unwrap().held.insert("inventory/ord-stop".into());
    let hooks = idem_host::hooks::Hooks {
        delay_confirm: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let pool = start_hooked(&env, hooks).await;
    let order = envelope(
        "msg-ord-stop",
        "fulfil-order",
        json!({ "order_id": "ord-stop", "customer": "c", "email": "c@example.com", "sku": "s", "quantity": 1, "amount_cents": 900 }),
    );
    let grant = envelope("g-stop", "grant-credits", json!({ "user": "u-stop", "balance": 3 }));
    pool.backends.broker.publish(&[order, grant], Duration::ZERO).await.unwrap();
    wait_for_held(&env.mock, "the order's handler reached the held step").await;
    let data = pool.backends.data.clone();
    wait_until(Duration::from_secs(30), "the grant's upsert committed", || {
        let data = data.clone();
        async move { data.get("credits", "u-stop").await.unwrap().is_some() }
    })
    .await;
    let (backends, counters) = (pool.backends.clone(), pool.counters.clone());
    pool.stop().await.unwrap();
    let state = |plugin: &'static str, key: &'static str| {
        let admin = backends.admin.clone();
        async move { admin.state(plugin, key).await.unwrap().map(|s| s.as_str()) }
    };
    assert_eq!(state("grant-credits", "g-stop").await, Some("done"), "confirmed, not released");
    assert_eq!(state("fulfil-order", "ord-stop").await, Some("retry"), "released for a retry");
    let c = counters.snapshot();
    assert_eq!((c.done, c.fence_rejections), (1, 0), "{c:?}");
    env.mock.release();
}

/// Shutdown after the grace period while finished executions wait for room
/// in the confirm queue (a slow confirm holds one, the queue another): the
/// one that found no room is released for a retry, as a running one is,
/// and the two queued are confirmed. None is left running until its lease
/// ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_what_waits_for_room_in_the_confirm_queue() {
    let mut env = Env::new().await;
    env.config.worker.shutdown_grace_ms = 300;
    let hooks = idem_host::hooks::Hooks {
        delay_confirm: Some(Duration::from_secs(3)),
        confirm_queue: Some(1),
        ..Default::default()
    };
    let pool = start_hooked(&env, hooks).await;
    let users = ["u-room-1", "u-room-2", "u-room-3"];
    let grants: Vec<_> = users
        .iter()
        .map(|u| envelope(&format!("g-{u}"), "grant-credits", json!({ "user": u, "balance": 3 })))
        .collect();
    pool.backends.broker.publish(&grants, Duration::ZERO).await.unwrap();
    let data = pool.backends.data.clone();
    wait_until(Duration::from_secs(30), "the three upserts committed", || {
        let data = data.clone();
        async move {
            for u in users {
                if data.get("credits", u).await.unwrap().is_none() {
                    return false;
                }
            }
            true
        }
    })
    .await;
    let (backends, counters) = (pool.backends.clone(), pool.counters.clone());
    pool.stop().await.unwrap();
    let mut states = Vec::new();
    for u in users {
        let state = backends.admin.state("grant-credits", &format!("g-{u}")).await.unwrap();
        states.push(state.map(|s| s.as_str()));
    }
    states.sort();
    assert_eq!(
        states,
        [Some("done"), Some("done"), Some("retry")],
        "two confirmed, the third released"
    );
    let c = counters.snapshot();
    assert_eq!((c.done, c.fence_rejections), (2, 0), "{c:?}");
}

/// A message whose handler has returned gives its place in hand back while
/// its writes commit, for a place among those settling. With one slot and
/// one place, the data table locked so the first upsert cannot commit: the
/// second message is fetched and run meanwhile, the third is not (the one
/// place settling is taken, so the second keeps its place), nothing is
/// confirmed before its write, and once the lock goes all three are done.
/// (Before, a message kept its place until its writes had committed, and
/// the second waited for the first's commit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_for_its_commit_does_not_keep_the_next_one_out() {
    let mut env = Env::on_postgres("settling", 4).await;
    env.config.worker.concurrency = 1;
    env.config.worker.prefetch = 1;
    let pool = start_hooked(&env, Default::default()).await;
    let ns = env.config.namespace.clone();
    let pg = idem_host::backend::open_postgres(&services::postgres(), &ns, 1, "data")
        .await
        .unwrap();
    let mut holder = pg.begin().await.unwrap();
    sqlx::query("LOCK TABLE kv IN EXCLUSIVE MODE").execute(&mut *holder).await.unwrap();
    let users = ["u-settle-1", "u-settle-2", "u-settle-3"];
    let grants: Vec<_> = users
        .iter()
        .map(|u| envelope(&format!("g-{u}"), "grant-credits", json!({ "user": u, "balance": 3 })))
        .collect();
    pool.backends.broker.publish(&grants, Duration::ZERO).await.unwrap();
    let counters = pool.counters.clone();
    wait_until(
        Duration::from_secs(30),
        "a second handler to run while the first upsert waits for the lock",
        || {
            let counters = counters.clone();
            async move { counters.snapshot().executions >= 2 }
        },
    )
    .await;
    // The third must not start while the one place settling is taken: no
    // event marks "not fetched", so watch for 30 fetch-loop idle pauses
    // (`worker.poll_idle_ms`), in which an unbounded pool fetches, claims
    // and runs it.
    let watch_until = std::time::Instant::now() + Duration::from_millis(env.config.worker.poll_idle_ms * 30);
    while std::time::Instant::now() < watch_until {
        let c = pool.counters.snapshot();
        assert_eq!((c.executions, c.done), (2, 0), "the third waits, nothing is confirmed: {c:?}");
        tokio::time::sleep(Duration::from_millis(env.config.worker.poll_idle_ms)).await;
    }
    for u in users {
        let state = pool.backends.admin.state("grant-credits", &format!("g-{u}")).await.unwrap();
        assert_ne!(state.map(|s| s.as_str()), Some("done"), "{u} confirmed before its write");
    }
    holder.rollback().await.unwrap();
    wait_until(Duration::from_secs(30), "the three messages done", || {
        let counters = counters.clone();
        async move { counters.snapshot().done >= 3 }
    })
    .await;
    for u in users {
        assert!(pool.backends.data.get("credits", u).await.unwrap().is_some(), "{u} written");
    }
    let c = pool.counters.snapshot();
    assert_eq!((c.executions, c.done, c.fence_rejections), (3, 3, 0), "{c:?}");
    pool.stop().await.unwrap();
}

/// G3 and G5 with clocks that disagree. Worker B's wall clock runs two
/// leases ahead of A's; A's handler is held inside its charge until B has
/// been told the key is busy and A's heartbeat has carried its lease past
/// its first end; B, its slot free, keeps receiving a duplicate. Lease
/// times come from the claim store's clock (Postgres here), so B finds the
/// key busy every time: one execution, never taken over. (Were B's wall
/// clock used, A's lease would look expired to B at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_clock_runs_ahead_cannot_take_over_a_live_lease() {
    let mut env = Env::on_postgres("clock", 4).await;
    env.config.worker.shutdown_grace_ms = 60_000;
    env.mock.state.lock().unwrap().held.insert("payments/pay-skew".into());
    let a = start_hooked(&env, Default::default()).await;
    a.backends.broker.publish(&[payment("pay-skew")], Duration::ZERO).await.unwrap();
    crate::common::wait_for_held(&env.mock, "A's charge to arrive").await;
    assert_eq!(state(&a, "record-payment", "pay-skew").await, Some("running"));
    // A fetches nothing more (its handler, heartbeat and confirm go on, for
    // up to the shutdown grace): the duplicates go to B.
    a.shutdown.cancel();
    let ahead = idem_host::hooks::Hooks {
        wall_clock_offset_ms: 2 * env.config.worker.lease_ms as i64,
        ..Default::default()
    };
    let b = start_hooked(&env, ahead).await;
    b.backends.broker.publish(&[payment("pay-skew")], Duration::ZERO).await.unwrap();
    // A's heartbeat extends every third of a lease: four extensions carry
    // the lease past the end it had when A claimed the key.
    wait_until(
        Duration::from_secs(60),
        "B to find the key busy while A's lease runs on its heartbeat",
        || async { b.counters.snapshot().busy >= 1 && a.counters.snapshot().lease_extensions >= 4 },
    )
    .await;
    env.mock.release();
    wait_until(
        Duration::from_secs(60),
        "the message to be done and its duplicate acked",
        || async {
            state(&b, "record-payment", "pay-skew").await == Some("done")
                && b.backends.broker.pending().await.unwrap() == 0
                && b.worker.in_flight() == 0
        },
    )
    .await;
    let (ca, cb) = (a.counters.snapshot(), b.counters.snapshot());
    assert_eq!((ca.executions, cb.executions), (1, 0), "only A ran it: {ca:?} {cb:?}");
    assert!(cb.busy >= 1, "B was told the key is busy: {cb:?}");
    assert_eq!(ca.fence_rejections + cb.fence_rejections, 0, "never taken over: {ca:?} {cb:?}");
    assert_eq!(env.step_requests("payments-api", "record-payment", "pay-skew", "charge"), 1);
    b.stop().await.unwrap();
    a.join().await.unwrap();
    let pool = sqlx::PgPool::connect(&services::postgres()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
        env.config.namespace
    )))
    .execute(&pool)
    .await
    .unwrap();
}
