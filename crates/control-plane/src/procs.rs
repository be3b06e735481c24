//! The control plane's processes as the operating system shows them: their pids, for
//! the lab's CPU figures, and etcd's metrics, for its database size. Found in `/proc`
//! by the scratch directory in their command lines, so a restarted server is found too.

use crate::{ControlPlane, Error};

/// The metric of the size etcd's bbolt file has allocated, in bytes.
const DB_SIZE_METRIC: &str = "etcd_mvcc_db_total_size_in_bytes";

/// Fails, naming the script that builds it, when etcd or kube-apiserver is missing:
/// for a caller that wants to know before it starts anything else.
pub fn check_binaries() -> Result<(), Error> {
    crate::binary("etcd", "ETCD")?;
    crate::binary("kube-apiserver", "KUBE_APISERVER")?;
    Ok(())
}

impl ControlPlane {
    /// The pid of kube-apiserver, while it runs.
    pub fn apiserver_pid(&self) -> Option<u32> {
        let cert_dir = format!("--cert-dir={}", self.dir.join("pki").display());
        self.process("kube-apiserver", &cert_dir)
            .map(|(pid, _)| pid)
    }

    /// The pid of etcd, while it runs.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd().map(|(pid, _)| pid)
    }

    /// etcd's database size now (`etcd_mvcc_db_total_size_in_bytes`), in bytes.
    pub async fn etcd_db_size_bytes(&self) -> Result<u64, Error> {
        let url = self.etcd_url();
        let failed = |e: reqwest::Error| Error::Io {
            what: format!("{url}/metrics"),
            source: std::io::Error::other(e),
        };
        let text = reqwest::get(format!("{url}/metrics"))
            .await
            .map_err(failed)?
            .text()
            .await
            .map_err(failed)?;
        db_size(&text).ok_or_else(|| Error::Io {
            what: format!("{url}/metrics"),
            source: std::io::Error::other(format!("no {DB_SIZE_METRIC}")),
        })
    }

    fn etcd(&self) -> Option<(u32, Vec<String>)> {
        let data_dir = format!("--data-dir={}", self.dir.join("etcd").display());
        self.process("etcd", &data_dir)
    }

    /// The process named `name` (its executable's file name) with the argument `arg`
    /// (exactly: another plane's directory may begin with this one's), and its
    /// arguments.
    fn process(&self, name: &str, arg: &str) -> Option<(u32, Vec<String>)> {
        std::fs::read_dir("/proc")
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find_map(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let args: Vec<String> = cmdline
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                let exe = std::path::Path::new(args.first()?).file_name()?;
                (exe == name && args.iter().skip(1).any(|a| a == arg)).then_some((pid, args))
            })
    }
}

/// `etcd_mvcc_db_total_size_in_bytes` in etcd's Prometheus text.
fn db_size(metrics: &str) -> Option<u64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(DB_SIZE_METRIC)?.strip_prefix(' ')?;
        Some(value.trim().parse::<f64>().ok()? as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn db_size_reads_the_total_not_the_in_use_size() {
        let text = "# TYPE etcd_mvcc_db_total_size_in_bytes gauge\n\
                    etcd_mvcc_db_total_size_in_bytes 2.097152e+06\n\
                    etcd_mvcc_db_total_size_in_use_in_bytes 1.2e+06\n";
        assert_eq!(db_size(text), Some(2_097_152));
        assert_eq!(db_size("etcd_mvcc_db_total_size_in_use_in_bytes 5\n"), None);
    }
}
