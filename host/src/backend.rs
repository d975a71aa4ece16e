//! Opening the backends a configuration names.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use crate::broker::Broker;
use crate::claim::{ClaimAdmin, ClaimStore};
use crate::clock::StoreClock;
use crate::config::{BrokerKind, Config, StoreKind};
use crate::store::DataStore;

/// The three roles a worker needs.
#[derive(Clone)]
pub struct Backends {
    /// Where deliveries come from.
    pub broker: Arc<dyn Broker>,
    /// Claims, journal, dead letters: what a worker does to them.
    pub claims: Arc<dyn ClaimStore>,
    /// The same store as operators and tools see it (counts, dead-letter
    /// list and replay, readiness).
    pub admin: Arc<dyn ClaimAdmin>,
    /// Plugin data.
    pub data: Arc<dyn DataStore>,
    /// The claim store's clock: the time of leases and retries.
    pub clock: Arc<StoreClock>,
}

/// Open (creating if needed) the embedded SQLite database and apply its
/// migrations.
pub async fn open_sqlite(config: &Config) -> Result<SqlitePool> {
    let path = &config.database.path;
    let options = SqliteConnectOptions::from_str("sqlite:")?
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(sqlite_synchronous(config.broker.kind))
        .busy_timeout(Duration::from_secs(5));
    // Processes that open a new database at once (a pool starting while
    // `idem publish` runs) would each create the file, switch it to WAL and
    // create the tables; SQLite answers some of those steps with "database
    // is locked" at once instead of waiting. Serialise opening and migrating
    // on an exclusive lock of a file beside the database. (Not the database
    // file itself: closing another descriptor of it would drop SQLite's own
    // locks.)
    let lock_path = migration_lock_path(path);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| {
            format!(
                "cannot create {} beside the SQLite database (database.path): check that its directory exists and is writable",
                lock_path.display()
            )
        })?;
    let lock = tokio::task::spawn_blocking(move || lock.lock().map(|()| lock))
        .await
        .context("the migration lock task panicked")?
        .with_context(|| format!("cannot lock {}", lock_path.display()))?;
    // A pool of another process writing at this moment can still make the
    // first connection's set-up see "database is locked" (SQLITE_BUSY)
    // without waiting; try again for up to five seconds.
    let mut attempts = 0;
    let pool = loop {
        let opened = SqlitePoolOptions::new()
            .max_connections(config.database.max_connections.max(1))
            .connect_with(options.clone())
            .await;
        match opened {
            // SQLITE_BUSY and its extended codes (261, 517, 773).
            Err(sqlx::Error::Database(e))
                if attempts < 100 && e.code().and_then(|c| c.parse::<i32>().ok()).is_some_and(|c| c & 0xff == 5) =>
            {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other,
        }
    }
    .with_context(|| {
        format!(
            "cannot open the SQLite database {} (database.path): check that its directory exists and is writable",
            path.display()
        )
    })?;
    let migrated = sqlx::migrate!("./migrations/sqlite").run(&pool).await;
    drop(lock);
    migrated.with_context(|| format!("cannot migrate the SQLite database {}", path.display()))?;
    Ok(pool)
}

/// How durable each SQLite commit is. With the queue in the same file
/// (`broker.kind = "sqlite"`), `NORMAL` suffices: an OS crash may roll the
/// last commits back, but consistently, acks included, so a lost confirm
/// comes back as a redelivery. With any other broker, an ack sent to the
/// broker cannot be rolled back with the file, so every commit (a confirm,
/// a dead letter, a data write) is synced before the ack: `FULL`.
pub fn sqlite_synchronous(broker: BrokerKind) -> SqliteSynchronous {
    if broker == BrokerKind::Sqlite {
        SqliteSynchronous::Normal
    } else {
        SqliteSynchronous::Full
    }
}

/// The file whose lock serialises migrations of the SQLite database at
/// `db`: `db` with `-migrate.lock` appended.
pub fn migration_lock_path(db: &std::path::Path) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-migrate.lock");
    std::path::PathBuf::from(name)
}

