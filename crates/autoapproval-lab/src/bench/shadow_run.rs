//! `autoapproval-lab bench --shadow`: the cut-over of issue 43 on one
//! workload. The seed's new design runs as the scheduler in place (its own
//! database role, its own copy of the state tables, its approvals recorded
//! as `decided_by = seed-new`, its own simulator) beside ours in
//! `--mode shadow`; when it has approved the first part of the workload the
//! run prints `autoapproval shadow-report`'s figures, the creations ours
//! made (counted by ours' simulator) and the writes its role made to the
//! business's tables (counted by triggers in the database), both to be
//! zero. Then the baseline stops, the rest of the workload arrives, and ours
//! restarts in `--mode active` and approves it.

use std::time::{Duration, Instant};

use chrono::Utc;
use serde::Serialize;

use super::{BenchArgs, BenchError, insert_owner, ours_argv, write};
use crate::stack::{Database, Program, Stack, StackArgs, StackError, WORKER_ROLE};
use autoapproval::shutdown::Termination;
use autoapproval_sim::{Faults, SimConfig, SimHandle, Simulator};

/// The baseline's database role, and the `decided_by` of its approvals.
const BASELINE_ROLE: &str = "seed_new";
const BASELINE_DECIDED_BY: &str = "seed-new";

/// What `bench --shadow` measured, as its JSON report holds it.
#[derive(Debug, Serialize)]
pub struct ShadowRun {
    /// Owner contracts inserted while the baseline ran beside ours in shadow.
    pub shadow_requests: u64,
    /// Owner contracts inserted after the baseline stopped, left to ours.
    pub rest_requests: u64,
    /// Approvals by the baseline (`decided_by = seed-new`).
    pub approved_by_baseline: u64,
    /// `autoapproval shadow-report --output json`, as printed.
    pub shadow_report: serde_json::Value,
    /// Creations the simulator ours talks to counted while ours was in shadow.
    pub creations_by_ours_in_shadow: u64,
    /// Creations the baseline's simulator counted.
    pub creations_by_baseline: u64,
    /// Writes to the business's tables by ours' role while in shadow, by table and operation.
    pub business_writes_by_ours_in_shadow: Vec<(String, i64)>,
    /// The same count for the baseline's role: the audit sees its approvals.
    pub business_writes_by_baseline: Vec<(String, i64)>,
    /// Approvals by ours (`decided_by = autoapproval`) after the switch to active.
    pub approved_by_ours_after_switch: u64,
}

