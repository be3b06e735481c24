//! The chart's escape hatches an operator expects (issue 36): the image by digest, the log
//! filter, extra env / envFrom / args, image pull Secrets, a PodMonitor or a ServiceMonitor only
//! where its CRD is served, the CRD as a kept template, ClusterRoles aggregated into view / edit /
//! admin, a NetworkPolicy egress preset and the `helm test` image pinned by digest; the
//! certificates of `tls.volumes` (issue 43). Each is rendered by the real helm and checked where an
//! operator would look, and a bad value of each is refused by name.

use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::support::{
    Cli, NAMESPACE, RELEASE, chart, helm_release, parse_yaml_stream, path_str, real_namespace,
    repo, stdout_of, with_cli_on_test_server,
};

/// A well-formed digest (not of any real image: nothing is pulled here).
pub const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// The chart with every new value set, rendered into `namespace`: what the real API server must
/// take (the monitors aside: no Prometheus Operator runs there).
fn every_new_value(namespace: &str) -> String {
    let cmd = helm_release(
        "template",
        &[
            "--skip-tests",
            "--namespace",
            namespace,
            "--set",
            &format!("image.digest={DIGEST}"),
            "--set",
            "logLevel=debug",
            "--set",
            "extraEnv[0].name=HTTPS_PROXY",
            "--set",
            "extraEnv[0].value=http://proxy:3128",
            "--set",
            "extraEnvFrom[0].secretRef.name=more",
            "--set",
            "extraArgs[0]=--poll-period=5s",
            "--set",
            "imagePullSecrets[0].name=regcred",
            "--set",
            "crds.enabled=true",
            "--set",
            "rbac.aggregate=true",
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "networkPolicy.egressPreset.enabled=true",
            "--set",
            "networkPolicy.egressPreset.database.to[0].ipBlock.cidr=10.0.5.0/24",
            "--set",
            "networkPolicy.egressPreset.apiServer.to[0].ipBlock.cidr=172.18.0.2/32",
            "--set",
            "networkPolicy.egress[0].ports[0].port=4318",
            "--set",
            "tls.volumes[0].name=db",
            "--set",
            "tls.volumes[0].secret=db-tls",
            "--set",
            "tls.volumes[1].name=rds-ca",
            "--set",
            "tls.volumes[1].configMap=rds-ca-bundle",
            "--set",
            "tls.volumes[1].items[0].key=global-bundle.pem",
            "--set",
            "tls.volumes[1].items[0].path=ca.pem",
            "--set",
            "tls.volumes[1].defaultMode=292",
        ],
    );
    stdout_of(cmd, "helm template with every new value")
}

/// `kubectl apply --dry-run=server` of every object the new values render, on the real
/// kube-apiserver with strict field validation: the NetworkPolicy preset, the ClusterRoles, the
/// templated CRD and the Deployment's new fields are valid objects, not only valid YAML.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_api_server_takes_every_object_the_new_values_render() {
    let real = real_namespace(|_| {}).await;
    let (kubeconfig, namespace) = (real.ns.admin_kubeconfig.clone(), real.ns.name.clone());
    tokio::task::spawn_blocking(move || {
        let cli = Cli::with_kubeconfig(&kubeconfig);
        let yaml = every_new_value(&namespace);
        let objects = parse_yaml_stream(&yaml);
        for kind in ["NetworkPolicy", "ClusterRole", "CustomResourceDefinition"] {
            assert!(!of_kind(&objects, kind).is_empty(), "{kind} rendered");
        }
        let file = cli.dir.join("every-new-value.yaml");
        std::fs::write(&file, &yaml).expect("write");
        let out = cli.kubectl(&[
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            file.to_str().expect("utf-8 path"),
        ]);
        assert_eq!(
            out.matches("(server dry run)").count(),
            objects.len(),
            "{out}"
        );
    })
    .await
    .expect("the dry run");
}

/// `helm template` of the chart with the required URLs and `args` (`--set`, `--api-versions`),
/// the `helm test` Pod included.
fn helm_template(args: &[&str]) -> Output {
    helm_release("template", args)
        .output()
        .expect("run helm template")
}

