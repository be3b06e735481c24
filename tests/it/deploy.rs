//! The deployment artefacts: the Helm chart (linted and rendered by the real helm v4), the plain
//! manifests rendered from it, and the Dockerfile. The rendered objects are applied to the test
//! API server with the real kubectl, and their promises (least-privilege RBAC, non-root read-only
//! containers, every setting of `autoapproval run` reachable) are checked object by object.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use autoapproval::flags::parse_duration;
use serde_json::Value;

use crate::support::{
    CHART_KINDS, Cli, Db, Kubelet, On, RESTRICTED, RESTRICTED_WARN, approved_through_kubectl,
    as_operator_of_own_server, eventually, kubectl_name, on_both_servers, parse_yaml_stream, repo,
    stdout_of, tool,
};

/// Release name and namespace of every render, as in `scripts/render-manifests.sh`.
const RELEASE: &str = "autoapproval";
const NAMESPACE: &str = "autoapproval";

fn chart() -> PathBuf {
    repo().join("deploy/helm/autoapproval")
}

fn all_values() -> PathBuf {
    chart().join("ci/all-values.yaml")
}

/// The four external URLs, which have no default: the least an install needs.
fn minimal_values() -> PathBuf {
    chart().join("ci/minimal-values.yaml")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

// === tools ===

/// `tool args`, which must succeed: its standard output.
fn ok(tool: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(tool);
    cmd.args(args);
    stdout_of(cmd, &format!("{} {args:?}", tool.display()))
}

fn helm(args: &[&str]) -> String {
    let mut cmd = Command::new(tool("helm"));
    cmd.args(args);
    stdout_of(cmd, &format!("helm {args:?}"))
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
    /// `helm template` with the chart's defaults plus the required URLs, then `values`; without
    /// the `helm test` Pod, which only `helm test` creates.
    fn render(name: &'static str, values: Option<PathBuf>) -> Rendered {
        Rendered::render_with(name, values, &[])
    }

    fn render_with(name: &'static str, values: Option<PathBuf>, extra: &[&str]) -> Rendered {
        let chart = chart();
        let minimal = minimal_values();
        let mut args = vec![
            "template",
            RELEASE,
            path_str(&chart),
            "--namespace",
            NAMESPACE,
            "--skip-tests",
            // As a cluster with the Prometheus Operator's CRDs: the monitors render only there.
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor",
            "--api-versions",
            "monitoring.coreos.com/v1/PodMonitor",
            "-f",
            path_str(&minimal),
        ];
        if let Some(v) = &values {
            args.extend(["-f", path_str(v)]);
        }
        args.extend(extra);
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

/// The chart rendered with its defaults (and the required URLs) and with `ci/all-values.yaml`
/// (every value set).
fn renders() -> &'static [Rendered; 2] {
    static RENDERS: OnceLock<[Rendered; 2]> = OnceLock::new();
    RENDERS.get_or_init(|| {
        [
            Rendered::render("defaults", None),
            Rendered::render("all-values", Some(all_values())),
        ]
    })
}

/// The chart rendered for kubectl, as scripts/render-manifests.sh renders deploy/manifests/.
fn plain() -> &'static Rendered {
    static PLAIN: OnceLock<Rendered> = OnceLock::new();
    PLAIN.get_or_init(|| Rendered::render_with("plain", None, &["--set", "helmHooks=false"]))
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
fn the_chart_passes_helm_v4_lint_with_the_required_values_and_with_every_value_set() {
    let version = helm(&["version", "--short"]);
    assert!(
        version.starts_with("v4."),
        "Helm v4 expected, got {version}"
    );
    let chart = chart();
    let chart = path_str(&chart);
    let minimal = minimal_values();
    helm(&["lint", "--strict", chart, "-f", path_str(&minimal)]);
    let values = all_values();
    helm(&["lint", "--strict", chart, "-f", path_str(&values)]);
}

// === values, schema and the chart's README ===

fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn schema() -> Value {
    let text = std::fs::read_to_string(chart().join("values.schema.json")).unwrap();
    serde_json::from_str(&text).expect("values.schema.json is JSON")
}

/// The dotted paths of values.yaml the schema does not describe, walking both together; below a
/// schema entry without `properties` (a Kubernetes object passed through) nothing is listed.
fn undescribed(values: &Value, schema: &Value, at: &str, out: &mut Vec<String>) {
    let (Some(values), Some(props)) = (
        values.as_object(),
        schema.get("properties").and_then(Value::as_object),
    ) else {
        return;
    };
    for (key, value) in values {
        match props.get(key) {
            None => out.push(format!("{at}{key}")),
            Some(s) => undescribed(value, s, &format!("{at}{key}."), out),
        }
    }
}

#[test]
fn every_value_has_a_schema_entry_that_refuses_typos() {
    let values = read_yaml(&chart().join("values.yaml"));
    let schema = schema();
    let mut missing = vec![];
    undescribed(&values, &schema, "", &mut missing);
    assert!(
        missing.is_empty(),
        "values.yaml has values that values.schema.json does not describe: {missing:?}: add each to deploy/helm/autoapproval/values.schema.json"
    );
    // The other way, where values.yaml lists every value there is (the top level and the
    // settings; Kubernetes objects such as probes take optional fields values.yaml leaves out):
    // the schema describes no value that values.yaml lacks.
    let mut stale = vec![];
    let mut top = schema_as_values(&schema);
    for (_, v) in top.as_object_mut().unwrap().iter_mut() {
        if v.as_object().is_some() {
            *v = Value::Null;
        }
    }
    top["config"] = schema_as_values(&schema["properties"]["config"]);
    undescribed(&top, &values_as_schema(&values), "", &mut stale);
    assert!(
        stale.is_empty(),
        "values.schema.json describes values that values.yaml lacks: {stale:?}"
    );
    // Every entry is typed and documented; every object of ours refuses unknown keys.
    fn check(s: &Value, at: &str) {
        assert!(
            s.get("type").is_some() || s.get("oneOf").is_some(),
            "{at}: no type in values.schema.json"
        );
        assert!(
            s["description"].is_string(),
            "{at}: no description in values.schema.json"
        );
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            assert_eq!(
                s["additionalProperties"], false,
                "{at}: unknown keys must be refused"
            );
            for (k, v) in props {
                check(v, &format!("{at}.{k}"));
            }
        }
    }
    for (k, v) in schema["properties"].as_object().unwrap() {
        check(v, k);
    }
    assert_eq!(schema["additionalProperties"], false);
    // The four external systems have no default and must be given.
    let required = strs(&schema["properties"]["config"]["required"]);
    assert_eq!(required, ["esignUrl", "ownerUrl", "storeUrl", "adUrl"]);
    for key in required {
        assert_eq!(values["config"][key], "", "config.{key} has no default");
    }
}

/// The schema's property tree as a values tree (each property a key), for the reverse walk.
fn schema_as_values(schema: &Value) -> Value {
    match schema.get("properties").and_then(Value::as_object) {
        Some(props) => Value::Object(
            props
                .iter()
                .map(|(k, v)| (k.clone(), schema_as_values(v)))
                .collect(),
        ),
        None => Value::Null,
    }
}

/// A values tree as a schema whose every key is a property.
fn values_as_schema(values: &Value) -> Value {
    match values.as_object() {
        Some(map) => serde_json::json!({"properties": map
            .iter()
            .map(|(k, v)| (k.clone(), values_as_schema(v)))
            .collect::<serde_json::Map<_, _>>()}),
        None => serde_json::json!({}),
    }
}

/// One `# --` documented value of values.yaml, as helm-docs reads it.
struct Documented {
    path: String,
    description: String,
}

/// The `# -- ` comments of values.yaml, each with the dotted path of the key below it.
fn documented_values() -> Vec<Documented> {
    let text = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let mut stack: Vec<(usize, String)> = vec![];
    let mut pending: Option<String> = None;
    let mut out = vec![];
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(doc) = trimmed.strip_prefix("# -- ") {
            pending = Some(doc.trim().to_owned());
            continue;
        }
        if let (Some(more), Some(p)) = (trimmed.strip_prefix("# "), pending.as_mut()) {
            p.push(' ');
            p.push_str(more.trim());
            continue;
        }
        let key = trimmed
            .split_once(':')
            .map(|(k, _)| k)
            .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if let Some(key) = key {
            stack.retain(|(i, _)| *i < indent);
            stack.push((indent, key.to_owned()));
            if let Some(description) = pending.take() {
                let path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).collect();
                out.push(Documented {
                    path: path.join("."),
                    description,
                });
            }
        } else if !trimmed.is_empty() {
            pending = None;
        }
    }
    out
}

