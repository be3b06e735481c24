use std::process::ExitCode;

use clap::Parser;
use mimalloc::MiMalloc;

/// mimalloc: glibc's malloc and free were a fifth of a replica's CPU at
/// saturation, spread over every allocation (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = autoapproval::cli::Cli::parse();
    match autoapproval::cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("autoapproval: {error}");
            ExitCode::FAILURE
        }
    }
}
