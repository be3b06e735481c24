//! Tests driven by the real kubectl binary.

use std::path::PathBuf;
use std::process::Command;

use crate::server::{Under, fixture, on_both_servers};

fn kubectl_bin() -> PathBuf {
    if let Ok(k) = std::env::var("KUBECTL") {
        return PathBuf::from(k);
    }
    let repo_tools = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/kubectl");
    if repo_tools.exists() {
        return repo_tools;
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = PathBuf::from(dir).join("kubectl");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "kubectl not found: set KUBECTL or run `export PATH=\"$(scripts/install-tools.sh):$PATH\"`"
    );
}

struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    /// kubectl on the server under test, in the test's namespace.
    fn new(s: &Under) -> Self {
        Kubectl {
            kubeconfig: s.kubeconfig().to_path_buf(),
            cache: s.dir().join("cache"),
        }
    }
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .output()
            .expect("run kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }
    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(ok, "kubectl {args:?} failed: {err}\n{out}");
        out
    }
}

/// On the real server the CRD is shared by the tests and installed once (then kubectl's
/// apply of it finds it established); on the in-memory one kubectl's apply creates it.
async fn crd_for_kubectl(s: &Under) {
    if s.is_real() {
        s.install_crd().await;
    }
}

async fn apply_get_patch_delete_with_finalizer(s: &Under) {
    crd_for_kubectl(s).await;
    let k = Kubectl::new(s);
    let sample = s.fixture("sample-aa.yaml");
    tokio::task::spawn_blocking(move || {
        k.ok(&["apply", "-f", &fixture("autoapproval-crd.yaml")]);
        k.ok(&["apply", "-f", &sample]);
        let out = k.ok(&["get", "aa"]);
        assert!(
            out.contains("REQUEST") && out.contains("NEXT RETRY") && out.contains("AGE"),
            "{out}"
        );
        assert!(
            out.contains("req-1") && out.contains("OWNER_CONTRACT"),
            "{out}"
        );
        k.ok(&[
            "patch",
            "aa",
            "req-1",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"paused":true}}"#,
        ]);
        k.ok(&[
            "patch",
            "aa",
            "req-1",
            "--type",
            "json",
            "-p",
            r#"[{"op":"add","path":"/metadata/finalizers","value":["autoapproval.io/cleanup"]}]"#,
        ]);
        let out = k.ok(&[
            "get",
            "aa",
            "req-1",
            "-o",
            "jsonpath={.spec.paused} {.metadata.generation}",
        ]);
        assert_eq!(out, "true 2");
        k.ok(&["delete", "aa", "req-1", "--wait=false"]);
        let out = k.ok(&[
            "get",
            "aa",
            "req-1",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ]);
        assert!(!out.is_empty(), "deletionTimestamp should be set");
        k.ok(&[
            "patch",
            "aa",
            "req-1",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
        let (ok, _, err) = k.run(&["get", "aa", "req-1"]);
        assert!(
            !ok && (err.contains("NotFound") || err.contains("not found")),
            "{err}"
        );
    })
    .await
    .unwrap();
}

on_both_servers!(apply_get_patch_delete_with_finalizer);

