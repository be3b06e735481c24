//! The schema the controller runs on: its two migration sets, and what
//! `run` checks before it starts (the controller's migrations applied, the
//! binding to the business tables usable, its writes made for real in
//! transactions rolled back, the candidate index present).
//!
//! The controller set (`migrations/<db>/controller/`) creates only our own
//! objects; the reference set (`migrations/<db>/reference/`) is a business
//! schema for the demo, the lab and the tests, bound to the controller as
//! an integrator binds theirs (docs/INTEGRATING.md). Each set keeps its own
//! history table, and an applied migration this binary does not know is
//! ignored: an older binary starts on a newer schema, which is why every
//! migration only adds what the previous release tolerates (expand, then
//! contract in a later release).

use sqlx::migrate::{Migration, Migrator};

use super::DbError;

/// One of the two migration sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrationSet {
    /// The controller's own tables, functions and wake routines.
    Controller,
    /// The reference business schema and its binding.
    Reference,
}

impl MigrationSet {
    /// The sets `migrate` applies, in order: the reference schema is bound
    /// through the controller's routines, so it comes second.
    pub fn chosen(reference_schema: bool) -> &'static [MigrationSet] {
        if reference_schema {
            &[MigrationSet::Controller, MigrationSet::Reference]
        } else {
            &[MigrationSet::Controller]
        }
    }

    /// The set's history table.
    pub fn history_table(self) -> &'static str {
        match self {
            MigrationSet::Controller => "_autoapproval_migrations",
            MigrationSet::Reference => "_autoapproval_reference_migrations",
        }
    }

    /// The set as the messages name it.
    pub fn name(self) -> &'static str {
        match self {
            MigrationSet::Controller => "controller",
            MigrationSet::Reference => "reference schema",
        }
    }
}

/// A migrator over `migrator`'s files that keeps its history in the set's
/// table and ignores applied migrations it does not know (a newer binary's).
pub(super) fn configured(mut migrator: Migrator, set: MigrationSet) -> Migrator {
    migrator.dangerous_set_table_name(set.history_table());
    migrator.set_ignore_missing(true);
    migrator
}

/// A migration as messages name it: `0001 (controller objects)`.
pub(super) fn label(migration: &Migration) -> String {
    format!("{:04} ({})", migration.version, migration.description)
}

/// The migrations of `migrator` not among `applied`.
pub(super) fn pending<'a>(migrator: &'a Migrator, applied: &[i64]) -> Vec<&'a Migration> {
    migrator
        .iter()
        .filter(|m| m.migration_type.is_up_migration() && !applied.contains(&m.version))
        .collect()
}

/// How a dialect writes the script `migrate --print-sql` prints.
pub(super) struct Script {
    /// The history table's DDL, `{table}` standing for its name (sqlx's own).
    pub history_ddl: &'static str,
    /// A byte string literal of the checksum.
    pub checksum: fn(&[u8]) -> String,
    /// Wraps one migration's text so the dialect's client runs it whole.
    pub wrap: fn(&str, bool) -> String,
}

