//! The shipped binary and its command line, as a user and a kubelet meet
//! them: what it is linked from, its subcommands, its settings, its CRD and
//! a whole run to SIGTERM.

use std::time::Duration;

use autoapproval::controller::crd::{self, AutoApproval, Phase};
use kube::api::Api;
use kube_testserver::{Options, TestServer};

use crate::support::{
    AsDb, Db, NS, backends, client_for, database_url, eventually, free_port, fresh_dir,
    install_crd, kubeconfig_in, metric_sum, on_both, owner_now, request_status, spawn_run,
    stop_on_sigterm, waiting_owner_now,
};

#[test]
fn the_checked_in_crd_is_what_autoapproval_crd_prints() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .arg("crd")
        .output()
        .expect("autoapproval crd");
    assert!(output.status.success());
    let checked_in = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/autoapproval.yaml"),
    )
    .expect("crds/autoapproval.yaml");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        checked_in,
        "crds/autoapproval.yaml is stale: run `cargo run -- crd > crds/autoapproval.yaml`"
    );
}

#[test]
fn run_refuses_a_bad_setting_naming_it() {
    for (flag, value) in [
        ("--poll-period", "0"),
        ("--shards", "0"),
        ("--poll-period", "soon"),
        ("--otlp-sampling-ratio", "1.5"),
        ("--otlp-endpoint", "https://collector:4318"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
            .args([
                "run",
                "--database-url",
                "postgres://127.0.0.1:1/none",
                flag,
                value,
            ])
            .env("AUTOAPPROVAL_KUBECONFIG", "/nonexistent")
            .output()
            .expect("autoapproval run");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
    }
}

on_both!(the_binary_approves_serves_its_probes_and_stops_on_sigterm);
async fn the_binary_approves_serves_its_probes_and_stops_on_sigterm(db: Db) {
    let (server, _, sim) = backends().await;
    let dir = fresh_dir("run");
    let kubeconfig = kubeconfig_in(&dir, &server);
    let port = free_port();

    let sim_url = sim.base_url();
    let child = spawn_run(
        &kubeconfig,
        port,
        &db,
        &["--namespace", NS, "--replica-name", "bin-1"],
        &[
            ("AUTOAPPROVAL_ESIGN_URL", &sim_url),
            ("AUTOAPPROVAL_OWNER_URL", &sim_url),
            ("AUTOAPPROVAL_STORE_URL", &sim_url),
            ("AUTOAPPROVAL_AD_URL", &sim_url),
        ],
    );

    let http = reqwest::Client::new();
    let ready = format!("http://127.0.0.1:{port}/readyz");
    eventually("/readyz to answer 200", || async {
        let response = http.get(&ready).send().await.ok()?;
        (response.status() == 200).then_some(())
    })
    .await;
    owner_now(120).insert(&db).await;
    eventually("request 120 to be approved", || async {
        (request_status(&db, 120).await == "APPROVED").then_some(())
    })
    .await;
    let metrics = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .expect("/metrics")
        .text()
        .await
        .expect("body");
    assert!(
        metrics.contains("autoapproval_pickup_latency_seconds_count 1"),
        "{metrics}"
    );

    let output = stop_on_sigterm(child, Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(&dir);
    let logs = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{logs}");
    assert!(logs.contains("controller stopped"), "{logs}");
    let api: Api<AutoApproval> = Api::namespaced(client_for(&server), NS);
    let cr = api.get(&crd::cr_name(120)).await.expect("CR");
    assert_eq!(cr.status.and_then(|s| s.phase), Some(Phase::Approved));
}

/// The shipped binary's dependency graph (normal and build edges, from
/// `cargo metadata`): the packages it is linked from.
fn shipped_closure(root: &str) -> std::collections::BTreeSet<String> {
    let rustc = std::process::Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc names its host");
    // This machine's graph only: other platforms' crates need not be downloaded.
    let output = cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--filter-platform",
        &host,
    ]);
    let metadata: serde_json::Value = serde_json::from_slice(&output).expect("JSON");
    let name_of = |id: &str| -> String {
        metadata["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .find(|p| p["id"] == id)
            .and_then(|p| p["name"].as_str())
            .expect("a package for every id")
            .to_owned()
    };
    let nodes = metadata["resolve"]["nodes"].as_array().expect("nodes");
    let root_id = nodes
        .iter()
        .map(|n| n["id"].as_str().expect("id"))
        .find(|id| name_of(id) == root)
        .expect("the root package");
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec![root_id.to_owned()];
    while let Some(id) = todo.pop() {
        let node = nodes.iter().find(|n| n["id"] == id.as_str()).expect("node");
        for dep in node["deps"].as_array().expect("deps") {
            // A dev-only edge is not linked into the binary.
            let linked = dep["dep_kinds"]
                .as_array()
                .expect("dep_kinds")
                .iter()
                .any(|k| k["kind"].is_null() || k["kind"] == "build");
            let dep_id = dep["pkg"].as_str().expect("pkg").to_owned();
            if linked && seen.insert(name_of(&dep_id)) {
                todo.push(dep_id);
            }
        }
    }
    seen
}

#[test]
fn the_shipped_binary_links_no_test_tooling() {
    const TOOLING: [&str; 5] = [
        "kube-testserver",
        "autoapproval-sim",
        "throwaway-db",
        "control-plane",
        "autoapproval-lab",
    ];
    let shipped = shipped_closure("autoapproval");
    for wanted in ["kube", "sqlx", "axum"] {
        assert!(
            shipped.contains(wanted),
            "{wanted} missing from {shipped:?}"
        );
    }
    for tool in TOOLING {
        assert!(
            !shipped.contains(tool),
            "{tool} is a normal dependency of the product: make it a dev-dependency"
        );
    }
    // The walk sees the tooling where it is linked: the lab depends on these.
    let lab = shipped_closure("autoapproval-lab");
    for tool in &TOOLING[..3] {
        assert!(lab.contains(*tool), "{tool} not seen in the lab's graph");
    }
    // The poll turn the lab and the tests drive is behind `test-support`,
    // which the binary's own build (as the Dockerfile runs it) never enables.
    assert_eq!(shipped_features(), ["otlp"]);
    assert!(features_of("autoapproval-lab").contains(&"test-support".to_owned()));
}

/// The product's features in its build for the image: `cargo build -p
/// autoapproval --features otlp`, no dev-dependency unified in.
fn shipped_features() -> Vec<String> {
    let output = cargo(&[
        "tree",
        "-p",
        "autoapproval",
        "--features",
        "otlp",
        "-e",
        "no-dev",
        "--depth",
        "0",
        "--format",
        "{f}",
    ]);
    let mut features: Vec<String> = String::from_utf8_lossy(&output)
        .trim()
        .split(',')
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    features.sort();
    features
}

/// What `cargo <args> --locked --offline` prints, run on this workspace.
fn cargo(args: &[&str]) -> Vec<u8> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args(args)
        .args(["--locked", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// The features of the product that `package` asks for on its dependency line.
fn features_of(package: &str) -> Vec<String> {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates")
        .join(package)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).expect("the package's manifest");
    let line = text
        .lines()
        .find(|l| l.starts_with("autoapproval = "))
        .expect("a dependency on the product");
    line.split('[')
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .map(|list| {
            list.split(',')
                .map(|f| f.trim().trim_matches('"').to_owned())
                .filter(|f| !f.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn help_lists_only_the_controllers_subcommands() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .arg("--help")
        .output()
        .expect("autoapproval --help");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        commands,
        [
            "migrate",
            "run",
            "check",
            "crd",
            "request",
            "pause",
            "resume",
            "shadow-report",
            "help"
        ],
        "{help}"
    );
}

/// `autoapproval <args>`'s exit status and stderr, with no `AUTOAPPROVAL_*`
/// variable of this process leaking in. A binary still running after 60 s
/// is killed and reported as a failure (a hang detector, not a speed target).
fn run_binary(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    use std::io::Read;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("AUTOAPPROVAL_") {
            command.env_remove(key);
        }
    }
    let mut child = command
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("autoapproval starts");
    let mut stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = reader.join().expect("stderr reader");
    match status {
        Some(status) => (status.success(), text),
        None => (false, format!("{text}[still running after 60 s: killed]")),
    }
}

#[test]
fn a_refused_database_is_named_at_once_without_its_password() {
    let (ok, stderr) = run_binary(
        &[
            "migrate",
            "--database-url",
            "postgres://app:hunter2@127.0.0.1:1/contracts",
        ],
        &[],
    );
    assert!(!ok);
    assert_eq!(
        stderr,
        "autoapproval: cannot connect to the primary database at \
         postgres://app:***@127.0.0.1:1/contracts: error communicating with database: \
         Connection refused (os error 111)\n"
    );
}

#[test]
fn a_window_beyond_any_date_is_refused_before_anything_starts() {
    let (ok, stderr) = run_binary(
        &[
            "run",
            "--database-url",
            "postgres://127.0.0.1:1/none",
            "--window",
            "99999999d",
        ],
        &[],
    );
    assert!(!ok);
    assert_eq!(
        stderr,
        "autoapproval: --window 99999999d: must be at most 36500d (100 years)\n"
    );
}

#[test]
fn help_never_prints_a_database_password() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(["run", "--help"])
        .env(
            "AUTOAPPROVAL_DATABASE_URL",
            "postgres://app:hunter2@db:5432/contracts",
        )
        .env(
            "AUTOAPPROVAL_READ_DATABASE_URL",
            "postgres://app:hunter3@replica:5432/contracts",
        )
        .output()
        .expect("run --help");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("AUTOAPPROVAL_DATABASE_URL"), "{help}");
    assert!(
        !help.contains("hunter2") && !help.contains("hunter3"),
        "{help}"
    );
}

on_both!(run_without_the_crd_says_how_to_install_it);
async fn run_without_the_crd_says_how_to_install_it(db: Db) {
    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    let dir = fresh_dir("nocrd");
    let kubeconfig = kubeconfig_in(&dir, &server);
    let url = database_url(&db);
    let kubeconfig = kubeconfig.display().to_string();
    let (ok, stderr) = tokio::task::spawn_blocking(move || {
        run_binary(
            &[
                "run",
                "--namespace",
                NS,
                "--kubeconfig",
                &kubeconfig,
                "--listen",
                "127.0.0.1:0",
            ],
            &[("AUTOAPPROVAL_DATABASE_URL", &url)],
        )
    })
    .await
    .expect("joins");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.ends_with(
            "autoapproval: CRD autoapprovals.autoapproval.io is not installed: kubectl apply -f crds/\n"
        ),
        "{stderr}"
    );
}

