//! The controller: AutoApproval CRs mirroring requests, discovery feeding
//! kube-runtime's `Controller`, and the level-triggered reconcile.

pub mod config;
pub mod crd;
pub mod discovery;
pub mod reconcile;
pub mod status;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::channel::mpsc;
use futures::{StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, predicates, reflector, watcher};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::approval::Approver;
use crate::cleanser::Cleanser;
use crate::clock::SharedClock;
use crate::domain::Fence;
use crate::endpoints::Health;
use crate::external::ExternalSystems;
use crate::store::{Store, StoreError};
use crate::telemetry::Metrics;

use self::config::Settings;
use self::crd::AutoApproval;
use self::discovery::Discovery;
use self::reconcile::Context;

/// The name Events are reported under.
pub const CONTROLLER_NAME: &str = "autoapproval";

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// Releasing claims at shutdown failed.
    #[error("releasing claims at shutdown: {0}")]
    Release(#[source] StoreError),
}

/// What the controller runs on.
pub struct Parts {
    /// The Kubernetes client.
    pub client: kube::Client,
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

/// This replica's fence: its name, and a token that differs at every start
/// so a restarted replica never passes for its former self.
pub fn fence_for(replica_name: &str) -> Fence {
    let token = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    Fence {
        holder: replica_name.to_owned(),
        token,
    }
}

/// Runs the controller until `shutdown` resolves, then stops claiming, lets
/// in-flight chains finish within the grace period and releases the rest.
pub async fn run_until(
    settings: Settings,
    parts: Parts,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ControllerError> {
    let Parts {
        client,
        store,
        external,
        clock,
        metrics,
        health,
    } = parts;
    let fence = fence_for(&settings.replica_name);
    let api: Api<AutoApproval> = Api::namespaced(client.clone(), &settings.namespace);
    let approver = Arc::new(Approver::new(
        store.clone(),
        external,
        clock.clone(),
        metrics.clone(),
        settings.approver.clone(),
    ));
    let (stop_tx, stop_rx) = watch::channel(false);

    // Only spec changes (generation) trigger a reconcile from the watch: our
    // own status writes would otherwise come straight back as work. A
    // deletion goes to discovery, which puts back the CR of an open request.
    let (cache, writer) = reflector::store();
    let (deleted_tx, deleted_rx) = mpsc::unbounded();
    let crs = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .inspect_ok(move |event| {
            if let watcher::Event::Delete(cr) = event {
                let _ = deleted_tx.unbounded_send(cr.spec.request_id);
            }
        })
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let (trigger_tx, trigger_rx) = mpsc::unbounded();

    let reporter = Reporter {
        controller: CONTROLLER_NAME.into(),
        instance: Some(settings.replica_name.clone()),
    };
    let context = Arc::new(Context {
        approver: approver.clone(),
        api: api.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        fence: fence.clone(),
        clock: clock.clone(),
        metrics: metrics.clone(),
        settings: settings.reconcile.clone(),
        stopping: stop_rx.clone(),
        failures: Mutex::new(HashMap::new()),
    });
    let mut stopping = stop_rx.clone();
    let controller = Controller::for_stream(crs, cache.clone())
        .with_config(controller::Config::default().concurrency(settings.concurrency))
        .reconcile_on(trigger_rx)
        .graceful_shutdown_on(async move { discovery::stopped(&mut stopping).await })
        .run(reconcile::reconcile, reconcile::error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                warn!(%error, "controller");
            }
        });

    if let Some(health) = health {
        let cache = cache.clone();
        tokio::spawn(async move {
            discovery::wait_ready(&cache).await;
            health.set_synced();
            info!("AutoApproval cache synced");
        });
    }
    let discovery = Discovery {
        store: store.clone(),
        api,
        cache,
        trigger: trigger_tx,
        clock: clock.clone(),
        metrics: metrics.clone(),
        settings: settings.discovery.clone(),
    };
    let discovery = tokio::spawn(discovery.run(stop_rx.clone(), deleted_rx));
    let cleanser = Cleanser::new(
        store.clone(),
        clock.clone(),
        metrics,
        settings.stuck_threshold,
    );
    let cleanser = tokio::spawn(cleanse_every(cleanser, settings.cleanse_interval, stop_rx));

    info!(
        replica = %fence.holder,
        namespace = %settings.namespace,
        "controller started"
    );
    let mut controller = Box::pin(controller);
    tokio::select! {
        () = &mut controller => warn!("controller stream ended"),
        () = shutdown => {
            info!(grace = ?settings.shutdown_grace, "shutting down: no new claims");
            let _ = stop_tx.send(true);
            if tokio::time::timeout(settings.shutdown_grace, &mut controller).await.is_err() {
                warn!("grace period over with chains still running");
            }
        }
    }
    let _ = stop_tx.send(true);
    // Dropping the controller aborts whatever still runs; then its claims go back.
    drop(controller);
    let _ = discovery.await;
    let _ = cleanser.await;
    let released = store
        .release_all(&fence, clock.now())
        .await
        .map_err(ControllerError::Release)?;
    for request_id in &released {
        info!(request_id, "claim released at shutdown");
    }
    info!(released = released.len(), "controller stopped");
    Ok(())
}

async fn cleanse_every(cleanser: Cleanser, every: Duration, mut stopping: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = discovery::stopped(&mut stopping) => return,
        }
        if let Err(error) = cleanser.run_once().await {
            warn!(%error, "cleanser pass failed");
        }
    }
}
