//! What a benchmark run measured, as JSON and as a side-by-side table.

use std::collections::BTreeMap;

use serde::Serialize;

use autoapproval_sim::Stats;

/// Percentiles of a sample, nearest-rank.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `values`; `None` when empty.
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let n = sorted.len();
            let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
            sorted[i]
        };
        Some(Self {
            p50: rank(0.50),
            p95: rank(0.95),
            p99: rank(0.99),
            max: sorted[sorted.len() - 1],
        })
    }
}

/// Creations beyond the first, per request and kind: what idempotency and
/// claims must keep at zero.
pub fn duplicate_creations(stats: &Stats) -> u64 {
    stats
        .per_request
        .values()
        .map(|c| {
            c.owner.saturating_sub(1) + c.store.saturating_sub(1) + c.campaign.saturating_sub(1)
        })
        .sum()
}

/// One design's figures.
#[derive(Clone, Debug, Serialize)]
pub struct DesignReport {
    /// `ours`, `seed-new` or `seed-old` (`ours-mariadb`, `ours-postgres`
    /// when one run holds ours on both databases).
    pub design: String,
    /// What it ran on: PostgreSQL, MariaDB, or MariaDB + Redis.
    pub database: String,
    /// Requests inserted.
    pub requests: u64,
    /// Requests approved by the design within the run.
    pub approved: u64,
    /// Pickup latency, eligible → claimed, milliseconds.
    pub pickup_ms: Option<Percentiles>,
    /// Every request's pickup latency, milliseconds, ascending (the plot's data).
    pub pickup_samples_ms: Vec<f64>,
    /// Approvals per second, first insert to last approval.
    pub throughput_per_s: f64,
    /// CPU seconds of the replica processes per 1,000 approvals.
    pub cpu_seconds_per_1000: f64,
    /// CPU seconds of the database (PostgreSQL's server and backends, or
    /// MariaDB's process) per 1,000 approvals.
    pub database_cpu_seconds_per_1000: Option<f64>,
    /// CPU seconds of the benchmark's own process per 1,000 approvals: the
    /// in-memory API server, the simulator and the inserts.
    pub lab_cpu_seconds_per_1000: Option<f64>,
    /// Statements the replicas sent, per approval (`pg_stat_statements`);
    /// `None` when the extension is not available.
    pub db_statements_per_approval: Option<f64>,
    /// The statements sent most, with their counts (where the statements go).
    pub db_statements_top: Vec<crate::harness::StatementCount>,
    /// Writes to the Kubernetes API per approval.
    pub kube_writes_per_approval: f64,
    /// With `--control-plane real`: what kube-apiserver and etcd spent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<ControlPlaneCost>,
    /// Calls to the external systems per approval.
    pub external_calls_per_approval: f64,
    /// Creations beyond the first per request and kind.
    pub duplicate_creations: u64,
    /// Creations that arrived while another for the same request and system
    /// was in flight: two chains on one request at once.
    pub overlapping_creations: u64,
    /// Failed claims by reason: `claim lost` (a conditional claim on the
    /// primary refused), and the seed's `lock contention` (Redis refused the
    /// lock), `stale candidate` (the writer's re-check refused a candidate
    /// read before another replica's claim) and `redis unavailable`.
    pub failed_claims: BTreeMap<String, u64>,
}

/// What the real control plane spent on a run, per 1,000 approvals: CPU seconds
/// per 1,000 are milliseconds per approval.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ControlPlaneCost {
    /// kube-apiserver's CPU seconds (utime + stime, `/proc`) per 1,000 approvals.
    pub apiserver_cpu_seconds_per_1000: f64,
    /// etcd's CPU seconds per 1,000 approvals.
    pub etcd_cpu_seconds_per_1000: f64,
    /// Growth of etcd's database (`etcd_mvcc_db_total_size_in_bytes`) per 1,000
    /// approvals, in bytes; bbolt allocates in pages and keeps freed ones, so it grows
    /// in steps and never shrinks without a defragmentation.
    pub etcd_db_growth_bytes_per_1000: f64,
    /// etcd's database size at the end of the run, in bytes.
    pub etcd_db_bytes: u64,
}

