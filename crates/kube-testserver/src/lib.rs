//! An in-memory Kubernetes API server for tests and the local demo.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = kube_testserver::TestServer::start(kube_testserver::Options::default()).await?;
//! let mut config = kube::Config::new(server.url().parse()?);
//! config.default_namespace = "default".into();
//! let client = kube::Client::try_from(config)?;
//! server.faults().fail_next(1, 500, kube_testserver::Match::any().verb("create"));
//! # let _ = client; Ok(()) }
//! ```

mod app;
mod discovery;
mod error;
mod events;
mod faults;
mod jsonpath;
mod kubeconfig;
mod net;
mod openapi;
mod patch;
mod protobuf;
mod resources;
mod selector;
mod server;
mod store;
mod table;
mod util;
mod validation;
mod watch;

pub use app::Access;
pub use error::Error;
pub use faults::{FaultRule, Faults, Match, Outage};

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Start-up options.
#[derive(Debug, Clone)]
pub struct Options {
    /// TCP port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// How many change events the watch log retains; older resourceVersions get 410 Expired.
    pub watch_window: usize,
    /// Interval between BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: 0,
            watch_window: 10_000,
            bookmark_interval: Duration::from_secs(5),
        }
    }
}

/// A running server; dropped or [`TestServer::shutdown`] stops it.
pub struct TestServer {
    addr: SocketAddr,
    app: Arc<app::App>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Binds 127.0.0.1:`port` and starts serving in the current tokio runtime.
    pub async fn start(opts: Options) -> Result<TestServer, Error> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port)).await?;
        let addr = listener.local_addr()?;
        let faults = Faults::default();
        let app = Arc::new(app::App {
            store: parking_lot::Mutex::new(store::Store::new(opts.watch_window)),
            faults: faults.clone(),
            bookmark_interval: opts.bookmark_interval,
            addr: addr.to_string(),
            requests: Default::default(),
            access: Default::default(),
        });
        let router = axum::Router::new()
            .fallback(server::handle)
            .with_state(app.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let l = net::FaultyListener {
            inner: listener,
            faults,
        };
        let task = tokio::spawn(async move {
            let _ = axum::serve(l, router)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(TestServer {
            addr,
            app,
            stop: Some(tx),
            task: Some(task),
        })
    }

    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Handle for fault injection.
    pub fn faults(&self) -> Faults {
        self.app.faults.clone()
    }

    /// Changes how many events the watch log retains (older resourceVersions get 410).
    pub fn set_watch_window(&self, events: usize) {
        self.app.store.lock().set_window(events);
    }

    /// Requests received so far (faulted ones included), keyed by verb and
    /// resource plural, e.g. `"create autoapprovals"`; discovery is `"get "`.
    pub fn request_counts(&self) -> std::collections::BTreeMap<String, u64> {
        self.app.requests.lock().clone()
    }

    /// Every (API group, resource[/subresource], verb) requested so far by
    /// clients whose User-Agent starts with `agent`: what an RBAC Role must
    /// grant them.
    pub fn access_by(&self, agent: &str) -> std::collections::BTreeSet<Access> {
        self.app
            .access
            .lock()
            .iter()
            .filter(|(a, _)| a.starts_with(agent))
            .flat_map(|(_, seen)| seen.iter().cloned())
            .collect()
    }

    /// Write requests (create, update, patch, delete, deletecollection) received so far.
    pub fn write_count(&self) -> u64 {
        self.request_counts()
            .iter()
            .filter(|(key, _)| {
                let verb = key.split(' ').next().unwrap_or_default();
                matches!(
                    verb,
                    "create" | "update" | "patch" | "delete" | "deletecollection"
                )
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// The current cluster-wide resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.app.store.lock().rv
    }

    /// A kubeconfig (YAML) for this server: context `testserver`, namespace `default`.
    pub fn kubeconfig_yaml(&self) -> Result<String, Error> {
        Ok(kubeconfig::render(&self.url())?)
    }

    /// Writes the kubeconfig to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        std::fs::write(path, self.kubeconfig_yaml()?)?;
        Ok(())
    }

    /// Stops serving: closes watches and waits (up to 5 s) for connections to finish.
    pub async fn shutdown(mut self) {
        self.stop_now();
        if let Some(t) = self.task.take() {
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }

    /// Blocks until the server stops (for the binary).
    pub async fn wait(mut self) {
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    fn stop_now(&mut self) {
        self.app.faults.clear();
        self.app.faults.close_watches();
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}