/// The chart's README: its metadata and a table of every documented value, helm-docs style.
fn chart_readme() -> String {
    let meta = read_yaml(&chart().join("Chart.yaml"));
    let values = read_yaml(&chart().join("values.yaml"));
    let mut out = String::new();
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    out.push_str(&format!(
        "# {}\n\n{}\n\n",
        s(&meta["name"]),
        s(&meta["description"])
    ));
    out.push_str(&format!(
        "Chart version `{}`, controller (app) version `{}`, Kubernetes `{}`.\n\n",
        s(&meta["version"]),
        s(&meta["appVersion"]),
        s(&meta["kubeVersion"])
    ));
    out.push_str(
        "Install, upgrade (CRD first) and uninstall as the repository README says, in its section\n\
         \"Install into a cluster\"; a test runs those steps with the real helm and kubectl. Values are\n\
         checked against `values.schema.json`: a bad value is refused by name before anything is\n\
         stored. The four `config.*Url` values are required.\n\n",
    );
    out.push_str(
        "This file is generated from the `# --` comments of `values.yaml`; a test fails while it is\n\
         stale. Regenerate it with\n\
         `UPDATE_CHART_README=1 cargo test --test it deploy::the_chart_readme_is_generated_from_the_commented_values`.\n\n",
    );
    out.push_str(
        "## Values\n\n| Key | Type | Default | Description |\n| --- | --- | --- | --- |\n",
    );
    for d in documented_values() {
        let value = d.path.split('.').fold(&values, |v, k| &v[k]);
        let kind = match value {
            Value::Bool(_) => "bool",
            Value::Number(n) if n.is_i64() || n.is_u64() => "int",
            Value::Number(_) => "float",
            Value::String(_) => "string",
            Value::Array(_) => "list",
            Value::Object(_) => "object",
            Value::Null => "null",
        };
        let default = serde_json::to_string(value).unwrap().replace('|', "\\|");
        let description = d.description.replace('|', "\\|");
        out.push_str(&format!(
            "| `{}` | {kind} | `{default}` | {description} |\n",
            d.path
        ));
    }
    out
}