impl DesignReport {
    /// Failed claims of every reason.
    pub fn failed_claims_total(&self) -> u64 {
        self.failed_claims.values().sum()
    }
}

/// The whole report: the parameters and each design.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The parameters, as given.
    pub parameters: serde_json::Value,
    /// Machine facts: cores and kernel.
    pub machine: String,
    /// One entry per design run.
    pub designs: Vec<DesignReport>,
    /// Ratios against `ours`, when it ran with others: `p99 <design> / ours` and so on.
    pub ratios: serde_json::Map<String, serde_json::Value>,
}

impl Report {
    /// A report of `designs` with the ratios of every other design's p99 and
    /// p50 to ours.
    pub fn new(parameters: serde_json::Value, designs: Vec<DesignReport>) -> Self {
        let mut ratios = serde_json::Map::new();
        // Ours on the database under test runs first.
        let base = designs.iter().find(|d| d.design.starts_with("ours"));
        if let Some((base_name, ours)) = base.and_then(|d| Some((&d.design, d.pickup_ms?))) {
            for other in designs.iter().filter(|d| &d.design != base_name) {
                if let Some(theirs) = other.pickup_ms {
                    for (name, a, b) in
                        [("p50", theirs.p50, ours.p50), ("p99", theirs.p99, ours.p99)]
                    {
                        ratios.insert(
                            format!("{name} {} / {base_name}", other.design),
                            serde_json::json!(a / b.max(f64::MIN_POSITIVE)),
                        );
                    }
                }
            }
        }
        Self {
            parameters,
            machine: machine(),
            designs,
            ratios,
        }
    }

    /// The human summary: one column per design, then the ratios.
    pub fn table(&self) -> String {
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        let f = |v: f64| format!("{v:.2}");
        let get = |pick: &dyn Fn(&DesignReport) -> String| {
            self.designs.iter().map(pick).collect::<Vec<String>>()
        };
        rows.push(("database".into(), get(&|d| d.database.clone())));
        rows.push((
            "approved / requests".into(),
            get(&|d| format!("{}/{}", d.approved, d.requests)),
        ));
        rows.push((
            "pickup p50 (ms)".into(),
            get(&|d| ms(d.pickup_ms.map(|p| p.p50))),
        ));
        rows.push((
            "pickup p95 (ms)".into(),
            get(&|d| ms(d.pickup_ms.map(|p| p.p95))),
        ));
        rows.push((
            "pickup p99 (ms)".into(),
            get(&|d| ms(d.pickup_ms.map(|p| p.p99))),
        ));
        rows.push((
            "pickup max (ms)".into(),
            get(&|d| ms(d.pickup_ms.map(|p| p.max))),
        ));
        rows.push((
            "throughput (approvals/s)".into(),
            get(&|d| f(d.throughput_per_s)),
        ));
        rows.push((
            "CPU s / 1,000 approvals".into(),
            get(&|d| f(d.cpu_seconds_per_1000)),
        ));
        rows.push((
            "  database CPU s / 1,000".into(),
            get(&|d| d.database_cpu_seconds_per_1000.map_or("n/a".into(), f)),
        ));
        let real = self.designs.iter().any(|d| d.control_plane.is_some());
        rows.push((
            if real {
                "  lab (sim, inserts) CPU s / 1,000".into()
            } else {
                "  API server + sim CPU s / 1,000".into()
            },
            get(&|d| d.lab_cpu_seconds_per_1000.map_or("n/a".into(), f)),
        ));
        if real {
            let cost = |pick: fn(&ControlPlaneCost) -> f64| {
                get(&|d| {
                    d.control_plane
                        .as_ref()
                        .map_or("n/a".into(), |c| f(pick(c)))
                })
            };
            rows.push((
                "  kube-apiserver CPU s / 1,000".into(),
                cost(|c| c.apiserver_cpu_seconds_per_1000),
            ));
            rows.push((
                "  etcd CPU s / 1,000".into(),
                cost(|c| c.etcd_cpu_seconds_per_1000),
            ));
            rows.push((
                "etcd DB growth KiB / 1,000".into(),
                cost(|c| c.etcd_db_growth_bytes_per_1000 / 1024.0),
            ));
        }
        rows.push((
            "DB statements / approval".into(),
            get(&|d| d.db_statements_per_approval.map_or("n/a".into(), f)),
        ));
        rows.push((
            "kube API writes / approval".into(),
            get(&|d| f(d.kube_writes_per_approval)),
        ));
        rows.push((
            "external calls / approval".into(),
            get(&|d| f(d.external_calls_per_approval)),
        ));
        rows.push((
            "duplicate creations".into(),
            get(&|d| d.duplicate_creations.to_string()),
        ));
        rows.push((
            "overlapping chains".into(),
            get(&|d| d.overlapping_creations.to_string()),
        ));
        rows.push((
            "failed claims".into(),
            get(&|d| d.failed_claims_total().to_string()),
        ));
        let mut reasons: Vec<&String> = self
            .designs
            .iter()
            .flat_map(|d| d.failed_claims.keys())
            .collect();
        reasons.sort();
        reasons.dedup();
        for reason in reasons {
            rows.push((
                format!("  {reason}"),
                get(&|d| {
                    d.failed_claims
                        .get(reason)
                        .copied()
                        .unwrap_or(0)
                        .to_string()
                }),
            ));
        }
        let mut text = format!("{:<34}", "");
        for d in &self.designs {
            text.push_str(&format!("{:>16}", d.design));
        }
        text.push('\n');
        for (label, cells) in rows {
            text.push_str(&format!("{label:<34}"));
            for cell in cells {
                text.push_str(&format!("{cell:>16}"));
            }
            text.push('\n');
        }
        for (name, value) in &self.ratios {
            if let Some(v) = value.as_f64() {
                // Two decimals below 10: ours on two databases may differ 30-fold.
                let v = if v < 10.0 {
                    format!("{v:.2}")
                } else {
                    format!("{v:.1}")
                };
                text.push_str(&format!("{name:<34}{v:>16}×\n"));
            }
        }
        text
    }
}

