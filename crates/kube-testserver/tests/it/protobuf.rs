//! Protobuf as client-go's typed clients speak it. For every built-in kind served in protobuf,
//! the object read in protobuf is the object read in JSON: it decodes with k8s-pb's own messages
//! (independently of the server's field table), and written back in protobuf it reads back in
//! JSON unchanged. Watches stream length-delimited protobuf frames; custom resources stay JSON.

use k8s_pb::apimachinery::pkg::apis::meta::v1::{ObjectMeta, WatchEvent};
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use kube_testserver::{Options, TestServer};
use prost::Message;
use serde::Deserialize;
use serde_json::{Value, json};

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// What client-go's typed clients send.
const ACCEPT_PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";

fn fixtures() -> Vec<Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/protobuf.yaml"
    ))
    .unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .collect()
}

fn plural(kind: &str) -> String {
    match kind {
        "PodDisruptionBudget" => "poddisruptionbudgets".into(),
        "NetworkPolicy" => "networkpolicies".into(),
        k => format!("{}s", k.to_lowercase()),
    }
}

/// The collection URL of an object (namespace `default` for namespaced kinds).
fn collection(server: &TestServer, o: &Value) -> String {
    let api_version = o["apiVersion"].as_str().unwrap();
    let kind = o["kind"].as_str().unwrap();
    let prefix = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding"].contains(&kind);
    let ns = if cluster_scoped {
        String::new()
    } else {
        "/namespaces/default".into()
    };
    format!("{}{prefix}{ns}/{}", server.url(), plural(kind))
}

fn item(server: &TestServer, o: &Value) -> String {
    format!(
        "{}/{}",
        collection(server, o),
        o["metadata"]["name"].as_str().unwrap()
    )
}

/// `k8s\0` + runtime.Unknown, as client-go writes a body.
fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = b"k8s\0".to_vec();
    unknown.encode(&mut out).unwrap();
    out
}

/// The runtime.Unknown inside a protobuf body.
fn unwrap_envelope(body: &[u8]) -> Unknown {
    let raw = body
        .strip_prefix(b"k8s\0")
        .unwrap_or_else(|| panic!("no k8s\\0 prefix: {body:?}"));
    Unknown::decode(raw).expect("a runtime.Unknown")
}

/// Decodes `raw` as the k8s-pb message of `kind` and returns its metadata.
fn typed_metadata(api_version: &str, kind: &str, raw: &[u8]) -> ObjectMeta {
    use k8s_pb::api::*;
    fn meta<T: Message + Default + k8s_pb::Metadata<Ty = ObjectMeta>>(raw: &[u8]) -> ObjectMeta {
        let m = T::decode(raw).unwrap_or_else(|e| panic!("{}: {e}", std::any::type_name::<T>()));
        m.metadata().cloned().expect("metadata")
    }
    match (api_version, kind) {
        ("v1", "Namespace") => meta::<core::v1::Namespace>(raw),
        ("v1", "Secret") => meta::<core::v1::Secret>(raw),
        ("v1", "ConfigMap") => meta::<core::v1::ConfigMap>(raw),
        ("v1", "ServiceAccount") => meta::<core::v1::ServiceAccount>(raw),
        ("v1", "Service") => meta::<core::v1::Service>(raw),
        ("v1", "Pod") => meta::<core::v1::Pod>(raw),
        ("v1", "Event") => meta::<core::v1::Event>(raw),
        ("apps/v1", "Deployment") => meta::<apps::v1::Deployment>(raw),
        ("batch/v1", "Job") => meta::<batch::v1::Job>(raw),
        ("rbac.authorization.k8s.io/v1", "Role") => meta::<rbac::v1::Role>(raw),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => meta::<rbac::v1::RoleBinding>(raw),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => meta::<rbac::v1::ClusterRole>(raw),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            meta::<rbac::v1::ClusterRoleBinding>(raw)
        }
        ("policy/v1", "PodDisruptionBudget") => meta::<policy::v1::PodDisruptionBudget>(raw),
        ("networking.k8s.io/v1", "NetworkPolicy") => meta::<networking::v1::NetworkPolicy>(raw),
        ("coordination.k8s.io/v1", "Lease") => meta::<coordination::v1::Lease>(raw),
        ("events.k8s.io/v1", "Event") => meta::<events::v1::Event>(raw),
        other => panic!("no k8s-pb message listed for {other:?}"),
    }
}

