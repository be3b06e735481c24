//! The cleanser's three cases.

use std::sync::Arc;

use autoapproval::cleanser::Cleanser;
use autoapproval::clock::ManualClock;
use autoapproval::store::mysql::MysqlStore;
use autoapproval::store::{ClaimOutcome, Store};
use autoapproval::telemetry::Metrics;
use chrono::{Duration, Utc};

use crate::support::{Db, NewRequest, candidate, fence, insert_state, on_both, state_count, t0};

on_both!(stuck_claims_recover_finished_rows_go_and_exhausted_rows_stay);
/// Stuck is judged in the database's clock, which stamps every claim and
/// heartbeat: the rows' times are set relative to it, and the cleanser's own
/// clock (the tests' t0, a day behind) only gives the recovered their due time.
async fn stuck_claims_recover_finished_rows_go_and_exhausted_rows_stay(db: Db) {
    let now = t0();
    let db_now = Utc::now();
    // Stuck: IN_PROGRESS, untouched for 20 minutes.
    NewRequest::ready_owner(1).insert(&db).await;
    insert_state(
        &db,
        1,
        "IN_PROGRESS",
        None,
        2,
        db_now - Duration::minutes(20),
    )
    .await;
    // Alive: IN_PROGRESS, heartbeat a minute ago.
    NewRequest::ready_owner(2).insert(&db).await;
    insert_state(
        &db,
        2,
        "IN_PROGRESS",
        None,
        0,
        db_now - Duration::minutes(1),
    )
    .await;
    // Finished by a person, and vanished altogether.
    NewRequest::ready_owner(3)
        .status("APPROVED")
        .insert(&db)
        .await;
    insert_state(
        &db,
        3,
        "RETRY_WAITING",
        Some(now),
        4,
        now - Duration::hours(1),
    )
    .await;
    NewRequest::ready_owner(4).insert(&db).await;
    insert_state(&db, 4, "RETRY_WAITING", Some(now), 1, now).await;
    db.exec("DELETE FROM approval_request WHERE id = 4").await;
    // At the retry limit, still open.
    NewRequest::ready_owner(5).insert(&db).await;
    insert_state(
        &db,
        5,
        "RETRY_WAITING",
        Some(now - Duration::days(1)),
        300,
        now - Duration::days(1),
    )
    .await;

    let store = db.store();
    let metrics = Metrics::new();
    let cleanser = Cleanser::new(
        store.clone(),
        Arc::new(ManualClock::new(now)),
        metrics.clone(),
        std::time::Duration::from_secs(600),
    );
    let report = cleanser.run_once().await.unwrap();

    assert_eq!(report.recovered, [1]);
    assert_eq!(report.deleted, 2);
    let stuck = store.state(1).await.unwrap().unwrap();
    assert_eq!(
        (
            stuck.status.as_str(),
            stuck.next_retry_time,
            stuck.retry_count
        ),
        ("RETRY_WAITING", Some(now), 3)
    );
    assert_eq!(
        store.memos(1).await.unwrap(),
        ["auto-approval was interrupted on elsewhere; retrying"]
    );
    assert_eq!(
        store.state(2).await.unwrap().unwrap().status.as_str(),
        "IN_PROGRESS"
    );
    assert!(store.state(3).await.unwrap().is_none() && store.state(4).await.unwrap().is_none());
    let exhausted = store.state(5).await.unwrap().unwrap();
    assert_eq!(
        (exhausted.status.as_str(), exhausted.retry_count),
        ("RETRY_WAITING", 300)
    );
    assert_eq!(state_count(&db).await, 3);
    assert!(
        metrics
            .encode()
            .contains("autoapproval_cleanser_recovered_total 1")
    );
}

