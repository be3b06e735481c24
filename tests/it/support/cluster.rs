//! A cluster in one process: the test API server (or the real kube-apiserver) with the
//! CRD, the simulator, and one controller replica over the test's database; plus
//! `eventually`, the deadline every wait in the tests goes through.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use autoapproval::clock::SystemClock;
use autoapproval::controller::config::ControllerConfig;
use autoapproval::controller::crd::{self, AutoApproval, Phase};
use autoapproval::controller::{Parts, run_until};
use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::telemetry::Metrics;
use autoapproval_sim::{Faults, SimConfig, SimHandle, Simulator};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, CustomResourceExt};
use kube_testserver::{Options, TestServer};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::control_plane::{RealNamespace, real_namespace_on};
use super::db::{AsDb, Db};
use super::rows::NewRequest;

pub const NS: &str = "default";

/// Which API server a test runs against (`on_both_servers!`).
#[derive(Clone, Copy, Debug)]
pub enum On {
    TestServer,
    RealServer,
}

/// The API server of a [`Cluster`].
pub enum ApiServer {
    /// kube-testserver: everything allowed, faults on demand.
    Test(TestServer),
    /// The real kube-apiserver, the controller as the chart's ServiceAccount.
    Real(Box<RealNamespace>),
}

impl ApiServer {
    /// The test API server, for a test that injects faults or counts requests.
    pub fn test(&self) -> &TestServer {
        match self {
            ApiServer::Test(server) => server,
            ApiServer::Real(_) => panic!("this test needs kube-testserver, not the real server"),
        }
    }

    pub fn faults(&self) -> kube_testserver::Faults {
        self.test().faults()
    }

    pub fn request_counts(&self) -> std::collections::BTreeMap<String, u64> {
        self.test().request_counts()
    }

    pub fn url(&self) -> String {
        match self {
            ApiServer::Test(server) => server.url(),
            ApiServer::Real(real) => real.plane.url().to_owned(),
        }
    }
}

/// A running controller with everything it talks to.
pub struct Cluster {
    pub server: ApiServer,
    /// The tests' own client: allowed everything, default namespace `ns`.
    pub client: Client,
    /// The replica's client: on the real server, the chart's ServiceAccount.
    controller_client: Client,
    /// The namespace of the CRs, Events and Leases.
    pub ns: String,
    pub sim: SimHandle,
    pub pool: Db,
    pub metrics: Metrics,
    pub api: Api<AutoApproval>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), autoapproval::controller::ControllerError>>>,
}

/// The controller's settings for tests: a poll period longer than any test, so whatever
/// happens was the doing of NOTIFY, the CR watch or a requeue.
pub fn test_settings() -> ControllerConfig {
    let mut s = super::engine::defaults();
    s.discovery.poll_period = Duration::from_secs(3600);
    s.shutdown_grace = Duration::from_secs(5);
    s
}

/// `test_settings` with Leases of 3 s (renew deadline 2 s, turns every
/// 250 ms), for tests that watch renewals, expiries and takeovers.
pub fn quick_leases() -> ControllerConfig {
    let mut s = test_settings();
    s.coordination.lease_duration = Duration::from_secs(3);
    s.coordination.renew_deadline = Duration::from_secs(2);
    s.coordination.retry_period = Duration::from_millis(250);
    s
}

/// A Lease named `name` with `role` as another replica, `holder`, writes it
/// (no protocol annotation: as the previous protocol, or a replica about to
/// die, leaves it), valid 3 s as `quick_leases` has them.
pub fn foreign_lease(name: &str, role: &str, holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    autoapproval::coordination::ROLE_LABEL.to_owned(),
                    role.to_owned(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(3),
            lease_transitions: Some(1),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

/// Every change to the Leases from now on.
pub async fn lease_changes(
    leases: &Api<Lease>,
) -> BoxStream<'static, kube::Result<WatchEvent<Lease>>> {
    let version = leases
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .unwrap_or_default();
    leases
        .watch(&WatchParams::default(), &version)
        .await
        .expect("watch")
        .boxed()
}

pub fn client_for(server: &TestServer) -> Client {
    let mut config = kube::Config::new(server.url().parse().expect("url"));
    config.default_namespace = NS.into();
    Client::try_from(config).expect("client")
}

/// The test API server with the CRD installed, a client of it, and the
/// simulator.
pub async fn backends() -> (TestServer, Client, SimHandle) {
    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    let client = client_for(&server);
    install_crd(&client).await;
    (server, client, simulator().await)
}

/// The simulator of the external systems, answering at once.
pub async fn simulator() -> SimHandle {
    Simulator::start("127.0.0.1:0".parse().expect("addr"), SimConfig::default())
        .await
        .expect("simulator")
}

/// Applies the CRD to the test API server.
pub async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &AutoApproval::crd())
        .await
        .expect("CRD created");
}

impl Cluster {
    pub async fn start(pool: impl AsDb) -> Cluster {
        Self::with(pool, test_settings()).await
    }

