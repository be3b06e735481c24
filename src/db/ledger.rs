//! The e-contract ledger the chain syncs from the e-sign system, and the
//! memo history of a request that people read.

use chrono::{DateTime, Utc};

use super::DbError;

/// One entry of a request's history.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Memo {
    /// When it was written (UTC).
    pub created_at: DateTime<Utc>,
    /// Who wrote it (`autoapproval`, `autoapproval-cleanser`, `manual:<who>`).
    pub author: String,
    /// The text people read in the request's history.
    pub message: String,
}

interface! {
    /// Ledger: see the methods on [`Database`].
    trait Ledger {
        /// The e-contract status our ledger holds, if any.
        #[tracing::instrument(name = "store.econtract_status", skip_all)]
        fn econtract_status(&self, contract_ref: &str) -> Result<Option<String>, DbError>;
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
        ) -> Result<(), DbError>;
        /// Appends a memo to a request's history.
        #[tracing::instrument(name = "store.add_memo", skip_all)]
        fn add_memo(
            &self,
            request_id: i64,
            message: &str,
            now: DateTime<Utc>,
        ) -> Result<(), DbError>;
        /// A request's history: each memo with its time and author, oldest first.
        fn history(&self, request_id: i64) -> Result<Vec<Memo>, DbError>;
        /// A request's memos, oldest first.
        fn memos(&self, request_id: i64) -> Result<Vec<String>, DbError>;
    }
}

/// The ledger's methods that are the same on both backends but for their
/// SQL, as items of `impl Ledger for <backend>` (beside its own
/// `sync_econtract`). `$status` reads autoapproval_econtract.status by contract_ref
/// (a template the backend's `sql` renders);
/// `$add` inserts a memo (request_id, created_at, message) by
/// `autoapproval`; `$history` and `$memos` read a request's memos in id order.
macro_rules! ledger_statements {
    (status: $status:expr, add: $add:expr, history: $history:expr, memos: $memos:expr $(,)?) => {
        async fn econtract_status(
            &self,
            contract_ref: &str,
        ) -> Result<Option<String>, $crate::db::DbError> {
            let row: Option<(String,)> = sqlx::query_as(self.sql($status))
                .bind(contract_ref)
                .fetch_optional(&self.primary)
                .await
                .map_err(db("read e-contract"))?;
            Ok(row.map(|(status,)| status))
        }

        async fn add_memo(
            &self,
            request_id: i64,
            message: &str,
            now: chrono::DateTime<chrono::Utc>,
        ) -> Result<(), $crate::db::DbError> {
            $crate::db::business_write(self.shadow, "add a memo")?;
            sqlx::query($add)
                .bind(request_id)
                .bind(now)
                .bind(message)
                .execute(&self.primary)
                .await
                .map_err(db("add memo"))?;
            Ok(())
        }

        async fn history(
            &self,
            request_id: i64,
        ) -> Result<Vec<$crate::db::Memo>, $crate::db::DbError> {
            sqlx::query_as($history)
                .bind(request_id)
                .fetch_all(&self.primary)
                .await
                .map_err(db("read history"))
        }

        async fn memos(&self, request_id: i64) -> Result<Vec<String>, $crate::db::DbError> {
            let rows: Vec<(String,)> = sqlx::query_as($memos)
                .bind(request_id)
                .fetch_all(&self.primary)
                .await
                .map_err(db("read memos"))?;
            Ok(rows.into_iter().map(|(message,)| message).collect())
        }
    };
}
pub(super) use ledger_statements;
