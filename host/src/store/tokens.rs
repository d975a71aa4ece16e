//! Fencing tokens: claims in one system (Redis), data in another
//! (Postgres). The data store cannot read the claim in the write's
//! transaction, so it keeps the highest fence it was told of per claim and
//! accepts a write only with that fence. [`TokenFenced`] tells it of every
//! fence the claim store hands out on a takeover and of every claim it
//! retires (dead-lettered, attempts exhausted), so the rule is the one the
//! claim-row stores enforce: a write is accepted only from the current
//! holder of a running claim.

use std::sync::Arc;

use async_trait::async_trait;

use super::{DataError, DataStore};
use crate::claim::{ClaimError, ClaimOutcome, ClaimRef, ClaimRequest, ClaimStore, DeadLetterRequest, JournalEntry};

/// A claim store whose fence changes reach a token-fenced data store.
pub struct TokenFenced {
    claims: Arc<dyn ClaimStore>,
    data: Arc<dyn DataStore>,
}

impl TokenFenced {
    /// Tell `data` of every fence change `claims` makes.
    pub fn new(claims: Arc<dyn ClaimStore>, data: Arc<dyn DataStore>) -> Self {
        TokenFenced { claims, data }
    }

    /// Raise the data store's token for `plugin`/`key` to `fence`.
    async fn advance(&self, plugin: &str, key: &str, fence: i64) -> Result<(), ClaimError> {
        let claim = ClaimRef {
            plugin: plugin.to_string(),
            key: key.to_string(),
            fence,
        };
        match self.data.advance_fence(&claim).await {
            Ok(()) => Ok(()),
            // The data store saw a higher fence than the claim store now hands
            // out: the claim store lost claims (a Redis restart without
            // persistence). The execution's writes will be refused and the
            // message redelivered with the next fence; say why.
            Err(DataError::FenceLost { .. }) => {
                tracing::error!(plugin, key, fence, "the data store has seen a higher fence for this claim than the claim store handed out: the claim store lost claims (run Redis with persistence, appendfsync everysec or always); writes under this fence are refused");
                Ok(())
            }
            Err(DataError::Unavailable(m)) => Err(ClaimError::Unavailable(format!(
                "cannot raise the fencing token in the data store: {m}"
            ))),
        }
    }
}

#[async_trait]
impl ClaimStore for TokenFenced {
    async fn claim(&self, requests: &[ClaimRequest<'_>], now: i64) -> Result<Vec<ClaimOutcome>, ClaimError> {
        let out = self.claims.claim(requests, now).await?;
        for (r, outcome) in requests.iter().zip(&out) {
            match *outcome {
                // A takeover: refuse the previous holder before the new one runs.
                ClaimOutcome::Acquired { fence, .. } if fence > 1 => self.advance(r.plugin, r.key, fence).await?,
                // Retired: refuse the holder whose lease ran out.
                ClaimOutcome::Exhausted { fence, .. } => self.advance(r.plugin, r.key, fence).await?,
                _ => {}
            }
        }
        Ok(out)
    }

    async fn extend(&self, claims: &[ClaimRef], lease_ms: i64, now: i64) -> Result<Vec<bool>, ClaimError> {
        self.claims.extend(claims, lease_ms, now).await
    }

    async fn confirm_with_results(&self, claims: &[ClaimRef], results: &[Option<&[u8]>], now: i64) -> Result<Vec<bool>, ClaimError> {
        self.claims.confirm_with_results(claims, results, now).await
    }

    async fn results(&self, keys: &[(&str, &str)]) -> Result<Vec<Option<Vec<u8>>>, ClaimError> {
        self.claims.results(keys).await
    }

    async fn release(&self, claim: &ClaimRef, not_before: i64, error: &str, trapped: bool, now: i64) -> Result<bool, ClaimError> {
        self.claims.release(claim, not_before, error, trapped, now).await
    }

    async fn dead_letter(&self, items: &[DeadLetterRequest<'_>], now: i64) -> Result<Vec<bool>, ClaimError> {
        let out = self.claims.dead_letter(items, now).await?;
        for (d, recorded) in items.iter().zip(&out) {
            if let (true, Some(fence)) = (*recorded, d.fence) {
                self.advance(d.plugin, d.key, fence + 1).await?;
            }
        }
        Ok(out)
    }

    async fn journal_get(&self, plugin: &str, key: &str, step: &str) -> Result<Option<JournalEntry>, ClaimError> {
        self.claims.journal_get(plugin, key, step).await
    }

    async fn fence_holds(&self, claim: &ClaimRef) -> Result<bool, ClaimError> {
        self.claims.fence_holds(claim).await
    }

    async fn journal_put(
        &self,
        claim: &ClaimRef,
        step: &str,
        request_hash: &str,
        response: &[u8],
        plugin_version: &str,
        now: i64,
    ) -> Result<bool, ClaimError> {
        self.claims
            .journal_put(claim, step, request_hash, response, plugin_version, now)
            .await
    }
}
