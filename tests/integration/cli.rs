//! The `idem` command line, as a user runs it.

use std::process::Command;

use crate::common::{drain, envelope, plugin, plugin_dir, Env};

fn idem(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idem")).args(args).output().expect("run idem");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The allocator's one fixed option (host/src/cli/alloc.rs) is set by its
/// index in mimalloc's option list; mimalloc's own report of its options
/// names the option that index set, so a mimalloc whose list moved fails here.
#[test]
fn the_allocator_commits_arenas_as_used() {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("--version")
        .env("MIMALLOC_VERBOSE", "1")
        .env_remove("MIMALLOC_ARENA_EAGER_COMMIT")
        .output()
        .expect("run idem");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("option 'arena_eager_commit': 0"), "{err}");
}

#[test]
fn plugin_check_accepts_an_example_plugin() {
    let path = plugin_dir().join("record_payment.wasm");
    let (ok, out, err) = idem(&["plugin", "check", path.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("idem:handler/store@0.2.0"), "{out}");
    assert!(out.contains("loads and exports `handle`"), "{out}");
    assert!(!out.contains("REFUSED"), "{out}");
}

#[test]
fn plugin_check_refuses_a_disallowed_import() {
    let path = plugin_dir().join("sneaky_net.wasm");
    let (ok, out, _) = idem(&["plugin", "check", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(out.contains("REFUSED wasi:sockets/"), "{out}");
}

#[test]
fn plugin_check_rejects_a_file_that_is_not_a_component() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.wasm");
    std::fs::write(&path, b"not wasm at all").unwrap();
    let (ok, _, err) = idem(&["plugin", "check", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("not a valid WebAssembly component"), "{err}");
}

#[test]
fn bad_config_names_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("idem.toml");
    std::fs::write(&cfg, "[plugins.pay]\npath = \"pay.wasm\"\nendpoints = [\"bank\"]\n").unwrap();
    let (ok, _, err) = idem(&["run", "--config", cfg.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("plugins.pay.endpoints grants \"bank\""), "{err}");

    std::fs::write(&cfg, "[worker]\nconcurency = 4\n").unwrap();
    let (ok, _, err) = idem(&["run", "--config", cfg.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("concurency"), "{err}");

    std::fs::write(
        &cfg,
        format!(
            "[database]\npath = \"{}\"\n[plugins.pay]\npath = \"missing.wasm\"\n",
            dir.path().join("x.db").display()
        ),
    )
    .unwrap();
    let (ok, _, err) = idem(&["run", "--config", cfg.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("plugin pay: cannot read") && err.contains("plugins.pay.path"), "{err}");

    let (ok, _, err) = idem(&["run", "--config", dir.path().join("nope.toml").to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("cannot read config file"), "{err}");
}

#[test]
fn publish_then_stats() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("idem.toml");
    std::fs::write(&cfg, "[database]\npath = \"q.db\"\n").unwrap();
    let c = cfg.to_str().unwrap();
    let (ok, _, err) = idem(&[
        "publish",
        "--config",
        c,
        "--handler",
        "grant-credits",
        "--id",
        "m1",
        "--payload",
        r#"{"user":"u","balance":1}"#,
    ]);
    assert!(ok, "{err}");
    let jsonl = dir.path().join("m.jsonl");
    std::fs::write(
        &jsonl,
        "{\"id\":\"m2\",\"handler\":\"grant-credits\",\"payload\":{\"user\":\"v\",\"balance\":2}}\n",
    )
    .unwrap();
    let (ok, _, err) = idem(&["publish", "--config", c, "--file", jsonl.to_str().unwrap()]);
    assert!(ok, "{err}");
    // The format `idem verify --input` reads: no handler on the line, one
    // given on the command line.
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/verify/grant-credits.jsonl");
    let (ok, _, err) = idem(&[
        "publish",
        "--config",
        c,
        "--handler",
        "grant-credits",
        "--file",
        shipped.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (ok, out, err) = idem(&["stats", "--config", c, "--json"]);
    assert!(ok, "{err}");
    let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(stats["pending"], 5);
    assert_eq!(stats["done"], 0);
}

/// Processes that open a database that does not exist yet, at once (a pool
/// starting while `idem publish` runs, as the quickstart does), all create
/// it without tripping over each other's migrations.
#[test]
fn processes_creating_the_database_at_once_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("idem.toml");
    std::fs::write(&cfg, "[database]\npath = \"new.db\"\n").unwrap();
    let c = cfg.to_str().unwrap();
    let publishers: Vec<_> = (0..8)
        .map(|i| {
            Command::new(env!("CARGO_BIN_EXE_idem"))
                .args(["publish", "--config", c, "--handler", "grant-credits", "--id", &format!("m{i}")])
                .args(["--payload", r#"{"user":"u","balance":1}"#])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run idem")
        })
        .collect();
    for p in publishers {
        let out = p.wait_with_output().expect("idem publish ends");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let (ok, out, err) = idem(&["stats", "--config", c, "--json"]);
    assert!(ok, "{err}");
    let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(stats["pending"], 8);
}

/// The demo, as `cargo xtask demo -- --json` runs it, at a smaller size.
#[test]
fn demo_json_reports_no_double_effect_and_nothing_lost() {
    demo_checks("rust");
}

/// The demo with every example plugin in Python: the same checks.
#[test]
fn demo_in_python_reports_no_double_effect_and_nothing_lost() {
    demo_checks("python");
}

/// The demo with every example plugin in JavaScript: the same checks.
#[test]
fn demo_in_javascript_reports_no_double_effect_and_nothing_lost() {
    demo_checks("js");
}

fn demo_checks(lang: &str) {
    let dir = plugin_dir();
    let (ok, out, err) = idem(&[
        "demo",
        "--messages",
        "300",
        "--json",
        "--lang",
        lang,
        "--plugins",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{lang}: {out}{err}");
    let last = out.lines().last().expect("output");
    let r: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(r["messages"], 300);
    assert_eq!(r["double_effects"], 0, "{lang}: {r}");
    assert_eq!(r["calls_after_journal"], 0, "{lang}: {r}");
    // A step is sent again only by an execution fenced out between its
    // answer and its journal write (its lease lapsed).
    assert!(
        r["resent_steps"].as_u64().unwrap() <= r["fenced_out"].as_u64().unwrap(),
        "{lang}: {r}"
    );
    assert_eq!(r["lost"], 0, "{lang}: {r}");
    assert_eq!(r["missing_effects"], 0, "{lang}: {r}");
    assert_eq!(r["effects"], r["expected_effects"], "{lang}: {r}");
    assert_eq!(r["effects"], 299, "{lang}: {r}");
    assert_eq!(r["dead_lettered"], 1, "{lang}: the poison message: {r}");
    for field in [
        "duplicates_suppressed",
        "busy_redeliveries",
        "retries",
        "crashes",
        "journal_replays",
    ] {
        assert!(r[field].as_u64().unwrap() > 0, "{lang}: {field} happened: {r}");
    }
    assert!(out.contains("OK: every message settled once"), "{lang}: {out}");
}

/// `idem bench` at a tiny size (throughput numbers are for
/// docs/BENCHMARKS.md, not tests): both handlers run, every message is
/// counted, the figures and the JSON report are well formed.
#[test]
fn bench_reports_both_handlers_side_by_side() {
    let dir = plugin_dir();
    let (ok, out, err) = idem(&[
        "bench",
        "--scenario",
        "a",
        "--messages",
        "300",
        "--runs",
        "2",
        "--latency-messages",
        "50",
        "--json",
        "--plugins",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{out}{err}");
    let r: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).expect("the last line is JSON");
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "2 runs x (wasm, native), alternating: {r}");
    let handlers: Vec<&str> = runs.iter().map(|x| x["handler"].as_str().unwrap()).collect();
    assert_eq!(handlers, ["wasm", "native", "wasm", "native"]);
    for run in runs {
        assert_eq!(run["messages"], 300);
        assert!(run["rate"].as_f64().unwrap() > 0.0, "{run}");
        assert!(run["p99_ms"].as_f64().unwrap() >= run["p50_ms"].as_f64().unwrap(), "{run}");
        assert!(run["p50_ms"].as_f64().unwrap() > 0.0, "the paced phase measured latency: {run}");
        assert!(run["cpu_s_per_1k"].as_f64().unwrap() > 0.0, "{run}");
        assert!(run["peak_rss_mib"].as_f64().unwrap() > 1.0, "{run}");
    }
    let summary = r["summary"].as_array().unwrap();
    let wasm = summary.iter().find(|s| s["handler"] == "wasm").unwrap();
    let native = summary.iter().find(|s| s["handler"] == "native").unwrap();
    let ratio = wasm["wasm_over_native"].as_f64().unwrap();
    assert!(
        (ratio - wasm["rate"].as_f64().unwrap() / native["rate"].as_f64().unwrap()).abs() < 1e-9,
        "{r}"
    );
    assert!(out.contains("component / native"), "the table is printed: {out}");
}

/// `idem bench --scenario g` runs the pool beside its two Redis loops, the
/// bare one and the one claiming and confirming each message, on as many
/// messages each (the claims loop checks every entry is claimed once and
/// confirmed by its holder), and leaves no claim of theirs behind.
#[test]
fn bench_g_runs_the_bare_loop_and_the_loop_with_claims() {
    use crate::common::services;
    let dir = plugin_dir();
    let (ok, out, err) = idem(&[
        "bench",
        "--scenario",
        "g",
        "--handler",
        "native",
        "--messages",
        "300",
        "--runs",
        "1",
        "--latency-messages",
        "0",
        "--json",
        "--plugins",
        dir.to_str().unwrap(),
        "--redis-url",
        &services::redis(),
        "--postgres-url",
        &services::postgres(),
    ]);
    assert!(ok, "{out}{err}");
    let r: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).expect("the last line is JSON");
    let runs = r["runs"].as_array().unwrap();
    let handlers: Vec<&str> = runs.iter().map(|x| x["handler"].as_str().unwrap()).collect();
    assert_eq!(handlers, ["native", "redis-loop", "redis-claims-loop"], "{r}");
    for run in runs {
        assert_eq!(run["messages"], 300, "{run}");
        assert!(run["rate"].as_f64().unwrap() > 0.0, "{run}");
    }
    let mut conn = redis::Client::open(services::redis()).unwrap().get_connection().unwrap();
    let left: Vec<String> = redis::cmd("KEYS").arg("idem_bench_*:loop-claim:*").query(&mut conn).unwrap();
    assert!(left.is_empty(), "the claims loop's claims are cleaned up: {} left", left.len());
}

/// `idem run` against servers that are not there, or that refuse the
/// credentials: it fails at start, naming the setting to fix.
#[test]
fn unreachable_servers_and_wrong_credentials_name_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = plugin_dir().join("grant_credits.wasm");
    let cases = [
        ("[broker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n", "broker.url"),
        ("[broker]\nkind = \"nats\"\nurl = \"nats://127.0.0.1:1\"\n", "broker.url"),
        ("[broker]\nkind = \"rabbitmq\"\nurl = \"amqp://guest:wrong@127.0.0.1:5672/%2f\"\n", "broker.url"),
        (
            "[claims]\nkind = \"postgres\"\nurl = \"postgres://postgres@127.0.0.1:5432/no_such_database\"\n[data]\nkind = \"postgres\"\nurl = \"postgres://postgres@127.0.0.1:5432/no_such_database\"\n",
            "claims.url",
        ),
        ("[claims]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n[data]\nkind = \"postgres\"\nurl = \"postgres://postgres@127.0.0.1:5432/test\"\n", "claims.url"),
        ("[claims]\nkind = \"postgres\"\nurl = \"postgres://postgres@127.0.0.1:5432/test\"\n", "data.kind"),
        ("[broker]\nkind = \"redis\"\n", "broker.url"),
        ("[broker]\nkind = \"rabbitmq\"\nurl = \"guest:wrong@127.0.0.1:5672\"\n", "broker.url"),
        ("[broker]\nkind = \"kafka\"\nurl = \"kafka://u:wrong@127.0.0.1:1\"\n", "broker.url"),
    ];
    for (i, (section, setting)) in cases.iter().enumerate() {
        let cfg = dir.path().join(format!("c{i}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "namespace = \"t_cli_{i}\"\n[database]\npath = \"c{i}.db\"\n{section}[plugins.grant-credits]\npath = \"{}\"\ncollections = [\"credits\"]\n",
                plugin.display()
            ),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let (ok, _, err) = idem(&["run", "--config", cfg.to_str().unwrap()]);
        assert!(!ok, "case {i} must fail: {section}");
        assert!(err.contains(setting), "case {i}: the error names {setting}: {err}");
        assert!(!err.contains("wrong@"), "case {i}: the password is not printed: {err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "case {i} fails fast");
    }
}

/// A pool starting on a database that does not exist yet while producers
/// publish to it, as a newcomer's first `idem run` and `idem publish` do:
/// every publish succeeds and every message is done.
#[test]
fn publishing_while_a_pool_creates_the_database_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[database]\npath = \"new.db\"\n[plugins.grant-credits]\npath = \"{}\"\ncollections = [\"credits\"]\n",
            plugin_dir().join("grant_credits.wasm").display()
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let spawn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run idem")
    };
    let log = dir.path().join("run.log");
    let mut run = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["run", "--config", c])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("run idem");
    let mut published = 0;
    for round in 0..3 {
        let publishers: Vec<_> = (0..8)
            .map(|i| {
                let id = format!("m{round}-{i}");
                spawn(&[
                    "publish",
                    "--config",
                    c,
                    "--handler",
                    "grant-credits",
                    "--id",
                    &id,
                    "--payload",
                    r#"{"user":"u","balance":1}"#,
                ])
            })
            .collect();
        for p in publishers {
            let out = p.wait_with_output().expect("idem publish ends");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            published += 1;
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let (ok, out, err) = idem(&["stats", "--config", c, "--json"]);
        assert!(ok, "{err}");
        let stats: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        if stats["done"] == published {
            assert_eq!(stats["dead_lettered"], 0, "{stats}");
            break;
        }
        if let Ok(Some(status)) = run.try_wait() {
            panic!("idem run exited ({status}): {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        assert!(std::time::Instant::now() < deadline, "not all done: {stats}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Command::new("kill").args(["-TERM", &run.id().to_string()]).status().unwrap();
    let status = run.wait().unwrap();
    assert!(status.success(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_built_against_the_first_world_still_runs_without_a_result() {
    let path = plugin_dir().join("legacy_grant_credits.wasm");
    let (ok, out, err) = idem(&["plugin", "check", path.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("idem:handler/store@0.1.0"), "{out}");
    assert!(
        out.contains("loads and exports `handle` (idem:handler@0.1.0, which returns no result)"),
        "{out}"
    );

    let mut env = Env::new().await;
    env.config
        .plugins
        .insert("legacy".into(), plugin("legacy_grant_credits.wasm", &["credits"], &[], None));
    let pool = env.start().await;
    let grants: Vec<_> = (0..5)
        .map(|i| {
            envelope(
                &format!("old-{i}"),
                "legacy",
                serde_json::json!({"user": format!("u{i}"), "balance": i}),
            )
        })
        .collect();
    pool.backends.broker.publish(&grants, std::time::Duration::ZERO).await.unwrap();
    drain(&pool).await;
    let mut credits = pool.backends.data.scan("credits").await.unwrap();
    credits.sort();
    assert_eq!(credits.len(), 5);
    assert_eq!(credits[3], ("u3".to_string(), b"3".to_vec()));
    assert_eq!(pool.backends.claims.results(&[("legacy", "old-3")]).await.unwrap(), vec![None]);
    assert_eq!(pool.counters.snapshot().done, 5);
    pool.stop().await.unwrap();
}

/// `idem plugin check --compile-cache DIR` (and `plugin build`, which runs
/// it) leaves the compiled component where a worker with the same
/// `worker.compile_cache_dir` finds it: the worker compiles it no second
/// time (an 18 MB Python component takes many seconds to compile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_check_leaves_the_compiled_component_for_the_worker() {
    use sha2::Digest;
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().join("compiled");
    let path = plugin_dir().join("poison.wasm");
    let digest = hex::encode(sha2::Sha256::digest(std::fs::read(&path).unwrap()));
    let entries = || -> Vec<String> {
        std::fs::read_dir(&dir)
            .map(|d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    };
    let (ok, out, err) = idem(&["plugin", "check", "--compile-cache", dir.to_str().unwrap(), path.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let after_check = entries();
    assert_eq!(after_check.len(), 1, "{after_check:?}");
    assert!(after_check[0].starts_with(&digest), "{after_check:?} is not named by {digest}");

    // A pool of the test deployment (every example plugin, its own limits)
    // on that directory compiles the others and reads poison's entry.
    let mut env = Env::new().await;
    env.config.worker.compile_cache_dir = Some(dir.clone());
    let pool = env.start().await;
    pool.stop().await.unwrap();
    let after_start = entries();
    let poison: Vec<_> = after_start.iter().filter(|e| e.starts_with(&digest)).collect();
    assert_eq!(poison, vec![&after_check[0]], "the pool compiled poison again: {after_start:?}");
    assert!(after_start.len() > 1, "the pool compiled nothing else: {after_start:?}");
}
