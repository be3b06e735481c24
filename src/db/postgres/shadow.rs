//! Shadow mode's records in PostgreSQL's SQL.

use chrono::{DateTime, Utc};

use super::{PgStore, db};
use crate::db::{DbError, ShadowOutcome, ShadowRecord, Shadows};

impl Shadows for PgStore {
    async fn record_shadow(
        &self,
        record: &ShadowRecord<'_>,
        now: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, DbError> {
        let (at,): (Option<DateTime<Utc>>,) = sqlx::query_as(
            "INSERT INTO auto_approve_shadow AS s
                    (request_id, request_type, decision, step, reason, first_seen_at,
                     would_approve_at, evaluated_at)
             VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $3 = 'APPROVE' THEN $6::timestamptz END, $6)
             ON CONFLICT (request_id) DO UPDATE
                SET request_type = EXCLUDED.request_type, decision = EXCLUDED.decision,
                    step = EXCLUDED.step, reason = EXCLUDED.reason,
                    evaluated_at = EXCLUDED.evaluated_at,
                    would_approve_at = COALESCE(s.would_approve_at, EXCLUDED.would_approve_at),
                    evaluations = s.evaluations + 1, handed_over_at = NULL
             RETURNING would_approve_at",
        )
        .bind(record.request_id)
        .bind(record.request_type.as_str())
        .bind(record.decision.as_str())
        .bind(record.step)
        .bind(record.reason)
        .bind(now)
        .fetch_one(&self.primary)
        .await
        .map_err(db("record a shadow decision"))?;
        Ok(at)
    }

    async fn hand_over_shadow(&self, now: DateTime<Utc>) -> Result<u64, DbError> {
        let done = sqlx::query(
            "WITH handed AS (
                 UPDATE auto_approve_shadow SET handed_over_at = $1
                  WHERE handed_over_at IS NULL
                 RETURNING request_id
             )
             UPDATE auto_approve_state s SET next_retry_time = $1, modified_at = now()
               FROM handed h
              WHERE s.request_id = h.request_id AND s.status = 'RETRY_WAITING'
                AND s.next_retry_time > $1",
        )
        .bind(now)
        .execute(&self.primary)
        .await
        .map_err(db("hand shadow's waiting requests over"))?;
        Ok(done.rows_affected())
    }

    async fn shadow_outcomes(&self, since: DateTime<Utc>) -> Result<Vec<ShadowOutcome>, DbError> {
        sqlx::query_as(
            "SELECT w.request_id, w.request_type, w.decision, w.step, w.reason, w.first_seen_at,
                    w.would_approve_at, r.status, r.decided_at, r.decided_by
               FROM auto_approve_shadow w
               LEFT JOIN autoapproval_request r ON r.id = w.request_id
              WHERE w.first_seen_at >= $1
              ORDER BY w.request_id",
        )
        .bind(since)
        .fetch_all(&self.read)
        .await
        .map_err(db("read the shadow decisions"))
    }
}