on_both!(an_unreachable_api_server_fails_liveness_and_sigterm_exits_at_once);
/// A replica whose API server refuses every connection says so, naming the
/// address, without a line every turn; its liveness probe fails once the
/// silence passes `--api-liveness-timeout`, so the kubelet restarts it; and
/// SIGTERM ends it at once when nothing runs, not after the grace period.
async fn an_unreachable_api_server_fails_liveness_and_sigterm_exits_at_once(db: Db) {
    let dir = fresh_dir("noapi");
    let kubeconfig = dir.join("kubeconfig");
    // Port 1 on loopback: nothing listens, every connection is refused.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    namespace: default\n    user: u\n\
         current-context: c\nusers:\n- name: u\n  user: {}\n",
    )
    .expect("kubeconfig");
    let port = free_port();
    let child = spawn_run(
        &kubeconfig,
        port,
        &db,
        &[
            "--replica-name",
            "cut-off",
            "--lease-duration",
            "3s",
            "--renew-deadline",
            "2s",
            "--retry-period",
            "500ms",
            "--api-liveness-timeout",
            "3s",
            "--shutdown-grace",
            "60s",
        ],
        &[("NO_COLOR", "1")],
    );

    let http = reqwest::Client::new();
    let healthz = format!("http://127.0.0.1:{port}/healthz");
    let body = eventually("/healthz to fail", || async {
        let response = http.get(&healthz).send().await.ok()?;
        (response.status() == 503).then_some(response.text().await.ok()?)
    })
    .await
    .expect("a body");
    assert!(
        body.starts_with("not live: no answer from the API server at http://127.0.0.1:1/ for "),
        "{body}"
    );

    // Well within the 60 s grace: nothing was running.
    let output = stop_on_sigterm(child, Duration::from_secs(10)).await;
    let _ = std::fs::remove_dir_all(&dir);
    let logs = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{logs}");
    let named = logs
        .lines()
        .filter(|l| l.contains("cannot reach the API server") && l.contains("127.0.0.1:1"))
        .count();
    assert_eq!(named, 1, "one line when the outage begins: {logs}");
    let per_turn = logs.lines().filter(|l| l.contains("WARN")).count();
    assert!(per_turn <= 4, "no line every turn: {logs}");
}

