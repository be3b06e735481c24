//! A request from the database to its end through its CR, one replica in this process on the test
//! API server (or the real one), a real PostgreSQL or MariaDB and the simulator over HTTP: approved
//! (owner and ad contracts), superseded by a person, exhausted at the retry limit, recovered from a
//! dead replica's claim.

use std::time::Duration;

use autoapproval::controller::crd::{self, Phase};
use autoapproval::domain::DEFAULT_RETRY_LIMIT;
use autoapproval::external::System;
use autoapproval_sim::{FaultKind, Faults};
use chrono::Utc;
use kube::ResourceExt;

use crate::support::{
    Cluster, Db, NewRequest, On, eventually, insert_state, memos, on_both, on_both_servers,
    owner_now, request_status, request_view, set, state_exists, test_settings, total_calls,
    waiting_owner_now,
};

on_both_servers!(an_owner_contract_is_approved_end_to_end);
async fn an_owner_contract_is_approved_end_to_end(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    owner_now(101).insert(&db).await;

    let cr = cluster.wait_phase(101, Phase::Approved).await;
    let view = request_view(&db, 101).await;
    assert_eq!(view.status, "APPROVED");
    assert!(
        view.owner_number.is_some() && view.store_number.is_some(),
        "{view:?}"
    );
    assert!(
        !state_exists(&db, 101).await,
        "the state row goes on success"
    );

    let labels = cr.labels();
    assert_eq!(labels[crd::TYPE_LABEL], "OWNER_CONTRACT");
    assert_eq!(labels[crd::SHARD_LABEL], (101 % 16).to_string());
    let status = cr.status.expect("status");
    let approved = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Approved")
        .expect("Approved condition");
    assert_eq!(approved.status, "True");
    assert_eq!(status.observed_generation, cr.metadata.generation);

    let reasons: Vec<String> = cluster
        .events_with(101, "Approved")
        .await
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(reasons, ["Approved"]);
    let created = cluster.sim.stats().for_request(101);
    assert_eq!((created.owner, created.store, created.campaign), (1, 1, 0));
    assert!(
        cluster
            .metrics
            .encode()
            .contains("autoapproval_pickup_latency_seconds_count 1"),
        "the claim recorded its pickup latency"
    );
    cluster.stop().await;
}

on_both!(an_ad_contract_for_an_existing_store_is_approved);
async fn an_ad_contract_for_an_existing_store_is_approved(db: Db) {
    let mut cluster = Cluster::start(db.clone()).await;
    cluster.sim.add_store(7001, true);
    NewRequest::ready_ad(102, 7001)
        .sorted_at(Utc::now())
        .insert(&db)
        .await;
    cluster.wait_phase(102, Phase::Approved).await;
    assert!(request_view(&db, 102).await.campaign_id.is_some());
    assert_eq!(cluster.sim.stats().for_request(102).campaign, 1);
    cluster.stop().await;
}

on_both!(a_waiting_request_is_approved_on_notify_before_its_retry_time);
async fn a_waiting_request_is_approved_on_notify_before_its_retry_time(db: Db) {
    // Start-up first: acquiring each shard runs a whole turn, which applies
    // wakes too, and the last of those could otherwise run after the flip
    // below and approve before its notification is heard.
    let mut cluster = Cluster::holding_every_shard(db.clone()).await;
    waiting_owner_now(103).insert(&db).await;

    // Settled on the long interval (a wake-up that races the first claim
    // makes one retry due at once, shown briefly as RetryWaiting too).
    let cr = eventually("request 103 to wait the long interval", || async {
        let cr = cluster.cr(103).await?;
        let status = cr.status.as_ref()?;
        let long = status.next_retry_time? > Utc::now() + chrono::Duration::minutes(9);
        (status.phase == Some(Phase::RetryWaiting) && long).then_some(cr)
    })
    .await
    .expect("CR");
    let status = cr.status.expect("status");
    let next = status.next_retry_time.expect("next retry time shown");
    // Waits are not failures: the limit's count stays at zero.
    assert!(status.retry_count == 0, "{}", status.retry_count);
    assert_eq!(status.step.as_deref(), Some("owner"));
    assert!(status.last_reason.expect("reason").contains("documents"));
    let events = cluster.events_with(103, "RetryScheduled").await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "RetryScheduled" && n.contains("documents")),
        "{events:?}"
    );
    let wakeups_before = cluster.metrics.notify_wakeups();

    let flipped = std::time::Instant::now();
    set(&db, 103, "documents_released = true").await;
    cluster.wait_phase(103, Phase::Approved).await;
    eprintln!(
        "approved {:?} after the documents flag flipped",
        flipped.elapsed()
    );
    assert!(Utc::now() < next, "approved before the retry time");
    assert_eq!(request_status(&db, 103).await, "APPROVED");
    assert!(
        cluster.metrics.notify_wakeups() > wakeups_before,
        "NOTIFY woke discovery"
    );
    cluster.stop().await;
}

