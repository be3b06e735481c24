//! The plain manifests of `deploy/manifests/`: the chart rendered for kubectl without a trace of
//! helm, and `kubectl apply -k` creating the Helm release's objects on the test API server and the
//! real kube-apiserver, whose replica approves a request under their Role.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::support::{
    CHART_KINDS, Cli, Db, Kubelet, NAMESPACE, On, RELEASE, RESTRICTED, RESTRICTED_WARN, Rendered,
    approved_through_kubectl, as_operator_of_own_server, eventually, kubectl_name, on_both_servers,
    parse_yaml_stream, path_str, plain, renders, repo, strs,
};

#[test]
fn the_plain_manifests_are_the_chart_rendered_for_kubectl_without_a_trace_of_helm() {
    let path = repo().join("deploy/manifests/autoapproval.yaml");
    let committed = std::fs::read_to_string(&path).expect("deploy/manifests/autoapproval.yaml");
    // The file is helm's output behind a comment header.
    let body: String = committed
        .split_inclusive('\n')
        .skip_while(|line| line.starts_with('#'))
        .collect();
    assert!(
        body == plain().yaml,
        "deploy/manifests/autoapproval.yaml is stale: run scripts/render-manifests.sh"
    );
    let helm_keys = |m: &Value| -> Vec<String> {
        m.as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| k.starts_with("helm.sh/") || *v == "Helm")
            .map(|(k, v)| format!("{k}: {v}"))
            .collect()
    };
    for o in &plain().objects {
        let meta = &o["metadata"];
        let found = [helm_keys(&meta["labels"]), helm_keys(&meta["annotations"])].concat();
        assert!(found.is_empty(), "{}: {found:?}", kubectl_name(o));
    }
    // The same objects as the Helm release, the migration Job included (an ordinary Job here).
    let names = |r: &Rendered| -> BTreeSet<String> { r.objects.iter().map(kubectl_name).collect() };
    assert_eq!(names(plain()), names(&renders()[0]));
    // No hook orders the migration first: an init container runs the same `migrate` (it waits
    // on the migration lock while the Job holds it), so no replica starts on an old schema.
    let job = plain().one("Job");
    let migrate = &job["spec"]["template"]["spec"]["initContainers"][0];
    let pod = &plain().one("Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["initContainers"].as_array().map(Vec::len), Some(1));
    assert_eq!(&pod["initContainers"][0], migrate);
    assert_eq!(strs(&migrate["args"]), ["migrate"]);
    let helm_pod = &renders()[0].one("Deployment")["spec"]["template"]["spec"];
    assert!(
        helm_pod["initContainers"].is_null(),
        "with Helm the hook Job runs first"
    );
}

/// A stand-in for one of the Prometheus Operator's CRDs (`ServiceMonitor`, `PrometheusRule`), so
/// those objects can be dry-run too.
fn monitoring_crd(kind: &str) -> String {
    let singular = kind.to_lowercase();
    let plural = format!("{singular}s");
    format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  names: {{kind: {kind}, listKind: {kind}List, plural: {plural}, singular: {singular}}}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"
    )
}

on_both_servers!(kubectl_apply_k_creates_the_objects_of_the_helm_release);
/// `kubectl apply -k deploy/manifests` against an API server of its own (the test API server or
/// the real kube-apiserver, as its admin), after the namespace, the CRD and the Secret made with
/// kubectl's typed commands: a server dry run that stores nothing, then for real (the objects of
/// the Helm release, hooks as ordinary objects), then idempotent; the test plays the Job
/// controller and kubelet (`autoapproval migrate` of the Job and the init container on the test's
/// database), the replica runs as the ServiceAccount the manifests create, on the real server
/// authorized only by their Role, and approves a request.
async fn kubectl_apply_k_creates_the_objects_of_the_helm_release(db: Db, on: On) {
    as_operator_of_own_server(on, db, NAMESPACE, apply_k).await;
}

