//! The chart's values schema and README: `helm lint` with the required and with every value, a
//! schema entry for every value that refuses typos, the chart's README generated from the commented
//! values, and the chart's versions and CRD following the crate's.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::support::{
    all_values, chart, helm, minimal_values, ok, path_str, repo, schema, strs, tool,
};

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

#[test]
fn helm_3_lints_the_chart_and_renders_what_helm_4_renders() {
    let helm3 = tool("helm3");
    let version = ok(&helm3, &["version", "--short"]);
    assert!(version.starts_with("v3."), "Helm 3 expected, got {version}");
    let chart = chart();
    let chart = path_str(&chart);
    for values in [minimal_values(), all_values()] {
        let values = path_str(&values);
        ok(&helm3, &["lint", "--strict", chart, "-f", values]);
        let template = [
            "template",
            "autoapproval",
            chart,
            "-n",
            "autoapproval",
            "-f",
            values,
        ];
        assert_eq!(
            ok(&helm3, &template),
            helm(&template),
            "Helm 3 and Helm 4 render {values} alike"
        );
    }
}

#[test]
fn the_chart_renders_as_a_dependency_of_a_parent_chart_that_sets_global_values() {
    // A parent chart (an umbrella release) carries ours in charts/; Helm hands every dependency
    // the parent's `global` values, which a schema refusing unknown keys must let through.
    let parent = std::env::temp_dir().join(format!("aa-umbrella-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&parent);
    std::fs::create_dir_all(parent.join("charts")).unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(chart())
        .arg(parent.join("charts"))
        .status()
        .unwrap();
    assert!(copied.success(), "cp -r of the chart failed");
    std::fs::write(
        parent.join("Chart.yaml"),
        "apiVersion: v2\nname: umbrella\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        parent.join("values.yaml"),
        "global:\n  imageRegistry: registry.example.com\n\
         autoapproval:\n  config:\n    esignUrl: http://esign:8080\n    ownerUrl: http://owner:8080\n\
         \x20   storeUrl: http://store:8080\n    adUrl: http://ad:8080\n",
    )
    .unwrap();
    let rendered = helm(&[
        "template",
        "umbrella",
        path_str(&parent),
        "--namespace",
        "autoapproval",
    ]);
    let _ = std::fs::remove_dir_all(&parent);
    assert!(
        rendered.contains("kind: Deployment") && rendered.contains("http://owner:8080"),
        "the dependency rendered no controller:\n{rendered}"
    );
}

fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
         `UPDATE_CHART_README=1 cargo test --test it chart_schema::the_chart_readme_is_generated_from_the_commented_values`.\n\n",
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
        "deploy/helm/autoapproval/README.md is stale: regenerate it with UPDATE_CHART_README=1 cargo test --test it chart_schema::the_chart_readme_is_generated_from_the_commented_values"
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
