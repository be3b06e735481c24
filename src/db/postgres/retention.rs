//! The retention queries in PostgreSQL's SQL: abandoned requests among the
//! CRs' and the rows nothing needs any more.

use std::time::Duration;

use super::{PgStore, db};
use crate::db::DbError;
use crate::db::retention::{AbandonedQuery, BATCH, Retention, RowsCollected};

const ABANDONED: &str = "\
SELECT r.id
  FROM autoapproval_request r
  LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.id = ANY($1::bigint[])
   AND r.status IN ({OPEN})
   AND (s.retry_count >= $2 OR r.sort_time < $3)
   AND (s.id IS NULL OR s.status = 'RETRY_WAITING')
   AND r.updated_at <= now() - make_interval(secs => $4)
   AND (s.id IS NULL OR s.modified_at <= now() - make_interval(secs => $4))
   AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)";

/// A request still needed by a row of ours: open, or decided less than
/// `$1` seconds ago. `{table}` is the row's table.
const STILL_NEEDED: &str = "\
EXISTS (SELECT 1 FROM autoapproval_request r
         WHERE r.id = {table}.request_id
           AND (r.status IN ({OPEN})
                OR COALESCE(r.decided_at, r.updated_at) > now() - make_interval(secs => $1)))";

/// The templates here (`db::codes`).
pub(super) const TEMPLATES: &[&str] = &[ABANDONED];

impl Retention for PgStore {
    async fn abandoned_among(
        &self,
        request_ids: &[i64],
        query: &AbandonedQuery,
    ) -> Result<Vec<i64>, DbError> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_scalar(self.sql(ABANDONED))
            .bind(request_ids)
            .bind(query.retry_limit)
            .bind(query.window_start)
            .bind(query.idle_for.as_secs_f64())
            .fetch_all(&self.primary)
            .await
            .map_err(db("abandoned requests"))
    }

    async fn collect_rows(&self, decided_for: Duration) -> Result<RowsCollected, DbError> {
        let seconds = decided_for.as_secs_f64();
        let sent = self
            .in_batches(
                "auto_approve_sent",
                "request_id, idempotency_key",
                seconds,
                "collect sent bodies",
            )
            .await?;
        let pauses = self
            .in_batches(
                "auto_approve_pause",
                "request_id",
                seconds,
                "collect pauses",
            )
            .await?;
        // The layout is one row that never changes: another K's tokens are
        // from before it was set (by hand), and fence nothing.
        let fences = sqlx::query(
            "DELETE FROM shard_fence
              WHERE shard_count <> (SELECT shard_count FROM shard_layout)",
        )
        .execute(&self.primary)
        .await
        .map_err(db("collect shard fences"))?
        .rows_affected();
        Ok(RowsCollected {
            sent,
            pauses,
            fences,
            manual_tokens: 0,
        })
    }
}

impl PgStore {
    /// Deletes the rows of `table` whose request no longer needs them,
    /// [`BATCH`] at a time, until none is left.
    async fn in_batches(
        &self,
        table: &'static str,
        key: &'static str,
        seconds: f64,
        operation: &'static str,
    ) -> Result<u64, DbError> {
        let needed = self
            .statements
            .codes()
            .render(STILL_NEEDED)
            .replace("{table}", table);
        let sql = format!(
            "DELETE FROM {table} WHERE ({key}) IN (
                 SELECT {key} FROM {table} WHERE NOT {needed} LIMIT $2)"
        );
        let mut total = 0;
        loop {
            let deleted = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(seconds)
                .bind(BATCH)
                .execute(&self.primary)
                .await
                .map_err(db(operation))?
                .rows_affected();
            total += deleted;
            if deleted < BATCH as u64 {
                return Ok(total);
            }
        }
    }
}
