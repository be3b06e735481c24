//! TLS to the external systems: the simulator over HTTPS with a CA the test
//! made, one system behind mTLS; a wrong CA, an expired certificate, another
//! host's certificate, a missing client certificate and a plain HTTP server
//! each fail naming the system and the reason and are retried; rotated CA and
//! client certificate files are used without a restart; a file that cannot be
//! used is refused by name at start-up.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use autoapproval::approval::AttemptOutcome;
use autoapproval::domain::RequestType;
use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::processors::Step;
use autoapproval_sim::{SimHandle, SimListener};
use sqlx::PgPool;

use crate::support::tls::{Pem, TestCa, env_over, https_simulator, write_file};
use crate::support::{
    Db, Env, NewRequest, attempt_due_retry, candidate, fresh_dir, metric_sum, migrated,
    request_view,
};

/// Clients for every system at `sim`, trusting the CA file in `dir`
/// (`ca.pem`) and reading their files again before every call.
fn trusting(sim: &SimHandle, dir: &Path) -> ExternalArgs {
    let mut config = ExternalArgs::all_at(sim.base_url()).expect("defaults");
    config.tls.external_ca_file = Some(dir.join("ca.pem"));
    config.tls.external_tls_reload_interval = Duration::ZERO;
    config
}

async fn postgres(pool: PgPool) -> Db {
    Db::Postgres(migrated(pool).await)
}

/// Owner contract `id` inserted and attempted once.
async fn attempt_owner(env: &Env, db: &Db, id: i64) -> AttemptOutcome {
    NewRequest::ready_owner(id).insert(db).await;
    env.attempt(&candidate(id, None)).await
}

/// The reason of a retry `outcome` at `step`; panics on any other outcome.
fn retried_at(outcome: AttemptOutcome, step: Step) -> String {
    match outcome {
        AttemptOutcome::RetryScheduled {
            step: at, reason, ..
        } => {
            assert_eq!(at, step, "{}", reason.reason);
            reason.reason
        }
        other => panic!("expected a retry at {step:?}, got {other:?}"),
    }
}

#[sqlx::test(migrations = false)]
async fn an_owner_contract_is_approved_over_https_verified_against_the_given_ca(pool: PgPool) {
    let db = postgres(pool).await;
    let dir = fresh_dir("tls-ok");
    let ca = TestCa::new("external CA");
    write_file(&dir, "ca.pem", &ca.pem);
    let sim = https_simulator(&ca.server(), None).await;
    assert!(sim.base_url().starts_with("https://"));
    let config = trusting(&sim, &dir);
    let env = env_over(db.clone(), sim, &config).await.expect("clients");

    assert_eq!(attempt_owner(&env, &db, 1).await, AttemptOutcome::Approved);
    assert_eq!(request_view(&db, 1).await.status, "APPROVED");
    let made = env.sim.stats().for_request(1);
    assert_eq!((made.owner, made.store), (1, 1));
    assert_eq!(env.sim.handshake_failures(), 0);
}

/// A simulator whose main port (e-sign, store, ad) has a good certificate of
/// `ca`, and the owner service on a port of its own with `owner_cert`; the
/// engine trusts `ca` only. Owner contract 1's attempt stops at the owner.
async fn owner_behind(
    db: &Db,
    ca: &TestCa,
    owner_cert: &Pem,
    tag: &str,
) -> (Env, String, SimListener) {
    let dir = fresh_dir(tag);
    write_file(&dir, "ca.pem", &ca.pem);
    let mut sim = https_simulator(&ca.server(), None).await;
    let owner = sim
        .add_listener(
            "127.0.0.1:0".parse().expect("addr"),
            Some(&TestCa::sim_tls(owner_cert, None)),
        )
        .await
        .expect("the owner's port");
    let mut config = trusting(&sim, &dir);
    config.owner_url = owner.url();
    let env = env_over(db.clone(), sim, &config).await.expect("clients");
    let reason = retried_at(attempt_owner(&env, db, 1).await, Step::Owner);
    assert!(
        reason.starts_with("owner create_owner: TLS with the owner service failed: "),
        "{reason}"
    );
    // Retried, not lost: the state waits for its retry, nothing was created.
    let state = env.store.state(1).await.unwrap().expect("the state row");
    assert_eq!(state.retry_count, 1);
    assert!(
        state
            .last_reason
            .as_deref()
            .is_some_and(|r| r.contains("owner service"))
    );
    assert_eq!(env.sim.stats().for_request(1).owner, 0);
    assert_eq!(
        metric_sum(
            &env.metrics.encode(),
            "autoapproval_external_calls_total",
            &["system=\"owner\"", "result=\"transient\""],
        ),
        1.0
    );
    (env, reason, owner)
}

