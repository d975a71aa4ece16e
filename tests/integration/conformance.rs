//! The conformance suite every backend must pass: claim store and data
//! store, each written once against the traits (the broker's is in
//! `broker_conformance`). Time is injected
//! (`now`) so lease expiry is tested without waiting.

use idem_host::backend::Backends;
use idem_host::claim::{delivery_identity, ClaimOutcome, ClaimRef, ClaimRequest, ClaimState, DeadLetterRequest};
use idem_host::config::{Config, StoreConfig, StoreKind};
use idem_host::envelope::payload_hash;
use idem_host::store::{DataError, Inserted};

pub async fn sqlite() -> (tempfile::TempDir, Backends) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.database.path = dir.path().join("conformance.db");
    let backends = idem_host::backend::open(&config).await.unwrap();
    (dir, backends)
}

pub fn request<'a>(key: &'a str, hash: &'a str, payload: &'a [u8], max_attempts: u32) -> ClaimRequest<'a> {
    ClaimRequest {
        plugin: "p",
        key,
        msg_id: key,
        payload_hash: hash,
        headers: &[],
        payload,
        owner: "w1",
        lease_ms: 1_000,
        max_attempts,
        plugin_version: "v1",
    }
}

pub async fn claim_store_conformance(b: &Backends) {
    let claims = &b.claims;
    let admin = &b.admin;
    let payload = b"{\"n\":1}";
    let hash = payload_hash(payload);
    let t0 = 1_000_000;

    // The store's clock (the one leases are measured with) is close to
    // this machine's; SQLite shares the machine's.
    if let Some(store_ms) = admin.clock_ms().await.unwrap() {
        let skew = (store_ms - idem_host::now_ms()).abs();
        assert!(skew < 5_000, "the claim store's clock is {skew} ms from this machine's");
    }
    assert!((b.clock.now_ms() - idem_host::now_ms()).abs() < 5_000);

    // A new key is acquired with fence 1, attempt 1.
    let out = claims.claim(&[request("k1", &hash, payload, 3)], t0).await.unwrap();
    assert_eq!(
        out,
        vec![ClaimOutcome::Acquired {
            fence: 1,
            attempt: 1,
            traps: 0
        }]
    );
    let f1 = ClaimRef {
        plugin: "p".into(),
        key: "k1".into(),
        fence: 1,
    };

    // While the lease is live, a second delivery is busy.
    let out = claims.claim(&[request("k1", &hash, payload, 3)], t0 + 10).await.unwrap();
    assert!(
        matches!(out[0], ClaimOutcome::Busy { retry_after_ms } if retry_after_ms > 0 && retry_after_ms <= 1_000),
        "{out:?}"
    );

    // The same key with another payload is a conflict, dead-lettered.
    let other = b"{\"n\":2}";
    let out = claims
        .claim(&[request("k1", &payload_hash(other), other, 3)], t0 + 20)
        .await
        .unwrap();
    assert_eq!(out, vec![ClaimOutcome::Conflict]);

    // The heartbeat extends the lease (to t0 + 1500); an extension that
    // would end it sooner (a worker with a shorter lease setting, or a
    // clock behind) never shortens it.
    assert_eq!(claims.extend(std::slice::from_ref(&f1), 1_000, t0 + 500).await.unwrap(), vec![true]);
    assert_eq!(claims.extend(std::slice::from_ref(&f1), 100, t0 + 600).await.unwrap(), vec![true]);
    let out = claims.claim(&[request("k1", &hash, payload, 3)], t0 + 1_200).await.unwrap();
    assert!(matches!(out[0], ClaimOutcome::Busy { .. }), "extended lease still live: {out:?}");

    // After the lease expires the claim is taken over: fence 2, attempt 2.
    let out = claims.claim(&[request("k1", &hash, payload, 3)], t0 + 1_600).await.unwrap();
    assert_eq!(
        out,
        vec![ClaimOutcome::Acquired {
            fence: 2,
            attempt: 2,
            traps: 0
        }]
    );
    let f2 = ClaimRef { fence: 2, ..f1.clone() };

    // The old fence can no longer extend, journal, write, confirm, release or dead-letter.
    assert_eq!(
        claims.extend(std::slice::from_ref(&f1), 1_000, t0 + 1_700).await.unwrap(),
        vec![false]
    );
    assert!(!claims.journal_put(&f1, "charge", "h", b"old", "v1", t0 + 1_700).await.unwrap());
    assert!(matches!(
        b.data.upsert(Some(&f1), "c", "x", b"old").await,
        Err(DataError::FenceLost { fence: 1, .. })
    ));
    assert!(matches!(
        b.data.insert_unique(Some(&f1), "c", "y", b"old").await,
        Err(DataError::FenceLost { .. })
    ));
    assert!(matches!(b.data.delete(Some(&f1), "c", "x").await, Err(DataError::FenceLost { .. })));
    assert_eq!(claims.confirm(std::slice::from_ref(&f1), t0 + 1_700).await.unwrap(), vec![false]);
    assert!(!claims.release(&f1, t0, "x", false, t0 + 1_700).await.unwrap());
    let dl = DeadLetterRequest {
        plugin: "p",
        key: "k1",
        msg_id: "k1",
        headers: &[],
        payload,
        reason: "x",
        fence: Some(1),
        plugin_version: None,
        delivery: None,
    };
    assert_eq!(claims.dead_letter(&[dl], t0 + 1_700).await.unwrap(), vec![false]);
    assert_eq!(b.data.get("c", "x").await.unwrap(), None, "the refused write left nothing");

    // The current fence journals once; the first response is kept.
    assert_eq!(claims.journal_get("p", "k1", "charge").await.unwrap(), None);
    assert!(claims.journal_put(&f2, "charge", "h", b"resp-1", "v1", t0 + 1_700).await.unwrap());
    assert!(claims.journal_put(&f2, "charge", "h", b"resp-2", "v1", t0 + 1_701).await.unwrap());
    assert_eq!(
        claims
            .journal_get("p", "k1", "charge")
            .await
            .unwrap()
            .map(|e| e.response)
            .as_deref(),
        Some(&b"resp-1"[..])
    );
    b.data.upsert(Some(&f2), "c", "x", b"new").await.unwrap();

    // Confirmed: later deliveries are duplicates.
    assert_eq!(claims.confirm(std::slice::from_ref(&f2), t0 + 1_800).await.unwrap(), vec![true]);
    let out = claims.claim(&[request("k1", &hash, payload, 3)], t0 + 1_900).await.unwrap();
    assert_eq!(out, vec![ClaimOutcome::Done]);
    assert_eq!(admin.state("p", "k1").await.unwrap().map(ClaimState::as_str), Some("done"));

    // Release for a retry: busy until not_before, then acquired again.
    let out = claims.claim(&[request("k2", &hash, payload, 2)], t0).await.unwrap();
    assert_eq!(
        out,
        vec![ClaimOutcome::Acquired {
            fence: 1,
            attempt: 1,
            traps: 0
        }]
    );
    let k2 = ClaimRef {
        plugin: "p".into(),
        key: "k2".into(),
        fence: 1,
    };
    assert!(claims.release(&k2, t0 + 500, "boom", true, t0 + 10).await.unwrap());
    // Due at t0 + 500, asked at t0 + 100: busy for 400 ms, less the time the
    // store waited for its lock (a lease starts when the lock is held).
    let asked = std::time::Instant::now();
    let out = claims.claim(&[request("k2", &hash, payload, 2)], t0 + 100).await.unwrap();
    let waited = asked.elapsed().as_millis() as i64;
    assert!(
        matches!(out[0], ClaimOutcome::Busy { retry_after_ms } if (400 - waited - 1..=400).contains(&retry_after_ms)),
        "waited {waited} ms: {out:?}"
    );
    let out = claims.claim(&[request("k2", &hash, payload, 2)], t0 + 600).await.unwrap();
    assert_eq!(
        out,
        vec![ClaimOutcome::Acquired {
            fence: 2,
            attempt: 2,
            traps: 1
        }]
    );

    // Attempts are counted at claim time: when the worker holding the last
    // attempt dies, the next claim dead-letters the message with its payload.
    let out = claims.claim(&[request("k2", &hash, payload, 2)], t0 + 5_000).await.unwrap();
    assert_eq!(out, vec![ClaimOutcome::Exhausted { attempts: 2, fence: 3 }]);
    assert_eq!(admin.state("p", "k2").await.unwrap().map(ClaimState::as_str), Some("dead"));
    // The claim is retired: the execution that held it (a zombie) can
    // no longer write, on any store.
    let zombie = ClaimRef { fence: 2, ..k2.clone() };
    assert!(matches!(
        b.data.upsert(Some(&zombie), "c", "k2", b"zombie").await,
        Err(DataError::FenceLost { fence: 2, .. })
    ));
    assert!(matches!(
        b.data.insert_unique(Some(&zombie), "c", "k2", b"zombie").await,
        Err(DataError::FenceLost { .. })
    ));
    assert!(matches!(
        b.data.delete(Some(&zombie), "c", "k2").await,
        Err(DataError::FenceLost { .. })
    ));
    assert!(!claims
        .journal_put(&zombie, "charge", "h", b"zombie", "v1", t0 + 5_000)
        .await
        .unwrap());
    let out = claims.claim(&[request("k2", &hash, payload, 2)], t0 + 5_001).await.unwrap();
    assert_eq!(out, vec![ClaimOutcome::DeadLettered]);

    // A batch answers per item, in order.
    let out = claims
        .claim(
            &[
                request("k3", &hash, payload, 2),
                request("k1", &hash, payload, 2),
                request("k3", &hash, payload, 2),
            ],
            t0 + 6_000,
        )
        .await
        .unwrap();
    assert_eq!(
        out[0],
        ClaimOutcome::Acquired {
            fence: 1,
            attempt: 1,
            traps: 0
        }
    );
    assert_eq!(out[1], ClaimOutcome::Done);
    assert!(matches!(out[2], ClaimOutcome::Busy { .. }));

    // Dead letter through the current fence.
    let dl = DeadLetterRequest {
        plugin: "p",
        key: "k3",
        msg_id: "k3",
        headers: &[],
        payload,
        reason: "permanent error: no",
        fence: Some(1),
        plugin_version: Some("v1"),
        delivery: None,
    };
    assert_eq!(claims.dead_letter(&[dl], t0 + 6_100).await.unwrap(), vec![true]);
    let k3 = ClaimRef {
        plugin: "p".into(),
        key: "k3".into(),
        fence: 1,
    };
    assert!(
        matches!(b.data.upsert(Some(&k3), "c", "k3", b"late").await, Err(DataError::FenceLost { .. })),
        "a dead-lettered claim accepts no more writes"
    );
    assert_eq!(b.data.get("c", "k3").await.unwrap(), None);

    let letters = admin.dead_letters(10).await.unwrap();
    let reasons: Vec<(&str, &str, u32)> = letters
        .iter()
        .map(|d| (d.key.as_str(), &d.reason[..9.min(d.reason.len())], d.attempts))
        .collect();
    assert_eq!(
        reasons,
        vec![("k3", "permanent", 1), ("k2", "attempts ", 2), ("k1", "conflict:", 0)]
    );
    assert!(letters.iter().all(|d| !d.payload.is_empty()));
    // In brief: the same records, newest first, without headers or payload.
    let brief = admin.dead_letter_summaries(10).await.unwrap();
    assert_eq!(brief, letters.iter().map(|d| d.summary.clone()).collect::<Vec<_>>());
    assert_eq!(brief[0].plugin_version.as_deref(), Some("v1"));
    assert_eq!(admin.dead_letter_summaries(2).await.unwrap(), brief[..2]);
    let counts = admin.counts().await.unwrap();
    assert_eq!((counts.done, counts.dead, counts.running, counts.dead_letters), (1, 2, 0, 3));
    assert_eq!(admin.dead_letter_count().await.unwrap(), 3, "what /metrics reads");

    // Replay support: only a dead claim taken for the same payload revives,
    // with no attempts counted; the dead-letter record can then be removed.
    assert!(!admin.revive("p", "k2", &payload_hash(b"another"), t0 + 7_000).await.unwrap());
    assert!(!admin.revive("p", "k1", &hash, t0 + 7_000).await.unwrap(), "k1 is done, not dead");
    assert!(admin.revive("p", "k2", &hash, t0 + 7_000).await.unwrap());
    assert_eq!(admin.state("p", "k2").await.unwrap().map(ClaimState::as_str), Some("retry"));
    let out = claims.claim(&[request("k2", &hash, payload, 2)], t0 + 7_001).await.unwrap();
    assert!(matches!(out[0], ClaimOutcome::Acquired { attempt: 1, fence: 4, .. }), "{out:?}");
    // The replay runs under the fence after the retired one, and may write.
    let replay = ClaimRef { fence: 4, ..k2.clone() };
    b.data.upsert(Some(&replay), "c", "k2", b"replayed").await.unwrap();
    assert_eq!(b.data.get("c", "k2").await.unwrap().as_deref(), Some(&b"replayed"[..]));
    let k2 = letters.iter().find(|d| d.key == "k2").unwrap();
    assert_eq!(admin.dead_letter_get(k2.id).await.unwrap().unwrap().key, "k2");
    assert_eq!(admin.dead_letter_remove(&[k2.id, k2.id]).await.unwrap(), 1);
    assert!(admin.dead_letter_get(k2.id).await.unwrap().is_none());
}

