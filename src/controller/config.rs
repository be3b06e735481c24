//! The settings of `autoapproval run`: a flag and an environment variable
//! for each, validated at start-up with a message naming the bad value.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::approval::{ApproverConfig, TurnConfig};
use crate::db::{DatabaseArgs, SessionArgs};
use crate::external::http::ExternalArgs;
pub use crate::flags::SettingError;
use crate::flags::{format_duration, parse_duration};
use crate::retry::RetryPolicy;

use super::discovery::DiscoveryConfig;
use super::gc::{Abandonment, GcConfig};
use super::reconcile::ReconcileConfig;
use crate::census::CensusConfig;
use crate::coordination::CoordinationConfig;

/// Arguments of `run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// The primary and the optional read replica.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Limits on each of the controller's statements.
    #[command(flatten)]
    pub session: SessionArgs,
    /// The external systems.
    #[command(flatten)]
    pub external: ExternalArgs,
    /// The controller.
    #[command(flatten)]
    pub controller: ControllerArgs,
    /// The spans' export.
    #[command(flatten)]
    pub tracing: crate::traces::TracingArgs,
}

/// The controller's own settings.
#[derive(clap::Args, Clone, Debug)]
pub struct ControllerArgs {
    /// Kubeconfig to use [default: in-cluster service account, else $KUBECONFIG or ~/.kube/config].
    #[arg(long, env = "AUTOAPPROVAL_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the AutoApproval CRs, Events and Leases [default: the pod's namespace ($POD_NAMESPACE or the service account's), else the kubeconfig's].
    #[arg(long, env = "AUTOAPPROVAL_NAMESPACE")]
    pub namespace: Option<String>,
    /// This replica's name in claims, Leases and Events, unique among the replicas: a replica whose name another live replica's member Lease holds refuses to start [default: $POD_NAME, else the host name].
    #[arg(long, env = "AUTOAPPROVAL_REPLICA_NAME")]
    pub replica_name: Option<String>,
    /// The fleet this replica belongs to: the database records the first fleet's name, and a replica of another fleet refuses to start (one fleet per database; a DR cluster's replicas use the same name) [default: the namespace].
    #[arg(long, env = "AUTOAPPROVAL_FLEET")]
    pub fleet: Option<String>,
    /// active: approve (create the owner, store and campaign, write the request); shadow: do everything else, beside the scheduler in place, and only record what would have been done (`autoapproval shadow-report` compares it with what happened). Switching needs no migration.
    #[arg(long, env = "AUTOAPPROVAL_MODE", value_enum, default_value_t = crate::approval::Mode::Active)]
    pub mode: crate::approval::Mode,
    /// Address of the /healthz, /readyz and /metrics endpoints.
    #[arg(long, env = "AUTOAPPROVAL_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Delay between discovery turns (fixed delay, not a schedule).
    #[arg(long, env = "AUTOAPPROVAL_POLL_PERIOD", default_value = "10s", value_parser = parse_duration)]
    pub poll_period: Duration,
    /// Delay before the next turn when a turn filled its page.
    #[arg(long, env = "AUTOAPPROVAL_BACKLOG_DELAY", default_value = "100ms", value_parser = parse_duration)]
    pub backlog_delay: Duration,
    /// Wake discovery on the request table's NOTIFY (false: polling only).
    #[arg(long, env = "AUTOAPPROVAL_NOTIFY", default_value_t = true, action = clap::ArgAction::Set)]
    pub notify: bool,
    /// Only requests whose sort_time is within this window are candidates.
    #[arg(long, env = "AUTOAPPROVAL_WINDOW", default_value = "30d", value_parser = parse_duration)]
    pub window: Duration,
    /// Owner contracts per candidate query.
    #[arg(long, env = "AUTOAPPROVAL_OWNER_LIMIT", default_value_t = 20)]
    pub owner_limit: i64,
    /// Ad contracts per candidate query.
    #[arg(long, env = "AUTOAPPROVAL_AD_LIMIT", default_value_t = 10)]
    pub ad_limit: i64,
    /// Reconciles (and so chains) running at once.
    #[arg(long, env = "AUTOAPPROVAL_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    /// Failed attempts after which a request is Exhausted (waits for a condition do not count; a change of the request's facts revives it).
    #[arg(long, env = "AUTOAPPROVAL_RETRY_LIMIT", default_value_t = crate::domain::DEFAULT_RETRY_LIMIT)]
    pub retry_limit: i32,
    /// Wait after an unmet condition (documents, signature, hold…).
    #[arg(long, env = "AUTOAPPROVAL_CONDITION_RETRY_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub condition_retry_interval: Duration,
    /// First backoff after a transient external failure.
    #[arg(long, env = "AUTOAPPROVAL_TRANSIENT_RETRY_BASE", default_value = "2s", value_parser = parse_duration)]
    pub transient_retry_base: Duration,
    /// Longest backoff after transient external failures.
    #[arg(long, env = "AUTOAPPROVAL_TRANSIENT_RETRY_MAX", default_value = "10m", value_parser = parse_duration)]
    pub transient_retry_max: Duration,
    /// How often a running chain touches its claim (the cleanser's sign of life; a lost shard stops the chain sooner, see --renew-deadline).
    #[arg(long, env = "AUTOAPPROVAL_HEARTBEAT_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// K: requests are split into K shards by request_id mod K.
    #[arg(long, env = "AUTOAPPROVAL_SHARDS", default_value_t = 16)]
    pub shards: u32,
    /// On SIGTERM, how long in-flight chains may run before their claims are released.
    #[arg(long, env = "AUTOAPPROVAL_SHUTDOWN_GRACE", default_value = "25s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Delay between cleanser passes.
    #[arg(long, env = "AUTOAPPROVAL_CLEANSE_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub cleanse_interval: Duration,
    /// A claim untouched this long is stuck; must be at least 3 × --heartbeat-interval and 2 × --processing-timeout.
    #[arg(long, env = "AUTOAPPROVAL_STUCK_THRESHOLD", default_value = "5m", value_parser = parse_duration)]
    pub stuck_threshold: Duration,
    /// A member or leader Lease not changed for this long may be taken over by another replica, and with a member Lease the shards of its holder (at least --renew-deadline + 2 × --retry-period).
    #[arg(long, env = "AUTOAPPROVAL_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// A replica that could not renew its member Lease (or the leader Lease) for this long stops claiming under it, and its chains stop within 100 ms, before any further external call: at least 2 × --retry-period before another replica may take its shards (--lease-duration). Both Leases are renewed every half of it, rounded up to whole retry periods (6 s by default).
    #[arg(long, env = "AUTOAPPROVAL_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,
    /// Delay between coordination turns (list, acquire, balance; a renew that failed is retried at the next turn).
    #[arg(long, env = "AUTOAPPROVAL_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,
    /// A chain running longer than this is stopped and retried with backoff.
    #[arg(long, env = "AUTOAPPROVAL_PROCESSING_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub processing_timeout: Duration,
    /// Delay between passes of the leader's CR garbage collector.
    #[arg(long, env = "AUTOAPPROVAL_GC_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub gc_interval: Duration,
    /// How long the CR of a finished request stays before it is deleted.
    #[arg(long, env = "AUTOAPPROVAL_FINISHED_TTL", default_value = "1h", value_parser = parse_duration)]
    pub finished_ttl: Duration,
    /// The CR of an open request no longer worked (Exhausted, or sorted out of --window) and unchanged this long is deleted: its state stays in the database and the CR comes back once the request is a candidate again. The recorded bodies and pauses of a request decided this long ago are deleted too.
    #[arg(long, env = "AUTOAPPROVAL_ABANDONED_AFTER", default_value = "7d", value_parser = parse_duration)]
    pub abandoned_after: Duration,
    /// A chain running longer than this shows InProgress on its CR.
    #[arg(long, env = "AUTOAPPROVAL_IN_PROGRESS_AFTER", default_value = "1s", value_parser = parse_duration)]
    pub in_progress_after: Duration,
    /// Delay between censuses: each replica pings the database (autoapproval_database_up), and the leader counts requests by state and the backlog's age (autoapproval_requests, autoapproval_backlog_age_seconds); at least 1s.
    #[arg(long, env = "AUTOAPPROVAL_CENSUS_INTERVAL", default_value = "15s", value_parser = parse_duration)]
    pub census_interval: Duration,
    /// /healthz fails once the API server has not answered a Lease list for this long, so a liveness probe restarts a replica cut off from it; /readyz fails once refused Lease calls (a missing namespace, a verb the Role lacks) have kept the replica from holding any shard for this long; also how long a CR create, status write or Event may go unanswered before it is given up; at least --lease-duration.
    #[arg(long, env = "AUTOAPPROVAL_API_LIVENESS_TIMEOUT", default_value = "1m", value_parser = parse_duration)]
    pub api_liveness_timeout: Duration,
}

