//! The SQL of the demo and the benchmark: seeding requests, the probes that
//! time every claim in the database's clock, what a run ended with, the
//! statement counts of `pg_stat_statements`, and the queue table and
//! scheduler locks of the seed's old design. The lab's own SQL, on
//! PostgreSQL ([`postgres`]) and on MariaDB ([`mysql`]); the shipped
//! controller never runs it.

mod mysql;
mod postgres;

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{MySqlPool, PgPool};

use autoapproval::db::{DbError, Pool};
use autoapproval::domain::{Candidate, RequestType};

/// The product's error for a failed statement, naming what the lab was doing.
fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> DbError {
    move |source| DbError::Database { operation, source }
}

/// A request to seed.
#[derive(Clone, Debug)]
pub struct NewRequest {
    /// Its type.
    pub request_type: RequestType,
    /// Shown in the request row.
    pub business_name: String,
    /// The documents fact the owner filter waits for.
    pub documents_released: bool,
    /// The store an ad contract advertises.
    pub target_store_number: Option<i64>,
}

/// Where a seeded request ended, as the database says.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct RequestEnd {
    /// The request.
    pub request_id: i64,
    /// `approval_request.status`.
    pub status: String,
    /// Who decided it, if anyone.
    pub decided_by: Option<String>,
    /// The state row's status, when one exists.
    pub state: Option<String>,
    /// The state row's last reason.
    pub last_reason: Option<String>,
}

/// When a run's approvals happened.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ApprovalSpan {
    /// Requests approved by the controller (or a baseline).
    pub approved: i64,
    /// From the first request becoming eligible to the last approval, seconds.
    pub seconds: f64,
}

/// One statement's count, for the report's breakdown.
#[derive(Clone, Debug, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct StatementCount {
    /// The normalised statement text, shortened.
    pub query: String,
    /// Executions.
    pub calls: i64,
}

/// A pool of either database the lab runs on.
#[derive(Clone, Debug)]
enum Db {
    Postgres(PgPool),
    Mysql(MySqlPool),
}

/// Calls `postgres::$f` or `mysql::$f` with the pool and the arguments.
macro_rules! on_db {
    ($db:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $db {
            Db::Postgres(pool) => postgres::$f(pool $(, $arg)*).await,
            Db::Mysql(pool) => mysql::$f(pool $(, $arg)*).await,
        }
    };
}

/// The harness's view of one database: an administrator's pool.
#[derive(Clone, Debug)]
pub struct Harness {
    db: Db,
}

// === impl Harness ===

impl Harness {
    /// A harness over a PostgreSQL superuser's pool (it creates triggers and
    /// reads every role's statistics).
    pub fn new(pool: PgPool) -> Self {
        Self {
            db: Db::Postgres(pool),
        }
    }

    /// A harness over a MariaDB / MySQL root pool.
    pub fn mysql(pool: MySqlPool) -> Self {
        Self {
            db: Db::Mysql(pool),
        }
    }

    /// Closes its pool.
    pub async fn close(&self) {
        match &self.db {
            Db::Postgres(pool) => pool.close().await,
            Db::Mysql(pool) => pool.close().await,
        }
    }

    /// Installs the probes: `harness_eligible` (when each request became
    /// workable, written by the harness) and `harness_claim` (every claim,
    /// stamped by a trigger on the state table), readable and writable by
    /// `worker_role`, which the controllers connect as; and the seed's old
    /// queue and scheduler lock tables.
    pub async fn install_probes(&self, worker_role: &str) -> Result<(), DbError> {
        on_db!(&self.db, install_probes(worker_role))
    }

    /// Inserts a request now (`created_at` in the database's clock) and, when
    /// it is workable at once, records it as eligible from that instant.
    pub async fn insert_request(&self, request: &NewRequest) -> Result<i64, DbError> {
        on_db!(&self.db, insert_request(request))
    }

