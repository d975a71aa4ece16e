//! Compiled components kept on disk, so a restart or a hot reload of a
//! large component (an 18 MB Python one compiles in seconds) loads in
//! milliseconds. Each entry is named by the SHA-256 of the component and a
//! hash of the engine's settings and version, so a changed component, a
//! changed setting or a new wasmtime never reads a stale entry. Entries are
//! written whole (a temporary file synced, then renamed into place); one
//! that cannot be read is compiled again and replaced.
//!
//! Reading an entry runs the machine code in it, so the directory must be
//! writable only by the worker's user (it is created with mode 0700). A
//! directory or entry that another user owns or may write is not read (nor
//! written): the component is compiled, with an error naming the setting
//! and the fix. The checks are made on the open directory and entry, and
//! the bytes read through them: a path swapped after a check is not read.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

/// Where compiled components are kept.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
}

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Read from the cache.
    Cached,
    /// Compiled (and written to the cache).
    Compiled,
}

impl CompileCache {
    /// A cache in `dir` (created when first written).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CompileCache { dir: dir.into() }
    }

    /// The entry's file name for `bytes` on `engine`.
    fn entry_name(engine: &Engine, bytes: &[u8]) -> String {
        let mut settings = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut settings);
        let digest = hex::encode(Sha256::digest(bytes));
        format!("{digest}-{:016x}.cwasm", settings.finish())
    }

    /// The entry for `bytes` on `engine`.
    #[cfg(test)]
    fn entry(&self, engine: &Engine, bytes: &[u8]) -> PathBuf {
        self.dir.join(Self::entry_name(engine, bytes))
    }

    /// The component for `bytes`: from the cache if an entry is there and
    /// loads, else compiled and stored.
    pub fn component(&self, engine: &Engine, bytes: &[u8]) -> Result<(Component, Source)> {
        let name = Self::entry_name(engine, bytes);
        let compile = || Component::new(engine, bytes).map_err(|e| anyhow::anyhow!("{e:#}"));
        let dir = match open_private_dir(&self.dir) {
            Ok(dir) => dir,
            Err(why) => {
                tracing::error!(
                    "worker.compile_cache_dir {} {why}: what is in it would run as machine code, so it is not used; make it the worker user's own (chown) and writable by no one else (chmod 700)",
                    self.dir.display()
                );
                return Ok((compile()?, Source::Compiled));
            }
        };
        let entry = self.dir.join(&name);
        match dir.as_ref().map(|dir| read_private_entry(dir, &name)) {
            Some(Err(why)) => tracing::error!(entry = %entry.display(), "compiled component {why}: not read; compiling it again"),
            Some(Ok(Some(compiled))) => {
                // SAFETY: entries are written only by `store` below, from
                // `Component::serialize` of this engine's settings (the
                // name says which), into a directory only this user can
                // write; the bytes were read through handles checked so.
                match unsafe { Component::deserialize(engine, &compiled) } {
                    Ok(c) => return Ok((c, Source::Cached)),
                    Err(e) => {
                        tracing::warn!(entry = %entry.display(), error = %format!("{e:#}"), "compiled component unreadable; compiling it again")
                    }
                }
            }
            Some(Ok(None)) | None => {}
        }
        let component = compile()?;
        if let Err(e) = self.store(&entry, &component) {
            tracing::warn!(dir = %self.dir.display(), error = %format!("{e:#}"), "cannot keep the compiled component; the next start compiles it again");
        }
        Ok((component, Source::Compiled))
    }

    fn store(&self, entry: &Path, component: &Component) -> Result<()> {
        create_private_dir(&self.dir)?;
        let bytes = component.serialize().map_err(|e| anyhow::anyhow!("{e:#}"))?;
        // A temporary file of its own (several pools, in one process or
        // many, may store the same entry at once), on disk before it is
        // renamed into place: renamed first, a crash could leave the name
        // on a file whose blocks never reached the disk (machine code read
        // back as zeros).
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).with_context(|| format!("cannot write into {}", self.dir.display()))?;
        std::io::Write::write_all(&mut tmp, &bytes).with_context(|| format!("cannot write {}", tmp.path().display()))?;
        tmp.as_file()
            .sync_all()
            .with_context(|| format!("cannot sync {}", tmp.path().display()))?;
        tmp.persist(entry)
            .map_err(|e| anyhow::anyhow!("cannot rename {} into place: {}", e.file.path().display(), e.error))?;
        Ok(())
    }
}

/// The cache directory, opened, if it is there: it must be owned by this
/// process's user and writable by no one else. What is checked is the open
/// handle, and entries are opened through it, so a directory swapped in
/// for it after the check is never read.
fn open_private_dir(dir: &Path) -> std::result::Result<Option<std::fs::File>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir);
    let dir = match opened {
        Ok(dir) => dir,
        // Not there yet: created private when first written.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot be read ({e})")),
    };
    private(&dir.metadata().map_err(|e| format!("cannot be read ({e})"))?)?;
    Ok(Some(dir))
}

