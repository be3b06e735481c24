//! Claims: exactly one winner, and fenced writes that refuse stale holders.

use autoapproval::db::{ClaimOutcome, Completion, Database, StepResult};
use autoapproval::domain::{Candidate, DEFAULT_RETRY_LIMIT, RequestType};
use chrono::Duration;
use sqlx::PgPool;

use crate::support::{
    Db, NewRequest, candidate, claim_new, complete_now, fence, insert_state, on_both, request_view,
    t0, with_pool,
};

on_both!(two_concurrent_claimers_of_a_new_request_one_wins);
async fn two_concurrent_claimers_of_a_new_request_one_wins(db: Db) {
    NewRequest::ready_owner(1).insert(&db).await;
    let store = db.database();
    let (fa, fb) = (fence("a", 1), fence("b", 1));
    let c = candidate(1, None);
    let (a, b) = tokio::join!(
        store.claim(&c, &fa, t0(), DEFAULT_RETRY_LIMIT),
        store.claim(&c, &fb, t0(), DEFAULT_RETRY_LIMIT)
    );
    let outcomes = [a.unwrap(), b.unwrap()];
    let winners = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Won(_)))
        .count();
    assert_eq!(winners, 1, "{outcomes:?}");
    let state = store.state(1).await.unwrap().unwrap();
    assert_eq!(state.status.as_str(), "IN_PROGRESS");
}

on_both!(many_concurrent_claimers_of_a_due_retry_one_wins);
async fn many_concurrent_claimers_of_a_due_retry_one_wins(db: Db) {
    NewRequest::ready_owner(1).insert(&db).await;
    let state_id = insert_state(
        &db,
        1,
        "RETRY_WAITING",
        Some(t0() - Duration::seconds(1)),
        3,
        t0(),
    )
    .await;
    let store = db.database();
    let c = Candidate {
        state_id: Some(state_id),
        ..candidate(1, None)
    };
    let fences: Vec<_> = (0..8).map(|i| fence(&format!("w{i}"), 1)).collect();
    let results = futures::future::join_all(
        fences
            .iter()
            .map(|f| store.claim(&c, f, t0(), DEFAULT_RETRY_LIMIT)),
    )
    .await;
    let winners: Vec<_> = results
        .into_iter()
        .filter_map(|r| match r.unwrap() {
            ClaimOutcome::Won(claim) => Some(claim),
            _ => None,
        })
        .collect();
    assert_eq!(winners.len(), 1);
    assert_eq!(winners[0].retry_count, 3);
    assert_eq!(
        store.state(1).await.unwrap().unwrap().holder,
        winners[0].fence.holder
    );
}

on_both!(a_retry_not_yet_due_or_at_the_limit_cannot_be_claimed);
async fn a_retry_not_yet_due_or_at_the_limit_cannot_be_claimed(db: Db) {
    NewRequest::ready_owner(1).insert(&db).await;
    NewRequest::ready_owner(2).insert(&db).await;
    let early = insert_state(
        &db,
        1,
        "RETRY_WAITING",
        Some(t0() + Duration::minutes(4)),
        1,
        t0(),
    )
    .await;
    let spent = insert_state(
        &db,
        2,
        "RETRY_WAITING",
        Some(t0() - Duration::minutes(1)),
        300,
        t0(),
    )
    .await;
    let store = db.database();
    for (id, state_id) in [(1, early), (2, spent)] {
        let c = Candidate {
            state_id: Some(state_id),
            ..candidate(id, None)
        };
        assert_eq!(
            store
                .claim(&c, &fence("a", 1), t0(), DEFAULT_RETRY_LIMIT)
                .await
                .unwrap(),
            ClaimOutcome::Lost
        );
    }
}

