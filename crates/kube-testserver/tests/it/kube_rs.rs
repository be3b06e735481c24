//! Tests driven by kube-rs clients.

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Config};
use kube_testserver::{Match, Options, TestServer};

use crate::server::{Under, eventually, install_crd, on_both_servers};
use serde_json::{Value, json};
use std::time::Duration;

fn client(server: &TestServer) -> Client {
    let mut c = Config::new(server.url().parse().unwrap());
    c.default_namespace = "default".into();
    Client::try_from(c).unwrap()
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn configmap_crud_conflict_and_errors(s: &Under) {
    let api: Api<ConfigMap> = Api::default_namespaced(s.client());
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "c1", "labels": {"a": "1"}}, "data": {"k": "v"}}),
    )
    .unwrap();
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    let err = api.create(&PostParams::default(), &cm).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );
    let mut stale = created.clone();
    let mut fresh = created.clone();
    fresh.data = Some([("k".to_string(), "v2".to_string())].into());
    let updated = api
        .replace("c1", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert!(
        updated
            .metadata
            .resource_version
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > created
                .metadata
                .resource_version
                .clone()
                .unwrap()
                .parse::<u64>()
                .unwrap()
    );
    stale.data = Some([("k".to_string(), "v3".to_string())].into());
    let err = api
        .replace("c1", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"),
        "{err:?}"
    );
    let list = api
        .list(&ListParams::default().labels("a in (1,2),!b"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let list = api
        .list(&ListParams::default().labels("a notin (1)"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 0);
    api.patch(
        "c1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "y"}})),
    )
    .await
    .unwrap();
    let got = api.get("c1").await.unwrap();
    assert_eq!(got.data.unwrap().get("x").map(String::as_str), Some("y"));
    api.delete("c1", &DeleteParams::default()).await.unwrap();
    let err = api.get("c1").await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 404 && s.reason == "NotFound"),
        "{err:?}"
    );
    let missing: Api<ConfigMap> = Api::namespaced(s.client(), "nope");
    let err = missing
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 404),
        "{err:?}"
    );
}

on_both_servers!(configmap_crud_conflict_and_errors);

async fn lease_race_exactly_one_wins(s: &Under) {
    let a: Api<Lease> = Api::namespaced(s.client(), s.namespace());
    let b: Api<Lease> = Api::default_namespaced(s.client());
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "none"}}),
    )
    .unwrap();
    let base = a.create(&PostParams::default(), &lease).await.unwrap();
    let mut la = base.clone();
    la.spec.as_mut().unwrap().holder_identity = Some("a".into());
    let mut lb = base.clone();
    lb.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let pp = PostParams::default();
    let (ra, rb) = tokio::join!(a.replace("leader", &pp, &la), b.replace("leader", &pp, &lb));
    let wins = [ra.is_ok(), rb.is_ok()].iter().filter(|x| **x).count();
    assert_eq!(wins, 1, "exactly one should win");
    let loser = match (ra, rb) {
        (Err(e), _) | (_, Err(e)) => e,
        _ => unreachable!(),
    };
    assert!(
        matches!(&loser, kube::Error::Api(s) if s.code == 409),
        "{loser:?}"
    );
}

on_both_servers!(lease_race_exactly_one_wins);

fn aa(name: &str, id: i64) -> kube::api::DynamicObject {
    serde_json::from_value(json!({"apiVersion": "autoapproval.io/v1alpha1", "kind": "AutoApproval", "metadata": {"name": name}, "spec": {"requestId": id, "requestType": "AD_CONTRACT"}})).unwrap()
}

async fn custom_resource_status_generation_validation(s: &Under) {
    s.install_crd().await;
    let api = s.autoapprovals();
    let o = api
        .create(&PostParams::default(), &aa("x", 5))
        .await
        .unwrap();
    assert_eq!(o.metadata.generation, Some(1));
    assert_eq!(o.data["spec"]["paused"], json!(false), "default applied");
    let s = api
        .patch_status(
            "x",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Pending"}, "spec": {"requestId": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(s.data["status"]["phase"], "Pending");
    assert_eq!(
        s.data["spec"]["requestId"], 5,
        "status write leaves spec alone"
    );
    assert_eq!(s.metadata.generation, Some(1));
    let m = api
        .patch(
            "x",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"requestId": 6}, "status": {"phase": "Done"}})),
        )
        .await
        .unwrap();
    assert_eq!(m.metadata.generation, Some(2));
    assert_eq!(
        m.data["status"]["phase"], "Pending",
        "main write leaves status alone"
    );
    let bad = serde_json::from_value(json!({"apiVersion": "autoapproval.io/v1alpha1", "kind": "AutoApproval", "metadata": {"name": "bad"}, "spec": {"requestType": "AD_CONTRACT"}})).unwrap();
    let err = api.create(&PostParams::default(), &bad).await.unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert_eq!(
                s.message,
                "AutoApproval.autoapproval.io \"bad\" is invalid: spec.requestId: Required value"
            );
        }
        other => panic!("{other:?}"),
    }
    let cfg = |id: i64| {
        Patch::Apply(
            json!({"apiVersion": "autoapproval.io/v1alpha1", "kind": "AutoApproval", "spec": {"requestId": id, "requestType": "AD_CONTRACT"}}),
        )
    };
    let err = api
        .patch("x", &PatchParams::apply("t"), &cfg(7))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.message.contains(".spec.requestId")),
        "{err:?}"
    );
    let err = api
        .patch("x", &PatchParams::apply("t").force(), &cfg(0))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422),
        "{err:?}"
    );
    let applied = api
        .patch("x", &PatchParams::apply("t").force(), &cfg(7))
        .await
        .unwrap();
    assert_eq!(applied.data["spec"]["requestId"], 7);
}

