//! `idem plugin new` and `idem plugin build`: a plugin project in Rust,
//! Python or JavaScript, from an empty directory to a checked component.
//!
//! A new project is self-contained: it carries the SDK and the WIT world of
//! the `idem` binary that created it, a configuration that runs it on the
//! embedded backend, and sample messages for `idem verify`. The build
//! installs the pinned toolchain it needs on first use (see [`toolchain`]),
//! builds with the flags Idem's sandbox expects, and checks the result as
//! `idem plugin check` does.

pub mod templates;
pub mod toolchain;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::capabilities::Grants;
use crate::runtime::footprint::Footprint;
use toolchain::{run, WASM_TARGET};

/// A guest language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
        })
    }
}

impl Lang {
    /// The language of the project in `dir`: `Cargo.toml`, `app.py` or
    /// `app.js`.
    pub fn detect(dir: &Path) -> Result<Lang> {
        let found: Vec<Lang> = [("Cargo.toml", Lang::Rust), ("app.py", Lang::Python), ("app.js", Lang::Js)]
            .into_iter()
            .filter(|(file, _)| dir.join(file).is_file())
            .map(|(_, lang)| lang)
            .collect();
        match found.as_slice() {
            [lang] => Ok(*lang),
            [] => bail!(
                "{} holds no plugin: expected Cargo.toml (Rust), app.py (Python) or app.js (JavaScript); \
                 create one with `idem plugin new NAME --lang rust|python|js`",
                dir.display()
            ),
            _ => bail!(
                "{} holds more than one of Cargo.toml, app.py and app.js: pass --lang to choose",
                dir.display()
            ),
        }
    }
}

/// A plugin name: what `[plugins.NAME]` and `--handler NAME` use.
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!("plugin name {name:?}: use 1–64 lowercase letters, digits and '-', starting with a letter (e.g. send-invoice)");
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Write the WIT world into `dir`.
fn write_wit(dir: &Path) -> Result<()> {
    for (file, text) in templates::WIT {
        write(&dir.join(file), text)?;
    }
    Ok(())
}

/// Create a new plugin project `dir` (its last component is the plugin's
/// name) in `lang`. Refuses a directory that exists and is not empty.
pub fn new_plugin(dir: &Path, lang: Lang) -> Result<()> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} does not end in a plugin name", dir.display()))?;
    check_name(name)?;
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        bail!("{} exists and is not empty: choose a new directory", dir.display());
    }
    let file = name.replace('-', "_");
    let fill = |t: &str, entry: &str| {
        t.replace("{name}", name)
            .replace("{file}", &file)
            .replace("{lang}", &lang.to_string())
            .replace("{entry}", entry)
    };
    let entry = match lang {
        Lang::Rust => {
            write(&dir.join("Cargo.toml"), &fill(templates::RUST_MANIFEST, ""))?;
            write(&dir.join(".cargo/config.toml"), templates::RUST_CARGO_CONFIG)?;
            write(&dir.join("src/lib.rs"), &fill(templates::RUST_HANDLER, ""))?;
            write(&dir.join("idem-sdk/Cargo.toml"), templates::RUST_SDK_MANIFEST)?;
            write(&dir.join("idem-sdk/src/lib.rs"), templates::RUST_SDK)?;
            // The SDK finds the world at ../wit from its manifest.
            write_wit(&dir.join("wit"))?;
            "src/lib.rs"
        }
        Lang::Python => {
            write(&dir.join("app.py"), &fill(templates::PYTHON_HANDLER, ""))?;
            write(&dir.join("idem/__init__.py"), templates::PYTHON_SDK)?;
            "app.py"
        }
        Lang::Js => {
            write(&dir.join("app.js"), &fill(templates::JS_HANDLER, ""))?;
            write(&dir.join("idem.js"), templates::JS_SDK)?;
            write(&dir.join("idem.d.ts"), templates::JS_TYPES)?;
            "app.js"
        }
    };
    write(&dir.join("idem.toml"), &fill(templates::CONFIG, entry))?;
    write(&dir.join("messages.jsonl"), templates::MESSAGES)?;
    write(&dir.join("README.md"), &fill(templates::README, entry))?;
    write(&dir.join(".gitignore"), templates::GITIGNORE)?;
    Ok(())
}

