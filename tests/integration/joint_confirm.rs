//! Claims and data in one Postgres database: a batch's confirms commit in
//! the transaction of the next batch of writes (in the upsert statement
//! itself when the batch is upserts only), each still checked against its
//! claim's fence, and answered per claim.

use idem_host::claim::{ClaimOutcome, ClaimRef, ClaimRequest};
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

/// Wait until one of namespace `ns`'s connections waits for a row lock.
async fn waiting_for_a_lock(pool: &sqlx::PgPool, ns: &str, what: &str) {
    let app = format!("idem {ns}");
    crate::common::wait_until(std::time::Duration::from_secs(10), what, || {
        let pool = pool.clone();
        let app = app.clone();
        async move {
            let waiting: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'")
                    .bind(app)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            waiting >= 1
        }
    })
    .await;
}

/// The statements themselves: a batch of upserts with confirms (one
/// statement), a batch of every kind with confirms (one more statement in
/// its transaction), confirms alone, and a batch whose transaction fails as
/// a whole. A stale fence is refused, the others are confirmed with their
/// results; a confirm repeated (a claim already done with that fence, as
/// after a commit whose answer was lost) is answered confirmed again and
/// leaves the claim as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirms_commit_in_the_write_batch_and_check_each_fence() {
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    claimed(&s, &["j1", "j2", "j3", "j4", "j5"], "j2").await;
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
    assert_eq!(confirmed, vec![true, true], "j4 confirmed; j1 was already done with that fence");
    assert_eq!(
        stored(&s, &["j1", "j4"]).await,
        vec![Some(b"r1".to_vec()), Some(b"r4".to_vec())],
        "a repeated confirm leaves the stored result alone"
    );

    let (written, confirmed) = data
        .write_batch_confirming(&[], &[confirm("j2", 2, b"r2")], 2_000_002)
        .await
        .unwrap();
    assert!(written.is_empty());
    assert_eq!(confirmed, vec![true]);
    assert_eq!(stored(&s, &["j2"]).await, vec![Some(b"r2".to_vec())]);

    // Repeated and stale confirms in the upsert statement: j4 is done with
    // fence 1 (answered confirmed), j2 with fence 2 (fence 1 refused).
    let (written, confirmed) = data
        .write_batch_confirming(
            &[write("j3", "d", up(b"3"))],
            &[confirm("j4", 1, b"again"), confirm("j2", 1, b"stale")],
            2_000_003,
        )
        .await
        .unwrap();
    assert_eq!(written[0].as_ref().ok(), Some(&Written::Upserted), "{written:?}");
    assert_eq!(confirmed, vec![true, false]);
    assert_eq!(stored(&s, &["j2", "j4"]).await, vec![Some(b"r2".to_vec()), Some(b"r4".to_vec())]);

    // A batch whose transaction fails as a whole (a key Postgres text
    // cannot hold): the confirms on their own, the writes item by item.
    let (written, confirmed) = data
        .write_and_confirm(
            &[write("j3", "bad\0key", up(b"x")), write("j3", "fine", up(b"y"))],
            vec![confirm("j5", 1, b"r5"), confirm("j1", 1, b"again"), confirm("j2", 1, b"stale")],
            2_000_004,
        )
        .await;
    assert!(matches!(written[0], Err(DataError::Unavailable(_))), "{written:?}");
    assert_eq!(written[1].as_ref().ok(), Some(&Written::Upserted), "{written:?}");
    assert_eq!(confirmed.unwrap(), vec![true, true, false]);
    assert_eq!(stored(&s, &["j1", "j5"]).await, vec![Some(b"r1".to_vec()), Some(b"r5".to_vec())]);
    s.cleanup().await;
}

/// Through the group commit: confirms sent while writes are queued are
/// answered per claim; a batch with a write Postgres refuses is written
/// item by item and its confirms still commit. With claims elsewhere (Redis) the data store confirms
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

