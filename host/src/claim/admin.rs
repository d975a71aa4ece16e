//! What operators and tools ask of the claim store: states and counts,
//! the dead letters (list, read, remove, revive for a replay) and
//! readiness. Kept off the hot path's [`super::ClaimStore`].

use async_trait::async_trait;
use serde::Serialize;

use super::{ClaimError, ClaimState};

/// A dead letter as a list shows it: all but its headers and payload, so
/// listing many holds none of their payloads.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeadLetterSummary {
    /// Row id.
    pub id: i64,
    /// Plugin name.
    pub plugin: String,
    /// Idempotency key.
    pub key: String,
    /// Producer's message id.
    pub msg_id: String,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Executions made.
    pub attempts: u32,
    /// Content hash of the plugin.
    pub plugin_version: Option<String>,
    /// When the claim was first taken (ms).
    pub first_seen_at: i64,
    /// When it was dead-lettered (ms).
    pub dead_at: i64,
}

/// A dead-lettered message in full: its summary, headers and payload.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// What a list shows of it (serialized inline).
    #[serde(flatten)]
    pub summary: DeadLetterSummary,
    /// Headers as delivered.
    pub headers: Vec<(String, String)>,
    /// Payload as delivered (serialized lossily as text).
    #[serde(serialize_with = "lossy_text")]
    pub payload: Vec<u8>,
}

impl std::ops::Deref for DeadLetter {
    type Target = DeadLetterSummary;
    fn deref(&self) -> &DeadLetterSummary {
        &self.summary
    }
}

fn lossy_text<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(bytes))
}

/// Headers as stored with a dead letter (JSON); unreadable ones are dropped.
pub(crate) fn parse_headers(json: &str) -> Vec<(String, String)> {
    serde_json::from_str(json).unwrap_or_default()
}

impl ClaimCounts {
    /// Set the count of one state.
    pub fn set(&mut self, state: ClaimState, n: u64) {
        match state {
            ClaimState::Running => self.running = n,
            ClaimState::Retry => self.retry = n,
            ClaimState::Done => self.done = n,
            ClaimState::Dead => self.dead = n,
        }
    }
}

/// Counts by claim state.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ClaimCounts {
    /// Claims held by a running execution.
    pub running: u64,
    /// Claims waiting for a retry.
    pub retry: u64,
    /// Claims done.
    pub done: u64,
    /// Claims dead-lettered.
    pub dead: u64,
    /// Dead-letter rows (includes input that was never claimed).
    pub dead_letters: u64,
    /// Journaled external-call responses.
    pub journal: u64,
}

/// One claim in full, as the console's message pages show it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ClaimInfo {
    /// Plugin name.
    pub plugin: String,
    /// Idempotency key.
    pub key: String,
    /// The message id that took the claim.
    pub msg_id: String,
    /// Where it stands.
    pub state: ClaimState,
    /// The current fence.
    pub fence: i64,
    /// The worker running it (running claims).
    pub owner: Option<String>,
    /// When the running execution's lease ends (ms; 0 when not running).
    pub lease_until: i64,
    /// When a retry is due (ms; retry claims).
    pub not_before: i64,
    /// Executions started.
    pub attempts: u32,
    /// Executions that trapped.
    pub traps: u32,
    /// The last failure, if any.
    pub last_error: Option<String>,
    /// Content hash of the plugin that last ran it.
    pub plugin_version: Option<String>,
    /// When it was first taken (ms).
    pub created_at: i64,
    /// When it last changed (ms): for a running claim, when its execution
    /// started.
    pub updated_at: i64,
}

/// One journaled external call of a message.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct JournalStep {
    /// The step name the handler gave.
    pub step: String,
    /// SHA-256 of the request.
    pub request_hash: String,
    /// The response replayed to later executions (as text, lossily).
    #[serde(serialize_with = "lossy_text")]
    pub response: Vec<u8>,
    /// Content hash of the plugin that made the call (not kept by Redis).
    pub plugin_version: Option<String>,
    /// When it was journaled (ms; not kept by Redis).
    pub created_at: Option<i64>,
}

/// What one retention sweep removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// The settled claims removed (plugin, key), their journals with them.
    pub claims: Vec<(String, String)>,
    /// Dead-letter records removed.
    pub dead_letters: u64,
}