/// Dead letters no claim retires (bad input, a key reused with another
/// payload) are recorded once per delivered message: a redelivery after an
/// answer or ack that failed records nothing more; another message with
/// the same id, or one without an id, is recorded; and once a record is
/// removed (replayed, purged) its message is recorded again.
pub async fn unclaimed_dead_letter_conformance(b: &Backends) {
    let (claims, admin) = (&b.claims, &b.admin);
    let now = idem_host::now_ms();
    let bad = |msg_id: &'static str, payload: &'static [u8]| DeadLetterRequest {
        plugin: "no-such-handler",
        key: msg_id,
        msg_id,
        headers: &[],
        payload,
        reason: "unknown handler",
        fence: None,
        plugin_version: None,
        delivery: (!msg_id.is_empty()).then(|| delivery_identity("no-such-handler", msg_id, msg_id, payload)),
    };
    let recorded = |msg_id: &'static str| async move {
        let all = admin.dead_letters(1_000).await.unwrap();
        all.into_iter()
            .filter(|d| d.plugin == "no-such-handler" && d.msg_id == msg_id)
            .collect::<Vec<_>>()
    };

    assert_eq!(claims.dead_letter(&[bad("m1", b"{")], now).await.unwrap(), vec![true]);
    assert_eq!(
        claims.dead_letter(&[bad("m1", b"{")], now + 10).await.unwrap(),
        vec![true],
        "a redelivery is answered as recorded, so it is acked"
    );
    assert_eq!(claims.dead_letter(&[bad("m1", b"[")], now + 20).await.unwrap(), vec![true]);
    assert_eq!(
        claims.dead_letter(&[bad("m2", b"{"), bad("m2", b"{")], now + 30).await.unwrap(),
        vec![true, true]
    );
    assert_eq!(claims.dead_letter(&[bad("", b"")], now + 40).await.unwrap(), vec![true]);
    assert_eq!(claims.dead_letter(&[bad("", b"")], now + 50).await.unwrap(), vec![true]);
    let payloads = |letters: Vec<idem_host::claim::DeadLetter>| {
        let mut p: Vec<Vec<u8>> = letters.into_iter().map(|d| d.payload).collect();
        p.sort();
        p
    };
    assert_eq!(
        payloads(recorded("m1").await),
        vec![b"[".to_vec(), b"{".to_vec()],
        "one per message"
    );
    assert_eq!(recorded("m2").await.len(), 1, "one per message, within a batch too");
    assert_eq!(recorded("").await.len(), 2, "without an id, nothing tells two messages apart");

    let m2 = recorded("m2").await.remove(0);
    assert_eq!(admin.dead_letter_remove(&[m2.id]).await.unwrap(), 1);
    assert_eq!(claims.dead_letter(&[bad("m2", b"{")], now + 60).await.unwrap(), vec![true]);
    let again = recorded("m2").await;
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].id, m2.id, "recorded again once its record was removed");

    // A replay releases the record before it republishes: the message,
    // dead-lettered again before the record is removed, is recorded.
    admin.dead_letter_release(again[0].id).await.unwrap();
    assert_eq!(claims.dead_letter(&[bad("m2", b"{")], now + 70).await.unwrap(), vec![true]);
    assert_eq!(claims.dead_letter(&[bad("m2", b"{")], now + 80).await.unwrap(), vec![true]);
    let replayed = recorded("m2").await;
    assert_eq!(replayed.len(), 2, "the released record and one new: {replayed:?}");
    assert_eq!(admin.dead_letter_remove(&[again[0].id]).await.unwrap(), 1);
    assert_eq!(claims.dead_letter(&[bad("m2", b"{")], now + 90).await.unwrap(), vec![true]);
    assert_eq!(
        recorded("m2").await.len(),
        1,
        "removing the released record left the new one in charge"
    );

    // A key reused with another payload, delivered again: one conflict.
    let (first, reused) = (payload_hash(b"a"), payload_hash(b"b"));
    let out = claims.claim(&[request("reused", &first, b"a", 5)], now).await.unwrap();
    assert!(matches!(out[0], ClaimOutcome::Acquired { .. }), "{out:?}");
    for t in [1, 2] {
        let out = claims.claim(&[request("reused", &reused, b"b", 5)], now + t).await.unwrap();
        assert_eq!(out, vec![ClaimOutcome::Conflict]);
    }
    let conflicts = admin.dead_letters(1_000).await.unwrap();
    assert_eq!(conflicts.iter().filter(|d| d.key == "reused").count(), 1, "{conflicts:?}");
}

