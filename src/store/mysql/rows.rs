//! Reading rows on the primary: a request, its state row, and the statuses
//! the CR garbage collector needs, in MySQL's SQL.

use super::{CHUNK, MysqlStore, db, placeholders};
use crate::domain::{Request, State};
use crate::store::rows::{RequestRow, RequestWithStateRow, StateRow, status_rows};
use crate::store::{RequestStatusRow, Rows, StoreError};

const REQUEST_COLUMNS: &str = "id, request_type, status, sort_time, created_at, business_name, \
documents_released, operational_hold, menu_registered, logo_registered, previous_step_approved, \
econtract_ref, target_store_number, owner_number, store_number, campaign_id, decided_by";

const STATE_COLUMNS: &str = "id, request_id, status, next_retry_time, retry_count, holder, \
fencing_token, step, last_reason, modified_at";

// === impl MysqlStore ===

impl Rows for MysqlStore {
    /// Re-reads a request from the primary.
    async fn request(&self, request_id: i64) -> Result<Option<Request>, StoreError> {
        let sql = format!("SELECT {REQUEST_COLUMNS} FROM approval_request WHERE id = ?");
        let row: Option<RequestRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(request_id)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("re-read request"))?;
        row.map(RequestRow::into_request).transpose()
    }

    /// A request and its state row, read together from the primary in one
    /// statement (one snapshot): what a reconcile looks at before it claims.
    async fn request_with_state(
        &self,
        request_id: i64,
    ) -> Result<Option<(Request, Option<State>)>, StoreError> {
        let sql =
            "SELECT r.id, r.request_type, r.status, r.sort_time, r.created_at, r.business_name,
                    r.documents_released, r.operational_hold, r.menu_registered, r.logo_registered,
                    r.previous_step_approved, r.econtract_ref, r.target_store_number, r.owner_number,
                    r.store_number, r.campaign_id, r.decided_by,
                    s.id AS s_id, s.status AS s_status, s.next_retry_time AS s_next_retry_time,
                    s.retry_count AS s_retry_count, s.holder AS s_holder,
                    s.fencing_token AS s_fencing_token, s.step AS s_step,
                    s.last_reason AS s_last_reason, s.modified_at AS s_modified_at
               FROM approval_request r LEFT JOIN auto_approve_state s ON s.request_id = r.id
              WHERE r.id = ?";
        let row: Option<RequestWithStateRow> = sqlx::query_as(sql)
            .bind(request_id)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("read request and state"))?;
        row.map(RequestWithStateRow::into_parts).transpose()
    }

    /// Reads a request's state row from the primary.
    async fn state(&self, request_id: i64) -> Result<Option<State>, StoreError> {
        let sql = format!("SELECT {STATE_COLUMNS} FROM auto_approve_state WHERE request_id = ?");
        let row: Option<StateRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(request_id)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("read state"))?;
        row.map(StateRow::into_state).transpose()
    }

    /// For each of `request_ids` that exists: its status and how long it
    /// is unchanged, in the database's clock, read on the primary.
    async fn request_statuses(
        &self,
        request_ids: &[i64],
    ) -> Result<Vec<RequestStatusRow>, StoreError> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        // TIMESTAMPDIFF in microseconds; divided by a DOUBLE literal it is
        // a DOUBLE (an f64), with no CAST AS DOUBLE (MySQL 8.0.17+ only).
        let mut rows: Vec<(i64, String, f64)> = Vec::with_capacity(request_ids.len());
        for chunk in request_ids.chunks(CHUNK) {
            let sql = format!(
                "SELECT id, status,
                        GREATEST(TIMESTAMPDIFF(MICROSECOND, COALESCE(decided_at, updated_at),
                                               UTC_TIMESTAMP(6)), 0) / 1e6
                   FROM approval_request WHERE id IN ({})",
                placeholders(chunk.len())
            );
            let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql));
            for id in chunk {
                q = q.bind(id);
            }
            rows.extend(
                q.fetch_all(&self.primary)
                    .await
                    .map_err(db("read request statuses"))?,
            );
        }
        Ok(status_rows(rows))
    }
}
