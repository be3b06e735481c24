//! The seed's two designs, as baselines the benchmark runs on the same
//! components as ours (`autoapproval-lab seed-design`, a hidden subcommand):
//!
//! - **old**: a collector at minute 7 of every 10 fills a queue table, a
//!   processor at minute 0 of every 10 drains it; each under a ShedLock-style
//!   lock, so one runner works however many replicas run;
//! - **new**: every replica polls every 10 s with a fixed delay after a
//!   random first delay, claims per request, and queries again (up to three
//!   rounds a turn) when a round claimed nothing.
//!
//! On PostgreSQL both run the same chain, claims and store as ours
//! ([`Approver`]); only how work is found differs. On MariaDB the new design
//! is the seed's own, claims included: a Redis lock per request, a re-check
//! on the writer and a ShedLock-style cleanser ([`super::seed_redis`]); the
//! old design's schedulers take ShedLock's table there. Periods are
//! divided by `--time-scale`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use chrono::Utc;
use tracing::{info, warn};

use autoapproval::approval::{Approver, TurnConfig, attempt_all, run_turn};
use autoapproval::clock::SystemClock;
use autoapproval::controller::config::{ControllerConfig, SettingError};
use autoapproval::db::{Database, DatabaseArgs, DbError, Pool, SessionArgs};
use autoapproval::domain::{Candidate, Fence, RequestType};
use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::flags::parse_duration;
use autoapproval::processors::Chain;
use autoapproval::shutdown::Termination;
use autoapproval::telemetry::Metrics;

use super::seed_redis::{self, FailedClaims, RedisLocks, SeedWorker};
use crate::harness::SeedQueue;

/// Which of the seed's designs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeedDesign {
    /// Collector at minute 7, processor at minute 0, every 10 minutes, one runner.
    Old,
    /// Every replica polls every 10 s, fixed delay, random start, up to 3 rounds.
    New,
}

impl SeedDesign {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            SeedDesign::Old => "seed-old",
            SeedDesign::New => "seed-new",
        }
    }
}

/// Arguments of the hidden `seed-design` subcommand (started by `bench`).
#[derive(clap::Args, Clone, Debug)]
pub struct SeedDesignArgs {
    /// The design to run.
    #[arg(long, value_enum)]
    pub design: SeedDesign,
    /// The database.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The external systems.
    #[command(flatten)]
    pub external: ExternalArgs,
    /// This replica's name (the claims' holder).
    #[arg(long, default_value = "seed")]
    pub replica_name: String,
    /// Where `/metrics` is served.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Every period is divided by this (1: the seed's own 10 s and 10 min).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// The new design's poll period before scaling.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub poll_period: Duration,
    /// Attempts run at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Redis of the new design's per-request locks (MariaDB only).
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// Prefix of the Redis lock keys, one per run so runs never share a lock.
    #[arg(long, default_value = "autoapproval-lab")]
    pub lock_prefix: String,
    /// A Redis lock expires after this, far above one chain's run.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub lock_ttl: Duration,
    /// The new design's cleanser runs this often, before scaling (MariaDB only).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub cleanse_period: Duration,
    /// The cleanser revives a claim untouched this long.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub stuck_after: Duration,
}

