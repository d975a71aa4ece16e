//! # idem-sdk: write Idem message handlers
//!
//! An Idem handler is a plain Rust function compiled to a WebAssembly
//! component. Idem delivers each broker message to it at least once — maybe
//! twice at the same moment — and makes that safe by giving the handler only
//! capabilities that are safe to repeat:
//!
//! * [`store`]: `insert_unique`, `upsert`, `get`, `delete` on named
//!   collections, each write committed only while this execution still owns
//!   the message's claim;
//! * [`effects::call`]: a keyed call to an external endpoint, sent with a
//!   stable `Idempotency-Key` and journaled, so a retry replays the response
//!   instead of calling again;
//! * [`log`]: structured log lines in the host's log.
//!
//! There is no increment, no clock and no network: shape the work as natural
//! keys and absolute assignments, and split multi-step work into keyed
//! [`effects::call`] steps so a retry resumes where the last attempt stopped.
//!
//! ## Example
//!
//! ```no_run
//! use idem_sdk::{effects, store, Message, Result};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Payment {
//!     payment_id: String,
//!     customer: String,
//!     amount_cents: u64,
//! }
//!
//! #[derive(Serialize)]
//! struct Charge<'a> {
//!     customer: &'a str,
//!     amount_cents: u64,
//! }
//!
//! fn handle(msg: Message) -> Result<()> {
//!     // A malformed payload is a permanent error: the message is
//!     // dead-lettered with the decode error as its reason.
//!     let payment: Payment = msg.json()?;
//!
//!     // The payment id is the natural key: a second execution finds the
//!     // row the first one wrote instead of writing another.
//!     store::collection("payments").insert_unique(&payment.payment_id, &payment)?;
//!
//!     // Sent with an Idempotency-Key derived from (message key, "charge");
//!     // once answered, later attempts get the journaled response.
//!     let _receipt: serde_json::Value = effects::call(
//!         "payments-api",
//!         "charge",
//!         &Charge { customer: &payment.customer, amount_cents: payment.amount_cents },
//!     )?;
//!     Ok(())
//! }
//!
//! idem_sdk::handler!(handle);
//! ```
//!
//! Build it with `cargo build --target wasm32-wasip2 --release` (crate type
//! `cdylib`) and check it with `idem plugin check`.
//!
//! ## Errors
//!
//! A handler returns [`Result<()>`](Result), or `Result<R>` with a result
//! `R` for producers that wait for one ([`Reply`]). `?` works on anything that
//! converts into `anyhow::Error`. Errors coming from Idem's own capabilities
//! keep their kind (an unreachable store is [`ErrorKind::Transient`], an
//! ungranted collection is [`ErrorKind::Permanent`]); any other error is
//! permanent unless marked with [`ResultExt::transient`] or [`transient`].
#![deny(missing_docs)]

extern crate self as idem_sdk;

use std::fmt;

#[doc(hidden)]
#[allow(missing_docs, clippy::too_many_arguments)]
pub mod __bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "handler",
        pub_export_macro: true,
        export_macro_name: "__export_handler_world",
        default_bindings_module: "::idem_sdk::__bindings",
        runtime_path: "::idem_sdk::__private::wit_bindgen::rt",
    });
}

use __bindings::idem::handler as wit;

/// One message delivered to a handler.
#[derive(Debug, Clone)]
pub struct Message {
    /// The producer's message id.
    pub id: String,
    /// The idempotency key the claim was taken on: the message id, or the
    /// natural key the plugin's configuration derives from the payload.
    pub key: String,
    /// 1 on the first execution. Informational: letting it change what the
    /// handler writes makes the handler non-idempotent.
    pub attempt: u32,
    /// Producer-supplied headers.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub payload: Vec<u8>,
}

impl Message {
    /// Decode the payload as JSON. A payload that does not decode is a
    /// permanent error: retrying the same bytes cannot succeed.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.payload)
            .map_err(|e| permanent(format!("payload of message {} is not valid JSON for this handler: {e}", self.id)))
    }

    /// The first header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Whether the host should retry a failed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Retry later with exponential backoff, until the attempt limit.
    Transient,
    /// Do not retry: dead-letter the message with the error as its reason.
    Permanent,
}

/// A handler failure: an error chain plus whether it is worth retrying.
pub struct Error {
    kind: ErrorKind,
    inner: anyhow::Error,
}

