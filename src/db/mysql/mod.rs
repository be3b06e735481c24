//! The MySQL 8 / MariaDB backend: the same methods and guarantees as the
//! PostgreSQL store, each with its own SQL next to it. Written for MySQL 8.0
//! and MariaDB 10.6 alike; each difference from PostgreSQL is commented
//! where it is handled, and those between MySQL 8 and MariaDB are listed in
//! the README (MySQL 8 and MariaDB).
//!
//! Two rules hold for every statement here:
//! * InnoDB locks the rows a locking statement scans, not those it returns
//!   (the seed's warning): every statement that takes a lock reaches its
//!   rows by primary or unique key, never by a range. Ranges are read
//!   without locks, and what they found is then written by key.
//! * Our sessions run READ COMMITTED: each statement sees what was committed
//!   before it (as on PostgreSQL), and InnoDB takes no gap locks, so an
//!   insert of the business system never waits on a gap we read.

use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool};
use sqlx::{Executor, MySql, Transaction};

use super::codes::{Codes, Dialect, Statements};
use super::{DatabaseArgs, DbError, SessionArgs, connect};

/// `$query` with each of `$values` bound in order: the values of an
/// `IN (…)` list of [`placeholders`].
macro_rules! bind_all {
    ($query:expr, $values:expr) => {{
        let mut query = $query;
        for value in $values {
            query = query.bind(value);
        }
        query
    }};
}

mod candidates;
mod census;
mod claims;
mod layout;
mod ledger;
mod naming;
mod notify;
mod pause;
mod recovery;
mod retention;
mod rows;
mod schema;
mod shadow;
mod vocabulary;
mod wake_cursor;

pub use candidates::{candidate_sql, candidates_among_sql, fresh_candidates_sql};
pub(crate) use notify::MysqlRequestChanges;
use wake_cursor::WakeCursor;

/// The wake poller's interval when the store is made over pools (the
/// flag's default).
const DEFAULT_WAKE_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The store on MySQL 8 or MariaDB.
#[derive(Clone, Debug)]
pub(crate) struct MysqlStore {
    primary: MySqlPool,
    read: MySqlPool,
    /// The read pool reaches a replica of its own.
    separate_read: bool,
    /// How far this process's wake poller has read: `apply_wakes` consumes
    /// no row it has not seen (shared by clones and `dedicated` stores).
    wakes: Arc<WakeCursor>,
    /// The wake poller's interval.
    poll_interval: Duration,
    /// The lock wait and statement limits of `run`'s sessions (`None`:
    /// the server's), which `dedicated` pools set as well.
    limits: Option<Limits>,
    /// Shadow mode: nothing is written to the business's tables (memos
    /// skipped, request and ledger writes refused).
    pub(super) shadow: bool,
    /// The statements that name a code, rendered for the vocabulary.
    pub(super) statements: Statements,
}

/// Every template of the backend that holds a placeholder (`db::codes`);
/// the statements built per call (a list's placeholders, a shard filter)
/// are rendered as they are built (`MysqlStore::render`).
const TEMPLATES: [&str; 11] = [
    crate::db::rows::request_sql!("?"),
    crate::db::rows::request_with_state_sql!("?"),
    ledger::ECONTRACT_STATUS,
    ledger::SYNC_ECONTRACT,
    claims::CLAIM_NEW,
    claims::WHY_REFUSED,
    claims::LOCK_FACTS,
    claims::LOCK_LEDGER,
    claims::APPROVE,
    recovery::FINISHED,
    recovery::FORGET_CLOSED,
];

/// The statements for our own words, rendered once per process.
fn ours() -> &'static Statements {
    static OURS: std::sync::LazyLock<Statements> = std::sync::LazyLock::new(|| {
        Statements::new(Codes::new(Arc::default(), Dialect::Mysql), &TEMPLATES)
    });
    &OURS
}

/// A session's lock wait and statement limits (`SessionArgs`).
type Limits = (Duration, Duration);

/// Whether the server is MariaDB or MySQL: the few statements that differ
/// (README: MySQL 8 and MariaDB) ask this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// MariaDB (10.6 and later).
    MariaDb,
    /// MySQL (8.0 and later).
    MySql,
}

// === impl MysqlStore ===

impl MysqlStore {
    pub(super) fn new(primary: MySqlPool, read: MySqlPool) -> Self {
        Self {
            primary,
            read,
            separate_read: false,
            wakes: Arc::new(WakeCursor::default()),
            poll_interval: DEFAULT_WAKE_POLL_INTERVAL,
            limits: None,
            shadow: false,
            statements: ours().clone(),
        }
    }

    /// The statement rendered from `template` for this store's vocabulary.
    pub(super) fn sql(&self, template: &'static str) -> sqlx::SqlStr {
        self.statements.get(template)
    }

