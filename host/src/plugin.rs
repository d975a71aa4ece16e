//! What a plugin is, apart from its code: its name, version, grants and
//! limits. The capabilities check every call against this; the runtime
//! pairs it with the compiled component.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

use crate::config::Limits;

/// Collections and endpoints a plugin may use.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Collection names.
    pub collections: BTreeSet<String>,
    /// Endpoint names.
    pub endpoints: BTreeSet<String>,
}

impl Grants {
    /// Grants from lists of names.
    pub fn new<S: Into<String>>(collections: impl IntoIterator<Item = S>, endpoints: impl IntoIterator<Item = S>) -> Self {
        Grants {
            collections: collections.into_iter().map(Into::into).collect(),
            endpoints: endpoints.into_iter().map(Into::into).collect(),
        }
    }
}

/// A loaded plugin's identity and sandbox settings.
#[derive(Debug, Clone)]
pub struct PluginInfo {
    /// The name messages are published to.
    pub name: String,
    /// Content hash of the component (first 12 hex digits of its SHA-256,
    /// see [`version_of`]), recorded with each claim, journal entry and
    /// dead letter.
    pub version: String,
    /// Collections and endpoints it may use.
    pub grants: Grants,
    /// Its sandbox limits.
    pub limits: Limits,
    /// JSON pointer of its natural idempotency key, if any.
    pub key_pointer: Option<String>,
    /// Every import of the component (for `idem plugin check`).
    pub imports: Vec<String>,
    /// When it was compiled (Unix ms).
    pub loaded_at: i64,
}

/// A component's version: the first 12 hex digits of its SHA-256.
pub fn version_of(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..6])
}
