//! `idem verify`: check that a handler is idempotent before it ships.
//!
//! Every effect of a handler passes through Idem's capabilities, so Idem
//! can run a message the way at-least-once delivery will, and compare:
//!
//! * **twice in a row** on a scratch store: the first run's claim is
//!   released before it is confirmed (a worker that died after the
//!   effects), and a second run takes it over with the next attempt number.
//!   The second run must change no stored value, make no external call the
//!   first did not, and end the same way;
//! * **twice at once** on a second scratch store: two executions under one
//!   claim, as when the claim store is down and `outage_policy =
//!   run-unguarded` lets both run. Together they must leave what one run
//!   left and call nothing one run did not.
//!
//! External endpoints are replaced by a recording stub that answers every
//! request and remembers its Idempotency-Key. Messages run in input order,
//! each on top of what the previous ones left.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::backend::{self, Backends};
use crate::capabilities::Execution;
use crate::capabilities::{effects::Endpoints, Capabilities, Grants};
use crate::claim::{ClaimOutcome, ClaimRef, ClaimRequest};
use crate::config::{Config, EndpointConfig, PluginConfig, StoreKind};
use crate::envelope::{derive_key, payload_hash};
use crate::now_ms;
use crate::runtime::{Outcome, Plugin, Runtime};
use crate::stats::Counters;
use crate::tools::kit::Mock;

/// `idem verify`.
#[derive(clap::Args, Debug, Clone)]
pub struct VerifyArgs {
    /// A plugin name from the configuration, or a component file.
    pub plugin: String,
    /// Messages to try: a message file (JSON Lines, {"payload": ...} with
    /// optional "id", "handler" and "headers" as [["name", "value"]]), the
    /// format `idem publish --file` reads. Every line runs through this
    /// plugin.
    #[arg(long)]
    pub input: PathBuf,
    /// Configuration naming the plugin's grants, limits and key pointer.
    #[arg(long, short, env = "IDEM_CONFIG")]
    pub config: Option<PathBuf>,
    /// For a component file not in the configuration: a collection it may
    /// use (repeatable).
    #[arg(long = "collection")]
    pub collections: Vec<String>,
    /// For a component file not in the configuration: an endpoint it may
    /// call (repeatable; the stub answers for it).
    #[arg(long = "endpoint")]
    pub endpoints: Vec<String>,
    /// Print the report as JSON (last line).
    #[arg(long)]
    pub json: bool,
}

/// One message to try, as read from the input file.
#[derive(Debug, Clone)]
pub struct Input {
    /// Message id.
    pub id: String,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Payload.
    pub payload: Vec<u8>,
}

/// Something a repeated run did that one run did not.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Finding {
    /// The message id.
    pub msg_id: String,
    /// Its idempotency key.
    pub key: String,
    /// `second-run-changed-state`, `second-run-new-call`,
    /// `second-run-outcome`, `concurrent-state`, `concurrent-new-call` or
    /// `concurrent-outcome`.
    pub kind: String,
    /// What differed.
    pub detail: String,
}

/// What `idem verify` found.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// Plugin name.
    pub plugin: String,
    /// Its version (content hash).
    pub version: String,
    /// Messages tried.
    pub messages: usize,
    /// How each message's first run ended, in input order.
    pub runs: Vec<FirstRun>,
    /// Findings, in input order.
    pub findings: Vec<Finding>,
}

/// One message's first run: the reference the repeats are compared with.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FirstRun {
    /// The message id.
    pub msg_id: String,
    /// `ok`, or the error or trap.
    pub outcome: String,
    /// Stored values it changed.
    pub changed: usize,
    /// External calls it made.
    pub calls: usize,
}