/// A pooled Postgres connection idle this long is tested before use.
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// Connect to Postgres, create the namespace's schema if needed, and apply
/// the migrations inside it. `setting` names the config section for errors.
pub async fn open_postgres(url: &str, namespace: &str, max_connections: u32, setting: &str) -> Result<PgPool> {
    let shown = crate::text::redact_url(url);
    let base = PgConnectOptions::from_str(url)
        .with_context(|| format!("{setting}.url {shown:?} is not a valid Postgres URL (postgres://user:password@host:port/database)"))?;
    let hint = || {
        format!("cannot connect to Postgres at {setting}.url = {shown:?}: check that the server is running and the user, password and database are right")
    };
    {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect_with(&base).await.with_context(hint)?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA IF NOT EXISTS \"{namespace}\"")))
            .execute(&mut conn)
            .await
            .or_else(|e| match &e {
                // Two processes creating the schema at once: one wins.
                sqlx::Error::Database(d) if d.code().as_deref() == Some("23505") || d.code().as_deref() == Some("42P06") => {
                    Ok(Default::default())
                }
                _ => Err(e),
            })
            .with_context(|| format!("cannot create schema {namespace:?} (namespace) in {setting}.url"))?;
        conn.close().await.ok();
    }
    // The application name lets an operator see (and a test terminate) a
    // deployment's connections in pg_stat_activity. Each prepared statement
    // is planned once per connection (its generic plan): planning every
    // execution took about a third of Postgres's CPU on the claim path. A
    // plan made while a namespace's tables were still empty must not read
    // them whole as they grow, so sequential scans are off wherever an index
    // can reach the rows (a statement with no such index still scans).
    // tests/integration/query_plans.rs checks the plans of the claim path
    // and of the data store's batch reads and deletes.
    let options = base
        .options([
            ("search_path", namespace),
            ("plan_cache_mode", "force_generic_plan"),
            ("enable_seqscan", "off"),
        ])
        .application_name(&format!("idem {namespace}"));
    // sqlx tests a connection with a round trip when it goes back to the
    // pool (closing it if that fails) and, by default, again when it is
    // handed out. The second test is made only for a connection that sat
    // idle a second or more, as the server may have closed it meanwhile:
    // it cost each group commit and claim batch a round trip of its own
    // (BENCHMARKS.md, item 20). A connection that breaks within a second
    // of its last use fails its next statement: a batch of writes is then
    // written item by item on other connections; a claim batch meets an
    // outage, decided by `worker.outage_policy` as when the store is down.
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .max_connections(max_connections.max(2))
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .with_context(hint)?;
    let mut lock = pool.acquire().await.with_context(hint)?;
    // Serialise migrations of concurrent starters on one advisory lock.
    sqlx::query(include_str!("../queries/postgres/migrate_lock.sql"))
        .execute(&mut *lock)
        .await?;
    let migrated = sqlx::migrate!("./migrations/postgres").run(&mut *lock).await;
    sqlx::query(include_str!("../queries/postgres/migrate_unlock.sql"))
        .execute(&mut *lock)
        .await?;
    migrated.with_context(|| format!("cannot migrate schema {namespace:?} in {setting}.url"))?;
    drop(lock);
    Ok(pool)
}

/// What the celery broker takes from a configuration.
fn celery_options(config: &Config) -> Result<crate::broker::celery::CeleryOptions> {
    let url = config.broker.url()?.to_string();
    let tasks = config
        .plugins
        .iter()
        .filter_map(|(name, p)| Some((p.celery_task.clone()?, name.clone())))
        .collect();
    // Unset: the broker's Redis, as a Celery app configured with
    // backend=broker would use; none on RabbitMQ (Celery's default).
    let result_backend = match config.broker.result_backend.as_deref() {
        None if url.starts_with("redis") => Some(url.clone()),
        None => None,
        Some("") => None,
        Some(other) => Some(other.to_string()),
    };
    Ok(crate::broker::celery::CeleryOptions {
        url,
        queues: config.broker.queues.clone(),
        tasks,
        result_backend,
        result_expires: std::time::Duration::from_secs(config.broker.result_expires_secs),
        namespace: config.namespace.clone(),
    })
}