on_both!(a_request_a_person_decided_ends_superseded_without_external_calls);
async fn a_request_a_person_decided_ends_superseded_without_external_calls(db: Db) {
    let mut cluster = Cluster::start(db.clone()).await;
    waiting_owner_now(104).insert(&db).await;
    cluster.wait_phase(104, Phase::RetryWaiting).await;
    let calls = total_calls(&cluster.sim);

    set(&db, 104, "status = 'APPROVED', decided_by = 'alice'").await;
    let cr = cluster.wait_phase(104, Phase::Superseded).await;
    assert!(
        cr.status
            .and_then(|s| s.last_reason)
            .unwrap_or_default()
            .contains("alice"),
        "the reason names who decided"
    );
    assert!(!state_exists(&db, 104).await, "the waiting row is gone");
    assert_eq!(total_calls(&cluster.sim), calls, "no external call");
    let reasons: Vec<String> = cluster
        .events_with(104, "Superseded")
        .await
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert!(reasons.contains(&"Superseded".to_owned()), "{reasons:?}");
    cluster.stop().await;
}

on_both!(a_claim_stuck_on_a_dead_replica_is_recovered_and_finishes);
async fn a_claim_stuck_on_a_dead_replica_is_recovered_and_finishes(db: Db) {
    owner_now(130).insert(&db).await;
    let ten_minutes_ago = Utc::now() - chrono::Duration::minutes(10);
    insert_state(&db, 130, "IN_PROGRESS", None, 0, ten_minutes_ago).await;
    let mut settings = test_settings();
    settings.cleanse_interval = Duration::from_millis(200);
    settings.stuck_threshold = Duration::from_secs(60);
    // The recovered row becomes a candidate again; a poll picks it up.
    settings.discovery.poll_period = Duration::from_secs(1);
    let mut cluster = Cluster::with(db.clone(), settings).await;

    cluster.wait_phase(130, Phase::Approved).await;
    let reasons: Vec<String> = cluster
        .events_with(130, "Approved")
        .await
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(reasons, ["Recovered", "Approved"]);
    let memos = memos(&db, 130).await;
    assert!(
        memos.iter().any(|m| m.contains("interrupted")),
        "the recovery is on the request's history: {memos:?}"
    );
    assert_eq!(cluster.sim.stats().for_request(130).owner, 1);
    cluster.stop().await;
}

on_both!(a_request_reaching_the_retry_limit_ends_exhausted_and_stays_for_a_person);
async fn a_request_reaching_the_retry_limit_ends_exhausted_and_stays_for_a_person(db: Db) {
    // 299 failures so far; the 300th is the owner service failing once
    // more (waits for a condition would not count).
    owner_now(131).insert(&db).await;
    let limit = DEFAULT_RETRY_LIMIT;
    let due = Utc::now() - chrono::Duration::seconds(1);
    insert_state(&db, 131, "RETRY_WAITING", Some(due), limit - 1, due).await;
    let mut cluster = Cluster::with_faults(
        db.clone(),
        test_settings(),
        Faults::fail_next(System::Owner, 1, FaultKind::Error),
    )
    .await;

    let cr = cluster.wait_phase(131, Phase::Exhausted).await;
    let status = cr.status.expect("status");
    assert_eq!(status.retry_count, limit);
    assert_eq!(status.next_retry_time, None, "nothing is scheduled");
    let stalled = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled")
        .expect("Stalled condition");
    assert_eq!(stalled.status, "True");
    let events = cluster.events_with(131, "Exhausted").await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "Exhausted" && n.contains("owner")),
        "{events:?}"
    );
    assert!(state_exists(&db, 131).await, "the row stays for a person");
    assert_eq!(request_status(&db, 131).await, "PENDING");
    cluster.stop().await;
}
