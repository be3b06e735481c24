//! What a person asks of a request through its CR: `spec.paused` (kept across the CR's deletion)
//! and a retry by the `autoapproval.io/retry-requested-at` annotation.

use std::time::Duration;

use autoapproval::controller::crd::{self, Phase};
use autoapproval::domain::DEFAULT_RETRY_LIMIT;
use chrono::Utc;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use crate::support::{
    Cluster, Db, On, eventually, insert_state, on_both_servers, owner_now, request_status,
    state_exists, test_settings, total_calls, waiting_owner_now,
};

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

/// Sets `spec.paused: false` on the CR of `request_id`, as a person would.
async fn unpause(cluster: &Cluster, request_id: i64) {
    cluster
        .api
        .patch(
            &crd::cr_name(request_id),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
        )
        .await
        .expect("unpause");
}

/// `kubectl annotate aa request-<request_id> <annotation>`, which must succeed.
async fn annotate(cluster: &Cluster, request_id: i64, annotation: &str) {
    let out = cluster
        .kubectl(&[
            "-n",
            &cluster.ns,
            "annotate",
            "aa",
            &crd::cr_name(request_id),
            annotation,
        ])
        .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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

    unpause(&cluster, 106).await;
    cluster.wait_phase(106, Phase::Approved).await;
    assert_eq!(request_status(&db, 106).await, "APPROVED");
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
        annotate(&cluster, id, &format!("{}={asked}", crd::RETRY_ANNOTATION)).await;
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
    annotate(&cluster, 122, "note=looked at").await;
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

on_both_servers!(a_paused_cr_deleted_while_no_replica_watched_comes_back_paused);
/// A paused request is no candidate, so its CR deleted while no replica
/// watched (a rollout, a lost shard under load) is not seen as a deletion:
/// the next replica puts it back, paused, and claims nothing meanwhile.
async fn a_paused_cr_deleted_while_no_replica_watched_comes_back_paused(db: Db, on: On) {
    let mut cluster = Cluster::on(on, db.clone()).await;
    create_paused(&cluster, 117).await;
    let first = cluster.wait_phase(117, Phase::Paused).await;
    owner_now(117).insert(&db).await;
    cluster.stop().await;
    cluster
        .api
        .delete(&crd::cr_name(117), &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the CR to be gone", || async {
        cluster.cr(117).await.is_none().then_some(())
    })
    .await
    .expect("gone");
    cluster.restart(test_settings());
    let back = eventually("the CR to come back", || async {
        let cr = cluster.cr(117).await?;
        (cr.uid() != first.uid() && cr.status.as_ref()?.phase == Some(Phase::Paused)).then_some(cr)
    })
    .await
    .expect("CR");
    assert!(back.spec.paused, "recreated paused");
    assert!(!state_exists(&db, 117).await, "never claimed");
    assert_eq!(total_calls(&cluster.sim), 0);

    unpause(&cluster, 117).await;
    cluster.wait_phase(117, Phase::Approved).await;
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

    unpause(&cluster, 116).await;
    cluster.wait_phase(116, Phase::Approved).await;
    cluster.stop().await;
}
