//! The controller on the real kube-apiserver and etcd (crates/control-plane), running as
//! the chart's ServiceAccount with only what the chart's Role grants: what the test API
//! server cannot show (authentication, RBAC, server-side apply's field ownership, the
//! events API as kube-apiserver serves it). The tests written with `on_both_servers!`
//! (in the other modules) also run here, as `<test>::{postgres,mysql}_real_server`.

use autoapproval::controller::crd::{FIELD_MANAGER, Phase};
use kube::ResourceExt;

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
