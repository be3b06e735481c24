//! Fencing by the shard's generation: a replica that lost its shard can
//! neither claim nor write once the new owner has fenced the shard.

use std::sync::Arc;
use std::time::Duration;

use autoapproval::approval::{Approver, ApproverConfig, AttemptOutcome};
use autoapproval::clock::SystemClock;
use autoapproval::db::{ClaimOutcome, Completion, Database, StepResult};
use autoapproval::domain::{DEFAULT_RETRY_LIMIT, Fence};
use autoapproval::external::System;
use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::telemetry::Metrics;
use autoapproval_sim::Faults;
use chrono::Utc;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::support::eventually;
use crate::support::{
    AsDb, Db, NewRequest, candidate, complete_now, defaults, on_both, request_view, simulator,
    slow, t0,
};

const K: u32 = 4;

on_both!(a_superseded_shard_token_can_neither_claim_nor_write);
async fn a_superseded_shard_token_can_neither_claim_nor_write(db: Db) {
    // Requests 1, 5 and 9 are all in shard 1 of 4.
    NewRequest::ready_owner(1).insert(&db).await;
    NewRequest::ready_owner(5).insert(&db).await;
    NewRequest::ready_owner(9).insert(&db).await;
    let store = db.database();
    let a = Fence::sharded("a", 1, K);
    let b = Fence::sharded("b", 2, K);

    assert_eq!(
        store
            .claim(&candidate(1, None), &a, t0(), DEFAULT_RETRY_LIMIT)
            .await
            .unwrap(),
        ClaimOutcome::Lost,
        "no claim before the shard is fenced at the claimer's token"
    );
    assert_eq!(
        store.fence_shard(K, 1, 1, "a", t0()).await.unwrap(),
        Some(vec![])
    );
    let ClaimOutcome::Won(claim_a) = store
        .claim(&candidate(1, None), &a, t0(), DEFAULT_RETRY_LIMIT)
        .await
        .unwrap()
    else {
        panic!("a holds shard 1 at token 1");
    };

    // A person's manual path holds request 9 outside coordination (token 0).
    let manual = Fence::new("manual:ann", 0);
    let ClaimOutcome::Won(claim_manual) = store
        .claim(&candidate(9, None), &manual, t0(), DEFAULT_RETRY_LIMIT)
        .await
        .unwrap()
    else {
        panic!("the manual path claims");
    };

    // "b" acquires the shard: a's claim comes back, due at once, with a
    // memo; the manual claim is left alone.
    let recovered = store.fence_shard(K, 1, 2, "b", t0()).await.unwrap();
    assert_eq!(recovered, Some(vec![1]));
    assert!(store.heartbeat(&claim_manual, "OWNER").await.unwrap());
    assert_eq!(
        store.fence_shard(K, 1, 2, "a", t0()).await.unwrap(),
        None,
        "a token is raised only upwards"
    );
    assert_eq!(store.shard_token(K, 1).await.unwrap(), Some(2));

    // Everything "a" tries now is refused.
    assert!(!store.heartbeat(&claim_a, "OWNER").await.unwrap());
    assert!(
        !store
            .save_result(&claim_a, StepResult::OwnerNumber(77))
            .await
            .unwrap()
    );
    assert!(!store.release(&claim_a, t0()).await.unwrap());
    assert_eq!(complete_now(&store, &claim_a).await, Completion::Stale);
    assert_eq!(
        store
            .claim(&candidate(5, None), &a, t0(), DEFAULT_RETRY_LIMIT)
            .await
            .unwrap(),
        ClaimOutcome::Lost,
        "no new claim in the shard under the old token"
    );

    // "b" claims the recovered request and approves it.
    let state = store.state(1).await.unwrap().expect("state row");
    assert_eq!(
        state.last_reason.as_deref(),
        Some("recovered: shard 1 moved to b")
    );
    let ClaimOutcome::Won(claim_b) = store
        .claim(&candidate(1, Some(state.id)), &b, t0(), DEFAULT_RETRY_LIMIT)
        .await
        .unwrap()
    else {
        panic!("b claims the recovered request");
    };
    assert_eq!(complete_now(&store, &claim_b).await, Completion::Approved);
    assert_eq!(
        request_view(&db, 1).await.owner_number,
        None,
        "a's result was not saved"
    );
    let memos = store.memos(1).await.unwrap();
    assert!(
        memos.iter().any(|m| m.contains("interrupted on a")),
        "{memos:?}"
    );
}

