//! One chain per request, also within one replica: a second attempt of the
//! same process is refused while the first runs, and a claim given back and
//! taken again under the same holder and token is another claim (its nonce),
//! whose fence the older chain's writes no longer match.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use autoapproval::approval::{Approver, AttemptOutcome};
use autoapproval::clock::Clock;
use autoapproval::db::{ClaimOutcome, Completion, Database, RetryWrite, StepResult};
use autoapproval::domain::{Claim, DEFAULT_RETRY_LIMIT};
use autoapproval::external::System;
use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::telemetry::Metrics;
use autoapproval_sim::{Faults, SimSystem};

use crate::support::{
    Db, Env, NewRequest, candidate, complete_now, defaults, fence, on_both, slow, t0, wait_in_call,
};

/// Owner creations that take `latency`, every other call at once.
fn slow_owner(latency: StdDuration) -> Faults {
    slow(System::Owner, latency)
}

async fn claim(store: &Database, id: i64, state_id: Option<i64>) -> Claim {
    match store
        .claim(
            &candidate(id, state_id),
            &fence("r1", 7),
            t0(),
            DEFAULT_RETRY_LIMIT,
        )
        .await
        .unwrap()
    {
        ClaimOutcome::Won(claim) => claim,
        other => panic!("claim of {id}: {other:?}"),
    }
}

on_both!(
    a_second_attempt_of_the_replica_on_a_running_request_is_refused_and_leaves_the_first_alone
);
/// Discovery's attempt before the cache's sync and the Controller's
/// reconcile of the same CR: the second is refused before its claim, and
/// its end does not take the first out of the running set, so the sweep
/// does not give the first one's claim back from under it.
async fn a_second_attempt_of_the_replica_on_a_running_request_is_refused_and_leaves_the_first_alone(
    db: Db,
) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(1).insert(&db).await;
    env.sim
        .set_faults(slow_owner(StdDuration::from_secs(2)))
        .unwrap();
    let first = tokio::spawn({
        let approver = env.approver.clone();
        async move { approver.attempt(&candidate(1, None), &fence("r1", 7)).await }
    });
    wait_in_call(&env, SimSystem::Owner).await;

    let second = env
        .approver
        .attempt(&candidate(1, None), &fence("r1", 7))
        .await
        .unwrap();

    assert_eq!(second, AttemptOutcome::NotClaimed);
    assert_eq!(env.metrics.claims("already_running"), 1);
    let released = env.approver.release_idle("r1", &[7]).await.unwrap();
    assert!(
        released.is_empty(),
        "the first attempt still runs, its claim is not idle: {released:?}"
    );
    assert_eq!(first.await.unwrap().unwrap(), AttemptOutcome::Approved);
    assert_eq!(env.sim.stats().created.owners, 1);
}

on_both!(a_claim_given_back_and_taken_again_under_the_same_fence_refuses_the_first_claims_writes);
/// The same state row, holder and token, claimed twice: every write of the
/// first claim is refused by the second's nonce, and the second's go through.
async fn a_claim_given_back_and_taken_again_under_the_same_fence_refuses_the_first_claims_writes(
    db: Db,
) {
    NewRequest::ready_owner(1).insert(&db).await;
    let store = db.database();
    let old = claim(&store, 1, None).await;
    // The sweep gives it back (no attempt of ours runs on it, it believes).
    assert_eq!(store.release_all("r1", &[7], &[], t0()).await.unwrap(), [1]);
    let new = claim(&store, 1, Some(old.state_id)).await;
    assert_eq!(
        (new.state_id, &new.fence),
        (old.state_id, &old.fence),
        "the same row, holder and token"
    );

    let retry = RetryWrite {
        next_retry_time: t0(),
        transient: true,
        counted: true,
        reason: "stale",
        step: "owner",
    };
    assert!(!store.heartbeat(&old, "owner").await.unwrap());
    assert!(
        !store
            .save_result(&old, StepResult::OwnerNumber(99))
            .await
            .unwrap()
    );
    assert!(
        !store
            .save_result(&old, StepResult::StoreNumber(99))
            .await
            .unwrap()
    );
    assert!(
        !store
            .save_result(
                &old,
                StepResult::CampaignId {
                    key: "1:campaign:store-7",
                    campaign_id: "c-1"
                }
            )
            .await
            .unwrap()
    );
    assert_eq!(
        store.record_sent(&old, "1:owner", "{}").await.unwrap(),
        None
    );
    assert_eq!(
        store.schedule_retry(&old, &retry, t0()).await.unwrap(),
        None
    );
    assert!(!store.release(&old, t0()).await.unwrap());
    assert!(!store.drop_claim(&old).await.unwrap());
    assert_eq!(complete_now(&store, &old).await, Completion::Stale);
    let state = store.state(1).await.unwrap().unwrap();
    assert_eq!(
        (state.status.as_str(), state.retry_count),
        ("IN_PROGRESS", 0)
    );
    assert_eq!(
        crate::support::request_view(&db, 1).await.owner_number,
        None
    );

    assert!(store.heartbeat(&new, "owner").await.unwrap());
    assert!(
        store
            .save_result(&new, StepResult::OwnerNumber(42))
            .await
            .unwrap()
    );
    assert_eq!(complete_now(&store, &new).await, Completion::Approved);
}

on_both!(a_chain_whose_claim_was_swept_and_taken_again_by_its_replica_writes_nothing_more);
/// The race of issue 33 end to end: a chain is in its owner call when its
/// claim is given back (a sweep that did not see it) and the replica claims
/// the request again under the same holder and token. The old chain's save,
/// made while the new claim stands, is refused by the nonce and it stops;
/// the new chain approves.
async fn a_chain_whose_claim_was_swept_and_taken_again_by_its_replica_writes_nothing_more(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(1).insert(&db).await;
    env.sim
        .set_faults(slow_owner(StdDuration::from_secs(2)))
        .unwrap();
    // A second approver of the same replica (same store, clock and fence)
    // that knows nothing of the first's attempt: what the running set of
    // before let happen.
    let external =
        HttpExternalSystems::build(&ExternalArgs::all_at(env.sim.base_url()).unwrap()).unwrap();
    let other = Arc::new(Approver::new(
        env.store.clone(),
        external,
        Arc::new(env.clock.clone()),
        Metrics::new(),
        defaults().approver,
    ));
    let old = tokio::spawn({
        let approver = env.approver.clone();
        async move { approver.attempt(&candidate(1, None), &fence("r1", 7)).await }
    });
    wait_in_call(&env, SimSystem::Owner).await;
    // The new chain's owner call outlasts the old one's: the old chain's
    // save comes while the new claim stands.
    env.sim
        .set_faults(slow_owner(StdDuration::from_secs(4)))
        .unwrap();
    assert_eq!(other.release_idle("r1", &[7]).await.unwrap(), [1]);
    let state = env.store.state(1).await.unwrap().unwrap();
    assert_eq!(state.next_retry_time, Some(env.clock.now()));

    let new = other
        .attempt(&candidate(1, Some(state.id)), &fence("r1", 7))
        .await
        .unwrap();

    assert_eq!(old.await.unwrap().unwrap(), AttemptOutcome::FenceLost);
    assert_eq!(new, AttemptOutcome::Approved);
    let view = crate::support::request_view(&db, 1).await;
    assert_eq!(view.status, "APPROVED");
    let stats = env.sim.stats();
    assert_eq!(
        (stats.created.owners, stats.created.stores),
        (1, 1),
        "the old chain's owner was replayed by the new one, and it made no store"
    );
}
