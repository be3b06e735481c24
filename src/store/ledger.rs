//! The e-contract ledger the chain syncs from the e-sign system, and the
//! memo history of a request that people read.

use chrono::{DateTime, Utc};

use super::StoreError;

/// One entry of a request's history.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Memo {
    /// When.
    pub created_at: DateTime<Utc>,
    /// Who wrote it (`autoapproval`, `autoapproval-cleanser`, `manual:<who>`).
    pub author: String,
    /// What happened.
    pub message: String,
}

interface! {
    /// Ledger: see the methods on [`Store`].
    trait Ledger {
        /// The e-contract status our ledger holds, if any.
        #[tracing::instrument(name = "store.econtract_status", skip_all)]
        fn econtract_status(&self, contract_ref: &str) -> Result<Option<String>, StoreError>;
        /// Records what the e-sign system says about a contract, synced by the
        /// chain of `request_id`. A signature is never taken back by a stale
        /// answer: SIGNED does not go back to PENDING (it may become REJECTED,
        /// a voided contract).
        #[tracing::instrument(name = "store.sync_econtract", skip_all)]
        fn sync_econtract(
            &self,
            request_id: i64,
            contract_ref: &str,
            status: &str,
            now: DateTime<Utc>,
        ) -> Result<(), StoreError>;
        /// Appends a memo to a request's history.
        #[tracing::instrument(name = "store.add_memo", skip_all)]
        fn add_memo(
            &self,
            request_id: i64,
            message: &str,
            now: DateTime<Utc>,
        ) -> Result<(), StoreError>;
        /// A request's history: each memo with its time and author, oldest first.
        fn history(&self, request_id: i64) -> Result<Vec<Memo>, StoreError>;
        /// A request's memos, oldest first.
        fn memos(&self, request_id: i64) -> Result<Vec<String>, StoreError>;
    }
}