/// Why a seed design stopped.
#[derive(Debug, thiserror::Error)]
pub enum SeedDesignError {
    /// A setting is invalid.
    #[error("invalid setting {flag}: {message}")]
    Setting {
        /// The flag.
        flag: &'static str,
        /// Why.
        message: String,
    },
    /// The store failed.
    #[error(transparent)]
    Database(#[from] DbError),
    /// The endpoints could not be served.
    #[error("serving {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The SIGTERM and Ctrl-C handlers could not be installed.
    #[error("installing the SIGTERM and Ctrl-C handlers: {0}")]
    Signal(#[source] std::io::Error),
    /// The controller's defaults, which the designs share, are invalid.
    #[error(transparent)]
    Defaults(#[from] SettingError),
    /// The new design's Redis failed.
    #[error(transparent)]
    Redis(#[from] seed_redis::SeedRedisError),
}

/// The seed's cycle of the old design: 10 minutes; the collector runs 7 minutes in.
const OLD_CYCLE: Duration = Duration::from_secs(600);
const OLD_COLLECTOR_OFFSET: f64 = 0.7;
/// Lock names of the old design's two schedulers.
const COLLECTOR_LOCK: &str = "autoApproveEnqueue";
const PROCESSOR_LOCK: &str = "autoApproveProcess";
use seed_redis::MAX_ROUNDS;

/// Runs the design until SIGTERM.
pub async fn run(args: SeedDesignArgs) -> Result<(), SeedDesignError> {
    let mut termination = Termination::install().map_err(SeedDesignError::Signal)?;
    if !(args.time_scale.is_finite() && args.time_scale > 0.0) {
        return Err(SeedDesignError::Setting {
            flag: "--time-scale",
            message: format!("must be a positive number, got {}", args.time_scale),
        });
    }
    let external =
        HttpExternalSystems::build(&args.external).map_err(|e| SeedDesignError::Setting {
            flag: "--*-url",
            message: e.to_string(),
        })?;
    // The same session limits as ours, at their defaults.
    let session = autoapproval::flags::defaults_of::<SessionArgs>().map_err(|e| {
        SeedDesignError::Setting {
            flag: "--db-*-timeout",
            message: e.to_string(),
        }
    })?;
    let store = Database::connect(&args.database, Some(&session)).await?;
    let metrics = Metrics::new();
    let failed = Arc::new(FailedClaims::default());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|source| SeedDesignError::Listen {
            addr: args.listen,
            source,
        })?;
    let (served, served_failed) = (metrics.clone(), failed.clone());
    let app = Router::new().route(
        "/metrics",
        get(move || async move { served.encode() + &served_failed.encode() }),
    );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            warn!(%error, "metrics endpoint stopped");
        }
    });
    // The same attempt settings and candidate queries as ours by default.
    let defaults = ControllerConfig::defaults("", args.replica_name.clone())?;
    let approver = Arc::new(Approver::new(
        store.clone(),
        external.clone(),
        Arc::new(SystemClock),
        metrics.clone(),
        defaults.approver.clone(),
    ));
    let turn = TurnConfig {
        concurrency: args.concurrency,
        ..defaults.discovery.turn
    };
    // Outside shard coordination, as the seed's workers were.
    let fence = Fence::new(args.replica_name.clone(), 0);
    let scale = |d: Duration| d.div_f64(args.time_scale);
    info!(design = args.design.name(), replica = %args.replica_name, "seed design running");
    let queue = SeedQueue::new(store.primary_pool());
    let holder = args.replica_name.as_str();
    let work = async {
        match (args.design, store.primary_pool()) {
            (SeedDesign::New, Pool::Mysql(writer)) => {
                let locks =
                    RedisLocks::connect(&args.redis_url, &args.lock_prefix, args.lock_ttl).await?;
                let worker = SeedWorker {
                    store: store.clone(),
                    writer,
                    external,
                    metrics,
                    locks,
                    failed,
                    holder: holder.to_owned(),
                    turn: turn.clone(),
                    retry: defaults.approver.retry.clone(),
                    chain: Chain::default(),
                };
                let cleanse = scale(args.cleanse_period);
                tokio::join!(
                    seed_redis::poll_loop(&worker, scale(args.poll_period)),
                    seed_redis::cleanser(&store, &queue, holder, cleanse, args.stuck_after),
                );
                Ok(())
            }
            (SeedDesign::New, Pool::Postgres(_)) => {
                poll_loop(&approver, &fence, scale(args.poll_period), &turn).await
            }
            (SeedDesign::Old, _) => {
                let cycle = scale(OLD_CYCLE);
                tokio::try_join!(
                    scheduled(
                        cycle,
                        OLD_COLLECTOR_OFFSET,
                        COLLECTOR_LOCK,
                        &queue,
                        holder,
                        || { collect(&approver, &queue, &turn) }
                    ),
                    scheduled(cycle, 0.0, PROCESSOR_LOCK, &queue, holder, || {
                        process(&approver, &queue, &fence, args.concurrency)
                    }),
                )
                .map(|_| ())
            }
        }
    };
    tokio::select! {
        result = work => result,
        () = termination.recv() => Ok(()),
    }
}

