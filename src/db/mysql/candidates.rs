//! The thin candidate queries on the read pool, as on PostgreSQL
//! (store/candidates.rs). Nothing is locked; the claim decides.
//!
//! The request side reads the view autoapproval_request; over the reference
//! tables, that is the candidate index approval_request_open_candidates
//! (request_type, status, sort_time, target_store_number), which is not
//! partial here (migrations/mysql/reference): see `candidate_sql` for how the
//! query keeps to the open ranges. The shard filter is `id % K IN (…)` with
//! one placeholder per shard (no arrays).

use chrono::{DateTime, Utc};

use super::{CHUNK, MysqlStore, db, placeholders};
use crate::db::candidates::{of_any_type, of_type};
use crate::db::{CandidateQuery, Candidates, DbError, ShardFilter};
use crate::domain::{Candidate, RequestType};

/// The open statuses, one branch each (the order is the codes' own:
/// `ORDER BY status`).
const OPEN: [&str; 3] = ["ING", "PENDING", "RETRY"];

/// A template of `db::codes` in our own words, as tests and the EXPLAIN of
/// a binding read it.
fn in_our_words(template: &str) -> String {
    super::ours().codes().render(template)
}

/// The candidate SQL of a type for `shards` shards (0: no shard filter);
/// `None` for types that are not auto-approvable. Binds, three times (one
/// branch per open status): window start, now, retry limit, [K, each
/// shard,] limit; then the limit once more.
///
/// One branch per open status, not PostgreSQL's `status IN (…)`: the index
/// is not partial, so the closed statuses sort between the open ones
/// (APPROVED < CANCELED < ING < PENDING < REJECTED < RETRY), and on
/// 1,000,000 requests MariaDB read the type's whole range in index order
/// from APPROVED on (66,745 rows for 20, docs/BENCHMARKS.md issue 19)
/// instead of the three open ranges. Each branch is one range read in
/// order that LIMIT stops; the outer sort is of at most 3 × limit rows.
pub fn candidate_sql(request_type: RequestType, shards: usize) -> Option<String> {
    candidate_template(request_type, shards).map(|t| in_our_words(&t))
}

/// [`candidate_sql`] as a template of `db::codes`.
pub(super) fn candidate_template(request_type: RequestType, shards: usize) -> Option<String> {
    let (ad, shard) = type_and_shard_conditions(request_type, shards)?;
    let branches: Vec<String> = OPEN
        .iter()
        .map(|status| {
            format!(
                "(SELECT r.id AS request_id, s.id AS state_id, r.status, r.sort_time
     FROM autoapproval_request r
     LEFT JOIN auto_approve_state s ON s.request_id = r.id
    WHERE r.request_type = {{TYPE:{}}}
      AND r.status = {{STATUS:{status}}}
      AND r.sort_time >= ?{ad}
      AND (s.id IS NULL
           OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?)){shard}
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY r.sort_time
    LIMIT ?)",
                request_type.as_str()
            )
        })
        .collect();
    Some(format!(
        "SELECT request_id, state_id FROM (\n{}\n) AS candidates\n ORDER BY status, sort_time\n LIMIT ?",
        branches.join("\n UNION ALL\n")
    ))
}

/// The conditions both candidate statements add for a type (an ad contract
/// needs its store) and for `shards` shards (0: none); `None` for types that
/// are not auto-approvable.
fn type_and_shard_conditions(
    request_type: RequestType,
    shards: usize,
) -> Option<(&'static str, String)> {
    let ad = match request_type {
        RequestType::OwnerContract => "",
        RequestType::AdContract => "\n      AND r.target_store_number IS NOT NULL",
        _ => return None,
    };
    let shard = if shards == 0 {
        String::new()
    } else {
        format!("\n      AND r.id % ? IN ({})", placeholders(shards))
    };
    Some((ad, shard))
}

