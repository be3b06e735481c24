//! What a creation and an approval are made from, when the request changes
//! under an attempt: the body sent under a key is the recorded one until its
//! result is saved, a saved campaign counts only for the store it was made
//! for, and a fact changed while the attempt ran is read before approving,
//! with or without a wake trigger.

use std::time::Duration as StdDuration;

use autoapproval::approval::{AttemptOutcome, WOKEN_BEFORE_COMPLETION};
use autoapproval::clock::Clock;
use autoapproval::db::{RequestChange, SessionArgs};
use autoapproval::domain::{Candidate, RequestType};
use autoapproval::external::{ContractStatus, System};
use autoapproval_sim::{Faults, SimSystem};

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

/// Runs an attempt at owner contract `id` whose last step (the store) is
/// slowed down, makes `change` while that step's call is in flight, and
/// answers the attempt's outcome.
async fn change_during_the_last_step<F, Fut>(env: &Env, id: i64, change: F) -> AttemptOutcome
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    env.sim
        .set_faults(slow(System::Store, StdDuration::from_secs(1)))
        .unwrap();
    let attempt = tokio::spawn({
        let approver = env.approver.clone();
        async move { approver.attempt(&candidate(id, None), &fence("a", 1)).await }
    });
    wait_in_call(env, SimSystem::Store).await;
    change().await;
    let outcome = attempt.await.unwrap().unwrap();
    env.sim.set_faults(Faults::default()).unwrap();
    outcome
}

/// The outcome is a completion refused for a changed fact, due at once.
fn assert_refused_and_due_at_once(env: &Env, outcome: &AttemptOutcome) {
    let AttemptOutcome::RetryScheduled {
        reason,
        next_retry_time,
        ..
    } = outcome
    else {
        panic!("{outcome:?}");
    };
    assert_eq!(reason.reason, WOKEN_BEFORE_COMPLETION);
    assert_eq!(*next_retry_time, env.clock.now(), "due at once");
}

on_both!(without_a_wake_trigger_documents_put_back_in_review_during_the_last_step_are_not_approved);
/// No wake trigger is attached, so the business's change records no wake:
/// the documents go back in review while the last step (the store) is
/// created, after the owner step's gate passed on them. The completion
/// compares the row it locks with what the gates passed on and approves
/// nothing; the request is due at once, waits for the documents, and is
/// approved once they are released again.
async fn without_a_wake_trigger_documents_put_back_in_review_during_the_last_step_are_not_approved(
    db: Db,
) {
    let env = Env::start(db.clone()).await;
    assert!(db.drop_wake_triggers().await > 0, "the binding had some");
    NewRequest::ready_owner(71).insert(&db).await;

    let first = change_during_the_last_step(&env, 71, || async {
        db.exec("UPDATE approval_request SET documents_released = false WHERE id = 71")
            .await;
    })
    .await;

    assert_refused_and_due_at_once(&env, &first);
    assert_eq!(
        db.fetch_i64("SELECT count(*) FROM auto_approve_wake").await,
        0,
        "no trigger wrote a wake"
    );
    assert_eq!(request_view(&db, 71).await.status, "PENDING");
    let retry = attempt_due_retry(&env, 71, RequestType::OwnerContract).await;
    assert!(
        matches!(&retry, AttemptOutcome::RetryScheduled { reason, .. }
            if reason.reason == "documents not released"),
        "{retry:?}"
    );
    db.exec("UPDATE approval_request SET documents_released = true WHERE id = 71")
        .await;
    let released = attempt_due_retry(&env, 71, RequestType::OwnerContract).await;
    assert_eq!(released, AttemptOutcome::Approved);
    assert_eq!(env.sim.stats().created.stores, 1, "the store made once");
}

on_both!(without_a_wake_trigger_an_e_contract_voided_during_the_last_step_is_not_approved);
/// No wake trigger is attached: the e-contract, signed when the owner
/// step's gate read the ledger, is voided (in the e-sign system and by its
/// sync in the ledger) while the last step runs. The completion compares
/// the ledger's status with the one the gate passed on and approves
/// nothing; the next attempt waits for a signature, and is approved once
/// the contract is signed again.
async fn without_a_wake_trigger_an_e_contract_voided_during_the_last_step_is_not_approved(db: Db) {
    let env = Env::start(db.clone()).await;
    assert!(db.drop_wake_triggers().await > 0, "the binding had some");
    NewRequest::ready_owner(72).insert(&db).await;

    let first = change_during_the_last_step(&env, 72, || async {
        env.sim
            .set_contract_status("EC-72", ContractStatus::Rejected);
        db.exec("UPDATE econtract SET status = 'REJECTED' WHERE contract_ref = 'EC-72'")
            .await;
    })
    .await;

    assert_refused_and_due_at_once(&env, &first);
    assert_eq!(request_view(&db, 72).await.status, "PENDING");
    let retry = attempt_due_retry(&env, 72, RequestType::OwnerContract).await;
    assert!(
        matches!(&retry, AttemptOutcome::RetryScheduled { reason, .. }
            if reason.reason == "e-contract rejected"),
        "{retry:?}"
    );
    env.sim.set_contract_status("EC-72", ContractStatus::Signed);
    let signed = attempt_due_retry(&env, 72, RequestType::OwnerContract).await;
    assert_eq!(signed, AttemptOutcome::Approved);
}

