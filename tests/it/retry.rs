//! Retry scheduling per class, and the retry limit.

use autoapproval::approval::{AttemptOutcome, run_turn};
use autoapproval::clock::Clock;
use autoapproval::domain::DEFAULT_RETRY_LIMIT;
use autoapproval::external::System;
use autoapproval::retry::RetryClass;
use autoapproval_sim::{FaultKind, Faults};
use chrono::Duration;

use crate::support::{Db, Env, NewRequest, candidate, defaults, fence, insert_state, on_both, t0};

on_both!(an_unmet_condition_waits_the_long_interval_and_leaves_a_memo);
async fn an_unmet_condition_waits_the_long_interval_and_leaves_a_memo(db: Db) {
    let env = Env::start(db.clone()).await;
    let mut r = NewRequest::ready_owner(1);
    r.documents_released = false;
    r.insert(&db).await;
    let outcome = env.attempt(&candidate(1, None)).await;
    let AttemptOutcome::RetryScheduled {
        reason,
        next_retry_time,
        retry_count,
        ..
    } = outcome
    else {
        panic!("expected a retry, got {outcome:?}");
    };
    assert_eq!(reason.class, RetryClass::ConditionNotMet);
    assert_eq!(reason.reason, "documents not released");
    // A wait is not a failure: the limit's count stays at zero.
    assert_eq!(
        (next_retry_time, retry_count),
        (t0() + Duration::minutes(10), 0)
    );
    let state = env.store.state(1).await.unwrap().unwrap();
    assert_eq!(
        (state.status.as_str(), state.next_retry_time),
        ("RETRY_WAITING", Some(next_retry_time))
    );
    assert_eq!(
        env.store.memos(1).await.unwrap(),
        ["auto-approval waits: documents not released"]
    );
    // Nothing was created outside for a request that was not ready.
    assert_eq!(env.sim.stats().created.owners, 0);
}

/// Attempts request 1 and asserts a retry of `class` delayed by at most
/// `ceiling_secs` (and at least half of it), then moves the clock to it.
async fn expect_retry(
    env: &Env,
    state_id: &mut Option<i64>,
    class: RetryClass,
    ceiling_secs: i64,
    retry_count: i32,
) {
    let now = env.clock.now();
    let outcome = env.attempt(&candidate(1, *state_id)).await;
    let AttemptOutcome::RetryScheduled {
        reason,
        next_retry_time,
        retry_count: n,
        ..
    } = outcome
    else {
        panic!("attempt {retry_count}: expected a retry, got {outcome:?}");
    };
    assert_eq!(reason.class, class, "{}", reason.reason);
    let delay = next_retry_time - now;
    let ceiling = Duration::seconds(ceiling_secs);
    let floor = if class == RetryClass::Transient {
        ceiling / 2
    } else {
        ceiling
    };
    assert!(
        delay >= floor && delay <= ceiling,
        "attempt {retry_count}: delay {delay}"
    );
    assert_eq!(n, retry_count);
    *state_id = Some(env.store.state(1).await.unwrap().unwrap().id);
    env.clock.set(next_retry_time);
}

on_both!(transient_failures_back_off_exponentially_and_an_unmet_condition_resets_the_streak);
async fn transient_failures_back_off_exponentially_and_an_unmet_condition_resets_the_streak(
    db: Db,
) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(1).insert(&db).await;
    env.sim
        .set_faults(Faults::fail_next(System::Owner, 2, FaultKind::Error))
        .unwrap();

    let mut state_id = None;
    expect_retry(&env, &mut state_id, RetryClass::Transient, 2, 1).await;
    expect_retry(&env, &mut state_id, RetryClass::Transient, 4, 2).await;
    // An unmet condition waits the long interval, counts nothing towards
    // the limit, and ends the streak…
    db.exec("UPDATE approval_request SET documents_released = false WHERE id = 1")
        .await;
    expect_retry(&env, &mut state_id, RetryClass::ConditionNotMet, 600, 2).await;
    // …so the next transient failure starts again at the base.
    db.exec("UPDATE approval_request SET documents_released = true WHERE id = 1")
        .await;
    env.fail_next(System::Owner, FaultKind::Error);
    expect_retry(&env, &mut state_id, RetryClass::Transient, 2, 3).await;
    // Then the owner service is healthy again and the request is approved.
    let outcome = env.attempt(&candidate(1, state_id)).await;
    assert_eq!(outcome, AttemptOutcome::Approved);
}