/// The object minus what every write changes.
fn comparable(mut o: Value) -> Value {
    if let Some(m) = o["metadata"].as_object_mut() {
        m.remove("resourceVersion");
        m.remove("managedFields");
        m.remove("generation");
    }
    o
}

async fn get(http: &reqwest::Client, url: &str, accept: &str) -> (String, Vec<u8>) {
    let resp = http.get(url).header("accept", accept).send().await.unwrap();
    assert_eq!(resp.status(), 200, "GET {url}");
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    (ct, resp.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn every_builtin_kind_reads_and_writes_the_same_object_in_protobuf_as_in_json() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let http = reqwest::Client::new();
    let fixtures = fixtures();
    assert_eq!(fixtures.len(), 17, "one object per kind served in protobuf");
    for fixture in fixtures {
        let api_version = fixture["apiVersion"].as_str().unwrap();
        let kind = fixture["kind"].as_str().unwrap();
        let what = format!("{kind} {api_version}");
        let resp = http
            .post(collection(&server, &fixture))
            .json(&fixture)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201, "{what}: {}", resp.text().await.unwrap());

        let (ct, body) = get(&http, &item(&server, &fixture), "application/json").await;
        assert!(ct.starts_with("application/json"), "{what}: {ct}");
        let in_json: Value = serde_json::from_slice(&body).unwrap();
        let (ct, in_protobuf) = get(&http, &item(&server, &fixture), ACCEPT_PROTOBUF).await;
        assert_eq!(ct, PROTOBUF, "{what}");

        // k8s-pb reads what the server wrote: the envelope names the kind, the message the object.
        let unknown = unwrap_envelope(&in_protobuf);
        let type_meta = unknown.type_meta.clone().unwrap();
        assert_eq!(
            type_meta.api_version.as_deref(),
            Some(api_version),
            "{what}"
        );
        assert_eq!(type_meta.kind.as_deref(), Some(kind), "{what}");
        let meta = typed_metadata(api_version, kind, unknown.raw.as_deref().unwrap());
        assert_eq!(meta.name.as_deref(), in_json["metadata"]["name"].as_str());
        assert_eq!(meta.uid.as_deref(), in_json["metadata"]["uid"].as_str());
        assert_eq!(
            meta.resource_version.as_deref(),
            in_json["metadata"]["resourceVersion"].as_str()
        );

        // The protobuf object, written back as client-go writes an update, is the JSON object.
        let resp = http
            .put(item(&server, &fixture))
            .header("content-type", PROTOBUF)
            .header("accept", ACCEPT_PROTOBUF)
            .body(in_protobuf.clone())
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
        let body = resp.bytes().await.unwrap();
        assert_eq!(status, 200, "{what}: {}", String::from_utf8_lossy(&body));
        assert_eq!(ct, PROTOBUF, "{what}: the update answers in protobuf");
        let (_, body) = get(&http, &item(&server, &fixture), "application/json").await;
        let after: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            comparable(after),
            comparable(in_json.clone()),
            "{what}: protobuf round trip"
        );
        // And every field the fixture set survived into JSON.
        for (key, value) in fixture.as_object().unwrap() {
            if key != "metadata" {
                assert_eq!(&in_json[key], value, "{what}: {key}");
            }
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn objects_created_in_protobuf_read_back_in_json_as_client_go_wrote_them() {
    use k8s_pb::api::core::v1::{Namespace, Secret};
    let server = TestServer::start(Options::default()).await.unwrap();
    let http = reqwest::Client::new();

    // `kubectl create namespace`: Go writes every non-pointer field, empty ones included.
    let ns = Namespace {
        metadata: Some(ObjectMeta {
            name: Some("typed".into()),
            namespace: Some(String::new()),
            resource_version: Some(String::new()),
            generation: Some(0),
            creation_timestamp: Some(Default::default()),
            ..Default::default()
        }),
        spec: Some(Default::default()),
        status: Some(Default::default()),
    };
    let resp = http
        .post(format!("{}/api/v1/namespaces", server.url()))
        .header("content-type", PROTOBUF)
        .header("accept", ACCEPT_PROTOBUF)
        .body(envelope("v1", "Namespace", ns.encode_to_vec()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let created = unwrap_envelope(&resp.bytes().await.unwrap());
    let created = Namespace::decode(created.raw.as_deref().unwrap()).unwrap();
    let meta = created.metadata.unwrap();
    assert_eq!(meta.name.as_deref(), Some("typed"));
    assert!(meta.uid.is_some_and(|u| !u.is_empty()));
    assert!(meta.creation_timestamp.and_then(|t| t.seconds).unwrap() > 0);

    // Helm's release record: a Secret whose data is arbitrary bytes.
    let release: Vec<u8> = (0..=255).collect();
    let secret = Secret {
        metadata: Some(ObjectMeta {
            name: Some("sh.helm.release.v1.demo.v1".into()),
            labels: [("owner".to_owned(), "helm".to_owned())].into(),
            ..Default::default()
        }),
        data: [("release".to_owned(), release.clone())].into(),
        r#type: Some("helm.sh/release.v1".into()),
        ..Default::default()
    };
    let url = format!("{}/api/v1/namespaces/typed/secrets", server.url());
    let resp = http
        .post(&url)
        .header("content-type", PROTOBUF)
        .body(envelope("v1", "Secret", secret.encode_to_vec()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    let (_, body) = get(
        &http,
        &format!("{url}/sh.helm.release.v1.demo.v1"),
        "application/json",
    )
    .await;
    let stored: Value = serde_json::from_slice(&body).unwrap();
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD.encode(&release);
    assert_eq!(stored["data"], json!({"release": data}));
    assert_eq!(stored["type"], "helm.sh/release.v1");
    assert_eq!(stored["metadata"]["labels"], json!({"owner": "helm"}));
    for empty in [
        "namespace",
        "resourceVersion",
        "generation",
        "creationTimestamp",
    ] {
        assert!(
            stored["metadata"].get(empty).is_none_or(|v| v != ""),
            "{empty}: {}",
            stored["metadata"]
        );
    }

    // A protobuf list with a label selector, as helm lists its releases.
    let (ct, body) = get(
        &http,
        &format!("{url}?labelSelector=owner%3Dhelm"),
        ACCEPT_PROTOBUF,
    )
    .await;
    assert_eq!(ct, PROTOBUF);
    let list = unwrap_envelope(&body);
    assert_eq!(list.type_meta.unwrap().kind.as_deref(), Some("SecretList"));
    let list = k8s_pb::api::core::v1::SecretList::decode(list.raw.as_deref().unwrap()).unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].data["release"], release);
    assert!(list.metadata.unwrap().resource_version.is_some());
    server.shutdown().await;
}

#[tokio::test]
async fn a_protobuf_watch_streams_length_delimited_watch_events() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let http = reqwest::Client::new();
    let url = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "watched"}, "data": {"a": "1"}});
    assert_eq!(
        http.post(&url).json(&cm).send().await.unwrap().status(),
        201
    );
    let mut resp = http
        .get(format!("{url}?watch=true&timeoutSeconds=5"))
        .header("accept", ACCEPT_PROTOBUF)
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers()["content-type"],
        "application/vnd.kubernetes.protobuf;stream=watch"
    );
    let mut buf = Vec::new();
    let frame = loop {
        if buf.len() >= 4 {
            let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
            if buf.len() >= 4 + len {
                break buf[4..4 + len].to_vec();
            }
        }
        let chunk = resp
            .chunk()
            .await
            .unwrap()
            .expect("a watch event before the stream ends");
        buf.extend_from_slice(&chunk);
    };
    let event = WatchEvent::decode(frame.as_slice()).unwrap();
    assert_eq!(event.r#type.as_deref(), Some("ADDED"));
    let object = unwrap_envelope(event.object.unwrap().raw.as_deref().unwrap());
    assert_eq!(object.type_meta.unwrap().kind.as_deref(), Some("ConfigMap"));
    let cm = k8s_pb::api::core::v1::ConfigMap::decode(object.raw.as_deref().unwrap()).unwrap();
    assert_eq!(cm.metadata.unwrap().name.as_deref(), Some("watched"));
    assert_eq!(cm.data["a"], "1");
    drop(resp);
    server.shutdown().await;
}

