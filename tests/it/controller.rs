//! End-to-end tests of the controller: the test API server, a real
//! PostgreSQL or MariaDB and the simulator over HTTP, one replica running in
//! this process.

use std::time::Duration;

use autoapproval::controller::crd::{self, AutoApproval, Phase};
use autoapproval::domain::DEFAULT_RETRY_LIMIT;
use autoapproval::external::System;
use autoapproval::telemetry::Metrics;
use autoapproval_sim::{FaultKind, Faults, SimHandle};
use chrono::Utc;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_testserver::{Match, Options, TestServer};

use crate::support::{
    AsDb, Cluster, Db, NS, NewRequest, On, client_for, eventually, foreign_lease, insert_state,
    install_crd, lease_changes, memos, metric_sum, on_both, on_both_servers, owner_now,
    quick_leases, reconciles_done, request_status, request_view, set, test_settings,
    waiting_owner_now,
};

async fn state_exists(db: &impl AsDb, id: i64) -> bool {
    db.db()
        .fetch_i64(&format!(
            "SELECT count(*) FROM auto_approve_state WHERE request_id = {id}"
        ))
        .await
        > 0
}

/// Creates the CR of `request_id` with `spec.paused: true`, as a person would.
async fn create_paused(cluster: &Cluster, request_id: i64) {
    let mut paused = crd::for_request(request_id, crd::ApprovalType::OwnerContract, 16);
    paused.spec.paused = true;
    cluster
        .api
        .create(&PostParams::default(), &paused)
        .await
        .expect("create paused CR");
}

fn total_calls(sim: &SimHandle) -> u64 {
    sim.stats().calls.values().sum()
}

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

on_both_servers!(a_deleted_cr_is_recreated_and_its_request_finishes);
async fn a_deleted_cr_is_recreated_and_its_request_finishes(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    waiting_owner_now(105).insert(&db).await;
    let first = cluster.wait_phase(105, Phase::RetryWaiting).await;

    cluster
        .api
        .delete(&first.name_any(), &DeleteParams::default())
        .await
        .expect("delete CR");
    // No poll runs during the test: the CR watch saw the deletion and
    // discovery put the CR back.
    let recreated = eventually("the CR to be recreated", || async {
        let cr = cluster.cr(105).await?;
        let phase = cr.status.as_ref().and_then(|s| s.phase);
        (cr.uid() != first.uid() && phase == Some(Phase::RetryWaiting)).then_some(cr)
    })
    .await
    .expect("recreated CR");
    assert!(
        recreated
            .status
            .and_then(|s| s.last_reason)
            .unwrap_or_default()
            .contains("documents"),
        "the recreated CR shows why the request waits"
    );
    set(&db, 105, "documents_released = true").await;

    let second = cluster.wait_phase(105, Phase::Approved).await;
    assert_ne!(second.uid(), first.uid(), "a new CR");
    assert_eq!(request_status(&db, 105).await, "APPROVED");
    assert_eq!(cluster.sim.stats().for_request(105).owner, 1);
    cluster.stop().await;
}

on_both_servers!(a_paused_cr_is_not_touched_until_unpaused);
async fn a_paused_cr_is_not_touched_until_unpaused(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    create_paused(&cluster, 106).await;
    cluster.wait_phase(106, Phase::Paused).await;
    cluster.wait_listening().await;
    // Counted before the insert: its wake-up may be handled before the
    // next line runs.
    let turns = cluster.metrics.notify_wakeups();
    owner_now(106).insert(&db).await;

    // The insert's NOTIFY runs a turn that finds the request: still untouched.
    eventually("a discovery turn after the insert", || async {
        (cluster.metrics.notify_wakeups() > turns).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!state_exists(&db, 106).await, "never claimed while paused");
    assert_eq!(total_calls(&cluster.sim), 0);
    assert_eq!(request_status(&db, 106).await, "PENDING");

    cluster
        .api
        .patch(
            &crd::cr_name(106),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
        )
        .await
        .expect("unpause");
    cluster.wait_phase(106, Phase::Approved).await;
    assert_eq!(request_status(&db, 106).await, "APPROVED");
    cluster.stop().await;
}

on_both_servers!(a_cr_naming_a_missing_request_ends_invalid_without_db_writes);
async fn a_cr_naming_a_missing_request_ends_invalid_without_db_writes(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    let cr = crd::for_request(999, crd::ApprovalType::OwnerContract, 16);
    cluster
        .api
        .create(&PostParams::default(), &cr)
        .await
        .expect("create CR");
    let cr = cluster.wait_phase(999, Phase::Invalid).await;
    assert!(
        cr.status
            .and_then(|s| s.last_reason)
            .unwrap_or_default()
            .contains("does not exist")
    );
    let events = cluster.events_with(999, "Invalid").await;
    assert!(events.iter().any(|(r, _)| r == "Invalid"), "{events:?}");
    assert!(!state_exists(&db, 999).await);
    assert_eq!(total_calls(&cluster.sim), 0);
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

on_both!(a_request_committed_below_the_cursor_without_a_notification_is_found_by_the_sweep);
/// The turns read new requests above the newest id they saw; a request
/// whose id is below it (committed after a newer one, its notification
/// lost) is found by the poll's sweep of the held shards in rotation.
async fn a_request_committed_below_the_cursor_without_a_notification_is_found_by_the_sweep(db: Db) {
    let mut settings = test_settings();
    settings.discovery.notify = false;
    settings.discovery.poll_period = Duration::from_millis(200);
    let mut cluster = Cluster::with(db.clone(), settings).await;
    owner_now(500).insert(&db).await;
    // The turn that found it read the newest id first: the cursor is at
    // 500 or above from then on.
    cluster.wait_phase(500, Phase::Approved).await;
    owner_now(400).insert(&db).await;
    cluster.wait_phase(400, Phase::Approved).await;
    assert_eq!(cluster.sim.stats().for_request(400).owner, 1);
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

/// After a shutdown: the chain of `id` finished, its request approved.
async fn assert_finished(db: &Db, id: i64) {
    assert_eq!(
        request_status(db, id).await,
        "APPROVED",
        "the chain finished"
    );
    assert!(!state_exists(db, id).await);
}

/// After a shutdown: the claim of `id` was released, due at once for the
/// next holder, and nothing was decided.
async fn assert_released(db: &Db, id: i64) {
    let state = db.store().state(id).await.unwrap().expect("state row");
    assert_eq!(
        state.status.as_str(),
        "RETRY_WAITING",
        "released, not left IN_PROGRESS"
    );
    assert!(
        state.next_retry_time.is_some_and(|due| due <= Utc::now()),
        "due again at once for the next holder: {state:?}"
    );
    assert_eq!(request_status(db, id).await, "PENDING");
}

on_both!(shutdown_finishes_chains_in_flight_within_the_grace_period);
async fn shutdown_finishes_chains_in_flight_within_the_grace_period(db: Db) {
    let mut settings = test_settings();
    settings.shutdown_grace = Duration::from_secs(10);
    let mut cluster = Cluster::with(db.clone(), settings).await;
    cluster
        .sim
        .set_faults(Faults {
            latency: Duration::from_millis(400),
            ..Faults::default()
        })
        .expect("faults");
    owner_now(107).insert(&db).await;
    eventually("the claim", || async {
        state_exists(&db, 107).await.then_some(())
    })
    .await;

    cluster.stop().await;
    assert_finished(&db, 107).await;
}

on_both!(shutdown_releases_claims_still_running_after_the_grace_period);
async fn shutdown_releases_claims_still_running_after_the_grace_period(db: Db) {
    let mut settings = test_settings();
    settings.shutdown_grace = Duration::from_millis(200);
    let mut cluster = Cluster::with(db.clone(), settings).await;
    cluster
        .sim
        .set_faults(Faults {
            latency: Duration::from_secs(20),
            ..Faults::default()
        })
        .expect("faults");
    owner_now(108).insert(&db).await;
    eventually("the claim", || async {
        state_exists(&db, 108).await.then_some(())
    })
    .await;

    cluster.stop().await;
    assert_released(&db, 108).await;
}

on_both_servers!(kubectl_get_autoapprovals_shows_the_printer_columns);
async fn kubectl_get_autoapprovals_shows_the_printer_columns(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    owner_now(110).insert(&db).await;
    waiting_owner_now(111).insert(&db).await;
    cluster.wait_phase(110, Phase::Approved).await;
    cluster.wait_phase(111, Phase::RetryWaiting).await;

    // The CRD is in the `autoapproval` category.
    let found = cluster
        .kubectl(&["api-resources", "--categories=autoapproval", "-o", "name"])
        .await;
    assert_eq!(
        String::from_utf8_lossy(&found.stdout).trim(),
        "autoapprovals.autoapproval.io",
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );
    let output = cluster.kubectl(&["get", "aa", "-n", &cluster.ns]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "REQUEST", "TYPE", "PHASE", "RETRIES", "AGE"],
        "{stdout}"
    );
    let row = |lines: &[Vec<&str>], name: &str| -> Vec<String> {
        lines
            .iter()
            .find(|l| l[0] == name)
            .unwrap_or_else(|| panic!("row {name}"))
            .iter()
            .map(|c| c.to_string())
            .collect()
    };
    assert_eq!(
        &row(&lines, "request-110")[1..5],
        ["110", "OWNER_CONTRACT", "Approved", "0"],
        "{stdout}"
    );
    // RETRIES counts failures; a wait for documents is none.
    assert_eq!(
        &row(&lines, "request-111")[1..5],
        ["111", "OWNER_CONTRACT", "RetryWaiting", "0"],
        "{stdout}"
    );

    let output = cluster
        .kubectl(&["get", "aa", "-n", &cluster.ns, "-o", "wide"])
        .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAME", "REQUEST", "TYPE", "PHASE", "RETRIES", "AGE", "STEP", "NEXT", "RETRY",
            "HOLDER", "REASON", "RETRY", "ASKED"
        ],
        "{stdout}"
    );
    let waiting = row(&lines, "request-111");
    assert_eq!(waiting[6], "owner", "{stdout}");
    // A date column would show a future time as <invalid>: it is a timestamp.
    assert!(
        chrono::DateTime::parse_from_rfc3339(&waiting[7]).is_ok(),
        "next retry as a timestamp: {stdout}"
    );
    assert_eq!(waiting[8], "replica-1", "{stdout}");
    assert!(stdout.contains("documents not released"), "{stdout}");

    let explained = cluster
        .kubectl(&["explain", "autoapproval.status.phase"])
        .await;
    let text = String::from_utf8_lossy(&explained.stdout);
    for phase in [
        "Pending",
        "InProgress",
        "RetryWaiting",
        "Approved",
        "Superseded",
        "Exhausted",
        "Paused",
        "Invalid",
    ] {
        assert!(
            text.contains(phase),
            "{phase} in:\n{text}{}",
            String::from_utf8_lossy(&explained.stderr)
        );
    }
    let described = cluster
        .kubectl(&["describe", "aa", "request-110", "-n", &cluster.ns])
        .await;
    let text = String::from_utf8_lossy(&described.stdout);
    assert!(
        text.contains("Type:                  Ready")
            && text.contains("Phase:                   Approved"),
        "{text}{}",
        String::from_utf8_lossy(&described.stderr)
    );
    // kubectl lists Events as core/v1 with an involvedObject field selector;
    // the controller writes events.k8s.io/v1: the same Event, two views.
    let events = text.split("Events:").nth(1).unwrap_or_default();
    let approved = events
        .lines()
        .find(|l| l.contains("Approved"))
        .unwrap_or_else(|| panic!("an Approved Event under describe:\n{text}"));
    let columns: Vec<&str> = approved.split_whitespace().collect();
    assert_eq!(columns[..2], ["Normal", "Approved"], "{approved}");
    assert!(columns.contains(&"autoapproval"), "From: {approved}");
    // The namespace also holds request-111's and the leader Lease's Events.
    let rows = events
        .lines()
        .filter(|l| l.trim_start().starts_with("Normal") || l.trim_start().starts_with("Warning"));
    assert_eq!(rows.count(), 1, "only this CR's Events: {events}");
    cluster.stop().await;
}

