//! The processor chain end to end: real PostgreSQL, the simulator over HTTP.

use std::time::Duration as StdDuration;

use autoapproval::approval::{AttemptOutcome, run_turn};
use autoapproval::db::SessionArgs;
use autoapproval::domain::{Candidate, RequestStatus, RequestType};
use autoapproval::external::{ContractStatus, Dedup, System};
use autoapproval::processors::Step;
use autoapproval::retry::RetryClass;
use autoapproval_sim::{FaultKind, Faults, Idempotency};

use crate::support::{
    Db, Env, NewRequest, attempt_due_retry, candidate, defaults, fence, metric_sum, on_both,
    request_view,
};

fn owner(id: i64) -> Candidate {
    Candidate {
        request_id: id,
        request_type: RequestType::OwnerContract,
        state_id: None,
    }
}

on_both!(a_ready_owner_contract_is_approved_with_one_creation_per_step);
async fn a_ready_owner_contract_is_approved_with_one_creation_per_step(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(1).insert(&db).await;
    let report = run_turn(
        &env.approver,
        &defaults().discovery.turn,
        &fence("a", 1),
        None,
    )
    .await
    .unwrap();
    assert_eq!(report.outcomes, [(1, AttemptOutcome::Approved)]);
    let view = request_view(&db, 1).await;
    assert_eq!(view.status, "APPROVED");
    assert!(view.owner_number.is_some() && view.store_number.is_some());
    assert!(
        env.store.state(1).await.unwrap().is_none(),
        "state row deleted on success"
    );
    let created = env.sim.stats().for_request(1);
    assert_eq!((created.owner, created.store, created.campaign), (1, 1, 0));
    // The e-sign sync wrote the ledger.
    assert_eq!(
        env.store.econtract_status("EC-1").await.unwrap().as_deref(),
        Some("SIGNED")
    );
}

on_both!(an_ad_contract_starts_at_the_campaign_step);
async fn an_ad_contract_starts_at_the_campaign_step(db: Db) {
    let env = Env::start(db.clone()).await;
    env.sim.add_store(700, true);
    NewRequest::ready_ad(2, 700).insert(&db).await;
    let report = run_turn(
        &env.approver,
        &defaults().discovery.turn,
        &fence("a", 1),
        None,
    )
    .await
    .unwrap();
    assert_eq!(report.outcomes, [(2, AttemptOutcome::Approved)]);
    let view = request_view(&db, 2).await;
    assert_eq!(
        (view.status.as_str(), view.owner_number),
        ("APPROVED", None)
    );
    assert!(view.campaign_id.is_some());
    assert_eq!(env.sim.stats().for_request(2).campaign, 1);
}

on_both!(an_ad_contract_for_a_missing_store_waits_without_approving_a_campaign);
async fn an_ad_contract_for_a_missing_store_waits_without_approving_a_campaign(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_ad(3, 404).insert(&db).await;
    let c = Candidate {
        request_id: 3,
        request_type: RequestType::AdContract,
        state_id: None,
    };
    let outcome = env.attempt(&c).await;
    let AttemptOutcome::RetryScheduled { step, reason, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        (step, reason.reason.as_str()),
        (Step::AdCampaign, "store 404 does not exist")
    );
    assert_eq!(env.sim.stats().created.campaigns, 0);
}

on_both!(an_unsigned_econtract_waits_and_the_sync_records_it);
async fn an_unsigned_econtract_waits_and_the_sync_records_it(db: Db) {
    let env = Env::start(db.clone()).await;
    env.sim.set_contract_status("EC-4", ContractStatus::Pending);
    NewRequest::ready_owner(4).insert(&db).await;
    let outcome = env.attempt(&owner(4)).await;
    let AttemptOutcome::RetryScheduled { reason, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        (reason.class, reason.reason.as_str()),
        (RetryClass::ConditionNotMet, "e-contract pending")
    );
    assert_eq!(
        env.store.econtract_status("EC-4").await.unwrap().as_deref(),
        Some("PENDING")
    );
}

