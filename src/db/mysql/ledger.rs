//! The e-contract ledger and the memo history (store/ledger.rs on PostgreSQL).

use chrono::{DateTime, Utc};

use super::naming::{Named, named_write};
use super::{MysqlStore, db};
use crate::db::ledger::ledger_statements;
use crate::db::{DbError, Ledger};

/// The e-contract sync: ON DUPLICATE KEY UPDATE for ON CONFLICT (through
/// the view, onto a unique key of its table: without one it inserts a
/// second row, which start-up refuses, `schema.rs`); VALUES(col) is the
/// row proposed (MySQL 8.0.20+ deprecates it for a row alias MariaDB lacks;
/// both still accept it). Assignments run left to right, so synced_at is
/// judged before status changes. Binds: contract_ref, status (our word,
/// written as the business's code), synced_at. A template of `db::codes`.
pub(super) const SYNC_ECONTRACT: &str =
    "INSERT INTO autoapproval_econtract (contract_ref, status, synced_at) VALUES (?, {ECONTRACT_PARAM:?}, ?)
     ON DUPLICATE KEY UPDATE
        synced_at = IF(status = {ECONTRACT:SIGNED} AND VALUES(status) = {ECONTRACT:PENDING}, synced_at, VALUES(synced_at)),
        status = IF(status = {ECONTRACT:SIGNED} AND VALUES(status) = {ECONTRACT:PENDING}, status, VALUES(status))";

/// The ledger's status of a contract, as our word.
pub(super) const ECONTRACT_STATUS: &str =
    "SELECT {ECONTRACT_AS:status} FROM autoapproval_econtract WHERE contract_ref = ?";

// === impl MysqlStore ===

impl Ledger for MysqlStore {
    ledger_statements! {
        status: ECONTRACT_STATUS,
        add: "INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
              VALUES (?, ?, 'autoapproval', ?)",
        history: "SELECT created_at, author, message FROM autoapproval_request_memo
                   WHERE request_id = ? ORDER BY id",
        memos: "SELECT message FROM autoapproval_request_memo WHERE request_id = ? ORDER BY id",
    }

    async fn sync_econtract(
        &self,
        request_id: i64,
        contract_ref: &str,
        status: &str,
        now: DateTime<Utc>,
    ) -> Result<(), DbError> {
        crate::db::business_write(self.shadow, "sync the e-contract ledger")?;
        // The e-contract trigger's procedure reads the session variable, so
        // it is set on this connection for the one statement and cleared
        // after it.
        named_write(
            &self.primary,
            Named::SyncingRequest,
            request_id,
            "sync e-contract: name the request",
            async |conn| {
                sqlx::query(self.sql(SYNC_ECONTRACT))
                    .bind(contract_ref)
                    .bind(status)
                    .bind(now)
                    .execute(conn)
                    .await
                    .map_err(db("sync e-contract"))?;
                Ok(())
            },
        )
        .await
    }
}