on_both!(a_completion_with_a_stale_fencing_token_changes_nothing_and_says_so);
async fn a_completion_with_a_stale_fencing_token_changes_nothing_and_says_so(db: Db) {
    NewRequest::ready_owner(1).insert(&db).await;
    let store = db.database();
    let ClaimOutcome::Won(old) = store
        .claim(
            &candidate(1, None),
            &fence("a", 1),
            t0(),
            DEFAULT_RETRY_LIMIT,
        )
        .await
        .unwrap()
    else {
        panic!("first claim must win");
    };
    // The cleanser gives the claim back and another worker takes it with a newer token.
    store
        .cleanse(std::time::Duration::ZERO, t0() + Duration::minutes(1))
        .await
        .unwrap();
    let state = store.state(1).await.unwrap().unwrap();
    let retry = Candidate {
        state_id: Some(state.id),
        ..candidate(1, None)
    };
    let later = t0() + Duration::minutes(2);
    let ClaimOutcome::Won(new) = store
        .claim(&retry, &fence("b", 2), later, DEFAULT_RETRY_LIMIT)
        .await
        .unwrap()
    else {
        panic!("the recovered request must be claimable");
    };

    assert_eq!(complete_now(&store, &old).await, Completion::Stale);
    assert!(
        !store
            .save_result(&old, StepResult::OwnerNumber(99))
            .await
            .unwrap()
    );
    assert!(!store.heartbeat(&old, "owner").await.unwrap());
    assert!(!store.release(&old, later).await.unwrap());
    assert_eq!(request_view(&db, 1).await.status, "PENDING");
    assert_eq!(request_view(&db, 1).await.owner_number, None);
    assert_eq!(store.state(1).await.unwrap().unwrap().holder, "b");

    assert_eq!(complete_now(&store, &new).await, Completion::Approved);
    assert_eq!(request_view(&db, 1).await.status, "APPROVED");
    assert!(store.state(1).await.unwrap().is_none());
}

on_both!(release_makes_the_request_due_again_without_counting_a_retry);
async fn release_makes_the_request_due_again_without_counting_a_retry(db: Db) {
    NewRequest::ready_owner(1).insert(&db).await;
    let store = db.database();
    let ClaimOutcome::Won(claim) = store
        .claim(
            &candidate(1, None),
            &fence("a", 1),
            t0(),
            DEFAULT_RETRY_LIMIT,
        )
        .await
        .unwrap()
    else {
        panic!("claim must win");
    };
    assert!(store.release(&claim, t0()).await.unwrap());
    let state = store.state(1).await.unwrap().unwrap();
    assert_eq!(
        (
            state.status.as_str(),
            state.retry_count,
            state.next_retry_time
        ),
        ("RETRY_WAITING", 0, Some(t0()))
    );
}

on_both!(a_change_notified_mid_chain_makes_the_scheduled_retry_due_at_once);
async fn a_change_notified_mid_chain_makes_the_scheduled_retry_due_at_once(db: Db) {
    use autoapproval::db::RetryWrite;

    let store = db.database();
    NewRequest::ready_owner(31).insert(&db).await;
    NewRequest::ready_owner(32).insert(&db).await;
    let mut claims = Vec::new();
    for id in [31, 32] {
        let candidate = Candidate {
            request_id: id,
            request_type: RequestType::OwnerContract,
            state_id: None,
        };
        match store
            .claim(&candidate, &fence("w1", 1), t0(), DEFAULT_RETRY_LIMIT)
            .await
            .unwrap()
        {
            ClaimOutcome::Won(claim) => claims.push(claim),
            other => panic!("claim {id}: {other:?}"),
        }
    }
    // Request 31 changes while its chain runs; 32 does not.
    assert_eq!(store.wake(&[31], t0()).await.unwrap(), [31]);
    let later = t0() + Duration::minutes(10);
    let write = RetryWrite {
        counted: true,
        next_retry_time: later,
        transient: false,
        reason: "documents not released",
        step: "owner",
    };
    let now = t0() + Duration::seconds(1);
    let woken = store.schedule_retry(&claims[0], &write, now).await.unwrap();
    let quiet = store.schedule_retry(&claims[1], &write, now).await.unwrap();
    assert_eq!(
        woken,
        Some((1, now)),
        "due at once: the chain may have read the old fact"
    );
    assert_eq!(quiet, Some((1, later)), "the long interval");
}

