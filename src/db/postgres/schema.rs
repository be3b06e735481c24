//! The migrations and the start-up checks of the schema, on PostgreSQL.

use sqlx::Row;
use sqlx::migrate::Migrator;

use super::candidates::candidate_template;
use super::{PgStore, db};
use crate::db::DbError;
use crate::db::schema::{
    MigrationSet, Probe, Schema, Script, configured, hex, missing, pending, run_probes, script,
    wake_warnings,
};
use crate::domain::RequestType;

fn migrator(set: MigrationSet) -> Migrator {
    configured(
        match set {
            MigrationSet::Controller => sqlx::migrate!("./migrations/postgres/controller"),
            MigrationSet::Reference => sqlx::migrate!("./migrations/postgres/reference"),
        },
        set,
    )
}

const SCRIPT: Script = Script {
    history_ddl: "CREATE TABLE IF NOT EXISTS {table} (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
    success BOOLEAN NOT NULL,
    checksum BYTEA NOT NULL,
    execution_time BIGINT NOT NULL
);",
    checksum: |bytes| format!("'\\x{}'::bytea", hex(bytes)),
    // psql runs a file statement by statement; a transaction around each
    // migration but a `-- no-transaction` one (CREATE INDEX CONCURRENTLY).
    wrap: |sql, no_tx| {
        if no_tx {
            format!("{sql}\n")
        } else {
            format!("BEGIN;\n{sql}\nCOMMIT;\n")
        }
    },
};

// The inserts, as the controller makes them, changing nothing: the
// upsert's unique key is checked when it is planned.
const INSERT_PROBES: &[Probe] = &[
    Probe {
        needs: "INSERT and UPDATE on autoapproval_econtract, over a table with a unique key on \
                the column behind contract_ref",
        sql: "INSERT INTO autoapproval_econtract (contract_ref, status, synced_at)
              SELECT contract_ref, status, synced_at FROM autoapproval_econtract WHERE false
              ON CONFLICT (contract_ref) DO UPDATE
                 SET status = EXCLUDED.status, synced_at = EXCLUDED.synced_at",
    },
    Probe {
        needs: "INSERT on autoapproval_request_memo (request_id, created_at, author, message)",
        sql: "INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
              SELECT NULL::bigint, NULL::timestamptz, NULL::text, NULL::text WHERE false",
    },
];

impl Schema for PgStore {
    async fn migrate_set(&self, set: MigrationSet) -> Result<(), DbError> {
        migrator(set).run(&self.primary).await?;
        Ok(())
    }

    async fn pending_sql(&self, set: MigrationSet) -> Result<String, DbError> {
        let applied = self.applied(set).await?.unwrap_or_default();
        let migrator = migrator(set);
        Ok(script(set, &pending(&migrator, &applied), &SCRIPT))
    }

    async fn missing_migrations(&self) -> Result<Vec<String>, DbError> {
        let applied = self.applied(MigrationSet::Controller).await?;
        Ok(missing(&migrator(MigrationSet::Controller), applied))
    }

    async fn binding_problems(&self) -> Result<Vec<String>, DbError> {
        run_probes(&self.primary, INSERT_PROBES).await
    }

    async fn candidate_scans(&self) -> Result<Vec<String>, DbError> {
        self.whole_table_reads().await
    }

    async fn trigger_warnings(&self) -> Result<Vec<String>, DbError> {
        let (requests, econtracts): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE p.proname = 'autoapproval_request_changed'),
                    count(*) FILTER (WHERE p.proname = 'autoapproval_econtract_changed')
               FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
              WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace",
        )
        .fetch_one(&self.primary)
        .await
        .map_err(db("listing the wake triggers"))?;
        Ok(wake_warnings(
            requests,
            econtracts,
            "attach one with autoapproval_watch_requests / autoapproval_watch_econtracts",
        ))
    }
}

