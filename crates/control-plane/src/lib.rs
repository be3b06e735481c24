//! The real Kubernetes control plane for tests and the lab: etcd and kube-apiserver
//! (scripts/install-control-plane.sh builds them) on free loopback ports, with TLS and
//! RBAC, an admin identity and, per namespace, the controller's ServiceAccount.

mod crd;
mod procs;
mod rbac;

pub use crd::{OpenApiProbe, install_crd};
pub use procs::check_binaries;
pub use rbac::chart_rbac;

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::OnceCell;

/// The ServiceAccount the chart runs the controller as (`serviceAccount.name`'s default).
pub const SERVICE_ACCOUNT: &str = "autoapproval";

/// The static token of the admin (user `admin`, group `system:masters`).
const ADMIN_TOKEN: &str = "autoapproval-tests-admin";

/// How long kube-apiserver may take to answer `/readyz` with 200.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// What can go wrong starting the control plane or a namespace in it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{binary} not found (looked at ${env} and {looked}): build it with scripts/install-control-plane.sh"
    )]
    Missing {
        binary: &'static str,
        env: &'static str,
        looked: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "kube-apiserver was not ready within {READY_WITHIN:?}: {last}\n--- kube-apiserver log (tail) ---\n{apiserver_log}\n--- etcd log (tail) ---\n{etcd_log}"
    )]
    NotReady {
        last: String,
        apiserver_log: String,
        etcd_log: String,
    },
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("client configuration from {path}: {source}")]
    Config {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("a kube client: {0}")]
    Client(#[source] kube::Error),
    #[error("etcd's {call} at {url}: {detail}")]
    Etcd {
        call: &'static str,
        url: String,
        detail: String,
    },
    #[error("the CRD {name} was not served within {within:?}: still waiting for {waiting_for}", within = crd::SERVED_WITHIN)]
    CrdNotServed { name: String, waiting_for: String },
    #[error("the chart's manifests: {0}")]
    Manifests(String),
    #[error("kube-apiserver still answers at {0} after it was killed")]
    StillUp(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}

/// etcd and kube-apiserver, running until the process that started them exits (or,
/// for one not shared, until it is dropped or [`ControlPlane::stop`]ped).
pub struct ControlPlane {
    /// `https://127.0.0.1:<port>`.
    url: String,
    /// etcd's client URL, `http://127.0.0.1:<port>`.
    etcd_url: String,
    /// Scratch directory: data, certificates, logs, kubeconfigs; removed by the watchdog.
    dir: PathBuf,
    /// The watchdog shell; kept so its pipe stays open while this process lives.
    _watchdog: Child,
    /// The watchdog's commands (`stop`, `start`: kube-apiserver); closed, it ends both.
    pipe: Mutex<Option<ChildStdin>>,
}

/// How a control plane of its own differs from the shared one.
#[derive(Clone, Debug)]
pub struct Options {
    /// kube-apiserver's watch cache (`--watch-cache`): off, every watch reads etcd's
    /// own history, so a compaction makes an older resourceVersion `410 Gone`.
    pub watch_cache: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { watch_cache: true }
    }
}

static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();

/// Numbers the namespaces (and scratch directories) of this process: names never repeat.
static NAMESPACES: AtomicU64 = AtomicU64::new(1);

