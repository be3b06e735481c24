//! `bench --at-rest`: what our replicas cost while they have nothing to do
//! but keep N requests waiting: Kubernetes API writes and database
//! statements per second, CPU, memory per waiting CR, and what one replica's
//! restart writes when nothing changed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{BenchArgs, BenchError};
use crate::stack::replicas::metric_sum;
use crate::stack::{Program, Stack, StackError, WORKER_ROLE};
use autoapproval::shutdown::Termination;
use autoapproval_sim::SimConfig;

/// What `--at-rest` measured.
#[derive(Debug, Serialize)]
pub struct AtRestReport {
    /// The machine, as in the comparison's report.
    pub machine: String,
    /// Replicas.
    pub replicas: u32,
    /// Shards.
    pub shards: u32,
    /// Requests waiting their retry.
    pub waiting: u32,
    /// Seconds measured at rest.
    pub window_s: f64,
    /// Kubernetes API writes per second, all replicas together.
    pub kube_writes_per_s: f64,
    /// The same by verb and resource, e.g. `"update leases"`.
    pub kube_writes_per_s_by_kind: BTreeMap<String, f64>,
    /// The replicas' top-level statements per second (`pg_stat_statements`).
    pub db_statements_per_s: Option<f64>,
    /// CPU used per replica over the window, in percent of one core.
    pub cpu_percent: Vec<f64>,
    /// Resident memory per replica at rest, in MiB.
    pub rss_mib: Vec<f64>,
    /// Resident memory per replica that the waiting CRs added, per CR, in bytes.
    pub rss_bytes_per_waiting_cr: Vec<f64>,
    /// Seconds from inserting the requests until every one waited with its CR.
    pub settle_s: f64,
    /// Mean duration of a discovery turn per replica over the window, in
    /// milliseconds (`autoapproval_discovery_turn_duration_seconds`).
    pub discovery_turn_ms: Vec<f64>,
    /// With `--control-plane real`: what kube-apiserver and etcd spent at rest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<ControlPlaneAtRest>,
    /// One replica stopped with SIGTERM and started again.
    pub restart: Restart,
}

/// kube-apiserver and etcd at rest.
#[derive(Debug, Serialize)]
pub struct ControlPlaneAtRest {
    /// kube-apiserver's CPU over the window, in percent of one core.
    pub apiserver_cpu_percent: f64,
    /// etcd's CPU over the window, in percent of one core.
    pub etcd_cpu_percent: f64,
    /// etcd's database size with every request waiting, in bytes.
    pub etcd_db_bytes: u64,
    /// What etcd's database grew by from before the inserts until every request
    /// waited with its CR, per waiting CR, in bytes.
    pub etcd_db_bytes_per_waiting_cr: f64,
}

/// One replica's restart with nothing changed.
#[derive(Debug, Serialize)]
pub struct Restart {
    /// Seconds from a second restart until its first approval: from its
    /// start one approvable request is inserted every 100 ms (ids, so
    /// shards, in turn).
    pub first_approval_s: Option<f64>,
    /// Seconds from its start until the shards were balanced again.
    pub ready_s: f64,
    /// Seconds from its start until its reconciles stopped (3 s without one).
    pub reconciled_s: f64,
    /// Its reconciles in that time.
    pub reconciles: f64,
    /// Status patches (`patch autoapprovals`) from its stop to then.
    pub status_patches: u64,
    /// Every API write in that time, by verb and resource.
    pub writes_by_kind: BTreeMap<String, u64>,
}

/// Runs `--at-rest` on a stack of its own, removed afterwards.
pub async fn run(args: &BenchArgs, interrupt: &mut Termination) -> Result<(), BenchError> {
    println!(
        "at rest: {} replicas, {} shards, {} requests waiting (--condition-retry-interval {}), measured for {} s",
        args.replicas,
        args.shards,
        args.waiting,
        args.condition_retry_interval.map_or_else(
            || "the controller's default".to_owned(),
            |d| format!("{} s", d.as_secs())
        ),
        args.window.as_secs_f64()
    );
    let mut stack = Stack::start(&args.stack, "at-rest", SimConfig::default()).await?;
    let result = tokio::select! {
        result = measure(&mut stack, args) => result,
        () = interrupt.recv() => Err(BenchError::Interrupted),
    };
    let failed = result.is_err() && !matches!(result, Err(BenchError::Interrupted));
    if failed {
        println!("logs kept in {}", stack.dir().display());
    }
    stack.shutdown(failed).await;
    let report = result?;
    println!("\n{}", table(&report));
    let json = serde_json::to_string_pretty(&report).map_err(|e| BenchError::Write {
        path: args.report.display().to_string(),
        source: e.into(),
    })?;
    super::write(&args.report, &json)?;
    println!("report: {}", args.report.display());
    Ok(())
}

