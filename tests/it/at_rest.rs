//! What a shared cluster pays for requests at rest (issue 42): a retry whose outcome did not change
//! writes no status and publishes no Event, a change of reason shows at once, the CR of a request
//! no longer worked is collected and comes back when it is workable, and the rows of decided
//! requests go after their retention.

use std::time::Duration;

use autoapproval::controller::crd::{self, Phase};
use autoapproval::db::Database;
use autoapproval::external::System;
use autoapproval_sim::{FaultKind, Faults};
use chrono::Utc;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};

use crate::support::{
    Cluster, Db, eventually, metric_sum, on_both, owner_now, set, test_settings, waiting_owner_now,
};

/// Events about the CR of `request_id` with `reason`, as their notes.
async fn events(cluster: &Cluster, request_id: i64, reason: &str) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let name = crd::cr_name(request_id);
    api.list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

/// The next retry time of `request_id`'s state row.
async fn due(store: &Database, request_id: i64) -> Option<chrono::DateTime<Utc>> {
    store
        .state(request_id)
        .await
        .expect("read state")
        .and_then(|s| s.next_retry_time)
}

on_both!(a_retry_with_an_unchanged_reason_writes_no_status_and_publishes_no_event);
/// A request waits for its documents, retried every second on the real kube-apiserver: the first
/// wait is shown (one status write, one RetryScheduled Event); the retries after it, with the same
/// reason, change the CR's resourceVersion not at all and publish no Event. Before, each retry
/// wrote its new nextRetryTime and an Event: 333 writes/s at 100,000 waiting.
async fn a_retry_with_an_unchanged_reason_writes_no_status_and_publishes_no_event(db: Db) {
    let mut settings = test_settings();
    settings.approver.retry.condition_interval = Duration::from_secs(1);
    let cluster = Cluster::real(db.clone(), settings).await;
    waiting_owner_now(1).insert(&db).await;
    let shown = cluster.wait_phase(1, Phase::RetryWaiting).await;
    eventually("the first RetryScheduled Event", || async {
        (!events(&cluster, 1, "RetryScheduled").await.is_empty()).then_some(())
    })
    .await;
    let version = shown.resource_version();

    // Three retries more, each with the same reason, as the database's schedule shows.
    let store = db.database();
    let seen = std::sync::Mutex::new(vec![due(&store, 1).await]);
    eventually("three more retries of request 1", || async {
        let now = due(&store, 1).await;
        let mut seen = seen.lock().expect("lock");
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        (seen.len() >= 4).then_some(())
    })
    .await;

    let cr = cluster.cr(1).await.expect("CR");
    assert_eq!(
        cr.resource_version(),
        version,
        "retries with an unchanged reason wrote the CR: {:?}",
        cr.status
    );
    assert_eq!(
        events(&cluster, 1, "RetryScheduled").await.len(),
        1,
        "one Event for the first wait, none for its repeats"
    );
    let metrics = cluster.metrics.encode();
    assert!(
        metric_sum(
            &metrics,
            "autoapproval_status_writes_total",
            &["phase=\"RetryWaiting\"", "outcome=\"skipped\""]
        ) >= 3.0,
        "the skipped writes are counted:\n{metrics}"
    );
    assert!(
        metric_sum(
            &metrics,
            "autoapproval_events_skipped_total",
            &["reason=\"RetryScheduled\""]
        ) >= 3.0,
        "the skipped Events are counted"
    );
}

on_both!(a_change_of_reason_shows_in_the_next_reconcile);
/// A request waits for its documents with an hour's retry interval; the documents are released
/// but an operational hold is set. The one reconcile that change wakes (no timed retry is due
/// within the test) shows the new reason on the CR, and publishes its Event.
async fn a_change_of_reason_shows_in_the_next_reconcile(db: Db) {
    let mut settings = test_settings();
    settings.approver.retry.condition_interval = Duration::from_secs(3600);
    let cluster = Cluster::real(db.clone(), settings).await;
    waiting_owner_now(2).insert(&db).await;
    let first = cluster.wait_phase(2, Phase::RetryWaiting).await;
    let before = first
        .status
        .and_then(|s| s.last_reason)
        .expect("a reason shown");

    set(&db, 2, "documents_released = TRUE, operational_hold = TRUE").await;
    let after = eventually("request 2 to show its new reason", || async {
        let reason = cluster.cr(2).await?.status?.last_reason?;
        (reason != before).then_some(reason)
    })
    .await
    .expect("reason");
    assert_eq!(
        events(&cluster, 2, "RetryScheduled").await.len(),
        2,
        "one Event per reason: {before:?}, then {after:?}"
    );
}