on_both!(health_readiness_and_metrics_are_served);
async fn health_readiness_and_metrics_are_served(db: Db) {
    use autoapproval::endpoints::{Health, router};

    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    let store = db.store();
    let metrics = Metrics::new();
    metrics.notify_wakeup();
    metrics.reconcile("ok", 0.004);
    let health = Health::new(store, client_for(&server), metrics);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(axum::serve(listener, router(health.clone())).into_future());
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let request = http.get(format!("{base}{path}"));
        async move {
            let response = request.send().await.expect("request");
            (
                response.status().as_u16(),
                response.text().await.expect("body"),
            )
        }
    };

    assert_eq!(get("/healthz").await.0, 200);
    let (code, body) = get("/readyz").await;
    assert_eq!(code, 503, "not ready before the cache synced");
    assert!(body.contains("cache"), "{body}");
    health.set_synced();
    assert_eq!(get("/readyz").await, (200, "ok\n".to_owned()));

    server.faults().refuse(None);
    let (code, body) = get("/readyz").await;
    assert_eq!(code, 503, "not ready while the API server refuses");
    assert!(body.contains("API server"), "{body}");
    server.faults().resume();

    let (code, body) = get("/metrics").await;
    assert_eq!(code, 200);
    for name in [
        "autoapproval_notify_wakeups_total 1",
        "autoapproval_pickup_latency_seconds_bucket",
        "autoapproval_reconcile_duration_seconds_count{result=\"ok\"} 1",
        "autoapproval_discovery_turn_candidates_bucket",
        "autoapproval_discovery_turn_duration_seconds_bucket",
        concat!(
            "autoapproval_build_info{version=\"",
            env!("CARGO_PKG_VERSION"),
            "\","
        ),
    ] {
        assert!(body.contains(name), "{name} in:\n{body}");
    }
}

#[tokio::test]
async fn the_crd_schema_rejects_a_cr_without_request_id_or_with_an_unknown_type() {
    use kube::api::{ApiResource, DynamicObject};

    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    let client = client_for(&server);
    install_crd(&client).await;
    let resource = ApiResource::erase::<AutoApproval>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client, NS, &resource);
    let cr = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "autoapproval.io/v1alpha1",
            "kind": "AutoApproval",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .expect("object")
    };
    let refused = async |name: &str, spec: serde_json::Value| match api
        .create(&PostParams::default(), &cr(name, spec))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 422 => s.message,
        other => panic!("{name}: expected 422 Invalid, got {other:?}"),
    };

    let message = refused(
        "no-id",
        serde_json::json!({"requestType": "OWNER_CONTRACT"}),
    )
    .await;
    assert!(message.contains("spec.requestId"), "{message}");
    let message = refused(
        "unknown-type",
        serde_json::json!({"requestId": 5, "requestType": "STORE_CLOSURE"}),
    )
    .await;
    assert!(message.contains("spec.requestType"), "{message}");
    let message = refused(
        "zero-id",
        serde_json::json!({"requestId": 0, "requestType": "AD_CONTRACT"}),
    )
    .await;
    assert!(message.contains("spec.requestId"), "{message}");

    let accepted = api
        .create(
            &PostParams::default(),
            &cr(
                "ok",
                serde_json::json!({"requestId": 5, "requestType": "AD_CONTRACT"}),
            ),
        )
        .await
        .expect("a valid CR is accepted");
    assert_eq!(
        accepted.data["spec"]["paused"], false,
        "paused defaults to false"
    );
}