impl Error {
    /// Wrap any error with an explicit kind.
    pub fn new(kind: ErrorKind, error: impl Into<anyhow::Error>) -> Self {
        Error { kind, inner: error.into() }
    }

    /// The same error, retried by the host.
    pub fn into_transient(self) -> Self {
        Error {
            kind: ErrorKind::Transient,
            ..self
        }
    }

    /// The same error, dead-lettered by the host.
    pub fn into_permanent(self) -> Self {
        Error {
            kind: ErrorKind::Permanent,
            ..self
        }
    }

    /// Whether the host will retry.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Look for an error of type `E` in the chain.
    pub fn downcast_ref<E: fmt::Display + fmt::Debug + Send + Sync + 'static>(&self) -> Option<&E> {
        self.inner.downcast_ref::<E>()
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {:?}", self.kind, self.inner)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.inner)
    }
}

impl<E: Into<anyhow::Error>> From<E> for Error {
    fn from(error: E) -> Self {
        let inner: anyhow::Error = error.into();
        let kind = inner
            .chain()
            .find_map(|cause| {
                if let Some(e) = cause.downcast_ref::<StoreError>() {
                    Some(e.kind())
                } else {
                    cause.downcast_ref::<CallError>().map(CallError::kind)
                }
            })
            .unwrap_or(ErrorKind::Permanent);
        Error { kind, inner }
    }
}

/// The result type of handlers and of every SDK call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A transient error: the message is retried with backoff.
pub fn transient(message: impl fmt::Display) -> Error {
    Error {
        kind: ErrorKind::Transient,
        inner: anyhow::anyhow!("{message}"),
    }
}

/// A permanent error: the message is dead-lettered with this reason.
pub fn permanent(message: impl fmt::Display) -> Error {
    Error {
        kind: ErrorKind::Permanent,
        inner: anyhow::anyhow!("{message}"),
    }
}

/// Mark the error of a `Result` as transient or permanent.
pub trait ResultExt<T> {
    /// Retry the message if this failed.
    fn transient(self) -> Result<T>;
    /// Dead-letter the message if this failed.
    fn permanent(self) -> Result<T>;
}

impl<T, E: Into<anyhow::Error>> ResultExt<T> for std::result::Result<T, E> {
    fn transient(self) -> Result<T> {
        self.map_err(|e| Error::new(ErrorKind::Transient, e))
    }
    fn permanent(self) -> Result<T> {
        self.map_err(|e| Error::new(ErrorKind::Permanent, e))
    }
}

/// A store operation that did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The collection is not granted to this plugin.
    AccessDenied(String),
    /// The key or value exceeds the configured limit.
    TooLarge(String),
    /// The store is unreachable; the message will be retried.
    Unavailable(String),
}

impl StoreError {
    /// Transient only when the store was unreachable.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Unavailable(_) => ErrorKind::Transient,
            _ => ErrorKind::Permanent,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::AccessDenied(m) => write!(f, "store access denied: {m}"),
            StoreError::TooLarge(m) => write!(f, "store value too large: {m}"),
            StoreError::Unavailable(m) => write!(f, "store unavailable: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<wit::store::StoreError> for StoreError {
    fn from(e: wit::store::StoreError) -> Self {
        match e {
            wit::store::StoreError::AccessDenied(m) => StoreError::AccessDenied(m),
            wit::store::StoreError::TooLarge(m) => StoreError::TooLarge(m),
            wit::store::StoreError::Unavailable(m) => StoreError::Unavailable(m),
        }
    }
}

/// An external call that produced no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The endpoint is not granted to this plugin.
    AccessDenied(String),
    /// Timeout, connection failure, 5xx, 408, 409 or 429: the message will be retried.
    Transient(String),
    /// The endpoint refused the request (4xx).
    Permanent(String),
}

impl CallError {
    /// Transient only for failures worth retrying.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CallError::Transient(_) => ErrorKind::Transient,
            _ => ErrorKind::Permanent,
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::AccessDenied(m) => write!(f, "endpoint access denied: {m}"),
            CallError::Transient(m) => write!(f, "external call failed (transient): {m}"),
            CallError::Permanent(m) => write!(f, "external call refused: {m}"),
        }
    }
}

