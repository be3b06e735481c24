//! Getting work back: the cleanser's pass over stuck and finished state
//! rows, the fence raised when a shard changes hands (recovering the old
//! holder's claims), and the release of a replica's claims at shutdown.

use chrono::{DateTime, Utc};

use super::DbError;

/// What the cleanser did in one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanseReport {
    /// Requests whose stuck claim went back to RETRY_WAITING.
    pub recovered: Vec<i64>,
    /// State rows deleted because their request is terminal or gone.
    pub deleted: u64,
}

interface! {
    /// Recovery: see the methods on [`Database`].
    trait Recovery {
        /// The cleanser's pass: stuck claims back to RETRY_WAITING (with a memo
        /// and retry_count + 1, so a request that kills its worker every time
        /// still reaches the limit), then rows of terminal or vanished requests
        /// deleted. Rows at the retry limit match neither and stay.
        ///
        /// "Untouched for `stuck_for`" is judged in the database's clock, the
        /// one every claim and heartbeat stamps `modified_at` with: replicas'
        /// clocks may disagree, the database's is one. `now` is the due time
        /// given to what is recovered.
        fn cleanse(
            &self,
            stuck_for: std::time::Duration,
            now: DateTime<Utc>,
        ) -> Result<CleanseReport, DbError>;
        /// Deletes the waiting state row of a request that is no longer open (a
        /// person decided); an IN_PROGRESS row is left to its holder.
        #[tracing::instrument(name = "store.forget_closed", skip_all)]
        fn forget_closed(&self, request_id: i64) -> Result<bool, DbError>;
        /// Gives back every claim `holder` still holds under one of `tokens`,
        /// but those of the requests in `running`: due again at once, no retry
        /// counted. At shutdown nothing runs any more; while running, these are
        /// claims whose chain ended without writing its outcome (the database
        /// failed under it). Returns the requests released.
        fn release_all(
            &self,
            holder: &str,
            tokens: &[i64],
            running: &[i64],
            now: DateTime<Utc>,
        ) -> Result<Vec<i64>, DbError>;
        /// The current fencing token of a shard, if it was ever fenced.
        fn shard_token(
            &self,
            shard_count: u32,
            shard: u32,
        ) -> Result<Option<i64>, DbError>;
        /// Raises a shard's fencing token to `token` for `holder`, and recovers
        /// every claim of the shard made under an older token (back to
        /// RETRY_WAITING, due now, retry_count + 1, with a memo), in one
        /// transaction. Token 0 marks a claim outside coordination (a manual
        /// path): only the stuck-age cleanser recovers those. `None` when the shard already has a token at or above
        /// `token`: someone acquired it later, nothing was written.
        fn fence_shard(
            &self,
            shard_count: u32,
            shard: u32,
            token: i64,
            holder: &str,
            now: DateTime<Utc>,
        ) -> Result<Option<Vec<i64>>, DbError>;
    }
}

/// `shard_token` of `impl Recovery for <backend>`, whose SQL differs
/// between the backends only in its placeholders.
macro_rules! shard_token {
    ($count:literal, $shard:literal) => {
        async fn shard_token(
            &self,
            shard_count: u32,
            shard: u32,
        ) -> Result<Option<i64>, $crate::db::DbError> {
            let row: Option<(i64,)> = sqlx::query_as(concat!(
                "SELECT token FROM shard_fence WHERE shard_count = ",
                $count,
                " AND shard = ",
                $shard
            ))
            .bind(shard_count as i32)
            .bind(shard as i32)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("read shard token"))?;
            Ok(row.map(|(token,)| token))
        }
    };
}
pub(super) use shard_token;
