//! The store: every SQL statement of the controller, one file per
//! capability, against a primary pool and a read pool (a replica, or the
//! primary when none is configured).
//!
//! Candidate queries run on the read pool; every re-read, claim and write runs
//! on the primary, because replica lag is exactly what makes a claimed request
//! still look like a candidate.

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use crate::domain::UnknownValue;

mod candidates;
mod census;
mod claims;
mod connect;
mod layout;
mod ledger;
mod notify;
mod pause;
mod recovery;
mod rows;

pub use candidates::{CandidateQuery, ShardFilter, candidate_sql};
pub use census::{BACKLOG_SQL, RequestCensus};
pub use claims::{ClaimOutcome, Completion, RetryWrite};
pub use connect::{DatabaseArgs, DatabaseUrl, SessionArgs};
pub use layout::ShardLayout;
pub use ledger::Memo;
pub use notify::{REQUEST_CHANGED_CHANNEL, RequestChange, RequestChanges};
pub use pause::Pause;
pub use recovery::CleanseReport;
pub use rows::RequestStatusRow;

/// The manual-approval functions of migration 0013, with their argument
/// types as a `GRANT EXECUTE ON FUNCTION` names them: the other service's
/// role needs these and nothing else (README: Working alongside people).
pub const MANUAL_FUNCTIONS: &str = "autoapproval_manual_claim(bigint, text), \
autoapproval_manual_heartbeat(bigint, text, bigint), \
autoapproval_manual_release(bigint, text, bigint), \
autoapproval_manual_decide(bigint, text, bigint, text, text)";

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
    /// A row we write is locked by another transaction (the business
    /// system's, in practice); the statement did not wait for it.
    #[error(
        "{operation}: the row is locked by another transaction (the business system's); retried later"
    )]
    RowLocked {
        /// What the store was doing.
        operation: &'static str,
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
    /// A database named by a URL could not be reached at start-up.
    #[error("cannot connect to the {role} database at {url}: {reason}")]
    Connect {
        /// "primary" or "read replica".
        role: &'static str,
        /// The URL with its password hidden.
        url: String,
        /// The driver's or the operating system's own words.
        reason: String,
    },
}

fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| match source.as_database_error().and_then(|e| e.code()) {
        // lock_not_available: a NOWAIT lock (or lock_timeout) found the row held.
        Some(code) if code == "55P03" => StoreError::RowLocked { operation },
        _ => StoreError::Database { operation, source },
    }
}

/// Access to the request, ledger, memo and state tables.
#[derive(Clone, Debug)]
pub struct Store {
    primary: PgPool,
    read: PgPool,
    /// The read pool reaches a replica of its own (--read-database-url).
    separate_read: bool,
}

// === impl Store ===

impl Store {
    /// A store over existing pools.
    pub fn new(primary: PgPool, read: PgPool) -> Self {
        Self {
            primary,
            read,
            separate_read: false,
        }
    }

    /// A store over a pool of its own of `connections` to the same primary
    /// (read from the primary too), for a caller that must never wait for a
    /// connection the chains hold: the Lease loop, the listener.
    pub fn dedicated(&self, connections: u32) -> Store {
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect_lazy_with(self.primary.connect_options().as_ref().clone());
        Store::new(pool.clone(), pool)
    }

    /// The primary pool (for tests' fixtures and the listener).
    pub fn primary(&self) -> &PgPool {
        &self.primary
    }

    /// Applies the migrations in `migrations/`; a no-op when they are applied.
    pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
        sqlx::migrate!("./migrations").run(pool).await?;
        Ok(())
    }

    /// The pools to watch, by name: `primary`, and `read` when a replica
    /// is configured (otherwise it is the primary's pool).
    pub fn pools(&self) -> Vec<(&'static str, PgPool)> {
        let mut pools = vec![("primary", self.primary.clone())];
        if self.separate_read {
            pools.push(("read", self.read.clone()));
        }
        pools
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
