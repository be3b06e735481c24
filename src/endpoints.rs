//! The controller's HTTP endpoints: `/healthz` (the process serves and has
//! heard from the API server recently), `/readyz` (the database and the API
//! server answer, the CR cache has synced, and the replica's Lease calls have
//! not kept it from holding any shard) and `/metrics` (Prometheus text).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::db::Database;
use crate::telemetry::Metrics;

/// How long a readiness check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// What `/healthz` and `/readyz` check.
#[derive(Clone)]
pub struct Health {
    store: Database,
    client: kube::Client,
    synced: Arc<AtomicBool>,
    metrics: Metrics,
    api: Arc<OnceLock<ApiContact>>,
    holding: Arc<OnceLock<Holding>>,
}

/// Since when the replica has been unable to hold any shard, and how long readiness
/// tolerates it.
struct Holding {
    stuck: watch::Receiver<Option<crate::coordination::Stuck>>,
    timeout: Duration,
}

/// When the Lease loop last heard from the API server, and how long
/// liveness tolerates silence.
struct ApiContact {
    last_ok: watch::Receiver<Instant>,
    address: String,
    timeout: Duration,
}

impl Health {
    /// Checks over these components; not synced yet.
    pub fn new(store: Database, client: kube::Client, metrics: Metrics) -> Self {
        Self {
            store,
            client,
            synced: Arc::default(),
            metrics,
            api: Arc::default(),
            holding: Arc::default(),
        }
    }

    /// From now on `/healthz` fails when `last_ok` (the Lease loop's last
    /// answer from the API server at `address`) is older than `timeout`.
    pub fn watch_api(&self, last_ok: watch::Receiver<Instant>, address: &str, timeout: Duration) {
        let _ = self.api.set(ApiContact {
            last_ok,
            address: address.to_owned(),
            timeout,
        });
    }

    /// From now on `/readyz` fails once the replica has held no shard it may claim in,
    /// because its Lease calls fail, for longer than `timeout` (`stuck`, from the Lease loop).
    /// A replica holding no shard because others hold them all stays ready.
    pub fn watch_holding(
        &self,
        stuck: watch::Receiver<Option<crate::coordination::Stuck>>,
        timeout: Duration,
    ) {
        let _ = self.holding.set(Holding { stuck, timeout });
    }

    /// `Err` once the replica has been unable to hold any shard for the timeout.
    fn holds_shards(&self) -> Result<(), String> {
        let Some(holding) = self.holding.get() else {
            return Ok(());
        };
        let stuck = holding.stuck.borrow();
        match stuck.as_ref() {
            Some(stuck) if stuck.since.elapsed() > holding.timeout => Err(format!(
                "no shard can be held for {} s (--api-liveness-timeout {} s): {}",
                stuck.since.elapsed().as_secs(),
                holding.timeout.as_secs(),
                stuck.why
            )),
            _ => Ok(()),
        }
    }

    /// `Ok` while alive, else why the kubelet should restart this replica.
    pub fn live(&self) -> Result<(), String> {
        let Some(api) = self.api.get() else {
            return Ok(());
        };
        let silent = api.last_ok.borrow().elapsed();
        if silent > api.timeout {
            return Err(format!(
                "no answer from the API server at {} for {} s (--api-liveness-timeout {} s)",
                api.address,
                silent.as_secs(),
                api.timeout.as_secs()
            ));
        }
        Ok(())
    }

    /// Marks the CR cache as synced.
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// `Ok` when ready, else the check that failed.
    pub async fn ready(&self) -> Result<(), String> {
        if !self.synced.load(Ordering::Acquire) {
            return Err("AutoApproval cache not synced yet".into());
        }
        self.holds_shards()?;
        match tokio::time::timeout(CHECK_TIMEOUT, self.store.ping()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("database: {e}")),
            Err(_) => return Err("database: no answer within 2s".into()),
        }
        match tokio::time::timeout(CHECK_TIMEOUT, self.client.apiserver_version()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("API server: {e}")),
            Err(_) => Err("API server: no answer within 2s".into()),
        }
    }
}

/// The router of the three endpoints.
pub fn router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health)
}

async fn healthz(State(health): State<Health>) -> impl IntoResponse {
    match health.live() {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not live: {why}\n"),
        ),
    }
}

async fn readyz(State(health): State<Health>) -> impl IntoResponse {
    match health.ready().await {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

async fn metrics(State(health): State<Health>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        health.metrics.encode(),
    )
}