/// What `idem plugin build` needs to know.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The project directory.
    pub dir: PathBuf,
    /// Its language (detected when `None`).
    pub lang: Option<Lang>,
    /// Where the component goes (default `DIR/build/NAME.wasm`).
    pub out: Option<PathBuf>,
    /// Where pinned toolchains are installed (see [`toolchain::tools_dir`]).
    pub tools_dir: Option<PathBuf>,
}

/// The plugin name of a project: its Cargo package name, or its directory's
/// name.
fn project_name(dir: &Path, lang: Lang) -> Result<String> {
    if lang == Lang::Rust {
        let manifest = dir.join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest).with_context(|| format!("cannot read {}", manifest.display()))?;
        let value: toml::Table = toml::from_str(&text).with_context(|| format!("{} is not valid TOML", manifest.display()))?;
        return value
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str())
            .map(str::to_string)
            .with_context(|| format!("{} has no [package] name", manifest.display()));
    }
    let canonical = dir.canonicalize().with_context(|| format!("cannot open {}", dir.display()))?;
    canonical
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .with_context(|| format!("{} has no name", dir.display()))
}

/// Build the project to a component; return its path.
pub fn build(opts: &BuildOptions) -> Result<PathBuf> {
    // Absolute from here on: the toolchains run in directories of their own.
    let dir = &absolute(&opts.dir)?;
    if !dir.is_dir() {
        bail!("{} is not a directory: pass the plugin project's directory", dir.display());
    }
    let lang = match opts.lang {
        Some(l) => l,
        None => Lang::detect(dir)?,
    };
    let name = project_name(dir, lang)?;
    let out = match &opts.out {
        Some(out) => absolute(out)?,
        None => dir.join("build").join(format!("{}.wasm", name.replace('-', "_"))),
    };
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let tools = absolute(&toolchain::tools_dir(opts.tools_dir.as_deref())?)?;
    match lang {
        Lang::Rust => build_rust(dir, &out)?,
        Lang::Python => build_python(dir, &out, &tools)?,
        Lang::Js => build_js(dir, &out, &tools)?,
    }
    Ok(out)
}

/// `path` made absolute against the current directory.
fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))
}

/// `cargo build --release --target wasm32-wasip2` with a 128 KiB stack;
/// the artifact is the `.wasm` cargo reports.
fn build_rust(dir: &Path, out: &Path) -> Result<()> {
    toolchain::rust_target()?;
    let mut cmd = Command::new("cargo");
    cmd.current_dir(dir)
        .args([
            "build",
            "--release",
            "--target",
            WASM_TARGET,
            "--message-format=json-render-diagnostics",
        ])
        .stderr(std::process::Stdio::inherit());
    // The project's .cargo/config.toml sets the stack; a project without one
    // gets the same flag here.
    if !dir.join(".cargo/config.toml").exists() && std::env::var_os("CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS").is_none() {
        cmd.env("CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS", "-C link-arg=-zstack-size=131072");
    }
    let output = cmd.output().context("cannot run cargo (install Rust: https://rustup.rs)")?;
    if !output.status.success() {
        bail!("cargo build of {} failed ({}): see the errors above", dir.display(), output.status);
    }
    let artifact = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "cdylib")))
        .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .rfind(|f| f.extension().is_some_and(|e| e == "wasm"))
        .with_context(|| {
            format!(
                "cargo built no .wasm in {}: its Cargo.toml needs [lib] crate-type = [\"cdylib\"]",
                dir.display()
            )
        })?;
    std::fs::copy(&artifact, out).with_context(|| format!("cannot copy {} to {}", artifact.display(), out.display()))?;
    Ok(())
}

/// componentize-py with `--stub-wasi`, the project's own `idem` package if
/// it has one, else this binary's.
fn build_python(dir: &Path, out: &Path, tools: &Path) -> Result<()> {
    if !dir.join("app.py").is_file() {
        bail!("{} has no app.py: the Python handler lives in app.py", dir.display());
    }
    let tool = toolchain::componentize_py(tools)?;
    let stage = tempfile::tempdir().context("cannot create a temporary directory")?;
    write_wit(&stage.path().join("wit"))?;
    let mut cmd = Command::new(tool.join("bin/componentize-py"));
    cmd.env("PYTHONPATH", &tool)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .arg("-d")
        .arg(stage.path().join("wit"))
        .args(["-w", "handler", "componentize", "--stub-wasi", "-p"])
        .arg(dir);
    if !dir.join("idem/__init__.py").is_file() {
        write(&stage.path().join("sdk/idem/__init__.py"), templates::PYTHON_SDK)?;
        cmd.arg("-p").arg(stage.path().join("sdk"));
    }
    cmd.arg("app").arg("-o").arg(out);
    run(&mut cmd, &format!("componentize-py on {}", dir.display()))
}

