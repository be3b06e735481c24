//! Shadow mode's records in MySQL's SQL (VALUES(col) is the row proposed,
//! as in the ledger's upsert).

use chrono::{DateTime, Utc};

use super::{MysqlStore, db};
use crate::db::{DbError, ShadowOutcome, ShadowRecord, Shadows, WouldDecision};

impl Shadows for MysqlStore {
    async fn record_shadow(
        &self,
        record: &ShadowRecord<'_>,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, DbError> {
        let approve = (record.decision == WouldDecision::Approve).then_some(now);
        // Assignments run left to right: would_approve_at first, from the
        // row as it was.
        sqlx::query(
            "INSERT INTO auto_approve_shadow
                    (request_id, request_type, decision, step, reason, first_seen_at,
                     would_approve_at, evaluated_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE
                would_approve_at = COALESCE(would_approve_at, VALUES(would_approve_at)),
                request_type = VALUES(request_type), decision = VALUES(decision),
                step = VALUES(step), reason = VALUES(reason),
                evaluated_at = VALUES(evaluated_at), evaluations = evaluations + 1,
                handed_over_at = NULL",
        )
        .bind(record.request_id)
        .bind(record.request_type.as_str())
        .bind(record.decision.as_str())
        .bind(record.step)
        .bind(record.reason)
        .bind(now)
        .bind(approve)
        .bind(now)
        .execute(&self.primary)
        .await
        .map_err(db("record a shadow decision"))?;
        let (at,): (Option<DateTime<Utc>>,) =
            sqlx::query_as("SELECT would_approve_at FROM auto_approve_shadow WHERE request_id = ?")
                .bind(record.request_id)
                .fetch_one(&self.primary)
                .await
                .map_err(db("record a shadow decision: read back"))?;
        Ok(at)
    }

    async fn hand_over_shadow(&self, now: DateTime<Utc>) -> Result<u64, DbError> {
        let mut tx = self.begin("hand shadow's waiting requests over").await?;
        let done = sqlx::query(
            "UPDATE auto_approve_state s
               JOIN auto_approve_shadow w ON w.request_id = s.request_id
                SET s.next_retry_time = ?, s.modified_at = UTC_TIMESTAMP(6)
              WHERE w.handed_over_at IS NULL AND s.status = 'RETRY_WAITING'
                AND s.next_retry_time > ?",
        )
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db("hand shadow's waiting requests over"))?;
        sqlx::query(
            "UPDATE auto_approve_shadow SET handed_over_at = ? WHERE handed_over_at IS NULL",
        )
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db("hand shadow's waiting requests over: mark"))?;
        tx.commit()
            .await
            .map_err(db("hand shadow's waiting requests over: commit"))?;
        Ok(done.rows_affected())
    }

    async fn shadow_outcomes(&self, since: DateTime<Utc>) -> Result<Vec<ShadowOutcome>, DbError> {
        sqlx::query_as(
            "SELECT w.request_id, w.request_type, w.decision, w.step, w.reason, w.first_seen_at,
                    w.would_approve_at, r.status, r.decided_at, r.decided_by
               FROM auto_approve_shadow w
               LEFT JOIN autoapproval_request r ON r.id = w.request_id
              WHERE w.first_seen_at >= ?
              ORDER BY w.request_id",
        )
        .bind(since)
        .fetch_all(&self.read)
        .await
        .map_err(db("read the shadow decisions"))
    }
}
