//! `idem dlq`: list, show, replay and purge dead letters.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use super::ConfigArg;

#[derive(Subcommand)]
pub enum DlqCommand {
    /// List dead letters, newest first.
    List {
        #[command(flatten)]
        config: ConfigArg,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One dead letter in full: payload, headers, error, attempts, plugin
    /// version, timestamps.
    Show {
        #[command(flatten)]
        config: ConfigArg,
        /// Its id (from `idem dlq list`).
        id: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Republish dead letters with their attempts reset; each record is
    /// deleted once its message is republished.
    Replay(DlqSelect),
    /// Delete dead-letter records (their messages stay settled as dead).
    Purge(DlqSelect),
}

#[derive(Args)]
pub struct DlqSelect {
    #[command(flatten)]
    config: ConfigArg,
    /// Dead-letter ids.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    ids: Vec<i64>,
    /// Every dead letter (of --plugin, if given).
    #[arg(long)]
    all: bool,
    /// Only this plugin's dead letters.
    #[arg(long)]
    plugin: Option<String>,
    /// Only dead letters whose reason contains this text.
    #[arg(long)]
    reason: Option<String>,
}

impl DlqSelect {
    fn selection(&self) -> idem_host::dlq::Selection {
        idem_host::dlq::Selection {
            ids: self.ids.clone(),
            all: self.all,
            plugin: self.plugin.clone(),
            reason: self.reason.clone(),
            dead_since: None,
            skip_missing: false,
        }
    }
}

/// Run one `idem dlq` command.
pub async fn main(cmd: DlqCommand) -> Result<ExitCode> {
    match cmd {
        DlqCommand::List { config, limit, json } => {
            let config = config.load()?;
            let backends = idem_host::backend::open(&config).await?;
            if json {
                println!("{}", serde_json::to_string(&backends.admin.dead_letters(limit).await?)?);
            } else {
                for d in backends.admin.dead_letter_summaries(limit).await? {
                    println!(
                        "{:>6}  {:<16} {:<24} attempts {:<3} {}",
                        d.id, d.plugin, d.key, d.attempts, d.reason
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Show { config, id, json } => {
            let config = config.load()?;
            let backends = idem_host::backend::open(&config).await?;
            let Some(d) = backends.admin.dead_letter_get(id).await? else {
                bail!("no dead letter with id {id}; `idem dlq list` shows the ids");
            };
            if json {
                println!("{}", serde_json::to_string(&d)?);
            } else {
                let time = |ms: i64| format!("{ms} ms since the epoch");
                println!("dead letter {}", d.id);
                println!(
                    "  plugin          {} (version {})",
                    d.plugin,
                    d.plugin_version.as_deref().unwrap_or("unknown")
                );
                println!("  key             {}", d.key);
                println!("  message id      {}", d.msg_id);
                println!("  attempts        {}", d.attempts);
                println!("  first seen      {}", time(d.first_seen_at));
                println!("  dead-lettered   {}", time(d.dead_at));
                println!("  reason          {}", d.reason);
                for (k, v) in &d.headers {
                    println!("  header          {k}: {v}");
                }
                println!("  payload         {}", String::from_utf8_lossy(&d.payload));
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Replay(sel) => {
            let config = sel.config.load()?;
            let backends = idem_host::backend::open(&config).await?;
            let selection = sel.selection();
            let done = idem_host::dlq::replay(&backends, &selection).await?;
            for r in &done.replayed {
                println!(
                    "replayed dead letter {} ({} {}){}",
                    r.id,
                    r.plugin,
                    r.key,
                    if r.claim_revived { "" } else { "; no dead claim to reset" }
                );
            }
            for k in &done.kept {
                eprintln!("kept dead letter {}: {}", k.id, k.why);
            }
            eprintln!("{} dead letter(s) republished", done.replayed.len());
            // One named by id and kept is a failure; --all passes over them.
            Ok(if done.kept.is_empty() || selection.all {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        DlqCommand::Purge(sel) => {
            let config = sel.config.load()?;
            let backends = idem_host::backend::open(&config).await?;
            let n = idem_host::dlq::purge(&backends, &sel.selection()).await?;
            eprintln!("{n} dead letter(s) deleted");
            Ok(ExitCode::SUCCESS)
        }
    }
}