#[tokio::test]
async fn custom_resources_stay_json_and_refuse_protobuf_bodies_by_name() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let http = reqwest::Client::new();
    let crd: Value = serde_yaml::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/autoapproval-crd.yaml"
        ))
        .unwrap(),
    )
    .unwrap();
    let crds = format!(
        "{}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        server.url()
    );
    assert_eq!(
        http.post(&crds).json(&crd).send().await.unwrap().status(),
        201
    );
    let group = crd["spec"]["group"].as_str().unwrap();
    let version = crd["spec"]["versions"][0]["name"].as_str().unwrap();
    let plural = crd["spec"]["names"]["plural"].as_str().unwrap();
    let kind = crd["spec"]["names"]["kind"].as_str().unwrap();
    let url = format!(
        "{}/apis/{group}/{version}/namespaces/default/{plural}",
        server.url()
    );

    let (ct, body) = get(&http, &url, ACCEPT_PROTOBUF).await;
    assert!(ct.starts_with("application/json"), "{ct}");
    let list: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(list["kind"], format!("{kind}List"));

    let body = envelope(&format!("{group}/{version}"), kind, vec![]);
    let resp = http
        .post(&url)
        .header("content-type", PROTOBUF)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    let status: Value = resp.json().await.unwrap();
    assert_eq!(status["reason"], "UnsupportedMediaType");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains(kind) && message.contains("JSON"),
        "{message}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn bad_protobuf_bodies_are_refused_by_name_and_misfits_are_answered_in_json() {
    let server = TestServer::start(Options::default()).await.unwrap();
    let http = reqwest::Client::new();
    let url = format!("{}/api/v1/namespaces/default/configmaps", server.url());
    let post = |body: Vec<u8>| {
        http.post(&url)
            .header("content-type", PROTOBUF)
            .body(body)
            .send()
    };

    // Not an envelope at all.
    let resp = post(b"{\"kind\":\"ConfigMap\"}".to_vec()).await.unwrap();
    assert_eq!(resp.status(), 400);
    let status: Value = resp.json().await.unwrap();
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("protobuf") && message.contains("k8s\\0"),
        "{message}"
    );

    // An envelope whose bytes are not the message it names.
    let resp = post(envelope("v1", "ConfigMap", vec![0xff, 0xff, 0xff]))
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let status: Value = resp.json().await.unwrap();
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("not a valid message"),
        "{status}"
    );

    // A Secret sent to the ConfigMaps: refused by kind, nothing stored.
    let secret = k8s_pb::api::core::v1::Secret {
        metadata: Some(ObjectMeta {
            name: Some("misplaced".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let resp = post(envelope("v1", "Secret", secret.encode_to_vec()))
        .await
        .unwrap();
    assert!(resp.status().is_client_error(), "{}", resp.status());
    let status: Value = resp.json().await.unwrap();
    assert!(
        status["message"].as_str().unwrap().contains("Secret"),
        "{status}"
    );
    let (_, body) = get(&http, &url, "application/json").await;
    let list: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(list["items"], json!([]));

    // Built-ins are not validated, so a stored object may not fit its message: a protobuf
    // client still gets it, in JSON, which it accepts too.
    let deployments = format!(
        "{}/apis/apps/v1/namespaces/default/deployments",
        server.url()
    );
    let odd = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "odd"}, "spec": {"replicas": "three"}});
    assert_eq!(
        http.post(&deployments)
            .json(&odd)
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    let (ct, body) = get(&http, &format!("{deployments}/odd"), ACCEPT_PROTOBUF).await;
    assert!(ct.starts_with("application/json"), "{ct}");
    let o: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(o["spec"]["replicas"], "three");
    server.shutdown().await;
}
