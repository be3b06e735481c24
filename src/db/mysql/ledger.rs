//! The e-contract ledger and the memo history (store/ledger.rs on PostgreSQL).

use chrono::{DateTime, Utc};

use super::{MysqlStore, db};
use crate::db::ledger::ledger_statements;
use crate::db::{DbError, Ledger};

// === impl MysqlStore ===

impl Ledger for MysqlStore {
    ledger_statements! {
        status: "SELECT status FROM econtract WHERE contract_ref = ?",
        add: "INSERT INTO approval_request_memo (request_id, created_at, author, message)
              VALUES (?, ?, 'autoapproval', ?)",
        history: "SELECT created_at, author, message FROM approval_request_memo
                   WHERE request_id = ? ORDER BY id",
        memos: "SELECT message FROM approval_request_memo WHERE request_id = ? ORDER BY id",
    }

    async fn sync_econtract(
        &self,
        request_id: i64,
        contract_ref: &str,
        status: &str,
        now: DateTime<Utc>,
    ) -> Result<(), DbError> {
        let mut conn = self
            .primary
            .acquire()
            .await
            .map_err(db("sync e-contract"))?;
        // The econtract trigger reads the session variable (PostgreSQL: a
        // transaction-local setting, which MySQL has not), so it is set on
        // this connection for the one statement and cleared after it.
        sqlx::query("SET @autoapproval_syncing_request = ?")
            .bind(request_id)
            .execute(&mut *conn)
            .await
            .map_err(db("sync e-contract: name the request"))?;
        // ON DUPLICATE KEY UPDATE for ON CONFLICT; VALUES(col) is the row
        // proposed (MySQL 8.0.20+ deprecates it for a row alias MariaDB
        // lacks; both still accept it). Assignments run left to right, so
        // synced_at is judged before status changes.
        let written = sqlx::query(
            "INSERT INTO econtract (contract_ref, status, synced_at) VALUES (?, ?, ?)
             ON DUPLICATE KEY UPDATE
                synced_at = IF(status = 'SIGNED' AND VALUES(status) = 'PENDING', synced_at, VALUES(synced_at)),
                status = IF(status = 'SIGNED' AND VALUES(status) = 'PENDING', status, VALUES(status))",
        )
        .bind(contract_ref)
        .bind(status)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(db("sync e-contract"));
        let cleared = sqlx::query("SET @autoapproval_syncing_request = NULL")
            .execute(&mut *conn)
            .await;
        if cleared.is_err() {
            // A connection that kept the variable must not be reused.
            conn.close_on_drop();
        }
        written?;
        Ok(())
    }
}
