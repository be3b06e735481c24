//! Replicas as child processes (the controller binary, or this one for the
//! seed's designs): started with their own
//! arguments and log file, read through `/metrics` and `/proc`, stopped with
//! SIGTERM like a pod.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::process::{free_port, signal, tail};
use super::{StackError, io};

/// One running replica.
pub struct Replica {
    name: String,
    child: Child,
    metrics: SocketAddr,
    log: PathBuf,
}

// === impl Replica ===

impl Replica {
    /// Starts `<exe> <args> --listen 127.0.0.1:<free port>` with
    /// `env` on top of ours minus every `AUTOAPPROVAL_*` variable, so the
    /// caller's settings cannot leak in. Output goes to `<dir>/<name>.log`.
    pub async fn spawn(
        exe: &Path,
        name: &str,
        args: &[String],
        env: &[(String, String)],
        dir: &Path,
    ) -> Result<Self, StackError> {
        let metrics: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err = out.try_clone().map_err(io("opening the log twice"))?;
        let mut command = Command::new(exe);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("AUTOAPPROVAL_") {
                command.env_remove(key);
            }
        }
        let child = command
            .args(args)
            .args(["--listen", &metrics.to_string()])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            // A log file, not a terminal: no colour codes.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(io(format!("starting replica {name}")))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            metrics,
            log,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Fails, naming the exit status and the log's tail, once it has exited.
    pub fn check_running(&mut self) -> Result<(), StackError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(StackError::Replica {
                name: self.name.clone(),
                message: format!("exited ({status}): {}", tail(&self.log)),
                log: self.log.display().to_string(),
            }),
            Err(e) => Err(StackError::Replica {
                name: self.name.clone(),
                message: e.to_string(),
                log: self.log.display().to_string(),
            }),
        }
    }

    /// Its `/metrics` text.
    pub async fn scrape(&self, http: &reqwest::Client) -> Result<String, StackError> {
        let url = format!("http://{}/metrics", self.metrics);
        let fail = |message: String| StackError::Replica {
            name: self.name.clone(),
            message,
            log: self.log.display().to_string(),
        };
        let response = http
            .get(&url)
            .send()
            .await
            .map_err(|e| fail(format!("GET {url}: {e}")))?;
        response
            .text()
            .await
            .map_err(|e| fail(format!("GET {url}: {e}")))
    }

    /// Resident memory now, from `/proc/<pid>/status` (`VmRSS`), in bytes.
    pub fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()?)).ok()?;
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    }

    /// CPU seconds (user + system) it has used so far, from `/proc/<pid>/stat`.
    pub fn cpu_seconds(&self) -> Option<f64> {
        cpu_seconds(self.child.id()?)
    }

    /// SIGTERM, then SIGKILL when it has not exited after `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            signal(pid, "TERM");
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// The fields of `/proc/<pid>/stat` after the parenthesised command name
/// (which may hold spaces): the line's field 3 is the first.
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    // The state letter (field 3) is not a number; keep the positions.
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// CPU seconds of process `pid`: utime + stime of `/proc/<pid>/stat`, in
/// USER_HZ ticks, which the kernel's ABI fixes at 100 per second.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let fields = stat_fields(pid)?;
    // utime and stime are fields 14 and 15 of the line; 12 and 13 after ')'.
    Some((fields.get(11)? + fields.get(12)?) as f64 / 100.0)
}

/// CPU seconds of process `pid` and of its children, living (their utime +
/// stime) and reaped (its cutime + cstime): a PostgreSQL server with its
/// backends.
pub fn tree_cpu_seconds(pid: u32) -> Option<f64> {
    let fields = stat_fields(pid)?;
    // cutime and cstime are fields 16 and 17: 14 and 15 after ')'.
    let mut ticks = fields.get(11)? + fields.get(12)? + fields.get(13)? + fields.get(14)?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // The parent pid is field 4: 1 after ')'.
        if let Some(f) = stat_fields(child).filter(|f| f.get(1) == Some(&u64::from(pid))) {
            ticks += f.get(11).unwrap_or(&0) + f.get(12).unwrap_or(&0);
        }
    }
    Some(ticks as f64 / 100.0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_adds_matching_series_only() {
        let text = "# HELP autoapproval_claims_total Claims.\n\
                    autoapproval_claims_total{result=\"won\"} 7\n\
                    autoapproval_claims_total{result=\"lost\"} 2\n\
                    autoapproval_claims_total_created{result=\"lost\"} 99\n\
                    autoapproval_up 1\n";
        assert_eq!(
            metric_sum(text, "autoapproval_claims_total", &["result=\"lost\""]),
            2.0
        );
        assert_eq!(metric_sum(text, "autoapproval_claims_total", &[]), 9.0);
        assert_eq!(metric_sum(text, "autoapproval_up", &[]), 1.0);
        assert_eq!(metric_sum(text, "missing", &[]), 0.0);
    }

    #[test]
    fn cpu_seconds_reads_our_own_process() {
        let ours = cpu_seconds(std::process::id());
        assert!(ours.is_some_and(|s| s >= 0.0), "{ours:?}");
        assert_eq!(cpu_seconds(u32::MAX), None);
    }
}
