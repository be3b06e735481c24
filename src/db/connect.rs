//! Reaching the database: the flags that name it, a URL that never prints
//! its password, and a start-up connection that fails at once, naming where
//! it tried and why, instead of waiting out a pool timeout, and says
//! whether it is encrypted and verified.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use sqlx::pool::PoolOptions;
use sqlx::{ConnectOptions, Database};

use super::DbError;
use super::tls::{self, TlsMode, TlsSettings, WithTls};
use crate::flags::parse_duration;

/// How long one start-up connection attempt may take before it is reported.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a statement waits for a pool connection before it fails.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The database flags of `run` and `migrate`.
#[derive(clap::Args, Clone, Debug)]
pub struct DatabaseArgs {
    /// URL of the primary, postgres:// or mysql:// / mariadb:// (MySQL 8, MariaDB): re-reads, claims and every write; TLS as libpq (sslmode, sslrootcert, sslcert, sslkey) or the MySQL client (ssl-mode, ssl-ca, ssl-cert, ssl-key) read it, default prefer / PREFERRED [required, no default].
    #[arg(long, env = "AUTOAPPROVAL_DATABASE_URL", hide_env_values = true, value_parser = DatabaseUrlParser)]
    pub database_url: DatabaseUrl,
    /// URL of a read replica for the candidate queries, of the primary's kind [default: the primary].
    #[arg(long, env = "AUTOAPPROVAL_READ_DATABASE_URL", hide_env_values = true, value_parser = DatabaseUrlParser)]
    pub read_database_url: Option<DatabaseUrl>,
    /// Connections per pool, primary and replica each; `run` needs at least --concurrency / 2 + 2. The listener and the Lease loop have connections of their own.
    #[arg(long, env = "AUTOAPPROVAL_DB_MAX_CONNECTIONS", default_value_t = 10)]
    pub db_max_connections: u32,
    /// MySQL / MariaDB only (no LISTEN/NOTIFY there): how often each replica reads the rows the triggers appended to auto_approve_wake; more than 0; the pickup latency of a new request is about half of it.
    #[arg(long, env = "AUTOAPPROVAL_WAKE_POLL_INTERVAL", default_value = "250ms", value_parser = parse_duration)]
    pub wake_poll_interval: Duration,
    /// A file of your codes for our words (YAML or JSON: request_types, request_statuses, econtract_statuses, flags; docs/REFERENCE.md): `migrate` stores it for our routines, `run` binds its statements to it and refuses to start when it differs from what `migrate` stored [default: none, our own words].
    #[arg(long, env = "AUTOAPPROVAL_VOCABULARY")]
    pub vocabulary: Option<std::path::PathBuf>,
}

/// Limits on each statement of the controller's sessions (`run` only;
/// `migrate` runs without): a business transaction holding a row we write,
/// or a slow plan, makes our statement fail and be retried instead of
/// holding a chain, a connection and the row locks we took for ever.
#[derive(clap::Args, Clone, Debug)]
pub struct SessionArgs {
    /// A statement waits at most this long for a lock another transaction holds (PostgreSQL lock_timeout; MySQL / MariaDB innodb_lock_wait_timeout, rounded up to whole seconds; 0: no limit).
    #[arg(long, env = "AUTOAPPROVAL_DB_LOCK_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub db_lock_timeout: Duration,
    /// A statement runs at most this long (PostgreSQL statement_timeout; MariaDB max_statement_time; MySQL 8 max_execution_time, SELECTs only; 0: no limit).
    #[arg(long, env = "AUTOAPPROVAL_DB_STATEMENT_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub db_statement_timeout: Duration,
}

// === impl DatabaseUrl ===

/// A `postgres://`, `mysql://` or `mariadb://` URL, checked when parsed (its TLS settings
/// too, see `db::tls`); `Display` and `Debug` show it with the password replaced by `***`, so it
/// can be logged and reported.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    url: String,
    shown: String,
    /// The URL without its TLS parameters, for the driver's parser; the
    /// settings go to the driver from `tls`.
    connect: String,
    /// The TLS settings it names, resolved.
    tls: TlsSettings,
    /// The password as given, in the userinfo or the query: masked in any
    /// text about the URL (a driver's error may quote it).
    secrets: Vec<String>,
}

impl DatabaseUrl {
    /// The URL itself, as given.
    #[cfg(test)]
    pub(super) fn expose(&self) -> &str {
        &self.url
    }

    /// The TLS settings this URL names.
    pub fn tls(&self) -> &TlsSettings {
        &self.tls
    }

    /// `text` (a driver's message about this URL) with its password masked.
    pub(super) fn redact(&self, text: &str) -> String {
        let mut text = text
            .replace(&self.url, &self.shown)
            .replace(&self.connect, &self.shown);
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }

    /// Whether it names a MySQL 8 / MariaDB server (`mysql://`,
    /// `mariadb://`): the scheme picks the store's backend.
    pub(super) fn is_mysql(&self) -> bool {
        self.url.starts_with("mysql:") || self.url.starts_with("mariadb:")
    }
}