#[sqlx::test(migrations = false)]
async fn a_certificate_of_another_ca_fails_naming_the_owner_service_and_is_retried(pool: PgPool) {
    let db = postgres(pool).await;
    let ca = TestCa::new("external CA");
    let other = TestCa::new("someone else's CA");
    let (env, reason, owner) = owner_behind(&db, &ca, &other.server(), "tls-wrong-ca").await;
    assert!(
        reason.contains("the server's certificate is not signed by a trusted CA: checked against the CAs of --external-ca-file"),
        "{reason}"
    );

    // Once the owner service shows a certificate of the trusted CA, the retry approves.
    owner
        .set_tls(&TestCa::sim_tls(&ca.server(), None))
        .expect("a good certificate");
    assert_eq!(
        attempt_due_retry(&env, 1, RequestType::OwnerContract).await,
        AttemptOutcome::Approved
    );
    assert_eq!(env.sim.stats().for_request(1).owner, 1);
}

#[sqlx::test(migrations = false)]
async fn an_expired_server_certificate_fails_naming_the_owner_service(pool: PgPool) {
    let db = postgres(pool).await;
    let ca = TestCa::new("external CA");
    let (_env, reason, _) = owner_behind(&db, &ca, &ca.expired_server(), "tls-expired").await;
    assert!(
        reason.contains("the server's certificate has expired"),
        "{reason}"
    );
}

#[sqlx::test(migrations = false)]
async fn a_certificate_for_another_host_fails_naming_the_host(pool: PgPool) {
    let db = postgres(pool).await;
    let ca = TestCa::new("external CA");
    let (_env, reason, _) =
        owner_behind(&db, &ca, &ca.server_for(&["owner.example"]), "tls-host").await;
    assert!(
        reason.contains("the server's certificate is not valid for the host name \"127.0.0.1\""),
        "{reason}"
    );
}

#[sqlx::test(migrations = false)]
async fn a_plain_http_server_behind_an_https_url_fails_saying_so(pool: PgPool) {
    let db = postgres(pool).await;
    let dir = fresh_dir("tls-plain");
    let ca = TestCa::new("external CA");
    write_file(&dir, "ca.pem", &ca.pem);
    let mut sim = https_simulator(&ca.server(), None).await;
    let plain = sim
        .add_listener("127.0.0.1:0".parse().expect("addr"), None)
        .await
        .expect("a plain port");
    let mut config = trusting(&sim, &dir);
    config.owner_url = plain.url().replace("http://", "https://");
    let env = env_over(db.clone(), sim, &config).await.expect("clients");
    let reason = retried_at(attempt_owner(&env, &db, 1).await, Step::Owner);
    assert!(
        reason.contains("TLS with the owner service failed: the server does not speak TLS"),
        "{reason}"
    );
}

#[sqlx::test(migrations = false)]
async fn the_mtls_store_refuses_a_client_without_certificate_and_takes_one_with(pool: PgPool) {
    let db = postgres(pool).await;
    let dir = fresh_dir("tls-mtls");
    let ca = TestCa::new("external CA");
    let clients_ca = TestCa::new("client CA");
    write_file(&dir, "ca.pem", &ca.pem);
    let mut sim = https_simulator(&ca.server(), None).await;
    let store = sim
        .add_listener(
            "127.0.0.1:0".parse().expect("addr"),
            Some(&TestCa::sim_tls(&ca.server(), Some(&clients_ca))),
        )
        .await
        .expect("the store's mTLS port");
    let mut config = trusting(&sim, &dir);
    config.store_url = store.url();

    let env = env_over(db.clone(), sim, &config).await.expect("clients");
    let reason = retried_at(attempt_owner(&env, &db, 1).await, Step::Store);
    assert!(
        reason.contains(
            "TLS with the store service failed: the server requires a client certificate and none is configured (--store-client-cert-file or --external-client-cert-file)"
        ),
        "{reason}"
    );
    assert_eq!(env.sim.stats().for_request(1).store, 0);
    assert!(env.sim.handshake_failures() >= 1);

    // The same engine's settings with the store's own client certificate: the retry approves.
    let client = clients_ca.client("autoapproval");
    config.tls.store_client_cert_file = Some(write_file(&dir, "client.crt", &client.cert));
    config.tls.store_client_key_file = Some(write_file(&dir, "client.key", &client.key));
    let Env { sim, .. } = env;
    let env = env_over(db.clone(), sim, &config).await.expect("clients");
    assert_eq!(
        attempt_due_retry(&env, 1, RequestType::OwnerContract).await,
        AttemptOutcome::Approved
    );
    let made = env.sim.stats().for_request(1);
    assert_eq!((made.owner, made.store), (1, 1));
}

