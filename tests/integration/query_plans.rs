//! The Postgres claim store's hot path finds claim rows by primary key,
//! whatever else the table holds, and the data store's batches find `kv`
//! rows the same way. A secondary index the planner prefers
//! (an index on `state` did this) turns every batch into a scan that grows
//! with the claims settled since the last vacuum.

use idem_host::backend::open_postgres;
use idem_host::claim::{ClaimRef, ClaimRequest};
use idem_host::config::StoreKind;
use idem_host::envelope::payload_hash;
use serde_json::Value;
use sqlx::Row;

use crate::conformance::{request, Served};

/// One hot-path statement, and the arguments of `EXECUTE` for a batch of
/// claims of these keys, as the worker binds them.
struct Statement {
    name: &'static str,
    sql: &'static str,
    args: fn(&[String]) -> String,
}

/// Plugins, keys and fences of a batch.
fn batch(keys: &[String]) -> String {
    format!(
        "{}, {}, ARRAY[{}]::bigint[]",
        literal(&vec!["p".to_string(); keys.len()]),
        literal(keys),
        vec!["1"; keys.len()].join(",")
    )
}

fn statements() -> Vec<Statement> {
    vec![
        Statement {
            name: "fence_batch_claim_row",
            sql: idem_host::claim::locking::FENCE_BATCH.as_str(),
            // Writes under these claims, and confirms of them.
            args: |keys| {
                format!(
                    "{}, {}, {}",
                    batch(keys),
                    literal(&vec!["p".to_string(); keys.len()]),
                    literal(keys)
                )
            },
        },
        Statement {
            name: "kv_upsert_batch_claim_row",
            sql: idem_host::claim::locking::UPSERT_BATCH.as_str(),
            args: |keys| {
                // Upserts under these claims, and confirms of them.
                let values = vec!["'\\x76'::bytea"; keys.len()].join(",");
                format!(
                    "{}, {}, {}, ARRAY[{values}], 1000, {}, ARRAY[{}]::bytea[], 1000",
                    batch(keys),
                    literal(&vec!["c".to_string(); keys.len()]),
                    literal(keys),
                    batch(keys),
                    vec!["NULL"; keys.len()].join(",")
                )
            },
        },
        Statement {
            name: "claim_confirm",
            sql: idem_host::claim::locking::CONFIRM.as_str(),
            args: |keys| format!("{}, 1000, ARRAY[{}]::bytea[]", batch(keys), vec!["NULL"; keys.len()].join(",")),
        },
        Statement {
            name: "claim_extend",
            sql: idem_host::claim::locking::EXTEND.as_str(),
            args: |keys| format!("{}, 2000, 1000", batch(keys)),
        },
        Statement {
            name: "claim_results",
            sql: include_str!("../../host/queries/postgres/claim_results.sql"),
            args: |keys| format!("{}, {}", literal(&vec!["p".to_string(); keys.len()]), literal(keys)),
        },
        Statement {
            name: "fence_check",
            sql: include_str!("../../host/queries/postgres/fence_check.sql"),
            args: |keys| format!("'p', '{}', 1", keys[0]),
        },
    ]
}

/// Every scan of `table` in a JSON plan: (node type, index name, whether
/// it looks rows up by a condition on the index rather than reading all of
/// it).
fn scans_of(table: &str, plan: &Value, out: &mut Vec<(String, String, bool)>) {
    if plan.get("Relation Name").and_then(Value::as_str) == Some(table)
        && plan.get("Node Type").and_then(Value::as_str) != Some("ModifyTable")
    {
        out.push((
            plan["Node Type"].as_str().unwrap_or("?").to_string(),
            plan.get("Index Name").and_then(Value::as_str).unwrap_or("").to_string(),
            plan.get("Index Cond").is_some(),
        ));
    }
    if let Some(children) = plan.get("Plans").and_then(Value::as_array) {
        for child in children {
            scans_of(table, child, out);
        }
    }
}

/// A fresh namespace on Postgres and a pool opened as the workers open
/// theirs (`setting` names it in errors), its tables still empty.
async fn fresh_pool(setting: &str) -> (Served, sqlx::PgPool) {
    let s = Served::open(StoreKind::Postgres, StoreKind::Postgres).await;
    let url = crate::common::services::postgres();
    let pool = open_postgres(&url, &s.config.namespace, 2, setting).await.unwrap();
    (s, pool)
}