/// A failure's text with a NUL in it (a handler's own words, an endpoint's
/// error body, a broker's refusal) is kept by every claim store, escaped as
/// `\0`: Postgres refuses a NUL in text, and with it the release or dead
/// letter, which left the claim running until its lease ran out.
pub async fn failure_text_conformance(b: &Backends) {
    let (claims, admin) = (&b.claims, &b.admin);
    let now = idem_host::now_ms();
    let hash = payload_hash(b"n");
    let out = claims.claim(&[request("nul-text", &hash, b"n", 5)], now).await.unwrap();
    let ClaimOutcome::Acquired { fence, .. } = out[0] else {
        panic!("{out:?}")
    };
    let claim = ClaimRef {
        plugin: "p".into(),
        key: "nul-text".into(),
        fence,
    };
    assert!(claims.release(&claim, now, "endpoint said a\0b", false, now).await.unwrap());
    let info = admin.claim("p", "nul-text").await.unwrap().expect("the released claim");
    assert_eq!(info.state, ClaimState::Retry);
    assert_eq!(info.last_error.as_deref(), Some("endpoint said a\\0b"));

    let out = claims.claim(&[request("nul-text", &hash, b"n", 5)], now + 1).await.unwrap();
    let ClaimOutcome::Acquired { fence, .. } = out[0] else {
        panic!("{out:?}")
    };
    let letters = [
        DeadLetterRequest {
            plugin: "p",
            key: "nul-text",
            msg_id: "nul-text",
            headers: &[],
            payload: b"n",
            reason: "permanent error: c\0d",
            fence: Some(fence),
            plugin_version: Some("v1"),
            delivery: None,
        },
        DeadLetterRequest {
            plugin: "no-such-handler",
            key: "nul-refused",
            msg_id: "nul-refused",
            headers: &[],
            payload: b"{",
            reason: "refused: e\0f",
            fence: None,
            plugin_version: None,
            delivery: Some(delivery_identity("no-such-handler", "nul-refused", "nul-refused", b"{")),
        },
    ];
    assert_eq!(claims.dead_letter(&letters, now + 2).await.unwrap(), vec![true, true]);
    let mut reasons: Vec<String> = admin
        .dead_letters(1_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.key.starts_with("nul-"))
        .map(|d| d.reason.clone())
        .collect();
    reasons.sort();
    assert_eq!(reasons, vec!["permanent error: c\\0d", "refused: e\\0f"]);
    let info = admin.claim("p", "nul-text").await.unwrap().expect("the retired claim");
    assert_eq!(info.state, ClaimState::Dead);
}

