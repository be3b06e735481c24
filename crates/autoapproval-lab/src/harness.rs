//! The SQL of the demo and the benchmark: seeding requests, the probes that
//! time every claim in the database's clock, what a run ended with, the
//! statement counts of `pg_stat_statements`, and the queue table of the
//! seed's old design. The lab's own SQL: the shipped controller never runs it.

use sqlx::PgPool;
use sqlx::postgres::PgConnection;

use autoapproval::domain::{Candidate, RequestType};
use autoapproval::store::StoreError;

/// The product's error for a failed statement, naming what the lab was doing.
fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Database { operation, source }
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

/// The harness's view of one database: an administrator's pool.
#[derive(Clone, Debug)]
pub struct Harness {
    pool: PgPool,
}

// === impl Harness ===

impl Harness {
    /// A harness over a pool of a superuser (it creates triggers and reads
    /// every role's statistics).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Installs the probes: `harness_eligible` (when each request became
    /// workable, written by the harness) and `harness_claim` (every claim,
    /// stamped by a trigger on the state table), readable and writable by
    /// `worker_role`, which the controllers connect as.
    pub async fn install_probes(&self, worker_role: &str) -> Result<(), StoreError> {
        let statements = [
            "CREATE TABLE IF NOT EXISTS harness_eligible (
                 request_id  BIGINT PRIMARY KEY,
                 eligible_at TIMESTAMPTZ NOT NULL)",
            "CREATE TABLE IF NOT EXISTS harness_claim (
                 request_id BIGINT NOT NULL,
                 claimed_at TIMESTAMPTZ NOT NULL)",
            "CREATE INDEX IF NOT EXISTS harness_claim_request ON harness_claim (request_id, claimed_at)",
            "CREATE OR REPLACE FUNCTION harness_record_claim() RETURNS trigger
                 LANGUAGE plpgsql SECURITY DEFINER AS $$
             BEGIN
                 INSERT INTO harness_claim VALUES (NEW.request_id, clock_timestamp());
                 RETURN NEW;
             END $$",
            "DROP TRIGGER IF EXISTS harness_claim_insert ON auto_approve_state",
            "CREATE TRIGGER harness_claim_insert AFTER INSERT ON auto_approve_state
                 FOR EACH ROW WHEN (NEW.status = 'IN_PROGRESS') EXECUTE FUNCTION harness_record_claim()",
            "DROP TRIGGER IF EXISTS harness_claim_update ON auto_approve_state",
            "CREATE TRIGGER harness_claim_update AFTER UPDATE OF status ON auto_approve_state
                 FOR EACH ROW WHEN (NEW.status = 'IN_PROGRESS' AND OLD.status <> 'IN_PROGRESS')
                 EXECUTE FUNCTION harness_record_claim()",
            "CREATE TABLE IF NOT EXISTS seed_old_queue (
                 id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 request_id   BIGINT NOT NULL,
                 request_type TEXT   NOT NULL,
                 status       TEXT   NOT NULL DEFAULT 'NEW',
                 enqueued_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
            "CREATE UNIQUE INDEX IF NOT EXISTS seed_old_queue_new ON seed_old_queue (request_id)
                 WHERE status = 'NEW'",
        ];
        for sql in statements {
            sqlx::query(sql)
                .execute(&self.pool)
                .await
                .map_err(db("install the harness probes"))?;
        }
        let grant = format!(
            "GRANT ALL ON harness_eligible, harness_claim, seed_old_queue TO \"{worker_role}\""
        );
        sqlx::query(sqlx::AssertSqlSafe(grant))
            .execute(&self.pool)
            .await
            .map_err(db("grant the harness tables"))?;
        Ok(())
    }

    /// Inserts a request now (`created_at` in the database's clock) and, when
    /// it is workable at once, records it as eligible from that instant.
    pub async fn insert_request(&self, request: &NewRequest) -> Result<i64, StoreError> {
        let (id,): (i64,) = sqlx::query_as(
            "WITH next AS (SELECT nextval(pg_get_serial_sequence('approval_request', 'id')) AS id),
             inserted AS (
                 INSERT INTO approval_request
                     (id, request_type, status, business_name, documents_released, menu_registered,
                      logo_registered, previous_step_approved, econtract_ref, target_store_number,
                      created_at, sort_time)
                 SELECT id, $1, 'PENDING', $2, $3, true, true, true, 'EC-' || id, $4,
                        clock_timestamp(), clock_timestamp()
                   FROM next
                 RETURNING id, created_at),
             eligible AS (
                 INSERT INTO harness_eligible (request_id, eligible_at)
                 SELECT id, created_at FROM inserted WHERE $3)
             SELECT id FROM inserted",
        )
        .bind(request.request_type.as_str())
        .bind(&request.business_name)
        .bind(request.documents_released)
        .bind(request.target_store_number)
        .fetch_one(&self.pool)
        .await
        .map_err(db("seed a request"))?;
        Ok(id)
    }

    /// Releases the documents of `ids` (the change NOTIFYs) and records them
    /// as eligible from now.
    pub async fn release_documents(&self, ids: &[i64]) -> Result<(), StoreError> {
        sqlx::query(
            "WITH released AS (
                 UPDATE approval_request SET documents_released = true, updated_at = clock_timestamp()
                  WHERE id = ANY($1) RETURNING id)
             INSERT INTO harness_eligible (request_id, eligible_at)
             SELECT id, clock_timestamp() FROM released
             ON CONFLICT (request_id) DO UPDATE SET eligible_at = EXCLUDED.eligible_at",
        )
        .bind(ids)
        .execute(&self.pool)
        .await
        .map_err(db("release documents"))?;
        Ok(())
    }

    /// A person approves `id` by hand, as the business system would.
    pub async fn approve_by_hand(&self, id: i64, person: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE approval_request
                SET status = 'APPROVED', decided_by = $2, decided_at = now(), updated_at = now()
              WHERE id = $1",
        )
        .bind(id)
        .bind(person)
        .execute(&self.pool)
        .await
        .map_err(db("approve by hand"))?;
        Ok(())
    }

    /// Where each of `ids` stands now.
    pub async fn ends(&self, ids: &[i64]) -> Result<Vec<RequestEnd>, StoreError> {
        sqlx::query_as(
            "SELECT r.id AS request_id, r.status, r.decided_by, s.status AS state, s.last_reason
               FROM approval_request r
               LEFT JOIN auto_approve_state s ON s.request_id = r.id
              WHERE r.id = ANY($1)
              ORDER BY r.id",
        )
        .bind(ids)
        .fetch_all(&self.pool)
        .await
        .map_err(db("read the requests' ends"))
    }

    /// Pickup latency in milliseconds of every request claimed since it
    /// became eligible (its first claim at or after `eligible_at`), ascending.
    pub async fn pickups_ms(&self) -> Result<Vec<f64>, StoreError> {
        let rows: Vec<(f64,)> = sqlx::query_as(
            "SELECT (extract(epoch FROM min(c.claimed_at) - e.eligible_at) * 1000)::float8 AS ms
               FROM harness_eligible e
               JOIN harness_claim c ON c.request_id = e.request_id AND c.claimed_at >= e.eligible_at
              GROUP BY e.request_id, e.eligible_at
              ORDER BY ms",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db("read the pickup latencies"))?;
        Ok(rows.into_iter().map(|(ms,)| ms).collect())
    }

    /// Approvals by `decided_by` and the time from the first eligible request
    /// to the last of those approvals.
    pub async fn approval_span(&self, decided_by: &str) -> Result<ApprovalSpan, StoreError> {
        let (approved, seconds): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*),
                    extract(epoch FROM max(r.decided_at) - (SELECT min(eligible_at) FROM harness_eligible))::float8
               FROM approval_request r
              WHERE r.status = 'APPROVED' AND r.decided_by = $1",
        )
        .bind(decided_by)
        .fetch_one(&self.pool)
        .await
        .map_err(db("read the approval span"))?;
        Ok(ApprovalSpan {
            approved,
            seconds: seconds.unwrap_or(0.0),
        })
    }

    /// State rows waiting their retry (`RETRY_WAITING`).
    pub async fn waiting(&self) -> Result<i64, StoreError> {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM auto_approve_state WHERE status = 'RETRY_WAITING'",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(db("count waiting state rows"))?;
        Ok(n)
    }

    /// Open requests that no claim has reached yet, and claims still held.
    pub async fn unfinished(&self) -> Result<i64, StoreError> {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM approval_request WHERE status IN ('PENDING', 'RETRY', 'ING')",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(db("count unfinished requests"))?;
        Ok(n)
    }

    /// The claim held longest among those still IN_PROGRESS: its request and
    /// its age in seconds, in the database's clock (from `harness_claim`).
    pub async fn oldest_running_claim(&self) -> Result<Option<(i64, f64)>, StoreError> {
        sqlx::query_as(
            "SELECT s.request_id, extract(epoch FROM clock_timestamp() - max(c.claimed_at))::float8
               FROM auto_approve_state s
               JOIN harness_claim c ON c.request_id = s.request_id
              WHERE s.status = 'IN_PROGRESS'
              GROUP BY s.request_id
              ORDER BY 2 DESC
              LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await
        .map_err(db("read the oldest running claim"))
    }

    /// Terminates every backend of `role` (`pg_terminate_backend`, what an
    /// operator or a failover does to sessions); returns how many were ended.
    pub async fn terminate_backends(&self, role: &str) -> Result<i64, StoreError> {
        let (ended,): (i64,) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
               FROM pg_stat_activity
              WHERE usename = $1 AND pid <> pg_backend_pid()",
        )
        .bind(role)
        .fetch_one(&self.pool)
        .await
        .map_err(db("terminate the backends"))?;
        Ok(ended)
    }

    /// Whether `pg_stat_statements` is loaded; creates the extension if so.
    pub async fn enable_statement_counts(&self) -> Result<bool, StoreError> {
        let (loaded,): (bool,) = sqlx::query_as(
            "SELECT 'pg_stat_statements' = ANY(string_to_array(current_setting('shared_preload_libraries'), ','))",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(db("read shared_preload_libraries"))?;
        if loaded {
            sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .execute(&self.pool)
                .await
                .map_err(db("create pg_stat_statements"))?;
        }
        Ok(loaded)
    }

    /// Forgets every statement counted so far.
    pub async fn reset_statement_counts(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(&self.pool)
            .await
            .map_err(db("reset pg_stat_statements"))?;
        Ok(())
    }

    /// Statements executed by `role` since the last reset (top-level only:
    /// what the client sent, not what triggers ran).
    pub async fn statements_by(&self, role: &str) -> Result<i64, StoreError> {
        let (n,): (Option<i64>,) = sqlx::query_as(
            "SELECT sum(s.calls)::bigint
               FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
              WHERE r.rolname = $1",
        )
        .bind(role)
        .fetch_one(&self.pool)
        .await
        .map_err(db("read pg_stat_statements"))?;
        Ok(n.unwrap_or(0))
    }

    /// The `limit` statements `role` executed most since the last reset.
    pub async fn top_statements(
        &self,
        role: &str,
        limit: i64,
    ) -> Result<Vec<StatementCount>, StoreError> {
        sqlx::query_as(
            "SELECT left(regexp_replace(s.query, '\\s+', ' ', 'g'), 160) AS query, s.calls
               FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
              WHERE r.rolname = $1
              ORDER BY s.calls DESC
              LIMIT $2",
        )
        .bind(role)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(db("read pg_stat_statements"))
    }
}

