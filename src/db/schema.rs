//! The schema the controller runs on: its two migration sets, and what
//! `run` checks before it starts (the controller's migrations applied, the
//! binding to the business tables usable, the candidate index present).
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
        self.schema_report().await?.into_result()
    }
}
