//! Keyed external calls: journaled per (plugin, message key, step).

use std::collections::BTreeMap;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{ExecutionCaps, HostAbort};
use crate::bindings::idem::handler::effects::{self as wit_effects, CallError};
use crate::config::EndpointConfig;
use crate::envelope::idempotency_key;
use crate::stats::Counters;

/// The header every attempt of a step carries, with the same value.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// Most external calls one execution may make (journal replays
/// included): each step's answer is kept in the journal with the message.
pub const MAX_CALLS: u32 = 256;

/// How much of an error response's body is read, to show in the error.
const ERROR_TEXT_BYTES: usize = 512;

/// The first `cap` bytes of `response`'s body (fewer if it is shorter),
/// read chunk by chunk: an endless or huge body costs no more memory.
async fn read_at_most(mut response: reqwest::Response, cap: usize) -> reqwest::Result<Vec<u8>> {
    let mut body = Vec::new();
    while body.len() < cap {
        let Some(chunk) = response.chunk().await? else { break };
        body.extend_from_slice(&chunk[..chunk.len().min(cap - body.len())]);
    }
    Ok(body)
}

/// Configured endpoints and one HTTP client (connections are reused).
#[derive(Clone)]
pub struct Endpoints {
    /// The deployment's namespace, part of every `Idempotency-Key`.
    namespace: String,
    endpoints: BTreeMap<String, EndpointConfig>,
    client: reqwest::Client,
}

impl Endpoints {
    /// Endpoints by name, for the deployment `namespace`.
    pub fn new(namespace: &str, endpoints: BTreeMap<String, EndpointConfig>) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            // A redirect would send the guest's request, with its
            // Idempotency-Key, to an address no one configured, and
            // journal that address's answer: not followed.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| anyhow::anyhow!("cannot create the HTTP client for effects: {e}"))?;
        Ok(Endpoints {
            namespace: namespace.to_string(),
            endpoints,
            client,
        })
    }

    /// Look up one endpoint.
    pub fn get(&self, name: &str) -> Option<&EndpointConfig> {
        self.endpoints.get(name)
    }
}

impl wit_effects::Host for ExecutionCaps {
    async fn call(&mut self, endpoint: String, step: String, request: Vec<u8>) -> wasmtime::Result<Result<Vec<u8>, CallError>> {
        self.enter_host()?;
        let result = call(self, endpoint, step, request).await;
        self.leave_host();
        Ok(result?)
    }
}