/// Sets what the simulator's e-sign system answers for `contract`, through its admin API
/// (`PUT /admin/esign/{ref}`, docs/REFERENCE.md).
async fn esign_says(env: &Env, contract: &str, status: &str) {
    let response = reqwest::Client::new()
        .put(format!("{}/admin/esign/{contract}", env.sim.base_url()))
        .json(&serde_json::json!({ "status": status }))
        .send()
        .await
        .expect("PUT /admin/esign");
    assert_eq!(
        response.status().as_u16(),
        204,
        "PUT /admin/esign/{contract}"
    );
}

on_both!(a_ledger_not_signed_is_overwritten_by_the_esign_systems_signed);
/// docs/INTEGRATING.md, "Which says the contract is signed": a status of the ledger other
/// than SIGNED is not trusted. The e-sign system is asked; its SIGNED is written over the
/// ledger's PENDING, and the request is approved.
async fn a_ledger_not_signed_is_overwritten_by_the_esign_systems_signed(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(6).insert(&db).await;
    db.exec(
        "INSERT INTO econtract (contract_ref, status, synced_at) VALUES ('EC-6', 'PENDING', now())",
    )
    .await;
    // Applied, as the discovery turn that finds the request would: the ledger's row is older.
    db.exec("DELETE FROM auto_approve_wake").await;
    esign_says(&env, "EC-6", "SIGNED").await;
    let outcome = env.attempt(&owner(6)).await;
    assert_eq!(outcome, AttemptOutcome::Approved);
    assert_eq!(
        env.sim.stats().calls_to("GET /esign/contracts/{ref}"),
        1,
        "the e-sign system was asked"
    );
    assert_eq!(
        env.store.econtract_status("EC-6").await.unwrap().as_deref(),
        Some("SIGNED"),
        "the ledger's PENDING was overwritten"
    );
}

on_both!(a_ledger_signed_passes_without_asking_the_esign_system);
/// docs/INTEGRATING.md, "Which says the contract is signed": the ledger's SIGNED wins. The
/// request is approved while the e-sign system would say PENDING: it is not asked, and the
/// ledger keeps its SIGNED.
async fn a_ledger_signed_passes_without_asking_the_esign_system(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(7).insert(&db).await;
    db.exec(
        "INSERT INTO econtract (contract_ref, status, synced_at) VALUES ('EC-7', 'SIGNED', now())",
    )
    .await;
    // Applied, as the discovery turn that finds the request would: the ledger's row is older.
    db.exec("DELETE FROM auto_approve_wake").await;
    esign_says(&env, "EC-7", "PENDING").await;
    let outcome = env.attempt(&owner(7)).await;
    assert_eq!(outcome, AttemptOutcome::Approved);
    assert_eq!(
        env.sim.stats().calls_to("GET /esign/contracts/{ref}"),
        0,
        "the e-sign system was not asked"
    );
    assert_eq!(
        env.store.econtract_status("EC-7").await.unwrap().as_deref(),
        Some("SIGNED")
    );
}

on_both!(a_crash_after_the_external_creation_gets_the_same_owner_from_the_idempotency_key);
async fn a_crash_after_the_external_creation_gets_the_same_owner_from_the_idempotency_key(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(5).insert(&db).await;
    // The owner service creates the owner, then the answer is lost: from our
    // side exactly like a crash between the creation and the DB save.
    env.fail_next(System::Owner, FaultKind::Malformed);
    let first = env.attempt(&owner(5)).await;
    assert!(
        matches!(&first, AttemptOutcome::RetryScheduled { reason, .. } if reason.class == RetryClass::Transient),
        "{first:?}"
    );
    assert_eq!(request_view(&db, 5).await.owner_number, None);
    assert_eq!(env.sim.stats().created.owners, 1);

    let state = env.store.state(5).await.unwrap().unwrap();
    env.clock.set(state.next_retry_time.unwrap());
    let retry = Candidate {
        state_id: Some(state.id),
        ..owner(5)
    };
    assert_eq!(env.attempt(&retry).await, AttemptOutcome::Approved);

    let stats = env.sim.stats();
    assert_eq!(stats.for_request(5).owner, 1, "the owner was created once");
    assert_eq!(
        stats.idempotent_replays, 1,
        "the retry replayed the first creation"
    );
    assert!(request_view(&db, 5).await.owner_number.is_some());
}

