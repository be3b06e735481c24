//! The harness's SQL on MariaDB (and MySQL 8): the same probes, seeding and
//! readings as on PostgreSQL, the seed's old queue, and ShedLock's table.
//! Times are UTC DATETIME(6), as in migrations/mysql/controller.

use std::time::Duration;

use sqlx::{MySqlPool, QueryBuilder};

use autoapproval::db::DbError;
use autoapproval::domain::Candidate;

use super::{ApprovalSpan, NewRequest, RequestEnd, db};

/// The probes, the old design's queue and ShedLock's table. A trigger's
/// body is one statement each; the text protocol (`raw_sql`) sends them,
/// as CREATE TRIGGER cannot be prepared.
const PROBES: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS harness_eligible (
         request_id  BIGINT      NOT NULL PRIMARY KEY,
         eligible_at DATETIME(6) NOT NULL)",
    "CREATE TABLE IF NOT EXISTS harness_claim (
         request_id BIGINT      NOT NULL,
         claimed_at DATETIME(6) NOT NULL,
         KEY harness_claim_request (request_id, claimed_at))",
    // The seed inserts its ids itself: one AUTO_INCREMENT of our own gives
    // the request its id before the insert, so its e-contract reference
    // ('EC-<id>') is written with it instead of by a second, waking update.
    "CREATE TABLE IF NOT EXISTS harness_request_id (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY)",
    "DROP TRIGGER IF EXISTS harness_claim_insert",
    "CREATE TRIGGER harness_claim_insert AFTER INSERT ON auto_approve_state FOR EACH ROW
         INSERT INTO harness_claim (request_id, claimed_at)
         SELECT NEW.request_id, UTC_TIMESTAMP(6) FROM DUAL WHERE NEW.status = 'IN_PROGRESS'",
    "DROP TRIGGER IF EXISTS harness_claim_update",
    "CREATE TRIGGER harness_claim_update AFTER UPDATE ON auto_approve_state FOR EACH ROW
         INSERT INTO harness_claim (request_id, claimed_at)
         SELECT NEW.request_id, UTC_TIMESTAMP(6) FROM DUAL
          WHERE NEW.status = 'IN_PROGRESS' AND OLD.status <> 'IN_PROGRESS'",
    // No partial unique index in MySQL: a generated column that is the
    // request id while queued and NULL after (NULLs never collide).
    "CREATE TABLE IF NOT EXISTS seed_old_queue (
         id           BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
         request_id   BIGINT      NOT NULL,
         request_type VARCHAR(64) NOT NULL,
         status       VARCHAR(16) NOT NULL DEFAULT 'NEW',
         enqueued_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
         queued_request BIGINT AS (IF(status = 'NEW', request_id, NULL)) STORED,
         UNIQUE KEY seed_old_queue_new (queued_request),
         KEY seed_old_queue_status (status, id))",
    // ShedLock's JDBC table, as its documentation creates it.
    "CREATE TABLE IF NOT EXISTS shedlock (
         name       VARCHAR(64)  NOT NULL PRIMARY KEY,
         lock_until DATETIME(6)  NOT NULL,
         locked_at  DATETIME(6)  NOT NULL,
         locked_by  VARCHAR(255) NOT NULL)",
];

pub(super) async fn install_probes(pool: &MySqlPool, _worker_role: &str) -> Result<(), DbError> {
    // The replicas connect as root on the lab's throwaway server: no grants.
    for sql in PROBES {
        sqlx::raw_sql(sqlx::AssertSqlSafe(*sql))
            .execute(pool)
            .await
            .map_err(db("install the harness probes"))?;
    }
    Ok(())
}