#[test]
fn the_schema_takes_a_duration_exactly_when_the_binary_does() {
    let samples = [
        "0",
        "10s",
        "1m30s",
        "1m 30s",
        "500ms",
        "2h",
        "30d",
        "5min",
        "10sec",
        "250us",
        "7ns",
        "10",
        "10x",
        "1.5s",
        "-1s",
        "s",
        "1m30",
        "ten seconds",
    ];
    for sample in samples {
        let out = helm_takes("--set-string", "pollPeriod", sample);
        let binary = parse_duration(sample);
        assert_eq!(
            out.status.success(),
            binary.is_ok(),
            "{sample:?}: the binary says {binary:?}, helm says {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("/config/pollPeriod"), "{stderr}");
        }
    }
}

#[test]
fn the_chart_readme_is_generated_from_the_commented_values() {
    // Every value is documented, itself or through the object that holds it.
    let documented: BTreeSet<String> = documented_values().into_iter().map(|d| d.path).collect();
    fn leaves(v: &Value, at: &str, out: &mut Vec<String>) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, x) in m {
                    let path = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    leaves(x, &path, out);
                }
            }
            _ => out.push(at.to_owned()),
        }
    }
    let mut all = vec![];
    leaves(&read_yaml(&chart().join("values.yaml")), "", &mut all);
    let undocumented: Vec<&String> = all
        .iter()
        .filter(|leaf| {
            let parts: Vec<&str> = leaf.split('.').collect();
            !(1..=parts.len()).any(|n| documented.contains(&parts[..n].join(".")))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "values without a `# --` comment in values.yaml: {undocumented:?}"
    );

    let path = chart().join("README.md");
    let generated = chart_readme();
    if std::env::var_os("UPDATE_CHART_README").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "deploy/helm/autoapproval/README.md is stale: regenerate it with UPDATE_CHART_README=1 cargo test --test it deploy::the_chart_readme_is_generated_from_the_commented_values"
    );
}

