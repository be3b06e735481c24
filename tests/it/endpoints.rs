//! The replica's HTTP endpoints: `/healthz`, `/readyz` and `/metrics`.

use autoapproval::telemetry::Metrics;
use kube_testserver::{Options, TestServer};

use crate::support::{Db, client_for, on_both};

on_both!(health_readiness_and_metrics_are_served);
async fn health_readiness_and_metrics_are_served(db: Db) {
    use autoapproval::endpoints::{Health, router};

    let server = TestServer::start(Options::default())
        .await
        .expect("test API server");
    let store = db.database();
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
