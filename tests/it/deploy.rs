//! The deployment artefacts: the Helm chart (linted and rendered by the real helm v4), the plain
//! manifests rendered from it, and the Dockerfile. The rendered objects are applied to the test
//! API server with the real kubectl, and their promises (least-privilege RBAC, non-root read-only
//! containers, every setting of `autoapproval run` reachable) are checked object by object.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use autoapproval::flags::parse_duration;
use serde::Deserialize;
use serde_json::Value;

/// Release name and namespace of every render, as in `scripts/render-manifests.sh`.
const RELEASE: &str = "autoapproval";
const NAMESPACE: &str = "autoapproval";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("deploy/helm/autoapproval")
}

fn all_values() -> PathBuf {
    chart().join("ci/all-values.yaml")
}

// === tools ===

/// The real `helm` or `kubectl`: $HELM / $KUBECTL, else PATH, else the repository's .tools/bin.
fn tool(name: &str) -> PathBuf {
    if let Ok(path) = std::env::var(name.to_uppercase()) {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([repo().join(".tools/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found on PATH nor in .tools/bin: run scripts/install-tools.sh (scripts/test.sh does)")
        })
}

/// Runs a tool and returns its stdout, failing the test with its stderr when it fails.
fn ok(tool: &Path, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", tool.display()));
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{}{}",
        tool.display(),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn helm(args: &[&str]) -> String {
    ok(&tool("helm"), args)
}

// === renders ===

/// One `helm template` output, parsed.
struct Rendered {
    /// Which values produced it.
    name: &'static str,
    /// The values file given to helm, if any.
    values: Option<PathBuf>,
    /// The YAML as helm printed it.
    yaml: String,
    /// Its objects.
    objects: Vec<Value>,
}

impl Rendered {
    fn render(name: &'static str, values: Option<PathBuf>) -> Rendered {
        let chart = chart();
        let mut args = vec![
            "template",
            RELEASE,
            chart.to_str().expect("utf-8 path"),
            "--namespace",
            NAMESPACE,
        ];
        if let Some(v) = &values {
            args.extend(["-f", v.to_str().expect("utf-8 path")]);
        }
        let yaml = helm(&args);
        let objects = parse_yaml_stream(&yaml);
        Rendered {
            name,
            values,
            yaml,
            objects,
        }
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let found = self.all(kind);
        assert_eq!(found.len(), 1, "{}: one {kind} expected", self.name);
        found[0]
    }

    /// The settings ConfigMap (not the dashboard's).
    fn settings(&self) -> &Value {
        let found: Vec<&Value> = self
            .all("ConfigMap")
            .into_iter()
            .filter(|o| o["metadata"]["labels"].get("grafana_dashboard").is_none())
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{}: one settings ConfigMap expected",
            self.name
        );
        found[0]
    }

    fn config_map(&self) -> BTreeMap<String, String> {
        let data = &self.settings()["data"];
        serde_json::from_value(data.clone()).expect("ConfigMap data is a string map")
    }

    fn controller(&self) -> &Value {
        &self.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    }

    /// A top-level value, from the values file or else the chart's values.yaml.
    fn value(&self, key: &str) -> Value {
        let read = |path: &Path| -> Value {
            let text = std::fs::read_to_string(path).expect("values file");
            serde_yaml::from_str(&text).expect("values YAML")
        };
        self.values
            .as_deref()
            .map(read)
            .and_then(|v| v.get(key).cloned())
            .unwrap_or_else(|| read(&chart().join("values.yaml"))[key].clone())
    }
}

fn parse_yaml_stream(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("valid YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

/// The chart rendered with its defaults and with `ci/all-values.yaml` (every value set).
fn renders() -> &'static [Rendered; 2] {
    static RENDERS: OnceLock<[Rendered; 2]> = OnceLock::new();
    RENDERS.get_or_init(|| {
        [
            Rendered::render("defaults", None),
            Rendered::render("all-values", Some(all_values())),
        ]
    })
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `labels` are all present in `on`.
fn selects(labels: &Value, on: &Value) -> bool {
    labels
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| on.get(k) == Some(v)))
}

// === `autoapproval --help` ===

/// The environment variables a subcommand reads, with clap's default where it has one.
fn help_env(subcommand: &str) -> BTreeMap<String, Option<String>> {
    let out = Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args([subcommand, "--help"])
        .output()
        .expect("run autoapproval --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    // One option per block: a line starting with `-`, then its description lines.
    let mut blocks: Vec<String> = vec![];
    for line in help.lines() {
        if line.trim_start().starts_with('-') {
            blocks.push(String::new());
        }
        if let Some(b) = blocks.last_mut() {
            b.push_str(line.trim());
            b.push(' ');
        }
    }
    let mut env = BTreeMap::new();
    for block in blocks {
        let Some(at) = block.find("[env: ") else {
            continue;
        };
        let rest = &block[at + "[env: ".len()..];
        let name = &rest[..rest.find(['=', ']']).expect("closed [env: …]")];
        // clap prints its own default after the env var; a `[default: …]` before it is prose.
        let default = rest
            .find("[default: ")
            .map(|d| &rest[d + "[default: ".len()..])
            .map(|d| d[..d.find(']').expect("closed [default: …]")].to_owned());
        env.insert(name.to_owned(), default);
    }
    assert!(
        env.contains_key("AUTOAPPROVAL_DATABASE_URL"),
        "`{subcommand} --help` parsed: {env:?}"
    );
    env
}

// === the chart ===

#[test]
fn the_chart_passes_helm_v4_lint_with_defaults_and_with_every_value_set() {
    let version = helm(&["version", "--short"]);
    assert!(
        version.starts_with("v4."),
        "Helm v4 expected, got {version}"
    );
    let chart = chart();
    let chart = chart.to_str().expect("utf-8 path");
    helm(&["lint", "--strict", chart]);
    let values = all_values();
    helm(&[
        "lint",
        "--strict",
        chart,
        "-f",
        values.to_str().expect("utf-8 path"),
    ]);
}

#[test]
fn the_chart_versions_follow_cargo_and_its_crd_is_the_generated_one() {
    let meta: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(meta["apiVersion"], "v2");
    let version = meta["version"].as_str().expect("a chart version");
    assert!(
        version.split('.').all(|n| n.parse::<u32>().is_ok()) && version.split('.').count() == 3,
        "the chart version is semver: {version}"
    );
    assert_eq!(meta["appVersion"], env!("CARGO_PKG_VERSION"));
    let generated = std::fs::read(repo().join("crds/autoapproval.yaml")).unwrap();
    let in_chart = std::fs::read(chart().join("crds/autoapproval.yaml")).unwrap();
    assert!(
        generated == in_chart,
        "deploy/helm/autoapproval/crds/autoapproval.yaml differs from crds/autoapproval.yaml: copy it over"
    );
}

#[test]
fn the_plain_manifests_are_the_chart_rendered_with_its_defaults() {
    let path = repo().join("deploy/manifests/autoapproval.yaml");
    let committed = std::fs::read_to_string(&path).expect("deploy/manifests/autoapproval.yaml");
    // The file is helm's output behind a comment header.
    let body: String = committed
        .split_inclusive('\n')
        .skip_while(|line| line.starts_with('#'))
        .collect();
    assert!(
        body == renders()[0].yaml,
        "deploy/manifests/autoapproval.yaml is stale: run scripts/render-manifests.sh"
    );
}

/// What the Role grants: what the controller calls, no more. The replica
/// tests check the other direction from the test API server's record of
/// every request the `autoapproval run` processes made
/// (`replicas::assert_role_grants_what_was_used`).
pub const ROLE_GRANTS: [(&str, &str, &str); 12] = [
    ("autoapproval.io", "autoapprovals", "list"),
    ("autoapproval.io", "autoapprovals", "watch"),
    ("autoapproval.io", "autoapprovals", "create"),
    ("autoapproval.io", "autoapprovals", "delete"),
    ("autoapproval.io", "autoapprovals/status", "patch"),
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "list"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
    ("coordination.k8s.io", "leases", "delete"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
];

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
        let c = &pod["containers"][0];
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
        assert_eq!(db["valueFrom"], controller_db["valueFrom"]);
        let known = help_env("migrate");
        for e in c["env"].as_array().unwrap() {
            let name = e["name"].as_str().unwrap();
            assert!(known.contains_key(name), "`migrate` does not read {name}");
        }
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

#[test]
fn every_run_setting_is_reachable_from_the_chart_and_the_chart_sets_no_other() {
    let known = help_env("run");
    for r in renders() {
        let mut set: BTreeSet<String> = r.config_map().into_keys().collect();
        for e in r.controller()["env"].as_array().unwrap() {
            set.insert(e["name"].as_str().unwrap().to_owned());
        }
        let unknown: Vec<&String> = set.iter().filter(|n| !known.contains_key(*n)).collect();
        assert!(
            unknown.is_empty(),
            "{}: the chart sets {unknown:?}, which `autoapproval run` does not read",
            r.name
        );
        if r.values.is_some() {
            // With every value set, the chart reaches every setting `run --help` lists.
            let missing: Vec<&String> = known.keys().filter(|n| !set.contains(*n)).collect();
            assert!(
                missing.is_empty(),
                "the chart cannot set {missing:?}: add each to values.yaml `config` (and ci/all-values.yaml) and to templates/configmap.yaml"
            );
        }
    }
}

#[test]
fn the_charts_defaults_are_the_binarys_defaults() {
    let known = help_env("run");
    let config = renders()[0].config_map();
    for (name, value) in &config {
        // The one deliberate difference: JSON logs in a cluster, where collectors parse them.
        let expected = match name.as_str() {
            "AUTOAPPROVAL_LOG_JSON" => Some("true".to_owned()),
            _ => known.get(name).cloned().flatten(),
        };
        if let Some(expected) = expected {
            assert_eq!(value, &expected, "values.yaml default of {name}");
        }
    }
}

#[test]
fn the_rendered_settings_pass_the_binarys_validation() {
    let dir = std::env::temp_dir().join(format!("autoapproval-deploy-{}", std::process::id()));
    let missing_kubeconfig = dir.join("no-such-kubeconfig");
    for r in renders() {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_autoapproval"));
        cmd.arg("run").env_clear().envs(r.config_map());
        for e in r.controller()["env"].as_array().unwrap() {
            let name = e["name"].as_str().unwrap();
            let value = match name {
                "AUTOAPPROVAL_DATABASE_URL" | "AUTOAPPROVAL_READ_DATABASE_URL" => {
                    "postgres://autoapproval@127.0.0.1:1/unused".to_owned()
                }
                "AUTOAPPROVAL_NAMESPACE" => NAMESPACE.to_owned(),
                "AUTOAPPROVAL_REPLICA_NAME" => format!("{RELEASE}-0"),
                _ => "a-token".to_owned(),
            };
            cmd.env(name, value);
        }
        // Every value is checked before anything is contacted; the first contact is the
        // kubeconfig, so a missing one proves that all the settings were accepted.
        cmd.env("AUTOAPPROVAL_KUBECONFIG", &missing_kubeconfig);
        let out = cmd.output().expect("run autoapproval");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {stderr}", r.name);
        if !cfg!(feature = "otlp") && r.config_map().contains_key("AUTOAPPROVAL_OTLP_ENDPOINT") {
            // The image is built with the span export; this test binary's build is not.
            assert!(
                stderr.contains("--otlp-endpoint") && stderr.contains("`otlp` cargo feature"),
                "{}: {stderr}",
                r.name
            );
            continue;
        }
        assert!(
            stderr.contains("Kubernetes configuration") && stderr.contains("no-such-kubeconfig"),
            "{}: a setting was refused: {stderr}",
            r.name
        );
    }
}

// === the test API server ===

/// kubectl against one test API server, with its own kubeconfig and cache.
struct Kubectl {
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn new(server: &kube_testserver::TestServer) -> Kubectl {
        let dir = std::env::temp_dir().join(format!(
            "autoapproval-deploy-{}-{}",
            std::process::id(),
            server.addr().port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        Kubectl { dir, kubeconfig }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(tool("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .args(args);
        cmd
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self.command(args).output().expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Applies what a `kubectl create … --dry-run=client -o yaml` prints: the test API server
    /// reads no protobuf, which kubectl's typed `create` commands send.
    fn create(&self, args: &[&str]) -> String {
        let mut all = vec!["create"];
        all.extend(args);
        all.extend(["--dry-run=client", "-o", "yaml"]);
        let yaml = self.run(&all);
        let file = self.dir.join("created.yaml");
        std::fs::write(&file, yaml).unwrap();
        self.run(&["apply", "-f", file.to_str().unwrap()])
    }
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `kubectl get -o name` of an object.
fn kubectl_name(o: &Value) -> String {
    let kind = o["kind"].as_str().unwrap().to_lowercase();
    let api = o["apiVersion"].as_str().unwrap();
    let name = o["metadata"]["name"].as_str().unwrap();
    match api.rsplit_once('/') {
        Some((group, _)) => format!("{kind}.{group}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// Stand-ins for the Prometheus Operator's CRDs, so the ServiceMonitor and the PrometheusRule can be dry-run too.
const MONITORING_CRDS: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  names: {kind: ServiceMonitor, listKind: ServiceMonitorList, plural: servicemonitors, singular: servicemonitor}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: prometheusrules.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  names: {kind: PrometheusRule, listKind: PrometheusRuleList, plural: prometheusrules, singular: prometheusrule}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

/// The kinds the chart renders with its defaults, as `kubectl get` takes them.
const CHART_KINDS: &str =
    "deployments,services,serviceaccounts,configmaps,roles,rolebindings,poddisruptionbudgets,jobs";

/// The README's install steps against the test API server: namespace, CRD, Secret, then the
/// plain manifests (a server dry run that stores nothing, then for real, then idempotent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_apply_to_the_api_server_as_the_readme_says() {
    let server = kube_testserver::TestServer::start(kube_testserver::Options::default())
        .await
        .expect("test API server");
    let k = Kubectl::new(&server);
    tokio::task::spawn_blocking(move || readme_steps(&k))
        .await
        .expect("kubectl steps");
    server.shutdown().await;
}

fn readme_steps(k: &Kubectl) {
    let manifests = repo().join("deploy/manifests");
    let manifests = manifests.to_str().unwrap();
    let objects = &renders()[0].objects;
    let names: BTreeSet<String> = objects.iter().map(kubectl_name).collect();

    k.create(&["namespace", NAMESPACE]);
    k.run(&["apply", "-f", repo().join("crds").to_str().unwrap()]);
    let url = "--from-literal=database-url=postgres://autoapproval@db:5432/contracts";
    k.create(&["secret", "generic", RELEASE, "-n", NAMESPACE, url]);

    let out = k.run(&["apply", "--dry-run=server", "-f", manifests]);
    let dry = out.matches(" created (server dry run)").count();
    assert_eq!(dry, objects.len(), "{out}");
    let stored = k.run(&["get", CHART_KINDS, "-n", NAMESPACE, "-o", "name"]);
    assert_eq!(stored, "", "a server dry run must store nothing");

    let out = k.run(&["apply", "-f", manifests]);
    assert_eq!(out.matches(" created\n").count(), objects.len(), "{out}");
    let stored = k.run(&["get", CHART_KINDS, "-n", NAMESPACE, "-o", "name"]);
    let stored: BTreeSet<String> = stored.lines().map(str::to_owned).collect();
    assert_eq!(stored, names);

    // Applying again changes nothing. kubectl still says `configured` for the
    // PodDisruptionBudget, as against kube-apiserver: its selector's patch strategy is
    // `replace`, so the patch kubectl computes is never empty.
    let rv = "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.resourceVersion} {end}";
    let versions = || k.run(&["get", CHART_KINDS, "-n", NAMESPACE, "-o", rv]);
    let before = versions();
    let out = k.run(&["apply", "-f", manifests]);
    assert_eq!(versions(), before, "re-apply changed objects: {out}");
    for line in out.lines() {
        let pdb = line.starts_with("poddisruptionbudget.policy/");
        assert!(line.ends_with(" unchanged") || pdb, "re-apply: {line}");
    }

    // The CRD serves; no request has been picked up yet.
    let aa = k
        .command(&["get", "autoapprovals", "-n", NAMESPACE])
        .output()
        .expect("run kubectl");
    let stderr = String::from_utf8_lossy(&aa.stderr);
    assert!(
        aa.status.success() && stderr.contains("No resources found"),
        "{stderr}"
    );

    // Every optional object too: the chart with every value set, ServiceMonitor,
    // PrometheusRule and the dashboard (in Grafana's namespace) included.
    let crd = k.dir.join("monitoring-crds.yaml");
    std::fs::write(&crd, MONITORING_CRDS).unwrap();
    k.run(&["apply", "-f", crd.to_str().unwrap()]);
    k.create(&["namespace", "monitoring"]);
    let everything = k.dir.join("all-values.yaml");
    std::fs::write(&everything, &renders()[1].yaml).unwrap();
    let out = k.run(&[
        "apply",
        "--dry-run=server",
        "-f",
        everything.to_str().unwrap(),
    ]);
    let dry = out.matches(" created (server dry run)").count();
    assert_eq!(dry, renders()[1].objects.len(), "{out}");
}

// === the image ===

#[test]
fn the_dockerfile_builds_in_one_stage_and_runs_the_binary_non_root_in_a_minimal_one() {
    use dockerfile_parser::{Dockerfile, Instruction, ShellOrExecExpr};

    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let dockerfile = Dockerfile::parse(&text).expect("a Dockerfile the parser reads");
    let stages = dockerfile.stages();
    assert!(stages.stages.len() >= 2, "a multi-stage build");
    let builder = &stages.stages[0];
    let runtime = stages.stages.last().unwrap();

    let from = |stage: &dockerfile_parser::Stage| match &stage.instructions[0] {
        Instruction::From(f) => f.image.content.clone(),
        other => panic!("a stage starts with FROM, not {other:?}"),
    };
    assert!(from(builder).starts_with("rust:"), "{}", from(builder));
    let builds = builder.instructions.iter().any(|i| match i {
        Instruction::Run(run) => run
            .expr
            .as_shell()
            .is_some_and(|shell| shell.to_string().contains("cargo build --release --locked")),
        _ => false,
    });
    assert!(builds, "the builder runs cargo build --release --locked");

    let base = from(runtime);
    assert!(
        base.starts_with("gcr.io/distroless/") || base == "scratch",
        "the runtime image is minimal: {base}"
    );
    let mut copies = vec![];
    let mut user = None;
    let mut entrypoint = None;
    let mut cmd = None;
    let exec = |expr: &ShellOrExecExpr| match expr {
        ShellOrExecExpr::Exec(args) => args.as_str_vec().join(" "),
        ShellOrExecExpr::Shell(_) => panic!("exec form expected: no shell in the runtime image"),
    };
    for i in &runtime.instructions[1..] {
        match i {
            Instruction::Copy(c) => copies.push(c),
            Instruction::Entrypoint(e) => entrypoint = Some(exec(&e.expr)),
            Instruction::Cmd(c) => cmd = Some(exec(&c.expr)),
            Instruction::Misc(m) if m.instruction.content.eq_ignore_ascii_case("USER") => {
                user = Some(m.arguments.to_string().trim().to_owned())
            }
            Instruction::Misc(m) => {
                let name = m.instruction.content.to_uppercase();
                assert!(
                    ["EXPOSE", "LABEL"].contains(&name.as_str()),
                    "unexpected {name} in the runtime stage"
                );
            }
            other => panic!("unexpected instruction in the runtime stage: {other:?}"),
        }
    }
    // Only the binary comes over from the builder.
    assert_eq!(copies.len(), 1, "one COPY in the runtime stage");
    let copy = copies[0];
    let from_flag: Vec<&str> = copy
        .flags
        .iter()
        .filter(|f| f.name.content == "from")
        .map(|f| f.value.content.as_str())
        .collect();
    assert_eq!(
        from_flag,
        [builder.name.as_deref().expect("the builder stage is named")]
    );
    assert_eq!(copy.sources.len(), 1);
    assert!(copy.sources[0].content.ends_with("/autoapproval"));
    assert_eq!(copy.destination.content, "/autoapproval");

    // A numeric, non-root user, so the kubelet can verify runAsNonRoot.
    let user = user.expect("a USER in the runtime stage");
    let ids: Vec<Result<u32, _>> = user.split(':').map(str::parse::<u32>).collect();
    assert!(
        ids.iter().all(|id| id.as_ref().is_ok_and(|id| *id != 0)),
        "USER {user}: numeric and not root"
    );
    assert_eq!(entrypoint.expect("ENTRYPOINT"), "/autoapproval");
    assert_eq!(cmd.expect("CMD"), "run");

    let ignored = std::fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    for entry in ["target/", ".tools/", ".git"] {
        assert!(
            ignored.lines().any(|l| l.trim() == entry),
            ".dockerignore lacks {entry}"
        );
    }
}

// === alerts and dashboard ===

/// The runbook address the promtool unit tests expect in every alert.
const RUNBOOK: &str = "https://runbooks.test/RUNBOOK.md";

/// The real `promtool` (Debian's `prometheus` package): $PROMTOOL, else PATH.
fn promtool() -> PathBuf {
    if let Ok(path) = std::env::var("PROMTOOL") {
        return PathBuf::from(path);
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join("promtool"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "promtool not found on PATH: apt-get install -y prometheus (scripts/test.sh does)"
            )
        })
}

/// The PrometheusRule's `spec` (a Prometheus rule file) rendered with `args` added.
fn rule_file(args: &[&str]) -> Value {
    let chart = chart();
    let mut all = vec![
        "template",
        RELEASE,
        chart.to_str().expect("utf-8 path"),
        "--namespace",
        NAMESPACE,
    ];
    all.extend_from_slice(args);
    let objects = parse_yaml_stream(&helm(&all));
    let rules: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "PrometheusRule")
        .collect();
    assert_eq!(rules.len(), 1, "one PrometheusRule expected");
    rules[0]["spec"].clone()
}

/// Every alerting rule of a rule file.
fn alerts(spec: &Value) -> Vec<&Value> {
    spec["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("autoapproval-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[test]
fn the_prometheus_rule_and_the_dashboard_are_off_by_default() {
    let defaults = &renders()[0];
    assert!(defaults.all("PrometheusRule").is_empty());
    assert_eq!(defaults.all("ConfigMap").len(), 1, "only the settings");
    // Enabled without a runbook address: refused, naming the value.
    let chart = chart();
    let out = Command::new(tool("helm"))
        .args(["template", RELEASE, chart.to_str().expect("utf-8 path")])
        .args(["--set", "prometheusRule.enabled=true"])
        .output()
        .expect("helm");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("prometheusRule.runbookBaseUrl"), "{stderr}");
}

#[test]
fn every_alert_passes_promtool_and_its_unit_tests_fire_it_and_keep_it_silent_when_healthy() {
    let spec = rule_file(&[
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        &format!("prometheusRule.runbookBaseUrl={RUNBOOK}"),
    ]);
    let dir = scratch("promtool");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, serde_yaml::to_string(&spec).expect("YAML")).expect("write rules");
    let tests = repo().join("tests/promtool/rules.test.yaml");
    std::fs::copy(&tests, dir.join("rules.test.yaml")).expect("copy the unit tests");
    let promtool = promtool();
    let checked = ok(
        &promtool,
        &["check", "rules", rules.to_str().expect("utf-8")],
    );
    let alerts = alerts(&spec);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{checked}"
    );
    let tested = Command::new(&promtool)
        .current_dir(&dir)
        .args(["test", "rules", "rules.test.yaml"])
        .output()
        .expect("promtool test rules");
    let said = String::from_utf8_lossy(&tested.stdout).into_owned()
        + &String::from_utf8_lossy(&tested.stderr);
    assert!(tested.status.success(), "promtool test rules:\n{said}");
    assert!(said.contains("SUCCESS"), "{said}");

    // Each alert has its words and a runbook section, and the unit tests
    // cover it both ways: firing on some series, silent on the healthy ones.
    let runbook = std::fs::read_to_string(repo().join("docs/RUNBOOK.md")).expect("RUNBOOK");
    let cases: Value =
        serde_yaml::from_str(&std::fs::read_to_string(&tests).expect("unit tests")).expect("YAML");
    let checks: Vec<&Value> = cases["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().expect("alert_rule_test"))
        .collect();
    let expected = [
        "AutoApprovalShardUnheld",
        "AutoApprovalNoLeader",
        "AutoApprovalLeaseRenewFailures",
        "AutoApprovalPickupSlow",
        "AutoApprovalRequestsExhausted",
        "AutoApprovalBacklogOld",
        "AutoApprovalDatabaseDown",
    ];
    let names: Vec<&str> = alerts.iter().filter_map(|a| a["alert"].as_str()).collect();
    assert_eq!(names, expected);
    for alert in &alerts {
        let name = alert["alert"].as_str().expect("name");
        let notes = &alert["annotations"];
        for key in ["summary", "description"] {
            assert!(
                notes[key].as_str().is_some_and(|s| s.len() > 20),
                "{name}: {key}"
            );
        }
        let anchor = name.to_lowercase();
        assert_eq!(
            notes["runbook_url"].as_str(),
            Some(format!("{RUNBOOK}#{anchor}").as_str()),
            "{name}"
        );
        assert!(
            runbook.lines().any(|l| l == format!("## {name}")),
            "docs/RUNBOOK.md has no section `## {name}`"
        );
        assert!(
            matches!(
                alert["labels"]["severity"].as_str(),
                Some("critical" | "warning")
            ),
            "{name}: severity"
        );
        let of_this = || checks.iter().filter(|c| c["alertname"] == name);
        assert!(
            of_this().any(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty())),
            "tests/promtool: no case where {name} fires"
        );
        assert!(
            of_this().any(|c| c["exp_alerts"].as_array().is_some_and(Vec::is_empty)),
            "tests/promtool: no case where {name} stays silent"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_rule_selects_the_configured_job_and_passes_promtool_with_every_value_set() {
    let r = &renders()[1];
    let spec = &r.one("PrometheusRule")["spec"];
    let dir = scratch("promtool-all-values");
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, serde_yaml::to_string(spec).expect("YAML")).expect("write rules");
    ok(
        &promtool(),
        &["check", "rules", rules.to_str().expect("utf-8")],
    );
    let _ = std::fs::remove_dir_all(&dir);
    for alert in alerts(spec) {
        let expr = alert["expr"].as_str().expect("expr");
        assert!(
            expr.contains(r#"namespace="autoapproval", job="contract-approver-metrics""#),
            "{expr}"
        );
    }
    let threshold = |name: &str| {
        alerts(spec)
            .into_iter()
            .find(|a| a["alert"] == name)
            .and_then(|a| a["expr"].as_str())
            .map(|e| e.trim().rsplit(' ').next().unwrap_or_default().to_owned())
    };
    assert_eq!(threshold("AutoApprovalPickupSlow").as_deref(), Some("5"));
    assert_eq!(threshold("AutoApprovalBacklogOld").as_deref(), Some("600"));
    assert_eq!(
        threshold("AutoApprovalLeaseRenewFailures").as_deref(),
        Some("10")
    );
    assert_eq!(
        r.one("PrometheusRule")["metadata"]["labels"]["release"],
        "prometheus"
    );
}

#[test]
fn the_dashboard_ships_in_a_configmap_grafana_finds_with_the_panels_the_readme_lists() {
    let r = &renders()[1];
    let maps: Vec<&Value> = r
        .all("ConfigMap")
        .into_iter()
        .filter(|o| o["metadata"]["labels"]["grafana_dashboard"] == "true")
        .collect();
    assert_eq!(maps.len(), 1, "one dashboard ConfigMap");
    let map = maps[0];
    assert_eq!(map["metadata"]["namespace"], "monitoring");
    assert_eq!(
        map["metadata"]["annotations"]["k8s-sidecar-target-directory"],
        "/tmp/dashboards/Controllers"
    );
    let json = map["data"]["autoapproval.json"]
        .as_str()
        .expect("JSON text");
    let dashboard: Value = serde_json::from_str(json).expect("the dashboard is JSON");
    assert_eq!(
        dashboard,
        serde_json::from_str::<Value>(
            &std::fs::read_to_string(chart().join("dashboards/autoapproval.json")).expect("file")
        )
        .expect("JSON"),
        "the ConfigMap holds the chart's file"
    );
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let panels: Vec<&str> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] != "row")
        .map(|p| p["title"].as_str().expect("title"))
        .collect();
    assert!(panels.len() >= 12, "{panels:?}");
    // Every panel query is PromQL that promtool accepts: written into a rule
    // file with Grafana's variables replaced by what they stand for.
    let mut rules = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            let expr = expr
                .replace("$__rate_interval", "5m")
                .replace("$namespace", "autoapproval")
                .replace("$job", "autoapproval");
            let record = format!("dashboard:query_{}", rules.len());
            rules.push(serde_json::json!({"record": record, "expr": expr}));
        }
    }
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = scratch("dashboard-promql");
    let path = dir.join("dashboard.yaml");
    std::fs::write(&path, serde_yaml::to_string(&file).expect("YAML")).expect("write");
    let checked = ok(
        &promtool(),
        &["check", "rules", path.to_str().expect("utf-8")],
    );
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", rules.len())),
        "{checked}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    for title in panels {
        assert!(
            readme.contains(&format!("**{title}**")),
            "README.md does not list the panel {title:?}"
        );
    }
}
