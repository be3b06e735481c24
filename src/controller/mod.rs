//! The controller: AutoApproval CRs mirroring requests, discovery feeding
//! kube-runtime's `Controller`, and the level-triggered reconcile.

pub mod cached;
pub mod config;
pub mod crd;
pub mod discovery;
pub mod fleet;
pub mod gc;
pub mod reconcile;
pub mod status;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::utils::Predicate;
use kube::runtime::{WatchStreamExt, predicates, reflector, watcher};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::approval::{Approver, Mode};
use crate::census::Census;
use crate::cleanser::Cleanser;
use crate::clock::SharedClock;
use crate::coordination::{Coordinator, Shards};
use crate::db::{Database, DbError};
use crate::endpoints::Health;
use crate::events::Publisher;
use crate::external::ExternalSystems;
use crate::outage::{Outage, Report};
use crate::telemetry::Metrics;

use self::cached::CachedAutoApproval;
use self::config::ControllerConfig;
use self::crd::AutoApproval;
use self::discovery::{Discovery, TRIGGER_CAPACITY};
use self::gc::Collector;
use self::reconcile::Context;

/// The name Events are reported under.
pub const CONTROLLER_NAME: &str = "autoapproval";

/// Connections of the Lease loop's own pool (fence and token reads, one shard at a time).
const COORDINATION_CONNECTIONS: u32 = 2;

/// How often a replica looks for claims of its own that no chain works on.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// How long shutdown waits for the Leases to be handed back.
const LEASE_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// The replica's long-running tasks under the [`Supervisor`].
const SUPERVISED_TASKS: usize = 7;

