//! Reading rows on the primary: a request, its state row, and the statuses
//! the CR garbage collector needs, in MySQL's SQL.

use super::{CHUNK, MysqlStore, db, placeholders};
use crate::db::rows::{key_reads, status_rows};
#[allow(unused_imports)]
use crate::db::rows::{request_sql, request_with_state_sql};
use crate::db::{DbError, RequestStatusRow, Rows};

// === impl MysqlStore ===

impl Rows for MysqlStore {
    key_reads!("?");

    async fn request_statuses(
        &self,
        request_ids: &[i64],
    ) -> Result<Vec<RequestStatusRow>, DbError> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        // TIMESTAMPDIFF in microseconds; divided by a DOUBLE literal it is
        // a DOUBLE (an f64), with no CAST AS DOUBLE (MySQL 8.0.17+ only).
        let mut rows: Vec<(i64, String, f64)> = Vec::with_capacity(request_ids.len());
        for chunk in request_ids.chunks(CHUNK) {
            let sql = format!(
                "SELECT id, {{STATUS_AS:status}},
                        GREATEST(TIMESTAMPDIFF(MICROSECOND, COALESCE(decided_at, updated_at),
                                               UTC_TIMESTAMP(6)), 0) / 1e6
                   FROM autoapproval_request WHERE id IN ({})",
                placeholders(chunk.len())
            );
            let q = bind_all!(sqlx::query_as(self.render(&sql)), chunk);
            rows.extend(
                q.fetch_all(&self.primary)
                    .await
                    .map_err(db("read request statuses"))?,
            );
        }
        Ok(status_rows(rows))
    }
}
