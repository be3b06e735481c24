//! The command line: `autoapproval <subcommand>`, every setting a flag with
//! an environment variable and a default shown in `--help`.

use clap::{Parser, Subcommand};

use crate::store::{DatabaseConfig, Store, StoreError};

/// Auto-approves contract requests kept in PostgreSQL.
#[derive(Parser, Debug)]
#[command(name = "autoapproval", version, about)]
pub struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(
        long,
        global = true,
        env = "AUTOAPPROVAL_LOG_JSON",
        default_value_t = false
    )]
    pub log_json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Apply the database migrations (idempotent).
    Migrate(MigrateArgs),
    /// Serve the simulator of the four external systems.
    Sim(crate::sim::SimArgs),
}

/// Arguments of `migrate`.
#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// The database.
    #[command(flatten)]
    pub database: DatabaseConfig,
}

/// Errors that end the program.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The simulator failed.
    #[error(transparent)]
    Sim(#[from] crate::sim::SimError),
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    crate::telemetry::init_tracing(cli.log_json);
    match cli.command {
        Command::Migrate(args) => {
            let store = Store::connect(&args.database).await?;
            Store::migrate(store.primary()).await?;
            tracing::info!("migrations applied");
            Ok(())
        }
        Command::Sim(args) => Ok(crate::sim::run(args).await?),
    }
}
