//! Claims and data in one Postgres database: a batch's confirms commit in
//! the transaction of the next batch of writes (in the upsert statement
//! itself when the batch is upserts only), each still checked against its
//! claim's fence, and answered per claim.

use idem_host::claim::{ClaimOutcome, ClaimRef};
use idem_host::config::StoreKind;
use idem_host::envelope::payload_hash;
use idem_host::store::postgres::{Fencing, PgData};
use idem_host::store::{Confirm, DataError, DataStore, Inserted, Write, WriteOp, Written};

use crate::conformance::{request, Served};

fn claim(key: &str, fence: i64) -> ClaimRef {
    ClaimRef {
        plugin: "p".into(),
        key: key.into(),
        fence,
    }
}

fn confirm(key: &str, fence: i64, result: &[u8]) -> Confirm {
    Confirm {
        claim: claim(key, fence),
        result: Some(result.to_vec()),
    }
}

fn write(key: &str, row: &str, op: WriteOp) -> Write {
    Write {
        claim: claim(key, 1),
        collection: "joint".into(),
        key: row.into(),
        op,
    }
}

/// Claims `keys` at fence 1, then takes `stale` over (fence 2 current).
async fn claimed(s: &Served, keys: &[&str], stale: &str) {
    let payload = b"{}";
    let hash = payload_hash(payload);
    let t0 = 1_000_000;
    for key in keys {
        let out = s.backends.claims.claim(&[request(key, &hash, payload, 5)], t0).await.unwrap();
        assert!(matches!(out[0], ClaimOutcome::Acquired { fence: 1, .. }), "{out:?}");
    }
    let out = s
        .backends
        .claims
        .claim(&[request(stale, &hash, payload, 5)], t0 + 5_000)
        .await
        .unwrap();
    assert!(matches!(out[0], ClaimOutcome::Acquired { fence: 2, .. }), "{out:?}");
}

/// The result stored with each claim: `Some` only for a done claim.
async fn stored(s: &Served, keys: &[&str]) -> Vec<Option<Vec<u8>>> {
    let keys: Vec<(&str, &str)> = keys.iter().map(|k| ("p", *k)).collect();
    s.backends.claims.results(&keys).await.unwrap()
}

/// The statements themselves: a batch of upserts with confirms (one
/// statement), a batch of every kind with confirms (one more statement in
/// its transaction), and confirms alone. A stale fence or a claim already
/// done is refused, the others are confirmed with their results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirms_commit_in_the_write_batch_and_check_each_fence() {
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    claimed(&s, &["j1", "j2", "j3", "j4"], "j2").await;
    let pool = idem_host::backend::open_postgres(&crate::common::services::postgres(), &s.config.namespace, 2, "data")
        .await
        .unwrap();
    let data = PgData::new(pool, Fencing::ClaimRow);
    assert!(data.confirms_claims(), "claims in the data store's database");

    let up = |v: &[u8]| WriteOp::Upsert(v.to_vec());
    let (written, confirmed) = data
        .write_batch_confirming(
            &[write("j3", "a", up(b"1")), write("j2", "b", up(b"stale"))],
            &[confirm("j1", 1, b"r1"), confirm("j2", 1, b"stale")],
            2_000_000,
        )
        .await
        .unwrap_or_else(|e| panic!("the upsert statement itself must not fail: {e}"));
    assert_eq!(written[0].as_ref().ok(), Some(&Written::Upserted), "{written:?}");
    assert!(matches!(written[1], Err(DataError::FenceLost { .. })), "{written:?}");
    assert_eq!(confirmed, vec![true, false], "j1 confirmed, j2's stale fence refused");
    assert_eq!(stored(&s, &["j1", "j2"]).await, vec![Some(b"r1".to_vec()), None]);

    let (written, confirmed) = data
        .write_batch_confirming(
            &[
                write("j3", "c", WriteOp::InsertUnique(b"2".to_vec())),
                write("j3", "a", WriteOp::Delete),
            ],
            &[confirm("j4", 1, b"r4"), confirm("j1", 1, b"again")],
            2_000_001,
        )
        .await
        .unwrap_or_else(|e| panic!("the statements themselves must not fail: {e}"));
    assert_eq!(
        written.iter().map(|w| w.as_ref().ok().cloned()).collect::<Vec<_>>(),
        vec![Some(Written::Inserted(Inserted::Inserted)), Some(Written::Deleted(true))]
    );
    assert_eq!(confirmed, vec![true, false], "j4 confirmed; j1 is already done");
    assert_eq!(
        stored(&s, &["j1", "j4"]).await,
        vec![Some(b"r1".to_vec()), Some(b"r4".to_vec())],
        "a refused confirm leaves the stored result alone"
    );

    let (written, confirmed) = data
        .write_batch_confirming(&[], &[confirm("j2", 2, b"r2")], 2_000_002)
        .await
        .unwrap();
    assert!(written.is_empty());
    assert_eq!(confirmed, vec![true]);
    assert_eq!(stored(&s, &["j2"]).await, vec![Some(b"r2".to_vec())]);
    s.cleanup().await;
}

