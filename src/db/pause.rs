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
        /// Every paused request, oldest id first: the few whose CR must
        /// stand while the pause does.
        #[tracing::instrument(name = "store.paused_requests", skip_all)]
        fn paused_requests(&self) -> Result<Vec<i64>, DbError>;
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

            async fn paused_requests(&self) -> Result<Vec<i64>, $crate::db::DbError> {
                sqlx::query_scalar("SELECT request_id FROM auto_approve_pause ORDER BY request_id")
                    .fetch_all(&self.read)
                    .await
                    .map_err(db("list paused requests"))
            }
        }
    };
}
pub(super) use impl_pauses;

/// The pause of the whole fleet (migration 0005 on PostgreSQL, 0004 on
/// MySQL): while it stands no replica claims anything.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct FleetPause {
    /// Who paused it (`autoapproval pause --all --as`, or the SQL function's `who`).
    pub paused_by: String,
    /// Why, as given; `None` when no reason was given.
    pub reason: Option<String>,
    /// When, in the database's clock.
    pub paused_at: DateTime<Utc>,
}

impl FleetPause {
    /// The pause in words, for a CR status, a log line or the CLI:
    /// `fleet paused by ann since 2026-12-07T10:00:00Z: month-end close`.
    pub fn describe(&self) -> String {
        let since = self
            .paused_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        match &self.reason {
            Some(reason) => format!("fleet paused by {} since {since}: {reason}", self.paused_by),
            None => format!("fleet paused by {} since {since}", self.paused_by),
        }
    }
}

/// What a pause or resume of the fleet did: done, or refused and why
/// (already paused, naming by whom; not paused).
pub type FleetAnswer = Result<(), String>;

interface! {
    /// The fleet's pause: see the methods on [`Database`].
    trait FleetPauses {
        /// Pauses the whole fleet through `autoapproval_pause_fleet` (the
        /// function people are granted), recording `who` and `reason`.
        #[tracing::instrument(name = "store.pause_fleet", skip_all)]
        fn pause_fleet(&self, who: &str, reason: Option<&str>) -> Result<FleetAnswer, DbError>;
        /// Ends the fleet's pause through `autoapproval_resume_fleet`.
        #[tracing::instrument(name = "store.resume_fleet", skip_all)]
        fn resume_fleet(&self, who: &str) -> Result<FleetAnswer, DbError>;
        /// The fleet's pause, if one stands (a read of its one-row table).
        #[tracing::instrument(name = "store.fleet_pause", skip_all)]
        fn fleet_pause(&self) -> Result<Option<FleetPause>, DbError>;
    }
}

/// `impl FleetPauses` for a backend, given the calls of its two routines
/// (`$pause` binds who and reason, `$resume` who; each answers one row of
/// done and refusal) and the read of the table.
macro_rules! impl_fleet_pauses {
    ($store:ty, pause: $pause:expr, resume: $resume:expr, read: $read:expr $(,)?) => {
        impl $crate::db::pause::FleetPauses for $store {
            async fn pause_fleet(
                &self,
                who: &str,
                reason: Option<&str>,
            ) -> Result<$crate::db::pause::FleetAnswer, $crate::db::DbError> {
                let (done, refusal): (bool, Option<String>) = sqlx::query_as($pause)
                    .bind(who)
                    .bind(reason)
                    .fetch_one(&self.primary)
                    .await
                    .map_err(db("pause the fleet"))?;
                Ok(if done {
                    Ok(())
                } else {
                    Err(refusal.unwrap_or_default())
                })
            }

            async fn resume_fleet(
                &self,
                who: &str,
            ) -> Result<$crate::db::pause::FleetAnswer, $crate::db::DbError> {
                let (done, refusal): (bool, Option<String>) = sqlx::query_as($resume)
                    .bind(who)
                    .fetch_one(&self.primary)
                    .await
                    .map_err(db("resume the fleet"))?;
                Ok(if done {
                    Ok(())
                } else {
                    Err(refusal.unwrap_or_default())
                })
            }

            async fn fleet_pause(
                &self,
            ) -> Result<Option<$crate::db::FleetPause>, $crate::db::DbError> {
                sqlx::query_as($read)
                    .fetch_optional(&self.primary)
                    .await
                    .map_err(db("read the fleet's pause"))
            }
        }
    };
}
pub(super) use impl_fleet_pauses;
