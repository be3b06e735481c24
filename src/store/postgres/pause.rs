//! Pauses an operator set, kept in the database (migration 0014) so they
//! outlive the CR they were set through.

use super::{PgStore, db};
use crate::store::{Pause, Pauses, StoreError};

impl Pauses for PgStore {
    async fn pause(
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

    async fn resume(&self, request_id: i64, cr_uid: Option<&str>) -> Result<bool, StoreError> {
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

    async fn pause_of(&self, request_id: i64) -> Result<Option<Pause>, StoreError> {
        sqlx::query_as(
            "SELECT paused_by, cr_uid, paused_at FROM auto_approve_pause WHERE request_id = $1",
        )
        .bind(request_id)
        .fetch_optional(&self.primary)
        .await
        .map_err(db("read pause"))
    }
}
