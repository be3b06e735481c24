//! Child processes the tests start: the real `autoapproval` binary with
//! the test's database, signals as a kubelet sends them, and its `/metrics`;
//! a fresh directory and a kubeconfig for a child process.

use super::db::AsDb;

/// The URL of the test's own database, for a child process.
pub fn database_url(db: &impl AsDb) -> String {
    db.db().url()
}

/// Sends SIGTERM.
pub fn sigterm(pid: u32) {
    signal(pid, "TERM");
}

/// Sends `SIG<name>` to `pid`.
pub fn signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(sent.success(), "kill -{name} {pid}");
}

/// The sum of the samples of `metric` whose labels contain every one of
/// `labels` (e.g. `result="lost"`), in Prometheus text.
pub fn metric_sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            // An OpenMetrics exemplar (` # {trace_id="…"} v ts`) follows the value.
            let line = line.split(" # ").next()?;
            let (series, value) = line.rsplit_once(' ')?;
            let (name, label_text) = match series.split_once('{') {
                Some((name, rest)) => (name, rest),
                None => (series, ""),
            };
            (name == metric && labels.iter().all(|l| label_text.contains(l)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// A TCP proxy on loopback in front of a server, that can be cut: from
/// then on every connection through it is closed and new ones are refused,
/// as a network partition between one replica and its database would.
pub struct CutProxy {
    addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
    /// Bumped by [`CutProxy::reset`]: the connections open then are closed.
    resets: tokio::sync::watch::Sender<u64>,
}

impl CutProxy {
    /// Forwards a free loopback port to `target`.
    pub async fn start(target: std::net::SocketAddr) -> CutProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy port");
        let addr = listener.local_addr().expect("proxy address");
        let (cut, mut cut_rx) = tokio::sync::watch::channel(false);
        let (resets, resets_rx) = tokio::sync::watch::channel(0u64);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    // Dropping the listener refuses new connections.
                    _ = cut_rx.wait_for(|c| *c) => return,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let mut cut = cut_rx.clone();
                let mut reset = resets_rx.clone();
                let generation = *reset.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|c| *c) => {}
                        _ = reset.wait_for(|g| *g != generation) => {}
                    }
                });
            }
        });
        CutProxy { addr, cut, resets }
    }

    /// `host:port` of the proxy.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Closes every connection open through the proxy now; new ones are let through,
    /// as after a load balancer's restart.
    pub fn reset(&self) {
        self.resets.send_modify(|g| *g += 1);
    }

    /// The URL of the test's database, through the proxy.
    pub fn url(&self, db: &impl AsDb) -> String {
        let mut url = url::Url::parse(&db.db().url()).expect("a database URL");
        url.set_host(Some(&self.addr.ip().to_string()))
            .expect("a host");
        url.set_port(Some(self.addr.port())).expect("a port");
        url.to_string()
    }

    /// Closes every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }
}

/// `spawn_run` with the external systems at the simulator's `sim_url`, the log
/// uncoloured.
pub fn spawn_run_on_sim(
    kubeconfig: &std::path::Path,
    pool: &impl AsDb,
    args: &[&str],
    sim_url: &str,
) -> tokio::process::Child {
    spawn_run(
        kubeconfig,
        free_port(),
        pool,
        args,
        &[
            ("AUTOAPPROVAL_ESIGN_URL", sim_url),
            ("AUTOAPPROVAL_OWNER_URL", sim_url),
            ("AUTOAPPROVAL_STORE_URL", sim_url),
            ("AUTOAPPROVAL_AD_URL", sim_url),
            ("NO_COLOR", "1"),
        ],
    )
}

/// The lines a child writes to its standard error, gathered as they come (the
/// child's stderr must be piped, as `spawn_run` has it).
pub fn capture_stderr(
    child: &mut tokio::process::Child,
) -> std::sync::Arc<std::sync::Mutex<String>> {
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let stderr = child.stderr.take().expect("stderr piped");
    tokio::spawn({
        let log = log.clone();
        async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = log.lock().expect("log");
                log.push_str(&line);
                log.push('\n');
            }
        }
    });
    log
}

/// A fresh directory for one test's files, `autoapproval-<tag>-<pid>-<n>` under the system's
/// temporary directory: numbered within this process, and emptied first should a dead run of
/// the same pid have left one.
pub fn fresh_dir(tag: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "autoapproval-{tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a fresh directory");
    dir
}

/// The kubeconfig of the test API server `server`, written into `dir`.
pub fn kubeconfig_in(
    dir: &std::path::Path,
    server: &kube_testserver::TestServer,
) -> std::path::PathBuf {
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    kubeconfig
}

/// Runs `autoapproval migrate` on the database of `url` twice; each run must succeed.
pub fn migrate_twice(url: &str) {
    for run in 1..=2 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
            .args(["migrate", "--database-url", url])
            .output()
            .expect("run autoapproval migrate");
        assert!(
            out.status.success(),
            "run {run}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Sends `child` SIGTERM and waits for it to exit, at most `within`: its output.
pub async fn stop_on_sigterm(
    child: tokio::process::Child,
    within: std::time::Duration,
) -> std::process::Output {
    sigterm(child.id().expect("pid"));
    tokio::time::timeout(within, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("exits within {within:?} of SIGTERM"))
        .expect("output")
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `autoapproval run` on the test's database with `kubeconfig`, serving its
/// endpoints on `port`, logging at info, its output captured.
pub fn spawn_run(
    kubeconfig: &std::path::Path,
    port: u16,
    pool: &impl AsDb,
    args: &[&str],
    env: &[(&str, &str)],
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .env("AUTOAPPROVAL_DATABASE_URL", database_url(pool))
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("autoapproval run starts")
}
