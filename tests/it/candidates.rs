//! The thin candidate query against the seed's reference rows.

use autoapproval::controller::crd::Phase;
use autoapproval::db::ShardFilter;
use autoapproval::domain::{Candidate, DEFAULT_RETRY_LIMIT, RequestType};
use autoapproval::external::ContractStatus;
use chrono::{Duration, Utc};

use crate::support::{
    Cluster, Db, NewRequest, defaults, eventually, insert_state, metric_sum, on_both, request_view,
    seed_reference_rows, seed_reference_rows_at, t0, test_settings,
};

fn query(
    request_type: RequestType,
    shards: Option<ShardFilter>,
) -> autoapproval::db::CandidateQuery {
    defaults()
        .discovery
        .turn
        .query(request_type, t0(), DEFAULT_RETRY_LIMIT, shards)
}

on_both!(seed_rows_select_exactly_101_102_103_in_status_then_age_order);
async fn seed_rows_select_exactly_101_102_103_in_status_then_age_order(db: Db) {
    seed_reference_rows(&db).await;
    let store = db.database();
    let found = store
        .candidates(&query(RequestType::OwnerContract, None))
        .await
        .unwrap();
    let ids: Vec<i64> = found.iter().map(|c| c.request_id).collect();
    // ING sorts before PENDING; within PENDING the oldest sort_time first.
    assert_eq!(ids, [102, 103, 101]);
    assert_eq!(
        found[2],
        Candidate {
            request_id: 101,
            request_type: RequestType::OwnerContract,
            state_id: None
        }
    );
    assert!(found[0].state_id.is_some() && found[1].state_id.is_some());
}

on_both!(limit_window_and_type_bound_the_turn);
async fn limit_window_and_type_bound_the_turn(db: Db) {
    let now = t0();
    for id in 1..=25 {
        NewRequest::ready_owner(id)
            .sorted_at(now - Duration::minutes(100 - id))
            .insert(&db)
            .await;
    }
    // Outside the 30-day window, and another type: never selected.
    NewRequest::ready_owner(90)
        .sorted_at(now - Duration::days(31))
        .insert(&db)
        .await;
    let mut other = NewRequest::ready_owner(91);
    other.request_type = "MENU_CHANGE";
    other.insert(&db).await;
    let store = db.database();
    let found = store
        .candidates(&query(RequestType::OwnerContract, None))
        .await
        .unwrap();
    assert_eq!(
        found.iter().map(|c| c.request_id).collect::<Vec<_>>(),
        (1..=20).collect::<Vec<_>>()
    );
}

on_both!(ad_contracts_need_a_store_and_are_limited_to_ten);
async fn ad_contracts_need_a_store_and_are_limited_to_ten(db: Db) {
    for id in 1..=12 {
        NewRequest::ready_ad(id, 500 + id).insert(&db).await;
    }
    let mut storeless = NewRequest::ready_ad(13, 0);
    storeless.target_store_number = None;
    storeless
        .sorted_at(t0() - Duration::days(1))
        .insert(&db)
        .await;
    let store = db.database();
    let found = store
        .candidates(&query(RequestType::AdContract, None))
        .await
        .unwrap();
    assert_eq!(found.len(), 10);
    assert!(
        found
            .iter()
            .all(|c| c.request_type == RequestType::AdContract && c.request_id != 13)
    );
}

on_both!(shard_filter_selects_only_the_given_shards);
async fn shard_filter_selects_only_the_given_shards(db: Db) {
    for id in 1..=12 {
        NewRequest::ready_owner(id).insert(&db).await;
    }
    let store = db.database();
    let shards = ShardFilter {
        shard_count: 4,
        shards: vec![1, 3],
    };
    let found = store
        .candidates(&query(RequestType::OwnerContract, Some(shards)))
        .await
        .unwrap();
    let mut ids: Vec<i64> = found.iter().map(|c| c.request_id).collect();
    ids.sort();
    assert_eq!(ids, [1, 3, 5, 7, 9, 11]);
}

