//! Shadow mode (issue 43, item 2), one replica in this process, a real PostgreSQL or MariaDB and
//! the simulator over HTTP: in shadow nothing is created outside (counted by the simulator) and
//! nothing of the business's is written (its rows read back unchanged, no memo, no ledger row),
//! while each request's would-decision is recorded (table, CR status, Event, metrics); the
//! `shadow-report` command's figures after "the scheduler in place and people" decide some
//! requests by hand; then a start in active mode approves the rest.

use autoapproval::approval::Mode;
use autoapproval::controller::config::ControllerConfig;
use autoapproval::controller::crd::{AutoApproval, Phase};
use chrono::Utc;

use crate::support::{
    Cluster, Db, NewRequest, eventually, memos, metric_sum, on_both, owner_now, request_view,
    test_settings, waiting_owner_now,
};

fn shadow_settings() -> ControllerConfig {
    let mut s = test_settings();
    s.approver.mode = Mode::Shadow;
    s
}

/// Waits until the CR of `request_id` shows shadow's would-decision `decision`; shadow
/// must have created nothing meanwhile.
async fn wait_would(cluster: &Cluster, request_id: i64, decision: &str) -> AutoApproval {
    eventually(
        &format!("request {request_id}'s CR to show wouldDecision {decision}"),
        || async {
            // A creation let through fails here at once, not by a timeout.
            assert_eq!(creations(cluster), (0, vec![]), "shadow sent a creation");
            let cr = cluster.cr(request_id).await?;
            let shown = cr.status.as_ref()?.would_decision.as_deref()?;
            (shown == decision).then_some(cr)
        },
    )
    .await
    .expect("eventually")
}

/// Every call the simulator counted that creates something (a POST).
fn creations(cluster: &Cluster) -> (u64, Vec<String>) {
    let stats = cluster.sim.stats();
    let posts = stats
        .calls
        .iter()
        .filter(|(endpoint, n)| endpoint.starts_with("POST") && **n > 0)
        .map(|(endpoint, n)| format!("{endpoint}: {n}"))
        .collect();
    let c = stats.created;
    (c.owners + c.stores + c.campaigns, posts)
}

/// The business's rows of `ids` as they read: the request's written columns, its memos.
async fn business_rows(db: &Db, ids: &[i64]) -> Vec<String> {
    let mut rows = Vec::new();
    for &id in ids {
        let view = request_view(db, id).await;
        let decided = db
            .fetch_i64(&format!(
                "SELECT count(*) FROM approval_request
                  WHERE id = {id} AND decided_at IS NULL AND decided_by IS NULL"
            ))
            .await;
        rows.push(format!(
            "{id}: {view:?} undecided={decided} memos={:?}",
            memos(db, id).await
        ));
    }
    rows
}

on_both!(in_shadow_nothing_is_created_nor_written_and_each_would_decision_is_recorded);
async fn in_shadow_nothing_is_created_nor_written_and_each_would_decision_is_recorded(db: Db) {
    let mut cluster = Cluster::with(db.clone(), shadow_settings()).await;
    cluster.sim.add_store(7001, true);
    owner_now(201).insert(&db).await;
    NewRequest::ready_ad(202, 7001)
        .sorted_at(Utc::now())
        .insert(&db)
        .await;
    waiting_owner_now(203).insert(&db).await;
    let before = business_rows(&db, &[201, 202, 203]).await;

    let owner = wait_would(&cluster, 201, "Approve").await;
    let ad = wait_would(&cluster, 202, "Approve").await;
    let held = wait_would(&cluster, 203, "Hold").await;

    // Zero external creations: the simulator counted none, and no POST at all.
    assert_eq!(creations(&cluster), (0, vec![]), "shadow sent a creation");
    // Zero business writes: the rows read as inserted, no memo, no ledger row
    // (the e-sign answer was read, not synced).
    assert_eq!(business_rows(&db, &[201, 202, 203]).await, before);
    assert_eq!(
        db.fetch_i64("SELECT count(*) FROM econtract").await,
        0,
        "shadow synced the e-contract ledger"
    );
    assert!(
        cluster.sim.stats().calls_to("GET /esign/contracts/{ref}") > 0,
        "the e-sign gate was evaluated against the e-sign system"
    );

    // The would-decision, in the CR status ...
    let status = owner.status.expect("status");
    assert!(status.would_approve_at.is_some(), "{status:?}");
    assert_eq!(
        status.step.as_deref(),
        Some("store"),
        "the owner chain's last step"
    );
    assert!(ad.status.expect("status").would_approve_at.is_some());
    let held = held.status.expect("status");
    assert_eq!(held.would_approve_at, None);
    assert_eq!(held.last_reason.as_deref(), Some("documents not released"));
    // ... in our table, durable ...
    let recorded = db
        .fetch_strings(
            "SELECT CONCAT(request_id, ' ', decision, ' ', step, ' ',
                           CASE WHEN would_approve_at IS NULL THEN 'held' ELSE 'approvable' END)
               FROM auto_approve_shadow ORDER BY request_id",
        )
        .await;
    assert_eq!(
        recorded,
        [
            "201 APPROVE store approvable",
            "202 APPROVE ad-campaign approvable",
            "203 HOLD owner held",
        ]
    );
    // ... as an Event and in the metrics.
    assert_eq!(cluster.events_with(201, "WouldApprove").await.len(), 1);
    assert!(!cluster.events_with(203, "WouldHold").await.is_empty());
    let metrics = cluster.metrics.encode();
    let decided =
        |labels: &[&str]| metric_sum(&metrics, "autoapproval_shadow_decisions_total", labels);
    assert_eq!(decided(&["decision=\"approve\""]), 2.0, "{metrics}");
    assert!(decided(&["decision=\"hold\"", "step=\"owner\""]) >= 1.0);
    assert_eq!(
        metric_sum(&metrics, "autoapproval_shadow_creations_skipped_total", &[]),
        3.0,
        "owner, store and campaign taken as made"
    );

    // Left alone once decided: no second evaluation of the approvable ones.
    let once = db
        .fetch_i64(
            "SELECT count(*) FROM auto_approve_shadow
              WHERE request_id IN (201, 202) AND evaluations = 1",
        )
        .await;
    assert_eq!(once, 2, "a would-approved request was evaluated again");
    cluster.stop().await;
}