/// The SQL that applying `pending` of `set` would run, with the history
/// rows sqlx would write, for a DBA who applies DDL by hand.
pub(super) fn script(set: MigrationSet, pending: &[&Migration], dialect: &Script) -> String {
    let table = set.history_table();
    let mut out = format!(
        "-- autoapproval {} migrations ({})\n",
        set.name(),
        if pending.is_empty() {
            "none pending".to_string()
        } else {
            pending
                .iter()
                .map(|m| label(m))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    if pending.is_empty() {
        return out;
    }
    out.push_str(&dialect.history_ddl.replace("{table}", table));
    out.push('\n');
    for m in pending {
        let record = format!(
            "INSERT INTO {table} (version, description, success, checksum, execution_time) \
             VALUES ({}, '{}', TRUE, {}, -1);",
            m.version,
            m.description.replace('\'', "''"),
            (dialect.checksum)(&m.checksum),
        );
        out.push_str(&format!("\n-- {}\n", label(m)));
        out.push_str(&(dialect.wrap)(
            &format!("{}\n{record}", m.sql.as_str().trim_end()),
            m.no_tx,
        ));
    }
    out
}

/// The hexadecimal digits of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What `run` found wrong with the schema, or would warn about.
#[derive(Debug, Default)]
pub struct SchemaReport {
    /// Controller migrations this binary needs that are not applied.
    pub missing: Vec<String>,
    /// Parts of the binding the controller's role cannot use, each naming
    /// the view, column or grant, with the database's own words.
    pub binding: Vec<String>,
    /// Warnings: a candidate query reading a business table whole, no wake
    /// trigger attached.
    pub warnings: Vec<String>,
    /// The run-time writes start-up could not try (no request row yet, a
    /// lock the business holds), each saying why; logged at INFO.
    pub unprobed: Vec<String>,
}

impl SchemaReport {
    /// The report as the error that stops start-up, if anything is missing.
    pub fn into_result(self) -> Result<Vec<String>, DbError> {
        if !self.missing.is_empty() {
            return Err(DbError::SchemaBehind {
                missing: self.missing.join(", "),
            });
        }
        if !self.binding.is_empty() {
            return Err(DbError::Binding {
                problems: self.binding.join("; "),
            });
        }
        Ok(self.warnings)
    }
}

/// One statement that uses a part of the binding as the controller does,
/// changing nothing, and what it needs.
pub(super) struct Probe {
    /// What the statement needs: "SELECT on autoapproval_request (every column)".
    pub needs: &'static str,
    /// The statement.
    pub sql: &'static str,
}

/// The uses of the binding both dialects write alike: each reads or
/// updates as the controller does and changes nothing (privileges and
/// columns are checked before a row is read). The inserts, which the
/// dialects write differently, are each backend's.
pub(super) const READ_AND_UPDATE_PROBES: &[Probe] = &[
    Probe {
        needs: "SELECT on autoapproval_request with every column of the contract",
        sql: "SELECT id, request_type, status, sort_time, created_at, updated_at, business_name,
                     documents_released, operational_hold, menu_registered, logo_registered,
                     previous_step_approved, econtract_ref, target_store_number, owner_number,
                     store_number, campaign_id, decided_at, decided_by
                FROM autoapproval_request LIMIT 0",
    },
    Probe {
        needs: "UPDATE on autoapproval_request (status, updated_at, owner_number, store_number, \
                campaign_id, decided_at, decided_by)",
        sql: "UPDATE autoapproval_request SET status = status, updated_at = updated_at, \
              owner_number = owner_number, store_number = store_number, campaign_id = campaign_id, \
              decided_at = decided_at, decided_by = decided_by WHERE FALSE",
    },
    Probe {
        needs: "SELECT on autoapproval_econtract (contract_ref, status, synced_at)",
        sql: "SELECT contract_ref, status, synced_at FROM autoapproval_econtract LIMIT 0",
    },
    Probe {
        needs: "SELECT on auto_approve_fleet_pause (the fleet's brake, which every claim reads; \
                granted with the controller's other tables)",
        sql: "SELECT paused_by, reason, paused_at FROM auto_approve_fleet_pause LIMIT 0",
    },
    Probe {
        needs: "SELECT on autoapproval_request_memo (id, request_id, created_at, author, message)",
        sql: "SELECT id, request_id, created_at, author, message FROM autoapproval_request_memo LIMIT 0",
    },
];

/// A write of `run`'s that start-up makes for real, in a transaction it
/// rolls back: what a grant does not show (a column default drawing from a
/// sequence, a trigger of the business's, the upsert's conflict target)
/// shows only when the statement runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Write {
    /// A memo (a wait, a recovery), with the table's own defaults.
    Memo,
    /// The e-contract sync, an upsert on contract_ref.
    Upsert,
    /// A request's update through its view, firing the table's triggers.
    Request,
}

impl Write {
    /// The view the write goes through.
    pub(super) fn view(self) -> &'static str {
        match self {
            Write::Memo => "autoapproval_request_memo",
            Write::Upsert => "autoapproval_econtract",
            Write::Request => "autoapproval_request",
        }
    }

    /// The write as the messages name it.
    pub(super) fn what(self) -> &'static str {
        match self {
            Write::Memo => "the memo insert (INSERT INTO autoapproval_request_memo)",
            Write::Upsert => {
                "the e-contract upsert (INSERT INTO autoapproval_econtract … on contract_ref)"
            }
            Write::Request => "the update of a request (UPDATE autoapproval_request)",
        }
    }

    /// The trigger event the write fires on the table behind its view.
    pub(super) fn event(self) -> &'static str {
        match self {
            Write::Memo | Write::Upsert => "INSERT",
            Write::Request => "UPDATE",
        }
    }
}

/// What one rolled-back write found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Probed {
    /// It went through.
    Passed,
    /// It was refused: the message names the object, the grant or the
    /// trigger, and the fix; start-up stops.
    Refused(String),
    /// It could not be tried (no row, a lock the business holds): a warning.
    Unprobed(String),
}

/// What the rolled-back writes found: refusals stop start-up, the rest warns.
#[derive(Debug, Default)]
pub struct WriteProbes {
    /// Each write refused, named with its fix.
    pub refused: Vec<String>,
    /// Each write that could not be tried, and why.
    pub unprobed: Vec<String>,
}

