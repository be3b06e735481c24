//! The Job controller and kubelet the tests play, since neither kube-controller-manager nor a
//! kubelet runs (on the test API server or the real kube-apiserver): in one namespace, each Job's
//! init containers and container (`autoapproval migrate`, then `check`) are run in order with the
//! real binary on the test's database and the Job marked complete or failed by their exits (a
//! failed one's stderr kept in the log, where `kubectl logs job/…` would show it); one replica of
//! each Deployment (`autoapproval run`) is started as the pod's ServiceAccount with the env the
//! pod would get (its ConfigMap, its fieldRefs, the Secret's database URL pointing at the test's
//! database, the external systems at the simulator), and stopped when the Deployment is deleted;
//! and each bare Pod (the `helm test` hook fetching `/readyz` through the Service) Succeeds
//! exactly when that replica's `/readyz` answers 200, else Fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use autoapproval::controller::crd;
use autoapproval_sim::SimHandle;
use control_plane::ControlPlane;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::cluster::{On, client_for, eventually};
use super::db::Db;
use super::processes::free_port;
use super::rows::owner_now;
use super::tools::Cli;

/// A kubeconfig of the ServiceAccount `(namespace, name)`, as a pod of it would be given a token.
pub type Credentials = Box<dyn Fn(String, String) -> BoxFuture<'static, PathBuf> + Send + Sync>;

/// What the played node reaches: the test's database (as the Secret's database URL) and the
/// simulator (as every external system).
pub struct Node {
    pub db: Db,
    pub external: String,
    pub credentials: Credentials,
}

/// The played Job controller and kubelet, until dropped.
pub struct Kubelet {
    /// `Job/name`, `Pod/name` (with `Succeeded` or `Failed`) and `Deployment/name` of each it
    /// completed or started, in order.
    done: Arc<Mutex<Vec<String>>>,
    /// The replicas' output (stderr), for a failing test's message.
    log: Arc<Mutex<String>>,
    /// The ports of the running replicas.
    ports: Arc<Mutex<Vec<u16>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- the played replicas' log ---\n{}", self.log());
        }
        // Aborted, the task drops its replicas, which are killed on drop.
        self.task.abort();
    }
}

