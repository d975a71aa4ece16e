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

/// Check `plugin`'s key pointer against the one recorded for it in the
/// namespace's claim store (recording it the first time). Keys must be
/// derived the same way for as long as any of the plugin's messages may be
/// delivered: another pointer would give a redelivery another key, and a
/// message done under the old key would run again. Checked on every start
/// and reload; `idem plugin rekey` changes the record.
pub async fn check_key_pointer(admin: &dyn crate::claim::ClaimAdmin, plugin: &str, pointer: Option<&str>) -> anyhow::Result<()> {
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
