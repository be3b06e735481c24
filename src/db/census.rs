//! The leader's census for the metrics: requests by state, from the state
//! table, and the age of the oldest request a candidate query would select
//! now (the backlog), both cheap enough to run every few seconds.

use chrono::{DateTime, Utc};

use super::DbError;

/// How many requests the state table holds in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct RequestCensus {
    /// IN_PROGRESS rows: a chain runs (or ran and its replica vanished).
    pub in_progress: i64,
    /// Waiting for a retry after a transient external failure.
    pub waiting_transient: i64,
    /// Waiting for a condition (documents, signature, hold…), or returned
    /// by the cleanser or a person without a failure of ours.
    pub waiting_condition: i64,
    /// At the retry limit: no longer selected until a change of the request's facts or a person acts.
    pub exhausted: i64,
}

interface! {
    /// The census queries: see the methods on [`Database`].
    trait CensusQueries {
        /// Counts the state table's rows by state; `retry_limit` separates
        /// waiting from exhausted.
        fn census(&self, retry_limit: i32) -> Result<RequestCensus, DbError>;
        /// When the oldest request a candidate query would select at `now`
        /// became eligible; `None` when there is none.
        fn oldest_eligible(
            &self,
            window_start: DateTime<Utc>,
            now: DateTime<Utc>,
            retry_limit: i32,
        ) -> Result<Option<DateTime<Utc>>, DbError>;
    }
}