/// The objects `helm template` renders with `args`, which must be accepted.
fn render(args: &[&str]) -> Vec<Value> {
    let out = helm_template(args);
    assert!(
        out.status.success(),
        "helm template {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_yaml_stream(&String::from_utf8_lossy(&out.stdout))
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(objects, kind);
    assert_eq!(found.len(), 1, "one {kind} expected");
    found[0]
}

/// The pod spec of the object of `kind` (Deployment, Job) or the Pod itself.
fn pod_spec<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let o = one(objects, kind);
    o.pointer("/spec/template/spec").unwrap_or(&o["spec"])
}

fn container<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    &pod_spec(objects, kind)["containers"][0]
}

/// The value of env variable `name` in `container`, or None when it is not set.
fn env<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

#[test]
fn image_digest_takes_precedence_over_the_tag_in_every_container_of_the_image() {
    let pinned = format!("image.digest={DIGEST}");
    let objects = render(&[
        "--set",
        "image.repository=registry.example.com/autoapproval",
        "--set",
        "image.tag=9.9.9",
        "--set",
        &pinned,
    ]);
    let expected = format!("registry.example.com/autoapproval@{DIGEST}");
    assert_eq!(
        container(&objects, "Deployment")["image"],
        expected.as_str()
    );
    assert_eq!(container(&objects, "Job")["image"], expected.as_str());
    // Without plain manifests' init container too.
    let plain = render(&["--set", &pinned, "--set", "helmHooks=false"]);
    assert_eq!(
        pod_spec(&plain, "Deployment")["initContainers"][0]["image"],
        format!("autoapproval@{DIGEST}").as_str()
    );
    // No digest: the tag, defaulting to the appVersion.
    let tagged = render(&[]);
    assert_eq!(
        container(&tagged, "Deployment")["image"],
        format!("autoapproval:{}", env!("CARGO_PKG_VERSION")).as_str()
    );
}

#[test]
fn log_level_extra_env_env_from_and_args_reach_the_controller_after_the_charts_own() {
    let objects = render(&[
        "--set",
        "logLevel=info\\,autoapproval=debug",
        "--set",
        "extraEnv[0].name=HTTPS_PROXY",
        "--set",
        "extraEnv[0].value=http://proxy:3128",
        "--set",
        "extraEnv[1].name=POD_IP",
        "--set",
        "extraEnv[1].valueFrom.fieldRef.fieldPath=status.podIP",
        "--set",
        "extraEnvFrom[0].secretRef.name=more-settings",
        "--set",
        "extraEnvFrom[1].configMapRef.name=proxy",
        "--set",
        "extraEnvFrom[1].prefix=PROXY_",
        "--set",
        "extraArgs[0]=--poll-period=5s",
        "--set",
        "extraArgs[1]=--log-json",
    ]);
    let controller = container(&objects, "Deployment");
    // RUST_LOG keeps the binary's default silence of kube's client's request errors.
    let filter = json!({"name": "RUST_LOG", "value": "info,autoapproval=debug,kube_client::client::builder=off"});
    assert_eq!(env(controller, "RUST_LOG"), Some(&filter));
    assert_eq!(
        env(container(&objects, "Job"), "RUST_LOG"),
        Some(&filter),
        "the migration logs at the same level"
    );
    let envs = controller["env"].as_array().expect("env");
    assert_eq!(
        envs[envs.len() - 2..],
        [
            json!({"name": "HTTPS_PROXY", "value": "http://proxy:3128"}),
            json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
        ],
        "extraEnv comes after the chart's own variables"
    );
    let env_from = controller["envFrom"].as_array().expect("envFrom");
    assert_eq!(
        env_from[1..],
        [
            json!({"secretRef": {"name": "more-settings"}}),
            json!({"configMapRef": {"name": "proxy"}, "prefix": "PROXY_"}),
        ]
    );
    assert!(
        env_from[0]["configMapRef"]["name"].is_string(),
        "the settings ConfigMap stays first, so extraEnvFrom can replace a setting: {env_from:?}"
    );
    assert_eq!(
        controller["args"],
        json!(["run", "--poll-period=5s", "--log-json"])
    );
    // Nothing set, nothing added.
    let plain = render(&[]);
    let controller = container(&plain, "Deployment");
    assert_eq!(env(controller, "RUST_LOG"), None);
    assert_eq!(env(container(&plain, "Job"), "RUST_LOG"), None);
    assert_eq!(controller["args"], json!(["run"]));
    assert_eq!(controller["envFrom"].as_array().map(Vec::len), Some(1));
}

