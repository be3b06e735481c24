//! Pickup latency benchmark: INSERT of a request → its claim, p50 and p99
//! over N requests, with NOTIFY and with polling only, one replica, in one
//! run. Real PostgreSQL (`DATABASE_URL`), the test API server and the
//! simulator over loopback HTTP.
//!
//! `cargo run --release --example pickup_latency -- [requests] [rate_per_s]`

use std::sync::Arc;
use std::time::Duration;

use autoapproval::clock::SystemClock;
use autoapproval::controller::config::ControllerConfig;
use autoapproval::controller::{Parts, run_until};
use autoapproval::db::Database;
use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::telemetry::Metrics;
use autoapproval_sim::{SimConfig, Simulator};
use kube_testserver::{Options, TestServer};

mod common;

use common::Error;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let requests: i64 = args.next().map_or(Ok(1000), |a| a.parse())?;
    let rate: f64 = args.next().map_or(Ok(100.0), |a| a.parse())?;
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    println!("pickup latency, {requests} owner contracts inserted at {rate}/s, one replica");
    println!("| mode | p50 | p99 | max |");
    println!("| --- | --- | --- | --- |");
    for notify in [true, false] {
        let (p50, p99, max) = run(&base, requests, rate, notify).await?;
        let mode = if notify {
            "NOTIFY + 10 s poll"
        } else {
            "10 s poll only"
        };
        println!("| {mode} | {p50:.1} ms | {p99:.1} ms | {max:.1} ms |");
    }
    Ok(())
}

async fn run(base: &str, requests: i64, rate: f64, notify: bool) -> Result<(f64, f64, f64), Error> {
    let db = format!("aa_bench_pickup_{}", std::process::id());
    let (admin, pool) = common::fresh_database(base, &db, 20).await?;
    // The claim time, in the database's clock, as the INSERT's created_at is.
    sqlx::raw_sql(
        "CREATE TABLE bench_claim (request_id BIGINT PRIMARY KEY, claimed_at TIMESTAMPTZ NOT NULL);
         CREATE FUNCTION bench_claim() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO bench_claim VALUES (NEW.request_id, clock_timestamp())
               ON CONFLICT DO NOTHING; RETURN NULL; END; $$;
         CREATE TRIGGER bench_claim AFTER INSERT ON auto_approve_state
             FOR EACH ROW EXECUTE FUNCTION bench_claim();",
    )
    .execute(&pool)
    .await?;

    let server = TestServer::start(Options::default()).await?;
    let client = common::client(&server)?;
    common::install_crd(&client).await?;
    let sim = Simulator::start("127.0.0.1:0".parse()?, SimConfig::default()).await?;
    let external = HttpExternalSystems::build(&ExternalArgs::all_at(sim.base_url())?)?;
    let mut settings = ControllerConfig::defaults("default", "bench-1")?;
    settings.discovery.notify = notify;
    let parts = Parts {
        client,
        api_server: server.url(),
        store: Database::postgres(pool.clone(), pool.clone()),
        external,
        clock: Arc::new(SystemClock),
        metrics: Metrics::new(),
        health: None,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run_until(settings, parts, async move {
        let _ = stop_rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let gap = Duration::from_secs_f64(1.0 / rate);
    let mut tick = tokio::time::interval(gap);
    for id in 1..=requests {
        tick.tick().await;
        sqlx::query(
            "INSERT INTO approval_request
                 (id, request_type, status, business_name, documents_released, menu_registered,
                  logo_registered, previous_step_approved, econtract_ref, created_at, sort_time)
             VALUES ($1, 'OWNER_CONTRACT', 'PENDING', 'Shop', true, true, true, true, $2,
                     clock_timestamp(), clock_timestamp())",
        )
        .bind(id)
        .bind(format!("EC-{id}"))
        .execute(&pool)
        .await?;
    }
    loop {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM bench_claim")
            .fetch_one(&pool)
            .await?;
        if n >= requests {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (p50, p99, max): (f64, f64, f64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms)
           FROM (SELECT (extract(epoch FROM c.claimed_at - r.created_at) * 1000)::float8 AS ms
                   FROM bench_claim c JOIN approval_request r ON r.id = c.request_id) l",
    )
    .fetch_one(&pool)
    .await?;
    let _ = stop_tx.send(());
    let _ = controller.await;
    sim.shutdown().await?;
    server.shutdown().await;
    common::drop_database(&admin, pool, &db).await?;
    Ok((p50, p99, max))
}
