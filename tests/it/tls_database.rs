//! TLS to the database (issue 43, item 1): dedicated PostgreSQL (`ssl = on`,
//! a `hostssl`-only pg_hba) and MariaDB (`require_secure_transport = ON`)
//! servers with certificates of a CA the test makes. Verified connections
//! work for migrate and run's start-up; a wrong CA, an expired certificate,
//! a certificate for another host and a plaintext-only server each stop
//! start-up, naming the connection and the reason; a client certificate the
//! server requires is sent from the URL's files. The shared servers are
//! never touched.

use std::time::Duration;

use autoapproval::db::{Database, DatabaseArgs, SessionArgs};
use sqlx::Connection;

use crate::support::{CertFiles, PgTransport, Pki, TlsDir, TlsMariaDb, TlsPostgres};

fn args(url: &str) -> DatabaseArgs {
    DatabaseArgs {
        database_url: url.parse().unwrap_or_else(|e| panic!("{url}: {e}")),
        read_database_url: None,
        db_max_connections: 2,
        wake_poll_interval: Duration::from_millis(250),
        vocabulary: None,
    }
}

fn session() -> SessionArgs {
    SessionArgs {
        db_lock_timeout: Duration::from_secs(5),
        db_statement_timeout: Duration::from_secs(30),
    }
}

/// `run`'s start-up connection to `url` (primary only).
async fn connect(url: &str) -> Result<Database, String> {
    Database::connect(&args(url), Some(&session()))
        .await
        .map_err(|e| e.to_string())
}

/// The refusal of `url`, which must name the connection and the reason.
async fn refused(url: &str, connection: &str, reason: &str) -> String {
    let error = match connect(url).await {
        Ok(_) => panic!("{url} connected; it must be refused ({reason})"),
        Err(error) => error,
    };
    assert!(
        error.contains(&format!("cannot connect to the {connection} database"))
            && error.contains(reason),
        "{url}: the refusal must name the {connection} connection and say {reason:?}: {error}"
    );
    error
}

/// `autoapproval migrate` on `url`, as the chart's Job runs it: its
/// success and its log.
fn migrate(url: &str, extra: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(["migrate", "--database-url", url])
        .args(extra)
        .output()
        .expect("run autoapproval migrate");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), log)
}

fn query(ca: &std::path::Path, mode: &str, client: Option<&CertFiles>, mysql: bool) -> String {
    let (mode_key, ca_key, cert_key, key_key) = if mysql {
        ("ssl-mode", "ssl-ca", "ssl-cert", "ssl-key")
    } else {
        ("sslmode", "sslrootcert", "sslcert", "sslkey")
    };
    let mut q = format!("{mode_key}={mode}&{ca_key}={}", ca.display());
    if let Some(client) = client {
        q.push_str(&format!(
            "&{cert_key}={}&{key_key}={}",
            client.cert.display(),
            client.key.display()
        ));
    }
    q
}

// === PostgreSQL ===

#[tokio::test]
async fn postgres_verify_full_with_the_servers_ca_migrates_passes_the_start_up_check_and_encrypts_every_connection()
 {
    let dir = TlsDir::new("tls-pg-ok");
    let pki = Pki::new(&dir, "test");
    let server = pki.server("server", &["localhost"], false);
    let pg = TlsPostgres::start(&dir, &pki.ca_file(), &server);
    let url = pg.url(
        "postgres",
        "localhost",
        &query(&pki.ca_file(), "verify-full", None, false),
    );

    let (ok, log) = migrate(&url, &["--reference-schema"]);
    assert!(ok, "migrate over verify-full: {log}");
    assert!(
        log.contains("database connection is encrypted and its server verified")
            && log.contains("sslmode=verify-full")
            && log.contains("certificate chain and host name"),
        "the start-up log says the connection is encrypted and verified: {log}"
    );

    // run's start-up: both pools, the schema check, the listener's and the
    // Lease loop's own connections, all with the URL's settings.
    let mut args = args(&url);
    args.read_database_url = Some(url.parse().expect("url"));
    let store = Database::connect(&args, Some(&session()))
        .await
        .expect("run's start-up over verify-full");
    store.check_schema().await.expect("the start-up check");
    let _listener = store.request_changes().await.expect("the NOTIFY listener");
    store
        .dedicated(1)
        .ping()
        .await
        .expect("the Lease loop's pool");
    for (pool, answer) in store.ping_pools().await {
        answer.unwrap_or_else(|e| panic!("{pool}: {e}"));
    }
    let mut admin = sqlx::PgConnection::connect(&pg.admin_url())
        .await
        .expect("admin over the socket");
    let (encrypted, plain): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
           FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
          WHERE a.client_addr IS NOT NULL",
    )
    .fetch_one(&mut admin)
    .await
    .expect("pg_stat_ssl");
    assert_eq!(plain, 0, "no TCP session of ours is plaintext");
    assert!(
        encrypted >= 3,
        "the pools, the listener and the Lease loop's pool are TLS sessions: {encrypted}"
    );
}