/// A claim transaction holds one claim row and then asks for a second (two
/// redeliveries, decided in key order) while a group commit writes under
/// the second and confirms the first: the group commit waits for the claim
/// transaction, and neither is aborted as a deadlock. Both batch paths: the
/// upsert statement, and the transaction of every kind. (While a batch
/// locked the rows it wrote under before those it confirmed, each held a row
/// the other waited for, and Postgres aborted one after `deadlock_timeout`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_commit_and_a_claim_transaction_lock_claim_rows_in_one_order() {
    use std::sync::Arc;
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    claimed(&s, &["d1", "d2", "e1", "e2", "x"], "x").await;
    let ns = s.config.namespace.clone();
    let pool = idem_host::backend::open_postgres(&crate::common::services::postgres(), &ns, 4, "data")
        .await
        .unwrap();
    let data = Arc::new(PgData::new(pool.clone(), Fencing::ClaimRow));
    for (first, second, op) in [
        ("d1", "d2", WriteOp::Upsert(b"u".to_vec())),
        ("e1", "e2", WriteOp::InsertUnique(b"i".to_vec())),
    ] {
        let mut holder = pool.begin().await.unwrap();
        let lock = |key: &str| format!("SELECT fence FROM claims WHERE plugin = 'p' AND key = '{key}' FOR UPDATE");
        sqlx::query(sqlx::AssertSqlSafe(lock(first))).execute(&mut *holder).await.unwrap();
        let batch = {
            let data = data.clone();
            let w = write(second, &format!("row-{second}"), op.clone());
            let c = confirm(first, 1, b"r");
            tokio::spawn(async move { data.write_batch_confirming(&[w], &[c], 4_000_000).await })
        };
        waiting_for_a_lock(&pool, &ns, "the group commit waiting for the held claim row").await;
        let second_lock = sqlx::query(sqlx::AssertSqlSafe(lock(second))).execute(&mut *holder).await;
        assert!(second_lock.is_ok(), "{second}: the claim transaction was aborted: {second_lock:?}");
        holder.commit().await.unwrap();
        let (written, confirmed) = batch
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{second}: the group commit was aborted: {e}"));
        assert!(written[0].is_ok(), "{written:?}");
        assert_eq!(confirmed, vec![true], "{first} confirmed");
        assert_eq!(stored(&s, &[first]).await, vec![Some(b"r".to_vec())]);
    }
    pool.close().await;
    s.cleanup().await;
}

/// A batch's new keys go in in byte order whatever the database's
/// collation, the order in which a claim transaction takes keys one by one,
/// so the two queue behind each other. Here the database sorts "a" before
/// "B" (an English locale), bytes "B" first: a transaction holding a new
/// "B" and then inserting "a" would deadlock with a batch statement that
/// inserted "a" first and waits for "B" (one of the two aborted after
/// Postgres's deadlock timeout). Once with two keys of one plugin, once
/// with one key of two plugins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_new_claims_takes_keys_in_byte_order_whatever_the_collation() {
    let base = crate::common::services::postgres();
    let admin = sqlx::PgPool::connect(&base).await.unwrap();
    let ns = crate::common::unique_namespace("collate");
    let scratch = ScratchDatabase {
        base: base.clone(),
        name: ns.to_lowercase(),
    };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE \"{}\" TEMPLATE template0 ENCODING 'UTF8' LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'",
        scratch.name
    )))
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;
    let url = scratch.url();
    let dir = tempfile::tempdir().unwrap();
    let mut config = idem_host::config::Config {
        namespace: ns.clone(),
        ..Default::default()
    };
    config.database.path = dir.path().join("idem.db");
    config.claims = idem_host::config::StoreConfig {
        kind: StoreKind::Postgres,
        url: Some(url.clone()),
        max_connections: 2,
    };
    let claims = idem_host::backend::open(&config).await.unwrap().claims;
    let pool = idem_host::backend::open_postgres(&url, &ns, 2, "claims").await.unwrap();
    let english: Vec<String> = sqlx::query_scalar("SELECT k FROM (VALUES ('a'), ('B')) AS t(k) ORDER BY k")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(english, ["a", "B"], "the database under test sorts \"a\" first");

    let payload = b"{}";
    let hash = payload_hash(payload);
    // (plugin, key) of the claim first in English, then of the one first in bytes.
    for [english_first, bytes_first] in [[("p", "a"), ("p", "B")], [("a", "k"), ("B", "k")]] {
        let insert = |(plugin, key): (&str, &str)| {
            format!(
                "INSERT INTO claims (plugin, key, msg_id, payload_hash, state, fence, owner, lease_until, attempts, plugin_version, created_at, updated_at) \
                 VALUES ('{plugin}', '{key}', '{key}', '{hash}', 'running', 1, 'other', 9000000000000, 1, 'v1', 1, 1)"
            )
        };
        let mut holder = pool.begin().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(insert(bytes_first)))
            .execute(&mut *holder)
            .await
            .unwrap();
        let batch = {
            let claims = claims.clone();
            let hash = hash.clone();
            tokio::spawn(async move {
                let of = |(plugin, key): (&'static str, &'static str)| ClaimRequest {
                    plugin,
                    ..request(key, &hash, payload, 5)
                };
                claims.claim(&[of(english_first), of(bytes_first)], 1_000_000).await
            })
        };
        waiting_for_a_lock(&pool, &ns, &format!("the batch statement waiting for the held {bytes_first:?}")).await;
        let second = sqlx::query(sqlx::AssertSqlSafe(insert(english_first))).execute(&mut *holder).await;
        assert!(
            second.is_ok(),
            "the transaction inserting {english_first:?} after {bytes_first:?} was aborted: {second:?}"
        );
        holder.commit().await.unwrap();
        let out = batch
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("the batch statement of {english_first:?} and {bytes_first:?} was aborted: {e}"));
        assert!(
            out.iter().all(|o| matches!(o, ClaimOutcome::Busy { .. })),
            "both claims are held by the other owner: {out:?}"
        );
    }
    pool.close().await;
    drop(claims);
}

