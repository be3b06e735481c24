//! Wakes: the LISTEN connection for the triggers' NOTIFY, and the wake a
//! caller records for a change the database did not see.

use super::{DbError, RequestChanges, ShardFilter};
use chrono::{DateTime, Utc};

/// One notification from the request-changed channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestChange {
    /// This request was inserted, or a fact its filters read changed.
    Changed(i64),
    /// A payload that is not a request id; reported and ignored.
    Malformed(String),
    /// The connection dropped and was re-established: notifications may
    /// have been missed, so the caller should run a full turn.
    Reconnected,
}

impl RequestChange {
    /// A change from a notification's payload: the request id as text.
    pub(crate) fn parse(payload: &str) -> Self {
        match payload.trim().parse() {
            Ok(id) => RequestChange::Changed(id),
            Err(_) => RequestChange::Malformed(payload.to_owned()),
        }
    }
}

interface! {
    /// Wakes: see the methods on [`Database`].
    trait Wakes {
        /// Makes waiting requests due at `now` because a fact their filters read
        /// changed, and marks running ones so the retry they schedule is due at
        /// once; returns the requests touched. Retry counts stay. The triggers
        /// record the same wake with every change (migration 0009); this is for
        /// a caller that knows of a change the database did not see.
        fn wake(
            &self,
            request_ids: &[i64],
            now: DateTime<Utc>,
        ) -> Result<Vec<i64>, DbError>;
        /// Makes due now the waiting requests of `shards` that the business
        /// system woke (the rows its trigger appended, migration 0010), and
        /// removes those rows, and those of requests with no claim left; a
        /// running claim's rows stay for the retry it schedules. Returns the
        /// requests made due. A woken request at `retry_limit` (Exhausted) is
        /// revived: its count starts again from zero, because the fact the
        /// business changed may be what made it fail.
        fn apply_wakes(
            &self,
            shards: Option<&ShardFilter>,
            now: DateTime<Utc>,
            retry_limit: i32,
        ) -> Result<Vec<i64>, DbError>;
        /// Listens on the primary for the request-changed notifications.
        fn request_changes(&self) -> Result<RequestChanges, DbError>;
    }
}
