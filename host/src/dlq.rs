//! Dead-letter tools: show, replay and purge, on every backend.
//!
//! A replay republishes the dead letter's message (same id, headers and
//! payload) and gives its claim a fresh start (no attempts counted). The
//! steps are ordered so that a crash loses nothing: the claim is revived,
//! the record released (the message, dead-lettered again, is recorded
//! again), the message published, and only then is the record deleted.
//! A crash in between leaves the record (released: the message, delivered
//! again as bad input, gets a second record rather than none), and
//! replaying it again publishes a second copy, which the claim answers as
//! a duplicate once the first is done. The claim keeps the payload hash,
//! so a replayed message whose key was reused with another payload is
//! still a conflict.

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::backend::Backends;
use crate::claim::DeadLetterSummary;
use crate::envelope::Envelope;

/// Which dead letters a replay or purge applies to.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// These ids (empty with `all`).
    pub ids: Vec<i64>,
    /// Every dead letter (of `plugin`, if set).
    pub all: bool,
    /// Only this plugin's dead letters.
    pub plugin: Option<String>,
    /// Only dead letters whose reason contains this text.
    pub reason: Option<String>,
    /// Only dead letters that died at or after this time (Unix ms).
    pub dead_since: Option<i64>,
    /// Ids no longer there are passed over, not an error: the console acts
    /// on the records its page listed, and some may be gone since
    /// (replayed, purged or swept).
    pub skip_missing: bool,
}

impl Selection {
    /// The dead letters selected, in brief (oldest first with `all`). Ids
    /// that do not exist are an error naming them, unless `skip_missing`.
    pub async fn resolve(&self, backends: &Backends) -> Result<Vec<DeadLetterSummary>> {
        if self.all != self.ids.is_empty() {
            bail!("name the dead letters by id, or pass --all (not both)");
        }
        let mut letters = Vec::new();
        if self.all {
            letters = backends.admin.dead_letter_summaries(i64::MAX).await?;
            letters.reverse(); // oldest first
        } else {
            let mut missing = Vec::new();
            for id in &self.ids {
                match backends.admin.dead_letter_get(*id).await? {
                    Some(d) => letters.push(d.summary),
                    None => missing.push(id.to_string()),
                }
            }
            if !missing.is_empty() && !self.skip_missing {
                bail!("no dead letter with id {}; `idem dlq list` shows the ids", missing.join(", "));
            }
        }
        letters.retain(|d| self.matches(d));
        Ok(letters)
    }

    /// Does `d` pass the selection's filters (plugin, reason, time)?
    pub fn matches(&self, d: &DeadLetterSummary) -> bool {
        self.plugin.as_ref().is_none_or(|p| &d.plugin == p)
            && self.reason.as_ref().is_none_or(|r| d.reason.contains(r.as_str()))
            && self.dead_since.is_none_or(|t| d.dead_at >= t)
    }
}

/// What one replayed dead letter became.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Replayed {
    /// The dead letter's id (now deleted).
    pub id: i64,
    /// Plugin.
    pub plugin: String,
    /// Idempotency key.
    pub key: String,
    /// Message id republished.
    pub msg_id: String,
    /// Whether a dead claim was revived (false: the message was never
    /// claimed, or its key is claimed by another message).
    pub claim_revived: bool,
}

/// A dead letter a replay kept, its message not publishable again.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Kept {
    /// The dead letter's id (the record stays).
    pub id: i64,
    /// Why its message is not published again.
    pub why: String,
}

/// What a replay did.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Replay {
    /// The dead letters republished (their records deleted).
    pub replayed: Vec<Replayed>,
    /// Those kept, untouched: their messages cannot be published again
    /// (see [`crate::broker::Broker::republishable`]).
    pub kept: Vec<Kept>,
}

/// Replay the selected dead letters. Each is read in full only as it is
/// replayed, so a replay of many holds one payload at a time; one gone
/// since the selection was made (replayed or purged by another hand, or
/// swept) is passed over, and one whose message the broker cannot publish
/// again is kept, untouched, with the reason.
pub async fn replay(backends: &Backends, selection: &Selection) -> Result<Replay> {
    let letters = selection.resolve(backends).await?;
    let mut out = Replay::default();
    for brief in letters {
        let Some(d) = backends
            .admin
            .dead_letter_get(brief.id)
            .await
            .with_context(|| format!("dead letter {}: cannot read it", brief.id))?
        else {
            continue;
        };
        let envelope = Envelope {
            id: d.msg_id.clone(),
            handler: d.plugin.clone(),
            headers: d.headers.clone(),
            payload: d.payload.clone(),
        };
        if let Err(why) = backends.broker.republishable(&envelope) {
            out.kept.push(Kept { id: d.id, why });
            continue;
        }
        let claim_revived = backends
            .admin
            .revive(
                &d.plugin,
                &d.key,
                &crate::envelope::payload_hash(&d.payload),
                backends.clock.now_ms(),
            )
            .await
            .with_context(|| format!("dead letter {}: cannot reset its claim", d.id))?;
        // Released first: the republished message, dead-lettered again
        // before this record is removed, gets a record of its own.
        backends
            .admin
            .dead_letter_release(d.id)
            .await
            .with_context(|| format!("dead letter {}: cannot release it for a new record", d.id))?;
        backends
            .broker
            .republish(&envelope)
            .await
            .with_context(|| format!("dead letter {}: cannot republish message {}", d.id, d.msg_id))?;
        backends.admin.dead_letter_remove(&[d.id]).await?;
        out.replayed.push(Replayed {
            id: d.id,
            plugin: d.summary.plugin,
            key: d.summary.key,
            msg_id: d.summary.msg_id,
            claim_revived,
        });
    }
    Ok(out)
}

/// Delete the selected dead letters; returns how many were deleted. Their
/// claims stay dead: a redelivery of the message is still acked unrun.
pub async fn purge(backends: &Backends, selection: &Selection) -> Result<u64> {
    let ids: Vec<i64> = selection.resolve(backends).await?.iter().map(|d| d.id).collect();
    Ok(backends.admin.dead_letter_remove(&ids).await?)
}