on_both!(the_garbage_collectors_statuses_come_from_the_primary_not_a_lagging_replica);
/// The CR garbage collector deletes the CR of a request it cannot find, so
/// it must look where every request already is: on the primary, not on a
/// read replica that has not caught up with the newest rows.
async fn the_garbage_collectors_statuses_come_from_the_primary_not_a_lagging_replica(db: Db) {
    NewRequest::ready_owner(1).insert(&db).await;
    // A "replica" that lags: the same tables, without the new row.
    let mut lagging_scratch = None;
    let (store, lagging) = match &db {
        Db::Postgres(pool) => {
            db.exec("CREATE SCHEMA lagging").await;
            db.exec("CREATE TABLE lagging.approval_request (LIKE public.approval_request)")
                .await;
            let options = (*pool.connect_options())
                .clone()
                .options([("search_path", "lagging")]);
            let replica = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await
                .unwrap();
            (
                Store::new(pool.clone(), replica.clone()),
                Db::Postgres(replica),
            )
        }
        Db::Mysql(pool) => {
            // A second scratch database, migrated and empty.
            let scratch = crate::support::MysqlScratch::create().await;
            let replica = scratch.db();
            let Db::Mysql(read) = &replica else {
                unreachable!("a MySQL scratch database")
            };
            let store = Store::mysql(MysqlStore::new(pool.clone(), read.clone()));
            lagging_scratch = Some(scratch);
            (store, replica)
        }
    };
    assert_eq!(
        lagging
            .fetch_i64("SELECT count(*) FROM approval_request")
            .await,
        0,
        "the replica lags"
    );

    let rows = store.request_statuses(&[1]).await.unwrap();

    assert_eq!(rows.len(), 1, "request 1 exists on the primary");
    assert_eq!(rows[0].request_id, 1);
    assert!(matches!(rows[0].status, Ok(ref s) if s.is_open()));
    if let Some(scratch) = lagging_scratch {
        scratch.finish().await;
    }
}

on_both!(a_cleanser_whose_clock_runs_ahead_takes_no_live_claim_for_a_stuck_one);
/// A replica whose clock runs an hour ahead of the others runs the
/// cleanser: a claim made and heartbeat a moment ago is alive in the
/// database's clock, and stays with its holder.
async fn a_cleanser_whose_clock_runs_ahead_takes_no_live_claim_for_a_stuck_one(db: Db) {
    NewRequest::ready_owner(1).insert(&db).await;
    let store = db.store();
    let ClaimOutcome::Won(claim) = store
        .claim(&candidate(1, None), &fence("a", 1), Utc::now(), 300)
        .await
        .unwrap()
    else {
        panic!("the claim wins");
    };
    assert!(store.heartbeat(&claim, "owner").await.unwrap());
    let ahead = Utc::now() + Duration::hours(1);
    let cleanser = Cleanser::new(
        store.clone(),
        Arc::new(ManualClock::new(ahead)),
        Metrics::new(),
        std::time::Duration::from_secs(600),
    );

    let report = cleanser.run_once().await.unwrap();

    assert_eq!(report.recovered, Vec::<i64>::new(), "the live claim stays");
    let state = store.state(1).await.unwrap().unwrap();
    assert_eq!(
        (state.status.as_str(), state.holder.as_str()),
        ("IN_PROGRESS", "a")
    );
}

on_both!(the_garbage_collector_ages_a_decision_in_the_database_clock);
/// The garbage collector ages a finished request in the database's clock,
/// which wrote its decision time, not in the replica's, which may disagree.
async fn the_garbage_collector_ages_a_decision_in_the_database_clock(db: Db) {
    NewRequest::ready_owner(1).insert(&db).await;
    // SQL-standard interval syntax, which both backends read.
    db.exec(
        "UPDATE approval_request
            SET status = 'APPROVED', decided_by = 'a person', decided_at = now() - INTERVAL '2' MINUTE
          WHERE id = 1",
    )
    .await;
    let store = db.store();

    let rows = store.request_statuses(&[1]).await.unwrap();

    let age = rows[0].unchanged_for.as_secs_f64();
    assert!((120.0..180.0).contains(&age), "decided {age} s ago");
}