fn apply_k(k: &Cli, kubelet: &Kubelet, db: &Db, rt: &tokio::runtime::Handle) {
    let manifests = repo().join("deploy/manifests");
    let manifests = path_str(&manifests);
    let objects = &plain().objects;
    let names: BTreeSet<String> = objects.iter().map(kubectl_name).collect();
    let helm_names: BTreeSet<String> = renders()[0].objects.iter().map(kubectl_name).collect();
    assert_eq!(names, helm_names, "the same objects as `helm template`");

    // kustomize adds nothing to the rendered file but the namespace it already has.
    let built = parse_yaml_stream(&k.kubectl(&["kustomize", manifests]));
    let by_name = |objs: &[Value]| -> BTreeMap<String, Value> {
        objs.iter().map(|o| (kubectl_name(o), o.clone())).collect()
    };
    assert_eq!(by_name(&built), by_name(objects));

    let out = k.kubectl(&["create", "namespace", NAMESPACE]);
    assert_eq!(out, format!("namespace/{NAMESPACE} created\n"));
    // Pod Security `restricted` enforced, as a hardened cluster does: on kube-apiserver its
    // admission warns of a pod template that falls short.
    k.kubectl(&["label", "namespace", NAMESPACE, RESTRICTED, RESTRICTED_WARN]);
    let crds = repo().join("crds");
    let out = k.kubectl(&["apply", "--server-side", "-f", path_str(&crds)]);
    assert!(
        out.contains("autoapprovals.autoapproval.io serverside-applied"),
        "{out}"
    );
    let url = "--from-literal=database-url=postgres://autoapproval@db:5432/contracts";
    let out = k.kubectl(&["-n", NAMESPACE, "create", "secret", "generic", RELEASE, url]);
    assert_eq!(out, format!("secret/{RELEASE} created\n"));

    let out = k.kubectl(&["apply", "--dry-run=server", "-k", manifests]);
    let dry = out.matches(" created (server dry run)").count();
    assert_eq!(dry, objects.len(), "{out}");
    let stored = k.kubectl(&["get", CHART_KINDS, "-n", NAMESPACE, "-o", "name"]);
    assert_eq!(stored, "", "a server dry run must store nothing");

    let applied = k
        .kubectl_command(&["apply", "-k", manifests])
        .output()
        .expect("run kubectl");
    let out = String::from_utf8_lossy(&applied.stdout).into_owned();
    let warnings = String::from_utf8_lossy(&applied.stderr);
    assert!(
        applied.status.success() && warnings.is_empty(),
        "kubectl apply -k: {warnings}"
    );
    assert_eq!(out.matches(" created\n").count(), objects.len(), "{out}");
    let stored = k.kubectl(&["get", CHART_KINDS, "-n", NAMESPACE, "-o", "name"]);
    let stored: BTreeSet<String> = stored.lines().map(str::to_owned).collect();
    assert_eq!(stored, names);
    let hooks = k.kubectl(&[
        "get",
        "jobs",
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.items[*].metadata.annotations}",
    ]);
    assert!(!hooks.contains("helm.sh"), "an ordinary Job: {hooks}");
    // The played Job controller writes the Job's status once; the re-apply below must find
    // nothing changed.
    rt.block_on(eventually("the migration Job to complete", || async {
        let done = kubelet.done();
        done.contains(&format!("Job/{RELEASE}-migrate"))
            .then_some(())
    }));

    // Applying again changes nothing. kubectl still says `configured` for the
    // PodDisruptionBudget, as against kube-apiserver: its selector's patch strategy is
    // `replace`, so the patch kubectl computes is never empty.
    let rv = "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.resourceVersion} {end}";
    let versions = || k.kubectl(&["get", CHART_KINDS, "-n", NAMESPACE, "-o", rv]);
    let before = versions();
    let out = k.kubectl(&["apply", "-k", manifests]);
    assert_eq!(versions(), before, "re-apply changed objects: {out}");
    for line in out.lines() {
        let pdb = line.starts_with("poddisruptionbudget.policy/");
        assert!(line.ends_with(" unchanged") || pdb, "re-apply: {line}");
    }

    // The CRD serves; no request has been picked up yet.
    let aa = k
        .kubectl_command(&["get", "autoapprovals", "-n", NAMESPACE])
        .output()
        .expect("run kubectl");
    let stderr = String::from_utf8_lossy(&aa.stderr);
    assert!(
        aa.status.success() && stderr.contains("No resources found"),
        "{stderr}"
    );

    // The replica, as the manifests' ServiceAccount, becomes ready and approves a request.
    rt.block_on(eventually("the replica to be ready", || async {
        kubelet.ready().await.then_some(())
    }));
    rt.block_on(approved_through_kubectl(k, db, NAMESPACE, 702));

    // Every optional object too: the chart with every value set, ServiceMonitor,
    // PrometheusRule and the dashboard (in Grafana's namespace) included.
    let crd = k.dir.join("monitoring-crds.yaml");
    let crds = [
        monitoring_crd("ServiceMonitor"),
        monitoring_crd("PrometheusRule"),
    ]
    .join("---\n");
    std::fs::write(&crd, crds).unwrap();
    k.kubectl(&["apply", "-f", path_str(&crd)]);
    k.kubectl(&["create", "namespace", "monitoring"]);
    let everything = k.dir.join("all-values.yaml");
    std::fs::write(&everything, &renders()[1].yaml).unwrap();
    let out = k.kubectl(&["apply", "--dry-run=server", "-f", path_str(&everything)]);
    let dry = out.matches(" created (server dry run)").count();
    assert_eq!(dry, renders()[1].objects.len(), "{out}");
}