impl FromStr for DatabaseUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parsed = url::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
        if !matches!(
            parsed.scheme(),
            "postgres" | "postgresql" | "mysql" | "mariadb"
        ) {
            return Err(format!(
                "scheme {:?} is not postgres://, postgresql://, mysql:// or mariadb://",
                parsed.scheme()
            ));
        }
        let is_mysql = matches!(parsed.scheme(), "mysql" | "mariadb");
        let split = tls::split(&parsed, is_mysql, &|var| std::env::var(var).ok())
            .map_err(|refused| refused.to_string())?;
        let mut secrets = Vec::new();
        if let Some(password) = parsed.password() {
            secrets.push(password.to_owned());
            // Cannot fail: a URL with a password has a host.
            let _ = parsed.set_password(Some("***"));
        }
        // Both drivers also take the password as a query parameter
        // (`?password=`, `?sslpassword=`): masked the same way.
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(key, value)| (key.into_owned(), value.into_owned()))
            .collect();
        if pairs.iter().any(|(key, _)| is_secret_parameter(key)) {
            let mut query = parsed.query_pairs_mut();
            query.clear();
            for (key, value) in &pairs {
                if is_secret_parameter(key) {
                    secrets.push(value.clone());
                    query.append_pair(key, "***");
                } else {
                    query.append_pair(key, value);
                }
            }
        }
        secrets.retain(|secret| !secret.is_empty());
        Ok(Self {
            url: s.to_owned(),
            shown: parsed.to_string(),
            connect: split.rest,
            tls: split.settings,
            secrets,
        })
    }
}

/// A query parameter that carries a credential.
fn is_secret_parameter(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password") || key.contains("passwd") || key == "pwd"
}

/// Parses `--database-url` and `--read-database-url` without echoing a
/// refused value, as clap's own message would: it may hold a password.
#[derive(Clone, Copy, Debug)]
struct DatabaseUrlParser;

impl clap::builder::TypedValueParser for DatabaseUrlParser {
    type Value = DatabaseUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<DatabaseUrl, clap::Error> {
        let flag = arg
            .and_then(clap::Arg::get_long)
            .map_or_else(|| "the database URL".to_owned(), |long| format!("--{long}"));
        let refused = |reason: &str| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for {flag} (not shown: it may hold a password): {reason}\n"),
            )
            .with_cmd(cmd)
        };
        let text = value.to_str().ok_or_else(|| refused("not UTF-8"))?;
        text.parse().map_err(|reason: String| refused(&reason))
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

// === connecting, for both backends ===

/// The options of every pool of the store: at most `max_connections`,
/// each waited for at most [`ACQUIRE_TIMEOUT`].
pub(super) fn pool_options<DB: Database>(max_connections: u32) -> PoolOptions<DB> {
    PoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(ACQUIRE_TIMEOUT)
}

/// A session's transport as its server reports it (PostgreSQL's
/// `pg_stat_ssl`, MySQL's `Ssl_version` and `Ssl_cipher`).
pub(super) trait SessionTls {
    /// The TLS version and cipher of this session; `None` when it is plaintext.
    fn session_tls(
        &mut self,
    ) -> impl Future<Output = Result<Option<(String, String)>, sqlx::Error>> + Send;
}

