//! The e-contract ledger the chain syncs from the e-sign system, and the
//! memo history of a request that people read.

use chrono::{DateTime, Utc};

use super::{PgStore, db};
use crate::db::ledger::ledger_statements;
use crate::db::{DbError, Ledger};

impl Ledger for PgStore {
    ledger_statements! {
        status: ECONTRACT_STATUS,
        add: "INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
              VALUES ($1, $2, 'autoapproval', $3)",
        history: "SELECT created_at, author, message FROM autoapproval_request_memo
                   WHERE request_id = $1 ORDER BY id",
        memos: "SELECT message FROM autoapproval_request_memo WHERE request_id = $1 ORDER BY id",
    }

    async fn sync_econtract(
        &self,
        request_id: i64,
        contract_ref: &str,
        status: &str,
        now: DateTime<Utc>,
    ) -> Result<(), DbError> {
        crate::db::business_write(self.shadow, "sync the e-contract ledger")?;
        // One statement, one round-trip: the transaction-local setting,
        // read by the econtract trigger (migration 0007), lasts until the
        // statement's implicit transaction ends, after the trigger fired.
        sqlx::query(self.sql(SYNC_ECONTRACT))
            .bind(contract_ref)
            .bind(status)
            .bind(now)
            .bind(request_id.to_string())
            .execute(&self.primary)
            .await
            .map_err(db("sync e-contract"))?;
        Ok(())
    }
}

// The ledger's status of a contract, as our word.
const ECONTRACT_STATUS: &str =
    "SELECT {ECONTRACT_AS:status} FROM autoapproval_econtract WHERE contract_ref = $1";

// The sync: the e-sign system's answer ($2, our word) written as the
// business's code; a signature is never taken back by a stale PENDING.
pub(super) const SYNC_ECONTRACT: &str = "INSERT INTO autoapproval_econtract (contract_ref, status, synced_at)
             SELECT $1, {ECONTRACT_PARAM:$2}, $3 FROM (SELECT set_config('autoapproval.syncing_request', $4, true)) AS origin
             ON CONFLICT (contract_ref) DO UPDATE SET status = EXCLUDED.status, synced_at = EXCLUDED.synced_at
              WHERE NOT (autoapproval_econtract.status = {ECONTRACT:SIGNED} AND EXCLUDED.status = {ECONTRACT:PENDING})";

/// The templates here (`db::codes`).
pub(super) const TEMPLATES: &[&str] = &[ECONTRACT_STATUS, SYNC_ECONTRACT];