#[tokio::test]
async fn postgres_a_wrong_ca_a_host_name_mismatch_an_expired_certificate_and_a_plaintext_server_each_stop_start_up_by_name()
 {
    let dir = TlsDir::new("tls-pg-refused");
    let pki = Pki::new(&dir, "test");
    let other = Pki::new(&dir, "other");
    let server = pki.server("server", &["localhost"], false);
    let expired = pki.server("expired", &["localhost"], true);
    let pg = TlsPostgres::start(&dir, &pki.ca_file(), &server);
    let right = pg.url(
        "postgres",
        "localhost",
        &query(&pki.ca_file(), "verify-full", None, false),
    );
    connect(&right).await.expect("the right CA connects");

    // A CA that did not sign the server's certificate.
    let wrong = pg.url(
        "postgres",
        "localhost",
        &query(&other.ca_file(), "verify-full", None, false),
    );
    refused(&wrong, "primary", "not signed by a CA this client trusts").await;
    let (ok, log) = migrate(&wrong, &[]);
    assert!(
        !ok && log.contains("cannot connect to the primary database")
            && log.contains("not signed by a CA this client trusts"),
        "migrate stops, naming the connection and the reason: {log}"
    );
    let mut with_replica = args(&right);
    with_replica.read_database_url = Some(wrong.parse().expect("url"));
    let error = Database::connect(&with_replica, None)
        .await
        .expect_err("a read replica with the wrong CA is refused")
        .to_string();
    assert!(
        error.contains("cannot connect to the read replica database"),
        "{error}"
    );

    // A certificate for another name: verify-full refuses, verify-ca
    // (the chain only) connects.
    let by_ip = |mode| {
        pg.url(
            "postgres",
            "127.0.0.1",
            &query(&pki.ca_file(), mode, None, false),
        )
    };
    refused(
        &by_ip("verify-full"),
        "primary",
        "does not name the host of the URL",
    )
    .await;
    connect(&by_ip("verify-ca"))
        .await
        .expect("verify-ca checks the chain only");

    // An expired certificate of the right CA: refused; `require` (no
    // verification, as libpq) still encrypts.
    pg.serve_certificate(&expired);
    refused(&right, "primary", "has expired").await;
    connect(&pg.url("postgres", "localhost", "sslmode=require"))
        .await
        .expect("require does not verify");

    // A server that offers no TLS: require refuses, prefer falls back.
    pg.serve(PgTransport::PlaintextOnly);
    refused(
        &pg.url("postgres", "localhost", "sslmode=require"),
        "primary",
        "offers no TLS",
    )
    .await;
    connect(&pg.url("postgres", "localhost", "sslmode=prefer"))
        .await
        .expect("prefer falls back to plaintext");
}

