//! Several replicas: real `autoapproval run` processes sharing the test API
//! server (or the real kube-apiserver), the database and the simulator,
//! coordinated by Leases.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use autoapproval::controller::crd::AutoApproval;
use autoapproval::coordination::{SHARD_LEASE_PREFIX, member_lease_name};
use autoapproval_sim::{Faults, Idempotency, SimHandle};
use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, ListParams};
use kube_testserver::Match;
use rand::Rng;
use tokio::process::{Child, Command};

use crate::support::{ApiServer, real_namespace_on, simulator};
use crate::support::{AsDb, CutProxy, Db, NS, backends, eventually, memos, on_both};
use crate::support::{database_url, fresh_dir, kubeconfig_in, sigterm};

const SHARDS: u32 = 16;
/// Lease timings of the tests: short, so failovers happen within seconds.
const LEASE_DURATION: Duration = Duration::from_secs(4);
const RETRY_PERIOD: Duration = Duration::from_millis(500);

struct Replica {
    name: String,
    port: u16,
    child: Option<Child>,
    /// Its database URL when not the test database's own (a proxy, say).
    database_url: Option<String>,
}

/// What kind of downstream the replicas create in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Downstream {
    /// Honours `Idempotency-Key`; the replicas rely on it.
    Keyed,
    /// No idempotency support at all; the replicas run with `--*-dedup
    /// lookup`, and some answers to creations are lost on the way back.
    Unkeyed,
}

impl Downstream {
    /// `faults`, and for an unkeyed downstream lost answers on top: the case
    /// a lookup has to catch.
    fn faults(self, faults: Faults) -> Faults {
        match self {
            Downstream::Keyed => faults,
            Downstream::Unkeyed => Faults {
                timeout_rate: faults.timeout_rate.max(0.02),
                malformed_rate: faults.malformed_rate.max(0.03),
                hang: Duration::from_millis(200),
                ..faults
            },
        }
    }
}

/// Three (or more) replicas and everything they talk to.
struct Fleet {
    server: ApiServer,
    /// The tests' own client (on the real server, the admin), default namespace `ns`.
    client: Client,
    /// The namespace of the Leases, CRs and Events.
    ns: String,
    /// Flags every replica gets on top of the fleet's own.
    extra_args: Vec<String>,
    sim: SimHandle,
    pool: Db,
    dir: PathBuf,
    kubeconfig: PathBuf,
    replicas: Vec<Replica>,
    lease_duration: Duration,
    http: reqwest::Client,
    downstream: Downstream,
}

/// Each claim the victim held when it died was memoed as interrupted on it by
/// its new holder, and every chain has finished (no state row left).
async fn assert_orphans_recovered(
    fleet: &Fleet,
    db: &impl AsDb,
    orphaned: &[i64],
    victim_name: &str,
) {
    for request_id in orphaned {
        let history = memos(db, *request_id).await;
        assert!(
            history
                .iter()
                .any(|m| m.contains(&format!("interrupted on {victim_name}"))),
            "request {request_id}: {history:?}"
        );
    }
    eventually("the state table to empty", || async {
        (fleet.count("SELECT count(*) FROM auto_approve_state").await == 0).then_some(())
    })
    .await;
}

/// What a fleet test saw about timing rather than a guarantee (a claim
/// failed in steady state, a takeover slower than its bound): collected as
/// the run goes and asserted after every guarantee (nothing lost, nothing
/// doubled, every failover counted) was judged, so a Lease renewal late on
/// a loaded machine never hides those. Timing is judged only on a machine
/// that kept time while the test ran (see [`Starvation`]); on a starved one
/// the findings are printed and excused by name.
struct Findings {
    seen: Vec<String>,
    starvation: Starvation,
}

impl Findings {
    /// Starts watching the machine's timekeeping for this test.
    fn new() -> Findings {
        Findings {
            seen: Vec::new(),
            starvation: Starvation::watch(),
        }
    }

    /// Records `what` unless `ok`.
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let what = what();
            eprintln!("timing finding: {what}");
            self.seen.push(what);
        }
    }

    /// Fails the test with every finding, unless the machine was starved;
    /// called last.
    fn assert_none(self) {
        if self.seen.is_empty() {
            return;
        }
        if let Some(why) = self.starvation.excuse() {
            eprintln!(
                "{} timing finding(s) excused: {why}; every guarantee held",
                self.seen.len()
            );
            return;
        }
        panic!(
            "{} timing finding(s), after every guarantee held, on a machine that kept time \
             ({}):\n{}",
            self.seen.len(),
            self.starvation.summary(),
            self.seen.join("\n---\n")
        );
    }
}