on_both!(errors_timeouts_and_malformed_answers_are_transient_retries);
async fn errors_timeouts_and_malformed_answers_are_transient_retries(db: Db) {
    let env = Env::with_external(db.clone(), |mut c| {
        c.external_timeout = StdDuration::from_millis(300);
        c
    })
    .await;
    for (id, kind) in [
        (11, FaultKind::Error),
        (12, FaultKind::Timeout),
        (13, FaultKind::Malformed),
    ] {
        NewRequest::ready_owner(id).insert(&db).await;
        let mut faults = Faults::fail_next(System::Owner, 1, kind);
        faults.hang = StdDuration::from_secs(3);
        env.sim.set_faults(faults).unwrap();
        let outcome = env.attempt(&owner(id)).await;
        let AttemptOutcome::RetryScheduled { step, reason, .. } = outcome else {
            panic!("{kind:?}: {outcome:?}")
        };
        assert_eq!(
            (step, reason.class),
            (Step::Owner, RetryClass::Transient),
            "{kind:?}: {}",
            reason.reason
        );
        assert_eq!(request_view(&db, id).await.status, "PENDING");
    }
    // A refusal waits as a condition, and each call is counted by its kind.
    NewRequest::ready_owner(14).insert(&db).await;
    env.fail_next(System::Owner, FaultKind::Refused);
    let outcome = env.attempt(&owner(14)).await;
    assert!(
        matches!(&outcome, AttemptOutcome::RetryScheduled { reason, .. }
            if reason.class == RetryClass::ConditionNotMet && reason.reason.contains("422")),
        "{outcome:?}"
    );
    let calls = |result: &str| {
        metric_sum(
            &env.metrics.encode(),
            "autoapproval_external_calls_total",
            &["system=\"owner\"", &format!("result=\"{result}\"")],
        )
    };
    assert_eq!(
        (calls("transient"), calls("permanent"), calls("ok")),
        (3.0, 1.0, 0.0)
    );
}

on_both!(a_request_a_person_decided_is_superseded_without_external_calls);
async fn a_request_a_person_decided_is_superseded_without_external_calls(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(6)
        .status("REJECTED")
        .insert(&db)
        .await;
    let outcome = env.attempt(&owner(6)).await;
    assert_eq!(outcome, AttemptOutcome::Superseded(RequestStatus::Rejected));
    assert!(env.store.state(6).await.unwrap().is_none());
    assert_eq!(request_view(&db, 6).await.status, "REJECTED");
    assert!(
        env.sim.stats().calls.is_empty(),
        "{:?}",
        env.sim.stats().calls
    );
}

on_both!(work_already_done_is_skipped);
async fn work_already_done_is_skipped(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(7).insert(&db).await;
    db.exec("UPDATE approval_request SET owner_number = 4242 WHERE id = 7")
        .await;
    assert_eq!(env.attempt(&owner(7)).await, AttemptOutcome::Approved);
    let stats = env.sim.stats();
    assert_eq!((stats.created.owners, stats.created.stores), (0, 1));
    assert_eq!(request_view(&db, 7).await.owner_number, Some(4242));
}