/// The fresh-candidate SQL of a type for `shards` shards (0: no shard
/// filter), as PostgreSQL's `FRESH_CANDIDATES`: new requests above a cursor
/// by primary key in id order, and due retries from the index
/// `auto_approve_state_due (status, next_retry_time)` (migrations/mysql/controller)
/// in due order. Binds: cursor, window start, [K, each shard,] limit;
/// then now, retry limit, window start, [K, each shard,] limit. The new
/// branch's state id is a typed NULL so that the union's column is BIGINT.
pub fn fresh_candidates_sql(request_type: RequestType, shards: usize) -> Option<String> {
    fresh_candidates_template(request_type, shards).map(|t| in_our_words(&t))
}

/// [`fresh_candidates_sql`] as a template of `db::codes`.
pub(super) fn fresh_candidates_template(
    request_type: RequestType,
    shards: usize,
) -> Option<String> {
    let (ad, shard) = type_and_shard_conditions(request_type, shards)?;
    let request_type = request_type.as_str();
    Some(format!(
        "(SELECT r.id AS request_id, CAST(NULL AS SIGNED) AS state_id
     FROM autoapproval_request r
    WHERE r.id > ?
      AND r.request_type = {{TYPE:{request_type}}}
      AND r.status IN ({{OPEN}})
      AND r.sort_time >= ?{ad}
      AND NOT EXISTS (SELECT 1 FROM auto_approve_state s WHERE s.request_id = r.id){shard}
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY r.id
    LIMIT ?)
 UNION ALL
(SELECT r.id AS request_id, s.id AS state_id
     FROM auto_approve_state s
     JOIN autoapproval_request r ON r.id = s.request_id
    WHERE s.status = 'RETRY_WAITING'
      AND s.next_retry_time <= ?
      AND s.retry_count < ?
      AND r.request_type = {{TYPE:{request_type}}}
      AND r.status IN ({{OPEN}})
      AND r.sort_time >= ?{ad}{shard}
      AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
    ORDER BY s.next_retry_time
    LIMIT ?)"
    ))
}

/// The same conditions for given requests of both types, by primary key,
/// in the candidate queries' order (status, then oldest sort_time): the
/// look at notified requests, and the order of a turn's candidates found
/// by several paths; for `n` of them. The sort key is returned too: a
/// list longer than [`CHUNK`] takes several statements, whose rows
/// [`Candidates::candidates_among`] sorts again as one.
pub fn candidates_among_sql(n: usize) -> String {
    in_our_words(&candidates_among_template(n))
}

/// [`candidates_among_sql`] as a template of `db::codes`: the type and the
/// status are read back as our words; the statement sorts by the codes.
pub(super) fn candidates_among_template(n: usize) -> String {
    format!(
        "SELECT r.id AS request_id, {{TYPE_AS:r.request_type}}, s.id AS state_id, {{STATUS_AS:r.status}}, r.sort_time
  FROM autoapproval_request r
  LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.id IN ({})
   AND r.status IN ({{OPEN}})
   AND (r.request_type = {{TYPE:OWNER_CONTRACT}}
        OR (r.request_type = {{TYPE:AD_CONTRACT}} AND r.target_store_number IS NOT NULL))
   AND r.sort_time >= ?
   AND (s.id IS NULL
        OR (s.status = 'RETRY_WAITING' AND s.next_retry_time <= ? AND s.retry_count < ?))
   AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)
 ORDER BY r.status, r.sort_time, r.id",
        placeholders(n)
    )
}

/// A row of [`candidates_among_sql`]: request id, request type, state id,
/// status, sort_time.
type AmongRow = (i64, String, Option<i64>, String, DateTime<Utc>);

/// The rows of every chunk as one list in the statement's own order
/// (`ORDER BY r.status, r.sort_time, r.id`, the status by its code, read
/// back as our word): each statement sorts only its chunk, and the turn
/// takes its limit from the front of the whole list.
fn in_among_order(
    mut rows: Vec<AmongRow>,
    vocabulary: &crate::vocabulary::Vocabulary,
) -> Vec<(i64, String, Option<i64>)> {
    let code = |word: &str| {
        crate::domain::RequestStatus::OPEN
            .into_iter()
            .find(|s| s.as_str() == word)
            .map(|s| vocabulary.status_code(s).clone())
    };
    rows.sort_by_key(|r| (code(&r.3), r.4, r.0));
    rows.into_iter()
        .map(|(request_id, request_type, state_id, _, _)| (request_id, request_type, state_id))
        .collect()
}