#[tokio::test]
/// The leader deletes a departed replica's member Lease as it judged it:
/// when the member renewed between the leader's list and its delete, the
/// delete is refused (409) and the live member keeps its Lease. Before, it
/// was deleted, and the renewing replica lost every shard at its next renew.
async fn a_member_lease_renewed_after_it_was_judged_departed_is_not_deleted() {
    use autoapproval::coordination::delete_unchanged;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    let leases: Api<Lease> = Api::namespaced(client_for(&server), NS);
    const NAME: &str = "autoapproval-member-ghost";
    let judged = leases
        .create(
            &PostParams::default(),
            &foreign_lease(NAME, "member", "ghost"),
        )
        .await
        .expect("member Lease");
    let mut renewed = judged.clone();
    renewed.spec.as_mut().expect("spec").renew_time =
        Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    leases
        .replace(NAME, &PostParams::default(), &renewed)
        .await
        .expect("renewed");

    let refused = delete_unchanged(&leases, &judged).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 409),
        "{refused:?}"
    );
    let current = leases.get_opt(NAME).await.expect("get");
    assert!(current.is_some(), "the renewed member Lease stays");
    delete_unchanged(&leases, &current.expect("current"))
        .await
        .expect("the Lease as it is now can be deleted");
    assert!(leases.get_opt(NAME).await.expect("get").is_none());
}

on_both!(an_in_progress_status_write_that_hangs_holds_up_no_chain);
/// The InProgress status is written while the chain goes on: with that
/// write hanging (an API server slower than any wait here), the chain still
/// runs its calls, heartbeats and shard checks, and approves. Before, the
/// attempt was not polled during the write: no heartbeat, no shard check,
/// no progress until the API server answered.
async fn an_in_progress_status_write_that_hangs_holds_up_no_chain(db: Db) {
    let mut settings = test_settings();
    settings.reconcile.in_progress_after = Duration::from_millis(500);
    let cluster = Cluster::with_faults(
        db.clone(),
        settings,
        Faults {
            latency: Duration::from_secs(2),
            system: Some(autoapproval_sim::SimSystem::Esign),
            ..Faults::default()
        },
    )
    .await;
    cluster.wait_listening().await;
    owner_now(1).insert(&db).await;
    eventually(
        "the chain of request 1 to be asking the e-sign system",
        || async { (cluster.sim.stats().in_flight.esign > 0).then_some(()) },
    )
    .await;
    // From now on (the InProgress write comes 500 ms into the chain), every
    // status write hangs for longer than `eventually` waits.
    cluster.server.faults().add_latency(
        Duration::from_secs(120),
        Match::any()
            .verb("patch")
            .resource("autoapprovals")
            .path_contains("/status"),
    );

    eventually(
        "request 1 to be approved while its status write hangs",
        || async { (request_status(&db, 1).await == "APPROVED").then_some(()) },
    )
    .await;
    let stats = cluster.sim.stats();
    assert_eq!(
        (
            stats.calls_to("POST /owners"),
            stats.calls_to("POST /stores")
        ),
        (1, 1),
        "{:?}",
        stats.calls
    );
}