/// How often a lasting watch failure is logged again.
const WATCH_OUTAGE_REPORT_EVERY: Duration = Duration::from_secs(30);

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// Releasing claims at shutdown failed.
    #[error("releasing claims at shutdown: {0}")]
    Release(#[source] DbError),
    /// The API server does not serve AutoApprovals: the CRD was never applied.
    #[error("CRD {0} is not installed: kubectl apply -f crds/")]
    CrdMissing(String),
    /// The database records another number of shards than this replica's.
    #[error(
        "--shards {requested} disagrees with the {in_force} shards in force (recorded by {set_by} at {set_at}): \
         start with --shards {in_force}, or change the number for every replica: stop them all, \
         run DELETE FROM shard_layout as the controller's role, and start them with --shards {requested} \
         (README: Changing the number of shards)"
    )]
    ShardCount {
        /// This replica's `--shards`.
        requested: u32,
        /// The K in the database.
        in_force: u32,
        /// The replica that recorded it.
        set_by: String,
        /// When it was recorded.
        set_at: chrono::DateTime<chrono::Utc>,
    },
    /// The database belongs to another fleet: two fleets on one database
    /// would take each other's shards and fences.
    #[error(
        "--fleet {requested}: this database belongs to fleet {owner} (recorded by {set_by} at {set_at}), \
         and two fleets on one database take each other's requests: start this replica with --fleet {owner} \
         if it is one of that fleet's, or take the database over deliberately: stop every replica of {owner}, \
         run DELETE FROM shard_layout as the controller's role, and start this fleet \
         (OPERATING.md: One fleet per database)"
    )]
    Fleet {
        /// This replica's `--fleet`.
        requested: String,
        /// The fleet the database records.
        owner: String,
        /// The replica that recorded it.
        set_by: String,
        /// When it was recorded.
        set_at: chrono::DateTime<chrono::Utc>,
    },
    /// A start in active mode could not make due what shadow mode left waiting.
    #[error("handing over the requests shadow mode left waiting (auto_approve_shadow): {0}")]
    ShadowHandOver(#[source] DbError),
    /// The start-up check of the shard count could not read the database.
    #[error("checking the shard layout (fleet and number of shards): {0}")]
    Layout(#[source] DbError),
    /// Another live replica has this replica's name.
    #[error(transparent)]
    NameInUse(#[from] crate::coordination::NameInUse),
    /// One of the replica's own tasks died; the replica stopped rather than
    /// run half alive (its claims and Leases were released first).
    #[error("the {task} task stopped unexpectedly: {reason}")]
    TaskFailed {
        /// Which task: coordination, discovery or leader.
        task: &'static str,
        /// Its panic message, or that it returned early.
        reason: String,
    },
}

/// What the controller runs on.
pub struct Parts {
    /// Reaches the API server as the replica's service account (CRs,
    /// Events, Leases).
    pub client: kube::Client,
    /// The API server's URL, for the messages about it.
    pub api_server: String,
    /// The request tables and the controller's own (claims, fences, wakes).
    pub store: Database,
    /// What the chain's steps call.
    pub external: ExternalSystems,
    /// "Now" for claims, retries and the census; tests pass a manual one.
    pub clock: SharedClock,
    /// Where every task publishes; `/metrics` reads it.
    pub metrics: Metrics,
    /// Readiness, marked synced once the CR cache is.
    pub health: Option<Health>,
}

/// Runs the controller until `shutdown` resolves, then stops claiming, lets
/// in-flight chains finish within the grace period and releases the rest.
pub async fn run_until(
    settings: ControllerConfig,
    parts: Parts,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ControllerError> {
    Replica::start(settings, parts).await?.run(shutdown).await
}

/// What every part of a replica is made from: built once from [`Parts`]
/// and the settings, handed around as one `Arc`.
struct Shared {
    client: kube::Client,
    /// For the messages about the API server.
    api_server: String,
    store: Database,
    clock: SharedClock,
    metrics: Metrics,
    settings: ControllerConfig,
}

impl Shared {
    /// An API of kind `K` in the replica's namespace.
    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    /// Events reported by this replica.
    fn publisher(&self) -> Publisher {
        let reporter = Reporter {
            controller: CONTROLLER_NAME.into(),
            instance: Some(self.settings.replica_name.clone()),
        };
        Publisher::new(self.client.clone(), reporter)
    }

    /// A cleanser over `store`.
    fn cleanser(&self, store: Database) -> Arc<Cleanser> {
        Arc::new(Cleanser::new(
            store,
            self.clock.clone(),
            self.metrics.clone(),
            self.settings.stuck_threshold,
        ))
    }
}

/// The replica's one cancellation: a token per shutdown stage. Each is a
/// child of the next stage's, so a later stage, or the replica dropped,
/// cancels the earlier ones too.
struct Stages {
    /// No new claim; discovery, the census, the leader's passes and the
    /// sweeper end.
    intake: CancellationToken,
    /// The grace is over: what still runs is aborted.
    cut: CancellationToken,
    /// The claims are back: the Leases are handed back.
    leases: CancellationToken,
}

impl Stages {
    fn new() -> Self {
        let leases = CancellationToken::new();
        let cut = leases.child_token();
        let intake = cut.child_token();
        Self {
            intake,
            cut,
            leases,
        }
    }
}

/// Why the replica began to stop.
enum Stop {
    Signal,
    StreamEnded,
    TaskFailed(&'static str, String),
}

/// A started replica: its tasks and what its shutdown acts on.
struct Replica {
    shared: Arc<Shared>,
    stages: Stages,
    shards: Arc<Shards>,
    /// The kube-runtime Controller: dropping it aborts its reconciles.
    controller: BoxFuture<'static, ()>,
    failed: mpsc::Receiver<(&'static str, String)>,
    /// Ends once the Leases are handed back.
    coordinator: JoinHandle<()>,
    /// Discovery, the leader's passes, the census, the sweeper, the fleet's
    /// pause watch: they end at
    /// `intake` (discovery's own attempts at `cut`).
    loops: Vec<JoinHandle<()>>,
}

impl Replica {
    /// Checks what must hold before anything is claimed, makes the
    /// components once and starts every task.
    async fn start(settings: ControllerConfig, parts: Parts) -> Result<Self, ControllerError> {
        let Parts {
            client,
            api_server,
            store,
            external,
            clock,
            metrics,
            health,
        } = parts;
        // Shadow mode writes nothing to the business's tables, down to the
        // store's own statements (memos of recovered claims, say).
        let store = match settings.approver.mode {
            Mode::Shadow => store.in_shadow(),
            Mode::Active => store,
        };
        let shared = Arc::new(Shared {
            client,
            api_server,
            store,
            clock,
            metrics,
            settings,
        });
        let settings = &shared.settings;
        let api: Api<AutoApproval> = shared.api();
        crd_installed(&api).await?;
        layout_agrees(&shared.store, settings).await?;
        // Acting again after shadow mode: what it left waiting is due now,
        // before the first discovery turn looks.
        if settings.approver.mode == Mode::Active {
            crate::cleanser::hand_over_shadow(&shared.store, shared.clock.now())
                .await
                .map_err(ControllerError::ShadowHandOver)?;
        } else {
            info!(
                "shadow mode: every gate is evaluated and recorded; nothing is created outside and nothing is written to the business's tables"
            );
        }
        crate::coordination::refuse_a_live_namesake(
            &shared.api(),
            &settings.replica_name,
            settings.coordination.lease_duration,
            settings.coordination.retry_period,
        )
        .await?;
        let stages = Stages::new();
        // A task that ends before shutdown, by panic or otherwise, stops the
        // replica. Each of the seven tasks sends at most once: never full.
        let (failed_tx, failed) = mpsc::channel(SUPERVISED_TASKS);
        let supervise = Supervisor {
            failed: failed_tx,
            stopping: stages.intake.clone(),
        };
        let approver = Arc::new(Approver::new(
            shared.store.clone(),
            external,
            shared.clock.clone(),
            shared.metrics.clone(),
            settings.approver.clone(),
        ));

        // The Lease loop fences and recovers shards on connections of its own:
        // a pool busy with chains must not delay a renewal past its deadline.
        let coordination_store = shared.store.dedicated(COORDINATION_CONNECTIONS);
        for (name, pool) in shared.store.pools() {
            shared.metrics.watch_pool(name, pool);
        }
        shared
            .metrics
            .watch_pool("coordination", coordination_store.primary_pool());
        shared.metrics.shards(settings.coordination.shard_count);
        let (coordinator, coordination) = Coordinator::new(
            shared.api(),
            shared.publisher(),
            &shared.api_server,
            &settings.replica_name,
            shared.cleanser(coordination_store),
            shared.clock.clone(),
            shared.metrics.clone(),
            settings.coordination.clone(),
        );
        let shards = coordination.shards.clone();
        let coordinator = supervise.spawn("coordination", coordinator.run(stages.leases.clone()));

        let (cache, writer) = reflector::store::<CachedAutoApproval>();
        // Full (1024 deletions discovery has not looked at yet): the deletion
        // is dropped, and the CR comes back when its request is next a
        // candidate (due, or woken by a change) instead of at once.
        let (deleted_tx, deleted_rx) = tokio::sync::mpsc::channel(TRIGGER_CAPACITY);
        // Full: discovery and the sweeper wait (see discovery::Trigger).
        let (trigger_tx, trigger_rx) = tokio::sync::mpsc::channel(TRIGGER_CAPACITY);
        // The fleet's pause binds in the claim statements; this reads it for
        // the metrics and tells discovery when it ends.
        let brake = Arc::new(fleet::FleetBrake::default());
        let fleet_watch = supervise.spawn(
            "fleet",
            fleet::watch(
                brake.clone(),
                shared.store.clone(),
                shared.metrics.clone(),
                settings.discovery.poll_period,
                stages.intake.clone(),
            ),
        );
        let context = Arc::new(Context {
            brake: brake.clone(),
            approver: approver.clone(),
            api: api.clone(),
            events: shared.publisher(),
            shards: shards.clone(),
            clock: shared.clock.clone(),
            metrics: shared.metrics.clone(),
            settings: settings.reconcile.clone(),
            stopping: stages.intake.clone(),
            failures: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
        });
        let controller = controller_stream(
            &shared,
            watched_crs(&shared, writer, deleted_tx),
            cache.clone(),
            trigger_rx,
            context.clone(),
            stages.intake.clone(),
        );

        if let Some(health) = health {
            health.watch_api(
                coordination.api_ok.clone(),
                &shared.api_server,
                settings.api_liveness_timeout,
            );
            health.watch_holding(coordination.stuck.clone(), settings.api_liveness_timeout);
            let cache = cache.clone();
            tokio::spawn(async move {
                discovery::wait_ready(&cache).await;
                health.set_synced();
                info!("AutoApproval cache synced");
            });
        }
        let collector = Collector {
            api: api.clone(),
            cache: cache.clone(),
            store: shared.store.clone(),
            clock: shared.clock.clone(),
            metrics: shared.metrics.clone(),
            settings: settings.gc.clone(),
        };
        let sweeper = supervise.spawn(
            "sweeper",
            sweep(
                approver,
                shards.clone(),
                settings.replica_name.clone(),
                trigger_tx.clone(),
                settings.namespace.clone(),
                stages.intake.clone(),
            ),
        );
        let discovery = Discovery {
            store: shared.store.clone(),
            api,
            cache,
            trigger: trigger_tx,
            clock: shared.clock.clone(),
            metrics: shared.metrics.clone(),
            settings: settings.discovery.clone(),
            shards: shards.clone(),
            context,
            brake,
            concurrency: usize::from(settings.concurrency),
            created: Default::default(),
        };
        let discovery = supervise.spawn(
            "discovery",
            discovery.run(
                stages.intake.clone(),
                deleted_rx,
                coordination.acquired.clone(),
                stages.cut.clone(),
            ),
        );
        let census = Census {
            store: shared.store.clone(),
            clock: shared.clock.clone(),
            metrics: shared.metrics.clone(),
            config: settings.census.clone(),
        };
        let census = supervise.spawn(
            "census",
            census.run(coordination.leader.clone(), stages.intake.clone()),
        );
        let leading = supervise.spawn(
            "leader",
            lead(
                shared.cleanser(shared.store.clone()),
                collector,
                settings.cleanse_interval,
                coordination.leader,
                stages.intake.clone(),
            ),
        );
        info!(
            replica = %settings.replica_name,
            namespace = %settings.namespace,
            shards = settings.coordination.shard_count,
            "controller started"
        );
        Ok(Self {
            shared,
            stages,
            shards,
            controller,
            failed,
            coordinator,
            loops: vec![discovery, leading, census, sweeper, fleet_watch],
        })
    }

    /// Runs until `shutdown`, a task's failure or the Controller's end, then
    /// stops in stages: no new claims; (on `shutdown`) the chains in flight
    /// drain within the grace; what still runs is cut off; its claims go
    /// back, and only then the Leases, so the next holder finds them due.
    async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ControllerError> {
        // Dropped midway, the replica cancels every stage at once.
        let _cancel_on_drop = self.stages.leases.clone().drop_guard();
        let shared = self.shared.clone();
        let settings = &shared.settings;
        let stop = tokio::select! {
            () = &mut self.controller => Stop::StreamEnded,
            Some((task, reason)) = self.failed.next() => Stop::TaskFailed(task, reason),
            () = shutdown => Stop::Signal,
        };
        match &stop {
            Stop::StreamEnded => warn!("controller stream ended"),
            Stop::TaskFailed(task, reason) => {
                error!(task, %reason, "a task of this replica stopped: releasing claims and Leases, then exiting");
            }
            Stop::Signal => info!(grace = ?settings.shutdown_grace, "shutting down: no new claims"),
        }
        // 1. Intake: no new claim; the loops end.
        self.shards.stop_claiming();
        self.stages.intake.cancel();
        // 2. Drain: after a signal, the chains in flight finish within the grace.
        if let Stop::Signal = stop {
            self.drain(settings.shutdown_grace).await;
        }
        // 3. Cut: dropping the Controller aborts what still runs, and
        // discovery aborts its own attempts.
        drop(self.controller);
        self.stages.cut.cancel();
        for task in self.loops {
            let _ = task.await;
        }
        // 4. Claims back, then 5. Leases back: the next holder finds them due.
        let now = shared.clock.now();
        let released = shared
            .store
            .release_all(&settings.replica_name, &self.shards.tokens(), &[], now)
            .await;
        self.stages.leases.cancel();
        // An API server that does not answer must not hold the exit: Leases
        // left behind expire after the lease duration.
        if tokio::time::timeout(LEASE_RELEASE_TIMEOUT, self.coordinator)
            .await
            .is_err()
        {
            warn!(api = %shared.api_server, "the API server did not take the Leases back in time; they will expire");
        }
        let released = released.map_err(ControllerError::Release)?;
        for request_id in &released {
            info!(request_id, "claim released at shutdown");
        }
        info!(released = released.len(), "controller stopped");
        match stop {
            Stop::TaskFailed(task, reason) => Err(ControllerError::TaskFailed { task, reason }),
            Stop::Signal | Stop::StreamEnded => Ok(()),
        }
    }

    /// Waits, within `grace`, for the chains in flight (no new claim starts
    /// now) or the Controller's end.
    async fn drain(&mut self, grace: Duration) {
        let drained = async {
            while self.shards.in_flight() > 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            () = &mut self.controller => {}
            () = drained => {}
            () = tokio::time::sleep(grace) => {
                warn!("grace period over with chains still running");
            }
        }
    }
}

/// The CRs as the Controller sees them. Only spec changes and a retry asked
/// for trigger a reconcile from the watch: our own status writes would
/// otherwise come straight back as work. A CR that waits quietly beyond one
/// poll period is not reconciled on sight either (a restart or a re-list
/// sees every CR): the candidate query finds it when it is due. A deletion
/// goes to discovery, which puts back the CR of an open request.
fn watched_crs(
    shared: &Shared,
    writer: reflector::store::Writer<CachedAutoApproval>,
    deleted: tokio::sync::mpsc::Sender<i64>,
) -> impl futures::Stream<Item = Result<CachedAutoApproval, watcher::Error>> + Send + 'static {
    let horizon =
        chrono::Duration::from_std(shared.settings.discovery.poll_period).unwrap_or_default();
    let clock = shared.clock.clone();
    watcher(shared.api(), watcher::Config::default())
        .default_backoff()
        .modify(CachedAutoApproval::forget_version)
        .reflect(writer)
        .inspect_ok(move |event| {
            if let watcher::Event::Delete(cr) = event {
                let _ = deleted.try_send(cr.spec.request_id);
            }
        })
        .applied_objects()
        .predicate_filter(
            predicates::generation::<CachedAutoApproval>.combine(retry_asked),
            Default::default(),
        )
        .try_filter(move |cr| {
            let quiet = cr
                .settled_until()
                .is_some_and(|due| due > clock.now() + horizon);
            futures::future::ready(!quiet)
        })
}

/// kube-runtime's Controller over `crs` and the triggers, its results
/// logged; it stops taking work at `intake`.
fn controller_stream(
    shared: &Shared,
    crs: impl futures::Stream<Item = Result<CachedAutoApproval, watcher::Error>> + Send + 'static,
    cache: reflector::Store<CachedAutoApproval>,
    triggers: tokio::sync::mpsc::Receiver<ObjectRef<CachedAutoApproval>>,
    context: Arc<Context>,
    intake: CancellationToken,
) -> BoxFuture<'static, ()> {
    let triggers = futures::stream::unfold(triggers, |mut rx| async move {
        rx.recv().await.map(|key| (key, rx))
    });
    // The watcher retries a failing list or watch every few seconds; one
    // line when it starts failing and one per period after.
    let mut outage = Outage::new(WATCH_OUTAGE_REPORT_EVERY);
    let api_server = shared.api_server.clone();
    Controller::for_stream(crs, cache)
        .with_config(controller::Config::default().concurrency(shared.settings.concurrency))
        .reconcile_on(triggers)
        .graceful_shutdown_on(intake.cancelled_owned())
        .run(reconcile::reconcile, reconcile::error_policy, context)
        .for_each(move |result| {
            match result {
                Err(controller::Error::QueueError(error)) => {
                    let lasted = match outage.failed(tokio::time::Instant::now()) {
                        Report::Began => Some(Duration::ZERO),
                        Report::Still(lasted) => Some(lasted),
                        _ => None,
                    };
                    if let Some(lasted) = lasted {
                        warn!(api = %api_server, %error, outage_s = lasted.as_secs(), "cannot list or watch AutoApprovals; retrying");
                    }
                }
                Err(error) => warn!(%error, "controller"),
                Ok(_) => {
                    outage.succeeded(tokio::time::Instant::now());
                }
            }
            futures::future::ready(())
        })
        .boxed()
}

/// Fails, naming the fleet that owns the database and how to take it
/// over, when the database records another fleet than this replica's; and,
/// saying which value is in force and how to change it, when it records
/// another K than this replica's `--shards`.
async fn layout_agrees(
    store: &Database,
    settings: &ControllerConfig,
) -> Result<(), ControllerError> {
    let requested = settings.coordination.shard_count;
    let layout = store
        .agree_layout(requested, &settings.fleet, &settings.replica_name)
        .await
        .map_err(ControllerError::Layout)?;
    if layout.fleet != settings.fleet {
        return Err(ControllerError::Fleet {
            requested: settings.fleet.clone(),
            owner: layout.fleet,
            set_by: layout.set_by,
            set_at: layout.set_at,
        });
    }
    if layout.adopted {
        info!(
            fleet = %layout.fleet,
            shards = layout.shard_count,
            "the shard layout an older version recorded had no fleet: it is now this fleet's"
        );
    }
    if layout.shard_count != requested {
        return Err(ControllerError::ShardCount {
            requested,
            in_force: layout.shard_count,
            set_by: layout.set_by,
            set_at: layout.set_at,
        });
    }
    Ok(())
}

/// Fails with the fix to apply when the API server has no AutoApproval
/// resource; any other error is left to the watcher, which retries.
async fn crd_installed(api: &Api<AutoApproval>) -> Result<(), ControllerError> {
    use kube::CustomResourceExt;
    match api.list(&kube::api::ListParams::default().limit(1)).await {
        Err(kube::Error::Api(e)) if e.code == 404 => Err(ControllerError::CrdMissing(
            AutoApproval::crd_name().to_owned(),
        )),
        _ => Ok(()),
    }
}

/// The retry asked for on a CR, for the watch's predicate: a new value is
/// a reconcile.
fn retry_asked(cr: &CachedAutoApproval) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let ask = cr.retry.as_ref()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    ask.value.hash(&mut hasher);
    Some(hasher.finish())
}

// === impl Supervisor ===

/// Spawns the replica's long-running tasks and reports the one that ends
/// while the replica is not stopping, with its panic message.
struct Supervisor {
    failed: mpsc::Sender<(&'static str, String)>,
    stopping: CancellationToken,
}

impl Supervisor {
    fn spawn<F>(&self, task: &'static str, work: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut failed = self.failed.clone();
        let stopping = self.stopping.clone();
        tokio::spawn(async move {
            let ended = std::panic::AssertUnwindSafe(work).catch_unwind().await;
            let reason = match ended {
                Err(panic) => panic_message(panic.as_ref()),
                Ok(()) if !stopping.is_cancelled() => "it returned before shutdown".to_owned(),
                Ok(()) => return,
            };
            let _ = failed.try_send((task, reason));
        })
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    format!("panicked: {text}")
}

/// Every [`SWEEP_EVERY`], gives back this replica's claims that no chain of
/// it works on (their outcome could not be written, and then neither could
/// the release), and reconciles their CRs so they run again at once.
async fn sweep(
    approver: Arc<Approver>,
    shards: Arc<Shards>,
    holder: String,
    trigger: discovery::Trigger,
    namespace: String,
    stopping: CancellationToken,
) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stopping.cancelled() => return,
        }
        let tokens = shards.tokens();
        if tokens.is_empty() {
            continue;
        }
        match approver.release_idle(&holder, &tokens).await {
            Ok(released) => {
                for request_id in released {
                    let key = ObjectRef::new(&crd::cr_name(request_id)).within(&namespace);
                    let _ = trigger.send(key).await;
                }
            }
            Err(error) => debug!(%error, "cannot look for idle claims; next sweep retries"),
        }
    }
}

/// While this replica leads: the cleanser and the CR garbage collector,
/// each on its own interval. Leadership lost stops both until regained.
async fn lead(
    cleanser: Arc<Cleanser>,
    collector: Collector,
    cleanse_every: Duration,
    mut leader: watch::Receiver<bool>,
    stopping: CancellationToken,
) {
    loop {
        tokio::select! {
            led = async { leader.wait_for(|l| *l).await.map(|_| ()) } => if led.is_err() { return },
            () = stopping.cancelled() => return,
        }
        let mut cleanse = tokio::time::interval(cleanse_every);
        let mut collect = tokio::time::interval(collector.settings.interval);
        cleanse.set_missed_tick_behavior(MissedTickBehavior::Delay);
        collect.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cleanse.tick() => {
                    if let Err(error) = cleanser.run_once().await {
                        warn!(%error, "cleanser pass failed");
                    }
                }
                _ = collect.tick() => {
                    if let Err(error) = collector.run_once().await {
                        warn!(%error, "CR garbage collection failed");
                    }
                }
                _ = async { leader.wait_for(|l| !*l).await.map(|_| ()) } => break,
                () = stopping.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_or_returns_early_is_reported_and_one_that_stops_is_not() {
        let (failed, mut reports) = mpsc::channel(SUPERVISED_TASKS);
        let stopping = CancellationToken::new();
        let supervisor = Supervisor {
            failed,
            stopping: stopping.clone(),
        };
        supervisor
            .spawn("discovery", async { panic!("window out of range") })
            .await
            .unwrap();
        supervisor.spawn("leader", async {}).await.unwrap();
        stopping.cancel();
        supervisor.spawn("coordination", async {}).await.unwrap();
        drop(supervisor);
        let reports: Vec<_> = reports.by_ref().collect().await;
        assert_eq!(
            reports,
            [
                ("discovery", "panicked: window out of range".to_owned()),
                ("leader", "it returned before shutdown".to_owned()),
            ]
        );
    }
}