/// The bytes of entry `name` in the opened directory `dir`, if it is
/// there: it must be a file of its own (not a link: it is opened without
/// following one), owned by this process's user and writable by no one
/// else, checked on the handle its bytes are read from.
fn read_private_entry(dir: &std::fs::File, name: &str) -> std::result::Result<Option<Vec<u8>>, String> {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd};
    let c_name = std::ffi::CString::new(name).map_err(|_| "has a NUL in its name".to_string())?;
    // SAFETY: `dir` is an open directory and `c_name` a NUL-terminated
    // name; the descriptor returned is owned by the `File` made of it.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c_name.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            Some(libc::ELOOP) => Err("is not a file of its own (a link)".into()),
            _ => Err(format!("cannot be read ({e})")),
        };
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let meta = file.metadata().map_err(|e| format!("cannot be read ({e})"))?;
    if !meta.file_type().is_file() {
        return Err("is not a file of its own (a directory or a device)".into());
    }
    private(&meta)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.read_to_end(&mut bytes).map_err(|e| format!("cannot be read ({e})"))?;
    Ok(Some(bytes))
}

/// Whether what `meta` describes may hold machine code this process runs:
/// owned by this process's user and writable by no one else.
fn private(meta: &std::fs::Metadata) -> std::result::Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if meta.uid() != uid {
        return Err(format!("is owned by user {}, not by this worker's user {uid}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!("may be written by other users (mode {:o})", meta.mode() & 0o777));
    }
    Ok(())
}

fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the compile cache {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary of `(component)`: an empty component.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

    /// An engine for components, with nothing else set.
    fn engine() -> Engine {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        Engine::new(&config).unwrap()
    }

    #[test]
    fn a_component_is_compiled_once_and_then_read_back() {
        let engine = engine();
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::new(dir.path().join("compiled"));
        assert_eq!(cache.component(&engine, EMPTY_COMPONENT).unwrap().1, Source::Compiled);
        assert_eq!(cache.component(&engine, EMPTY_COMPONENT).unwrap().1, Source::Cached);
        // A damaged entry is compiled again and replaced.
        let entry = cache.entry(&engine, EMPTY_COMPONENT);
        std::fs::write(&entry, b"garbage").unwrap();
        assert_eq!(cache.component(&engine, EMPTY_COMPONENT).unwrap().1, Source::Compiled);
        assert_eq!(cache.component(&engine, EMPTY_COMPONENT).unwrap().1, Source::Cached);
        // Another engine setting reads another entry.
        let mut other = wasmtime::Config::new();
        other.wasm_component_model(true).epoch_interruption(true);
        let other = Engine::new(&other).unwrap();
        assert_eq!(cache.component(&other, EMPTY_COMPONENT).unwrap().1, Source::Compiled);
    }

    /// An entry another user could have written is never read: not in a
    /// directory others may write, nor a file others may write or a link.
    #[test]
    fn entries_others_may_write_are_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let engine = engine();
        let dir = tempfile::tempdir().unwrap();
        let compiled = dir.path().join("compiled");
        let cache = CompileCache::new(&compiled);
        assert_eq!(cache.component(&engine, EMPTY_COMPONENT).unwrap().1, Source::Compiled);
        assert_eq!(cache.component(&engine, EMPTY_COMPONENT).unwrap().1, Source::Cached);
        let entry = cache.entry(&engine, EMPTY_COMPONENT);
        let chmod = |path: &Path, mode: u32| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();

        // Each compiled again, not read; the entry written again is the
        // worker's own, and read next time.
        for (path, mode, what) in [
            (&compiled, 0o777, "a directory anyone may write"),
            (&entry, 0o666, "an entry anyone may write"),
        ] {
            chmod(path, mode);
            assert_eq!(cache.component(&engine, EMPTY_COMPONENT).unwrap().1, Source::Compiled, "{what}");
            chmod(&compiled, 0o700);
            assert_eq!(
                cache.component(&engine, EMPTY_COMPONENT).unwrap().1,
                Source::Cached,
                "{what}, mended"
            );
        }

        let elsewhere = dir.path().join("elsewhere.cwasm");
        std::fs::rename(&entry, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
        assert_eq!(cache.component(&engine, EMPTY_COMPONENT).unwrap().1, Source::Compiled, "a link");
        assert!(
            !std::fs::symlink_metadata(&entry).unwrap().file_type().is_symlink(),
            "replaced by an entry of its own"
        );
        assert_eq!(cache.component(&engine, EMPTY_COMPONENT).unwrap().1, Source::Cached);
    }
}
