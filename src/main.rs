use std::process::ExitCode;

use clap::Parser;

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