impl std::error::Error for CallError {}

impl From<wit::effects::CallError> for CallError {
    fn from(e: wit::effects::CallError) -> Self {
        match e {
            wit::effects::CallError::AccessDenied(m) => CallError::AccessDenied(m),
            wit::effects::CallError::Transient(m) => CallError::Transient(m),
            wit::effects::CallError::Permanent(m) => CallError::Permanent(m),
        }
    }
}

/// The data store: named collections of JSON values.
pub mod store {
    use super::{wit, Result, StoreError};
    use serde::{de::DeserializeOwned, Serialize};

    /// A collection, as granted to this plugin in its configuration.
    #[derive(Debug, Clone)]
    pub struct Collection {
        name: String,
    }

    /// A handle on the collection `name`. No call is made until an
    /// operation runs; an ungranted collection fails then with
    /// [`StoreError::AccessDenied`].
    pub fn collection(name: &str) -> Collection {
        Collection { name: name.to_string() }
    }

    /// The outcome of [`Collection::insert_unique`].
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Inserted<T> {
        /// The key was free and now holds the value.
        Inserted,
        /// The key was taken; this is what it holds (usually what an earlier
        /// execution of the same message wrote).
        Existed(T),
    }

    impl Collection {
        /// The collection's name.
        pub fn name(&self) -> &str {
            &self.name
        }

        /// Store `value` under `key` unless the key exists.
        pub fn insert_unique<T: Serialize + DeserializeOwned>(&self, key: &str, value: &T) -> Result<Inserted<T>> {
            let bytes = serde_json::to_vec(value)?;
            Ok(match self.insert_unique_bytes(key, &bytes)? {
                Inserted::Inserted => Inserted::Inserted,
                Inserted::Existed(old) => Inserted::Existed(serde_json::from_slice(&old)?),
            })
        }

        /// [`insert_unique`](Self::insert_unique) on raw bytes.
        pub fn insert_unique_bytes(&self, key: &str, value: &[u8]) -> Result<Inserted<Vec<u8>>> {
            match wit::store::insert_unique(&self.name, key, value).map_err(StoreError::from)? {
                wit::store::Inserted::Inserted => Ok(Inserted::Inserted),
                wit::store::Inserted::Existed(old) => Ok(Inserted::Existed(old)),
            }
        }

        /// Set `key` to `value`, whatever it held.
        pub fn upsert<T: Serialize + ?Sized>(&self, key: &str, value: &T) -> Result<()> {
            let bytes = serde_json::to_vec(value)?;
            self.upsert_bytes(key, &bytes)
        }

        /// [`upsert`](Self::upsert) on raw bytes.
        pub fn upsert_bytes(&self, key: &str, value: &[u8]) -> Result<()> {
            Ok(wit::store::upsert(&self.name, key, value).map_err(StoreError::from)?)
        }

        /// Read and decode the value under `key`.
        pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
            match self.get_bytes(key)? {
                Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
                None => Ok(None),
            }
        }

        /// [`get`](Self::get) without decoding.
        pub fn get_bytes(&self, key: &str) -> Result<Option<Vec<u8>>> {
            Ok(wit::store::get(&self.name, key).map_err(StoreError::from)?)
        }

        /// Remove `key`; true if it was there.
        pub fn delete(&self, key: &str) -> Result<bool> {
            Ok(wit::store::delete(&self.name, key).map_err(StoreError::from)?)
        }
    }
}

/// Keyed, journaled calls to external endpoints.
pub mod effects {
    use super::{wit, CallError, Result};
    use serde::{de::DeserializeOwned, Serialize};

    /// POST `request` as JSON to `endpoint` as step `step` of this message
    /// and decode the JSON response. The step name must be the same on
    /// every attempt; distinct steps of one handler need distinct names.
    pub fn call<Req: Serialize + ?Sized, Resp: DeserializeOwned>(endpoint: &str, step: &str, request: &Req) -> Result<Resp> {
        let body = serde_json::to_vec(request)?;
        let response = call_raw(endpoint, step, &body)?;
        Ok(serde_json::from_slice(&response)?)
    }

    /// [`call`] with raw bytes in and out.
    pub fn call_raw(endpoint: &str, step: &str, request: &[u8]) -> Result<Vec<u8>> {
        Ok(wit::effects::call(endpoint, step, request).map_err(CallError::from)?)
    }
}

