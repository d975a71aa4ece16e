//! The docs' commands, run: every shell block of the README, the
//! quickstart, configuration, operating and writing-a-plugin pages runs
//! here, so a doc that drifts from the code fails the suite.
//!
//! How a page is read:
//! - ```` ```console ```` blocks are transcripts: `$ COMMAND` lines (a
//!   trailing `\` continues a command on the next line), each followed by
//!   the output it must print (stdout and stderr, as a terminal shows them).
//!   `[..]` in a line matches any text, a line `...` any number of lines. A
//!   last output line `[exit status: N]` expects that status; otherwise the
//!   command must succeed.
//! - ```` ```sh ```` blocks are commands without transcripts: each must
//!   succeed. `# …` after two spaces is a comment.
//! - A command ending in `&`, and `idem run` and `idem mock-api` (which
//!   serve until stopped), run in the background, numbered like a shell's
//!   jobs from `%1` for the page; `kill [-SIGNAL] %N` signals one. What is
//!   left runs until the page is done.
//! - Commands that read a running pool (`idem stats`, `idem dlq list`,
//!   `curl`) are repeated until their output matches, for up to two
//!   minutes (a killed worker's delivery waits out its visibility timeout),
//!   as a reader would run them again.
//!
//! Each page runs in a scratch directory holding a copy of `examples/` and
//! the repository's `target/` (built plugins and the `idem` binary, first on
//! `PATH`). A command the suite cannot run here is listed in [`NOT_RUN`]
//! with the reason and where it is covered instead; a listed command that no
//! page shows any more fails too, so the list cannot go stale.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The pages whose commands run.
const PAGES: &[&str] = &[
    "README.md",
    "docs/quickstart.md",
    "docs/configuration.md",
    "docs/operating.md",
    "docs/writing-a-plugin.md",
];

/// Commands shown in the docs that are not run here: (command prefix, why,
/// and what covers it instead).
const NOT_RUN: &[(&str, &str)] = &[
    ("cargo xtask test", "this suite is what it runs"),
    (
        "cargo xtask demo",
        "builds, then runs `idem demo`, which cli::demo_json_reports_no_double_effect_and_nothing_lost runs",
    ),
    (
        "cargo xtask build",
        "run by `cargo xtask test` before this suite (the plugins and target/release/idem)",
    ),
    ("cargo xtask plugins", "run by `cargo xtask test` before this suite"),
    ("rustup target add wasm32-wasip2", "run by every cargo xtask command"),
    (
        "cargo install --locked --path host",
        "installs the binary this suite runs from target/release into ~/.cargo/bin",
    ),
    (
        "cargo build --target wasm32-wasip2 --release",
        "builds the reader's own plugin crate; cargo xtask plugins builds the shipped ones the same way",
    ),
    (
        "idem plugin check target/wasm32-wasip2/release/welcome_user.wasm",
        "the reader's own plugin; cli::plugin_check_accepts_an_example_plugin runs the command on a shipped one",
    ),
    (
        "idem publish --config idem.toml --handler welcome-user",
        "the reader's own plugin and configuration; the quickstart publishes to a shipped one",
    ),
    (
        "idem verify welcome-user --config idem.toml",
        "the reader's own plugin; writing-a-plugin.md's transcript runs `idem verify` on a shipped one",
    ),
];

/// One command of a page.
#[derive(Debug)]
struct Step {
    page: &'static str,
    line: usize,
    command: String,
    /// The transcript's output, for console blocks.
    expected: Option<String>,
}