/// One connection to `url`, opened and closed: the options it was made
/// with (its TLS settings in force, see `db::tls`), or why it could not be
/// made, in the driver's own words with the password masked. `uses` says
/// what the connection serves, for the start-up log of its encryption.
pub(super) async fn reach<O>(
    role: &'static str,
    uses: &'static str,
    url: &DatabaseUrl,
) -> Result<O, DbError>
where
    O: ConnectOptions + FromStr<Err = sqlx::Error> + WithTls,
    O::Connection: Sized + SessionTls,
{
    let refused = |reason: String| {
        let reason = match tls::explain(&reason, &url.tls) {
            Some(words) => format!("{words}: {reason}"),
            None => reason,
        };
        DbError::Connect {
            role,
            url: url.to_string(),
            reason: url.redact(&reason),
        }
    };
    let options = O::from_str(&url.connect)
        .map_err(|e| refused(e.to_string()))?
        .with_tls(&url.tls);
    match tokio::time::timeout(CONNECT_TIMEOUT, options.connect()).await {
        Ok(Ok(mut connection)) => {
            report_tls(role, uses, url, connection.session_tls().await);
            // Closing is best effort: the pool opens its own connections.
            let _ = sqlx::Connection::close(connection).await;
            Ok(options)
        }
        Ok(Err(error)) => Err(refused(error.to_string())),
        Err(_) => Err(refused(format!(
            "no answer within {} s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// Logs whether the connection to `url` is encrypted and what of the
/// server was verified: a warning when it is plaintext or unverified.
fn report_tls(
    role: &'static str,
    uses: &'static str,
    url: &DatabaseUrl,
    session: Result<Option<(String, String)>, sqlx::Error>,
) {
    let settings = &url.tls;
    let mode = settings.spelled.as_str();
    let verified = settings.mode.verified();
    match session {
        Ok(Some((tls_version, cipher))) if settings.mode == TlsMode::VerifyFull => {
            tracing::info!(connection = role, uses, %url, mode, encrypted = true, verified, tls_version, cipher, "database connection is encrypted and its server verified");
        }
        Ok(Some((tls_version, cipher))) => {
            tracing::warn!(connection = role, uses, %url, mode, encrypted = true, verified, tls_version, cipher, "database connection is encrypted but its server is not fully verified: sslmode=verify-full (ssl-mode=VERIFY_IDENTITY) with the server's CA checks it");
        }
        Ok(None) => {
            tracing::warn!(connection = role, uses, %url, mode, encrypted = false, verified, "database connection is NOT encrypted: the password and the data travel in clear");
        }
        Err(error) => {
            let error = url.redact(&error.to_string());
            tracing::warn!(connection = role, uses, %url, mode, verified, %error, "cannot read whether the database connection is encrypted");
        }
    }
}

/// One round-trip on `pool` (the readiness probe, the pool checks).
pub(super) async fn ping<DB: Database>(pool: &sqlx::Pool<DB>) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    sqlx::query::<DB>("SELECT 1").execute(pool).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_url_never_shows_its_password() {
        let url: DatabaseUrl = "postgres://app:hunter2@db.example:5432/contracts"
            .parse()
            .unwrap();
        assert_eq!(
            url.to_string(),
            "postgres://app:***@db.example:5432/contracts"
        );
        assert_eq!(
            format!("{url:?}"),
            "postgres://app:***@db.example:5432/contracts"
        );
        assert_eq!(
            url.expose(),
            "postgres://app:hunter2@db.example:5432/contracts"
        );
        let plain: DatabaseUrl = "postgres://app@db/contracts".parse().unwrap();
        assert_eq!(plain.to_string(), "postgres://app@db/contracts");
    }

    #[test]
    fn a_password_in_the_query_is_masked_too() {
        let url: DatabaseUrl =
            "postgres://app@db:5432/x?sslmode=require&password=hunter2&passwd=s3cret"
                .parse()
                .unwrap();
        let shown = url.to_string();
        assert_eq!(
            shown,
            "postgres://app@db:5432/x?sslmode=require&password=***&passwd=***"
        );
        // sslpassword is refused (no encrypted keys), naming it, not its value.
        let refused = "postgres://app@db/x?sslpassword=s3cret"
            .parse::<DatabaseUrl>()
            .unwrap_err();
        assert!(
            refused.contains("sslpassword") && !refused.contains("s3cret"),
            "{refused}"
        );
        assert_eq!(format!("{url:?}"), shown);
        let mysql: DatabaseUrl = "mysql://app:pw1@db/x?PASSWORD=pw2".parse().unwrap();
        assert_eq!(mysql.to_string(), "mysql://app:***@db/x?PASSWORD=***");
        // A driver's message quoting the URL or the password is masked.
        let quoted = format!("bad option in {}: near hunter2", url.expose());
        let masked = url.redact(&quoted);
        assert!(
            !masked.contains("hunter2") && !masked.contains("s3cret"),
            "{masked}"
        );
        assert!(masked.contains("password=***"), "{masked}");
    }

    #[test]
    fn a_refused_database_url_is_not_echoed() {
        use clap::Parser;

        #[derive(Parser, Debug)]
        struct Flags {
            #[command(flatten)]
            database: DatabaseArgs,
        }
        for url in [
            "sqlite://app:hunter2@db/x",
            "sqlite://db/x?password=hunter2",
        ] {
            let error = Flags::try_parse_from(["t", "--database-url", url]).unwrap_err();
            let message = error.to_string();
            assert!(!message.contains("hunter2"), "{message}");
            assert!(message.contains("--database-url"), "{message}");
        }
        let error = Flags::try_parse_from([
            "t",
            "--database-url",
            "postgres://db/x",
            "--read-database-url",
            "redis://app:hunter2@db/0?password=hunter2",
        ])
        .unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }

    #[test]
    fn a_url_of_another_database_is_refused() {
        let err = "sqlite://db/x".parse::<DatabaseUrl>().unwrap_err();
        assert!(err.contains("not postgres://"), "{err}");
        let mysql: DatabaseUrl = "mysql://app:pw@db:3306/x".parse().unwrap();
        assert!(mysql.is_mysql());
        assert_eq!(mysql.to_string(), "mysql://app:***@db:3306/x");
        let mariadb: DatabaseUrl = "mariadb://app:pw@db:3306/x".parse().unwrap();
        assert!(mariadb.is_mysql());
        assert!(
            !"postgresql://db/x"
                .parse::<DatabaseUrl>()
                .unwrap()
                .is_mysql()
        );
        assert!("not a url".parse::<DatabaseUrl>().is_err());
    }
}