impl ControlPlane {
    /// The control plane of this process, started by the first caller; every caller
    /// after it gets the same one (a failed start is retried by the next caller).
    pub async fn shared() -> Result<&'static ControlPlane, Error> {
        SHARED.get_or_try_init(Self::start).await
    }

    /// Starts etcd and kube-apiserver and waits until kube-apiserver is ready.
    pub async fn start() -> Result<ControlPlane, Error> {
        Self::start_with(Options::default()).await
    }

    /// Like `start`, with `options`: a control plane of the caller's own, ended when
    /// it is dropped.
    pub async fn start_with(options: Options) -> Result<ControlPlane, Error> {
        let etcd = binary("etcd", "ETCD")?;
        let apiserver = binary("kube-apiserver", "KUBE_APISERVER")?;
        let dir = std::env::temp_dir().join(format!(
            "control-plane-{}-{}",
            std::process::id(),
            NAMESPACES.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("pki"))
            .map_err(io("create the control plane's directory"))?;
        let key = dir.join("sa.key");
        let status = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048")
            .stderr(Stdio::null())
            .status()
            .map_err(io("run openssl to make the service-account signing key"))?;
        if !status.success() {
            return Err(Error::Io {
                what: "openssl genrsa (the service-account signing key)".into(),
                source: std::io::Error::other(status.to_string()),
            });
        }
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,admin,\"system:masters\"\n"),
        )
        .map_err(io("write the token file"))?;

        let [client_port, peer_port, secure_port] = free_ports()?;
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = [
            "--name=default".to_owned(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // Throwaway data: no fsync per write.
            "--unsafe-no-fsync".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let apiserver_args = [
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={secure_port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--cert-dir={}", dir.join("pki").display()),
            "--authorization-mode=RBAC".to_owned(),
            format!("--token-auth-file={}", dir.join("tokens.csv").display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", key.display()),
            format!("--service-account-signing-key-file={}", key.display()),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            // No controller-manager makes the `default` ServiceAccount this plugin
            // requires of every pod; no kubelet runs pods either.
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            "--profiling=false".to_owned(),
            format!("--watch-cache={}", options.watch_cache),
        ];
        // `stop` kills kube-apiserver (SIGKILL, as a crashed node would), `start` runs it
        // again with the same arguments: the same port, certificates and etcd.
        let script = format!(
            "trap '' INT TERM\n\
             {etcd} {etcd_args} </dev/null >{dir}/etcd.log 2>&1 & etcd=$!\n\
             start() {{ {apiserver} {apiserver_args} </dev/null >>{dir}/kube-apiserver.log 2>&1 & apiserver=$!; }}\n\
             start\n\
             while read -r command; do\n\
               case $command in\n\
                 stop) kill -9 $apiserver; wait $apiserver;;\n\
                 start) start;;\n\
               esac\n\
             done\n\
             kill -9 $apiserver $etcd 2>/dev/null\n\
             wait\n\
             rm -rf {dir}\n",
            etcd = quote(&etcd.display().to_string()),
            etcd_args = etcd_args.map(|a| quote(&a)).join(" "),
            apiserver = quote(&apiserver.display().to_string()),
            apiserver_args = apiserver_args.map(|a| quote(&a)).join(" "),
            dir = quote(&dir.display().to_string()),
        );
        // Its own process group: a Ctrl-C of the tests reaches the test process, whose
        // exit closes the pipe; the watchdog then ends both servers.
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(io("start the control plane's watchdog (sh)"))?;
        let pipe = watchdog.stdin.take().ok_or_else(|| Error::Io {
            what: "the watchdog's standard input".into(),
            source: std::io::Error::other("not piped"),
        })?;
        let plane = ControlPlane {
            url: format!("https://127.0.0.1:{secure_port}"),
            etcd_url,
            dir,
            _watchdog: watchdog,
            pipe: Mutex::new(Some(pipe)),
        };
        plane.wait_ready().await?;
        plane.write_kubeconfig(
            &plane.admin_kubeconfig_path(),
            "admin",
            ADMIN_TOKEN,
            "default",
        )?;
        Ok(plane)
    }

    async fn wait_ready(&self) -> Result<(), Error> {
        let http = reqwest::Client::builder()
            // Only readiness is asked here; the clients handed out verify the certificate.
            .danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::Io {
                what: "an HTTP client".into(),
                source: std::io::Error::other(e),
            })?;
        let start = Instant::now();
        let mut last = String::from("no answer yet");
        while start.elapsed() < READY_WITHIN {
            match http
                .get(format!("{}/readyz", self.url))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => last = format!("/readyz answered {}", r.status()),
                Err(e) => last = format!("/readyz: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::NotReady {
            last,
            apiserver_log: tail(&self.dir.join("kube-apiserver.log")),
            etcd_log: tail(&self.dir.join("etcd.log")),
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// etcd's client URL (its v3 HTTP/JSON gateway answers there too).
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// kube-apiserver's log so far (every run of it, when restarted).
    pub fn apiserver_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kube-apiserver.log")).unwrap_or_default()
    }

    fn command(&self, command: &str) -> Result<(), Error> {
        let mut pipe = self.pipe.lock().unwrap_or_else(|e| e.into_inner());
        let pipe = pipe.as_mut().ok_or_else(|| Error::Io {
            what: format!("{command} kube-apiserver"),
            source: std::io::Error::other("the control plane was stopped"),
        })?;
        writeln!(pipe, "{command}")
            .and_then(|()| pipe.flush())
            .map_err(io(format!("tell the watchdog to {command} kube-apiserver")))
    }

    /// Kills kube-apiserver with SIGKILL (etcd keeps running) and returns once its
    /// port refuses connections.
    pub async fn kill_apiserver(&self) -> Result<(), Error> {
        self.command("stop")?;
        let addr = self.url.trim_start_matches("https://").to_owned();
        let start = Instant::now();
        while start.elapsed() < READY_WITHIN {
            if tokio::net::TcpStream::connect(&addr).await.is_err() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(Error::StillUp(self.url.clone()))
    }

    /// Starts kube-apiserver again after [`ControlPlane::kill_apiserver`], on the same
    /// port with the same certificates and etcd, and waits until it is ready.
    pub async fn restart_apiserver(&self) -> Result<(), Error> {
        self.command("start")?;
        self.wait_ready().await
    }

    /// Compacts etcd's history up to its current revision (physically), through its
    /// v3 HTTP/JSON gateway; returns that revision.
    pub async fn compact_etcd(&self) -> Result<i64, Error> {
        let http = reqwest::Client::new();
        let call = |path: &'static str, body: serde_json::Value| {
            let http = http.clone();
            let url = format!("{}{path}", self.etcd_url);
            async move {
                let failed = |detail: String| Error::Etcd {
                    call: path,
                    url: url.clone(),
                    detail,
                };
                let response = http
                    .post(&url)
                    .json(&body)
                    .send()
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                let status = response.status();
                let text = response.text().await.map_err(|e| failed(e.to_string()))?;
                if !status.is_success() {
                    return Err(failed(format!("{status}: {text}")));
                }
                serde_json::from_str::<serde_json::Value>(&text)
                    .map_err(|e| failed(format!("{e}: {text}")))
            }
        };
        // Any key: the answer's header carries the store's current revision ("/" is "Lw==").
        let range = call("/v3/kv/range", serde_json::json!({"key": "Lw=="})).await?;
        let revision = range["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse::<i64>().ok())
            .ok_or_else(|| Error::Etcd {
                call: "/v3/kv/range",
                url: self.etcd_url.clone(),
                detail: format!("no revision in {range}"),
            })?;
        call(
            "/v3/kv/compaction",
            serde_json::json!({"revision": revision.to_string(), "physical": true}),
        )
        .await?;
        Ok(revision)
    }

    /// Ends etcd and kube-apiserver now and removes their directory (the watchdog
    /// does, once its pipe closes).
    pub fn stop(&self) {
        self.pipe.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// kube-apiserver's self-signed serving certificate and its CA, PEM.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("pki/apiserver.crt")
    }

    /// A kubeconfig of the admin (group `system:masters`), default namespace `default`.
    pub fn admin_kubeconfig_path(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// A client of the admin, default namespace `default`.
    pub async fn admin_client(&self) -> Result<kube::Client, Error> {
        client_from(&self.admin_kubeconfig_path()).await
    }

    /// A fresh namespace named `<prefix>-<n>` with the ServiceAccount `autoapproval`
    /// and a kubeconfig of that ServiceAccount (a token of a TokenRequest), which is
    /// granted nothing until a Role is bound to it.
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace, Error> {
        let admin = self.admin_client().await?;
        let name = format!("{prefix}-{}", NAMESPACES.fetch_add(1, Ordering::Relaxed));
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        namespaces
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await
            .map_err(kube_err(format!("create namespace {name}")))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(admin, &name);
        accounts
            .create(
                &PostParams::default(),
                &ServiceAccount {
                    metadata: ObjectMeta {
                        name: Some(SERVICE_ACCOUNT.into()),
                        ..ObjectMeta::default()
                    },
                    ..ServiceAccount::default()
                },
            )
            .await
            .map_err(kube_err(format!(
                "create ServiceAccount {name}/{SERVICE_ACCOUNT}"
            )))?;
        let kubeconfig = self
            .service_account_kubeconfig(&name, SERVICE_ACCOUNT)
            .await?;
        let admin_kubeconfig = self.dir.join(format!("{name}.admin.kubeconfig"));
        self.write_kubeconfig(&admin_kubeconfig, "admin", ADMIN_TOKEN, &name)?;
        Ok(TestNamespace {
            name,
            kubeconfig,
            admin_kubeconfig,
        })
    }

    /// A kubeconfig of the existing ServiceAccount `namespace/account` (e.g. the one a chart
    /// installed), default namespace `namespace`: a token of a TokenRequest, valid a day.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        account: &str,
    ) -> Result<PathBuf, Error> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin_client().await?, namespace);
        let token = accounts
            .create_token_request(
                account,
                &PostParams::default(),
                &TokenRequest {
                    spec: Some(TokenRequestSpec {
                        expiration_seconds: Some(24 * 3600),
                        ..TokenRequestSpec::default()
                    }),
                    ..TokenRequest::default()
                },
            )
            .await
            .map_err(kube_err(format!("TokenRequest of {namespace}/{account}")))?
            .status
            .and_then(|s| s.token)
            .unwrap_or_default();
        let user = format!("system:serviceaccount:{namespace}:{account}");
        let kubeconfig = self.dir.join(format!("{namespace}.{account}.kubeconfig"));
        self.write_kubeconfig(&kubeconfig, &user, &token, namespace)?;
        Ok(kubeconfig)
    }

    fn write_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        token: &str,
        namespace: &str,
    ) -> Result<(), Error> {
        // JSON is YAML: kubectl, helm and kube read it as a kubeconfig.
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "control-plane", "cluster": {
                "server": self.url,
                "certificate-authority": self.ca_file(),
            }}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "control-plane", "context": {
                "cluster": "control-plane", "user": user, "namespace": namespace,
            }}],
            "current-context": "control-plane",
        });
        std::fs::write(path, config.to_string()).map_err(io(format!("write {}", path.display())))
    }
}

