//! Developer commands: `cargo xtask demo [-- ARGS]`, `cargo xtask test`,
//! `cargo xtask chaos [-- ARGS]`, `cargo xtask plugins`, `cargo xtask build`,
//! `cargo xtask lint` (formatting and clippy alone, in check mode),
//! `cargo xtask chart IN.json OUT.png` (the benchmark chart).
//!
//! Each sets up what it needs on a fresh machine: the `wasm32-wasip2`
//! target, the plugin components, the host binary, and (for `test`) the
//! services of `scripts/services.sh`. Everything built lands
//! in `target/`: plugins in `target/plugins/wasm32-wasip2/plugin/`, the host
//! in `target/release/`, the dependencies built once for the demo and the
//! tests. `test` lints as it builds: the workspace's own crates go through
//! clippy with warnings denied (after a demo, it recompiles those crates,
//! not the dependencies).

mod chart;
mod guests;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

const WASM_TARGET: &str = "wasm32-wasip2";
/// The cargo-fuzz `cargo xtask fuzz` installs under `target/tools`.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

fn main() {
    if let Err(e) = try_main() {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

fn try_main() -> Result<()> {
    // `cargo run` describes xtask's own package to it in CARGO_PKG_* and
    // CARGO_MANIFEST_*. Build scripts that watch those names (ring's, and
    // with it everything over TLS) would see them change between a cargo
    // started here and one started from a shell, and rebuild each time.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_MANIFEST_LINKS",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&name.as_str())
        {
            std::env::remove_var(&name);
        }
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = args
        .split_first()
        .map(|(t, r)| (t.as_str(), r.to_vec()))
        .unwrap_or(("help", Vec::new()));
    let rest: Vec<String> = rest.into_iter().skip_while(|a| a == "--").collect();
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    match task {
        "demo" => {
            // The Python and JavaScript ports (and their toolchains, from
            // PyPI and npm) only when the demo is asked to run them.
            let guests = rest.windows(2).any(|w| w[0] == "--lang" && w[1] != "rust")
                || rest.iter().any(|a| a.starts_with("--lang=") && a != "--lang=rust");
            let plugins = build_plugins(&root, guests, Lint::Off)?;
            let mut cmd = Command::new(root.join("target/release/idem"));
            cmd.arg("demo").arg("--plugins").arg(&plugins).args(&rest);
            run(&mut cmd)
        }
        "test" => {
            // The suite runs against real PostgreSQL, Redis, RabbitMQ,
            // NATS, an SQS server and a Kafka server: check each answers,
            // start (or install) what does not.
            run(Command::new("bash").arg(root.join("scripts/services.sh")))?;
            // The suite includes the lints: formatting first (seconds), then
            // every build below compiles the workspace's crates through
            // clippy with warnings denied, so linting costs no second
            // compilation of the dependencies.
            cargo(&["fmt", "--all", "--check"])?;
            let lint = Lint::Deny;
            let plugins = build_plugins(&root, true, lint)?;
            let mut build = Command::new("cargo");
            build
                .args(["build", "--release", "--workspace", "--exclude", "xtask", "--all-targets"])
                .args(plugin_excludes(&root)?);
            run(lint.apply(&mut build)?)?;
            let mut cmd = Command::new("cargo");
            cmd.args(["test", "--release", "--workspace", "--exclude", "xtask"])
                .args(plugin_excludes(&root)?)
                .env("IDEM_PLUGIN_DIR", &plugins)
                // A failing test's message, not pages of backtrace, ends
                // its report (the panic's file and line are printed
                // either way): where only a log's tail is kept, the
                // message is what it keeps. Set whatever the environment
                // says, since CI's sets backtraces on.
                .env("RUST_BACKTRACE", "0")
                .args(&rest);
            run(local_aws_credentials(lint.apply(&mut cmd)?))?;
            cargo(&["clippy", "-p", "xtask", "--", "-D", "warnings"])?;
            // A CI-sized chaos run per example deployment, on the binary the
            // tests just built. Fixed seeds keep CI reproducible; run
            // `cargo xtask chaos -- --config FILE` for new seeds.
            if rest.is_empty() {
                // Then the Python and JavaScript ports on two of the
                // production deployments.
                for (config, seed, lang) in [
                    ("embedded", 101, "rust"),
                    ("redis-postgres", 102, "rust"),
                    ("rabbitmq-postgres", 103, "rust"),
                    ("nats-postgres", 104, "rust"),
                    ("sqs-postgres", 107, "rust"),
                    ("kafka-postgres", 108, "rust"),
                    ("redis-postgres", 105, "python"),
                    ("rabbitmq-postgres", 106, "js"),
                ] {
                    let mut chaos = chaos_command(&root)?;
                    chaos
                        .args([
                            "--messages",
                            "2000",
                            "--timeout-secs",
                            "300",
                            "--seed",
                            &seed.to_string(),
                            "--lang",
                            lang,
                            "--config",
                        ])
                        .arg(root.join("examples").join(format!("{config}.toml")))
                        .arg("--plugins")
                        .arg(&plugins);
                    run(&mut chaos)?;
                }
            }
            Ok(())
        }
        "chaos" => {
            run(Command::new("bash").arg(root.join("scripts/services.sh")))?;
            let plugins = build_plugins(&root, true, Lint::Off)?;
            let mut cmd = chaos_command(&root)?;
            cmd.arg("--plugins").arg(&plugins).args(&rest);
            run(&mut cmd)
        }
        "fuzz" => fuzz(&root, &rest),
        "chart" => match rest.as_slice() {
            [input, output] => chart::chart(Path::new(input), Path::new(output)),
            _ => bail!("usage: cargo xtask chart INPUT.json OUTPUT.png"),
        },
        "plugins" | "build" => build_plugins(&root, true, Lint::Off).map(|dir| println!("{}", dir.display())),
        "lint" => {
            cargo(&["fmt", "--all", "--check"])?;
            cargo(&[
                "clippy",
                "--workspace",
                "--exclude",
                "xtask",
                "--all-targets",
                "--release",
                "--",
                "-D",
                "warnings",
            ])?;
            cargo(&["clippy", "-p", "xtask", "--", "-D", "warnings"])?;
            let mut cmd = Command::new("cargo");
            cmd.args([
                "clippy",
                "--profile",
                "plugin",
                "--target",
                WASM_TARGET,
                "--target-dir",
                "target/plugins",
            ]);
            for p in plugin_crates(&root)? {
                cmd.args(["-p", &p]);
            }
            cmd.args(["--", "-D", "warnings"]);
            run(&mut cmd)
        }
        _ => {
            eprintln!("usage: cargo xtask <demo [-- ARGS] | test [-- ARGS] | chaos [-- ARGS] | fuzz [-- SECONDS [TARGET…]] | plugins | build | lint | chart IN.json OUT.png>");
            if task == "help" {
                Ok(())
            } else {
                bail!("unknown task {task:?}")
            }
        }
    }
}

/// Build cargo-fuzz targets and run each briefly: `-- [SECONDS [TARGET…]]`,
/// 20 s and the `envelope` target by default. `claims` builds the whole
/// host under the fuzzer's flags (about twenty minutes here); its model
/// check also runs in the test suite on seeded random sequences.
/// cargo-fuzz needs nightly-only compiler flags; `RUSTC_BOOTSTRAP=1` lets
/// this stable toolchain accept them.
fn fuzz(root: &Path, rest: &[String]) -> Result<()> {
    let seconds = rest.first().map(String::as_str).unwrap_or("20");
    let mut targets: Vec<&str> = rest.iter().skip(1).map(String::as_str).collect();
    if targets.is_empty() {
        targets.push("envelope");
    }
    if let Some(unknown) = targets.iter().find(|t| !["envelope", "claims"].contains(t)) {
        bail!("no fuzz target {unknown:?}: the targets are envelope and claims");
    }
    // cargo-fuzz, pinned and installed under target/tools like the other
    // tools the project's scripts fetch; run as `cargo-fuzz fuzz …`, the
    // way cargo runs a subcommand.
    let tool_root = root.join("target/tools/cargo-fuzz");
    let cargo_fuzz = tool_root.join("bin/cargo-fuzz");
    let installed = Command::new(&cargo_fuzz)
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(CARGO_FUZZ_VERSION));
    if !installed {
        run(Command::new("cargo")
            .args(["install", "cargo-fuzz", "--locked", "--version", CARGO_FUZZ_VERSION, "--root"])
            .arg(&tool_root))?;
    }
    let fuzz_dir = root.join("fuzz");
    let target_dir = root.join("target/fuzz");
    let features: &[&str] = if targets.contains(&"claims") {
        &["--features", "claims"]
    } else {
        &[]
    };
    // Every target the features allow (`claims` needs its feature).
    run(Command::new(&cargo_fuzz)
        .args(["fuzz", "build", "-O", "--target-dir"])
        .arg(&target_dir)
        .args(features)
        .current_dir(&fuzz_dir)
        .env("RUSTC_BOOTSTRAP", "1"))?;
    for target in &targets {
        let corpus = target_dir.join("corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        run(Command::new(&cargo_fuzz)
            .args(["fuzz", "run", "-O", "--target-dir"])
            .arg(&target_dir)
            .args(features)
            .arg(target)
            .arg(&corpus)
            .args(["--", &format!("-max_total_time={seconds}"), "-rss_limit_mb=4096"])
            .current_dir(&fuzz_dir)
            .env("RUSTC_BOOTSTRAP", "1"))?;
    }
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Credentials for the local SQS-compatible server the tests and chaos
/// runs use (it accepts any), where the environment sets none.
fn local_aws_credentials(cmd: &mut Command) -> &mut Command {
    for (name, value) in [
        ("AWS_ACCESS_KEY_ID", "idem-test"),
        ("AWS_SECRET_ACCESS_KEY", "idem-test"),
        ("AWS_REGION", "us-east-1"),
    ] {
        if std::env::var_os(name).is_none() {
            cmd.env(name, value);
        }
    }
    cmd
}

/// `idem chaos` on the built binary, with the local SQS credentials and
/// `target/tools/bin` first on `PATH`: a chaos run starts and restarts a
/// NATS server of its own, the one `scripts/services.sh` pins there.
fn chaos_command(root: &Path) -> Result<Command> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(root.join("target/tools/bin")).chain(std::env::split_paths(&path).filter(|d| !d.as_os_str().is_empty()));
    let mut cmd = Command::new(root.join("target/release/idem"));
    cmd.env("PATH", std::env::join_paths(dirs)?).arg("chaos");
    local_aws_credentials(&mut cmd);
    Ok(cmd)
}

/// Run a command, saying how long it took (CI logs show where the time goes).
fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let started = std::time::Instant::now();
    let status = cmd.status().with_context(|| format!("cannot start {cmd:?}"))?;
    let words: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args().take(3))
        .map(|w| Path::new(w).file_name().unwrap_or(w).to_string_lossy().into_owned())
        .collect();
    eprintln!("xtask: {} took {:.0} s", words.join(" "), started.elapsed().as_secs_f64());
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn cargo(args: &[&str]) -> Result<()> {
    run(Command::new("cargo").args(args))
}

