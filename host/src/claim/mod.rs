//! Claims, the effect journal and dead letters: the state that decides how
//! often and when a handler runs.
//!
//! A claim is taken per (plugin, idempotency key). It carries a lease (who
//! runs it, until when), a fence (a number that grows with each takeover),
//! an attempt count (incremented at claim time, so an execution whose worker
//! died still counts) and the payload hash (a key reused with a different
//! payload is a conflict). Every change after the claim names the fence it
//! expects; a stale fence changes nothing.

mod admin;
pub mod locking;
pub mod postgres;
pub mod redis;
mod redis_inspect;
mod sql_admin;
pub mod sqlite;
mod state;

use async_trait::async_trait;

pub use admin::{check_key_pointer, ClaimAdmin, ClaimCounts, ClaimInfo, DeadLetter, DeadLetterSummary, JournalStep, Swept};
pub use state::ClaimState;
pub(crate) use state::{decide, Decision, Stored};

/// A failure's text as every claim store keeps it (releases, dead
/// letters): a NUL (a handler's own text, an endpoint's error body, a
/// broker's refusal) escaped as `\0`. Postgres refuses a NUL in text, and
/// with it the release or dead letter, which would leave the claim running
/// until its lease ran out and lose the real reason; the other stores keep
/// the same text so a reason reads alike wherever it is stored.
pub(crate) fn storable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\\0"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// A claim held by one execution: what every guarded operation presents.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    /// Plugin name.
    pub plugin: String,
    /// Idempotency key.
    pub key: String,
    /// The fence this execution was given.
    pub fence: i64,
}

/// Ask for a claim on one delivery.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// Plugin name.
    pub plugin: &'a str,
    /// Idempotency key.
    pub key: &'a str,
    /// The producer's message id.
    pub msg_id: &'a str,
    /// [`crate::envelope::payload_hash`] of the payload.
    pub payload_hash: &'a str,
    /// Headers and payload, kept with a dead letter if the claim decides the
    /// message is dead (attempts exhausted, or conflicting payload).
    pub headers: &'a [(String, String)],
    /// The payload.
    pub payload: &'a [u8],
    /// Who runs it.
    pub owner: &'a str,
    /// Lease length in milliseconds.
    pub lease_ms: i64,
    /// Executions allowed before the message is dead-lettered.
    pub max_attempts: u32,
    /// Content hash of the plugin that will run it.
    pub plugin_version: &'a str,
}

/// What a claim request decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Run it, with this fence; `attempt` counts this execution.
    Acquired {
        /// The fence to present.
        fence: i64,
        /// 1 for the first execution.
        attempt: u32,
        /// Traps so far.
        traps: u32,
    },
    /// Already done: ack the delivery, do not run.
    Done,
    /// Already dead-lettered: ack the delivery, do not run.
    DeadLettered,
    /// Another execution holds a live lease, or a retry is not due yet:
    /// redeliver after `retry_after_ms`, do not ack.
    Busy {
        /// When it is worth trying again.
        retry_after_ms: i64,
    },
    /// The key was first seen with a different payload; this delivery was
    /// dead-lettered with that reason. Ack it.
    Conflict,
    /// The attempt limit was reached; the message was dead-lettered. Ack it.
    Exhausted {
        /// Attempts made.
        attempts: u32,
        /// The claim's fence once retired: above every fence handed out, so
        /// an execution still holding one is refused.
        fence: i64,
    },
}

/// A message to dead-letter.
#[derive(Debug, Clone)]
pub struct DeadLetterRequest<'a> {
    /// Plugin name (or the unknown handler name).
    pub plugin: &'a str,
    /// Idempotency key (the message id if none could be derived).
    pub key: &'a str,
    /// The producer's message id.
    pub msg_id: &'a str,
    /// Headers as delivered.
    pub headers: &'a [(String, String)],
    /// Payload as delivered.
    pub payload: &'a [u8],
    /// Why.
    pub reason: &'a str,
    /// The claim being ended, if the message was claimed. Without one the
    /// dead letter is recorded as-is (malformed input never claimed).
    pub fence: Option<i64>,
    /// Content hash of the plugin, if one was loaded.
    pub plugin_version: Option<&'a str>,
    /// For a message no claim retires (bad input), what identifies the
    /// delivered message ([`delivery_identity`] of it as delivered): the
    /// store records one dead letter per identity. `None` for a claimed
    /// message (its retired claim answers a redelivery) and for one
    /// without a message id, which nothing tells apart from another.
    pub delivery: Option<String>,
}

/// A hash of a message's plugin (or handler name), key, message id and
/// payload, as delivered (not as escaped for the record). Every claim
/// store records one dead letter per identity for the dead letters no
/// claim retires (bad input, a key reused with another payload), so a
/// message redelivered because its answer or ack failed after its dead
/// letter was recorded is not recorded again. (Redis's claim script
/// identifies a conflict with a hash of its own, over the payload's hash:
/// it never receives the payload's identity.)
pub fn delivery_identity(plugin: &str, key: &str, msg_id: &str, payload: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [plugin.as_bytes(), key.as_bytes(), msg_id.as_bytes(), payload] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    hex::encode(h.finalize())
}

