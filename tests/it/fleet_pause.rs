//! The fleet's brake (issue 43): `autoapproval pause --all` / `resume --all`
//! and the SQL functions people are granted. While paused no replica claims
//! anything (counted in the claims table and by the simulator), a chain
//! already running finishes once, the pause outlives a restart, readiness
//! stays true and the metrics show it; after the resume the requests held
//! back are claimed at the next poll.

use std::time::Duration;

use autoapproval::controller::config::ControllerConfig;
use autoapproval::controller::crd::{AutoApproval, Phase};
use autoapproval_sim::{Faults, SimSystem};
use rand::Rng;

use crate::support::{
    Cluster, Db, NS, backends, client_for, eventually, free_port, fresh_dir, kubeconfig_in,
    metric_sum, on_both, owner_now, quick_leases, request_status, spawn_run, state_exists,
    stop_on_sigterm, total_calls, with_pool,
};

/// `quick_leases` with discovery polling every `poll`.
fn polling_every(poll: Duration) -> ControllerConfig {
    let mut settings = quick_leases();
    settings.discovery.poll_period = poll;
    settings
}

/// Discovery turns the replica of `cluster` has run.
fn turns(cluster: &Cluster) -> f64 {
    metric_sum(
        &cluster.metrics.encode(),
        "autoapproval_discovery_turn_duration_seconds_count",
        &[],
    )
}

/// Waits until the CR of `id` shows the fleet's pause (phase Paused, the
/// pause in its reason).
async fn wait_held_back(cluster: &Cluster, id: i64, by: &str) -> AutoApproval {
    let shown = format!("fleet paused by {by} since ");
    eventually(
        &format!("request {id} to show the fleet's pause"),
        || async {
            let cr = cluster.cr(id).await?;
            let status = cr.status.as_ref()?;
            (status.phase == Some(Phase::Paused)
                && status.last_reason.as_deref()?.starts_with(&shown))
            .then_some(cr)
        },
    )
    .await
    .expect("CR")
}

/// Waits until the replica of `cluster` has run `n` more discovery turns.
async fn more_turns(cluster: &Cluster, n: f64) {
    let from = turns(cluster);
    eventually(&format!("{n} more discovery turns"), || async {
        (turns(cluster) >= from + n).then_some(())
    })
    .await;
}