on_both!(a_business_transaction_holding_the_row_delays_the_approval_without_holding_us);
/// A business transaction that holds the request row does not hold the
/// chain: our write takes the row with NOWAIT, fails at once, and counts as
/// a transient retry; once the business commits, the retry approves. No
/// lock timeout is set, so only NOWAIT can keep the attempt from waiting.
async fn a_business_transaction_holding_the_row_delays_the_approval_without_holding_us(db: Db) {
    let session = SessionArgs {
        db_lock_timeout: std::time::Duration::ZERO,
        db_statement_timeout: std::time::Duration::from_secs(30),
    };
    let env = Env::with_session(db.clone(), &session).await;
    NewRequest::ready_owner(1).insert(&db).await;
    let business = db
        .business_transaction("UPDATE approval_request SET business_name = 'Renamed' WHERE id = 1")
        .await;

    let outcome = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        env.approver.attempt(&candidate(1, None), &fence("a", 1)),
    )
    .await
    .expect("the attempt does not wait for the business transaction")
    .expect("an outcome");
    let AttemptOutcome::RetryScheduled {
        reason,
        next_retry_time,
        ..
    } = outcome
    else {
        panic!("{outcome:?}");
    };
    assert!(
        reason
            .reason
            .contains("the row is locked by another transaction"),
        "{}",
        reason.reason
    );
    business.commit().await;

    env.clock.set(next_retry_time);
    let state_id = env.store.state(1).await.unwrap().map(|s| s.id);
    let outcome = env.attempt(&candidate(1, state_id)).await;
    assert_eq!(outcome, AttemptOutcome::Approved);
    let view = request_view(&db, 1).await;
    assert_eq!(view.status, "APPROVED");
    // The owner made before the timeout was replayed, not made twice.
    assert_eq!(env.sim.stats().created.owners, 1);
}

on_both!(a_business_transaction_holding_the_econtract_row_is_waited_for_only_the_lock_timeout);
/// The e-contract ledger is the business system's too; an upsert cannot
/// say NOWAIT, so `--db-lock-timeout` bounds its wait for a row the
/// business holds: the attempt becomes a transient retry naming the lock.
async fn a_business_transaction_holding_the_econtract_row_is_waited_for_only_the_lock_timeout(
    db: Db,
) {
    let session = SessionArgs {
        db_lock_timeout: std::time::Duration::from_millis(300),
        db_statement_timeout: std::time::Duration::from_secs(30),
    };
    let env = Env::with_session(db.clone(), &session).await;
    NewRequest::ready_owner(1).insert(&db).await;
    db.exec(
        "INSERT INTO econtract (contract_ref, status, synced_at) VALUES ('EC-1', 'SENT', now())",
    )
    .await;
    let business = db
        .business_transaction("UPDATE econtract SET synced_at = now() WHERE contract_ref = 'EC-1'")
        .await;

    let outcome = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        env.approver.attempt(&candidate(1, None), &fence("a", 1)),
    )
    .await
    .expect("the attempt waits only the lock timeout")
    .expect("an outcome");
    let AttemptOutcome::RetryScheduled { reason, .. } = outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        reason.reason.contains("sync e-contract"),
        "{}",
        reason.reason
    );
    assert!(
        reason
            .reason
            .contains("the row is locked by another transaction"),
        "{}",
        reason.reason
    );
    business.commit().await;
}

on_both!(documents_withdrawn_after_the_owner_was_made_stop_the_retry);
/// The owner is made, the store call fails, and then the business puts the
/// documents back in review (a gate of the owner step only): the retry runs
/// every gate again, so it waits for the documents instead of skipping past
/// the made owner to the store and the approval.
async fn documents_withdrawn_after_the_owner_was_made_stop_the_retry(db: Db) {
    let env = Env::start(db.clone()).await;
    NewRequest::ready_owner(21).insert(&db).await;
    env.fail_next(System::Store, FaultKind::Error);
    let first = env.attempt(&owner(21)).await;
    assert!(
        matches!(first, AttemptOutcome::RetryScheduled { .. }),
        "{first:?}"
    );
    assert!(request_view(&db, 21).await.owner_number.is_some());
    db.exec("UPDATE approval_request SET documents_released = false WHERE id = 21")
        .await;

    let state = env.store.state(21).await.unwrap().unwrap();
    env.clock.set(state.next_retry_time.unwrap());
    let retry = env.attempt(&candidate(21, Some(state.id))).await;

    let AttemptOutcome::RetryScheduled { reason, .. } = retry else {
        panic!("the withdrawn documents must stop the retry: {retry:?}");
    };
    assert!(reason.reason.contains("documents"), "{}", reason.reason);
    assert_eq!(request_view(&db, 21).await.status, "PENDING");
    assert_eq!(
        env.sim.stats().created.stores,
        0,
        "no store made without documents"
    );
}

