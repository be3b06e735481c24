//! The PostgreSQL backend: every capability of the store in PostgreSQL's
//! SQL, migrations in `migrations/postgres/`, wakes by LISTEN/NOTIFY.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{Postgres, Transaction};

use std::sync::Arc;

use super::codes::{Codes, Dialect, Statements};
use super::{DatabaseArgs, DbError, SessionArgs, connect};
use crate::vocabulary::Vocabulary;

mod candidates;
mod census;
mod claims;
mod layout;
mod ledger;
mod notify;
mod pause;
mod recovery;
mod retention;
mod rows;
mod schema;
mod shadow;
mod vocabulary;

pub use candidates::{FRESH_CANDIDATES, candidate_sql, fresh_candidates_sql};
pub use census::{BACKLOG_SQL, backlog_sql};
pub(crate) use notify::Listener;

/// The manual-approval functions of migration 0013, with their argument
/// types as a `GRANT EXECUTE ON FUNCTION` names them: the other service's
/// role needs these and nothing else (README: Working alongside people).
pub const MANUAL_FUNCTIONS: &str = "autoapproval_manual_claim(bigint, text), \
autoapproval_manual_heartbeat(bigint, text, bigint), \
autoapproval_manual_release(bigint, text, bigint), \
autoapproval_manual_decide(bigint, text, bigint, text, text)";

/// The fleet's brake of migration 0005 as `GRANT EXECUTE ON FUNCTION`
/// names it: pause, resume and read the pause (docs/DATABASE.md).
pub const FLEET_FUNCTIONS: &str = "autoapproval_pause_fleet(text, text), \
autoapproval_resume_fleet(text), autoapproval_fleet_pause()";

pub(super) fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> DbError {
    move |source| match source.as_database_error().and_then(|e| e.code()) {
        // lock_not_available: a NOWAIT lock (or lock_timeout) found the row held.
        Some(code) if code == "55P03" => DbError::RowLocked { operation },
        _ => DbError::Database { operation, source },
    }
}

/// The store on PostgreSQL: a primary pool and a read pool (a replica, or
/// the primary when none is configured).
#[derive(Clone, Debug)]
pub(crate) struct PgStore {
    primary: PgPool,
    read: PgPool,
    /// The read pool reaches a replica of its own (--read-database-url).
    separate_read: bool,
    /// Shadow mode: nothing is written to the business's tables (memos
    /// skipped, request and ledger writes refused).
    pub(super) shadow: bool,
    /// Every statement that names a code, rendered for the vocabulary.
    pub(super) statements: Statements,
}

/// Every template of the backend that holds a placeholder (`db::codes`).
fn templates() -> Vec<&'static str> {
    [
        candidates::TEMPLATES,
        census::TEMPLATES,
        claims::TEMPLATES,
        ledger::TEMPLATES,
        recovery::TEMPLATES,
        retention::TEMPLATES,
        rows::TEMPLATES,
    ]
    .concat()
}

/// The statements for a vocabulary.
fn statements(vocabulary: Arc<Vocabulary>) -> Statements {
    Statements::new(Codes::new(vocabulary, Dialect::Postgres), &templates())
}

/// The statements for our own words, rendered once per process.
pub(super) fn ours() -> &'static Statements {
    static OURS: std::sync::LazyLock<Statements> =
        std::sync::LazyLock::new(|| statements(Arc::default()));
    &OURS
}

impl PgStore {
    pub(super) fn new(primary: PgPool, read: PgPool) -> Self {
        Self {
            primary,
            read,
            separate_read: false,
            shadow: false,
            statements: ours().clone(),
        }
    }

    pub(super) fn with_vocabulary(mut self, vocabulary: Arc<Vocabulary>) -> Self {
        self.statements = statements(vocabulary);
        self
    }

    /// The statement rendered from `template` for this store's vocabulary.
    pub(super) fn sql(&self, template: &'static str) -> sqlx::SqlStr {
        self.statements.get(template)
    }

    /// Connects both pools; the read pool is the primary when no replica is
    /// set. Each database is reached once first, so a wrong host, port,
    /// password or name is reported at once with the driver's own words.
    pub(super) async fn connect(
        config: &DatabaseArgs,
        session: Option<&SessionArgs>,
    ) -> Result<Self, DbError> {
        let pool =
            |options| connect::pool_options(config.db_max_connections).connect_lazy_with(options);
        let limited = |options| match session {
            Some(session) => session.apply_to_postgres(options),
            None => options,
        };
        let primary = pool(limited(
            connect::reach("primary", PRIMARY_USES, &config.database_url).await?,
        ));
        let read = match &config.read_database_url {
            Some(url) => pool(limited(
                connect::reach("read replica", "candidate queries", url).await?,
            )),
            None => primary.clone(),
        };
        Ok(Self {
            primary,
            read,
            separate_read: config.read_database_url.is_some(),
            shadow: false,
            statements: ours().clone(),
        })
    }

    pub(super) fn dedicated(&self, connections: u32) -> PgStore {
        let pool = connect::pool_options(connections)
            .connect_lazy_with(self.primary.connect_options().as_ref().clone());
        PgStore {
            shadow: self.shadow,
            statements: self.statements.clone(),
            ..PgStore::new(pool.clone(), pool)
        }
    }

    pub(super) fn primary(&self) -> &PgPool {
        &self.primary
    }

    /// The read replica's pool, when it is not the primary's.
    pub(super) fn replica(&self) -> Option<&PgPool> {
        self.separate_read.then_some(&self.read)
    }

    async fn begin(&self, operation: &'static str) -> Result<Transaction<'_, Postgres>, DbError> {
        self.primary.begin().await.map_err(db(operation))
    }
}

/// What the primary's settings serve: every pool and connection made
/// from its options (`dedicated`, the listener) has the same TLS.
const PRIMARY_USES: &str =
    "re-reads, claims, writes, migrations, the Lease loop, the NOTIFY listener";

impl connect::SessionTls for sqlx::PgConnection {
    async fn session_tls(&mut self) -> Result<Option<(String, String)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT version, cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl",
        )
        .fetch_optional(self)
        .await
    }
}

impl SessionArgs {
    /// `options` with these limits set for every session they open.
    pub(super) fn apply_to_postgres(&self, options: PgConnectOptions) -> PgConnectOptions {
        let ms = |d: Duration| d.as_millis().to_string();
        options.options([
            ("lock_timeout", ms(self.db_lock_timeout)),
            ("statement_timeout", ms(self.db_statement_timeout)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every placeholder of every template is known: none is left in the
    /// statements, for our words or for codes.
    #[test]
    fn every_template_renders_without_a_placeholder_left() {
        let coded = Vocabulary::parse(
            "request_types: {OWNER_CONTRACT: 1, AD_CONTRACT: 2}
request_statuses: {ING: I, PENDING: P, RETRY: R, APPROVED: A, REJECTED: X, CANCELED: C}
econtract_statuses: {PENDING: 0, SIGNED: 2, REJECTED: 3}
flags: {yes: Y}",
        )
        .unwrap();
        for vocabulary in [Vocabulary::default(), coded] {
            let statements = statements(Arc::new(vocabulary));
            for template in templates() {
                let sql = statements.text(template).unwrap();
                assert!(
                    !sql.contains("{OPEN")
                        && !sql.contains("{STATUS")
                        && !sql.contains("{TYPE")
                        && !sql.contains("{ECONTRACT")
                        && !sql.contains("{FLAG")
                        && !sql.contains("{DECIDED"),
                    "{sql}"
                );
            }
        }
    }
}