on_both!(a_change_notified_while_its_shard_changes_hands_is_not_lost);
/// A change notified while its shard is held by no replica that works it
/// (here: taken by another holder) is not lost: the database wake is
/// recorded anyway, and the replica that gets the shard next approves the
/// request at once instead of after its 10-minute condition interval.
async fn a_change_notified_while_its_shard_changes_hands_is_not_lost(db: Db) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    let mut cluster = Cluster::start(db.clone()).await;
    let held = |m: &Metrics| metric_sum(&m.encode(), "autoapproval_shards_held", &[]);
    eventually("the replica to hold all 16 shards", || async {
        (held(&cluster.metrics) == 16.0).then_some(())
    })
    .await
    .expect("all shards held");
    cluster.wait_listening().await;
    // Request 105 is in shard 105 mod 16 = 9.
    waiting_owner_now(105).insert(&db).await;
    eventually("request 105 to wait the long interval", || async {
        let status = cluster.cr(105).await?.status?;
        let long = status.next_retry_time? > Utc::now() + chrono::Duration::minutes(9);
        (status.phase == Some(Phase::RetryWaiting) && long).then_some(())
    })
    .await
    .expect("waiting");

    // Another holder takes shard 9 (its Lease fresh, so not expired).
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NS);
    eventually("the Lease of shard 9 to be taken by a ghost", || async {
        let mut lease = leases.get("autoapproval-shard-9").await.ok()?;
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some("ghost".into());
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        spec.lease_duration_seconds = Some(3600);
        leases
            .replace("autoapproval-shard-9", &PostParams::default(), &lease)
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .expect("lease taken");
    eventually("the replica to notice it lost shard 9", || async {
        (held(&cluster.metrics) == 15.0).then_some(())
    })
    .await
    .expect("shard 9 lost");

    set(&db, 105, "documents_released = true").await;
    let recorded = db
        .fetch_i64(match db {
            Db::Postgres(_) => "SELECT count(*) FROM auto_approve_wake WHERE request_id = 105",
            // MySQL also records the request's INSERT (migrations/mysql
            // 0003): a row for discovery, not a wake.
            Db::Mysql(_) => {
                "SELECT count(*) FROM auto_approve_wake WHERE request_id = 105 AND NOT new_request"
            }
        })
        .await;
    assert_eq!(
        recorded, 1,
        "the wake is recorded by the change although no replica works shard 9"
    );
    assert_eq!(
        request_status(&db, 105).await,
        "PENDING",
        "nobody works shard 9 yet"
    );

    // The ghost goes; the replica takes shard 9 back and finds it due.
    leases
        .delete("autoapproval-shard-9", &DeleteParams::default())
        .await
        .expect("ghost lease deleted");
    cluster.wait_phase(105, Phase::Approved).await;
    assert_eq!(request_status(&db, 105).await, "APPROVED");
    cluster.stop().await;
}

/// Shard 3's fence row, last fenced by `holder`, locked by a transaction
/// until it commits: fencing the shard waits on it.
async fn fence_row_of_shard_3_locked(db: &Db, holder: &str) -> crate::support::Business {
    db.exec_at(
        &format!(
            "INSERT INTO shard_fence (shard_count, shard, token, holder, fenced_at)
             VALUES (16, 3, 0, '{holder}', $1)"
        ),
        Utc::now(),
    )
    .await;
    db.business_transaction(
        "SELECT token FROM shard_fence WHERE shard_count = 16 AND shard = 3 FOR UPDATE",
    )
    .await
}

on_both!(a_stuck_fence_of_one_shard_holds_up_no_other);
/// A database call of the Lease loop that does not return (here: fencing
/// shard 3 waits on a row lock someone holds) is given up after a retry
/// period, so the same turn still takes and renews every other shard, and
/// their requests are approved while shard 3 stays blocked.
async fn a_stuck_fence_of_one_shard_holds_up_no_other(db: Db) {
    let blocker = fence_row_of_shard_3_locked(&db, "nobody").await;

    let mut cluster = Cluster::start(db.clone()).await;
    // Request 5 is in shard 5, acquired after shard 3 in the same turn.
    owner_now(5).insert(&db).await;
    cluster.wait_phase(5, Phase::Approved).await;
    let held = || metric_sum(&cluster.metrics.encode(), "autoapproval_shards_held", &[]);
    eventually("every shard but the blocked one to be held", || async {
        (held() == 15.0).then_some(())
    })
    .await;
    assert_eq!(
        held(),
        15.0,
        "shard 3 cannot be fenced while the lock is held"
    );

    blocker.commit().await;
    eventually("shard 3 to be acquired once the lock is gone", || async {
        (metric_sum(&cluster.metrics.encode(), "autoapproval_shards_held", &[]) == 16.0)
            .then_some(())
    })
    .await;
    cluster.stop().await;
}

on_both!(a_failover_whose_first_fence_failed_is_still_counted_as_a_failover);
/// A shard taken from a dead holder whose fence then fails (the database
/// slow or locked for longer than a retry period) is handed back, and
/// acquired again later: that later acquisition completes the failover and
/// is counted as one. Before, the hand-back left the Lease naming nobody, so
/// it was counted as a free shard: the cause of a loaded run's "each of the
/// victim's shards failed over once, left: 4.0, right: 5.0".
async fn a_failover_whose_first_fence_failed_is_still_counted_as_a_failover(db: Db) {
    use autoapproval::coordination::TAKEN_FROM_ANNOTATION;
    use k8s_openapi::api::coordination::v1::Lease;

    let blocker = fence_row_of_shard_3_locked(&db, "ghost").await;
    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    let client = client_for(&server);
    install_crd(&client).await;
    // Shard 3 is held by a replica that is gone (no member Lease).
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    leases
        .create(
            &PostParams::default(),
            &foreign_lease("autoapproval-shard-3", "shard", "ghost"),
        )
        .await
        .expect("the ghost's shard Lease");
    let mut cluster = Cluster::with_server(db.clone(), quick_leases(), server, client).await;
    // Taken from the ghost, not fenced (the row is locked), handed back.
    eventually(
        "shard 3 to be handed back after its fence failed",
        || async {
            let lease = leases.get("autoapproval-shard-3").await.ok()?;
            let holder = lease
                .spec
                .as_ref()?
                .holder_identity
                .clone()
                .unwrap_or_default();
            (holder.is_empty()).then_some(lease)
        },
    )
    .await;
    blocker.commit().await;
    cluster.wait_every_shard().await;
    let acquisitions = |kind: &str| {
        metric_sum(
            &cluster.metrics.encode(),
            "autoapproval_shard_acquisitions_total",
            &[&format!("kind=\"{kind}\"")],
        )
    };
    assert_eq!(
        (acquisitions("failover"), acquisitions("free")),
        (1.0, 15.0),
        "shard 3 failed over from the ghost; the others were free"
    );
    let lease = leases.get("autoapproval-shard-3").await.expect("Lease");
    assert!(
        !lease
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(TAKEN_FROM_ANNOTATION),
        "the note goes once the shard is taken"
    );
    cluster.stop().await;
}

on_both!(a_replica_named_as_a_live_replica_refuses_to_start);
/// Two replicas of one name would each take the other's shards as its own
/// former run's and claim under one holder. The second one sees the first
/// one's member Lease renewed and refuses to start, naming the flag; the
/// first keeps every shard. A former run of the same name (its member
/// Lease no longer renewed) is not refused: a restarted pod starts.
async fn a_replica_named_as_a_live_replica_refuses_to_start(db: Db) {
    use autoapproval::controller::{ControllerError, run_until};

    let mut cluster = Cluster::holding_every_shard(db.clone()).await;
    let second = run_until(
        quick_leases(),
        cluster.parts(Metrics::new()),
        std::future::pending(),
    );
    let refused = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("refused within a lease duration or so")
        .expect_err("a second replica-1 must not run");
    assert!(
        matches!(refused, ControllerError::NameInUse(_)),
        "{refused}"
    );
    let message = refused.to_string();
    assert!(
        message.contains("--replica-name \"replica-1\""),
        "{message}"
    );
    assert_eq!(
        metric_sum(&cluster.metrics.encode(), "autoapproval_shards_held", &[]),
        16.0,
        "the live replica keeps its shards"
    );
    cluster.stop().await;
}

on_both!(a_claim_left_without_a_chain_is_resumed_within_seconds);
/// A claim this replica holds with no chain running for it (a chain whose
/// outcome and release both failed while the database was away) is given
/// back within seconds and the request approved, not left IN_PROGRESS under
/// a live replica until the 5-minute stuck threshold.
async fn a_claim_left_without_a_chain_is_resumed_within_seconds(db: Db) {
    let mut cluster = Cluster::start(db.clone()).await;
    let held = || metric_sum(&cluster.metrics.encode(), "autoapproval_shards_held", &[]);
    eventually("the replica to hold all 16 shards", || async {
        (held() == 16.0).then_some(())
    })
    .await;
    // Request 21 is in shard 5; its claim carries the shard's current token.
    let token = db
        .fetch_i64("SELECT token FROM shard_fence WHERE shard_count = 16 AND shard = 5")
        .await;
    waiting_owner_now(21).insert(&db).await;
    cluster.wait_phase(21, Phase::RetryWaiting).await;
    // A chain of this replica claimed it and died without a word: the
    // claim is ours, under the current token, and nobody works on it.
    db.exec_at(
        &format!(
            "UPDATE auto_approve_state
                SET status = 'IN_PROGRESS', holder = 'replica-1', fencing_token = {token},
                    modified_at = $1
              WHERE request_id = 21"
        ),
        Utc::now(),
    )
    .await;
    set(&db, 21, "documents_released = true").await;

    eventually("request 21 to be approved", || async {
        (request_status(&db, 21).await == "APPROVED").then_some(())
    })
    .await;
    cluster.stop().await;
}

on_both!(shards_are_taken_again_when_the_leases_are_gone_but_the_tokens_stay);
/// The Leases are gone (the namespace recreated, the API server's data
/// lost) while the database keeps every shard's fencing token. A new
/// generation must be one above the database's token as well as the
/// Lease's (which starts again at 0), or the fence would refuse it, and
/// the replica would climb one generation per turn until it caught up.
async fn shards_are_taken_again_when_the_leases_are_gone_but_the_tokens_stay(db: Db) {
    let mut first = Cluster::start(db.clone()).await;
    owner_now(151).insert(&db).await;
    first.wait_phase(151, Phase::Approved).await;
    first.stop().await;
    let fenced = db
        .fetch_i64("SELECT count(*) FROM shard_fence WHERE token >= 1")
        .await;
    assert_eq!(fenced, 16, "every shard was fenced once");
    // Many generations have passed (replicas came and went): a Lease that
    // starts again at 0 would need a thousand refused turns to catch up.
    db.exec("UPDATE shard_fence SET token = token + 1000").await;

    // A new API server: no Lease of the first run exists there.
    let mut second = Cluster::start(db.clone()).await;
    owner_now(152).insert(&db).await;
    second.wait_phase(152, Phase::Approved).await;
    // The other shards are taken turn by turn; each above its old token.
    eventually("every shard to be fenced above its old token", || async {
        let raised = db
            .fetch_i64("SELECT count(*) FROM shard_fence WHERE token > 1001")
            .await;
        (raised == 16).then_some(())
    })
    .await
    .expect("each shard fenced above its old token");
    second.stop().await;
}

on_both_servers!(a_cr_edit_to_another_request_or_type_is_refused_by_the_api_server);
/// spec.requestId and spec.requestType are immutable: the CRD's CEL rule
/// `self == oldSelf`, enforced by the API server, refuses an edit to another
/// request or type with the rule's message, through the client and kubectl.
async fn a_cr_edit_to_another_request_or_type_is_refused_by_the_api_server(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    waiting_owner_now(111).insert(&db).await;
    cluster.wait_phase(111, Phase::RetryWaiting).await;
    let refused = async |spec: serde_json::Value| match cluster
        .api
        .patch(
            &crd::cr_name(111),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": spec })),
        )
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 422 => s.message,
        other => panic!("{spec}: expected 422 Invalid, got {other:?}"),
    };
    let message = refused(serde_json::json!({"requestId": 112})).await;
    assert!(
        message.contains("spec.requestId") && message.contains("requestId is immutable"),
        "{message}"
    );
    let message = refused(serde_json::json!({"requestType": "AD_CONTRACT"})).await;
    assert!(message.contains("requestType is immutable"), "{message}");

    let name = crd::cr_name(111);
    let out = cluster
        .kubectl(&[
            "-n",
            &cluster.ns,
            "patch",
            "autoapproval",
            &name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"requestId":112}}"#,
        ])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "kubectl patch was accepted");
    assert!(stderr.contains("requestId is immutable"), "{stderr}");

    // Other fields stay editable.
    cluster
        .api
        .patch(
            &crd::cr_name(111),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": true}})),
        )
        .await
        .expect("pausing is an allowed edit");
    let cr = cluster.wait_phase(111, Phase::Paused).await;
    assert_eq!(cr.spec.request_id, 111);
    cluster.stop().await;
}