/// The validated settings of `run`, built only by [`ControllerArgs::config`],
/// so every value in it passed the checks that name a flag.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Namespace of the CRs, Events and Leases.
    pub namespace: String,
    /// This replica's name: the holder in claims and Leases, the reporter of Events.
    pub replica_name: String,
    /// The fleet that owns the database this replica works on.
    pub fleet: String,
    /// Where /healthz, /readyz and /metrics are served.
    pub listen: SocketAddr,
    /// Reconciles (and so chains) running at once.
    pub concurrency: u16,
    /// How long in-flight chains may run after SIGTERM before their claims are released.
    pub shutdown_grace: Duration,
    /// Delay between the leader's cleanser passes.
    pub cleanse_interval: Duration,
    /// A claim untouched this long is stuck (at least 3 heartbeats, 2 processing timeouts).
    pub stuck_threshold: Duration,
    /// Without an answer from the API server for this long, /healthz fails.
    pub api_liveness_timeout: Duration,
    /// Retries, heartbeats and the processing timeout of one attempt.
    pub approver: ApproverConfig,
    /// The candidate queries and their wake-ups.
    pub discovery: DiscoveryConfig,
    /// When a reconcile shows progress and looks again.
    pub reconcile: ReconcileConfig,
    /// Shards and Lease timings.
    pub coordination: CoordinationConfig,
    /// The leader's CR garbage collector.
    pub gc: GcConfig,
    /// The census behind the state metrics.
    pub census: CensusConfig,
}