/// Through the group commit: confirms sent while writes are queued are
/// answered per claim; a batch whose transaction fails as a whole (a key
/// Postgres text cannot hold) is written item by item and its confirms
/// still commit. With claims elsewhere (Redis) the data store confirms
/// nothing and the worker confirms in the claim store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_commit_answers_confirms_beside_writes() {
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    let keys: Vec<String> = (0..40).map(|i| format!("g{i}")).collect();
    let names: Vec<&str> = keys.iter().map(String::as_str).chain(["stale"]).collect();
    claimed(&s, &names, "stale").await;
    let data = s.backends.data.clone();
    assert!(data.confirms_claims());

    // Writes under the even keys race confirms of the odd ones.
    let mut tasks = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let data = data.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                let w = data.upsert(Some(&claim(&key, 1)), "joint", &key, b"v").await;
                assert!(w.is_ok(), "{key}: {w:?}");
            } else {
                let c = data.confirm(vec![confirm(&key, 1, key.as_bytes())], 3_000_000).await;
                assert_eq!(c.unwrap(), vec![true], "{key}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let results = stored(&s, &names[..40]).await;
    for (i, (key, result)) in keys.iter().zip(results).enumerate() {
        let expected = (i % 2 == 1).then(|| key.as_bytes().to_vec());
        assert_eq!(result, expected, "{key}");
    }

    // One batch: a write its transaction cannot hold, a good one, and
    // confirms (one stale).
    let (written, confirmed) = data
        .write_and_confirm(
            &[
                write("g0", "bad\0key", WriteOp::Upsert(b"x".to_vec())),
                write("g2", "good", WriteOp::Upsert(b"y".to_vec())),
            ],
            vec![confirm("g0", 1, b"r0"), confirm("stale", 1, b"no")],
            3_000_001,
        )
        .await;
    assert!(matches!(written[0], Err(DataError::Unavailable(_))), "{written:?}");
    assert_eq!(written[1].as_ref().ok(), Some(&Written::Upserted), "{written:?}");
    assert_eq!(confirmed.unwrap(), vec![true, false]);
    assert_eq!(stored(&s, &["g0", "stale"]).await, vec![Some(b"r0".to_vec()), None]);
    assert_eq!(data.get("joint", "good").await.unwrap().as_deref(), Some(&b"y"[..]));
    s.cleanup().await;

    let s = Served::open(StoreKind::Redis, StoreKind::Postgres).await;
    assert!(!s.backends.data.confirms_claims(), "claims in Redis: confirmed there");
    assert!(s.backends.data.confirm(vec![confirm("g1", 1, b"r")], 1).await.is_err());
    s.cleanup().await;
}
