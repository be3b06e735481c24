//! Tests driven by the real kubectl binary.

use kube_testserver::{Options, TestServer};
use std::path::PathBuf;
use std::process::Command;

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
    fn new(server: &TestServer, tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "kts-{}-{}-{}",
            tag,
            std::process::id(),
            server.addr().port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        Kubectl {
            kubeconfig,
            cache: dir.join("cache"),
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

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run_async<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn apply_get_patch_delete_with_finalizer() {
    run_async(async {
        let server = TestServer::start(Options::default()).await.unwrap();
        let k = Kubectl::new(&server, "apply");
        tokio::task::spawn_blocking(move || {
            k.ok(&["apply", "-f", &fixture("autoapproval-crd.yaml")]);
            k.ok(&["apply", "-f", &fixture("sample-aa.yaml")]);
            let out = k.ok(&["get", "aa"]);
            assert!(out.contains("REQUEST") && out.contains("NEXT RETRY") && out.contains("AGE"), "{out}");
            assert!(out.contains("req-1") && out.contains("OWNER_CONTRACT"), "{out}");
            k.ok(&["patch", "aa", "req-1", "--type", "merge", "-p", r#"{"spec":{"paused":true}}"#]);
            k.ok(&["patch", "aa", "req-1", "--type", "json", "-p", r#"[{"op":"add","path":"/metadata/finalizers","value":["autoapproval.io/cleanup"]}]"#]);
            let out = k.ok(&["get", "aa", "req-1", "-o", "jsonpath={.spec.paused} {.metadata.generation}"]);
            assert_eq!(out, "true 2");
            k.ok(&["delete", "aa", "req-1", "--wait=false"]);
            let out = k.ok(&["get", "aa", "req-1", "-o", "jsonpath={.metadata.deletionTimestamp}"]);
            assert!(!out.is_empty(), "deletionTimestamp should be set");
            k.ok(&["patch", "aa", "req-1", "--type", "merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
            let (ok, _, err) = k.run(&["get", "aa", "req-1"]);
            assert!(!ok && err.contains("NotFound") || err.contains("not found"), "{err}");
        })
        .await
        .unwrap();
    });
}