impl ControllerConfig {
    /// Refuses a pool that running chains would keep exhausted: a chain
    /// holds a connection only for its statements, between external calls,
    /// so half of them at once, plus discovery and the leader's passes.
    pub fn check_pool(&self, db_max_connections: u32) -> Result<(), SettingError> {
        let needed = u32::from(self.concurrency).div_ceil(2) + 2;
        if db_max_connections < needed {
            return Err(refuse(
                "--db-max-connections",
                db_max_connections,
                "must be at least --concurrency / 2 + 2, or chains queue for connections",
            ));
        }
        Ok(())
    }

    /// The settings `run` starts with when no flag or variable is given, as
    /// `--help` documents them: the clap defaults are their one source.
    pub fn defaults(
        namespace: impl Into<String>,
        replica_name: impl Into<String>,
    ) -> Result<Self, SettingError> {
        let args = crate::flags::defaults_of::<ControllerArgs>().map_err(|error| SettingError {
            flag: "run",
            value: error.to_string(),
            message: "the flags have no valid defaults",
        })?;
        args.config(namespace.into(), replica_name.into())
    }
}

fn refuse(flag: &'static str, value: impl ToString, message: &'static str) -> SettingError {
    SettingError {
        flag,
        value: value.to_string(),
        message,
    }
}

/// The longest fleet name: the column that records it is a VARCHAR(255) on MySQL.
const FLEET_MAX: usize = 255;

/// A fleet name as the database records it: not blank, and at most
/// [`FLEET_MAX`] characters.
fn checked_fleet(fleet: &str) -> Result<String, SettingError> {
    if fleet.trim().is_empty() {
        return Err(refuse("--fleet", fleet, "must not be empty"));
    }
    if fleet.chars().count() > FLEET_MAX || fleet.chars().any(char::is_control) {
        return Err(refuse(
            "--fleet",
            fleet,
            "must be at most 255 characters, without control characters",
        ));
    }
    Ok(fleet.to_owned())
}

/// The longest duration any flag takes: 100 years, beyond the age of any
/// request, and far inside what a timestamp can hold.
const LONGEST: Duration = Duration::from_secs(36_500 * 86_400);

fn bounded(flag: &'static str, d: Duration) -> Result<Duration, SettingError> {
    if d > LONGEST {
        return Err(refuse(
            flag,
            format_duration(d),
            "must be at most 36500d (100 years)",
        ));
    }
    Ok(d)
}

fn positive(flag: &'static str, d: Duration) -> Result<Duration, SettingError> {
    if d.is_zero() {
        return Err(refuse(
            flag,
            format_duration(d),
            "must be greater than zero",
        ));
    }
    bounded(flag, d)
}

