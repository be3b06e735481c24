//! The real kubectl v1.35 and helm v4 (scripts/install-tools.sh), pointed at one API server (the
//! test API server or the real kube-apiserver) with a kubeconfig, caches and Helm homes of their
//! own.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize;
use serde_json::Value;

/// The kinds the chart renders with its defaults, as `kubectl get` takes them.
pub const CHART_KINDS: &str =
    "deployments,services,serviceaccounts,configmaps,roles,rolebindings,poddisruptionbudgets,jobs";

/// The labels (`kubectl label` arguments) by which a namespace enforces, and warns of, the Pod
/// Security Standard `restricted`.
pub const RESTRICTED: &str = "pod-security.kubernetes.io/enforce=restricted";
pub const RESTRICTED_WARN: &str = "pod-security.kubernetes.io/warn=restricted";

/// The repository root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The real `helm` or `kubectl`: $HELM / $KUBECTL, else PATH, else the repository's .tools/bin.
pub fn tool(name: &str) -> PathBuf {
    if let Ok(path) = std::env::var(name.to_uppercase()) {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([repo().join(".tools/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found on PATH nor in .tools/bin: run scripts/install-tools.sh (scripts/test.sh does)")
        })
}

/// Runs a command and returns its stdout, failing the test with its stderr when it fails.
pub fn stdout_of(mut cmd: Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The objects of a YAML stream (`helm template`, `kubectl kustomize`, a manifest file).
pub fn parse_yaml_stream(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("valid YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

/// `kubectl get -o name` of an object.
pub fn kubectl_name(o: &Value) -> String {
    let kind = o["kind"].as_str().unwrap().to_lowercase();
    let api = o["apiVersion"].as_str().unwrap();
    let name = o["metadata"]["name"].as_str().unwrap();
    match api.rsplit_once('/') {
        Some((group, _)) => format!("{kind}.{group}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// kubectl and helm against one API server.
pub struct Cli {
    /// Scratch directory: kubeconfig, caches, Helm homes; removed on drop.
    pub dir: PathBuf,
    kubeconfig: PathBuf,
    /// The helm every command and shell line runs: `tool("helm")`, or another build.
    helm: PathBuf,
}

/// Runs `f` (blocking: helm and kubectl) with a `Cli` on a fresh test API server, then stops it.
pub async fn with_cli_on_test_server(f: impl FnOnce(&Cli) + Send + 'static) {
    let server = kube_testserver::TestServer::start(kube_testserver::Options::default())
        .await
        .expect("test API server");
    let cli = Cli::new(&server);
    tokio::task::spawn_blocking(move || f(&cli))
        .await
        .expect("the commands on the test API server");
    server.shutdown().await;
}

impl Cli {
    pub fn new(server: &kube_testserver::TestServer) -> Cli {
        let dir = super::fresh_dir("cli");
        let kubeconfig = super::kubeconfig_in(&dir, server);
        Cli {
            dir,
            kubeconfig,
            helm: tool("helm"),
        }
    }

    /// As the user of `kubeconfig` (e.g. the real control plane's admin), which is read, not
    /// removed.
    pub fn with_kubeconfig(kubeconfig: &Path) -> Cli {
        Cli {
            dir: super::fresh_dir("cli"),
            kubeconfig: kubeconfig.to_owned(),
            helm: tool("helm"),
        }
    }

    /// The same user with `helm` (e.g. `tool("helm3")`) as the `helm` of every command and of
    /// the shell lines, which find it first on PATH under that name.
    pub fn with_helm(&self, helm: &Path) -> Cli {
        let mut cli = Cli::with_kubeconfig(&self.kubeconfig);
        let bin = cli.dir.join("helm-bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(helm, bin.join("helm")).unwrap();
        cli.helm = bin.join("helm");
        cli
    }

    /// `program` (a path, or a name resolved by PATH) with this server's kubeconfig, kubectl's
    /// cache and Helm's homes, and the tools' directories first on PATH.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut path: Vec<PathBuf> = [self.helm.clone(), tool("kubectl")]
            .iter()
            .filter_map(|t| t.parent().map(Path::to_path_buf))
            .collect();
        path.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        let mut cmd = Command::new(program);
        cmd.env("PATH", std::env::join_paths(path).unwrap())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.dir.join("kube-cache"))
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"));
        cmd
    }

    /// kubectl with `args`, not yet run.
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut cmd = self.command(tool("kubectl"));
        cmd.args(args);
        cmd
    }

    /// kubectl's stdout; the test fails when kubectl does.
    pub fn kubectl(&self, args: &[&str]) -> String {
        stdout_of(self.kubectl_command(args), &format!("kubectl {args:?}"))
    }

    /// helm with `args`, run: its output whether it succeeded or not.
    pub fn helm_output(&self, args: &[&str]) -> Output {
        let mut cmd = self.command(&self.helm);
        cmd.args(args).output().expect("run helm")
    }

    /// One shell command line, as a reader types it, run from `cwd`.
    pub fn shell(&self, line: &str, cwd: &Path) -> Output {
        let mut cmd = self.command("sh");
        cmd.arg("-c").arg(line).current_dir(cwd);
        cmd.output().expect("run sh")
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