#[test]
fn helm_test_fetches_readyz_through_the_service_and_notes_never_chain_after_port_forward() {
    let chart = chart();
    let minimal = minimal_values();
    let yaml = helm(&[
        "template",
        RELEASE,
        path_str(&chart),
        "-n",
        NAMESPACE,
        "-f",
        path_str(&minimal),
        "--show-only",
        "templates/tests/readyz.yaml",
    ]);
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
    let out = Command::new(tool("helm"))
        .args([
            "install",
            RELEASE,
            path_str(&chart),
            "-n",
            NAMESPACE,
            "-f",
            path_str(&minimal),
            "--dry-run=client",
        ])
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
    let kube = meta["kubeVersion"]
        .as_str()
        .expect("Chart.yaml names the kubeVersion it needs");
    assert!(kube.starts_with(">=1."), "{kube}");
    let generated = std::fs::read(repo().join("crds/autoapproval.yaml")).unwrap();
    let in_chart = std::fs::read(chart().join("crds/autoapproval.yaml")).unwrap();
    assert!(
        generated == in_chart,
        "deploy/helm/autoapproval/crds/autoapproval.yaml differs from crds/autoapproval.yaml: copy it over"
    );
}

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
    let migrate = &job["spec"]["template"]["spec"]["containers"][0];
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

/// What the Role grants: what the controller calls, no more. The replica
/// tests check the other direction from the test API server's record of
/// every request the `autoapproval run` processes made
/// (`replicas::assert_role_grants_what_was_used`).
pub const ROLE_GRANTS: [(&str, &str, &str); 11] = [
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
            // The OpenTelemetry variables are the platform's (an OpenTelemetry operator
            // injects them, or extra env): no chart value of their own (docs/TELEMETRY.md).
            let missing: Vec<&String> = known
                .keys()
                .filter(|n| !set.contains(*n) && !n.starts_with("OTEL_"))
                .collect();
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
        // The deliberate differences: JSON logs in a cluster, where collectors parse them, and
        // the external URLs, which the chart requires instead of defaulting to a loopback.
        let expected = match name.as_str() {
            "AUTOAPPROVAL_LOG_JSON" => Some("true".to_owned()),
            "AUTOAPPROVAL_ESIGN_URL"
            | "AUTOAPPROVAL_OWNER_URL"
            | "AUTOAPPROVAL_STORE_URL"
            | "AUTOAPPROVAL_AD_URL" => None,
            _ => known.get(name).cloned().flatten(),
        };
        if let Some(expected) = expected {
            assert_eq!(value, &expected, "values.yaml default of {name}");
        }
    }
}

/// `autoapproval run` with a render's settings, the Secret's values stood in for, and a missing
/// kubeconfig: every value is checked before anything is contacted and the first contact is
/// the kubeconfig, so failing on it proves that all the settings were accepted.
fn run_with_settings(r: &Rendered, kubeconfig: &Path) -> Command {
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
    cmd.env("AUTOAPPROVAL_KUBECONFIG", kubeconfig);
    cmd
}

/// The binary accepted every setting: it went on to the (missing) kubeconfig.
fn accepted(out: &std::process::Output) -> bool {
    let stderr = String::from_utf8_lossy(&out.stderr);
    out.status.code() == Some(1)
        && stderr.contains("Kubernetes configuration")
        && stderr.contains("no-such-kubeconfig")
}

