//! Reading rows on the primary: a request, its state row, and the statuses
//! the CR garbage collector needs; each row checked into a domain value.

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::DbError;
use crate::domain::{Request, RequestStatus, State, StateStatus};

/// A request's status as the CR garbage collector needs it.
#[derive(Debug)]
pub struct RequestStatusRow {
    /// The request's id.
    pub request_id: i64,
    /// Its status, or why it cannot be read.
    pub status: Result<RequestStatus, DbError>,
    /// How long ago it was decided, else last updated, in the database's
    /// clock (zero if that lies in the future).
    pub unchanged_for: std::time::Duration,
}

/// The garbage collector's rows as read by either backend: (request id,
/// status, seconds since it was decided or updated).
pub(super) fn status_rows(rows: Vec<(i64, String, f64)>) -> Vec<RequestStatusRow> {
    rows.into_iter()
        .map(|(request_id, status, seconds)| RequestStatusRow {
            request_id,
            status: status
                .parse()
                .map_err(|error| DbError::Malformed { request_id, error }),
            unchanged_for: std::time::Duration::try_from_secs_f64(seconds).unwrap_or_default(),
        })
        .collect()
}

// The rows both backends decode (sqlx's `FromRow` is generic over the
// database); the column names are the SELECTs' in each backend.

#[derive(FromRow)]
pub(super) struct RequestRow {
    id: i64,
    request_type: String,
    status: String,
    sort_time: DateTime<Utc>,
    created_at: DateTime<Utc>,
    business_name: String,
    documents_released: bool,
    operational_hold: bool,
    menu_registered: bool,
    logo_registered: bool,
    previous_step_approved: bool,
    econtract_ref: Option<String>,
    target_store_number: Option<i64>,
    owner_number: Option<i64>,
    store_number: Option<i64>,
    campaign_id: Option<String>,
    decided_by: Option<String>,
}

impl RequestRow {
    pub(super) fn into_request(self) -> Result<Request, DbError> {
        let malformed = |error| DbError::Malformed {
            request_id: self.id,
            error,
        };
        Ok(Request {
            id: self.id,
            request_type: self.request_type.parse().map_err(malformed)?,
            status: self.status.parse().map_err(malformed)?,
            sort_time: self.sort_time,
            created_at: self.created_at,
            business_name: self.business_name,
            documents_released: self.documents_released,
            operational_hold: self.operational_hold,
            menu_registered: self.menu_registered,
            logo_registered: self.logo_registered,
            previous_step_approved: self.previous_step_approved,
            econtract_ref: self.econtract_ref,
            target_store_number: self.target_store_number,
            owner_number: self.owner_number,
            store_number: self.store_number,
            campaign_id: self.campaign_id,
            decided_by: self.decided_by,
        })
    }
}

#[derive(FromRow)]
pub(super) struct StateRow {
    id: i64,
    request_id: i64,
    status: String,
    next_retry_time: Option<DateTime<Utc>>,
    retry_count: i32,
    holder: String,
    fencing_token: i64,
    step: Option<String>,
    last_reason: Option<String>,
    modified_at: DateTime<Utc>,
}

impl StateRow {
    pub(super) fn into_state(self) -> Result<State, DbError> {
        Ok(State {
            status: self
                .status
                .parse::<StateStatus>()
                .map_err(|error| DbError::Malformed {
                    request_id: self.request_id,
                    error,
                })?,
            id: self.id,
            request_id: self.request_id,
            next_retry_time: self.next_retry_time,
            retry_count: self.retry_count,
            holder: self.holder,
            fencing_token: self.fencing_token,
            step: self.step,
            last_reason: self.last_reason,
            modified_at: self.modified_at,
        })
    }
}

/// A request row with its state row's columns beside it (`LEFT JOIN`), all
/// of the state's null when it has none.
#[derive(FromRow)]
pub(super) struct RequestWithStateRow {
    #[sqlx(flatten)]
    request: RequestRow,
    s_id: Option<i64>,
    s_status: Option<String>,
    s_next_retry_time: Option<DateTime<Utc>>,
    s_retry_count: Option<i32>,
    s_holder: Option<String>,
    s_fencing_token: Option<i64>,
    s_step: Option<String>,
    s_last_reason: Option<String>,
    s_modified_at: Option<DateTime<Utc>>,
}

impl RequestWithStateRow {
    pub(super) fn into_parts(self) -> Result<(Request, Option<State>), DbError> {
        let request_id = self.request.id;
        let state = match (
            self.s_id,
            self.s_status,
            self.s_retry_count,
            self.s_holder,
            self.s_fencing_token,
            self.s_modified_at,
        ) {
            (
                Some(id),
                Some(status),
                Some(retry_count),
                Some(holder),
                Some(fencing_token),
                Some(modified_at),
            ) => Some(
                StateRow {
                    id,
                    request_id,
                    status,
                    next_retry_time: self.s_next_retry_time,
                    retry_count,
                    holder,
                    fencing_token,
                    step: self.s_step,
                    last_reason: self.s_last_reason,
                    modified_at,
                }
                .into_state()?,
            ),
            _ => None,
        };
        Ok((self.request.into_request()?, state))
    }
}