/// What the sqs broker takes from a configuration.
pub fn sqs_options(config: &Config) -> crate::broker::sqs::SqsOptions {
    let b = &config.broker;
    crate::broker::sqs::SqsOptions {
        endpoint: b.url.clone(),
        region: b.region.clone(),
        queue: b.queue.clone().unwrap_or_else(|| config.namespace.clone()),
        wait_secs: b.wait_secs,
        max_attempts: config.retry.max_attempts,
        max_retry_delay_ms: config.retry.max_delay_ms,
        group_pointer: b.group_pointer.clone(),
        key_pointers: config
            .plugins
            .iter()
            .filter_map(|(name, p)| Some((name.clone(), p.key_pointer.clone()?)))
            .collect(),
    }
}

/// What the kafka broker takes from a configuration.
pub fn kafka_options(config: &Config) -> Result<crate::broker::kafka::KafkaOptions> {
    let b = &config.broker;
    let url = b.url()?;
    let servers = url.strip_prefix("kafka://").unwrap_or(url).trim_end_matches('/').to_string();
    let topics = if b.topics.is_empty() {
        vec![config.namespace.clone()]
    } else {
        b.topics.clone()
    };
    Ok(crate::broker::kafka::KafkaOptions {
        servers,
        topics,
        group: b.group.clone().unwrap_or_else(|| config.namespace.clone()),
        ordering: b.ordering,
        grace: Duration::from_millis(b.rebalance_grace_ms),
        key_pointer: b.group_pointer.clone(),
        key_pointers: config
            .plugins
            .iter()
            .filter_map(|(name, p)| Some((name.clone(), p.key_pointer.clone()?)))
            .collect(),
    })
}

/// The claim store's clock. A store that went away after it was connected
/// (restarted while this process starts) is waited for, as a running worker
/// waits out an outage (G8); one still unreachable after 30 s is an error.
async fn start_clock(admin: Arc<dyn ClaimAdmin>) -> Result<Arc<StoreClock>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut wait = Duration::from_millis(100);
    loop {
        match StoreClock::start(admin.clone(), 0).await {
            Ok(clock) => return Ok(clock),
            Err(e @ crate::claim::ClaimError::Unavailable(_)) if std::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, retry_in = ?wait, "cannot read the claim store's clock; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            Err(e) => anyhow::bail!("cannot read the claim store's clock: {e}"),
        }
    }
}

