//! Telemetry: the Prometheus metrics every module records into, and the
//! tracing subscriber.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::db::Pool;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

mod kube_client;
mod state;

pub use kube_client::KubeRequestsLayer;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    request_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    step: String,
    outcome: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SystemLabels {
    system: String,
    result: String,
}

/// The exemplar of a latency observation: the trace it was made in.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TraceExemplar {
    trace_id: String,
}

impl TraceExemplar {
    /// The current span's trace, when spans are exported (`--otlp-endpoint`).
    fn current() -> Option<Self> {
        crate::traces::current_trace_id().map(|trace_id| Self { trace_id })
    }
}

/// A latency histogram whose buckets keep the trace of their last observation.
type TracedHistogram = HistogramWithExemplars<TraceExemplar>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ColumnLabel {
    column: String,
}

/// The controller's metrics. Cheap to clone; all clones share the counters.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    candidates: Family<TypeLabel, Counter>,
    claims: Family<ResultLabel, Counter>,
    outcomes: Family<OutcomeLabels, Counter>,
    external_calls: Family<SystemLabels, Counter>,
    external_tls_reloads: Family<SystemLabels, Counter>,
    external_tls_rejected: Family<SystemLabel, Gauge>,
    malformed_rows: Family<ColumnLabel, Counter>,
    cleanser_recovered: Counter,
    cleanser_deleted: Counter,
    pickup_latency: TracedHistogram,
    reconcile_duration: Family<ResultLabel, TracedHistogram>,
    turn_candidates: Histogram,
    turn_duration: Histogram,
    notify_wakeups: Counter,
    crs_created: Counter,
    events: Family<ReasonLabel, Counter>,
    events_skipped: Family<ReasonLabel, Counter>,
    status_writes: Family<StatusWriteLabels, Counter>,
    rows_collected: Family<TableLabel, Counter>,
    shards_held: Gauge,
    cannot_hold_shards: Gauge,
    leader: Gauge,
    shard_acquisitions: Family<KindLabel, Counter>,
    shard_losses: Counter,
    chains_cancelled: Counter,
    lease_renew_failures: Counter,
    leadership_losses: Counter,
    crs_collected: Family<ReasonLabel, Counter>,
    creations_found: Family<SystemLabel, Counter>,
    shadow_creations_skipped: Family<SystemLabel, Counter>,
    shadow_decisions: Family<ShadowLabels, Counter>,
    recorded_bodies_resent: Counter,
    results_redone: Family<SystemLabel, Counter>,
    external_call_duration: Family<SystemLabel, Histogram>,
    shard_count: Gauge,
    requests: Family<StateLabels, Gauge>,
    backlog_age: Family<NoLabels, Gauge<f64, AtomicU64>>,
    fleet_paused: Gauge,
    fleet_paused_since: Gauge,
    database_up: Family<PoolLabel, Gauge>,
    pool_connections: Family<PoolLabel, Gauge>,
    pool_idle: Family<PoolLabel, Gauge>,
    pool_max: Family<PoolLabel, Gauge>,
    pools: Arc<Mutex<Vec<(&'static str, Pool)>>>,
    kube_requests: Family<KubeLabels, Counter>,
    kube_request_duration: Family<VerbLabel, Histogram>,
}