/// A journaled external call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// SHA-256 (hex) of the request that was sent.
    pub request_hash: String,
    /// The response body.
    pub response: Vec<u8>,
}

/// Errors of the claim store itself (not of the guarded operations, which
/// answer with `false` when the fence is stale).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClaimError {
    /// The store could not be reached or failed: an outage (G8).
    #[error("claim store unavailable: {0}")]
    Unavailable(String),
    /// The store answered, refusing what it was given (a value it cannot
    /// hold, a limit of the statement): about the items, not an outage.
    #[error("claim store refused the request: {0}")]
    Rejected(String),
}

impl From<sqlx::Error> for ClaimError {
    fn from(e: sqlx::Error) -> Self {
        if refuses_the_data(&e) {
            ClaimError::Rejected(e.to_string())
        } else {
            ClaimError::Unavailable(e.to_string())
        }
    }
}

/// Is this an error about the statement's data rather than the server or
/// the connection? Postgres says so by SQLSTATE class: 22 (data exception:
/// a NUL in text, a bad encoding, a value out of range), 23 (integrity
/// constraint), 54 (program limit: an index row too large). Connection,
/// resource and operator classes (08, 53, 57, 58) and every non-database
/// error (I/O, pool timeout, TLS) are outages.
pub(crate) fn refuses_the_data(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d.code().is_some_and(|code| {
            let class = code.get(..2).unwrap_or_default();
            d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().is_some() && matches!(class, "22" | "23" | "54")
                // SQLite: TOOBIG, CONSTRAINT, MISMATCH, RANGE (primary codes).
                || d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
                    && code.parse::<i32>().is_ok_and(|n| matches!(n & 0xff, 18 | 19 | 20 | 25))
        }),
        _ => false,
    }
}

/// The claim store on the hot path: what a worker does to a message's
/// claim, its journal and its dead letter. Batch methods answer per item, in
/// order. What operators and tools ask of it is [`ClaimAdmin`].
#[async_trait]
pub trait ClaimStore: Send + Sync + 'static {
    /// Claim each delivery (one round trip for the batch).
    async fn claim(&self, requests: &[ClaimRequest<'_>], now: i64) -> Result<Vec<ClaimOutcome>, ClaimError>;
    /// Extend the leases of running claims; `false` where the fence is stale.
    async fn extend(&self, claims: &[ClaimRef], lease_ms: i64, now: i64) -> Result<Vec<bool>, ClaimError>;
    /// Mark claims done; `false` where the fence is stale (do not ack then).
    /// A claim already done with that fence is answered `true` and left as
    /// it is: only the holder of a fence confirms with it, so this is the
    /// same confirm repeated (after a commit whose answer was lost).
    async fn confirm(&self, claims: &[ClaimRef], now: i64) -> Result<Vec<bool>, ClaimError> {
        self.confirm_with_results(claims, &vec![None; claims.len()], now).await
    }
    /// [`ClaimStore::confirm`], storing with each claim its handler's
    /// result (`results[i]` for `claims[i]`), which duplicates answer with.
    async fn confirm_with_results(&self, claims: &[ClaimRef], results: &[Option<&[u8]>], now: i64) -> Result<Vec<bool>, ClaimError>;
    /// The results stored with done claims, per `(plugin, key)`; `None`
    /// where there is none (no claim, not done, or no result).
    async fn results(&self, keys: &[(&str, &str)]) -> Result<Vec<Option<Vec<u8>>>, ClaimError>;
    /// Give a claim back for a retry no earlier than `not_before`;
    /// `error` is kept as [`storable`] makes it.
    async fn release(&self, claim: &ClaimRef, not_before: i64, error: &str, trapped: bool, now: i64) -> Result<bool, ClaimError>;
    /// Record dead letters; for claimed messages, only if the fence is
    /// current (`false` otherwise, and nothing is recorded). A claim
    /// dead-lettered this way is retired: its fence grows by one. Each
    /// reason is kept as [`storable`] makes it.
    async fn dead_letter(&self, items: &[DeadLetterRequest<'_>], now: i64) -> Result<Vec<bool>, ClaimError>;
    /// The journaled response of a step, if any.
    async fn journal_get(&self, plugin: &str, key: &str, step: &str) -> Result<Option<JournalEntry>, ClaimError>;
    /// Whether `claim` is still current (read-only; a guard against sending
    /// an external call after a takeover, not a substitute for the fenced
    /// writes).
    async fn fence_holds(&self, claim: &ClaimRef) -> Result<bool, ClaimError>;
    /// Journal a step's response; `false` if the fence is stale (nothing
    /// written). A response already journaled for the step is kept.
    async fn journal_put(
        &self,
        claim: &ClaimRef,
        step: &str,
        request_hash: &str,
        response: &[u8],
        plugin_version: &str,
        now: i64,
    ) -> Result<bool, ClaimError>;
}
