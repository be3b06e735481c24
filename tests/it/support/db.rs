//! The test's database on either backend: a PostgreSQL database from
//! `#[sqlx::test]`, or a scratch MariaDB/MySQL database on the server that
//! `MYSQL_URL` names, created for the test and dropped after it. Tests that
//! must hold on both are written once over [`Db`] with [`on_both!`].

use autoapproval::db::Database;
use autoapproval::db::mysql;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{ConnectOptions, Executor, PgPool};

/// The database a test runs on.
#[derive(Clone, Debug)]
pub enum Db {
    Postgres(PgPool),
    Mysql(MySqlPool),
}

/// What a fixture accepts: a PostgreSQL pool (the tests that run on
/// PostgreSQL alone) or a [`Db`].
pub trait AsDb {
    fn db(&self) -> Db;
}

impl AsDb for PgPool {
    fn db(&self) -> Db {
        Db::Postgres(self.clone())
    }
}

impl AsDb for Db {
    fn db(&self) -> Db {
        self.clone()
    }
}

/// Runs `$body` with the pool of `$db`, whichever backend it is; the body is
/// compiled once per backend, so a query in it is typed for each.
macro_rules! with_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            $crate::support::Db::Postgres($pool) => $body,
            $crate::support::Db::Mysql($pool) => $body,
        }
    };
}
pub(crate) use with_pool;

impl Db {
    /// A store over this database, reading from the primary.
    pub fn database(&self) -> Database {
        match self {
            Db::Postgres(pool) => Database::postgres(pool.clone(), pool.clone()),
            Db::Mysql(pool) => Database::mysql(pool.clone(), pool.clone()),
        }
    }

    /// The database's URL, as `run` would be given it.
    pub fn url(&self) -> String {
        match self {
            Db::Postgres(pool) => {
                let options = pool.connect_options();
                format!(
                    "postgres://{}@{}:{}/{}",
                    options.get_username(),
                    options.get_host(),
                    options.get_port(),
                    options.get_database().expect("a database name")
                )
            }
            Db::Mysql(pool) => pool.connect_options().to_url_lossy().to_string(),
        }
    }

    /// Opens a transaction of the business system's that runs `sql` and
    /// holds what it locked until [`Business::commit`].
    pub async fn business_transaction(&self, sql: &str) -> Business {
        match self {
            Db::Postgres(pool) => {
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                    .execute(&mut *tx)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                Business::Postgres(tx)
            }
            Db::Mysql(pool) => {
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                    .execute(&mut *tx)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                Business::Mysql(tx)
            }
        }
    }

    /// The address of the database server (its first, when it has several).
    pub async fn server_addr(&self) -> std::net::SocketAddr {
        let url = url::Url::parse(&self.url()).expect("a database URL");
        let host = match url.host_str() {
            None | Some("") => "127.0.0.1",
            Some(host) if host.starts_with('/') || host.starts_with("%2F") => "127.0.0.1",
            Some(host) => host,
        }
        .to_owned();
        let port = url.port_or_known_default().unwrap_or(match self {
            Db::Postgres(_) => 5432,
            Db::Mysql(_) => 3306,
        });
        tokio::net::lookup_host((host.as_str(), port))
            .await
            .expect("the database host")
            .next()
            .expect("an address")
    }

