//! What the console and `idem stats` read from a claim store, on SQLite,
//! Postgres and Redis: one claim in full, the running and retrying claims,
//! a message's journal, and the namespace's activity per minute.

use idem_host::backend::Backends;
use idem_host::claim::{ClaimRef, ClaimRequest, ClaimState};
use idem_host::config::StoreKind;
use idem_host::envelope::payload_hash;

use crate::conformance::{request, sqlite, Served};

async fn inspection_conformance(b: &Backends) {
    let (claims, admin) = (&b.claims, &b.admin);
    let payload = b"{}";
    let hash = payload_hash(payload);
    let now = idem_host::now_ms();
    let claim = |key: &str, fence: i64| ClaimRef {
        plugin: "p".into(),
        key: key.into(),
        fence,
    };
    assert_eq!(admin.claim("p", "nothing").await.unwrap(), None);

    // Running (two, started 300 ms apart), waiting for a retry, done with
    // two journaled steps.
    claims.claim(&[request("run-late", &hash, payload, 5)], now - 100).await.unwrap();
    // A store starts a claim's times when it holds its lock: up to the
    // call's own duration after the time it was given.
    let asked = std::time::Instant::now();
    claims.claim(&[request("run-early", &hash, payload, 5)], now - 400).await.unwrap();
    let waited = asked.elapsed().as_millis() as i64;
    let other = ClaimRequest {
        plugin: "q",
        ..request("run-q", &hash, payload, 5)
    };
    claims.claim(&[other], now - 50).await.unwrap();
    claims.claim(&[request("retry", &hash, payload, 5)], now - 1_000).await.unwrap();
    assert!(claims
        .release(&claim("retry", 1), now + 5_000, "api said 503", false, now - 900)
        .await
        .unwrap());
    claims.claim(&[request("done", &hash, payload, 5)], now - 2_000).await.unwrap();
    for (i, step) in ["reserve", "charge"].iter().enumerate() {
        let response = format!("{{\"ok\":{i}}}");
        assert!(claims
            .journal_put(
                &claim("done", 1),
                step,
                &format!("hash-{step}"),
                response.as_bytes(),
                "v1",
                now - 1_990 + i as i64
            )
            .await
            .unwrap());
    }
    assert_eq!(claims.confirm(&[claim("done", 1)], now - 1_900).await.unwrap(), vec![true]);

    let running = admin.claim("p", "run-early").await.unwrap().expect("a claim");
    assert_eq!(
        (
            running.state,
            running.fence,
            running.attempts,
            running.owner.as_deref(),
            running.msg_id.as_str()
        ),
        (ClaimState::Running, 1, 1, Some("w1"), "run-early")
    );
    // Times as the store recorded them (a store may move a time by a
    // millisecond or two to keep its clock monotonic).
    assert_eq!(running.lease_until - running.updated_at, 1_000);
    assert_eq!(running.created_at, running.updated_at);
    assert!(
        (-2..=waited + 2).contains(&(running.updated_at - (now - 400))),
        "recorded at {}, given {} and waited {waited} ms: {running:?}",
        running.updated_at,
        now - 400
    );
    assert_eq!(running.plugin_version.as_deref(), Some("v1"));
    let retry = admin.claim("p", "retry").await.unwrap().expect("a claim");
    assert_eq!((retry.state, retry.owner.as_deref()), (ClaimState::Retry, None));
    assert!((retry.not_before - (now + 5_000)).abs() <= 5, "{retry:?}");
    assert_eq!(retry.last_error.as_deref(), Some("api said 503"));
    assert_eq!(admin.claim("p", "done").await.unwrap().unwrap().state, ClaimState::Done);

    // Running: longest-running first; filtered by plugin.
    let keys = |v: Vec<idem_host::claim::ClaimInfo>| v.into_iter().map(|c| c.key).collect::<Vec<_>>();
    assert_eq!(
        keys(admin.claims_in(ClaimState::Running, None, 10).await.unwrap()),
        ["run-early", "run-late", "run-q"]
    );
    assert_eq!(
        keys(admin.claims_in(ClaimState::Running, Some("p"), 10).await.unwrap()),
        ["run-early", "run-late"]
    );
    assert_eq!(keys(admin.claims_in(ClaimState::Running, Some("q"), 10).await.unwrap()), ["run-q"]);
    assert_eq!(
        keys(admin.claims_in(ClaimState::Running, Some("p"), 1).await.unwrap()),
        ["run-early"]
    );
    assert!(admin.claims_in(ClaimState::Running, Some("other"), 10).await.unwrap().is_empty());
    assert_eq!(keys(admin.claims_in(ClaimState::Retry, None, 10).await.unwrap()), ["retry"]);

    let journal = admin.journal("p", "done").await.unwrap();
    let mut steps: Vec<(String, String, Vec<u8>)> = journal.into_iter().map(|s| (s.step, s.request_hash, s.response)).collect();
    steps.sort();
    assert_eq!(
        steps,
        [
            ("charge".to_string(), "hash-charge".to_string(), b"{\"ok\":1}".to_vec()),
            ("reserve".to_string(), "hash-reserve".to_string(), b"{\"ok\":0}".to_vec()),
        ]
    );
    assert!(admin.journal("p", "retry").await.unwrap().is_empty());

    // Activity: two workers add to the same minute; the last hour sums them;
    // an older minute is outside it.
    let minute = now.div_euclid(60_000) * 60_000;
    let day = 24 * 3600 * 1000;
    // Two days old: dropped when the next minute is added (SQL) or expired
    // at once (Redis).
    admin
        .activity_add(minute - 2 * day, &[("done", 9)], minute - 2 * day)
        .await
        .unwrap();
    admin
        .activity_add(minute - 90 * 60_000, &[("done", 7)], minute - day)
        .await
        .unwrap();
    admin
        .activity_add(minute, &[("done", 3), ("duplicates", 2), ("busy", 0)], minute - day)
        .await
        .unwrap();
    admin
        .activity_add(minute, &[("done", 1), ("dead_lettered", 1)], minute - day)
        .await
        .unwrap();
    let hour = idem_host::activity::last_hour(admin.as_ref(), now).await.unwrap();
    assert_eq!(hour.minutes.len(), 60);
    assert_eq!(hour.minutes.last().unwrap().minute, minute);
    let t = hour.total;
    assert_eq!((t.done, t.duplicates, t.busy, t.retries, t.dead_lettered), (4, 2, 0, 0, 1));
    assert_eq!(hour.minutes.last().unwrap().done, 4);
    let kept = admin.activity(minute - 3 * day).await.unwrap();
    assert_eq!(
        kept,
        [
            (minute - 90 * 60_000, "done".to_string(), 7),
            (minute, "dead_lettered".to_string(), 1),
            (minute, "done".to_string(), 4),
            (minute, "duplicates".to_string(), 2),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_inspection_conforms() {
    let (_dir, b) = sqlite().await;
    inspection_conformance(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_inspection_conforms() {
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    inspection_conformance(&s.backends).await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_inspection_conforms() {
    let s = Served::open(StoreKind::Redis, StoreKind::Postgres).await;
    inspection_conformance(&s.backends).await;
    s.cleanup().await;
}
