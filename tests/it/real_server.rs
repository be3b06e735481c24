//! The controller on the real kube-apiserver and etcd (crates/control-plane), running as
//! the chart's ServiceAccount with only what the chart's Role grants: what the test API
//! server cannot show (authentication, RBAC, server-side apply's field ownership, the
//! events API as kube-apiserver serves it). The tests written with `on_both_servers!`
//! (in the other modules) also run here, as `<test>::{postgres,mysql}_real_server`.

use autoapproval::controller::crd::{FIELD_MANAGER, Phase};
use k8s_openapi::api::rbac::v1::Role;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::support::*;

on_both!(the_status_is_the_service_accounts_by_server_side_apply);
/// The end-to-end approval on this server is
/// `approvals::an_owner_contract_is_approved_end_to_end::*_real_server`, and kubectl's
/// views of it `crd::kubectl_get_autoapprovals_shows_the_printer_columns::*`;
/// here what the test API server does not keep: the status written by server-side apply
/// on the status subresource, owned by the controller's field manager, and the CRD's
/// spec as `kubectl explain` shows it.
async fn the_status_is_the_service_accounts_by_server_side_apply(db: Db) {
    let mut cluster = Cluster::real(db.clone(), test_settings()).await;
    owner_now(301).insert(&db).await;
    let cr = cluster.wait_phase(301, Phase::Approved).await;
    let managers: Vec<(String, String, String)> = cr
        .managed_fields()
        .iter()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
                m.subresource.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&(FIELD_MANAGER.into(), "Apply".into(), "status".into())),
        "{managers:?}"
    );

    let out = cluster.kubectl(&["explain", "autoapproval.spec"]).await;
    let explained = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for field in ["requestId", "requestType", "paused"] {
        assert!(explained.contains(field), "{field} in:\n{explained}");
    }
    cluster.stop().await;
}