#[sqlx::test(migrations = false)]
async fn the_chains_own_econtract_sync_wakes_only_the_other_requests_on_that_contract(
    pool: PgPool,
) {
    let pool = crate::support::migrated(pool).await;
    use autoapproval::db::RequestChange;

    let store = Database::postgres(pool.clone(), pool.clone());
    for id in [41, 42, 43] {
        let mut request = NewRequest::ready_owner(id);
        if id != 43 {
            request.econtract_ref = Some("EC-shared".into());
        }
        request.insert(&pool).await;
    }
    let mut changes = store.request_changes().await.unwrap();
    let mut next = async || {
        tokio::time::timeout(std::time::Duration::from_secs(30), changes.next())
            .await
            .expect("a notification")
            .unwrap()
    };

    // The chain of 41 syncs the ledger; request 43 then changes as a marker.
    store
        .sync_econtract(41, "EC-shared", "SIGNED", t0())
        .await
        .unwrap();
    sqlx::query("UPDATE approval_request SET documents_released = false WHERE id = 43")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(next().await, RequestChange::Changed(42));
    assert_eq!(
        next().await,
        RequestChange::Changed(43),
        "no wake-up for 41, whose own chain wrote the ledger"
    );

    // A ledger write by anyone else wakes every request on the contract.
    sqlx::query("UPDATE econtract SET status = 'CANCELED' WHERE contract_ref = 'EC-shared'")
        .execute(&pool)
        .await
        .unwrap();
    let mut woken = vec![next().await, next().await];
    woken.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(
        woken,
        [RequestChange::Changed(41), RequestChange::Changed(42)]
    );
}

on_both!(our_own_approval_notifies_nobody_and_a_persons_decision_does);
/// Our own approval notifies nobody (PostgreSQL 0015, MySQL's update
/// trigger): the replica that wrote it knows, and a wake cost the shard's
/// holder a discovery turn and a reconcile of a finished request. A
/// person's decision still wakes.
async fn our_own_approval_notifies_nobody_and_a_persons_decision_does(db: Db) {
    use autoapproval::db::{Completion, RequestChange};

    let store = db.database();
    for id in [61, 62] {
        NewRequest::ready_owner(id).insert(&db).await;
    }
    let mut changes = store.request_changes().await.unwrap();
    let claim = claim_new(&store, 61, "w1").await;
    assert_eq!(complete_now(&store, &claim).await, Completion::Approved);
    // A person approves 62: delivered in commit order, after anything of 61's.
    db.exec(
        "UPDATE approval_request SET status = 'APPROVED', decided_by = 'manual:ann' WHERE id = 62",
    )
    .await;
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), changes.next())
        .await
        .expect("a notification")
        .unwrap();
    assert_eq!(
        first,
        RequestChange::Changed(62),
        "nothing for our own approval of 61"
    );
}