pub(super) async fn insert_request(pool: &MySqlPool, request: &NewRequest) -> Result<i64, DbError> {
    let mut tx = pool.begin().await.map_err(db("seed a request"))?;
    let id = sqlx::query("INSERT INTO harness_request_id () VALUES ()")
        .execute(&mut *tx)
        .await
        .map_err(db("seed a request"))?
        .last_insert_id() as i64;
    sqlx::query(
        "INSERT INTO approval_request
             (id, request_type, status, business_name, documents_released, menu_registered,
              logo_registered, previous_step_approved, econtract_ref, target_store_number,
              created_at, sort_time)
         VALUES (?, ?, 'PENDING', ?, ?, true, true, true, CONCAT('EC-', ?), ?,
                 UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .bind(id)
    .bind(request.request_type.as_str())
    .bind(&request.business_name)
    .bind(request.documents_released)
    .bind(id)
    .bind(request.target_store_number)
    .execute(&mut *tx)
    .await
    .map_err(db("seed a request"))?;
    if request.documents_released {
        sqlx::query(
            "INSERT INTO harness_eligible (request_id, eligible_at)
             SELECT id, created_at FROM approval_request WHERE id = ?",
        )
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(db("seed a request"))?;
    }
    tx.commit().await.map_err(db("seed a request"))?;
    Ok(id)
}

/// `<prefix> (?, ?, …) <suffix>` with `ids` bound.
fn with_ids(prefix: &str, ids: &[i64], suffix: &str) -> QueryBuilder<sqlx::MySql> {
    let mut query = QueryBuilder::new(prefix);
    query.push(" (");
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    query.push(") ");
    query.push(suffix);
    query
}

pub(super) async fn release_documents(pool: &MySqlPool, ids: &[i64]) -> Result<(), DbError> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut tx = pool.begin().await.map_err(db("release documents"))?;
    with_ids(
        "UPDATE approval_request
            SET documents_released = true, updated_at = UTC_TIMESTAMP(6)
          WHERE id IN",
        ids,
        "",
    )
    .build()
    .execute(&mut *tx)
    .await
    .map_err(db("release documents"))?;
    with_ids(
        "INSERT INTO harness_eligible (request_id, eligible_at)
         SELECT id, UTC_TIMESTAMP(6) FROM approval_request WHERE id IN",
        ids,
        "ON DUPLICATE KEY UPDATE eligible_at = VALUES(eligible_at)",
    )
    .build()
    .execute(&mut *tx)
    .await
    .map_err(db("release documents"))?;
    tx.commit().await.map_err(db("release documents"))
}

pub(super) async fn approve_by_hand(
    pool: &MySqlPool,
    id: i64,
    person: &str,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE approval_request
            SET status = 'APPROVED', decided_by = ?, decided_at = UTC_TIMESTAMP(6),
                updated_at = UTC_TIMESTAMP(6)
          WHERE id = ?",
    )
    .bind(person)
    .bind(id)
    .execute(pool)
    .await
    .map_err(db("approve by hand"))?;
    Ok(())
}

pub(super) async fn ends(pool: &MySqlPool, ids: &[i64]) -> Result<Vec<RequestEnd>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    with_ids(
        "SELECT r.id AS request_id, r.status, r.decided_by, s.status AS state, s.last_reason
           FROM approval_request r
           LEFT JOIN auto_approve_state s ON s.request_id = r.id
          WHERE r.id IN",
        ids,
        "ORDER BY r.id",
    )
    .build_query_as()
    .fetch_all(pool)
    .await
    .map_err(db("read the requests' ends"))
}

