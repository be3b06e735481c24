//! Pauses an operator set, kept in the database (migration 0014) so they
//! outlive the CR they were set through.

use chrono::{DateTime, Utc};

use super::DbError;

/// A request's pause.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Pause {
    /// Who set it (`AutoApproval <name>` for a CR's spec.paused).
    pub paused_by: String,
    /// The uid of the CR it was set through, if it was.
    pub cr_uid: Option<String>,
    /// When it was set, in the database's clock.
    pub paused_at: DateTime<Utc>,
}

interface! {
    /// Pauses: see the methods on [`Database`].
    trait Pauses {
        /// Records that `request_id` is paused, through the CR `cr_uid`; the
        /// CR it is recorded through is updated when one already stands.
        #[tracing::instrument(name = "store.pause", skip_all)]
        fn pause(
            &self,
            request_id: i64,
            paused_by: &str,
            cr_uid: Option<&str>,
        ) -> Result<(), DbError>;
        /// Ends the pause of `request_id` if it was set through the CR
        /// `cr_uid`; true when one was ended.
        #[tracing::instrument(name = "store.resume", skip_all)]
        fn resume(&self, request_id: i64, cr_uid: Option<&str>) -> Result<bool, DbError>;
        /// The pause of `request_id`, if it is paused.
        #[tracing::instrument(name = "store.pause_of", skip_all)]
        fn pause_of(&self, request_id: i64) -> Result<Option<Pause>, DbError>;
    }
}

/// `impl Pauses` for a backend, given its SQL: the binding and reading are
/// the same on both. `$record` upserts (request_id, paused_by, cr_uid)
/// keeping paused_at; `$end` deletes by request_id and a null-safe
/// cr_uid; `$read` selects paused_by, cr_uid, paused_at by request_id.
macro_rules! impl_pauses {
    ($store:ty, record: $record:expr, end: $end:expr, read: $read:expr $(,)?) => {
        impl $crate::db::Pauses for $store {
            async fn pause(
                &self,
                request_id: i64,
                paused_by: &str,
                cr_uid: Option<&str>,
            ) -> Result<(), $crate::db::DbError> {
                sqlx::query($record)
                    .bind(request_id)
                    .bind(paused_by)
                    .bind(cr_uid)
                    .execute(&self.primary)
                    .await
                    .map_err(db("record pause"))?;
                Ok(())
            }

            async fn resume(
                &self,
                request_id: i64,
                cr_uid: Option<&str>,
            ) -> Result<bool, $crate::db::DbError> {
                let done = sqlx::query($end)
                    .bind(request_id)
                    .bind(cr_uid)
                    .execute(&self.primary)
                    .await
                    .map_err(db("end pause"))?;
                Ok(done.rows_affected() == 1)
            }

            async fn pause_of(
                &self,
                request_id: i64,
            ) -> Result<Option<$crate::db::Pause>, $crate::db::DbError> {
                sqlx::query_as($read)
                    .bind(request_id)
                    .fetch_optional(&self.primary)
                    .await
                    .map_err(db("read pause"))
            }
        }
    };
}
pub(super) use impl_pauses;
