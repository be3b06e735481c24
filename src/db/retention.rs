//! What the garbage collector may delete, beyond the CRs of finished
//! requests: the CRs of requests no longer worked (abandoned), and the rows
//! of our tables that nothing needs any more. Every table of ours has a
//! bound; these are the collectors of the ones nothing else empties.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::DbError;

/// Which open requests count as abandoned: no longer worked by the
/// controller, and untouched for a while.
#[derive(Clone, Debug, PartialEq)]
pub struct AbandonedQuery {
    /// Requests sorted before this are out of the candidate window.
    pub window_start: DateTime<Utc>,
    /// A state row at this many retries is Exhausted.
    pub retry_limit: i32,
    /// Neither the request nor its state row changed for this long (in the
    /// database's clock).
    pub idle_for: Duration,
}

/// Rows one retention pass deleted, by table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowsCollected {
    /// `auto_approve_sent`: bodies of requests decided (or gone) longer ago
    /// than the retention.
    pub sent: u64,
    /// `auto_approve_pause`: pauses of requests decided (or gone) longer
    /// ago than the retention.
    pub pauses: u64,
    /// `shard_fence`: tokens of a shard count other than the layout's.
    pub fences: u64,
    /// `autoapproval_manual_token` (MySQL): every token row but the newest.
    pub manual_tokens: u64,
}

/// Rows deleted per statement of a retention pass: a pass repeats it until
/// fewer go, so no statement runs into `--db-statement-timeout` after a
/// long time without a collector.
pub(super) const BATCH: i64 = 5_000;

interface! {
    /// Retention: see the methods on [`Database`].
    trait Retention {
        /// The requests among `request_ids` that are open but abandoned:
        /// Exhausted (their state row at the retry limit) or out of the
        /// candidate window, not paused, not claimed, and neither the request
        /// nor its state row changed for `query.idle_for`. Their CRs may go:
        /// the database keeps their state, and discovery creates the CR again
        /// once the request is a candidate (a change revives it, or it is
        /// sorted into the window again).
        #[tracing::instrument(name = "store.abandoned_among", skip_all)]
        fn abandoned_among(
            &self,
            request_ids: &[i64],
            query: &AbandonedQuery,
        ) -> Result<Vec<i64>, DbError>;
        /// Deletes the rows nothing needs any more (see [`RowsCollected`]);
        /// a request counts as decided `decided_for` after its decision, in
        /// the database's clock.
        #[tracing::instrument(name = "store.collect_rows", skip_all)]
        fn collect_rows(&self, decided_for: Duration) -> Result<RowsCollected, DbError>;
    }
}