/// `autoapproval run` as the chart's ServiceAccount in a namespace whose Role lacks the
/// rule on `resource`, with request `id` waiting; its log once a line says the
/// ServiceAccount `refused` (e.g. `cannot list resource "leases"`).
async fn log_with_rule_removed(db: &Db, resource: &str, id: i64, refused: &str) -> String {
    let edit = |role: &mut k8s_openapi::api::rbac::v1::Role| without_rule(role, resource);
    log_with_role(db, edit, &[], id, |user| {
        format!(r#"User "{user}" {refused}"#)
    })
    .await
}

on_both!(each_rule_missing_from_the_role_is_named_in_the_log);
/// The chart's Role less any one rule: the replica says which call the real RBAC
/// authorizer refused, as whom, never silently doing nothing; a refused Lease list is
/// not mistaken for an unreachable server.
async fn each_rule_missing_from_the_role_is_named_in_the_log(db: Db) {
    for (id, resource, refused) in [
        (
            320,
            "autoapprovals",
            r#"cannot list resource "autoapprovals""#,
        ),
        (
            321,
            "autoapprovals/status",
            r#"cannot patch resource "autoapprovals/status""#,
        ),
        (322, "leases", r#"cannot list resource "leases""#),
        (323, "events", r#"cannot create resource "events""#),
    ] {
        let log = log_with_rule_removed(&db, resource, id, refused).await;
        if resource == "leases" {
            assert!(log.contains("forbidden to list Leases"), "{log}");
            assert!(!log.contains("cannot reach the API server"), "{log}");
        }
    }
}

/// `autoapproval run` with `kubeconfig` and `args`, its Leases short, while something keeps
/// it from holding any shard: within a few turns its log says so at WARN naming each of
/// `named`, `/readyz` fails once `--api-liveness-timeout` (3 s) has passed, naming the same,
/// and `autoapproval_cannot_hold_shards` is 1; request `id` waits. Then `fix` runs: the replica says its Lease calls succeed again, is ready, and approves the
/// request.
async fn stuck_until_fixed<F: Future<Output = ()>>(
    db: &Db,
    kubeconfig: &std::path::Path,
    args: &[&str],
    id: i64,
    named: &[&str],
    fix: impl FnOnce() -> F,
) {
    let sim = simulator().await;
    let sim_url = sim.base_url();
    let port = free_port();
    let timings = [
        "--replica-name",
        "hold-1",
        "--lease-duration",
        "3s",
        "--renew-deadline",
        "2s",
        "--retry-period",
        "250ms",
        "--api-liveness-timeout",
        "3s",
    ];
    let mut child = spawn_run(
        kubeconfig,
        port,
        db,
        &[&timings[..], args].concat(),
        &[
            ("AUTOAPPROVAL_ESIGN_URL", &sim_url),
            ("AUTOAPPROVAL_OWNER_URL", &sim_url),
            ("AUTOAPPROVAL_STORE_URL", &sim_url),
            ("AUTOAPPROVAL_AD_URL", &sim_url),
            ("NO_COLOR", "1"),
        ],
    );
    let log = capture_stderr(&mut child);
    let warned = eventually(
        "a WARN line saying the replica cannot hold shards",
        || async {
            log.lock()
                .expect("log")
                .lines()
                .find(|l| l.contains("WARN") && l.contains("cannot hold shards"))
                .map(str::to_owned)
        },
    )
    .await
    .expect("the line");
    for name in named {
        assert!(warned.contains(name), "{name} in: {warned}");
    }

    let http = reqwest::Client::new();
    let get = |path: &str| {
        let request = http.get(format!("http://127.0.0.1:{port}{path}"));
        async move {
            let response = request.send().await.ok()?;
            Some((response.status().as_u16(), response.text().await.ok()?))
        }
    };
    let not_ready = eventually("/readyz to fail: no shard can be held", || async {
        get("/readyz")
            .await
            .filter(|(code, body)| *code == 503 && body.contains("no shard can be held"))
            .map(|(_, body)| body)
    })
    .await
    .expect("the body");
    for name in named {
        assert!(not_ready.contains(name), "{name} in: {not_ready}");
    }
    let (_, metrics) = get("/metrics").await.expect("/metrics");
    assert_eq!(
        metric_sum(&metrics, "autoapproval_cannot_hold_shards", &[]),
        1.0,
        "{metrics}"
    );
    // Inserted once no shard can be held (a replica refused `update` holds its shards until
    // the renew deadline, and works in them meanwhile): it waits.
    owner_now(id).insert(db).await;
    assert_eq!(request_status(db, id).await, "PENDING", "nothing approved");

    fix().await;
    eventually("/readyz to answer 200 once the fix is in", || async {
        get("/readyz").await.filter(|(code, _)| *code == 200)
    })
    .await;
    eventually(&format!("request {id} to be approved"), || async {
        (request_status(db, id).await == "APPROVED").then_some(())
    })
    .await;
    let (_, metrics) = get("/metrics").await.expect("/metrics");
    assert_eq!(
        metric_sum(&metrics, "autoapproval_cannot_hold_shards", &[]),
        0.0
    );
    sigterm(child.id().expect("pid"));
    let _ = child.wait().await;
    let log = log.lock().expect("log").clone();
    assert!(
        log.lines()
            .any(|l| l.contains("INFO") && l.contains("Lease calls succeed again")),
        "the recovery is said: {log}"
    );
}

#[sqlx::test(migrations = false)]
/// Issue 44: `run --namespace mydb` before that namespace existed held no shard, answered
/// `/readyz` 200 and logged nothing at WARN while requests waited. Now the refused create of
/// the member Lease is named (the namespace, the Lease, the verb, the API server's answer),
/// and the replica is not ready until the namespace exists; then it approves.
async fn a_missing_namespace_is_named_and_the_replica_is_not_ready_until_it_exists(
    pool: sqlx::PgPool,
) {
    use k8s_openapi::api::core::v1::Namespace;

    let db = Db::Postgres(migrated(pool).await);
    let plane = control_plane().await;
    let namespace = format!("absent-{}-{}", std::process::id(), rand::random::<u32>());
    let member = autoapproval::coordination::member_lease_name("hold-1");
    let admin = plane.admin_client().await.expect("admin");
    let object = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(namespace.clone()),
            ..Default::default()
        },
        ..Namespace::default()
    };
    let create = move || async move {
        Api::<Namespace>::all(admin)
            .create(&PostParams::default(), &object)
            .await
            .expect("the namespace");
    };
    // The API server's answer, and what to do about it.
    let answer = format!(r#"namespaces "{namespace}" not found"#);
    let fix = format!("namespace {namespace} does not exist");
    stuck_until_fixed(
        &db,
        &plane.admin_kubeconfig_path(),
        &["--namespace", &namespace],
        350,
        &[&namespace, &member, "create", &answer, &fix],
        create,
    )
    .await;
}

#[sqlx::test(migrations = false)]
/// A Lease verb the Role refuses (create: the member Lease cannot be made; update: it is
/// made but never renewed, so every shard it vouched for goes stale) is named at WARN with
/// the fix, and the replica is not ready until the Role grants it; then it approves.
async fn a_lease_verb_the_role_refuses_is_named_and_the_replica_is_not_ready_until_granted(
    pool: sqlx::PgPool,
) {
    let db = Db::Postgres(migrated(pool).await);
    for (id, verb) in [(351, "create"), (352, "update")] {
        let real = real_namespace(|role| without_verb(role, "leases", verb)).await;
        let (full, _) = chart_rbac(&real.ns.name);
        let name = full.metadata.name.clone().expect("the Role's name");
        let roles: Api<Role> = Api::namespaced(real.admin.clone(), &real.ns.name);
        let grant = move || async move {
            let rules = serde_json::json!({ "rules": full.rules });
            roles
                .patch(&name, &PatchParams::default(), &Patch::Merge(&rules))
                .await
                .expect("the chart's Role again");
        };
        let refused = format!(r#"cannot {verb} resource "leases""#);
        let must_grant = format!("must grant `{verb}` on leases");
        stuck_until_fixed(
            &db,
            &real.ns.kubeconfig,
            // One fleet on the one database, whichever namespace.
            &["--fleet", "hold"],
            id,
            &[&real.ns.name, "autoapproval-", &refused, &must_grant],
            grant,
        )
        .await;
    }
}
