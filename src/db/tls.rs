//! The TLS settings of a database URL, read as users already write them
//! (libpq's `sslmode`, `sslrootcert`, `sslcert`, `sslkey`; the MySQL
//! client's `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key`), and refused by
//! name when this build cannot honour them: never silently downgraded.

use std::fmt;

use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// How far a connection is protected, in libpq's words (MySQL's
/// DISABLED … VERIFY_IDENTITY map one to one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// Plaintext.
    Disable,
    /// TLS when the server offers it, plaintext otherwise; no verification.
    Prefer,
    /// TLS or no connection; the certificate is not verified.
    Require,
    /// TLS with the server's certificate chain verified, not its name.
    VerifyCa,
    /// TLS with the chain and the host name verified.
    VerifyFull,
}

impl TlsMode {
    /// What is verified of the server, for the start-up log.
    pub fn verified(self) -> &'static str {
        match self {
            TlsMode::VerifyFull => "certificate chain and host name",
            TlsMode::VerifyCa => "certificate chain only, not the host name",
            TlsMode::Disable | TlsMode::Prefer | TlsMode::Require => "nothing",
        }
    }
}

/// The TLS settings of one URL, resolved: what the driver is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// The mode in force.
    pub mode: TlsMode,
    /// The mode as the user wrote it or the default that applied, e.g.
    /// `sslmode=require` or `ssl-mode=PREFERRED (default)`.
    pub spelled: String,
    /// The CA file trusted beside the platform's roots (`sslrootcert`,
    /// `ssl-ca`); `None`: the platform's roots only.
    pub ca: Option<String>,
    /// The client certificate and its key (`sslcert`/`sslkey`,
    /// `ssl-cert`/`ssl-key`), always both or neither.
    pub client: Option<(String, String)>,
}

/// A URL's TLS parameter that this build cannot honour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The parameter as written (`sslmode`, `PGSSLMODE`, `ssl-crl`).
    pub parameter: String,
    /// Why, and what to write instead.
    pub reason: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TLS setting {} is refused: {}",
            self.parameter, self.reason
        )
    }
}

fn refuse(parameter: &str, reason: impl Into<String>) -> Refused {
    Refused {
        parameter: parameter.to_owned(),
        reason: reason.into(),
    }
}

/// The URL's query with its TLS parameters taken out (`rest`, for the
/// driver's own parser) and those parameters read (`settings`).
#[derive(Debug)]
pub(super) struct Split {
    pub rest: String,
    pub settings: TlsSettings,
}

/// Reads the TLS parameters of `url` (already checked to be a postgres or
/// mysql URL); `env` answers libpq's environment variables (`PGSSLMODE`,
/// `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`), which apply on PostgreSQL
/// when the URL does not say, as they do for psql.
pub(super) fn split(
    url: &url::Url,
    mysql: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Split, Refused> {
    let mut tls = Vec::new();
    let mut rest = url.clone();
    let mut kept = Vec::new();
    for (key, value) in url.query_pairs() {
        let class = if mysql {
            mysql_parameter(&key)
        } else {
            postgres_parameter(&key)
        };
        match class {
            Parameter::Other => kept.push((key.into_owned(), value.into_owned())),
            Parameter::Tls(name) => tls.push((name, key.into_owned(), value.into_owned())),
            Parameter::Checked(check) => check(&key, &value)?,
            Parameter::Unsupported(reason) => return Err(refuse(&key, reason)),
        }
    }
    rest.set_query(None);
    if !kept.is_empty() {
        rest.query_pairs_mut().extend_pairs(kept);
    }
    let given = |name: Name| -> Result<Option<(String, String)>, Refused> {
        let mut found = tls.iter().filter(|(n, _, _)| *n == name);
        let first = found.next().map(|(_, k, v)| (k.clone(), v.clone()));
        if let Some((_, again, _)) = found.next() {
            return Err(refuse(again, "given twice (or with another spelling)"));
        }
        Ok(first.or_else(|| {
            // libpq's variables stand in for a parameter the URL omits.
            (!mysql)
                .then(|| name.env())
                .and_then(|var| env(var).map(|value| (var.to_owned(), value)))
                .filter(|(_, value)| !value.is_empty())
        }))
    };
    let mode = given(Name::Mode)?;
    let ca = given(Name::Ca)?;
    let cert = given(Name::Cert)?;
    let key = given(Name::Key)?;
    let client = match (cert, key) {
        (Some((_, cert)), Some((_, key))) => Some((cert, key)),
        (None, None) => None,
        (Some((name, _)), None) | (None, Some((name, _))) => {
            return Err(refuse(
                &name,
                "a client certificate and its key go together: give both (sslcert and sslkey, or ssl-cert and ssl-key)",
            ));
        }
    };
    let settings = if mysql {
        mysql_settings(mode, ca, client)?
    } else {
        postgres_settings(mode, ca, client)?
    };
    Ok(Split {
        rest: rest.to_string(),
        settings,
    })
}

/// The four settings, whatever their spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Name {
    Mode,
    Ca,
    Cert,
    Key,
}

