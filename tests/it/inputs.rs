//! What a creation and an approval are made from, when the request changes
//! under an attempt: the body sent under a key is the recorded one until its
//! result is saved, a saved campaign counts only for the store it was made
//! for, and a fact changed while the attempt ran is read before approving.

use std::time::Duration as StdDuration;

use autoapproval::approval::{AttemptOutcome, WOKEN_BEFORE_COMPLETION};
use autoapproval::clock::Clock;
use autoapproval::db::SessionArgs;
use autoapproval::domain::{Candidate, RequestType};
use autoapproval::external::System;
use autoapproval_sim::SimSystem;

use crate::support::{
    Db, Env, NewRequest, attempt_due_retry, candidate, fence, metric_sum, on_both, request_view,
    slow, wait_in_call,
};

fn metric(env: &Env, name: &str, labels: &[&str]) -> f64 {
    metric_sum(&env.metrics.encode(), name, labels)
}

on_both!(a_rename_between_a_lost_save_and_its_retry_resends_the_recorded_body_under_the_key);
/// The business renames a request in a transaction that holds its row while
/// our first attempt creates the owner: the save of the owner number fails
/// on the held row. The retry, after the rename, replays the key with the
/// body first sent (the old name), which a strict downstream accepts; the
/// new name would have been refused (422) as another body under the key.
async fn a_rename_between_a_lost_save_and_its_retry_resends_the_recorded_body_under_the_key(
    db: Db,
) {
    let session = SessionArgs {
        db_lock_timeout: StdDuration::ZERO,
        db_statement_timeout: StdDuration::from_secs(30),
    };
    let env = Env::with_session(db.clone(), &session).await;
    env.sim.set_strict_keys(true);
    NewRequest::ready_owner(1).insert(&db).await;
    let business = db
        .business_transaction("UPDATE approval_request SET business_name = 'Renamed' WHERE id = 1")
        .await;

    let first = env.attempt(&candidate(1, None)).await;
    assert!(
        matches!(&first, AttemptOutcome::RetryScheduled { reason, .. }
            if reason.reason.contains("the row is locked by another transaction")),
        "{first:?}"
    );
    assert_eq!(
        env.sim.stats().created.owners,
        1,
        "made, its number unsaved"
    );
    business.commit().await;

    let retry = attempt_due_retry(&env, 1, RequestType::OwnerContract).await;

    assert_eq!(retry, AttemptOutcome::Approved);
    let stats = env.sim.stats();
    assert_eq!(stats.key_conflicts, 0, "no key reused with another body");
    assert_eq!(stats.faults_injected.refused, 0);
    assert_eq!((stats.created.owners, stats.created.stores), (1, 1));
    assert_eq!(stats.idempotent_replays, 1, "the owner replayed");
    assert_eq!(
        metric(&env, "autoapproval_recorded_bodies_resent_total", &[]),
        1.0
    );
    assert_eq!(request_view(&db, 1).await.status, "APPROVED");
}