/// The backends a configuration names.
pub async fn open(config: &Config) -> Result<Backends> {
    let ns = &config.namespace;
    let uses_sqlite =
        config.broker.kind == BrokerKind::Sqlite || config.claims.kind == StoreKind::Sqlite || config.data.kind == StoreKind::Sqlite;
    let sqlite = if uses_sqlite { Some(open_sqlite(config).await?) } else { None };
    let sqlite_pool = || sqlite.clone().expect("opened above");

    let claims_pg = if config.claims.kind == StoreKind::Postgres {
        Some(open_postgres(config.claims.url("claims")?, ns, config.claims.max_connections, "claims").await?)
    } else {
        None
    };

    let broker: Arc<dyn Broker> = match config.broker.kind {
        BrokerKind::Sqlite => Arc::new(crate::broker::sqlite::SqliteBroker::new(sqlite_pool())),
        BrokerKind::Redis => Arc::new(crate::broker::redis::RedisBroker::connect(config.broker.url()?, ns).await?),
        BrokerKind::Rabbitmq => {
            // Five times the places in hand: as many again settling (their
            // writes committing), as many again waiting for their batched
            // confirm and ack, and twice that keeps deliveries arriving
            // ahead of the fetches. With twice the places, the inbox ran
            // dry while acks were on their way and scenario c ran 15%
            // slower (BENCHMARKS.md, item 13); the fifth keeps that room
            // since messages settling have their own places (item 24).
            let held = config.worker.concurrency.saturating_mul(config.worker.prefetch).saturating_mul(5);
            let prefetch = u16::try_from(held).unwrap_or(u16::MAX);
            Arc::new(crate::broker::amqp::AmqpBroker::connect_with_prefetch(config.broker.url()?, ns, prefetch).await?)
        }
        BrokerKind::Nats => Arc::new(crate::broker::nats::NatsBroker::connect(config.broker.url()?, ns, config.worker.visibility()).await?),
        BrokerKind::Celery => Arc::new(crate::broker::celery::CeleryBroker::connect(celery_options(config)?).await?),
        BrokerKind::Sqs => Arc::new(crate::broker::sqs::SqsBroker::connect(sqs_options(config)).await?),
        BrokerKind::Kafka => Arc::new(crate::broker::kafka::KafkaBroker::connect(kafka_options(config)?).await?),
    };
    fn both<T: ClaimStore + ClaimAdmin>(store: T) -> (Arc<dyn ClaimStore>, Arc<dyn ClaimAdmin>) {
        let store = Arc::new(store);
        (store.clone(), store)
    }
    let (claims, admin) = match config.claims.kind {
        StoreKind::Sqlite => both(crate::claim::sqlite::SqliteClaims::new(sqlite_pool())),
        StoreKind::Postgres => both(crate::claim::postgres::PgClaims::new(claims_pg.clone().expect("opened above"))),
        StoreKind::Redis => both(crate::claim::redis::RedisClaims::connect(config.claims.url("claims")?, ns).await?),
    };
    // Whether writes are fenced by tokens (claims elsewhere) rather than by
    // the claim row in the write's transaction.
    let mut tokens = false;
    let data: Arc<dyn DataStore> = match config.data.kind {
        StoreKind::Sqlite => Arc::new(crate::store::sqlite::SqliteData::new(sqlite_pool())),
        StoreKind::Postgres => {
            let url = config.data.url("data")?;
            match (&claims_pg, config.claims.url.as_deref()) {
                // Same database as the claims: the fence is checked against
                // the claim row, in the write's transaction.
                (Some(pool), Some(claims_url)) if claims_url == url => Arc::new(crate::store::postgres::PgData::new(
                    pool.clone(),
                    crate::store::postgres::Fencing::ClaimRow,
                )),
                // Claims elsewhere (Redis): the store keeps the highest fence
                // it was told of per key and refuses writes that present
                // another one.
                _ => {
                    tokens = true;
                    let pool = open_postgres(url, ns, config.data.max_connections, "data").await?;
                    Arc::new(crate::store::postgres::PgData::new(pool, crate::store::postgres::Fencing::Token))
                }
            }
        }
        StoreKind::Redis => anyhow::bail!("data.kind = \"redis\" is not supported"),
    };
    // Concurrent handlers' writes commit together.
    let data: Arc<dyn DataStore> = Arc::new(crate::store::batch::GroupCommit::new(data));
    // With tokens, every fence the claim store hands out or retires is
    // passed on to the data store.
    let claims: Arc<dyn ClaimStore> = if tokens {
        Arc::new(crate::store::tokens::TokenFenced::new(claims, data.clone()))
    } else {
        claims
    };
    let clock = start_clock(admin.clone()).await?;
    Ok(Backends {
        broker,
        claims,
        admin,
        data,
        clock,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `PRAGMA synchronous` of the pool `open_sqlite` gives for a broker.
    async fn synchronous_with(broker: BrokerKind) -> i64 {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.database.path = dir.path().join("idem.db");
        config.broker.kind = broker;
        let pool = open_sqlite(&config).await.unwrap();
        sqlx::query_scalar("PRAGMA synchronous").fetch_one(&pool).await.unwrap()
    }

    #[tokio::test]
    async fn sqlite_commits_are_synced_whenever_the_broker_is_elsewhere() {
        // 1 = NORMAL, 2 = FULL.
        assert_eq!(synchronous_with(BrokerKind::Sqlite).await, 1);
        for broker in [BrokerKind::Redis, BrokerKind::Rabbitmq, BrokerKind::Nats] {
            assert_eq!(synchronous_with(broker).await, 2, "{broker:?}");
        }
    }
}