impl ControllerArgs {
    /// Checks every value and builds the settings; `namespace` and
    /// `replica_name` are the resolved defaults when the flags are absent.
    pub fn config(
        &self,
        namespace: String,
        replica_name: String,
    ) -> Result<ControllerConfig, SettingError> {
        for (flag, limit) in [
            ("--owner-limit", self.owner_limit),
            ("--ad-limit", self.ad_limit),
        ] {
            if !(1..=10_000).contains(&limit) {
                return Err(refuse(flag, limit, "must be between 1 and 10000"));
            }
        }
        if self.concurrency == 0 {
            return Err(refuse("--concurrency", 0, "must be at least 1"));
        }
        if self.retry_limit < 1 {
            return Err(refuse(
                "--retry-limit",
                self.retry_limit,
                "must be at least 1",
            ));
        }
        if !(1..=4096).contains(&self.shards) {
            return Err(refuse(
                "--shards",
                self.shards,
                "must be between 1 and 4096",
            ));
        }
        let transient_base = positive("--transient-retry-base", self.transient_retry_base)?;
        let transient_max = positive("--transient-retry-max", self.transient_retry_max)?;
        if transient_max < transient_base {
            return Err(refuse(
                "--transient-retry-max",
                format_duration(transient_max),
                "must not be below --transient-retry-base",
            ));
        }
        let heartbeat = positive("--heartbeat-interval", self.heartbeat_interval)?;
        let processing_timeout = positive("--processing-timeout", self.processing_timeout)?;
        let stuck = positive("--stuck-threshold", self.stuck_threshold)?;
        if stuck < heartbeat.saturating_mul(3) {
            return Err(refuse(
                "--stuck-threshold",
                format_duration(stuck),
                "must be at least 3 × --heartbeat-interval, or live claims look stuck",
            ));
        }
        if stuck < processing_timeout.saturating_mul(2) {
            return Err(refuse(
                "--stuck-threshold",
                format_duration(stuck),
                "must be at least 2 × --processing-timeout, or a slow live chain looks stuck",
            ));
        }
        let retry_period = positive("--retry-period", self.retry_period)?;
        let renew_deadline = positive("--renew-deadline", self.renew_deadline)?;
        if renew_deadline <= retry_period {
            return Err(refuse(
                "--renew-deadline",
                format_duration(renew_deadline),
                "must be above --retry-period, or a held Lease lapses between two renews",
            ));
        }
        let lease_duration = positive("--lease-duration", self.lease_duration)?;
        if lease_duration < renew_deadline.saturating_add(retry_period.saturating_mul(2)) {
            return Err(refuse(
                "--lease-duration",
                format_duration(lease_duration),
                "must be at least --renew-deadline + 2 × --retry-period, or a new holder could claim before the old one stops",
            ));
        }
        let api_liveness_timeout = positive("--api-liveness-timeout", self.api_liveness_timeout)?;
        if api_liveness_timeout < lease_duration {
            return Err(refuse(
                "--api-liveness-timeout",
                format_duration(api_liveness_timeout),
                "must be at least --lease-duration, or a short outage restarts replicas whose Leases are still valid",
            ));
        }
        let census_interval = positive("--census-interval", self.census_interval)?;
        if census_interval < Duration::from_secs(1) {
            return Err(refuse(
                "--census-interval",
                format_duration(census_interval),
                "must be at least 1s, or the census queries run back to back on the database",
            ));
        }
        let window = positive("--window", self.window)?;
        let abandonment = Abandonment {
            after: bounded("--abandoned-after", self.abandoned_after)?,
            window,
            retry_limit: self.retry_limit,
        };
        let fleet = match &self.fleet {
            Some(fleet) => checked_fleet(fleet)?,
            None => namespace.clone(),
        };
        Ok(ControllerConfig {
            namespace,
            replica_name,
            fleet,
            listen: self.listen,
            concurrency: self.concurrency,
            shutdown_grace: bounded("--shutdown-grace", self.shutdown_grace)?,
            cleanse_interval: positive("--cleanse-interval", self.cleanse_interval)?,
            stuck_threshold: stuck,
            api_liveness_timeout,
            approver: ApproverConfig {
                retry: RetryPolicy {
                    condition_interval: positive(
                        "--condition-retry-interval",
                        self.condition_retry_interval,
                    )?,
                    transient_base,
                    transient_max,
                    limit: self.retry_limit,
                },
                heartbeat_interval: heartbeat,
                processing_timeout,
                mode: self.mode,
            },
            discovery: DiscoveryConfig {
                poll_period: positive("--poll-period", self.poll_period)?,
                backlog_delay: bounded("--backlog-delay", self.backlog_delay)?,
                notify: self.notify,
                shard_count: self.shards,
                turn: TurnConfig {
                    owner_limit: self.owner_limit,
                    ad_limit: self.ad_limit,
                    window,
                    concurrency: usize::from(self.concurrency),
                },
                retry_limit: self.retry_limit,
                abandoned: abandonment.clone(),
                api_timeout: api_liveness_timeout,
            },
            reconcile: ReconcileConfig {
                api_timeout: api_liveness_timeout,
                ..ReconcileConfig::new(bounded("--in-progress-after", self.in_progress_after)?)
            },
            coordination: CoordinationConfig {
                shard_count: self.shards,
                lease_duration,
                renew_deadline,
                retry_period,
            },
            gc: GcConfig {
                interval: positive("--gc-interval", self.gc_interval)?,
                finished_ttl: bounded("--finished-ttl", self.finished_ttl)?,
                abandoned: abandonment.clone(),
            },
            census: CensusConfig {
                interval: census_interval,
                window,
                retry_limit: self.retry_limit,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControllerArgs,
    }

    fn settings(args: &[&str]) -> Result<ControllerConfig, SettingError> {
        let cli = Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
            .expect("parses");
        cli.args.config("ns".into(), "r1".into())
    }

    #[test]
    fn the_documented_defaults_are_valid() {
        let d = ControllerConfig::defaults("ns", "r1").unwrap();
        assert_eq!(d.namespace, "ns");
        assert_eq!(d.discovery.poll_period, Duration::from_secs(10));
        assert_eq!(d.discovery.turn.window, Duration::from_secs(30 * 86_400));
        assert_eq!(
            d.approver.retry.condition_interval,
            Duration::from_secs(600)
        );
        assert_eq!(d.approver.retry.limit, crate::domain::DEFAULT_RETRY_LIMIT);
        assert_eq!(d.stuck_threshold, Duration::from_secs(300));
        assert!(d.discovery.notify);
        assert_eq!(d.coordination.shard_count, 16);
        assert_eq!(d.coordination.lease_duration, Duration::from_secs(15));
        assert_eq!(d.coordination.renew_deadline, Duration::from_secs(10));
        assert_eq!(d.coordination.retry_period, Duration::from_secs(2));
        assert_eq!(d.gc.finished_ttl, Duration::from_secs(3600));
        assert_eq!(d.gc.abandoned.after, Duration::from_secs(7 * 86_400));
        assert_eq!(d.approver.processing_timeout, Duration::from_secs(120));
        assert_eq!(d.census.interval, Duration::from_secs(15));
        let parsed = settings(&[]).unwrap();
        assert_eq!(parsed.approver.retry, d.approver.retry);
    }

    #[test]
    fn the_fleet_is_the_namespace_unless_named() {
        assert_eq!(ControllerConfig::defaults("ns", "r1").unwrap().fleet, "ns");
        let named = settings(&["--fleet", "payments/autoapproval"]).unwrap();
        assert_eq!(named.fleet, "payments/autoapproval");
        assert_eq!(named.namespace, "ns");
        let longest = "f".repeat(255);
        assert_eq!(settings(&["--fleet", &longest]).unwrap().fleet, longest);
    }

    #[test]
    fn the_pool_must_outnumber_the_chains_that_can_run() {
        let d = ControllerConfig::defaults("ns", "r1").unwrap();
        assert_eq!(d.concurrency, 16);
        d.check_pool(10).unwrap();
        let err = d.check_pool(9).unwrap_err();
        assert_eq!(err.flag, "--db-max-connections");
    }

    #[test]
    fn bad_values_are_refused_naming_the_flag() {
        let too_long = "f".repeat(256);
        for (args, flag) in [
            (&["--poll-period", "0"][..], "--poll-period"),
            (&["--owner-limit", "0"], "--owner-limit"),
            (&["--shards", "0"], "--shards"),
            (&["--concurrency", "0"], "--concurrency"),
            (
                &[
                    "--transient-retry-base",
                    "1m",
                    "--transient-retry-max",
                    "10s",
                ],
                "--transient-retry-max",
            ),
            (&["--stuck-threshold", "20s"], "--stuck-threshold"),
            (&["--processing-timeout", "3m"], "--stuck-threshold"),
            (&["--renew-deadline", "2s"], "--renew-deadline"),
            (&["--lease-duration", "10s"], "--lease-duration"),
            (&["--retry-period", "0"], "--retry-period"),
            (&["--gc-interval", "0"], "--gc-interval"),
            (&["--window", "99999999d"], "--window"),
            (&["--api-liveness-timeout", "10s"], "--api-liveness-timeout"),
            (&["--finished-ttl", "36501d"], "--finished-ttl"),
            (&["--abandoned-after", "36501d"], "--abandoned-after"),
            (&["--census-interval", "0"], "--census-interval"),
            (&["--census-interval", "500ms"], "--census-interval"),
            (&["--fleet", ""], "--fleet"),
            (&["--fleet", "  "], "--fleet"),
            (&["--fleet", too_long.as_str()], "--fleet"),
            (&["--fleet", "a\nb"], "--fleet"),
        ] {
            let err = settings(args).unwrap_err();
            assert_eq!(err.flag, flag, "{args:?}");
            assert!(err.to_string().starts_with(flag), "{err}");
        }
    }
}
