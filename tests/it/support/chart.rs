//! The chart as the tests render it: `helm template` parsed (`Rendered`), with its defaults, every
//! value set, or for kubectl; the values schema, the Role's grants, and the settings
//! `autoapproval --help` lists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use super::{parse_yaml_stream, repo, stdout_of, tool};

/// Release name and namespace of every render, as in `scripts/render-manifests.sh`.
pub const RELEASE: &str = "autoapproval";
pub const NAMESPACE: &str = "autoapproval";

pub fn chart() -> PathBuf {
    repo().join("deploy/helm/autoapproval")
}

pub fn all_values() -> PathBuf {
    chart().join("ci/all-values.yaml")
}

/// The four external URLs, which have no default: the least an install needs.
pub fn minimal_values() -> PathBuf {
    chart().join("ci/minimal-values.yaml")
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `tool args`, which must succeed: its standard output.
pub fn ok(tool: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(tool);
    cmd.args(args);
    stdout_of(cmd, &format!("{} {args:?}", tool.display()))
}

/// `helm <command> autoapproval <chart> --namespace autoapproval -f ci/minimal-values.yaml
/// <args>`: the release (`template`, `install`, …) with the required URLs; the caller may add more.
pub fn helm_release(command: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(tool("helm"));
    cmd.args([command, RELEASE])
        .arg(chart())
        .args(["--namespace", NAMESPACE, "-f"])
        .arg(minimal_values())
        .args(args);
    cmd
}

pub fn helm(args: &[&str]) -> String {
    let mut cmd = Command::new(tool("helm"));
    cmd.args(args);
    stdout_of(cmd, &format!("helm {args:?}"))
}

/// One `helm template` output, parsed.
pub struct Rendered {
    /// Which values produced it.
    pub name: &'static str,
    /// The values file given to helm, if any.
    pub values: Option<PathBuf>,
    /// The YAML as helm printed it.
    pub yaml: String,
    /// Its objects.
    pub objects: Vec<Value>,
}

impl Rendered {
    /// `helm template` with the chart's defaults plus the required URLs, then `values`; without
    /// the `helm test` Pod, which only `helm test` creates.
    pub fn render(name: &'static str, values: Option<PathBuf>) -> Rendered {
        Rendered::render_with(name, values, &[])
    }

    pub fn render_with(name: &'static str, values: Option<PathBuf>, extra: &[&str]) -> Rendered {
        // As a cluster with the Prometheus Operator's CRDs: the monitors render only there.
        let mut cmd = helm_release(
            "template",
            &[
                "--skip-tests",
                "--api-versions",
                "monitoring.coreos.com/v1/ServiceMonitor",
                "--api-versions",
                "monitoring.coreos.com/v1/PodMonitor",
            ],
        );
        if let Some(v) = &values {
            cmd.arg("-f").arg(v);
        }
        cmd.args(extra);
        let yaml = stdout_of(cmd, &format!("helm template ({name}) {extra:?}"));
        let objects = parse_yaml_stream(&yaml);
        Rendered {
            name,
            values,
            yaml,
            objects,
        }
    }

    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    pub fn one(&self, kind: &str) -> &Value {
        let found = self.all(kind);
        assert_eq!(found.len(), 1, "{}: one {kind} expected", self.name);
        found[0]
    }

    /// The settings ConfigMap (not the dashboard's, nor the vocabulary's).
    pub fn settings(&self) -> &Value {
        let found: Vec<&Value> = self
            .all("ConfigMap")
            .into_iter()
            .filter(|o| o["metadata"]["labels"].get("grafana_dashboard").is_none())
            .filter(|o| o["data"].get("vocabulary.yaml").is_none())
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{}: one settings ConfigMap expected",
            self.name
        );
        found[0]
    }

    pub fn config_map(&self) -> BTreeMap<String, String> {
        let data = &self.settings()["data"];
        serde_json::from_value(data.clone()).expect("ConfigMap data is a string map")
    }

    pub fn controller(&self) -> &Value {
        &self.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    }

    /// A top-level value, from the values file or else the chart's values.yaml.
    pub fn value(&self, key: &str) -> Value {
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
pub fn renders() -> &'static [Rendered; 2] {
    static RENDERS: OnceLock<[Rendered; 2]> = OnceLock::new();
    RENDERS.get_or_init(|| {
        [
            Rendered::render("defaults", None),
            Rendered::render("all-values", Some(all_values())),
        ]
    })
}

/// The chart rendered for kubectl, as scripts/render-manifests.sh renders deploy/manifests/.
pub fn plain() -> &'static Rendered {
    static PLAIN: OnceLock<Rendered> = OnceLock::new();
    PLAIN.get_or_init(|| Rendered::render_with("plain", None, &["--set", "helmHooks=false"]))
}

pub fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `labels` are all present in `on`.
pub fn selects(labels: &Value, on: &Value) -> bool {
    labels
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| on.get(k) == Some(v)))
}

/// The environment variables a subcommand reads, with clap's default where it has one.
pub fn help_env(subcommand: &str) -> BTreeMap<String, Option<String>> {
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

pub fn schema() -> Value {
    let text = std::fs::read_to_string(chart().join("values.schema.json")).unwrap();
    serde_json::from_str(&text).expect("values.schema.json is JSON")
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