    /// A statement built per call (`template` holds placeholders of
    /// `db::codes`), rendered for this store's vocabulary.
    pub(super) fn render(&self, template: &str) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(self.statements.codes().render(template))
    }

    /// This store with its statements rendered for `vocabulary`.
    pub(super) fn with_vocabulary(
        mut self,
        vocabulary: Arc<crate::vocabulary::Vocabulary>,
    ) -> Result<Self, DbError> {
        self.statements = Statements::new(Codes::new(vocabulary, Dialect::Mysql), &TEMPLATES);
        Ok(self)
    }

    pub(super) fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Connects to the primary (and the read replica for the candidate
    /// queries, when set), reaching each once first so a wrong address is
    /// reported at once.
    pub(super) async fn connect(
        config: &DatabaseArgs,
        session: Option<&SessionArgs>,
    ) -> Result<Self, DbError> {
        let max = config.db_max_connections;
        let primary = pool(
            connect::reach("primary", PRIMARY_USES, &config.database_url).await?,
            max,
            session,
        );
        let read = match &config.read_database_url {
            Some(url) => pool(
                connect::reach("read replica", "candidate queries", url).await?,
                max,
                session,
            ),
            None => primary.clone(),
        };
        let mut store = Self::new(primary, read).with_poll_interval(config.wake_poll_interval);
        store.separate_read = config.read_database_url.is_some();
        store.limits = session.map(limits_of);
        Ok(store)
    }

    /// Sessions set as this store's: the Lease loop's fence must give up
    /// on a held row after the lock wait, as the chains' statements do, not
    /// after InnoDB's 50 s. The wake cursor is shared.
    pub(super) fn dedicated(&self, connections: u32) -> MysqlStore {
        let options = self.primary.connect_options().as_ref().clone();
        let pool = limited_pool(options, connections, self.limits);
        MysqlStore {
            primary: pool.clone(),
            read: pool,
            separate_read: false,
            wakes: Arc::clone(&self.wakes),
            poll_interval: self.poll_interval,
            limits: self.limits,
            statements: self.statements.clone(),
            shadow: self.shadow,
        }
    }

    pub(super) fn primary(&self) -> &MySqlPool {
        &self.primary
    }

    /// The read replica's pool, when it is not the primary's.
    pub(super) fn replica(&self) -> Option<&MySqlPool> {
        self.separate_read.then_some(&self.read)
    }

    async fn begin(&self, operation: &'static str) -> Result<Transaction<'_, MySql>, DbError> {
        self.primary.begin().await.map_err(db(operation))
    }
}

/// What the primary's settings serve: every pool made from its options
/// (`dedicated`) has the same TLS.
const PRIMARY_USES: &str = "re-reads, claims, writes, migrations, the Lease loop, the wake poller";

impl connect::SessionTls for sqlx::MySqlConnection {
    async fn session_tls(&mut self) -> Result<Option<(String, String)>, sqlx::Error> {
        // Empty values on a plaintext session; MySQL 8 and MariaDB alike.
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SHOW SESSION STATUS WHERE Variable_name IN ('Ssl_version', 'Ssl_cipher')",
        )
        .fetch_all(self)
        .await?;
        let value = |name: &str| {
            rows.iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
                .filter(|v| !v.is_empty())
        };
        Ok(value("Ssl_version").zip(value("Ssl_cipher")))
    }
}

/// A lazily connecting pool whose sessions are set as our SQL expects:
/// READ COMMITTED (see the module doc), the time zone UTC (sqlx sets
/// it: DATETIME columns hold UTC), and the lock and statement limits.
pub fn pool(
    options: MySqlConnectOptions,
    max_connections: u32,
    session: Option<&SessionArgs>,
) -> MySqlPool {
    limited_pool(options, max_connections, session.map(limits_of))
}

/// [`pool`] with the limits as the store keeps them.
fn limited_pool(
    options: MySqlConnectOptions,
    max_connections: u32,
    limits: Option<Limits>,
) -> MySqlPool {
    connect::pool_options::<MySql>(max_connections)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                // `SET SESSION TRANSACTION ISOLATION LEVEL` is the one
                // spelling both accept: the variable is tx_isolation on
                // MariaDB before 11.1, transaction_isolation on MySQL 8.
                conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await?;
                if let Some((lock, statement)) = limits {
                    let flavour = flavour_of(&mut *conn).await?;
                    for sql in session_limits(flavour, lock, statement) {
                        conn.execute(sqlx::AssertSqlSafe(sql)).await?;
                    }
                }
                Ok(())
            })
        })
        .connect_lazy_with(options)
}

/// MariaDB or MySQL, from the server's version string.
pub async fn flavour_of(conn: &mut sqlx::MySqlConnection) -> Result<Flavour, sqlx::Error> {
    let (version,): (String,) = sqlx::query_as("SELECT VERSION()").fetch_one(conn).await?;
    Ok(if version.contains("MariaDB") {
        Flavour::MariaDb
    } else {
        Flavour::MySql
    })
}

fn limits_of(session: &SessionArgs) -> Limits {
    (session.db_lock_timeout, session.db_statement_timeout)
}

