//! The retention queries in MySQL's SQL: abandoned requests among the CRs'
//! and the rows nothing needs any more.

use std::time::Duration;

use super::{CHUNK, MysqlStore, db, placeholders};
use crate::db::DbError;
use crate::db::retention::{AbandonedQuery, BATCH, Retention, RowsCollected};

/// A request still needed by a row of ours: open, or decided less than
/// `?` microseconds ago. `{table}` is the row's table.
pub(super) const STILL_NEEDED: &str = "\
EXISTS (SELECT 1 FROM autoapproval_request r
         WHERE r.id = {table}.request_id
           AND (r.status IN ({OPEN})
                OR COALESCE(r.decided_at, r.updated_at) > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND))";

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl Retention for MysqlStore {
    async fn abandoned_among(
        &self,
        request_ids: &[i64],
        query: &AbandonedQuery,
    ) -> Result<Vec<i64>, DbError> {
        let idle = micros(query.idle_for);
        let mut found = Vec::new();
        for chunk in request_ids.chunks(CHUNK) {
            let sql = format!(
                "SELECT r.id
                   FROM autoapproval_request r
                   LEFT JOIN auto_approve_state s ON s.request_id = r.id
                  WHERE r.id IN ({})
                    AND r.status IN ({{OPEN}})
                    AND (s.retry_count >= ? OR r.sort_time < ?)
                    AND (s.id IS NULL OR s.status = 'RETRY_WAITING')
                    AND r.updated_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
                    AND (s.id IS NULL OR s.modified_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)
                    AND NOT EXISTS (SELECT 1 FROM auto_approve_pause p WHERE p.request_id = r.id)",
                placeholders(chunk.len())
            );
            let q = bind_all!(sqlx::query_scalar(self.render(&sql)), chunk)
                .bind(query.retry_limit)
                .bind(query.window_start)
                .bind(idle)
                .bind(idle);
            let ids: Vec<i64> = q
                .fetch_all(&self.primary)
                .await
                .map_err(db("abandoned requests"))?;
            found.extend(ids);
        }
        Ok(found)
    }

    async fn collect_rows(&self, decided_for: Duration) -> Result<RowsCollected, DbError> {
        let decided = micros(decided_for);
        let sent = self
            .in_batches("auto_approve_sent", decided, "collect sent bodies")
            .await?;
        let pauses = self
            .in_batches("auto_approve_pause", decided, "collect pauses")
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
        // A person's claim takes a token by inserting a row; only the newest
        // is needed, to keep AUTO_INCREMENT where it is (a derived table:
        // MySQL reads no table it deletes from in a subquery).
        let manual_tokens = sqlx::query(
            "DELETE FROM autoapproval_manual_token
              WHERE id < (SELECT newest FROM (SELECT MAX(id) AS newest
                                                FROM autoapproval_manual_token) AS t)",
        )
        .execute(&self.primary)
        .await
        .map_err(db("collect manual tokens"))?
        .rows_affected();
        Ok(RowsCollected {
            sent,
            pauses,
            fences,
            manual_tokens,
        })
    }
}

impl MysqlStore {
    /// Deletes the rows of `table` whose request no longer needs them,
    /// [`BATCH`] at a time, until none is left.
    async fn in_batches(
        &self,
        table: &'static str,
        decided_micros: i64,
        operation: &'static str,
    ) -> Result<u64, DbError> {
        let needed = self
            .statements
            .codes()
            .render(STILL_NEEDED)
            .replace("{table}", table);
        let sql = format!("DELETE FROM {table} WHERE NOT {needed} LIMIT {BATCH}");
        let mut total = 0;
        loop {
            let deleted = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(decided_micros)
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