/// Binds a shard filter's K and shards, as `candidate_sql` and
/// `fresh_candidates_sql` place them; nothing without a filter.
fn bind_shards<'q, O>(
    mut q: sqlx::query::QueryAs<'q, sqlx::MySql, O, sqlx::mysql::MySqlArguments>,
    filter: Option<&ShardFilter>,
) -> sqlx::query::QueryAs<'q, sqlx::MySql, O, sqlx::mysql::MySqlArguments> {
    if let Some(f) = filter {
        q = q.bind(f.shard_count.max(1));
        if f.shards.is_empty() {
            // No shard: a value no id % K equals.
            q = q.bind(-1_i64);
        }
        for shard in &f.shards {
            q = q.bind(*shard);
        }
    }
    q
}

// === impl MysqlStore ===

impl Candidates for MysqlStore {
    // One statement per [`CHUNK`] of ids: MySQL has no array parameters.
    async fn candidates_among(
        &self,
        request_ids: &[i64],
        query: &CandidateQuery,
    ) -> Result<Vec<Candidate>, DbError> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut rows: Vec<AmongRow> = Vec::new();
        for chunk in request_ids.chunks(CHUNK) {
            let sql = self.render(&candidates_among_template(chunk.len()));
            let q = bind_all!(sqlx::query_as(sql), chunk);
            rows.extend(
                q.bind(query.window_start)
                    .bind(query.now)
                    .bind(query.retry_limit)
                    .fetch_all(&self.read)
                    .await
                    .map_err(db("candidates among requests"))?,
            );
        }
        of_any_type(in_among_order(rows, self.statements.codes().vocabulary()))
    }

    async fn fresh_candidates(
        &self,
        query: &CandidateQuery,
        since: i64,
    ) -> Result<Vec<Candidate>, DbError> {
        let shards = query.shards.as_ref().map_or(0, |f| f.shards.len().max(1));
        let Some(sql) = fresh_candidates_template(query.request_type, shards) else {
            return Ok(Vec::new());
        };
        let q = sqlx::query_as(self.render(&sql))
            .bind(since)
            .bind(query.window_start);
        let q = bind_shards(q, query.shards.as_ref())
            .bind(query.limit)
            .bind(query.now)
            .bind(query.retry_limit)
            .bind(query.window_start);
        let rows: Vec<(i64, Option<i64>)> = bind_shards(q, query.shards.as_ref())
            .bind(query.limit)
            .fetch_all(&self.read)
            .await
            .map_err(db("fresh candidate query"))?;
        Ok(of_type(rows, query.request_type))
    }

    async fn newest_request_id(&self) -> Result<i64, DbError> {
        sqlx::query_scalar("SELECT CAST(COALESCE(MAX(id), 0) AS SIGNED) FROM autoapproval_request")
            .fetch_one(&self.read)
            .await
            .map_err(db("newest request id"))
    }

    async fn candidates(&self, query: &CandidateQuery) -> Result<Vec<Candidate>, DbError> {
        let shards = query.shards.as_ref().map_or(0, |f| f.shards.len().max(1));
        let Some(sql) = candidate_template(query.request_type, shards) else {
            return Ok(Vec::new());
        };
        let mut q = sqlx::query_as(self.render(&sql));
        for _ in OPEN {
            q = q
                .bind(query.window_start)
                .bind(query.now)
                .bind(query.retry_limit);
            q = bind_shards(q, query.shards.as_ref()).bind(query.limit);
        }
        let rows: Vec<(i64, Option<i64>)> = q
            .bind(query.limit)
            .fetch_all(&self.read)
            .await
            .map_err(db("candidate query"))?;
        Ok(of_type(rows, query.request_type))
    }
}
