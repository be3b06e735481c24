//! The objects the chart renders keep their promises: a Role granting exactly what the controller
//! calls, non-root read-only containers, the Deployment's replicas, probes, resources, spread and
//! shutdown grace, the migration hook Job, database URLs and tokens only from the existing Secret,
//! and `helm test` and NOTES.

use std::collections::BTreeSet;

use autoapproval::flags::parse_duration;
use serde_json::Value;

use crate::support::{
    NAMESPACE, RELEASE, ROLE_GRANTS, helm_release, help_env, parse_yaml_stream, renders, selects,
    stdout_of, strs,
};

#[test]
fn helm_test_fetches_readyz_through_the_service_and_notes_never_chain_after_port_forward() {
    let template = helm_release("template", &["--show-only", "templates/tests/readyz.yaml"]);
    let yaml = stdout_of(
        template,
        "helm template --show-only templates/tests/readyz.yaml",
    );
    let pods = parse_yaml_stream(&yaml);
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
    let service = renders()[0].one("Service");
    let port = service["spec"]["ports"][0]["port"].as_u64().unwrap();
    let url = format!(
        "http://{}.{NAMESPACE}.svc:{port}/readyz",
        service["metadata"]["name"].as_str().unwrap()
    );
    let command = strs(&pod["spec"]["containers"][0]["command"]);
    assert_eq!(command.first(), Some(&"wget"));
    assert_eq!(command.last(), Some(&url.as_str()));
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(
        pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
        true
    );

    // NOTES: port-forward blocks, so nothing may follow it with `&&`.
    let out = helm_release("install", &["--dry-run=client"])
        .output()
        .unwrap();
    let notes = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let forward = notes
        .lines()
        .find(|l| l.trim_start().starts_with("kubectl") && l.contains("port-forward"))
        .unwrap_or_else(|| panic!("NOTES show port-forward: {notes}"));
    assert!(
        forward.trim_end().ends_with('&') && !forward.contains("&&"),
        "{forward}"
    );
    assert!(
        notes.contains(&format!("curl -s localhost:{port}/metrics")),
        "{notes}"
    );
    assert!(
        !notes.contains("WARNING"),
        "no loopback URL, no warning: {notes}"
    );
}

#[test]
fn rbac_grants_exactly_the_controllers_needs_in_the_release_namespace() {
    let mut expected = BTreeSet::new();
    for (group, resource, verb) in ROLE_GRANTS {
        expected.insert((group.to_owned(), resource.to_owned(), verb.to_owned()));
    }
    for r in renders() {
        for kind in ["ClusterRole", "ClusterRoleBinding"] {
            assert!(
                r.all(kind).is_empty(),
                "{}: no {kind} may be rendered",
                r.name
            );
        }
        let role = r.one("Role");
        assert_eq!(role["metadata"]["namespace"], NAMESPACE, "{}", r.name);
        let mut granted = BTreeSet::new();
        for rule in role["rules"].as_array().expect("rules") {
            let keys: BTreeSet<&str> = rule
                .as_object()
                .expect("rule")
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(
                keys,
                BTreeSet::from(["apiGroups", "resources", "verbs"]),
                "{}: {rule}",
                r.name
            );
            for group in strs(&rule["apiGroups"]) {
                for resource in strs(&rule["resources"]) {
                    for verb in strs(&rule["verbs"]) {
                        granted.insert((group.to_owned(), resource.to_owned(), verb.to_owned()));
                    }
                }
            }
        }
        assert_eq!(granted, expected, "{}: Role rules", r.name);

        let binding = r.one("RoleBinding");
        let sa = r.one("ServiceAccount");
        let pod = &r.one("Deployment")["spec"]["template"]["spec"];
        assert_eq!(binding["metadata"]["namespace"], NAMESPACE);
        assert_eq!(
            binding["roleRef"],
            serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]})
        );
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}])
        );
        assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    }
}