on_both!(a_fact_change_wakes_its_request_in_the_same_transaction_without_a_listener);
/// The change's own transaction records the wake (PostgreSQL 0010, MySQL
/// 0003: a row appended, nothing of ours locked), with no listener at all: the next
/// discovery turn makes a waiting retry due at once, a running chain's retry
/// is scheduled due at once, and a change to a column no filter reads wakes
/// nothing.
async fn a_fact_change_wakes_its_request_in_the_same_transaction_without_a_listener(db: Db) {
    use autoapproval::db::RetryWrite;
    use chrono::SubsecRound;

    let store = db.database();
    // Microseconds, as both databases keep them.
    let now = chrono::Utc::now().trunc_subsecs(6);
    let later = now + Duration::minutes(10);
    let write = RetryWrite {
        counted: true,
        next_retry_time: later,
        transient: false,
        reason: "documents not released",
        step: "owner",
    };
    let mut claims = Vec::new();
    for id in [51, 52, 53] {
        NewRequest::ready_owner(id).insert(&db).await;
        match store
            .claim(
                &candidate(id, None),
                &fence("w1", 1),
                now,
                DEFAULT_RETRY_LIMIT,
            )
            .await
            .unwrap()
        {
            ClaimOutcome::Won(claim) => claims.push(claim),
            other => panic!("claim {id}: {other:?}"),
        }
    }
    for claim in &claims[..2] {
        assert_eq!(
            store.schedule_retry(claim, &write, now).await.unwrap(),
            Some((1, later))
        );
    }
    let due = async |id: i64| -> bool {
        let sql = db.sql(&format!(
            "SELECT count(*) FROM auto_approve_state WHERE request_id = {id} AND next_retry_time <= $1"
        ));
        let count: i64 = with_pool!(&db, pool => sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
            .bind(chrono::Utc::now())
            .fetch_one(pool)
            .await
            .unwrap());
        count == 1
    };

    // 51 waits and a fact changes; 52 waits and a result column changes;
    // 53 is running when a fact changes.
    for sql in [
        "UPDATE approval_request SET documents_released = false WHERE id = 51",
        "UPDATE approval_request SET owner_number = 7 WHERE id = 52",
        "UPDATE approval_request SET menu_registered = false WHERE id = 53",
    ] {
        db.exec(sql).await;
    }
    // Both record every change of an open request (PostgreSQL 0020); on
    // MySQL a new request's row is for discovery only (0003).
    let recorded = db
        .fetch_ids(match db {
            Db::Postgres(_) => "SELECT request_id FROM auto_approve_wake ORDER BY request_id",
            Db::Mysql(_) => {
                "SELECT request_id FROM auto_approve_wake WHERE NOT new_request ORDER BY request_id"
            }
        })
        .await;
    assert_eq!(recorded, [51, 53], "recorded in the changing transaction");
    assert!(!due(51).await, "the business side touched no row of ours");
    assert_eq!(
        store
            .apply_wakes(None, chrono::Utc::now(), DEFAULT_RETRY_LIMIT)
            .await
            .unwrap(),
        [51],
        "the turn makes the waiting request due; the running one keeps its row"
    );
    assert!(due(51).await, "a waiting request is due at once");
    assert!(!due(52).await, "no fact changed: it keeps its interval");
    let scheduled = store
        .schedule_retry(&claims[2], &write, now + Duration::seconds(1))
        .await
        .unwrap();
    assert_eq!(
        scheduled,
        Some((1, now + Duration::seconds(1))),
        "the running chain may have read the old fact: due at once"
    );
}

on_both!(the_listener_takes_no_connection_from_the_chains_pool);
/// The LISTEN connection (the wake poller's on MySQL) is held for good: it
/// has a pool of its own, so it never takes one of the connections the
/// chains were given. Here the chains' pool has one connection, and it
/// stays free while the listener runs.
async fn the_listener_takes_no_connection_from_the_chains_pool(db: Db) {
    let store = match &db {
        Db::Postgres(pool) => {
            let chains = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(std::time::Duration::from_secs(2))
                .connect_with((*pool.connect_options()).clone())
                .await
                .unwrap();
            Database::postgres(chains.clone(), chains)
        }
        Db::Mysql(pool) => {
            let chains = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(std::time::Duration::from_secs(2))
                .connect_with((*pool.connect_options()).clone())
                .await
                .unwrap();
            Database::mysql(chains.clone(), chains)
        }
    };
    let _listening = store.request_changes().await.expect("listening");
    // The poller's first read happens at once; give it a moment to run.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    store
        .ping()
        .await
        .expect("the chains' only connection is still free");
    let dedicated = store.dedicated(1);
    dedicated
        .ping()
        .await
        .expect("a dedicated store reaches the same primary");
}