/// The shell blocks of a page, as steps.
fn steps(page: &'static str, text: &str) -> Vec<Step> {
    let mut out = Vec::new();
    let mut lang: Option<String> = None;
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        if let Some(fence) = line.trim_start().strip_prefix("```") {
            lang = match lang {
                Some(_) => None,
                None => Some(fence.trim().to_string()),
            };
            continue;
        }
        match lang.as_deref() {
            Some("console") => {
                let Some(first) = line.strip_prefix("$ ") else { continue };
                let mut command = first.to_string();
                while command.ends_with('\\') {
                    command.pop();
                    let (_, next) = lines.next().expect("a continued command goes on");
                    command.push_str(next.trim_start());
                }
                let mut expected = Vec::new();
                while let Some((_, next)) = lines.peek() {
                    if next.starts_with("$ ") || next.trim_start().starts_with("```") {
                        break;
                    }
                    expected.push(lines.next().expect("peeked").1);
                }
                out.push(Step {
                    page,
                    line: i + 1,
                    command,
                    expected: Some(expected.join("\n")),
                });
            }
            Some("sh") => {
                let code = line.split("  #").next().unwrap_or_default().trim();
                if code.is_empty() || code.starts_with('#') {
                    continue;
                }
                let mut command = code.to_string();
                while command.ends_with('\\') {
                    command.pop();
                    let (_, next) = lines.next().expect("a continued command goes on");
                    command.push_str(next.split("  #").next().unwrap_or_default().trim());
                }
                out.push(Step {
                    page,
                    line: i + 1,
                    command,
                    expected: None,
                });
            }
            _ => {}
        }
    }
    out
}

fn not_run_reason(command: &str) -> Option<&'static str> {
    NOT_RUN.iter().find(|(prefix, _)| command.starts_with(prefix)).map(|(_, why)| *why)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A page's terminal: its scratch directory and background jobs.
struct Session {
    dir: tempfile::TempDir,
    path: String,
    jobs: Vec<(String, Child, PathBuf)>,
}

