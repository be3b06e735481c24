//! How a replica finds its requests and keeps a CR for each: NOTIFY, the turns and the sweep below
//! the cursor, a change notified while its shard changes hands, a claim left without a chain, a CR
//! deleted or made stale by a type corrected in the database, and a restarted replica's new requests
//! before its CR cache syncs.

use std::time::Duration;

use autoapproval::controller::crd::{self, Phase};
use autoapproval::telemetry::Metrics;
use chrono::Utc;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube_testserver::{FaultRule, Match};

use crate::support::{
    Cluster, Db, NS, On, eventually, metric_sum, on_both, on_both_servers, owner_now, quick_leases,
    reconciles_done, request_status, set, status_patches, test_settings, waiting_owner_now,
};

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

on_both!(a_cr_create_the_api_server_leaves_unanswered_strands_no_request);
/// The kube client waits for an answer without limit: one CR create the
/// API server left unanswered (as a just-restarted one can) held the
/// discovery loop, and with it every request of the replica's shards (no
/// CR, no reconcile of a shard resumed or acquired), while its Leases were
/// renewed so nobody else took them (DESIGN §4a, guarantee 4). The create
/// is given up after the API timeout, and a later turn creates the CR.
async fn a_cr_create_the_api_server_leaves_unanswered_strands_no_request(db: Db) {
    let mut settings = test_settings();
    settings.discovery.poll_period = Duration::from_secs(1);
    settings.discovery.api_timeout = Duration::from_secs(2);
    let mut cluster = Cluster::with(db.clone(), settings).await;
    cluster.wait_listening().await;
    // The first create of an AutoApproval is answered long after the test.
    cluster.server.faults().add(FaultRule {
        matcher: Match::any().verb("create").resource("autoapprovals"),
        latency_ms: 600_000,
        count: Some(1),
        ..FaultRule::default()
    });
    for id in 1..=5 {
        owner_now(id).insert(&db).await;
    }
    // The others first: they were stranded behind request 1's create.
    for id in [2, 3, 4, 5, 1] {
        cluster.wait_phase(id, Phase::Approved).await;
        assert_eq!(request_status(&db, id).await, "APPROVED");
    }
    cluster.stop().await;
}
