//! Runtime micro-benchmarks: what one message costs in the sandbox.
//!
//! * instantiate + call of the no-op component (a fresh instance per
//!   message, as the pool runs it), next to the same no-op as a native
//!   handler;
//! * the same with a 1 KiB and a 64 KiB payload (the copy into the guest);
//! * one store operation through the host interface (`store.get` on an
//!   in-memory store, so the figure is the host-call overhead, not a
//!   database's);
//! * instantiate + call of the no-op in Python and in JavaScript.
//!
//! Needs the plugins built: `cargo xtask plugins`, then
//! `cargo bench -p idem-host --bench runtime`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use idem_host::capabilities::Execution;
use idem_host::capabilities::{effects::Endpoints, Capabilities, Grants};
use idem_host::claim::ClaimRef;
use idem_host::config::Limits;
use idem_host::envelope::Envelope;
use idem_host::runtime::footprint::Footprint;
use idem_host::runtime::native::Noop;
use idem_host::runtime::{Outcome, Runtime, RuntimeOptions};
use idem_host::stats::Counters;
use idem_host::store::{DataError, DataStore, Inserted};

/// A store in a hash map: the benchmark measures the host call, not I/O.
#[derive(Default)]
struct MemoryStore(Mutex<HashMap<(String, String), Vec<u8>>>);

#[async_trait]
impl DataStore for MemoryStore {
    async fn insert_unique(&self, _: Option<&ClaimRef>, c: &str, k: &str, v: &[u8]) -> Result<Inserted, DataError> {
        let mut m = self.0.lock().unwrap();
        match m.get(&(c.to_string(), k.to_string())) {
            Some(old) => Ok(Inserted::Existed(old.clone())),
            None => {
                m.insert((c.to_string(), k.to_string()), v.to_vec());
                Ok(Inserted::Inserted)
            }
        }
    }
    async fn upsert(&self, _: Option<&ClaimRef>, c: &str, k: &str, v: &[u8]) -> Result<(), DataError> {
        self.0.lock().unwrap().insert((c.to_string(), k.to_string()), v.to_vec());
        Ok(())
    }
    async fn get(&self, c: &str, k: &str) -> Result<Option<Vec<u8>>, DataError> {
        Ok(self.0.lock().unwrap().get(&(c.to_string(), k.to_string())).cloned())
    }
    async fn delete(&self, _: Option<&ClaimRef>, c: &str, k: &str) -> Result<bool, DataError> {
        Ok(self.0.lock().unwrap().remove(&(c.to_string(), k.to_string())).is_some())
    }
    async fn scan(&self, _: &str) -> Result<Vec<(String, Vec<u8>)>, DataError> {
        Ok(Vec::new())
    }
}

fn plugin_dir() -> PathBuf {
    std::env::var_os("IDEM_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugins/wasm32-wasip2/plugin"))
}

fn execution(payload: Vec<u8>, headers: Vec<(String, String)>) -> Execution {
    Execution {
        envelope: Arc::new(Envelope {
            id: "m-1".into(),
            handler: "noop".into(),
            headers,
            payload,
        }),
        key: "m-1".into(),
        attempt: 1,
        claim: None,
        interrupt: Arc::new(AtomicBool::new(false)),
        writes: Default::default(),
    }
}

fn runtime_benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (runtime, caps, wasm, native) = rt.block_on(async {
        let runtime = Arc::new(Runtime::new(RuntimeOptions::default()).unwrap());
        let claims_pool = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", dir.path().join("b.db").display()))
            .await
            .unwrap();
        let caps = Arc::new(Capabilities {
            data: Arc::new(MemoryStore::default()),
            claims: Arc::new(idem_host::claim::sqlite::SqliteClaims::new(claims_pool)),
            effects: Endpoints::new("bench", Default::default()).unwrap(),
            counters: Arc::new(Counters::default()),
            hooks: Default::default(),
        });
        let grants = Grants::new(["bench"], Vec::<&str>::new());
        let wasm = runtime
            .load_file("noop", &plugin_dir().join("noop.wasm"), grants.clone(), Limits::default(), None)
            .await
            .expect("noop.wasm: run `cargo xtask plugins` first");
        let native = runtime.install_native("native-noop", Arc::new(Noop), grants, Limits::default());
        (runtime, caps, wasm, native)
    });

    let mut group = c.benchmark_group("instantiate_and_call");
    for (name, plugin) in [("noop_component", &wasm), ("noop_native", &native)] {
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let out = runtime.execute(&caps, plugin, execution(Vec::new(), Vec::new())).await;
                assert!(matches!(out, Outcome::Done(_)), "{out:?}");
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("call_with_payload");
    for size in [1024usize, 64 * 1024] {
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(format!("{} KiB", size / 1024)), &size, |b, &size| {
            let payload = vec![b'x'; size];
            b.to_async(&rt).iter(|| async {
                let out = runtime.execute(&caps, &wasm, execution(payload.clone(), Vec::new())).await;
                assert!(matches!(out, Outcome::Done(_)), "{out:?}");
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("host_call");
    group.bench_function("noop_plus_one_store_get", |b| {
        let headers = vec![("op".to_string(), "get".to_string())];
        b.to_async(&rt).iter(|| async {
            let out = runtime.execute(&caps, &wasm, execution(Vec::new(), headers.clone())).await;
            assert!(matches!(out, Outcome::Done(_)), "{out:?}");
        })
    });
    group.finish();
    drop((runtime, wasm, native));

    // The no-op in Python and JavaScript: a pool sized for their footprint,
    // the compiled component loaded once, a fresh instance per call.
    let guests: Vec<(&str, PathBuf)> = [("noop_python", "noop_py.wasm"), ("noop_javascript", "noop_js.wasm")]
        .into_iter()
        .map(|(name, file)| (name, plugin_dir().join(file)))
        .collect();
    let per_instance = guests
        .iter()
        .map(|(_, path)| Footprint::of(&std::fs::read(path).expect("guest noop: run `cargo xtask plugins` first")).unwrap())
        .fold(Footprint::SMALL, Footprint::max);
    let runtime = Arc::new(
        Runtime::new(RuntimeOptions {
            max_instances: 16,
            per_instance,
            ..Default::default()
        })
        .unwrap(),
    );
    let mut group = c.benchmark_group("instantiate_and_call");
    for (name, path) in &guests {
        let plugin = rt
            .block_on(runtime.load_file(name, path, Grants::new(["bench"], Vec::<&str>::new()), Limits::default(), None))
            .unwrap();
        group.bench_function(*name, |b| {
            b.to_async(&rt).iter(|| async {
                let out = runtime.execute(&caps, &plugin, execution(Vec::new(), Vec::new())).await;
                assert!(matches!(out, Outcome::Done(_)), "{out:?}");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, runtime_benches);
criterion_main!(benches);