on_both!(reaching_the_retry_limit_stops_selection);
async fn reaching_the_retry_limit_stops_selection(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(1).insert(&db).await;
    // The 300th failure: the owner service fails the call.
    env.fail_next(System::Owner, FaultKind::Error);
    let state_id = insert_state(
        &db,
        1,
        "RETRY_WAITING",
        Some(t0() - Duration::seconds(1)),
        DEFAULT_RETRY_LIMIT - 1,
        t0(),
    )
    .await;
    let outcome = env.attempt(&candidate(1, Some(state_id))).await;
    assert!(
        matches!(
            outcome,
            AttemptOutcome::RetryScheduled {
                retry_count: 300,
                ..
            }
        ),
        "{outcome:?}"
    );

    // Long after the retry time, the request is no longer a candidate.
    env.clock.set(t0() + Duration::hours(1));
    let report = run_turn(
        &env.approver,
        &defaults().discovery.turn,
        &fence("a", 1),
        None,
    )
    .await
    .unwrap();
    assert_eq!(report.candidates, 0);
    let state = env.store.state(1).await.unwrap().unwrap();
    assert_eq!(
        (state.status.as_str(), state.retry_count),
        ("RETRY_WAITING", 300)
    );
}

on_both!(a_documents_release_on_day_3_approves_a_request_that_waited_since_day_1);
/// A request whose documents wait from day 1 to day 3 is tried every ten
/// minutes, 432 times, more than the limit of 300: waits are not failures,
/// so it is never Exhausted, and the release on day 3 approves it.
async fn a_documents_release_on_day_3_approves_a_request_that_waited_since_day_1(db: Db) {
    let env = Env::start(db.clone()).await;
    let mut r = NewRequest::ready_owner(1);
    r.documents_released = false;
    r.insert(&db).await;
    let mut state_id = None;
    let mut waits = 0;
    while env.clock.now() < t0() + Duration::days(3) {
        let outcome = env.attempt(&candidate(1, state_id)).await;
        let AttemptOutcome::RetryScheduled {
            next_retry_time,
            retry_count,
            ..
        } = outcome
        else {
            panic!("wait {waits}: {outcome:?}");
        };
        assert_eq!(retry_count, 0, "a wait counts nothing");
        waits += 1;
        state_id = env.store.state(1).await.unwrap().map(|s| s.id);
        env.clock.set(next_retry_time);
    }
    assert!(waits > DEFAULT_RETRY_LIMIT, "{waits} waits");
    db.exec("UPDATE approval_request SET documents_released = true WHERE id = 1")
        .await;

    let outcome = env.attempt(&candidate(1, state_id)).await;
    assert_eq!(outcome, AttemptOutcome::Approved);
}

on_both!(a_fact_change_revives_an_exhausted_request);
/// Two failures exhaust a request at a limit of 2; then the business
/// changes one of its facts (a corrected e-contract). The change revives
/// it: its count starts again and it is due at once, and it is approved.
async fn a_fact_change_revives_an_exhausted_request(db: Db) {
    const LIMIT: i32 = 2;
    let mut config = defaults().approver;
    config.retry.limit = LIMIT;
    let env = crate::support::Env::with_approver(db.clone(), config).await;
    NewRequest::ready_owner(1).insert(&db).await;
    env.sim
        .set_faults(Faults::fail_next(System::Owner, 2, FaultKind::Error))
        .unwrap();
    let mut state_id = None;
    for _ in 0..LIMIT {
        let outcome = env.attempt(&candidate(1, state_id)).await;
        let AttemptOutcome::RetryScheduled {
            next_retry_time, ..
        } = outcome
        else {
            panic!("{outcome:?}");
        };
        state_id = env.store.state(1).await.unwrap().map(|s| s.id);
        env.clock.set(next_retry_time);
    }
    assert_eq!(
        env.attempt(&candidate(1, state_id)).await,
        AttemptOutcome::NotClaimed,
        "exhausted"
    );

    db.exec("UPDATE approval_request SET econtract_ref = 'EC-1-corrected' WHERE id = 1")
        .await;
    let woken = env
        .store
        .apply_wakes(None, env.clock.now(), LIMIT)
        .await
        .unwrap();
    assert_eq!(woken, [1], "the wake revives it");
    let state = env.store.state(1).await.unwrap().unwrap();
    assert_eq!(state.retry_count, 0);

    assert_eq!(
        env.attempt(&candidate(1, Some(state.id))).await,
        AttemptOutcome::Approved
    );
}
