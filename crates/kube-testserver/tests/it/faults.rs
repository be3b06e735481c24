//! Fault injection, driven from the Rust handle and from the admin endpoint.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, Config};
use kube_testserver::{Match, Options, TestServer};
use serde_json::json;
use std::time::{Duration, Instant};

fn client(server: &TestServer) -> Client {
    let mut c = Config::new(server.url().parse().unwrap());
    c.default_namespace = "default".into();
    Client::try_from(c).unwrap()
}

fn api_code(r: Result<impl std::fmt::Debug, kube::Error>) -> u16 {
    match r {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_next_counts_down_and_matches_only_its_target() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client(&server));
    server
        .faults()
        .fail_next(2, 500, Match::any().verb("list").resource("configmaps"));
    // A get is not a list: unaffected.
    assert_eq!(api_code(api.get("missing").await), 404);
    assert_eq!(api_code(api.list(&ListParams::default()).await), 500);
    assert_eq!(api_code(api.list(&ListParams::default()).await), 500);
    api.list(&ListParams::default()).await.unwrap();
    assert!(
        server.faults().rules().is_empty(),
        "spent rules are removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_answers_429_with_retry_after() {
    let server = TestServer::start(Options::default()).await.unwrap();
    server
        .faults()
        .fail_next(1, 429, Match::any().resource("configmaps"));
    let resp = reqwest::get(format!(
        "{}/api/v1/namespaces/default/configmaps",
        server.url()
    ))
    .await
    .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "TooManyRequests");
    assert_eq!(body["code"], 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoint_adds_lists_and_clears_rules() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client(&server));
    let http = reqwest::Client::new();
    let url = format!("{}/_testserver/faults", server.url());
    let resp = http
        .post(&url)
        .json(&json!({"verb": "create", "resource": "configmaps", "status": 500, "count": 1}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let rules: serde_json::Value = http.get(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(rules[0]["status"], 500);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap();
    assert_eq!(api_code(api.create(&PostParams::default(), &cm).await), 500);
    api.create(&PostParams::default(), &cm).await.unwrap();

    // A rule that never runs out, then cleared over HTTP.
    http.post(&url)
        .json(&json!({"verb": "get", "status": 500}))
        .send()
        .await
        .unwrap();
    assert_eq!(api_code(api.get("a").await), 500);
    http.delete(&url).send().await.unwrap();
    api.get("a").await.unwrap();

    // A malformed rule is refused with a message, and nothing is added.
    let resp = http
        .post(&url)
        .body(r#"{"status": "five hundred"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert!(resp.text().await.unwrap().contains("invalid fault rule"));
    assert!(server.faults().rules().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fraction_fails_some_and_not_all() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client(&server));
    server
        .faults()
        .fail_fraction(0.5, 500, Match::any().verb("list"));
    let mut failed = 0;
    for _ in 0..200 {
        if api.list(&ListParams::default()).await.is_err() {
            failed += 1;
        }
    }
    // Binomial(200, 0.5): outside [50, 150] has probability < 1e-12.
    assert!((50..=150).contains(&failed), "{failed} of 200 failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_delays_matching_requests() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client(&server));
    server
        .faults()
        .add_latency(Duration::from_millis(300), Match::any().verb("list"));
    let t = Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_watches_ends_open_streams() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client(&server));
    let mut stream = api
        .watch(&WatchParams::default().timeout(290), "0")
        .await
        .unwrap()
        .boxed();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "w"}})).unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    match stream.next().await {
        Some(Ok(WatchEvent::Added(o))) => assert_eq!(o.metadata.name.as_deref(), Some("w")),
        other => panic!("expected ADDED, got {other:?}"),
    }
    // Admin endpoint this time.
    reqwest::Client::new()
        .post(format!("{}/_testserver/close-watches", server.url()))
        .send()
        .await
        .unwrap();
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        let mut n = 0;
        while stream.next().await.is_some() {
            n += 1;
        }
        n
    })
    .await
    .expect("the watch stream must end when watches are closed");
    assert_eq!(rest, 0, "no events after the close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_holds_requests_until_resumed() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client(&server));
    server.faults().hang(None);
    let api2 = api.clone();
    let pending = tokio::spawn(async move { api2.list(&ListParams::default()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "a request must wait during a hang");
    server.faults().resume();
    tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("answered after resume")
        .unwrap()
        .unwrap();

    // A timed hang ends by itself.
    server.faults().hang(Some(Duration::from_millis(200)));
    tokio::time::timeout(Duration::from_secs(10), api.list(&ListParams::default()))
        .await
        .expect("a timed hang ends")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_drops_connections_until_resumed() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let url = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    // A fresh client per call so no pooled connection hides the outage.
    let get = || async { reqwest::Client::new().get(&url).send().await };
    assert!(get().await.unwrap().status().is_success());
    server.faults().refuse(None);
    let err = get().await.expect_err("refused while the outage lasts");
    assert!(err.is_connect() || err.is_request(), "{err:?}");
    server.faults().resume();
    assert!(get().await.unwrap().status().is_success());
}
