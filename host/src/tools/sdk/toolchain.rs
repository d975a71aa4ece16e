//! The guest toolchains `idem plugin build` runs, pinned and installed on
//! first use into a tools directory: componentize-py from PyPI,
//! componentize-js from npm, the `wasm32-wasip2` Rust target through rustup.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// componentize-py's version (PyPI). The wheel carries CPython and builds
/// offline.
pub const COMPONENTIZE_PY: &str = "0.25.1";
/// componentize-js's version (npm). The package carries the SpiderMonkey
/// engine; Idem never uses its `--aot` mode, which downloads at build time.
pub const COMPONENTIZE_JS: &str = "0.23.0";
/// The Rust target plugins are built for.
pub const WASM_TARGET: &str = "wasm32-wasip2";

/// Where pinned toolchains live: `--tools-dir`, else `$IDEM_TOOLS_DIR`, else
/// `$XDG_CACHE_HOME/idem/tools`, else `~/.cache/idem/tools`.
pub fn tools_dir(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = explicit {
        return Ok(dir.to_path_buf());
    }
    if let Some(dir) = std::env::var_os("IDEM_TOOLS_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(cache).join("idem/tools"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache/idem/tools")),
        None => bail!("no directory for the plugin toolchains: set IDEM_TOOLS_DIR or pass --tools-dir"),
    }
}

/// Run `cmd`, failing with `what` and its output if it fails.
pub(super) fn run(cmd: &mut Command, what: &str) -> Result<()> {
    tracing::debug!(?cmd, "running");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {what} ({:?})", cmd.get_program()))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// componentize-py, installed with pip into `tools/componentize-py-VERSION`
/// unless it is there. Returns the directory (put it on PYTHONPATH).
pub fn componentize_py(tools: &Path) -> Result<PathBuf> {
    let dir = tools.join(format!("componentize-py-{COMPONENTIZE_PY}"));
    if !dir.join("bin/componentize-py").exists() {
        eprintln!("installing componentize-py {COMPONENTIZE_PY} into {}", dir.display());
        run(
            Command::new("python3")
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
                .arg(&dir)
                .arg(format!("componentize-py=={COMPONENTIZE_PY}")),
            "pip install componentize-py (python3 with pip is needed; Debian: apt-get install python3-pip)",
        )?;
    }
    Ok(dir)
}

/// componentize-js, installed with npm into `tools/componentize-js-VERSION`
/// unless it is there. Returns its command.
pub fn componentize_js(tools: &Path) -> Result<PathBuf> {
    let dir = tools.join(format!("componentize-js-{COMPONENTIZE_JS}"));
    let bin = dir.join("node_modules/.bin/componentize-js");
    if !bin.exists() {
        eprintln!("installing componentize-js {COMPONENTIZE_JS} into {}", dir.display());
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        run(
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix"])
                .arg(&dir)
                .arg(format!("@bytecodealliance/componentize-js@{COMPONENTIZE_JS}")),
            "npm install @bytecodealliance/componentize-js (Node.js 20 or later with npm is needed)",
        )?;
    }
    Ok(bin)
}

/// Add the wasm target if this Rust toolchain lacks it.
pub fn rust_target() -> Result<()> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("rustup is needed to add the wasm32-wasip2 target (https://rustup.rs)")?;
    if String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == WASM_TARGET) {
        return Ok(());
    }
    run(
        Command::new("rustup").args(["target", "add", WASM_TARGET]),
        "rustup target add wasm32-wasip2",
    )
}
