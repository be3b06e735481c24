//! `autoapproval-sim`: the four external systems on one HTTP port, until
//! Ctrl-C or SIGTERM.

use std::process::ExitCode;

use autoapproval_sim::SimArgs;
use clap::Parser;

/// Serves a simulator of the e-sign, owner, store and ad systems autoapproval calls.
#[derive(Parser, Debug)]
#[command(name = "autoapproval-sim", version, about)]
struct Cli {
    #[command(flatten)]
    sim: SimArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = autoapproval::telemetry::init_tracing(false, "info", None);
    match autoapproval_sim::run(cli.sim).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("autoapproval-sim: {error}");
            ExitCode::FAILURE
        }
    }
}
