//! `autoapproval-lab bench`: one design, or (`--compare`) ours and the seed's
//! two, on the same throwaway stack and workload, one after the other; with
//! `--database mysql` the stack is a MariaDB, the seed's new design is its
//! own (Redis locks), and `--compare` also runs ours on PostgreSQL, so one
//! run holds the figures of both backends. Each
//! run inserts owner contracts at a steady rate, waits until all are
//! approved, and reports pickup latency (eligible → claimed, in the
//! database's clock), throughput and what each approval cost.

pub mod at_rest;
pub mod plot;
pub mod report;
pub mod seed_designs;
pub mod seed_redis;
pub mod shadow_run;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use report::{ControlPlaneCost, DesignReport, Percentiles, Report, duplicate_creations};
use seed_designs::SeedDesign;

use crate::harness::{Harness, NewRequest};
use crate::stack::{
    ControlPlaneKind, Database, Program, Stack, StackArgs, StackError, WORKER_ROLE,
    install_termination,
};
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
    /// Instead of approvals: seed-new as the scheduler in place beside ours in --mode shadow on 3/4 of --requests (the report's figures, ours' creations and business writes, both zero), then seed-new stops and ours in --mode active approves the rest; PostgreSQL only [default: off].
    #[arg(
        long,
        env = "AUTOAPPROVAL_BENCH_SHADOW",
        default_value_t = false,
        conflicts_with_all = ["compare", "at_rest"]
    )]
    pub shadow: bool,
    /// With --at-rest: requests waiting (documents not released, so each waits its 10-minute retry).
    #[arg(long, env = "AUTOAPPROVAL_BENCH_WAITING", default_value_t = 5000)]
    pub waiting: u32,
    /// With --at-rest: the replicas' --condition-retry-interval; unset, the controller's default
    /// (10m). A short one compresses a long run: 3,000 waiting at 60s retry as many per second
    /// as 30,000 at 10m.
    #[arg(long, env = "AUTOAPPROVAL_BENCH_CONDITION_RETRY_INTERVAL", value_parser = parse_duration)]
    pub condition_retry_interval: Option<Duration>,
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
    /// Redis of seed-new's per-request locks with --database mysql.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
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

    /// The designs to run, each with its database: `--compare` on MariaDB
    /// also runs ours on PostgreSQL (NOTIFY), second, for the comparison.
    fn designs(&self) -> Vec<(Design, Database)> {
        let db = self.stack.database;
        match (self.compare, db) {
            (false, _) => vec![(self.design, db)],
            (true, Database::Postgres) => vec![
                (Design::Ours, db),
                (Design::SeedNew, db),
                (Design::SeedOld, db),
            ],
            (true, Database::Mysql) => vec![
                (Design::Ours, db),
                (Design::Ours, Database::Postgres),
                (Design::SeedNew, db),
                (Design::SeedOld, db),
            ],
        }
    }

    /// The parameters as the report records them.
    fn parameters(&self) -> serde_json::Value {
        let mut parameters = serde_json::json!({
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
            "database": self.stack.database.name(),
            "wake_poll_interval_ms": (self.stack.database == Database::Mysql).then_some(250),
            "read_replica": false,
        });
        // The in-memory run's report stays as it was.
        if self.stack.control_plane == ControlPlaneKind::Real {
            parameters["control_plane"] = "kube-apiserver + etcd".into();
        }
        parameters
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
    if args.shadow {
        return shadow_run::run(&args, &mut interrupt).await;
    }
    if args.stack.database == Database::Mysql {
        println!("{MYSQL_NOTE}");
    }
    let mut designs = Vec::new();
    for (design, database) in args.designs() {
        println!(
            "{} on {}: {} owner contracts at {}/s, {} replicas, {} ms per external call, {}",
            design.name(),
            on(design, database),
            args.requests,
            args.rate,
            args.replicas,
            args.latency.as_millis(),
            args.scaling()
        );
        let report = run_design(&args, design, database, &mut interrupt).await?;
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
        .filter(|d| {
            d.approved < d.requests || d.duplicate_creations > 0 || d.overlapping_creations > 0
        })
        .map(|d| {
            format!(
                "{}: {} of {} approved, {} duplicate creations, {} overlapping",
                d.design, d.approved, d.requests, d.duplicate_creations, d.overlapping_creations
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

/// How the MariaDB runs differ from the PostgreSQL ones, printed first.
const MYSQL_NOTE: &str = "on MariaDB: ours wakes by polling the wake table every 250 ms (no NOTIFY); \
candidates are read from the primary, as on PostgreSQL, whose stack has no read replica \
either, so seed-new's stale candidates are those read before another replica's claim, \
not replica lag; seed-new locks each request in Redis (SET NX PX), as the seed did";

/// What a design runs on, as the output names it.
fn on(design: Design, database: Database) -> &'static str {
    match (design, database) {
        (_, Database::Postgres) => "PostgreSQL",
        (Design::SeedNew, Database::Mysql) => "MariaDB + Redis",
        (_, Database::Mysql) => "MariaDB",
    }
}

/// The design's name in the report: the database is named when a run
/// holds the same design on both.
fn label(args: &BenchArgs, design: Design, database: Database) -> String {
    if args.compare && args.stack.database == Database::Mysql && design == Design::Ours {
        match database {
            Database::Mysql => "ours-mariadb".into(),
            Database::Postgres => "ours-postgres".into(),
        }
    } else {
        design.name().into()
    }
}

/// One design on a stack of its own, which is removed afterwards, also when
/// interrupted.
async fn run_design(
    args: &BenchArgs,
    design: Design,
    database: Database,
    interrupt: &mut Termination,
) -> Result<DesignReport, BenchError> {
    let sim = SimConfig {
        faults: Faults {
            latency: args.latency,
            ..Faults::default()
        },
        ..SimConfig::default()
    };
    if design == Design::SeedNew && database == Database::Mysql {
        check_redis(&args.redis_url).await?;
    }
    let stack_args = StackArgs {
        database,
        ..args.stack.clone()
    };
    let mut stack = Stack::start(&stack_args, "bench", sim).await?;
    let result = if interrupt.caught() {
        Err(BenchError::Interrupted)
    } else {
        tokio::select! {
            result = measure(&mut stack, args, design) => result.map(|mut report| {
                report.design = label(args, design, database);
                report.database = on(design, database).into();
                report
            }),
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

/// Fails, naming the fix, when seed-new's Redis does not answer.
async fn check_redis(url: &str) -> Result<(), BenchError> {
    let answer = async {
        let locks =
            seed_redis::RedisLocks::connect(url, "autoapproval-lab-check", Duration::from_secs(1))
                .await?;
        locks.ping().await
    };
    answer.await.map_err(|e| BenchError::Setting {
        flag: "--redis-url",
        message: format!(
            "{e}; seed-new on MariaDB takes its locks in Redis: start one (scripts/redis.sh) or name it"
        ),
    })
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
                    "--redis-url".into(),
                    args.redis_url.clone(),
                    // The locks of one run only.
                    "--lock-prefix".into(),
                    format!(
                        "autoapproval-lab-{}-{:08x}",
                        std::process::id(),
                        rand::random::<u32>()
                    ),
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
    let database_before = stack.database_cpu_seconds();
    let lab_before = crate::stack::replicas::cpu_seconds(std::process::id());
    let writes_before = write_count(stack).await?;
    let server_before = stack.real().and_then(|r| r.cpu_seconds());
    let etcd_before = etcd_db_bytes(stack).await?;
    let calls_before = sim_calls(stack);
    let failed_before = stack.failed_claims(&http).await;
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
    let database_cpu = stack
        .database_cpu_seconds()
        .zip(database_before)
        .map(|(after, before)| after - before);
    let lab_cpu = crate::stack::replicas::cpu_seconds(std::process::id())
        .zip(lab_before)
        .map(|(after, before)| after - before);
    let writes = write_count(stack).await?.saturating_sub(writes_before);
    let server_cpu = stack
        .real()
        .and_then(|r| r.cpu_seconds())
        .zip(server_before)
        .map(|(after, before)| (after.apiserver - before.apiserver, after.etcd - before.etcd));
    let etcd_after = etcd_db_bytes(stack).await?;
    let calls = sim_calls(stack) - calls_before;
    let failed = stack.failed_claims(&http).await;
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
        database_cpu_seconds_per_1000: database_cpu.map(|c| per(c) * 1000.0),
        lab_cpu_seconds_per_1000: lab_cpu.map(|c| per(c) * 1000.0),
        db_statements_per_approval: statements.map(|s| per(s as f64)),
        db_statements_top: top,
        kube_writes_per_approval: per(writes as f64),
        control_plane: server_cpu.zip(etcd_before.zip(etcd_after)).map(
            |((apiserver, etcd), (before, after))| ControlPlaneCost {
                apiserver_cpu_seconds_per_1000: per(apiserver) * 1000.0,
                etcd_cpu_seconds_per_1000: per(etcd) * 1000.0,
                etcd_db_growth_bytes_per_1000: per(after as f64 - before as f64) * 1000.0,
                etcd_db_bytes: after,
            },
        ),
        external_calls_per_approval: per(calls as f64),
        duplicate_creations: stack.sim().map_or(0, |s| duplicate_creations(&s.stats())),
        overlapping_creations: stack.sim().map_or(0, |s| s.stats().overlapping_creations),
        failed_claims: failed
            .iter()
            .map(|(reason, n)| {
                let before = failed_before.get(reason).copied().unwrap_or(0.0);
                (reason.clone(), (n - before).max(0.0) as u64)
            })
            .collect(),
        database: String::new(),
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

/// API writes so far, every kind.
async fn write_count(stack: &Stack) -> Result<u64, StackError> {
    Ok(stack.api_writes().await?.values().sum())
}

/// etcd's database size now, on the real control plane.
async fn etcd_db_bytes(stack: &Stack) -> Result<Option<u64>, StackError> {
    match stack.real() {
        Some(real) => Ok(Some(real.etcd_db_bytes().await?)),
        None => Ok(None),
    }
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
