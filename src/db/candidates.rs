//! The thin candidate query: which requests are worth a look, on the read
//! pool. Nothing is locked; the claim decides.

use chrono::{DateTime, Utc};

use super::DbError;
use crate::domain::{Candidate, RequestType};

/// What the candidate query should select.
#[derive(Clone, Debug)]
pub struct CandidateQuery {
    /// The request type (one query per auto-approvable type).
    pub request_type: RequestType,
    /// At most this many rows.
    pub limit: i64,
    /// Only requests whose sort_time is at or after this instant.
    pub window_start: DateTime<Utc>,
    /// The evaluation time for "retry due".
    pub now: DateTime<Utc>,
    /// Retries at or beyond this are no longer selected.
    pub retry_limit: i32,
    /// Only requests with `id % shard_count` in `shards`; all when `None`.
    pub shards: Option<ShardFilter>,
}

/// A subset of the K shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardFilter {
    /// K, the number of shards requests are split into (id mod K).
    pub shard_count: i64,
    /// The shards wanted, each in `0..shard_count`.
    pub shards: Vec<i64>,
}

/// Candidate rows (request id, state id) of one type, as candidates.
pub(crate) fn of_type(rows: Vec<(i64, Option<i64>)>, request_type: RequestType) -> Vec<Candidate> {
    rows.into_iter()
        .map(|(request_id, state_id)| Candidate {
            request_id,
            request_type,
            state_id,
        })
        .collect()
}

/// Candidate rows (request id, request type, state id) of any type, as
/// candidates; a type this controller does not know is malformed.
pub(super) fn of_any_type(
    rows: Vec<(i64, String, Option<i64>)>,
) -> Result<Vec<Candidate>, DbError> {
    rows.into_iter()
        .map(|(request_id, request_type, state_id)| {
            Ok(Candidate {
                request_id,
                request_type: request_type
                    .parse()
                    .map_err(|error| DbError::Malformed { request_id, error })?,
                state_id,
            })
        })
        .collect()
}

interface! {
    /// Candidates: see the methods on [`Database`].
    trait Candidates {
        /// Which of `request_ids` are candidates, by the candidate queries'
        /// conditions (window, retry due and under the limit, not paused, an ad
        /// contract's store), in one statement on the read pool; the window,
        /// `now` and the limit come from `query`, its type and shards are not used.
        /// In the candidate queries' order: status, then oldest `sort_time`.
        fn candidates_among(
            &self,
            request_ids: &[i64],
            query: &CandidateQuery,
        ) -> Result<Vec<Candidate>, DbError>;
        /// Runs the thin candidate query on the read pool.
        fn candidates(&self, query: &CandidateQuery) -> Result<Vec<Candidate>, DbError>;
        /// The candidates that cost no step over waiting requests: the new
        /// ones (no state row) with an id above `since`, read in id order,
        /// and the due retries, read from the state table in due order; at
        /// most `query.limit` of each, on the read pool. A new request at or
        /// below `since` is the whole query's to find ([`Database::candidates`]).
        fn fresh_candidates(
            &self,
            query: &CandidateQuery,
            since: i64,
        ) -> Result<Vec<Candidate>, DbError>;
        /// The highest request id there is (0 for none), on the read pool.
        fn newest_request_id(&self) -> Result<i64, DbError>;
    }
}
