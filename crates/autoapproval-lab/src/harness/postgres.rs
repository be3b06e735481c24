//! The harness's SQL on PostgreSQL: the probes, the seeding, what a run
//! ended with, `pg_stat_statements`, and the seed's old queue.

use sqlx::PgPool;
use sqlx::postgres::PgConnection;

use autoapproval::db::DbError;
use autoapproval::domain::Candidate;

use super::{ApprovalSpan, NewRequest, RequestEnd, StatementCount, db};

/// Installs the probes: `harness_eligible` (when each request became
/// workable, written by the harness) and `harness_claim` (every claim,
/// stamped by a trigger on the state table), readable and writable by
/// `worker_role`, which the controllers connect as.
pub(super) async fn install_probes(pool: &PgPool, worker_role: &str) -> Result<(), DbError> {
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
            .execute(pool)
            .await
            .map_err(db("install the harness probes"))?;
    }
    let grant = format!(
        "GRANT ALL ON harness_eligible, harness_claim, seed_old_queue TO \"{worker_role}\""
    );
    sqlx::query(sqlx::AssertSqlSafe(grant))
        .execute(pool)
        .await
        .map_err(db("grant the harness tables"))?;
    Ok(())
}

/// Inserts a request now (`created_at` in the database's clock) and, when
/// it is workable at once, records it as eligible from that instant.
pub(super) async fn insert_request(pool: &PgPool, request: &NewRequest) -> Result<i64, DbError> {
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
    .fetch_one(pool)
    .await
    .map_err(db("seed a request"))?;
    Ok(id)
}

/// Releases the documents of `ids` (the change NOTIFYs) and records them
/// as eligible from now.
pub(super) async fn release_documents(pool: &PgPool, ids: &[i64]) -> Result<(), DbError> {
    sqlx::query(
        "WITH released AS (
             UPDATE approval_request SET documents_released = true, updated_at = clock_timestamp()
              WHERE id = ANY($1) RETURNING id)
         INSERT INTO harness_eligible (request_id, eligible_at)
         SELECT id, clock_timestamp() FROM released
         ON CONFLICT (request_id) DO UPDATE SET eligible_at = EXCLUDED.eligible_at",
    )
    .bind(ids)
    .execute(pool)
    .await
    .map_err(db("release documents"))?;
    Ok(())
}

/// A person approves `id` by hand, as the business system would.
pub(super) async fn approve_by_hand(pool: &PgPool, id: i64, person: &str) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE approval_request
            SET status = 'APPROVED', decided_by = $2, decided_at = now(), updated_at = now()
          WHERE id = $1",
    )
    .bind(id)
    .bind(person)
    .execute(pool)
    .await
    .map_err(db("approve by hand"))?;
    Ok(())
}

/// Where each of `ids` stands now.
pub(super) async fn ends(pool: &PgPool, ids: &[i64]) -> Result<Vec<RequestEnd>, DbError> {
    sqlx::query_as(
        "SELECT r.id AS request_id, r.status, r.decided_by, s.status AS state, s.last_reason
           FROM approval_request r
           LEFT JOIN auto_approve_state s ON s.request_id = r.id
          WHERE r.id = ANY($1)
          ORDER BY r.id",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .map_err(db("read the requests' ends"))
}

/// Pickup latency in milliseconds of every request claimed since it
/// became eligible (its first claim at or after `eligible_at`), ascending.
pub(super) async fn pickups_ms(pool: &PgPool) -> Result<Vec<f64>, DbError> {
    let rows: Vec<(f64,)> = sqlx::query_as(
        "SELECT (extract(epoch FROM min(c.claimed_at) - e.eligible_at) * 1000)::float8 AS ms
           FROM harness_eligible e
           JOIN harness_claim c ON c.request_id = e.request_id AND c.claimed_at >= e.eligible_at
          GROUP BY e.request_id, e.eligible_at
          ORDER BY ms",
    )
    .fetch_all(pool)
    .await
    .map_err(db("read the pickup latencies"))?;
    Ok(rows.into_iter().map(|(ms,)| ms).collect())
}

/// Approvals by `decided_by` and the time from the first eligible request
/// to the last of those approvals.
pub(super) async fn approval_span(
    pool: &PgPool,
    decided_by: &str,
) -> Result<ApprovalSpan, DbError> {
    let (approved, seconds): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*),
                extract(epoch FROM max(r.decided_at) - (SELECT min(eligible_at) FROM harness_eligible))::float8
           FROM approval_request r
          WHERE r.status = 'APPROVED' AND r.decided_by = $1",
    )
    .bind(decided_by)
    .fetch_one(pool)
    .await
    .map_err(db("read the approval span"))?;
    Ok(ApprovalSpan {
        approved,
        seconds: seconds.unwrap_or(0.0),
    })
}

