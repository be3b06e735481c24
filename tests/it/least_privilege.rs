//! The chart's Role grants what the controller calls and nothing more (issue 36). One
//! direction is `replicas::assert_role_grants_what_was_used` (every call of a fleet is
//! granted); here the other: a replica's life (start, discovery, approval, Events, Lease
//! renewals, the leader's garbage collection, shutdown) calls every verb the Role grants, so
//! none is spare. On the real kube-apiserver `real_server::each_rule_missing_from_the_role_is_named_in_the_log`
//! shows each rule is needed; here also why Leases are not narrowed by `resourceNames`.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role};

use crate::support::*;

on_both!(every_verb_the_role_grants_is_called_in_a_replicas_life);
/// `autoapproval run` on the test API server, which records each request's RBAC verb by
/// User-Agent, through one request's approval and collection and a graceful stop.
async fn every_verb_the_role_grants_is_called_in_a_replicas_life(db: Db) {
    let (server, _client, sim) = backends().await;
    let dir = std::env::temp_dir().join(format!(
        "aa-least-privilege-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let mut child = spawn_run_on_sim(
        &kubeconfig,
        &db,
        &[
            "--namespace",
            NS,
            "--replica-name",
            "least-1",
            // Short Leases, so they are renewed, and a short TTL, so the leader collects the CR.
            "--lease-duration",
            "3s",
            "--renew-deadline",
            "2s",
            "--retry-period",
            "250ms",
            "--finished-ttl",
            "1s",
            "--gc-interval",
            "1s",
        ],
        &sim.base_url(),
    );
    let log = capture_stderr(&mut child);
    owner_now(340).insert(&db).await;
    let used = || -> BTreeSet<(String, String, String)> {
        server
            .access_by(autoapproval::cli::USER_AGENT)
            .into_iter()
            .map(|a| (a.group, a.resource, a.verb))
            .collect()
    };
    let collected = (
        "autoapproval.io".to_owned(),
        "autoapprovals".to_owned(),
        "delete".to_owned(),
    );
    eventually("the approved request's CR to be collected", || async {
        used().contains(&collected).then_some(())
    })
    .await;
    sigterm(child.id().expect("pid"));
    let status = child.wait().await.expect("the replica exits");
    assert!(status.success(), "{}", log.lock().expect("log"));

    let granted: BTreeSet<(String, String, String)> = ROLE_GRANTS
        .iter()
        .map(|(g, r, v)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        .collect();
    let used = used();
    let spare: Vec<_> = granted.difference(&used).collect();
    let missing: Vec<_> = used.difference(&granted).collect();
    assert!(
        spare.is_empty() && missing.is_empty(),
        "granted but never called: {spare:?}; called but not granted: {missing:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The chart's Role with the Lease rule's get, update and delete narrowed by `resourceNames`
/// to the Leases whose names are known before the pods exist: the leader's and the shards'
/// (create, list and watch cannot be narrowed by name).
fn leases_narrowed_to_known_names(role: &mut Role) {
    let names: Vec<String> = std::iter::once(autoapproval::coordination::LEADER_LEASE.to_owned())
        .chain((0..16).map(autoapproval::coordination::shard_lease_name))
        .collect();
    let rules = role.rules.as_mut().expect("rules");
    let at = rules
        .iter()
        .position(|r| r.resources.as_deref() == Some(&["leases".to_owned()][..]))
        .expect("the Lease rule");
    let lease = rules.remove(at);
    let (named, unnamed): (Vec<String>, Vec<String>) = lease
        .verbs
        .iter()
        .cloned()
        .partition(|v| ["get", "update", "delete"].contains(&v.as_str()));
    rules.push(PolicyRule {
        verbs: unnamed,
        ..lease.clone()
    });
    rules.push(PolicyRule {
        verbs: named,
        resource_names: Some(names),
        ..lease
    });
}

on_both!(leases_cannot_be_narrowed_to_the_leader_and_shard_names);
/// Every Lease verb is also called on the replica's member Lease, named after the pod (which a
/// Deployment names at random): narrowed to the leader's and the shards' names, the real
/// authorizer refuses the first read of the member Lease, by name, as the chart's
/// ServiceAccount.
async fn leases_cannot_be_narrowed_to_the_leader_and_shard_names(db: Db) {
    let member = autoapproval::coordination::member_lease_name("rbac-1");
    let refused = r#"cannot get resource "leases" in API group "coordination.k8s.io""#;
    let until = |user: &str| format!(r#"User "{user}" {refused}"#);
    let log = log_with_role(&db, leases_narrowed_to_known_names, &[], 324, until).await;
    assert!(
        log.contains(&format!(
            r#"leases.coordination.k8s.io "{member}" is forbidden"#
        )),
        "the member Lease {member} is named: {log}"
    );
}

on_both!(each_verb_missing_from_the_role_is_named_in_the_log);
/// Finer than `real_server::each_rule_missing_from_the_role_is_named_in_the_log`: the chart's
/// Role less one verb, on the real kube-apiserver, and the replica's log names the refused
/// call as the ServiceAccount's. A refused Lease create or update keeps the replica from
/// holding any shard: `real_server::a_lease_verb_the_role_refuses_is_named_and_the_replica_is_not_ready_until_granted`.
async fn each_verb_missing_from_the_role_is_named_in_the_log(db: Db) {
    // A short TTL, so the leader collects the approved request's CR at once.
    let collect: &[&str] = &["--finished-ttl", "1s", "--gc-interval", "1s"];
    for (id, resource, verb, args, after) in [
        (
            330,
            "autoapprovals",
            "watch",
            &[][..],
            "cannot list or watch AutoApprovals",
        ),
        (
            331,
            "autoapprovals",
            "create",
            &[],
            "could not create AutoApproval",
        ),
        (
            332,
            "autoapprovals",
            "delete",
            collect,
            "could not delete AutoApproval",
        ),
        (
            333,
            "leases",
            "get",
            &[],
            "cannot read this replica's member Lease",
        ),
    ] {
        let refused = format!(r#"cannot {verb} resource "{resource}""#);
        let until = |user: &str| format!(r#"User "{user}" {refused}"#);
        let edit = |role: &mut Role| without_verb(role, resource, verb);
        let log = log_with_role(&db, edit, args, id, until).await;
        let line = log
            .lines()
            .find(|l| l.contains(&refused))
            .expect("the refusal's line");
        assert!(line.contains(after), "{verb} {resource}: {line}");
    }
    // The member Lease is deleted only at shutdown: stopped once it joined, the replica says
    // it could not.
    let edit = |role: &mut Role| without_verb(role, "leases", "delete");
    let log = log_with_role(&db, edit, &[], 334, |_| "joined as a member".to_owned()).await;
    let line = log
        .lines()
        .find(|l| l.contains("could not delete the member Lease"))
        .unwrap_or_else(|| panic!("the refused delete is logged: {log}"));
    assert!(
        line.contains(r#"cannot delete resource "leases""#),
        "{line}"
    );
}
