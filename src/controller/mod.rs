//! The controller: AutoApproval CRs mirroring requests, discovery feeding
//! kube-runtime's `Controller`, and the level-triggered reconcile.

pub mod cached;
pub mod config;
pub mod crd;
pub mod discovery;
pub mod gc;
pub mod reconcile;
pub mod status;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use futures::{FutureExt, StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::utils::Predicate;
use kube::runtime::{WatchStreamExt, predicates, reflector, watcher};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tracing::{debug, error, info, warn};

use crate::approval::Approver;
use crate::census::Census;
use crate::cleanser::Cleanser;
use crate::clock::SharedClock;
use crate::coordination::Coordinator;
use crate::endpoints::Health;
use crate::events::Publisher;
use crate::external::ExternalSystems;
use crate::outage::{Outage, Report};
use crate::store::{Store, StoreError};
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
const SUPERVISED_TASKS: usize = 6;

/// How often a lasting watch failure is logged again.
const WATCH_OUTAGE_REPORT_EVERY: Duration = Duration::from_secs(30);

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// Releasing claims at shutdown failed.
    #[error("releasing claims at shutdown: {0}")]
    Release(#[source] StoreError),
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
        /// Who recorded it.
        set_by: String,
        /// When.
        set_at: chrono::DateTime<chrono::Utc>,
    },
    /// The start-up check of the shard count could not read the database.
    #[error("checking the number of shards: {0}")]
    Layout(#[source] StoreError),
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
    /// The Kubernetes client.
    pub client: kube::Client,
    /// The API server's URL, for the messages about it.
    pub api_server: String,
    /// The store.
    pub store: Store,
    /// The external systems.
    pub external: ExternalSystems,
    /// The clock.
    pub clock: SharedClock,
    /// Metrics.
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
    let Parts {
        client,
        api_server,
        store,
        external,
        clock,
        metrics,
        health,
    } = parts;
    let api: Api<AutoApproval> = Api::namespaced(client.clone(), &settings.namespace);
    crd_installed(&api).await?;
    shards_agree(&store, &settings).await?;
    crate::coordination::refuse_a_live_namesake(
        &Api::namespaced(client.clone(), &settings.namespace),
        &settings.replica_name,
        settings.coordination.lease_duration,
        settings.coordination.retry_period,
    )
    .await?;
    let approver = Arc::new(Approver::new(
        store.clone(),
        external,
        clock.clone(),
        metrics.clone(),
        settings.approver.clone(),
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    let cleanser = Arc::new(Cleanser::new(
        store.clone(),
        clock.clone(),
        metrics.clone(),
        settings.stuck_threshold,
    ));
    // The Lease loop fences and recovers shards on connections of its own:
    // a pool busy with chains must not delay a renewal past its deadline.
    let coordination_store = store.dedicated(COORDINATION_CONNECTIONS);
    for (name, pool) in store.pools() {
        metrics.watch_pool(name, pool);
    }
    metrics.watch_pool("coordination", coordination_store.primary_pool());
    metrics.shards(settings.coordination.shard_count);
    let fencer = Arc::new(Cleanser::new(
        coordination_store,
        clock.clone(),
        metrics.clone(),
        settings.stuck_threshold,
    ));
    let reporter = Reporter {
        controller: CONTROLLER_NAME.into(),
        instance: Some(settings.replica_name.clone()),
    };
    let (coordinator, coordination) = Coordinator::new(
        Api::namespaced(client.clone(), &settings.namespace),
        Publisher::new(client.clone(), reporter.clone()),
        &api_server,
        &settings.replica_name,
        fencer,
        clock.clone(),
        metrics.clone(),
        settings.coordination.clone(),
    );
    let shards = coordination.shards.clone();
    let (release_tx, release_rx) = watch::channel(false);
    // True once the shutdown's grace is over: what still runs is cut off.
    let (cut_tx, cut_rx) = watch::channel(false);
    // A task that ends before shutdown, by panic or otherwise, stops the
    // replica. Each of the six tasks sends at most once: never full.
    let (failed_tx, mut failed_rx) = mpsc::channel(SUPERVISED_TASKS);
    let supervise = Supervisor {
        failed: failed_tx,
        stopping: stop_rx.clone(),
    };
    let coordinator = supervise.spawn("coordination", coordinator.run(release_rx));

    // Only spec changes and a retry asked for trigger a reconcile from the
    // watch: our own status writes would otherwise come straight back as
    // work. A CR that waits quietly beyond one poll period is not reconciled
    // on sight either (a restart or a re-list sees every CR): the candidate
    // query finds it when it is due. A deletion goes to discovery, which
    // puts back the CR of an open request.
    let (cache, writer) = reflector::store::<CachedAutoApproval>();
    // Full (1024 deletions discovery has not looked at yet): the deletion
    // is dropped, and the CR comes back when its request is next a
    // candidate (due, or woken by a change) instead of at once.
    let (deleted_tx, deleted_rx) = tokio::sync::mpsc::channel(TRIGGER_CAPACITY);
    let horizon = chrono::Duration::from_std(settings.discovery.poll_period).unwrap_or_default();
    let watched: Api<CachedAutoApproval> = Api::namespaced(client.clone(), &settings.namespace);
    let crs = watcher(watched, watcher::Config::default())
        .default_backoff()
        .modify(CachedAutoApproval::forget_version)
        .reflect(writer)
        .inspect_ok(move |event| {
            if let watcher::Event::Delete(cr) = event {
                let _ = deleted_tx.try_send(cr.spec.request_id);
            }
        })
        .applied_objects()
        .predicate_filter(
            predicates::generation::<CachedAutoApproval>.combine(retry_asked),
            Default::default(),
        )
        .try_filter({
            let clock = clock.clone();
            move |cr| {
                let quiet = cr
                    .settled_until()
                    .is_some_and(|due| due > clock.now() + horizon);
                futures::future::ready(!quiet)
            }
        });
    // Full: discovery and the sweeper wait (see discovery::Trigger).
    let (trigger_tx, trigger_rx) = tokio::sync::mpsc::channel(TRIGGER_CAPACITY);
    let trigger_rx = futures::stream::unfold(trigger_rx, |mut rx| async move {
        rx.recv().await.map(|key| (key, rx))
    });

    let context = Arc::new(Context {
        approver: approver.clone(),
        api: api.clone(),
        events: Publisher::new(client.clone(), reporter),
        shards: shards.clone(),
        clock: clock.clone(),
        metrics: metrics.clone(),
        settings: settings.reconcile.clone(),
        stopping: stop_rx.clone(),
        failures: Mutex::new(HashMap::new()),
        written: Mutex::new(HashMap::new()),
    });
    let mut stopping = stop_rx.clone();
    let controller = Controller::for_stream(crs, cache.clone())
        .with_config(controller::Config::default().concurrency(settings.concurrency))
        .reconcile_on(trigger_rx)
        .graceful_shutdown_on(async move { discovery::stopped(&mut stopping).await })
        .run(reconcile::reconcile, reconcile::error_policy, context.clone())
        .for_each({
            // The watcher retries a failing list or watch every few seconds;
            // one line when it starts failing and one per period after.
            let mut outage = Outage::new(WATCH_OUTAGE_REPORT_EVERY);
            let api_server = api_server.clone();
            move |result| {
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
            }
        });

    if let Some(health) = health {
        health.watch_api(
            coordination.api_ok.clone(),
            &api_server,
            settings.api_liveness_timeout,
        );
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
        store: store.clone(),
        clock: clock.clone(),
        metrics: metrics.clone(),
        settings: settings.gc.clone(),
    };
    let sweeper = supervise.spawn(
        "sweeper",
        sweep(
            approver.clone(),
            shards.clone(),
            settings.replica_name.clone(),
            trigger_tx.clone(),
            settings.namespace.clone(),
            stop_rx.clone(),
        ),
    );
    let discovery = Discovery {
        store: store.clone(),
        api,
        cache,
        trigger: trigger_tx,
        clock: clock.clone(),
        metrics: metrics.clone(),
        settings: settings.discovery.clone(),
        shards: shards.clone(),
        context,
        concurrency: usize::from(settings.concurrency),
        created: Default::default(),
    };
    let discovery = supervise.spawn(
        "discovery",
        discovery.run(
            stop_rx.clone(),
            deleted_rx,
            coordination.acquired.clone(),
            cut_rx,
        ),
    );
    let census = Census {
        store: store.clone(),
        clock: clock.clone(),
        metrics: metrics.clone(),
        config: settings.census.clone(),
    };
    let census = supervise.spawn(
        "census",
        census.run(coordination.leader.clone(), stop_rx.clone()),
    );
    let leading = supervise.spawn(
        "leader",
        lead(
            cleanser,
            collector,
            settings.cleanse_interval,
            coordination.leader,
            stop_rx,
        ),
    );

    info!(
        replica = %settings.replica_name,
        namespace = %settings.namespace,
        shards = settings.coordination.shard_count,
        "controller started"
    );
    let mut controller = Box::pin(controller);
    let mut failure = None;
    tokio::select! {
        () = &mut controller => warn!("controller stream ended"),
        Some((task, reason)) = failed_rx.next() => {
            error!(task, %reason, "a task of this replica stopped: releasing claims and Leases, then exiting");
            failure = Some(ControllerError::TaskFailed { task, reason });
        }
        () = shutdown => {
            info!(grace = ?settings.shutdown_grace, "shutting down: no new claims");
            shards.stop_claiming();
            let _ = stop_tx.send(true);
            // No new claim starts now; wait only for the chains that run.
            let drained = async {
                while shards.in_flight() > 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            tokio::select! {
                () = &mut controller => {}
                () = drained => {}
                () = tokio::time::sleep(settings.shutdown_grace) => {
                    warn!("grace period over with chains still running");
                }
            }
        }
    }
    shards.stop_claiming();
    let _ = stop_tx.send(true);
    // Dropping the controller aborts whatever still runs; then its claims go
    // back, and only then the Leases, so the next holder finds them due.
    drop(controller);
    let _ = cut_tx.send(true);
    let _ = discovery.await;
    let _ = leading.await;
    let _ = census.await;
    let _ = sweeper.await;
    let released = store
        .release_all(&settings.replica_name, &shards.tokens(), &[], clock.now())
        .await;
    let _ = release_tx.send(true);
    // An API server that does not answer must not hold the exit: Leases
    // left behind expire after the lease duration.
    if tokio::time::timeout(LEASE_RELEASE_TIMEOUT, coordinator)
        .await
        .is_err()
    {
        warn!(api = %api_server, "the API server did not take the Leases back in time; they will expire");
    }
    let released = released.map_err(ControllerError::Release)?;
    for request_id in &released {
        info!(request_id, "claim released at shutdown");
    }
    info!(released = released.len(), "controller stopped");
    failure.map_or(Ok(()), Err)
}

/// Fails, saying which value is in force and how to change it, when the
/// database records another K than this replica's `--shards`.
async fn shards_agree(store: &Store, settings: &ControllerConfig) -> Result<(), ControllerError> {
    let requested = settings.coordination.shard_count;
    let layout = store
        .agree_shard_count(requested, &settings.replica_name)
        .await
        .map_err(ControllerError::Layout)?;
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
    stopping: watch::Receiver<bool>,
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
                Ok(()) if !*stopping.borrow() => "it returned before shutdown".to_owned(),
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
    shards: Arc<crate::coordination::Shards>,
    holder: String,
    trigger: discovery::Trigger,
    namespace: String,
    mut stopping: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = discovery::stopped(&mut stopping) => return,
        }
        let tokens = shards.tokens();
        if tokens.is_empty() {
            continue;
        }
        match approver.release_idle(&holder, &tokens).await {
            Ok(released) => {
                for request_id in released {
                    let key = kube::runtime::reflector::ObjectRef::new(&crd::cr_name(request_id))
                        .within(&namespace);
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
    mut stopping: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            led = async { leader.wait_for(|l| *l).await.map(|_| ()) } => if led.is_err() { return },
            () = discovery::stopped(&mut stopping) => return,
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
                () = discovery::stopped(&mut stopping) => return,
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
        let (stop, stopping) = watch::channel(false);
        let supervisor = Supervisor { failed, stopping };
        supervisor
            .spawn("discovery", async { panic!("window out of range") })
            .await
            .unwrap();
        supervisor.spawn("leader", async {}).await.unwrap();
        stop.send(true).unwrap();
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
