//! `autoapproval-lab bench`: one design, or (`--compare`) ours and the seed's
//! two, on the same throwaway stack and workload, one after the other. Each
//! run inserts owner contracts at a steady rate, waits until all are
//! approved, and reports pickup latency (eligible → claimed, in the
//! database's clock), throughput and what each approval cost.

pub mod at_rest;
pub mod plot;
pub mod report;
pub mod seed_designs;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use report::{DesignReport, Percentiles, Report, duplicate_creations};
use seed_designs::SeedDesign;

use crate::harness::{Harness, NewRequest};
use crate::stack::{Program, Stack, StackArgs, StackError, WORKER_ROLE, install_termination};
use autoapproval::domain::RequestType;
use autoapproval::flags::parse_duration;
use autoapproval::shutdown::Termination;
use autoapproval_sim::{Faults, SimConfig};

/// The designs `bench` can run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Design {
    /// This controller: shard Leases, NOTIFY wake-ups, CRs.
    Ours,
    /// The seed's new design: every replica polls, claims per request.
    SeedNew,
    /// The seed's old design: a queue filled and drained every 10 minutes by one runner.
    SeedOld,
}

impl Design {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Design::Ours => "ours",
            Design::SeedNew => SeedDesign::New.name(),
            Design::SeedOld => SeedDesign::Old.name(),
        }
    }
}

/// Arguments of `bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Where the stack comes from.
    #[command(flatten)]
    pub stack: StackArgs,
    /// The design to run (without --compare).
    #[arg(
        long,
        env = "AUTOAPPROVAL_BENCH_DESIGN",
        value_enum,
        default_value = "ours"
    )]
    pub design: Design,
    /// Run ours, seed-new and seed-old one after the other, print them side by side and plot them [default: off].
    #[arg(long, env = "AUTOAPPROVAL_BENCH_COMPARE", default_value_t = false)]
    pub compare: bool,
    /// Owner contracts inserted per run.
    #[arg(long, env = "AUTOAPPROVAL_BENCH_REQUESTS", default_value_t = 300)]
    pub requests: u32,
    /// Insert rate, requests per second.
    #[arg(long, env = "AUTOAPPROVAL_BENCH_RATE", default_value_t = 20.0)]
    pub rate: f64,
    /// Replicas (child processes) per design.
    #[arg(long, env = "AUTOAPPROVAL_BENCH_REPLICAS", default_value_t = 3)]
    pub replicas: u32,
    /// Simulated latency of every external call.
    #[arg(long, env = "AUTOAPPROVAL_BENCH_LATENCY", default_value = "20ms", value_parser = parse_duration)]
    pub latency: Duration,
    /// Poll period of ours and of seed-new, before --time-scale.
    #[arg(long, env = "AUTOAPPROVAL_BENCH_POLL_PERIOD", default_value = "10s", value_parser = parse_duration)]
    pub poll_period: Duration,
    /// NOTIFY wake-ups for ours.
    #[arg(long, env = "AUTOAPPROVAL_BENCH_NOTIFY", default_value_t = true, action = clap::ArgAction::Set)]
    pub notify: bool,
    /// Shards for ours.
    #[arg(long, env = "AUTOAPPROVAL_BENCH_SHARDS", default_value_t = 16)]
    pub shards: u32,
    /// Seed-old's 10-minute cycle is divided by this, so its run takes about a minute (10 s cycles at 60); the polls are not, unless --scale-polls.
    #[arg(long, env = "AUTOAPPROVAL_BENCH_TIME_SCALE", default_value_t = 60.0)]
    pub time_scale: f64,
    /// Divide ours' and seed-new's poll period by --time-scale too; it flatters seed-new, whose pickup its 10 s poll bounds, and adds poll turns to ours [default: off: both poll for real].
    #[arg(long, env = "AUTOAPPROVAL_BENCH_SCALE_POLLS", default_value_t = false)]
    pub scale_polls: bool,
    /// Instead of approvals: 3 replicas with --waiting requests waiting and nothing to do, measured for --window (API writes, statements, CPU, memory), then one replica restarted [default: off].
    #[arg(
        long,
        env = "AUTOAPPROVAL_BENCH_AT_REST",
        default_value_t = false,
        conflicts_with = "compare"
    )]
    pub at_rest: bool,
    /// With --at-rest: requests waiting (documents not released, so each waits its 10-minute retry).
    #[arg(long, env = "AUTOAPPROVAL_BENCH_WAITING", default_value_t = 5000)]
    pub waiting: u32,
    /// With --at-rest: how long the replicas are measured at rest.
    #[arg(long, env = "AUTOAPPROVAL_BENCH_WINDOW", default_value = "60s", value_parser = parse_duration)]
    pub window: Duration,
    /// Where the JSON report is written.
    #[arg(
        long,
        env = "AUTOAPPROVAL_BENCH_REPORT",
        default_value = "target/bench/report.json"
    )]
    pub report: PathBuf,
    /// Where --compare writes the SVG plot of the pickup latencies.
    #[arg(
        long,
        env = "AUTOAPPROVAL_BENCH_SVG",
        default_value = "docs/pickup-latency.svg"
    )]
    pub svg: PathBuf,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A setting is invalid.
    #[error("invalid setting {flag}: {message}")]
    Setting {
        /// The flag.
        flag: &'static str,
        /// Why.
        message: String,
    },
    /// The stack failed.
    #[error(transparent)]
    Stack(#[from] StackError),
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A design left requests unapproved or created something twice.
    #[error("{0}")]
    Incomplete(String),
    /// Ctrl-C or SIGTERM.
    #[error("interrupted; everything the benchmark started is stopped")]
    Interrupted,
}