    /// Which backend, for messages and per-backend names.
    pub fn name(&self) -> &'static str {
        match self {
            Db::Postgres(_) => "postgres",
            Db::Mysql(_) => "mysql",
        }
    }

    /// `sql` with PostgreSQL's `$n` placeholders, as this backend writes
    /// it: `?` on MySQL, where each must appear once and in order.
    pub fn sql(&self, sql: &str) -> String {
        match self {
            Db::Postgres(_) => sql.to_owned(),
            Db::Mysql(_) => {
                let mut out = String::with_capacity(sql.len());
                let mut chars = sql.chars().peekable();
                let mut expected = 1;
                while let Some(c) = chars.next() {
                    if c == '$' && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
                        let mut n = 0u32;
                        while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                            n = n * 10 + d;
                            chars.next();
                        }
                        assert_eq!(n, expected, "placeholders in order, each once: {sql}");
                        expected += 1;
                        out.push('?');
                    } else {
                        out.push(c);
                    }
                }
                out
            }
        }
    }

    /// Runs one statement with no parameters, as the business system would.
    pub async fn exec(&self, sql: &str) -> u64 {
        with_pool!(self, pool => pool
            .execute(sqlx::AssertSqlSafe(sql.to_owned()))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected())
    }

    /// Runs one statement whose one parameter `$1` is `at`.
    pub async fn exec_at(&self, sql: &str, at: chrono::DateTime<chrono::Utc>) -> u64 {
        let sql = self.sql(sql);
        with_pool!(self, pool => sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(at)
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected())
    }

    /// The integers of the one column `sql` selects.
    pub async fn fetch_ids(&self, sql: &str) -> Vec<i64> {
        with_pool!(self, pool => {
            let rows: Vec<(i64,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned()))
                .fetch_all(pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            rows.into_iter().map(|(id,)| id).collect()
        })
    }

    /// Drops every wake trigger the binding attached (those calling
    /// autoapproval_request_changed or autoapproval_econtract_changed), as
    /// a business schema nobody watched has none; how many it dropped.
    pub async fn drop_wake_triggers(&self) -> usize {
        let drops = match self {
            Db::Postgres(_) => {
                self.fetch_strings(
                    "SELECT format('DROP TRIGGER %I ON %s', t.tgname, t.tgrelid::regclass)
                       FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
                      WHERE p.proname IN ('autoapproval_request_changed',
                                          'autoapproval_econtract_changed')",
                )
                .await
            }
            Db::Mysql(_) => {
                self.fetch_strings(
                    "SELECT CONCAT('DROP TRIGGER ', TRIGGER_NAME) FROM information_schema.TRIGGERS
                      WHERE TRIGGER_SCHEMA = DATABASE()
                        AND (ACTION_STATEMENT LIKE '%autoapproval_request_changed%'
                             OR ACTION_STATEMENT LIKE '%autoapproval_econtract_changed%')",
                )
                .await
            }
        };
        for drop in &drops {
            self.exec(drop).await;
        }
        drops.len()
    }

    /// The strings of the one column `sql` selects.
    pub async fn fetch_strings(&self, sql: &str) -> Vec<String> {
        with_pool!(self, pool => sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}")))
    }

    /// The one integer `sql` selects.
    pub async fn fetch_i64(&self, sql: &str) -> i64 {
        with_pool!(self, pool => {
            let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned()))
                .fetch_one(pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            n
        })
    }
}

/// A business transaction holding its locks.
pub enum Business {
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    Mysql(sqlx::Transaction<'static, sqlx::MySql>),
}

impl Business {
    /// Commits, releasing the locks.
    pub async fn commit(self) {
        match self {
            Business::Postgres(tx) => tx.commit().await.expect("commit"),
            Business::Mysql(tx) => tx.commit().await.expect("commit"),
        }
    }
}

/// `pool`'s database (a fresh one of `sqlx::test`) with the controller's
/// migrations and the reference business schema applied, as
/// `autoapproval migrate --reference-schema` applies them.
pub async fn migrated(pool: PgPool) -> PgPool {
    Database::postgres(pool.clone(), pool.clone())
        .migrate(true)
        .await
        .expect("PostgreSQL migrations apply");
    pool
}

/// A scratch database on the MariaDB/MySQL server of `MYSQL_URL`, dropped
/// by [`MysqlScratch::finish`]; a failed test leaves its database behind
/// for a look (named `aa_it_<pid>_<n>`).
pub struct MysqlScratch {
    admin: MySqlPool,
    name: String,
    url: String,
    pool: MySqlPool,
}

impl MysqlScratch {
    /// Creates the database and applies the MySQL migrations.
    pub async fn create() -> MysqlScratch {
        let scratch = MysqlScratch::unmigrated().await;
        scratch
            .db()
            .database()
            .migrate(true)
            .await
            .expect("MySQL migrations apply");
        scratch
    }