/// Log lines written while the guard lives, on this thread.
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[sqlx::test(migrations = false)]
async fn rotated_ca_and_client_certificate_files_are_used_without_a_restart(pool: PgPool) {
    let db = postgres(pool).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let writer = log.clone();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || Captured(writer.clone()))
            .with_ansi(false)
            .finish(),
    );
    let dir = fresh_dir("tls-rotate");
    let (ca1, clients1) = (TestCa::new("CA 1"), TestCa::new("client CA 1"));
    let client1 = clients1.client("autoapproval");
    write_file(&dir, "ca.pem", &ca1.pem);
    write_file(&dir, "client.crt", &client1.cert);
    write_file(&dir, "client.key", &client1.key);
    let sim = https_simulator(&ca1.server(), Some(&clients1)).await;
    let mut config = trusting(&sim, &dir);
    config.tls.external_client_cert_file = Some(dir.join("client.crt"));
    config.tls.external_client_key_file = Some(dir.join("client.key"));
    let env = env_over(db.clone(), sim, &config).await.expect("clients");
    assert_eq!(attempt_owner(&env, &db, 1).await, AttemptOutcome::Approved);

    // Both sides rotate: the server to CA 2 and client CA 2, the files on disk
    // (written as the kubelet writes a Secret's) to CA 2 and a client certificate of client CA 2.
    let old = fresh_dir("tls-rotate-old");
    for name in ["ca.pem", "client.crt", "client.key"] {
        std::fs::copy(dir.join(name), old.join(name)).expect("a copy of the old files");
    }
    let (ca2, clients2) = (TestCa::new("CA 2"), TestCa::new("client CA 2"));
    let client2 = clients2.client("autoapproval");
    env.sim
        .set_tls(&TestCa::sim_tls(&ca2.server(), Some(&clients2)))
        .expect("the rotated server certificate");
    write_file(&dir, "ca.pem", &ca2.pem);
    write_file(&dir, "client.crt", &client2.cert);
    write_file(&dir, "client.key", &client2.key);

    // The same engine, not restarted, approves with the new files ...
    assert_eq!(attempt_owner(&env, &db, 2).await, AttemptOutcome::Approved);
    let metrics = env.metrics.encode();
    assert!(
        metric_sum(
            &metrics,
            "autoapproval_external_tls_reloads_total",
            &["system=\"owner\"", "result=\"loaded\""]
        ) >= 1.0,
        "{metrics}"
    );
    // ... where a client still on either old file is refused: the old CA
    // does not verify the rotated server, the old client certificate is not
    // of the client CA the server now requires.
    let stale = |ca: &Path, cert: &Path, key: &Path| {
        let mut stale = config.clone();
        stale.tls.external_ca_file = Some(ca.to_owned());
        stale.tls.external_client_cert_file = Some(cert.to_owned());
        stale.tls.external_client_key_file = Some(key.to_owned());
        HttpExternalSystems::build(&stale).expect("clients on a mix of old and new files")
    };
    let refused = stale(
        &old.join("ca.pem"),
        &dir.join("client.crt"),
        &dir.join("client.key"),
    )
    .esign
    .contract_status("EC-2")
    .await
    .expect_err("the old CA does not verify the rotated server")
    .to_string();
    assert!(
        refused.contains(
            "TLS with the e-sign service failed: the server's certificate is not signed by a trusted CA"
        ),
        "{refused}"
    );
    let refused = stale(
        &dir.join("ca.pem"),
        &old.join("client.crt"),
        &old.join("client.key"),
    )
    .esign
    .contract_status("EC-2")
    .await
    .expect_err("the rotated server refuses the old client certificate")
    .to_string();
    assert!(
        refused.contains(
            "TLS with the e-sign service failed: the server refused our client certificate"
        ),
        "{refused}"
    );

    // A broken file is refused by name, the last good ones stay in use.
    std::fs::write(dir.join("client.key"), "not a key").expect("write");
    assert_eq!(attempt_owner(&env, &db, 3).await, AttemptOutcome::Approved);
    let metrics = env.metrics.encode();
    for system in ["esign", "owner", "store"] {
        let labels = [format!("system=\"{system}\"")];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        assert_eq!(
            metric_sum(
                &metrics,
                "autoapproval_external_tls_files_rejected",
                &labels
            ),
            1.0,
            "{system}: {metrics}"
        );
    }
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    let key = dir.join("client.key");
    assert!(
        text.contains(&format!("--external-client-key-file {}", key.display()))
            && text.contains("the last good ones stay in use"),
        "{text}"
    );
    // Mended, it is taken again.
    write_file(&dir, "client.key", &client2.key);
    assert_eq!(attempt_owner(&env, &db, 4).await, AttemptOutcome::Approved);
    let metrics = env.metrics.encode();
    assert_eq!(
        metric_sum(
            &metrics,
            "autoapproval_external_tls_files_rejected",
            &["system=\"owner\""]
        ),
        0.0,
        "{metrics}"
    );
}