impl Name {
    fn env(self) -> &'static str {
        match self {
            Name::Mode => "PGSSLMODE",
            Name::Ca => "PGSSLROOTCERT",
            Name::Cert => "PGSSLCERT",
            Name::Key => "PGSSLKEY",
        }
    }
}

/// What a query parameter is to this module.
enum Parameter {
    /// Not about TLS: the driver reads it.
    Other,
    /// One of the four settings.
    Tls(Name),
    /// Accepted only with values this build honours; taken out either way.
    Checked(fn(&str, &str) -> Result<(), Refused>),
    /// About TLS and not honoured, with what to do instead.
    Unsupported(&'static str),
}

fn postgres_parameter(key: &str) -> Parameter {
    match key {
        "sslmode" | "ssl-mode" => Parameter::Tls(Name::Mode),
        "sslrootcert" | "ssl-root-cert" | "ssl-ca" => Parameter::Tls(Name::Ca),
        "sslcert" | "ssl-cert" => Parameter::Tls(Name::Cert),
        "sslkey" | "ssl-key" => Parameter::Tls(Name::Key),
        "sslsni" => Parameter::Checked(|key, value| {
            only(key, value, &["1"], "SNI is always sent for a host name")
        }),
        "sslnegotiation" => Parameter::Checked(|key, value| {
            only(
                key,
                value,
                &["postgres"],
                "direct TLS negotiation (PostgreSQL 17) is not supported",
            )
        }),
        "sslcompression" => Parameter::Checked(|key, value| {
            only(key, value, &["0"], "TLS compression is never used")
        }),
        "ssl_min_protocol_version" => Parameter::Checked(|key, value| {
            only(
                key,
                value,
                &["", "TLSv1", "TLSv1.1", "TLSv1.2"],
                "TLS 1.2 is the oldest version used; a minimum of TLSv1.3 cannot be enforced",
            )
        }),
        "ssl_max_protocol_version" => Parameter::Checked(|key, value| {
            only(
                key,
                value,
                &["", "TLSv1.3"],
                "TLS 1.3 is always offered; a lower maximum cannot be enforced",
            )
        }),
        "sslcertmode" => Parameter::Checked(|key, value| {
            only(
                key,
                value,
                &["allow"],
                "the client certificate is sent whenever sslcert and sslkey are given and the server asks for one (sslcertmode=allow)",
            )
        }),
        "gssencmode" => Parameter::Checked(|key, value| {
            only(
                key,
                value,
                &["disable", "prefer"],
                "GSSAPI encryption is not supported; use sslmode",
            )
        }),
        "sslcrl" | "sslcrldir" => Parameter::Unsupported(
            "certificate revocation lists are not supported; rotate the server certificate and its CA instead",
        ),
        "sslpassword" => Parameter::Unsupported(
            "encrypted client keys are not supported; give an unencrypted key in sslkey (kept in a Secret)",
        ),
        "sslkeylogfile" => Parameter::Unsupported("TLS key logging is not supported"),
        other if is_tls_name(other) => Parameter::Unsupported(
            "not a TLS parameter this build knows: sslmode, sslrootcert, sslcert and sslkey are",
        ),
        _ => Parameter::Other,
    }
}

fn mysql_parameter(key: &str) -> Parameter {
    match key.to_ascii_lowercase().replace('_', "-").as_str() {
        "ssl-mode" | "sslmode" => Parameter::Tls(Name::Mode),
        "ssl-ca" | "sslca" => Parameter::Tls(Name::Ca),
        "ssl-cert" | "sslcert" => Parameter::Tls(Name::Cert),
        "ssl-key" | "sslkey" => Parameter::Tls(Name::Key),
        "ssl-capath" => Parameter::Unsupported(
            "a CA directory is not supported; give one CA file (it may hold several certificates) in ssl-ca",
        ),
        "ssl-crl" | "ssl-crlpath" => Parameter::Unsupported(
            "certificate revocation lists are not supported; rotate the server certificate and its CA instead",
        ),
        "ssl-cipher" | "tls-ciphersuites" | "tls-version" => Parameter::Unsupported(
            "the TLS versions (1.2, 1.3) and cipher suites are rustls's safe defaults and cannot be chosen",
        ),
        other if is_tls_name(other) => Parameter::Unsupported(
            "not a TLS parameter this build knows: ssl-mode, ssl-ca, ssl-cert and ssl-key are",
        ),
        _ => Parameter::Other,
    }
}

/// A parameter name that speaks of TLS (`ssl…`, `tls…`, `useSSL`, …):
/// one this module does not know is refused, not passed on to be ignored.
fn is_tls_name(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("ssl") || key.contains("tls")
}

fn only(key: &str, value: &str, allowed: &[&str], reason: &str) -> Result<(), Refused> {
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(value)) {
        Ok(())
    } else {
        Err(refuse(&format!("{key}={value}"), reason))
    }
}