/// One statement's count, for the report's breakdown.
#[derive(Clone, Debug, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct StatementCount {
    /// The normalised statement text, shortened.
    pub query: String,
    /// Executions.
    pub calls: i64,
}

/// The seed's old design: a queue table one scheduler fills and another
/// drains, each under a ShedLock-style lock so one runner works at a time.
#[derive(Clone, Debug)]
pub struct SeedQueue {
    pool: PgPool,
}

// === impl SeedQueue ===

impl SeedQueue {
    /// The queue over a worker's pool.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Takes the ShedLock-style lock `key` on `conn` when free (a session
    /// advisory lock: it is gone when the holder's connection is).
    pub async fn try_lock(conn: &mut PgConnection, key: i64) -> Result<bool, StoreError> {
        let (won,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)")
            .bind(key)
            .fetch_one(&mut *conn)
            .await
            .map_err(db("take the scheduler lock"))?;
        Ok(won)
    }

    /// Releases the lock `key` taken on `conn`.
    pub async fn unlock(conn: &mut PgConnection, key: i64) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut *conn)
            .await
            .map_err(db("release the scheduler lock"))?;
        Ok(())
    }

    /// The collector: queues every candidate not already queued.
    pub async fn enqueue(&self, candidates: &[Candidate]) -> Result<u64, StoreError> {
        let ids: Vec<i64> = candidates.iter().map(|c| c.request_id).collect();
        let types: Vec<&str> = candidates.iter().map(|c| c.request_type.as_str()).collect();
        let done = sqlx::query(
            "INSERT INTO seed_old_queue (request_id, request_type)
             SELECT * FROM unnest($1::bigint[], $2::text[])
             ON CONFLICT (request_id) WHERE status = 'NEW' DO NOTHING",
        )
        .bind(ids)
        .bind(types)
        .execute(&self.pool)
        .await
        .map_err(db("fill the queue"))?;
        Ok(done.rows_affected())
    }

    /// The processor's batch: the oldest `limit` queued requests.
    pub async fn queued(&self, limit: i64) -> Result<Vec<(i64, i64, String)>, StoreError> {
        sqlx::query_as(
            "SELECT id, request_id, request_type FROM seed_old_queue
              WHERE status = 'NEW' ORDER BY id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(db("read the queue"))
    }

    /// Marks a queue row processed.
    pub async fn done(&self, id: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE seed_old_queue SET status = 'DONE' WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(db("mark a queue row done"))?;
        Ok(())
    }
}