/// `autoapproval run` with `args` after a database nobody listens on: its
/// exit status and stderr. Every setting is checked before anything is contacted.
fn run_with(args: &[&str]) -> (bool, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("AUTOAPPROVAL_") {
            command.env_remove(key);
        }
    }
    let output = command
        .args(["run", "--database-url", "postgres://127.0.0.1:1/none"])
        .args(args)
        .env("AUTOAPPROVAL_KUBECONFIG", "/nonexistent")
        .output()
        .expect("autoapproval run");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn run_refuses_a_missing_unreadable_or_invalid_tls_file_naming_it() {
    let dir = fresh_dir("tls-start-up");
    let ca = TestCa::new("external CA");
    let client = ca.client("autoapproval");
    let other = ca.client("someone else");
    let garbage = write_file(&dir, "garbage.pem", "not PEM at all");
    let ca_file = write_file(&dir, "ca.pem", &ca.pem);
    let cert = write_file(&dir, "client.crt", &client.cert);
    let other_key = write_file(&dir, "other.key", &other.key);
    let missing = dir.join("missing.pem");
    let text = |p: &Path| p.display().to_string();
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            vec!["--owner-ca-file".into(), text(&missing)],
            format!("--owner-ca-file {}: cannot be read", text(&missing)),
        ),
        (
            vec!["--external-ca-file".into(), text(&garbage)],
            format!(
                "--external-ca-file {}: no PEM certificate in it",
                text(&garbage)
            ),
        ),
        (
            vec!["--ad-client-cert-file".into(), text(&cert)],
            "--ad-client-cert-file is set without --ad-client-key-file".into(),
        ),
        (
            vec![
                "--external-ca-file".into(),
                text(&ca_file),
                "--store-client-cert-file".into(),
                text(&cert),
                "--store-client-key-file".into(),
                text(&other_key),
            ],
            format!(
                "--store-client-key-file {}: not the key of --store-client-cert-file {}",
                text(&other_key),
                text(&cert)
            ),
        ),
    ];
    for (args, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stderr) = run_with(&args);
        assert!(!ok && stderr.contains(&expected), "{args:?}: {stderr}");
    }
    // Good files pass this check: the run goes on to the (missing) kubeconfig.
    let key = write_file(&dir, "client.key", &client.key);
    let (ok, stderr) = run_with(&[
        "--external-ca-file",
        &text(&ca_file),
        "--external-client-cert-file",
        &text(&cert),
        "--external-client-key-file",
        &text(&key),
    ]);
    assert!(!ok && stderr.contains("/nonexistent"), "{stderr}");
}

#[test]
fn no_flag_turns_tls_verification_off() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(["run", "--help"])
        .output()
        .expect("autoapproval run --help");
    let help = String::from_utf8_lossy(&output.stdout).to_lowercase();
    assert!(help.contains("--external-ca-file"), "{help}");
    for word in [
        "insecure",
        "skip-verify",
        "no-verify",
        "accept-invalid",
        "danger",
    ] {
        assert!(!help.contains(word), "`run --help` offers {word}: {help}");
    }
}
