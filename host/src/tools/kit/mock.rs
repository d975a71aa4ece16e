//! A local mock of the payment, inventory and email APIs.
//!
//! It behaves like a real idempotent API (Stripe-style): the first request
//! with an `Idempotency-Key` performs the effect and stores the response;
//! later requests with the same key get the stored response and perform
//! nothing. It counts everything, so a run can be checked exactly: requests
//! per key, and effects performed per business reference.
//!
//! Some references are made slow (to outlast the broker's visibility
//! timeout) or flaky (the first request answers 503), chosen by the caller.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::Notify;

use crate::claim::ClaimStore;

/// What the mock has seen.
#[derive(Debug, Default)]
pub struct MockState {
    /// Requests received per idempotency key.
    pub requests: HashMap<String, u32>,
    /// Requests without an idempotency key.
    pub unkeyed: u32,
    /// Stored responses per idempotency key.
    responses: HashMap<String, String>,
    /// Effects performed per (api, reference).
    pub performed: HashMap<(String, String), u32>,
    /// References whose first request is slow.
    pub slow: HashSet<String>,
    /// How long a slow request takes (settable while the mock runs).
    pub slow_for: Duration,
    /// References whose first requests fail with 503, and how many do.
    pub flaky: HashMap<String, u32>,
    /// `api/reference` pairs whose first request is held until
    /// [`Mock::release`] (for tests).
    pub held: HashSet<String>,
    /// When each request for a reference arrived.
    pub arrivals: HashMap<String, Vec<std::time::Instant>>,
    /// Requests for a (plugin, key, step) whose response Idem had already
    /// journaled: a journaled call must be replayed, never re-sent.
    pub after_journal: u32,
    /// Successful answers per (api, reference, step), whatever the key:
    /// more than one is a step sent again (the endpoint's key dedupe hid
    /// its effect, this does not hide the request).
    pub answered: HashMap<(String, String, String), u32>,
    seen_refs: HashMap<String, u32>,
    next_id: u64,
}

/// A running mock server.
#[derive(Clone)]
pub struct Mock {
    /// Its address.
    pub addr: SocketAddr,
    /// Its counts.
    pub state: Arc<Mutex<MockState>>,
    release: Arc<Notify>,
    arrived: Arc<Notify>,
    journal: Arc<Mutex<Option<Arc<dyn ClaimStore>>>>,
}

impl Mock {
    /// Start on an ephemeral port of 127.0.0.1.
    pub async fn start(slow_for: Duration) -> anyhow::Result<Mock> {
        Self::start_on("127.0.0.1:0", slow_for).await
    }

    /// Start on `addr` (`host:port`).
    pub async fn start_on(addr: &str, slow_for: Duration) -> anyhow::Result<Mock> {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!("cannot listen on {addr}: {e} (is another mock or service using the port? pick another with --listen)")
        })?;
        let addr = listener.local_addr()?;
        let mock = Mock {
            addr,
            state: Arc::new(Mutex::new(MockState {
                slow_for,
                ..MockState::default()
            })),
            release: Arc::new(Notify::new()),
            arrived: Arc::new(Notify::new()),
            journal: Arc::new(Mutex::new(None)),
        };
        let app = Router::new()
            .route("/counts", get(counts))
            .route("/{api}", post(handle))
            .with_state(mock.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(mock)
    }

    /// The URL of one API.
    pub fn url(&self, api: &str) -> String {
        format!("http://{}/{api}", self.addr)
    }

    /// Check every request against this journal (see [`MockState::after_journal`]).
    pub fn watch_journal(&self, claims: Arc<dyn ClaimStore>) {
        *self.journal.lock().expect("mock journal poisoned") = Some(claims);
    }

    /// Requests sent although their response was already journaled.
    pub fn calls_after_journal(&self) -> u64 {
        self.state.lock().expect("mock state poisoned").after_journal as u64
    }

    /// Let held requests answer.
    pub fn release(&self) {
        self.release.notify_waiters();
    }

    /// Wait until a held request has arrived.
    pub async fn wait_for_held(&self) {
        self.arrived.notified().await;
    }

    /// Total requests received.
    pub fn total_requests(&self) -> u64 {
        let s = self.state.lock().expect("mock state poisoned");
        s.requests.values().map(|&n| n as u64).sum::<u64>() + s.unkeyed as u64
    }

    /// Effects performed more than once for the same (api, reference).
    pub fn double_effects(&self) -> u64 {
        let s = self.state.lock().expect("mock state poisoned");
        s.performed.values().map(|&n| n.saturating_sub(1) as u64).sum()
    }

    /// Steps answered more than once for the same (api, reference, step):
    /// requests sent again, even where the key made them harmless.
    pub fn resent(&self) -> u64 {
        let s = self.state.lock().expect("mock state poisoned");
        s.answered.values().map(|&n| n.saturating_sub(1) as u64).sum()
    }

    /// Effects performed for one (api, reference).
    pub fn performed(&self, api: &str, reference: &str) -> u32 {
        let s = self.state.lock().expect("mock state poisoned");
        s.performed.get(&(api.to_string(), reference.to_string())).copied().unwrap_or(0)
    }

    /// Requests received with one idempotency key.
    pub fn requests_for(&self, key: &str) -> u32 {
        self.state
            .lock()
            .expect("mock state poisoned")
            .requests
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// What `GET /counts` answers.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Counts {
    /// Requests received, retries included.
    pub requests: u64,
    /// Effects performed (first request of each idempotency key).
    pub effects: u64,
    /// Effects performed more than once for the same (api, reference).
    pub double_effects: u64,
    /// Requests refused for carrying no `Idempotency-Key`.
    pub unkeyed: u64,
    /// Steps answered more than once for the same (api, reference, step),
    /// whatever their keys: requests sent again.
    pub resent: u64,
}