/// Add the wasm target if this toolchain lacks it.
fn ensure_wasm_target() -> Result<()> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("rustup is needed to add the wasm32-wasip2 target")?;
    if String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == WASM_TARGET) {
        return Ok(());
    }
    run(Command::new("rustup").args(["target", "add", WASM_TARGET]))
}

/// Crate names of the example plugins (every directory under plugins/).
fn plugin_crates(root: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(root.join("plugins"))? {
        let path = entry?.path();
        if path.join("Cargo.toml").exists() {
            names.push(path.file_name().expect("dir name").to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

fn plugin_excludes(root: &Path) -> Result<Vec<String>> {
    Ok(plugin_crates(root)?
        .into_iter()
        .flat_map(|p| ["--exclude".to_string(), p])
        .collect())
}

/// How the workspace's own crates are compiled.
#[derive(Clone, Copy)]
enum Lint {
    /// By rustc, as `cargo build` does.
    Off,
    /// Through clippy, as cargo's workspace wrapper, with warnings denied:
    /// the build is also the lint pass of `cargo clippy -- -D warnings`.
    /// Dependencies are compiled as in a plain build (the wrapper applies
    /// to workspace members only), so no second, check-mode compilation of
    /// them is needed, as `cargo clippy` would make.
    Deny,
}

impl Lint {
    fn apply(self, cmd: &mut Command) -> Result<&mut Command> {
        if let Lint::Deny = self {
            // clippy-driver sits beside the cargo that started xtask;
            // CLIPPY_ARGS is how `cargo clippy` hands it lint flags.
            let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            let driver = cargo.with_file_name("clippy-driver");
            if !driver.is_file() {
                bail!(
                    "{} not found: the test suite lints while it builds; install clippy with `rustup component add clippy`",
                    driver.display()
                );
            }
            cmd.env("RUSTC_WORKSPACE_WRAPPER", driver)
                .env("CLIPPY_ARGS", "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__");
        }
        Ok(cmd)
    }
}

/// Build every plugin as a component (the Python and JavaScript ones only
/// with `guests`), and the release host that builds those; return the
/// directory holding the plugins. The workspace's crates are compiled as
/// `lint` says. The host is built with the same package set as `test`, so
/// both share one build of the dependencies (features are unified per
/// package set).
fn build_plugins(root: &Path, guests: bool, lint: Lint) -> Result<PathBuf> {
    ensure_wasm_target()?;
    let mut cmd = Command::new("cargo");
    cmd.args([
        "build",
        "--profile",
        "plugin",
        "--target",
        WASM_TARGET,
        "--target-dir",
        "target/plugins",
    ]);
    for p in plugin_crates(root)? {
        cmd.args(["-p", &p]);
    }
    run(lint.apply(&mut cmd)?)?;
    let out = root.join("target/plugins").join(WASM_TARGET).join("plugin");
    let mut build = Command::new("cargo");
    build
        .args(["build", "--release", "--workspace", "--exclude", "xtask"])
        .args(plugin_excludes(root)?);
    run(lint.apply(&mut build)?)?;
    if guests {
        guests::build_guest_plugins(root, &root.join("target/release/idem"), &out)?;
    }
    Ok(out)
}