on_both_servers!(custom_resource_status_generation_validation);

/// An apply to the status subresource is a managed-fields entry of its own (subresource
/// `status`), as in kube-apiserver: the manager owns what it applied there, a field it stops
/// applying is removed, and its apply to the main resource is kept beside it.
async fn a_status_apply_owns_its_fields_and_drops_those_it_stops_applying(s: &Under) {
    s.install_crd().await;
    let api = s.autoapprovals();
    api.create(&PostParams::default(), &aa("y", 8))
        .await
        .unwrap();
    let status = |status: Value| {
        Patch::Apply(
            json!({"apiVersion": "autoapproval.io/v1alpha1", "kind": "AutoApproval", "status": status}),
        )
    };
    let ctl = PatchParams::apply("ctl").force();
    api.patch(
        "y",
        &ctl,
        &Patch::Apply(json!({"apiVersion": "autoapproval.io/v1alpha1", "kind": "AutoApproval", "spec": {"requestId": 8, "requestType": "AD_CONTRACT", "paused": true}})),
    )
    .await
    .unwrap();
    let waiting = api
        .patch_status(
            "y",
            &ctl,
            &status(json!({"phase": "RetryWaiting", "step": "owner", "holder": "r1", "nextRetryTime": "2026-12-04T10:00:00Z"})),
        )
        .await
        .unwrap();
    assert_eq!(waiting.data["status"]["step"], "owner");
    let decided = api
        .patch_status("y", &ctl, &status(json!({"phase": "Superseded"})))
        .await
        .unwrap();
    assert_eq!(decided.data["status"], json!({"phase": "Superseded"}));
    assert_eq!(
        decided.data["spec"]["paused"], true,
        "the main resource's apply stands"
    );
    let entries: Vec<(String, String, String)> = decided
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            (
                e.manager.unwrap_or_default(),
                e.operation.unwrap_or_default(),
                e.subresource.unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        entries.contains(&("ctl".into(), "Apply".into(), "status".into()))
            && entries.contains(&("ctl".into(), "Apply".into(), String::new())),
        "{entries:?}"
    );
}

on_both_servers!(a_status_apply_owns_its_fields_and_drops_those_it_stops_applying);

/// Fault injection (closed watch streams, 410 Gone on demand): in-memory only.
#[tokio::test]
async fn watcher_survives_closed_stream_and_410() {
    let server = TestServer::start(Options {
        watch_window: 5,
        ..Options::default()
    })
    .await
    .unwrap();
    let c = client(&server);
    let api: Api<ConfigMap> = Api::default_namespaced(c.clone());
    let (reader, writer) = reflector::store::<ConfigMap>();
    let inits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inits2 = inits.clone();
    let stream = watcher(api.clone(), watcher::Config::default())
        .map(move |e| {
            if let Ok(watcher::Event::InitDone) = &e {
                inits2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            e
        })
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    let mk =
        |n: &str| serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": n}})).unwrap();
    api.create(&PostParams::default(), &mk("a")).await.unwrap();
    wait_for("a in store", || reader.state().len() == 1).await;
    // Dropped stream: the watcher reconnects from its last resourceVersion.
    server.faults().close_watches();
    api.create(&PostParams::default(), &mk("b")).await.unwrap();
    wait_for("b in store", || reader.state().len() == 2).await;
    // 410: block watches, push more changes than the retained window, then let it reconnect.
    server.faults().fail_always(500, Match::any().verb("watch"));
    server.faults().close_watches();
    for i in 0..8 {
        api.create(&PostParams::default(), &mk(&format!("n{i}")))
            .await
            .unwrap();
    }
    api.delete("a", &DeleteParams::default()).await.unwrap();
    server.faults().clear();
    wait_for("relisted store", || {
        reader.state().len() == 9 && inits.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    task.abort();
}

async fn streaming_list_watcher(s: &Under) {
    let api: Api<ConfigMap> = Api::default_namespaced(s.client());
    for n in ["s1", "s2"] {
        api.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": n}})).unwrap(),
        )
        .await
        .unwrap();
    }
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = watcher(api.clone(), watcher::Config::default().streaming_lists())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    wait_for("streamed initial events", || reader.state().len() == 2).await;
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "s3"}})).unwrap(),
    )
    .await
    .unwrap();
    wait_for("s3", || reader.state().len() == 3).await;
    task.abort();
}

on_both_servers!(streaming_list_watcher);