on_both_servers!(a_cr_named_after_another_request_is_invalid_and_drives_nothing);
/// A CR whose name is not `request-<spec.requestId>` is reported Invalid and
/// drives nothing; the request's own CR approves it, once.
async fn a_cr_named_after_another_request_is_invalid_and_drives_nothing(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    let mut rogue = crd::for_request(113, crd::ApprovalType::OwnerContract, 16);
    rogue.metadata.name = Some("request-114".into());
    cluster
        .api
        .create(&PostParams::default(), &rogue)
        .await
        .expect("create CR");
    let invalid = eventually("the misnamed CR to be Invalid", || async {
        let cr = cluster.api.get_opt("request-114").await.ok()??;
        let status = cr.status?;
        (status.phase == Some(Phase::Invalid)).then_some(status)
    })
    .await
    .expect("status");
    assert!(
        invalid
            .last_reason
            .as_deref()
            .is_some_and(|r| r.contains("belongs to the AutoApproval named request-113")),
        "{invalid:?}"
    );
    owner_now(113).insert(&db).await;
    cluster.wait_phase(113, Phase::Approved).await;
    assert_eq!(cluster.sim.stats().for_request(113).owner, 1);
    let still: AutoApproval = cluster.api.get("request-114").await.expect("get");
    assert_eq!(
        still.status.and_then(|s| s.phase),
        Some(Phase::Invalid),
        "the misnamed CR never took part"
    );
    cluster.stop().await;
}

on_both_servers!(a_request_whose_type_is_corrected_in_the_database_gets_a_cr_of_the_new_type);
/// The database is the truth: a waiting owner contract whose type is
/// corrected to an ad contract gets a new CR of the new type (the spec is
/// immutable) and is approved as an ad contract.
async fn a_request_whose_type_is_corrected_in_the_database_gets_a_cr_of_the_new_type(
    db: Db,
    on: On,
) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    cluster.sim.add_store(700, true);
    waiting_owner_now(115).insert(&db).await;
    let before = cluster.wait_phase(115, Phase::RetryWaiting).await;
    set(
        &db,
        115,
        "request_type = 'AD_CONTRACT', target_store_number = 700, documents_released = true",
    )
    .await;
    let after = cluster.wait_phase(115, Phase::Approved).await;
    assert_ne!(after.uid(), before.uid(), "a new CR");
    assert_eq!(after.spec.request_type, crd::ApprovalType::AdContract);
    let made = cluster.sim.stats().for_request(115);
    assert_eq!(
        (made.owner, made.store, made.campaign),
        (0, 0, 1),
        "approved as an ad contract"
    );
    assert_eq!(request_status(&db, 115).await, "APPROVED");
    cluster.stop().await;
}

on_both_servers!(a_retry_asked_for_with_an_annotation_runs_at_once_and_once_per_value);
/// `kubectl annotate aa request-N autoapproval.io/retry-requested-at=…`:
/// a request waiting its 10-minute interval, whose condition came true
/// without the database hearing of it (the e-sign system changed), is
/// approved at once; an exhausted one gets one more attempt; each value is
/// acted on once, with who asked in the memo, and echoed in the status.
async fn a_retry_asked_for_with_an_annotation_runs_at_once_and_once_per_value(db: Db, on: On) {
    let limit = DEFAULT_RETRY_LIMIT;
    let long_ago = Utc::now() - chrono::Duration::hours(1);
    owner_now(121).insert(&db).await;
    insert_state(&db, 121, "RETRY_WAITING", Some(long_ago), limit, long_ago).await;
    waiting_owner_now(122).insert(&db).await;
    let mut cluster = Cluster::on(on, db.clone()).await;
    // An exhausted request is no candidate: its CR is one a person kept.
    cluster
        .api
        .create(
            &PostParams::default(),
            &crd::for_request(121, crd::ApprovalType::OwnerContract, 16),
        )
        .await
        .expect("create CR");
    cluster
        .sim
        .set_contract_status("EC-120", autoapproval::external::ContractStatus::Pending);
    owner_now(120).insert(&db).await;
    let before = cluster.wait_phase(120, Phase::RetryWaiting).await;
    assert!(
        before
            .status
            .and_then(|s| s.next_retry_time)
            .expect("due time")
            > Utc::now() + chrono::Duration::minutes(5)
    );
    cluster.wait_phase(121, Phase::Exhausted).await;
    cluster.wait_phase(122, Phase::RetryWaiting).await;
    cluster
        .sim
        .set_contract_status("EC-120", autoapproval::external::ContractStatus::Signed);

    let asked = "2026-12-03T10:00:00Z";
    for id in [120, 121, 122] {
        let out = cluster
            .kubectl(&[
                "-n",
                &cluster.ns,
                "annotate",
                "aa",
                &crd::cr_name(id),
                &format!("{}={asked}", crd::RETRY_ANNOTATION),
            ])
            .await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for id in [120, 121] {
        let cr = cluster.wait_phase(id, Phase::Approved).await;
        assert_eq!(
            cr.status.and_then(|s| s.last_retry_request).as_deref(),
            Some(asked),
            "request {id}"
        );
    }
    let asked_for = |id| {
        let db = db.clone();
        async move {
            crate::support::memos(&db, id)
                .await
                .into_iter()
                .filter(|m| {
                    m.contains("retry requested by kubectl-annotate at 2026-12-03T10:00:00Z")
                })
                .count()
        }
    };
    // 122 still waits for its documents; the request was acted on, once.
    let cr = eventually("request 122 to acknowledge the request", || async {
        let cr = cluster.cr(122).await?;
        (cr.status.as_ref()?.last_retry_request.as_deref() == Some(asked)).then_some(cr)
    })
    .await
    .expect("CR");
    assert_eq!(cr.status.and_then(|s| s.phase), Some(Phase::RetryWaiting));
    assert_eq!(asked_for(122).await, 1);
    // Another annotation makes another reconcile; the same value is not acted on again.
    let out = cluster
        .kubectl(&[
            "-n",
            &cluster.ns,
            "annotate",
            "aa",
            &crd::cr_name(122),
            "note=looked at",
        ])
        .await;
    assert!(out.status.success());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(asked_for(122).await, 1);
    assert_eq!(asked_for(120).await, 1);
    let events = cluster.events_with(120, "RetryRequested").await;
    assert!(
        events.iter().any(|(r, _)| r == "RetryRequested"),
        "{events:?}"
    );
    cluster.stop().await;
}

on_both_servers!(a_deleted_paused_cr_comes_back_paused);
/// A pause outlives its CR: a deleted paused CR comes back paused and the
/// request is not claimed meanwhile; unpausing the new CR resumes it.
async fn a_deleted_paused_cr_comes_back_paused(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    create_paused(&cluster, 116).await;
    let first = cluster.wait_phase(116, Phase::Paused).await;
    owner_now(116).insert(&db).await;
    cluster
        .api
        .delete(&crd::cr_name(116), &DeleteParams::default())
        .await
        .expect("delete");
    let back = eventually("the CR to come back", || async {
        let cr = cluster.cr(116).await?;
        (cr.uid() != first.uid() && cr.status.as_ref()?.phase == Some(Phase::Paused)).then_some(cr)
    })
    .await
    .expect("CR");
    assert!(back.spec.paused, "recreated paused");
    assert!(!state_exists(&db, 116).await, "never claimed");
    assert_eq!(total_calls(&cluster.sim), 0);

    cluster
        .api
        .patch(
            &crd::cr_name(116),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
        )
        .await
        .expect("unpause");
    cluster.wait_phase(116, Phase::Approved).await;
    cluster.stop().await;
}

on_both!(becoming_the_leader_is_an_event_on_the_leader_lease);
/// Leadership taken is an Event on the leader Lease, as client-go's leader
/// election records it, so `kubectl describe lease autoapproval-leader` tells
/// who leads since when.
async fn becoming_the_leader_is_an_event_on_the_leader_lease(db: Db) {
    use k8s_openapi::api::events::v1::Event;

    let mut cluster = Cluster::start(db.clone()).await;
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), NS);
    let note = eventually("a LeaderElection Event on the leader Lease", || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("LeaderElection")
                    && e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some("Lease")
                            && r.name.as_deref() == Some(autoapproval::coordination::LEADER_LEASE)
                    })
            })
            .and_then(|e| e.note)
    })
    .await
    .expect("note");
    assert_eq!(note, "replica-1 became leader");
    cluster.stop().await;
}