/// API writes so far, by verb and resource.
async fn writes(stack: &Stack) -> Result<BTreeMap<String, u64>, StackError> {
    stack.api_writes().await
}

fn since(now: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    now.iter()
        .map(|(k, n)| {
            (
                k.clone(),
                n.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

async fn reconciles_of(stack: &Stack, name: &str, http: &reqwest::Client) -> f64 {
    for replica in stack.replicas().iter().filter(|r| r.name() == name) {
        if let Ok(text) = replica.scrape(http).await {
            return metric_sum(&text, "autoapproval_reconcile_duration_seconds_count", &[]);
        }
    }
    0.0
}

/// `autoapproval_discovery_turn_duration_seconds` sum and count per replica.
async fn turn_times(stack: &Stack, http: &reqwest::Client) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for replica in stack.replicas() {
        let text = replica.scrape(http).await.unwrap_or_default();
        out.push((
            metric_sum(
                &text,
                "autoapproval_discovery_turn_duration_seconds_sum",
                &[],
            ),
            metric_sum(
                &text,
                "autoapproval_discovery_turn_duration_seconds_count",
                &[],
            ),
        ));
    }
    out
}

/// Approvals of the replica named `name` so far.
async fn approvals_of(stack: &Stack, name: &str, http: &reqwest::Client) -> f64 {
    for replica in stack.replicas().iter().filter(|r| r.name() == name) {
        if let Ok(text) = replica.scrape(http).await {
            return metric_sum(
                &text,
                "autoapproval_outcomes_total",
                &["outcome=\"approved\""],
            );
        }
    }
    0.0
}

/// Seconds from `started` until replica `name` approves, inserting one
/// approvable request every 100 ms meanwhile; `None` after `limit`.
async fn first_approval(
    stack: &mut Stack,
    name: &str,
    started: Instant,
    limit: Duration,
) -> Result<Option<f64>, BenchError> {
    let http = reqwest::Client::new();
    let harness = stack.harness()?.clone();
    let mut i = 0;
    while started.elapsed() < limit {
        stack.check_replicas()?;
        if approvals_of(stack, name, &http).await > 0.0 {
            return Ok(Some(started.elapsed().as_secs_f64()));
        }
        super::insert_owner(&harness, format!("Ready shop {i}"), true).await?;
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(None)
}

async fn measure(stack: &mut Stack, args: &BenchArgs) -> Result<AtRestReport, BenchError> {
    // The controller's retry policy unless --condition-retry-interval says
    // otherwise: the retries of waiting requests are what a cluster pays at
    // rest, so they run during the window (their writes are measured).
    let replica_args = |stack: &Stack, name: &str| {
        let mut argv = super::ours_argv(stack, args, name, args.poll_period);
        if let Some(interval) = args.condition_retry_interval {
            argv.extend([
                "--condition-retry-interval".to_owned(),
                format!("{}ms", interval.as_millis()),
            ]);
        }
        argv
    };
    let names: Vec<String> = (0..args.replicas).map(|i| format!("ours-{i}")).collect();
    for name in &names {
        let argv = replica_args(stack, name);
        stack.spawn(Program::Controller, name, &argv).await?;
    }
    stack.wait_ready(Some(args.shards)).await?;
    let rss_empty: Vec<u64> = stack
        .replicas()
        .iter()
        .map(|r| r.rss_bytes().unwrap_or(0))
        .collect();

    // Requests that wait: their documents are not released, so each attempt
    // schedules a retry 10 minutes out.
    let harness = stack.harness()?.clone();
    let etcd_empty = super::etcd_db_bytes(stack).await?;
    let inserted = Instant::now();
    for i in 0..args.waiting {
        super::insert_owner(&harness, format!("Waiting shop {i}"), false).await?;
    }
    let deadline = Instant::now()
        + Duration::from_secs(120)
        + Duration::from_millis(u64::from(args.waiting) * 20);
    loop {
        stack.check_replicas()?;
        let waiting = harness.waiting().await.map_err(StackError::from)?;
        let crs = writes(stack)
            .await?
            .get("create autoapprovals")
            .copied()
            .unwrap_or(0);
        if waiting >= i64::from(args.waiting) && crs >= u64::from(args.waiting) {
            break;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Incomplete(format!(
                "after {} s only {waiting} of {} requests wait and {crs} CRs exist",
                inserted.elapsed().as_secs(),
                args.waiting
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let settle_s = inserted.elapsed().as_secs_f64();
    // The last statuses and Events of the attempts are written by now or in a moment.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let counting = stack.counts_statements();
    if counting {
        harness
            .reset_statement_counts()
            .await
            .map_err(StackError::from)?;
    }
    let writes_before = writes(stack).await?;
    let etcd_waiting = super::etcd_db_bytes(stack).await?;
    let server_before = stack.real().and_then(|r| r.cpu_seconds());
    let cpu_before: Vec<f64> = stack
        .replicas()
        .iter()
        .map(|r| r.cpu_seconds().unwrap_or(0.0))
        .collect();
    let http = reqwest::Client::new();
    let turns_before = turn_times(stack, &http).await;
    let started = Instant::now();
    tokio::time::sleep(args.window).await;
    stack.check_replicas()?;
    let window = started.elapsed().as_secs_f64();
    let by_kind = since(&writes(stack).await?, &writes_before);
    let control_plane = stack
        .real()
        .and_then(|r| r.cpu_seconds())
        .zip(server_before)
        .zip(etcd_empty.zip(etcd_waiting))
        .map(|((after, before), (empty, waiting))| ControlPlaneAtRest {
            apiserver_cpu_percent: (after.apiserver - before.apiserver) / window * 100.0,
            etcd_cpu_percent: (after.etcd - before.etcd) / window * 100.0,
            etcd_db_bytes: waiting,
            etcd_db_bytes_per_waiting_cr: (waiting as f64 - empty as f64) / f64::from(args.waiting),
        });
    let statements = if counting {
        Some(
            harness
                .statements_by(WORKER_ROLE)
                .await
                .map_err(StackError::from)?,
        )
    } else {
        None
    };
    let cpu_percent: Vec<f64> = stack
        .replicas()
        .iter()
        .zip(&cpu_before)
        .map(|(r, before)| (r.cpu_seconds().unwrap_or(*before) - before) / window * 100.0)
        .collect();
    let rss: Vec<u64> = stack
        .replicas()
        .iter()
        .map(|r| r.rss_bytes().unwrap_or(0))
        .collect();
    let discovery_turn_ms: Vec<f64> = turn_times(stack, &http)
        .await
        .iter()
        .zip(&turns_before)
        .map(|((sum, n), (sum0, n0))| {
            if n > n0 {
                (sum - sum0) / (n - n0) * 1000.0
            } else {
                f64::NAN
            }
        })
        .collect();

    // One replica restarts; the database changed nothing meanwhile but for
    // the approvable requests inserted to see its first approval.
    let name = names[0].clone();
    let before_restart = writes(stack).await?;
    stack.stop_replica(&name, Duration::from_secs(30)).await;
    let argv = replica_args(stack, &name);
    stack.spawn(Program::Controller, &name, &argv).await?;
    let restarted = Instant::now();
    stack.wait_ready(Some(args.shards)).await?;
    let ready_s = restarted.elapsed().as_secs_f64();
    let (mut last, mut quiet_since) = (reconciles_of(stack, &name, &http).await, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(300);
    while quiet_since.elapsed() < Duration::from_secs(3) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        stack.check_replicas()?;
        let now = reconciles_of(stack, &name, &http).await;
        if now != last {
            (last, quiet_since) = (now, Instant::now());
        }
    }
    let reconciled_s = (quiet_since - restarted).as_secs_f64();
    let restart_writes = since(&writes(stack).await?, &before_restart);

    // Once more, now with approvable requests coming in: its first approval.
    stack.stop_replica(&name, Duration::from_secs(30)).await;
    let argv = replica_args(stack, &name);
    let restarted = Instant::now();
    stack.spawn(Program::Controller, &name, &argv).await?;
    let first_approval_s =
        first_approval(stack, &name, restarted, Duration::from_secs(300)).await?;

    let total: u64 = by_kind.values().sum();
    Ok(AtRestReport {
        machine: super::report::machine(),
        replicas: args.replicas,
        shards: args.shards,
        waiting: args.waiting,
        window_s: window,
        kube_writes_per_s: total as f64 / window,
        kube_writes_per_s_by_kind: by_kind
            .into_iter()
            .map(|(k, n)| (k, n as f64 / window))
            .collect(),
        db_statements_per_s: statements.map(|n| n as f64 / window),
        cpu_percent,
        rss_mib: rss.iter().map(|b| *b as f64 / 1_048_576.0).collect(),
        rss_bytes_per_waiting_cr: rss
            .iter()
            .zip(&rss_empty)
            .map(|(at_rest, empty)| (*at_rest as f64 - *empty as f64) / f64::from(args.waiting))
            .collect(),
        settle_s,
        discovery_turn_ms,
        control_plane,
        restart: Restart {
            first_approval_s,
            ready_s,
            reconciled_s,
            reconciles: last,
            status_patches: restart_writes
                .get("patch autoapprovals")
                .copied()
                .unwrap_or(0),
            writes_by_kind: restart_writes,
        },
    })
}

fn table(r: &AtRestReport) -> String {
    let list = |v: &[f64], digits: usize| {
        v.iter()
            .map(|x| format!("{x:.digits$}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let mut out = format!(
        "| at rest ({} replicas, {} shards, {} waiting, {:.0} s) | |\n| --- | --- |\n",
        r.replicas, r.shards, r.waiting, r.window_s
    );
    out += &format!("| kube API writes / s | {:.2} |\n", r.kube_writes_per_s);
    for (kind, n) in &r.kube_writes_per_s_by_kind {
        out += &format!("| &nbsp; {kind} / s | {n:.2} |\n");
    }
    out += &format!(
        "| DB statements / s | {} |\n",
        r.db_statements_per_s
            .map_or("-".into(), |n| format!("{n:.2}"))
    );
    out += &format!("| CPU per replica | {} % |\n", list(&r.cpu_percent, 2));
    out += &format!("| RSS per replica | {} MiB |\n", list(&r.rss_mib, 1));
    out += &format!(
        "| RSS per waiting CR | {} bytes |\n",
        list(&r.rss_bytes_per_waiting_cr, 0)
    );
    out += &format!(
        "| time for every request to wait with its CR | {:.1} s |\n",
        r.settle_s
    );
    out += &format!(
        "| discovery turn, mean per replica | {} ms |\n",
        list(&r.discovery_turn_ms, 1)
    );
    if let Some(c) = &r.control_plane {
        out += &format!(
            "| kube-apiserver CPU | {:.2} % |\n| etcd CPU | {:.2} % |\n| etcd DB size | {:.1} MiB |\n| etcd DB growth per waiting CR | {:.0} bytes |\n",
            c.apiserver_cpu_percent,
            c.etcd_cpu_percent,
            c.etcd_db_bytes as f64 / 1_048_576.0,
            c.etcd_db_bytes_per_waiting_cr
        );
    }
    out += &format!(
        "| restart: first approval | {} |\n",
        r.restart
            .first_approval_s
            .map_or("none within 300 s".into(), |s| format!("{s:.1} s"))
    );
    out += &format!(
        "| restart: balanced again | {:.1} s |\n| restart: reconciles done (quiet 3 s) | {:.1} s, {} reconciles |\n| restart: status patches | {} |\n",
        r.restart.ready_s,
        r.restart.reconciled_s,
        r.restart.reconciles + 0.0, // an empty sum is -0.0
        r.restart.status_patches
    );
    out
}
