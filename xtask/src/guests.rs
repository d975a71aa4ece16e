//! Python and JavaScript plugins: each example under
//! `guest-sdk/python/examples/` and `guest-sdk/js/examples/` is built by the
//! host's own `idem plugin build` into a component beside the Rust ones
//! (`<name>_py.wasm`, `<name>_js.wasm`), with its toolchain pinned and
//! installed under `target/tools`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{Context, Result};

use super::run;

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

/// Build every Python and JavaScript example plugin into `out` with `idem`
/// (skipping those whose component is newer than their sources, the SDK
/// and the WIT world, which the `idem` binary embeds, and the build code
/// that pins the toolchains and their flags). Two builds run at a time:
/// each is mostly one process working on one core.
pub(super) fn build_guest_plugins(root: &Path, idem: &Path, out: &Path) -> Result<()> {
    let tools = root.join("target/tools");
    let mut builds: Vec<Command> = Vec::new();
    for (lang, sdk, suffix) in [
        ("python", root.join("guest-sdk/python/idem"), "py"),
        ("js", root.join("guest-sdk/js/idem.js"), "js"),
    ] {
        let examples = root.join("guest-sdk").join(lang).join("examples");
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&examples)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        dirs.sort();
        for dir in dirs.into_iter().filter(|d| d.is_dir()) {
            let name = dir.file_name().expect("dir name").to_string_lossy().replace('-', "_");
            let target = out.join(format!("{name}_{suffix}.wasm"));
            let sources = newest(&[dir.clone(), sdk.clone(), root.join("wit"), root.join("host/src/tools/sdk")])?;
            if std::fs::metadata(&target)
                .and_then(|m| m.modified())
                .is_ok_and(|built| built > sources)
            {
                continue;
            }
            let mut cmd = Command::new(idem);
            cmd.args(["plugin", "build"])
                .arg(&dir)
                .arg("--out")
                .arg(&target)
                .arg("--tools-dir")
                .arg(&tools)
                // The check compiles the component: keep it where the demo,
                // the chaos runs and the tests load compiled plugins from.
                .arg("--compile-cache")
                .arg(out.join(".compiled"));
            builds.push(cmd);
        }
    }
    // The first build of each language installs its toolchain: one at a
    // time until each language has built once.
    let mut first: Vec<Command> = Vec::new();
    for lang in ["python", "js"] {
        if let Some(i) = builds.iter().position(|c| {
            c.get_args()
                .nth(2)
                .is_some_and(|a| a.to_string_lossy().contains(&format!("/{lang}/")))
        }) {
            first.push(builds.remove(i));
        }
    }
    for mut cmd in first {
        run(&mut cmd)?;
    }
    let queue = std::sync::Mutex::new(builds);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let Some(mut cmd) = queue.lock().expect("build queue poisoned").pop() else {
                            return Ok(());
                        };
                        run(&mut cmd)?;
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().expect("a build thread panicked"))
    })
}
