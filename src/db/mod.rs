//! The store: every SQL statement of the controller, behind one interface
//! with a backend per database family, chosen by the URL's scheme.
//!
//! Each capability (claims, candidates, wakes, …) is a trait declared in its
//! own module here, with the public method on [`Database`] that callers use.
//! What both backends share lives in the modules here too: the row types,
//! the URL, pools and pinging (`connect`). `postgres/` and `mysql/` implement
//! every trait, each with its own SQL next to its methods and only what truly
//! differs. Only this file names the backends: it picks one (`Database::connect`)
//! and dispatches to it (`Backend`, `ChangeSource`), so the modules below it
//! never import each other in a circle.
//! Candidate queries run on the read pool; every re-read, claim and write
//! runs on the primary, because replica lag is exactly what makes a claimed
//! request still look like a candidate.

use sqlx::mysql::MySqlPool;
use sqlx::postgres::PgPool;

use crate::domain::UnknownValue;

/// Declares one capability of the store: a trait each backend implements,
/// and on [`Database`] the public method that calls the backend's (so a
/// backend missing a method does not compile). The attributes of a method
/// (its doc, its span) go on the public method; the backends' methods
/// carry no doc of their own.
macro_rules! interface {
    (
        $(#[$trait_meta:meta])*
        trait $trait:ident {
            $(
                $(#[$meta:meta])*
                fn $name:ident(&self $(, $arg:ident : $ty:ty)* $(,)?) -> $ret:ty;
            )*
        }
    ) => {
        $(#[$trait_meta])*
        pub(super) trait $trait {
            $( async fn $name(&self $(, $arg: $ty)*) -> $ret; )*
        }

        impl $crate::db::Database {
            $(
                $(#[$meta])*
                pub async fn $name(&self $(, $arg: $ty)*) -> $ret {
                    match &self.backend {
                        $crate::db::Backend::Postgres(b) => $trait::$name(b $(, $arg)*).await,
                        $crate::db::Backend::Mysql(b) => $trait::$name(b $(, $arg)*).await,
                    }
                }
            )*
        }
    };
}

mod candidates;
mod census;
mod claims;
mod codes;
mod connect;
mod layout;
mod ledger;
/// The MySQL 8 / MariaDB backend.
pub mod mysql;
mod notify;
mod pause;
pub mod postgres;
mod recovery;
mod retention;
mod rows;
mod schema;
mod shadow;
mod tls;
mod vocabulary;

use candidates::Candidates;
use census::CensusQueries;
use claims::Claims;
use layout::Layout;
use ledger::Ledger;
use notify::Wakes;
use pause::Pauses;
use recovery::Recovery;
use rows::Rows;
use shadow::Shadows;

pub use candidates::{CandidateQuery, ShardFilter};
pub use census::RequestCensus;
pub use claims::{ClaimOutcome, Completion, RetryWrite, SentKey, StepResult};
pub use connect::{DatabaseArgs, DatabaseUrl, SessionArgs};
pub use layout::ShardLayout;
pub use ledger::Memo;
pub use notify::RequestChange;
pub use pause::{FleetAnswer, FleetPause, Pause};
pub use recovery::CleanseReport;
pub use retention::{AbandonedQuery, RowsCollected};
pub use rows::RequestStatusRow;
pub use schema::{MigrationSet, SchemaReport, WriteProbes};
pub use shadow::{ShadowOutcome, ShadowRecord, WouldDecision};
pub use tls::{TlsMode, TlsSettings};

/// Errors from the store.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
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
    /// The schema lacks controller migrations this binary needs.
    #[error(
        "the database lacks controller migration {missing}: run `autoapproval migrate` of this \
         version (or apply `autoapproval migrate --print-sql`) before `run`"
    )]
    SchemaBehind {
        /// The missing migrations, as `0002 (description)`.
        missing: String,
    },
    /// The controller's role cannot use part of the binding to the business tables.
    #[error("binding to the business tables: {problems} (docs/INTEGRATING.md)")]
    Binding {
        /// Each part that failed, naming the view, column or grant.
        problems: String,
    },
    /// A row holds a value the controller does not know; it is skipped.
    #[error("request {request_id}: {error}")]
    Malformed {
        /// The request whose row is malformed.
        request_id: i64,
        /// What is wrong with it.
        error: UnknownValue,
    },
    /// A write to the business's tables asked of a store in shadow mode,
    /// which writes none: refused before anything is sent.
    #[error("{operation}: refused in shadow mode, which writes nothing to the business's tables")]
    ShadowWrite {
        /// The write refused.
        operation: &'static str,
    },
    /// The vocabulary file (--vocabulary) was refused.
    #[error(transparent)]
    Vocabulary(#[from] crate::vocabulary::VocabularyError),
    /// The vocabulary `run` was given differs from the one `migrate` stored
    /// for the database's routines.
    #[error(
        "--vocabulary differs from the one `autoapproval migrate` stored in auto_approve_vocabulary \
         (run migrate with the same file): {differences}"
    )]
    VocabularyMismatch {
        /// Each word whose code differs.
        differences: String,
    },
    /// A setting is invalid.
    #[error("invalid database setting {setting}: {message}")]
    Config {
        /// The flag that set it, as `--name`.
        setting: &'static str,
        /// The invariant it breaks.
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

/// Access to the request, ledger, memo and state tables, on whichever
/// database the URL named.
#[derive(Clone, Debug)]
pub struct Database {
    backend: Backend,
}

/// The backend a [`Database`] calls.
#[derive(Clone, Debug)]
enum Backend {
    Postgres(postgres::PgStore),
    Mysql(mysql::MysqlStore),
}

/// A connection pool of the store, for the pool metrics.
#[derive(Clone, Debug)]
pub enum Pool {
    /// A pool of the PostgreSQL backend.
    Postgres(PgPool),
    /// A pool of the MySQL 8 / MariaDB backend.
    Mysql(MySqlPool),
}

impl Pool {
    /// One round-trip on this pool.
    pub async fn ping(&self) -> Result<(), DbError> {
        match self {
            Pool::Postgres(pool) => connect::ping(pool).await.map_err(postgres::db("ping")),
            Pool::Mysql(pool) => connect::ping(pool).await.map_err(mysql::db("ping")),
        }
    }

    /// Connections open now.
    pub fn size(&self) -> u32 {
        match self {
            Pool::Postgres(pool) => pool.size(),
            Pool::Mysql(pool) => pool.size(),
        }
    }

    /// Connections open and idle now.
    pub fn num_idle(&self) -> usize {
        match self {
            Pool::Postgres(pool) => pool.num_idle(),
            Pool::Mysql(pool) => pool.num_idle(),
        }
    }

    /// The most connections it opens.
    pub fn max_connections(&self) -> u32 {
        match self {
            Pool::Postgres(pool) => pool.options().get_max_connections(),
            Pool::Mysql(pool) => pool.options().get_max_connections(),
        }
    }
}

// === impl RequestChanges ===

/// The stream of request changes: the primary's notifications on
/// PostgreSQL, the wake table's new rows on MySQL / MariaDB.
pub struct RequestChanges {
    source: ChangeSource,
}

/// Where a backend's changes come from.
pub(crate) enum ChangeSource {
    /// PostgreSQL's LISTEN connection.
    Postgres(postgres::Listener),
    /// The wake-table poller on MySQL / MariaDB.
    Mysql(mysql::MysqlRequestChanges),
}

impl RequestChanges {
    pub(crate) fn new(source: ChangeSource) -> Self {
        Self { source }
    }

    /// Waits for the next change.
    pub async fn next(&mut self) -> Result<RequestChange, DbError> {
        match &mut self.source {
            ChangeSource::Postgres(listener) => listener.next().await,
            ChangeSource::Mysql(poller) => poller.next().await,
        }
    }

    /// A change already received, without waiting.
    pub fn next_buffered(&mut self) -> Option<RequestChange> {
        match &mut self.source {
            ChangeSource::Postgres(listener) => listener.next_buffered(),
            ChangeSource::Mysql(poller) => poller.next_buffered(),
        }
    }
}

/// Refuses a write to the business's tables when `shadow` (the store is
/// in shadow mode): the last line behind the chain's own checks.
pub(crate) fn business_write(shadow: bool, operation: &'static str) -> Result<(), DbError> {
    if shadow {
        return Err(DbError::ShadowWrite { operation });
    }
    Ok(())
}

// === impl Store ===

impl Database {
    /// This store in shadow mode: it writes nothing to the business's
    /// tables through the binding (no memo; an approval, a result or a
    /// ledger sync is refused with [`DbError::ShadowWrite`]); its own
    /// tables are written as ever.
    pub fn in_shadow(self) -> Self {
        match self.backend {
            Backend::Postgres(mut b) => {
                b.shadow = true;
                Self {
                    backend: Backend::Postgres(b),
                }
            }
            Backend::Mysql(mut b) => {
                b.shadow = true;
                Self {
                    backend: Backend::Mysql(b),
                }
            }
        }
    }

    /// Whether this store is in shadow mode ([`Database::in_shadow`]).
    pub fn is_shadow(&self) -> bool {
        match &self.backend {
            Backend::Postgres(b) => b.shadow,
            Backend::Mysql(b) => b.shadow,
        }
    }

    /// Connects to the database the URL names, on the backend its scheme
    /// picks (PostgreSQL, or MySQL 8 / MariaDB), its primary and its read
    /// pool (the primary when no replica is set), reaching each once first so
    /// that a wrong host, port, password or name is reported at once.
    pub async fn connect(
        config: &DatabaseArgs,
        session: Option<&SessionArgs>,
    ) -> Result<Self, DbError> {
        if config.db_max_connections == 0 {
            return Err(DbError::Config {
                setting: "--db-max-connections",
                message: "must be at least 1".into(),
            });
        }
        if config.wake_poll_interval.is_zero() {
            return Err(DbError::Config {
                setting: "--wake-poll-interval",
                message: "must be more than 0".into(),
            });
        }
        let read_is_mysql = config.read_database_url.as_ref().map(DatabaseUrl::is_mysql);
        if read_is_mysql.is_some_and(|read| read != config.database_url.is_mysql()) {
            return Err(DbError::Config {
                setting: "--read-database-url",
                message: "must name the same kind of database as --database-url".into(),
            });
        }
        // The file is read and checked before any database is contacted.
        let vocabulary = match &config.vocabulary {
            Some(path) => crate::vocabulary::Vocabulary::load(path)?,
            None => crate::vocabulary::Vocabulary::default(),
        };
        let backend = if config.database_url.is_mysql() {
            Backend::Mysql(mysql::MysqlStore::connect(config, session).await?)
        } else {
            Backend::Postgres(postgres::PgStore::connect(config, session).await?)
        };
        Database { backend }.with_vocabulary(std::sync::Arc::new(vocabulary))
    }

    /// This store with its statements rendered for `vocabulary` (the
    /// business's codes for our words, `--vocabulary`); a store is made
    /// with our own words.
    pub fn with_vocabulary(
        self,
        vocabulary: std::sync::Arc<crate::vocabulary::Vocabulary>,
    ) -> Result<Self, DbError> {
        match self.backend {
            Backend::Postgres(b) => Ok(Self {
                backend: Backend::Postgres(b.with_vocabulary(vocabulary)),
            }),
            Backend::Mysql(b) => Ok(Self {
                backend: Backend::Mysql(b.with_vocabulary(vocabulary)?),
            }),
        }
    }

    /// The vocabulary the statements were rendered for.
    pub fn vocabulary(&self) -> &std::sync::Arc<crate::vocabulary::Vocabulary> {
        match &self.backend {
            Backend::Postgres(b) => b.statements.codes().vocabulary(),
            Backend::Mysql(b) => b.statements.codes().vocabulary(),
        }
    }

    /// A store on PostgreSQL over pools the caller made (tests, the lab);
    /// `read` serves the candidate queries.
    pub fn postgres(primary: PgPool, read: PgPool) -> Self {
        Self {
            backend: Backend::Postgres(postgres::PgStore::new(primary, read)),
        }
    }

    /// A store on MySQL 8 / MariaDB over pools the caller made (tests, the
    /// lab), which should come from [`mysql::pool`]: it sets the session
    /// our SQL expects.
    pub fn mysql(primary: MySqlPool, read: MySqlPool) -> Self {
        Self {
            backend: Backend::Mysql(mysql::MysqlStore::new(primary, read)),
        }
    }

    /// This store with the MySQL wake poller reading every `interval`;
    /// PostgreSQL's wakes are pushed by NOTIFY, so it is unchanged there.
    pub fn with_wake_poll_interval(self, interval: std::time::Duration) -> Self {
        match self.backend {
            Backend::Mysql(b) => Self {
                backend: Backend::Mysql(b.with_poll_interval(interval)),
            },
            backend @ Backend::Postgres(_) => Self { backend },
        }
    }

    /// A store over a pool of its own of `connections` to the same primary
    /// (read from the primary too), for a caller that must never wait for a
    /// connection the chains hold: the Lease loop, the listener.
    pub fn dedicated(&self, connections: u32) -> Database {
        match &self.backend {
            Backend::Postgres(b) => Database {
                backend: Backend::Postgres(b.dedicated(connections)),
            },
            Backend::Mysql(b) => Database {
                backend: Backend::Mysql(b.dedicated(connections)),
            },
        }
    }

    /// The primary's pool, for the pool metrics.
    pub fn primary_pool(&self) -> Pool {
        match &self.backend {
            Backend::Postgres(b) => Pool::Postgres(b.primary().clone()),
            Backend::Mysql(b) => Pool::Mysql(b.primary().clone()),
        }
    }

    /// The pools to watch, by name: `primary`, and `read` when a replica
    /// is configured (otherwise it is the primary's pool).
    pub fn pools(&self) -> Vec<(&'static str, Pool)> {
        let read = match &self.backend {
            Backend::Postgres(b) => b.replica().cloned().map(Pool::Postgres),
            Backend::Mysql(b) => b.replica().cloned().map(Pool::Mysql),
        };
        let mut pools = vec![("primary", self.primary_pool())];
        pools.extend(read.map(|pool| ("read", pool)));
        pools
    }

    /// One round-trip to the primary, for the readiness probe.
    pub async fn ping(&self) -> Result<(), DbError> {
        self.primary_pool().ping().await
    }

    /// One round-trip on each pool of [`Database::pools`], by name.
    pub async fn ping_pools(&self) -> Vec<(&'static str, Result<(), DbError>)> {
        let mut answers = Vec::new();
        for (name, pool) in self.pools() {
            answers.push((name, pool.ping().await));
        }
        answers
    }
}