/// The claim store as `idem stats`, `idem dlq` and the HTTP endpoints see it.
#[async_trait]
pub trait ClaimAdmin: Send + Sync + 'static {
    /// Answer if the store is reachable (readiness).
    async fn ping(&self) -> Result<(), ClaimError>;
    /// The store's own clock, in ms since the Unix epoch: the one clock
    /// every worker measures leases with (see [`crate::clock`]). `None` for
    /// a store on the workers' own machine (SQLite), whose clock it shares.
    async fn clock_ms(&self) -> Result<Option<i64>, ClaimError>;
    /// The state of one claim, if any.
    async fn state(&self, plugin: &str, key: &str) -> Result<Option<ClaimState>, ClaimError>;
    /// Counts by state (on SQL stores, a count of every claim and journal
    /// row: not for each metrics scrape).
    async fn counts(&self) -> Result<ClaimCounts, ClaimError>;
    /// How many dead letters are kept (`/metrics`' `idem_dead_letters`).
    async fn dead_letter_count(&self) -> Result<u64, ClaimError>;
    /// Dead letters, newest first, in full (`idem dlq list --json`).
    async fn dead_letters(&self, limit: i64) -> Result<Vec<DeadLetter>, ClaimError>;
    /// Dead letters, newest first, without their headers and payloads: what
    /// the console's list and a replay or purge of `--all` read, however
    /// large the payloads.
    async fn dead_letter_summaries(&self, limit: i64) -> Result<Vec<DeadLetterSummary>, ClaimError>;
    /// One dead letter.
    async fn dead_letter_get(&self, id: i64) -> Result<Option<DeadLetter>, ClaimError>;
    /// Delete dead-letter records; returns how many existed. Their
    /// messages, dead-lettered again, are recorded again.
    async fn dead_letter_remove(&self, ids: &[i64]) -> Result<u64, ClaimError>;
    /// Keep a dead-letter record but let its message be recorded again if
    /// it is dead-lettered again. A replay calls it before it republishes
    /// the message, which may come back as bad as it left before the
    /// record is removed.
    async fn dead_letter_release(&self, id: i64) -> Result<(), ClaimError>;
    /// Give a dead claim a fresh start for a replay: state `retry`, no
    /// attempts or traps counted, due now; only if it is dead and was taken
    /// for this payload (`payload_hash`), so replaying a conflict's dead
    /// letter never revives the claim of the other message. `false`
    /// otherwise (done, running, never claimed, or another payload's).
    async fn revive(&self, plugin: &str, key: &str, payload_hash: &str, now: i64) -> Result<bool, ClaimError>;
    /// Retention: remove up to `limit` settled claims (done or dead) last
    /// changed before `settled_before`, with their journal entries, and up
    /// to `limit` dead letters that died before `dead_letters_before` (none
    /// when `None`). Running claims and claims waiting for a retry are never
    /// removed. A key removed here is a new key to the next delivery: the
    /// duplicate-detection window is the retention.
    async fn sweep(&self, settled_before: i64, dead_letters_before: Option<i64>, limit: u32) -> Result<Swept, ClaimError>;
    /// The key pointer recorded for `plugin` in this namespace (`""` = the
    /// message id), recording `pointer` if none is. Checked on every start
    /// and reload: a plugin's keys must not change while its messages are
    /// in flight.
    async fn key_pointer(&self, plugin: &str, pointer: &str, now: i64) -> Result<String, ClaimError>;
    /// One claim in full.
    async fn claim(&self, plugin: &str, key: &str) -> Result<Option<ClaimInfo>, ClaimError>;
    /// Claims in `state` (running or retry: the console's in-flight and
    /// retrying pages), of `plugin` if given, at most `limit`: running ones
    /// longest-running first, retries soonest-due first.
    async fn claims_in(&self, state: ClaimState, plugin: Option<&str>, limit: i64) -> Result<Vec<ClaimInfo>, ClaimError>;
    /// The journaled external calls of one message.
    async fn journal(&self, plugin: &str, key: &str) -> Result<Vec<JournalStep>, ClaimError>;
    /// Add a worker's counts to one minute of the namespace's activity
    /// (`minute`: ms at its start; `counts`: outcome and how many), and
    /// forget the minutes before `keep_since`.
    async fn activity_add(&self, minute: i64, counts: &[(&str, u64)], keep_since: i64) -> Result<(), ClaimError>;
    /// The activity of every minute from `since` on: (minute, outcome,
    /// count), oldest first.
    async fn activity(&self, since: i64) -> Result<Vec<(i64, String, u64)>, ClaimError>;
    /// Replace the recorded key pointer (`idem plugin rekey`, an operator's
    /// decision once nothing of the plugin is in flight).
    async fn set_key_pointer(&self, plugin: &str, pointer: &str, now: i64) -> Result<(), ClaimError>;
}

/// Check `plugin`'s key pointer against the one recorded for it in the
/// namespace's claim store (recording it the first time). Keys must be
/// derived the same way for as long as any of the plugin's messages may be
/// delivered: another pointer would give a redelivery another key, and a
/// message done under the old key would run again. Checked on every start
/// and reload; `idem plugin rekey` changes the record.
pub async fn check_key_pointer(admin: &dyn ClaimAdmin, plugin: &str, pointer: Option<&str>) -> anyhow::Result<()> {
    let ours = pointer.unwrap_or("");
    let recorded = admin
        .key_pointer(plugin, ours, crate::now_ms())
        .await
        .map_err(|e| anyhow::anyhow!("cannot check plugins.{plugin}.key_pointer against the claim store: {e}"))?;
    if recorded != ours {
        let shown = |p: &str| {
            if p.is_empty() {
                "unset (the message id)".to_string()
            } else {
                format!("{p:?}")
            }
        };
        anyhow::bail!(
            "plugins.{plugin}.key_pointer is {} but this namespace derives {plugin}'s keys with {}: a redelivery would get another key and run again. Put the recorded pointer back, or, once no message of {plugin} is queued or in flight, run `idem plugin rekey {plugin} --config FILE` to record the new one",
            shown(ours),
            shown(&recorded)
        );
    }
    Ok(())
}