/// The command: verify, print, exit 1 on a finding.
pub async fn main(args: VerifyArgs) -> Result<ExitCode> {
    let config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let (name, plugin_config) = resolve_plugin(&config, &args)?;
    let messages = read_input(&args.input, &name)?;
    let report = verify(&config, &name, &plugin_config, messages).await?;
    for f in &report.findings {
        println!("NOT IDEMPOTENT  message {} (key {}): {}: {}", f.msg_id, f.key, f.kind, f.detail);
    }
    println!(
        "{} {} ({} message(s), each run twice in a row and twice at once): {}",
        report.plugin,
        report.version,
        report.messages,
        if report.findings.is_empty() {
            "no difference found".to_string()
        } else {
            format!("{} finding(s)", report.findings.len())
        }
    );
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(if report.findings.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn resolve_plugin(config: &Config, args: &VerifyArgs) -> Result<(String, PluginConfig)> {
    if let Some(p) = config.plugins.get(&args.plugin) {
        return Ok((args.plugin.clone(), p.clone()));
    }
    let path = Path::new(&args.plugin);
    if !path.is_file() {
        bail!(
            "{:?} is neither a plugin of the configuration ({}) nor a component file",
            args.plugin,
            if config.plugins.is_empty() {
                "none configured; pass --config FILE".to_string()
            } else {
                config.plugins.keys().cloned().collect::<Vec<_>>().join(", ")
            }
        );
    }
    let canonical = path.canonicalize().ok();
    if let Some((name, p)) = config.plugins.iter().find(|(_, p)| p.path.canonicalize().ok() == canonical) {
        return Ok((name.clone(), p.clone()));
    }
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin").replace('_', "-");
    Ok((
        name,
        PluginConfig {
            path: path.to_path_buf(),
            collections: args.collections.clone(),
            endpoints: args.endpoints.clone(),
            key_pointer: None,
            celery_task: None,
            limits: None,
        },
    ))
}

/// The messages of a message file (see [`crate::message_file`]); the plugin
/// under test handles every line.
fn read_input(file: &Path, plugin: &str) -> Result<Vec<Input>> {
    Ok(crate::message_file::read(file, Some(plugin))?
        .into_iter()
        .map(|e| Input {
            id: e.id,
            headers: e.headers,
            payload: e.payload,
        })
        .collect())
}

/// A scratch store: its own SQLite file, claims and data together.
struct Scratch {
    backends: Backends,
    caps: Arc<Capabilities>,
}

impl Scratch {
    async fn open(dir: &Path, name: &str, base: &Config, endpoints: Endpoints) -> Result<Scratch> {
        let mut config = base.clone();
        config.broker = Default::default();
        config.claims.kind = StoreKind::Sqlite;
        config.data.kind = StoreKind::Sqlite;
        config.database.path = dir.join(format!("{name}.db"));
        let backends = backend::open(&config).await?;
        let caps = Arc::new(Capabilities {
            data: backends.data.clone(),
            claims: backends.claims.clone(),
            effects: endpoints,
            counters: Arc::new(Counters::default()),
            hooks: Default::default(),
        });
        Ok(Scratch { backends, caps })
    }

    /// Every value of the plugin's collections.
    async fn snapshot(&self, collections: &BTreeSet<String>) -> Result<BTreeMap<(String, String), Vec<u8>>> {
        let mut out = BTreeMap::new();
        for c in collections {
            for (k, v) in self.backends.data.scan(c).await? {
                out.insert((c.clone(), k), v);
            }
        }
        Ok(out)
    }

    async fn claim(&self, plugin: &Plugin, msg_id: &str, key: &str, payload: &[u8]) -> Result<(ClaimRef, u32)> {
        let hash = payload_hash(payload);
        let request = ClaimRequest {
            plugin: &plugin.name,
            key,
            msg_id,
            payload_hash: &hash,
            headers: &[],
            payload,
            owner: "idem-verify",
            lease_ms: 600_000,
            max_attempts: u32::MAX,
            plugin_version: &plugin.version,
        };
        match self.backends.claims.claim(&[request], now_ms()).await?.pop() {
            Some(ClaimOutcome::Acquired { fence, attempt, .. }) => Ok((
                ClaimRef {
                    plugin: plugin.name.clone(),
                    key: key.to_string(),
                    fence,
                },
                attempt,
            )),
            other => bail!(
                "message {msg_id}: the scratch claim store answered {other:?}; are two input lines sharing a key with different payloads?"
            ),
        }
    }
}

/// Run every message twice in a row and twice at once; report differences.
pub async fn verify(config: &Config, name: &str, p: &PluginConfig, messages: Vec<Input>) -> Result<VerifyReport> {
    let runtime = Arc::new(Runtime::new(crate::app::runtime_options(config))?);
    let grants = Grants::new(p.collections.iter().cloned(), p.endpoints.iter().cloned());
    let plugin = runtime
        .load_file(name, &p.path, grants, config.limits_for(name), p.key_pointer.clone())
        .await?;
    let stub = Mock::start(Duration::ZERO).await?;
    let endpoints = Endpoints::new(
        &config.namespace,
        p.endpoints
            .iter()
            .map(|e| {
                let timeout_ms = config.endpoints.get(e).map(|c| c.timeout_ms).unwrap_or(10_000);
                (
                    e.clone(),
                    EndpointConfig {
                        url: stub.url(e),
                        timeout_ms,
                    },
                )
            })
            .collect(),
    )?;
    let dir = tempfile::tempdir().context("cannot create a scratch directory")?;
    let seq = Scratch::open(dir.path(), "in-a-row", config, endpoints.clone()).await?;
    let conc = Scratch::open(dir.path(), "at-once", config, endpoints).await?;
    let collections = &plugin.grants.collections;
    let calls = || -> BTreeSet<String> { stub.state.lock().expect("stub state poisoned").requests.keys().cloned().collect() };

    let mut findings = Vec::new();
    let mut runs = Vec::new();
    let total = messages.len();
    for Input {
        id: msg_id,
        headers,
        payload,
    } in messages
    {
        let envelope = Arc::new(crate::envelope::Envelope {
            id: msg_id.clone(),
            handler: name.to_string(),
            headers,
            payload,
        });
        let key = derive_key(&envelope, plugin.key_pointer.as_deref()).map_err(|e| anyhow::anyhow!("message {msg_id}: {e}"))?;
        let mut find = |kind: &str, detail: String| {
            findings.push(Finding {
                msg_id: msg_id.clone(),
                key: key.clone(),
                kind: kind.to_string(),
                detail,
            })
        };
        let exec = |claim: &ClaimRef, attempt: u32| Execution {
            envelope: envelope.clone(),
            key: key.clone(),
            attempt,
            claim: Some(claim.clone()),
            interrupt: Arc::new(AtomicBool::new(false)),
            writes: Default::default(),
        };

        // Twice in a row: the first run's claim is released unconfirmed.
        let s0 = seq.snapshot(collections).await?;
        let c0 = calls();
        let (claim, attempt) = seq.claim(&plugin, &msg_id, &key, &envelope.payload).await?;
        let first = runtime.execute(&seq.caps, &plugin, exec(&claim, attempt)).await;
        let now = now_ms();
        seq.backends
            .claims
            .release(&claim, now, "idem verify: run it again", false, now)
            .await?;
        let s1 = seq.snapshot(collections).await?;
        let c1 = calls();
        let (claim, attempt) = seq.claim(&plugin, &msg_id, &key, &envelope.payload).await?;
        let second = runtime.execute(&seq.caps, &plugin, exec(&claim, attempt)).await;
        seq.backends.claims.confirm(&[claim], now_ms()).await?;
        let s2 = seq.snapshot(collections).await?;
        let c2 = calls();
        runs.push(FirstRun {
            msg_id: msg_id.clone(),
            outcome: describe(&first),
            changed: diff(&s0, &s1).len(),
            calls: c1.difference(&c0).count(),
        });
        let changed = diff(&s1, &s2);
        if !changed.is_empty() {
            find("second-run-changed-state", format!("the second run changed {}", changed.join("; ")));
        }
        let new_calls: Vec<&String> = c2.difference(&c1).collect();
        if !new_calls.is_empty() {
            find(
                "second-run-new-call",
                format!(
                    "the second run made external call(s) the first did not (Idempotency-Key {}); derive step names and requests from the payload only",
                    join(&new_calls)
                ),
            );
        }
        if first != second {
            find(
                "second-run-outcome",
                format!("the first run ended {}, the second {}", describe(&first), describe(&second)),
            );
        }

        // Twice at once, under one claim.
        let y0 = conc.snapshot(collections).await?;
        let (claim, attempt) = conc.claim(&plugin, &msg_id, &key, &envelope.payload).await?;
        let (a, b) = tokio::join!(
            runtime.execute(&conc.caps, &plugin, exec(&claim, attempt)),
            runtime.execute(&conc.caps, &plugin, exec(&claim, attempt + 1)),
        );
        conc.backends.claims.confirm(&[claim], now_ms()).await?;
        let y1 = conc.snapshot(collections).await?;
        let c3 = calls();
        let once = diff(&s0, &s1);
        let twice = diff(&y0, &y1);
        if once != twice {
            find(
                "concurrent-state",
                format!(
                    "one run changed [{}] but two runs at once changed [{}]",
                    once.join("; "),
                    twice.join("; ")
                ),
            );
        }
        let single: BTreeSet<String> = c1.difference(&c0).cloned().collect();
        let concurrent_new: Vec<&String> = c3.difference(&c2).filter(|k| !single.contains(*k)).collect();
        if !concurrent_new.is_empty() {
            find(
                "concurrent-new-call",
                format!(
                    "two runs at once made external call(s) one run did not (Idempotency-Key {})",
                    join(&concurrent_new)
                ),
            );
        }
        for (which, o) in [("one", &a), ("the other", &b)] {
            if &first != o {
                find(
                    "concurrent-outcome",
                    format!(
                        "run alone it ended {}; run twice at once, {which} ended {}",
                        describe(&first),
                        describe(o)
                    ),
                );
            }
        }
    }
    Ok(VerifyReport {
        plugin: name.to_string(),
        version: plugin.version.clone(),
        messages: total,
        runs,
        findings,
    })
}

fn join(keys: &[&String]) -> String {
    keys.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
}

/// Values that differ between two snapshots, as `collection/key: old → new`.
fn diff(before: &BTreeMap<(String, String), Vec<u8>>, after: &BTreeMap<(String, String), Vec<u8>>) -> Vec<String> {
    let keys: BTreeSet<&(String, String)> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| format!("{}/{}: {} → {}", k.0, k.1, show(before.get(k)), show(after.get(k))))
        .collect()
}

fn show(v: Option<&Vec<u8>>) -> String {
    match v {
        None => "(absent)".into(),
        Some(b) => {
            let text = String::from_utf8_lossy(b);
            if text.chars().count() > 60 {
                format!("{}…", text.chars().take(60).collect::<String>())
            } else {
                text.into_owned()
            }
        }
    }
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Done(None) => "ok".into(),
        Outcome::Done(Some(r)) => format!("ok, returning {}", crate::envelope::printable(&String::from_utf8_lossy(r), 200)),
        Outcome::Transient(m) => format!("with a transient error ({m})"),
        Outcome::Permanent(m) => format!("with a permanent error ({m})"),
        Outcome::Trapped(m) => format!("trapped ({m})"),
        Outcome::FenceLost => "with its claim lost".into(),
        Outcome::Crashed => "crashed".into(),
        Outcome::HostError(m) => format!("with a host error ({m})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_names_changed_added_and_removed_values() {
        let k = |c: &str, k: &str| (c.to_string(), k.to_string());
        let before = BTreeMap::from([(k("credits", "u-1"), b"250".to_vec()), (k("credits", "u-2"), b"1".to_vec())]);
        let after = BTreeMap::from([(k("credits", "u-1"), b"500".to_vec()), (k("credits", "u-3"), b"7".to_vec())]);
        assert_eq!(
            diff(&before, &after),
            vec![
                "credits/u-1: 250 → 500".to_string(),
                "credits/u-2: 1 → (absent)".to_string(),
                "credits/u-3: (absent) → 7".to_string(),
            ]
        );
        assert!(diff(&before, &before).is_empty());
    }
}