fn postgres_settings(
    mode: Option<(String, String)>,
    ca: Option<(String, String)>,
    client: Option<(String, String)>,
) -> Result<TlsSettings, Refused> {
    // libpq 16: sslrootcert=system trusts the platform's roots and then
    // insists on verify-full (a weaker mode would let any CA's holder in).
    let system = ca.as_ref().is_some_and(|(_, value)| value == "system");
    let parsed = match &mode {
        None if system => (
            TlsMode::VerifyFull,
            "sslmode=verify-full (sslrootcert=system)".to_owned(),
        ),
        None => (TlsMode::Prefer, "sslmode=prefer (default)".to_owned()),
        Some((key, value)) => {
            let mode = match value.to_ascii_lowercase().as_str() {
                "disable" => TlsMode::Disable,
                "prefer" => TlsMode::Prefer,
                "require" => TlsMode::Require,
                "verify-ca" => TlsMode::VerifyCa,
                "verify-full" => TlsMode::VerifyFull,
                "allow" => {
                    return Err(refuse(
                        &format!("{key}={value}"),
                        "allow (plaintext first, TLS only when the server insists) is not supported: use prefer, require or verify-full",
                    ));
                }
                _ => {
                    return Err(refuse(
                        &format!("{key}={value}"),
                        "not one of disable, prefer, require, verify-ca, verify-full",
                    ));
                }
            };
            (mode, format!("{key}={value}"))
        }
    };
    let (mut mode, mut spelled) = parsed;
    if system && mode != TlsMode::VerifyFull {
        return Err(refuse(
            &spelled,
            "sslrootcert=system needs sslmode=verify-full (as libpq insists): any public CA's holder could pose as the server",
        ));
    }
    // libpq: "if a root CA file exists, sslmode=require behaves as verify-ca".
    if mode == TlsMode::Require && ca.is_some() {
        mode = TlsMode::VerifyCa;
        spelled.push_str(" (verify-ca: sslrootcert is given, as libpq does)");
    }
    Ok(TlsSettings {
        mode,
        spelled,
        ca: ca.filter(|_| !system).map(|(_, value)| value),
        client,
    })
}