/// One replica's approver over `pool`, calling `sim` over HTTP.
fn replica(
    sim: &autoapproval_sim::SimHandle,
    db: impl AsDb,
    metrics: Metrics,
    config: &ApproverConfig,
) -> Arc<Approver> {
    let external =
        HttpExternalSystems::build(&ExternalArgs::all_at(sim.base_url()).expect("defaults"))
            .expect("external clients");
    Arc::new(Approver::new(
        db.db().database(),
        external,
        Arc::new(SystemClock),
        metrics,
        config.clone(),
    ))
}

/// A pool whose connections name `app` in `application_name`, so the audit
/// trigger can tell the replicas' writes apart.
async fn pool_named(pool: &PgPool, app: &str) -> PgPool {
    let options = (*pool.connect_options()).clone().application_name(app);
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("named pool")
}

/// Records every row written to the request and state tables, by whom.
async fn install_audit(pool: &PgPool) {
    for sql in [
        "CREATE TABLE write_audit (seq BIGSERIAL PRIMARY KEY, app TEXT, tbl TEXT, op TEXT, holder TEXT)",
        "CREATE FUNCTION audit_write() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO write_audit (app, tbl, op, holder)
             VALUES (current_setting('application_name'), TG_TABLE_NAME, TG_OP,
                     (CASE WHEN TG_OP = 'DELETE' THEN to_jsonb(OLD) ELSE to_jsonb(NEW) END) ->> 'holder');
             RETURN NULL;
         END $$",
        "CREATE TRIGGER audit_state AFTER INSERT OR UPDATE OR DELETE ON auto_approve_state
         FOR EACH ROW EXECUTE FUNCTION audit_write()",
        "CREATE TRIGGER audit_request AFTER UPDATE ON approval_request
         FOR EACH ROW EXECUTE FUNCTION audit_write()",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .expect("audit");
    }
}