impl WriteProbes {
    /// Records what one write found.
    pub(super) fn add(&mut self, probed: Probed) {
        match probed {
            Probed::Passed => {}
            Probed::Refused(said) => self.refused.push(said),
            Probed::Unprobed(said) => self.unprobed.push(said),
        }
    }
}

/// The note for a request update that had no row to try: row triggers
/// fire only on a row, and start-up never makes one up in the business's
/// table.
pub(super) fn no_request_row() -> Probed {
    Probed::Unprobed(format!(
        "{} was not probed: autoapproval_request has no row this role could lock without \
         waiting (none yet, or every one held by the business system), so a trigger on the \
         table behind it that fails as the controller's role would show only at the first \
         approval; `autoapproval check` probes it once there is a request",
        Write::Request.what()
    ))
}

/// The note for a write that waited on a lock the business holds: start-up
/// waits a second at most (guarantee 1), and tries again next time.
pub(super) fn waited(write: Write, said: &str) -> Probed {
    Probed::Unprobed(format!(
        "{} was not probed: it waited on a lock the business system holds ({said}); \
         `autoapproval check` probes it again",
        write.what()
    ))
}

/// The refusal of a write whose column default draws from a sequence the
/// controller's role may not use: defaults run as the writer, not as the
/// view's owner, so an IDENTITY column needs no grant and a `bigserial`
/// or `DEFAULT NEXTVAL` one does.
pub(super) fn sequence_refused(
    write: Write,
    sequence: &str,
    role: &str,
    grant: &str,
    said: &str,
) -> Probed {
    Probed::Refused(format!(
        "{} through {} runs the default of a column of the table behind it, which draws from \
         sequence {sequence}, as the controller's role {role}, and the role may not use that \
         sequence ({said}): as the sequence's owner, {grant}",
        write.what(),
        write.view()
    ))
}

/// The refusal of a write by the table behind a view that is not a plain
/// column rename of one table.
pub(super) fn not_a_rename(write: Write, how: &str, said: &str) -> Probed {
    Probed::Refused(format!(
        "{} cannot go through {}: {how} ({said}); make {} a plain column rename of one table \
         (each column of ours a column of yours, no expression, no trigger on the view)",
        write.what(),
        write.view(),
        write.view()
    ))
}

/// The grant that fixes a PostgreSQL `permission denied for <kind> <name>`
/// raised inside a trigger function, if the message names one.
pub(super) fn pg_grant_for(said: &str, role: &str) -> Option<String> {
    let rest = said.strip_prefix("permission denied for ")?;
    let (kind, name) = rest.split_once(' ')?;
    let right = match kind {
        "schema" => "USAGE ON SCHEMA",
        "sequence" => "USAGE ON SEQUENCE",
        "table" | "view" => "SELECT (or the right its statement needs) ON",
        "function" => "EXECUTE ON FUNCTION",
        _ => return None,
    };
    Some(format!("GRANT {right} {name} TO {role}"))
}

/// The functions a PostgreSQL error context names (`PL/pgSQL function
/// biz.audit() line 3 at PERFORM`, `SQL function "audit" statement 1`),
/// without schema or arguments.
pub(super) fn pg_functions_in(context: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in context.lines() {
        let name = if let Some(at) = line.find("PL/pgSQL function ") {
            let rest = &line[at + "PL/pgSQL function ".len()..];
            rest.split('(').next()
        } else if let Some(at) = line.find("SQL function \"") {
            let rest = &line[at + "SQL function \"".len()..];
            rest.split('"').next()
        } else {
            None
        };
        if let Some(name) = name {
            let bare = name.rsplit('.').next().unwrap_or(name).trim_matches('"');
            if !bare.is_empty() && !found.iter().any(|f| f == bare) {
                found.push(bare.to_owned());
            }
        }
    }
    found
}

/// A trigger on a table behind one of our views, as the catalog lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TableTrigger {
    /// The table, as the database names it.
    pub table: String,
    /// The trigger's name.
    pub name: String,
    /// Its function with its arguments (PostgreSQL), as ALTER FUNCTION takes it.
    pub function: String,
    /// The function's bare name, as an error context names it.
    pub function_name: String,
}

