//! Reading rows on the primary: a request, its state row, and the statuses
//! the CR garbage collector needs; each row checked into a domain value.

use super::{PgStore, db};
use crate::domain::{Request, State};
use crate::store::rows::{RequestRow, RequestWithStateRow, StateRow, status_rows};
use crate::store::{RequestStatusRow, Rows, StoreError};

const SELECT_REQUEST: &str = "\
SELECT id, request_type, status, sort_time, created_at, business_name, documents_released,
       operational_hold, menu_registered, logo_registered, previous_step_approved, econtract_ref,
       target_store_number, owner_number, store_number, campaign_id, decided_by
  FROM approval_request WHERE id = $1";

const SELECT_REQUEST_WITH_STATE: &str = "\
SELECT r.id, r.request_type, r.status, r.sort_time, r.created_at, r.business_name,
       r.documents_released, r.operational_hold, r.menu_registered, r.logo_registered,
       r.previous_step_approved, r.econtract_ref, r.target_store_number, r.owner_number,
       r.store_number, r.campaign_id, r.decided_by,
       s.id AS s_id, s.status AS s_status, s.next_retry_time AS s_next_retry_time,
       s.retry_count AS s_retry_count, s.holder AS s_holder, s.fencing_token AS s_fencing_token,
       s.step AS s_step, s.last_reason AS s_last_reason, s.modified_at AS s_modified_at
  FROM approval_request r LEFT JOIN auto_approve_state s ON s.request_id = r.id
 WHERE r.id = $1";

impl Rows for PgStore {
    async fn request(&self, request_id: i64) -> Result<Option<Request>, StoreError> {
        let row: Option<RequestRow> = sqlx::query_as(SELECT_REQUEST)
            .bind(request_id)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("re-read request"))?;
        row.map(RequestRow::into_request).transpose()
    }

    async fn request_with_state(
        &self,
        request_id: i64,
    ) -> Result<Option<(Request, Option<State>)>, StoreError> {
        let row: Option<RequestWithStateRow> = sqlx::query_as(SELECT_REQUEST_WITH_STATE)
            .bind(request_id)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("read request and state"))?;
        row.map(RequestWithStateRow::into_parts).transpose()
    }

    async fn state(&self, request_id: i64) -> Result<Option<State>, StoreError> {
        let row: Option<StateRow> = sqlx::query_as(
            "SELECT id, request_id, status, next_retry_time, retry_count, holder, fencing_token, \
                    step, last_reason, modified_at
               FROM auto_approve_state WHERE request_id = $1",
        )
        .bind(request_id)
        .fetch_optional(&self.primary)
        .await
        .map_err(db("read state"))?;
        row.map(StateRow::into_state).transpose()
    }

    async fn request_statuses(
        &self,
        request_ids: &[i64],
    ) -> Result<Vec<RequestStatusRow>, StoreError> {
        // The age is taken in the database's clock, which wrote the times:
        // a replica whose clock runs ahead would collect CRs early.
        let rows: Vec<(i64, String, f64)> = sqlx::query_as(
            "SELECT id, status,
                    GREATEST(extract(epoch FROM now() - COALESCE(decided_at, updated_at)), 0)::float8
               FROM approval_request WHERE id = ANY($1)",
        )
        .bind(request_ids)
        .fetch_all(&self.primary)
        .await
        .map_err(db("read request statuses"))?;
        Ok(status_rows(rows))
    }
}