/// Runs the shadow comparison on its own stack, removed afterwards.
pub(super) async fn run(args: &BenchArgs, interrupt: &mut Termination) -> Result<(), BenchError> {
    if args.stack.database != Database::Postgres {
        return Err(BenchError::Setting {
            flag: "--shadow",
            message: "runs on PostgreSQL only (the baseline's own role and state tables)".into(),
        });
    }
    if args.requests < 2 {
        return Err(BenchError::Setting {
            flag: "--requests",
            message: "--shadow needs at least 2 (some in shadow, the rest after the switch)".into(),
        });
    }
    let sim = SimConfig {
        faults: Faults {
            latency: args.latency,
            ..Faults::default()
        },
        ..SimConfig::default()
    };
    let baseline_sim = Simulator::start(([127, 0, 0, 1], 0).into(), sim.clone())
        .await
        .map_err(StackError::from)?;
    let stack_args = StackArgs {
        database: Database::Postgres,
        ..args.stack.clone()
    };
    let mut stack = match Stack::start(&stack_args, "bench-shadow", sim).await {
        Ok(stack) => stack,
        Err(error) => {
            let _ = baseline_sim.shutdown().await;
            return Err(error.into());
        }
    };
    let result = tokio::select! {
        result = measure(&mut stack, &baseline_sim, args) => result,
        () = interrupt.recv() => Err(BenchError::Interrupted),
    };
    let failed = result.is_err() && !matches!(result, Err(BenchError::Interrupted));
    if failed {
        println!("logs kept in {}", stack.dir().display());
    }
    stack.shutdown(failed).await;
    let _ = baseline_sim.shutdown().await;
    let run = result?;
    let json = serde_json::to_string_pretty(&run).map_err(|e| BenchError::Write {
        path: args.report.display().to_string(),
        source: e.into(),
    })?;
    write(&args.report, &json)?;
    println!("report: {}", args.report.display());
    let mut problems = Vec::new();
    if run.creations_by_ours_in_shadow > 0 {
        problems.push(format!(
            "ours created {} things outside while in shadow",
            run.creations_by_ours_in_shadow
        ));
    }
    if !run.business_writes_by_ours_in_shadow.is_empty() {
        problems.push(format!(
            "ours wrote to the business's tables while in shadow: {:?}",
            run.business_writes_by_ours_in_shadow
        ));
    }
    if run.approved_by_ours_after_switch < run.rest_requests {
        problems.push(format!(
            "active approved {} of the {} left",
            run.approved_by_ours_after_switch, run.rest_requests
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(BenchError::Incomplete(problems.join("; ")))
    }
}

async fn measure(
    stack: &mut Stack,
    baseline_sim: &SimHandle,
    args: &BenchArgs,
) -> Result<ShadowRun, BenchError> {
    let harness = stack.harness()?.clone();
    harness
        .install_baseline(WORKER_ROLE, BASELINE_ROLE, BASELINE_DECIDED_BY)
        .await
        .map_err(StackError::from)?;
    let rest = (args.requests / 4).max(1);
    let in_shadow = args.requests - rest;
    let poll = args.poll();
    println!(
        "shadow run on PostgreSQL: seed-new ({} replicas, {} s poll) approves {in_shadow} owner \
         contracts at {}/s while ours ({} replicas) runs beside it in --mode shadow; then seed-new \
         stops, {rest} more arrive, ours switches to --mode active",
        args.replicas,
        poll.as_secs_f64(),
        args.rate,
        args.replicas
    );

    spawn_ours(stack, args, "shadow").await?;
    // The baseline: its own role (hence its own state tables and decided_by)
    // and its own simulator, so ours' simulator counts ours only.
    let baseline_url =
        stack
            .worker_url()?
            .replacen(&format!("{WORKER_ROLE}@"), &format!("{BASELINE_ROLE}@"), 1);
    let sim_url = baseline_sim.base_url();
    for i in 0..args.replicas {
        let mut argv: Vec<String> = [
            "seed-design",
            "--design",
            "new",
            "--replica-name",
            &format!("seed-new-{i}"),
            "--time-scale",
            "1",
            "--poll-period",
            &format!("{}ms", poll.as_millis().max(1)),
            "--database-url",
            &baseline_url,
        ]
        .map(String::from)
        .to_vec();
        for system in ["esign", "owner", "store", "ad"] {
            argv.extend([format!("--{system}-url"), sim_url.clone()]);
        }
        stack
            .spawn(Program::Lab, &format!("seed-new-{i}"), &argv)
            .await?;
    }
    stack.wait_ready(None).await?;

    let since = Utc::now() - chrono::Duration::seconds(1);
    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    for i in 0..in_shadow {
        tokio::time::sleep_until((started + interval * i).into()).await;
        insert_owner(&harness, format!("Shop {i}"), true).await?;
    }
    let cap = poll * 6 + Duration::from_secs(120);
    // Approved by anyone: ours must not have, and the report says if it did.
    wait_for(
        stack,
        cap,
        "seed-new to approve the shadow part",
        async |_| {
            let baseline = harness.approval_span(BASELINE_DECIDED_BY).await?.approved;
            let ours = harness.approval_span("autoapproval").await?.approved;
            Ok(baseline + ours >= i64::from(in_shadow))
        },
    )
    .await?;
    for i in 0..args.replicas {
        stack
            .stop_replica(&format!("seed-new-{i}"), Duration::from_secs(10))
            .await;
    }
    let approved_by_baseline = harness
        .approval_span(BASELINE_DECIDED_BY)
        .await
        .map_err(StackError::from)?
        .approved
        .max(0) as u64;
    println!("seed-new approved {approved_by_baseline} and stopped; {rest} more arrive");
    for i in in_shadow..args.requests {
        insert_owner(&harness, format!("Shop {i}"), true).await?;
    }
    // Ours, still in shadow, evaluates what arrived: the report counts it undecided.
    let report_bin = stack.controller_bin().to_path_buf();
    let url = stack.worker_url()?;
    let mut report = serde_json::Value::Null;
    wait_for(
        stack,
        cap,
        "ours to evaluate the rest in shadow",
        async |_| {
            report = shadow_report(&report_bin, &url, since).await?;
            // Or approved: an ours that acted in shadow must end here and be reported.
            let approved = harness.approval_span("autoapproval").await?.approved;
            let seen = report["undecided"].as_u64().unwrap_or(0) + approved.max(0) as u64;
            Ok(seen >= u64::from(rest))
        },
    )
    .await?;
    let creations = |sim: Option<&SimHandle>| {
        sim.map_or(0, |s| {
            let c = s.stats().created;
            c.owners + c.stores + c.campaigns
        })
    };
    let creations_by_ours_in_shadow = creations(stack.sim());
    let creations_by_baseline = creations(Some(baseline_sim));
    let business_writes_by_ours_in_shadow = harness
        .business_writes_by(WORKER_ROLE)
        .await
        .map_err(StackError::from)?;
    let business_writes_by_baseline = harness
        .business_writes_by(BASELINE_ROLE)
        .await
        .map_err(StackError::from)?;
    print_shadow(
        &report,
        (creations_by_ours_in_shadow, creations_by_baseline),
        &business_writes_by_ours_in_shadow,
        &business_writes_by_baseline,
    );

    stack.stop_replicas(Duration::from_secs(10)).await;
    println!("ours restarts in --mode active");
    spawn_ours(stack, args, "active").await?;
    wait_for(
        stack,
        cap,
        "ours to approve the rest in active",
        async |_| {
            let span = harness.approval_span("autoapproval").await?;
            Ok(span.approved >= i64::from(rest))
        },
    )
    .await?;
    let approved_by_ours_after_switch = harness
        .approval_span("autoapproval")
        .await
        .map_err(StackError::from)?
        .approved
        .max(0) as u64;
    println!(
        "active: ours approved {approved_by_ours_after_switch} of the {rest} left; \
         {} creations in ours' simulator now",
        creations(stack.sim())
    );
    Ok(ShadowRun {
        shadow_requests: u64::from(in_shadow),
        rest_requests: u64::from(rest),
        approved_by_baseline,
        shadow_report: report,
        creations_by_ours_in_shadow,
        creations_by_baseline,
        business_writes_by_ours_in_shadow,
        business_writes_by_baseline,
        approved_by_ours_after_switch,
    })
}

/// Starts `args.replicas` of ours in `mode` and waits until the shards settle.
async fn spawn_ours(stack: &mut Stack, args: &BenchArgs, mode: &str) -> Result<(), BenchError> {
    for i in 0..args.replicas {
        let name = format!("ours-{mode}-{i}");
        let argv = [
            ours_argv(stack, args, &name, args.poll()),
            vec!["--mode".into(), mode.into()],
        ]
        .concat();
        stack.spawn(Program::Controller, &name, &argv).await?;
    }
    Ok(stack.wait_ready(Some(args.shards)).await?)
}

/// Polls `done` every 200 ms until it holds, a replica exits, or `cap` passes.
async fn wait_for(
    stack: &mut Stack,
    cap: Duration,
    what: &str,
    mut done: impl AsyncFnMut(()) -> Result<bool, autoapproval::db::DbError>,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + cap;
    loop {
        stack.check_replicas()?;
        if done(()).await.map_err(StackError::from)? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Incomplete(format!(
                "waited {} s for {what}",
                cap.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `autoapproval shadow-report --since <since> --output json`, run as an operator would.
async fn shadow_report(
    bin: &std::path::Path,
    url: &str,
    since: chrono::DateTime<Utc>,
) -> Result<serde_json::Value, autoapproval::db::DbError> {
    let failed = |message: String| autoapproval::db::DbError::Config {
        setting: "shadow-report",
        message,
    };
    let output = tokio::process::Command::new(bin)
        .args(["shadow-report", "--output", "json", "--since"])
        .arg(since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .env("AUTOAPPROVAL_DATABASE_URL", url)
        .output()
        .await
        .map_err(|e| failed(format!("{}: {e}", bin.display())))?;
    if !output.status.success() {
        return Err(failed(String::from_utf8_lossy(&output.stderr).into_owned()));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| failed(e.to_string()))
}

/// Prints the report's figures and the two counts.
fn print_shadow(
    report: &serde_json::Value,
    (ours, baseline): (u64, u64),
    writes: &[(String, i64)],
    baseline_writes: &[(String, i64)],
) {
    let ids = |key: &str| {
        report[key].as_array().map_or_else(String::new, |list| {
            list.iter()
                .filter_map(|d| d["requestId"].as_i64())
                .map(|id| id.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        })
    };
    let len = |key: &str| report[key].as_array().map_or(0, Vec::len);
    println!(
        "shadow report: evaluated {}, would approve {}, would hold {}; decided by seed-new {}, \
         agreed {} (rate {}); dangerous (would approve, rejected) {} [{}]; held but approved {} [{}]; \
         undecided {}",
        report["evaluated"],
        report["wouldApprove"],
        report["wouldHold"],
        report["decided"],
        report["agreed"],
        report["agreementRate"],
        len("approvedButRejected"),
        ids("approvedButRejected"),
        len("heldButApproved"),
        ids("heldButApproved"),
        report["undecided"],
    );
    let saved = &report["saved"];
    println!(
        "pickup time saved on {} approved: median {} s, p99 {} s",
        saved["requests"], saved["medianSeconds"], saved["p99Seconds"]
    );
    println!(
        "in shadow: {ours} creations by ours (its simulator; seed-new's counted {baseline}); \
         business writes by ours' role: {} (by seed-new's: {baseline_writes:?})",
        if writes.is_empty() {
            "0".to_owned()
        } else {
            format!("{writes:?}")
        }
    );
}
