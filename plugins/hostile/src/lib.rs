//! A handler that misbehaves on purpose, to show that the sandbox contains it.
//!
//! The payload's `mode` picks the attack: `loop` spins forever (stopped by
//! the CPU deadline), `memory` allocates until the memory limit, `recursion`
//! recurses without bound, `ungranted-collection` and `ungranted-endpoint`
//! use capabilities the plugin was not granted, `huge-log` floods the log,
//! `huge-stdout` floods standard output, `host-call-loop` calls the host
//! forever (stopped by the wall-clock timeout), `spin-and-call` works ~1 ms
//! between cheap denied host calls, forever (stopped by the CPU deadline),
//! `sleep` sleeps for a minute (the clock's timers are all due at once),
//! `probe` records what the sandbox shows of time, randomness, environment,
//! arguments and files (and asks to be retried once), `huge-result` returns a
//! 2 MiB error, `huge-value` stores 2 MiB, `injection` writes SQL-looking
//! collection names and keys, `residue` checks that nothing an earlier
//! message wrote to its memory is left and then dirties it, `nul-key` and
//! `nul-key-get` name a store key holding a NUL character, `call-echo`
//! calls the endpoint `echo` (granted only where a test configures it)
//! once, `call-bad-step` with a line break in the step, `call-loop` with a
//! new step each time until refused,
//! `write-flood` makes 500 upserts of 64 KiB each and returns; `ok`
//! writes one granted value.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_sdk::{effects, log, store, Message, Result};
use serde::Deserialize;

/// About a millisecond of work on the host this runs on.
fn work() {
    let mut x: u64 = 0;
    for i in 0..300_000u64 {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
}

/// What the sandbox lets a handler see; stored for the tests to read.
fn probe(msg: &Message) -> Result<()> {
    let wall_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(u128::MAX);
    let start = Instant::now();
    work();
    let monotonic_ns = start.elapsed().as_nanos();
    let mut secure = [0u8; 16];
    getrandom::fill(&mut secure).map_err(|e| idem_sdk::permanent(format!("getrandom: {e}")))?;
    let seeded_hash = std::collections::hash_map::RandomState::new().hash_one(42u64);
    let files: Vec<String> = ["/", ".", "/etc/passwd", "/proc/self/environ"]
        .into_iter()
        .filter(|p| std::fs::metadata(p).is_ok())
        .map(String::from)
        .collect();
    let seen = serde_json::json!({
        "wall_ns": wall_ns.to_string(),
        "monotonic_ns": monotonic_ns.to_string(),
        "secure_random": secure.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "seeded_hash": seeded_hash.to_string(),
        "env": std::env::vars().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "args": std::env::args().collect::<Vec<_>>(),
        "files": files,
    });
    store::collection("hostile").upsert(&format!("{}#{}", msg.key, msg.attempt), &seen)?;
    if msg.attempt == 1 {
        return Err(idem_sdk::transient("probe once more, to compare"));
    }
    Ok(())
}

/// A value in the data segment (part of the memory image) and 1 MiB of
/// zeroed memory after it: what an earlier message's instance could leave
/// behind if a pool slot were not reset.
static MARK: AtomicU32 = AtomicU32::new(0x1de4);
static SCRATCH: [AtomicU8; 1 << 20] = [const { AtomicU8::new(0) }; 1 << 20];

/// Finds the memory as built, then dirties every other page of it.
fn residue(msg: &Message) -> Result<()> {
    let mark = MARK.swap(0xdead, Relaxed);
    let dirty = SCRATCH.iter().step_by(4096).filter(|b| b.load(Relaxed) != 0).count();
    // Every other page: 128 separate runs of written pages, more than a
    // slot's reset collects from one scan of its memory, so the reset has
    // to go on scanning past them.
    SCRATCH.iter().step_by(2 * 4096).for_each(|b| b.store(0xab, Relaxed));
    if mark != 0x1de4 || dirty > 0 {
        return Err(idem_sdk::permanent(format!(
            "memory of an earlier message: mark {mark:#x}, {dirty} dirty pages"
        )));
    }
    store::collection("hostile").upsert(&msg.key, &"clean")?;
    Ok(())
}

#[derive(Deserialize)]
struct Attack {
    mode: String,
}

#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse(depth: u64, pad: &mut [u8; 256]) -> u64 {
    pad[(depth % 256) as usize] = depth as u8;
    let mut next = *pad;
    recurse(depth + 1, &mut next) + next[0] as u64
}

fn handle(msg: Message) -> Result<()> {
    let attack: Attack = msg.json()?;
    match attack.mode.as_str() {
        "loop" => {
            let mut x: u64 = 0;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        "memory" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        "recursion" => {
            let mut pad = [0u8; 256];
            std::hint::black_box(recurse(0, &mut pad));
            Ok(())
        }
        "ungranted-collection" => {
            store::collection("secrets").upsert("stolen", &"value")?;
            Ok(())
        }
        "ungranted-endpoint" => {
            let _: serde_json::Value = effects::call("exfiltrate", "send", &serde_json::json!({}))?;
            Ok(())
        }
        "host-call-loop" => loop {
            std::hint::black_box(store::collection("hostile").get_bytes("nothing")?);
        },
        "spin-and-call" => loop {
            work();
            let _denied = store::collection("secrets").get_bytes("anything");
        },
        "sleep" => {
            std::thread::sleep(Duration::from_secs(60));
            store::collection("hostile").upsert(&msg.key, &"woke")?;
            Ok(())
        }
        "probe" => probe(&msg),
        "residue" => residue(&msg),
        "huge-result" => Err(idem_sdk::permanent("r".repeat(2 << 20))),
        "huge-value" => {
            store::collection("hostile").upsert_bytes(&msg.key, &vec![7u8; 2 << 20])?;
            Ok(())
        }
        "injection" => {
            // A granted collection whose name and key are SQL: stored as text.
            let evil = "x'); DROP TABLE kv; --";
            store::collection(evil).upsert(evil, &"stored literally")?;
            Ok(())
        }
        "nul-key" => {
            store::collection("hostile").upsert("order\u{0}17", &"x")?;
            Ok(())
        }
        "nul-key-get" => {
            std::hint::black_box(store::collection("hostile").get_bytes("order\u{0}17")?);
            Ok(())
        }
        "call-echo" => {
            let _: serde_json::Value = effects::call("echo", "send", &serde_json::json!({ "key": msg.key }))?;
            Ok(())
        }
        "call-bad-step" => {
            let _: serde_json::Value = effects::call("echo", "send\nIdem-Plugin: other", &serde_json::json!({}))?;
            Ok(())
        }
        "call-loop" => {
            for i in 0u64.. {
                let _: serde_json::Value = effects::call("echo", &format!("step-{i}"), &serde_json::json!({}))?;
            }
            Ok(())
        }
        "write-flood" => {
            let value = vec![7u8; 64 << 10];
            for i in 0..500 {
                store::collection("hostile").upsert_bytes(&format!("{}-{i}", msg.key), &value)?;
            }
            Ok(())
        }
        "huge-log" => {
            let line = "x".repeat(64 * 1024);
            for _ in 0..10_000 {
                log::info(&line);
            }
            Ok(())
        }
        "huge-stdout" => {
            let line = "y".repeat(64 * 1024);
            for _ in 0..10_000 {
                println!("{line}");
            }
            Ok(())
        }
        _ => {
            store::collection("hostile").upsert(&msg.key, &"ok")?;
            Ok(())
        }
    }
}

idem_sdk::handler!(handle);