#[test]
fn the_binary_takes_the_rendered_extra_args_and_refuses_a_misspelt_one() {
    // `autoapproval run` takes the rendered args (its parser refuses an unknown flag).
    let objects = render(&["--set", "extraArgs[0]=--poll-period=5s"]);
    let args: Vec<String> =
        serde_json::from_value(container(&objects, "Deployment")["args"].clone()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(&args)
        .arg("--help")
        .output()
        .expect("run autoapproval");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(["run", "--pol-period=5s", "--help"])
        .output()
        .expect("run autoapproval");
    assert!(!out.status.success(), "a misspelt flag is refused");
}

#[test]
fn image_pull_secrets_reach_the_controller_the_migration_and_the_test_pod() {
    let objects = render(&["--set", "imagePullSecrets[0].name=regcred"]);
    for kind in ["Deployment", "Job", "Pod"] {
        assert_eq!(
            pod_spec(&objects, kind)["imagePullSecrets"],
            json!([{"name": "regcred"}]),
            "{kind}"
        );
    }
}

#[test]
fn a_monitor_is_rendered_only_where_its_crd_is_served_and_only_one_of_the_two() {
    const SM: &str = "monitoring.coreos.com/v1/ServiceMonitor";
    const PM: &str = "monitoring.coreos.com/v1/PodMonitor";
    let kinds = |args: &[&str]| -> Vec<String> {
        render(args)
            .iter()
            .filter_map(|o| o["kind"].as_str())
            .filter(|k| k.ends_with("Monitor"))
            .map(str::to_owned)
            .collect()
    };
    let sm = ["--set", "serviceMonitor.enabled=true"];
    let pm = ["--set", "podMonitor.enabled=true"];
    assert_eq!(
        kinds(&sm),
        Vec::<String>::new(),
        "no CRD, no ServiceMonitor"
    );
    assert_eq!(kinds(&pm), Vec::<String>::new(), "no CRD, no PodMonitor");
    assert_eq!(
        kinds(&[&sm[..], &["--api-versions", SM]].concat()),
        ["ServiceMonitor"]
    );
    assert_eq!(
        kinds(&[&sm[..], &["--api-versions", PM]].concat()),
        Vec::<String>::new(),
        "the PodMonitor CRD does not serve a ServiceMonitor"
    );
    assert_eq!(
        kinds(&["--api-versions", SM, "--api-versions", PM]),
        Vec::<String>::new()
    );

    let objects = render(
        &[
            &pm[..],
            &[
                "--api-versions",
                PM,
                "--set",
                "podMonitor.labels.release=prom",
                "--set",
                "podMonitor.interval=15s",
            ],
        ]
        .concat(),
    );
    let monitor = one(&objects, "PodMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(
        monitor["spec"]["podMetricsEndpoints"],
        json!([{"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}])
    );
    // It selects exactly the controller pods, whose container port it names.
    let pod = &one(&objects, "Deployment")["spec"]["template"];
    let labels = pod["metadata"]["labels"].as_object().expect("pod labels");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector");
    assert!(!selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
    assert_eq!(pod["spec"]["containers"][0]["ports"][0]["name"], "http");
    assert_eq!(
        monitor["spec"]["namespaceSelector"]["matchNames"],
        json!([NAMESPACE])
    );

    // An enabled monitor the cluster cannot take is named in the NOTES, not silently dropped.
    let mut dry = helm_release("install", &["--dry-run=client"]);
    dry.args(pm);
    let notes = stdout_of(dry, "helm install --dry-run=client");
    assert!(
        notes.contains("WARNING: PodMonitor enabled, but this cluster serves no monitoring.coreos.com/v1 PodMonitor"),
        "{notes}"
    );

    let both = helm_template(
        &[
            &sm[..],
            &pm[..],
            &["--api-versions", SM, "--api-versions", PM],
        ]
        .concat(),
    );
    assert!(!both.status.success());
    let stderr = String::from_utf8_lossy(&both.stderr);
    assert!(
        stderr.contains("serviceMonitor.enabled and podMonitor.enabled"),
        "{stderr}"
    );
}

#[test]
fn the_templated_crd_is_the_generated_one_kept_on_uninstall_unless_told() {
    let generated: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("crds/autoapproval.yaml")).expect("crds/"),
    )
    .expect("CRD YAML");
    assert!(
        of_kind(&render(&[]), "CustomResourceDefinition").is_empty(),
        "off by default"
    );
    let objects = render(&["--set", "crds.enabled=true"]);
    let crd = one(&objects, "CustomResourceDefinition");
    assert_eq!(
        crd["spec"], generated["spec"],
        "the generated CRD's spec, unchanged"
    );
    assert_eq!(crd["metadata"]["name"], generated["metadata"]["name"]);
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert_eq!(
        crd["metadata"]["labels"]["app.kubernetes.io/instance"],
        RELEASE
    );
    let objects = render(&["--set", "crds.enabled=true", "--set", "crds.keep=false"]);
    let crd = one(&objects, "CustomResourceDefinition");
    assert!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"].is_null(),
        "{crd}"
    );
}

#[test]
fn aggregated_cluster_roles_let_view_read_and_edit_change_autoapprovals_but_not_their_status() {
    let defaults = render(&[]);
    assert!(
        of_kind(&defaults, "ClusterRole").is_empty(),
        "off by default"
    );
    let objects = render(&["--set", "rbac.aggregate=true"]);
    let roles = of_kind(&objects, "ClusterRole");
    assert_eq!(roles.len(), 2);
    let to = |role: &Value| -> Vec<String> {
        let labels = role["metadata"]["labels"].as_object().expect("labels");
        labels
            .iter()
            .filter(|(_, v)| *v == "true")
            .filter_map(|(k, _)| k.strip_prefix("rbac.authorization.k8s.io/aggregate-to-"))
            .map(str::to_owned)
            .collect()
    };
    let view = roles
        .iter()
        .find(|r| to(r) == ["view"])
        .expect("a view role");
    assert_eq!(
        view["rules"],
        json!([{"apiGroups": ["autoapproval.io"], "resources": ["autoapprovals", "autoapprovals/status"], "verbs": ["get", "list", "watch"]}])
    );
    let edit = roles
        .iter()
        .find(|r| to(r) == ["admin", "edit"])
        .expect("an edit and admin role");
    assert_eq!(
        edit["rules"],
        json!([{"apiGroups": ["autoapproval.io"], "resources": ["autoapprovals"], "verbs": ["create", "update", "patch", "delete", "deletecollection"]}])
    );
    // Nothing is bound to them: the controller's grants are the namespaced Role's alone.
    assert!(of_kind(&objects, "ClusterRoleBinding").is_empty());
    assert_eq!(
        one(&objects, "Role")["rules"],
        one(&defaults, "Role")["rules"]
    );
}

#[test]
fn the_egress_preset_allows_dns_the_database_the_api_server_and_the_external_systems() {
    let objects = render(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.egressPreset.enabled=true",
        "--set",
        "networkPolicy.egressPreset.database.to[0].ipBlock.cidr=10.0.5.0/24",
        "--set",
        "networkPolicy.egressPreset.database.ports={5432,3306}",
        "--set",
        "networkPolicy.egressPreset.apiServer.to[0].ipBlock.cidr=172.18.0.2/32",
        "--set",
        "networkPolicy.egressPreset.externalSystems.to[0].namespaceSelector.matchLabels.team=contracts",
        "--set",
        "networkPolicy.egress[0].to[0].ipBlock.cidr=10.9.0.0/16",
        "--set",
        "networkPolicy.egress[0].ports[0].port=4318",
    ]);
    let spec = &one(&objects, "NetworkPolicy")["spec"];
    assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    let tcp = |ports: &[u16]| -> Value {
        ports
            .iter()
            .map(|p| json!({"port": p, "protocol": "TCP"}))
            .collect()
    };
    assert_eq!(
        spec["egress"],
        json!([
            {
                "ports": [{"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
                "to": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }],
            },
            {"ports": tcp(&[5432, 3306]), "to": [{"ipBlock": {"cidr": "10.0.5.0/24"}}]},
            {"ports": tcp(&[443, 6443]), "to": [{"ipBlock": {"cidr": "172.18.0.2/32"}}]},
            {"ports": tcp(&[443, 8080]), "to": [{"namespaceSelector": {"matchLabels": {"team": "contracts"}}}]},
            {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 4318}]},
        ])
    );
    // A destination left without peers allows its ports to any address.
    let open = render(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.egressPreset.enabled=true",
    ]);
    let egress = &one(&open, "NetworkPolicy")["spec"]["egress"];
    assert_eq!(egress[1], json!({"ports": tcp(&[5432])}));
    // Without the preset or rules egress stays open, as before.
    let ingress_only = render(&["--set", "networkPolicy.enabled=true"]);
    let spec = &one(&ingress_only, "NetworkPolicy")["spec"];
    assert_eq!(spec["policyTypes"], json!(["Ingress"]));
    assert!(spec["egress"].is_null());
}