#[sqlx::test(migrations = false)]
async fn a_replica_that_lost_its_shard_mid_chain_writes_nothing_after_the_new_owner_claimed(
    pool: PgPool,
) {
    let pool = crate::support::migrated(pool).await;
    install_audit(&pool).await;
    NewRequest::ready_owner(1)
        .sorted_at(Utc::now())
        .insert(&pool)
        .await;
    // The owner service answers slowly: replica a is mid-chain when b takes over.
    let sim = simulator().await;
    sim.set_faults(slow(System::Owner, Duration::from_millis(1500)))
        .expect("faults");
    let config = ApproverConfig {
        heartbeat_interval: Duration::from_millis(200),
        ..defaults().approver
    };
    let replica_a = replica(
        &sim,
        pool_named(&pool, "replica-a").await,
        Metrics::new(),
        &config,
    );
    let replica_b = replica(
        &sim,
        pool_named(&pool, "replica-b").await,
        Metrics::new(),
        &config,
    );
    let store = Database::postgres(pool.clone(), pool.clone());
    store.fence_shard(K, 1, 1, "a", Utc::now()).await.unwrap();

    let a = tokio::spawn({
        let replica_a = replica_a.clone();
        async move {
            replica_a
                .attempt(&candidate(1, None), &Fence::sharded("a", 1, K))
                .await
        }
    });
    eventually("replica a to be calling the owner service", || async {
        (sim.stats().in_flight.owner > 0).then_some(())
    })
    .await;

    // b acquires the shard (the Lease expired, say) and fences it.
    let recovered = store.fence_shard(K, 1, 2, "b", Utc::now()).await.unwrap();
    assert_eq!(recovered, Some(vec![1]));
    let state = store.state(1).await.unwrap().expect("recovered row");
    sim.set_faults(Faults::default()).expect("faults");
    let b_outcome = replica_b
        .attempt(&candidate(1, Some(state.id)), &Fence::sharded("b", 2, K))
        .await
        .unwrap();
    assert_eq!(b_outcome, AttemptOutcome::Approved);
    let a_outcome = a.await.expect("joins").unwrap();
    assert_eq!(a_outcome, AttemptOutcome::FenceLost);

    let (b_claimed,): (i64,) = sqlx::query_as(
        "SELECT min(seq) FROM write_audit WHERE app = 'replica-b' AND tbl = 'auto_approve_state'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let late: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT seq, tbl, op FROM write_audit WHERE app = 'replica-a' AND seq > $1")
            .bind(b_claimed)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(late.is_empty(), "replica a wrote after b claimed: {late:?}");
    let (a_writes,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM write_audit WHERE app = 'replica-a'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(a_writes >= 1, "replica a's claim is in the audit");

    let view = request_view(&pool, 1).await;
    assert_eq!(view.status, "APPROVED");
    let created = sim.stats().for_request(1);
    assert_eq!((created.owner, created.store), (1, 1), "{created:?}");
    assert!(created.campaign <= 1, "{created:?}");
    // The instrument that sees two chains: a's owner call, which no shard
    // check stops here, was still being worked on when b's arrived.
    assert_eq!(sim.stats().overlapping_creations, 1);
    let (approvals,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM write_audit WHERE tbl = 'approval_request' AND app = 'replica-b'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(approvals >= 1);
}

on_both!(a_chain_whose_shard_is_lost_makes_no_further_external_call);
/// Replica a is waiting on the e-sign system when its shard is lost (its
/// renewal went overdue, say); b fences the shard and approves. a's chain
/// is cancelled at its next await point, so it makes no further external
/// call: before, its e-sign answer arrived, it synced the ledger and called
/// the owner service a second time, after b, until the fenced save stopped it.
async fn a_chain_whose_shard_is_lost_makes_no_further_external_call(db: Db) {
    NewRequest::ready_owner(1)
        .sorted_at(Utc::now())
        .insert(&db)
        .await;
    let sim = simulator().await;
    sim.set_faults(slow(System::ESign, Duration::from_millis(1500)))
        .expect("faults");
    let config = defaults().approver;
    let a_metrics = Metrics::new();
    let replica_a = replica(&sim, db.clone(), a_metrics.clone(), &config);
    let replica_b = replica(&sim, db.clone(), Metrics::new(), &config);
    let store = db.database();
    store.fence_shard(K, 1, 1, "a", Utc::now()).await.unwrap();
    let a_holds = Arc::new(std::sync::atomic::AtomicBool::new(true));

    let a = tokio::spawn({
        let (replica_a, a_holds) = (replica_a.clone(), a_holds.clone());
        async move {
            let held = move || a_holds.load(std::sync::atomic::Ordering::SeqCst);
            replica_a
                .attempt_since(&candidate(1, None), &Fence::sharded("a", 1, K), None, &held)
                .await
        }
    });
    eventually("replica a to be asking the e-sign system", || async {
        (sim.stats().in_flight.esign > 0).then_some(())
    })
    .await;

    a_holds.store(false, std::sync::atomic::Ordering::SeqCst);
    let recovered = store.fence_shard(K, 1, 2, "b", Utc::now()).await.unwrap();
    assert_eq!(recovered, Some(vec![1]));
    sim.set_faults(Faults::default()).expect("faults");
    let state = store.state(1).await.unwrap().expect("recovered row");
    let b_outcome = replica_b
        .attempt(&candidate(1, Some(state.id)), &Fence::sharded("b", 2, K))
        .await
        .unwrap();
    assert_eq!(b_outcome, AttemptOutcome::Approved);
    let a_outcome = a.await.expect("joins").unwrap();
    assert_eq!(a_outcome, AttemptOutcome::FenceLost);
    // a's e-sign answer would have come by now; let it, if it still ran.
    tokio::time::sleep(Duration::from_millis(1700)).await;

    let stats = sim.stats();
    assert_eq!(
        (
            stats.calls_to("POST /owners"),
            stats.calls_to("POST /stores")
        ),
        (1, 1),
        "only b called the owner and store services: {:?}",
        stats.calls
    );
    assert_eq!(request_view(&db, 1).await.status, "APPROVED");
    assert!(
        a_metrics
            .encode()
            .contains("autoapproval_chains_cancelled_total 1"),
        "{}",
        a_metrics.encode()
    );
}

on_both!(an_external_call_after_the_shard_is_lost_is_never_started);
/// The check before every external call: once the shard is seen lost, a
/// call is refused before its future is first polled, so nothing is sent,
/// however soon after the loss the chain gets there.
async fn an_external_call_after_the_shard_is_lost_is_never_started(db: Db) {
    let external = HttpExternalSystems::build(
        &ExternalArgs::all_at("http://127.0.0.1:9".to_owned()).expect("defaults"),
    )
    .expect("external clients");
    let store = db.database();
    let claim = autoapproval::domain::Claim {
        state_id: 1,
        request_id: 1,
        retry_count: 0,
        transient_streak: 0,
        fence: Fence::sharded("a", 1, K),
        nonce: 1,
        requested_at: None,
    };
    let lost = || false;
    let cx = autoapproval::processors::ChainContext {
        store: &store,
        external: &external,
        claim: &claim,
        clock: &SystemClock,
        metrics: &Metrics::new(),
        held: &lost,
        seen: &autoapproval::processors::Seen::default(),
        shadow: false,
    };
    let started = std::sync::atomic::AtomicBool::new(false);

    let result = cx
        .call(autoapproval::external::System::Owner, async {
            started.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .await;

    assert!(
        matches!(
            result,
            Err(autoapproval::processors::ChainError::ShardLost(1))
        ),
        "{result:?}"
    );
    assert!(
        !started.load(std::sync::atomic::Ordering::SeqCst),
        "never started"
    );
}
