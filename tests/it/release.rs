//! A release as its users meet it: one version everywhere (the crate, the
//! chart, the chart's appVersion, the changelog's latest release), the
//! toolchain the tests run on declared as `rust-version`, and
//! `autoapproval_build_info` naming the revision and features of the build.

use std::path::Path;

use crate::support::AsDb;

fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The version of the first `## [x.y.z] - YYYY-MM-DD` heading (Keep a Changelog).
fn latest_changelog_release(changelog: &str) -> String {
    let heading = changelog
        .lines()
        .filter_map(|l| l.strip_prefix("## ["))
        .find(|l| !l.starts_with("Unreleased]"))
        .expect("a `## [x.y.z] - date` release heading in CHANGELOG.md");
    let (version, date) = heading.split_once("] - ").unwrap_or_else(|| {
        panic!("CHANGELOG.md: `## [{heading}` is not `## [x.y.z] - YYYY-MM-DD`")
    });
    let digits: Vec<&str> = date.trim().split('-').collect();
    assert!(
        digits.len() == 3 && digits.iter().all(|d| d.parse::<u32>().is_ok()),
        "CHANGELOG.md: the release {version} has no YYYY-MM-DD date: {date}"
    );
    version.to_owned()
}

#[test]
fn the_crate_the_chart_its_app_version_and_the_changelog_name_one_version() {
    let chart: serde_yaml::Value =
        serde_yaml::from_str(&repo_file("deploy/helm/autoapproval/Chart.yaml"))
            .expect("Chart.yaml");
    let crate_version = env!("CARGO_PKG_VERSION");
    let versions = [
        ("Cargo.toml [package] version", crate_version.to_owned()),
        (
            "Chart.yaml version",
            chart["version"].as_str().unwrap_or_default().to_owned(),
        ),
        (
            "Chart.yaml appVersion",
            chart["appVersion"].as_str().unwrap_or_default().to_owned(),
        ),
        (
            "CHANGELOG.md latest release",
            latest_changelog_release(&repo_file("CHANGELOG.md")),
        ),
    ];
    for (place, version) in &versions {
        assert_eq!(
            version, crate_version,
            "{place} differs from the crate's version; bump them together (docs/RELEASING.md): {versions:?}"
        );
    }
}

#[test]
fn rust_version_is_the_toolchain_the_tests_run_on() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = std::process::Command::new(&rustc)
        .arg("--version")
        .output()
        .expect("rustc --version");
    let text = String::from_utf8_lossy(&output.stdout);
    // `rustc 1.95.0 (…)`: its major.minor.
    let toolchain: Vec<&str> = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split('.')
        .take(2)
        .collect();
    assert_eq!(
        env!("CARGO_PKG_RUST_VERSION"),
        toolchain.join("."),
        "Cargo.toml's rust-version is not the toolchain the tests run on ({text}): move them together"
    );
}

/// The features `[features]` of Cargo.toml declares.
fn declared_features() -> Vec<String> {
    let manifest = repo_file("Cargo.toml");
    let section = manifest
        .split("\n[features]\n")
        .nth(1)
        .expect("[features] in Cargo.toml");
    section
        .lines()
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k.trim().to_owned()))
        .filter(|k| !k.starts_with('#'))
        .collect()
}

#[tokio::test]
async fn build_info_on_metrics_names_the_version_the_git_revision_and_the_features() {
    use autoapproval::endpoints::{Health, router};
    use autoapproval::telemetry::Metrics;

    // /metrics contacts neither the database nor the API server.
    let pool = sqlx::PgPool::connect_lazy("postgres://127.0.0.1:1/none").expect("lazy pool");
    let client = kube::Client::try_from(kube::Config::new(
        "http://127.0.0.1:1".parse().expect("url"),
    ))
    .expect("client");
    let health = Health::new(pool.db().database(), client, Metrics::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
    tokio::spawn(axum::serve(listener, router(health)).into_future());
    let body = reqwest::get(url)
        .await
        .expect("/metrics")
        .text()
        .await
        .expect("body");

    let line = body
        .lines()
        .find(|l| l.starts_with("autoapproval_build_info{"))
        .unwrap_or_else(|| panic!("no autoapproval_build_info in:\n{body}"));
    let label = |name: &str| {
        line.split_once(&format!("{name}=\""))
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(value, _)| value.to_owned())
            .unwrap_or_else(|| panic!("no {name} label: {line}"))
    };
    assert_eq!(label("version"), env!("CARGO_PKG_VERSION"), "{line}");

    let expected = match option_env!("AUTOAPPROVAL_GIT_REVISION") {
        Some(given) if !given.trim().is_empty() => given.trim().to_owned(),
        _ => {
            let git = std::process::Command::new("git")
                .args(["rev-parse", "HEAD"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .expect("git rev-parse HEAD");
            assert!(git.status.success(), "the tests run in a git checkout");
            String::from_utf8_lossy(&git.stdout).trim().to_owned()
        }
    };
    assert_eq!(label("revision"), expected, "{line}");

    let features = label("features");
    let features: Vec<&str> = features.split(',').filter(|f| !f.is_empty()).collect();
    assert_eq!(features.contains(&"otlp"), cfg!(feature = "otlp"), "{line}");
    let declared = declared_features();
    for feature in &features {
        assert!(
            declared.iter().any(|d| d == feature),
            "{feature} is no feature of Cargo.toml: {line}"
        );
    }
}

/// Every script runs under `set -o pipefail`, where `cmd | head -n 1` fails
/// with SIGPIPE (141) whenever `cmd` writes after head has closed the pipe: a
/// race a loaded fresh machine loses (`etcd --version | head` killed
/// `.ci/run` after the control plane was built). `sed -n 1p` reads it all.
#[test]
fn the_scripts_never_cut_a_pipe_short_under_pipefail() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts");
    let mut offenders = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("scripts/") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "sh") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("script");
        if !text.contains("pipefail") {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let code = line.split(" #").next().unwrap_or(line).trim_start();
            if code.starts_with('#') {
                continue;
            }
            let cut = ["| head", "|head", "| grep -q", "| grep -m"]
                .iter()
                .any(|p| code.contains(p));
            if cut && !code.contains("|| true") {
                offenders.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}