/// Status patches the API server has received (the CRs' only patches).
fn status_patches(c: &Cluster) -> u64 {
    c.api_requests("patch autoapprovals")
}

on_both!(a_replica_restarted_with_nothing_changed_writes_no_status);
/// A restarted replica finds every CR already showing what the database
/// says: it writes no status (DESIGN: the API server is shared; a restart
/// that rewrites statuses is load nobody asked for). Waiting, approved and
/// superseded requests alike.
async fn a_replica_restarted_with_nothing_changed_writes_no_status(db: Db) {
    let mut cluster = Cluster::start(db.clone()).await;
    let waiting: Vec<i64> = (1..=30).collect();
    for &id in &waiting {
        waiting_owner_now(id).insert(&db).await;
    }
    owner_now(31).insert(&db).await;
    for &id in &waiting {
        cluster.wait_phase(id, Phase::RetryWaiting).await;
    }
    cluster.wait_phase(31, Phase::Approved).await;
    cluster.stop().await;

    let (patched, reconciled) = (status_patches(&cluster), reconciles_done(&cluster));
    cluster.restart(test_settings());
    // Every CR is reconciled once its shard is taken; the status write, if
    // any, comes before the reconcile is counted.
    eventually("the restarted replica to reconcile every CR", || async {
        (reconciles_done(&cluster) >= reconciled + 31.0).then_some(())
    })
    .await;
    assert_eq!(
        status_patches(&cluster) - patched,
        0,
        "status patches after a restart that changed nothing"
    );
    cluster.stop().await;
}

on_both!(a_restarted_replica_approves_new_requests_before_its_cr_cache_syncs);
/// A restarted replica lists every CR before kube-runtime's Controller
/// reconciles anything (seconds at 100,000 CRs); meanwhile discovery
/// attempts the notified new requests of its shards itself, from their
/// CR's create response. Here every list of AutoApprovals fails until the
/// test lifts the fault, so the cache cannot sync: the request is still
/// approved and shown, and the reconcile after the sync writes its status
/// no second time.
async fn a_restarted_replica_approves_new_requests_before_its_cr_cache_syncs(db: Db) {
    let mut settings = quick_leases();
    // One status write per approval, as in an_approval_writes_its_status_once.
    settings.reconcile.in_progress_after = Duration::from_secs(3600);
    let mut cluster = Cluster::holding_every_shard(db.clone()).await;
    cluster.stop().await;
    cluster
        .server
        .faults()
        .fail_always(500, Match::any().verb("list").resource("autoapprovals"));
    let lists_before = cluster.api_requests("list autoapprovals");
    cluster.restart(settings);
    cluster.wait_every_shard().await;
    cluster.wait_listening().await;
    let reconciled = reconciles_done(&cluster);
    owner_now(72).insert(&db).await;

    let approved = cluster.wait_phase(72, Phase::Approved).await;
    assert_eq!(request_status(&db, 72).await, "APPROVED");
    assert!(
        cluster.api_requests("list autoapprovals") > lists_before,
        "the replica tried to list its CRs"
    );
    assert_eq!(
        approved.status.as_ref().map(|s| s.retry_count),
        Some(0),
        "{approved:?}"
    );
    eventually("the early attempt to be counted", || async {
        (reconciles_done(&cluster) > reconciled).then_some(())
    })
    .await;
    let patched = status_patches(&cluster);
    let reconciled = reconciles_done(&cluster);

    // The list works again: the cache syncs and the Controller reconciles
    // what it lists, the approved CR among them.
    cluster.server.faults().clear();
    eventually("a reconcile after the cache's sync", || async {
        (reconciles_done(&cluster) > reconciled).then_some(())
    })
    .await;
    assert_eq!(
        status_patches(&cluster) - patched,
        0,
        "status writes after the sync: {:?}",
        cluster.server.request_counts()
    );
    cluster.stop().await;
}

/// A replica restarted with every list of AutoApprovals failing (its cache
/// cannot sync), external calls taking `latency` and `grace` to shut down;
/// it holds every shard and hears NOTIFY, and request `id` has been
/// claimed by discovery's own attempt when this returns.
async fn claimed_before_the_cache_syncs(
    db: &Db,
    id: i64,
    latency: Duration,
    grace: Duration,
) -> Cluster {
    let mut settings = quick_leases();
    settings.shutdown_grace = grace;
    let mut cluster = Cluster::holding_every_shard(db.clone()).await;
    cluster.stop().await;
    cluster
        .server
        .faults()
        .fail_always(500, Match::any().verb("list").resource("autoapprovals"));
    cluster
        .sim
        .set_faults(Faults {
            latency,
            ..Faults::default()
        })
        .expect("faults");
    cluster.restart(settings);
    cluster.wait_every_shard().await;
    cluster.wait_listening().await;
    owner_now(id).insert(db).await;
    eventually("the claim", || async {
        state_exists(db, id).await.then_some(())
    })
    .await;
    cluster
}

on_both!(an_attempt_begun_before_the_cr_cache_syncs_finishes_within_the_grace_period);
/// Discovery's own attempts obey the shutdown as the Controller's do: one
/// in flight when the shutdown begins runs on through the grace period.
async fn an_attempt_begun_before_the_cr_cache_syncs_finishes_within_the_grace_period(db: Db) {
    let mut cluster = claimed_before_the_cache_syncs(
        &db,
        74,
        Duration::from_millis(400),
        Duration::from_secs(10),
    )
    .await;
    cluster.stop().await;
    assert_finished(&db, 74).await;
}

on_both!(an_attempt_begun_before_the_cr_cache_syncs_is_cut_off_when_the_grace_period_ends);
/// ... and one still running when the grace period ends is cut off before
/// the claims are released: its claim goes back due at once, and no chain
/// runs on past it.
async fn an_attempt_begun_before_the_cr_cache_syncs_is_cut_off_when_the_grace_period_ends(db: Db) {
    let mut cluster = claimed_before_the_cache_syncs(
        &db,
        75,
        Duration::from_secs(20),
        Duration::from_millis(200),
    )
    .await;
    cluster.stop().await;
    assert_released(&db, 75).await;
}