on_both!(new_requests_and_due_retries_merge_in_age_order_under_the_limit);
/// New requests and due retries interleaved in age order, more of each than
/// the limit: the turn takes the oldest twenty, whichever kind they are.
async fn new_requests_and_due_retries_merge_in_age_order_under_the_limit(db: Db) {
    let now = t0();
    for id in 1..=30 {
        NewRequest::ready_owner(id)
            .sorted_at(now - Duration::minutes(100 - id))
            .insert(&db)
            .await;
        if id % 2 == 0 {
            insert_state(
                &db,
                id,
                "RETRY_WAITING",
                Some(now - Duration::minutes(1)),
                1,
                now - Duration::minutes(11),
            )
            .await;
        }
    }
    // Waiting and not due, older than all of them: skipped, not blocking.
    for id in 40..=45 {
        NewRequest::ready_owner(id)
            .sorted_at(now - Duration::days(2))
            .insert(&db)
            .await;
        insert_state(
            &db,
            id,
            "RETRY_WAITING",
            Some(now + Duration::minutes(5)),
            1,
            now - Duration::minutes(5),
        )
        .await;
    }
    let store = db.database();
    let found = store
        .candidates(&query(RequestType::OwnerContract, None))
        .await
        .unwrap();
    assert_eq!(
        found.iter().map(|c| c.request_id).collect::<Vec<_>>(),
        (1..=20).collect::<Vec<_>>()
    );
    for c in &found {
        assert_eq!(c.state_id.is_some(), c.request_id % 2 == 0, "{c:?}");
    }
}

/// The plan benchmark must measure the statements the store sends.
#[test]
fn benchmark_script_prepares_the_store_queries_verbatim() {
    let script = include_str!("../../benches/candidate_plans.sql");
    for t in [RequestType::OwnerContract, RequestType::AdContract] {
        let sql = autoapproval::db::postgres::candidate_sql(t).unwrap();
        assert!(
            script.contains(sql),
            "benches/candidate_plans.sql lacks the {t:?} query"
        );
    }
}

on_both!(the_look_at_notified_requests_agrees_with_the_candidate_queries);
/// The one-statement look at notified requests selects, among them, exactly
/// what the two range queries select: the seed's reference rows 101–107 and
/// ad contracts with and without their store, other types, an old one.
async fn the_look_at_notified_requests_agrees_with_the_candidate_queries(db: Db) {
    seed_reference_rows(&db).await;
    NewRequest::ready_ad(110, 7).insert(&db).await;
    let mut without_store = NewRequest::ready_ad(111, 7);
    without_store.target_store_number = None;
    without_store.insert(&db).await;
    let mut other = NewRequest::ready_owner(112);
    other.request_type = "MENU_CHANGE";
    other.insert(&db).await;
    NewRequest::ready_owner(113)
        .sorted_at(t0() - Duration::days(31))
        .insert(&db)
        .await;
    let store = db.database();
    let mut ranged = Vec::new();
    for request_type in RequestType::AUTO_APPROVABLE {
        ranged.extend(store.candidates(&query(request_type, None)).await.unwrap());
    }
    ranged.sort_by_key(|c| c.request_id);
    let ids: Vec<i64> = (101..=113).collect();
    let mut among = store
        .candidates_among(&ids, &query(RequestType::OwnerContract, None))
        .await
        .unwrap();
    among.sort_by_key(|c| c.request_id);
    assert_eq!(among, ranged);
    let selected: Vec<i64> = among.iter().map(|c| c.request_id).collect();
    assert_eq!(selected, [101, 102, 103, 110]);
    assert!(
        store
            .candidates_among(&[104, 105], &query(RequestType::OwnerContract, None))
            .await
            .unwrap()
            .is_empty()
    );
}