    /// PostgreSQL only: `bench --shadow`'s baseline role, its own state
    /// tables, its `decided_by`, and the business-write audit.
    pub async fn install_baseline(
        &self,
        worker_role: &str,
        baseline_role: &str,
        baseline_decided_by: &str,
    ) -> Result<(), DbError> {
        match &self.db {
            Db::Postgres(pool) => {
                postgres::install_baseline(pool, worker_role, baseline_role, baseline_decided_by)
                    .await
            }
            Db::Mysql(_) => Err(DbError::Config {
                setting: "--database",
                message: "bench --shadow runs on PostgreSQL only".into(),
            }),
        }
    }

    /// PostgreSQL only: writes to the business's tables by `role`'s
    /// sessions, by table and operation.
    pub async fn business_writes_by(&self, role: &str) -> Result<Vec<(String, i64)>, DbError> {
        match &self.db {
            Db::Postgres(pool) => postgres::business_writes_by(pool, role).await,
            Db::Mysql(_) => Err(DbError::Config {
                setting: "--database",
                message: "bench --shadow runs on PostgreSQL only".into(),
            }),
        }
    }

    /// Releases the documents of `ids` (the change wakes the replicas) and
    /// records them as eligible from now.
    pub async fn release_documents(&self, ids: &[i64]) -> Result<(), DbError> {
        on_db!(&self.db, release_documents(ids))
    }

    /// A person approves `id` by hand, as the business system would.
    pub async fn approve_by_hand(&self, id: i64, person: &str) -> Result<(), DbError> {
        on_db!(&self.db, approve_by_hand(id, person))
    }

    /// Where each of `ids` stands now.
    pub async fn ends(&self, ids: &[i64]) -> Result<Vec<RequestEnd>, DbError> {
        on_db!(&self.db, ends(ids))
    }

    /// Pickup latency in milliseconds of every request claimed since it
    /// became eligible (its first claim at or after `eligible_at`), ascending.
    pub async fn pickups_ms(&self) -> Result<Vec<f64>, DbError> {
        on_db!(&self.db, pickups_ms())
    }

    /// Approvals by `decided_by` and the time from the first eligible request
    /// to the last of those approvals.
    pub async fn approval_span(&self, decided_by: &str) -> Result<ApprovalSpan, DbError> {
        on_db!(&self.db, approval_span(decided_by))
    }

    /// State rows waiting their retry (`RETRY_WAITING`).
    pub async fn waiting(&self) -> Result<i64, DbError> {
        on_db!(&self.db, waiting())
    }

    /// Open requests (PENDING, RETRY, ING).
    pub async fn unfinished(&self) -> Result<i64, DbError> {
        on_db!(&self.db, unfinished())
    }

    /// The claim held longest among those still IN_PROGRESS: its request and
    /// its age in seconds, in the database's clock (from `harness_claim`).
    pub async fn oldest_running_claim(&self) -> Result<Option<(i64, f64)>, DbError> {
        on_db!(&self.db, oldest_running_claim())
    }

    /// Ends every session of `role` (what an operator or a failover does to
    /// sessions); returns how many were ended.
    pub async fn terminate_backends(&self, role: &str) -> Result<i64, DbError> {
        on_db!(&self.db, terminate_backends(role))
    }

    /// Whether statements are counted (PostgreSQL with `pg_stat_statements`
    /// preloaded; never on MariaDB); creates the extension if so.
    pub async fn enable_statement_counts(&self) -> Result<bool, DbError> {
        match &self.db {
            Db::Postgres(pool) => postgres::enable_statement_counts(pool).await,
            Db::Mysql(_) => Ok(false),
        }
    }

    /// Forgets every statement counted so far.
    pub async fn reset_statement_counts(&self) -> Result<(), DbError> {
        match &self.db {
            Db::Postgres(pool) => postgres::reset_statement_counts(pool).await,
            Db::Mysql(_) => Ok(()),
        }
    }