fn mysql_settings(
    mode: Option<(String, String)>,
    ca: Option<(String, String)>,
    client: Option<(String, String)>,
) -> Result<TlsSettings, Refused> {
    let (mode, spelled) = match &mode {
        // The MySQL client: --ssl-ca without --ssl-mode means VERIFY_CA.
        None if ca.is_some() => (
            TlsMode::VerifyCa,
            "ssl-mode=VERIFY_CA (ssl-ca is given)".to_owned(),
        ),
        None => (TlsMode::Prefer, "ssl-mode=PREFERRED (default)".to_owned()),
        Some((key, value)) => {
            let mode = match value.to_ascii_uppercase().as_str() {
                "DISABLED" => TlsMode::Disable,
                "PREFERRED" => TlsMode::Prefer,
                "REQUIRED" => TlsMode::Require,
                "VERIFY_CA" => TlsMode::VerifyCa,
                "VERIFY_IDENTITY" => TlsMode::VerifyFull,
                _ => {
                    return Err(refuse(
                        &format!("{key}={value}"),
                        "not one of DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY",
                    ));
                }
            };
            (mode, format!("{key}={value}"))
        }
    };
    Ok(TlsSettings {
        mode,
        spelled,
        ca: ca.map(|(_, value)| value),
        client,
    })
}

// === the drivers' options ===

/// Connect options that take a URL's [`TlsSettings`].
pub(super) trait WithTls: Sized {
    /// These options with the settings in force, replacing whatever the
    /// driver read from its environment.
    fn with_tls(self, tls: &TlsSettings) -> Self;
}

impl WithTls for PgConnectOptions {
    fn with_tls(self, tls: &TlsSettings) -> Self {
        let mode = match tls.mode {
            TlsMode::Disable => PgSslMode::Disable,
            TlsMode::Prefer => PgSslMode::Prefer,
            TlsMode::Require => PgSslMode::Require,
            TlsMode::VerifyCa => PgSslMode::VerifyCa,
            TlsMode::VerifyFull => PgSslMode::VerifyFull,
        };
        let mut options = self.ssl_mode(mode);
        if let Some(ca) = &tls.ca {
            options = options.ssl_root_cert(ca);
        }
        if let Some((cert, key)) = &tls.client {
            options = options.ssl_client_cert(cert).ssl_client_key(key);
        }
        options
    }
}

impl WithTls for MySqlConnectOptions {
    fn with_tls(self, tls: &TlsSettings) -> Self {
        let mode = match tls.mode {
            TlsMode::Disable => MySqlSslMode::Disabled,
            TlsMode::Prefer => MySqlSslMode::Preferred,
            TlsMode::Require => MySqlSslMode::Required,
            TlsMode::VerifyCa => MySqlSslMode::VerifyCa,
            TlsMode::VerifyFull => MySqlSslMode::VerifyIdentity,
        };
        let mut options = self.ssl_mode(mode);
        if let Some(ca) = &tls.ca {
            options = options.ssl_ca(ca);
        }
        if let Some((cert, key)) = &tls.client {
            options = options.ssl_client_cert(cert).ssl_client_key(key);
        }
        options
    }
}

