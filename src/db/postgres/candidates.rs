//! The thin candidate query: which requests are worth a look, on the read
//! pool. Nothing is locked; the claim decides.

use super::{PgStore, db};
use crate::db::candidates::{of_any_type, of_type};
use crate::db::{CandidateQuery, Candidates, DbError};
use crate::domain::{Candidate, RequestType};

// The two candidate queries. Conditions and ORDER BY follow the partial
// index `approval_request_open_candidates` (request_type, status, sort_time)
// INCLUDE (id, target_store_number), so the request side is one index-only
// range read in order and LIMIT stops it; each row costs one unique-index
// probe of the state table and one of the (small) pause table. Open statuses sort ING < PENDING < RETRY. A
// union of a new-request and a due-retry branch was measured and rejected:
// docs/BENCHMARKS.md.
const OWNER_CANDIDATES: &str = "\
SELECT r.id AS request_id, s.id AS state_id
  FROM autoapproval_request r
  LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.status IN ({OPEN})
   AND r.request_type = {TYPE:OWNER_CONTRACT}
   AND r.sort_time >= $1
   AND (s.id IS NULL
        OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= $2 AND s.retry_count < $3))
   AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
   AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
 ORDER BY r.status, r.sort_time
 LIMIT $4";

// Ad contracts also need the store they advertise.
const AD_CANDIDATES: &str = "\
SELECT r.id AS request_id, s.id AS state_id
  FROM autoapproval_request r
  LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.status IN ({OPEN})
   AND r.request_type = {TYPE:AD_CONTRACT}
   AND r.sort_time >= $1
   AND r.target_store_number IS NOT NULL
   AND (s.id IS NULL
        OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= $2 AND s.retry_count < $3))
   AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
   AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
 ORDER BY r.status, r.sort_time
 LIMIT $4";

// The same conditions, for given requests of both types at once: the ones a
// notification named, or a turn found by several paths. Read by primary
// key, in the candidate queries' order (status, then oldest sort_time), so
// that a turn takes them in that order; no limit.
const CANDIDATES_AMONG: &str = "\
SELECT r.id AS request_id, {TYPE_AS:r.request_type}, s.id AS state_id
  FROM autoapproval_request r
  LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.id = ANY($4::bigint[])
   AND r.status IN ({OPEN})
   AND (r.request_type = {TYPE:OWNER_CONTRACT}
        OR (r.request_type = {TYPE:AD_CONTRACT} AND r.target_store_number IS NOT NULL))
   AND r.sort_time >= $1
   AND (s.id IS NULL
        OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= $2 AND s.retry_count < $3))
   AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
 ORDER BY r.status, r.sort_time, r.id";

/// The fresh candidates of a type ($8): two branches that each read only
/// rows that can be candidates. New requests: a primary-key range above the
/// cursor ($7), in id order, probing the state and pause tables per row;
/// every request inserted since the cursor is read once, whatever became of
/// it. Due retries: the partial index `auto_approve_state_due`
/// (next_retry_time) WHERE status = 'RETRY_WAITING' (migration 0016), in due
/// order, to the limit; each probes its request by primary key. Waiting
/// requests are in neither, however many there are. A template
/// (`db::codes`): [`fresh_candidates_sql`] is it in our words. The type is
/// bound as our word and turned into the business's code in the statement
/// (`TYPE_PARAM`): neither branch reads by type, so no index needs it as a literal.
pub const FRESH_CANDIDATES: &str = "\
(SELECT r.id AS request_id, NULL::bigint AS state_id
   FROM autoapproval_request r
  WHERE r.id > $7
    AND r.status IN ({OPEN})
    AND r.request_type = {TYPE_PARAM:$8}
    AND r.sort_time >= $1
    AND ($8 <> 'AD_CONTRACT' OR r.target_store_number IS NOT NULL)
    AND NOT EXISTS (SELECT 1 FROM auto_approve_state s WHERE s.request_id = r.id)
    AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
    AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
  ORDER BY r.id
  LIMIT $4)
