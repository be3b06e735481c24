//! Pauses an operator set (store/pause.rs on PostgreSQL).

use super::{MysqlStore, db};
use crate::store::{Pause, Pauses, StoreError};

// === impl MysqlStore ===

impl Pauses for MysqlStore {
    /// Records that `request_id` is paused, through the CR `cr_uid`.
    async fn pause(
        &self,
        request_id: i64,
        paused_by: &str,
        cr_uid: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO auto_approve_pause (request_id, paused_by, cr_uid) VALUES (?, ?, ?)
             ON DUPLICATE KEY UPDATE cr_uid = VALUES(cr_uid)",
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
    /// `cr_uid`; true when one was ended. `<=>` is IS NOT DISTINCT FROM.
    async fn resume(&self, request_id: i64, cr_uid: Option<&str>) -> Result<bool, StoreError> {
        let done =
            sqlx::query("DELETE FROM auto_approve_pause WHERE request_id = ? AND cr_uid <=> ?")
                .bind(request_id)
                .bind(cr_uid)
                .execute(&self.primary)
                .await
                .map_err(db("end pause"))?;
        Ok(done.rows_affected() == 1)
    }

    /// The pause of `request_id`, if it is paused.
    async fn pause_of(&self, request_id: i64) -> Result<Option<Pause>, StoreError> {
        sqlx::query_as(
            "SELECT paused_by, cr_uid, paused_at FROM auto_approve_pause WHERE request_id = ?",
        )
        .bind(request_id)
        .fetch_optional(&self.primary)
        .await
        .map_err(db("read pause"))
    }
}
