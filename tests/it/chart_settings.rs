//! The chart and `autoapproval run` agree on every setting: each reachable from the chart and no
//! other, the same defaults, the rendered settings passing the binary's validation, and the schema
//! taking a duration, URL, count, listen address or fraction exactly when the binary does.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use autoapproval::flags::parse_duration;

use crate::support::{NAMESPACE, RELEASE, Rendered, helm_release, help_env, renders};

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

/// `autoapproval run` with a render's settings, the Secret's values and the mounted TLS files
/// stood in for, and a missing kubeconfig: every value is checked before anything is contacted
/// and the first contact is the kubeconfig, so failing on it proves that all the settings were
/// accepted.
fn run_with_settings(r: &Rendered, kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_autoapproval"));
    cmd.arg("run").env_clear().envs(r.config_map());
    let files = crate::support::tls::stand_in_files();
    for name in r.config_map().keys() {
        if let Some(file) = files.for_variable(name) {
            cmd.env(name, file);
        }
    }
    for e in r.controller()["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        let value = match name {
            // The mounted file, stood in for by the rendered ConfigMap's text: the binary reads
            // and checks it before anything is contacted.
            "AUTOAPPROVAL_VOCABULARY" => {
                let text = r
                    .all("ConfigMap")
                    .into_iter()
                    .find_map(|c| c["data"]["vocabulary.yaml"].as_str())
                    .expect("AUTOAPPROVAL_VOCABULARY set without the vocabulary ConfigMap");
                let dir = crate::support::fresh_dir("vocabulary-stand-in");
                let file = dir.join("vocabulary.yaml");
                std::fs::write(&file, text).expect("write the vocabulary stand-in");
                file.display().to_string()
            }
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
    helm_release(
        "template",
        &[flag, &set, "--show-only", "templates/configmap.yaml"],
    )
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

/// One fleet per database: without `config.fleet` every pod names its fleet `<its namespace>/<the
/// release>`, the namespace expanded by the kubelet from the variable defined before it, so a
/// second release against the same database, in any namespace, is refused; `config.fleet` (a DR
/// cluster's, the same as the primary's) replaces it.
#[test]
fn the_chart_names_the_fleet_after_the_pods_namespace_and_the_release_unless_set() {
    let [defaults, all] = renders();
    let env = defaults.controller()["env"].as_array().unwrap();
    let at = |name: &str| env.iter().position(|e| e["name"] == name);
    let fleet = at("AUTOAPPROVAL_FLEET").expect("the Deployment sets AUTOAPPROVAL_FLEET");
    assert_eq!(
        env[fleet]["value"],
        format!("$(AUTOAPPROVAL_NAMESPACE)/{RELEASE}")
    );
    assert!(
        at("AUTOAPPROVAL_NAMESPACE").expect("the namespace variable") < fleet,
        "the kubelet expands only variables defined before"
    );
    assert!(!defaults.config_map().contains_key("AUTOAPPROVAL_FLEET"));

    let env = all.controller()["env"].as_array().unwrap();
    assert!(env.iter().all(|e| e["name"] != "AUTOAPPROVAL_FLEET"));
    assert_eq!(
        all.config_map()
            .get("AUTOAPPROVAL_FLEET")
            .map(String::as_str),
        Some("contracts/autoapproval-primary")
    );
}