/// `autoapproval shadow-report --output json` on the test's database.
fn report(db: &Db) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args([
            "shadow-report",
            "--since",
            "1h",
            "--output",
            "json",
            "--database-url",
            &db.url(),
        ])
        .output()
        .expect("run autoapproval shadow-report");
    assert!(
        out.status.success(),
        "shadow-report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

on_both!(the_report_compares_shadow_with_what_happened_and_active_then_approves_the_rest);
async fn the_report_compares_shadow_with_what_happened_and_active_then_approves_the_rest(db: Db) {
    let mut cluster = Cluster::with(db.clone(), shadow_settings()).await;
    for id in [301, 302, 303] {
        owner_now(id).insert(&db).await;
    }
    for id in [304, 305] {
        waiting_owner_now(id).insert(&db).await;
    }
    for id in [301, 302, 303] {
        wait_would(&cluster, id, "Approve").await;
    }
    for id in [304, 305] {
        wait_would(&cluster, id, "Hold").await;
    }

    // What actually happened, written as the scheduler in place and people write it: 301
    // approved by the old scheduler a minute after shadow would have, 302 rejected by a person
    // (the dangerous kind), 304 approved by a person although shadow held it, 305 rejected as
    // shadow held it; 303 still waits.
    let later = Utc::now() + chrono::Duration::seconds(60);
    let decide = |id: i64, status: &str, by: &str| {
        format!(
            "UPDATE approval_request SET status = '{status}', decided_at = $1, decided_by = '{by}'
              WHERE id = {id}"
        )
    };
    db.exec_at(&decide(301, "APPROVED", "old-scheduler"), later)
        .await;
    db.exec_at(&decide(302, "REJECTED", "alice"), later).await;
    db.exec_at(&decide(304, "APPROVED", "bob"), later).await;
    db.exec_at(&decide(305, "REJECTED", "carol"), later).await;
    for id in [301, 302, 304, 305] {
        cluster.wait_phase(id, Phase::Superseded).await;
    }

    let json = report(&db);
    let ids = |key: &str| -> Vec<i64> {
        json[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} in {json}"))
            .iter()
            .map(|d| d["requestId"].as_i64().expect("requestId"))
            .collect()
    };
    assert_eq!(json["evaluated"], 5, "{json}");
    assert_eq!(
        (json["wouldApprove"].clone(), json["wouldHold"].clone()),
        (3.into(), 2.into())
    );
    assert_eq!(
        (json["decided"].clone(), json["agreed"].clone()),
        (4.into(), 2.into()),
        "{json}"
    );
    assert_eq!(json["agreementRate"], 0.5);
    assert_eq!(
        ids("approvedButRejected"),
        [302],
        "the dangerous one, by id"
    );
    assert_eq!(json["approvedButRejected"][0]["decidedBy"], "alice");
    assert_eq!(ids("heldButApproved"), [304]);
    assert_eq!(json["undecided"], 1);
    let saved = &json["saved"];
    assert_eq!(saved["requests"], 1, "{json}");
    let median = saved["medianSeconds"].as_f64().expect("median");
    assert!(
        (55.0..=3600.0).contains(&median),
        "301 was approved a minute after shadow would have: {median}"
    );

    // Switched to active: no migration, nothing lost; the one left approvable is approved,
    // and only it gets creations.
    cluster.stop().await;
    let creations_before = cluster.sim.stats().created;
    assert_eq!(
        creations_before.owners + creations_before.stores,
        0,
        "shadow created nothing"
    );
    cluster.restart(test_settings());
    cluster.wait_phase(303, Phase::Approved).await;
    assert_eq!(request_view(&db, 303).await.status, "APPROVED");
    let created = cluster.sim.stats().for_request(303);
    assert_eq!((created.owner, created.store), (1, 1));
    for id in [301, 302, 304, 305] {
        let c = cluster.sim.stats().for_request(id);
        assert_eq!(
            (c.owner, c.store),
            (0, 0),
            "request {id} was decided by hand"
        );
    }
    let cr = cluster.cr(303).await.expect("CR");
    assert!(
        cr.status.expect("status").would_approve_at.is_some(),
        "the CR still shows what shadow saw"
    );
    let after = report(&db);
    assert_eq!(after["approvedByUs"], 1, "{after}");
    assert_eq!(after["undecided"], 0, "{after}");
    cluster.stop().await;
}