/// The volume mounts of `container`, by volume name: (mount path, read-only).
fn mounts(container: &Value) -> Vec<(String, String, bool)> {
    container["volumeMounts"]
        .as_array()
        .map(|mounts| {
            mounts
                .iter()
                .map(|m| {
                    (
                        m["name"].as_str().unwrap_or_default().to_owned(),
                        m["mountPath"].as_str().unwrap_or_default().to_owned(),
                        m["readOnly"] == true,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn tls_volumes_are_mounted_read_only_into_the_controller_the_migration_job_and_the_init_container()
{
    let tls = [
        "--set",
        "tls.volumes[0].name=db",
        "--set",
        "tls.volumes[0].secret=db-tls",
        "--set",
        "tls.volumes[1].name=rds-ca",
        "--set",
        "tls.volumes[1].configMap=rds-ca-bundle",
        "--set",
        "tls.volumes[1].items[0].key=global-bundle.pem",
        "--set",
        "tls.volumes[1].items[0].path=ca.pem",
        "--set",
        "extraVolumes[0].name=kubeconfig",
        "--set",
        "extraVolumes[0].secret.secretName=kc",
        "--set",
        "extraVolumeMounts[0].name=kubeconfig",
        "--set",
        "extraVolumeMounts[0].mountPath=/etc/kubeconfig",
    ];
    let expected = [
        (
            "tls-db".to_owned(),
            "/etc/autoapproval/tls/db".to_owned(),
            true,
        ),
        (
            "tls-rds-ca".to_owned(),
            "/etc/autoapproval/tls/rds-ca".to_owned(),
            true,
        ),
    ];
    let check_volumes = |spec: &Value, what: &str| {
        let volumes = spec["volumes"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: volumes"));
        let by_name = |name: &str| {
            volumes
                .iter()
                .find(|v| v["name"] == name)
                .unwrap_or_else(|| panic!("{what}: volume {name}: {volumes:?}"))
        };
        assert_eq!(
            by_name("tls-db")["secret"]["secretName"],
            "db-tls",
            "{what}"
        );
        let ca = by_name("tls-rds-ca");
        assert_eq!(ca["configMap"]["name"], "rds-ca-bundle", "{what}");
        assert_eq!(
            ca["configMap"]["items"],
            json!([{"key": "global-bundle.pem", "path": "ca.pem"}]),
            "{what}"
        );
    };

    // With Helm: the hook Job migrates; the controller pods mount the same folders.
    let objects = render(&tls);
    let controller = mounts(container(&objects, "Deployment"));
    assert_eq!(
        controller[..2],
        expected,
        "the controller mounts tls.volumes first"
    );
    assert!(
        controller.iter().any(|(name, _, _)| name == "kubeconfig"),
        "extraVolumeMounts stay: {controller:?}"
    );
    check_volumes(pod_spec(&objects, "Deployment"), "Deployment");
    assert!(
        pod_spec(&objects, "Deployment")["volumes"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v["name"] == "kubeconfig")),
        "extraVolumes stay"
    );
    assert_eq!(
        mounts(container(&objects, "Job")),
        expected,
        "the migration Job"
    );
    check_volumes(pod_spec(&objects, "Job"), "Job");

    // Without Helm's hooks, the init container migrates in the controller's pod.
    let mut plain = tls.to_vec();
    plain.extend(["--set", "helmHooks=false"]);
    let objects = render(&plain);
    let init = &pod_spec(&objects, "Deployment")["initContainers"][0];
    assert_eq!(init["name"], "migrate");
    assert_eq!(mounts(init), expected, "the init container");

    // By default nothing is mounted.
    let objects = render(&[]);
    assert!(container(&objects, "Deployment")["volumeMounts"].is_null());
    assert!(pod_spec(&objects, "Job")["volumes"].is_null());
}

/// The vocabulary's text in the ConfigMap named `name`, or None when it is not rendered.
fn vocabulary_text<'a>(objects: &'a [Value], name: &str) -> Option<&'a str> {
    of_kind(objects, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["name"] == name)
        .and_then(|c| c["data"]["vocabulary.yaml"].as_str())
}

/// `container` names the mounted vocabulary file and mounts its folder read-only from the
/// volume `vocabulary`, which `spec` takes from the ConfigMap `config_map`.
fn binds_the_vocabulary(spec: &Value, container: &Value, config_map: &str, what: &str) {
    assert_eq!(
        env(container, "AUTOAPPROVAL_VOCABULARY").map(|e| &e["value"]),
        Some(&json!("/etc/autoapproval/vocabulary/vocabulary.yaml")),
        "{what}: AUTOAPPROVAL_VOCABULARY"
    );
    assert!(
        mounts(container).contains(&(
            "vocabulary".to_owned(),
            "/etc/autoapproval/vocabulary".to_owned(),
            true
        )),
        "{what}: the vocabulary mounted read-only: {:?}",
        mounts(container)
    );
    let volume = spec["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "vocabulary"))
        .unwrap_or_else(|| panic!("{what}: no vocabulary volume"));
    assert_eq!(volume["configMap"]["name"], config_map, "{what}");
}

#[test]
fn the_vocabulary_value_is_mounted_into_the_controller_the_migration_job_and_the_init_container() {
    // Block style: `--set-string` takes no commas.
    let text = "request_types:\n  OWNER_CONTRACT: 1\n  AD_CONTRACT: 2\nflags:\n  yes: Y";
    let set = format!("vocabulary={text}");
    let fullname = RELEASE;
    let own = format!("{fullname}-vocabulary");
    let hook = format!("{fullname}-migrate-vocabulary");

    // With Helm: the hook Job runs before the chart's other objects exist, so it mounts a hook
    // copy created just before it; the controller mounts the release's own.
    let objects = render(&["--set-string", &set]);
    assert_eq!(vocabulary_text(&objects, &own), Some(text), "the ConfigMap");
    assert_eq!(
        vocabulary_text(&objects, &hook),
        Some(text),
        "the hook copy"
    );
    let copy = of_kind(&objects, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["name"] == hook.as_str())
        .expect("the hook copy");
    let annotations = &copy["metadata"]["annotations"];
    assert_eq!(annotations["helm.sh/hook"], "pre-install,pre-upgrade");
    let weight = |v: &Value| v.as_str().and_then(|w| w.parse::<i64>().ok());
    let job = one(&objects, "Job");
    assert!(
        weight(&annotations["helm.sh/hook-weight"])
            < weight(&job["metadata"]["annotations"]["helm.sh/hook-weight"]),
        "the copy exists before the Job: {annotations}"
    );
    let deployment = pod_spec(&objects, "Deployment");
    binds_the_vocabulary(deployment, &deployment["containers"][0], &own, "controller");
    assert!(
        one(&objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
            ["checksum/vocabulary"]
            .is_string(),
        "a changed vocabulary rolls the pods"
    );
    let spec = pod_spec(&objects, "Job");
    binds_the_vocabulary(spec, &spec["initContainers"][0], &hook, "the Job's migrate");
    binds_the_vocabulary(spec, &spec["containers"][0], &hook, "the Job's check");

    // Without Helm's hooks: one ConfigMap, for the Job and the init container alike.
    let objects = render(&["--set-string", &set, "--set", "helmHooks=false"]);
    assert_eq!(vocabulary_text(&objects, &hook), None, "no hook copy");
    let deployment = pod_spec(&objects, "Deployment");
    binds_the_vocabulary(
        deployment,
        &deployment["initContainers"][0],
        &own,
        "init container",
    );
    binds_the_vocabulary(deployment, &deployment["containers"][0], &own, "controller");
    let spec = pod_spec(&objects, "Job");
    binds_the_vocabulary(
        spec,
        &spec["initContainers"][0],
        &own,
        "plain Job's migrate",
    );
    binds_the_vocabulary(spec, &spec["containers"][0], &own, "plain Job's check");

    // Empty, the default: our own words, nothing rendered, mounted or named.
    for args in [&[][..], &["--set", "helmHooks=false"][..]] {
        let objects = render(args);
        assert!(
            of_kind(&objects, "ConfigMap")
                .iter()
                .all(|c| c["data"].get("vocabulary.yaml").is_none()),
            "{args:?}: no vocabulary ConfigMap"
        );
        for kind in ["Deployment", "Job"] {
            let spec = pod_spec(&objects, kind);
            let containers = spec["containers"].as_array().into_iter().flatten();
            let inits = spec["initContainers"].as_array().into_iter().flatten();
            for c in containers.chain(inits) {
                assert!(
                    env(c, "AUTOAPPROVAL_VOCABULARY").is_none()
                        && !mounts(c).iter().any(|(n, _, _)| n == "vocabulary"),
                    "{args:?}: {kind} {} names or mounts a vocabulary",
                    c["name"]
                );
            }
            assert!(spec["volumes"].is_null(), "{args:?}: {kind} has volumes");
        }
    }
}

#[test]
fn the_helm_test_image_is_pinned_by_digest() {
    let objects = render(&[]);
    let image = container(&objects, "Pod")["image"]
        .as_str()
        .expect("the test Pod's image")
        .to_owned();
    let (name, digest) = image.split_once("@sha256:").expect("a digest");
    assert!(name.starts_with("busybox:"), "{image}");
    assert!(
        digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
        "{image}"
    );
}

#[test]
fn a_bad_value_of_each_new_kind_is_refused_by_name() {
    // (what is wrong, --set, what helm's refusal must contain)
    let cases = [
        (
            "a digest too short",
            "image.digest=sha256:abc",
            "at '/image/digest'",
        ),
        (
            "a digest of another algorithm",
            "image.digest=md5:0123456789abcdef0123456789abcdef",
            "at '/image/digest'",
        ),
        ("not a log level", "logLevel=loud", "at '/logLevel'"),
        (
            "an env entry without a name",
            "extraEnv[0].value=x",
            "at '/extraEnv/0': missing property 'name'",
        ),
        (
            "a variable the chart sets",
            "extraEnv[0].name=AUTOAPPROVAL_DATABASE_URL",
            "extraEnv[].name AUTOAPPROVAL_DATABASE_URL is set by the chart",
        ),
        (
            "an envFrom without a source",
            "extraEnvFrom[0].prefix=X",
            "at '/extraEnvFrom/0'",
        ),
        ("an empty argument", "extraArgs[0]=", "at '/extraArgs/0'"),
        (
            "a misspelt pull Secret key",
            "imagePullSecrets[0].nme=regcred",
            "at '/imagePullSecrets/0'",
        ),
        (
            "not a Prometheus duration",
            "podMonitor.interval=30",
            "at '/podMonitor/interval'",
        ),
        ("not a boolean", "crds.keep=maybe", "at '/crds/keep'"),
        (
            "a misspelt crds key",
            "crds.enable=true",
            "'enable' not allowed",
        ),
        (
            "not a boolean",
            "rbac.aggregate=yes",
            "at '/rbac/aggregate'",
        ),
        (
            "a port out of range",
            "networkPolicy.egressPreset.database.ports[0]=70000",
            "at '/networkPolicy/egressPreset/database/ports/0'",
        ),
        (
            "not a CIDR",
            "networkPolicy.egressPreset.database.to[0].ipBlock.cidr=10.0.0.0",
            "at '/networkPolicy/egressPreset/database/to/0/ipBlock/cidr'",
        ),
        (
            "a misspelt preset key",
            "networkPolicy.egressPreset.dns.protocol=UDP",
            "'protocol' not allowed",
        ),
        (
            "a test image by tag only",
            "tests.image=busybox:1.37",
            "at '/tests/image'",
        ),
        (
            "a certificate volume without a source",
            "tls.volumes[0].name=db",
            "at '/tls/volumes/0'",
        ),
        (
            "a certificate volume with two sources",
            "tls.volumes[0].name=db,tls.volumes[0].secret=a,tls.volumes[0].configMap=b",
            "at '/tls/volumes/0'",
        ),
        (
            "a folder name that is not a DNS label",
            "tls.volumes[0].name=Db_Ca,tls.volumes[0].secret=a",
            "at '/tls/volumes/0/name'",
        ),
        (
            "a misspelt certificate volume key",
            "tls.volumes[0].name=db,tls.volumes[0].secret=a,tls.volumes[0].mountPath=/x",
            "'mountPath' not allowed",
        ),
        (
            "one folder twice",
            "tls.volumes[0].name=db,tls.volumes[0].secret=a,tls.volumes[1].name=db,tls.volumes[1].configMap=b",
            "tls.volumes: the name \"db\" is given twice",
        ),
    ];
    for (what, bad, named) in cases {
        let out = helm_template(&["--set", bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: {bad} was accepted");
        assert!(
            stderr.contains(named),
            "{what}: {bad}: helm must name {named}: {stderr}"
        );
    }
}

/// With crds.enabled the CRD belongs to the release: `helm install --skip-crds` creates it from
/// the template, `helm uninstall` leaves it (and so every AutoApproval) behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_with_crds_enabled_installs_the_crd_and_uninstall_keeps_it() {
    with_cli_on_test_server(kept_crd).await;
}

fn kept_crd(cli: &Cli) {
    let chart = path_str(&chart()).to_owned();
    let crds = || cli.kubectl(&["get", "crds", "-o", "name"]);
    cli.kubectl(&["create", "namespace", NAMESPACE]);
    let minimal = format!("{chart}/ci/minimal-values.yaml");
    let install = |extra: &[&str]| {
        let mut args = vec![
            "install",
            RELEASE,
            &chart,
            "-n",
            NAMESPACE,
            "--no-hooks",
            "-f",
            &minimal,
            "--set",
            "crds.enabled=true",
        ];
        args.extend(extra);
        cli.helm_output(&args)
    };
    // Without --skip-crds Helm installs the crds/ copy first, then refuses the template's.
    let out = install(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("cannot be imported into the current release"),
        "{stderr}"
    );
    assert_eq!(
        cli.kubectl(&["get", "secrets", "-n", NAMESPACE, "-o", "name"]),
        "",
        "refused before a release record"
    );
    const CRD: &str =
        "customresourcedefinition.apiextensions.k8s.io/autoapprovals.autoapproval.io\n";
    assert_eq!(crds(), CRD, "the crds/ copy, not the release's");
    let succeeded = |out: Output, what: &str| {
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let owned = || {
        let manifest = cli.helm_output(&["get", "manifest", RELEASE, "-n", NAMESPACE]);
        String::from_utf8_lossy(&manifest.stdout).contains("kind: CustomResourceDefinition")
    };
    // Marked as the release's (docs/CHART.md), a CRD applied before is taken over.
    let name = "autoapprovals.autoapproval.io";
    cli.kubectl(&["label", "crd", name, "app.kubernetes.io/managed-by=Helm"]);
    let release = format!("meta.helm.sh/release-name={RELEASE}");
    let namespace = format!("meta.helm.sh/release-namespace={NAMESPACE}");
    cli.kubectl(&["annotate", "crd", name, &release, &namespace]);
    succeeded(install(&["--skip-crds"]), "install over the marked CRD");
    assert!(owned(), "the CRD is the release's");
    // Kept on uninstall, and taken back by the same release.
    let uninstall = || cli.helm_output(&["uninstall", RELEASE, "-n", NAMESPACE]);
    succeeded(uninstall(), "uninstall");
    assert_eq!(crds(), CRD, "kept on uninstall");
    succeeded(install(&["--skip-crds"]), "install again");
    assert!(owned());
    // crds.keep=false: the uninstall deletes it; a new install creates it from the template.
    succeeded(
        cli.helm_output(&[
            "upgrade",
            RELEASE,
            &chart,
            "-n",
            NAMESPACE,
            "--no-hooks",
            "--reuse-values",
            "--set",
            "crds.keep=false",
        ]),
        "upgrade to crds.keep=false",
    );
    succeeded(uninstall(), "uninstall without keep");
    assert_eq!(crds(), "", "deleted without crds.keep");
    succeeded(
        install(&["--skip-crds"]),
        "install on a cluster without the CRD",
    );
    assert_eq!(crds(), CRD);
    assert!(owned());
}