on_both!(the_sweep_gives_back_a_claim_no_chain_works_on_and_only_that);
/// A claim of ours with no attempt working on it (its outcome and then its
/// release failed: the database went away under the chain) is given back by
/// the sweep, due at once; a claim whose chain is still running is not.
async fn the_sweep_gives_back_a_claim_no_chain_works_on_and_only_that(db: Db) {
    use autoapproval::approval::AttemptOutcome;
    use autoapproval::clock::Clock;
    use autoapproval_sim::Faults;

    let env = crate::support::Env::start(db.clone()).await;
    NewRequest::ready_owner(1).insert(&db).await;
    NewRequest::ready_owner(2).insert(&db).await;
    let mine = fence("r1", 7);
    // 1: claimed, and its chain is gone.
    let orphan = env
        .store
        .claim(
            &candidate(1, None),
            &mine,
            env.clock.now(),
            DEFAULT_RETRY_LIMIT,
        )
        .await
        .unwrap();
    assert!(matches!(orphan, ClaimOutcome::Won(_)));
    // 2: its chain runs, slowed down by the owner system.
    env.sim
        .set_faults(Faults {
            latency: std::time::Duration::from_secs(2),
            ..Faults::default()
        })
        .unwrap();
    let approver = env.approver.clone();
    let running = tokio::spawn({
        let mine = mine.clone();
        async move { approver.attempt(&candidate(2, None), &mine).await }
    });
    crate::support::eventually("request 2 to be claimed", || async {
        env.store.state(2).await.unwrap().map(|_| ())
    })
    .await;

    let released = env.approver.release_idle("r1", &[7]).await.unwrap();

    assert_eq!(released, [1]);
    let state = env.store.state(1).await.unwrap().unwrap();
    assert_eq!(
        (
            state.status.as_str(),
            state.next_retry_time,
            state.retry_count
        ),
        ("RETRY_WAITING", Some(env.clock.now()), 0)
    );
    assert_eq!(
        env.store.state(2).await.unwrap().unwrap().status.as_str(),
        "IN_PROGRESS",
        "a running chain keeps its claim"
    );
    // Another holder's or another generation's claims are not ours to give.
    assert!(
        env.approver
            .release_idle("r2", &[7])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(running.await.unwrap().unwrap(), AttemptOutcome::Approved);
}

on_both!(a_signed_econtract_is_never_synced_back_to_pending);
/// A stale answer of the e-sign system never takes a signature back: the
/// ledger stays SIGNED when a sync says PENDING, and a voided contract may
/// still become REJECTED.
async fn a_signed_econtract_is_never_synced_back_to_pending(db: Db) {
    NewRequest::ready_owner(1).insert(&db).await;
    let store = db.database();
    store
        .sync_econtract(1, "EC-1", "SIGNED", t0())
        .await
        .unwrap();

    store
        .sync_econtract(1, "EC-1", "PENDING", t0())
        .await
        .unwrap();
    assert_eq!(
        store.econtract_status("EC-1").await.unwrap().as_deref(),
        Some("SIGNED")
    );

    store
        .sync_econtract(1, "EC-1", "REJECTED", t0())
        .await
        .unwrap();
    assert_eq!(
        store.econtract_status("EC-1").await.unwrap().as_deref(),
        Some("REJECTED")
    );
}

on_both!(a_paused_request_is_neither_a_candidate_nor_claimed);
/// A request paused in the database is claimed by no replica, new or due,
/// and is no candidate, whatever a CR says; resumed, it is claimed again.
async fn a_paused_request_is_neither_a_candidate_nor_claimed(db: Db) {
    use autoapproval::db::CandidateQuery;

    NewRequest::ready_owner(1).insert(&db).await;
    NewRequest::ready_owner(2).insert(&db).await;
    let due = insert_state(
        &db,
        2,
        "RETRY_WAITING",
        Some(t0() - Duration::seconds(1)),
        0,
        t0(),
    )
    .await;
    let store = db.database();
    store
        .pause(1, "AutoApproval request-1", Some("uid-1"))
        .await
        .unwrap();
    store
        .pause(2, "AutoApproval request-2", Some("uid-2"))
        .await
        .unwrap();
    let query = CandidateQuery {
        request_type: RequestType::OwnerContract,
        limit: 10,
        window_start: t0() - Duration::days(30),
        now: t0(),
        retry_limit: DEFAULT_RETRY_LIMIT,
        shards: None,
    };
    assert_eq!(store.candidates(&query).await.unwrap(), []);
    let retry = Candidate {
        state_id: Some(due),
        ..candidate(2, None)
    };
    for c in [candidate(1, None), retry] {
        assert_eq!(
            store
                .claim(&c, &fence("a", 1), t0(), DEFAULT_RETRY_LIMIT)
                .await
                .unwrap(),
            ClaimOutcome::Lost,
            "request {}",
            c.request_id
        );
    }
    assert!(
        !store.resume(1, Some("another CR")).await.unwrap(),
        "only the CR that paused it resumes it"
    );
    assert!(store.resume(1, Some("uid-1")).await.unwrap());
    assert!(matches!(
        store
            .claim(
                &candidate(1, None),
                &fence("a", 1),
                t0(),
                DEFAULT_RETRY_LIMIT
            )
            .await
            .unwrap(),
        ClaimOutcome::Won(_)
    ));
    assert_eq!(
        store.candidates(&query).await.unwrap().len(),
        0,
        "1 is claimed, 2 still paused"
    );
}

on_both!(a_request_and_its_state_are_read_in_one_statement_as_two_reads_gave_them);
/// The reconcile's one read before a claim gives what the two reads it
/// replaced gave: the request, its state row or none, nothing for an
/// unknown request, and a malformed request row reported as such.
async fn a_request_and_its_state_are_read_in_one_statement_as_two_reads_gave_them(db: Db) {
    let store = db.database();
    for id in [71, 72, 73] {
        NewRequest::ready_owner(id).insert(&db).await;
    }
    let retry_at = t0() + Duration::minutes(10);
    insert_state(&db, 72, "RETRY_WAITING", Some(retry_at), 4, t0()).await;
    for id in [71, 72] {
        let (request, state) = store
            .request_with_state(id)
            .await
            .unwrap()
            .expect("the request exists");
        assert_eq!(Some(request), store.request(id).await.unwrap(), "{id}");
        assert_eq!(state, store.state(id).await.unwrap(), "{id}");
    }
    let (_, state) = store.request_with_state(72).await.unwrap().unwrap();
    let state = state.expect("72 has a state row");
    assert_eq!(
        (state.retry_count, state.next_retry_time),
        (4, Some(retry_at))
    );
    assert!(store.request_with_state(99).await.unwrap().is_none());
    db.exec("UPDATE approval_request SET status = 'SOMETHING' WHERE id = 73")
        .await;
    assert!(matches!(
        store.request_with_state(73).await,
        Err(autoapproval::db::DbError::Malformed { request_id: 73, .. })
    ));
}

on_both!(a_completion_after_a_persons_decision_keeps_it_and_drops_the_claim);
/// A person decides while our chain runs: the completion approves nothing,
/// keeps the person's decision and still removes our state row; a new
/// request's claim carries the request's creation time (its pickup).
async fn a_completion_after_a_persons_decision_keeps_it_and_drops_the_claim(db: Db) {
    NewRequest::ready_owner(7).insert(&db).await;
    let store = db.database();
    let ClaimOutcome::Won(claim) = store
        .claim(
            &candidate(7, None),
            &fence("a", 1),
            t0(),
            DEFAULT_RETRY_LIMIT,
        )
        .await
        .unwrap()
    else {
        panic!("a new request is claimed");
    };
    assert!(claim.requested_at.is_some(), "{claim:?}");
    db.exec(
        "UPDATE approval_request SET status = 'REJECTED', decided_by = 'manual:ann' WHERE id = 7",
    )
    .await;
    assert_eq!(
        complete_now(&store, &claim).await,
        Completion::RequestClosed
    );
    assert_eq!(request_view(&db, 7).await.status, "REJECTED");
    assert!(store.state(7).await.unwrap().is_none(), "the claim is gone");
}

/// Our result writes wake nobody whatever the binding watches: with the
/// request trigger attached to every column (`autoapproval_watch_requests`
/// without a column list), a saved owner number appends no wake row and
/// notifies nobody, while a business write of any column does both.
#[sqlx::test(migrations = false)]
async fn our_result_writes_wake_nobody_even_when_every_column_is_watched(pool: PgPool) {
    use autoapproval::db::RequestChange;

    let pool = crate::support::migrated(pool).await;
    sqlx::query("SELECT autoapproval_watch_requests('approval_request', 'id')")
        .execute(&pool)
        .await
        .unwrap();
    let store = Database::postgres(pool.clone(), pool.clone());
    for id in [71, 72] {
        NewRequest::ready_owner(id).insert(&pool).await;
    }
    let mut changes = store.request_changes().await.unwrap();
    let claim = claim_new(&store, 71, "w1").await;
    assert!(
        store
            .save_result(&claim, StepResult::OwnerNumber(7_100))
            .await
            .unwrap()
    );
    // A business write of a column no filter reads: watched now, so it wakes.
    sqlx::query("UPDATE approval_request SET business_name = 'renamed' WHERE id = 72")
        .execute(&pool)
        .await
        .unwrap();
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), changes.next())
        .await
        .expect("a notification")
        .unwrap();
    assert_eq!(
        first,
        RequestChange::Changed(72),
        "nothing for our write to 71"
    );
    let woken: Vec<i64> = sqlx::query_scalar("SELECT request_id FROM auto_approve_wake ORDER BY 1")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(woken, [72], "no wake row for our own write");
}

