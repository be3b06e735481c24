//! Throughput benchmark: approvals per second with 1 and with 3 replicas
//! coordinated by shard Leases, every external call answering after 100 ms,
//! side by side in one run. Real PostgreSQL (`DATABASE_URL`), the test API
//! server and the simulator over loopback HTTP; each replica has its own
//! Kubernetes client, DB pool and HTTP clients, as separate pods would.
//!
//! `cargo run --release --example replica_throughput -- [requests] [runs]`
//!
//! A backlog of owner contracts is inserted at once after the replicas hold
//! every shard; the rate is taken between the 10th and the 90th percentile
//! of the approval times, so start-up and the tail do not blur it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use autoapproval::clock::SystemClock;
use autoapproval::controller::config::ControllerConfig;
use autoapproval::controller::{Parts, run_until};
use autoapproval::coordination::SHARD_LEASE_PREFIX;
use autoapproval::db::Database;
use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::telemetry::Metrics;
use autoapproval_sim::{Faults, SimConfig, Simulator};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use kube_testserver::{Options, TestServer};
use sqlx::postgres::PgPoolOptions;

mod common;

use common::Error;

const LATENCY: Duration = Duration::from_millis(100);

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let requests: i64 = args.next().map_or(Ok(1500), |a| a.parse())?;
    let runs: usize = args.next().map_or(Ok(3), |a| a.parse())?;
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    println!(
        "throughput, {requests} owner contracts as one backlog, {} ms per external call, concurrency 16 per replica",
        LATENCY.as_millis()
    );
    println!("| run | 1 replica | 3 replicas | ratio |");
    println!("| --- | --- | --- | --- |");
    let mut ratios = Vec::new();
    let mut one = Vec::new();
    let mut three = Vec::new();
    for run in 1..=runs {
        let a = measure(&base, requests, 1).await?;
        let b = measure(&base, requests, 3).await?;
        println!("| {run} | {a:.1}/s | {b:.1}/s | {:.2} |", b / a);
        one.push(a);
        three.push(b);
        ratios.push(b / a);
    }
    println!(
        "| median | {:.1}/s | {:.1}/s | {:.2} |",
        median(&mut one),
        median(&mut three),
        median(&mut ratios)
    );
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One run with `replicas` replicas: approvals per second between the 10th
/// and 90th percentile of the approval times.
async fn measure(base: &str, requests: i64, replicas: usize) -> Result<f64, Error> {
    let db = format!("aa_bench_replicas_{}", std::process::id());
    let (admin, pool) = common::fresh_database(base, &db, 4).await?;
    let server = TestServer::start(Options::default()).await?;
    let client = common::client(&server)?;
    common::install_crd(&client).await?;
    let sim = Simulator::start("127.0.0.1:0".parse()?, SimConfig::default()).await?;
    sim.set_faults(Faults {
        latency: LATENCY,
        ..Faults::default()
    })?;
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..replicas {
        let replica_pool = PgPoolOptions::new()
            .max_connections(10)
            .connect_with((*pool.connect_options()).clone())
            .await?;
        let parts = Parts {
            client: common::client(&server)?,
            api_server: server.url(),
            store: Database::postgres(replica_pool.clone(), replica_pool),
            external: HttpExternalSystems::build(&ExternalArgs::all_at(sim.base_url())?)?,
            clock: Arc::new(SystemClock),
            metrics: Metrics::new(),
            health: None,
        };
        let settings = ControllerConfig::defaults("default", format!("bench-{i}"))?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        stops.push(stop_tx);
        tasks.push(tokio::spawn(run_until(settings, parts, async move {
            let _ = stop_rx.await;
        })));
    }
    wait_balanced(&client, replicas).await?;

    sqlx::query(
        "INSERT INTO approval_request
             (id, request_type, status, business_name, documents_released, menu_registered,
              logo_registered, previous_step_approved, econtract_ref, created_at, sort_time)
         SELECT g, 'OWNER_CONTRACT', 'PENDING', 'Shop', true, true, true, true, 'EC-' || g,
                clock_timestamp(), clock_timestamp()
           FROM generate_series(1, $1::bigint) AS g",
    )
    .bind(requests)
    .execute(&pool)
    .await?;
    loop {
        let (n,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM approval_request WHERE status = 'APPROVED'")
                .fetch_one(&pool)
                .await?;
        if n >= requests {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (rate,): (f64,) = sqlx::query_as(
        "SELECT (0.8 * count(*) / extract(epoch FROM
                    percentile_disc(0.9) WITHIN GROUP (ORDER BY decided_at)
                  - percentile_disc(0.1) WITHIN GROUP (ORDER BY decided_at)))::float8
           FROM approval_request",
    )
    .fetch_one(&pool)
    .await?;
    for stop in stops {
        let _ = stop.send(());
    }
    for task in tasks {
        let _ = task.await;
    }
    sim.shutdown().await?;
    server.shutdown().await;
    common::drop_database(&admin, pool, &db).await?;
    Ok(rate)
}

/// Waits until the replicas hold all 16 shards, each within one of the fair share.
async fn wait_balanced(client: &kube::Client, replicas: usize) -> Result<(), Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    for _ in 0..600 {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for lease in leases.list(&ListParams::default()).await?.items {
            let is_shard = lease
                .metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(SHARD_LEASE_PREFIX));
            if let Some(holder) = lease.spec.and_then(|s| s.holder_identity)
                && is_shard
                && !holder.is_empty()
            {
                *counts.entry(holder).or_default() += 1;
            }
        }
        let fair = 16 / replicas;
        if counts.len() == replicas
            && counts.values().sum::<usize>() == 16
            && counts.values().all(|c| (fair..=fair + 1).contains(c))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the replicas did not balance the shards within 60 s".into())
}
