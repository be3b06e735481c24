//! The PrometheusRule and the Grafana dashboard: off by default, every alert passing promtool with
//! unit tests that fire it and keep it silent when healthy, the rule selecting the configured job,
//! and the dashboard's panels in a ConfigMap Grafana finds.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::support::{
    chart, fresh_dir, helm_release, ok, parse_yaml_stream, renders, repo, stdout_of,
};

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
    let template = helm_release("template", args);
    let objects = parse_yaml_stream(&stdout_of(template, &format!("helm template {args:?}")));
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

#[test]
fn the_prometheus_rule_and_the_dashboard_are_off_by_default() {
    let defaults = &renders()[0];
    assert!(defaults.all("PrometheusRule").is_empty());
    assert_eq!(defaults.all("ConfigMap").len(), 1, "only the settings");
    // Enabled without a runbook address: refused, naming the value.
    let out = helm_release("template", &["--set", "prometheusRule.enabled=true"])
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
    let dir = fresh_dir("promtool");
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
        "AutoApprovalReplicaCannotHoldShards",
        "AutoApprovalNoLeader",
        "AutoApprovalLeaseRenewFailures",
        "AutoApprovalPickupSlow",
        "AutoApprovalRequestsExhausted",
        "AutoApprovalBacklogOld",
        "AutoApprovalDatabaseDown",
        "AutoApprovalFleetPaused",
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
    let dir = fresh_dir("promtool-all-values");
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
        threshold("AutoApprovalFleetPaused").as_deref(),
        Some("7200")
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
    let dir = fresh_dir("dashboard-promql");
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
