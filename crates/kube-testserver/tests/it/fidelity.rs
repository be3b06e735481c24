//! Where the real kube-apiserver answered differently from the imitation: each test pins
//! kube-apiserver's answer and runs on both servers, so the imitation cannot drift back.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::core::Status;
use serde_json::{Value, json};

use crate::server::{Under, on_both_servers};

/// The error kube-apiserver answered with.
fn refusal<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> Box<Status> {
    match r {
        Err(kube::Error::Api(e)) => e,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A raw request through the test's client, answered in JSON.
async fn send(
    s: &Under,
    method: &str,
    path: &str,
    content_type: &str,
    body: Value,
) -> Result<Value, kube::Error> {
    let path = path.replace("NS", s.namespace());
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        })
        .unwrap();
    s.client().request::<Value>(request).await
}

fn aa(name: &str) -> kube::api::DynamicObject {
    serde_json::from_value(
        json!({"apiVersion": "autoapproval.io/v1alpha1", "kind": "AutoApproval",
        "metadata": {"name": name}, "spec": {"requestId": 1, "requestType": "AD_CONTRACT"}}),
    )
    .unwrap()
}

/// A custom resource has no unconditional update and no patch strategies.
async fn a_custom_resource_put_names_its_version_and_a_strategic_patch_is_refused(s: &Under) {
    s.install_crd().await;
    let api = s.autoapprovals();
    api.create(&PostParams::default(), &aa("a1")).await.unwrap();
    let e = refusal(api.replace("a1", &PostParams::default(), &aa("a1")).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{e:?}");
    assert_eq!(
        e.message,
        "autoapprovals.autoapproval.io \"a1\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update"
    );
    let e = refusal(
        api.patch(
            "a1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"requestId": 2}})),
        )
        .await,
    );
    assert_eq!(
        (e.code, e.reason.as_str()),
        (415, "UnsupportedMediaType"),
        "{e:?}"
    );
    let e = refusal(
        api.replace("nope", &PostParams::default(), &aa("nope"))
            .await,
    );
    assert_eq!(e.code, 404, "{e:?}");
}
on_both_servers!(a_custom_resource_put_names_its_version_and_a_strategic_patch_is_refused);

/// An apply that would create an object must name it in its body.
async fn an_apply_that_creates_names_its_object(s: &Under) {
    let api: Api<ConfigMap> = Api::default_namespaced(s.client());
    let unnamed = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "1"}});
    let e = refusal(
        api.patch("zz", &PatchParams::apply("t"), &Patch::Apply(&unnamed))
            .await,
    );
    assert_eq!(e.code, 400, "{e:?}");
    assert_eq!(
        e.message,
        "the name of the object (zz based on URL) was undeterminable: name must be provided"
    );
    let named = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "zz"}, "data": {"a": "1"}});
    api.patch("zz", &PatchParams::apply("t"), &Patch::Apply(&named))
        .await
        .unwrap();
    // On an existing object the name may be left out (the controller's status apply does).
    api.patch("zz", &PatchParams::apply("t"), &Patch::Apply(&unnamed))
        .await
        .unwrap();
}
on_both_servers!(an_apply_that_creates_names_its_object);

