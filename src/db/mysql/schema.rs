//! The migrations and the start-up checks of the schema, on MySQL / MariaDB.

use sqlx::Row;
use sqlx::migrate::Migrator;

use super::candidates::candidate_sql;
use super::{MysqlStore, db};
use crate::db::DbError;
use crate::db::schema::{
    MigrationSet, Probe, Schema, Script, configured, hex, missing, pending, run_probes, script,
    wake_warnings,
};
use crate::domain::RequestType;

fn migrator(set: MigrationSet) -> Migrator {
    configured(
        match set {
            MigrationSet::Controller => sqlx::migrate!("./migrations/mysql/controller"),
            MigrationSet::Reference => sqlx::migrate!("./migrations/mysql/reference"),
        },
        set,
    )
}

const SCRIPT: Script = Script {
    history_ddl: "CREATE TABLE IF NOT EXISTS {table} (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
);",
    checksum: |bytes| format!("x'{}'", hex(bytes)),
    // A migration holds triggers and procedures whose bodies contain `;`:
    // the mysql client sends it whole under another delimiter (its server
    // runs the statements one after the other, as sqlx does).
    wrap: |sql, _| format!("DELIMITER $$\n{sql}\n$$\nDELIMITER ;\n"),
};

// The inserts, as the controller makes them, changing nothing.
const INSERT_PROBES: &[Probe] = &[
    Probe {
        needs: "INSERT and UPDATE on autoapproval_econtract",
        sql: "INSERT INTO autoapproval_econtract (contract_ref, status, synced_at)
              SELECT NULL, NULL, NULL FROM DUAL WHERE FALSE
              ON DUPLICATE KEY UPDATE status = VALUES(status), synced_at = VALUES(synced_at)",
    },
    Probe {
        needs: "INSERT on autoapproval_request_memo (request_id, created_at, author, message)",
        sql: "INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
              SELECT NULL, NULL, NULL, NULL FROM DUAL WHERE FALSE",
    },
];

impl Schema for MysqlStore {
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
        // Only the triggers of the tables behind our views count (a server
        // holds other databases, with triggers of their own): a view's
        // definition names its table as `schema`.`table`.
        let (requests, econtracts): (i64, i64) = sqlx::query_as(
            "SELECT CAST(COALESCE(SUM(v.TABLE_NAME = 'autoapproval_request'
                        AND t.ACTION_STATEMENT LIKE '%autoapproval_request_changed%'), 0) AS SIGNED),
                    CAST(COALESCE(SUM(v.TABLE_NAME = 'autoapproval_econtract'
                        AND t.ACTION_STATEMENT LIKE '%autoapproval_econtract_changed%'), 0) AS SIGNED)
               FROM information_schema.TRIGGERS t
               JOIN information_schema.VIEWS v
                 ON v.TABLE_SCHEMA = DATABASE()
                AND v.TABLE_NAME IN ('autoapproval_request', 'autoapproval_econtract')
                AND INSTR(v.VIEW_DEFINITION,
                          CONCAT('`', t.EVENT_OBJECT_SCHEMA, '`.`', t.EVENT_OBJECT_TABLE, '`')) > 0",
        )
        .fetch_one(&self.primary)
        .await
        .map_err(db("listing the wake triggers"))?;
        Ok(wake_warnings(
            requests,
            econtracts,
            "none this account can see: an account sees the triggers of the tables it has \
             TRIGGER on; if yours are watched as docs/INTEGRATING.md says, this is only that",
        ))
    }
}

impl MysqlStore {
    /// The versions of `set` applied; `None` when its history table is missing.
    async fn applied(&self, set: MigrationSet) -> Result<Option<Vec<i64>>, DbError> {
        let exists: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.TABLES
              WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        )
        .bind(set.history_table())
        .fetch_one(&self.primary)
        .await
        .map_err(db("reading the migration history"))?;
        if exists == 0 {
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

    /// The candidate queries that would read the business table whole: a
    /// request-side read with no index it could use. MySQL merges the view
    /// autoapproval_request into the query, so EXPLAIN names the table
    /// behind it, not the alias `r`: the request side is every row that is
    /// none of our own (`s`, `p`) nor a derived table or union (`<…>`).
    /// MySQL has no switch to forbid full scans, and chooses one on a small
    /// table whatever its indexes, so the test is the usable keys, not the
    /// plan.
    async fn whole_table_reads(&self) -> Result<Vec<String>, DbError> {
        let now = chrono::Utc::now();
        let mut warnings = Vec::new();
        for request_type in [RequestType::OwnerContract, RequestType::AdContract] {
            let Some(sql) = candidate_sql(request_type, 0) else {
                continue;
            };
            let mut explain = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")));
            for _ in 0..3 {
                explain = explain
                    .bind(now - chrono::Duration::days(1))
                    .bind(now)
                    .bind(i32::MAX)
                    .bind(1_i64);
            }
            // EXPLAIN of a view needs SHOW VIEW and the right to read the
            // tables behind it, which the controller's account has not when
            // the business tables are in a database of their own: then the
            // index cannot be checked from here, and start-up says so.
            let rows = match explain.bind(1_i64).fetch_all(&self.read).await {
                Ok(rows) => rows,
                Err(sqlx::Error::Database(e)) => {
                    warnings.push(format!(
                        "the {} candidate query's plan cannot be read by this account ({}): \
                         check by hand that the table behind autoapproval_request has an index \
                         on the columns behind (request_type, status, sort_time) \
                         (docs/INTEGRATING.md)",
                        request_type.as_str(),
                        e.message()
                    ));
                    continue;
                }
                Err(e) => return Err(db("explaining the candidate query")(e)),
            };
            let mut unindexed: Vec<String> = rows
                .iter()
                .filter_map(|row| {
                    let table: String = row.try_get("table").ok().flatten()?;
                    let keys: Option<String> = row.try_get("possible_keys").ok().flatten();
                    let ours = matches!(table.as_str(), "s" | "p") || table.starts_with('<');
                    (!ours && keys.is_none_or(|k| k.is_empty())).then_some(table)
                })
                .collect();
            unindexed.dedup();
            for table in unindexed {
                warnings.push(format!(
                    "the {} candidate query reads table {table} whole: it needs an index on the \
                     columns behind autoapproval_request's (request_type, status, sort_time), \
                     e.g. CREATE INDEX autoapproval_candidates ON {table} (<type column>, \
                     <status column>, <sort column>) (docs/INTEGRATING.md)",
                    request_type.as_str()
                ));
            }
        }
        Ok(warnings)
    }
}