/// How late this machine ran timers while a test ran: a thread of the test
/// sleeps [`Starvation::TICK`] in a loop and records its worst overshoot,
/// and the 1-minute load average is sampled. The replicas renew their
/// Leases on the same starved cores, so a timing bound (a takeover within
/// lease duration + retry period) is meaningless when the test's own
/// timers ran a renewal period late or the load was several times the
/// cores: the guarantees are judged all the same.
struct Starvation {
    worst_late_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    peak_load_centi: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Starvation {
    const TICK: Duration = Duration::from_millis(50);

    fn watch() -> Starvation {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let s = Starvation {
            worst_late_ms: Arc::new(AtomicU64::new(0)),
            peak_load_centi: Arc::new(AtomicU64::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (late, load, stop) = (
            s.worst_late_ms.clone(),
            s.peak_load_centi.clone(),
            s.stop.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let before = std::time::Instant::now();
                std::thread::sleep(Self::TICK);
                let over = before.elapsed().saturating_sub(Self::TICK);
                late.fetch_max(over.as_millis() as u64, Ordering::Relaxed);
                if let Some(l) = Self::load_average() {
                    load.fetch_max((l * 100.0) as u64, Ordering::Relaxed);
                }
            }
        });
        s
    }

    /// The 1-minute load average, from /proc/loadavg.
    fn load_average() -> Option<f64> {
        std::fs::read_to_string("/proc/loadavg")
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn summary(&self) -> String {
        use std::sync::atomic::Ordering;
        format!(
            "timers at worst {} ms late, peak 1-min load {:.2} on {} cores",
            self.worst_late_ms.load(Ordering::Relaxed),
            self.peak_load_centi.load(Ordering::Relaxed) as f64 / 100.0,
            Self::cores()
        )
    }

    fn cores() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    /// Why timing cannot be judged on this run, if it cannot: timers a
    /// retry period late, or a load of at least four runnable tasks per core
    /// (a fleet test alone stays well under it).
    fn excuse(&self) -> Option<String> {
        use std::sync::atomic::Ordering;
        let late = Duration::from_millis(self.worst_late_ms.load(Ordering::Relaxed));
        let load = self.peak_load_centi.load(Ordering::Relaxed) as f64 / 100.0;
        (late >= RETRY_PERIOD || load >= 4.0 * Self::cores() as f64)
            .then(|| format!("the machine was starved ({})", self.summary()))
    }
}

impl Drop for Starvation {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What a replica's metrics say went wrong with its Leases: renewals (or
/// lists, takes) that failed, shards lost to another replica without a
/// hand-back (a renewal too late), chains stopped because their shard was
/// lost or its renewal overdue.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct LeaseTrouble {
    renew_failures: f64,
    shards_lost: f64,
    chains_cancelled: f64,
}

impl LeaseTrouble {
    /// What rose since `before`: anything at all means trouble.
    fn since(self, before: LeaseTrouble) -> Option<LeaseTrouble> {
        let d = LeaseTrouble {
            renew_failures: self.renew_failures - before.renew_failures,
            shards_lost: self.shards_lost - before.shards_lost,
            chains_cancelled: self.chains_cancelled - before.chains_cancelled,
        };
        (d != LeaseTrouble::default()).then_some(d)
    }
}

/// The shards whose holder or acquire time differ between two views of the
/// Leases: handed over (or taken over) in between.
fn moved_shards(
    before: &BTreeMap<u32, (String, DateTime<Utc>)>,
    after: &BTreeMap<u32, (String, DateTime<Utc>)>,
) -> Vec<u32> {
    (0..SHARDS)
        .filter(|s| before.get(s) != after.get(s))
        .collect()
}

impl Fleet {
    /// Replica `i`'s [`LeaseTrouble`] so far.
    async fn lease_trouble(&self, i: usize) -> LeaseTrouble {
        LeaseTrouble {
            renew_failures: self
                .metric(i, "autoapproval_lease_renew_failures_total")
                .await,
            shards_lost: self.metric(i, "autoapproval_shard_losses_total").await,
            chains_cancelled: self.metric(i, "autoapproval_chains_cancelled_total").await,
        }
    }

    /// Every replica's [`LeaseTrouble`] so far (a stopped one's: none).
    async fn lease_troubles(&self) -> Vec<LeaseTrouble> {
        let mut troubles = Vec::new();
        for i in 0..self.replicas.len() {
            troubles.push(self.lease_trouble(i).await);
        }
        troubles
    }

    async fn start(pool: impl AsDb, n: usize, lease_duration: Duration) -> Fleet {
        Self::with(pool, n, lease_duration, Downstream::Keyed).await
    }

    async fn with(
        pool: impl AsDb,
        n: usize,
        lease_duration: Duration,
        downstream: Downstream,
    ) -> Fleet {
        let (server, client, sim) = backends().await;
        if downstream == Downstream::Unkeyed {
            sim.set_idempotency(Idempotency::Ignored);
        }
        let dir = fresh_dir("fleet");
        let kubeconfig = kubeconfig_in(&dir, &server);
        let fleet = Fleet {
            server: ApiServer::Test(server),
            client,
            ns: NS.into(),
            extra_args: Vec::new(),
            sim,
            pool: pool.db(),
            dir,
            kubeconfig,
            replicas: Vec::new(),
            lease_duration,
            http: reqwest::Client::new(),
            downstream,
        };
        fleet.started(n)
    }

    /// `n` replicas on the real kube-apiserver of `plane`, in a namespace of their own,
    /// each as the chart's ServiceAccount under the chart's Role (through its
    /// kubeconfig), with `extra_args`; keyed downstream.
    async fn real(
        pool: impl AsDb,
        n: usize,
        lease_duration: Duration,
        plane: &'static control_plane::ControlPlane,
        extra_args: &[&str],
    ) -> Fleet {
        let real = real_namespace_on(plane, |_| {}).await;
        let dir = fresh_dir("fleet");
        let fleet = Fleet {
            client: real.admin.clone(),
            ns: real.ns.name.clone(),
            kubeconfig: real.ns.kubeconfig.clone(),
            server: ApiServer::Real(Box::new(real)),
            extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
            sim: simulator().await,
            pool: pool.db(),
            dir,
            replicas: Vec::new(),
            lease_duration,
            http: reqwest::Client::new(),
            downstream: Downstream::Keyed,
        };
        fleet.started(n)
    }

    /// This fleet with replicas `r0..r<n>` started.
    fn started(mut self, n: usize) -> Fleet {
        let fleet = &mut self;
        for i in 0..n {
            fleet.replicas.push(Replica {
                name: format!("r{i}"),
                port: 0,
                child: None,
                database_url: None,
            });
            fleet.spawn(i);
        }
        self
    }

    /// Starts replica `i` (again).
    fn spawn(&mut self, i: usize) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let replica = &mut self.replicas[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", replica.name)))
            .expect("log file");
        let renew_deadline = self.lease_duration.saturating_sub(RETRY_PERIOD * 2);
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let dedup = match self.downstream {
            Downstream::Keyed => "key",
            Downstream::Unkeyed => "lookup",
        };
        let child = Command::new(env!("CARGO_BIN_EXE_autoapproval"))
            .args([
                "run",
                "--namespace",
                &self.ns,
                "--replica-name",
                &replica.name,
            ])
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--shards", &SHARDS.to_string()])
            .args(["--lease-duration", &ms(self.lease_duration)])
            .args(["--renew-deadline", &ms(renew_deadline)])
            .args(["--retry-period", &ms(RETRY_PERIOD)])
            .args(["--poll-period", "2s", "--heartbeat-interval", "1s"])
            .args(["--processing-timeout", "10s", "--stuck-threshold", "30s"])
            .args([
                "--cleanse-interval",
                "1s",
                "--condition-retry-interval",
                "2s",
            ])
            .args([
                "--transient-retry-base",
                "200ms",
                "--transient-retry-max",
                "2s",
            ])
            .args(["--shutdown-grace", "5s"])
            .args(&self.extra_args)
            .env(
                "AUTOAPPROVAL_DATABASE_URL",
                replica
                    .database_url
                    .clone()
                    .unwrap_or_else(|| database_url(&self.pool)),
            )
            .env("AUTOAPPROVAL_ESIGN_URL", self.sim.base_url())
            .env("AUTOAPPROVAL_OWNER_URL", self.sim.base_url())
            .env("AUTOAPPROVAL_STORE_URL", self.sim.base_url())
            .env("AUTOAPPROVAL_AD_URL", self.sim.base_url())
            .env("AUTOAPPROVAL_OWNER_DEDUP", dedup)
            .env("AUTOAPPROVAL_STORE_DEDUP", dedup)
            .env("AUTOAPPROVAL_AD_DEDUP", dedup)
            // IT_REPLICA_RUST_LOG (e.g. "info,kube_runtime=debug") to look into a replica.
            .env(
                "RUST_LOG",
                std::env::var("IT_REPLICA_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("autoapproval run starts");
        replica.port = port;
        replica.child = Some(child);
    }

    /// SIGKILL: nothing is released, the Leases must expire.
    async fn kill_hard(&mut self, i: usize) {
        let mut child = self.replicas[i].child.take().expect("running");
        child.kill().await.expect("SIGKILL");
    }

    /// SIGTERM, then waits for a clean exit.
    async fn stop(&mut self, i: usize) {
        let mut child = self.replicas[i].child.take().expect("running");
        let pid = child.id().expect("pid");
        sigterm(pid);
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("exits within 30 s of SIGTERM")
            .expect("wait");
        assert!(
            status.success(),
            "{} exited with {status}: {}",
            self.replicas[i].name,
            self.log(i)
        );
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", self.replicas[i].name)))
            .unwrap_or_default()
    }

    /// A counter or gauge of replica `i`, summed over the series matching `series`.
    async fn metric(&self, i: usize, series: &str) -> f64 {
        let url = format!("http://127.0.0.1:{}/metrics", self.replicas[i].port);
        let Ok(response) = self.http.get(url).send().await else {
            return 0.0;
        };
        let text = response.text().await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with(series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Each shard's holder and acquire time, from the Lease objects.
    async fn shard_holders(&self) -> BTreeMap<u32, (String, DateTime<Utc>)> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.ns);
        let Ok(list) = leases.list(&ListParams::default()).await else {
            return BTreeMap::new();
        };
        list.items
            .into_iter()
            .filter_map(|l| {
                let shard = l
                    .metadata
                    .name
                    .as_deref()?
                    .strip_prefix(SHARD_LEASE_PREFIX)?
                    .parse()
                    .ok()?;
                let spec = l.spec?;
                let holder = spec.holder_identity.filter(|h| !h.is_empty())?;
                let acquired = spec.acquire_time?.0.as_microsecond();
                Some((shard, (holder, DateTime::from_timestamp_micros(acquired)?)))
            })
            .collect()
    }

    /// Waits until the running replicas hold every shard, each within one
    /// shard of the fair share.
    /// Shards taken over from an expired holder by every replica but `except`.
    async fn failovers_except(&self, except: usize) -> f64 {
        let mut sum = 0.0;
        for i in (0..self.replicas.len()).filter(|i| *i != except) {
            sum += self
                .metric(
                    i,
                    "autoapproval_shard_acquisitions_total{kind=\"failover\"}",
                )
                .await;
        }
        sum
    }

    async fn wait_balanced(&self) -> BTreeMap<u32, (String, DateTime<Utc>)> {
        let running: Vec<String> = self
            .replicas
            .iter()
            .filter(|r| r.child.is_some())
            .map(|r| r.name.clone())
            .collect();
        let n = running.len();
        eventually(
            "the shards to be balanced over the running replicas",
            || async {
                let holders = self.shard_holders().await;
                if holders.len() != SHARDS as usize {
                    return None;
                }
                let mut counts: BTreeMap<&str, usize> =
                    running.iter().map(|r| (r.as_str(), 0)).collect();
                for (holder, _) in holders.values() {
                    *counts.get_mut(holder.as_str())? += 1;
                }
                let fair = SHARDS as usize / n;
                counts
                    .values()
                    .all(|c| (fair..=fair + 1).contains(c))
                    .then_some(holders.clone())
            },
        )
        .await
        .expect("balanced")
    }

    async fn count(&self, sql: &str) -> i64 {
        self.pool.fetch_i64(sql).await
    }

    /// Waits until `n` requests are approved. A hang detector on progress,
    /// not a speed target: it fails when the count has not moved for 90 s
    /// (or after 15 min), so a loaded machine's slower pace passes and a
    /// stalled fleet does not.
    async fn wait_approvals(&self, what: &str, n: i64) {
        const STALL: Duration = Duration::from_secs(90);
        let started = tokio::time::Instant::now();
        let (mut last, mut moved) = (-1, started);
        loop {
            let approved = self
                .count("SELECT count(*) FROM approval_request WHERE status = 'APPROVED'")
                .await;
            if approved >= n {
                return;
            }
            if approved != last {
                (last, moved) = (approved, tokio::time::Instant::now());
            }
            assert!(
                moved.elapsed() < STALL && started.elapsed() < STALL * 10,
                "timed out waiting for {what}: {approved} of {n} approved, none for {:?}",
                moved.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // A failed test keeps the replicas' logs for whoever reads its output.
        if std::thread::panicking() {
            eprintln!("replica logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Inserts requests `from..=to` in one statement: owner contracts, or ad
/// contracts for `store`; `ready` false leaves the documents in review.
async fn insert_requests(db: &impl AsDb, from: i64, to: i64, store: Option<i64>, ready: bool) {
    let request_type = if store.is_some() {
        "AD_CONTRACT"
    } else {
        "OWNER_CONTRACT"
    };
    let store = store.map_or("NULL".to_owned(), |s| s.to_string());
    let ids: Vec<i64> = (from..=to).collect();
    // Literal rows, 500 a statement: the same SQL on every backend.
    for chunk in ids.chunks(500) {
        let rows: Vec<String> = chunk
            .iter()
            .map(|g| {
                format!(
                    "({g}, '{request_type}', 'PENDING', now(), now(), 'Shop {g}', {ready}, \
                     false, true, true, true, 'EC-{g}', {store})"
                )
            })
            .collect();
        db.db()
            .exec(&format!(
                "INSERT INTO approval_request
                    (id, request_type, status, sort_time, created_at, business_name,
                     documents_released, operational_hold, menu_registered, logo_registered,
                     previous_step_approved, econtract_ref, target_store_number)
                 VALUES {}",
                rows.join(", ")
            ))
            .await;
    }
}

/// In an unkeyed run, answers were lost and the replicas looked up before
/// creating: the case the run is for did happen.
fn assert_lookups_made(fleet: &Fleet) {
    if fleet.downstream != Downstream::Unkeyed {
        return;
    }
    let stats = fleet.sim.stats();
    let lost = stats.faults_injected.timeout + stats.faults_injected.malformed;
    let lookups = stats.calls_to("GET /owners") + stats.calls_to("GET /stores");
    eprintln!("unkeyed downstream: {lost} answers lost, {lookups} lookups");
    assert!(lost > 0 && lookups > 0, "{stats:?}");
}

/// Every request the replica processes made to the API server is one the
/// chart's Role grants: run with that Role, they would have been refused
/// nothing (on the real server, the Role was enforced: nothing to check).
fn assert_role_grants_what_was_used(server: &ApiServer) {
    let ApiServer::Test(server) = server else {
        return;
    };
    let used = server.access_by(autoapproval::cli::USER_AGENT);
    assert!(
        !used.is_empty(),
        "no request carried the controller's User-Agent"
    );
    let missing: Vec<_> = used
        .iter()
        .filter(|a| {
            !crate::support::ROLE_GRANTS
                .iter()
                .any(|(g, r, v)| a.group == *g && a.resource == *r && a.verb == *v)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "used but not granted by the Role: {missing:?}"
    );
}

/// Every creation the simulator made is at most one per request and kind,
/// and no two chains worked on one request at once.
fn assert_nothing_doubled(sim: &SimHandle) {
    let stats = sim.stats();
    eprintln!(
        "simulator: {:?} created, {} replays, {} duplicates, {} overlaps, {} faults injected",
        stats.created,
        stats.idempotent_replays,
        stats.duplicate_creations,
        stats.overlapping_creations,
        stats.faults_injected.error
            + stats.faults_injected.timeout
            + stats.faults_injected.malformed
    );
    assert_eq!(stats.duplicate_creations, 0, "something was created twice");
    let doubled: Vec<_> = stats
        .per_request
        .iter()
        .filter(|(_, c)| c.owner > 1 || c.store > 1 || c.campaign > 1)
        .collect();
    assert!(doubled.is_empty(), "created twice: {doubled:?}");
    assert_eq!(stats.key_conflicts, 0, "a key reused with another body");
    assert_eq!(
        stats.overlapping_creations, 0,
        "two chains worked on one request at once"
    );
}

on_both!(two_thousand_requests_survive_a_replica_killed_hard_mid_run);
async fn two_thousand_requests_survive_a_replica_killed_hard_mid_run(db: Db) {
    killed_hard_mid_run(db, Downstream::Keyed).await;
}

on_both!(a_replica_killed_hard_mid_run_doubles_nothing_in_a_downstream_without_idempotency_keys);
async fn a_replica_killed_hard_mid_run_doubles_nothing_in_a_downstream_without_idempotency_keys(
    db: Db,
) {
    killed_hard_mid_run(db, Downstream::Unkeyed).await;
}

async fn killed_hard_mid_run(pool: Db, downstream: Downstream) {
    let mut fleet = Fleet::with(pool.clone(), 3, LEASE_DURATION, downstream).await;
    let mut findings = Findings::new();
    let balanced = fleet.wait_balanced().await;
    let trouble_at_balance = fleet.lease_troubles().await;
    fleet.sim.add_store(900_001, true);
    // Slow enough that every replica has chains in flight at the kill, with
    // transient errors and lost answers that force idempotent retries.
    fleet
        .sim
        .set_faults(downstream.faults(Faults {
            latency: Duration::from_millis(40),
            jitter: Duration::from_millis(20),
            error_rate: 0.03,
            timeout_rate: 0.01,
            hang: Duration::from_millis(200),
            ..Faults::default()
        }))
        .expect("faults");
    insert_requests(&pool, 1, 1_700, None, true).await;
    insert_requests(&pool, 1_701, 1_900, Some(900_001), true).await;
    // Documents still in review: these wait, and are released later.
    insert_requests(&pool, 1_901, 1_960, None, false).await;
    // A person decides these meanwhile; they are not eligible.
    insert_requests(&pool, 1_961, 2_000, None, true).await;
    let canceled = pool
        .exec(
            "UPDATE approval_request SET status = 'CANCELED', decided_by = 'a person', decided_at = now()
              WHERE id BETWEEN 1961 AND 2000 AND status IN ('PENDING', 'ING', 'RETRY')",
        )
        .await;

    fleet
        .wait_approvals("a third of the requests to be approved", 650)
        .await;
    // Steady state so far: every shard had one holder, so no claim failed,
    // unless a Lease renewal ran late (a loaded machine): then a shard
    // changed hands, or the replica's own metrics show the renewal failed,
    // the shard lost or overdue, and a claim may meet the new fence. Only
    // such a failure is excused, by name; one without is a finding.
    let moved = moved_shards(&balanced, &fleet.shard_holders().await);
    for (i, at_balance) in trouble_at_balance.iter().enumerate() {
        let lost = fleet
            .metric(i, "autoapproval_claims_total{result=\"lost\"}")
            .await;
        if lost == 0.0 {
            continue;
        }
        let trouble = fleet.lease_trouble(i).await.since(*at_balance);
        if !moved.is_empty() || trouble.is_some() {
            eprintln!(
                "replica {i}: {lost} claims failed in steady state, excused by late Lease renewals: \
                 shards {moved:?} changed hands, its own Lease trouble {trouble:?}"
            );
            continue;
        }
        findings.check(false, || {
            format!(
                "replica {i} had {lost} failed claims in steady state, with every shard on its \
                 holder and no Lease renewal failed, late or lost:\n{}",
                fleet.log(i)
            )
        });
    }

    let victim = rand::rng().random_range(0..3);
    let victim_name = fleet.replicas[victim].name.clone();
    // The holders and failovers as they are at the kill: a renewal late
    // under load may have moved a shard since the start.
    let holders = fleet.wait_balanced().await;
    let failovers_before = fleet.failovers_except(victim).await;
    let trouble_at_kill = fleet.lease_troubles().await;
    let victim_shards: Vec<u32> = holders
        .iter()
        .filter(|(_, (h, _))| *h == victim_name)
        .map(|(s, _)| *s)
        .collect();
    fleet.kill_hard(victim).await;
    let killed_at = Utc::now();
    let orphaned = pool
        .fetch_ids(&format!(
            "SELECT request_id FROM auto_approve_state
              WHERE status = 'IN_PROGRESS' AND holder = '{victim_name}'"
        ))
        .await;
    assert!(
        !orphaned.is_empty(),
        "{victim_name} had chains in flight when killed"
    );

    // Its shards go to the survivors once its Leases expire.
    let after = eventually("the victim's shards to be taken over", || async {
        let holders = fleet.shard_holders().await;
        victim_shards
            .iter()
            .all(|s| holders.get(s).is_some_and(|(h, _)| *h != victim_name))
            .then_some(holders)
    })
    .await
    .expect("holders");
    let slowest = victim_shards
        .iter()
        .map(|s| after[s].1 - killed_at)
        .max()
        .expect("the victim held shards");
    let bound = LEASE_DURATION + RETRY_PERIOD;
    eprintln!("{victim_name}'s shards {victim_shards:?} taken over {slowest} after the kill");
    // One turn's own work (a list and a few writes) is the only slack.
    findings.check(
        slowest.to_std().unwrap_or_default() <= bound + Duration::from_secs(1),
        || format!("shards taken over {slowest} after the kill; lease duration + retry period is {bound:?}"),
    );

    // The documents are released: NOTIFY wakes the waiting requests.
    pool.exec(
        "UPDATE approval_request SET documents_released = true WHERE id BETWEEN 1901 AND 1960",
    )
    .await;
    let eligible = 2_000 - canceled as i64;
    fleet
        .wait_approvals("every eligible request to be approved", eligible)
        .await;
    assert_eq!(
        fleet
            .count("SELECT count(*) FROM approval_request WHERE status = 'CANCELED' AND decided_by = 'a person'")
            .await,
        canceled as i64,
        "a person's decisions stand"
    );
    assert_nothing_doubled(&fleet.sim);
    assert_lookups_made(&fleet);
    assert_role_grants_what_was_used(&fleet.server);
    // The claims the victim held were recovered by the new holders' cleanser
    // pass at takeover, and finished.
    assert_orphans_recovered(&fleet, &pool, &orphaned, &victim_name).await;
    let failovers = fleet.failovers_except(victim).await - failovers_before;
    assert!(
        failovers >= victim_shards.len() as f64,
        "each of the victim's {} shards failed over, counted: {failovers} counted",
        victim_shards.len()
    );
    // More is a survivor's shard taken over by the other after a renewal
    // of its own ran late: excused only when a survivor's metrics show it.
    if failovers > victim_shards.len() as f64 {
        let troubles = fleet.lease_troubles().await;
        let survivors_trouble: Vec<_> = (0..3)
            .filter(|i| *i != victim)
            .filter_map(|i| troubles[i].since(trouble_at_kill[i]))
            .collect();
        findings.check(!survivors_trouble.is_empty(), || {
            format!(
                "{failovers} failovers counted for the victim's {} shards, and no survivor's \
                 Lease renewal failed, late or lost",
                victim_shards.len()
            )
        });
    }
    // Each failover is an Event on its shard Lease, naming the old holder.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(fleet.client.clone(), NS);
    let failed_over: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("ShardFailover")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains(&format!("from {victim_name},")))
        })
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect();
    for shard in &victim_shards {
        let lease = autoapproval::coordination::shard_lease_name(*shard);
        assert!(
            failed_over.contains(&lease),
            "no ShardFailover Event on {lease}: {failed_over:?}"
        );
    }
    for i in (0..3).filter(|i| *i != victim) {
        fleet.stop(i).await;
    }
    findings.assert_none();
}

on_both!(a_rolling_restart_hands_shards_over_without_waiting_for_lease_expiry);
async fn a_rolling_restart_hands_shards_over_without_waiting_for_lease_expiry(db: Db) {
    rolling_restart(db, Downstream::Keyed).await;
}

on_both!(a_rolling_restart_doubles_nothing_in_a_downstream_without_idempotency_keys);
async fn a_rolling_restart_doubles_nothing_in_a_downstream_without_idempotency_keys(db: Db) {
    rolling_restart(db, Downstream::Unkeyed).await;
}

async fn rolling_restart(pool: Db, downstream: Downstream) {
    // Leases that would take 30 s to expire: a handover within that time
    // can only be a release.
    let long = Duration::from_secs(30);
    let mut fleet = Fleet::with(pool.clone(), 3, long, downstream).await;
    let mut findings = Findings::new();
    fleet.wait_balanced().await;
    fleet
        .sim
        .set_faults(downstream.faults(Faults {
            latency: Duration::from_millis(20),
            ..Faults::default()
        }))
        .expect("faults");
    insert_requests(&pool, 1, 600, None, true).await;
    for i in 0..3 {
        let name = fleet.replicas[i].name.clone();
        let before = fleet.shard_holders().await;
        let held: Vec<u32> = before
            .iter()
            .filter(|(_, (h, _))| *h == name)
            .map(|(s, _)| *s)
            .collect();
        let stopped_at = Utc::now();
        fleet.stop(i).await;
        let logs = fleet.log(i);
        assert!(logs.contains("Leases released"), "{logs}");
        let after = eventually(
            "the stopped replica's shards to have new holders",
            || async {
                let holders = fleet.shard_holders().await;
                held.iter()
                    .all(|s| holders.get(s).is_some_and(|(h, _)| *h != name))
                    .then_some(holders)
            },
        )
        .await
        .expect("holders");
        if let Some(slowest) = held.iter().map(|s| after[s].1 - stopped_at).max() {
            eprintln!("{name}'s shards {held:?} handed over at most {slowest} after SIGTERM");
        }
        for s in &held {
            let took = after[s].1 - stopped_at;
            findings.check(took.to_std().unwrap_or_default() < long, || {
                format!("shard {s} was taken {took} after the stop: it waited for expiry")
            });
        }
        // The member Lease went with it, so the others count two replicas.
        let leases: Api<Lease> = Api::namespaced(fleet.client.clone(), NS);
        assert!(
            leases
                .get_opt(&member_lease_name(&name))
                .await
                .expect("get")
                .is_none()
        );
        fleet.spawn(i);
        fleet.wait_balanced().await;
    }
    fleet
        .wait_approvals("every request to be approved", 600)
        .await;
    assert_nothing_doubled(&fleet.sim);
    assert_lookups_made(&fleet);
    assert_role_grants_what_was_used(&fleet.server);
    // Hand-overs only, no expiry: a failover is excused only when some
    // replica's metrics show a renewal of its own failed or came too late.
    let troubles = fleet.lease_troubles().await;
    let trouble: Vec<_> = troubles
        .iter()
        .filter_map(|t| t.since(LeaseTrouble::default()))
        .collect();
    for i in 0..3 {
        let failovers = fleet
            .metric(
                i,
                "autoapproval_shard_acquisitions_total{kind=\"failover\"}",
            )
            .await;
        if failovers > 0.0 && !trouble.is_empty() {
            eprintln!(
                "replica {i} took {failovers} shards over from expired Leases, excused by late Lease renewals: {trouble:?}"
            );
            continue;
        }
        findings.check(failovers == 0.0, || {
            format!(
                "replica {i} took a shard over from an expired Lease:\n{}",
                fleet.log(i)
            )
        });
    }
    for i in 0..3 {
        fleet.stop(i).await;
    }
    findings.assert_none();
}

on_both!(api_server_failures_then_closed_watches_lose_and_double_nothing);
async fn api_server_failures_then_closed_watches_lose_and_double_nothing(db: Db) {
    api_server_failures(db, Downstream::Keyed).await;
}

on_both!(api_server_failures_double_nothing_in_a_downstream_without_idempotency_keys);
async fn api_server_failures_double_nothing_in_a_downstream_without_idempotency_keys(db: Db) {
    api_server_failures(db, Downstream::Unkeyed).await;
}

async fn api_server_failures(pool: Db, downstream: Downstream) {
    let mut fleet = Fleet::with(pool.clone(), 3, LEASE_DURATION, downstream).await;
    fleet.wait_balanced().await;
    fleet
        .sim
        .set_faults(downstream.faults(Faults {
            latency: Duration::from_millis(10),
            ..Faults::default()
        }))
        .expect("faults");
    insert_requests(&pool, 1, 200, None, true).await;
    // One request in five to the API server fails, for 60 s, while requests
    // keep arriving.
    fleet.server.faults().fail_fraction(0.2, 500, Match::any());
    for wave in 0..6 {
        let from = 201 + wave * 100;
        insert_requests(&pool, from, from + 99, None, true).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    fleet.server.faults().clear();
    fleet.server.faults().close_watches();
    insert_requests(&pool, 801, 900, None, true).await;

    fleet
        .wait_approvals("every request to be approved", 900)
        .await;
    assert_nothing_doubled(&fleet.sim);
    assert_lookups_made(&fleet);
    eventually("the state table to empty", || async {
        (fleet.count("SELECT count(*) FROM auto_approve_state").await == 0).then_some(())
    })
    .await;
    // The CRs recover by themselves too: each shows the outcome.
    let api: Api<AutoApproval> = Api::namespaced(fleet.client.clone(), NS);
    eventually("every CR to show Approved", || async {
        let crs = api.list(&ListParams::default()).await.ok()?;
        let approved = crs
            .items
            .iter()
            .filter(|cr| {
                cr.status.as_ref().and_then(|s| s.phase)
                    == Some(autoapproval::controller::crd::Phase::Approved)
            })
            .count();
        (approved == 900).then_some(())
    })
    .await;
    for i in 0..3 {
        fleet.stop(i).await;
    }
}

on_both!(a_replica_cut_from_the_database_hands_its_shards_over);
/// A replica that still reaches the API server but no longer the database
/// could renew its Leases for ever and claim nothing: it gives every Lease
/// back once the database has not answered for the renew deadline, so the
/// replica that can work takes its shards, and every request is approved
/// once, by it.
async fn a_replica_cut_from_the_database_hands_its_shards_over(db: Db) {
    let mut findings = Findings::new();
    let proxy = CutProxy::start(db.server_addr().await).await;
    let mut fleet = Fleet::start(db.clone(), 1, LEASE_DURATION).await;
    fleet.replicas.push(Replica {
        name: "cut".into(),
        port: 0,
        child: None,
        database_url: Some(proxy.url(&db)),
    });
    fleet.spawn(1);
    fleet.wait_balanced().await;

    proxy.cut();
    let cut_at = Utc::now();
    insert_requests(&db, 1, 200, None, true).await;

    let holders = eventually("r0 to hold every shard", || async {
        let holders = fleet.shard_holders().await;
        (holders.len() == SHARDS as usize && holders.values().all(|(h, _)| h == "r0"))
            .then_some(holders)
    })
    .await
    .expect("holders");
    let latest = holders.values().map(|(_, at)| *at).max().expect("a shard");
    let moved = (latest - cut_at).to_std().unwrap_or_default();
    println!("shards of the cut replica moved within {moved:?} of the cut");
    // The cut replica gives up after its renew deadline; the bound is a hang
    // detector with room for a loaded machine (held by it, they never move).
    findings.check(moved <= LEASE_DURATION * 2, || {
        format!("moved within two lease durations: {moved:?}")
    });
    eventually("every request to be approved", || async {
        let open = fleet
            .count("SELECT count(*) FROM approval_request WHERE status <> 'APPROVED'")
            .await;
        (open == 0).then_some(())
    })
    .await;
    assert_nothing_doubled(&fleet.sim);
    assert_lookups_made(&fleet);
    let log = fleet.log(1);
    assert!(
        log.contains("giving every Lease back until it answers"),
        "{log}"
    );
    fleet.stop(0).await;
    findings.assert_none();
}

on_both!(a_business_transaction_open_for_30_s_holds_up_no_lease_and_no_other_request);
/// The business system holds one request row of every shard in a
/// transaction left open for at least 30 s (and until the others are
/// approved, on a loaded machine), while half the shards change hands
/// (a second replica joins, and each shard it takes is fenced). The held
/// requests already have their owner and store (a resubmission), so each
/// chain goes straight to its completion and meets the held row. Our
/// statements wait at most `--db-lock-timeout` and take the request row
/// before the state row, so no fence and no Lease renewal waits behind the
/// business: no shard is lost, every other request is approved while the
/// transaction is still open, and the held ones once it commits.
async fn a_business_transaction_open_for_30_s_holds_up_no_lease_and_no_other_request(db: Db) {
    const HOLD: Duration = Duration::from_secs(30);
    let mut findings = Findings::new();
    let held = i64::from(SHARDS);
    insert_requests(&db, 1, held, None, true).await;
    db.exec(&format!(
        "UPDATE approval_request SET owner_number = 1000 + id, store_number = 2000 + id
          WHERE id <= {held}"
    ))
    .await;
    // By key, as a business edit is. Under InnoDB's REPEATABLE READ (the
    // business sessions' default) a range, or the full scan MariaDB picks
    // for a 16-row table, also locks the gap above the last row, and the
    // business's own inserts of new requests below would wait for it.
    let ids = (1..=held).map(|id| id.to_string()).collect::<Vec<_>>();
    let by_key = match db {
        Db::Mysql(_) => " FORCE INDEX (PRIMARY)",
        Db::Postgres(_) => "",
    };
    let business = db
        .business_transaction(&format!(
            "UPDATE approval_request{by_key} SET business_name = CONCAT(business_name, ' (edited)')
              WHERE id IN ({})",
            ids.join(", ")
        ))
        .await;
    let opened = tokio::time::Instant::now();

    let mut fleet = Fleet::start(db.clone(), 1, LEASE_DURATION).await;
    fleet.wait_balanced().await;
    fleet.replicas.push(Replica {
        name: "r1".into(),
        port: 0,
        child: None,
        database_url: None,
    });
    fleet.spawn(1);
    fleet.wait_balanced().await;
    insert_requests(&db, 101, 300, None, true).await;

    // The business holds its rows for at least HOLD, and on until every
    // other request is approved: a loaded machine's slower pace is waited
    // for, and only a stall (no other request approved for STALL while
    // some are open) means something of ours waits behind the business.
    const STALL: Duration = Duration::from_secs(60);
    let (mut last, mut moved) = (-1, tokio::time::Instant::now());
    let others_open = loop {
        let open = fleet
            .count("SELECT count(*) FROM approval_request WHERE id > 100 AND status <> 'APPROVED'")
            .await;
        if open != last {
            (last, moved) = (open, tokio::time::Instant::now());
        }
        if (open == 0 && opened.elapsed() > HOLD) || moved.elapsed() > STALL {
            break open;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let held_open = fleet
        .count("SELECT count(*) FROM approval_request WHERE id <= 16 AND status <> 'APPROVED'")
        .await;
    let losses = [
        fleet.metric(0, "autoapproval_shard_losses_total").await,
        fleet.metric(1, "autoapproval_shard_losses_total").await,
    ];
    let waited = opened.elapsed();
    business.commit().await;
    // Judged after the guarantees below, so a failure here still says
    // whether anything was lost or doubled.
    findings.check(others_open == 0, || {
        format!(
            "{others_open} requests still open, none approved for {STALL:?}, after the business \
             held its rows {waited:?}: {}",
            fleet.log(0)
        )
    });
    findings.check(losses == [0.0, 0.0], || {
        format!("a replica lost a shard it held: {losses:?}")
    });
    assert_eq!(held_open, held, "the held requests wait for the business");
    println!("200 other requests approved {waited:?} into the business transaction");
    eventually(
        "the held requests to be approved once it commits",
        || async {
            let open = fleet
                .count("SELECT count(*) FROM approval_request WHERE status <> 'APPROVED'")
                .await;
            (open == 0).then_some(())
        },
    )
    .await;
    assert_nothing_doubled(&fleet.sim);
    assert_lookups_made(&fleet);
    fleet.stop(1).await;
    fleet.stop(0).await;
    findings.assert_none();
}

on_both!(a_shard_whose_hand_back_failed_is_released_later_and_taken);
/// A replica hands shards back to a newcomer; the first release answers
/// 500. Its Lease still names the giver, whose member Lease is live, so
/// nobody would take the shard, and the giver, which gave it away, would
/// not either: the release is written again at the next turn, and the
/// newcomer takes the shard.
async fn a_shard_whose_hand_back_failed_is_released_later_and_taken(db: Db) {
    let mut fleet = Fleet::start(db.clone(), 2, LEASE_DURATION).await;
    fleet.wait_balanced().await;
    fleet.stop(1).await;
    fleet.wait_balanced().await;
    fleet.server.faults().fail_next(
        1,
        500,
        Match::any()
            .verb("update")
            .resource("leases")
            .path_contains(SHARD_LEASE_PREFIX),
    );
    fleet.spawn(1);
    let holders = fleet.wait_balanced().await;
    assert!(
        fleet.log(0).contains("Lease released on a later try"),
        "the failed release was written again: {holders:?}"
    );
}

/// Three replicas on `plane` with `extra_args`, balanced, working through requests
/// `1..=n` (40 ms a call, so chains are in flight), once `approved` of them are.
async fn real_fleet_mid_run(
    db: &Db,
    plane: &'static control_plane::ControlPlane,
    extra_args: &[&str],
    n: i64,
    approved: i64,
) -> Fleet {
    let fleet = Fleet::real(db.clone(), 3, LEASE_DURATION, plane, extra_args).await;
    fleet.wait_balanced().await;
    fleet
        .sim
        .set_faults(Faults {
            latency: Duration::from_millis(40),
            jitter: Duration::from_millis(20),
            ..Faults::default()
        })
        .expect("faults");
    insert_requests(db, 1, n, None, true).await;
    fleet
        .wait_approvals(
            &format!("{approved} of {n} requests to be approved"),
            approved,
        )
        .await;
    fleet
}

/// Waits until every one of the fleet's requests `1..=n` is approved.
async fn wait_approved(fleet: &Fleet, n: i64) {
    fleet
        .wait_approvals(&format!("all {n} requests to be approved"), n)
        .await;
}

/// Every one of the requests `1..=n` had exactly one owner and one store created: one
/// creation per request and step, none lost and none twice.
fn assert_each_created_once(sim: &SimHandle, n: i64) {
    assert_nothing_doubled(sim);
    let stats = sim.stats();
    let wrong: Vec<_> = (1..=n)
        .filter(|id| {
            stats
                .per_request
                .get(id)
                .is_none_or(|c| c.owner != 1 || c.store != 1)
        })
        .collect();
    assert!(wrong.is_empty(), "not created exactly once: {wrong:?}");
}

/// The Events in the fleet's namespace with `reason`, as (regarding's name, note).
async fn events_of(fleet: &Fleet, reason: &str) -> Vec<(String, String)> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(fleet.client.clone(), &fleet.ns);
    events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| {
            (
                e.regarding.and_then(|r| r.name).unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

on_both!(a_replica_killed_hard_mid_run_on_the_real_server_loses_and_doubles_nothing);
/// Three `autoapproval run` processes on the real kube-apiserver, each as the chart's
/// ServiceAccount through a kubeconfig, under the chart's Role; one is killed with
/// SIGKILL while its chains are in flight. Its shard Leases expire and are taken over
/// (a `ShardFailover` Event on each, naming it), its claims are recovered by the new
/// holders, and each of 300 requests gets one owner and one store.
async fn a_replica_killed_hard_mid_run_on_the_real_server_loses_and_doubles_nothing(db: Db) {
    const N: i64 = 300;
    let plane = crate::support::control_plane().await;
    let mut fleet = real_fleet_mid_run(&db, plane, &[], N, N / 3).await;
    let holders = fleet.wait_balanced().await;
    // The victim is a replica with chains in flight the moment before the
    // kill (on a loaded machine a random one may be between chains, and a
    // choice made before waiting for balance was seen stale by the kill).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let victim = loop {
        let mut busiest = (0, 0);
        for (i, replica) in fleet.replicas.iter().enumerate() {
            let in_flight = fleet
                .count(&format!(
                    "SELECT count(*) FROM auto_approve_state
                      WHERE status = 'IN_PROGRESS' AND holder = '{}'",
                    replica.name
                ))
                .await;
            if in_flight > busiest.1 {
                busiest = (i, in_flight);
            }
        }
        if busiest.1 >= 1 {
            break busiest.0;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no replica had chains in flight for a minute"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let victim_name = fleet.replicas[victim].name.clone();
    let victim_shards: Vec<u32> = holders
        .iter()
        .filter(|(_, (h, _))| *h == victim_name)
        .map(|(s, _)| *s)
        .collect();
    fleet.kill_hard(victim).await;
    let killed_at = tokio::time::Instant::now();
    let orphaned = db
        .fetch_ids(&format!(
            "SELECT request_id FROM auto_approve_state
              WHERE status = 'IN_PROGRESS' AND holder = '{victim_name}'"
        ))
        .await;
    assert!(
        !orphaned.is_empty(),
        "{victim_name} had chains in flight when killed"
    );
    eventually("the victim's shards to be taken over", || async {
        let holders = fleet.shard_holders().await;
        victim_shards
            .iter()
            .all(|s| holders.get(s).is_some_and(|(h, _)| *h != victim_name))
            .then_some(())
    })
    .await;
    eprintln!(
        "{victim_name}'s shards {victim_shards:?} taken over within {:?} of the kill",
        killed_at.elapsed()
    );
    wait_approved(&fleet, N).await;
    eprintln!("all {N} approved {:?} after the kill", killed_at.elapsed());
    assert_each_created_once(&fleet.sim, N);
    assert_orphans_recovered(&fleet, &db, &orphaned, &victim_name).await;
    let failed_over = events_of(&fleet, "ShardFailover").await;
    for shard in &victim_shards {
        let lease = autoapproval::coordination::shard_lease_name(*shard);
        assert!(
            failed_over.iter().any(
                |(name, note)| *name == lease && note.contains(&format!("from {victim_name},"))
            ),
            "no ShardFailover Event on {lease} naming {victim_name}: {failed_over:?}"
        );
    }
    let elected = events_of(&fleet, "LeaderElection").await;
    assert!(!elected.is_empty(), "no LeaderElection Event");
    for i in (0..3).filter(|i| *i != victim) {
        fleet.stop(i).await;
    }
}

impl Fleet {
    /// Replica `i`'s `/healthz`: its status and body (`None` when it does not answer).
    async fn healthz(&self, i: usize) -> Option<(u16, String)> {
        let url = format!("http://127.0.0.1:{}/healthz", self.replicas[i].port);
        let response = self.http.get(url).send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.unwrap_or_default()))
    }
}

on_both!(the_api_server_killed_and_restarted_mid_run_loses_and_doubles_nothing);
/// kube-apiserver (a control plane of the test's own) is killed with SIGKILL while three
/// replicas work through 300 requests, and started again on the same port, certificates
/// and etcd once every replica's `/healthz` has failed past `--api-liveness-timeout`,
/// naming the server. Each replica logs the outage by the server's address, and its end;
/// every request is approved after the server returns, one owner and one store each.
async fn the_api_server_killed_and_restarted_mid_run_loses_and_doubles_nothing(db: Db) {
    const N: i64 = 300;
    let plane = crate::support::private_control_plane(control_plane::Options::default()).await;
    let mut fleet =
        real_fleet_mid_run(&db, plane, &["--api-liveness-timeout", "5s"], N, N / 4).await;
    for i in 0..3 {
        let (status, body) = fleet.healthz(i).await.expect("answers");
        assert_eq!(status, 200, "replica {i} live before the outage: {body}");
    }

    plane.kill_apiserver().await.expect("kube-apiserver killed");
    let killed_at = tokio::time::Instant::now();
    let approved_at_kill = fleet
        .count("SELECT count(*) FROM approval_request WHERE status = 'APPROVED'")
        .await;
    let named = format!("no answer from the API server at {}", plane.url());
    for i in 0..3 {
        let body = eventually(&format!("replica {i}'s /healthz to fail"), || async {
            let (status, body) = fleet.healthz(i).await?;
            (status != 200).then_some(body)
        })
        .await
        .expect("a failure");
        assert!(
            body.contains(&named) && body.contains("--api-liveness-timeout 5 s"),
            "{body}"
        );
    }
    eprintln!(
        "every /healthz failing {:?} after the kill ({approved_at_kill} of {N} approved at the kill)",
        killed_at.elapsed()
    );
    for i in 0..3 {
        let log = fleet.log(i);
        assert!(
            log.contains("cannot reach the API server to list Leases") && log.contains(plane.url()),
            "replica {i}: {log}"
        );
    }

    plane
        .restart_apiserver()
        .await
        .expect("kube-apiserver back");
    let back_at = tokio::time::Instant::now();
    wait_approved(&fleet, N).await;
    eprintln!("all {N} approved {:?} after the restart", back_at.elapsed());
    assert_each_created_once(&fleet.sim, N);
    eventually("the state table to empty", || async {
        (fleet.count("SELECT count(*) FROM auto_approve_state").await == 0).then_some(())
    })
    .await;
    for i in 0..3 {
        eventually(&format!("replica {i}'s /healthz to pass again"), || async {
            (fleet.healthz(i).await?.0 == 200).then_some(())
        })
        .await;
        let log = fleet.log(i);
        assert!(
            log.contains("the API server answers again"),
            "replica {i}: {log}"
        );
    }
    for i in 0..3 {
        fleet.stop(i).await;
    }
    plane.stop();
}
