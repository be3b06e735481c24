//! The HTTP clients against the simulator over loopback: idempotency, error
//! classification, the in-flight limit, tokens and the simulator's counters.

use std::net::SocketAddr;
use std::time::Duration;

use autoapproval::external::http::{ExternalArgs, HttpExternalSystems};
use autoapproval::external::{
    CampaignApproval, ContractStatus, ErrorKind, ExternalSystems, IdempotencyKey, NewOwner,
    NewStore, System,
};
use autoapproval_sim::{FaultKind, Faults, SimConfig, SimHandle, SimSystem, Simulator};

const ANY_PORT: &str = "127.0.0.1:0";

async fn sim(options: SimConfig) -> SimHandle {
    let addr: SocketAddr = ANY_PORT.parse().unwrap();
    Simulator::start(addr, options).await.unwrap()
}

fn clients(sim: &SimHandle, tweak: impl FnOnce(&mut ExternalArgs)) -> ExternalSystems {
    let mut config = ExternalArgs::all_at(sim.base_url()).expect("defaults");
    tweak(&mut config);
    HttpExternalSystems::build(&config).unwrap()
}

fn owner(request_id: i64) -> NewOwner {
    NewOwner {
        request_id,
        business_name: format!("Business {request_id}"),
    }
}

#[tokio::test]
async fn a_full_chain_creates_owner_store_and_campaign_once_each() {
    let sim = sim(SimConfig::default()).await;
    let ext = clients(&sim, |_| {});

    assert_eq!(
        ext.esign.contract_status("c-42").await.unwrap(),
        ContractStatus::Signed
    );
    sim.set_contract_status("c-42", ContractStatus::Pending);
    assert_eq!(
        ext.esign.contract_status("c-42").await.unwrap(),
        ContractStatus::Pending
    );

    let owner_number = ext
        .owner
        .create_owner(&IdempotencyKey::new(42, "owner"), &owner(42))
        .await
        .unwrap();
    let store = NewStore {
        request_id: 42,
        owner_number,
        store_name: "Store 42".into(),
    };
    let store_number = ext
        .store
        .create_store(&IdempotencyKey::new(42, "store"), &store)
        .await
        .unwrap();
    let info = ext.store.lookup_store(store_number).await.unwrap().unwrap();
    assert_eq!((info.store_number, info.open), (store_number, true));
    let campaign = ext
        .ad
        .approve_campaign(
            &IdempotencyKey::new(42, "campaign"),
            &CampaignApproval {
                request_id: 42,
                store_number,
            },
        )
        .await
        .unwrap();
    assert!(!campaign.is_empty());

    let stats = sim.stats();
    assert_eq!(stats.calls_to("GET /esign/contracts/{ref}"), 2);
    assert_eq!(stats.calls_to("POST /owners"), 1);
    assert_eq!(stats.calls_to("POST /stores"), 1);
    assert_eq!(stats.calls_to("GET /stores/{n}"), 1);
    assert_eq!(stats.calls_to("POST /campaigns/approvals"), 1);
    let per_request = stats.for_request(42);
    assert_eq!(
        (per_request.owner, per_request.store, per_request.campaign),
        (1, 1, 1)
    );
    assert_eq!(
        (
            stats.created.owners,
            stats.created.stores,
            stats.created.campaigns
        ),
        (1, 1, 1)
    );
    assert_eq!(stats.idempotent_replays, 0);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_replayed_key_returns_the_first_number_and_creates_once() {
    let sim = sim(SimConfig::default()).await;
    let ext = clients(&sim, |_| {});
    let key = IdempotencyKey::new(7, "owner");

    let first = ext.owner.create_owner(&key, &owner(7)).await.unwrap();
    let second = ext.owner.create_owner(&key, &owner(7)).await.unwrap();
    let other = ext
        .owner
        .create_owner(&IdempotencyKey::new(8, "owner"), &owner(8))
        .await
        .unwrap();

    assert_eq!(first, second);
    assert_ne!(first, other);
    let stats = sim.stats();
    assert_eq!(stats.created.owners, 2);
    assert_eq!(stats.idempotent_replays, 1);
    assert_eq!(stats.for_request(7).owner, 1);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn twenty_concurrent_calls_with_one_key_create_once() {
    let sim = sim(SimConfig {
        faults: Faults {
            latency: Duration::from_millis(20),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let ext = clients(&sim, |_| {});
    let key = IdempotencyKey::new(9, "store");
    let store = NewStore {
        request_id: 9,
        owner_number: 1,
        store_name: "Nine".into(),
    };

    let calls = (0..20).map(|_| ext.store.create_store(&key, &store));
    let numbers: Vec<i64> = futures::future::try_join_all(calls).await.unwrap();

    assert!(numbers.iter().all(|&n| n == numbers[0]), "{numbers:?}");
    let stats = sim.stats();
    assert_eq!(stats.created.stores, 1);
    assert_eq!(stats.idempotent_replays, 19);
    assert_eq!(stats.for_request(9).store, 1);
    assert!(stats.in_flight_max.store > 1, "calls were not concurrent");
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_500_is_transient() {
    let sim = sim(SimConfig::default()).await;
    let ext = clients(&sim, |_| {});
    sim.set_faults(Faults::fail_next(System::ESign, 1, FaultKind::Error))
        .unwrap();

    let err = ext.esign.contract_status("c-1").await.unwrap_err();

    assert_eq!(err.kind, ErrorKind::Transient);
    assert_eq!(err.system, System::ESign);
    assert_eq!(err.operation, "contract_status");
    assert!(err.message.contains("500"), "{}", err.message);
    assert!(ext.esign.contract_status("c-1").await.is_ok());
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_hang_longer_than_the_client_timeout_is_transient_and_keeps_the_creation() {
    let sim = sim(SimConfig::default()).await;
    let ext = clients(&sim, |c| c.external_timeout = Duration::from_millis(200));
    sim.set_faults(Faults {
        hang: Duration::from_secs(30),
        ..Faults::fail_next(System::Owner, 1, FaultKind::Timeout)
    })
    .unwrap();
    let key = IdempotencyKey::new(11, "owner");

    let started = std::time::Instant::now();
    let err = ext.owner.create_owner(&key, &owner(11)).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(err.kind, ErrorKind::Transient);
    assert!(err.message.contains("timed out"), "{}", err.message);

    // The owner was created before the hang: the retry replays it.
    let number = ext.owner.create_owner(&key, &owner(11)).await.unwrap();
    let stats = sim.stats();
    assert_eq!(stats.created.owners, 1);
    assert_eq!(stats.idempotent_replays, 1);
    assert!(number > 0);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_malformed_answer_is_transient_on_every_operation() {
    let sim = sim(SimConfig {
        faults: Faults {
            malformed_rate: 1.0,
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let ext = clients(&sim, |_| {});
    sim.add_store(5, true);
    let key = |step| IdempotencyKey::new(12, step);
    let store = NewStore {
        request_id: 12,
        owner_number: 1,
        store_name: "Twelve".into(),
    };
    let approval = CampaignApproval {
        request_id: 12,
        store_number: 5,
    };

    let errors = [
        ext.esign.contract_status("c-12").await.unwrap_err(),
        ext.owner
            .create_owner(&key("owner"), &owner(12))
            .await
            .unwrap_err(),
        ext.store
            .create_store(&key("store"), &store)
            .await
            .unwrap_err(),
        ext.store.lookup_store(5).await.unwrap_err(),
        ext.ad
            .approve_campaign(&key("campaign"), &approval)
            .await
            .unwrap_err(),
    ];

    for err in &errors {
        assert_eq!(err.kind, ErrorKind::Transient, "{err}");
        assert!(err.message.contains("malformed"), "{err}");
    }
    assert_eq!(sim.stats().faults_injected.malformed, 5);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
/// An answer whose body is larger than the client reads (a misrouted call
/// answered by a file server, a downstream gone wrong) is a named bad
/// answer, retried as transient; the owner it made is replayed by the
/// retry. Before, the whole body was read, however large.
async fn an_answer_larger_than_the_limit_is_a_transient_bad_answer() {
    use autoapproval::external::http::MAX_ANSWER_BODY;

    let sim = sim(SimConfig::default()).await;
    let ext = clients(&sim, |_| {});
    sim.set_faults(Faults::fail_next(System::Owner, 1, FaultKind::Oversized))
        .unwrap();
    let key = IdempotencyKey::new(14, "owner");

    let err = ext.owner.create_owner(&key, &owner(14)).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transient, "{err}");
    assert!(err.message.contains("answer too large"), "{err}");
    assert!(
        err.message
            .contains(&format!("{} KiB limit", MAX_ANSWER_BODY / 1024)),
        "{err}"
    );
    assert_eq!(sim.stats().faults_injected.oversized, 1);

    let number = ext.owner.create_owner(&key, &owner(14)).await.unwrap();
    assert!(number > 0);
    assert_eq!(sim.stats().created.owners, 1, "the retry replays the owner");
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_refused_input_is_permanent_and_a_missing_store_is_none() {
    let sim = sim(SimConfig::default()).await;
    let ext = clients(&sim, |_| {});

    assert_eq!(ext.store.lookup_store(999).await.unwrap(), None);
    let err = ext
        .ad
        .approve_campaign(
            &IdempotencyKey::new(13, "campaign"),
            &CampaignApproval {
                request_id: 13,
                store_number: 999,
            },
        )
        .await
        .unwrap_err();

    assert_eq!(err.kind, ErrorKind::Permanent);
    assert!(err.message.contains("422"), "{}", err.message);
    assert_eq!(sim.stats().created.campaigns, 0);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn nothing_listening_is_transient() {
    let listener = std::net::TcpListener::bind(ANY_PORT).unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let ext = HttpExternalSystems::build(&ExternalArgs::all_at(base).expect("defaults")).unwrap();

    let err = ext.esign.contract_status("c").await.unwrap_err();

    assert_eq!(err.kind, ErrorKind::Transient);
}

#[tokio::test]
async fn a_burst_never_exceeds_the_in_flight_limit() {
    const LIMIT: usize = 4;
    let sim = sim(SimConfig {
        faults: Faults {
            latency: Duration::from_millis(20),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let ext = clients(&sim, |c| c.external_concurrency = LIMIT);
    sim.add_store(1, true);

    let calls = (0..100).map(|_| ext.store.lookup_store(1));
    let found = futures::future::try_join_all(calls).await.unwrap();

    assert!(found.iter().all(Option::is_some));
    let stats = sim.stats();
    assert_eq!(stats.calls_to("GET /stores/{n}"), 100);
    let max = *stats.in_flight_max.get(SimSystem::Store);
    assert!(
        max <= LIMIT as u64,
        "observed {max} in flight, limit {LIMIT}"
    );
    assert!(max > 1, "the burst was not concurrent at all");
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_bearer_token_is_sent_and_required() {
    let sim = sim(SimConfig {
        require_tokens: vec![autoapproval::external::http::Secret::new("s3cret")],
        ..SimConfig::default()
    })
    .await;
    let with = clients(&sim, |c| *c = c.clone().with_token("s3cret"));
    let wrong = clients(&sim, |c| *c = c.clone().with_token("guess"));
    let without = clients(&sim, |_| {});

    assert!(with.esign.contract_status("c").await.is_ok());
    let key = IdempotencyKey::new(14, "owner");
    assert!(with.owner.create_owner(&key, &owner(14)).await.is_ok());
    for ext in [&wrong, &without] {
        let err = ext.esign.contract_status("c").await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Permanent);
        assert!(err.message.contains("401"), "{}", err.message);
    }
    assert_eq!(sim.stats().unauthorized, 2);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn fail_next_fails_exactly_the_next_n_calls_of_its_system() {
    let sim = sim(SimConfig::default()).await;
    let ext = clients(&sim, |_| {});
    sim.set_faults(Faults::fail_next(System::Owner, 2, FaultKind::Error))
        .unwrap();
    let key = IdempotencyKey::new(15, "owner");

    // Other systems are untouched.
    assert!(ext.esign.contract_status("c").await.is_ok());
    assert!(ext.owner.create_owner(&key, &owner(15)).await.is_err());
    assert!(ext.owner.create_owner(&key, &owner(15)).await.is_err());
    assert!(ext.owner.create_owner(&key, &owner(15)).await.is_ok());
    assert!(ext.owner.create_owner(&key, &owner(15)).await.is_ok());

    let stats = sim.stats();
    assert_eq!(stats.faults_injected.error, 2);
    assert_eq!(stats.calls_to("POST /owners"), 4);
    assert_eq!(stats.created.owners, 1);
    assert_eq!(stats.idempotent_replays, 1);
    assert_eq!(sim.faults().fail_next, None);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_admin_api_sets_faults_data_and_resets() {
    let sim = sim(SimConfig::default()).await;
    let http = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", sim.base_url());

    let put = http
        .put(url("/admin/faults"))
        .json(
            &serde_json::json!({"system": "esign", "failNext": {"count": 1, "kind": "malformed"}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let bad = http
        .put(url("/admin/faults"))
        .json(&serde_json::json!({"errorRate": 2.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let faults: Faults = http
        .get(url("/admin/faults"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(faults.system, Some(SimSystem::Esign));

    let status = |path: &str, body: serde_json::Value| {
        let request = http.put(url(path)).json(&body);
        async move { request.send().await.unwrap().status() }
    };
    assert_eq!(
        status(
            "/admin/esign/c-9",
            serde_json::json!({"status": "REJECTED"})
        )
        .await,
        204
    );
    assert_eq!(
        status("/admin/stores/77", serde_json::json!({"open": false})).await,
        204
    );

    let ext = clients(&sim, |_| {});
    assert!(ext.esign.contract_status("c-9").await.is_err());
    assert_eq!(
        ext.esign.contract_status("c-9").await.unwrap(),
        ContractStatus::Rejected
    );
    assert_eq!(
        ext.store.lookup_store(77).await.unwrap().map(|s| s.open),
        Some(false)
    );

    // Admin calls are never faulted nor counted.
    let stats: serde_json::Value = http
        .get(url("/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["calls"]["GET /esign/contracts/{ref}"], 2);
    assert_eq!(stats["faultsInjected"]["malformed"], 1);
    assert!(stats["calls"].get("GET /stats").is_none());

    let reset = http.post(url("/admin/reset")).send().await.unwrap();
    assert_eq!(reset.status(), 204);
    assert_eq!(sim.stats().calls_to("GET /esign/contracts/{ref}"), 0);
    assert_eq!(ext.store.lookup_store(77).await.unwrap(), None);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_mutation_without_idempotency_key_is_refused() {
    let sim = sim(SimConfig::default()).await;

    let answer = reqwest::Client::new()
        .post(format!("{}/owners", sim.base_url()))
        .json(&serde_json::json!({"requestId": 1, "businessName": "x"}))
        .send()
        .await
        .unwrap();

    assert_eq!(answer.status(), 400);
    assert_eq!(sim.stats().created.owners, 0);
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_cuts_a_hanging_call_short() {
    let sim = sim(SimConfig {
        faults: Faults {
            timeout_rate: 1.0,
            hang: Duration::from_secs(60),
            ..Faults::default()
        },
        ..SimConfig::default()
    })
    .await;
    let ext = clients(&sim, |c| c.external_timeout = Duration::from_secs(30));
    let call = tokio::spawn(async move { ext.esign.contract_status("c").await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while sim.stats().faults_injected.timeout == 0 {
        assert!(tokio::time::Instant::now() < deadline, "call never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    tokio::time::timeout(Duration::from_secs(5), sim.shutdown())
        .await
        .expect("shutdown waited for the hang")
        .unwrap();

    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transient);
}

/// Two creations for one request worked on at once (two chains) are an
/// overlap in `/stats`; for two requests, or one after the other, they are not.
#[tokio::test]
async fn creations_for_one_request_at_once_are_counted_as_overlapping() {
    let sim = sim(SimConfig::default()).await;
    sim.set_faults(Faults {
        latency: Duration::from_millis(300),
        ..Faults::default()
    })
    .unwrap();
    let ext = clients(&sim, |_| {});
    let (key1, key2) = (
        IdempotencyKey::new(1, "owner"),
        IdempotencyKey::new(2, "owner"),
    );
    let (owner1, owner2) = (owner(1), owner(2));
    let (a, b, c) = tokio::join!(
        ext.owner.create_owner(&key1, &owner1),
        ext.owner.create_owner(&key1, &owner1),
        ext.owner.create_owner(&key2, &owner2),
    );
    assert!(a.is_ok() && b.is_ok() && c.is_ok());
    assert_eq!(sim.stats().overlapping_creations, 1);
    ext.owner.create_owner(&key1, &owner1).await.unwrap();
    assert_eq!(sim.stats().overlapping_creations, 1, "one after the other");
    sim.shutdown().await.unwrap();
}
