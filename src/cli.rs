//! The command line: `autoapproval <subcommand>`, every setting a flag with
//! an environment variable and a default shown in `--help`.

use clap::{Parser, Subcommand};

use crate::db::{Database, DatabaseArgs, DbError, SessionArgs};

/// Auto-approves contract requests kept in PostgreSQL, MySQL or MariaDB.
#[derive(Parser, Debug)]
#[command(name = "autoapproval", version, about)]
pub struct Cli {
    /// Log as JSON lines instead of text [default: off, human-readable text].
    #[arg(
        long,
        global = true,
        env = "AUTOAPPROVAL_LOG_JSON",
        default_value_t = false
    )]
    pub log_json: bool,
    /// The subcommand: the controller, its migrations or its CRD.
    #[command(subcommand)]
    pub command: Command,
}

/// The shipped binary's subcommands; the tooling has binaries of its own.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Apply the controller's database migrations (idempotent; docs/INTEGRATING.md).
    Migrate(MigrateArgs),
    /// Run the controller.
    Run(Box<crate::controller::config::RunArgs>),
    /// Check, as the controller's role, what `run` checks of the database before it starts (the controller's migrations applied, the binding usable); exits 1 naming what is missing.
    Check(CheckArgs),
    /// Print the AutoApproval CRD as YAML (what crds/autoapproval.yaml holds).
    Crd,
    /// Show one request, or retry, pause or resume it, through the database.
    Request(crate::operator::RequestArgs),
    /// Pause the whole fleet (`--all`): no replica claims anything until `resume --all`.
    Pause(crate::operator::PauseArgs),
    /// End the fleet's pause (`--all`): every replica claims again at its next poll.
    Resume(crate::operator::ResumeArgs),
    /// Compare what shadow mode (`run --mode shadow`) would have done with what happened to each request.
    ShadowReport(crate::shadow::ShadowReportArgs),
}

/// Arguments of `migrate`.
#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// The database to migrate (the primary).
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Also create the reference business schema (approval_request, econtract, their memo
    /// table) and bind it, for the demo, the tests or a new system that adopts it; a company's
    /// own tables are bound by docs/INTEGRATING.md instead [default: off].
    #[arg(long, env = "AUTOAPPROVAL_REFERENCE_SCHEMA", default_value_t = false)]
    pub reference_schema: bool,
    /// Print the SQL the pending migrations would run (with the history rows they record)
    /// instead of running it, for a DBA who applies DDL by hand [default: off].
    #[arg(long, default_value_t = false)]
    pub print_sql: bool,
}

/// Arguments of `check`: the database as `run` connects to it.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The database to check (the primary), with the controller's role: the one `run` uses.
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// The session limits `run` sets on each connection.
    #[command(flatten)]
    pub session: SessionArgs,
}

/// What `check` prints when `run` would start.
pub const CHECK_PASSED: &str = "the database is ready for autoapproval run: the controller's migrations are applied and this role can use the binding";