on_both!(a_replica_with_another_shard_count_refuses_to_start);
/// Two replicas started with different `--shards` would both own one
/// request (shard 3 of 16 and shard 3 of 8 share request 19): the first
/// records its K in the database, and the second refuses to start, naming
/// the value in force and how to change it.
async fn a_replica_with_another_shard_count_refuses_to_start(db: Db) {
    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    install_crd(&client_for(&server)).await;
    let dir = fresh_dir("k");
    let kubeconfig = kubeconfig_in(&dir, &server);
    let first = spawn_run(
        &kubeconfig,
        free_port(),
        &db,
        &[
            "--namespace",
            NS,
            "--replica-name",
            "first",
            "--shards",
            "16",
        ],
        &[],
    );
    eventually("the first replica to record its K", || async {
        (db.fetch_i64("SELECT count(*) FROM shard_layout").await == 1).then_some(())
    })
    .await;

    let second = spawn_run(
        &kubeconfig,
        free_port(),
        &db,
        &[
            "--namespace",
            NS,
            "--replica-name",
            "second",
            "--shards",
            "8",
        ],
        &[],
    );
    let refused = tokio::time::timeout(Duration::from_secs(30), second.wait_with_output())
        .await
        .expect("the second replica exits")
        .expect("output");
    let stopped = stop_on_sigterm(first, Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(&dir);

    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "autoapproval: --shards 8 disagrees with the 16 shards in force (recorded by first at "
        ),
        "{stderr}"
    );
    assert!(
        stderr.trim_end().ends_with(
            "start with --shards 16, or change the number for every replica: stop them all, \
             run DELETE FROM shard_layout as the controller's role, and start them with --shards 8 \
             (README: Changing the number of shards)"
        ),
        "{stderr}"
    );
    assert!(stopped.status.success(), "the first replica ran on");
}