/// Prepare `sql` as `name` on `conn` and run it 6 times with `args` (the
/// runs after which Postgres may settle on a generic plan), while the
/// tables it reads are still empty.
async fn prepare_on_empty(conn: &mut sqlx::PgConnection, name: &str, sql: &str, args: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!("PREPARE {name} AS {sql}")))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    for _ in 0..6 {
        sqlx::query(sqlx::AssertSqlSafe(format!("EXECUTE {name}({args})")))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// The plan of `EXECUTE name(args)` reads `table`, and only by looking keys
/// up in `index`.
async fn assert_looks_up(conn: &mut sqlx::PgConnection, name: &str, args: &str, table: &str, index: &str, what: &str) {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN (FORMAT JSON) EXECUTE {name}({args})")))
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    // A `json` column: its text, whichever format it came in.
    let plan: Value = serde_json::from_str(&row.try_get_unchecked::<String, _>(0).unwrap()).unwrap();
    let mut scans = Vec::new();
    scans_of(table, &plan[0]["Plan"], &mut scans);
    assert!(!scans.is_empty(), "{name} ({what}) reads {table}: {plan}");
    for (node, used, looked_up) in &scans {
        assert!(
            node.starts_with("Index") && used == index && *looked_up,
            "{name} ({what}) reaches {table} by {node} {used:?} (index condition: {looked_up}), not by looking keys up in {index}: {plan}"
        );
    }
}

/// A literal of `keys`' arguments for `EXECUTE`, in the order `args` binds
/// them (test keys need no escaping).
fn literal(values: &[String]) -> String {
    format!("ARRAY[{}]", values.iter().map(|v| format!("'{v}'")).collect::<Vec<_>>().join(","))
}

/// A table as a busy pool leaves it between vacuums: 40,000 claims taken,
/// all but 300 confirmed, never analyzed. Each hot-path statement is
/// prepared and run on the pool's own connection while the table is still
/// empty (so a generic plan, were one cached, would be made for an empty
/// table), then planned again on the full table for batches of 64 and 256
/// claims: each reaches `claims` only by looking its keys up in the primary
/// key. The pool's connections keep generic plans (one per statement and
/// connection), so what is checked is the plan made on the empty table.
/// Fails with an index on `state` (bitmap scans of every entry 'running'
/// ever had) and with sequential scans allowed (a generic plan made for the
/// empty table reads it whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_hot_path_statements_find_claims_by_primary_key() {
    let (s, pool) = fresh_pool("claims").await;
    let mut conn = pool.acquire().await.unwrap();
    let keys: Vec<String> = (0..40_000).map(|i| format!("k{i}")).collect();
    let running = &keys[39_700..];
    for st in statements() {
        prepare_on_empty(&mut conn, st.name, st.sql, &(st.args)(&running[..64])).await;
    }

    let claims = &s.backends.claims;
    let payload = b"x";
    let hash = payload_hash(payload);
    for chunk in keys.chunks(1_000) {
        let requests: Vec<ClaimRequest> = chunk.iter().map(|k| request(k, &hash, payload, 3)).collect();
        claims.claim(&requests, 1_000).await.unwrap();
    }
    let settled: Vec<ClaimRef> = keys[..39_700]
        .iter()
        .map(|k| ClaimRef {
            plugin: "p".into(),
            key: k.clone(),
            fence: 1,
        })
        .collect();
    for chunk in settled.chunks(1_000) {
        let confirmed = claims.confirm_with_results(chunk, &vec![None; chunk.len()], 1_500).await.unwrap();
        assert!(confirmed.iter().all(|c| *c));
    }

    for n in [64, 256] {
        for st in statements() {
            assert_looks_up(
                &mut conn,
                st.name,
                &(st.args)(&running[..n]),
                "claims",
                "claims_pkey",
                &format!("{n} claims"),
            )
            .await;
        }
    }
    drop(conn);
    pool.close().await;
    s.cleanup().await;
}

/// The data store's batch reads and deletes, and retention's forgetting of
/// fencing tokens, prepared on the pool's own connection while `kv` and
/// `fences` are empty (the generic plan each connection keeps is made
/// then), then explained with 40,000 rows in each table: each looks its
/// keys up in the primary key. Upserts and unique inserts reach rows through
/// `ON CONFLICT`, which always uses it. Fails with sequential scans allowed
/// (a plan made for the empty table reads it whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_data_batches_find_rows_by_primary_key() {
    let (s, pool) = fresh_pool("data").await;
    let mut conn = pool.acquire().await.unwrap();
    let keys: Vec<String> = (0..256).map(|i| format!("k{i}")).collect();
    let args = |n: usize| format!("{}, {}", literal(&vec!["c".to_string(); n]), literal(&keys[..n]));
    // Each statement, the table it reaches and the primary key it must use.
    let statements = [
        (
            "kv_get_many",
            include_str!("../../host/queries/postgres/kv_get_many.sql"),
            "kv",
            "kv_pkey",
        ),
        (
            "kv_delete_many",
            include_str!("../../host/queries/postgres/kv_delete_many.sql"),
            "kv",
            "kv_pkey",
        ),
        (
            "fence_forget",
            include_str!("../../host/queries/postgres/fence_forget.sql"),
            "fences",
            "fences_pkey",
        ),
    ];
    for (name, sql, _, _) in statements {
        prepare_on_empty(&mut conn, name, sql, &args(64)).await;
    }
    sqlx::query("INSERT INTO kv (collection, key, value, updated_at) SELECT 'c', 'k' || g, '\\x76', 0 FROM generate_series(0, 39999) g")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO fences (plugin, key, fence) SELECT 'c', 'k' || g, 1 FROM generate_series(0, 39999) g")
        .execute(&mut *conn)
        .await
        .unwrap();
    for n in [64, 256] {
        for (name, _, table, index) in statements {
            assert_looks_up(&mut conn, name, &args(n), table, index, &format!("{n} keys")).await;
        }
    }
    drop(conn);
    pool.close().await;
    s.cleanup().await;
}
