//! The migrations and the start-up checks of the schema, on MySQL / MariaDB.

use sqlx::Row;
use sqlx::migrate::Migrator;

use super::candidates::candidate_sql;
use super::ledger::SYNC_ECONTRACT;
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

// The memo insert, as the controller makes it, changing nothing. The
// e-contract upsert is probed by `upsert_problem`.
const INSERT_PROBES: &[Probe] = &[Probe {
    needs: "INSERT on autoapproval_request_memo (request_id, created_at, author, message)",
    sql: "INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
          SELECT NULL, NULL, NULL, NULL FROM DUAL WHERE FALSE",
}];

/// What the e-contract upsert needs, as a refusal names it.
const UPSERT_NEEDS: &str = "INSERT and UPDATE on autoapproval_econtract (contract_ref, status, \
                            synced_at), over a table with a UNIQUE key on the column behind \
                            contract_ref";

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
        let mut problems = run_probes(&self.primary, INSERT_PROBES).await?;
        problems.extend(self.upsert_problem().await?);
        Ok(problems)
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
    /// Whether the e-contract upsert updates the row of a contract it has
    /// written before, as `sync_econtract` relies on: ON DUPLICATE KEY
    /// UPDATE over a table with no unique key on the column behind
    /// contract_ref inserts a second row instead, silently, at every sync
    /// (PostgreSQL's ON CONFLICT refuses that itself). The statement the
    /// chain runs, twice on one made-up contract, in a transaction that is
    /// rolled back: only what it does tells, as the controller's role may
    /// not see the table's keys. The ledger's triggers fire inside it; the
    /// wake row they append goes with the rollback.
    async fn upsert_problem(&self) -> Result<Option<String>, DbError> {
        const OPERATION: &str = "probing the e-contract upsert";
        let contract = format!("aa-probe-{:08x}", rand::random::<u32>());
        // A status the chain writes (a ledger may CHECK its values).
        let pending = "PENDING";
        let mut tx = self.primary.begin().await.map_err(db(OPERATION))?;
        for _ in 0..2 {
            let upsert = sqlx::query(SYNC_ECONTRACT)
                .bind(&contract)
                .bind(pending)
                .bind(chrono::Utc::now())
                .execute(&mut *tx)
                .await;
            match upsert {
                Ok(_) => {}
                Err(sqlx::Error::Database(e)) => {
                    tx.rollback().await.map_err(db(OPERATION))?;
                    return Ok(Some(format!("{UPSERT_NEEDS} needed: {}", e.message())));
                }
                Err(e) => return Err(db(OPERATION)(e)),
            }
        }
        let rows: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM autoapproval_econtract WHERE contract_ref = ?",
        )
        .bind(&contract)
        .fetch_one(&mut *tx)
        .await
        .map_err(db(OPERATION))?;
        tx.rollback().await.map_err(db(OPERATION))?;
        if rows == 1 {
            return Ok(None);
        }
        let definition: Option<String> = sqlx::query_scalar(
            "SELECT VIEW_DEFINITION FROM information_schema.VIEWS
              WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'autoapproval_econtract'",
        )
        .fetch_optional(&self.primary)
        .await
        .map_err(db(OPERATION))?;
        Ok(Some(no_unique_key(
            definition
                .as_deref()
                .and_then(|d| column_behind(d, "contract_ref")),
        )))
    }

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

/// The refusal of an e-contract ledger whose upsert inserted a second row;
/// `behind`: the view's column as `table` and `column`, when it was read.
fn no_unique_key(behind: Option<(String, String)>) -> String {
    let fix = match behind {
        Some((table, column)) => format!(
            "{table}.{column} is the column behind it: ALTER TABLE {table} ADD UNIQUE KEY ({column})"
        ),
        None => "add a UNIQUE key on the column behind it to the view's table".to_owned(),
    };
    format!(
        "{UPSERT_NEEDS} needed: the upsert inserted a second row for one contract_ref instead of \
         updating the first (every e-contract sync would add a ledger row); {fix}"
    )
}

/// The table and column that a view's `alias` selects, from its
/// definition as information_schema.VIEWS shows it (both servers write
/// `` `db`.`table`.`column` AS `alias` ``); `None` for anything else (an
/// expression, a definition this account may not read).
fn column_behind(definition: &str, alias: &str) -> Option<(String, String)> {
    let marker = format!(" AS `{alias}`");
    let at = definition
        .to_ascii_lowercase()
        .find(&marker.to_ascii_lowercase())?;
    // The quoted names before the marker, right to left: `db`.`table`.`column`.
    let mut names = Vec::new();
    let mut rest = &definition[..at];
    while let Some(before) = rest.strip_suffix('`') {
        let open = before.rfind('`')?;
        names.push(&before[open + 1..]);
        rest = &before[..open];
        match rest.strip_suffix('.') {
            Some(r) => rest = r,
            None => break,
        }
    }
    let (column, table) = match names.as_slice() {
        [column, table, db, ..] => (column, format!("`{db}`.`{table}`")),
        [column, table] => (column, format!("`{table}`")),
        _ => return None,
    };
    Some((table, format!("`{column}`")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_column_behind_a_view_alias_is_read_from_its_definition() {
        let mariadb = "select `contracts`.`esign_version`.`contract_no` AS `contract_ref`,\
                       `contracts`.`esign_version`.`esign_status` AS `status` \
                       from `contracts`.`esign_version`";
        assert_eq!(
            column_behind(mariadb, "contract_ref"),
            Some((
                "`contracts`.`esign_version`".to_owned(),
                "`contract_no`".to_owned()
            ))
        );
        assert_eq!(
            column_behind(mariadb, "status").map(|(_, c)| c),
            Some("`esign_status`".to_owned())
        );
        assert_eq!(
            column_behind(
                "select upper(`t`.`ref`) AS `contract_ref` from `t`",
                "contract_ref"
            ),
            None
        );
        assert_eq!(column_behind("", "contract_ref"), None);
    }

    #[test]
    fn the_refusal_names_the_view_the_column_and_the_fix() {
        let said = no_unique_key(Some(("`c`.`ledger`".to_owned(), "`ref`".to_owned())));
        assert!(said.contains("autoapproval_econtract"), "{said}");
        assert!(said.contains("contract_ref"), "{said}");
        assert!(
            said.contains("ALTER TABLE `c`.`ledger` ADD UNIQUE KEY (`ref`)"),
            "{said}"
        );
        assert!(no_unique_key(None).contains("UNIQUE key"));
    }
}