impl BenchArgs {
    fn validate(&self) -> Result<(), BenchError> {
        let bad = |flag, message: &str| {
            Err(BenchError::Setting {
                flag,
                message: message.into(),
            })
        };
        if self.requests == 0 {
            return bad("--requests", "must be at least 1");
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return bad("--rate", "must be a positive number");
        }
        if self.replicas == 0 {
            return bad("--replicas", "must be at least 1");
        }
        if self.shards == 0 {
            return bad("--shards", "must be at least 1");
        }
        if !(self.time_scale.is_finite() && self.time_scale >= 1.0) {
            return bad("--time-scale", "must be a number of at least 1");
        }
        if self.poll_period.is_zero() {
            return bad("--poll-period", "must be above zero");
        }
        if self.at_rest && self.waiting == 0 {
            return bad("--waiting", "must be at least 1");
        }
        if self.at_rest && self.window < Duration::from_secs(1) {
            return bad("--window", "must be at least 1s");
        }
        Ok(())
    }

    /// The poll period ours and seed-new run with.
    fn poll(&self) -> Duration {
        if self.scale_polls {
            self.poll_period.div_f64(self.time_scale)
        } else {
            self.poll_period
        }
    }

    /// What is scaled, as the output says it.
    fn scaling(&self) -> String {
        if self.scale_polls {
            format!("every period / {}", self.time_scale)
        } else {
            format!(
                "seed-old's cycle / {} ({} s); polls unscaled",
                self.time_scale,
                600.0 / self.time_scale
            )
        }
    }

    fn designs(&self) -> Vec<Design> {
        if self.compare {
            vec![Design::Ours, Design::SeedNew, Design::SeedOld]
        } else {
            vec![self.design]
        }
    }

    /// The parameters as the report records them.
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": self.requests,
            "rate_per_s": self.rate,
            "replicas": self.replicas,
            "external_latency_ms": self.latency.as_secs_f64() * 1000.0,
            "poll_period_s": self.poll_period.as_secs_f64(),
            "notify": self.notify,
            "shards": self.shards,
            "time_scale": self.time_scale,
            "scale_polls": self.scale_polls,
            "poll_period_run_ms": self.poll().as_secs_f64() * 1000.0,
            "scaled_seed_old_cycle_s": 600.0 / self.time_scale,
        })
    }
}

