//! What a plugin is, apart from its code: its name, version, grants and
//! limits. The capabilities check every call against this; the runtime
//! pairs it with the compiled component.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

use crate::config::Limits;

/// Collections and endpoints a plugin may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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

/// The largest plugin file read (an interpreter with its snapshot is tens
/// of megabytes).
pub const MAX_COMPONENT_BYTES: u64 = 512 << 20;

/// A plugin's component file, read whole. Only a regular file is read: a
/// pipe or a device in its place would block the reload (and every reload
/// after it) or never end. The file is opened once (without waiting on a
/// pipe) and what is checked is what is read: a path swapped between a
/// check and a read cannot slip a pipe, a device or a larger file in.
pub fn read_component(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;

    use anyhow::{bail, Context};
    let cannot = || format!("cannot read {}", path.display());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(cannot)?;
    let meta = file.metadata().with_context(cannot)?;
    if !meta.is_file() {
        bail!(
            "{} is not a regular file (a plugin's path names its .wasm component)",
            path.display()
        );
    }
    let too_large = |len: u64| {
        anyhow::anyhow!(
            "{} is {len} bytes, more than the {MAX_COMPONENT_BYTES} a plugin may be",
            path.display()
        )
    };
    if meta.len() > MAX_COMPONENT_BYTES {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // A file that grows while it is read is read no further than the bound.
    file.take(MAX_COMPONENT_BYTES + 1).read_to_end(&mut bytes).with_context(cannot)?;
    if bytes.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_is_read_as_a_component() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.wasm");
        std::fs::write(&file, b"\0asm").unwrap();
        assert_eq!(read_component(&file).unwrap(), b"\0asm");
        let fifo = dir.path().join("fifo.wasm");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        for path in [fifo.as_path(), dir.path(), std::path::Path::new("/dev/zero")] {
            let err = read_component(path).unwrap_err().to_string();
            assert!(err.contains("is not a regular file"), "{}: {err}", path.display());
        }
        let err = format!("{:#}", read_component(&dir.path().join("missing.wasm")).unwrap_err());
        assert!(err.contains("cannot read") && err.contains("missing.wasm"), "{err}");
    }
}