/// A namespace of its own for one test, with the controller's ServiceAccount.
pub struct TestNamespace {
    pub name: String,
    /// Kubeconfig of `system:serviceaccount:<name>:autoapproval`, namespace `name`.
    pub kubeconfig: PathBuf,
    /// Kubeconfig of the admin, namespace `name`.
    pub admin_kubeconfig: PathBuf,
}

impl TestNamespace {
    /// A client of the ServiceAccount, default namespace this one.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        client_from(&self.kubeconfig).await
    }

    /// A client of the admin, default namespace this one.
    pub async fn admin_client(&self) -> Result<kube::Client, Error> {
        client_from(&self.admin_kubeconfig).await
    }

    /// `system:serviceaccount:<namespace>:autoapproval`.
    pub fn service_account_user(&self) -> String {
        format!("system:serviceaccount:{}:{SERVICE_ACCOUNT}", self.name)
    }
}

async fn client_from(path: &Path) -> Result<kube::Client, Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Config {
        path: path.into(),
        source,
    })?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| Error::Config {
            path: path.into(),
            source,
        })?;
    kube::Client::try_from(config).map_err(Error::Client)
}

/// `$<env>`, else the repository's .tools/bin, else PATH.
fn binary(name: &'static str, env: &'static str) -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os(env) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::Missing {
                binary: name,
                env,
                looked: path.display().to_string(),
            })
        };
    }
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/bin");
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    std::iter::once(tools.clone())
        .chain(on_path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::Missing {
            binary: name,
            env,
            looked: format!("{} and PATH", tools.display()),
        })
}

/// `N` distinct free loopback ports: all bound at once, so none is picked twice.
fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").map_err(io("find a free port")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(io("find a free port"))?
            .port();
    }
    Ok(ports)
}

/// A word for `sh`, single-quoted.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The last lines of a log, for a start-up failure's message.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