/// The new design: a random first delay up to one period, then turns with
/// a fixed delay between the end of one and the start of the next.
async fn poll_loop(
    approver: &Arc<Approver>,
    fence: &Fence,
    period: Duration,
    turn: &TurnConfig,
) -> Result<(), SeedDesignError> {
    tokio::time::sleep(period.mul_f64(rand::random::<f64>())).await;
    loop {
        for _ in 0..MAX_ROUNDS {
            match run_turn(approver, turn, fence, None).await {
                // Nothing to do, or something claimed: the turn is over.
                Ok(report) if report.candidates == 0 || report.claimed() > 0 => break,
                Ok(_) => continue,
                Err(error) => {
                    warn!(%error, "poll turn failed");
                    break;
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}

/// Runs `job` at `offset` × `cycle` into every cycle of the wall clock (as
/// cron would on every replica), when this replica wins the lock `name`.
async fn scheduled<F, Fut>(
    cycle: Duration,
    offset: f64,
    name: &str,
    locks: &SeedQueue,
    holder: &str,
    job: F,
) -> Result<(), SeedDesignError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), DbError>>,
{
    loop {
        tokio::time::sleep(until_next(cycle, offset)).await;
        let lock = match locks.try_lock(name, holder, cycle).await {
            Ok(Some(lock)) => lock,
            Ok(None) => continue,
            Err(error) => {
                warn!(%error, "could not take the scheduler lock");
                continue;
            }
        };
        if let Err(error) = job().await {
            warn!(%error, "scheduled job failed");
        }
        // Held for at least half a cycle: a replica whose schedule fires a
        // little later does not run the job again.
        locks.unlock(lock, holder, cycle / 2).await?;
    }
}

/// Time until the next instant that is `offset` × `cycle` past a multiple
/// of `cycle` since the Unix epoch.
fn until_next(cycle: Duration, offset: f64) -> Duration {
    let cycle_ms = cycle.as_millis().max(1) as i64;
    let offset_ms = (offset * cycle_ms as f64) as i64;
    let now_ms = Utc::now().timestamp_millis();
    let into = (now_ms - offset_ms).rem_euclid(cycle_ms);
    Duration::from_millis((cycle_ms - into) as u64)
}

/// The collector: every candidate of every auto-approvable type into the queue.
async fn collect(
    approver: &Arc<Approver>,
    queue: &SeedQueue,
    turn: &TurnConfig,
) -> Result<(), DbError> {
    let turn = TurnConfig {
        owner_limit: 100_000,
        ad_limit: 100_000,
        ..turn.clone()
    };
    let now = Utc::now();
    let mut candidates = Vec::new();
    for request_type in RequestType::AUTO_APPROVABLE {
        let query = turn.query(request_type, now, approver.config().retry.limit, None);
        candidates.extend(approver.database().candidates(&query).await?);
    }
    let queued = queue.enqueue(&candidates).await?;
    info!(candidates = candidates.len(), queued, "collector ran");
    Ok(())
}

/// The processor: drains the queue, `concurrency` attempts at a time.
async fn process(
    approver: &Arc<Approver>,
    queue: &SeedQueue,
    fence: &Fence,
    concurrency: usize,
) -> Result<(), DbError> {
    loop {
        let batch = queue.queued(100).await?;
        if batch.is_empty() {
            return Ok(());
        }
        let mut candidates = Vec::with_capacity(batch.len());
        for (_, request_id, request_type) in &batch {
            let Ok(request_type) = request_type.parse::<RequestType>() else {
                warn!(request_id, %request_type, "queued request of an unknown type skipped");
                continue;
            };
            // A due retry is claimed through its state row.
            let state_id = approver.database().state(*request_id).await?.map(|s| s.id);
            candidates.push(Candidate {
                request_id: *request_id,
                request_type,
                state_id,
            });
        }
        let report = attempt_all(approver, &candidates, fence, concurrency).await;
        info!(
            attempted = report.candidates,
            claimed = report.claimed(),
            "processor batch"
        );
        for (id, _, _) in &batch {
            queue.done(*id).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_run_is_at_the_offset_within_one_cycle() {
        let cycle = Duration::from_secs(20);
        for offset in [0.0, 0.7] {
            let wait = until_next(cycle, offset);
            assert!(wait > Duration::ZERO && wait <= cycle, "{wait:?}");
            let at = Utc::now().timestamp_millis() + wait.as_millis() as i64;
            let phase = (at - (offset * 20_000.0) as i64).rem_euclid(20_000);
            // Within the few milliseconds this test takes.
            assert!(!(50..=19_950).contains(&phase), "phase {phase} ms");
        }
    }
}
