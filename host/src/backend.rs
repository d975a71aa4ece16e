//! Opening the backends a configuration names.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use crate::broker::Broker;
use crate::claim::ClaimStore;
use crate::config::Config;
use crate::store::DataStore;

/// The three roles a worker needs.
#[derive(Clone)]
pub struct Backends {
    /// Where deliveries come from.
    pub broker: Arc<dyn Broker>,
    /// Claims, journal, dead letters.
    pub claims: Arc<dyn ClaimStore>,
    /// Plugin data.
    pub data: Arc<dyn DataStore>,
}

/// Open (creating if needed) the embedded SQLite database and apply its
/// migrations.
pub async fn open_sqlite(config: &Config) -> Result<SqlitePool> {
    let path = &config.database.path;
    let options = SqliteConnectOptions::from_str("sqlite:")?
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(config.database.max_connections.max(1))
        .connect_with(options)
        .await
        .with_context(|| {
            format!(
                "cannot open the SQLite database {} (database.path): check that its directory exists and is writable",
                path.display()
            )
        })?;
    sqlx::migrate!("./migrations/sqlite")
        .run(&pool)
        .await
        .with_context(|| format!("cannot migrate the SQLite database {}", path.display()))?;
    Ok(pool)
}

/// The embedded backends, all on one SQLite file.
pub async fn open(config: &Config) -> Result<Backends> {
    let pool = open_sqlite(config).await?;
    Ok(Backends {
        broker: Arc::new(crate::broker::sqlite::SqliteBroker::new(pool.clone())),
        claims: Arc::new(crate::claim::sqlite::SqliteClaims::new(pool.clone())),
        data: Arc::new(crate::store::sqlite::SqliteData::new(pool)),
    })
}