/// Results stored with confirmed claims, which duplicates answer with: an
/// empty result stays apart from none, a stale confirm stores nothing, and
/// claims not done have none.
pub async fn results_conformance(b: &Backends) {
    let claims = &b.claims;
    let t0 = 1_800_000_000_000;
    let (payload, hash) = (&b"{}"[..], payload_hash(b"{}"));
    let keys = ["res-1", "res-2", "res-3", "res-4"];
    let requests: Vec<ClaimRequest> = keys.iter().map(|k| request(k, &hash, payload, 3)).collect();
    let refs: Vec<ClaimRef> = claims
        .claim(&requests, t0)
        .await
        .unwrap()
        .into_iter()
        .zip(keys)
        .map(|(o, key)| match o {
            ClaimOutcome::Acquired { fence, .. } => ClaimRef {
                plugin: "p".into(),
                key: key.into(),
                fence,
            },
            other => panic!("{key}: {other:?}"),
        })
        .collect();
    let all: Vec<(&str, &str)> = keys.iter().map(|k| ("p", *k)).chain([("p", "res-none")]).collect();
    assert_eq!(claims.results(&all).await.unwrap(), vec![None; 5], "running claims have no result");
    let stale = ClaimRef {
        fence: refs[2].fence + 1,
        ..refs[2].clone()
    };
    let confirmed = claims
        .confirm_with_results(
            &[refs[0].clone(), refs[1].clone(), stale.clone(), refs[3].clone()],
            &[Some(&b"{\"n\":1}"[..]), Some(&b""[..]), Some(&b"x"[..]), None],
            t0 + 10,
        )
        .await
        .unwrap();
    assert_eq!(confirmed, vec![true, true, false, true]);
    // The same confirms again, as after a commit whose answer was lost: the
    // claims done with these fences answer confirmed, and keep their results.
    let again = claims
        .confirm_with_results(
            &[refs[0].clone(), refs[1].clone(), stale.clone(), refs[3].clone()],
            &[Some(&b"other"[..]), None, Some(&b"x"[..]), Some(&b"other"[..])],
            t0 + 15,
        )
        .await
        .unwrap();
    assert_eq!(again, vec![true, true, false, true], "a repeated confirm is answered as the first");
    assert_eq!(
        claims.results(&all).await.unwrap(),
        vec![Some(b"{\"n\":1}".to_vec()), Some(Vec::new()), None, None, None]
    );
    let out = claims.claim(&requests[..1], t0 + 20).await.unwrap();
    assert_eq!(out, vec![ClaimOutcome::Done], "a confirmed claim is a duplicate");
}

/// One batch of every kind of request, answered in request order: new
/// keys, a key done, a key running, a repeat of a new key within the
/// batch, and a key first seen with another payload. The new keys stay
/// claimed after the batch.
pub async fn mixed_batch_conformance(b: &Backends) {
    let claims = &b.claims;
    let t0 = 1_900_000_000_000;
    let (payload, hash) = (&b"{\"n\":1}"[..], payload_hash(b"{\"n\":1}"));
    let (other, other_hash) = (&b"{\"n\":2}"[..], payload_hash(b"{\"n\":2}"));
    let before: Vec<ClaimRequest> = ["mx-done", "mx-running", "mx-conflict"]
        .iter()
        .map(|k| request(k, &hash, payload, 3))
        .collect();
    let out = claims.claim(&before, t0).await.unwrap();
    assert!(out.iter().all(|o| matches!(o, ClaimOutcome::Acquired { fence: 1, .. })), "{out:?}");
    let done = ClaimRef {
        plugin: "p".into(),
        key: "mx-done".into(),
        fence: 1,
    };
    assert_eq!(claims.confirm(&[done], t0 + 1).await.unwrap(), vec![true]);
    let batch = [
        request("mx-new-1", &hash, payload, 3),
        request("mx-done", &hash, payload, 3),
        request("mx-running", &hash, payload, 3),
        request("mx-new-1", &hash, payload, 3),
        request("mx-conflict", &other_hash, other, 3),
        request("mx-new-2", &hash, payload, 3),
    ];
    let out = claims.claim(&batch, t0 + 10).await.unwrap();
    let first = ClaimOutcome::Acquired {
        fence: 1,
        attempt: 1,
        traps: 0,
    };
    assert_eq!(out[0], first, "a new key: {out:?}");
    assert_eq!(out[1], ClaimOutcome::Done, "a key done: {out:?}");
    assert!(matches!(out[2], ClaimOutcome::Busy { .. }), "a key running: {out:?}");
    assert!(
        matches!(out[3], ClaimOutcome::Busy { .. }),
        "a new key's repeat in the batch: {out:?}"
    );
    assert_eq!(out[4], ClaimOutcome::Conflict, "another payload: {out:?}");
    assert_eq!(out[5], first, "a new key: {out:?}");
    let again = claims.claim(&batch[..1], t0 + 20).await.unwrap();
    assert!(
        matches!(again[0], ClaimOutcome::Busy { .. }),
        "the batch's new claims are held: {again:?}"
    );
}