on_both!(a_store_changed_after_the_campaign_was_saved_gets_a_campaign_of_its_own);
/// The campaign is approved for store 700 and saved; the business moves the
/// target to store 701 meanwhile, so the completion is refused. The retry
/// finds a campaign id saved, but not made under store 701's key: it is not
/// taken, a campaign for 701 is approved (under its own key) and saved.
async fn a_store_changed_after_the_campaign_was_saved_gets_a_campaign_of_its_own(db: Db) {
    let env = Env::start(db.clone()).await;
    env.sim.add_store(700, true);
    env.sim.add_store(701, true);
    NewRequest::ready_ad(31, 700).insert(&db).await;
    env.sim
        .set_faults(slow(System::Ad, StdDuration::from_secs(1)))
        .unwrap();
    let ad = Candidate {
        request_id: 31,
        request_type: RequestType::AdContract,
        state_id: None,
    };
    let first = tokio::spawn({
        let approver = env.approver.clone();
        async move { approver.attempt(&ad, &fence("a", 1)).await }
    });
    wait_in_call(&env, SimSystem::Ad).await;
    db.exec("UPDATE approval_request SET target_store_number = 701 WHERE id = 31")
        .await;
    let first = first.await.unwrap().unwrap();
    assert!(
        matches!(&first, AttemptOutcome::RetryScheduled { reason, .. }
            if reason.reason == WOKEN_BEFORE_COMPLETION),
        "{first:?}"
    );
    let saved = request_view(&db, 31).await.campaign_id;
    assert!(saved.is_some(), "the campaign of store 700 was saved");

    let retry = attempt_due_retry(&env, 31, RequestType::AdContract).await;

    assert_eq!(retry, AttemptOutcome::Approved);
    let stats = env.sim.stats();
    assert_eq!(stats.for_request(31).campaign, 2, "one campaign per store");
    assert_eq!(stats.key_conflicts, 0);
    let view = request_view(&db, 31).await;
    assert_ne!(view.campaign_id, saved, "store 701's campaign, not 700's");
    assert_eq!(
        metric(
            &env,
            "autoapproval_results_redone_total",
            &["system=\"ad\""]
        ),
        1.0
    );
}

on_both!(a_hold_set_while_the_last_step_runs_is_not_approved);
/// Operations puts the request on hold while its last step (the store) is
/// being created: the gate was read before the hold, so the completion,
/// seeing the wake the hold recorded, approves nothing; the request is due
/// at once, and its next attempt stops at the hold.
async fn a_hold_set_while_the_last_step_runs_is_not_approved(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(61).insert(&db).await;
    env.sim
        .set_faults(slow(System::Store, StdDuration::from_secs(1)))
        .unwrap();
    let first = tokio::spawn({
        let approver = env.approver.clone();
        async move { approver.attempt(&candidate(61, None), &fence("a", 1)).await }
    });
    wait_in_call(&env, SimSystem::Store).await;
    db.exec("UPDATE approval_request SET operational_hold = true WHERE id = 61")
        .await;

    let first = first.await.unwrap().unwrap();

    let AttemptOutcome::RetryScheduled {
        reason,
        next_retry_time,
        ..
    } = &first
    else {
        panic!("{first:?}");
    };
    assert_eq!(reason.reason, WOKEN_BEFORE_COMPLETION);
    assert_eq!(*next_retry_time, env.clock.now(), "due at once");
    assert_eq!(request_view(&db, 61).await.status, "PENDING");
    let retry = attempt_due_retry(&env, 61, RequestType::OwnerContract).await;
    assert!(
        matches!(&retry, AttemptOutcome::RetryScheduled { reason, .. }
            if reason.reason.contains("operational hold")),
        "{retry:?}"
    );
    assert_eq!(request_view(&db, 61).await.status, "PENDING");
}

on_both!(a_name_the_owner_service_refused_is_sent_again_corrected_under_a_new_key);
/// The owner service refuses the business name (422, nothing created); the
/// business corrects it. The refusal ended the key, so the due retry sends
/// the corrected name under the next key and the request is approved with
/// one owner. Before, every retry resent the refused body under the same
/// key until the retry limit; a strict downstream, which keeps a refused
/// key refused, also refuses a corrected body under it.
async fn a_name_the_owner_service_refused_is_sent_again_corrected_under_a_new_key(db: Db) {
    let env = Env::start(db.clone()).await;
    env.sim.set_strict_keys(true);
    env.sim.set_refused_names(&["Shop 1"]);
    NewRequest::ready_owner(1).insert(&db).await;

    let first = env.attempt(&candidate(1, None)).await;

    assert!(
        matches!(&first, AttemptOutcome::RetryScheduled { reason, .. }
            if reason.reason.contains("422")),
        "{first:?}"
    );
    assert_eq!(env.sim.stats().names_refused, 1);
    assert_eq!(env.sim.stats().created.owners, 0, "nothing created");
    db.exec("UPDATE approval_request SET business_name = 'Shop One' WHERE id = 1")
        .await;

    let retry = attempt_due_retry(&env, 1, RequestType::OwnerContract).await;

    assert_eq!(retry, AttemptOutcome::Approved);
    let stats = env.sim.stats();
    assert_eq!(
        stats.names_refused, 1,
        "the refused body was not sent again"
    );
    assert_eq!(stats.key_conflicts, 0, "no key reused with another body");
    assert_eq!((stats.created.owners, stats.created.stores), (1, 1));
    assert_eq!(stats.for_request(1).owner, 1);
    assert_eq!(request_view(&db, 1).await.status, "APPROVED");
}

