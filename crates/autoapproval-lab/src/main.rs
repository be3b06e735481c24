//! `autoapproval-lab`: the demo and the benchmark.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let args = autoapproval_lab::cli::LabArgs::parse();
    match autoapproval_lab::cli::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("autoapproval-lab: {error}");
            ExitCode::FAILURE
        }
    }
}
