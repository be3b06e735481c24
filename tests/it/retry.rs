//! Retry scheduling per class, and the retry limit.

use autoapproval::approval::{AttemptOutcome, run_turn};
use autoapproval::clock::Clock;
use autoapproval::domain::DEFAULT_RETRY_LIMIT;
use autoapproval::external::System;
use autoapproval::retry::RetryClass;
use autoapproval_sim::{FaultKind, Faults};
use chrono::Duration;
use sqlx::PgPool;

use crate::support::{Env, NewRequest, candidate, defaults, fence, insert_state, t0};

#[sqlx::test]
async fn an_unmet_condition_waits_the_long_interval_and_leaves_a_memo(pool: PgPool) {
    let env = Env::start(pool.clone()).await;
    let mut r = NewRequest::ready_owner(1);
    r.documents_released = false;
    r.insert(&pool).await;
    let outcome = env
        .approver
        .attempt(&candidate(1, None), &fence("a", 1))
        .await
        .unwrap();
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
    assert_eq!(
        (next_retry_time, retry_count),
        (t0() + Duration::minutes(10), 1)
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
    let outcome = env
        .approver
        .attempt(&candidate(1, *state_id), &fence("a", 1))
        .await
        .unwrap();
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

#[sqlx::test]
async fn transient_failures_back_off_exponentially_and_an_unmet_condition_resets_the_streak(
    pool: PgPool,
) {
    let env = Env::start(pool.clone()).await;
    NewRequest::ready_owner(1).insert(&pool).await;
    env.sim
        .set_faults(Faults::fail_next(System::Owner, 2, FaultKind::Error))
        .unwrap();

    let mut state_id = None;
    expect_retry(&env, &mut state_id, RetryClass::Transient, 2, 1).await;
    expect_retry(&env, &mut state_id, RetryClass::Transient, 4, 2).await;
    // An unmet condition waits the long interval and ends the streak…
    sqlx::query("UPDATE approval_request SET documents_released = false WHERE id = 1")
        .execute(&pool)
        .await
        .unwrap();
    expect_retry(&env, &mut state_id, RetryClass::ConditionNotMet, 600, 3).await;
    // …so the next transient failure starts again at the base.
    sqlx::query("UPDATE approval_request SET documents_released = true WHERE id = 1")
        .execute(&pool)
        .await
        .unwrap();
    env.sim
        .set_faults(Faults::fail_next(System::Owner, 1, FaultKind::Error))
        .unwrap();
    expect_retry(&env, &mut state_id, RetryClass::Transient, 2, 4).await;
    // Then the owner service is healthy again and the request is approved.
    let outcome = env
        .approver
        .attempt(&candidate(1, state_id), &fence("a", 1))
        .await
        .unwrap();
    assert_eq!(outcome, AttemptOutcome::Approved);
}

#[sqlx::test]
async fn reaching_the_retry_limit_stops_selection(pool: PgPool) {
    let env = Env::start(pool.clone()).await;
    let mut r = NewRequest::ready_owner(1);
    r.operational_hold = true;
    r.insert(&pool).await;
    let state_id = insert_state(
        &pool,
        1,
        "RETRY_WAITING",
        Some(t0() - Duration::seconds(1)),
        DEFAULT_RETRY_LIMIT - 1,
        t0(),
    )
    .await;
    let outcome = env
        .approver
        .attempt(&candidate(1, Some(state_id)), &fence("a", 1))
        .await
        .unwrap();
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
