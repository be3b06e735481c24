//! The AutoApproval resource as the API server and kubectl hold it: the CRD's schema and printer
//! columns, the immutable spec, and CRs that name a missing request or another request's name.

use autoapproval::controller::crd::{self, AutoApproval, Phase};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_testserver::{Options, TestServer};

use crate::support::{
    Cluster, Db, NS, On, client_for, eventually, install_crd, on_both_servers, owner_now,
    state_exists, total_calls, waiting_owner_now,
};

on_both_servers!(a_cr_naming_a_missing_request_ends_invalid_without_db_writes);
async fn a_cr_naming_a_missing_request_ends_invalid_without_db_writes(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    let cr = crd::for_request(999, crd::ApprovalType::OwnerContract, 16);
    cluster
        .api
        .create(&PostParams::default(), &cr)
        .await
        .expect("create CR");
    let cr = cluster.wait_phase(999, Phase::Invalid).await;
    assert!(
        cr.status
            .and_then(|s| s.last_reason)
            .unwrap_or_default()
            .contains("does not exist")
    );
    let events = cluster.events_with(999, "Invalid").await;
    assert!(events.iter().any(|(r, _)| r == "Invalid"), "{events:?}");
    assert!(!state_exists(&db, 999).await);
    assert_eq!(total_calls(&cluster.sim), 0);
    cluster.stop().await;
}

/// `kubectl get`'s table: a row a line, a cell a word.
fn table(stdout: &str) -> Vec<Vec<&str>> {
    stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect()
}

on_both_servers!(kubectl_get_autoapprovals_shows_the_printer_columns);
async fn kubectl_get_autoapprovals_shows_the_printer_columns(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    owner_now(110).insert(&db).await;
    waiting_owner_now(111).insert(&db).await;
    cluster.wait_phase(110, Phase::Approved).await;
    cluster.wait_phase(111, Phase::RetryWaiting).await;

    // The CRD is in the `autoapproval` category.
    let found = cluster
        .kubectl(&["api-resources", "--categories=autoapproval", "-o", "name"])
        .await;
    assert_eq!(
        String::from_utf8_lossy(&found.stdout).trim(),
        "autoapprovals.autoapproval.io",
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );
    let output = cluster.kubectl(&["get", "aa", "-n", &cluster.ns]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines = table(&stdout);
    assert_eq!(
        lines[0],
        ["NAME", "REQUEST", "TYPE", "PHASE", "SINCE", "AGE"],
        "{stdout}"
    );
    let row = |lines: &[Vec<&str>], name: &str| -> Vec<String> {
        lines
            .iter()
            .find(|l| l[0] == name)
            .unwrap_or_else(|| panic!("row {name}"))
            .iter()
            .map(|c| c.to_string())
            .collect()
    };
    assert_eq!(
        &row(&lines, "request-110")[1..4],
        ["110", "OWNER_CONTRACT", "Approved"],
        "{stdout}"
    );
    // No retry count or next retry time by default: a retry with the same outcome writes
    // nothing, so they would be stale; SINCE is when the outcome last changed, true at rest.
    assert_eq!(
        &row(&lines, "request-111")[1..4],
        ["111", "OWNER_CONTRACT", "RetryWaiting"],
        "{stdout}"
    );

    let output = cluster
        .kubectl(&["get", "aa", "-n", &cluster.ns, "-o", "wide"])
        .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines = table(&stdout);
    assert_eq!(
        lines[0],
        [
            "NAME", "REQUEST", "TYPE", "PHASE", "SINCE", "AGE", "STEP", "HOLDER", "REASON",
            "RETRY", "ASKED"
        ],
        "{stdout}"
    );
    let waiting = row(&lines, "request-111");
    assert_eq!(waiting[6], "owner", "{stdout}");
    assert_eq!(waiting[7], "replica-1", "{stdout}");
    assert!(stdout.contains("documents not released"), "{stdout}");

    let explained = cluster
        .kubectl(&["explain", "autoapproval.status.phase"])
        .await;
    let text = String::from_utf8_lossy(&explained.stdout);
    for phase in [
        "Pending",
        "InProgress",
        "RetryWaiting",
        "Approved",
        "Superseded",
        "Exhausted",
        "Paused",
        "Invalid",
    ] {
        assert!(
            text.contains(phase),
            "{phase} in:\n{text}{}",
            String::from_utf8_lossy(&explained.stderr)
        );
    }
    let described = cluster
        .kubectl(&["describe", "aa", "request-110", "-n", &cluster.ns])
        .await;
    let text = String::from_utf8_lossy(&described.stdout);
    assert!(
        text.contains("Type:                  Ready")
            && text.contains("Phase:                   Approved"),
        "{text}{}",
        String::from_utf8_lossy(&described.stderr)
    );
    // kubectl lists Events as core/v1 with an involvedObject field selector;
    // the controller writes events.k8s.io/v1: the same Event, two views.
    let events = text.split("Events:").nth(1).unwrap_or_default();
    let approved = events
        .lines()
        .find(|l| l.contains("Approved"))
        .unwrap_or_else(|| panic!("an Approved Event under describe:\n{text}"));
    let columns: Vec<&str> = approved.split_whitespace().collect();
    assert_eq!(columns[..2], ["Normal", "Approved"], "{approved}");
    assert!(columns.contains(&"autoapproval"), "From: {approved}");
    // The namespace also holds request-111's and the leader Lease's Events.
    let rows = events
        .lines()
        .filter(|l| l.trim_start().starts_with("Normal") || l.trim_start().starts_with("Warning"));
    assert_eq!(rows.count(), 1, "only this CR's Events: {events}");
    cluster.stop().await;
}

#[tokio::test]
async fn the_crd_schema_rejects_a_cr_without_request_id_or_with_an_unknown_type() {
    use kube::api::{ApiResource, DynamicObject};

    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    let client = client_for(&server);
    install_crd(&client).await;
    let resource = ApiResource::erase::<AutoApproval>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client, NS, &resource);
    let cr = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "autoapproval.io/v1alpha1",
            "kind": "AutoApproval",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .expect("object")
    };
    let refused = async |name: &str, spec: serde_json::Value| match api
        .create(&PostParams::default(), &cr(name, spec))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 422 => s.message,
        other => panic!("{name}: expected 422 Invalid, got {other:?}"),
    };

    let message = refused(
        "no-id",
        serde_json::json!({"requestType": "OWNER_CONTRACT"}),
    )
    .await;
    assert!(message.contains("spec.requestId"), "{message}");
    let message = refused(
        "unknown-type",
        serde_json::json!({"requestId": 5, "requestType": "STORE_CLOSURE"}),
    )
    .await;
    assert!(message.contains("spec.requestType"), "{message}");
    let message = refused(
        "zero-id",
        serde_json::json!({"requestId": 0, "requestType": "AD_CONTRACT"}),
    )
    .await;
    assert!(message.contains("spec.requestId"), "{message}");

    let accepted = api
        .create(
            &PostParams::default(),
            &cr(
                "ok",
                serde_json::json!({"requestId": 5, "requestType": "AD_CONTRACT"}),
            ),
        )
        .await
        .expect("a valid CR is accepted");
    assert_eq!(
        accepted.data["spec"]["paused"], false,
        "paused defaults to false"
    );
}