pub(super) async fn pickups_ms(pool: &MySqlPool) -> Result<Vec<f64>, DbError> {
    // A float literal makes the quotient a DOUBLE on both servers.
    let rows: Vec<(f64,)> = sqlx::query_as(
        "SELECT TIMESTAMPDIFF(MICROSECOND, e.eligible_at, MIN(c.claimed_at)) / 1e3 AS ms
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

pub(super) async fn approval_span(
    pool: &MySqlPool,
    decided_by: &str,
) -> Result<ApprovalSpan, DbError> {
    let (approved, seconds): (i64, Option<f64>) = sqlx::query_as(
        "SELECT COUNT(*),
                TIMESTAMPDIFF(MICROSECOND, (SELECT MIN(eligible_at) FROM harness_eligible),
                              MAX(r.decided_at)) / 1e6
           FROM approval_request r
          WHERE r.status = 'APPROVED' AND r.decided_by = ?",
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

pub(super) async fn waiting(pool: &MySqlPool) -> Result<i64, DbError> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM auto_approve_state WHERE status = 'RETRY_WAITING'")
            .fetch_one(pool)
            .await
            .map_err(db("count waiting state rows"))?;
    Ok(n)
}

pub(super) async fn unfinished(pool: &MySqlPool) -> Result<i64, DbError> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM approval_request WHERE status IN ('PENDING', 'RETRY', 'ING')",
    )
    .fetch_one(pool)
    .await
    .map_err(db("count unfinished requests"))?;
    Ok(n)
}

pub(super) async fn oldest_running_claim(pool: &MySqlPool) -> Result<Option<(i64, f64)>, DbError> {
    sqlx::query_as(
        "SELECT s.request_id,
                TIMESTAMPDIFF(MICROSECOND, MAX(c.claimed_at), UTC_TIMESTAMP(6)) / 1e6 AS age
           FROM auto_approve_state s
           JOIN harness_claim c ON c.request_id = s.request_id
          WHERE s.status = 'IN_PROGRESS'
          GROUP BY s.request_id
          ORDER BY age DESC
          LIMIT 1",
    )
    .fetch_optional(pool)
    .await
    .map_err(db("read the oldest running claim"))
}

pub(super) async fn terminate_backends(pool: &MySqlPool, user: &str) -> Result<i64, DbError> {
    let mut conn = pool.acquire().await.map_err(db("terminate the sessions"))?;
    let ids: Vec<(i64,)> = sqlx::query_as(
        "SELECT CAST(id AS SIGNED) FROM information_schema.processlist
          WHERE user = ? AND id <> CONNECTION_ID()",
    )
    .bind(user)
    .fetch_all(&mut *conn)
    .await
    .map_err(db("list the sessions"))?;
    let mut ended = 0;
    for (id,) in ids {
        // A session that ended meanwhile is not an error.
        if sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
            .execute(&mut *conn)
            .await
            .is_ok()
        {
            ended += 1;
        }
    }
    Ok(ended)
}

/// ShedLock's JDBC provider: a first run inserts the row; later runs take
/// it by a conditional update once its `lock_until` has passed.
pub(super) async fn try_lock(
    pool: &MySqlPool,
    name: &str,
    holder: &str,
    at_most: Duration,
) -> Result<bool, DbError> {
    let micros = at_most.as_micros() as i64;
    let inserted = sqlx::query(
        "INSERT IGNORE INTO shedlock (name, lock_until, locked_at, locked_by)
         VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), ?)",
    )
    .bind(name)
    .bind(micros)
    .bind(holder)
    .execute(pool)
    .await
    .map_err(db("take the scheduler lock"))?;
    if inserted.rows_affected() == 1 {
        return Ok(true);
    }
    let updated = sqlx::query(
        "UPDATE shedlock
            SET lock_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                locked_at = UTC_TIMESTAMP(6), locked_by = ?
          WHERE name = ? AND lock_until <= UTC_TIMESTAMP(6)",
    )
    .bind(micros)
    .bind(holder)
    .bind(name)
    .execute(pool)
    .await
    .map_err(db("take the scheduler lock"))?;
    Ok(updated.rows_affected() == 1)
}

/// ShedLock's unlock: held on until `at_least` after it was taken.
pub(super) async fn unlock(
    pool: &MySqlPool,
    name: &str,
    holder: &str,
    at_least: Duration,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE shedlock
            SET lock_until = GREATEST(locked_at + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))
          WHERE name = ? AND locked_by = ?",
    )
    .bind(at_least.as_micros() as i64)
    .bind(name)
    .bind(holder)
    .execute(pool)
    .await
    .map_err(db("release the scheduler lock"))?;
    Ok(())
}

pub(super) async fn enqueue(pool: &MySqlPool, candidates: &[Candidate]) -> Result<u64, DbError> {
    if candidates.is_empty() {
        return Ok(0);
    }
    let mut query =
        QueryBuilder::new("INSERT IGNORE INTO seed_old_queue (request_id, request_type) ");
    query.push_values(candidates, |mut row, c| {
        row.push_bind(c.request_id)
            .push_bind(c.request_type.as_str());
    });
    let done = query
        .build()
        .execute(pool)
        .await
        .map_err(db("fill the queue"))?;
    Ok(done.rows_affected())
}

pub(super) async fn queued(
    pool: &MySqlPool,
    limit: i64,
) -> Result<Vec<(i64, i64, String)>, DbError> {
    sqlx::query_as(
        "SELECT id, request_id, request_type FROM seed_old_queue
          WHERE status = 'NEW' ORDER BY id LIMIT ?",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
    .map_err(db("read the queue"))
}

pub(super) async fn done(pool: &MySqlPool, id: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE seed_old_queue SET status = 'DONE' WHERE id = ?")
        .bind(id)
        .execute(pool)
        .await
        .map_err(db("mark a queue row done"))?;
    Ok(())
}