/// The refusal of a write by a trigger function of the business's that
/// runs as the writer (PostgreSQL's default, SECURITY INVOKER): the trigger
/// the error context names when one of `triggers` matches it, else all of
/// them.
pub(super) fn pg_trigger_refused(
    write: Write,
    triggers: &[TableTrigger],
    context: &str,
    role: &str,
    said: &str,
) -> Probed {
    let named = pg_functions_in(context);
    let culprit = triggers.iter().find(|t| named.contains(&t.function_name));
    let first = context.lines().last().unwrap_or(context);
    let grant = pg_grant_for(said, role)
        .unwrap_or_else(|| format!("grant {role} the right the message names"));
    let (which, function) = match culprit {
        Some(t) => (
            format!(
                "trigger {} on {}, whose function {}",
                t.name, t.table, t.function
            ),
            t.function.clone(),
        ),
        None if triggers.is_empty() => (
            format!("a function ({first})"),
            named
                .first()
                .cloned()
                .unwrap_or_else(|| "<function>".to_owned()),
        ),
        None => (
            format!(
                "one of the triggers on {} ({}), whose function",
                triggers[0].table,
                triggers
                    .iter()
                    .map(|t| format!("{} calls {}", t.name, t.function))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "<function>".to_owned(),
        ),
    };
    Probed::Refused(format!(
        "{} through {} fires {which} runs as the controller's role {role} and was refused: \
         {said} (PostgreSQL's context: {first}); as the function's owner, make it run as its \
         owner (ALTER FUNCTION {function} SECURITY DEFINER SET search_path = <its schemas>), \
         or {grant}",
        write.what(),
        write.view()
    ))
}

/// The wake triggers found, by kind, and the warnings they call for. A
/// trigger only makes a change seen sooner: the completion re-checks the
/// facts the gates passed on (`Database::complete`), with or without one,
/// so its absence costs latency, never a wrong approval, and only warns.
pub(super) fn wake_warnings(requests: i64, econtracts: i64, how: &str) -> Vec<String> {
    let mut warnings = Vec::new();
    if requests == 0 {
        warnings.push(format!(
            "no wake trigger calls autoapproval_request_changed ({how}): \
             a new or changed request is seen only at the next poll (--poll-period), and a \
             waiting one waits out its retry interval; approvals are unaffected (each \
             re-checks its request's facts when it is written)"
        ));
    }
    if econtracts == 0 {
        warnings.push(format!(
            "no wake trigger calls autoapproval_econtract_changed ({how}): \
             a request waiting for its e-contract waits out its retry interval after the \
             signature; approvals are unaffected (each re-checks the ledger when it is written)"
        ));
    }
    warnings
}

interface! {
    /// What start-up checks of the schema, and the migrations themselves.
    trait Schema {
        /// Applies the set's pending migrations; a no-op when none is.
        #[tracing::instrument(name = "store.migrate", skip_all)]
        fn migrate_set(&self, set: MigrationSet) -> Result<(), DbError>;
        /// The SQL applying the set's pending migrations would run.
        fn pending_sql(&self, set: MigrationSet) -> Result<String, DbError>;
        /// The controller migrations this binary needs that are not applied.
        fn missing_migrations(&self) -> Result<Vec<String>, DbError>;
        /// Each use of the binding the controller's role cannot make.
        fn binding_problems(&self) -> Result<Vec<String>, DbError>;
        /// The run-time writes, each made for real in a transaction rolled back.
        fn write_probes(&self) -> Result<WriteProbes, DbError>;
        /// Warnings about candidate queries that would read a business table whole.
        fn candidate_scans(&self) -> Result<Vec<String>, DbError>;
        /// Warnings about wake triggers that are not attached.
        fn trigger_warnings(&self) -> Result<Vec<String>, DbError>;
    }
}

/// The labels of the migrations of `migrator` not in `applied` (all of
/// them when the history table is missing).
pub(super) fn missing(migrator: &Migrator, applied: Option<Vec<i64>>) -> Vec<String> {
    pending(migrator, &applied.unwrap_or_default())
        .into_iter()
        .map(label)
        .collect()
}

/// Runs the shared probes, then the backend's `inserts`, on `pool`, and
/// names what each refused one needs with the database's own words.
pub(super) async fn run_probes<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    inserts: &[Probe],
) -> Result<Vec<String>, DbError>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let mut problems = Vec::new();
    for probe in READ_AND_UPDATE_PROBES.iter().chain(inserts) {
        if let Err(e) = sqlx::query::<DB>(probe.sql).execute(pool).await {
            let Some(e) = e.as_database_error() else {
                return Err(DbError::Database {
                    operation: "probing the binding",
                    source: e,
                });
            };
            problems.push(format!("{} needed: {}", probe.needs, e.message()));
        }
    }
    Ok(problems)
}