/// componentize-js with every WASI feature disabled (the component imports
/// only `idem:handler/*`), built from a copy of the project beside the SDK
/// (the project's own `idem.js` wins).
fn build_js(dir: &Path, out: &Path, tools: &Path) -> Result<()> {
    if !dir.join("app.js").is_file() {
        bail!(
            "{} has no app.js: the JavaScript handler lives in app.js (an ES module exporting `handle`)",
            dir.display()
        );
    }
    let tool = toolchain::componentize_js(tools)?;
    let stage = tempfile::tempdir().context("cannot create a temporary directory")?;
    copy_sources(dir, stage.path())?;
    if !stage.path().join("idem.js").exists() {
        write(&stage.path().join("idem.js"), templates::JS_SDK)?;
    }
    write_wit(&stage.path().join(".idem-wit"))?;
    let out_abs = std::path::absolute(out)?;
    run(
        Command::new(tool)
            .current_dir(stage.path())
            .arg("app.js")
            .args([
                "--wit",
                ".idem-wit",
                "-n",
                "handler",
                "-d",
                "stdio",
                "random",
                "clocks",
                "http",
                "fetch-event",
                "-o",
            ])
            .arg(&out_abs),
        &format!("componentize-js on {}", dir.display()),
    )
}

/// Copy the JavaScript sources of `from` (recursively, skipping
/// node_modules, build and dot directories) into `to`.
fn copy_sources(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let text = name.to_string_lossy();
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            if text.starts_with('.') || text == "node_modules" || text == "build" {
                continue;
            }
            std::fs::create_dir_all(to.join(&name))?;
            copy_sources(&path, &to.join(&name))?;
        } else if text.ends_with(".js") || text.ends_with(".mjs") || text.ends_with(".json") {
            std::fs::copy(&path, to.join(&name)).with_context(|| format!("cannot copy {}", path.display()))?;
        }
    }
    Ok(())
}

/// What `idem plugin check` found.
#[derive(Debug)]
pub struct CheckReport {
    pub bytes: usize,
    /// Each import and whether Idem allows it.
    pub imports: Vec<(String, bool)>,
    /// The version Idem gives it and the world it was built against, or
    /// why it does not load.
    pub loaded: Result<(String, &'static str), String>,
}

/// Compile `file` as Idem would load it and list its imports. With a
/// `compile_cache` directory, the compiled component is kept there (or taken
/// from there), as a worker whose `worker.compile_cache_dir` names it does.
pub fn check(file: &Path, compile_cache: Option<&Path>) -> Result<CheckReport> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let footprint = Footprint::of(&bytes).unwrap_or(Footprint::SMALL);
    let runtime = crate::app::inspection_runtime_with(footprint, compile_cache.map(Path::to_path_buf))?;
    let name = file.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin").replace('_', "-");
    let compiled = runtime
        .component(&name, &bytes)
        .with_context(|| format!("{} cannot be loaded", file.display()))?;
    let engine = runtime.engine();
    let imports = crate::runtime::component_imports(engine, &compiled.component)
        .into_iter()
        .map(|i| {
            let ok = crate::runtime::import_allowed(&i);
            (i, ok)
        })
        .collect();
    let loaded = runtime
        .prepare(&name, &bytes, &compiled, Grants::default(), Default::default(), None)
        .map(|p| (p.version.to_string(), p.world()))
        .map_err(|e| format!("{e:#}"));
    Ok(CheckReport {
        bytes: bytes.len(),
        imports,
        loaded,
    })
}

impl CheckReport {
    /// Print it as `idem plugin check` does; true if the component loads.
    pub fn print(&self, file: &Path) -> bool {
        println!("{}: {} bytes", file.display(), self.bytes);
        println!("imports:");
        for (i, ok) in &self.imports {
            println!("  {} {i}", if *ok { "ok     " } else { "REFUSED" });
        }
        match &self.loaded {
            Ok((version, world)) => {
                let note = if *world == "idem:handler@0.1.0" {
                    ", which returns no result"
                } else {
                    ""
                };
                println!("version {version}: loads and exports `handle` ({world}{note})");
                true
            }
            Err(e) => {
                let refused = self.imports.iter().filter(|(_, ok)| !ok).count();
                println!("refused ({refused} disallowed import(s)): {e}");
                false
            }
        }
    }
}