/// Deleting a custom resource answers a Status; with a finalizer pending the object stays,
/// its generation counting the deletion.
async fn a_deleted_custom_resource_answers_a_status_and_a_pending_one_a_new_generation(s: &Under) {
    s.install_crd().await;
    let api = s.autoapprovals();
    api.create(&PostParams::default(), &aa("gone"))
        .await
        .unwrap();
    let answer = api.delete("gone", &DeleteParams::default()).await.unwrap();
    let status = answer.right().expect("a Status, not the object");
    assert_eq!(
        status.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    let mut held = aa("held");
    held.metadata.finalizers = Some(vec!["autoapproval.io/test".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    let answer = api
        .delete(
            "held",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    let object = answer.left().expect("the object, its finalizer pending");
    assert!(object.metadata.deletion_timestamp.is_some());
    assert_eq!(object.metadata.generation, Some(2));
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}
on_both_servers!(a_deleted_custom_resource_answers_a_status_and_a_pending_one_a_new_generation);

/// A conflict names the other manager as kube-apiserver does: with its subresource, and for
/// an update with the API version it wrote with. Managed fields list applies first.
async fn apply_conflicts_and_managed_fields_read_as_kube_apiserver_writes_them(s: &Under) {
    s.install_crd().await;
    let api = s.autoapprovals();
    let creator = PostParams {
        field_manager: Some("a-creator".into()),
        ..PostParams::default()
    };
    api.create(&creator, &aa("m")).await.unwrap();
    let spec = |id: i64| {
        Patch::Apply(
            json!({"apiVersion": "autoapproval.io/v1alpha1", "kind": "AutoApproval",
        "metadata": {"name": "m"}, "spec": {"requestId": id, "requestType": "AD_CONTRACT"}}),
        )
    };
    let e = refusal(
        api.patch("m", &PatchParams::apply("z-applier"), &spec(2))
            .await,
    );
    assert_eq!(
        e.message,
        "Apply failed with 1 conflict: conflict with \"a-creator\" using autoapproval.io/v1alpha1: .spec.requestId"
    );
    let applied = api
        .patch("m", &PatchParams::apply("z-applier").force(), &spec(2))
        .await
        .unwrap();
    let order: Vec<String> = applied
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            format!(
                "{}/{}",
                e.manager.unwrap_or_default(),
                e.operation.unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(order, ["z-applier/Apply", "a-creator/Update"]);
    let status = |phase: &str| {
        Patch::Apply(
            json!({"apiVersion": "autoapproval.io/v1alpha1", "kind": "AutoApproval",
        "metadata": {"name": "m"}, "status": {"phase": phase}}),
        )
    };
    api.patch_status("m", &PatchParams::apply("ctl"), &status("Done"))
        .await
        .unwrap();
    let e = refusal(
        api.patch_status("m", &PatchParams::apply("other"), &status("Other"))
            .await,
    );
    assert_eq!(
        e.message,
        "Apply failed with 1 conflict: conflict with \"ctl\" with subresource \"status\": .status.phase"
    );
}
on_both_servers!(apply_conflicts_and_managed_fields_read_as_kube_apiserver_writes_them);

/// In JSON, a list of a built-in kind carries no apiVersion and kind on its items; a list of
/// custom resources does.
async fn items_of_a_built_in_list_carry_no_type(s: &Under) {
    s.install_crd().await;
    let api: Api<ConfigMap> = Api::default_namespaced(s.client());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
    )
    .await
    .unwrap();
    s.autoapprovals()
        .create(&PostParams::default(), &aa("listed"))
        .await
        .unwrap();
    let list = send(
        s,
        "GET",
        "/api/v1/namespaces/NS/configmaps",
        "application/json",
        Value::Null,
    )
    .await
    .unwrap();
    let item = &list["items"][0];
    assert_eq!(
        (item.get("apiVersion"), item.get("kind")),
        (None, None),
        "{item}"
    );
    let list = send(
        s,
        "GET",
        "/apis/autoapproval.io/v1alpha1/namespaces/NS/autoapprovals",
        "application/json",
        Value::Null,
    )
    .await
    .unwrap();
    assert_eq!(list["items"][0]["kind"], "AutoApproval");
}
on_both_servers!(items_of_a_built_in_list_carry_no_type);

/// A new events.k8s.io Event needs its time, and the object it regards in its namespace.
async fn an_event_needs_its_time_and_its_object_in_its_namespace(s: &Under) {
    let path = "/apis/events.k8s.io/v1/namespaces/NS/events";
    let bad = json!({"metadata": {"name": "e2"}, "reason": "Approved", "type": "Normal", "note": "done",
        "regarding": {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "namespace": "elsewhere"}});
    let e = refusal(send(s, "POST", path, "application/json", bad).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{e:?}");
    assert_eq!(
        e.message,
        "Event \"e2\" is invalid: [involvedObject.namespace: Invalid value: \"elsewhere\": does not match event.namespace, eventTime: Required value]"
    );
    let good = json!({"metadata": {"name": "e1"}, "eventTime": "2026-12-04T10:00:00.000000Z",
        "reportingController": "autoapproval.io/controller", "reportingInstance": "r1", "action": "Approve",
        "reason": "Approved", "type": "Normal", "note": "done",
        "regarding": {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "namespace": s.namespace()}});
    send(s, "POST", path, "application/json", good)
        .await
        .unwrap();
}
on_both_servers!(an_event_needs_its_time_and_its_object_in_its_namespace);

/// kubectl's columns come described, and a failed delete precondition names the kind.
async fn printer_columns_are_described_and_a_precondition_names_the_kind(s: &Under) {
    s.install_crd().await;
    s.autoapprovals()
        .create(&PostParams::default(), &aa("t"))
        .await
        .unwrap();
    let request = http::Request::get(format!(
        "/apis/autoapproval.io/v1alpha1/namespaces/{}/autoapprovals/t",
        s.namespace()
    ))
    .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .unwrap();
    let table: Value = s.client().request(request).await.unwrap();
    assert_eq!(
        table["columnDefinitions"][1]["description"],
        "Custom resource definition column (in JSONPath format): .spec.requestId"
    );
    let api: Api<ConfigMap> = Api::default_namespaced(s.client());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap(),
    )
    .await
    .unwrap();
    let wrong = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let e = refusal(api.delete("p", &wrong).await);
    assert_eq!(e.code, 409);
    assert!(
        e.message.starts_with("Operation cannot be fulfilled on ConfigMap \"p\": the UID in the precondition (00000000-0000-0000-0000-000000000000) does not match the UID in record ("),
        "{}",
        e.message
    );
}
on_both_servers!(printer_columns_are_described_and_a_precondition_names_the_kind);