/// Cores and kernel of this machine, for the report.
pub(crate) fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(String::new(), |kb| format!(", {} GiB", kb / (1024 * 1024)));
    format!("{cores} cores{memory}, Linux {}", kernel.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&values).expect("non-empty");
        assert_eq!((p.p50, p.p95, p.p99, p.max), (50.0, 95.0, 99.0, 100.0));
        let one = Percentiles::of(&[7.0]).expect("non-empty");
        assert_eq!((one.p50, one.p99, one.max), (7.0, 7.0, 7.0));
        assert_eq!(Percentiles::of(&[]), None);
    }

    #[test]
    fn ratios_compare_every_other_design_with_ours() {
        let design = |name: &str, p99: f64| DesignReport {
            design: name.into(),
            requests: 1,
            approved: 1,
            pickup_ms: Some(Percentiles {
                p50: p99 / 2.0,
                p95: p99,
                p99,
                max: p99,
            }),
            pickup_samples_ms: vec![p99],
            throughput_per_s: 1.0,
            cpu_seconds_per_1000: 1.0,
            database_cpu_seconds_per_1000: None,
            lab_cpu_seconds_per_1000: None,
            db_statements_per_approval: None,
            db_statements_top: Vec::new(),
            kube_writes_per_approval: 0.0,
            control_plane: None,
            external_calls_per_approval: 3.0,
            duplicate_creations: 0,
            overlapping_creations: 0,
            failed_claims: BTreeMap::from([("lock contention".to_owned(), 2)]),
            database: "PostgreSQL".into(),
        };
        let report = Report::new(
            serde_json::json!({}),
            vec![
                design("ours", 10.0),
                design("seed-new", 400.0),
                design("seed-old", 20_000.0),
            ],
        );
        assert_eq!(report.ratios["p99 seed-new / ours"], 40.0);
        assert_eq!(report.ratios["p99 seed-old / ours"], 2000.0);
        let table = report.table();
        assert!(table.contains("seed-old"), "{table}");
        assert!(table.contains("2000.0×"), "{table}");
        assert!(table.contains("  lock contention"), "{table}");
    }
}
