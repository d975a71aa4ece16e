//! `idem plugin`: create, build, check, list and rekey plugins.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use idem_host::tools::sdk::{self, Lang};
use idem_host::{app, observe};

use super::ConfigArg;

#[derive(Subcommand)]
pub enum PluginCommand {
    /// Create a plugin project in a new directory: a handler that builds, the
    /// SDK, a configuration for the embedded backend and sample messages.
    New {
        /// The directory to create; its name is the plugin's name.
        dir: PathBuf,
        /// The handler's language.
        #[arg(long, value_enum, default_value_t = Lang::Rust)]
        lang: Lang,
    },
    /// Build a plugin project into a component (Rust: cargo with a 128 KiB
    /// stack; Python: componentize-py with WASI stubbed; JavaScript:
    /// componentize-js with every WASI feature off), then check it.
    Build {
        /// The project directory (Cargo.toml, app.py or app.js).
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// The language, when the directory does not say.
        #[arg(long, value_enum)]
        lang: Option<Lang>,
        /// Where the component goes (default DIR/build/NAME.wasm).
        #[arg(long, short)]
        out: Option<PathBuf>,
        /// Where pinned toolchains (componentize-py, componentize-js) are
        /// installed on first use (default $IDEM_TOOLS_DIR, else
        /// ~/.cache/idem/tools).
        #[arg(long)]
        tools_dir: Option<PathBuf>,
        #[command(flatten)]
        cache: CompileCacheArg,
    },
    /// Compile a component and list its imports; refuse disallowed ones.
    Check {
        /// The component file.
        file: PathBuf,
        #[command(flatten)]
        cache: CompileCacheArg,
    },
    /// Record the configuration's `key_pointer` of a plugin as the one its
    /// keys are derived with in this namespace. Run it after changing the
    /// pointer, once no message is queued, running or waiting for a retry:
    /// keys derived two ways would let a message run twice.
    Rekey {
        /// The plugin.
        name: String,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// What a running pool has loaded (asks its HTTP endpoint).
    List {
        #[command(flatten)]
        config: ConfigArg,
        /// The pool's HTTP address (default: http.listen of the configuration).
        #[arg(long)]
        url: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Where `plugin build` and `plugin check` keep the compiled component.
#[derive(clap::Args)]
pub struct CompileCacheArg {
    /// Keep the compiled component in this directory, so a worker whose
    /// `worker.compile_cache_dir` is the same directory (and whose engine
    /// settings match) loads it without compiling it again.
    #[arg(long, value_name = "DIR")]
    compile_cache: Option<PathBuf>,
}

/// Run one `idem plugin` subcommand.
pub async fn main(cmd: PluginCommand) -> Result<ExitCode> {
    match cmd {
        PluginCommand::Check { file, cache } => plugin_check(&file, &cache),
        PluginCommand::New { dir, lang } => {
            sdk::new_plugin(&dir, lang)?;
            println!(
                "created {} ({lang}); build it with `idem plugin build {}`",
                dir.display(),
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Build {
            dir,
            lang,
            out,
            tools_dir,
            cache,
        } => {
            let out = sdk::build(&sdk::BuildOptions { dir, lang, out, tools_dir })?;
            plugin_check(&out, &cache)
        }
        PluginCommand::List { config, url, json } => plugin_list(&config, url, json).await,
        PluginCommand::Rekey { name, config } => plugin_rekey(&name, &config).await,
    }
}

async fn plugin_list(config: &ConfigArg, url: Option<String>, json: bool) -> Result<ExitCode> {
    let url = match url {
        Some(u) => u,
        None => config
            .load()?
            .http
            .listen
            .context("no pool address: pass --url http://HOST:PORT, or set http.listen in the configuration")?,
    };
    let base = if url.contains("://") { url } else { format!("http://{url}") };
    let endpoint = format!("{}/plugins", base.trim_end_matches('/'));
    let loaded: Vec<observe::LoadedPlugin> = reqwest::get(&endpoint)
        .await
        .with_context(|| format!("cannot reach a running pool at {endpoint}; is `idem run` serving HTTP there (http.listen / --listen)?"))?
        .error_for_status()?
        .json()
        .await
        .with_context(|| format!("{endpoint} did not answer with the plugin list"))?;
    if json {
        println!("{}", serde_json::to_string(&loaded)?);
    } else {
        for p in loaded {
            println!("{:<20} {}  loaded at {} ms", p.name, p.version, p.loaded_at);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn plugin_rekey(name: &str, config: &ConfigArg) -> Result<ExitCode> {
    let config = config.load()?;
    let plugin = config
        .plugins
        .get(name)
        .with_context(|| format!("no plugin {name:?} in the configuration (its [plugins.{name}] section)"))?;
    let backends = idem_host::backend::open(&config).await?;
    let stats = app::stats(&backends).await?;
    if stats.pending > 0 || stats.in_flight > 0 || stats.retry > 0 {
        anyhow::bail!(
            "not rekeyed: {} messages are queued, {} running and {} waiting for a retry; their keys were derived with the recorded pointer. Stop the producers, let the workers drain the queue (`idem stats`), then run this again",
            stats.pending,
            stats.in_flight,
            stats.retry
        );
    }
    let pointer = plugin.key_pointer.as_deref().unwrap_or("");
    backends.admin.set_key_pointer(name, pointer, idem_host::now_ms()).await?;
    println!(
        "{name}: keys are derived with {} from now on",
        if pointer.is_empty() {
            "the message id".to_string()
        } else {
            format!("key_pointer {pointer:?}")
        }
    );
    Ok(ExitCode::SUCCESS)
}

fn plugin_check(file: &Path, cache: &CompileCacheArg) -> Result<ExitCode> {
    let report = sdk::check(file, cache.compile_cache.as_deref())?;
    Ok(if report.print(file) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