async fn invalid_create_ssa_and_watch(s: &Under) {
    crd_for_kubectl(s).await;
    let k = Kubectl::new(s);
    let sample = s.fixture("sample-aa.yaml");
    tokio::task::spawn_blocking(move || {
            k.ok(&["apply", "-f", &fixture("autoapproval-crd.yaml")]);
            let dir = k.kubeconfig.parent().unwrap().to_path_buf();
            let bad = dir.join("bad.yaml");
            std::fs::write(&bad, "apiVersion: autoapproval.io/v1alpha1\nkind: AutoApproval\nmetadata:\n  name: bad\nspec:\n  requestType: AD_CONTRACT\n").unwrap();
            let (ok, _, err) = k.run(&["create", "-f", bad.to_str().unwrap()]);
            assert!(!ok, "invalid CR must be rejected");
            assert!(err.contains("spec.requestId") && err.contains("Required value"), "{err}");
            k.ok(&["apply", "--server-side", "-f", &sample]);
            let out = k.ok(&["get", "aa", "req-1", "-o", "jsonpath={.metadata.managedFields[0].manager} {.metadata.managedFields[0].operation}"]);
            assert_eq!(out, "kubectl Apply");
            let mut child = Command::new(kubectl_bin())
                .arg("--kubeconfig")
                .arg(&k.kubeconfig)
                .arg("--cache-dir")
                .arg(&k.cache)
                .args(["get", "aa", "-w", "--no-headers"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let stdout = child.stdout.take().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            let first = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("initial line");
            assert!(first.starts_with("req-1"), "{first}");
            k.ok(&["patch", "aa", "req-1", "--type", "merge", "-p", r#"{"spec":{"requestId":42}}"#]);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            loop {
                let line = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())).expect("watch update");
                if line.contains("42") {
                    break;
                }
            }
            child.kill().unwrap();
            let _ = child.wait();
        })
        .await
        .unwrap();
}

on_both_servers!(invalid_create_ssa_and_watch);

/// The standalone binary, as a user runs it: it writes a kubeconfig that kubectl uses as is.
#[test]
fn standalone_binary_serves_kubectl_printer_columns() {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("kts-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    /// Stops the server process and removes its files, also when an assertion fails.
    struct Running(std::process::Child, PathBuf);
    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-testserver"))
        .args(["--port", "0", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _running = Running(child, dir.clone());
    let mut url = String::new();
    std::io::BufReader::new(stdout).read_line(&mut url).unwrap();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let k = Kubectl {
        kubeconfig,
        cache: dir.join("cache"),
    };
    k.ok(&["apply", "-f", &fixture("autoapproval-crd.yaml")]);
    k.ok(&["apply", "-f", &fixture("sample-aa.yaml")]);
    let out = k.ok(&["get", "autoapprovals"]);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "REQUEST", "TYPE", "PHASE", "STEP", "RETRIES", "NEXT", "RETRY", "AGE"
        ],
        "{out}"
    );
    // Reason has priority 1: shown only with -o wide.
    let wide = k.ok(&["get", "autoapprovals", "-o", "wide"]);
    assert!(wide.lines().next().unwrap().contains("REASON"), "{wide}");
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], ["req-1", "1", "OWNER_CONTRACT"], "{out}");
}