#[test]
fn every_container_runs_non_root_on_a_read_only_root_without_privileges() {
    for r in renders() {
        let pods: Vec<(&Value, &Value)> = r
            .objects
            .iter()
            .filter_map(|o| Some((o, o.pointer("/spec/template/spec")?)))
            .collect();
        let kinds: BTreeSet<&str> = pods
            .iter()
            .filter_map(|(o, _)| o["kind"].as_str())
            .collect();
        assert_eq!(kinds, BTreeSet::from(["Deployment", "Job"]), "{}", r.name);
        for (owner, pod) in pods {
            let what = format!(
                "{}: {} {}",
                r.name, owner["kind"], owner["metadata"]["name"]
            );
            for host in ["hostNetwork", "hostPID", "hostIPC"] {
                assert_ne!(pod[host], true, "{what}: {host}");
            }
            let pod_sc = &pod["securityContext"];
            let containers = pod["containers"].as_array().expect("containers");
            let init = pod["initContainers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            assert!(!containers.is_empty());
            for c in containers.iter().chain(&init) {
                let what = format!("{what} container {}", c["name"]);
                let sc = &c["securityContext"];
                let effective = |key: &str| match &sc[key] {
                    Value::Null => pod_sc[key].clone(),
                    v => v.clone(),
                };
                assert_eq!(effective("runAsNonRoot"), true, "{what}: runAsNonRoot");
                let uid = effective("runAsUser");
                assert!(
                    uid.as_u64().is_some_and(|u| u > 0),
                    "{what}: runAsUser {uid}"
                );
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}: read-only root");
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}: escalation");
                assert_ne!(sc["privileged"], true, "{what}: privileged");
                assert_eq!(strs(&sc["capabilities"]["drop"]), ["ALL"], "{what}: drop");
                assert!(strs(&sc["capabilities"]["add"]).is_empty(), "{what}: add");
                assert_eq!(
                    effective("seccompProfile")["type"],
                    "RuntimeDefault",
                    "{what}: seccomp"
                );
            }
        }
    }
}

#[test]
fn the_deployment_has_replicas_probes_resources_spread_and_the_shutdown_grace() {
    for r in renders() {
        let deployment = r.one("Deployment");
        let template = &deployment["spec"]["template"];
        let pod = &template["spec"];
        let labels = &template["metadata"]["labels"];
        let c = r.controller();
        let config = r.config_map();
        assert!(selects(
            &deployment["spec"]["selector"]["matchLabels"],
            labels
        ));
        // Replicas spread over nodes: preferred by default, required in all-values.
        let anti = "/affinity/podAntiAffinity";
        let term = if r.values.is_none() {
            assert_eq!(deployment["spec"]["replicas"], 3);
            let p =
                format!("{anti}/preferredDuringSchedulingIgnoredDuringExecution/0/podAffinityTerm");
            pod.pointer(&p)
        } else {
            pod.pointer(&format!(
                "{anti}/requiredDuringSchedulingIgnoredDuringExecution/0"
            ))
        };
        let term = term.unwrap_or_else(|| panic!("{}: pod anti-affinity", r.name));
        assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
        assert!(selects(&term["labelSelector"]["matchLabels"], labels));
        assert_eq!(
            c["image"],
            match r.values {
                None => format!("autoapproval:{}", env!("CARGO_PKG_VERSION")),
                Some(_) => "registry.example.com/platform/autoapproval:9.9.9".to_owned(),
            }
        );
        assert_eq!(strs(&c["args"]), ["run"]);
        assert_eq!(
            c["envFrom"],
            serde_json::json!([{"configMapRef": {"name": r.settings()["metadata"]["name"]}}])
        );

        // The probes and the Service reach the port the controller listens on.
        let listen = &config["AUTOAPPROVAL_LISTEN"];
        let port: u64 = listen.rsplit(':').next().unwrap().parse().unwrap();
        assert_eq!(
            c["ports"],
            serde_json::json!([{"name": "http", "containerPort": port, "protocol": "TCP"}])
        );
        assert_eq!(
            c["livenessProbe"]["httpGet"],
            serde_json::json!({"path": "/healthz", "port": "http"})
        );
        assert_eq!(
            c["readinessProbe"]["httpGet"],
            serde_json::json!({"path": "/readyz", "port": "http"})
        );
        for bound in ["requests", "limits"] {
            assert!(
                c["resources"][bound]["memory"].is_string(),
                "{}: resources.{bound}.memory",
                r.name
            );
        }

        // The kubelet waits out the controller's own grace, plus the margin to release claims.
        let grace = parse_duration(&config["AUTOAPPROVAL_SHUTDOWN_GRACE"]).unwrap();
        let margin = r.value("shutdownMarginSeconds").as_u64().unwrap();
        assert!(margin > 0);
        assert_eq!(
            pod["terminationGracePeriodSeconds"].as_u64(),
            Some(grace.as_secs() + u64::from(grace.subsec_nanos() > 0) + margin),
            "{}: terminationGracePeriodSeconds against AUTOAPPROVAL_SHUTDOWN_GRACE {grace:?}",
            r.name
        );

        let service = r.one("Service");
        assert!(selects(&service["spec"]["selector"], labels));
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "http");
        let pdb = r.one("PodDisruptionBudget");
        assert!(selects(&pdb["spec"]["selector"]["matchLabels"], labels));
        assert!(
            pdb["spec"]["maxUnavailable"]
                .as_u64()
                .is_some_and(|n| n >= 1)
        );
        for kind in ["ServiceMonitor", "NetworkPolicy"] {
            assert_eq!(
                r.all(kind).len(),
                usize::from(r.values.is_some()),
                "{}: {kind} is optional",
                r.name
            );
        }
        if r.values.is_some() {
            let monitor = r.one("ServiceMonitor");
            assert!(selects(
                &monitor["spec"]["selector"]["matchLabels"],
                &service["metadata"]["labels"]
            ));
            assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http");
            assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
            let policy = r.one("NetworkPolicy");
            assert!(selects(
                &policy["spec"]["podSelector"]["matchLabels"],
                labels
            ));
            assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], "http");
        }
    }
}