#[tokio::test]
async fn postgres_a_client_certificate_the_server_requires_is_sent_from_sslcert_and_sslkey() {
    let dir = TlsDir::new("tls-pg-client");
    let pki = Pki::new(&dir, "test");
    let other = Pki::new(&dir, "other");
    let server = pki.server("server", &["localhost"], false);
    let pg = TlsPostgres::start(&dir, &pki.ca_file(), &server);
    let mut admin = sqlx::PgConnection::connect(&pg.admin_url())
        .await
        .expect("admin over the socket");
    sqlx::query("CREATE ROLE certuser LOGIN")
        .execute(&mut admin)
        .await
        .expect("create the role");
    let client = pki.client("client", "certuser");
    let stranger = other.client("stranger", "certuser");

    let with = pg.url(
        "certuser",
        "localhost",
        &query(&pki.ca_file(), "verify-full", Some(&client), false),
    );
    let store = connect(&with)
        .await
        .expect("pg_hba `cert`: the client certificate authenticates");
    store.ping().await.expect("a round-trip as certuser");

    let without = pg.url(
        "certuser",
        "localhost",
        &query(&pki.ca_file(), "verify-full", None, false),
    );
    refused(&without, "primary", "certificate").await;
    let foreign = pg.url(
        "certuser",
        "localhost",
        &query(&pki.ca_file(), "verify-full", Some(&stranger), false),
    );
    refused(&foreign, "primary", "certificate").await;
}

// === MariaDB ===

#[tokio::test]
async fn mariadb_verify_identity_with_the_servers_ca_migrates_and_passes_the_start_up_check() {
    let dir = TlsDir::new("tls-my-ok");
    let pki = Pki::new(&dir, "test");
    let server = pki.server("server", &["localhost"], false);
    let my = TlsMariaDb::start(&dir, &pki.ca_file(), &server).await;
    my.db.create_database("app").await.expect("database");
    let url = my.url(
        "root",
        "localhost",
        "app",
        &query(&pki.ca_file(), "VERIFY_IDENTITY", None, true),
    );

    let (ok, log) = migrate(&url, &["--reference-schema"]);
    assert!(ok, "migrate over VERIFY_IDENTITY: {log}");
    assert!(
        log.contains("database connection is encrypted and its server verified")
            && log.contains("ssl-mode=VERIFY_IDENTITY")
            && log.contains("certificate chain and host name"),
        "the start-up log says the connection is encrypted and verified: {log}"
    );

    // require_secure_transport refuses plaintext, so every connection that
    // works below is a TLS session.
    let mut args = args(&url);
    args.read_database_url = Some(url.parse().expect("url"));
    let store = Database::connect(&args, Some(&session()))
        .await
        .expect("run's start-up over VERIFY_IDENTITY");
    store.check_schema().await.expect("the start-up check");
    store
        .dedicated(1)
        .ping()
        .await
        .expect("the Lease loop's pool");
    for (pool, answer) in store.ping_pools().await {
        answer.unwrap_or_else(|e| panic!("{pool}: {e}"));
    }
}

#[tokio::test]
async fn mariadb_a_wrong_ca_a_host_name_mismatch_an_expired_certificate_and_a_plaintext_server_each_stop_start_up_by_name()
 {
    let dir = TlsDir::new("tls-my-refused");
    let pki = Pki::new(&dir, "test");
    let other = Pki::new(&dir, "other");
    let server = pki.server("server", &["localhost"], false);
    let expired = pki.server("expired", &["localhost"], true);
    let my = TlsMariaDb::start(&dir, &pki.ca_file(), &server).await;
    let right = my.url(
        "root",
        "localhost",
        "",
        &query(&pki.ca_file(), "VERIFY_IDENTITY", None, true),
    );
    connect(&right).await.expect("the right CA connects");

    let wrong = my.url(
        "root",
        "localhost",
        "",
        &query(&other.ca_file(), "VERIFY_IDENTITY", None, true),
    );
    refused(&wrong, "primary", "not signed by a CA this client trusts").await;
    let (ok, log) = migrate(&wrong, &[]);
    assert!(
        !ok && log.contains("cannot connect to the primary database")
            && log.contains("not signed by a CA this client trusts"),
        "migrate stops, naming the connection and the reason: {log}"
    );

    let by_ip = |mode| {
        my.url(
            "root",
            "127.0.0.1",
            "",
            &query(&pki.ca_file(), mode, None, true),
        )
    };
    refused(
        &by_ip("VERIFY_IDENTITY"),
        "primary",
        "does not name the host of the URL",
    )
    .await;
    connect(&by_ip("VERIFY_CA"))
        .await
        .expect("VERIFY_CA checks the chain only");

    my.serve_certificate(&expired).await;
    refused(&right, "primary", "has expired").await;
    connect(&my.url("root", "localhost", "", "ssl-mode=REQUIRED"))
        .await
        .expect("REQUIRED does not verify");

    // MariaDB 10.x offers no TLS without certificates: a server of its own.
    let plain = throwaway_db::MariaDb::start()
        .await
        .expect("a plaintext MariaDB");
    let url = |mode: &str| format!("mysql://root@localhost:{}/?ssl-mode={mode}", plain.port());
    refused(&url("REQUIRED"), "primary", "offers no TLS").await;
    connect(&url("PREFERRED"))
        .await
        .expect("PREFERRED falls back to plaintext");
}