/// The built-in kinds a Helm chart renders: a server dry run validates and stores nothing, a real
/// apply stores each kind in its scope, and a second apply patches them in place.
async fn builtin_kinds_dry_run_apply_and_reapply(s: &Under) {
    let k = Kubectl::new(s);
    let builtins = s.fixture("builtins.yaml");
    tokio::task::spawn_blocking(move || {
            let kinds = "serviceaccounts,configmaps,secrets,services,deployments,jobs,poddisruptionbudgets,networkpolicies,roles,rolebindings";
            let out = k.ok(&["apply", "--dry-run=server", "-f", &builtins]);
            assert_eq!(out.matches("(server dry run)").count(), 12, "{out}");
            let (ok, out, err) = k.run(&["get", kinds, "-o", "name"]);
            assert!(ok && out.is_empty(), "a dry run must store nothing: {out}{err}");
            let (ok, _, err) = k.run(&["get", "clusterrole", "demo"]);
            assert!(!ok && err.contains("NotFound"), "{err}");

            let out = k.ok(&["apply", "-f", &builtins]);
            assert_eq!(out.matches(" created").count(), 12, "{out}");
            let names = k.ok(&["get", kinds, "-o", "name"]);
            for name in [
                "serviceaccount/demo",
                "configmap/demo",
                "secret/demo",
                "service/demo",
                "deployment.apps/demo",
                "job.batch/demo",
                "poddisruptionbudget.policy/demo",
                "networkpolicy.networking.k8s.io/demo",
                "role.rbac.authorization.k8s.io/demo",
                "rolebinding.rbac.authorization.k8s.io/demo",
            ] {
                assert!(names.lines().any(|l| l == name), "{name} missing from\n{names}");
            }
            let all = k.ok(&["get", "all", "-o", "name"]);
            assert_eq!(
                all.lines().collect::<Vec<_>>(),
                ["service/demo", "deployment.apps/demo", "job.batch/demo"],
                "{all}"
            );
            let cluster = k.ok(&["get", "clusterroles,clusterrolebindings", "--field-selector", "metadata.name=demo", "-o", "jsonpath={range .items[*]}{.kind}/{.metadata.name}/{.metadata.namespace};{end}"]);
            assert_eq!(cluster, "ClusterRole/demo/;ClusterRoleBinding/demo/;");
            let (ok, _, err) = k.run(&["get", "deploy", "demo", "-n", "kube-system"]);
            assert!(!ok && err.contains("NotFound"), "namespaced: {err}");
            // kubectl's typed `create` commands speak protobuf.
            let out = k.ok(&["create", "namespace", "typed"]);
            assert_eq!(out, "namespace/typed created\n");
            let out = k.ok(&["create", "secret", "generic", "creds", "-n", "typed", "--from-literal=url=postgres://db/x"]);
            assert_eq!(out, "secret/creds created\n");
            let url = k.ok(&["get", "secret", "creds", "-n", "typed", "-o", "jsonpath={.data.url}"]);
            assert_eq!(url, "cG9zdGdyZXM6Ly9kYi94", "base64 of postgres://db/x");
            let out = k.ok(&["create", "configmap", "settings", "-n", "typed", "--from-literal=a=1"]);
            assert_eq!(out, "configmap/settings created\n");
            let out = k.ok(&["create", "serviceaccount", "robot", "-n", "typed"]);
            assert_eq!(out, "serviceaccount/robot created\n");
            let out = k.ok(&["create", "role", "reader", "-n", "typed", "--verb=get", "--resource=configmaps"]);
            assert_eq!(out, "role.rbac.authorization.k8s.io/reader created\n");
            let rules = k.ok(&["get", "role", "reader", "-n", "typed", "-o", "jsonpath={.rules}"]);
            assert_eq!(rules, r#"[{"apiGroups":[""],"resources":["configmaps"],"verbs":["get"]}]"#);

            // A second apply with changes goes through a strategic merge patch.
            let dir = k.kubeconfig.parent().unwrap().to_path_buf();
            let changed = dir.join("changed.yaml");
            let text = std::fs::read_to_string(&builtins)
                .unwrap()
                .replace("replicas: 2", "replicas: 3")
                .replace("targetPort: http", "targetPort: 9090");
            std::fs::write(&changed, text).unwrap();
            let out = k.ok(&["apply", "--dry-run=server", "-f", changed.to_str().unwrap()]);
            assert!(out.contains("deployment.apps/demo configured (server dry run)"), "{out}");
            assert_eq!(k.ok(&["get", "deploy", "demo", "-o", "jsonpath={.spec.replicas}"]), "2");
            let out = k.ok(&["apply", "-f", changed.to_str().unwrap()]);
            assert!(out.contains("deployment.apps/demo configured") && out.contains("service/demo configured"), "{out}");
            assert!(out.contains("role.rbac.authorization.k8s.io/demo unchanged"), "{out}");
            assert_eq!(k.ok(&["get", "deploy", "demo", "-o", "jsonpath={.spec.replicas}"]), "3");
            // Not `{.spec.ports}` whole: kube-apiserver defaults `protocol: TCP`, the imitation
            // defaults no built-in field (README, deliberate simplifications).
            let ports = k.ok(&["get", "svc", "demo", "-o", "jsonpath={.spec.ports[*].name} {.spec.ports[*].port} {.spec.ports[*].targetPort}"]);
            assert_eq!(ports, "http 8080 9090");
            let env = k.ok(&["get", "deploy", "demo", "-o", "jsonpath={.spec.template.spec.containers[0].env}"]);
            assert_eq!(env, r#"[{"name":"A","value":"1"}]"#);
        })
        .await
        .unwrap();
}

on_both_servers!(builtin_kinds_dry_run_apply_and_reapply);