on_both!(the_look_at_more_than_ten_thousand_requests_keeps_the_candidate_order);
/// Over more ids than one MySQL statement binds (10,000), the candidates
/// still come back as one list in status, then oldest `sort_time` order,
/// as PostgreSQL's one statement returns them: the turn takes its limit
/// from the front. Here the newest ids are the oldest requests, and one of
/// the last chunk's is ING, so the first chunk's order is not the list's.
async fn the_look_at_more_than_ten_thousand_requests_keeps_the_candidate_order(db: Db) {
    const N: i64 = 10_005;
    const ING: i64 = 10_002;
    // 1..=N from five cross-joined digits, in one statement; request n is
    // n seconds older than t0.
    let older = match db {
        Db::Postgres(_) => "$1 - make_interval(secs => n)",
        Db::Mysql(_) => "TIMESTAMPADD(SECOND, -n, $1)",
    };
    let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let inserted = db
        .exec_at(
            &format!(
                "INSERT INTO approval_request (id, request_type, status, sort_time)
                 SELECT n, 'OWNER_CONTRACT', CASE WHEN n = {ING} THEN 'ING' ELSE 'PENDING' END,
                        {older}
                   FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n
                           FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f) ns
                  WHERE n BETWEEN 1 AND {N}"
            ),
            t0(),
        )
        .await;
    assert_eq!(inserted, N as u64);
    let ids: Vec<i64> = (1..=N).collect();
    let found: Vec<i64> = db
        .database()
        .candidates_among(&ids, &query(RequestType::OwnerContract, None))
        .await
        .unwrap()
        .iter()
        .map(|c| c.request_id)
        .collect();
    let expected: Vec<i64> = std::iter::once(ING)
        .chain((1..=N).rev().filter(|id| *id != ING))
        .collect();
    assert_eq!(found.len(), expected.len());
    assert_eq!(found[..5], expected[..5], "the head of the list");
    assert!(found == expected, "the whole list in candidate order");
}

/// The MariaDB plan benchmark must measure the statements the MySQL store
/// sends: they are prepared from these strings, verbatim.
#[test]
fn the_mysql_benchmark_script_prepares_the_store_queries_verbatim() {
    use autoapproval::db::mysql::{candidate_sql, candidates_among_sql};
    let script = include_str!("../../benches/mysql_plans.sql");
    let statements = [
        candidate_sql(RequestType::OwnerContract, 4).unwrap(),
        candidate_sql(RequestType::AdContract, 0).unwrap(),
        candidates_among_sql(4),
    ];
    for sql in statements {
        assert!(
            script.contains(&format!("\"{sql}\"")),
            "benches/mysql_plans.sql lacks, as a double-quoted string:\n{sql}"
        );
    }
}