#[tokio::test]
async fn mariadb_a_client_certificate_the_server_requires_is_sent_from_ssl_cert_and_ssl_key() {
    let dir = TlsDir::new("tls-my-client");
    let pki = Pki::new(&dir, "test");
    let other = Pki::new(&dir, "other");
    let server = pki.server("server", &["localhost"], false);
    let my = TlsMariaDb::start(&dir, &pki.ca_file(), &server).await;
    my.db
        .execute("CREATE USER 'certuser'@'%' REQUIRE X509; GRANT SELECT ON *.* TO 'certuser'@'%'")
        .await
        .expect("a user that must show a certificate");
    let client = pki.client("client", "certuser");
    let stranger = other.client("stranger", "certuser");

    let with = my.url(
        "certuser",
        "localhost",
        "",
        &query(&pki.ca_file(), "VERIFY_IDENTITY", Some(&client), true),
    );
    let store = connect(&with)
        .await
        .expect("REQUIRE X509: the client certificate is sent");
    store.ping().await.expect("a round-trip as certuser");

    let without = my.url(
        "certuser",
        "localhost",
        "",
        &query(&pki.ca_file(), "VERIFY_IDENTITY", None, true),
    );
    refused(&without, "primary", "Access denied").await;
    let foreign = my.url(
        "certuser",
        "localhost",
        "",
        &query(&pki.ca_file(), "VERIFY_IDENTITY", Some(&stranger), true),
    );
    refused(&foreign, "primary", "certificate").await;
}

// === refused settings ===

#[test]
fn a_tls_setting_this_build_cannot_honour_stops_start_up_naming_it() {
    for (url, named) in [
        (
            "postgres://app@127.0.0.1:1/x?sslmode=bogus",
            "sslmode=bogus",
        ),
        (
            "postgres://app@127.0.0.1:1/x?sslmode=allow",
            "sslmode=allow",
        ),
        (
            "postgres://app@127.0.0.1:1/x?sslmode=verify-full&sslcrl=/crl.pem",
            "sslcrl",
        ),
        (
            "postgres://app@127.0.0.1:1/x?sslnegotiation=direct",
            "sslnegotiation=direct",
        ),
        ("postgres://app@127.0.0.1:1/x?sslcert=/c.pem", "sslcert"),
        ("mysql://app@127.0.0.1:1/x?ssl-mode=bogus", "ssl-mode=bogus"),
        (
            "mysql://app@127.0.0.1:1/x?ssl-mode=REQUIRED&ssl-crl=/crl.pem",
            "ssl-crl",
        ),
        (
            "mariadb://app@127.0.0.1:1/x?tls-version=TLSv1.3",
            "tls-version",
        ),
    ] {
        let (ok, log) = migrate(url, &[]);
        assert!(
            !ok && log.contains("--database-url")
                && log.contains(&format!("TLS setting {named} is refused")),
            "{url}: refused at start-up, naming {named}: {log}"
        );
    }
}