/// `autoapproval run` as `replica` of `fleet` (the namespace's when
/// `None`), against `db` and the API server of `kubeconfig`.
fn spawn_fleet_replica(
    kubeconfig: &std::path::Path,
    db: &Db,
    replica: &str,
    fleet: Option<&str>,
) -> tokio::process::Child {
    let mut args = vec!["--namespace", NS, "--replica-name", replica];
    if let Some(fleet) = fleet {
        args.extend(["--fleet", fleet]);
    }
    spawn_run(kubeconfig, free_port(), db, &args, &[])
}

/// Waits for a replica that must refuse to start: its stderr.
async fn refused(child: tokio::process::Child) -> String {
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the replica exits")
        .expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    stderr
}

/// The refusal's advice, after `(recorded by … at …)`, for a database `owner` owns.
fn take_over_advice(owner: &str) -> String {
    format!(
        "and two fleets on one database take each other's requests: start this replica with \
         --fleet {owner} if it is one of that fleet's, or take the database over deliberately: \
         stop every replica of {owner}, run DELETE FROM shard_layout as the controller's role, \
         and start this fleet (OPERATING.md: One fleet per database)"
    )
}

on_both!(a_replica_of_another_fleet_refuses_to_start_until_the_database_is_taken_over);
/// Two fleets on one database (another namespace's release, a DR cluster)
/// would each hold every shard, their Leases being per namespace: the first
/// replica records its fleet (by default its namespace), a replica of
/// another fleet refuses to start naming it and the take-over, and after
/// the documented take-over (the old fleet stopped, the layout deleted) the
/// new fleet starts and owns the database.
async fn a_replica_of_another_fleet_refuses_to_start_until_the_database_is_taken_over(db: Db) {
    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    install_crd(&client_for(&server)).await;
    let dir = fresh_dir("fleet");
    let kubeconfig = kubeconfig_in(&dir, &server);
    let first = spawn_fleet_replica(&kubeconfig, &db, "first", None);
    eventually("the first replica to record its fleet", || async {
        (db.fetch_i64(&format!(
            "SELECT count(*) FROM shard_layout WHERE fleet = '{NS}' AND set_by = 'first'"
        ))
        .await
            == 1)
            .then_some(())
    })
    .await;

    let stderr = refused(spawn_fleet_replica(
        &kubeconfig,
        &db,
        "dr-1",
        Some("dr/autoapproval"),
    ))
    .await;
    assert!(
        stderr.contains(&format!(
            "autoapproval: --fleet dr/autoapproval: this database belongs to fleet {NS} (recorded by first at "
        )),
        "{stderr}"
    );
    assert!(
        stderr.trim_end().ends_with(&take_over_advice(NS)),
        "{stderr}"
    );

    // The take-over, as docs/OPERATING.md has it.
    let stopped = stop_on_sigterm(first, Duration::from_secs(30)).await;
    assert!(
        stopped.status.success(),
        "the first fleet ran on until stopped"
    );
    db.exec("DELETE FROM shard_layout").await;
    let taken_over = spawn_fleet_replica(&kubeconfig, &db, "dr-1", Some("dr/autoapproval"));
    eventually("the new fleet to record itself", || async {
        (db.fetch_i64(
            "SELECT count(*) FROM shard_layout WHERE fleet = 'dr/autoapproval' AND set_by = 'dr-1'",
        )
        .await
            == 1)
            .then_some(())
    })
    .await;
    // Now the old fleet is the other one.
    let stderr = refused(spawn_fleet_replica(&kubeconfig, &db, "first", None)).await;
    assert!(
        stderr.contains(&format!(
            "autoapproval: --fleet {NS}: this database belongs to fleet dr/autoapproval (recorded by dr-1 at "
        )),
        "{stderr}"
    );
    let ran = stop_on_sigterm(taken_over, Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        ran.status.success(),
        "the new fleet ran until stopped: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
}

on_both!(a_layout_recorded_without_a_fleet_is_adopted_by_the_first_fleet);
/// 0.2.0 recorded K in a `shard_layout` without a fleet column: the
/// migration adds the column (MySQL 8 has no ADD COLUMN IF NOT EXISTS), the
/// first replica to start adopts the layout for its fleet, saying so, and a
/// replica of another fleet is then refused.
async fn a_layout_recorded_without_a_fleet_is_adopted_by_the_first_fleet(db: Db) {
    // 0.2.0's table and row, and the fleet's migration not yet applied.
    db.exec("ALTER TABLE shard_layout DROP COLUMN fleet").await;
    db.exec(
        "INSERT INTO shard_layout (only_row, shard_count, set_by) VALUES (true, 16, 'old-replica')",
    )
    .await;
    let fleet_migration = match db {
        Db::Postgres(_) => 3,
        Db::Mysql(_) => 2,
    };
    db.exec(&format!(
        "DELETE FROM _autoapproval_migrations WHERE version = {fleet_migration}"
    ))
    .await;
    let migrate = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(["migrate", "--database-url", &database_url(&db)])
        .output()
        .expect("autoapproval migrate");
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    assert_eq!(
        db.fetch_i64(
            "SELECT count(*) FROM shard_layout WHERE fleet IS NULL AND set_by = 'old-replica'"
        )
        .await,
        1,
        "the migration keeps 0.2.0's layout"
    );

    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    install_crd(&client_for(&server)).await;
    let dir = fresh_dir("fleet-adopt");
    let kubeconfig = kubeconfig_in(&dir, &server);
    let adopter = spawn_fleet_replica(&kubeconfig, &db, "adopter", Some("contracts/autoapproval"));
    eventually("the first replica to adopt the layout", || async {
        (db.fetch_i64(
            "SELECT count(*) FROM shard_layout \
              WHERE fleet = 'contracts/autoapproval' AND set_by = 'adopter' AND shard_count = 16",
        )
        .await
            == 1)
            .then_some(())
    })
    .await;
    let stderr = refused(spawn_fleet_replica(
        &kubeconfig,
        &db,
        "other",
        Some("other"),
    ))
    .await;
    assert!(
        stderr.contains(
            "autoapproval: --fleet other: this database belongs to fleet contracts/autoapproval (recorded by adopter at "
        ),
        "{stderr}"
    );
    assert!(
        stderr
            .trim_end()
            .ends_with(&take_over_advice("contracts/autoapproval")),
        "{stderr}"
    );
    let ran = stop_on_sigterm(adopter, Duration::from_secs(30)).await;
    let _ = std::fs::remove_dir_all(&dir);
    let logs = String::from_utf8_lossy(&ran.stderr);
    assert!(ran.status.success(), "{logs}");
    assert!(
        logs.contains(
            "the shard layout an older version recorded had no fleet: it is now this fleet's"
        ),
        "{logs}"
    );
}

/// `autoapproval request …` against the database: (success, stdout, stderr).
async fn request_command(pool: &impl AsDb, args: &[&str]) -> (bool, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .arg("request")
        .args(args)
        .env("AUTOAPPROVAL_DATABASE_URL", database_url(pool))
        .env("USER", "olivia")
        .output()
        .await
        .expect("autoapproval request runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

on_both!(an_operator_shows_retries_pauses_and_resumes_a_request);
/// An operator without kubectl shows, retries, pauses and resumes a request
/// through the database; refusals name the request and the reason.
async fn an_operator_shows_retries_pauses_and_resumes_a_request(db: Db) {
    use autoapproval::db::ClaimOutcome;
    use autoapproval::domain::{Candidate, RequestType};

    let later = chrono::Utc::now() + chrono::Duration::minutes(10);
    waiting_owner_now(501).insert(&db).await;
    crate::support::insert_state(
        &db,
        501,
        "RETRY_WAITING",
        Some(later),
        2,
        chrono::Utc::now(),
    )
    .await;

    let (ok, shown, _) = request_command(&db, &["show", "501"]).await;
    assert!(ok, "{shown}");
    for part in [
        "request 501: OWNER_CONTRACT PENDING",
        "documents in review",
        "auto-approval: RETRY_WAITING",
        "2 retries, due",
        "paused: no",
    ] {
        assert!(shown.contains(part), "{part:?} in:\n{shown}");
    }

    let (ok, out, err) = request_command(&db, &["retry", "501"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("request 501 is due now"), "{out}");
    let (_, history, _) = request_command(&db, &["history", "501"]).await;
    assert!(history.contains("retry requested by olivia"), "{history}");

    let (ok, out, err) = request_command(&db, &["pause", "501"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("request 501 paused"), "{out}");
    let store = db.database();
    let state = store.state(501).await.unwrap().expect("state");
    let due = Candidate {
        request_id: 501,
        request_type: RequestType::OwnerContract,
        state_id: Some(state.id),
    };
    let claim = store
        .claim(
            &due,
            &crate::support::fence("a", 1),
            chrono::Utc::now(),
            300,
        )
        .await
        .unwrap();
    assert_eq!(claim, ClaimOutcome::Lost, "a paused request is not claimed");
    let (_, shown, _) = request_command(&db, &["show", "501"]).await;
    assert!(
        shown.contains("paused: by olivia (autoapproval request pause)"),
        "{shown}"
    );
    let (ok, _, err) = request_command(&db, &["pause", "501"]).await;
    assert!(
        !ok && err.contains("request 501 is already paused by olivia"),
        "{err}"
    );

    let (ok, out, err) = request_command(&db, &["resume", "501"]).await;
    assert!(ok && out.contains("request 501 resumed"), "{out}{err}");
    assert!(matches!(
        store
            .claim(
                &due,
                &crate::support::fence("a", 1),
                chrono::Utc::now(),
                300
            )
            .await
            .unwrap(),
        ClaimOutcome::Won(_)
    ));
    let (ok, _, err) = request_command(&db, &["retry", "501"]).await;
    assert!(
        !ok && err.contains("auto-approval is running request 501"),
        "{err}"
    );

    let (ok, _, err) = request_command(&db, &["show", "999"]).await;
    assert!(!ok && err.contains("request 999 does not exist"), "{err}");
}

/// The metric names a text exposition declares, with the suffixes its
/// samples carry: `_total` for counters, `_bucket`/`_sum`/`_count` for
/// histograms, `_info` for info metrics.
fn exported_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split(' ');
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            if !name.is_empty() {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// Appends every `expr` and `query` string of a Grafana dashboard to `out`.
fn collect_queries(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match v {
                    serde_json::Value::String(s) if key == "expr" || key == "query" => {
                        out.push_str(s);
                        out.push('\n');
                    }
                    _ => collect_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_queries(v, out)),
        _ => {}
    }
}

/// The `autoapproval_…` metric names a dashboard or rule file uses.
fn used_names(text: &str) -> std::collections::BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("autoapproval_"))
        .map(str::to_owned)
        .collect()
}

on_both!(every_metric_the_dashboard_and_the_alerts_use_is_one_the_binary_exports);
/// The dashboard and the alerts cannot drift from the binary: every metric
/// they use is one a running replica exports on /metrics, and the replica
/// exports the census, the pools and the API server requests it counts.
async fn every_metric_the_dashboard_and_the_alerts_use_is_one_the_binary_exports(db: Db) {
    let (server, _, sim) = backends().await;
    let dir = fresh_dir("run");
    let kubeconfig = kubeconfig_in(&dir, &server);
    let port = free_port();
    let sim_url = sim.base_url();
    let _child = spawn_run(
        &kubeconfig,
        port,
        &db,
        &[
            "--namespace",
            NS,
            "--replica-name",
            "bin-metrics",
            "--census-interval",
            "1s",
        ],
        &[
            ("AUTOAPPROVAL_ESIGN_URL", &sim_url),
            ("AUTOAPPROVAL_OWNER_URL", &sim_url),
            ("AUTOAPPROVAL_STORE_URL", &sim_url),
            ("AUTOAPPROVAL_AD_URL", &sim_url),
        ],
    );
    // One request approved (claims, external calls, outcomes, reconciles
    // counted) and one that waits for its documents (the census counts it).
    owner_now(130).insert(&db).await;
    waiting_owner_now(131).insert(&db).await;
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let text = eventually(
        "an approval and the leader's census on /metrics",
        || async {
            let text = http.get(&url).send().await.ok()?.text().await.ok()?;
            let approved = request_status(&db, 130).await == "APPROVED";
            let leading = metric_sum(&text, "autoapproval_leader", &[]) == 1.0;
            let waiting =
                metric_sum(&text, "autoapproval_requests", &[r#"state="waiting""#]) == 1.0;
            (approved && leading && waiting).then_some(text)
        },
    )
    .await
    .expect("the census");
    let _ = std::fs::remove_dir_all(&dir);

    let exported = exported_names(&text);
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/autoapproval");
    let mut used = std::collections::BTreeSet::new();
    let read = |file: &str| std::fs::read_to_string(chart.join(file)).expect("chart file");
    // The dashboard's queries: every `expr`, and the variables' `query`.
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("dashboards/autoapproval.json")).expect("dashboard JSON");
    let mut queries = String::new();
    collect_queries(&dashboard, &mut queries);
    // The rule template holds no metric name outside its expressions.
    for text in [queries, read("templates/prometheusrule.yaml")] {
        let names = used_names(&text);
        assert!(names.len() >= 7, "{names:?}");
        used.extend(names);
    }
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "used by the dashboard or the alerts, exported by no replica: {unknown:?}\n{text}"
    );
    for (metric, labels, least) in [
        ("autoapproval_shards", &[][..], 16.0),
        ("autoapproval_database_up", &[r#"pool="primary""#][..], 1.0),
        (
            "autoapproval_db_pool_max_connections",
            &[r#"pool="primary""#],
            10.0,
        ),
        (
            "autoapproval_db_pool_max_connections",
            &[r#"pool="coordination""#],
            2.0,
        ),
        (
            "autoapproval_kube_requests_total",
            &[r#"verb="watch""#, r#"status="200""#],
            1.0,
        ),
        (
            "autoapproval_kube_requests_total",
            &[r#"verb="create""#, r#"status="201""#],
            1.0,
        ),
    ] {
        assert!(
            metric_sum(&text, metric, labels) >= least,
            "{metric}{labels:?} below {least}:\n{text}"
        );
    }
    // The leader counts by state, and the units are declared.
    assert!(
        text.contains("# UNIT autoapproval_backlog_age_seconds seconds"),
        "{text}"
    );
    assert!(text.contains(r#"autoapproval_requests{state="in_progress",reason_class=""}"#));
}

/// `autoapproval check` on `url`: whether it exited 0, its stdout and its stderr.
async fn check(url: &str) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(["check", "--database-url", url])
        .env_remove("AUTOAPPROVAL_DATABASE_URL")
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("autoapproval check runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `check` refuses what `run` would refuse at start-up, with `run`'s message (the migration,
/// then the view), and passes, saying so, once the binding is usable.
async fn check_refuses_what_run_would_and_passes_once_the_binding_is_usable(db: Db, url: &str) {
    let (ok, _, stderr) = check(url).await;
    assert!(
        !ok && stderr.contains("the database lacks controller migration 0001"),
        "an empty database: {stderr}"
    );
    db.database().migrate(false).await.expect("controller set");
    let (ok, _, stderr) = check(url).await;
    assert!(
        !ok && stderr.contains(
            "autoapproval: binding to the business tables: SELECT on autoapproval_request"
        ),
        "no binding: {stderr}"
    );
    db.database().migrate(true).await.expect("reference set");
    let (ok, stdout, stderr) = check(url).await;
    assert!(ok, "{stderr}");
    assert_eq!(stdout, format!("{}\n", autoapproval::cli::CHECK_PASSED));
}

#[sqlx::test(migrations = false)]
async fn check_refuses_what_run_would_and_passes_once_the_binding_is_usable_on_postgres(
    pool: sqlx::PgPool,
) {
    let db = Db::Postgres(pool);
    let url = db.url();
    check_refuses_what_run_would_and_passes_once_the_binding_is_usable(db, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_refuses_what_run_would_and_passes_once_the_binding_is_usable_on_mysql() {
    let scratch = crate::support::MysqlScratch::unmigrated().await;
    check_refuses_what_run_would_and_passes_once_the_binding_is_usable(scratch.db(), scratch.url())
        .await;
    scratch.finish().await;
}
