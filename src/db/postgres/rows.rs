//! Reading rows on the primary: a request, its state row, and the statuses
//! the CR garbage collector needs; each row checked into a domain value.

use super::{PgStore, db};
use crate::db::rows::{key_reads, request_sql, request_with_state_sql, status_rows};
use crate::db::{DbError, RequestStatusRow, Rows};

impl Rows for PgStore {
    key_reads!("$1");

    async fn request_statuses(
        &self,
        request_ids: &[i64],
    ) -> Result<Vec<RequestStatusRow>, DbError> {
        // The age is taken in the database's clock, which wrote the times:
        // a replica whose clock runs ahead would collect CRs early.
        let rows: Vec<(i64, String, f64)> = sqlx::query_as(self.sql(STATUSES))
            .bind(request_ids)
            .fetch_all(&self.primary)
            .await
            .map_err(db("read request statuses"))?;
        Ok(status_rows(rows))
    }
}

// The statuses the CR garbage collector needs, as our words.
const STATUSES: &str = "SELECT id, {STATUS_AS:status},
                    GREATEST(extract(epoch FROM now() - COALESCE(decided_at, updated_at)), 0)::float8
               FROM autoapproval_request WHERE id = ANY($1)";

/// The templates here (`db::codes`).
pub(super) const TEMPLATES: &[&str] =
    &[STATUSES, request_sql!("$1"), request_with_state_sql!("$1")];