on_both!(a_resubmitted_request_with_old_results_runs_every_gate_again);
/// A request rejected and resubmitted keeps the owner and store numbers of
/// its first run; its documents are back in review. Every gate runs again:
/// it waits for the documents instead of being approved on old results.
async fn a_resubmitted_request_with_old_results_runs_every_gate_again(db: Db) {
    let env = Env::start(db.clone()).await;
    let mut request = NewRequest::ready_owner(22);
    request.documents_released = false;
    request.insert(&db).await;
    db.exec("UPDATE approval_request SET owner_number = 7001, store_number = 8001 WHERE id = 22")
        .await;

    let outcome = env.attempt(&owner(22)).await;

    let AttemptOutcome::RetryScheduled { reason, .. } = outcome else {
        panic!("old results must not approve it: {outcome:?}");
    };
    assert!(reason.reason.contains("documents"), "{}", reason.reason);
    assert_eq!(request_view(&db, 22).await.status, "PENDING");
    let stats = env.sim.stats();
    assert_eq!((stats.created.owners, stats.created.stores), (0, 0));
}

on_both!(a_store_change_after_a_lost_campaign_answer_approves_the_new_store);
/// The ad service approves a campaign for store 700 and the answer is lost;
/// the business then corrects the target store to 701. The store defines
/// the campaign, so the retry makes one for 701 instead of replaying the
/// campaign of 700 under the old key (which a strict downstream would
/// refuse as a key reused with another body).
async fn a_store_change_after_a_lost_campaign_answer_approves_the_new_store(db: Db) {
    let env = Env::start(db.clone()).await;
    env.sim.add_store(700, true);
    env.sim.add_store(701, true);
    NewRequest::ready_ad(31, 700).insert(&db).await;
    env.fail_next(System::Ad, FaultKind::Malformed);
    let ad = Candidate {
        request_id: 31,
        request_type: RequestType::AdContract,
        state_id: None,
    };
    let first = env.attempt(&ad).await;
    assert!(
        matches!(first, AttemptOutcome::RetryScheduled { .. }),
        "{first:?}"
    );
    let lost = env.sim.stats().created.campaigns;
    assert_eq!(lost, 1, "the campaign for 700 was made, its answer lost");
    db.exec("UPDATE approval_request SET target_store_number = 701 WHERE id = 31")
        .await;

    let state = env.store.state(31).await.unwrap().unwrap();
    env.clock.set(state.next_retry_time.unwrap());
    let retry = Candidate {
        state_id: Some(state.id),
        ..ad
    };
    assert_eq!(env.attempt(&retry).await, AttemptOutcome::Approved);

    let stats = env.sim.stats();
    assert_eq!(stats.key_conflicts, 0, "no key reused with another body");
    assert_eq!(stats.idempotent_replays, 0, "nothing of store 700 replayed");
    assert_eq!(stats.for_request(31).campaign, 2, "one campaign per store");
    assert!(request_view(&db, 31).await.campaign_id.is_some());
}

