//! The throwaway stack the demo and the benchmark run on, in one process
//! tree: a PostgreSQL (or, with `--database mysql`, a MariaDB) of their
//! own, the in-memory test API server (or, with `--control-plane real`,
//! kube-apiserver and etcd, RBAC enforced) with the CRD, the simulator of the external systems, and replicas started as child
//! processes: the shipped `autoapproval` binary, or this one for the seed's
//! designs. Everything is removed again by [`Stack::shutdown`].

pub mod postgres;
pub mod process;
pub mod real;
pub mod replicas;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_testserver::{Options, TestServer};
use throwaway_db::MariaDb;

use autoapproval::controller::crd::AutoApproval;
use autoapproval::db::mysql;
use autoapproval::db::{self, DbError};
use autoapproval::shutdown::Termination;
use autoapproval_sim::{SimConfig, SimError, SimHandle, Simulator};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, PostParams};

use crate::harness::Harness;
use postgres::Postgres;
use real::RealServer;
use replicas::Replica;

/// The role the replicas connect as; the harness's own statements run as
/// the superuser, so `pg_stat_statements` can tell the two apart.
pub const WORKER_ROLE: &str = "autoapproval";
/// The database the stack creates.
pub const DATABASE: &str = "autoapproval";
/// The namespace of the CRs and Leases on the in-memory API server.
pub const NAMESPACE: &str = "default";

/// The database a stack runs on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Database {
    /// PostgreSQL; the replicas wake on NOTIFY.
    Postgres,
    /// MariaDB (the MySQL family, from Debian's binaries); the replicas poll the wake table.
    Mysql,
}

impl Database {
    /// The server's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Database::Postgres => "PostgreSQL",
            Database::Mysql => "MariaDB",
        }
    }
}

/// The Kubernetes API server a stack runs on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlPlaneKind {
    /// The in-memory test API server (crates/kube-testserver), in the lab's process.
    Memory,
    /// kube-apiserver and etcd (scripts/install-control-plane.sh builds them), the
    /// replicas as the chart's ServiceAccount under its Role.
    Real,
}

/// Settings of the stack shared by `demo` and `bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct StackArgs {
    /// The database the stack starts: a throwaway PostgreSQL, or a throwaway MariaDB (`mysql`: the controller's MySQL 8 / MariaDB backend).
    #[arg(
        long,
        env = "AUTOAPPROVAL_LAB_DATABASE",
        value_enum,
        default_value = "postgres"
    )]
    pub database: Database,
    /// The Kubernetes API server: the in-memory test server, or the real kube-apiserver and etcd (built once by scripts/install-control-plane.sh; found by $KUBE_APISERVER and $ETCD, else .tools/bin, else PATH).
    #[arg(
        long,
        env = "AUTOAPPROVAL_LAB_CONTROL_PLANE",
        value_enum,
        default_value = "memory"
    )]
    pub control_plane: ControlPlaneKind,
    /// Directory of PostgreSQL's `initdb` and `postgres` [default: the newest /usr/lib/postgresql/*/bin, else PATH].
    #[arg(long, env = "AUTOAPPROVAL_PG_BINDIR")]
    pub pg_bindir: Option<PathBuf>,
    /// Where the stack's temporary directory is made [default: the system's temporary directory].
    #[arg(long, env = "AUTOAPPROVAL_WORK_DIR")]
    pub work_dir: Option<PathBuf>,
    /// The controller binary the replicas of "ours" run: what ships [default: `autoapproval` beside this binary].
    #[arg(long, env = "AUTOAPPROVAL_CONTROLLER_BIN")]
    pub controller_bin: Option<PathBuf>,
}

/// Which binary a replica runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// The shipped controller, `autoapproval`.
    Controller,
    /// This binary, for the seed's designs (`autoapproval-lab seed-design`).
    Lab,
}