/// The host side of `effects.call`: the guest-visible answer, or why the
/// host stops the execution.
async fn call(
    state: &mut ExecutionCaps,
    endpoint: String,
    step: String,
    request: Vec<u8>,
) -> Result<Result<Vec<u8>, CallError>, HostAbort> {
    let plugin = state.plugin.clone();
    if !plugin.grants.endpoints.contains(&endpoint) {
        return Ok(Err(CallError::AccessDenied(format!(
            "plugin {} may not call endpoint {endpoint:?}; grant it in plugins.{}.endpoints",
            plugin.name, plugin.name
        ))));
    }
    if step.is_empty() || step.len() > 128 {
        return Ok(Err(CallError::Permanent(format!(
            "step name must be 1 to 128 bytes, got {} bytes",
            step.len()
        ))));
    }
    if let Some(c) = step.chars().find(|c| c.is_control()) {
        return Ok(Err(CallError::Permanent(format!(
            "step name {:?} contains the control character U+{:04X}; a step is printable text (it is sent as the Idem-Step header and journaled)",
            crate::envelope::printable(&step, 64),
            c as u32
        ))));
    }
    if request.len() > plugin.limits.max_value_bytes {
        return Ok(Err(CallError::Permanent(format!(
            "request of {} bytes exceeds limits.max_value_bytes = {}",
            request.len(),
            plugin.limits.max_value_bytes
        ))));
    }
    // Every call that gets this far is counted, replayed or sent.
    state.calls += 1;
    if state.calls > MAX_CALLS {
        return Ok(Err(CallError::Permanent(format!(
            "more than {MAX_CALLS} external calls in one execution; each is journaled with the message, so a handler makes a bounded number (split the work into several messages)"
        ))));
    }
    // What the handler wrote before the call is committed before the
    // endpoint can see its effects, as when every write committed before
    // the handler went on.
    state.after_all_queued().await?;
    let caps = state.shared.clone();
    let key = state.exec.key.clone();

    let request_hash = hex::encode(Sha256::digest(&request));

    // A journaled response is replayed: the endpoint is not called again.
    match caps.claims.journal_get(&plugin.name, &key, &step).await {
        Ok(Some(entry)) if entry.request_hash == request_hash => {
            Counters::inc(&caps.counters.journal_replays);
            tracing::debug!(plugin = %plugin.name, %key, %step, "replaying journaled response");
            return Ok(Ok(entry.response));
        }
        Ok(Some(_)) => {
            return Ok(Err(CallError::Permanent(format!(
                "step {step:?} of message key {key:?} was journaled for a different request; a step name must stand for one request on every attempt (derive the request from the payload only, or use a new step name)"
            ))))
        }
        Ok(None) => {}
        Err(e) => return Ok(Err(CallError::Transient(format!("journal unavailable: {e}")))),
    }
    // Do not send for an execution that has already lost its claim.
    if let Some(claim) = state.exec.claim.clone() {
        match caps.claims.fence_holds(&claim).await {
            Ok(true) => {}
            Ok(false) => {
                Counters::inc(&caps.counters.fence_rejections);
                return Err(state.stop(HostAbort::FenceLost));
            }
            Err(e) => return Ok(Err(CallError::Transient(format!("claim store unavailable: {e}")))),
        }
    }

    let Some(config) = caps.effects.get(&endpoint) else {
        return Ok(Err(CallError::AccessDenied(format!(
            "endpoint {endpoint:?} is not configured; add [endpoints.{endpoint}] with its url"
        ))));
    };
    let idem_key = idempotency_key(&caps.effects.namespace, &endpoint, &plugin.name, &key, &step);
    Counters::inc(&caps.counters.external_calls);
    let sent = caps
        .effects
        .client
        .post(&config.url)
        .timeout(Duration::from_millis(config.timeout_ms))
        .header(IDEMPOTENCY_KEY_HEADER, &idem_key)
        .header("Idem-Plugin", &plugin.name)
        .header("Idem-Message-Key", &key)
        .header("Idem-Step", &step)
        .header("Content-Type", "application/json")
        .body(request)
        .send()
        .await;
    let response = match sent {
        Ok(r) => r,
        Err(e) => return Ok(Err(CallError::Transient(format!("{endpoint}: {e}")))),
    };
    let status = response.status();
    if status.is_redirection() {
        return Ok(Err(CallError::Permanent(format!(
            "{endpoint} answered {status}: redirects are not followed; set endpoints.{endpoint}.url to the address that answers"
        ))));
    }
    let limit = plugin.limits.max_value_bytes;
    // Read no more than can be used: the start of an error's text, or a
    // response up to the limit (one byte more tells it is over).
    let cap = if status.is_success() {
        limit.saturating_add(1)
    } else {
        ERROR_TEXT_BYTES
    };
    let body = match read_at_most(response, cap).await {
        Ok(b) => b,
        Err(e) => return Ok(Err(CallError::Transient(format!("{endpoint}: reading the response failed: {e}")))),
    };
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body).into_owned();
        let retryable = status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 || status.as_u16() == 409;
        let message = format!("{endpoint} answered {status}: {text}");
        return Ok(Err(if retryable {
            CallError::Transient(message)
        } else {
            CallError::Permanent(message)
        }));
    }
    if body.len() > limit {
        return Ok(Err(CallError::Permanent(format!(
            "{endpoint} answered more than limits.max_value_bytes = {limit} bytes"
        ))));
    }

    // Journal before returning: a later attempt replays this response. A
    // stale fence means another worker owns the message now: stop here.
    let claim = match &state.exec.claim {
        Some(c) => c.clone(),
        None => return Ok(Ok(body)),
    };
    match caps
        .claims
        .journal_put(&claim, &step, &request_hash, &body, &plugin.version, crate::now_ms())
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            Counters::inc(&caps.counters.fence_rejections);
            tracing::warn!(plugin = %plugin.name, %key, %step, "journal write refused: fence is stale, interrupting the instance");
            return Err(state.stop(HostAbort::FenceLost));
        }
        Err(e) => {
            return Ok(Err(CallError::Transient(format!(
                "journal unavailable after {endpoint} answered: {e}"
            ))))
        }
    }
    if let Some(inject) = &caps.hooks.crash_after_step {
        if inject(&plugin.name, &key, state.exec.attempt, &step) {
            Counters::inc(&caps.counters.crashes);
            return Err(state.stop(HostAbort::SimulatedCrash));
        }
    }
    Ok(Ok(body))
}