on_both_servers!(a_cr_edit_to_another_request_or_type_is_refused_by_the_api_server);
/// spec.requestId and spec.requestType are immutable: the CRD's CEL rule
/// `self == oldSelf`, enforced by the API server, refuses an edit to another
/// request or type with the rule's message, through the client and kubectl.
async fn a_cr_edit_to_another_request_or_type_is_refused_by_the_api_server(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    waiting_owner_now(111).insert(&db).await;
    cluster.wait_phase(111, Phase::RetryWaiting).await;
    let refused = async |spec: serde_json::Value| match cluster
        .api
        .patch(
            &crd::cr_name(111),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": spec })),
        )
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 422 => s.message,
        other => panic!("{spec}: expected 422 Invalid, got {other:?}"),
    };
    let message = refused(serde_json::json!({"requestId": 112})).await;
    assert!(
        message.contains("spec.requestId") && message.contains("requestId is immutable"),
        "{message}"
    );
    let message = refused(serde_json::json!({"requestType": "AD_CONTRACT"})).await;
    assert!(message.contains("requestType is immutable"), "{message}");

    let name = crd::cr_name(111);
    let out = cluster
        .kubectl(&[
            "-n",
            &cluster.ns,
            "patch",
            "autoapproval",
            &name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"requestId":112}}"#,
        ])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "kubectl patch was accepted");
    assert!(stderr.contains("requestId is immutable"), "{stderr}");

    // Other fields stay editable.
    cluster
        .api
        .patch(
            &crd::cr_name(111),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": true}})),
        )
        .await
        .expect("pausing is an allowed edit");
    let cr = cluster.wait_phase(111, Phase::Paused).await;
    assert_eq!(cr.spec.request_id, 111);
    cluster.stop().await;
}

on_both_servers!(a_cr_named_after_another_request_is_invalid_and_drives_nothing);
/// A CR whose name is not `request-<spec.requestId>` is reported Invalid and
/// drives nothing; the request's own CR approves it, once.
async fn a_cr_named_after_another_request_is_invalid_and_drives_nothing(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    let mut rogue = crd::for_request(113, crd::ApprovalType::OwnerContract, 16);
    rogue.metadata.name = Some("request-114".into());
    cluster
        .api
        .create(&PostParams::default(), &rogue)
        .await
        .expect("create CR");
    let invalid = eventually("the misnamed CR to be Invalid", || async {
        let cr = cluster.api.get_opt("request-114").await.ok()??;
        let status = cr.status?;
        (status.phase == Some(Phase::Invalid)).then_some(status)
    })
    .await
    .expect("status");
    assert!(
        invalid
            .last_reason
            .as_deref()
            .is_some_and(|r| r.contains("belongs to the AutoApproval named request-113")),
        "{invalid:?}"
    );
    owner_now(113).insert(&db).await;
    cluster.wait_phase(113, Phase::Approved).await;
    assert_eq!(cluster.sim.stats().for_request(113).owner, 1);
    let still: AutoApproval = cluster.api.get("request-114").await.expect("get");
    assert_eq!(
        still.status.and_then(|s| s.phase),
        Some(Phase::Invalid),
        "the misnamed CR never took part"
    );
    cluster.stop().await;
}