#[test]
fn the_rendered_settings_pass_the_binarys_validation() {
    let dir = std::env::temp_dir().join(format!("autoapproval-deploy-{}", std::process::id()));
    let missing_kubeconfig = dir.join("no-such-kubeconfig");
    for r in renders() {
        let out = run_with_settings(r, &missing_kubeconfig)
            .output()
            .expect("run autoapproval");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !cfg!(feature = "otlp") && r.config_map().contains_key("AUTOAPPROVAL_OTLP_ENDPOINT") {
            // The image is built with the span export; this test binary's build is not.
            assert!(
                out.status.code() == Some(1)
                    && stderr.contains("--otlp-endpoint")
                    && stderr.contains("`otlp` cargo feature"),
                "{}: {stderr}",
                r.name
            );
            continue;
        }
        assert!(
            accepted(&out),
            "{}: a setting was refused: {stderr}",
            r.name
        );
    }
}

/// Helm's verdict on one value: `helm template` of the chart with the
/// minimal values and `config.<key>=<value>` given with `flag`
/// (`--set`, or `--set-string` to keep it a string), the ConfigMap only.
fn helm_takes(flag: &str, key: &str, value: &str) -> std::process::Output {
    let set = format!("config.{key}={value}");
    Command::new(tool("helm"))
        .args([
            "template",
            RELEASE,
            path_str(&chart()),
            "-f",
            path_str(&minimal_values()),
        ])
        .args([flag, &set, "--show-only", "templates/configmap.yaml"])
        .output()
        .expect("run helm")
}

/// Asserts that helm and `autoapproval run` (the chart's default settings,
/// `env` set to each value) take exactly the same of `values`.
fn assert_schema_agrees_with_the_binary(flag: &str, key: &str, env: &str, values: &[&str]) {
    let missing_kubeconfig = std::env::temp_dir().join("no-such-kubeconfig");
    for value in values {
        let helm = helm_takes(flag, key, value);
        let binary = run_with_settings(&renders()[0], &missing_kubeconfig)
            .env(env, value)
            .output()
            .expect("run autoapproval");
        assert_eq!(
            helm.status.success(),
            accepted(&binary),
            "config.{key}={value:?}: the binary says {}, helm says {}",
            String::from_utf8_lossy(&binary.stderr),
            String::from_utf8_lossy(&helm.stderr)
        );
    }
}

#[test]
fn the_schema_takes_an_external_url_exactly_when_the_binary_does() {
    // Empty is the one deliberate difference: the binary falls back to its loopback default,
    // the chart has none and requires the value.
    let samples = [
        "http://esign:8080",
        "https://esign.contracts.svc.cluster.local",
        "http://10.0.0.7:8080/api/v1",
        "http://[fd00::7]:8080",
        "https://esign.example.com/base?tenant=1",
        "esign:8080",
        "ftp://esign",
        "http://",
        "http://user:secret@esign:8080",
        "esign",
    ];
    assert_schema_agrees_with_the_binary(
        "--set-string",
        "esignUrl",
        "AUTOAPPROVAL_ESIGN_URL",
        &samples,
    );
}

#[test]
fn the_schema_takes_a_count_exactly_when_the_binary_does() {
    // Each count's own bounds; values that only a rule across settings refuses (connections
    // against concurrency) are the binary's to refuse, by name, at start-up.
    let samples: [(&str, &str, &[&str]); 7] = [
        (
            "ownerLimit",
            "AUTOAPPROVAL_OWNER_LIMIT",
            &["0", "1", "10000", "10001"],
        ),
        (
            "adLimit",
            "AUTOAPPROVAL_AD_LIMIT",
            &["0", "1", "10000", "10001"],
        ),
        ("shards", "AUTOAPPROVAL_SHARDS", &["0", "1", "4096", "4097"]),
        (
            "concurrency",
            "AUTOAPPROVAL_CONCURRENCY",
            &["0", "1", "65536"],
        ),
        (
            "retryLimit",
            "AUTOAPPROVAL_RETRY_LIMIT",
            &["0", "1", "2147483647", "2147483648"],
        ),
        (
            "externalConcurrency",
            "AUTOAPPROVAL_EXTERNAL_CONCURRENCY",
            &["0", "1"],
        ),
        (
            "dbMaxConnections",
            "AUTOAPPROVAL_DB_MAX_CONNECTIONS",
            &["0", "4294967296"],
        ),
    ];
    for (key, env, values) in samples {
        assert_schema_agrees_with_the_binary("--set", key, env, values);
    }
}

