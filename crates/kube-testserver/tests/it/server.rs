//! The server under test: the in-memory `TestServer` or the real kube-apiserver (one per
//! test binary run, from crates/control-plane), each giving a kube client, a kubeconfig for
//! kubectl and a namespace of the test's own. `on_both_servers!(name)` runs the async test
//! function `name(&Under)` on each, as `name::in_memory` and `name::real`.

use control_plane::ControlPlane;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use kube_testserver::{Options, TestServer};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::OnceCell;

/// Runs `async fn $name(&Under)` once on each server, as `$name::in_memory` and `$name::real`.
macro_rules! on_both_servers {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn in_memory() {
                super::$name(&crate::server::Under::in_memory().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn real() {
                super::$name(&crate::server::Under::real().await).await;
            }
        }
    };
}
pub(crate) use on_both_servers;

/// The CRD's group, as in `tests/fixtures/autoapproval-crd.yaml`.
pub const GROUP: &str = "autoapproval.io";

/// Numbers the namespaces and scratch directories of this process.
static SEQ: AtomicU64 = AtomicU64::new(1);

/// One test's server, namespace and scratch directory.
pub struct Under {
    /// `Some` on the in-memory server (kept running for the test); `None` on the real one.
    memory: Option<TestServer>,
    client: Client,
    namespace: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Under {
    /// A fresh in-memory server; the test's namespace is `default`.
    pub async fn in_memory() -> Under {
        let server = TestServer::start(Options::default()).await.unwrap();
        let dir = scratch("memory");
        let kubeconfig = dir.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let mut config = Config::new(server.url().parse().unwrap());
        config.default_namespace = "default".into();
        Under {
            client: Client::try_from(config).unwrap(),
            memory: Some(server),
            namespace: "default".into(),
            dir,
            kubeconfig,
        }
    }

    /// The real kube-apiserver shared by this test binary, with a fresh namespace (nothing
    /// in it, not even a ServiceAccount) and the admin's identity.
    pub async fn real() -> Under {
        let plane = ControlPlane::shared()
            .await
            .unwrap_or_else(|e| panic!("the real control plane: {e}"));
        let dir = scratch("real");
        let namespace = format!("kts-{}", SEQ.fetch_add(1, Ordering::Relaxed));
        // The admin's kubeconfig, with the test's namespace as its default.
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(plane.admin_kubeconfig_path()).unwrap())
                .unwrap();
        config["contexts"][0]["context"]["namespace"] = json!(namespace);
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, config.to_string()).unwrap();
        let client = Client::try_from(
            Config::from_custom_kubeconfig(
                Kubeconfig::read_from(&kubeconfig).unwrap(),
                &KubeConfigOptions::default(),
            )
            .await
            .unwrap(),
        )
        .unwrap();
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        Under {
            memory: None,
            client,
            namespace,
            dir,
            kubeconfig,
        }
    }

    /// Whether this is the real kube-apiserver.
    pub fn is_real(&self) -> bool {
        self.memory.is_none()
    }

    /// A client whose default namespace is the test's.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The test's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A kubeconfig whose default namespace is the test's.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The test's scratch directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A fixture with its `namespace: default` moved to the test's namespace, as a path.
    pub fn fixture(&self, name: &str) -> String {
        let text = std::fs::read_to_string(fixture(name)).unwrap().replace(
            "namespace: default",
            &format!("namespace: {}", self.namespace),
        );
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    /// The AutoApproval CRD of the fixture, served and established. On the real server it is
    /// installed once per run and shared, so no test may change or delete it there.
    pub async fn install_crd(&self) {
        if self.is_real() {
            static CRD: OnceCell<()> = OnceCell::const_new();
            CRD.get_or_init(|| install_crd(self.client(), GROUP)).await;
        } else {
            install_crd(self.client(), GROUP).await;
        }
    }

    /// The AutoApproval custom resources of the test's namespace.
    pub fn autoapprovals(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client(),
            &self.namespace,
            &autoapproval_resource(GROUP),
        )
    }
}

impl Drop for Under {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The AutoApproval kind served under `group`.
pub fn autoapproval_resource(group: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1alpha1".into(),
        api_version: format!("{group}/v1alpha1"),
        kind: "AutoApproval".into(),
        plural: "autoapprovals".into(),
    }
}

/// Creates the fixture's CRD with its group changed to `group` and waits until it is
/// established and its schema is in the OpenAPI (what kubectl validates and explains with).
pub async fn install_crd(client: Client, group: &str) {
    let mut crd: Value =
        serde_yaml::from_str(&std::fs::read_to_string(fixture("autoapproval-crd.yaml")).unwrap())
            .unwrap();
    crd["metadata"]["name"] = json!(format!("autoapprovals.{group}"));
    crd["spec"]["group"] = json!(group);
    let openapi = format!("/openapi/v3/apis/{group}/v1alpha1");
    let probe = control_plane::OpenApiProbe {
        path: &openapi,
        needle: "requestId",
    };
    control_plane::install_crd(&client, &serde_json::from_value(crd).unwrap(), Some(probe))
        .await
        .unwrap();
}

/// Waits until `f` answers `Some`, for at most 30 s.
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The path of a file in `tests/fixtures`.
pub fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kts-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