on_both!(an_approval_writes_its_status_once);
/// The attempt that approves a request writes its status once; later
/// reconciles of the approved CR (the request's own NOTIFY, a watch event)
/// find it shown and write nothing, keeping the holder and retries shown.
async fn an_approval_writes_its_status_once(db: Db) {
    // A chain slower than `in_progress_after` shows InProgress first, a
    // second write by design; on a loaded machine a 1 s chain happens (the
    // cause of this test's rare failures on MariaDB), so it is put out of
    // reach here.
    let mut settings = test_settings();
    settings.reconcile.in_progress_after = Duration::from_secs(3600);
    let mut cluster = Cluster::with(db.clone(), settings).await;
    owner_now(61).insert(&db).await;
    let approved = cluster.wait_phase(61, Phase::Approved).await;
    let shown = approved.status.clone().expect("status");
    assert_eq!(
        shown.retry_count, 0,
        "approved at the first attempt: {shown:?}"
    );
    // The approving reconcile is counted once it returned: from then on
    // every status write would be a later reconcile's.
    eventually("the approving reconcile to be counted", || async {
        (reconciles_done(&cluster) >= 1.0).then_some(())
    })
    .await;
    let at_approval = status_patches(&cluster);
    assert_eq!(
        at_approval,
        1,
        "the approving attempt's status writes: {:?}, Events {:?}",
        cluster.server.request_counts(),
        cluster.events_with(61, "Approved").await
    );
    let reconciled = reconciles_done(&cluster);
    // A change of one of our annotations is a reconcile trigger: an operator
    // asks for a retry of a request that is already approved.
    cluster
        .api
        .patch(
            &crd::cr_name(61),
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {crd::RETRY_ANNOTATION: "now"}}}),
            ),
        )
        .await
        .expect("annotate");
    eventually("a reconcile after the approval", || async {
        (reconciles_done(&cluster) > reconciled).then_some(())
    })
    .await;
    assert_eq!(
        status_patches(&cluster) - at_approval,
        1,
        "only the test's annotation after the approval: {:?}",
        cluster.server.request_counts()
    );
    let status = cluster
        .cr(61)
        .await
        .and_then(|cr| cr.status)
        .expect("status");
    assert_eq!(status.holder.as_deref(), Some("replica-1"), "{status:?}");
    cluster.stop().await;
}

on_both!(a_new_request_is_looked_at_alone_and_a_waiting_ones_change_gets_a_whole_turn);
/// A new request's notification costs its shard's holder one look at that
/// request, not a whole discovery turn (the wake batch and a range query
/// per type); a change to a waiting request still gets the whole turn,
/// which applies its wake.
async fn a_new_request_is_looked_at_alone_and_a_waiting_ones_change_gets_a_whole_turn(db: Db) {
    // A window of new requests is measured again (at most twice) when a
    // turn of another cause fell into it: the turn of shards acquired by
    // the coordination turn that reached 16 may still be pending, a member
    // Lease renewed after its deadline under load resumes claiming with a
    // turn, and the first poll comes at a random time. A whole turn per new
    // request falls into every window.
    const WINDOWS: i64 = 3;
    let mut cluster = Cluster::start(db.clone()).await;
    // The replica takes its shards over several coordination turns, each
    // acquisition starting a whole turn: the count starts once all are held.
    eventually("the replica to hold all 16 shards", || async {
        (metric_sum(&cluster.metrics.encode(), "autoapproval_shards_held", &[]) == 16.0)
            .then_some(())
    })
    .await;
    cluster.wait_listening().await;
    waiting_owner_now(80).insert(&db).await;
    cluster.wait_phase(80, Phase::RetryWaiting).await;
    let turns = |c: &Cluster| {
        metric_sum(
            &c.metrics.encode(),
            "autoapproval_discovery_turn_candidates_count",
            &[],
        )
    };
    let mut disturbed = Vec::new();
    for window in 0..WINDOWS {
        let before = turns(&cluster);
        let ids = 81 + 5 * window..=85 + 5 * window;
        for id in ids.clone() {
            owner_now(id).insert(&db).await;
        }
        for id in ids.clone() {
            cluster.wait_phase(id, Phase::Approved).await;
        }
        let whole = turns(&cluster) - before;
        if whole == 0.0 {
            break;
        }
        disturbed.push((ids, whole));
    }
    assert!(
        disturbed.len() < WINDOWS as usize,
        "no whole turn for new requests; whole turns in each window: {disturbed:?}"
    );
    // The waiting request's documents are released: its wake is applied by a turn.
    let before = turns(&cluster);
    set(&db, 80, "documents_released = true").await;
    cluster.wait_phase(80, Phase::Approved).await;
    assert!(
        turns(&cluster) > before,
        "a whole turn for a waiting request's change"
    );
    cluster.stop().await;
}

on_both!(at_rest_only_the_member_and_leader_leases_are_written);
/// At rest a replica writes one Lease per renewal round (its member Lease)
/// and the leader one more (the leader Lease), however many shards it
/// holds: shard Leases are written only when they change hands. Rounds are
/// counted by the member Lease's own writes, so the assertion is about
/// writes per round, not per second.
async fn at_rest_only_the_member_and_leader_leases_are_written(db: Db) {
    use std::collections::BTreeMap;

    use futures::TryStreamExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::WatchEvent;

    const ROUNDS: u64 = 5;
    let mut cluster = Cluster::with(db.clone(), quick_leases()).await;
    eventually("the replica to hold all 16 shards and lead", || async {
        let text = cluster.metrics.encode();
        (metric_sum(&text, "autoapproval_shards_held", &[]) == 16.0
            && metric_sum(&text, "autoapproval_leader", &[]) == 1.0)
            .then_some(())
    })
    .await
    .expect("settled");
    let lease_writes = |server: &TestServer| -> u64 {
        let counts = server.request_counts();
        ["update leases", "create leases"]
            .iter()
            .map(|k| counts.get(*k).copied().unwrap_or(0))
            .sum()
    };

    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NS);
    let mut events = lease_changes(&leases).await;
    let member = autoapproval::coordination::member_lease_name("replica-1");
    // From the first member renew seen, count ROUNDS more.
    let mut written: BTreeMap<String, u64> = BTreeMap::new();
    let mut start = None;
    let mut rounds = 0;
    let watched = tokio::time::timeout(Duration::from_secs(120), async {
        while rounds < ROUNDS {
            let event = events.try_next().await.expect("watch").expect("open");
            let (WatchEvent::Added(lease) | WatchEvent::Modified(lease)) = event else {
                continue;
            };
            let name = lease.metadata.name.unwrap_or_default();
            if name == member {
                match start {
                    None => {
                        start = Some(lease_writes(cluster.server.test()));
                        continue;
                    }
                    Some(_) => rounds += 1,
                }
            }
            if start.is_some() {
                *written.entry(name).or_default() += 1;
            }
        }
    })
    .await;
    assert!(watched.is_ok(), "no {ROUNDS} member renewals within 120 s");
    let delta = lease_writes(cluster.server.test()) - start.unwrap_or_default();
    let others: Vec<_> = written
        .keys()
        .filter(|n| **n != member && n.as_str() != autoapproval::coordination::LEADER_LEASE)
        .collect();
    assert!(
        others.is_empty(),
        "only the member and leader Leases are written at rest: {written:?}"
    );
    // Per round, the member Lease and the leader Lease: 2 writes, give or
    // take the leader write of the rounds at either end.
    assert!(
        (2 * ROUNDS - 2..=2 * ROUNDS + 1).contains(&delta),
        "{delta} Lease writes in {ROUNDS} renewal rounds, 2 per round expected: {written:?}"
    );
    cluster.stop().await;
}

on_both!(a_replica_written_out_of_its_member_lease_drops_every_shard);
/// A replica whose member Lease was written by another replica (which
/// judged it gone and may be taking its shards) drops every shard at its
/// next renew, before it joins again: each shard is then fenced anew.
async fn a_replica_written_out_of_its_member_lease_drops_every_shard(db: Db) {
    use k8s_openapi::api::coordination::v1::Lease;

    let mut cluster = Cluster::with(db.clone(), quick_leases()).await;
    let text = || cluster.metrics.encode();
    eventually("the replica to hold all 16 shards", || async {
        (metric_sum(&text(), "autoapproval_shards_held", &[]) == 16.0).then_some(())
    })
    .await
    .expect("settled");
    let before = db
        .fetch_i64("SELECT max(token) FROM shard_fence WHERE shard_count = 16")
        .await;

    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NS);
    let member = autoapproval::coordination::member_lease_name("replica-1");
    eventually("the member Lease to be written out", || async {
        let mut lease = leases.get(&member).await.ok()?;
        lease.spec.as_mut()?.holder_identity = None;
        leases
            .replace(&member, &PostParams::default(), &lease)
            .await
            .ok()
            .map(drop)
    })
    .await
    .expect("written out");

    eventually("every shard to be dropped and fenced anew", || async {
        let lost = metric_sum(&text(), "autoapproval_shard_losses_total", &[]);
        let refenced = db
            .fetch_i64(&format!(
                "SELECT count(*) FROM shard_fence WHERE shard_count = 16 AND token > {before}"
            ))
            .await;
        (lost == 16.0 && refenced == 16).then_some(())
    })
    .await
    .expect("dropped and taken again");
    let lease = leases.get(&member).await.expect("member Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("replica-1"),
        "the replica joined again"
    );
    cluster.stop().await;
}