/// Log lines in the host's log, tagged with the message and plugin.
pub mod log {
    use super::wit::log::{log, Level};

    /// Log at trace level.
    pub fn trace(message: impl AsRef<str>) {
        log(Level::Trace, message.as_ref())
    }
    /// Log at debug level.
    pub fn debug(message: impl AsRef<str>) {
        log(Level::Debug, message.as_ref())
    }
    /// Log at info level.
    pub fn info(message: impl AsRef<str>) {
        log(Level::Info, message.as_ref())
    }
    /// Log at warn level.
    pub fn warn(message: impl AsRef<str>) {
        log(Level::Warn, message.as_ref())
    }
    /// Log at error level.
    pub fn error(message: impl AsRef<str>) {
        log(Level::Error, message.as_ref())
    }
}

#[doc(hidden)]
pub mod __private {
    pub use wit_bindgen;

    use super::{wit, ErrorKind, Message, Result};

    pub fn run<R: super::Reply>(
        f: impl FnOnce(Message) -> Result<R>,
        msg: wit::types::Message,
    ) -> std::result::Result<Option<Vec<u8>>, wit::types::HandlerError> {
        let msg = Message {
            id: msg.id,
            key: msg.key,
            attempt: msg.attempt,
            headers: msg.headers,
            payload: msg.payload,
        };
        f(msg).and_then(super::Reply::into_reply).map_err(|e| match e.kind() {
            ErrorKind::Transient => wit::types::HandlerError::Transient(e.to_string()),
            ErrorKind::Permanent => wit::types::HandlerError::Permanent(e.to_string()),
        })
    }
}

/// What a handler may return: nothing (`()`), or the message's result,
/// which the host stores with the claim and hands to producers that wait
/// for one (Celery's `AsyncResult(id).get()`); a duplicate delivery
/// answers with the same result.
pub trait Reply {
    /// The result as bytes (JSON by convention), or none.
    fn into_reply(self) -> Result<Option<Vec<u8>>>;
}

impl Reply for () {
    fn into_reply(self) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
}

impl Reply for serde_json::Value {
    fn into_reply(self) -> Result<Option<Vec<u8>>> {
        Ok(Some(serde_json::to_vec(&self).map_err(|e| Error::new(ErrorKind::Permanent, e))?))
    }
}

/// A result serialised as JSON: `Ok(Json(balance))`.
#[derive(Debug, Clone)]
pub struct Json<T>(pub T);

impl<T: serde::Serialize> Reply for Json<T> {
    fn into_reply(self) -> Result<Option<Vec<u8>>> {
        Ok(Some(serde_json::to_vec(&self.0).map_err(|e| Error::new(ErrorKind::Permanent, e))?))
    }
}

impl<R: Reply> Reply for Option<R> {
    fn into_reply(self) -> Result<Option<Vec<u8>>> {
        self.map_or(Ok(None), Reply::into_reply)
    }
}

/// Export `f: fn(Message) -> Result<R>` as this component's handler, where
/// `R` is `()` or a result ([`Reply`]: [`Json`], `serde_json::Value`).
///
/// ```no_run
/// fn handle(msg: idem_sdk::Message) -> idem_sdk::Result<()> {
///     idem_sdk::log::info(format!("got {}", msg.id));
///     Ok(())
/// }
/// idem_sdk::handler!(handle);
/// ```
///
/// ```no_run
/// fn handle(msg: idem_sdk::Message) -> idem_sdk::Result<idem_sdk::Json<u64>> {
///     Ok(idem_sdk::Json(msg.payload.len() as u64))
/// }
/// idem_sdk::handler!(handle);
/// ```
#[macro_export]
macro_rules! handler {
    ($f:path) => {
        struct __IdemHandler;

        impl $crate::__bindings::Guest for __IdemHandler {
            fn handle(
                msg: $crate::__bindings::idem::handler::types::Message,
            ) -> ::core::result::Result<
                ::core::option::Option<::std::vec::Vec<u8>>,
                $crate::__bindings::idem::handler::types::HandlerError,
            > {
                $crate::__private::run($f, msg)
            }
        }

        $crate::__bindings::__export_handler_world!(__IdemHandler with_types_in $crate::__bindings);
    };
}