/// Why the stack could not be set up or run.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The controller binary is not where it was looked for.
    #[error(
        "the controller binary {0} does not exist: build it with `cargo build -p autoapproval` or pass --controller-bin"
    )]
    ControllerBinary(String),
    /// PostgreSQL could not be found, initialised or started.
    #[error("PostgreSQL: {0}")]
    Postgres(String),
    /// MariaDB could not be started or set up.
    #[error("MariaDB: {0}")]
    Mariadb(String),
    /// The database failed.
    #[error(transparent)]
    Database(#[from] DbError),
    /// The test API server or a Kubernetes call failed.
    #[error("Kubernetes: {0}")]
    Kube(String),
    /// The real control plane could not be started or read.
    #[error("the real control plane: {0}")]
    ControlPlane(#[from] control_plane::Error),
    /// The simulator failed.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A replica process failed.
    #[error("replica {name}: {message} (its log: {log})")]
    Replica {
        /// The replica.
        name: String,
        /// What went wrong.
        message: String,
        /// Its log file.
        log: String,
    },
}

/// Maps an I/O error with what was being done.
pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StackError {
    let what = what.into();
    move |source| StackError::Io { what, source }
}

/// Installs the Ctrl-C and SIGTERM handlers; call before starting anything,
/// so that no signal can cut a start short and orphan a child.
pub fn install_termination() -> Result<Termination, StackError> {
    Termination::install().map_err(io("catching Ctrl-C and SIGTERM"))
}

/// The running stack.
pub struct Stack {
    dir: PathBuf,
    postgres: Option<Postgres>,
    mariadb: Option<MariaDb>,
    apiserver: Option<TestServer>,
    real: Option<RealServer>,
    /// The lab's own client (the admin on the real server), namespace [`Stack::namespace`].
    client: Option<kube::Client>,
    sim: Option<SimHandle>,
    kubeconfig: PathBuf,
    controller_bin: PathBuf,
    harness: Option<Harness>,
    counts_statements: bool,
    replicas: Vec<Replica>,
}

// === impl Stack ===

impl Stack {
    /// Starts PostgreSQL (migrated, probes installed), the test API server
    /// with the CRD, and the simulator with `sim` options. `purpose` names
    /// the temporary directory.
    pub async fn start(
        args: &StackArgs,
        purpose: &str,
        sim: SimConfig,
    ) -> Result<Self, StackError> {
        let controller_bin = match &args.controller_bin {
            Some(path) => path.clone(),
            None => std::env::current_exe()
                .map_err(io("finding this binary"))?
                .with_file_name("autoapproval"),
        };
        if !controller_bin.is_file() {
            return Err(StackError::ControllerBinary(
                controller_bin.display().to_string(),
            ));
        }
        if args.control_plane == ControlPlaneKind::Real {
            control_plane::check_binaries()?;
        }
        let base = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "autoapproval-{purpose}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let mut stack = Self {
            kubeconfig: dir.join("kubeconfig"),
            controller_bin,
            dir,
            postgres: None,
            mariadb: None,
            apiserver: None,
            real: None,
            client: None,
            sim: None,
            harness: None,
            counts_statements: false,
            replicas: Vec::new(),
        };
        // On any failure below, what was started is stopped again.
        match stack.bring_up(args, sim).await {
            Ok(()) => Ok(stack),
            Err(error) => {
                stack.shutdown(true).await;
                Err(error)
            }
        }
    }

    async fn bring_up(&mut self, args: &StackArgs, sim: SimConfig) -> Result<(), StackError> {
        let harness = match args.database {
            Database::Postgres => self.bring_up_postgres(args).await?,
            Database::Mysql => self.bring_up_mariadb().await?,
        };
        self.counts_statements = harness.enable_statement_counts().await?;
        harness.install_probes(WORKER_ROLE).await?;
        self.harness = Some(harness);

        match args.control_plane {
            ControlPlaneKind::Memory => self.bring_up_test_server().await?,
            ControlPlaneKind::Real => {
                let real = RealServer::start().await?;
                self.kubeconfig = real.kubeconfig().to_path_buf();
                self.client = Some(real.admin());
                self.real = Some(real);
            }
        }
        self.sim = Some(Simulator::start(([127, 0, 0, 1], 0).into(), sim).await?);
        Ok(())
    }

    /// The in-memory test API server with the CRD.
    async fn bring_up_test_server(&mut self) -> Result<(), StackError> {
        let apiserver = TestServer::start(Options::default())
            .await
            .map_err(|e| StackError::Kube(format!("starting the test API server: {e}")))?;
        apiserver
            .write_kubeconfig(&self.kubeconfig)
            .map_err(|e| StackError::Kube(format!("writing the kubeconfig: {e}")))?;
        let url = apiserver.url();
        self.apiserver = Some(apiserver);
        let uri = url
            .parse()
            .map_err(|e| StackError::Kube(format!("{url}: {e}")))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = NAMESPACE.into();
        let client = kube::Client::try_from(config).map_err(|e| StackError::Kube(e.to_string()))?;
        Api::<CustomResourceDefinition>::all(client.clone())
            .create(&PostParams::default(), &AutoApproval::crd())
            .await
            .map_err(|e| StackError::Kube(format!("applying the CRD: {e}")))?;
        self.client = Some(client);
        Ok(())
    }

    /// PostgreSQL with the worker role and the migrated database; the
    /// harness connects as the superuser.
    async fn bring_up_postgres(&mut self, args: &StackArgs) -> Result<Harness, StackError> {
        let postgres = Postgres::start(&self.dir.join("pg"), args.pg_bindir.as_deref()).await?;
        let admin = postgres.connect("postgres", "postgres").await?;
        for sql in [
            format!("CREATE ROLE {WORKER_ROLE} LOGIN"),
            format!("CREATE DATABASE {DATABASE} OWNER {WORKER_ROLE}"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&admin)
                .await
                .map_err(|e| StackError::Postgres(format!("{sql}: {e}")))?;
        }
        admin.close().await;
        let worker = postgres.connect(WORKER_ROLE, DATABASE).await?;
        db::Database::postgres(worker.clone(), worker.clone())
            .migrate(true)
            .await?;
        worker.close().await;
        self.postgres = Some(postgres);
        Ok(Harness::new(
            self.postgres()?.connect("postgres", DATABASE).await?,
        ))
    }

    /// A throwaway MariaDB with the migrated database. The replicas and the
    /// harness connect as its root (no password, 127.0.0.1 only): the
    /// server lives as long as the stack.
    async fn bring_up_mariadb(&mut self) -> Result<Harness, StackError> {
        let mariadb = MariaDb::start()
            .await
            .map_err(|e| StackError::Mariadb(e.to_string()))?;
        mariadb
            .create_database(DATABASE)
            .await
            .map_err(|e| StackError::Mariadb(e.to_string()))?;
        let url = mariadb.database_url(DATABASE);
        self.mariadb = Some(mariadb);
        let options = url
            .parse()
            .map_err(|e| StackError::Mariadb(format!("{url}: {e}")))?;
        // The store's own session settings (READ COMMITTED, UTC).
        let pool = mysql::pool(options, 4, None);
        db::Database::mysql(pool.clone(), pool.clone())
            .migrate(true)
            .await?;
        Ok(Harness::mysql(pool))
    }

    fn postgres(&self) -> Result<&Postgres, StackError> {
        self.postgres
            .as_ref()
            .ok_or_else(|| StackError::Postgres("not running".into()))
    }

    /// The temporary directory (logs, kubeconfig, PostgreSQL's data).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kubeconfig the replicas run with: the test API server's, or on the real
    /// one the chart's ServiceAccount's.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The namespace of the CRs and Leases.
    pub fn namespace(&self) -> &str {
        self.real.as_ref().map_or(NAMESPACE, RealServer::namespace)
    }

    /// The lab's own client (the admin on the real server), default namespace
    /// [`Stack::namespace`].
    pub fn client(&self) -> Result<kube::Client, StackError> {
        self.client
            .clone()
            .ok_or_else(|| StackError::Kube("no API server is running".into()))
    }

    /// The test API server, when the stack runs on it.
    pub fn apiserver(&self) -> Option<&TestServer> {
        self.apiserver.as_ref()
    }

    /// The real control plane, when the stack runs on it.
    pub fn real(&self) -> Option<&RealServer> {
        self.real.as_ref()
    }

    /// API writes so far, by verb and resource (`"create autoapprovals"`).
    pub async fn api_writes(&self) -> Result<BTreeMap<String, u64>, StackError> {
        let counts = match (&self.apiserver, &self.real) {
            (Some(server), _) => server.request_counts(),
            (None, Some(real)) => real.writes().await?,
            (None, None) => BTreeMap::new(),
        };
        Ok(counts
            .into_iter()
            .filter(|(key, _)| {
                matches!(
                    key.split(' ').next().unwrap_or_default(),
                    "create" | "update" | "patch" | "delete" | "deletecollection"
                )
            })
            .collect())
    }

    /// The simulator.
    pub fn sim(&self) -> Option<&SimHandle> {
        self.sim.as_ref()
    }

    /// The controller binary the replicas of "ours" run.
    pub fn controller_bin(&self) -> &Path {
        &self.controller_bin
    }

    /// The harness's database access (superuser).
    pub fn harness(&self) -> Result<&Harness, StackError> {
        self.harness
            .as_ref()
            .ok_or_else(|| StackError::Postgres("not running".into()))
    }

    /// Whether `pg_stat_statements` counts the statements (its library was
    /// there to preload).
    pub fn counts_statements(&self) -> bool {
        self.counts_statements
    }

    /// Restarts PostgreSQL (fast shutdown, down for `down`, then start on
    /// the same port and data), as an operator's restart or a failover does
    /// to the replicas.
    pub async fn restart_postgres(&mut self, down: Duration) -> Result<(), StackError> {
        match self.postgres.as_mut() {
            Some(pg) => pg.restart(down).await,
            None => Err(StackError::Postgres("not running".into())),
        }
    }

    /// The URL the replicas connect with.
    pub fn worker_url(&self) -> Result<String, StackError> {
        match &self.mariadb {
            Some(mariadb) => Ok(mariadb.database_url(DATABASE)),
            None => Ok(self.postgres()?.url(WORKER_ROLE, DATABASE)),
        }
    }

    /// The database the stack runs.
    pub fn database(&self) -> Database {
        if self.mariadb.is_some() {
            Database::Mysql
        } else {
            Database::Postgres
        }
    }

    /// `autoapproval run` against this stack as replica `name`; the caller
    /// appends its own settings.
    pub fn run_args(&self, name: &str) -> Vec<String> {
        [
            "run",
            "--kubeconfig",
            &self.kubeconfig.display().to_string(),
            "--namespace",
            self.namespace(),
            "--replica-name",
            name,
        ]
        .map(String::from)
        .to_vec()
    }

    /// Starts a replica: `program` with `args`, its environment cleared of
    /// `AUTOAPPROVAL_*` and given the database and simulator URLs.
    pub async fn spawn(
        &mut self,
        program: Program,
        name: &str,
        args: &[String],
    ) -> Result<(), StackError> {
        let sim_url = self
            .sim
            .as_ref()
            .map(|s| s.base_url())
            .ok_or_else(|| StackError::Kube("the simulator is not running".into()))?;
        let mut env = vec![("AUTOAPPROVAL_DATABASE_URL".to_owned(), self.worker_url()?)];
        for system in ["ESIGN", "OWNER", "STORE", "AD"] {
            env.push((format!("AUTOAPPROVAL_{system}_URL"), sim_url.clone()));
        }
        let exe = match program {
            Program::Controller => self.controller_bin.clone(),
            Program::Lab => std::env::current_exe().map_err(io("finding this binary"))?,
        };
        let replica = Replica::spawn(&exe, name, args, &env, &self.dir).await?;
        self.replicas.push(replica);
        Ok(())
    }

    /// CPU seconds the database has used so far: PostgreSQL's server and
    /// backends, or MariaDB's one process (all its threads).
    pub fn database_cpu_seconds(&self) -> Option<f64> {
        match &self.mariadb {
            Some(mariadb) => {
                // Its pid file sits beside its log in its data directory's parent.
                let pid = std::fs::read_to_string(mariadb.log_path().with_file_name("mysqld.pid"))
                    .ok()?;
                replicas::cpu_seconds(pid.trim().parse().ok()?)
            }
            None => self.postgres.as_ref()?.cpu_seconds(),
        }
    }

    /// The running replicas.
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// Fails when a replica has exited.
    pub fn check_replicas(&mut self) -> Result<(), StackError> {
        for replica in &mut self.replicas {
            replica.check_running()?;
        }
        Ok(())
    }

    /// Waits until every replica serves `/metrics` and, when `shards` is
    /// given, their `autoapproval_shards_held` add up to it with each within
    /// one of its fair share (the Leases have settled).
    pub async fn wait_ready(&mut self, shards: Option<u32>) -> Result<(), StackError> {
        let http = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            self.check_replicas()?;
            let mut held = Vec::new();
            for replica in &self.replicas {
                if let Ok(text) = replica.scrape(&http).await {
                    held.push(replicas::metric_sum(&text, "autoapproval_shards_held", &[]) as u32);
                }
            }
            let serving = held.len() == self.replicas.len();
            let settled = shards.is_none_or(|k| {
                let fair = k / (held.len().max(1) as u32);
                held.iter().sum::<u32>() == k && held.iter().all(|h| (fair..=fair + 1).contains(h))
            });
            if serving && settled {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(StackError::Kube(format!(
                    "replicas not ready after 60 s (shards held per replica: {held:?})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Failed claims across the replicas so far, by reason: `claim lost`
    /// (`autoapproval_claims_total{result="lost"}`: a conditional claim on
    /// the primary refused) and the seed's own reasons
    /// ([`crate::bench::seed_redis::FAILED_CLAIMS_METRIC`]).
    pub async fn failed_claims(&self, http: &reqwest::Client) -> BTreeMap<String, f64> {
        let mut failed = BTreeMap::new();
        for replica in &self.replicas {
            let Ok(text) = replica.scrape(http).await else {
                continue;
            };
            *failed.entry("claim lost".to_owned()).or_default() +=
                replicas::metric_sum(&text, "autoapproval_claims_total", &["result=\"lost\""]);
            for reason in ["lock_contention", "stale_candidate", "redis_unavailable"] {
                let label = format!("reason=\"{reason}\"");
                let n = replicas::metric_sum(
                    &text,
                    crate::bench::seed_redis::FAILED_CLAIMS_METRIC,
                    &[&label],
                );
                *failed.entry(reason.replace('_', " ")).or_default() += n;
            }
        }
        failed
    }

    /// Stops the replica named `name` (SIGTERM, then SIGKILL after `grace`).
    pub async fn stop_replica(&mut self, name: &str, grace: Duration) {
        if let Some(i) = self.replicas.iter().position(|r| r.name() == name) {
            self.replicas.remove(i).stop(grace).await;
        }
    }

    /// Stops the replicas (SIGTERM, then SIGKILL after `grace`).
    pub async fn stop_replicas(&mut self, grace: Duration) {
        let stops = self.replicas.drain(..).map(|r| r.stop(grace));
        futures::future::join_all(stops).await;
    }

    /// Stops everything and removes the temporary directory; with
    /// `keep_logs` only PostgreSQL's data goes and the logs stay.
    pub async fn shutdown(mut self, keep_logs: bool) {
        self.stop_replicas(Duration::from_secs(10)).await;
        if let Some(sim) = self.sim.take() {
            let _ = sim.shutdown().await;
        }
        if let Some(server) = self.apiserver.take() {
            server.shutdown().await;
        }
        // Its drop ends etcd and kube-apiserver and removes their directory.
        drop(self.real.take());
        if let Some(harness) = self.harness.take() {
            harness.close().await;
        }
        if let Some(pg) = self.postgres.take() {
            pg.stop().await;
        }
        // Killed, its data directory removed.
        drop(self.mariadb.take());
        let remove = if keep_logs {
            self.dir.join("pg").join("data")
        } else {
            self.dir.clone()
        };
        if !remove.exists() {
            return;
        }
        if let Err(error) = std::fs::remove_dir_all(&remove) {
            tracing::warn!(dir = %self.dir.display(), %error, "could not remove the stack's directory");
        }
    }
}
