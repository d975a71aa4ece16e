//! The command line's parts beyond `main.rs`: arguments the commands share,
//! the log's set-up and the `idem plugin` subcommands.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use idem_host::config::Config;

pub mod alloc;
pub mod dlq;
pub mod logging;
pub mod plugin;

#[derive(Args, Clone)]
pub struct ConfigArg {
    /// Configuration file (TOML). Without one, the embedded SQLite backend
    /// in ./idem.db.
    #[arg(long, short, env = "IDEM_CONFIG")]
    pub config: Option<PathBuf>,
}

impl ConfigArg {
    /// The configuration: the file, or the defaults with the environment
    /// applied.
    pub fn load(&self) -> Result<Config> {
        match &self.config {
            Some(path) => Config::load(path),
            None => {
                let mut c = Config::default();
                c.apply_env()?;
                c.validate()?;
                Ok(c)
            }
        }
    }
}