#[test]
fn the_schema_takes_a_listen_address_exactly_when_the_binary_does() {
    let samples = [
        "0.0.0.0:8080",
        "127.0.0.1:9090",
        "[::]:8080",
        "[::1]:8080",
        "localhost:8080",
        "metrics:8080",
        "8080",
        ":8080",
        "0.0.0.0",
        "0.0.0.0:99999",
    ];
    assert_schema_agrees_with_the_binary("--set-string", "listen", "AUTOAPPROVAL_LISTEN", &samples);
}

// === the test API server ===

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
    std::fs::write(&crd, MONITORING_CRDS).unwrap();
    k.kubectl(&["apply", "-f", path_str(&crd)]);
    k.kubectl(&["create", "namespace", "monitoring"]);
    let everything = k.dir.join("all-values.yaml");
    std::fs::write(&everything, &renders()[1].yaml).unwrap();
    let out = k.kubectl(&["apply", "--dry-run=server", "-f", path_str(&everything)]);
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
    let minimal = minimal_values();
    let mut all = vec![
        "template",
        RELEASE,
        chart.to_str().expect("utf-8 path"),
        "--namespace",
        NAMESPACE,
        "-f",
        path_str(&minimal),
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

/// Fractions reach the binary as given: `--set` passes `0.25` as a string,
/// which the schema takes like the number a values file gives.
#[test]
fn fractions_set_on_the_command_line_reach_the_settings() {
    for (how, extra) in [
        ("--set", ["--set", "tracing.samplingRatio=0.25"]),
        ("--set-json", ["--set-json", "tracing.samplingRatio=0.25"]),
    ] {
        let r = Rendered::render_with(
            "fractions",
            None,
            &[
                "--set",
                "tracing.enabled=true",
                "--set",
                "tracing.endpoint=http://otel-collector:4318",
                "--set",
                "prometheusRule.enabled=true",
                "--set",
                "prometheusRule.runbookBaseUrl=https://runbooks.test/RUNBOOK.md",
                "--set",
                "prometheusRule.thresholds.pickupP99Seconds=2.5",
                extra[0],
                extra[1],
            ],
        );
        let settings = r.config_map();
        assert_eq!(
            settings
                .get("AUTOAPPROVAL_OTLP_SAMPLING_RATIO")
                .map(String::as_str),
            Some("0.25"),
            "{how}"
        );
        assert_eq!(
            settings
                .get("AUTOAPPROVAL_OTLP_ENDPOINT")
                .map(String::as_str),
            Some("http://otel-collector:4318"),
            "{how}"
        );
        assert!(
            r.yaml.contains("> 2.5"),
            "{how}: the threshold reaches the rule"
        );
    }
}

#[test]
fn the_prometheus_rule_and_the_dashboard_are_off_by_default() {
    let defaults = &renders()[0];
    assert!(defaults.all("PrometheusRule").is_empty());
    assert_eq!(defaults.all("ConfigMap").len(), 1, "only the settings");
    // Enabled without a runbook address: refused, naming the value.
    let chart = chart();
    let minimal = minimal_values();
    let out = Command::new(tool("helm"))
        .args(["template", RELEASE, chart.to_str().expect("utf-8 path")])
        .args(["-f", path_str(&minimal)])
        .args(["--set", "prometheusRule.enabled=true"])
        .output()
        .expect("helm");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The schema refuses it first (`/prometheusRule/runbookBaseUrl`); the template's
    // `required` says `prometheusRule.runbookBaseUrl`. Either names the value.
    assert!(
        stderr.contains("prometheusRule") && stderr.contains("runbookBaseUrl"),
        "{stderr}"
    );
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
    let readme = std::fs::read_to_string(repo().join("docs/OPERATING.md")).expect("OPERATING");
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
            "docs/OPERATING.md does not list the panel {title:?}"
        );
    }
}
