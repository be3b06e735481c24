//! Faults only the real control plane shows, each on a control plane of the test's
//! own (crates/control-plane): etcd's history compacted under a running controller, so
//! its watch is answered `410 Gone`. kube-apiserver killed and restarted under three
//! replicas is `replicas::the_api_server_killed_and_restarted_mid_run_*` (it needs the
//! fleet), a Role rule removed `real_server::each_rule_missing_from_the_role_*`.

use ::control_plane::Options;
use autoapproval::controller::crd::{self, AutoApproval, Phase};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use crate::support::*;

on_both!(a_watch_answered_410_gone_after_etcds_compaction_relists_and_misses_nothing);
/// kube-apiserver without its watch cache, so a watch reads etcd's own history; one
/// replica (`autoapproval run` as the chart's ServiceAccount) reaches it through a proxy.
/// Once a request is approved, etcd is compacted to its current revision and the proxy
/// drops every connection, as a load balancer's restart would: the replica watches again
/// from the last resourceVersion it saw, which etcd no longer has, and is answered
/// `410 Gone`. It lists again, and a request inserted afterwards is approved with the
/// poll an hour away: from the CR watch, not the safety net.
async fn a_watch_answered_410_gone_after_etcds_compaction_relists_and_misses_nothing(db: Db) {
    let plane = private_control_plane(Options { watch_cache: false }).await;
    let real = real_namespace_on(plane, |_| {}).await;
    let apiserver: std::net::SocketAddr = plane
        .url()
        .trim_start_matches("https://")
        .parse()
        .expect("kube-apiserver's address");
    let proxy = CutProxy::start(apiserver).await;
    // The ServiceAccount's kubeconfig, through the proxy (the serving certificate is
    // for 127.0.0.1, whatever the port).
    let kubeconfig = real.ns.kubeconfig.with_extension("proxied.kubeconfig");
    let text = std::fs::read_to_string(&real.ns.kubeconfig).expect("kubeconfig");
    std::fs::write(
        &kubeconfig,
        text.replace(plane.url(), &format!("https://{}", proxy.addr())),
    )
    .expect("proxied kubeconfig");
    let sim = simulator().await;
    let sim_url = sim.base_url();
    let mut child = spawn_run_on_sim(
        &kubeconfig,
        &db,
        &["--replica-name", "compacted", "--poll-period", "3600s"],
        &sim_url,
    );
    let log = capture_stderr(&mut child);
    let crs: Api<AutoApproval> = Api::namespaced(real.admin.clone(), &real.ns.name);
    let approved = |id: i64| {
        let crs = crs.clone();
        async move {
            eventually(&format!("request {id} to be approved"), || async {
                let cr = crs.get_opt(&crd::cr_name(id)).await.ok()??;
                (cr.status?.phase? == Phase::Approved).then_some(())
            })
            .await;
        }
    };
    owner_now(401).insert(&db).await;
    approved(401).await;

    // Two writes past the watch's last resourceVersion, then no history up to them.
    let config_maps: Api<ConfigMap> = Api::namespaced(real.admin.clone(), &real.ns.name);
    for name in ["after-1", "after-2"] {
        config_maps
            .create(
                &PostParams::default(),
                &ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.into()),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                },
            )
            .await
            .expect("a ConfigMap");
    }
    let revision = plane.compact_etcd().await.expect("etcd compacted");
    proxy.reset();
    let gone = eventually("the replica's watch to be answered 410 Gone", || async {
        let log = log.lock().expect("log").clone();
        log.lines()
            .find(|l| l.contains("cannot list or watch AutoApprovals") && l.contains("too old"))
            .map(str::to_owned)
    })
    .await
    .expect("a line");
    eprintln!("etcd compacted at revision {revision}; the replica logged: {gone}");

    let inserted = tokio::time::Instant::now();
    owner_now(402).insert(&db).await;
    approved(402).await;
    eprintln!(
        "request 402 approved {:?} after its insert",
        inserted.elapsed()
    );
    assert_eq!(request_status(&db, 402).await, "APPROVED");
    sigterm(child.id().expect("pid"));
    let _ = child.wait().await;
    plane.stop();
}