on_both!(an_abandoned_requests_cr_is_collected_and_created_again_once_it_is_workable);
/// A request exhausts its retries (a limit of one; the owner service fails once). With
/// `--abandoned-after 0s` the collector deletes its CR; discovery does not put it back (another
/// CR deleted after it is restored meanwhile); its state stays in the database. Then the business
/// corrects its e-contract: the change revives the request, discovery creates its CR again, and it
/// is approved.
async fn an_abandoned_requests_cr_is_collected_and_created_again_once_it_is_workable(db: Db) {
    let mut settings = test_settings();
    settings.gc.interval = Duration::from_secs(1);
    settings.gc.abandoned.after = Duration::ZERO;
    settings.discovery.abandoned.after = Duration::ZERO;
    // One retry: the owner service's one failure exhausts it.
    let limit = 1;
    settings.approver.retry.limit = limit;
    settings.gc.abandoned.retry_limit = limit;
    settings.discovery.abandoned.retry_limit = limit;
    settings.discovery.retry_limit = limit;
    let cluster = Cluster::real(db.clone(), settings).await;
    cluster
        .sim
        .set_faults(Faults::fail_next(System::Owner, 1, FaultKind::Error))
        .expect("faults");
    cluster.wait_listening().await;
    owner_now(3).insert(&db).await;
    let store = db.database();
    eventually("request 3 to exhaust its one retry", || async {
        let state = store.state(3).await.expect("state")?;
        (state.retry_count == limit).then_some(())
    })
    .await;
    // A waiting request beside it: worked, so never abandoned.
    waiting_owner_now(4).insert(&db).await;
    cluster.wait_phase(4, Phase::RetryWaiting).await;

    eventually("the CR of exhausted request 3 to be collected", || async {
        cluster.cr(3).await.is_none().then_some(())
    })
    .await;
    let state = store.state(3).await.expect("state").expect("kept");
    assert_eq!(state.retry_count, limit, "its state stays in the database");

    // Deleted CRs are restored in the order they were deleted: once request 4's is back,
    // request 3's deletion has been looked at, and left alone.
    let uid = cluster.cr(4).await.expect("CR 4").uid();
    cluster
        .api
        .delete(&crd::cr_name(4), &DeleteParams::default())
        .await
        .expect("delete CR 4");
    eventually("the CR of waiting request 4 to be put back", || async {
        let cr = cluster.cr(4).await?;
        (cr.uid() != uid).then_some(())
    })
    .await;
    assert!(
        cluster.cr(3).await.is_none(),
        "the CR of an abandoned request was put back"
    );
    let metrics = cluster.metrics.encode();
    assert!(
        metric_sum(
            &metrics,
            "autoapproval_crs_collected_total",
            &["reason=\"abandoned\""]
        ) >= 1.0,
        "counted as abandoned:\n{metrics}"
    );

    set(&db, 3, "econtract_ref = 'EC-3-corrected'").await;
    cluster.wait_phase(3, Phase::Approved).await;
}

on_both!(the_rows_of_decided_requests_go_after_one_collector_pass);
/// Recorded bodies and pauses are kept while their request is open or decided recently (a
/// resubmission replays the same creations); a request decided longer ago than the retention,
/// or gone, keeps none after one pass.
async fn the_rows_of_decided_requests_go_after_one_collector_pass(db: Db) {
    for id in [10, 11, 12] {
        owner_now(id).insert(&db).await;
    }
    // 10: open; 11: decided long ago; 12: decided just now; 13: gone.
    set(
        &db,
        11,
        "status = 'REJECTED', decided_by = 'alice', decided_at = '2020-01-01 00:00:00', \
         updated_at = '2020-01-01 00:00:00'",
    )
    .await;
    set(
        &db,
        12,
        "status = 'CANCELED', decided_by = 'bob', decided_at = updated_at",
    )
    .await;
    for id in [10, 11, 12, 13] {
        for key in ["owner", "store"] {
            db.exec(&format!(
                "INSERT INTO auto_approve_sent (request_id, idempotency_key, body) \
                 VALUES ({id}, '{id}:{key}', '{{}}')"
            ))
            .await;
        }
        db.exec(&format!(
            "INSERT INTO auto_approve_pause (request_id, paused_by) VALUES ({id}, 'dba')"
        ))
        .await;
    }

    let store = db.database();
    let collected = store
        .collect_rows(Duration::from_secs(7 * 86_400))
        .await
        .expect("one pass");
    assert_eq!((collected.sent, collected.pauses), (4, 2), "{collected:?}");
    for (id, kept) in [(10, true), (11, false), (12, true), (13, false)] {
        let sent = db
            .fetch_i64(&format!(
                "SELECT COUNT(*) FROM auto_approve_sent WHERE request_id = {id}"
            ))
            .await;
        let paused = store.pause_of(id).await.expect("pause").is_some();
        assert_eq!(
            (sent > 0, paused),
            (kept, kept),
            "request {id}: rows kept {kept}"
        );
    }
}