/// A database of its own, dropped with this value, also when the test
/// fails before its end.
struct ScratchDatabase {
    /// The URL of the server's usual database.
    base: String,
    name: String,
}

impl ScratchDatabase {
    /// `base` with this database in its path (its query kept).
    fn url(&self) -> String {
        let (server, query) = match self.base.split_once('?') {
            Some((server, query)) => (server, format!("?{query}")),
            None => (self.base.as_str(), String::new()),
        };
        let authority = server.find("://").map_or(0, |i| i + 3);
        let path = server[authority..].find('/').map_or(server.len(), |i| authority + i);
        format!("{}/{}{query}", &server[..path], self.name)
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let (base, name) = (self.base.clone(), self.name.clone());
        // Dropped inside the test's runtime: the drop gets a thread and a
        // runtime of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let admin = sqlx::PgPool::connect(&base).await?;
                sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
                    .execute(&admin)
                    .await?;
                admin.close().await;
                Ok::<(), sqlx::Error>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) && !std::thread::panicking() {
            panic!("cannot drop the test database {:?}: {dropped:?}", self.name);
        }
    }
}

/// Forgetting swept claims' fencing tokens (claims held elsewhere) locks
/// their rows in the order a group commit takes them: a transaction holding
/// "k1" and then taking "k2", as a group commit writing both does, queues
/// the forget behind it instead of deadlocking with it, whatever order the
/// keys came in. (While the delete took rows in the order it found them,
/// it held "k2" and waited for "k1", and Postgres aborted one side after
/// `deadlock_timeout`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetting_fences_locks_them_in_the_group_commits_order() {
    use std::sync::Arc;
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    let ns = s.config.namespace.clone();
    let pool = idem_host::backend::open_postgres(&crate::common::services::postgres(), &ns, 4, "data")
        .await
        .unwrap();
    // The keys come as "k2", "k1": a statement that locks rows in the order
    // it is given them takes "k2" first.
    sqlx::query("INSERT INTO fences (plugin, key, fence) VALUES ('p', 'k2', 3), ('p', 'k1', 3), ('p', 'kept', 3)")
        .execute(&pool)
        .await
        .unwrap();
    let data = Arc::new(PgData::new(pool.clone(), Fencing::Token));
    let mut holder = pool.begin().await.unwrap();
    let lock = |key: &str| format!("SELECT fence FROM fences WHERE plugin = 'p' AND key = '{key}' FOR UPDATE");
    sqlx::query(sqlx::AssertSqlSafe(lock("k1"))).execute(&mut *holder).await.unwrap();
    let forget = {
        let data = data.clone();
        tokio::spawn(async move { data.forget_fences(&[("p".into(), "k2".into()), ("p".into(), "k1".into())]).await })
    };
    waiting_for_a_lock(&pool, &ns, "the forget waiting for the held fence row").await;
    let second_lock = sqlx::query(sqlx::AssertSqlSafe(lock("k2"))).execute(&mut *holder).await;
    assert!(second_lock.is_ok(), "the group commit's side was aborted: {second_lock:?}");
    holder.commit().await.unwrap();
    let forgot = forget.await.unwrap();
    assert!(forgot.is_ok(), "the forget was aborted: {forgot:?}");
    let left: Vec<String> = sqlx::query_scalar("SELECT key FROM fences WHERE plugin = 'p' ORDER BY key")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, ["kept"]);
    pool.close().await;
    s.cleanup().await;
}
