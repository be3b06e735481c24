//! The migrations and the start-up checks of the schema, on PostgreSQL.

use sqlx::Row;
use sqlx::migrate::Migrator;

use super::candidates::candidate_template;
use super::{PgStore, db};
use crate::db::DbError;
use crate::db::schema::{
    MigrationSet, Probe, Probed, Schema, Script, TableTrigger, Write, WriteProbes, configured, hex,
    missing, no_request_row, not_a_rename, pending, pg_trigger_refused, run_probes, script,
    sequence_refused, waited, wake_warnings,
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

// The inserts, as the controller makes them, changing nothing. The
// upsert's conflict target is the real upsert's to check (`write_probes`):
// here only the rights it needs.
const INSERT_PROBES: &[Probe] = &[
    Probe {
        needs: "INSERT on autoapproval_econtract (contract_ref, status, synced_at)",
        sql: "INSERT INTO autoapproval_econtract (contract_ref, status, synced_at)
              SELECT contract_ref, status, synced_at FROM autoapproval_econtract WHERE false",
    },
    Probe {
        needs: "UPDATE on autoapproval_econtract (status, synced_at)",
        sql: "UPDATE autoapproval_econtract SET status = status, synced_at = synced_at WHERE false",
    },
    Probe {
        needs: "INSERT on autoapproval_request_memo (request_id, created_at, author, message)",
        sql: "INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
              SELECT NULL::bigint, NULL::timestamptz, NULL::text, NULL::text WHERE false",
    },
];

// The writes `write_probes` makes for real, as the controller makes them
// (ledger.rs, claims.rs), each in a transaction rolled back.

/// One request row nobody holds, locked without waiting (guarantee 1: the
/// business's writes never wait on us, beyond the probe's milliseconds).
const PICK_REQUEST: &str = "SELECT id FROM autoapproval_request ORDER BY id DESC LIMIT 1
                            FOR NO KEY UPDATE SKIP LOCKED";

/// Every column the controller writes, so that a trigger `OF` any of them
/// fires; the values unchanged but the write time, as a completion sets it.
const UPDATE_REQUEST: &str = "UPDATE autoapproval_request
    SET status = status, updated_at = now(), owner_number = owner_number,
        store_number = store_number, campaign_id = campaign_id, decided_at = decided_at,
        decided_by = decided_by
  WHERE id = $1";

/// The memo insert of `add_memo` (ledger.rs).
const INSERT_MEMO: &str =
    "INSERT INTO autoapproval_request_memo (request_id, created_at, author, message)
              VALUES ($1, $2, 'autoapproval', $3)";

/// The triggers of the tables behind a view (`$1`), but for ours (which
/// run as their owner): the rewrite rule of a view depends on each table it
/// reads.
const TRIGGERS_BEHIND: &str = "SELECT DISTINCT t.tgrelid::regclass::text, t.tgname::text,
        t.tgfoid::regprocedure::text, p.proname::text
   FROM pg_catalog.pg_rewrite r
   JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::regclass
        AND d.objid = r.oid AND d.refclassid = 'pg_catalog.pg_class'::regclass
        AND d.refobjid <> r.ev_class
   JOIN pg_catalog.pg_trigger t ON t.tgrelid = d.refobjid AND NOT t.tgisinternal
   JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
  WHERE r.ev_class = $1::regclass
    AND p.proname NOT IN ('autoapproval_request_changed', 'autoapproval_econtract_changed')
  ORDER BY 1, 2";

/// What keeps ON CONFLICT from passing through the ledger's view: its
/// INSTEAD OF triggers, and its columns of ours that are expressions.
const LEDGER_SHAPE: &str = "SELECT
    COALESCE((SELECT string_agg(t.tgname::text, ', ' ORDER BY t.tgname)
                FROM pg_catalog.pg_trigger t
               WHERE t.tgrelid = v.oid AND (t.tgtype::int & 64) <> 0), ''),
    COALESCE((SELECT string_agg(a.attname::text, ', ' ORDER BY a.attnum)
                FROM pg_catalog.pg_attribute a
               WHERE a.attrelid = v.oid AND a.attname IN ('contract_ref', 'status', 'synced_at')
                 AND NOT pg_catalog.pg_column_is_updatable(v.oid, a.attnum, false)), '')
  FROM (SELECT 'autoapproval_econtract'::regclass AS oid) v";

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

    async fn write_probes(&self) -> Result<WriteProbes, DbError> {
        const OPERATION: &str = "probing the binding's writes";
        let mut found = WriteProbes::default();
        let role: String = sqlx::query_scalar("SELECT current_user::text")
            .fetch_one(&self.primary)
            .await
            .map_err(db(OPERATION))?;
        let now = chrono::Utc::now();

        // The request update, on a row nobody holds, its triggers firing.
        let mut tx = self.primary.begin().await.map_err(db(OPERATION))?;
        sqlx::query("SET LOCAL lock_timeout = '1s'")
            .execute(&mut *tx)
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
            Some(Err(e)) => found.add(self.diagnose(Write::Request, &role, e).await?),
        }

        // The memo insert, its table's defaults and triggers running; on
        // the request above, or on none (then its foreign key, if any,
        // refuses it after the defaults ran).
        let mut tx = self.primary.begin().await.map_err(db(OPERATION))?;
        sqlx::query("SET LOCAL lock_timeout = '1s'")
            .execute(&mut *tx)
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
            found.add(self.diagnose(Write::Memo, &role, e).await?);
        }

        // The e-contract upsert on a made-up contract, conflict target and all.
        let mut tx = self.primary.begin().await.map_err(db(OPERATION))?;
        sqlx::query("SET LOCAL lock_timeout = '1s'")
            .execute(&mut *tx)
            .await
            .map_err(db(OPERATION))?;
        // The real statement, in the business's codes (`db::codes`).
        let upsert = sqlx::query(self.sql(super::ledger::SYNC_ECONTRACT))
            .bind(format!("aa-probe-{:08x}", rand::random::<u32>()))
            .bind("PENDING")
            .bind(now)
            .bind("0")
            .execute(&mut *tx)
            .await;
        tx.rollback().await.map_err(db(OPERATION))?;
        if let Err(e) = upsert {
            found.add(self.diagnose(Write::Upsert, &role, e).await?);
        }
        Ok(found)
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
    /// What a refused write means, in words: the sequence, the trigger or
    /// the view's shape behind the database's message, and the fix.
    async fn diagnose(
        &self,
        write: Write,
        role: &str,
        error: sqlx::Error,
    ) -> Result<Probed, DbError> {
        const OPERATION: &str = "reading why a write of the binding was refused";
        let Some(e) = error.as_database_error() else {
            return Err(db(OPERATION)(error));
        };
        let said = e.message().to_owned();
        let code = e.code().map(|c| c.into_owned()).unwrap_or_default();
        let context = e
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .and_then(|p| p.r#where())
            .map(str::to_owned);
        // lock_not_available, query_canceled (the statement timeout).
        if code == "55P03" || code == "57014" {
            return Ok(waited(write, &said));
        }
        // foreign_key_violation: the insert got as far as its keys.
        if code == "23503" && write != Write::Request {
            return Ok(Probed::Passed);
        }
        if write == Write::Upsert {
            let (instead, expressions): (String, String) = sqlx::query_as(LEDGER_SHAPE)
                .fetch_one(&self.primary)
                .await
                .map_err(db(OPERATION))?;
            if !instead.is_empty() || !expressions.is_empty() {
                let mut how = Vec::new();
                if !instead.is_empty() {
                    how.push(format!(
                        "the view is written through INSTEAD OF trigger {instead}"
                    ));
                }
                if !expressions.is_empty() {
                    how.push(format!(
                        "its column {expressions} is an expression, not a column"
                    ));
                }
                return Ok(not_a_rename(
                    write,
                    &format!(
                        "{}, and PostgreSQL runs ON CONFLICT (contract_ref) only on a view it \
                         updates itself, so it answers that no unique key matches even when \
                         the ledger table has one on the column behind contract_ref",
                        how.join(" and ")
                    ),
                    &said,
                ));
            }
            if code == "42P10" {
                return Ok(Probed::Refused(format!(
                    "{} needs a UNIQUE key (or the primary key) of the ledger table on the \
                     column behind contract_ref: {said}",
                    write.what()
                )));
            }
        }
        if let Some(name) = said
            .strip_prefix("permission denied for sequence ")
            .filter(|_| code == "42501")
        {
            let sequence: Option<String> = sqlx::query_scalar(
                "SELECT c.oid::regclass::text FROM pg_catalog.pg_class c
                  WHERE c.relkind = 'S' AND c.relname = $1
                  ORDER BY pg_catalog.pg_table_is_visible(c.oid) DESC LIMIT 1",
            )
            .bind(name)
            .fetch_optional(&self.primary)
            .await
            .map_err(db(OPERATION))?;
            let sequence = sequence.unwrap_or_else(|| name.to_owned());
            return Ok(sequence_refused(
                write,
                &sequence,
                role,
                &format!("GRANT USAGE ON SEQUENCE {sequence} TO {role}"),
                &said,
            ));
        }
        if let Some(context) = context.filter(|c| c.contains("function")) {
            let triggers: Vec<(String, String, String, String)> = sqlx::query_as(TRIGGERS_BEHIND)
                .bind(write.view())
                .fetch_all(&self.primary)
                .await
                .map_err(db(OPERATION))?;
            let triggers: Vec<TableTrigger> = triggers
                .into_iter()
                .map(|(table, name, function, function_name)| TableTrigger {
                    table,
                    name,
                    function,
                    function_name,
                })
                .collect();
            return Ok(pg_trigger_refused(write, &triggers, &context, role, &said));
        }
        Ok(Probed::Refused(format!(
            "{} through {} as the controller's role {role} was refused: {said}",
            write.what(),
            write.view()
        )))
    }

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
    /// hide a missing index: a scan that remains has no index to use. A
    /// scan through an index that leaves the type or the status to its
    /// Filter (an index on sort_time alone, walked whole or as a bitmap)
    /// reads every row of the window as well.
    async fn whole_table_reads(&self) -> Result<Vec<String>, DbError> {
        const OPERATION: &str = "explaining the candidate query";
        let now = chrono::Utc::now();
        let mut warnings = Vec::new();
        // The columns behind request_type, status and sort_time, as a
        // verbose plan writes them (`imr.imr_type`): the Output of a read
        // of the view.
        let behind: Option<Vec<String>> = match sqlx::query_scalar::<_, serde_json::Value>(
            "EXPLAIN (VERBOSE, FORMAT JSON) SELECT request_type, status, sort_time FROM autoapproval_request",
        )
        .fetch_one(&self.read)
        .await
        {
            Ok(plan) => outputs(&plan),
            Err(sqlx::Error::Database(_)) => None,
            Err(e) => return Err(db(OPERATION)(e)),
        };
        for request_type in [RequestType::OwnerContract, RequestType::AdContract] {
            let Some(sql) = candidate_template(request_type).map(|t| self.sql(t)) else {
                continue;
            };
            let mut tx = self.read.begin().await.map_err(db(OPERATION))?;
            sqlx::query("SET LOCAL enable_seqscan = off")
                .execute(&mut *tx)
                .await
                .map_err(db(OPERATION))?;
            let sql = sql.as_str();
            let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                "EXPLAIN (VERBOSE, FORMAT JSON) {sql}"
            )))
            .bind(now - chrono::Duration::days(1))
            .bind(now)
            .bind(i32::MAX)
            .bind(1_i64)
            .bind(None::<Vec<i64>>)
            .bind(1_i64)
            .fetch_one(&mut *tx)
            .await
            .map_err(db(OPERATION))?;
            let plan: serde_json::Value = row.try_get(0).map_err(db(OPERATION))?;
            let bare: Vec<&str> = behind
                .iter()
                .flatten()
                .map(|c| c.rsplit('.').next().unwrap_or(c))
                .collect();
            let columns = match bare.as_slice() {
                [t, s, o] => format!("({t}, {s}, {o})"),
                _ => "(<type column>, <status column>, <sort column>)".to_owned(),
            };
            let status = bare.get(1).copied().unwrap_or("<status column>");
            for table in whole_reads(&plan) {
                warnings.push(format!(
                    "the {} candidate query reads table {table} whole: it needs an index on the \
                     columns behind autoapproval_request's (request_type, status, sort_time), \
                     e.g. CREATE INDEX CONCURRENTLY ON {table} {columns} WHERE {status} IN \
                     ('ING', 'PENDING', 'RETRY') (docs/INTEGRATING.md)",
                    request_type.as_str()
                ));
            }
            if let Some(behind) = &behind {
                for (table, kind, filter) in unserved_reads(&plan, &behind[..2]) {
                    warnings.push(format!(
                        "the {} candidate query reads table {table} through an index that does \
                         not hold its type and status ({kind}, the two left to its Filter: \
                         {filter}): it \
                         walks every request of the window, whatever its type and status; it \
                         needs an index on the columns behind autoapproval_request's \
                         (request_type, status, sort_time), e.g. CREATE INDEX CONCURRENTLY ON \
                         {table} {columns} WHERE {status} IN ('ING', 'PENDING', 'RETRY') \
                         (docs/INTEGRATING.md)",
                        request_type.as_str()
                    ));
                }
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

/// The Output of a verbose plan's top node: what each selected column is
/// in terms of the tables read.
fn outputs(plan: &serde_json::Value) -> Option<Vec<String>> {
    plan.get(0)?
        .get("Plan")?
        .get("Output")?
        .as_array()?
        .iter()
        .map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// The business tables a plan reads whole: a sequential scan, or an index
/// scan with no index condition (a full index walk).
pub(super) fn whole_reads(plan: &serde_json::Value) -> Vec<String> {
    let mut found = Vec::new();
    for (kind, table, fields) in scans(plan) {
        let whole = kind == "Seq Scan"
            || (matches!(kind, "Index Scan" | "Index Only Scan")
                && !fields.contains_key("Index Cond"));
        if whole && !found.iter().any(|t| t == table) {
            found.push(table.to_string());
        }
    }
    found.sort();
    found
}

/// The business tables a plan reads through an index that leaves one of
/// `columns` (as a verbose plan writes them) to the scan's Filter, with
/// the scan's kind and that Filter: the index does not narrow the read to
/// them.
fn unserved_reads(plan: &serde_json::Value, columns: &[String]) -> Vec<(String, String, String)> {
    let mut found: Vec<(String, String, String)> = Vec::new();
    for (kind, table, fields) in scans(plan) {
        if kind == "Seq Scan" {
            continue;
        }
        let Some(filter) = fields.get("Filter").and_then(|f| f.as_str()) else {
            continue;
        };
        if columns.iter().any(|c| mentions(filter, c)) && !found.iter().any(|(t, ..)| t == table) {
            found.push((table.to_owned(), kind.to_owned(), filter.to_owned()));
        }
    }
    found.sort();
    found
}

/// Whether `text` holds `term` where it stands alone (not inside a longer
/// name: `imr.status` is not in `imr.status_code`).
fn mentions(text: &str, term: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '"';
    text.match_indices(term).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + term.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// Each node of a plan that reads a business table: its kind, the table and
/// its fields.
fn scans(
    plan: &serde_json::Value,
) -> Vec<(&str, &str, &serde_json::Map<String, serde_json::Value>)> {
    let mut found = Vec::new();
    let mut stack = vec![plan];
    while let Some(node) = stack.pop() {
        match node {
            serde_json::Value::Array(items) => stack.extend(items),
            serde_json::Value::Object(fields) => {
                let kind = fields.get("Node Type").and_then(|v| v.as_str());
                let table = fields.get("Relation Name").and_then(|v| v.as_str());
                if let (Some(kind), Some(table)) = (kind, table)
                    && !ours(table)
                {
                    found.push((kind, table, fields));
                }
                stack.extend(fields.values());
            }
            _ => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::{mentions, unserved_reads, whole_reads};

    #[test]
    fn a_scan_leaving_the_type_or_status_to_its_filter_is_an_unserved_read() {
        let columns = ["imr.imr_type".to_owned(), "imr.status".to_owned()];
        // A bitmap walk of an index on sort_time alone.
        let plan = serde_json::json!([{"Plan": {"Node Type": "Limit", "Plans": [
            {"Node Type": "Bitmap Heap Scan", "Relation Name": "imr",
             "Recheck Cond": "(imr.sort_time >= $1)",
             "Filter": "((imr.status = ANY ('{ING,PENDING,RETRY}'::text[])) AND (imr.imr_type = 'OWNER_CONTRACT'::text))",
             "Plans": [{"Node Type": "Bitmap Index Scan", "Index Name": "imr_sort_time",
                        "Index Cond": "(imr.sort_time >= $1)"}]},
            {"Node Type": "Index Scan", "Relation Name": "auto_approve_state",
             "Filter": "(imr.status = 'x')"},
        ]}}]);
        assert_eq!(unserved_reads(&plan, &columns).len(), 1);
        assert_eq!(unserved_reads(&plan, &columns)[0].0, "imr");
        // The candidate index: type in its condition, status in its predicate, a
        // Filter on the target store only.
        let plan = serde_json::json!([{"Plan": {"Node Type": "Index Only Scan",
            "Relation Name": "imr", "Index Cond": "((imr.imr_type = 'AD_CONTRACT'::text) AND (imr.sort_time >= $1))",
            "Filter": "(imr.ad_shop_no IS NOT NULL)"}}]);
        assert!(unserved_reads(&plan, &columns).is_empty());
    }

    #[test]
    fn a_column_is_mentioned_only_where_it_stands_alone() {
        assert!(mentions("(imr.status = 'P')", "imr.status"));
        assert!(!mentions("(imr.status_code = 'P')", "imr.status"));
        assert!(!mentions("(ximr.status = 'P')", "imr.status"));
    }

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