    /// Creates the database, empty: for the tests of the migrations themselves.
    pub async fn unmigrated() -> MysqlScratch {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let server = std::env::var("MYSQL_URL").unwrap_or_else(|_| {
            panic!(
                "MYSQL_URL is not set: these tests need a MariaDB or MySQL server \
                 (scripts/test.sh starts one and sets it)"
            )
        });
        let admin = MySqlPoolOptions::new()
            .max_connections(2)
            .connect(&server)
            .await
            .unwrap_or_else(|e| panic!("MYSQL_URL {server}: {e}"));
        // A multi-replica test holds ~50 connections (three `run` processes
        // with their pools, the fleet's own), and tests run in parallel:
        // MariaDB's default of 151 was seen exhausted ("Too many
        // connections"). Raised once for the server, when we may.
        static RAISED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        RAISED
            .get_or_init(|| async {
                let _ = admin
                    .execute("SET GLOBAL max_connections = GREATEST(@@max_connections, 1000)")
                    .await;
            })
            .await;
        let name = format!(
            "aa_it_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // The name holds our pid, so a database of that name is a dead run's
        // (a test binary killed before its finish, a pid used again): ours to drop.
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name}"
            )))
            .await
            .expect("drop a dead run's scratch database");
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .expect("create the scratch database");
        let url = database_url(&server, &name);
        // Sessions as the product sets them (READ COMMITTED): the server's
        // default, REPEATABLE READ, would gap-lock where production does not.
        let options: sqlx::mysql::MySqlConnectOptions =
            url.parse().expect("the scratch database's URL");
        let pool = mysql::pool(options, 16, None);
        MysqlScratch {
            admin,
            name,
            url,
            pool,
        }
    }

    /// The database's name, as the server's messages show it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's URL, as `run` and `migrate` would be given it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The pool over it, sessions as the product sets them.
    pub fn pool(&self) -> MySqlPool {
        self.pool.clone()
    }

    /// The scratch database.
    pub fn db(&self) -> Db {
        Db::Mysql(self.pool.clone())
    }

    /// Closes the pool and drops the database.
    pub async fn finish(self) {
        // close() waits for every connection checked out; one still held
        // by a task the test left behind hung a run for ten minutes, so it
        // gets a bound: the DROP below does not need the pool closed.
        if tokio::time::timeout(std::time::Duration::from_secs(10), self.pool.close())
            .await
            .is_err()
        {
            eprintln!(
                "scratch database {}: pool not closed in 10 s; dropped anyway",
                self.name
            );
        }
        self.admin
            .execute(sqlx::AssertSqlSafe(format!("DROP DATABASE {}", self.name)))
            .await
            .expect("drop the scratch database");
    }
}

/// `server` (a `mysql://` URL, with or without a database) naming `database`.
fn database_url(server: &str, database: &str) -> String {
    let mut url = url::Url::parse(server).expect("MYSQL_URL is a URL");
    url.set_path(database);
    url.to_string()
}

/// Declares the tests `<name>::postgres` and `<name>::mysql`, each calling
/// the function `<name>(db: Db)` (written beside it) on its backend.
macro_rules! on_both {
    ($name:ident) => {
        mod $name {
            #[sqlx::test(migrations = false)]
            async fn postgres(pool: sqlx::PgPool) {
                super::$name($crate::support::Db::Postgres(
                    $crate::support::migrated(pool).await,
                ))
                .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                let scratch = $crate::support::MysqlScratch::create().await;
                super::$name(scratch.db()).await;
                scratch.finish().await;
            }
        }
    };
}
pub(crate) use on_both;

/// Runs the async test fn `$name(db: Db, on: On)` on PostgreSQL and MariaDB/MySQL, each
/// on the test API server (`postgres`, `mysql`) and on the real kube-apiserver
/// (`postgres_real_server`, `mysql_real_server`).
macro_rules! on_both_servers {
    ($name:ident) => {
        mod $name {
            use $crate::support::On;

            #[sqlx::test(migrations = false)]
            async fn postgres(pool: sqlx::PgPool) {
                super::$name(
                    $crate::support::Db::Postgres($crate::support::migrated(pool).await),
                    On::TestServer,
                )
                .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                let scratch = $crate::support::MysqlScratch::create().await;
                super::$name(scratch.db(), On::TestServer).await;
                scratch.finish().await;
            }

            #[sqlx::test(migrations = false)]
            async fn postgres_real_server(pool: sqlx::PgPool) {
                super::$name(
                    $crate::support::Db::Postgres($crate::support::migrated(pool).await),
                    On::RealServer,
                )
                .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql_real_server() {
                let scratch = $crate::support::MysqlScratch::create().await;
                super::$name(scratch.db(), On::RealServer).await;
                scratch.finish().await;
            }
        }
    };
}
pub(crate) use on_both_servers;