impl Kubelet {
    /// Starts playing in `namespace` as `admin` (allowed to write Job and Pod statuses).
    pub fn start(admin: Client, namespace: &str, node: Node) -> Kubelet {
        let done = Arc::new(Mutex::new(vec![]));
        let log = Arc::new(Mutex::new(String::new()));
        let ports = Arc::new(Mutex::new(vec![]));
        let mut play = Play {
            jobs: Api::namespaced(admin.clone(), namespace),
            pods: Api::namespaced(admin.clone(), namespace),
            deployments: Api::namespaced(admin.clone(), namespace),
            config_maps: Api::namespaced(admin.clone(), namespace),
            secrets: Api::namespaced(admin, namespace),
            namespace: namespace.to_owned(),
            node,
            finished: BTreeSet::new(),
            replicas: BTreeMap::new(),
            done: done.clone(),
            log: log.clone(),
            ports: ports.clone(),
        };
        let task = tokio::spawn(async move {
            loop {
                play.turn().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Kubelet {
            done,
            log,
            ports,
            task,
        }
    }

    /// Whether a replica answers `/readyz` with 200.
    pub async fn ready(&self) -> bool {
        let ports = self.ports.lock().expect("ports").clone();
        ready(&ports).await
    }

    /// The replicas' output so far.
    pub fn log(&self) -> String {
        self.log.lock().expect("log").clone()
    }

    /// What it completed or started so far.
    pub fn done(&self) -> Vec<String> {
        self.done.lock().expect("done").clone()
    }
}

/// A replica of a Deployment: its process and the port of its `/readyz`.
struct Replica {
    _child: tokio::process::Child,
    port: u16,
}

struct Play {
    jobs: Api<Job>,
    pods: Api<Pod>,
    deployments: Api<Deployment>,
    config_maps: Api<ConfigMap>,
    secrets: Api<Secret>,
    namespace: String,
    node: Node,
    /// UIDs of the Jobs and Pods finished.
    finished: BTreeSet<String>,
    /// Running replicas, by their Deployment's UID.
    replicas: BTreeMap<String, Replica>,
    done: Arc<Mutex<Vec<String>>>,
    log: Arc<Mutex<String>>,
    ports: Arc<Mutex<Vec<u16>>>,
}

/// Whether a replica on one of `ports` answers `/readyz` with 200.
async fn ready(ports: &[u16]) -> bool {
    for port in ports {
        let url = format!("http://127.0.0.1:{port}/readyz");
        if reqwest::get(&url)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return true;
        }
    }
    false
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

impl Play {
    async fn turn(&mut self) {
        let deployments = self
            .deployments
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let uids: BTreeSet<String> = deployments
            .iter()
            .filter_map(|d| d.metadata.uid.clone())
            .collect();
        self.replicas.retain(|uid, _| uids.contains(uid));
        self.publish_ports();
        for deployment in deployments {
            let uid = deployment.metadata.uid.clone().unwrap_or_default();
            if !self.replicas.contains_key(&uid) {
                let name = deployment.metadata.name.clone().unwrap_or_default();
                if let Some(replica) = self.start_replica(&deployment).await {
                    self.replicas.insert(uid, replica);
                    self.publish_ports();
                    self.record(format!("Deployment/{name}"));
                }
            }
        }
        for job in self
            .jobs
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            self.run_job(job).await;
        }
        for pod in self
            .pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            self.run_pod(pod).await;
        }
    }

    fn publish_ports(&self) {
        *self.ports.lock().expect("ports") = self.replicas.values().map(|r| r.port).collect();
    }

    fn record(&self, what: String) {
        self.done.lock().expect("done").push(what);
    }

    /// The env of `container` as the kubelet gives it, the database and the external systems
    /// being the node's.
    async fn env(&self, container: &Container, pod_name: &str) -> Vec<(String, String)> {
        let mut env = vec![];
        for from in container.env_from.iter().flatten() {
            if let Some(map) = &from.config_map_ref
                && let Ok(map) = self.config_maps.get(&map.name).await
            {
                env.extend(map.data.unwrap_or_default());
            }
        }
        for var in container.env.iter().flatten() {
            let source = var.value_from.as_ref();
            let value = if var.name == "AUTOAPPROVAL_DATABASE_URL" {
                Some(self.node.db.url())
            } else if let Some(value) = &var.value {
                Some(value.clone())
            } else if let Some(field) = source.and_then(|s| s.field_ref.as_ref()) {
                match field.field_path.as_str() {
                    "metadata.namespace" => Some(self.namespace.clone()),
                    "metadata.name" => Some(pod_name.to_owned()),
                    other => panic!("the played kubelet knows no fieldRef {other}"),
                }
            } else if let Some(key) = source.and_then(|s| s.secret_key_ref.as_ref()) {
                let secret = self.secrets.get(&key.name).await.ok();
                secret
                    .and_then(|s| s.data?.remove(&key.key))
                    .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            } else {
                None
            };
            if let Some(value) = value {
                env.push((var.name.clone(), value));
            }
        }
        for (name, value) in &mut env {
            if name.starts_with("AUTOAPPROVAL_")
                && name.ends_with("_URL")
                && name != "AUTOAPPROVAL_DATABASE_URL"
                && name != "AUTOAPPROVAL_READ_DATABASE_URL"
            {
                *value = self.node.external.clone();
            }
        }
        env
    }

    /// One replica of `deployment`'s pod, as its ServiceAccount, serving on a free port.
    async fn start_replica(&self, deployment: &Deployment) -> Option<Replica> {
        let name = deployment.metadata.name.clone()?;
        let spec = deployment.spec.template.spec.as_ref()?;
        let container = spec.containers.first()?;
        let account = spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into());
        let pod_name = format!("{name}-played-0");
        for init in spec.init_containers.iter().flatten() {
            if !self.run_to_end(init, &pod_name).await {
                return None;
            }
        }
        let kubeconfig = (self.node.credentials)(self.namespace.clone(), account).await;
        let port = free_port();
        let mut env = self.env(container, &pod_name).await;
        env.retain(|(name, _)| name != "AUTOAPPROVAL_LISTEN");
        env.push(("AUTOAPPROVAL_LISTEN".into(), format!("127.0.0.1:{port}")));
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
            .args(container.args.iter().flatten())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env_clear()
            .envs(env)
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("autoapproval run starts");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = self.log.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = log.lock().expect("log");
                log.push_str(&line);
                log.push('\n');
            }
        });
        Some(Replica {
            _child: child,
            port,
        })
    }

    /// Runs `container` (the binary with its args) to its end: whether it exited 0; its output
    /// goes to the log when it did not.
    async fn run_to_end(&self, container: &Container, pod_name: &str) -> bool {
        self.exit_code(container, pod_name).await == 0
    }

    /// Runs `container` to its end: its exit code (-1 when killed by a signal); its output goes
    /// to the log when it is not 0.
    async fn exit_code(&self, container: &Container, pod_name: &str) -> i32 {
        let env = self.env(container, pod_name).await;
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
            .args(container.args.iter().flatten())
            .env_clear()
            .envs(env)
            .env("NO_COLOR", "1")
            .output()
            .await
            .expect("the container's binary runs");
        if !out.status.success() {
            self.log
                .lock()
                .expect("log")
                .push_str(&String::from_utf8_lossy(&out.stderr));
        }
        out.status.code().unwrap_or(-1)
    }

    /// Runs the Job's container to its end and marks the Job by its exit, once.
    async fn run_job(&mut self, job: Job) {
        let name = job.metadata.name.clone().unwrap_or_default();
        let uid = job.metadata.uid.clone().unwrap_or_default();
        if self.finished.contains(&uid) {
            return;
        }
        let spec = job.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        let Some(spec) = spec.filter(|s| !s.containers.is_empty()) else {
            return;
        };
        // The init containers in order (`migrate`), then the container (`check`), each only
        // after the one before it exited 0, as a pod runs them.
        let pod_name = format!("{name}-played");
        let mut failed = None;
        for container in spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
        {
            let code = self.exit_code(container, &pod_name).await;
            if code != 0 {
                failed = Some((container.name.as_str(), code));
                break;
            }
        }
        let succeeded = failed.is_none();
        // Failed by a FailJob rule of the podFailurePolicy, or (no retries played) by the limit.
        let fail_job = |(container, code): (&str, i32)| {
            let policy = job
                .spec
                .as_ref()
                .and_then(|s| s.pod_failure_policy.as_ref());
            policy.into_iter().flat_map(|p| &p.rules).any(|rule| {
                rule.action == "FailJob"
                    && rule.on_exit_codes.as_ref().is_some_and(|on| {
                        on.container_name.as_deref().is_none_or(|c| c == container)
                            && (on.operator == "In") == on.values.contains(&code)
                    })
            })
        };
        let reason = match failed {
            Some(failed) if fail_job(failed) => "PodFailurePolicy",
            _ => "BackoffLimitExceeded",
        };
        let now = now();
        let condition = |type_: &str, reason: &str| json!({"type": type_, "status": "True", "reason": reason, "lastProbeTime": now, "lastTransitionTime": now});
        let status = if succeeded {
            json!({"status": {
                "startTime": now, "completionTime": now, "succeeded": 1, "active": 0, "ready": 0,
                "conditions": [
                    condition("SuccessCriteriaMet", "CompletionsReached"),
                    condition("Complete", "CompletionsReached"),
                ],
            }})
        } else {
            json!({"status": {
                "startTime": now, "failed": 1, "active": 0, "ready": 0,
                "conditions": [
                    condition("FailureTarget", reason),
                    condition("Failed", reason),
                ],
            }})
        };
        let patched = self
            .jobs
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await;
        if patched.is_ok() {
            self.finished.insert(uid);
            self.record(format!("Job/{name}"));
        }
    }

    /// The `helm test` Pod: its `wget …/readyz` through the Service reaches the replica.
    async fn run_pod(&mut self, pod: Pod) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if self.finished.contains(&uid) {
            return;
        }
        let wget = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .any(|c| c.command.iter().flatten().any(|w| w.ends_with("/readyz")));
        assert!(
            wget,
            "the played kubelet runs only the readyz test Pod: {name}"
        );
        let ports: Vec<u16> = self.replicas.values().map(|r| r.port).collect();
        let ready = ready(&ports).await;
        let (phase, code) = if ready {
            ("Succeeded", 0)
        } else {
            ("Failed", 1)
        };
        let now = now();
        let containers: Vec<Value> = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| json!({
                "name": c.name, "image": c.image, "imageID": "", "ready": false,
                "restartCount": 0, "started": false,
                "state": {"terminated": {"exitCode": code, "reason": if ready { "Completed" } else { "Error" }, "startedAt": now, "finishedAt": now}},
            }))
            .collect();
        let status = json!({"status": {
            "phase": phase, "startTime": now, "containerStatuses": containers,
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}],
        }});
        let patched = self
            .pods
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await;
        if patched.is_ok() {
            self.finished.insert(uid);
            self.record(format!("Pod/{name} {phase}"));
        }
    }
}

