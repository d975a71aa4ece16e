//! Idem: run broker messages through sandboxed WebAssembly handlers, safely
//! under at-least-once delivery.
//!
//! A delivery becomes an [`envelope::Envelope`], is admitted by a claim
//! ([`claim::ClaimStore`]: lease, fence, attempt count), runs in the
//! [`runtime::Runtime`] (a wasmtime component with limits) whose only
//! effects go through [`capabilities`] (fenced store writes, journaled
//! external calls, logs), and is settled by the [`worker`]: confirm and ack,
//! retry later, or dead-letter and ack.

pub mod activity;
pub mod app;
pub mod backend;
pub mod bindings;
pub mod broker;
pub mod capabilities;
pub mod claim;
pub mod clock;
pub mod config;
pub mod console;
pub mod dlq;
pub use idem_wire::envelope;
pub mod hooks;
pub mod message_file;
pub mod observe;
pub mod plugin;
pub mod prefork;
pub mod reload;
pub mod retention;
pub mod runtime;
pub mod stats;
pub mod store;
pub mod text;
pub mod tools;
pub mod worker;

/// Milliseconds since the Unix epoch: the time unit of every stored
/// timestamp and lease.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