    /// Statements executed by `role` since the last reset (top-level only:
    /// what the client sent, not what triggers ran); 0 on MariaDB.
    pub async fn statements_by(&self, role: &str) -> Result<i64, DbError> {
        match &self.db {
            Db::Postgres(pool) => postgres::statements_by(pool, role).await,
            Db::Mysql(_) => Ok(0),
        }
    }

    /// The `limit` statements `role` executed most since the last reset.
    pub async fn top_statements(
        &self,
        role: &str,
        limit: i64,
    ) -> Result<Vec<StatementCount>, DbError> {
        match &self.db {
            Db::Postgres(pool) => postgres::top_statements(pool, role, limit).await,
            Db::Mysql(_) => Ok(Vec::new()),
        }
    }
}

/// A scheduler lock of the seed's (ShedLock-style: one runner of a job at a
/// time across the replicas), held until [`SeedQueue::unlock`].
pub enum SchedulerLock {
    /// A session advisory lock, held by this connection.
    Postgres(PoolConnection<sqlx::Postgres>, String),
    /// A row of the `shedlock` table, held until its `lock_until`.
    Mysql(String),
}

/// The seed's old design: a queue table one scheduler fills and another
/// drains, each under a scheduler lock so one runner works at a time; and
/// the lock of the new design's cleanser.
#[derive(Clone, Debug)]
pub struct SeedQueue {
    db: Db,
}

// === impl SeedQueue ===

impl SeedQueue {
    /// The queue over a worker's pool.
    pub fn new(pool: Pool) -> Self {
        Self {
            db: match pool {
                Pool::Postgres(pool) => Db::Postgres(pool),
                Pool::Mysql(pool) => Db::Mysql(pool),
            },
        }
    }

    /// Takes the scheduler lock `name` for `holder` when free. On MariaDB it
    /// is ShedLock's own table: held at most `at_most` (a dead holder's lock
    /// lapses) and, once released, at least `at_least` from when it was
    /// taken, so replicas whose schedules fire a little apart do not run
    /// the job twice. On PostgreSQL a session advisory lock.
    pub async fn try_lock(
        &self,
        name: &str,
        holder: &str,
        at_most: Duration,
    ) -> Result<Option<SchedulerLock>, DbError> {
        match &self.db {
            Db::Postgres(pool) => {
                let mut conn = pool
                    .acquire()
                    .await
                    .map_err(db("connect for the scheduler lock"))?;
                Ok(postgres::try_lock(&mut conn, name)
                    .await?
                    .then(|| SchedulerLock::Postgres(conn, name.to_owned())))
            }
            Db::Mysql(pool) => Ok(mysql::try_lock(pool, name, holder, at_most)
                .await?
                .then(|| SchedulerLock::Mysql(name.to_owned()))),
        }
    }

    /// Releases `lock`; on MariaDB it stays taken until `at_least` after
    /// it was taken.
    pub async fn unlock(
        &self,
        lock: SchedulerLock,
        holder: &str,
        at_least: Duration,
    ) -> Result<(), DbError> {
        match (lock, &self.db) {
            (SchedulerLock::Postgres(mut conn, name), _) => {
                postgres::unlock(&mut conn, &name).await
            }
            (SchedulerLock::Mysql(name), Db::Mysql(pool)) => {
                mysql::unlock(pool, &name, holder, at_least).await
            }
            // A lock is only ever made by a queue of its own kind.
            (SchedulerLock::Mysql(_), Db::Postgres(_)) => Ok(()),
        }
    }

    /// The collector: queues every candidate not already queued.
    pub async fn enqueue(&self, candidates: &[Candidate]) -> Result<u64, DbError> {
        on_db!(&self.db, enqueue(candidates))
    }

    /// The processor's batch: the oldest `limit` queued requests.
    pub async fn queued(&self, limit: i64) -> Result<Vec<(i64, i64, String)>, DbError> {
        on_db!(&self.db, queued(limit))
    }

    /// Marks a queue row processed.
    pub async fn done(&self, id: i64) -> Result<(), DbError> {
        on_db!(&self.db, done(id))
    }
}
