//! The lab's command line: `autoapproval-lab <subcommand>`, every setting a
//! flag with an environment variable and a default shown in `--help`.

use clap::{Parser, Subcommand};

/// The demo and the benchmark of autoapproval, on a throwaway stack.
#[derive(Parser, Debug)]
#[command(name = "autoapproval-lab", version, about)]
pub struct LabArgs {
    /// Log as JSON lines instead of text [default: off, human-readable text].
    #[arg(
        long,
        global = true,
        env = "AUTOAPPROVAL_LOG_JSON",
        default_value_t = false
    )]
    pub log_json: bool,
    /// What to run.
    #[command(subcommand)]
    pub command: LabCommand,
}

/// The lab's subcommands.
#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Show the controller at work: a throwaway PostgreSQL (or MariaDB), API server, simulator and 3 replicas on a mixed workload.
    Demo(Box<crate::demo::DemoArgs>),
    /// Measure ours (and, with --compare, the seed's two designs) on the demo's stack; JSON report and SVG plot.
    Bench(Box<crate::bench::BenchArgs>),
    /// Run one of the seed's designs as a replica (started by `bench`).
    #[command(hide = true)]
    SeedDesign(Box<crate::bench::seed_designs::SeedDesignArgs>),
}

/// Errors that end the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The demo failed.
    #[error(transparent)]
    Demo(#[from] crate::demo::DemoError),
    /// The benchmark failed.
    #[error(transparent)]
    Bench(#[from] crate::bench::BenchError),
    /// A seed design replica failed.
    #[error(transparent)]
    SeedDesign(#[from] crate::bench::seed_designs::SeedDesignError),
}

/// Runs the parsed command line.
pub async fn run(args: LabArgs) -> Result<(), LabError> {
    // The demo and the benchmark print their own progress; their log is
    // for warnings unless RUST_LOG asks for more.
    let quiet = matches!(args.command, LabCommand::Demo(_) | LabCommand::Bench(_));
    let _ = autoapproval::telemetry::init_tracing(
        args.log_json,
        if quiet { "warn" } else { "info" },
        None,
    );
    match args.command {
        LabCommand::Demo(args) => Ok(crate::demo::run(*args).await?),
        LabCommand::Bench(args) => Ok(crate::bench::run(*args).await?),
        LabCommand::SeedDesign(args) => Ok(crate::bench::seed_designs::run(*args).await?),
    }
}