#[test]
fn migrations_run_in_a_hook_job_that_needs_none_of_the_charts_own_objects() {
    for r in renders() {
        let job = r.one("Job");
        let annotations = &job["metadata"]["annotations"];
        assert_eq!(annotations["helm.sh/hook"], "pre-install,pre-upgrade");
        assert_eq!(
            annotations["helm.sh/hook-delete-policy"],
            "before-hook-creation,hook-succeeded"
        );
        let pod = &job["spec"]["template"]["spec"];
        // A pre-install hook runs before the ServiceAccount and the ConfigMap exist.
        assert!(pod["serviceAccountName"].is_null(), "{}", r.name);
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(pod["restartPolicy"], "Never");
        let c = &pod["initContainers"][0];
        assert_eq!(c["image"], r.controller()["image"]);
        assert_eq!(strs(&c["args"]), ["migrate"]);
        assert!(c["envFrom"].is_null());
        let db = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "AUTOAPPROVAL_DATABASE_URL")
            .expect("the database URL");
        let controller_db = r.controller()["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "AUTOAPPROVAL_DATABASE_URL")
            .expect("the database URL");
        // The controller's Secret; the owner role's key when all-values names one (issue 41).
        let key = &db["valueFrom"]["secretKeyRef"]["key"];
        assert_eq!(
            db["valueFrom"]["secretKeyRef"]["name"],
            controller_db["valueFrom"]["secretKeyRef"]["name"]
        );
        match r.name {
            "all-values" => assert_eq!(key, "owner-url"),
            _ => assert_eq!(key, &controller_db["valueFrom"]["secretKeyRef"]["key"]),
        }
        let known = help_env("migrate");
        for e in c["env"].as_array().unwrap() {
            let name = e["name"].as_str().unwrap();
            assert!(known.contains_key(name), "`migrate` does not read {name}");
        }
        // Then `check` as the controller's role (its URL, whichever key migrate uses), the
        // start-up check of `run`, fails the Job at once when the replicas would refuse to start.
        let check = &pod["containers"][0];
        assert_eq!(pod["containers"].as_array().map(Vec::len), Some(1));
        assert_eq!(check["image"], r.controller()["image"]);
        assert_eq!(strs(&check["args"]), ["check"]);
        assert_eq!(check["terminationMessagePolicy"], "FallbackToLogsOnError");
        let check_db = check["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "AUTOAPPROVAL_DATABASE_URL")
            .expect("the database URL");
        assert_eq!(
            check_db["valueFrom"], controller_db["valueFrom"],
            "{}",
            r.name
        );
        let known = help_env("check");
        for e in check["env"].as_array().unwrap() {
            let name = e["name"].as_str().unwrap();
            assert!(known.contains_key(name), "`check` does not read {name}");
        }
        let rule = &job["spec"]["podFailurePolicy"]["rules"][0];
        assert_eq!(rule["action"], "FailJob");
        assert_eq!(rule["onExitCodes"]["containerName"], "check");
    }
}

#[test]
fn database_urls_and_tokens_come_only_from_the_existing_secret() {
    let secret_env = [
        "AUTOAPPROVAL_DATABASE_URL",
        "AUTOAPPROVAL_READ_DATABASE_URL",
        "AUTOAPPROVAL_ESIGN_TOKEN",
        "AUTOAPPROVAL_OWNER_TOKEN",
        "AUTOAPPROVAL_STORE_TOKEN",
        "AUTOAPPROVAL_AD_TOKEN",
    ];
    for r in renders() {
        assert!(
            r.all("Secret").is_empty(),
            "{}: the chart must not create the Secret",
            r.name
        );
        let config = r.config_map();
        let env = r.controller()["env"].as_array().unwrap();
        let secret_name = match r.values {
            None => RELEASE,
            Some(_) => "approver-secrets",
        };
        for name in secret_env {
            assert!(
                !config.contains_key(name),
                "{}: {name} in the ConfigMap",
                r.name
            );
            let e = env
                .iter()
                .find(|e| e["name"] == name)
                .unwrap_or_else(|| panic!("{}: {name} not set", r.name));
            assert!(e["value"].is_null(), "{}: {name} as a plain value", r.name);
            let by = &e["valueFrom"]["secretKeyRef"];
            assert_eq!(by["name"], secret_name, "{}: {name}", r.name);
            // Only the primary's URL is required; the rest may be absent from the Secret.
            assert_eq!(
                by["optional"] == true,
                name != "AUTOAPPROVAL_DATABASE_URL",
                "{}: {name}",
                r.name
            );
        }
    }
}