impl super::Database {
    /// Applies the sets `migrate` was asked for, in order.
    pub async fn migrate(&self, reference_schema: bool) -> Result<(), DbError> {
        for set in MigrationSet::chosen(reference_schema) {
            self.migrate_set(*set).await?;
        }
        self.store_vocabulary().await
    }

    /// The SQL `migrate` would run for the sets asked for, without running it.
    pub async fn migration_script(&self, reference_schema: bool) -> Result<String, DbError> {
        let mut out = String::new();
        for set in MigrationSet::chosen(reference_schema) {
            out.push_str(&self.pending_sql(*set).await?);
        }
        Ok(out)
    }

    /// What is wrong with the schema for `run`, and what to warn about; a
    /// later check is skipped when an earlier one failed.
    pub async fn schema_report(&self) -> Result<SchemaReport, DbError> {
        let mut report = SchemaReport {
            missing: self.missing_migrations().await?,
            ..SchemaReport::default()
        };
        if report.missing.is_empty() {
            report.binding = self.binding_problems().await?;
        }
        // The real writes only once the grants are there: a missing grant
        // is named better by the probes above.
        if report.missing.is_empty() && report.binding.is_empty() {
            let writes = self.write_probes().await?;
            report.binding = writes.refused;
            report.unprobed = writes.unprobed;
        }
        if report.missing.is_empty() && report.binding.is_empty() {
            report.warnings.extend(self.candidate_scans().await?);
            report.warnings.extend(self.trigger_warnings().await?);
        }
        Ok(report)
    }

    /// Stops start-up when the schema lacks a controller migration this
    /// binary needs or the binding is unusable; returns the warnings.
    pub async fn check_schema(&self) -> Result<Vec<String>, DbError> {
        // The vocabulary first: its refusals name a code or a view's
        // expression where the binding's probes would give the database's words.
        if self.missing_migrations().await?.is_empty() {
            self.check_vocabulary().await?;
        }
        let report = self.schema_report().await?;
        // An empty request table is a fresh install's: said, not warned of.
        for note in &report.unprobed {
            tracing::info!(%note, "schema");
        }
        report.into_result()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_functions_of_an_error_context_are_read_without_schema_or_arguments() {
        let context = "SQL statement \"INSERT INTO biz.audit VALUES (1)\"\n\
                       PL/pgSQL function biz.imr_audit() line 3 at SQL statement\n\
                       SQL function \"helper\" statement 1";
        assert_eq!(pg_functions_in(context), ["imr_audit", "helper"]);
        assert!(pg_functions_in("").is_empty());
    }

    #[test]
    fn a_permission_refused_inside_a_trigger_is_given_its_grant() {
        assert_eq!(
            pg_grant_for("permission denied for schema biz", "ctl").as_deref(),
            Some("GRANT USAGE ON SCHEMA biz TO ctl")
        );
        assert_eq!(
            pg_grant_for("permission denied for sequence s", "ctl").as_deref(),
            Some("GRANT USAGE ON SEQUENCE s TO ctl")
        );
        assert_eq!(pg_grant_for("division by zero", "ctl"), None);
    }

    #[test]
    fn a_trigger_refusal_names_the_trigger_its_function_and_the_fix_not_the_servers_line() {
        let triggers = [
            TableTrigger {
                table: "imr".into(),
                name: "imr_stamp".into(),
                function: "imr_stamp()".into(),
                function_name: "imr_stamp".into(),
            },
            TableTrigger {
                table: "imr".into(),
                name: "imr_audited".into(),
                function: "biz.imr_audit()".into(),
                function_name: "imr_audit".into(),
            },
        ];
        let Probed::Refused(said) = pg_trigger_refused(
            Write::Request,
            &triggers,
            "PL/pgSQL function biz.imr_audit() line 3 at SQL statement",
            "ctl",
            "permission denied for schema biz",
        ) else {
            panic!("refused");
        };
        for named in [
            "trigger imr_audited on imr",
            "biz.imr_audit()",
            "ALTER FUNCTION biz.imr_audit() SECURITY DEFINER",
            "GRANT USAGE ON SCHEMA biz TO ctl",
            "line 3",
        ] {
            assert!(said.contains(named), "{named}: {said}");
        }
        assert!(!said.contains("imr_stamp"), "{said}");
        // No trigger matched by name: every trigger of the table is listed.
        let Probed::Refused(said) = pg_trigger_refused(
            Write::Request,
            &triggers,
            "PL/pgSQL function biz.other() line 1 at PERFORM",
            "ctl",
            "permission denied for table t",
        ) else {
            panic!("refused");
        };
        assert!(said.contains("imr_stamp calls imr_stamp()") && said.contains("imr_audited"));
    }
}