pub async fn data_store_conformance(b: &Backends) {
    let d = &b.data;
    assert_eq!(d.insert_unique(None, "users", "u1", b"alice").await.unwrap(), Inserted::Inserted);
    assert_eq!(
        d.insert_unique(None, "users", "u1", b"bob").await.unwrap(),
        Inserted::Existed(b"alice".to_vec())
    );
    assert_eq!(d.get("users", "u1").await.unwrap().as_deref(), Some(&b"alice"[..]));
    d.upsert(None, "users", "u1", b"carol").await.unwrap();
    d.upsert(None, "users", "u1", b"carol").await.unwrap();
    assert_eq!(d.get("users", "u1").await.unwrap().as_deref(), Some(&b"carol"[..]));
    assert_eq!(d.get("other", "u1").await.unwrap(), None, "collections are separate");
    assert!(d.delete(None, "users", "u1").await.unwrap());
    assert!(!d.delete(None, "users", "u1").await.unwrap());
    let evil = "x'); DROP TABLE kv; --";
    d.upsert(None, evil, evil, b"v").await.unwrap();
    assert_eq!(d.scan(evil).await.unwrap(), vec![(evil.to_string(), b"v".to_vec())]);
}

/// A group-committed batch checks each item's fence on its own; writes to
/// one row land as if the items had run in order; two insert-uniques of
/// one free key in one batch: the first inserts, the second sees its
/// value; of two deletes of one row, the first finds it. Where the database
/// refuses an item (`refuses_nul`: Postgres text cannot hold a NUL byte),
/// only that item fails and the others give the same answers.
pub async fn batched_writes_conformance(b: &Backends, refuses_nul: bool) {
    use idem_host::store::{Write, WriteOp, Written};
    let payload = b"{}";
    let hash = payload_hash(payload);
    let t0 = 1_000_000;
    for key in ["b1", "b2"] {
        let out = b.claims.claim(&[request(key, &hash, payload, 5)], t0).await.unwrap();
        assert!(matches!(out[0], ClaimOutcome::Acquired { fence: 1, .. }), "{out:?}");
    }
    // b2 is taken over after its lease: fence 2 is current, fence 1 stale.
    let out = b.claims.claim(&[request("b2", &hash, payload, 5)], t0 + 5_000).await.unwrap();
    assert!(matches!(out[0], ClaimOutcome::Acquired { fence: 2, .. }), "{out:?}");
    let claim = |key: &str, fence: i64| ClaimRef {
        plugin: "p".into(),
        key: key.into(),
        fence,
    };
    b.data.upsert(None, "batch", "gone", b"old").await.unwrap();
    let item = |c: ClaimRef, key: &str, op: WriteOp| Write {
        claim: c,
        collection: "batch".into(),
        key: key.into(),
        op,
    };
    let up = |v: &[u8]| WriteOp::Upsert(v.to_vec());
    let ins = |v: &[u8]| WriteOp::InsertUnique(v.to_vec());
    let mut items = vec![
        item(claim("b1", 1), "x", up(b"first")),
        item(claim("b2", 1), "y", up(b"stale")),
        item(claim("b2", 2), "y", up(b"fresh")),
        item(claim("b1", 1), "x", up(b"second")),
        item(claim("b1", 1), "u", ins(b"one")),
        item(claim("b2", 2), "u", ins(b"two")),
        item(claim("b2", 2), "x", ins(b"late")),
        item(claim("b2", 1), "z", ins(b"stale")),
        item(claim("b1", 1), "gone", WriteOp::Delete),
        item(claim("b2", 2), "gone", WriteOp::Delete),
        item(claim("b2", 2), "never", WriteOp::Delete),
        item(claim("b2", 1), "x", WriteOp::Delete),
    ];
    if refuses_nul {
        // The batch's transaction fails as a whole and is written item by
        // item (the statements themselves are tested in
        // `the_group_commit_statements_check_each_item`).
        items.push(item(claim("b1", 1), "bad\0key", up(b"a NUL byte Postgres text refuses")));
    }
    let results = b.data.write_many(&items).await;
    assert_eq!(results.len(), items.len());
    let lost = |r: &Result<Written, DataError>| matches!(r, Err(DataError::FenceLost { .. }));
    let ok = |r: &Result<Written, DataError>| r.as_ref().ok().cloned();
    assert_eq!(ok(&results[0]), Some(Written::Upserted), "{results:?}");
    assert!(
        lost(&results[1]) && lost(&results[7]) && lost(&results[11]),
        "stale fences: {results:?}"
    );
    assert_eq!(ok(&results[2]), Some(Written::Upserted));
    assert_eq!(ok(&results[3]), Some(Written::Upserted));
    assert_eq!(ok(&results[4]), Some(Written::Inserted(Inserted::Inserted)), "{results:?}");
    assert_eq!(
        ok(&results[5]),
        Some(Written::Inserted(Inserted::Existed(b"one".to_vec()))),
        "the second insert of one key in a batch sees the first's value: {results:?}"
    );
    assert_eq!(
        ok(&results[6]),
        Some(Written::Inserted(Inserted::Existed(b"second".to_vec()))),
        "{results:?}"
    );
    assert_eq!(ok(&results[8]), Some(Written::Deleted(true)), "{results:?}");
    assert_eq!(ok(&results[9]), Some(Written::Deleted(false)), "{results:?}");
    assert_eq!(ok(&results[10]), Some(Written::Deleted(false)), "{results:?}");
    if refuses_nul {
        assert!(matches!(results[12], Err(DataError::Unavailable(_))), "{results:?}");
    }
    let get = |key: &'static str| {
        let data = b.data.clone();
        async move { data.get("batch", key).await.unwrap() }
    };
    assert_eq!(get("x").await.as_deref(), Some(&b"second"[..]), "the later write wins");
    assert_eq!(get("y").await.as_deref(), Some(&b"fresh"[..]), "the stale write is refused");
    assert_eq!(get("u").await.as_deref(), Some(&b"one"[..]));
    assert_eq!(get("z").await, None, "a stale insert writes nothing");
    assert_eq!(get("gone").await, None);

    // Write-behind: writes of one key queued one after another commit in
    // that order, and a get waits for the ones still queued.
    let mut queued = Vec::new();
    for i in 0..50 {
        queued.push(b.data.queue(item(claim("b1", 1), "seq", up(format!("v{i}").as_bytes()))).await);
    }
    assert_eq!(get("seq").await.as_deref(), Some(&b"v49"[..]), "the get saw every queued write");
    for q in queued {
        assert_eq!(q.wait().await.unwrap(), Written::Upserted);
    }

    // Through the group commit: racing insert-uniques of one key, each with
    // its own answer; exactly one inserts and every other sees its value.
    let racers: Vec<_> = (0..20)
        .map(|i| {
            let data = b.data.clone();
            let c = claim(if i % 2 == 0 { "b1" } else { "b2" }, if i % 2 == 0 { 1 } else { 2 });
            tokio::spawn(async move { data.insert_unique(Some(&c), "batch", "race", format!("v{i}").as_bytes()).await })
        })
        .collect();
    let mut answers = Vec::new();
    for r in racers {
        answers.push(r.await.unwrap().unwrap());
    }
    let stored = get("race").await.expect("one insert won");
    assert_eq!(answers.iter().filter(|a| **a == Inserted::Inserted).count(), 1, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|a| *a == Inserted::Inserted || *a == Inserted::Existed(stored.clone())),
        "every loser sees the winner's value: {answers:?}"
    );

    // Through the group commit: concurrent upserts, each with its own answer.
    let writes: Vec<_> = (0..40)
        .map(|i| {
            let data = b.data.clone();
            // Every fourth write presents b2's stale fence.
            let c = match i % 4 {
                1 => claim("b2", 1),
                3 => claim("b2", 2),
                _ => claim("b1", 1),
            };
            tokio::spawn(async move { (i, data.upsert(Some(&c), "batch", &format!("k{i}"), b"v").await) })
        })
        .collect();
    for w in writes {
        let (i, result) = w.await.unwrap();
        assert_eq!(result.is_err(), i % 4 == 1, "write {i}: {result:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_claim_store_conforms() {
    let (_dir, b) = sqlite().await;
    claim_store_conformance(&b).await;
    results_conformance(&b).await;
    mixed_batch_conformance(&b).await;
    unclaimed_dead_letter_conformance(&b).await;
    failure_text_conformance(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_data_store_conforms() {
    let (_dir, b) = sqlite().await;
    data_store_conformance(&b).await;
    batched_writes_conformance(&b, false).await;
}

/// Backends on the real servers, in a namespace of their own (a Postgres
/// schema, a Redis key prefix), dropped at the end.
pub struct Served {
    pub backends: Backends,
    pub config: Config,
    _dir: tempfile::TempDir,
}

impl Served {
    pub async fn open(claims: StoreKind, data: StoreKind) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            namespace: crate::common::unique_namespace("conf"),
            ..Default::default()
        };
        config.database.path = dir.path().join("conformance.db");
        config.claims = StoreConfig {
            kind: claims,
            url: Some(url(claims)),
            max_connections: 8,
        };
        config.data = StoreConfig {
            kind: data,
            url: Some(url(data)),
            max_connections: 8,
        };
        let backends = idem_host::backend::open(&config).await.unwrap();
        Served {
            backends,
            config,
            _dir: dir,
        }
    }

    pub async fn cleanup(self) {
        let ns = &self.config.namespace;
        if self.config.claims.kind == StoreKind::Postgres || self.config.data.kind == StoreKind::Postgres {
            let pool = sqlx::PgPool::connect(&crate::common::services::postgres()).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{ns}\" CASCADE")))
                .execute(&pool)
                .await
                .unwrap();
        }
        if self.config.claims.kind == StoreKind::Redis {
            let client = redis::Client::open(crate::common::services::redis()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{ns}:*")).query_async(&mut conn).await.unwrap();
            if !keys.is_empty() {
                let _: () = redis::cmd("DEL").arg(keys).query_async(&mut conn).await.unwrap();
            }
        }
    }
}