on_both!(a_paused_fleet_claims_nothing_and_claims_again_at_the_poll_after_the_resume);
/// Paused: sixteen approvable requests, one per shard, get their CR (it
/// shows the pause) and nothing else over several polls: no state row, no
/// external call, no claim won. Resumed: every one is approved by the
/// whole turn the resume starts, within a turn or two of it; the sweep
/// alone (three shards a poll) would need six.
async fn a_paused_fleet_claims_nothing_and_claims_again_at_the_poll_after_the_resume(db: Db) {
    let mut cluster = Cluster::with(db.clone(), polling_every(Duration::from_secs(1))).await;
    cluster.wait_every_shard().await;
    let store = db.database();
    store
        .pause_fleet("ops", Some("database maintenance"))
        .await
        .expect("pause the fleet")
        .expect("not paused before");
    let ids: Vec<i64> = (600..616).collect();
    for &id in &ids {
        owner_now(id).insert(&db).await;
    }
    for &id in &ids {
        let cr = wait_held_back(&cluster, id, "ops").await;
        let reason = cr.status.and_then(|s| s.last_reason).unwrap_or_default();
        assert!(reason.ends_with(": database maintenance; `autoapproval resume --all` resumes"));
    }
    // Polls go by: the fresh query's cursor steps past the requests, and
    // every turn's due candidates are refused again.
    more_turns(&cluster, 3.0).await;
    for &id in &ids {
        assert!(
            !state_exists(&db, id).await,
            "request {id} claimed while paused"
        );
        assert_eq!(request_status(&db, id).await, "PENDING");
    }
    assert_eq!(
        total_calls(&cluster.sim),
        0,
        "no external call while paused"
    );
    let metrics = cluster.metrics.encode();
    assert_eq!(
        metric_sum(&metrics, "autoapproval_claims_total", &[r#"result="won""#]),
        0.0
    );
    assert!(
        metric_sum(
            &metrics,
            "autoapproval_claims_total",
            &[r#"result="fleet_paused""#]
        ) >= 16.0
    );
    assert_eq!(metric_sum(&metrics, "autoapproval_fleet_paused", &[]), 1.0);

    let at_resume = turns(&cluster);
    store
        .resume_fleet("ops")
        .await
        .expect("resume the fleet")
        .expect("paused before");
    for &id in &ids {
        eventually(&format!("request {id} to be approved"), || async {
            (request_status(&db, id).await == "APPROVED").then_some(())
        })
        .await;
    }
    let taken = turns(&cluster) - at_resume;
    assert!(
        taken <= 4.0,
        "{taken} discovery turns from the resume to the last approval: the requests held back \
         waited for the sweep instead of the turn the resume starts"
    );
    let metrics = cluster.metrics.encode();
    assert_eq!(metric_sum(&metrics, "autoapproval_fleet_paused", &[]), 0.0);
    assert_eq!(
        metric_sum(&metrics, "autoapproval_fleet_paused_since_seconds", &[]),
        0.0,
        "0 while the fleet runs"
    );
    cluster.stop().await;
}

on_both!(a_chain_running_when_the_fleet_pauses_finishes_once_and_nothing_new_starts);
/// The pause lands while a chain waits on the store service: that chain
/// approves its request with one owner and one store; a request inserted
/// after the pause is not claimed until the resume, then approved, with
/// nothing created twice.
async fn a_chain_running_when_the_fleet_pauses_finishes_once_and_nothing_new_starts(db: Db) {
    let mut cluster = Cluster::with_faults(
        db.clone(),
        polling_every(Duration::from_secs(1)),
        Faults {
            latency: Duration::from_secs(3),
            system: Some(SimSystem::Store),
            creations_only: true,
            ..Faults::default()
        },
    )
    .await;
    cluster.wait_every_shard().await;
    owner_now(700).insert(&db).await;
    eventually("the chain of 700 to wait on the store service", || async {
        (cluster.sim.stats().in_flight.store > 0).then_some(())
    })
    .await;
    let store = db.database();
    store
        .pause_fleet("ops", None)
        .await
        .expect("pause the fleet")
        .expect("not paused before");
    owner_now(701).insert(&db).await;

    cluster.wait_phase(700, Phase::Approved).await;
    assert_eq!(request_status(&db, 700).await, "APPROVED");
    assert!(!state_exists(&db, 700).await);
    wait_held_back(&cluster, 701, "ops").await;
    more_turns(&cluster, 2.0).await;
    assert!(!state_exists(&db, 701).await, "701 claimed while paused");
    let stats = cluster.sim.stats();
    let of = |id: i64| stats.per_request.get(&id).cloned().unwrap_or_default();
    assert_eq!((of(700).owner, of(700).store), (1, 1));
    assert_eq!((of(701).owner, of(701).store), (0, 0));

    store
        .resume_fleet("ops")
        .await
        .expect("resume the fleet")
        .expect("paused before");
    cluster.wait_phase(701, Phase::Approved).await;
    let stats = cluster.sim.stats();
    let of = |id: i64| stats.per_request.get(&id).cloned().unwrap_or_default();
    assert_eq!((of(701).owner, of(701).store), (1, 1));
    assert_eq!(stats.duplicate_creations, 0);
    assert_eq!(stats.overlapping_creations, 0);
    cluster.stop().await;
}

/// GET of the replica's endpoint `path` on `port`: status and body.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let response = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

/// `autoapproval <command> --database-url <db> <rest>`: success, stdout, stderr.
fn cli(db: &Db, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(&args[..1])
        .args(["--database-url", &db.url()])
        .args(&args[1..])
        .output()
        .expect("autoapproval runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

on_both!(the_pause_of_the_cli_outlives_a_restart_and_the_replica_stays_ready_showing_it);
/// The binary as operators run it: `pause --all --reason` (a second one
/// refused, naming the first), a held-back request shown by `request
/// show`, `/readyz` 200 and the metrics saying paused; a restarted replica
/// reads the pause at start and claims nothing over its polls; `resume
/// --all` and the request is approved.
async fn the_pause_of_the_cli_outlives_a_restart_and_the_replica_stays_ready_showing_it(db: Db) {
    let (server, client, sim) = backends().await;
    let dir = fresh_dir("fleet-pause");
    let kubeconfig = kubeconfig_in(&dir, &server);
    let sim_url = sim.base_url();
    let start = |port: u16| {
        spawn_run(
            &kubeconfig,
            port,
            &db,
            &[
                "--namespace",
                NS,
                "--replica-name",
                "paused-1",
                "--poll-period",
                "1s",
            ],
            &[
                ("AUTOAPPROVAL_ESIGN_URL", sim_url.as_str()),
                ("AUTOAPPROVAL_OWNER_URL", sim_url.as_str()),
                ("AUTOAPPROVAL_STORE_URL", sim_url.as_str()),
                ("AUTOAPPROVAL_AD_URL", sim_url.as_str()),
            ],
        )
    };
    let ready = |port: u16| async move {
        eventually("/readyz to answer 200", || async {
            (get(port, "/readyz").await?.0 == 200).then_some(())
        })
        .await;
    };
    let metric = |port: u16, name: &'static str| async move {
        let (_, text) = get(port, "/metrics").await.expect("/metrics");
        metric_sum(&text, name, &[])
    };
    let port = free_port();
    let first = start(port);
    ready(port).await;

    let (ok, out, err) = cli(
        &db,
        &[
            "pause",
            "--all",
            "--reason",
            "database maintenance",
            "--as",
            "ops",
        ],
    );
    assert!(ok, "{err}");
    assert!(
        out.starts_with("fleet paused by ops: database maintenance\n"),
        "{out}"
    );
    let (ok, _, err) = cli(&db, &["pause", "--all", "--as", "kim"]);
    assert!(!ok);
    assert!(
        err.contains("the fleet is already paused by ops since"),
        "{err}"
    );
    assert!(err.contains(": database maintenance"), "{err}");
    let (ok, _, err) = cli(&db, &["pause"]);
    assert!(!ok && err.contains("--all"), "{err}");

    owner_now(800).insert(&db).await;
    let api: kube::Api<AutoApproval> = kube::Api::namespaced(client_for(&server), NS);
    eventually("request 800 to show the fleet's pause", || async {
        let cr = api
            .get_opt(&autoapproval::controller::crd::cr_name(800))
            .await
            .ok()??;
        let status = cr.status?;
        (status.phase == Some(Phase::Paused)
            && status
                .last_reason?
                .starts_with("fleet paused by ops since "))
        .then_some(())
    })
    .await;
    assert_eq!(
        get(port, "/readyz").await.map(|r| r.0),
        Some(200),
        "ready while paused"
    );
    eventually("the metrics to show the pause", || async {
        (metric(port, "autoapproval_fleet_paused").await == 1.0).then_some(())
    })
    .await;
    assert!(metric(port, "autoapproval_fleet_paused_since_seconds").await > 1.7e9);
    let (ok, shown, err) = cli(&db, &["request", "show", "800"]);
    assert!(ok, "{err}");
    assert!(
        shown.contains("\nfleet paused by ops since ")
            && shown.contains(": database maintenance (nothing is claimed"),
        "{shown}"
    );
    let output = stop_on_sigterm(first, Duration::from_secs(30)).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Restarted: the pause is in the database, not in the replica.
    let port = free_port();
    let second = start(port);
    ready(port).await;
    eventually("the restarted replica to show the pause", || async {
        (metric(port, "autoapproval_fleet_paused").await == 1.0).then_some(())
    })
    .await;
    let from = metric(port, "autoapproval_discovery_turn_duration_seconds_count").await;
    eventually("three discovery turns of the restarted replica", || async {
        (metric(port, "autoapproval_discovery_turn_duration_seconds_count").await >= from + 3.0)
            .then_some(())
    })
    .await;
    assert!(!state_exists(&db, 800).await, "claimed after the restart");
    assert_eq!(total_calls(&sim), 0);
    assert_eq!(get(port, "/readyz").await.map(|r| r.0), Some(200));

    let (ok, out, err) = cli(&db, &["resume", "--all", "--as", "ops"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("fleet resumed by ops"), "{out}");
    eventually("request 800 to be approved", || async {
        (request_status(&db, 800).await == "APPROVED").then_some(())
    })
    .await;
    eventually("the metrics to show the fleet running", || async {
        (metric(port, "autoapproval_fleet_paused").await == 0.0).then_some(())
    })
    .await;
    let (ok, _, err) = cli(&db, &["resume", "--all"]);
    assert!(!ok && err.contains("the fleet is not paused"), "{err}");
    let (_, shown, _) = cli(&db, &["request", "show", "800"]);
    assert!(shown.contains("\nfleet: running\n"), "{shown}");
    let output = stop_on_sigterm(second, Duration::from_secs(30)).await;
    assert!(output.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    drop(client);
}

/// The fleet's routines as MySQL grants them, one at a time.
const FLEET_PROCEDURES: [&str; 3] = [
    "autoapproval_pause_fleet",
    "autoapproval_resume_fleet",
    "autoapproval_fleet_pause",
];

/// `routine`'s call with `args` placeholders, as each server spells it.
fn call(db: &Db, routine: &str, args: usize) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(match db {
        Db::Postgres(_) => {
            let params: Vec<String> = (1..=args).map(|i| format!("${i}")).collect();
            format!("SELECT * FROM {routine}({})", params.join(", "))
        }
        Db::Mysql(_) => format!("CALL {routine}({})", vec!["?"; args].join(", ")),
    })
}

on_both!(people_granted_the_fleet_functions_pause_and_resume_a_running_fleet);
/// The SQL path: a role granted EXECUTE on the three fleet routines and
/// nothing else pauses (a second pause refused, naming the first), reads
/// the pause, cannot touch the table itself, and resumes; the replica
/// claims nothing in between and approves after.
async fn people_granted_the_fleet_functions_pause_and_resume_a_running_fleet(db: Db) {
    let role = format!("aa_fleet_{}", rand::rng().random::<u32>());
    let (setup, teardown) = match &db {
        Db::Postgres(_) => (
            vec![
                format!("CREATE ROLE {role} LOGIN"),
                format!(
                    "GRANT EXECUTE ON FUNCTION {} TO {role}",
                    autoapproval::db::postgres::FLEET_FUNCTIONS
                ),
            ],
            vec![format!("DROP OWNED BY {role}"), format!("DROP ROLE {role}")],
        ),
        Db::Mysql(_) => {
            let mut setup = vec![format!("CREATE USER '{role}'@'%'")];
            setup.extend(
                FLEET_PROCEDURES
                    .iter()
                    .map(|p| format!("GRANT EXECUTE ON PROCEDURE {p} TO '{role}'@'%'")),
            );
            (setup, vec![format!("DROP USER '{role}'@'%'")])
        }
    };
    for statement in &setup {
        db.exec(statement).await;
    }
    let person = match &db {
        Db::Postgres(pool) => Db::Postgres(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_lazy_with((*pool.connect_options()).clone().username(&role)),
        ),
        Db::Mysql(pool) => Db::Mysql(
            sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(1)
                .connect_lazy_with((*pool.connect_options()).clone().username(&role)),
        ),
    };
    let mut cluster = Cluster::with(db.clone(), polling_every(Duration::from_secs(1))).await;
    cluster.wait_every_shard().await;

    let pause = |who: &'static str| {
        let person = person.clone();
        async move {
            let answer: (bool, Option<String>) = with_pool!(&person, pool => {
                sqlx::query_as(call(&person, "autoapproval_pause_fleet", 2))
                    .bind(who)
                    .bind("quarter close")
                    .fetch_one(pool)
                    .await
                    .expect("autoapproval_pause_fleet")
            });
            answer
        }
    };
    assert_eq!(pause("kim").await, (true, None));
    let (paused, refusal) = pause("lee").await;
    assert!(!paused);
    let refusal = refusal.unwrap_or_default();
    assert!(
        refusal.starts_with("the fleet is already paused by kim since ")
            && refusal.ends_with(": quarter close"),
        "{refusal}"
    );
    let (by, reason): (String, Option<String>) = with_pool!(&person, pool => {
        sqlx::query_as(call(&person, "autoapproval_fleet_pause", 0))
            .fetch_one(pool)
            .await
            .expect("autoapproval_fleet_pause")
    });
    assert_eq!(
        (by.as_str(), reason.as_deref()),
        ("kim", Some("quarter close"))
    );
    let direct = with_pool!(&person, pool => sqlx::query("DELETE FROM auto_approve_fleet_pause")
        .execute(pool)
        .await
        .map(|_| ()));
    assert!(direct.is_err(), "the role may not write the table itself");

    owner_now(900).insert(&db).await;
    wait_held_back(&cluster, 900, "kim").await;
    more_turns(&cluster, 2.0).await;
    assert!(!state_exists(&db, 900).await, "claimed while paused");
    assert_eq!(total_calls(&cluster.sim), 0);

    let resume = || {
        let person = person.clone();
        async move {
            let answer: (bool, Option<String>) = with_pool!(&person, pool => {
                sqlx::query_as(call(&person, "autoapproval_resume_fleet", 1))
                    .bind("kim")
                    .fetch_one(pool)
                    .await
                    .expect("autoapproval_resume_fleet")
            });
            answer
        }
    };
    assert_eq!(resume().await, (true, None));
    cluster.wait_phase(900, Phase::Approved).await;
    assert_eq!(
        resume().await,
        (false, Some("the fleet is not paused".to_owned()))
    );
    cluster.stop().await;
    with_pool!(&person, pool => pool.close().await);
    for statement in &teardown {
        db.exec(statement).await;
    }
}
