//! Pauses an operator set, kept in the database (migration 0014) so they
//! outlive the CR they were set through.

use chrono::{DateTime, Utc};

use super::{Store, StoreError, db};

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

// === impl Store ===

impl Store {
    /// Records that `request_id` is paused, through the CR `cr_uid`; the
    /// CR it is recorded through is updated when one already stands.
    #[tracing::instrument(name = "store.pause", skip_all)]
    pub async fn pause(
        &self,
        request_id: i64,
        paused_by: &str,
        cr_uid: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO auto_approve_pause (request_id, paused_by, cr_uid) VALUES ($1, $2, $3)
             ON CONFLICT (request_id) DO UPDATE SET cr_uid = EXCLUDED.cr_uid
              WHERE auto_approve_pause.cr_uid IS DISTINCT FROM EXCLUDED.cr_uid",
        )
        .bind(request_id)
        .bind(paused_by)
        .bind(cr_uid)
        .execute(&self.primary)
        .await
        .map_err(db("record pause"))?;
        Ok(())
    }

    /// Ends the pause of `request_id` if it was set through the CR
    /// `cr_uid`; true when one was ended.
    #[tracing::instrument(name = "store.resume", skip_all)]
    pub async fn resume(&self, request_id: i64, cr_uid: Option<&str>) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "DELETE FROM auto_approve_pause WHERE request_id = $1 AND cr_uid IS NOT DISTINCT FROM $2",
        )
        .bind(request_id)
        .bind(cr_uid)
        .execute(&self.primary)
        .await
        .map_err(db("end pause"))?;
        Ok(done.rows_affected() == 1)
    }

    /// The pause of `request_id`, if it is paused.
    #[tracing::instrument(name = "store.pause_of", skip_all)]
    pub async fn pause_of(&self, request_id: i64) -> Result<Option<Pause>, StoreError> {
        sqlx::query_as(
            "SELECT paused_by, cr_uid, paused_at FROM auto_approve_pause WHERE request_id = $1",
        )
        .bind(request_id)
        .fetch_optional(&self.primary)
        .await
        .map_err(db("read pause"))
    }
}