    pub async fn with(pool: impl AsDb, settings: ControllerConfig) -> Cluster {
        Self::with_faults(pool, settings, Faults::default()).await
    }

    /// Like `with`, the simulator failing with `faults` from the start.
    pub async fn with_faults(
        pool: impl AsDb,
        settings: ControllerConfig,
        faults: Faults,
    ) -> Cluster {
        let (server, client, sim) = backends().await;
        sim.set_faults(faults).expect("faults");
        Self::on_test_server(pool, settings, server, client, sim)
    }

    /// Like `with`, on an API server the test prepared first (Leases left
    /// by other replicas, say).
    pub async fn with_server(
        pool: impl AsDb,
        settings: ControllerConfig,
        server: TestServer,
        client: Client,
    ) -> Cluster {
        Self::on_test_server(pool, settings, server, client, simulator().await)
    }

    fn on_test_server(
        pool: impl AsDb,
        settings: ControllerConfig,
        server: TestServer,
        client: Client,
        sim: SimHandle,
    ) -> Cluster {
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = autoapproval::telemetry::init_tracing(false, "info", None);
        }
        let controller = client.clone();
        Self::started(
            ApiServer::Test(server),
            client,
            controller,
            NS,
            sim,
            pool,
            settings,
        )
    }

    /// With `test_settings`, on the test API server or the real one.
    pub async fn on(on: On, pool: impl AsDb) -> Cluster {
        match on {
            On::TestServer => Self::start(pool).await,
            On::RealServer => Self::real(pool, test_settings()).await,
        }
    }

    /// On the real kube-apiserver, in a namespace of its own, the replica as the chart's
    /// ServiceAccount bound to the chart's Role.
    pub async fn real(pool: impl AsDb, settings: ControllerConfig) -> Cluster {
        Self::real_with_role(pool, settings, |_| {}).await
    }

    /// Like `real`, the chart's Role changed by `edit`.
    pub async fn real_with_role(
        pool: impl AsDb,
        settings: ControllerConfig,
        edit: impl FnOnce(&mut Role),
    ) -> Cluster {
        Self::real_on(
            super::control_plane::control_plane().await,
            pool,
            settings,
            edit,
        )
        .await
    }

    /// Like `real_with_role`, on `plane` (one of the test's own).
    pub async fn real_on(
        plane: &'static ::control_plane::ControlPlane,
        pool: impl AsDb,
        settings: ControllerConfig,
        edit: impl FnOnce(&mut Role),
    ) -> Cluster {
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = autoapproval::telemetry::init_tracing(false, "info", None);
        }
        let real = real_namespace_on(plane, edit).await;
        let (admin, controller, ns) = (
            real.admin.clone(),
            real.controller.clone(),
            real.ns.name.clone(),
        );
        let sim = simulator().await;
        let server = ApiServer::Real(Box::new(real));
        Self::started(server, admin, controller, &ns, sim, pool, settings)
    }

    /// The replica started as `controller` in `ns`; the tests use `client`.
    fn started(
        server: ApiServer,
        client: Client,
        controller: Client,
        ns: &str,
        sim: SimHandle,
        pool: impl AsDb,
        settings: ControllerConfig,
    ) -> Cluster {
        let mut cluster = Cluster {
            server,
            api: Api::namespaced(client.clone(), ns),
            client,
            controller_client: controller,
            ns: ns.into(),
            sim,
            pool: pool.db(),
            metrics: Metrics::new(),
            stop: None,
            task: None,
        };
        cluster.run(settings);
        cluster
    }

    /// Starts the replica.
    fn run(&mut self, mut settings: ControllerConfig) {
        settings.namespace = self.ns.clone();
        let parts = self.parts(self.metrics.clone());
        let (tx, rx) = oneshot::channel::<()>();
        self.stop = Some(tx);
        self.task = Some(tokio::spawn(run_until(settings, parts, async move {
            let _ = rx.await;
        })));
    }

    /// What a replica of this cluster runs on (another replica's, with
    /// `metrics` of its own).
    pub fn parts(&self, metrics: Metrics) -> Parts {
        let external = HttpExternalSystems::build(
            &ExternalArgs::all_at(self.sim.base_url()).expect("defaults"),
        )
        .expect("external clients");
        Parts {
            client: self.controller_client.clone(),
            api_server: self.server.url(),
            store: self.pool.database(),
            external,
            clock: Arc::new(SystemClock),
            metrics,
            health: None,
        }
    }

    /// One replica with `quick_leases`, once it holds all 16 shards.
    pub async fn holding_every_shard(pool: impl AsDb) -> Cluster {
        let cluster = Self::with(pool, quick_leases()).await;
        cluster.wait_every_shard().await;
        cluster
    }

    /// Waits until the replica holds all 16 shards.
    pub async fn wait_every_shard(&self) {
        eventually("the replica to hold all 16 shards", || async {
            (super::metric_sum(&self.metrics.encode(), "autoapproval_shards_held", &[]) == 16.0)
                .then_some(())
        })
        .await;
    }

    /// Requests of one kind the test API server has received, e.g.
    /// `"patch autoapprovals"`.
    pub fn api_requests(&self, kind: &str) -> u64 {
        self.server.request_counts().get(kind).copied().unwrap_or(0)
    }

    /// Starts the replica again after [`Cluster::stop`], with the same
    /// backends, database and metrics: a restart.
    pub fn restart(&mut self, settings: ControllerConfig) {
        assert!(self.task.is_none(), "restart after stop");
        self.run(settings);
    }

    /// Sends the shutdown signal and waits for the replica to stop; a stop
    /// that outlasts the grace period by far is a hang (nothing may wait
    /// out a poll period at shutdown).
    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("the controller stops within 30 s")
                .expect("joins")
                .expect("controller stops cleanly");
        }
    }

    pub async fn cr(&self, request_id: i64) -> Option<AutoApproval> {
        self.api
            .get_opt(&crd::cr_name(request_id))
            .await
            .expect("get CR")
    }

    /// Waits until the CR of `request_id` is in `phase`.
    pub async fn wait_phase(&self, request_id: i64, phase: Phase) -> AutoApproval {
        eventually(&format!("request {request_id} to be {phase:?}"), || async {
            let cr = self.cr(request_id).await?;
            let shown = cr.status.as_ref().and_then(|s| s.phase);
            (shown == Some(phase)).then_some(cr)
        })
        .await
        .expect("CR")
    }

    /// Waits until discovery hears NOTIFY: its LISTEN connection comes up
    /// concurrently with start-up. A canceled probe request is touched
    /// until one of its notifications wakes discovery.
    pub async fn wait_listening(&self) {
        const PROBE: i64 = 9_999_999;
        NewRequest::ready_owner(PROBE)
            .status("CANCELED")
            .insert(&self.pool)
            .await;
        let before = self.metrics.notify_wakeups();
        eventually("discovery to hear NOTIFY", || async {
            set(
                &self.pool,
                PROBE,
                "documents_released = NOT documents_released",
            )
            .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            (self.metrics.notify_wakeups() > before).then_some(())
        })
        .await;
    }

    /// Runs the real kubectl against the test API server with `args`.
    pub async fn kubectl(&self, args: &[&str]) -> std::process::Output {
        let dir = super::fresh_dir("kubectl");
        let kubeconfig = match &self.server {
            ApiServer::Test(server) => super::kubeconfig_in(&dir, server),
            // The admin's, as a cluster's operator looks: the ServiceAccount may only
            // do what the controller does.
            ApiServer::Real(real) => real.ns.admin_kubeconfig.clone(),
        };
        let output = tokio::process::Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(dir.join("cache"))
            .args(args)
            .output()
            .await
            .expect("kubectl runs (set KUBECTL or run scripts/install-tools.sh)");
        let _ = std::fs::remove_dir_all(&dir);
        output
    }

    /// The request's Events (reason, note) once one with `reason` is
    /// there: an Event is published after the status it goes with, so a
    /// test that saw the status waits for its Event.
    pub async fn events_with(&self, request_id: i64, reason: &str) -> Vec<(String, String)> {
        eventually(
            &format!("a {reason} Event for request {request_id}"),
            || async {
                let events = self.events_now(request_id).await;
                events.iter().any(|(r, _)| r == reason).then_some(events)
            },
        )
        .await
        .unwrap_or_default()
    }

    /// Events about the CR of `request_id`, as (reason, note), as listed now.
    async fn events_now(&self, request_id: i64) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        let name = crd::cr_name(request_id);
        events
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }
}

/// Calls the simulator has answered, of every kind.
pub fn total_calls(sim: &SimHandle) -> u64 {
    sim.stats().calls.values().sum()
}

/// Status patches the API server has received (the CRs' only patches).
pub fn status_patches(c: &Cluster) -> u64 {
    c.api_requests("patch autoapprovals")
}

/// Reconciles the replica of `c` has finished.
pub fn reconciles_done(c: &Cluster) -> f64 {
    super::metric_sum(
        &c.metrics.encode(),
        "autoapproval_reconcile_duration_seconds_count",
        &[],
    )
}

/// Sets columns of a request row, as the business system would.
pub async fn set(db: &impl AsDb, id: i64, assignment: &str) {
    db.db()
        .exec(&format!(
            "UPDATE approval_request SET {assignment} WHERE id = {id}"
        ))
        .await;
}

/// Polls `check` until it returns `Some`, or panics after 90 s: a hang
/// detector, not a speed target (speed is measured by the benchmarks).
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub fn kubectl_bin() -> std::path::PathBuf {
    if let Ok(k) = std::env::var("KUBECTL") {
        return k.into();
    }
    let tools = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/bin/kubectl");
    if tools.exists() {
        return tools;
    }
    "kubectl".into()
}
