//! The store: every SQL statement of the controller, one file per
//! capability, against a primary pool and a read pool (a replica, or the
//! primary when none is configured).
//!
//! Candidate queries run on the read pool; every re-read, claim and write runs
//! on the primary, because replica lag is exactly what makes a claimed request
//! still look like a candidate.

use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use crate::domain::UnknownValue;

mod candidates;
mod claims;
mod ledger;
mod notify;
mod recovery;
mod rows;

pub use candidates::{CandidateQuery, ShardFilter, candidate_sql};
pub use claims::{ClaimOutcome, Completion, RetryWrite};
pub use notify::{REQUEST_CHANGED_CHANNEL, RequestChange, RequestChanges};
pub use recovery::CleanseReport;
pub use rows::RequestStatusRow;

/// The database flags of `run` and `migrate`.
#[derive(clap::Args, Clone, Debug)]
pub struct DatabaseArgs {
    /// PostgreSQL URL of the primary: re-reads, claims and every write [required, no default].
    #[arg(long, env = "AUTOAPPROVAL_DATABASE_URL")]
    pub database_url: String,
    /// PostgreSQL URL of a read replica for the candidate queries [default: the primary].
    #[arg(long, env = "AUTOAPPROVAL_READ_DATABASE_URL")]
    pub read_database_url: Option<String>,
    /// Connections per pool.
    #[arg(long, env = "AUTOAPPROVAL_DB_MAX_CONNECTIONS", default_value_t = 10)]
    pub db_max_connections: u32,
}

/// Errors from the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or could not be reached.
    #[error("database error during {operation}: {source}")]
    Database {
        /// What the store was doing.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Applying migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A row holds a value the controller does not know; it is skipped.
    #[error("request {request_id}: {error}")]
    Malformed {
        /// The request whose row is malformed.
        request_id: i64,
        /// What is wrong with it.
        error: UnknownValue,
    },
    /// A setting is invalid.
    #[error("invalid database setting {setting}: {message}")]
    Config {
        /// The flag.
        setting: &'static str,
        /// Why.
        message: String,
    },
}

fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Database { operation, source }
}

/// Access to the request, ledger, memo and state tables.
#[derive(Clone, Debug)]
pub struct Store {
    primary: PgPool,
    read: PgPool,
}

// === impl Store ===

impl Store {
    /// Connects both pools; the read pool is the primary when no replica is set.
    pub async fn connect(config: &DatabaseArgs) -> Result<Self, StoreError> {
        if config.db_max_connections == 0 {
            return Err(StoreError::Config {
                setting: "--db-max-connections",
                message: "must be at least 1".into(),
            });
        }
        let options = || {
            PgPoolOptions::new()
                .max_connections(config.db_max_connections)
                .acquire_timeout(Duration::from_secs(10))
        };
        let primary = options()
            .connect(&config.database_url)
            .await
            .map_err(db("connect to the primary"))?;
        let read = match &config.read_database_url {
            Some(url) => options()
                .connect(url)
                .await
                .map_err(db("connect to the read replica"))?,
            None => primary.clone(),
        };
        Ok(Self { primary, read })
    }

    /// A store over existing pools.
    pub fn new(primary: PgPool, read: PgPool) -> Self {
        Self { primary, read }
    }

    /// The primary pool (for LISTEN and for tests' fixtures).
    pub fn primary(&self) -> &PgPool {
        &self.primary
    }

    /// Applies the migrations in `migrations/`; a no-op when they are applied.
    pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
        sqlx::migrate!("./migrations").run(pool).await?;
        Ok(())
    }

    /// One round-trip to the primary, for the readiness probe.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.primary)
            .await
            .map_err(db("ping"))?;
        Ok(())
    }

    async fn begin(
        &self,
        operation: &'static str,
    ) -> Result<Transaction<'_, Postgres>, StoreError> {
        self.primary.begin().await.map_err(db(operation))
    }
}