/// Plain words beside a driver's TLS failure, whose own are terse
/// (`invalid peer certificate: UnknownIssuer`); `None` for other failures.
pub(super) fn explain(reason: &str, tls: &TlsSettings) -> Option<String> {
    let trusted = match &tls.ca {
        Some(ca) => format!("the CA file {ca} and the platform's roots"),
        None => "the platform's roots (no sslrootcert / ssl-ca given)".to_owned(),
    };
    let mode = &tls.spelled;
    // rustls's words: "invalid peer certificate: …" is our verdict on the
    // server's certificate, "received fatal alert: …" the server's on ours.
    let words = if reason.contains("received fatal alert") {
        "the server refused the TLS handshake: it does not accept this client's certificate \
         (sslcert / ssl-cert), or wants one and none was given"
            .to_owned()
    } else if reason.contains("UnknownIssuer") {
        format!(
            "the server's certificate is not signed by a CA this client trusts ({trusted}; {mode})"
        )
    } else if reason.contains("certificate expired") || reason.contains("Expired") {
        format!("the server's certificate has expired ({mode})")
    } else if reason.contains("not valid yet") || reason.contains("NotValidYet") {
        format!("the server's certificate is not valid yet ({mode})")
    } else if reason.contains("not valid for name") || reason.contains("NotValidForName") {
        format!(
            "the server's certificate does not name the host of the URL ({mode}; verify-ca / VERIFY_CA checks the chain only)"
        )
    } else if reason.contains("server does not support TLS") {
        format!("the server offers no TLS and {mode} requires it")
    } else if reason.contains("invalid peer certificate") {
        format!("the server's certificate is refused ({trusted}; {mode})")
    } else {
        return None;
    };
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn pg(query: &str) -> Result<Split, Refused> {
        let url = url::Url::parse(&format!("postgres://u@db:5432/x?{query}")).unwrap();
        split(&url, false, &no_env)
    }

    fn my(query: &str) -> Result<Split, Refused> {
        let url = url::Url::parse(&format!("mysql://u@db:3306/x?{query}")).unwrap();
        split(&url, true, &no_env)
    }

    #[test]
    fn postgres_modes_are_read_as_libpq_reads_them() {
        let cases = [
            ("", TlsMode::Prefer),
            ("sslmode=disable", TlsMode::Disable),
            ("sslmode=prefer", TlsMode::Prefer),
            ("sslmode=require", TlsMode::Require),
            ("sslmode=verify-ca&sslrootcert=/ca.pem", TlsMode::VerifyCa),
            (
                "sslmode=VERIFY-FULL&sslrootcert=/ca.pem",
                TlsMode::VerifyFull,
            ),
            ("sslmode=verify-full", TlsMode::VerifyFull),
            // libpq: a root CA file makes require verify the chain.
            ("sslmode=require&sslrootcert=/ca.pem", TlsMode::VerifyCa),
            // libpq 16: system roots, verify-full by default.
            ("sslrootcert=system", TlsMode::VerifyFull),
        ];
        for (query, mode) in cases {
            let split = pg(query).unwrap_or_else(|e| panic!("{query}: {e}"));
            assert_eq!(split.settings.mode, mode, "{query}");
        }
        let system = pg("sslrootcert=system").unwrap().settings;
        assert_eq!(system.ca, None, "system means the platform's roots");
    }

    #[test]
    fn tls_parameters_leave_the_url_the_driver_reads() {
        let split = pg("application_name=aa&sslmode=verify-full&sslrootcert=/etc/autoapproval/tls/db/ca.crt&sslcert=/c.pem&sslkey=/k.pem&options=-c%20x%3D1").unwrap();
        assert_eq!(
            split.rest,
            "postgres://u@db:5432/x?application_name=aa&options=-c+x%3D1"
        );
        assert_eq!(
            split.settings.ca.as_deref(),
            Some("/etc/autoapproval/tls/db/ca.crt")
        );
        assert_eq!(
            split.settings.client,
            Some(("/c.pem".to_owned(), "/k.pem".to_owned()))
        );
        let bare = pg("sslmode=require").unwrap();
        assert_eq!(bare.rest, "postgres://u@db:5432/x");
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        for (query, named) in [
            ("sslmode=bogus", "sslmode=bogus"),
            ("sslmode=allow", "sslmode=allow"),
            ("sslcrl=/crl.pem", "sslcrl"),
            ("sslcrldir=/crl", "sslcrldir"),
            ("sslnegotiation=direct", "sslnegotiation=direct"),
            ("sslpassword=x", "sslpassword"),
            ("sslsni=0", "sslsni=0"),
            (
                "ssl_min_protocol_version=TLSv1.3",
                "ssl_min_protocol_version=TLSv1.3",
            ),
            ("gssencmode=require", "gssencmode=require"),
            ("sslcertmode=require", "sslcertmode=require"),
            ("sslfoo=1", "sslfoo"),
            ("sslrootcert=system&sslmode=require", "sslmode=require"),
            ("sslcert=/c.pem", "sslcert"),
            ("sslkey=/k.pem", "sslkey"),
            ("sslmode=require&ssl-mode=disable", "ssl-mode"),
        ] {
            let refused = pg(query).expect_err(query);
            assert_eq!(refused.parameter, named, "{query}");
        }
        for (query, named) in [
            ("ssl-mode=bogus", "ssl-mode=bogus"),
            ("ssl-crl=/crl.pem", "ssl-crl"),
            ("ssl-capath=/ca", "ssl-capath"),
            ("tls-version=TLSv1.3", "tls-version"),
            ("useSSL=true", "useSSL"),
            ("ssl-cert=/c.pem", "ssl-cert"),
        ] {
            let refused = my(query).expect_err(query);
            assert_eq!(refused.parameter, named, "{query}");
        }
        // Accepted where the build does what the value asks.
        for query in [
            "sslsni=1",
            "sslnegotiation=postgres",
            "ssl_min_protocol_version=TLSv1.2",
            "gssencmode=disable",
            "sslcompression=0",
        ] {
            pg(query).unwrap_or_else(|e| panic!("{query}: {e}"));
        }
    }

    #[test]
    fn mysql_modes_are_read_as_the_mysql_client_reads_them() {
        for (query, mode) in [
            ("", TlsMode::Prefer),
            ("ssl-mode=DISABLED", TlsMode::Disable),
            ("ssl-mode=preferred", TlsMode::Prefer),
            ("ssl-mode=REQUIRED", TlsMode::Require),
            ("ssl-mode=VERIFY_CA&ssl-ca=/ca.pem", TlsMode::VerifyCa),
            (
                "ssl_mode=VERIFY_IDENTITY&ssl_ca=/ca.pem",
                TlsMode::VerifyFull,
            ),
            // The mysql client: --ssl-ca alone means VERIFY_CA.
            ("ssl-ca=/ca.pem", TlsMode::VerifyCa),
        ] {
            let split = my(query).unwrap_or_else(|e| panic!("{query}: {e}"));
            assert_eq!(split.settings.mode, mode, "{query}");
        }
        let split =
            my("ssl-mode=VERIFY_IDENTITY&ssl-ca=/ca.pem&ssl-cert=/c&ssl-key=/k&charset=utf8mb4")
                .unwrap();
        assert_eq!(split.rest, "mysql://u@db:3306/x?charset=utf8mb4");
        assert_eq!(split.settings.client, Some(("/c".into(), "/k".into())));
    }

    #[test]
    fn libpq_environment_stands_in_for_what_the_url_omits() {
        let env = |var: &str| match var {
            "PGSSLMODE" => Some("verify-full".to_owned()),
            "PGSSLROOTCERT" => Some("/env-ca.pem".to_owned()),
            _ => None,
        };
        let url = url::Url::parse("postgres://u@db/x").unwrap();
        let settings = split(&url, false, &env).unwrap().settings;
        assert_eq!(settings.mode, TlsMode::VerifyFull);
        assert_eq!(settings.ca.as_deref(), Some("/env-ca.pem"));
        let url = url::Url::parse("postgres://u@db/x?sslmode=disable").unwrap();
        assert_eq!(
            split(&url, false, &env).unwrap().settings.mode,
            TlsMode::Disable
        );
        let bogus = |var: &str| (var == "PGSSLMODE").then(|| "bogus".to_owned());
        let url = url::Url::parse("postgres://u@db/x").unwrap();
        assert_eq!(
            split(&url, false, &bogus).unwrap_err().parameter,
            "PGSSLMODE=bogus"
        );
        // MySQL has no such variables.
        let url = url::Url::parse("mysql://u@db/x").unwrap();
        assert_eq!(
            split(&url, true, &env).unwrap().settings.mode,
            TlsMode::Prefer
        );
    }
}