impl PgStore {
    /// The versions of `set` applied; `None` when its history table is missing.
    async fn applied(&self, set: MigrationSet) -> Result<Option<Vec<i64>>, DbError> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(set.history_table())
            .fetch_one(&self.primary)
            .await
            .map_err(db("reading the migration history"))?;
        if !exists {
            return Ok(None);
        }
        let versions = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT version FROM {} WHERE success ORDER BY version",
            set.history_table()
        )))
        .fetch_all(&self.primary)
        .await
        .map_err(db("reading the migration history"))?;
        Ok(Some(versions))
    }

    /// The business tables each candidate query would read whole, as
    /// warnings naming the columns to index. The planner is asked with
    /// sequential scans disabled, so a small table's cheap scan does not
    /// hide a missing index: a scan that remains has no index to use.
    async fn whole_table_reads(&self) -> Result<Vec<String>, DbError> {
        let now = chrono::Utc::now();
        let mut warnings = Vec::new();
        for request_type in [RequestType::OwnerContract, RequestType::AdContract] {
            let Some(sql) = candidate_template(request_type).map(|t| self.sql(t)) else {
                continue;
            };
            let mut tx = self
                .read
                .begin()
                .await
                .map_err(db("explaining the candidate query"))?;
            sqlx::query("SET LOCAL enable_seqscan = off")
                .execute(&mut *tx)
                .await
                .map_err(db("explaining the candidate query"))?;
            let sql = sql.as_str();
            let row = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN (FORMAT JSON) {sql}")))
                .bind(now - chrono::Duration::days(1))
                .bind(now)
                .bind(i32::MAX)
                .bind(1_i64)
                .bind(None::<Vec<i64>>)
                .bind(1_i64)
                .fetch_one(&mut *tx)
                .await
                .map_err(db("explaining the candidate query"))?;
            let plan: serde_json::Value = row
                .try_get(0)
                .map_err(db("explaining the candidate query"))?;
            for table in whole_reads(&plan) {
                warnings.push(format!(
                    "the {} candidate query reads table {table} whole: it needs an index on the \
                     columns behind autoapproval_request's (request_type, status, sort_time), \
                     e.g. CREATE INDEX CONCURRENTLY ON {table} (<type column>, <status column>, \
                     <sort column>) WHERE <status column> IN ('ING', 'PENDING', 'RETRY') \
                     (docs/INTEGRATING.md)",
                    request_type.as_str()
                ));
            }
        }
        warnings.dedup();
        Ok(warnings)
    }
}

/// The tables of ours a whole read is fine on: small, and indexed by us.
fn ours(table: &str) -> bool {
    table.starts_with("auto_approve_")
}

/// The business tables a plan reads whole: a sequential scan, or an index
/// scan with no index condition (a full index walk).
pub(super) fn whole_reads(plan: &serde_json::Value) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![plan];
    while let Some(node) = stack.pop() {
        match node {
            serde_json::Value::Array(items) => stack.extend(items),
            serde_json::Value::Object(fields) => {
                let kind = fields.get("Node Type").and_then(|v| v.as_str());
                let table = fields.get("Relation Name").and_then(|v| v.as_str());
                if let (Some(kind), Some(table)) = (kind, table) {
                    let whole = kind == "Seq Scan"
                        || (matches!(kind, "Index Scan" | "Index Only Scan")
                            && !fields.contains_key("Index Cond"));
                    if whole && !ours(table) && !found.iter().any(|t| t == table) {
                        found.push(table.to_string());
                    }
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::whole_reads;

    #[test]
    fn a_seq_scan_or_an_unconditioned_index_scan_of_a_business_table_is_a_whole_read() {
        let plan = serde_json::json!([{"Plan": {"Node Type": "Limit", "Plans": [
            {"Node Type": "Seq Scan", "Relation Name": "imr"},
            {"Node Type": "Index Scan", "Relation Name": "esign"},
            {"Node Type": "Index Scan", "Relation Name": "memo", "Index Cond": "(id = 1)"},
            {"Node Type": "Seq Scan", "Relation Name": "auto_approve_pause"},
        ]}}]);
        assert_eq!(whole_reads(&plan), ["esign", "imr"]);
    }

    #[test]
    fn an_index_range_read_is_not_a_whole_read() {
        let plan = serde_json::json!([{"Plan": {"Node Type": "Index Only Scan",
            "Relation Name": "autoapproval_request", "Index Cond": "(request_type = 'AD')"}}]);
        assert!(whole_reads(&plan).is_empty());
    }
}
