//! Bad rows and answers are reported and parked; the rest of the turn proceeds.

use autoapproval::approval::{AttemptOutcome, attempt_all};
use autoapproval::clock::Clock;
use autoapproval::db::CandidateQuery;
use autoapproval::domain::{DEFAULT_RETRY_LIMIT, RequestType};
use autoapproval::retry::RetryClass;
use chrono::Duration;

use crate::support::{Db, Env, NewRequest, candidate, defaults, fence, on_both, request_view, t0};

on_both!(unknown_type_or_status_is_skipped_with_a_metric_and_the_turn_proceeds);
async fn unknown_type_or_status_is_skipped_with_a_metric_and_the_turn_proceeds(db: Db) {
    let env = Env::start(db.clone()).await;
    for id in 1..=4 {
        NewRequest::ready_owner(id)
            .sorted_at(t0() - Duration::minutes(10 - id))
            .insert(&db)
            .await;
    }
    let query = CandidateQuery {
        request_type: RequestType::OwnerContract,
        limit: 20,
        window_start: t0() - Duration::days(1),
        now: t0(),
        retry_limit: DEFAULT_RETRY_LIMIT,
        shards: None,
    };
    let candidates = env.store.candidates(&query).await.unwrap();
    assert_eq!(candidates.len(), 4);
    // Between the candidate query and the primary re-read, the business
    // system writes values this controller does not know.
    db.exec("UPDATE approval_request SET status = 'ON_HOLD' WHERE id = 2")
        .await;
    db.exec("UPDATE approval_request SET request_type = 'MYSTERY' WHERE id = 3")
        .await;

    let report = attempt_all(&env.approver, &candidates, &fence("a", 1), 4).await;

    let outcome = |id| {
        report
            .outcomes
            .iter()
            .find(|(r, _)| *r == id)
            .map(|(_, o)| o.clone())
            .unwrap()
    };
    assert_eq!(outcome(1), AttemptOutcome::Approved);
    assert_eq!(outcome(4), AttemptOutcome::Approved);
    for (id, column) in [(2, "status"), (3, "request_type")] {
        let AttemptOutcome::RetryScheduled { reason, .. } = outcome(id) else {
            panic!("{id}: {:?}", outcome(id))
        };
        assert!(reason.reason.contains(column), "{id}: {}", reason.reason);
        assert_eq!(env.metrics.malformed_rows(column), 1);
        assert!(
            env.store.state(id).await.unwrap().is_some(),
            "parked, not lost"
        );
    }
    assert_eq!(report.errors, 0);
    assert_eq!(request_view(&db, 2).await.status, "ON_HOLD");
    assert_eq!(env.sim.stats().created.owners, 2);
}

/// An answer the database refuses to store (a campaign id with a NUL byte)
/// fails the same way on every attempt: each failure counts as a transient
/// retry with backoff, so the limit ends it, instead of the claim being
/// released uncounted and the external call repeated every poll for ever.
// PostgreSQL only: the refusal is of a NUL in text, which MySQL and MariaDB store.
#[sqlx::test(migrations = false)]
async fn a_result_the_database_refuses_counts_as_a_retry_until_the_limit(pool: sqlx::PgPool) {
    let pool = crate::support::migrated(pool).await;
    let db = Db::Postgres(pool);
    const LIMIT: i32 = 3;
    let mut config = crate::support::defaults().approver;
    config.retry.limit = LIMIT;
    let env = Env::with_approver(db.clone(), config).await;
    env.sim.add_store(500, true);
    env.sim.set_campaign_prefix("cmp\u{0}");
    NewRequest::ready_ad(7, 500).insert(&db).await;

    let mut state_id = None;
    for attempt in 1..=LIMIT {
        let outcome = env
            .approver
            .attempt(&candidate(7, state_id), &fence("a", 1))
            .await
            .expect("the refusal is an outcome, not an error");
        let AttemptOutcome::RetryScheduled {
            reason,
            retry_count,
            next_retry_time,
            ..
        } = outcome
        else {
            panic!("attempt {attempt}: {outcome:?}");
        };
        assert_eq!(reason.class, RetryClass::Transient);
        assert!(reason.reason.contains("0x00"), "{}", reason.reason);
        assert_eq!(retry_count, attempt);
        assert!(next_retry_time > env.clock.now(), "backs off");
        state_id = env.store.state(7).await.unwrap().map(|s| s.id);
        env.clock.set(next_retry_time);
    }

    // At the limit the request is no longer a candidate: it stays, with its
    // reason, for a person.
    let query =
        defaults()
            .discovery
            .turn
            .query(RequestType::AdContract, env.clock.now(), LIMIT, None);
    assert!(env.store.candidates(&query).await.unwrap().is_empty());
    let state = env.store.state(7).await.unwrap().expect("state row stays");
    assert_eq!(
        (state.status.as_str(), state.retry_count),
        ("RETRY_WAITING", LIMIT)
    );
    assert!(
        state
            .last_reason
            .as_deref()
            .is_some_and(|r| r.contains("0x00")),
        "{state:?}"
    );
    let memos = env.store.memos(7).await.unwrap();
    assert_eq!(memos.len(), 1, "one memo for one reason: {memos:?}");
    assert!(
        memos[0].starts_with("auto-approval waits: store error:"),
        "{memos:?}"
    );
    assert_eq!(request_view(&db, 7).await.campaign_id, None);
    // One call per attempt, one creation (the retries replay its key).
    let stats = env.sim.stats();
    assert_eq!(
        stats.calls_to("POST /campaigns/approvals"),
        u64::from(LIMIT.unsigned_abs())
    );
    assert_eq!(stats.created.campaigns, 1);
}
