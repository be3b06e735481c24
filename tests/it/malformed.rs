//! Bad rows are reported and parked; the rest of the turn proceeds.

use autoapproval::approval::{AttemptOutcome, attempt_all};
use autoapproval::domain::{DEFAULT_RETRY_LIMIT, RequestType};
use autoapproval::store::CandidateQuery;
use chrono::Duration;
use sqlx::PgPool;

use crate::support::{Env, NewRequest, fence, request_view, t0};

#[sqlx::test]
async fn unknown_type_or_status_is_skipped_with_a_metric_and_the_turn_proceeds(pool: PgPool) {
    let env = Env::start(pool.clone()).await;
    for id in 1..=4 {
        NewRequest::ready_owner(id)
            .sorted_at(t0() - Duration::minutes(10 - id))
            .insert(&pool)
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
    sqlx::query("UPDATE approval_request SET status = 'ON_HOLD' WHERE id = 2")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE approval_request SET request_type = 'MYSTERY' WHERE id = 3")
        .execute(&pool)
        .await
        .unwrap();

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
    assert_eq!(request_view(&pool, 2).await.status, "ON_HOLD");
    assert_eq!(env.sim.stats().created.owners, 2);
}