impl Mock {
    /// The counts `GET /counts` answers.
    pub fn counts(&self) -> Counts {
        let double_effects = self.double_effects();
        let resent = self.resent();
        let s = self.state.lock().expect("mock state poisoned");
        Counts {
            resent,
            requests: s.requests.values().map(|&n| n as u64).sum::<u64>() + s.unkeyed as u64,
            effects: s.performed.values().map(|&n| n as u64).sum(),
            double_effects,
            unkeyed: s.unkeyed as u64,
        }
    }
}

async fn counts(State(mock): State<Mock>) -> axum::Json<Counts> {
    axum::Json(mock.counts())
}

async fn handle(State(mock): State<Mock>, Path(api): Path<String>, headers: HeaderMap, body: String) -> Response {
    let key = headers.get("Idempotency-Key").and_then(|v| v.to_str().ok()).map(str::to_string);
    let reference = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("reference").and_then(|r| r.as_str()).map(str::to_string))
        .unwrap_or_default();
    let journal = mock.journal.lock().expect("mock journal poisoned").clone();
    if let Some(journal) = journal {
        let h = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        if let Ok(Some(_)) = journal
            .journal_get(&h("Idem-Plugin"), &h("Idem-Message-Key"), &h("Idem-Step"))
            .await
        {
            mock.state.lock().expect("mock state poisoned").after_journal += 1;
        }
    }
    let (slow, slow_for, flaky_now, held) = {
        let mut s = mock.state.lock().expect("mock state poisoned");
        match &key {
            Some(k) => *s.requests.entry(k.clone()).or_default() += 1,
            None => s.unkeyed += 1,
        }
        let pair = format!("{api}/{reference}");
        let seen = {
            let n = s.seen_refs.entry(pair.clone()).or_default();
            *n += 1;
            *n
        };
        s.arrivals.entry(reference.clone()).or_default().push(std::time::Instant::now());
        let failures = s.flaky.get(&reference).copied().unwrap_or(0);
        (
            s.slow.contains(&reference) && seen == 1,
            s.slow_for,
            seen <= failures,
            s.held.contains(&pair) && seen == 1,
        )
    };
    if held {
        let released = mock.release.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        mock.arrived.notify_one();
        released.await;
    }
    if slow {
        tokio::time::sleep(slow_for).await;
    }
    if flaky_now {
        return (StatusCode::SERVICE_UNAVAILABLE, "temporarily unavailable, retry").into_response();
    }
    let Some(key) = key else {
        return (StatusCode::BAD_REQUEST, "Idempotency-Key header required").into_response();
    };
    let step = headers
        .get("Idem-Step")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut s = mock.state.lock().expect("mock state poisoned");
    *s.answered.entry((api.clone(), reference.clone(), step)).or_default() += 1;
    if let Some(stored) = s.responses.get(&key) {
        return (StatusCode::OK, stored.clone()).into_response();
    }
    s.next_id += 1;
    let response = serde_json::json!({ "id": format!("{api}_{}", s.next_id), "reference": reference }).to_string();
    s.responses.insert(key, response.clone());
    *s.performed.entry((api, reference)).or_default() += 1;
    (StatusCode::OK, response).into_response()
}