#[sqlx::test(migrations = false)]
/// The completion is one statement: its snapshot is taken before it locks
/// the request row, and its wake rows are read under that snapshot (issue
/// 41, 9a), so a business change committed in between wrote a wake row the
/// statement cannot see. A function in the view (this test's only) holds
/// the completion there, after its snapshot and before the row lock, until
/// the business has committed a change of a fact; the completion compares
/// the row it then locks, the change's newest version, and approves nothing.
async fn a_business_commit_between_the_completions_snapshot_and_its_row_lock_is_seen(pool: PgPool) {
    use autoapproval::domain::Facts;
    use sqlx::Connection;

    let pool = crate::support::migrated(pool).await;
    let store = Database::postgres(pool.clone(), pool.clone());
    NewRequest::ready_owner(81).insert(&pool).await;
    let claim = claim_new(&store, 81, "w1").await;
    let facts = Facts::of(&store.request(81).await.unwrap().unwrap());
    // The scan evaluates the view's WHERE before the row above it is
    // locked: the completion's (its text names the `approved` step) waits
    // there for an advisory lock the test holds.
    sqlx::raw_sql(
        "CREATE FUNCTION hold_the_completion() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
         BEGIN
             IF current_query() LIKE '%approved AS (%' THEN
                 PERFORM pg_advisory_lock(4141);
                 PERFORM pg_advisory_unlock(4141);
             END IF;
             RETURN true;
         END $$;
         CREATE OR REPLACE VIEW autoapproval_request AS
         SELECT id, request_type, status, sort_time, created_at, updated_at, business_name,
                documents_released, operational_hold, menu_registered, logo_registered,
                previous_step_approved, econtract_ref, target_store_number,
                owner_number, store_number, campaign_id, decided_at, decided_by
           FROM approval_request WHERE hold_the_completion();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut gate = sqlx::PgConnection::connect_with(&pool.connect_options())
        .await
        .unwrap();
    sqlx::query("SELECT pg_advisory_lock(4141)")
        .execute(&mut gate)
        .await
        .unwrap();

    let completion = tokio::spawn({
        let store = store.clone();
        async move { store.complete(&claim, &facts).await }
    });
    crate::support::eventually("the completion held before its row lock", || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        (waiting > 0).then_some(())
    })
    .await;
    sqlx::query("UPDATE approval_request SET documents_released = false WHERE id = 81")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("SELECT pg_advisory_unlock(4141)")
        .execute(&mut gate)
        .await
        .unwrap();

    assert_eq!(completion.await.unwrap().unwrap(), Completion::Woken);
    assert_eq!(request_view(&pool, 81).await.status, "PENDING");
    let woken: Vec<i64> = sqlx::query_scalar("SELECT request_id FROM auto_approve_wake")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        woken,
        [81],
        "the change's wake row, committed after the statement's snapshot"
    );
}