/// State rows waiting their retry (`RETRY_WAITING`).
pub(super) async fn waiting(pool: &PgPool) -> Result<i64, DbError> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM auto_approve_state WHERE status = 'RETRY_WAITING'")
            .fetch_one(pool)
            .await
            .map_err(db("count waiting state rows"))?;
    Ok(n)
}

/// Open requests that no claim has reached yet, and claims still held.
pub(super) async fn unfinished(pool: &PgPool) -> Result<i64, DbError> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM approval_request WHERE status IN ('PENDING', 'RETRY', 'ING')",
    )
    .fetch_one(pool)
    .await
    .map_err(db("count unfinished requests"))?;
    Ok(n)
}

/// The claim held longest among those still IN_PROGRESS: its request and
/// its age in seconds, in the database's clock (from `harness_claim`).
pub(super) async fn oldest_running_claim(pool: &PgPool) -> Result<Option<(i64, f64)>, DbError> {
    sqlx::query_as(
        "SELECT s.request_id, extract(epoch FROM clock_timestamp() - max(c.claimed_at))::float8
           FROM auto_approve_state s
           JOIN harness_claim c ON c.request_id = s.request_id
          WHERE s.status = 'IN_PROGRESS'
          GROUP BY s.request_id
          ORDER BY 2 DESC
          LIMIT 1",
    )
    .fetch_optional(pool)
    .await
    .map_err(db("read the oldest running claim"))
}

/// Terminates every backend of `role` (`pg_terminate_backend`, what an
/// operator or a failover does to sessions); returns how many were ended.
pub(super) async fn terminate_backends(pool: &PgPool, role: &str) -> Result<i64, DbError> {
    let (ended,): (i64,) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
           FROM pg_stat_activity
          WHERE usename = $1 AND pid <> pg_backend_pid()",
    )
    .bind(role)
    .fetch_one(pool)
    .await
    .map_err(db("terminate the backends"))?;
    Ok(ended)
}

/// Whether `pg_stat_statements` is loaded; creates the extension if so.
pub(super) async fn enable_statement_counts(pool: &PgPool) -> Result<bool, DbError> {
    let (loaded,): (bool,) = sqlx::query_as(
        "SELECT 'pg_stat_statements' = ANY(string_to_array(current_setting('shared_preload_libraries'), ','))",
    )
    .fetch_one(pool)
    .await
    .map_err(db("read shared_preload_libraries"))?;
    if loaded {
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(pool)
            .await
            .map_err(db("create pg_stat_statements"))?;
    }
    Ok(loaded)
}

/// Forgets every statement counted so far.
pub(super) async fn reset_statement_counts(pool: &PgPool) -> Result<(), DbError> {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(pool)
        .await
        .map_err(db("reset pg_stat_statements"))?;
    Ok(())
}

/// Statements executed by `role` since the last reset (top-level only:
/// what the client sent, not what triggers ran).
pub(super) async fn statements_by(pool: &PgPool, role: &str) -> Result<i64, DbError> {
    let (n,): (Option<i64>,) = sqlx::query_as(
        "SELECT sum(s.calls)::bigint
           FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
          WHERE r.rolname = $1",
    )
    .bind(role)
    .fetch_one(pool)
    .await
    .map_err(db("read pg_stat_statements"))?;
    Ok(n.unwrap_or(0))
}

/// The `limit` statements `role` executed most since the last reset.
pub(super) async fn top_statements(
    pool: &PgPool,
    role: &str,
    limit: i64,
) -> Result<Vec<StatementCount>, DbError> {
    sqlx::query_as(
        "SELECT left(regexp_replace(s.query, '\\s+', ' ', 'g'), 160) AS query, s.calls
           FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
          WHERE r.rolname = $1
          ORDER BY s.calls DESC
          LIMIT $2",
    )
    .bind(role)
    .bind(limit)
    .fetch_all(pool)
    .await
    .map_err(db("read pg_stat_statements"))
}

// === the seed's old queue ===