impl Session {
    fn new() -> Session {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&repo().join("examples"), &dir.path().join("examples"));
        std::os::unix::fs::symlink(repo().join("target"), dir.path().join("target")).unwrap();
        let bin = Path::new(env!("CARGO_BIN_EXE_idem")).parent().unwrap().to_path_buf();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        Session {
            dir,
            path,
            jobs: Vec::new(),
        }
    }

    fn shell(&self, command: &str) -> Command {
        let mut c = Command::new("bash");
        c.arg("-c")
            .arg(command)
            .current_dir(self.dir.path())
            .env("PATH", &self.path)
            // Plugin toolchains and builds stay under this repository's
            // target/, shared with the other tests.
            .env("IDEM_TOOLS_DIR", repo().join("target/tools"))
            .env("CARGO_TARGET_DIR", repo().join("target/newcomer"))
            .env_remove("IDEM_CONFIG")
            .stdin(Stdio::null());
        c
    }

    /// Run in the foreground: exit status and what it printed.
    fn run(&self, command: &str) -> (i32, String) {
        let out = self.shell(&format!("exec 2>&1; {command}")).output().unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn background(&mut self, command: &str) {
        let log = self.dir.path().join(format!("job-{}.log", self.jobs.len() + 1));
        let file = std::fs::File::create(&log).unwrap();
        let child = self
            .shell(&format!("exec {command}"))
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        self.jobs.push((command.to_string(), child, log));
    }

    /// `kill [-SIGNAL] %N`.
    fn kill(&mut self, args: &str, at: &str) {
        let (signal, job) = match args.split_once(' ') {
            Some((s, j)) => (s.trim_start_matches('-'), j.trim()),
            None => ("TERM", args.trim()),
        };
        let n: usize = job
            .strip_prefix('%')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{at}: kill takes a job, like %1"));
        let (command, child, _) = self.jobs.get_mut(n - 1).unwrap_or_else(|| panic!("{at}: there is no job %{n}"));
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "{at}: cannot signal job %{n} ({command})");
        child.wait().unwrap();
    }

    fn logs(&self) -> String {
        self.jobs
            .iter()
            .map(|(c, _, log)| format!("--- %{c}\n{}", std::fs::read_to_string(log).unwrap_or_default()))
            .collect()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.jobs {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Does `actual` match the transcript `expected` (with `[..]` and `...`)?
fn matches(expected: &str, actual: &str) -> Result<(), String> {
    snapbox::Assert::new()
        .try_eq(
            None,
            snapbox::Data::text(actual.trim_end()),
            snapbox::Data::text(expected.trim_end()),
        )
        .map_err(|e| e.to_string())
}

fn observes(command: &str) -> bool {
    ["idem stats", "idem dlq list", "idem plugin list", "curl "]
        .iter()
        .any(|p| command.starts_with(p))
}

fn serves(command: &str) -> bool {
    command.starts_with("idem run") || command.starts_with("idem mock-api")
}

/// A transcript's expected exit status (a last line `[exit status: N]`,
/// else 0) and the output before it.
fn split_status(expected: &str) -> (i32, &str) {
    let trimmed = expected.trim_end();
    let (rest, last) = trimmed.rsplit_once('\n').unwrap_or(("", trimmed));
    match last.strip_prefix("[exit status: ").and_then(|s| s.strip_suffix(']')) {
        Some(n) => (n.parse().expect("an exit status is a number"), rest),
        None => (0, expected),
    }
}

fn run_page(steps: &[&Step]) {
    let mut session = Session::new();
    for step in steps {
        let at = format!("{}:{}: `{}`", step.page, step.line, step.command);
        if not_run_reason(&step.command).is_some() {
            continue;
        }
        if let Some(args) = step.command.strip_prefix("kill ") {
            session.kill(args, &at);
            continue;
        }
        if let Some(command) = step.command.strip_suffix('&') {
            session.background(command.trim());
            continue;
        }
        if serves(&step.command) {
            session.background(&step.command);
            continue;
        }
        let (want_status, expected) = split_status(step.expected.as_deref().unwrap_or_default());
        let patience = if observes(&step.command) {
            Duration::from_secs(120)
        } else {
            Duration::ZERO
        };
        let deadline = Instant::now() + patience;
        loop {
            let (status, output) = session.run(&step.command);
            let verdict = if status != want_status {
                Err(format!("exit status {status}, expected {want_status}"))
            } else if step.expected.is_some() {
                matches(expected, &output)
            } else {
                Ok(())
            };
            match verdict {
                Ok(()) => break,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(250)),
                Err(why) => panic!("{at}: {why}\n--- printed:\n{output}\n--- background jobs:\n{}", session.logs()),
            }
        }
    }
}

fn all_steps() -> Vec<Step> {
    PAGES
        .iter()
        .flat_map(|page| {
            let text = std::fs::read_to_string(repo().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
            steps(page, &text)
        })
        .collect()
}

#[test]
fn every_command_in_the_docs_is_run_or_says_why_not() {
    let steps = all_steps();
    assert!(steps.len() > 20, "the docs show {} commands; the parser lost some", steps.len());
    for s in &steps {
        let known = s.command.starts_with("idem ")
            || s.command.starts_with("curl ")
            || s.command.starts_with("kill ")
            || not_run_reason(&s.command).is_some();
        assert!(
            known,
            "{}:{}: `{}` is neither an idem command this suite runs nor listed in NOT_RUN with a reason",
            s.page, s.line, s.command
        );
    }
    let shown: BTreeSet<&str> = NOT_RUN
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| steps.iter().any(|s| s.command.starts_with(p)))
        .collect();
    for (prefix, _) in NOT_RUN {
        assert!(shown.contains(prefix), "NOT_RUN lists `{prefix}`, which no page shows any more");
    }
}

/// Each page in its own scratch directory; the pages share fixed ports
/// (the quickstart's mock and metrics), so they run one after another.
#[test]
fn the_docs_commands_work_as_written() {
    let steps = all_steps();
    for page in PAGES {
        let mine: Vec<&Step> = steps.iter().filter(|s| s.page == *page).collect();
        run_page(&mine);
    }
}

#[test]
fn transcripts_are_parsed_with_their_output() {
    let page = "```console\n$ idem stats --config a.toml\npending 0\n$ idem publish \\\n    --x 1\n[exit status: 2]\n```\n```sh\nidem run --config a.toml   # serves\n# a comment\n```\n";
    let s = steps("t.md", page);
    assert_eq!(s.len(), 3);
    assert_eq!(
        (s[0].command.as_str(), s[0].expected.as_deref()),
        ("idem stats --config a.toml", Some("pending 0"))
    );
    assert_eq!(
        (s[1].command.as_str(), s[1].expected.as_deref()),
        ("idem publish --x 1", Some("[exit status: 2]"))
    );
    assert_eq!(
        (s[2].command.as_str(), s[2].expected.as_deref()),
        ("idem run --config a.toml", None)
    );
    assert_eq!(split_status("out\n[exit status: 1]"), (1, "out"));
    assert_eq!(split_status("[exit status: 2]"), (2, ""));
    assert_eq!(split_status("out"), (0, "out"));
    assert!(matches("a [..] c\n...\nz", "a b c\nx\ny\nz").is_ok());
    assert!(matches("a [..] c", "a b d").is_err());
}