/// Runs the benchmark, prints the summary, writes the report (and the plot
/// with `--compare`).
pub async fn run(args: BenchArgs) -> Result<(), BenchError> {
    args.validate()?;
    let mut interrupt = install_termination()?;
    if args.at_rest {
        return at_rest::run(&args, &mut interrupt).await;
    }
    let mut designs = Vec::new();
    for design in args.designs() {
        println!(
            "{}: {} owner contracts at {}/s, {} replicas, {} ms per external call, {}",
            design.name(),
            args.requests,
            args.rate,
            args.replicas,
            args.latency.as_millis(),
            args.scaling()
        );
        let report = run_design(&args, design, &mut interrupt).await?;
        println!(
            "  approved {}/{}; pickup p99 {}",
            report.approved,
            report.requests,
            report
                .pickup_ms
                .map_or("-".into(), |p| format!("{:.1} ms", p.p99))
        );
        designs.push(report);
    }
    let report = Report::new(args.parameters(), designs);
    println!("\n{}", report.table());
    let json = serde_json::to_string_pretty(&report).map_err(|e| BenchError::Write {
        path: args.report.display().to_string(),
        source: e.into(),
    })?;
    write(&args.report, &json)?;
    println!("report: {}", args.report.display());
    if args.compare {
        let subtitle = format!(
            "{} owner contracts at {}/s, {} replicas each, {} ms per external call, {}\n{}, {} build: autoapproval-lab bench --compare",
            args.requests,
            args.rate,
            args.replicas,
            args.latency.as_millis(),
            args.scaling(),
            report.machine,
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
        );
        write(&args.svg, &plot::cdf_svg(&report.designs, &subtitle))?;
        println!("plot: {}", args.svg.display());
    }
    let problems: Vec<String> = report
        .designs
        .iter()
        .filter(|d| d.approved < d.requests || d.duplicate_creations > 0)
        .map(|d| {
            format!(
                "{}: {} of {} approved, {} duplicate creations",
                d.design, d.approved, d.requests, d.duplicate_creations
            )
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(BenchError::Incomplete(problems.join("; ")))
    }
}

fn write(path: &std::path::Path, text: &str) -> Result<(), BenchError> {
    let fail = |source| BenchError::Write {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    std::fs::write(path, text).map_err(fail)
}

/// One design on a stack of its own, which is removed afterwards, also when
/// interrupted.
async fn run_design(
    args: &BenchArgs,
    design: Design,
    interrupt: &mut Termination,
) -> Result<DesignReport, BenchError> {
    let sim = SimConfig {
        faults: Faults {
            latency: args.latency,
            ..Faults::default()
        },
        ..SimConfig::default()
    };
    let mut stack = Stack::start(&args.stack, "bench", sim).await?;
    let result = if interrupt.caught() {
        Err(BenchError::Interrupted)
    } else {
        tokio::select! {
            result = measure(&mut stack, args, design) => result,
            () = interrupt.recv() => Err(BenchError::Interrupted),
        }
    };
    if result.is_err() && !matches!(result, Err(BenchError::Interrupted)) {
        println!("logs kept in {}", stack.dir().display());
    }
    stack
        .shutdown(result.is_err() && !matches!(result, Err(BenchError::Interrupted)))
        .await;
    result
}

async fn measure(
    stack: &mut Stack,
    args: &BenchArgs,
    design: Design,
) -> Result<DesignReport, BenchError> {
    let poll = args.poll();
    for i in 0..args.replicas {
        let name = format!("{}-{i}", design.name());
        let (program, argv): (Program, Vec<String>) = match design {
            Design::Ours => (Program::Controller, ours_argv(stack, args, &name, poll)),
            Design::SeedNew | Design::SeedOld => (
                Program::Lab,
                vec![
                    "seed-design".into(),
                    "--design".into(),
                    if design == Design::SeedNew {
                        "new"
                    } else {
                        "old"
                    }
                    .into(),
                    "--replica-name".into(),
                    name.clone(),
                    // seed-design divides every period by its time scale;
                    // seed-new's only period is its poll.
                    "--time-scale".into(),
                    if design == Design::SeedNew && !args.scale_polls {
                        "1".into()
                    } else {
                        args.time_scale.to_string()
                    },
                    "--poll-period".into(),
                    format!("{}ms", args.poll_period.as_millis()),
                ],
            ),
        };
        stack.spawn(program, &name, &argv).await?;
    }
    stack
        .wait_ready((design == Design::Ours).then_some(args.shards))
        .await?;

    let http = reqwest::Client::new();
    let cpu_before: Vec<f64> = stack
        .replicas()
        .iter()
        .map(|r| r.cpu_seconds().unwrap_or(0.0))
        .collect();
    let postgres_before = stack.postgres_cpu_seconds();
    let lab_before = crate::stack::replicas::cpu_seconds(std::process::id());
    let writes_before = stack.apiserver().map_or(0, |s| s.write_count());
    let calls_before = sim_calls(stack);
    let lost_before = stack.failed_claims(&http).await;
    let harness = stack.harness()?.clone();
    let counting = stack.counts_statements();
    if counting {
        harness
            .reset_statement_counts()
            .await
            .map_err(StackError::from)?;
    }

    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    for i in 0..args.requests {
        tokio::time::sleep_until((started + interval * i).into()).await;
        insert_owner(&harness, format!("Shop {i}"), true).await?;
    }
    // The slowest design needs up to 1.3 of its cycles after the last insert.
    let drain = Duration::from_secs(600).div_f64(args.time_scale) * 2
        + args.poll() * 3
        + Duration::from_secs(60);
    let deadline = Instant::now() + drain;
    loop {
        stack.check_replicas()?;
        let span = harness
            .approval_span("autoapproval")
            .await
            .map_err(StackError::from)?;
        if span.approved >= i64::from(args.requests) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let cpu: f64 = stack
        .replicas()
        .iter()
        .zip(&cpu_before)
        .map(|(r, before)| r.cpu_seconds().unwrap_or(*before) - before)
        .sum();
    let (statements, top) = if counting {
        let n = harness.statements_by(WORKER_ROLE).await;
        let top = harness.top_statements(WORKER_ROLE, 12).await;
        (
            Some(n.map_err(StackError::from)?),
            top.map_err(StackError::from)?,
        )
    } else {
        (None, Vec::new())
    };
    let postgres_cpu = stack
        .postgres_cpu_seconds()
        .zip(postgres_before)
        .map(|(after, before)| after - before);
    let lab_cpu = crate::stack::replicas::cpu_seconds(std::process::id())
        .zip(lab_before)
        .map(|(after, before)| after - before);
    let writes = stack.apiserver().map_or(0, |s| s.write_count()) - writes_before;
    let calls = sim_calls(stack) - calls_before;
    let lost = stack.failed_claims(&http).await - lost_before;
    let span = harness
        .approval_span("autoapproval")
        .await
        .map_err(StackError::from)?;
    let samples = harness.pickups_ms().await.map_err(StackError::from)?;
    let approved = span.approved.max(0) as u64;
    let per = |n: f64| {
        if approved == 0 {
            0.0
        } else {
            n / approved as f64
        }
    };
    Ok(DesignReport {
        design: design.name().into(),
        requests: u64::from(args.requests),
        approved,
        pickup_ms: Percentiles::of(&samples),
        pickup_samples_ms: samples,
        throughput_per_s: if span.seconds > 0.0 {
            approved as f64 / span.seconds
        } else {
            0.0
        },
        cpu_seconds_per_1000: per(cpu) * 1000.0,
        postgres_cpu_seconds_per_1000: postgres_cpu.map(|c| per(c) * 1000.0),
        lab_cpu_seconds_per_1000: lab_cpu.map(|c| per(c) * 1000.0),
        db_statements_per_approval: statements.map(|s| per(s as f64)),
        db_statements_top: top,
        kube_writes_per_approval: per(writes as f64),
        external_calls_per_approval: per(calls as f64),
        duplicate_creations: stack.sim().map_or(0, |s| duplicate_creations(&s.stats())),
        failed_claims: lost.max(0.0) as u64,
    })
}

/// The command line of one of our replicas: the stack's, then the
/// benchmark's shards, poll period and NOTIFY.
fn ours_argv(stack: &Stack, args: &BenchArgs, name: &str, poll: Duration) -> Vec<String> {
    [
        stack.run_args(name),
        vec![
            "--shards".into(),
            args.shards.to_string(),
            "--poll-period".into(),
            format!("{}ms", poll.as_millis().max(1)),
            "--notify".into(),
            args.notify.to_string(),
        ],
    ]
    .concat()
}

fn sim_calls(stack: &Stack) -> u64 {
    stack
        .sim()
        .map_or(0, |s| s.stats().calls.values().sum::<u64>())
}

/// Inserts one owner contract, its documents released or not.
pub(crate) async fn insert_owner(
    harness: &Harness,
    business_name: String,
    documents_released: bool,
) -> Result<i64, StackError> {
    let request = NewRequest {
        request_type: RequestType::OwnerContract,
        business_name,
        documents_released,
        target_store_number: None,
    };
    Ok(harness.insert_request(&request).await?)
}