on_both!(a_dead_holder_is_written_out_of_its_member_lease_before_its_shard_is_taken);
/// A shard held by a replica whose member Lease stopped changing is taken
/// only after the taker wrote that replica out of its member Lease (so a
/// renew it sent meanwhile would have failed the taker's write instead),
/// and the failover is an Event naming the old holder.
async fn a_dead_holder_is_written_out_of_its_member_lease_before_its_shard_is_taken(db: Db) {
    use k8s_openapi::api::coordination::v1::Lease;

    let mut cluster = Cluster::holding_every_shard(db.clone()).await;
    // A ghost replica joins and takes shard 9, then dies: neither of its
    // Leases changes again.
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NS);
    let ghost = |name: &str, role: &str| foreign_lease(name, role, "ghost");
    leases
        .create(
            &PostParams::default(),
            &ghost("autoapproval-member-ghost", "member"),
        )
        .await
        .expect("ghost member Lease");
    eventually("the ghost to take shard 9", || async {
        let mut lease = leases.get("autoapproval-shard-9").await.ok()?;
        lease.spec = ghost("autoapproval-shard-9", "shard").spec;
        leases
            .replace("autoapproval-shard-9", &PostParams::default(), &lease)
            .await
            .ok()
            .map(drop)
    })
    .await
    .expect("ghost holds shard 9");
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NS);
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    eventually("shard 9 to be taken from the ghost", || async {
        let lease = leases.get("autoapproval-shard-9").await.ok()?;
        (holder(lease).as_deref() == Some("replica-1")).then_some(())
    })
    .await
    .expect("taken");
    let ghost = leases
        .get("autoapproval-member-ghost")
        .await
        .expect("ghost member Lease");
    assert_eq!(
        holder(ghost),
        None,
        "the ghost was written out of its member Lease first"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(cluster.client.clone(), NS);
    eventually("a ShardFailover Event naming the ghost", || async {
        let list = events.list(&kube::api::ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("ShardFailover")
                    && e.note.as_deref().is_some_and(|n| n.contains("from ghost,"))
            })
            .then_some(())
    })
    .await
    .expect("event");
    cluster.stop().await;
}

on_both!(shard_leases_are_renewed_while_a_replica_of_the_previous_protocol_lives);
/// During a rolling upgrade a replica of the previous coordination protocol
/// (its member Lease carries no protocol annotation) judges each shard Lease
/// by its own renewals and would take one left unrenewed: while one lives,
/// the shard Leases held are renewed every turn again; once it is gone, they
/// are written only when they change hands.
async fn shard_leases_are_renewed_while_a_replica_of_the_previous_protocol_lives(db: Db) {
    use futures::TryStreamExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::WatchEvent;

    let mut cluster = Cluster::holding_every_shard(db.clone()).await;
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NS);
    let mut events = lease_changes(&leases).await;

    // The old replica's member Lease, as the previous protocol writes it,
    // renewed by this test.
    let old_name = autoapproval::coordination::member_lease_name("old-replica");
    let old = foreign_lease(&old_name, "member", "old-replica");
    leases
        .create(&PostParams::default(), &old)
        .await
        .expect("old member");
    let renewing = {
        let leases = leases.clone();
        let name = old_name.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Ok(mut lease) = leases.get(&name).await {
                    if let Some(spec) = lease.spec.as_mut() {
                        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
                    }
                    let _ = leases.replace(&name, &PostParams::default(), &lease).await;
                }
            }
        })
    };
    // A shard Lease renewed, not taken: it names replica-1 at the generation it had.
    let renewal = |lease: &Lease, seen: &mut BTreeMap<String, i32>| -> bool {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let spec = lease.spec.clone().unwrap_or_default();
        if !name.starts_with(autoapproval::coordination::SHARD_LEASE_PREFIX)
            || spec.holder_identity.as_deref() != Some("replica-1")
        {
            return false;
        }
        let generation = spec.lease_transitions.unwrap_or_default();
        seen.insert(name, generation) == Some(generation)
    };
    use std::collections::BTreeMap;
    let mut seen = BTreeMap::new();
    let mut renewals = 0;
    let renewed = tokio::time::timeout(Duration::from_secs(60), async {
        while renewals < 6 {
            let event = events.try_next().await.expect("watch").expect("open");
            if let WatchEvent::Modified(lease) = event
                && renewal(&lease, &mut seen)
            {
                renewals += 1;
            }
        }
    })
    .await;
    assert!(
        renewed.is_ok(),
        "shard Leases not renewed while the old replica lives"
    );

    renewing.abort();
    leases
        .delete(&old_name, &Default::default())
        .await
        .expect("old member gone");
    // Once it is gone: three renewals of our member Lease in a row with no
    // shard Lease renewed between them.
    let member = autoapproval::coordination::member_lease_name("replica-1");
    let mut quiet_rounds = 0;
    let quiet = tokio::time::timeout(Duration::from_secs(60), async {
        while quiet_rounds < 3 {
            let event = events.try_next().await.expect("watch").expect("open");
            let WatchEvent::Modified(lease) = event else {
                continue;
            };
            if lease.metadata.name.as_deref() == Some(member.as_str()) {
                quiet_rounds += 1;
            } else if renewal(&lease, &mut seen) {
                quiet_rounds = 0;
            }
        }
    })
    .await;
    assert!(
        quiet.is_ok(),
        "shard Leases still renewed after the old replica left"
    );
    cluster.stop().await;
}

on_both!(a_replica_that_lost_the_leader_lease_leads_again_once_it_expires);
/// A leader whose Lease another replica took (a partition from the API
/// server, say) stands again once that one is gone: it leads again after
/// the Lease expires, instead of renewing a Lease that is not its own.
async fn a_replica_that_lost_the_leader_lease_leads_again_once_it_expires(db: Db) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    let mut cluster = Cluster::with(db.clone(), quick_leases()).await;
    let leading = |c: &Cluster| metric_sum(&c.metrics.encode(), "autoapproval_leader", &[]);
    eventually("the replica to lead", || async {
        (leading(&cluster) == 1.0).then_some(())
    })
    .await;
    // Another replica takes the Lease, then vanishes without renewing it.
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NS);
    let mut lease = leases
        .get(autoapproval::coordination::LEADER_LEASE)
        .await
        .expect("leader Lease");
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = Some("partitioned-away".into());
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        spec.lease_transitions = spec.lease_transitions.map(|t| t + 1);
    }
    leases
        .replace(
            autoapproval::coordination::LEADER_LEASE,
            &PostParams::default(),
            &lease,
        )
        .await
        .expect("taken");
    eventually("the replica to notice it lost the lead", || async {
        (leading(&cluster) == 0.0).then_some(())
    })
    .await;
    eventually(
        "the replica to lead again after the Lease expired",
        || async { (leading(&cluster) == 1.0).then_some(()) },
    )
    .await;
    let holder = leases
        .get(autoapproval::coordination::LEADER_LEASE)
        .await
        .expect("leader Lease")
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("replica-1"));
    cluster.stop().await;
}