on_both!(a_lost_answer_after_a_refusal_keeps_the_new_key_and_its_body);
/// After a refused body, the next body's answer is lost (a timeout after
/// the owner was made): the retry after that sends the same body under the
/// same (second) key, and gets the owner made, not a second one, even
/// though the name changed again meanwhile.
async fn a_lost_answer_after_a_refusal_keeps_the_new_key_and_its_body(db: Db) {
    let env = Env::start(db.clone()).await;
    env.sim.set_strict_keys(true);
    env.sim.set_refused_names(&["Shop 2"]);
    NewRequest::ready_owner(2).insert(&db).await;
    let first = env.attempt(&candidate(2, None)).await;
    assert!(
        matches!(first, AttemptOutcome::RetryScheduled { .. }),
        "{first:?}"
    );
    db.exec("UPDATE approval_request SET business_name = 'Shop Two' WHERE id = 2")
        .await;
    env.fail_next(System::Owner, autoapproval_sim::FaultKind::Malformed);
    let lost = attempt_due_retry(&env, 2, RequestType::OwnerContract).await;
    assert!(
        matches!(&lost, AttemptOutcome::RetryScheduled { reason, .. }
            if reason.reason.contains("malformed")),
        "{lost:?}"
    );
    assert_eq!(env.sim.stats().created.owners, 1, "made, its answer lost");
    db.exec("UPDATE approval_request SET business_name = 'Shop Zwei' WHERE id = 2")
        .await;

    let retry = attempt_due_retry(&env, 2, RequestType::OwnerContract).await;

    assert_eq!(retry, AttemptOutcome::Approved);
    let stats = env.sim.stats();
    assert_eq!(stats.for_request(2).owner, 1, "one owner");
    assert_eq!(stats.key_conflicts, 0, "the key's own body replayed");
    assert_eq!(stats.idempotent_replays, 1, "the owner replayed");
}

on_both!(a_request_a_person_decided_keeps_its_recorded_bodies_until_approved);
/// A person rejects the request while its last creation is in flight: the
/// completion finds it decided and ends the claim, and the bodies recorded
/// for it are kept, so that its resubmission sends the same bodies under
/// the same keys. They go with its approval.
async fn a_request_a_person_decided_keeps_its_recorded_bodies_until_approved(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(61).insert(&db).await;
    env.sim
        .set_faults(slow(System::Store, StdDuration::from_secs(1)))
        .unwrap();
    let first = tokio::spawn({
        let approver = env.approver.clone();
        async move { approver.attempt(&candidate(61, None), &fence("a", 1)).await }
    });
    wait_in_call(&env, SimSystem::Store).await;
    db.exec(
        "UPDATE approval_request SET status = 'REJECTED', decided_by = 'a person', decided_at = now()
          WHERE id = 61",
    )
    .await;

    let first = first.await.unwrap().unwrap();

    assert!(matches!(first, AttemptOutcome::Superseded(_)), "{first:?}");
    let sent = "SELECT count(*) FROM auto_approve_sent WHERE request_id = 61";
    assert_eq!(
        db.fetch_i64(sent).await,
        2,
        "the owner's and the store's bodies kept"
    );

    db.exec("UPDATE approval_request SET status = 'RETRY' WHERE id = 61")
        .await;
    assert_eq!(
        env.attempt(&candidate(61, None)).await,
        AttemptOutcome::Approved
    );
    assert_eq!(db.fetch_i64(sent).await, 0, "gone with the approval");
}