UNION ALL
(SELECT r.id AS request_id, s.id AS state_id
   FROM auto_approve_state s
   JOIN autoapproval_request r ON r.id = s.request_id
  WHERE s.status = 'RETRY_WAITING'
    AND s.next_retry_time <= $2
    AND s.retry_count < $3
    AND r.status IN ({OPEN})
    AND r.request_type = {TYPE_PARAM:$8}
    AND r.sort_time >= $1
    AND ($8 <> 'AD_CONTRACT' OR r.target_store_number IS NOT NULL)
    AND ($5::bigint[] IS NULL OR r.id % $6 = ANY($5::bigint[]))
    AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
  ORDER BY s.next_retry_time
  LIMIT $4)";

/// The templates here (`db::codes`).
pub(super) const TEMPLATES: &[&str] = &[
    OWNER_CANDIDATES,
    AD_CANDIDATES,
    CANDIDATES_AMONG,
    FRESH_CANDIDATES,
];

/// The template of a type's candidate query; `None` for types that are not
/// auto-approvable.
pub(super) fn candidate_template(request_type: RequestType) -> Option<&'static str> {
    match request_type {
        RequestType::OwnerContract => Some(OWNER_CANDIDATES),
        RequestType::AdContract => Some(AD_CANDIDATES),
        _ => None,
    }
}

/// The candidate SQL for a type in our own words; `None` for types that are
/// not auto-approvable.
pub fn candidate_sql(request_type: RequestType) -> Option<&'static str> {
    candidate_template(request_type).map(|t| super::ours().text(t).unwrap_or(t))
}

/// The fresh-candidates SQL in our own words ([`FRESH_CANDIDATES`] rendered).
pub fn fresh_candidates_sql() -> &'static str {
    super::ours()
        .text(FRESH_CANDIDATES)
        .unwrap_or(FRESH_CANDIDATES)
}

impl Candidates for PgStore {
    async fn candidates_among(
        &self,
        request_ids: &[i64],
        query: &CandidateQuery,
    ) -> Result<Vec<Candidate>, DbError> {
        let rows: Vec<(i64, String, Option<i64>)> = sqlx::query_as(self.sql(CANDIDATES_AMONG))
            .bind(query.window_start)
            .bind(query.now)
            .bind(query.retry_limit)
            .bind(request_ids)
            .fetch_all(&self.read)
            .await
            .map_err(db("candidates among requests"))?;
        of_any_type(rows)
    }

    async fn fresh_candidates(
        &self,
        query: &CandidateQuery,
        since: i64,
    ) -> Result<Vec<Candidate>, DbError> {
        if candidate_template(query.request_type).is_none() {
            return Ok(Vec::new());
        }
        self.typed_rows(
            FRESH_CANDIDATES,
            query,
            Some(since),
            "fresh candidate query",
        )
        .await
    }

    async fn newest_request_id(&self) -> Result<i64, DbError> {
        sqlx::query_scalar("SELECT COALESCE(max(id), 0) FROM autoapproval_request")
            .fetch_one(&self.read)
            .await
            .map_err(db("newest request id"))
    }

    async fn candidates(&self, query: &CandidateQuery) -> Result<Vec<Candidate>, DbError> {
        let Some(sql) = candidate_template(query.request_type) else {
            return Ok(Vec::new());
        };
        self.typed_rows(sql, query, None, "candidate query").await
    }
}

impl PgStore {
    /// Runs a candidate statement of one type: window start, now, retry
    /// limit, limit, shards and K bound as $1–$6, then the cursor and the
    /// type as $7 and $8 for the fresh query.
    async fn typed_rows(
        &self,
        template: &'static str,
        query: &CandidateQuery,
        since: Option<i64>,
        operation: &'static str,
    ) -> Result<Vec<Candidate>, DbError> {
        let (shards, shard_count) = match &query.shards {
            Some(f) => (Some(f.shards.clone()), f.shard_count.max(1)),
            None => (None, 1),
        };
        let mut statement = sqlx::query_as(self.sql(template))
            .bind(query.window_start)
            .bind(query.now)
            .bind(query.retry_limit)
            .bind(query.limit)
            .bind(shards)
            .bind(shard_count);
        if let Some(since) = since {
            statement = statement.bind(since).bind(query.request_type.as_str());
        }
        let rows: Vec<(i64, Option<i64>)> = statement
            .fetch_all(&self.read)
            .await
            .map_err(db(operation))?;
        Ok(of_type(rows, query.request_type))
    }
}
