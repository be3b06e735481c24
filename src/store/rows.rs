//! Reading rows on the primary: a request, its state row, and the statuses
//! the CR garbage collector needs; each row checked into a domain value.

use super::StoreError;
use crate::domain::{Request, RequestStatus, State};

/// A request's status as the CR garbage collector needs it.
#[derive(Debug)]
pub struct RequestStatusRow {
    /// The request.
    pub request_id: i64,
    /// Its status, or why it cannot be read.
    pub status: Result<RequestStatus, StoreError>,
    /// How long ago it was decided, else last updated, in the database's
    /// clock (zero if that lies in the future).
    pub unchanged_for: std::time::Duration,
}

interface! {
    /// Rows: see the methods on [`Store`].
    trait Rows {
        /// Re-reads a request from the primary.
        #[tracing::instrument(name = "store.request", skip_all)]
        fn request(&self, request_id: i64) -> Result<Option<Request>, StoreError>;
        /// A request and its state row, read together from the primary in one
        /// statement (one snapshot): what a reconcile looks at before it claims.
        /// `None` when the request does not exist.
        #[tracing::instrument(name = "store.request_with_state", skip_all)]
        fn request_with_state(
            &self,
            request_id: i64,
        ) -> Result<Option<(Request, Option<State>)>, StoreError>;
        /// Reads a request's state row from the primary.
        #[tracing::instrument(name = "store.state", skip_all)]
        fn state(&self, request_id: i64) -> Result<Option<State>, StoreError>;
        /// For each of `request_ids` that exists: its status and, when decided,
        /// when (the decision time, else the last update). Read on the primary:
        /// the garbage collector deletes the CR of a request it does not find,
        /// and a lagging replica does not have the newest requests yet.
        fn request_statuses(
            &self,
            request_ids: &[i64],
        ) -> Result<Vec<RequestStatusRow>, StoreError>;
    }
}
