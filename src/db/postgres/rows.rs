//! Reading rows on the primary: a request, its state row, and the statuses
//! the CR garbage collector needs; each row checked into a domain value.

use super::{PgStore, db};
use crate::db::rows::{key_reads, status_rows};
use crate::db::{DbError, RequestStatusRow, Rows};

impl Rows for PgStore {
    key_reads!("$1");

    async fn request_statuses(
        &self,
        request_ids: &[i64],
    ) -> Result<Vec<RequestStatusRow>, DbError> {
        // The age is taken in the database's clock, which wrote the times:
        // a replica whose clock runs ahead would collect CRs early.
        let rows: Vec<(i64, String, f64)> = sqlx::query_as(
            "SELECT id, status,
                    GREATEST(extract(epoch FROM now() - COALESCE(decided_at, updated_at)), 0)::float8
               FROM autoapproval_request WHERE id = ANY($1)",
        )
        .bind(request_ids)
        .fetch_all(&self.primary)
        .await
        .map_err(db("read request statuses"))?;
        Ok(status_rows(rows))
    }
}