/// Runs `steps` (kubectl and helm, which block) as the operator of an API server of its own on
/// `on`, the Job controller and kubelet played in `namespace` on `db` and a simulator.
pub async fn as_operator_of_own_server<F>(on: On, db: Db, namespace: &'static str, steps: F)
where
    F: FnOnce(&Cli, &Kubelet, &Db, &tokio::runtime::Handle) + Send + 'static,
{
    let server = OwnServer::start(on).await;
    let cli = server.cli();
    let sim = super::cluster::simulator().await;
    let kubelet = server.kubelet(&cli, namespace, &db, &sim).await;
    let handle = tokio::runtime::Handle::current();
    let kubelet = tokio::task::spawn_blocking(move || {
        steps(&cli, &kubelet, &db, &handle);
        kubelet
    })
    .await
    .expect("the operator's steps");
    // The replicas end before their API server.
    drop(kubelet);
    server.shutdown().await;
}

/// Inserts an owner contract request `id` and waits until `kubectl get` shows its CR in
/// `namespace` Approved.
pub async fn approved_through_kubectl(cli: &Cli, db: &Db, namespace: &str, id: i64) {
    owner_now(id).insert(db).await;
    let name = crd::cr_name(id);
    eventually(&format!("{name} approved by the replica"), || async {
        let jsonpath = "jsonpath={.status.phase}";
        let get = cli.kubectl_command(&[
            "-n",
            namespace,
            "get",
            "autoapproval",
            &name,
            "-o",
            jsonpath,
        ]);
        let out = tokio::process::Command::from(get).output().await.ok()?;
        (out.stdout == b"Approved").then_some(())
    })
    .await;
}

/// An API server of one test's own, for a test that changes what is cluster-wide (the CRD, a
/// namespace named as the README names it).
pub enum OwnServer {
    Test(kube_testserver::TestServer),
    Real(Arc<ControlPlane>),
}

impl OwnServer {
    pub async fn start(on: On) -> OwnServer {
        match on {
            On::TestServer => OwnServer::Test(
                kube_testserver::TestServer::start(kube_testserver::Options::default())
                    .await
                    .expect("test API server"),
            ),
            On::RealServer => OwnServer::Real(Arc::new(
                ControlPlane::start()
                    .await
                    .unwrap_or_else(|e| panic!("the real control plane: {e}")),
            )),
        }
    }

    /// The operator's client: allowed everything.
    pub async fn admin(&self) -> Client {
        match self {
            OwnServer::Test(server) => client_for(server),
            OwnServer::Real(plane) => plane.admin_client().await.expect("admin client"),
        }
    }

    /// kubectl and helm as the operator.
    pub fn cli(&self) -> Cli {
        match self {
            OwnServer::Test(server) => Cli::new(server),
            OwnServer::Real(plane) => Cli::with_kubeconfig(&plane.admin_kubeconfig_path()),
        }
    }

    /// How a pod's ServiceAccount gets its token: on the real server a TokenRequest, so the
    /// replica is authorized by the Role the chart installed and nothing else; the test API
    /// server allows everyone everything.
    pub fn credentials(&self, scratch: &Path) -> Credentials {
        match self {
            OwnServer::Test(server) => {
                let kubeconfig = scratch.join("pod.kubeconfig");
                server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
                Box::new(move |_, _| {
                    let kubeconfig = kubeconfig.clone();
                    Box::pin(async move { kubeconfig })
                })
            }
            OwnServer::Real(plane) => {
                let plane = plane.clone();
                Box::new(move |namespace, account| {
                    let plane = plane.clone();
                    Box::pin(async move {
                        plane
                            .service_account_kubeconfig(&namespace, &account)
                            .await
                            .unwrap_or_else(|e| panic!("a token of {namespace}/{account}: {e}"))
                    })
                })
            }
        }
    }

    /// The played Job controller and kubelet in `namespace`, the node reaching `db` and `sim`.
    pub async fn kubelet(&self, cli: &Cli, namespace: &str, db: &Db, sim: &SimHandle) -> Kubelet {
        let node = Node {
            db: db.clone(),
            external: sim.base_url(),
            credentials: self.credentials(&cli.dir),
        };
        Kubelet::start(self.admin().await, namespace, node)
    }

    pub async fn shutdown(self) {
        match self {
            OwnServer::Test(server) => server.shutdown().await,
            // Dropped, its watchdog ends etcd and kube-apiserver.
            OwnServer::Real(plane) => drop(plane),
        }
    }
}