/// The statements setting a session's lock wait and statement limits; 0
/// means no limit. They differ (README: MySQL 8 and MariaDB):
/// innodb_lock_wait_timeout is whole seconds on both (at least 1);
/// MariaDB's max_statement_time is seconds and covers every statement,
/// MySQL's max_execution_time is milliseconds and covers SELECTs only.
fn session_limits(flavour: Flavour, lock: Duration, statement: Duration) -> Vec<String> {
    let mut sql = Vec::new();
    if !lock.is_zero() {
        let seconds = lock.as_secs_f64().ceil().max(1.0) as u64;
        sql.push(format!("SET SESSION innodb_lock_wait_timeout = {seconds}"));
    }
    if !statement.is_zero() {
        sql.push(match flavour {
            Flavour::MariaDb => format!(
                "SET SESSION max_statement_time = {}",
                statement.as_secs_f64()
            ),
            Flavour::MySql => format!("SET SESSION max_execution_time = {}", statement.as_millis()),
        });
    }
    sql
}

/// Maps a driver error; a lock we did not wait for is `RowLocked`.
pub(super) fn db(operation: &'static str) -> impl FnOnce(sqlx::Error) -> DbError {
    move |source| {
        let number = source
            .as_database_error()
            .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
            .map(|e| e.number());
        match number {
            // NOWAIT found the row locked: MySQL 8 says 3572
            // (ER_LOCK_NOWAIT), MariaDB 1205 (its NOWAIT is a lock wait
            // timeout of 0), and 1205 is also innodb_lock_wait_timeout.
            Some(3572 | 1205) => DbError::RowLocked { operation },
            _ => DbError::Database { operation, source },
        }
    }
}

/// Ends a transaction that wrote nothing, at once, and answers `value`: a
/// dropped transaction is rolled back only when its connection is next
/// used, and keeps its row locks until then.
async fn give_up<T>(
    tx: Transaction<'_, MySql>,
    operation: &'static str,
    value: T,
) -> Result<T, DbError> {
    tx.rollback().await.map_err(db(operation))?;
    Ok(value)
}

/// Most values one statement binds from a caller's list. The protocol
/// numbers a prepared statement's placeholders in 16 bits, so one with more
/// than 65,535 fails whole (at 65,536 cached CRs the garbage collector's
/// every pass did): a longer list is sent in statements of this many,
/// leaving room for the statement's other parameters.
const CHUNK: usize = 10_000;

/// `n` comma-separated placeholders: MySQL has no array parameters, so a
/// list is bound value by value (`= ANY($1)` on PostgreSQL), at most
/// [`CHUNK`] of them per statement.
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every placeholder of every statement is known: none is left, for
    /// our words or for codes, the statements built per call included.
    #[test]
    fn every_template_renders_without_a_placeholder_left() {
        use crate::domain::RequestType;
        let coded = crate::vocabulary::Vocabulary::parse(
            "request_types: {OWNER_CONTRACT: 1, AD_CONTRACT: 2}
request_statuses: {ING: I, PENDING: P, RETRY: R, APPROVED: A, REJECTED: X, CANCELED: C}
econtract_statuses: {PENDING: 0, SIGNED: 2, REJECTED: 3}
flags: {yes: Y}",
        )
        .unwrap();
        let mut built = vec![
            candidates::candidates_among_template(3),
            census::backlog_sql(),
            retention::STILL_NEEDED.to_owned(),
        ];
        for t in [RequestType::OwnerContract, RequestType::AdContract] {
            built.push(candidates::candidate_template(t, 2).unwrap());
            built.push(candidates::fresh_candidates_template(t, 0).unwrap());
        }
        for vocabulary in [crate::vocabulary::Vocabulary::default(), coded] {
            let codes = Codes::new(Arc::new(vocabulary), Dialect::Mysql);
            let statements = Statements::new(codes.clone(), &TEMPLATES);
            let rendered = TEMPLATES
                .iter()
                .map(|t| statements.text(t).unwrap().to_owned())
                .chain(built.iter().map(|t| codes.render(t)));
            for sql in rendered {
                assert!(
                    ![
                        "{OPEN",
                        "{STATUS",
                        "{TYPE",
                        "{ECONTRACT",
                        "{FLAG",
                        "{DECIDED"
                    ]
                    .iter()
                    .any(|p| sql.contains(p)),
                    "{sql}"
                );
            }
        }
        // Our own words render to the statements as they were.
        assert!(
            candidates::candidate_sql(RequestType::AdContract, 0)
                .unwrap()
                .contains("r.request_type = 'AD_CONTRACT'\n      AND r.status = 'ING'")
        );
    }

    #[test]
    fn placeholders_list_one_per_value() {
        assert_eq!(placeholders(3), "?, ?, ?");
        assert_eq!(placeholders(1), "?");
    }

    #[test]
    fn the_session_limits_differ_by_flavour() {
        let lock = Duration::from_millis(1500);
        let statement = Duration::from_secs(30);
        assert_eq!(
            session_limits(Flavour::MariaDb, lock, statement),
            [
                "SET SESSION innodb_lock_wait_timeout = 2",
                "SET SESSION max_statement_time = 30"
            ]
        );
        assert_eq!(
            session_limits(Flavour::MySql, lock, statement)[1],
            "SET SESSION max_execution_time = 30000"
        );
        assert!(session_limits(Flavour::MySql, Duration::ZERO, Duration::ZERO).is_empty());
    }
}