/// The sum of kube-apiserver's `apiserver_request_total` over the series with every one
/// of `labels`: what the server itself counted (the plane must be the test's own).
async fn apiserver_requests(cluster: &Cluster, labels: &[&str]) -> f64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a request");
    let text = cluster
        .client
        .request_text(request)
        .await
        .expect("kube-apiserver's /metrics");
    metric_sum(&text, "apiserver_request_total", labels)
}

/// Sets the verbs of the Role's rule on `autoapprovals`, as an administrator would.
async fn set_autoapproval_verbs(cluster: &Cluster, verbs: &[&str]) {
    let roles: Api<Role> = Api::namespaced(cluster.client.clone(), &cluster.ns);
    let mut role = roles
        .list(&Default::default())
        .await
        .expect("roles")
        .items
        .pop()
        .expect("the chart's Role");
    for rule in role.rules.iter_mut().flatten() {
        if rule
            .resources
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r == "autoapprovals"))
        {
            rule.verbs = verbs.iter().map(|v| (*v).to_owned()).collect();
        }
    }
    let name = role.metadata.name.clone().expect("a name");
    roles
        .replace(&name, &PostParams::default(), &role)
        .await
        .expect("the Role replaced");
}

on_both!(a_restarted_replica_approves_new_requests_before_its_cr_cache_syncs_on_the_real_server);
/// `discovery::a_restarted_replica_approves_new_requests_before_its_cr_cache_syncs` on
/// the real server: there the test API server fails every list of AutoApprovals on
/// demand; here the real RBAC authorizer refuses them (403), the chart's Role stripped of
/// `list` on autoapprovals while the replica restarts, so its cache cannot sync. The
/// request is still approved and shown, from its CR's create response; once the Role
/// grants `list` again the cache syncs, the Controller reconciles what it lists, and
/// kube-apiserver's own count of status writes shows none a second time.
async fn a_restarted_replica_approves_new_requests_before_its_cr_cache_syncs_on_the_real_server(
    db: Db,
) {
    let plane = private_control_plane(Options::default()).await;
    let mut settings = quick_leases();
    settings.reconcile.in_progress_after = std::time::Duration::from_secs(3600);
    let mut cluster = Cluster::real_on(plane, db.clone(), quick_leases(), |_| {}).await;
    cluster.wait_every_shard().await;
    cluster.stop().await;
    set_autoapproval_verbs(&cluster, &["watch", "create", "delete"]).await;
    cluster.restart(settings);
    cluster.wait_every_shard().await;
    cluster.wait_listening().await;
    let reconciled = reconciles_done(&cluster);
    owner_now(72).insert(&db).await;

    let approved = cluster.wait_phase(72, Phase::Approved).await;
    assert_eq!(request_status(&db, 72).await, "APPROVED");
    // The real authorizer refuses the ServiceAccount every list of AutoApprovals.
    let can_i = cluster
        .kubectl(&[
            "auth",
            "can-i",
            "list",
            "autoapprovals.autoapproval.io",
            "--as",
            &format!("system:serviceaccount:{}:autoapproval", cluster.ns),
        ])
        .await;
    assert_eq!(String::from_utf8_lossy(&can_i.stdout).trim(), "no");
    assert_eq!(
        approved.status.as_ref().map(|s| s.retry_count),
        Some(0),
        "{approved:?}"
    );
    eventually("the early attempt to be counted", || async {
        (reconciles_done(&cluster) > reconciled).then_some(())
    })
    .await;
    let status = [r#"resource="autoapprovals""#, r#"subresource="status""#];
    let patched = apiserver_requests(&cluster, &status).await;
    assert!(patched > 0.0, "kube-apiserver counted the status writes");
    let reconciled = reconciles_done(&cluster);

    // The Role grants the list again: the cache syncs and the Controller reconciles
    // what it lists, the approved CR among them.
    set_autoapproval_verbs(&cluster, &["list", "watch", "create", "delete"]).await;
    eventually("a reconcile after the cache's sync", || async {
        (reconciles_done(&cluster) > reconciled).then_some(())
    })
    .await;
    assert_eq!(
        apiserver_requests(&cluster, &status).await - patched,
        0.0,
        "status writes after the sync"
    );
    cluster.stop().await;
    plane.stop();
}