/// Takes the advisory lock named `name` on `conn` when free (a session
/// lock: it is gone when the holder's connection is).
pub(super) async fn try_lock(conn: &mut PgConnection, name: &str) -> Result<bool, DbError> {
    let (won,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock(hashtext($1))")
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .map_err(db("take the scheduler lock"))?;
    Ok(won)
}

/// Releases the lock `name` taken on `conn`.
pub(super) async fn unlock(conn: &mut PgConnection, name: &str) -> Result<(), DbError> {
    sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
        .bind(name)
        .execute(&mut *conn)
        .await
        .map_err(db("release the scheduler lock"))?;
    Ok(())
}

/// The collector: queues every candidate not already queued.
pub(super) async fn enqueue(pool: &PgPool, candidates: &[Candidate]) -> Result<u64, DbError> {
    let ids: Vec<i64> = candidates.iter().map(|c| c.request_id).collect();
    let types: Vec<&str> = candidates.iter().map(|c| c.request_type.as_str()).collect();
    let done = sqlx::query(
        "INSERT INTO seed_old_queue (request_id, request_type)
         SELECT * FROM unnest($1::bigint[], $2::text[])
         ON CONFLICT (request_id) WHERE status = 'NEW' DO NOTHING",
    )
    .bind(ids)
    .bind(types)
    .execute(pool)
    .await
    .map_err(db("fill the queue"))?;
    Ok(done.rows_affected())
}

/// The processor's batch: the oldest `limit` queued requests.
pub(super) async fn queued(pool: &PgPool, limit: i64) -> Result<Vec<(i64, i64, String)>, DbError> {
    sqlx::query_as(
        "SELECT id, request_id, request_type FROM seed_old_queue
          WHERE status = 'NEW' ORDER BY id LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
    .map_err(db("read the queue"))
}

/// Marks a queue row processed.
pub(super) async fn done(pool: &PgPool, id: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE seed_old_queue SET status = 'DONE' WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .map_err(db("mark a queue row done"))?;
    Ok(())
}

/// Sets up `bench --shadow`'s baseline beside ours: a login role
/// `baseline_role` with the worker's grants whose claims go to its own copy
/// of our state tables (schema `baseline`, first on its search path), as
/// the scheduler in place has its own; a trigger that records its approvals
/// as `decided_by = baseline_decided_by`, as that scheduler's are; and
/// `lab_business_write`, one row per write to the business's tables with
/// the session's role, so what ours wrote is counted by the database.
pub(super) async fn install_baseline(
    pool: &PgPool,
    worker_role: &str,
    baseline_role: &str,
    baseline_decided_by: &str,
) -> Result<(), DbError> {
    let mut statements = vec![
        format!("CREATE ROLE \"{baseline_role}\" LOGIN IN ROLE \"{worker_role}\""),
        format!("CREATE SCHEMA baseline AUTHORIZATION \"{baseline_role}\""),
        format!("ALTER ROLE \"{baseline_role}\" SET search_path = baseline, public"),
    ];
    for table in [
        "auto_approve_state",
        "auto_approve_sent",
        "auto_approve_wake",
        "auto_approve_pause",
        "auto_approve_fleet_pause",
    ] {
        statements.push(format!(
            "CREATE TABLE baseline.{table} (LIKE public.{table} INCLUDING ALL)"
        ));
        statements.push(format!(
            "ALTER TABLE baseline.{table} OWNER TO \"{baseline_role}\""
        ));
    }
    statements.extend([
        format!(
            "CREATE FUNCTION lab_baseline_decided_by() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF session_user = '{baseline_role}' AND NEW.decided_by = 'autoapproval' THEN
                     NEW.decided_by := '{baseline_decided_by}';
                 END IF;
                 RETURN NEW;
             END $$"
        ),
        "CREATE TRIGGER lab_baseline_decided_by BEFORE UPDATE ON approval_request
             FOR EACH ROW EXECUTE FUNCTION lab_baseline_decided_by()"
            .into(),
        "CREATE TABLE lab_business_write (
             by_role    TEXT NOT NULL,
             table_name TEXT NOT NULL,
             operation  TEXT NOT NULL,
             at         TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
            .into(),
        "CREATE FUNCTION lab_record_business_write() RETURNS trigger
             LANGUAGE plpgsql SECURITY DEFINER AS $$
         BEGIN
             INSERT INTO lab_business_write (by_role, table_name, operation)
                  VALUES (session_user, TG_TABLE_NAME, TG_OP);
             RETURN NULL;
         END $$"
            .into(),
    ]);
    for table in ["approval_request", "approval_request_memo", "econtract"] {
        statements.push(format!(
            "CREATE TRIGGER lab_business_write AFTER INSERT OR UPDATE OR DELETE ON {table}
                 FOR EACH ROW EXECUTE FUNCTION lab_record_business_write()"
        ));
    }
    for sql in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .map_err(db("install the shadow run's baseline"))?;
    }
    Ok(())
}

/// Writes to the business's tables by sessions of `role` so far, by table
/// and operation (`approval_request UPDATE: 3`).
pub(super) async fn business_writes_by(
    pool: &PgPool,
    role: &str,
) -> Result<Vec<(String, i64)>, DbError> {
    sqlx::query_as(
        "SELECT table_name || ' ' || operation, count(*) FROM lab_business_write
          WHERE by_role = $1 GROUP BY 1 ORDER BY 1",
    )
    .bind(role)
    .fetch_all(pool)
    .await
    .map_err(db("count the business writes"))
}
