//! `kube-testserver --port N --kubeconfig PATH`: runs the in-memory API server.

use clap::Parser;
use std::path::PathBuf;

/// Command-line arguments.
#[derive(Parser, Debug)]
#[command(
    name = "kube-testserver",
    about = "An in-memory Kubernetes API server for tests and the local demo"
)]
struct Args {
    /// Port on 127.0.0.1 (0 = pick a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where to write a kubeconfig for this server [default: none, no file is written].
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Watch events retained (older resourceVersions get 410 Expired).
    #[arg(long, default_value_t = 10_000)]
    watch_window: usize,
    /// Seconds between watch BOOKMARK events.
    #[arg(long, default_value_t = 5.0)]
    bookmark_interval: f64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let server = kube_testserver::TestServer::start(kube_testserver::Options {
        port: args.port,
        watch_window: args.watch_window,
        bookmark_interval: std::time::Duration::from_secs_f64(args.bookmark_interval.max(0.01)),
    })
    .await?;
    if let Some(p) = &args.kubeconfig {
        server.write_kubeconfig(p)?;
        eprintln!("kubeconfig written to {}", p.display());
    }
    println!("{}", server.url());
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = server.wait() => {}
    }
    Ok(())
}
