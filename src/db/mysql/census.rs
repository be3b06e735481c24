//! The leader's census for the metrics (store/census.rs on PostgreSQL).

use chrono::{DateTime, Utc};

use super::{MysqlStore, db};
use crate::db::{CensusQueries, DbError, RequestCensus};

// COUNT(CASE …) for PostgreSQL's count(*) FILTER (WHERE …), which MySQL
// lacks; COUNT is a BIGINT where SUM would be a DECIMAL.
const CENSUS: &str = "\
SELECT COUNT(CASE WHEN status = 'IN_PROGRESS' THEN 1 END) AS in_progress,
       COUNT(CASE WHEN status = 'RETRY_WAITING' AND retry_count < ?
                   AND transient_streak > 0 THEN 1 END) AS waiting_transient,
       COUNT(CASE WHEN status = 'RETRY_WAITING' AND retry_count < ?
                   AND transient_streak = 0 THEN 1 END) AS waiting_condition,
       COUNT(CASE WHEN status = 'RETRY_WAITING' AND retry_count >= ? THEN 1 END) AS exhausted
  FROM auto_approve_state";

/// One branch of the backlog query per (type, open status): the first
/// unclaimed, unpaused request of that range of the candidate index.
fn first_new(request_type: &str, status: &str) -> String {
    format!(
        "(SELECT r.sort_time AS t FROM autoapproval_request r
          WHERE r.request_type = {{TYPE:{request_type}}} AND r.status = {{STATUS:{status}}} AND r.sort_time >= ?
            AND (r.request_type = {{TYPE:OWNER_CONTRACT}} OR r.target_store_number IS NOT NULL)
            AND NOT EXISTS (SELECT 1 FROM auto_approve_state s WHERE s.request_id = r.id)
            AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
          ORDER BY r.sort_time LIMIT 1)"
    )
}

/// When the oldest eligible-but-unclaimed request became eligible, as
/// PostgreSQL's BACKLOG_SQL. MariaDB has no LATERAL join, so the six
/// (type, status) ranges are six branches of a UNION ALL, each bound with
/// the window start; the due retries are the seventh. A template of
/// `db::codes`.
pub(super) fn backlog_sql() -> String {
    let mut branches = Vec::new();
    for request_type in ["OWNER_CONTRACT", "AD_CONTRACT"] {
        for status in ["ING", "PENDING", "RETRY"] {
            branches.push(first_new(request_type, status));
        }
    }
    branches.push(
        "(SELECT s.next_retry_time AS t
            FROM auto_approve_state s
            JOIN autoapproval_request r ON r.id = s.request_id
           WHERE s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?
             AND r.status IN ({OPEN})
             AND r.request_type IN ({TYPE:OWNER_CONTRACT}, {TYPE:AD_CONTRACT})
             AND r.sort_time >= ?
             AND (r.request_type = {TYPE:OWNER_CONTRACT} OR r.target_store_number IS NOT NULL)
             AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
           ORDER BY s.next_retry_time LIMIT 1)"
            .to_owned(),
    );
    format!(
        "SELECT MIN(t) FROM ({}) AS firsts",
        branches.join("\n UNION ALL\n")
    )
}

// === impl MysqlStore ===

impl CensusQueries for MysqlStore {
    async fn census(&self, retry_limit: i32) -> Result<RequestCensus, DbError> {
        sqlx::query_as(CENSUS)
            .bind(retry_limit)
            .bind(retry_limit)
            .bind(retry_limit)
            .fetch_one(&self.read)
            .await
            .map_err(db("census"))
    }

    async fn oldest_eligible(
        &self,
        window_start: DateTime<Utc>,
        now: DateTime<Utc>,
        retry_limit: i32,
    ) -> Result<Option<DateTime<Utc>>, DbError> {
        let mut q = sqlx::query_as(self.render(&backlog_sql()));
        for _ in 0..6 {
            q = q.bind(window_start);
        }
        let (oldest,): (Option<DateTime<Utc>>,) = q
            .bind(now)
            .bind(retry_limit)
            .bind(window_start)
            .fetch_one(&self.read)
            .await
            .map_err(db("backlog age"))?;
        Ok(oldest)
    }
}