on_both!(fresh_candidates_are_the_new_above_the_cursor_and_the_due_and_agree_with_the_whole_query);
/// The fresh candidates: new requests above the cursor in id order and due
/// retries in due order, each under the limit and the shard filter; never a
/// waiting request, a paused one, an ad contract without its store, one
/// outside the window, in progress, or at the retry limit. Above the cursor
/// they are exactly what the whole query selects.
async fn fresh_candidates_are_the_new_above_the_cursor_and_the_due_and_agree_with_the_whole_query(
    db: Db,
) {
    let now = t0();
    // 1–10: new; 11–20: waiting, not due; 21–30: due (21 the latest due);
    // 31: in progress; 32: due but at the retry limit; 33: paused; 34:
    // outside the window; 35: an ad contract without its store; 36: an
    // ad contract with its store; 37: another type.
    for id in 1..=37 {
        let mut request = match id {
            35 | 36 => NewRequest::ready_ad(id, 7),
            _ => NewRequest::ready_owner(id),
        };
        if id == 35 {
            request.target_store_number = None;
        }
        if id == 37 {
            request.request_type = "MENU_CHANGE";
        }
        if id == 34 {
            request = request.sorted_at(now - Duration::days(31));
        }
        request.insert(&db).await;
        let (status, due, count) = match id {
            11..=20 => ("RETRY_WAITING", now + Duration::minutes(5), 1),
            21..=30 => ("RETRY_WAITING", now - Duration::minutes(id - 20), 1),
            31 => ("IN_PROGRESS", now, 0),
            32 => (
                "RETRY_WAITING",
                now - Duration::minutes(1),
                DEFAULT_RETRY_LIMIT,
            ),
            _ => continue,
        };
        insert_state(
            &db,
            id,
            status,
            Some(due),
            count,
            now - Duration::minutes(20),
        )
        .await;
    }
    db.exec("INSERT INTO auto_approve_pause (request_id, paused_by) VALUES (33, 'alice')")
        .await;
    let store = db.database();
    let ids = |found: &[Candidate]| found.iter().map(|c| c.request_id).collect::<Vec<_>>();

    let owner = query(RequestType::OwnerContract, None);
    let found = store.fresh_candidates(&owner, 0).await.unwrap();
    let new: Vec<i64> = (1..=10).collect();
    let due: Vec<i64> = (21..=30).rev().collect();
    assert_eq!(ids(&found), [new.clone(), due.clone()].concat());
    assert!(
        found
            .iter()
            .all(|c| c.state_id.is_some() == (c.request_id > 20))
    );
    // Above the cursor: only the new requests above it, the due ones all.
    let found = store.fresh_candidates(&owner, 6).await.unwrap();
    assert_eq!(ids(&found), [vec![7, 8, 9, 10], due.clone()].concat());
    // The whole query selects the same set (in its own order).
    let mut whole = ids(&store.candidates(&owner).await.unwrap());
    let mut fresh = ids(&store.fresh_candidates(&owner, 0).await.unwrap());
    whole.sort();
    fresh.sort();
    assert_eq!(fresh, whole);
    // The limit bounds each branch: twenty at most of each, in their order.
    let limited = autoapproval::db::CandidateQuery {
        limit: 3,
        ..owner.clone()
    };
    let found = store.fresh_candidates(&limited, 0).await.unwrap();
    assert_eq!(ids(&found), [1, 2, 3, 30, 29, 28]);
    // The shard filter applies to both.
    let shards = ShardFilter {
        shard_count: 4,
        shards: vec![1],
    };
    let found = store
        .fresh_candidates(&query(RequestType::OwnerContract, Some(shards)), 0)
        .await
        .unwrap();
    assert_eq!(ids(&found), [1, 5, 9, 29, 25, 21]);
    // Ad contracts: only the one with its store.
    let found = store
        .fresh_candidates(&query(RequestType::AdContract, None), 0)
        .await
        .unwrap();
    assert_eq!(ids(&found), [36]);
    assert_eq!(store.newest_request_id().await.unwrap(), 37);
}

on_both!(the_newest_request_id_of_an_empty_table_is_zero);
async fn the_newest_request_id_of_an_empty_table_is_zero(db: Db) {
    assert_eq!(db.database().newest_request_id().await.unwrap(), 0);
}

/// The turn benchmarks must measure the statements the stores send: the
/// whole owner query and the fresh one, verbatim, on both databases.
#[test]
fn the_turn_benchmark_scripts_prepare_the_store_queries_verbatim() {
    let pg = include_str!("../../benches/turn_plans.sql");
    let owner = autoapproval::db::postgres::candidate_sql(RequestType::OwnerContract).unwrap();
    for sql in [owner, autoapproval::db::postgres::fresh_candidates_sql()] {
        assert!(pg.contains(sql), "benches/turn_plans.sql lacks:\n{sql}");
    }
    use autoapproval::db::mysql::{candidate_sql, fresh_candidates_sql};
    let mysql = include_str!("../../benches/mysql_turn_plans.sql");
    for sql in [
        candidate_sql(RequestType::OwnerContract, 6).unwrap(),
        fresh_candidates_sql(RequestType::OwnerContract, 6).unwrap(),
    ] {
        assert!(
            mysql.contains(&format!("\"{sql}\"")),
            "benches/mysql_turn_plans.sql lacks, as a double-quoted string:\n{sql}"
        );
    }
}

on_both!(the_seed_rows_are_approved_in_the_documented_order_when_notified_at_once);
/// The three wait for their documents; one statement releases them all, so
/// all three are woken, notified and due at once.
async fn the_seed_rows_are_approved_in_the_documented_order_when_notified_at_once(db: Db) {
    seed_reference_rows_at(&db, Utc::now()).await;
    db.exec("UPDATE approval_request SET documents_released = false WHERE id IN (101, 102, 103)")
        .await;
    let mut cluster = one_per_turn(&db, true).await;
    waiting(&cluster).await;
    db.exec("UPDATE approval_request SET documents_released = true WHERE id IN (101, 102, 103)")
        .await;
    assert_approved_in_the_documented_order(&db).await;
    cluster.stop().await;
}

