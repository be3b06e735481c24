//! Pauses an operator set, kept in the database (migration 0014) so they
//! outlive the CR they were set through.

use chrono::{DateTime, Utc};

use super::StoreError;

/// A request's pause.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Pause {
    /// Who set it (`AutoApproval <name>` for a CR's spec.paused).
    pub paused_by: String,
    /// The uid of the CR it was set through, if it was.
    pub cr_uid: Option<String>,
    /// When.
    pub paused_at: DateTime<Utc>,
}

interface! {
    /// Pauses: see the methods on [`Store`].
    trait Pauses {
        /// Records that `request_id` is paused, through the CR `cr_uid`; the
        /// CR it is recorded through is updated when one already stands.
        #[tracing::instrument(name = "store.pause", skip_all)]
        fn pause(
            &self,
            request_id: i64,
            paused_by: &str,
            cr_uid: Option<&str>,
        ) -> Result<(), StoreError>;
        /// Ends the pause of `request_id` if it was set through the CR
        /// `cr_uid`; true when one was ended.
        #[tracing::instrument(name = "store.resume", skip_all)]
        fn resume(&self, request_id: i64, cr_uid: Option<&str>) -> Result<bool, StoreError>;
        /// The pause of `request_id`, if it is paused.
        #[tracing::instrument(name = "store.pause_of", skip_all)]
        fn pause_of(&self, request_id: i64) -> Result<Option<Pause>, StoreError>;
    }
}
