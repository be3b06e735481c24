//! The seed's new design on MariaDB + Redis as the benchmark runs it
//! (`bench --database mysql`): a real MariaDB (throwaway-db), the real Redis
//! of REDIS_URL, the simulator. Two workers, each with a Redis connection of
//! its own, poll the same candidates at the same moment; the per-request
//! lock (`SET NX`) alone keeps their claims exclusive: a waiting request's
//! state row is taken by a plain UPDATE after the re-check, as the seed did.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use autoapproval::approval::TurnConfig;
use autoapproval::controller::config::ControllerConfig;
use autoapproval::db::Database;
use autoapproval::db::mysql;
use autoapproval::domain::RequestType;
use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::processors::Chain;
use autoapproval::telemetry::Metrics;
use autoapproval_lab::bench::report::duplicate_creations;
use autoapproval_lab::bench::seed_redis::{FailedClaims, RedisLocks, SeedWorker};
use autoapproval_lab::harness::{Harness, NewRequest};
use autoapproval_sim::{Faults, Idempotency, SimConfig, Simulator};
use throwaway_db::MariaDb;

const NEW: usize = 20;
const WAITING: usize = 40;

#[tokio::test]
async fn two_seed_new_workers_on_mariadb_and_redis_never_claim_one_request_twice() {
    let server = MariaDb::start().await.expect("MariaDB starts");
    server.create_database("lab").await.expect("database");
    let url = server.database_url("lab");
    let pool = mysql::pool(url.parse().expect("URL"), 20, None);
    let store = Database::mysql(pool.clone(), pool.clone());
    store.migrate(true).await.expect("migrated");
    let harness = Harness::mysql(pool.clone());
    harness.install_probes("root").await.expect("probes");
    // Downstreams that ignore idempotency keys, as the seed's: two chains
    // on one request make two owners, and overlap in the simulator.
    let sim = Simulator::start(
        ([127, 0, 0, 1], 0).into(),
        SimConfig {
            idempotency: Idempotency::Ignored,
            faults: Faults {
                latency: Duration::from_millis(20),
                ..Faults::default()
            },
            ..SimConfig::default()
        },
    )
    .await
    .expect("simulator");

    let request = NewRequest {
        request_type: RequestType::OwnerContract,
        business_name: "Shop".into(),
        documents_released: true,
        target_store_number: None,
    };
    for _ in 0..NEW + WAITING {
        harness.insert_request(&request).await.expect("seeded");
    }
    // The later ones wait a retry that is due: their state rows exist, so
    // no UNIQUE key stands between two workers, only the lock.
    sqlx::query(
        "INSERT INTO auto_approve_state
             (request_id, request_type, status, next_retry_time, retry_count, holder, fencing_token)
         SELECT id, request_type, 'RETRY_WAITING', UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, 1, 'earlier', 0
           FROM approval_request ORDER BY id DESC LIMIT ?",
    )
    .bind(WAITING as i64)
    .execute(&pool)
    .await
    .expect("waiting retries");

    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!(
        "aa-it-seed-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let defaults = ControllerConfig::defaults("", "seed").expect("defaults");
    let failed = Arc::new(FailedClaims::default());
    let mut workers = Vec::new();
    for i in 0..2 {
        workers.push(SeedWorker {
            store: store.clone(),
            writer: pool.clone(),
            external: HttpExternalSystems::build(
                &ExternalArgs::all_at(sim.base_url()).expect("external defaults"),
            )
            .expect("external systems"),
            metrics: Metrics::new(),
            locks: RedisLocks::connect(&redis, &prefix, Duration::from_secs(30))
                .await
                .expect("Redis at REDIS_URL (scripts/redis.sh starts one)"),
            failed: failed.clone(),
            holder: format!("seed-{i}"),
            turn: TurnConfig {
                concurrency: 8,
                ..defaults.discovery.turn.clone()
            },
            retry: defaults.approver.retry.clone(),
            chain: Chain::default(),
        });
    }

    // Both turn at once, again and again, as two replicas whose polls
    // coincide (the seed's worst case, which its random first delay only
    // makes rarer).
    for _ in 0..20 {
        let (a, b) = tokio::join!(workers[0].turn(), workers[1].turn());
        a.expect("turn");
        b.expect("turn");
        if harness.unfinished().await.expect("count") == 0 {
            break;
        }
    }

    let stats = sim.stats();
    assert_eq!(
        harness.unfinished().await.expect("count"),
        0,
        "every request approved"
    );
    assert_eq!(
        stats.overlapping_creations, 0,
        "two chains on one request at once"
    );
    assert_eq!(
        duplicate_creations(&stats),
        0,
        "a second owner or store for one request"
    );
    assert_eq!(
        stats.created.owners as usize,
        NEW + WAITING,
        "one owner per request"
    );
    let contended = failed.lock_contention.load(Ordering::Relaxed);
    let stale = failed.stale_candidate.load(Ordering::Relaxed);
    assert!(
        contended + stale > 0,
        "the two workers raced for the same candidates (lock contention {contended}, stale {stale})"
    );
    let _ = sim.shutdown().await;
}