on_both!(without_idempotency_keys_a_lost_answer_is_looked_up_not_made_again);
/// An owner contract whose owner answer, then store answer, is lost by a
/// downstream with no idempotency support: each retry looks the request up
/// first and takes what the lost call made.
async fn without_idempotency_keys_a_lost_answer_is_looked_up_not_made_again(db: Db) {
    let env = Env::with_external(db.clone(), |c| c.with_dedup(Dedup::Lookup)).await;
    env.sim.set_idempotency(Idempotency::Ignored);
    NewRequest::ready_owner(41).insert(&db).await;
    env.sim
        .set_faults(Faults::fail_next_creation(
            System::Owner,
            1,
            FaultKind::Malformed,
        ))
        .unwrap();
    let first = env.attempt(&owner(41)).await;
    assert!(
        matches!(first, AttemptOutcome::RetryScheduled { .. }),
        "{first:?}"
    );
    assert_eq!(env.sim.stats().created.owners, 1, "made, its answer lost");

    env.sim
        .set_faults(Faults::fail_next_creation(
            System::Store,
            1,
            FaultKind::Malformed,
        ))
        .unwrap();
    let second = attempt_due_retry(&env, 41, RequestType::OwnerContract).await;
    assert!(
        matches!(
            second,
            AttemptOutcome::RetryScheduled {
                step: Step::Store,
                ..
            }
        ),
        "{second:?}"
    );
    assert_eq!(env.sim.stats().created.stores, 1, "made, its answer lost");
    assert_eq!(
        attempt_due_retry(&env, 41, RequestType::OwnerContract).await,
        AttemptOutcome::Approved
    );

    let stats = env.sim.stats();
    assert_eq!(stats.duplicate_creations, 0, "{stats:?}");
    let made = stats.for_request(41);
    assert_eq!((made.owner, made.store), (1, 1));
    assert_eq!(stats.idempotent_replays, 0, "the simulator replays nothing");
    assert_eq!(
        stats.calls_to("GET /owners"),
        2,
        "looked up before each create"
    );
    assert_eq!(stats.calls_to("GET /stores"), 2);
    let view = request_view(&db, 41).await;
    assert!(view.owner_number.is_some() && view.store_number.is_some());
    let found = |label| {
        metric_sum(
            &env.metrics.encode(),
            "autoapproval_creations_found_total",
            &[label],
        )
    };
    assert_eq!(
        (found("system=\"owner\""), found("system=\"store\"")),
        (1.0, 1.0)
    );
}

on_both!(without_idempotency_keys_or_lookups_a_lost_answer_makes_a_second_owner);
/// The instrument of the test above can see a duplicate: with the same lost
/// answer and nobody looking up, the downstream makes a second owner.
async fn without_idempotency_keys_or_lookups_a_lost_answer_makes_a_second_owner(db: Db) {
    let env = Env::start(db.clone()).await;
    env.sim.set_idempotency(Idempotency::Ignored);
    NewRequest::ready_owner(42).insert(&db).await;
    env.sim
        .set_faults(Faults::fail_next_creation(
            System::Owner,
            1,
            FaultKind::Malformed,
        ))
        .unwrap();
    env.attempt(&owner(42)).await;
    assert_eq!(
        attempt_due_retry(&env, 42, RequestType::OwnerContract).await,
        AttemptOutcome::Approved
    );
    let stats = env.sim.stats();
    assert_eq!(stats.for_request(42).owner, 2);
    assert_eq!(stats.duplicate_creations, 1);
}

on_both!(without_idempotency_keys_a_store_change_after_a_lost_campaign_approves_the_new_store);
/// A lookup that finds the campaign made for the old target store does not
/// take it for the new one.
async fn without_idempotency_keys_a_store_change_after_a_lost_campaign_approves_the_new_store(
    db: Db,
) {
    let env = Env::with_external(db.clone(), |c| c.with_dedup(Dedup::Lookup)).await;
    env.sim.set_idempotency(Idempotency::Ignored);
    env.sim.add_store(700, true);
    env.sim.add_store(701, true);
    NewRequest::ready_ad(43, 700).insert(&db).await;
    env.sim
        .set_faults(Faults::fail_next_creation(
            System::Ad,
            1,
            FaultKind::Malformed,
        ))
        .unwrap();
    let ad = Candidate {
        request_id: 43,
        request_type: RequestType::AdContract,
        state_id: None,
    };
    env.attempt(&ad).await;
    db.exec("UPDATE approval_request SET target_store_number = 701 WHERE id = 43")
        .await;
    assert_eq!(
        attempt_due_retry(&env, 43, RequestType::AdContract).await,
        AttemptOutcome::Approved
    );
    let stats = env.sim.stats();
    assert_eq!(stats.for_request(43).campaign, 2, "one campaign per store");
    assert_eq!(stats.duplicate_creations, 0);
    // The approval carries the campaign of store 701, the latest one.
    let latest: serde_json::Value = reqwest::get(format!(
        "{}/campaigns/approvals?requestId=43",
        env.sim.base_url()
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(latest["storeNumber"], 701);
    assert_eq!(
        request_view(&db, 43).await.campaign_id.as_deref(),
        latest["campaignId"].as_str()
    );
}