/// The label set of a single series that must be able to disappear (a
/// plain gauge is always exported): no labels at all.
type NoLabels = Vec<(String, String)>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
    reason_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KubeLabels {
    verb: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabel {
    verb: String,
}

fn call_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SystemLabel {
    system: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowLabels {
    decision: String,
    step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusWriteLabels {
    phase: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabel {
    table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

fn reconcile_buckets() -> TracedHistogram {
    TracedHistogram::new(exponential_buckets(0.0005, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("autoapproval");
        // `autoapproval_build_info{version="…",revision="…",features="…"} 1`:
        // which build each replica runs (build.rs finds the revision).
        registry.register(
            "build",
            "The version of the running binary, the git revision it was built from and its cargo features",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("revision", env!("AUTOAPPROVAL_REVISION")),
                ("features", env!("AUTOAPPROVAL_FEATURES")),
            ]),
        );
        let candidates = Family::<TypeLabel, Counter>::default();
        registry.register(
            "candidates",
            "Candidates returned by the candidate queries",
            candidates.clone(),
        );
        let claims = Family::<ResultLabel, Counter>::default();
        registry.register(
            "claims",
            "Claim attempts on the primary by result: won; lost (another worker holds it, or the retry is no longer due); already_done (decided before the claim, e.g. a lagging read replica's candidate); vanished; already_running (another attempt of this replica is on the request: refused before any statement); fleet_paused (the whole fleet is paused: autoapproval pause --all)",
            claims.clone(),
        );
        let outcomes = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "outcomes",
            "Attempt outcomes by step and reason class",
            outcomes.clone(),
        );
        let external_calls = Family::<SystemLabels, Counter>::default();
        registry.register(
            "external_calls",
            "External system calls by system and result",
            external_calls.clone(),
        );
        let external_tls_reloads = Family::<SystemLabels, Counter>::default();
        registry.register(
            "external_tls_reloads",
            "Changed CA or client certificate files of an external system, by result: loaded, or rejected (the last good ones stay in use)",
            external_tls_reloads.clone(),
        );
        let external_tls_rejected = Family::<SystemLabel, Gauge>::default();
        registry.register(
            "external_tls_files_rejected",
            "1 while an external system's TLS files on disk are rejected and the last good ones are in use",
            external_tls_rejected.clone(),
        );
        let malformed_rows = Family::<ColumnLabel, Counter>::default();
        registry.register(
            "malformed_rows",
            "Rows skipped because a column holds a value the controller does not know",
            malformed_rows.clone(),
        );
        let cleanser_recovered = Counter::default();
        registry.register(
            "cleanser_recovered",
            "Stuck claims returned to RETRY_WAITING",
            cleanser_recovered.clone(),
        );
        let cleanser_deleted = Counter::default();
        registry.register(
            "cleanser_deleted",
            "State rows of finished requests deleted",
            cleanser_deleted.clone(),
        );
        let pickup_latency = TracedHistogram::new(exponential_buckets(0.001, 2.0, 22));
        registry.register_with_unit(
            "pickup_latency",
            "Time from a request becoming eligible to its claim",
            Unit::Seconds,
            pickup_latency.clone(),
        );
        let reconcile_duration = Family::<ResultLabel, TracedHistogram>::new_with_constructor(
            reconcile_buckets as fn() -> TracedHistogram,
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Duration of one reconcile by result",
            Unit::Seconds,
            reconcile_duration.clone(),
        );
        let turn_candidates = Histogram::new([0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 100.0]);
        registry.register(
            "discovery_turn_candidates",
            "Candidates found by one discovery turn",
            turn_candidates.clone(),
        );
        // 0.5 ms to about 4 s: the shard owner's turn, goal < 50 ms at 100,000 waiting.
        let turn_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register_with_unit(
            "discovery_turn_duration",
            "Duration of one discovery turn of the shard owner (wakes applied, candidate queries, CRs ensured)",
            Unit::Seconds,
            turn_duration.clone(),
        );
        let notify_wakeups = Counter::default();
        registry.register(
            "notify_wakeups",
            "Discovery turns started early by a request-changed NOTIFY",
            notify_wakeups.clone(),
        );
        let crs_created = Counter::default();
        registry.register(
            "crs_created",
            "AutoApproval custom resources created by discovery",
            crs_created.clone(),
        );
        let events = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "events",
            "Kubernetes Events published by reason",
            events.clone(),
        );
        let events_skipped = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "events_skipped",
            "Kubernetes Events not published because they repeated the outcome the CR shows, by reason",
            events_skipped.clone(),
        );
        let status_writes = Family::<StatusWriteLabels, Counter>::default();
        registry.register(
            "status_writes",
            "AutoApproval status writes by phase: outcome=written, or skipped (the CR already showed that outcome)",
            status_writes.clone(),
        );
        let rows_collected = Family::<TableLabel, Counter>::default();
        registry.register(
            "rows_collected",
            "Rows of our tables deleted by the garbage collector's retention pass, by table",
            rows_collected.clone(),
        );
        let shards_held = Gauge::default();
        registry.register(
            "shards_held",
            "Shard Leases this replica holds",
            shards_held.clone(),
        );
        let cannot_hold_shards = Gauge::default();
        registry.register(
            "cannot_hold_shards",
            "1 while this replica holds no shard it may claim in because its Lease calls fail (the log names the Lease, the verb and the API server's answer); 0 when it can hold shards, even if others hold them all",
            cannot_hold_shards.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        let shard_acquisitions = Family::<KindLabel, Counter>::default();
        registry.register(
            "shard_acquisitions",
            "Shards acquired: kind=free (never held or released) or failover (taken from a holder whose Lease expired)",
            shard_acquisitions.clone(),
        );
        let shard_losses = Counter::default();
        registry.register(
            "shard_losses",
            "Shards lost to another replica without handing them back",
            shard_losses.clone(),
        );
        let chains_cancelled = Counter::default();
        registry.register(
            "chains_cancelled",
            "Chains stopped mid-way, before any further external call, because their shard was lost or its renewal overdue",
            chains_cancelled.clone(),
        );
        let creations_found = Family::<SystemLabel, Counter>::default();
        registry.register(
            "creations_found",
            "Creations an earlier attempt made (its answer lost), found by a lookup in a downstream without idempotency keys and taken instead of made again",
            creations_found.clone(),
        );
        let shadow_creations_skipped = Family::<SystemLabel, Counter>::default();
        registry.register(
            "shadow_creations_skipped",
            "Creations a controller in shadow mode would have made and did not send, taken as made for the next step's gates",
            shadow_creations_skipped.clone(),
        );
        let shadow_decisions = Family::<ShadowLabels, Counter>::default();
        registry.register(
            "shadow_decisions",
            "Would-decisions recorded in shadow mode, by decision (approve, hold) and the step whose gate held the request (the last step for approve)",
            shadow_decisions.clone(),
        );
        // Every series it can have, at zero from the start: a switch to
        // shadow shows its first decisions as increases, and the dashboard's
        // queries name metrics every replica exports.
        for system in ["owner", "store", "ad"] {
            let _ = shadow_creations_skipped.get_or_create(&SystemLabel {
                system: system.into(),
            });
        }
        for (decision, step) in [
            ("approve", "store"),
            ("approve", "ad-campaign"),
            ("hold", "owner"),
            ("hold", "store"),
            ("hold", "ad-campaign"),
        ] {
            let _ = shadow_decisions.get_or_create(&ShadowLabels {
                decision: decision.into(),
                step: step.into(),
            });
        }
        let recorded_bodies_resent = Counter::default();
        registry.register(
            "recorded_bodies_resent",
            "Creations sent again with the body recorded under their idempotency key, which the request's current facts no longer give (renamed since the first send)",
            recorded_bodies_resent.clone(),
        );
        let results_redone = Family::<SystemLabel, Counter>::default();
        registry.register(
            "results_redone",
            "Saved results not made for the request's current inputs (a campaign saved for another store than the current target), made again under the current inputs' key",
            results_redone.clone(),
        );
        let lease_renew_failures = Counter::default();
        registry.register(
            "lease_renew_failures",
            "Lease calls that failed (list, renew, acquire)",
            lease_renew_failures.clone(),
        );
        let leadership_losses = Counter::default();
        registry.register(
            "leadership_losses",
            "Times the leader Lease was lost without handing it back",
            leadership_losses.clone(),
        );
        let crs_collected = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "crs_collected",
            "AutoApproval CRs deleted by the garbage collector, by reason",
            crs_collected.clone(),
        );
        let external_call_duration = Family::<SystemLabel, Histogram>::new_with_constructor(
            call_buckets as fn() -> Histogram,
        );
        registry.register_with_unit(
            "external_call_duration",
            "Duration of external system calls by system, answered or not",
            Unit::Seconds,
            external_call_duration.clone(),
        );
        let shard_count = Gauge::default();
        registry.register(
            "shards",
            "K, the shards requests are split into (--shards): all of them should be held",
            shard_count.clone(),
        );
        let requests = Family::<StateLabels, Gauge>::default();
        registry.register(
            "requests",
            "Requests with a state row, by state (in_progress, waiting by reason_class, exhausted); exported by the leader only, refreshed every --census-interval",
            requests.clone(),
        );
        let backlog_age = Family::<NoLabels, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "backlog_age",
            "Age of the oldest request a candidate query would select now (0 when none); exported by the leader only",
            Unit::Seconds,
            backlog_age.clone(),
        );
        let fleet_paused = Gauge::default();
        registry.register(
            "fleet_paused",
            "1 while the whole fleet is paused (autoapproval pause --all: no replica claims anything), else 0; as this replica last read it, every --poll-period",
            fleet_paused.clone(),
        );
        let fleet_paused_since = Gauge::default();
        registry.register_with_unit(
            "fleet_paused_since",
            "When the fleet's pause began, in Unix seconds of the database's clock; 0 while the fleet runs",
            Unit::Seconds,
            fleet_paused_since.clone(),
        );
        let database_up = Family::<PoolLabel, Gauge>::default();
        registry.register(
            "database_up",
            "1 when this replica's last census ping of the pool's database answered, else 0",
            database_up.clone(),
        );
        let pool_connections = Family::<PoolLabel, Gauge>::default();
        registry.register(
            "db_pool_connections",
            "Connections open in the pool, idle or in use",
            pool_connections.clone(),
        );
        let pool_idle = Family::<PoolLabel, Gauge>::default();
        registry.register(
            "db_pool_idle_connections",
            "Idle connections in the pool",
            pool_idle.clone(),
        );
        let pool_max = Family::<PoolLabel, Gauge>::default();
        registry.register(
            "db_pool_max_connections",
            "Most connections the pool opens",
            pool_max.clone(),
        );
        let kube_requests = Family::<KubeLabels, Counter>::default();
        registry.register(
            "kube_requests",
            "Requests to the API server by verb and HTTP status (error: no response)",
            kube_requests.clone(),
        );
        let kube_request_duration =
            Family::<VerbLabel, Histogram>::new_with_constructor(call_buckets as fn() -> Histogram);
        registry.register_with_unit(
            "kube_request_duration",
            "Duration of requests to the API server until their response headers, by verb (watches not included)",
            Unit::Seconds,
            kube_request_duration.clone(),
        );
        Self {
            registry: Arc::new(registry),
            external_call_duration,
            shard_count,
            requests,
            backlog_age,
            fleet_paused,
            fleet_paused_since,
            database_up,
            pool_connections,
            pool_idle,
            pool_max,
            pools: Arc::default(),
            kube_requests,
            kube_request_duration,
            shards_held,
            cannot_hold_shards,
            leader,
            shard_acquisitions,
            shard_losses,
            chains_cancelled,
            lease_renew_failures,
            leadership_losses,
            crs_collected,
            creations_found,
            shadow_creations_skipped,
            shadow_decisions,
            recorded_bodies_resent,
            results_redone,
            reconcile_duration,
            turn_candidates,
            turn_duration,
            notify_wakeups,
            crs_created,
            events,
            events_skipped,
            status_writes,
            rows_collected,
            candidates,
            claims,
            outcomes,
            external_calls,
            external_tls_reloads,
            external_tls_rejected,
            malformed_rows,
            cleanser_recovered,
            cleanser_deleted,
            pickup_latency,
        }
    }

    /// Counts candidates of a type.
    pub fn candidates(&self, request_type: &str, n: u64) {
        self.candidates
            .get_or_create(&TypeLabel {
                request_type: request_type.into(),
            })
            .inc_by(n);
    }

    /// Counts a claim attempt: `won` or `lost`.
    pub fn claim(&self, result: &str) {
        self.claims
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// How many claim attempts had `result`.
    pub fn claims(&self, result: &str) -> u64 {
        self.claims
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .get()
    }

    /// Counts an attempt's outcome.
    pub fn outcome(&self, step: &str, outcome: &str, reason: &str) {
        let labels = OutcomeLabels {
            step: step.into(),
            outcome: outcome.into(),
            reason: reason.into(),
        };
        self.outcomes.get_or_create(&labels).inc();
    }

    /// Counts an external call.
    pub fn external_call(&self, system: &str, result: &str) {
        self.external_calls
            .get_or_create(&SystemLabels {
                system: system.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts a reload of `system`'s TLS files: `loaded` or `rejected`.
    pub fn external_tls_reload(&self, system: &str, result: &str) {
        self.external_tls_reloads
            .get_or_create(&SystemLabels {
                system: system.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Whether `system`'s TLS files on disk are rejected (the last good ones in use).
    pub fn external_tls_rejected(&self, system: &str, rejected: bool) {
        self.external_tls_rejected
            .get_or_create(&SystemLabel {
                system: system.into(),
            })
            .set(i64::from(rejected));
    }

    /// Records how long a call to `system` took.
    pub fn external_call_took(&self, system: &str, took: Duration) {
        self.external_call_duration
            .get_or_create(&SystemLabel {
                system: system.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts a malformed row.
    pub fn malformed_row(&self, column: &str) {
        self.malformed_rows
            .get_or_create(&ColumnLabel {
                column: column.into(),
            })
            .inc();
    }

    /// How many malformed rows were seen with a bad `column`.
    pub fn malformed_rows(&self, column: &str) -> u64 {
        self.malformed_rows
            .get_or_create(&ColumnLabel {
                column: column.into(),
            })
            .get()
    }

    /// Counts a cleanser pass.
    pub fn cleansed(&self, recovered: u64, deleted: u64) {
        self.cleanser_recovered.inc_by(recovered);
        self.cleanser_deleted.inc_by(deleted);
    }

    /// Records a pickup latency, with the current trace as its exemplar.
    pub fn pickup(&self, seconds: f64) {
        self.pickup_latency
            .observe(seconds, TraceExemplar::current(), None);
    }

    /// Records one reconcile's duration, with the current trace as its
    /// exemplar; `result` is `ok` or `error`.
    pub fn reconcile(&self, result: &str, seconds: f64) {
        self.reconcile_duration
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .observe(seconds, TraceExemplar::current(), None);
    }

    /// Records the candidates and the duration of one discovery turn.
    pub fn turn(&self, candidates: usize, seconds: f64) {
        self.turn_candidates.observe(candidates as f64);
        self.turn_duration.observe(seconds);
    }

    /// Counts a NOTIFY wake-up of discovery.
    pub fn notify_wakeup(&self) {
        self.notify_wakeups.inc();
    }

    /// How many NOTIFY wake-ups there were.
    pub fn notify_wakeups(&self) -> u64 {
        self.notify_wakeups.get()
    }

    /// Counts a CR created by discovery.
    pub fn cr_created(&self) {
        self.crs_created.inc();
    }

    /// Counts a published Event.
    pub fn event(&self, reason: &str) {
        self.events
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts an Event not published: it repeated the outcome shown.
    pub fn event_skipped(&self, reason: &str) {
        self.events_skipped
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts a status write of `phase`, `outcome` written or skipped.
    pub fn status_write(&self, phase: &str, outcome: &str) {
        self.status_writes
            .get_or_create(&StatusWriteLabels {
                phase: phase.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Counts rows of `table` deleted by the retention pass.
    pub fn rows_collected(&self, table: &str, rows: u64) {
        self.rows_collected
            .get_or_create(&TableLabel {
                table: table.into(),
            })
            .inc_by(rows);
    }

    /// Records the coordination state: shards held and leadership.
    pub fn coordination(&self, shards_held: usize, leader: bool) {
        self.shards_held.set(shards_held as i64);
        self.leader.set(i64::from(leader));
    }

    /// Records whether this replica cannot hold any shard because its Lease calls fail.
    pub fn cannot_hold_shards(&self, stuck: bool) {
        self.cannot_hold_shards.set(i64::from(stuck));
    }

    /// Counts a shard acquired; `failover` when taken from an expired holder.
    pub fn shard_acquired(&self, failover: bool) {
        let kind = if failover { "failover" } else { "free" };
        self.shard_acquisitions
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// How many shards were acquired by `kind` (`free` or `failover`).
    pub fn shard_acquisitions(&self, kind: &str) -> u64 {
        self.shard_acquisitions
            .get_or_create(&KindLabel { kind: kind.into() })
            .get()
    }

    /// Counts a shard lost to another replica.
    pub fn shard_lost(&self) {
        self.shard_losses.inc();
    }

    /// A chain was stopped because its shard was lost or overdue.
    pub fn chain_cancelled(&self) {
        self.chains_cancelled.inc();
    }

    /// A lookup found what an earlier attempt created in `system`.
    pub fn creation_found(&self, system: &str) {
        self.creations_found
            .get_or_create(&SystemLabel {
                system: system.into(),
            })
            .inc();
    }

    /// Shadow mode took a creation in `system` as made without sending it.
    pub fn shadow_creation_skipped(&self, system: &str) {
        self.shadow_creations_skipped
            .get_or_create(&SystemLabel {
                system: system.into(),
            })
            .inc();
    }

    /// Shadow mode recorded a would-decision (`approve` or `hold`) at `step`.
    pub fn shadow_decision(&self, decision: &str, step: &str) {
        self.shadow_decisions
            .get_or_create(&ShadowLabels {
                decision: decision.into(),
                step: step.into(),
            })
            .inc();
    }

    /// A creation was sent with its recorded body, not the current facts'.
    pub fn recorded_body_resent(&self) {
        self.recorded_bodies_resent.inc();
    }

    /// A saved result of `system` was made for other inputs and is made again.
    pub fn result_redone(&self, system: &str) {
        self.results_redone
            .get_or_create(&SystemLabel {
                system: system.into(),
            })
            .inc();
    }

    /// Counts a failed Lease call.
    pub fn lease_renew_failure(&self) {
        self.lease_renew_failures.inc();
    }

    /// Counts a lost leadership.
    pub fn leadership_lost(&self) {
        self.leadership_losses.inc();
    }

    /// Counts a CR deleted by the garbage collector.
    pub fn cr_collected(&self, reason: &str) {
        self.crs_collected
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        self.refresh_pools();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Installs the tracing subscriber: `RUST_LOG` filter (default
/// `default_level`), JSON lines when `json` is set, and the OTLP export of
/// the spans when `otlp` is given; the export flushes when dropped.
pub fn init_tracing(
    json: bool,
    default_level: &str,
    otlp: Option<&crate::traces::OtlpConfig>,
) -> Result<Option<crate::traces::Export>, crate::traces::ExportError> {
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::{EnvFilter, fmt};
    // kube's client logs every failed request at ERROR before handing the
    // error back; our callers report it once, naming what they were doing.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!("{default_level},kube_client::client::builder=off"))
    });
    let lines = if json {
        fmt::layer().json().with_writer(std::io::stderr).boxed()
    } else {
        fmt::layer().with_writer(std::io::stderr).boxed()
    };
    #[cfg(feature = "otlp")]
    let (spans, export) = match otlp {
        Some(config) => {
            let (layer, export) = crate::traces::layer(config)?;
            (Some(layer), Some(export))
        }
        None => (None, None),
    };
    #[cfg(not(feature = "otlp"))]
    let (spans, export): (Option<tracing_subscriber::layer::Identity>, _) = {
        // `TracingArgs::config` refuses an endpoint in such a build.
        let _ = otlp;
        (None, None)
    };
    // A second init (tests) is harmless; keep the first.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(spans)
        .try_init();
    Ok(export)
}
