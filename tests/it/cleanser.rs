//! The cleanser's three cases.

use std::sync::Arc;

use autoapproval::cleanser::Cleanser;
use autoapproval::clock::ManualClock;
use autoapproval::db::{ClaimOutcome, Database};
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

    let store = db.database();
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
                Database::postgres(pool.clone(), replica.clone()),
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
            let store = Database::mysql(pool.clone(), read.clone());
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
    let store = db.database();
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
    let store = db.database();

    let rows = store.request_statuses(&[1]).await.unwrap();

    let age = rows[0].unchanged_for.as_secs_f64();
    assert!((120.0..180.0).contains(&age), "decided {age} s ago");
}

/// More ids than one MySQL statement can bind: its protocol numbers a
/// statement's placeholders in 16 bits (65,535 at most).
const MANY: i64 = 70_000;

on_both!(lists_of_70_000_ids_are_read_released_woken_and_collected);
/// The garbage collector asks for the status of every cached CR, discovery
/// for the candidates among every notified request, and the sweep releases
/// every claim of a replica: on MySQL each bound one placeholder per id,
/// so from 65,536 on every such call failed whole (no finished CR was ever
/// collected again). Now a long list is sent in chunks; PostgreSQL binds
/// one array and never had the limit.
async fn lists_of_70_000_ids_are_read_released_woken_and_collected(db: Db) {
    let store = db.database();
    for id in 1..=3 {
        NewRequest::ready_owner(id).insert(&db).await;
    }
    // 70,000 claims of a replica that is gone, for requests that are not
    // (or no longer) there: ids 0..=99,999 from five digits, the first
    // 70,000 of them above 10.
    let digit = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                 UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let inserted = db
        .exec(&format!(
            "INSERT INTO auto_approve_state (request_id, request_type, status, holder, fencing_token)
             SELECT 10 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d,
                    'OWNER_CONTRACT', 'IN_PROGRESS', 'gone', 1
               FROM {digit} a, {digit} b, {digit} c, {digit} e, {digit} f
              WHERE a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d < {MANY}"
        ))
        .await;
    assert_eq!(inserted, MANY as u64);
    let ids: Vec<i64> = (1..=MANY).collect();

    let statuses = store.request_statuses(&ids).await.expect("statuses");
    assert_eq!(statuses.len(), 3);
    let query = crate::support::defaults().discovery.turn.query(
        autoapproval::domain::RequestType::OwnerContract,
        t0(),
        autoapproval::domain::DEFAULT_RETRY_LIMIT,
        None,
    );
    let among = store
        .candidates_among(&ids, &query)
        .await
        .expect("candidates among");
    assert_eq!(among.len(), 3);
    let woken = store.wake(&ids, Utc::now()).await.expect("wake");
    assert_eq!(
        woken.len() as i64,
        MANY - 9,
        "every running claim among them"
    );

    let released = store
        .release_all("gone", &[1], &[], Utc::now())
        .await
        .expect("release");
    assert_eq!(released.len() as i64, MANY);
    let report = store
        .cleanse(std::time::Duration::from_secs(3600), Utc::now())
        .await
        .expect("cleanse");
    assert_eq!(
        report.deleted as i64, MANY,
        "the rows of vanished requests go"
    );
    assert_eq!(state_count(&db).await, 0);
}
