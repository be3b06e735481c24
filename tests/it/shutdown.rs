//! A replica's shutdown: chains in flight finish within the grace period, those still running after
//! it release their claims, and so do discovery's own attempts begun before the CR cache synced.

use std::time::Duration;

use autoapproval_sim::Faults;
use chrono::Utc;
use kube_testserver::Match;

use crate::support::{
    Cluster, Db, eventually, on_both, owner_now, quick_leases, request_status, state_exists,
    test_settings,
};

/// After a shutdown: the chain of `id` finished, its request approved.
async fn assert_finished(db: &Db, id: i64) {
    assert_eq!(
        request_status(db, id).await,
        "APPROVED",
        "the chain finished"
    );
    assert!(!state_exists(db, id).await);
}

/// After a shutdown: the claim of `id` was released, due at once for the
/// next holder, and nothing was decided.
async fn assert_released(db: &Db, id: i64) {
    let state = db.database().state(id).await.unwrap().expect("state row");
    assert_eq!(
        state.status.as_str(),
        "RETRY_WAITING",
        "released, not left IN_PROGRESS"
    );
    assert!(
        state.next_retry_time.is_some_and(|due| due <= Utc::now()),
        "due again at once for the next holder: {state:?}"
    );
    assert_eq!(request_status(db, id).await, "PENDING");
}

on_both!(shutdown_finishes_chains_in_flight_within_the_grace_period);
async fn shutdown_finishes_chains_in_flight_within_the_grace_period(db: Db) {
    let mut settings = test_settings();
    settings.shutdown_grace = Duration::from_secs(10);
    let mut cluster = Cluster::with(db.clone(), settings).await;
    cluster
        .sim
        .set_faults(Faults {
            latency: Duration::from_millis(400),
            ..Faults::default()
        })
        .expect("faults");
    owner_now(107).insert(&db).await;
    eventually("the claim", || async {
        state_exists(&db, 107).await.then_some(())
    })
    .await;

    cluster.stop().await;
    assert_finished(&db, 107).await;
}

on_both!(shutdown_releases_claims_still_running_after_the_grace_period);
async fn shutdown_releases_claims_still_running_after_the_grace_period(db: Db) {
    let mut settings = test_settings();
    settings.shutdown_grace = Duration::from_millis(200);
    let mut cluster = Cluster::with(db.clone(), settings).await;
    cluster
        .sim
        .set_faults(Faults {
            latency: Duration::from_secs(20),
            ..Faults::default()
        })
        .expect("faults");
    owner_now(108).insert(&db).await;
    eventually("the claim", || async {
        state_exists(&db, 108).await.then_some(())
    })
    .await;

    cluster.stop().await;
    assert_released(&db, 108).await;
}

/// A replica restarted with every list of AutoApprovals failing (its cache
/// cannot sync), external calls taking `latency` and `grace` to shut down;
/// it holds every shard and hears NOTIFY, and request `id` has been
/// claimed by discovery's own attempt when this returns.
async fn claimed_before_the_cache_syncs(
    db: &Db,
    id: i64,
    latency: Duration,
    grace: Duration,
) -> Cluster {
    let mut settings = quick_leases();
    settings.shutdown_grace = grace;
    let mut cluster = Cluster::holding_every_shard(db.clone()).await;
    cluster.stop().await;
    cluster
        .server
        .faults()
        .fail_always(500, Match::any().verb("list").resource("autoapprovals"));
    cluster
        .sim
        .set_faults(Faults {
            latency,
            ..Faults::default()
        })
        .expect("faults");
    cluster.restart(settings);
    cluster.wait_every_shard().await;
    cluster.wait_listening().await;
    owner_now(id).insert(db).await;
    eventually("the claim", || async {
        state_exists(db, id).await.then_some(())
    })
    .await;
    cluster
}

on_both!(an_attempt_begun_before_the_cr_cache_syncs_finishes_within_the_grace_period);
/// Discovery's own attempts obey the shutdown as the Controller's do: one
/// in flight when the shutdown begins runs on through the grace period.
async fn an_attempt_begun_before_the_cr_cache_syncs_finishes_within_the_grace_period(db: Db) {
    let mut cluster = claimed_before_the_cache_syncs(
        &db,
        74,
        Duration::from_millis(400),
        Duration::from_secs(10),
    )
    .await;
    cluster.stop().await;
    assert_finished(&db, 74).await;
}

on_both!(an_attempt_begun_before_the_cr_cache_syncs_is_cut_off_when_the_grace_period_ends);
/// ... and one still running when the grace period ends is cut off before
/// the claims are released: its claim goes back due at once, and no chain
/// runs on past it.
async fn an_attempt_begun_before_the_cr_cache_syncs_is_cut_off_when_the_grace_period_ends(db: Db) {
    let mut cluster = claimed_before_the_cache_syncs(
        &db,
        75,
        Duration::from_secs(20),
        Duration::from_millis(200),
    )
    .await;
    cluster.stop().await;
    assert_released(&db, 75).await;
}
