//! The migrations and the start-up checks of the schema, on MySQL / MariaDB.

use sqlx::Row;
use sqlx::migrate::Migrator;

use super::candidates::candidate_template;
use super::ledger::SYNC_ECONTRACT;
use super::{MysqlStore, db};
use crate::db::DbError;
use crate::db::schema::{
    MigrationSet, Probed, Schema, Script, Write, WriteProbes, configured, hex, missing,
    no_request_row, not_a_rename, pending, run_probes, script, sequence_refused, waited,
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

// The memo insert is probed for real by `write_probes` (a probe that
// inserts nothing is refused already by a sequence default's rights, with
// the server's words only); the e-contract upsert by `upsert_problem`.

// The writes `write_probes` makes for real, as the controller makes them
// (ledger.rs, claims.rs), each in a transaction rolled back.

/// One request row nobody holds, locked without waiting (guarantee 1).
const PICK_REQUEST: &str =
    "SELECT id FROM autoapproval_request ORDER BY id DESC LIMIT 1 FOR UPDATE SKIP LOCKED";

/// Every column the controller writes, the values unchanged but the write
/// time, as a completion sets it (MySQL fires a row's triggers either way).
const UPDATE_REQUEST: &str = "UPDATE autoapproval_request
    SET status = status, updated_at = UTC_TIMESTAMP(6), owner_number = owner_number,
        store_number = store_number, campaign_id = campaign_id, decided_at = decided_at,
        decided_by = decided_by
  WHERE id = ?";

/// The memo insert of `add_memo` (ledger.rs).
const INSERT_MEMO: &str =
    "INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
              VALUES (?, ?, 'autoapproval', ?)";

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
        let mut problems = run_probes(&self.primary, &[]).await?;
        problems.extend(self.upsert_problem().await?);
        Ok(problems)
    }

    async fn write_probes(&self) -> Result<WriteProbes, DbError> {
        const OPERATION: &str = "probing the binding's writes";
        let mut found = WriteProbes::default();
        // A connection of its own, closed after: its lock wait is cut to
        // the server's least (1 s), which the pool's sessions must not keep.
        let mut conn = self.primary.acquire().await.map_err(db(OPERATION))?;
        conn.close_on_drop();
        sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
            .execute(&mut *conn)
            .await
            .map_err(db(OPERATION))?;
        // As GRANT names it: 'user'@'host'.
        let user: String = sqlx::query_scalar(
            "SELECT CONCAT(QUOTE(SUBSTRING_INDEX(CURRENT_USER(), '@', 1)), '@',
                           QUOTE(SUBSTRING_INDEX(CURRENT_USER(), '@', -1)))",
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db(OPERATION))?;
        let now = chrono::Utc::now();

        // The request update, on a row nobody holds, its triggers firing.
        let mut tx = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(db(OPERATION))?;
        let picked = sqlx::query_scalar::<_, i64>(PICK_REQUEST)
            .fetch_optional(&mut *tx)
            .await;
        let (request, updated) = match picked {
            Ok(Some(id)) => (
                Some(id),
                Some(sqlx::query(UPDATE_REQUEST).bind(id).execute(&mut *tx).await),
            ),
            Ok(None) => (None, None),
            Err(e) => (None, Some(Err(e))),
        };
        tx.rollback().await.map_err(db(OPERATION))?;
        match updated {
            None => found.add(no_request_row()),
            Some(Ok(_)) => {}
            Some(Err(e)) => found.add(self.diagnose(Write::Request, &user, e).await?),
        }

        // The memo insert, its table's defaults and triggers running.
        let mut tx = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(db(OPERATION))?;
        let memo = sqlx::query(INSERT_MEMO)
            .bind(request.unwrap_or(0))
            .bind(now)
            .bind("start-up probe, rolled back")
            .execute(&mut *tx)
            .await;
        tx.rollback().await.map_err(db(OPERATION))?;
        if let Err(e) = memo {
            found.add(self.diagnose(Write::Memo, &user, e).await?);
        }
        Ok(found)
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
            let upsert = sqlx::query(self.sql(SYNC_ECONTRACT))
                .bind(&contract)
                .bind(pending)
                .bind(chrono::Utc::now())
                .execute(&mut *tx)
                .await;
            match upsert {
                Ok(_) => {}
                Err(sqlx::Error::Database(e)) => {
                    tx.rollback().await.map_err(db(OPERATION))?;
                    let number = e
                        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .map(|e| e.number());
                    // Through a view that is not a plain rename the upsert
                    // cannot insert, whatever the grants.
                    if let Some(1471 | 1348 | 1393 | 1395) = number {
                        let how = "the view is not insertable into through its columns";
                        if let Probed::Refused(said) = not_a_rename(Write::Upsert, how, e.message())
                        {
                            return Ok(Some(said));
                        }
                    }
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

    /// What a refused write means, in words: the sequence, the column or
    /// the trigger behind the server's message, and the fix.
    async fn diagnose(
        &self,
        write: Write,
        user: &str,
        error: sqlx::Error,
    ) -> Result<Probed, DbError> {
        const OPERATION: &str = "reading why a write of the binding was refused";
        let Some(e) = error.as_database_error() else {
            return Err(db(OPERATION)(error));
        };
        let said = e.message().to_owned();
        let number = e
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|e| e.number());
        match number {
            // A lock wait (NOWAIT, innodb_lock_wait_timeout), a statement
            // timeout (MariaDB 1969, MySQL 3024).
            Some(1205 | 3572 | 1969 | 3024) => return Ok(waited(write, &said)),
            // No row to hang the memo on: the insert got as far as its keys.
            Some(1452) if write != Write::Request => return Ok(Probed::Passed),
            // A sequence default (MariaDB's DEFAULT NEXTVAL(s)) runs with
            // the writer's rights, not the view's definer's.
            Some(1142 | 1143) => {
                if let Some(table) = said.split(" for table ").nth(1) {
                    let table = table.trim();
                    if table.contains(write.view()) {
                        let needs = match write {
                            Write::Memo => {
                                "INSERT on autoapproval_request_memo (request_id, created_at, \
                                 author, message)"
                            }
                            Write::Upsert => UPSERT_NEEDS,
                            Write::Request => {
                                "UPDATE on autoapproval_request (status, updated_at, \
                                 owner_number, store_number, campaign_id, decided_at, decided_by)"
                            }
                        };
                        return Ok(Probed::Refused(format!("{needs} needed: {said}")));
                    } else {
                        return Ok(sequence_refused(
                            write,
                            table,
                            user,
                            &format!("GRANT SELECT, INSERT ON {table} TO {user}"),
                            &said,
                        ));
                    }
                }
            }
            Some(1364) => {
                return Ok(Probed::Refused(format!(
                    "{} through {} leaves a column of the table behind it without a value: \
                     {said}; give that column a DEFAULT (ALTER TABLE … ALTER COLUMN … SET \
                     DEFAULT …), as the table's owner",
                    write.what(),
                    write.view()
                )));
            }
            Some(1471 | 1348 | 1393 | 1395) => {
                return Ok(not_a_rename(
                    write,
                    "the view is not insertable into or updatable through its columns",
                    &said,
                ));
            }
            _ => {}
        }
        // Anything else a trigger of the business's may have raised (a
        // SIGNAL, a right its definer lacks): name them, when this account
        // may see them.
        let definition: Option<String> = sqlx::query_scalar(
            "SELECT VIEW_DEFINITION FROM information_schema.VIEWS
              WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        )
        .bind(write.view())
        .fetch_optional(&self.primary)
        .await
        .map_err(db(OPERATION))?;
        let table = definition
            .as_deref()
            .and_then(|d| {
                column_behind(
                    d,
                    if write == Write::Upsert {
                        "contract_ref"
                    } else {
                        "id"
                    },
                )
            })
            .map(|(table, _)| table);
        let triggers: Vec<String> = match &table {
            Some(table) => sqlx::query_scalar(
                "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS
                  WHERE CONCAT('`', EVENT_OBJECT_SCHEMA, '`.`', EVENT_OBJECT_TABLE, '`') = ?
                    AND EVENT_MANIPULATION = ?
                    AND ACTION_STATEMENT NOT LIKE '%autoapproval_request_changed%'
                    AND ACTION_STATEMENT NOT LIKE '%autoapproval_econtract_changed%'
                  ORDER BY ACTION_ORDER",
            )
            .bind(table)
            .bind(write.event())
            .fetch_all(&self.primary)
            .await
            .map_err(db(OPERATION))?,
            None => Vec::new(),
        };
        Ok(Probed::Refused(mysql_trigger_refused(
            write,
            table.as_deref(),
            &triggers,
            user,
            &said,
        )))
    }

    /// The table behind autoapproval_request, the columns behind its
    /// request_type, status and sort_time, and each index of that table with its
    /// first two columns; `None` when this account cannot read the view's
    /// definition (then the plan cannot be read either).
    #[allow(clippy::type_complexity)]
    async fn leading_columns(
        &self,
    ) -> Result<Option<(String, [String; 3], Vec<(String, Vec<String>)>)>, DbError> {
        const OPERATION: &str = "reading the request table's indexes";
        let definition: Option<String> = sqlx::query_scalar(
            "SELECT VIEW_DEFINITION FROM information_schema.VIEWS
              WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'autoapproval_request'",
        )
        .fetch_optional(&self.read)
        .await
        .map_err(db(OPERATION))?;
        let Some(definition) = definition else {
            return Ok(None);
        };
        let (Some((table, kind)), Some((_, status)), Some((_, sort))) = (
            column_behind(&definition, "request_type"),
            column_behind(&definition, "status"),
            column_behind(&definition, "sort_time"),
        ) else {
            return Ok(None);
        };
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT INDEX_NAME,
                    GROUP_CONCAT(CONCAT('`', COLUMN_NAME, '`') ORDER BY SEQ_IN_INDEX SEPARATOR ',')
               FROM information_schema.STATISTICS
              WHERE CONCAT('`', TABLE_SCHEMA, '`.`', TABLE_NAME, '`') = ?
                 OR (TABLE_SCHEMA = DATABASE() AND CONCAT('`', TABLE_NAME, '`') = ?)
              GROUP BY INDEX_NAME",
        )
        .bind(&table)
        .bind(&table)
        .fetch_all(&self.read)
        .await
        .map_err(db(OPERATION))?;
        let keys = rows
            .into_iter()
            .map(|(name, columns)| (name, columns.split(',').map(str::to_owned).collect()))
            .collect();
        Ok(Some((table, [kind, status, sort], keys)))
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
        let leading = self.leading_columns().await?;
        for request_type in [RequestType::OwnerContract, RequestType::AdContract] {
            let Some(sql) =
                candidate_template(request_type, 0).map(|t| self.statements.codes().render(&t))
            else {
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
            // An index it can use that does not begin with the type and the
            // status (one on sort_time alone) walks the whole window.
            if let Some((table, columns, keys)) = &leading {
                let mut usable: Vec<String> = rows
                    .iter()
                    .filter_map(|row| {
                        let name: String = row.try_get("table").ok().flatten()?;
                        let possible: String = row.try_get("possible_keys").ok().flatten()?;
                        (table.ends_with(&format!("`{name}`"))).then_some(possible)
                    })
                    .flat_map(|p| p.split(',').map(str::to_owned).collect::<Vec<_>>())
                    .collect();
                // One row per branch of the union: each key once.
                usable.sort();
                usable.dedup();
                let serves = |key: &String| {
                    keys.iter().any(|(name, first)| {
                        name == key
                            && first.len() >= 2
                            && columns[..2].iter().all(|c| first[..2].contains(c))
                    })
                };
                if !usable.is_empty() && !usable.iter().any(serves) {
                    warnings.push(format!(
                        "the {} candidate query can read table {table} only through index {}, \
                         which does not begin with its type and status columns ({}, {}): it \
                         walks every request of the window, whatever its type and status; it \
                         needs an index on the columns behind autoapproval_request's \
                         (request_type, status, sort_time), e.g. CREATE INDEX \
                         autoapproval_candidates ON {table} ({}, {}, {}) \
                         (docs/INTEGRATING.md)",
                        request_type.as_str(),
                        usable.join(", "),
                        columns[0],
                        columns[1],
                        columns[0],
                        columns[1],
                        columns[2],
                    ));
                }
            }
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

/// The refusal of a write that passed the grant checks: on MySQL a trigger
/// runs with its definer's rights, so one refuses the controller's user
/// itself (a SIGNAL, a check of USER()) or lacks a right for every writer.
/// `table`: the table behind the view, when its definition was readable;
/// `triggers`: its triggers of the write's event, when this account sees them.
fn mysql_trigger_refused(
    write: Write,
    table: Option<&str>,
    triggers: &[String],
    user: &str,
    said: &str,
) -> String {
    let on = table.unwrap_or("the table behind it");
    let which = if triggers.is_empty() {
        format!(
            "if it is not a right of the view's definer on {on}, an {} trigger on {on} refused \
             it (this account cannot list them: information_schema.TRIGGERS shows a table's \
             triggers only to an account with the TRIGGER right on it; as the table's owner, \
             SHOW TRIGGERS LIKE '<table>' names them)",
            write.event()
        )
    } else {
        format!(
            "an {} trigger on {on} refused it ({})",
            write.event(),
            triggers.join(", ")
        )
    };
    format!(
        "{} through {} as the controller's user {user} was refused: {said}; {which}: a trigger \
         runs with its definer's rights, so it refused {user} itself (a SIGNAL, a check of \
         USER()) or its definer lacks a right: let it accept the controller's writes of the \
         columns it writes, or grant its definer the right",
        write.what(),
        write.view()
    )
}

/// The table and column that a view's `alias` selects, from its
/// definition as information_schema.VIEWS shows it (both servers write
/// `` `db`.`table`.`column` AS `alias` ``); `None` for anything else (an
/// expression, a definition this account may not read).
pub(super) fn column_behind(definition: &str, alias: &str) -> Option<(String, String)> {
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
