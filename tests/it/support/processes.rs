//! Child processes the tests start: the real `autoapproval` binary with
//! the test's database, signals as a kubelet sends them, and its `/metrics`.

use sqlx::PgPool;

/// The URL of the test's own database, for a child process.
pub fn database_url(pool: &PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().expect("a database name")
    )
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