/// Errors that end the program.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The store failed.
    #[error(transparent)]
    Database(#[from] DbError),
    /// A setting is invalid.
    #[error(transparent)]
    Setting(#[from] crate::flags::SettingError),
    /// An external-system setting is invalid.
    #[error(transparent)]
    External(#[from] crate::external::http::ConfigError),
    /// No usable Kubernetes configuration.
    #[error("Kubernetes configuration: {0}")]
    Kube(String),
    /// The controller failed.
    #[error(transparent)]
    Controller(#[from] crate::controller::ControllerError),
    /// The endpoints could not be served.
    #[error("serving {addr}: {source}")]
    Listen {
        /// The `--listen` address that could not be bound.
        addr: std::net::SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// No `--replica-name`, and neither the pod's nor the host's name.
    #[error(
        "cannot tell this replica's name: set --replica-name (or $POD_NAME), unique among the replicas"
    )]
    NoReplicaName,
    /// The SIGTERM and Ctrl-C handlers could not be installed.
    #[error("installing the SIGTERM and Ctrl-C handlers: {0}")]
    Signal(#[source] std::io::Error),
    /// The CRD could not be rendered.
    #[error("rendering the CRD: {0}")]
    Crd(#[from] serde_yaml::Error),
    /// The span export could not start.
    #[error(transparent)]
    Export(#[from] crate::traces::ExportError),
    /// An operator's action was refused or failed.
    #[error(transparent)]
    Request(#[from] crate::operator::RequestError),
    /// The shadow report could not be made.
    #[error(transparent)]
    ShadowReport(#[from] crate::shadow::ShadowReportError),
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    // An operator's command prints its answer; only warnings go beside it.
    let level = match cli.command {
        Command::Request(_) | Command::Pause(_) | Command::Resume(_) | Command::ShadowReport(_) => {
            "warn"
        }
        _ => "info",
    };
    // The export is set up with the subscriber, so its settings are checked
    // first; the guard flushes the last spans when the command returns.
    let otlp = match &cli.command {
        Command::Run(args) => args.tracing.config()?,
        _ => None,
    };
    let _export = crate::telemetry::init_tracing(cli.log_json, level, otlp.as_ref())?;
    match cli.command {
        Command::Migrate(args) => {
            // Migrations may wait for locks and build indexes: no session limits.
            let store = Database::connect(&args.database, None).await?;
            if args.print_sql {
                print!("{}", store.migration_script(args.reference_schema).await?);
                return Ok(());
            }
            store.migrate(args.reference_schema).await?;
            tracing::info!(
                reference_schema = args.reference_schema,
                "migrations applied"
            );
            Ok(())
        }
        Command::Run(args) => run_controller(*args).await,
        Command::Check(args) => {
            // The same connection and the same check as `run`'s start-up, so a
            // release whose replicas would refuse to start fails here instead
            // (the chart's migration hook runs it after `migrate`).
            let store = Database::connect(&args.database, Some(&args.session)).await?;
            for warning in store.check_schema().await? {
                tracing::warn!(%warning, "schema");
            }
            println!("{CHECK_PASSED}");
            Ok(())
        }
        Command::Crd => {
            print!("{}", crate::controller::crd::crd_yaml()?);
            Ok(())
        }
        Command::Request(args) => {
            print!("{}", crate::operator::run(&args).await?);
            Ok(())
        }
        Command::Pause(args) => {
            print!("{}", crate::operator::pause_fleet(&args).await?);
            Ok(())
        }
        Command::Resume(args) => {
            print!("{}", crate::operator::resume_fleet(&args).await?);
            Ok(())
        }
        Command::ShadowReport(args) => {
            print!("{}", crate::shadow::run(&args).await?);
            Ok(())
        }
    }
}

/// `autoapproval run`: validate everything, then serve until SIGTERM.
async fn run_controller(args: crate::controller::config::RunArgs) -> Result<(), CliError> {
    use std::sync::Arc;

    use crate::controller::{Parts, run_until};
    use crate::endpoints::{Health, router};
    use crate::telemetry::Metrics;

    args.tracing.report_unexported();
    // A SIGTERM during start-up is kept for the loop below, not fatal.
    let mut termination = crate::shutdown::Termination::install().map_err(CliError::Signal)?;
    // Every value is checked before anything is contacted.
    args.controller
        .config(String::new(), String::new())?
        .check_pool(args.database.db_max_connections)?;
    let metrics = Metrics::new();
    let external = crate::external::http::HttpExternalSystems::build_reporting(
        &args.external,
        Some(&metrics),
    )?;
    let (client, api_server) = kube_client(args.controller.kubeconfig.as_deref(), &metrics).await?;
    let namespace = match &args.controller.namespace {
        Some(ns) => ns.clone(),
        None => own_namespace().unwrap_or_else(|| client.default_namespace().to_owned()),
    };
    let replica_name = match args.controller.replica_name.clone() {
        Some(name) => name,
        None => own_name().ok_or(CliError::NoReplicaName)?,
    };
    let settings = args.controller.config(namespace, replica_name)?;
    let store = Database::connect(&args.database, Some(&args.session)).await?;
    // A schema older than this binary, or a binding the role cannot use,
    // stops here, naming it; what only slows the controller is a warning.
    for warning in store.check_schema().await? {
        tracing::warn!(%warning, "schema");
    }
    let health = Health::new(store.clone(), client.clone(), metrics.clone());
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|source| CliError::Listen {
            addr: settings.listen,
            source,
        })?;
    let addr = listener.local_addr().unwrap_or(settings.listen);
    tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    let app = router(health.clone());
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "health and metrics endpoints stopped");
        }
    });
    let parts = Parts {
        client,
        api_server,
        store,
        external,
        clock: Arc::new(crate::clock::SystemClock),
        metrics,
        health: Some(health),
    };
    run_until(settings, parts, async move { termination.recv().await }).await?;
    Ok(())
}

/// The User-Agent of the controller's requests to the API server.
pub const USER_AGENT: &str = concat!("autoapproval/", env!("CARGO_PKG_VERSION"));

/// The client, and the API server's URL for the messages about it.
async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    metrics: &crate::telemetry::Metrics,
) -> Result<(kube::Client, String), CliError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| CliError::Kube(format!("--kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| CliError::Kube(format!("--kubeconfig {}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| CliError::Kube(e.to_string()))?,
    };
    let url = config.cluster_url.to_string();
    // Named in the API server's audit log (and the test server's access record).
    config.headers.push((
        reqwest::header::USER_AGENT,
        reqwest::header::HeaderValue::from_static(USER_AGENT),
    ));
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| CliError::Kube(e.to_string()))?
        .with_layer(&crate::telemetry::KubeRequestsLayer::new(metrics.clone()))
        .build();
    Ok((client, url))
}

/// This replica's default name: the pod's (`$POD_NAME`), else the host's
/// (`$HOSTNAME`, else the kernel's), never one shared by every replica.
fn own_name() -> Option<String> {
    let non_empty = |s: String| Some(s.trim().to_owned()).filter(|s| !s.is_empty());
    std::env::var("POD_NAME")
        .ok()
        .and_then(non_empty)
        .or_else(|| std::env::var("HOSTNAME").ok().and_then(non_empty))
        .or_else(|| {
            ["/proc/sys/kernel/hostname", "/etc/hostname"]
                .iter()
                .find_map(|path| std::fs::read_to_string(path).ok().and_then(non_empty))
        })
}

/// The pod's namespace: `$POD_NAMESPACE`, else the service account's.
fn own_namespace() -> Option<String> {
    std::env::var("POD_NAMESPACE").ok().or_else(|| {
        std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    })
}
