//! `autoapproval-lab bench --shadow` as a user runs it (issue 43): seed-new
//! as the scheduler in place beside ours in shadow, then ours switched to
//! active. The run's JSON must show zero creations and zero business writes
//! by ours while in shadow, the baseline's approvals compared by the
//! report, and active approving the rest.

use std::process::Stdio;

#[tokio::test(flavor = "multi_thread")]
async fn beside_seed_new_shadow_creates_and_writes_nothing_then_active_approves_the_rest() {
    crate::assert_controller_built();
    let dir = std::env::temp_dir().join(format!("aa-it-shadow-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("work dir");
    let report = dir.join("report.json");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_autoapproval-lab"))
        .args([
            "bench",
            "--shadow",
            "--requests",
            "12",
            "--rate",
            "20",
            "--replicas",
            "1",
            "--poll-period",
            "1s",
            "--work-dir",
        ])
        .arg(&dir)
        .arg("--report")
        .arg(&report)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .expect("bench runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let run: serde_json::Value = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| panic!("no report; stdout:\n{stdout}\nstderr:\n{stderr}"));
    let _ = std::fs::remove_dir_all(&dir);

    // Zero by ours while in shadow, counted by its simulator and by the database.
    assert_eq!(run["creations_by_ours_in_shadow"], 0, "{run:#}");
    assert_eq!(
        run["business_writes_by_ours_in_shadow"],
        serde_json::json!([]),
        "{run:#}"
    );
    // The counters see writes: the baseline's approvals are there.
    assert!(run["creations_by_baseline"].as_u64() >= Some(9), "{run:#}");
    assert!(
        run["business_writes_by_baseline"]
            .to_string()
            .contains("approval_request UPDATE"),
        "{run:#}"
    );
    // The baseline approved the shadow part; the report compared it with ours.
    assert_eq!(
        (
            run["shadow_requests"].as_u64(),
            run["rest_requests"].as_u64()
        ),
        (Some(9), Some(3))
    );
    assert_eq!(run["approved_by_baseline"], 9, "{run:#}");
    let shadow = &run["shadow_report"];
    assert_eq!(shadow["decided"], 9, "{run:#}");
    assert_eq!(shadow["agreed"], 9, "{run:#}");
    assert_eq!(shadow["approvedButRejected"], serde_json::json!([]));
    assert_eq!(shadow["undecided"], 3, "the rest, evaluated in shadow");
    assert!(shadow["saved"]["requests"].as_u64() > Some(0), "{run:#}");
    // Active approved the rest.
    assert_eq!(run["approved_by_ours_after_switch"], 3, "{run:#}");
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("business writes by ours' role: 0"),
        "{stdout}"
    );
}