interface! {
    /// Rows: see the methods on [`Database`].
    trait Rows {
        /// Re-reads a request from the primary.
        #[tracing::instrument(name = "store.request", skip_all)]
        fn request(&self, request_id: i64) -> Result<Option<Request>, DbError>;
        /// A request and its state row, read together from the primary in one
        /// statement (one snapshot): what a reconcile looks at before it claims.
        /// `None` when the request does not exist.
        #[tracing::instrument(name = "store.request_with_state", skip_all)]
        fn request_with_state(
            &self,
            request_id: i64,
        ) -> Result<Option<(Request, Option<State>)>, DbError>;
        /// Reads a request's state row from the primary.
        #[tracing::instrument(name = "store.state", skip_all)]
        fn state(&self, request_id: i64) -> Result<Option<State>, DbError>;
        /// For each of `request_ids` that exists: its status and, when decided,
        /// when (the decision time, else the last update). Read on the primary:
        /// the garbage collector deletes the CR of a request it does not find,
        /// and a lagging replica does not have the newest requests yet.
        fn request_statuses(
            &self,
            request_ids: &[i64],
        ) -> Result<Vec<RequestStatusRow>, DbError>;
    }
}

/// The re-reads of `impl Rows for <backend>` by one key, whose SQL differs
/// between the backends only in the placeholder of that key (`$id`: "$1"
/// or "?"), as items of the impl beside its own `request_statuses`.
macro_rules! key_reads {
    ($id:literal) => {
        async fn request(
            &self,
            request_id: i64,
        ) -> Result<Option<$crate::domain::Request>, $crate::db::DbError> {
            let row: Option<$crate::db::rows::RequestRow> =
                sqlx::query_as(self.sql($crate::db::rows::request_sql!($id)))
                    .bind(request_id)
                    .fetch_optional(&self.primary)
                    .await
                    .map_err(db("re-read request"))?;
            row.map($crate::db::rows::RequestRow::into_request)
                .transpose()
        }

        async fn request_with_state(
            &self,
            request_id: i64,
        ) -> Result<
            Option<($crate::domain::Request, Option<$crate::domain::State>)>,
            $crate::db::DbError,
        > {
            let row: Option<$crate::db::rows::RequestWithStateRow> =
                sqlx::query_as(self.sql($crate::db::rows::request_with_state_sql!($id)))
                    .bind(request_id)
                    .fetch_optional(&self.primary)
                    .await
                    .map_err(db("read request and state"))?;
            row.map($crate::db::rows::RequestWithStateRow::into_parts)
                .transpose()
        }

        async fn state(
            &self,
            request_id: i64,
        ) -> Result<Option<$crate::domain::State>, $crate::db::DbError> {
            let row: Option<$crate::db::rows::StateRow> = sqlx::query_as(concat!(
                "SELECT id, request_id, status, next_retry_time, retry_count, holder,
                        fencing_token, step, last_reason, modified_at
                   FROM auto_approve_state WHERE request_id = ",
                $id
            ))
            .bind(request_id)
            .fetch_optional(&self.primary)
            .await
            .map_err(db("read state"))?;
            row.map($crate::db::rows::StateRow::into_state).transpose()
        }
    };
}
pub(super) use key_reads;

/// The re-read of a request by its key (`$id`: "$1" or "?"): a template
/// (`db::codes`), its type, status and flags read back as our words.
macro_rules! request_sql {
    ($id:literal) => {
        concat!(
            "SELECT id, {TYPE_AS:request_type}, {STATUS_AS:status}, sort_time, created_at, business_name,
                        {FLAG_AS:documents_released}, {FLAG_AS:operational_hold}, {FLAG_AS:menu_registered},
                        {FLAG_AS:logo_registered}, {FLAG_AS:previous_step_approved}, econtract_ref,
                        target_store_number, owner_number, store_number, campaign_id, decided_by
                   FROM autoapproval_request WHERE id = ",
            $id
        )
    };
}
pub(super) use request_sql;

/// A request and its state row by the request's key, as [`request_sql`].
macro_rules! request_with_state_sql {
    ($id:literal) => {
        concat!(
            "SELECT r.id, {TYPE_AS:r.request_type}, {STATUS_AS:r.status}, r.sort_time, r.created_at,
                        r.business_name, {FLAG_AS:r.documents_released}, {FLAG_AS:r.operational_hold},
                        {FLAG_AS:r.menu_registered}, {FLAG_AS:r.logo_registered},
                        {FLAG_AS:r.previous_step_approved}, r.econtract_ref,
                        r.target_store_number, r.owner_number, r.store_number, r.campaign_id,
                        r.decided_by,
                        s.id AS s_id, s.status AS s_status, s.next_retry_time AS s_next_retry_time,
                        s.retry_count AS s_retry_count, s.holder AS s_holder,
                        s.fencing_token AS s_fencing_token, s.step AS s_step,
                        s.last_reason AS s_last_reason, s.modified_at AS s_modified_at
                   FROM autoapproval_request r LEFT JOIN auto_approve_state s ON s.request_id = r.id
                  WHERE r.id = ",
            $id
        )
    };
}
pub(super) use request_with_state_sql;