fn url(kind: StoreKind) -> String {
    match kind {
        StoreKind::Postgres => crate::common::services::postgres(),
        StoreKind::Redis => crate::common::services::redis(),
        StoreKind::Sqlite => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claim_store_conforms() {
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    claim_store_conformance(&s.backends).await;
    results_conformance(&s.backends).await;
    mixed_batch_conformance(&s.backends).await;
    unclaimed_dead_letter_conformance(&s.backends).await;
    failure_text_conformance(&s.backends).await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_data_store_conforms() {
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    data_store_conformance(&s.backends).await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_claim_store_with_postgres_data_conforms() {
    let s = Served::open(StoreKind::Redis, StoreKind::Postgres).await;
    claim_store_conformance(&s.backends).await;
    results_conformance(&s.backends).await;
    mixed_batch_conformance(&s.backends).await;
    unclaimed_dead_letter_conformance(&s.backends).await;
    failure_text_conformance(&s.backends).await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_data_store_with_fencing_tokens_conforms() {
    let s = Served::open(StoreKind::Redis, StoreKind::Postgres).await;
    data_store_conformance(&s.backends).await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_batched_writes_check_fences_per_item() {
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    batched_writes_conformance(&s.backends, true).await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_batched_writes_with_fencing_tokens_check_fences_per_item() {
    let s = Served::open(StoreKind::Redis, StoreKind::Postgres).await;
    batched_writes_conformance(&s.backends, true).await;
    s.cleanup().await;
}

/// Concurrent claims of the same keys from two connections never both win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_redis_claims_are_exclusive_under_concurrency() {
    for kind in [StoreKind::Postgres, StoreKind::Redis] {
        let s = Served::open(kind, StoreKind::Postgres).await;
        let payload = b"x";
        let hash = payload_hash(payload);
        let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
        let run = |reverse: bool| {
            let claims = s.backends.claims.clone();
            let keys = keys.clone();
            let hash = hash.clone();
            async move {
                let mut keys = keys;
                if reverse {
                    keys.reverse();
                }
                let reqs: Vec<ClaimRequest> = keys.iter().map(|k| request(k, &hash, payload, 3)).collect();
                claims.claim(&reqs, 1_000_000).await.unwrap()
            }
        };
        let (a, b) = tokio::join!(run(false), run(true));
        let won = |o: &Vec<ClaimOutcome>| o.iter().filter(|x| matches!(x, ClaimOutcome::Acquired { .. })).count();
        assert_eq!(won(&a) + won(&b), 50, "{kind:?}: every key acquired exactly once");
        s.cleanup().await;
    }
}

/// The group-commit statements themselves, not their item-by-item
/// fallback, with both ways of fencing (claim row, tokens): a batch of
/// upserts (the same row twice, a stale fence and a current one) in one
/// statement, and a batch of every kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_commit_statements_check_each_item() {
    use idem_host::store::postgres::{Fencing, PgData};
    use idem_host::store::{Write, WriteOp, Written};
    for (claims_kind, fencing) in [(StoreKind::Postgres, Fencing::ClaimRow), (StoreKind::Redis, Fencing::Token)] {
        let s = Served::open(claims_kind, StoreKind::Postgres).await;
        let payload = b"{}";
        let hash = payload_hash(payload);
        let t0 = 1_000_000;
        for key in ["s1", "s2"] {
            s.backends.claims.claim(&[request(key, &hash, payload, 5)], t0).await.unwrap();
        }
        // s2 is taken over: fence 2 current, 1 stale.
        let out = s
            .backends
            .claims
            .claim(&[request("s2", &hash, payload, 5)], t0 + 5_000)
            .await
            .unwrap();
        assert!(matches!(out[0], ClaimOutcome::Acquired { fence: 2, .. }), "{out:?}");
        let pool = idem_host::backend::open_postgres(&url(StoreKind::Postgres), &s.config.namespace, 2, "data")
            .await
            .unwrap();
        let data = PgData::new(pool, fencing);
        let item = |key: &str, fence: i64, row: &str, op: WriteOp| Write {
            claim: ClaimRef {
                plugin: "p".into(),
                key: key.into(),
                fence,
            },
            collection: "stmt".into(),
            key: row.into(),
            op,
        };
        let up = |v: &[u8]| WriteOp::Upsert(v.to_vec());
        let ins = |v: &[u8]| WriteOp::InsertUnique(v.to_vec());
        // Upserts only: one statement.
        let results = data
            .write_batch(&[
                item("s1", 1, "same", up(b"first")),
                item("s2", 1, "other", up(b"stale")),
                item("s2", 2, "other", up(b"current")),
                item("s1", 1, "same", up(b"second")),
            ])
            .await
            .unwrap_or_else(|e| panic!("{fencing:?}: the statement itself must not fail: {e}"));
        let refused: Vec<bool> = results.iter().map(|r| matches!(r, Err(DataError::FenceLost { .. }))).collect();
        assert_eq!(refused, vec![false, true, false, false], "{fencing:?}: {results:?}");
        let get = |row: &'static str| {
            let data = &data;
            async move { idem_host::store::DataStore::get(data, "stmt", row).await.unwrap() }
        };
        assert_eq!(
            get("same").await.as_deref(),
            Some(&b"second"[..]),
            "{fencing:?}: the later write wins"
        );
        assert_eq!(
            get("other").await.as_deref(),
            Some(&b"current"[..]),
            "{fencing:?}: the stale write is refused"
        );
        // Every kind: the fence statement, then one statement per kind.
        let results = data
            .write_batch(&[
                item("s1", 1, "fresh", ins(b"a")),
                item("s2", 2, "fresh", ins(b"b")),
                item("s2", 2, "same", ins(b"c")),
                item("s2", 1, "new", ins(b"stale")),
                item("s1", 1, "other", WriteOp::Delete),
                item("s2", 2, "other", WriteOp::Delete),
                item("s2", 1, "same", WriteOp::Delete),
                item("s2", 2, "up", up(b"u")),
            ])
            .await
            .unwrap_or_else(|e| panic!("{fencing:?}: the statements themselves must not fail: {e}"));
        let answers: Vec<Option<Written>> = results.iter().map(|r| r.as_ref().ok().cloned()).collect();
        assert_eq!(
            answers,
            vec![
                Some(Written::Inserted(Inserted::Inserted)),
                Some(Written::Inserted(Inserted::Existed(b"a".to_vec()))),
                Some(Written::Inserted(Inserted::Existed(b"second".to_vec()))),
                None,
                Some(Written::Deleted(true)),
                Some(Written::Deleted(false)),
                None,
                Some(Written::Upserted),
            ],
            "{fencing:?}: {results:?}"
        );
        assert!(matches!(results[3], Err(DataError::FenceLost { .. })) && matches!(results[6], Err(DataError::FenceLost { .. })));
        assert_eq!(get("fresh").await.as_deref(), Some(&b"a"[..]));
        assert_eq!(get("new").await, None);
        assert_eq!(get("other").await, None);
        assert_eq!(
            get("same").await.as_deref(),
            Some(&b"second"[..]),
            "{fencing:?}: a stale delete deletes nothing"
        );
        assert_eq!(get("up").await.as_deref(), Some(&b"u"[..]));
        s.cleanup().await;
    }
}

/// Retention on every claim store: settled claims older than the window go
/// with their journals (and, with fencing tokens, their tokens), newer ones
/// and running or retrying ones stay, a duplicate inside the window is still
/// suppressed, and old dead letters go when a dead-letter retention is set.
pub async fn retention_conformance(b: &Backends) {
    use idem_host::config::RetentionConfig;
    let (claims, admin) = (&b.claims, &b.admin);
    let payload = b"{}";
    let hash = payload_hash(payload);
    let day = 24 * 3600 * 1000;
    let now = idem_host::now_ms();
    let t0 = now - 10 * day;
    let claim = |key: &str, fence: i64| ClaimRef {
        plugin: "p".into(),
        key: key.into(),
        fence,
    };
    let acquired = |out: Vec<ClaimOutcome>| match out[0] {
        ClaimOutcome::Acquired { fence, .. } => fence,
        ref other => panic!("not acquired: {other:?}"),
    };

    // Settled ten days ago: done after a takeover (fence 2, its journal),
    // and dead after its only attempt's worker vanished.
    assert_eq!(
        acquired(claims.claim(&[request("old-done", &hash, payload, 5)], t0).await.unwrap()),
        1
    );
    assert_eq!(
        acquired(claims.claim(&[request("old-done", &hash, payload, 5)], t0 + 1_500).await.unwrap()),
        2
    );
    assert!(claims
        .journal_put(&claim("old-done", 2), "charge", "h", b"r", "v1", t0 + 1_505)
        .await
        .unwrap());
    assert_eq!(claims.confirm(&[claim("old-done", 2)], t0 + 1_510).await.unwrap(), vec![true]);
    claims.claim(&[request("old-dead", &hash, payload, 1)], t0).await.unwrap();
    let out = claims.claim(&[request("old-dead", &hash, payload, 1)], t0 + 3_000).await.unwrap();
    assert!(matches!(out[0], ClaimOutcome::Exhausted { .. }), "{out:?}");
    // Ten days old but not settled: running (lease long gone) and retrying.
    claims.claim(&[request("old-running", &hash, payload, 5)], t0).await.unwrap();
    claims.claim(&[request("old-retry", &hash, payload, 5)], t0).await.unwrap();
    assert!(claims
        .release(&claim("old-retry", 1), t0 + 50, "boom", false, t0 + 10)
        .await
        .unwrap());
    // Settled an hour ago, with a journal.
    claims
        .claim(&[request("new-done", &hash, payload, 5)], now - 3_600_000)
        .await
        .unwrap();
    assert!(claims
        .journal_put(&claim("new-done", 1), "charge", "h", b"r", "v1", now - 3_599_000)
        .await
        .unwrap());
    assert_eq!(claims.confirm(&[claim("new-done", 1)], now - 3_598_000).await.unwrap(), vec![true]);
    // Bad input dead-lettered ten days ago.
    let bad = DeadLetterRequest {
        plugin: "no-such-handler",
        key: "old-bad",
        msg_id: "old-bad",
        headers: &[],
        payload,
        reason: "unknown handler",
        fence: None,
        plugin_version: None,
        delivery: Some(delivery_identity("no-such-handler", "old-bad", "old-bad", payload)),
    };
    assert_eq!(claims.dead_letter(std::slice::from_ref(&bad), t0 + 20).await.unwrap(), vec![true]);
    let before = admin.counts().await.unwrap();
    assert_eq!((before.done, before.dead, before.journal, before.dead_letters), (2, 1, 2, 2));

    let retention = RetentionConfig {
        done_ms: 7 * day as u64,
        dead_letters_ms: Some(9 * day as u64),
        sweep_every_ms: 1_000,
        sweep_batch: 1,
    };
    let totals = idem_host::retention::sweep_once(b, &retention, &Default::default()).await.unwrap();
    assert_eq!((totals.claims, totals.dead_letters), (2, 2), "batches of one, repeated until done");

    let state = |key: &'static str| async move { admin.state("p", key).await.unwrap().map(ClaimState::as_str) };
    assert_eq!(state("old-done").await, None);
    assert_eq!(state("old-dead").await, None);
    assert_eq!(state("old-running").await, Some("running"), "never sweeps a running claim");
    assert_eq!(state("old-retry").await, Some("retry"), "never sweeps a claim waiting for a retry");
    assert_eq!(state("new-done").await, Some("done"));
    assert_eq!(claims.journal_get("p", "old-done", "charge").await.unwrap(), None);
    assert!(claims.journal_get("p", "new-done", "charge").await.unwrap().is_some());
    let after = admin.counts().await.unwrap();
    assert_eq!((after.done, after.dead, after.journal, after.dead_letters), (1, 0, 1, 0));

    // Inside the window a duplicate is still suppressed; past it, the key
    // is new: fence 1 again, and its writes pass (the token went too).
    let out = claims.claim(&[request("new-done", &hash, payload, 5)], now).await.unwrap();
    assert_eq!(out, vec![ClaimOutcome::Done]);
    assert_eq!(
        acquired(claims.claim(&[request("old-done", &hash, payload, 5)], now).await.unwrap()),
        1
    );
    b.data.upsert(Some(&claim("old-done", 1)), "c", "old-done", b"again").await.unwrap();
    // The swept bad input, delivered again, is recorded again.
    assert_eq!(claims.dead_letter(&[bad], now).await.unwrap(), vec![true]);
    let letters = admin.dead_letters(10).await.unwrap();
    assert_eq!(letters.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(), vec!["old-bad"]);
    assert!(letters[0].dead_at >= now, "{letters:?}");
    admin.dead_letter_remove(&[letters[0].id]).await.unwrap();
    // Nothing left to sweep.
    let again = idem_host::retention::sweep_once(b, &retention, &Default::default()).await.unwrap();
    assert_eq!((again.claims, again.dead_letters), (0, 0));

    // A dead claim stays, with its journal, while its dead letter is kept
    // (as by default): replayed after the window, the message is revived
    // and its journal answers the call it made, which is not sent again.
    // Before, the claim and journal were swept and the replay ran as new.
    assert_eq!(
        acquired(claims.claim(&[request("kept-dead", &hash, payload, 5)], t0).await.unwrap()),
        1
    );
    assert!(claims
        .journal_put(&claim("kept-dead", 1), "charge", "h", b"r", "v1", t0 + 5)
        .await
        .unwrap());
    let dead = DeadLetterRequest {
        plugin: "p",
        key: "kept-dead",
        msg_id: "kept-dead",
        headers: &[],
        payload,
        reason: "permanent error: the email API is down",
        fence: Some(1),
        plugin_version: Some("v1"),
        delivery: None,
    };
    assert_eq!(claims.dead_letter(&[dead], t0 + 10).await.unwrap(), vec![true]);
    let keep = RetentionConfig {
        dead_letters_ms: None,
        ..retention
    };
    let kept = idem_host::retention::sweep_once(b, &keep, &Default::default()).await.unwrap();
    assert_eq!((kept.claims, kept.dead_letters), (0, 0));
    assert_eq!(state("kept-dead").await, Some("dead"));
    assert!(claims.journal_get("p", "kept-dead", "charge").await.unwrap().is_some());
    assert!(admin.revive("p", "kept-dead", &hash, now).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_retention_conforms() {
    let (_dir, b) = sqlite().await;
    retention_conformance(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_retention_conforms() {
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    retention_conformance(&s.backends).await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_retention_with_fencing_tokens_conforms() {
    let s = Served::open(StoreKind::Redis, StoreKind::Postgres).await;
    retention_conformance(&s.backends).await;
    s.cleanup().await;
}
