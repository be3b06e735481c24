//! The leader's census for the metrics: requests by state, from the state
//! table, and the age of the oldest request a candidate query would select
//! now (the backlog), both cheap enough to run every few seconds.

use chrono::{DateTime, Utc};

use super::{PgStore, db};
use crate::db::{CensusQueries, DbError, RequestCensus};

// One pass over the state table, which holds in-progress and waiting
// requests only (never the backlog). The reason class of a waiting row is
// its transient streak: the retry write sets it to 0 after an unmet
// condition and counts it up after a transient failure (claims.rs).
const CENSUS: &str = "\
SELECT count(*) FILTER (WHERE status = 'IN_PROGRESS') AS in_progress,
       count(*) FILTER (WHERE status = 'RETRY_WAITING' AND retry_count < $1
                          AND transient_streak > 0) AS waiting_transient,
       count(*) FILTER (WHERE status = 'RETRY_WAITING' AND retry_count < $1
                          AND transient_streak = 0) AS waiting_condition,
       count(*) FILTER (WHERE status = 'RETRY_WAITING' AND retry_count >= $1) AS exhausted
  FROM auto_approve_state";

/// When the oldest eligible-but-unclaimed request became eligible: what
/// the candidate queries (candidates.rs) would select with no limit and no
/// shard filter. A new request (no state row) is eligible since its
/// `sort_time`, its place in the queue (a resubmission moves it); a due
/// retry since its `next_retry_time`. Each (type, open status) pair is one
/// range of the candidate index read in order until its first unclaimed,
/// unpaused row, so the cost is that of one candidate query per pair; the
/// due retries are read from the state table in retry order until the
/// first whose request is eligible, so their cost is bounded by the state
/// table (in progress + waiting), not by the open requests.
/// docs/BENCHMARKS.md shows the plans. A template (`db::codes`):
/// [`backlog_sql`] is it in our words.
pub const BACKLOG_SQL: &str = "\
SELECT LEAST(
  (SELECT min(first.sort_time)
     FROM (VALUES ({TYPE:OWNER_CONTRACT}, {STATUS:ING}), ({TYPE:OWNER_CONTRACT}, {STATUS:PENDING}),
                  ({TYPE:OWNER_CONTRACT}, {STATUS:RETRY}), ({TYPE:AD_CONTRACT}, {STATUS:ING}),
                  ({TYPE:AD_CONTRACT}, {STATUS:PENDING}), ({TYPE:AD_CONTRACT}, {STATUS:RETRY})) AS k(request_type, status)
     CROSS JOIN LATERAL (
       SELECT r.sort_time
         FROM autoapproval_request r
        WHERE r.status IN ({OPEN})
          AND r.request_type = k.request_type
          AND r.status = k.status
          AND r.sort_time >= $1
          AND (r.request_type = {TYPE:OWNER_CONTRACT} OR r.target_store_number IS NOT NULL)
          AND NOT EXISTS (SELECT 1 FROM auto_approve_state s WHERE s.request_id = r.id)
          AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
        ORDER BY r.sort_time
        LIMIT 1) AS first),
  (SELECT s.next_retry_time
     FROM auto_approve_state s
     JOIN autoapproval_request r ON r.id = s.request_id
    WHERE s.status = 'RETRY_WAITING'
      AND s.next_retry_time <= $2
      AND s.retry_count < $3
      AND r.status IN ({OPEN})
      AND r.request_type IN ({TYPE:OWNER_CONTRACT}, {TYPE:AD_CONTRACT})
      AND r.sort_time >= $1
      AND (r.request_type = {TYPE:OWNER_CONTRACT} OR r.target_store_number IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY s.next_retry_time
    LIMIT 1))";

/// The templates here (`db::codes`).
pub(super) const TEMPLATES: &[&str] = &[BACKLOG_SQL];

/// [`BACKLOG_SQL`] in our own words.
pub fn backlog_sql() -> &'static str {
    super::ours().text(BACKLOG_SQL).unwrap_or(BACKLOG_SQL)
}

impl CensusQueries for PgStore {
    async fn census(&self, retry_limit: i32) -> Result<RequestCensus, DbError> {
        sqlx::query_as(CENSUS)
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
        let (oldest,): (Option<DateTime<Utc>>,) = sqlx::query_as(self.sql(BACKLOG_SQL))
            .bind(window_start)
            .bind(now)
            .bind(retry_limit)
            .fetch_one(&self.read)
            .await
            .map_err(db("backlog age"))?;
        Ok(oldest)
    }
}
