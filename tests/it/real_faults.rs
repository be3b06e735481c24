//! Faults only the real control plane shows, each on a control plane of the test's
//! own (crates/control-plane): etcd's history compacted under a running controller, so
//! its watch is answered `410 Gone`. kube-apiserver killed and restarted under three
//! replicas is `replicas::the_api_server_killed_and_restarted_mid_run_*` (it needs the
//! fleet), a Role rule removed `real_server::each_rule_missing_from_the_role_*`.

use ::control_plane::Options;
use autoapproval::controller::crd::{self, AutoApproval, Phase};
use k8s_openapi::api::core::v1::ConfigMap;
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
    let mut child = spawn_run(
        &kubeconfig,
        free_port(),
        &db,
        &["--replica-name", "compacted", "--poll-period", "3600s"],
        &[
            ("AUTOAPPROVAL_ESIGN_URL", &sim_url),
            ("AUTOAPPROVAL_OWNER_URL", &sim_url),
            ("AUTOAPPROVAL_STORE_URL", &sim_url),
            ("AUTOAPPROVAL_AD_URL", &sim_url),
            ("NO_COLOR", "1"),
        ],
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