/// Legacy and aggregated discovery describe the same resources, and a CRD appears in both
/// once established and leaves when it is deleted. The CRD is the test's own (its own group):
/// the shared one of the real server stays.
async fn legacy_and_aggregated_discovery_agree(s: &Under) {
    use kube::discovery::{Discovery, Scope};
    use std::collections::BTreeSet;
    fn resources(d: &Discovery) -> BTreeSet<(String, String, String, String, bool, Vec<String>)> {
        d.groups()
            .flat_map(|g| {
                g.versions()
                    .flat_map(|v| g.versioned_resources(v))
                    .map(|(ar, caps)| {
                        let mut subs: Vec<String> = caps
                            .subresources
                            .iter()
                            .map(|(s, _)| s.plural.clone())
                            .collect();
                        subs.sort();
                        (
                            ar.group,
                            ar.version,
                            ar.kind,
                            ar.plural,
                            caps.scope == Scope::Namespaced,
                            subs,
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }
    const GROUP: &str = "discovery.autoapproval.io";
    let c = s.client();
    install_crd(c.clone(), GROUP).await;
    let (legacy, aggregated) = eventually("the CRD in both discoveries", || async {
        let legacy = resources(&Discovery::new(c.clone()).run().await.unwrap());
        let aggregated = resources(&Discovery::new(c.clone()).run_aggregated().await.unwrap());
        (legacy.iter().any(|r| r.0 == GROUP) && aggregated.iter().any(|r| r.0 == GROUP))
            .then_some((legacy, aggregated))
    })
    .await;
    assert_eq!(legacy, aggregated);
    let aa = aggregated
        .iter()
        .find(|r| r.0 == GROUP)
        .expect("the CRD is discovered");
    assert_eq!(
        (aa.1.as_str(), aa.2.as_str(), aa.3.as_str(), aa.4),
        ("v1alpha1", "AutoApproval", "autoapprovals", true)
    );
    assert_eq!(aa.5, ["status"]);
    assert!(
        aggregated
            .iter()
            .any(|r| r.0 == "coordination.k8s.io" && r.3 == "leases")
    );
    assert!(
        aggregated
            .iter()
            .any(|r| r.0.is_empty() && r.3 == "configmaps")
    );
    // The built-in kinds a Helm chart renders, each in its scope.
    for (group, kind, plural, namespaced) in [
        ("", "Service", "services", true),
        ("", "Secret", "secrets", true),
        ("", "ServiceAccount", "serviceaccounts", true),
        ("apps", "Deployment", "deployments", true),
        ("batch", "Job", "jobs", true),
        (
            "policy",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
        ),
        (
            "networking.k8s.io",
            "NetworkPolicy",
            "networkpolicies",
            true,
        ),
        ("rbac.authorization.k8s.io", "Role", "roles", true),
        (
            "rbac.authorization.k8s.io",
            "RoleBinding",
            "rolebindings",
            true,
        ),
        (
            "rbac.authorization.k8s.io",
            "ClusterRole",
            "clusterroles",
            false,
        ),
        (
            "rbac.authorization.k8s.io",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
        ),
    ] {
        assert!(
            aggregated.iter().any(|r| r.0 == group
                && r.1 == "v1"
                && r.2 == kind
                && r.3 == plural
                && r.4 == namespaced),
            "{group}/v1 {kind} ({plural}, namespaced {namespaced}) is not discovered"
        );
    }

    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(c.clone());
    crds.delete(&format!("autoapprovals.{GROUP}"), &DeleteParams::default())
        .await
        .unwrap();
    eventually("the CRD gone from discovery", || async {
        let after = resources(&Discovery::new(c.clone()).run_aggregated().await.unwrap());
        (!after.iter().any(|r| r.0 == GROUP)).then_some(())
    })
    .await;
}

on_both_servers!(legacy_and_aggregated_discovery_agree);

async fn a_paged_list_returns_each_object_once_in_order_with_the_count_left(s: &Under) {
    let api: Api<ConfigMap> = Api::default_namespaced(s.client());
    for i in 0..25 {
        let labels = if i % 2 == 0 {
            json!({"even": "yes"})
        } else {
            json!({})
        };
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("c{i:02}"), "labels": labels}}),
        )
        .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    for (selector, expected) in [("", 25), ("even=yes", 13)] {
        let mut names = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = ListParams::default().limit(4).labels(selector);
            params.continue_token = token.clone();
            let page = api.list(&params).await.unwrap();
            let left = expected - names.len() - page.items.len();
            // As kube-apiserver: no count of what is left on a filtered list.
            let counted = (left > 0 && selector.is_empty()).then_some(left as i64);
            assert_eq!(
                page.metadata.remaining_item_count, counted,
                "{selector:?} after {names:?}"
            );
            names.extend(page.items.into_iter().filter_map(|c| c.metadata.name));
            token = page.metadata.continue_;
            if token.is_none() {
                break;
            }
        }
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names, sorted, "in order, each once");
        assert_eq!(names.len(), expected, "{selector:?}: {names:?}");
    }
}

on_both_servers!(a_paged_list_returns_each_object_once_in_order_with_the_count_left);