on_both!(the_seed_rows_are_approved_in_the_documented_order_when_due_polling_only);
/// The three wait for their e-contract's signature (the e-sign system's:
/// nothing in the database changes); then they fall due in another order
/// than the documented one, 101 first, then 103, then 102, all before the
/// next poll.
async fn the_seed_rows_are_approved_in_the_documented_order_when_due_polling_only(db: Db) {
    let mut cluster = one_per_turn(&db, false).await;
    for id in [101, 102, 103] {
        cluster
            .sim
            .set_contract_status(&format!("EC-{id}"), ContractStatus::Pending);
    }
    seed_reference_rows_at(&db, Utc::now()).await;
    waiting(&cluster).await;
    // A turn that finds nothing: the next ones read only what is fresh.
    let empty_turns = || {
        metric_sum(
            &cluster.metrics.encode(),
            "autoapproval_discovery_turn_candidates_bucket",
            &["le=\"0.0\""],
        )
    };
    let before = empty_turns();
    eventually("a discovery turn that finds nothing", || async {
        (empty_turns() > before).then_some(())
    })
    .await;
    for id in [101, 102, 103] {
        cluster
            .sim
            .set_contract_status(&format!("EC-{id}"), ContractStatus::Signed);
    }
    let seconds_ago = "CASE request_id WHEN 101 THEN 3 WHEN 103 THEN 2 ELSE 1 END";
    db.exec(&match db.name() {
        "postgres" => format!(
            "UPDATE auto_approve_state SET next_retry_time = now() - ({seconds_ago}) * interval '1 second'
              WHERE request_id IN (101, 102, 103)"
        ),
        _ => format!(
            "UPDATE auto_approve_state SET next_retry_time = UTC_TIMESTAMP(6) - INTERVAL ({seconds_ago}) SECOND
              WHERE request_id IN (101, 102, 103)"
        ),
    })
    .await;
    assert_approved_in_the_documented_order(&db).await;
    cluster.stop().await;
}

/// A replica under `--owner-limit 1 --concurrency 1`, polling every 500 ms.
async fn one_per_turn(db: &Db, notify: bool) -> Cluster {
    let mut settings = test_settings();
    settings.concurrency = 1;
    settings.discovery.turn.owner_limit = 1;
    settings.discovery.turn.concurrency = 1;
    settings.discovery.notify = notify;
    settings.discovery.poll_period = std::time::Duration::from_millis(500);
    Cluster::with(db.clone(), settings).await
}

/// Waits until 101–103 were attempted once and wait.
async fn waiting(cluster: &Cluster) {
    for id in [101, 102, 103] {
        cluster.wait_phase(id, Phase::RetryWaiting).await;
    }
}

/// Under `--owner-limit 1 --concurrency 1` a turn takes one request,
/// whichever path found it (the whole query, the fresh one's due retries,
/// a notification), so the seed's rows are served in the documented order,
/// by status then oldest `sort_time`: 102 (ING), then the PENDING ones
/// oldest first, 103 (two hours), 101 (one minute); 104 is claimed
/// elsewhere, 105 not due, 106 at the limit, 107 approved. The order shows
/// in the simulator's owner numbers, given one chain at a time.
async fn assert_approved_in_the_documented_order(db: &Db) {
    let approved = eventually("the due requests to be approved", || async {
        let mut approved = Vec::new();
        for id in [101, 102, 103] {
            let view = request_view(db, id).await;
            if view.status == "APPROVED" {
                approved.push((view.owner_number?, id));
            }
        }
        (approved.len() == 3).then_some(approved)
    })
    .await
    .expect("approved");
    let mut by_owner = approved;
    by_owner.sort();
    let order: Vec<i64> = by_owner.into_iter().map(|(_, id)| id).collect();
    assert_eq!(order, [102, 103, 101]);
    for id in [104, 105, 106] {
        assert_ne!(request_view(db, id).await.status, "APPROVED", "{id}");
    }
}
