//! One replica's Leases on the test API server (the multi-replica runs are in `replicas`): shard,
//! member and leader Leases, fencing that hangs or fails, a live replica's name refused, writes at
//! rest, a rolling upgrade from the previous protocol, and leadership lost and taken again.

use std::time::Duration;

use autoapproval::controller::crd::Phase;
use autoapproval::telemetry::Metrics;
use chrono::Utc;
use kube::api::{Api, PostParams};
use kube_testserver::{Options, TestServer};

use crate::support::{
    Cluster, Db, NS, client_for, eventually, foreign_lease, install_crd, lease_changes, metric_sum,
    on_both, owner_now, quick_leases,
};

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

    // Losses counted from here: a renewal late on a loaded machine may
    // have dropped a shard already, which is no failure of this guard.
    let lost_before = metric_sum(&text(), "autoapproval_shard_losses_total", &[]);
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
        (lost - lost_before >= 16.0 && refenced == 16).then_some(())
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
