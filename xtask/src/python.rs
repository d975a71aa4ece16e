//! Python plugins: componentize-py, pinned and installed under `target/`,
//! builds each example under `guest-sdk/python/examples/` with the Python
//! SDK into a component beside the Rust ones (`<name>_py.wasm`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{Context, Result};

use super::run;

/// componentize-py's version (PyPI). It carries CPython and builds offline.
const COMPONENTIZE_PY: &str = "0.25.1";

/// Where the pinned componentize-py lives.
fn tool_dir(root: &Path) -> PathBuf {
    root.join("target/tools").join(format!("componentize-py-{COMPONENTIZE_PY}"))
}

/// Install componentize-py from PyPI into `target/tools` unless it is there.
fn ensure_componentize_py(root: &Path) -> Result<PathBuf> {
    let dir = tool_dir(root);
    if !dir.join("bin/componentize-py").exists() {
        run(Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
            .arg(&dir)
            .arg(format!("componentize-py=={COMPONENTIZE_PY}")))
        .context("cannot install componentize-py with pip (python3 and pip are needed; Debian: apt-get install python3-pip)")?;
    }
    Ok(dir)
}

/// Newest modification time of the files under `dirs` (recursively).
fn newest(dirs: &[PathBuf]) -> Result<SystemTime> {
    let mut newest = SystemTime::UNIX_EPOCH;
    let mut stack: Vec<PathBuf> = dirs.to_vec();
    while let Some(path) = stack.pop() {
        let meta = std::fs::metadata(&path).with_context(|| format!("cannot read {}", path.display()))?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                let p = entry?.path();
                if p.file_name().is_some_and(|n| n != "__pycache__") {
                    stack.push(p);
                }
            }
        } else {
            newest = newest.max(meta.modified()?);
        }
    }
    Ok(newest)
}

/// Build every Python example plugin into `out` (skipping those whose
/// component is newer than their sources, the SDK and the WIT world).
pub(super) fn build_python_plugins(root: &Path, out: &Path) -> Result<()> {
    let examples = root.join("guest-sdk/python/examples");
    let sdk = root.join("guest-sdk/python");
    let wit = root.join("wit");
    let mut tool = None;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&examples)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    dirs.sort();
    for dir in dirs.into_iter().filter(|d| d.join("app.py").exists()) {
        let name = dir.file_name().expect("dir name").to_string_lossy().replace('-', "_");
        let target = out.join(format!("{name}_py.wasm"));
        let sources = newest(&[dir.clone(), sdk.join("idem"), wit.clone()])?;
        if std::fs::metadata(&target)
            .and_then(|m| m.modified())
            .is_ok_and(|built| built > sources)
        {
            continue;
        }
        let tool_dir = match &tool {
            Some(t) => t,
            None => tool.insert(ensure_componentize_py(root)?),
        };
        run(Command::new(tool_dir.join("bin/componentize-py"))
            .env("PYTHONPATH", tool_dir.as_os_str())
            .arg("-d")
            .arg(&wit)
            .args(["-w", "handler", "componentize", "--stub-wasi", "-p"])
            .arg(&sdk)
            .arg("-p")
            .arg(&dir)
            .arg("app")
            .arg("-o")
            .arg(&target))?;
    }
    Ok(())
}