on_both!(an_e_contract_voided_during_the_last_step_is_not_approved_before_its_wake_is_expanded);
/// With the triggers attached, an e-contract voided while the last step
/// runs: PostgreSQL's trigger writes a wake row per open request on it; on
/// MySQL the trigger writes one row naming the contract, which becomes the
/// requests' own only when a poller expands it (none runs here). Either
/// way, nothing is approved and the request is due at once.
async fn an_e_contract_voided_during_the_last_step_is_not_approved_before_its_wake_is_expanded(
    db: Db,
) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(73).insert(&db).await;

    let first = change_during_the_last_step(&env, 73, || async {
        env.sim
            .set_contract_status("EC-73", ContractStatus::Rejected);
        db.exec("UPDATE econtract SET status = 'REJECTED' WHERE contract_ref = 'EC-73'")
            .await;
    })
    .await;

    assert_refused_and_due_at_once(&env, &first);
    assert_eq!(request_view(&db, 73).await.status, "PENDING");
    if let Db::Mysql(_) = db {
        assert_eq!(
            db.fetch_i64(
                "SELECT count(*) FROM auto_approve_wake
                  WHERE request_id IS NULL AND contract_ref = 'EC-73' AND skip_request IS NULL"
            )
            .await,
            1,
            "the contract's row, not expanded"
        );
    }
}

on_both!(an_e_contract_voided_and_signed_again_during_the_last_step_is_not_approved_while_its_wake_is_pending);
/// The e-contract is voided and signed again while the last step runs: the
/// ledger ends as the gate saw it, but the change's wake is pending (on
/// MySQL, only as the contract's unexpanded row), so the completion
/// approves nothing, as after any wake since the claim; the next attempt
/// reads the contract again and approves.
async fn an_e_contract_voided_and_signed_again_during_the_last_step_is_not_approved_while_its_wake_is_pending(
    db: Db,
) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(74).insert(&db).await;

    let first = change_during_the_last_step(&env, 74, || async {
        db.exec("UPDATE econtract SET status = 'REJECTED' WHERE contract_ref = 'EC-74'")
            .await;
        db.exec("UPDATE econtract SET status = 'SIGNED' WHERE contract_ref = 'EC-74'")
            .await;
    })
    .await;

    assert_refused_and_due_at_once(&env, &first);
    if let Db::Mysql(_) = db {
        assert_eq!(
            db.fetch_i64("SELECT count(*) FROM auto_approve_wake WHERE request_id IS NOT NULL")
                .await,
            0,
            "only the contract's rows, none of the request's own"
        );
        // What a replica's poller does within its interval: the rows
        // become the request's own, which the next claim consumes.
        let mut changes = env.store.request_changes().await.unwrap();
        let change = tokio::time::timeout(StdDuration::from_secs(10), changes.next())
            .await
            .expect("the poller reads the rows")
            .unwrap();
        assert_eq!(change, RequestChange::Changed(74));
    }
    let retry = attempt_due_retry(&env, 74, RequestType::OwnerContract).await;
    assert_eq!(retry, AttemptOutcome::Approved);
}

on_both!(without_a_wake_trigger_a_fact_read_otherwise_by_a_later_step_is_not_approved);
/// No wake trigger: the menu is registered while the owner step's call
/// runs (the owner step's read had none; only the store step's gate reads
/// it), and would be withdrawn again during the store's call, so the row
/// at the completion would match the first read. Every step must read the
/// facts the earlier ones passed on: the store step's read differs, the
/// attempt stops there, creates no store and is due again at once.
async fn without_a_wake_trigger_a_fact_read_otherwise_by_a_later_step_is_not_approved(db: Db) {
    let env = Env::start(db.clone()).await;
    assert!(db.drop_wake_triggers().await > 0, "the binding had some");
    NewRequest {
        menu_registered: false,
        ..NewRequest::ready_owner(75)
    }
    .insert(&db)
    .await;
    env.sim
        .set_faults(slow(System::Owner, StdDuration::from_secs(1)))
        .unwrap();
    let attempt = tokio::spawn({
        let approver = env.approver.clone();
        async move { approver.attempt(&candidate(75, None), &fence("a", 1)).await }
    });
    wait_in_call(&env, SimSystem::Owner).await;
    db.exec("UPDATE approval_request SET menu_registered = true WHERE id = 75")
        .await;
    env.sim
        .set_faults(slow(System::Store, StdDuration::from_secs(1)))
        .unwrap();
    // Were the store's call made, the menu goes again while it runs.
    let mut attempt = attempt;
    let mut withdrawn = false;
    let first = loop {
        tokio::select! {
            outcome = &mut attempt => break outcome.unwrap().unwrap(),
            () = tokio::time::sleep(StdDuration::from_millis(10)) => {
                if !withdrawn && *env.sim.stats().in_flight.get(SimSystem::Store) > 0 {
                    db.exec("UPDATE approval_request SET menu_registered = false WHERE id = 75")
                        .await;
                    withdrawn = true;
                }
            }
        }
    };

    assert_refused_and_due_at_once(&env, &first);
    assert_eq!(
        env.sim.stats().created.stores,
        0,
        "stopped before the store"
    );
    assert_eq!(request_view(&db, 75).await.status, "PENDING");
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
