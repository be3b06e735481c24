//! Spans as an operator meets them: every JSON log line of a request's
//! attempt names the request, its shard, the claim's token and the step;
//! with the `otlp` feature, each attempt is one exported trace whose spans
//! cover the external calls, and each call carries that trace to the
//! downstream as a W3C `traceparent`.

use std::path::PathBuf;
use std::time::Duration;

use autoapproval_sim::SimHandle;
use kube_testserver::TestServer;
use serde_json::Value;

use crate::support::{
    AsDb, Db, NS, backends, eventually, free_port, fresh_dir, kubeconfig_in, on_both, owner_now,
    request_status, spawn_run, stop_on_sigterm,
};

/// A test API server with the CRD, the simulator and a kubeconfig for the binary.
struct Stage {
    _server: TestServer,
    sim: SimHandle,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Stage {
    async fn start(name: &str) -> Stage {
        let (server, _, sim) = backends().await;
        let dir = fresh_dir(name);
        let kubeconfig = kubeconfig_in(&dir, &server);
        Stage {
            _server: server,
            sim,
            dir,
            kubeconfig,
        }
    }

    /// `autoapproval run` against this stage, with `args` and `env` added,
    /// and the port of its endpoints.
    fn run(
        &self,
        pool: &impl AsDb,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (tokio::process::Child, u16) {
        let url = self.sim.base_url();
        let mut all_env = vec![
            ("AUTOAPPROVAL_ESIGN_URL", url.as_str()),
            ("AUTOAPPROVAL_OWNER_URL", url.as_str()),
            ("AUTOAPPROVAL_STORE_URL", url.as_str()),
            ("AUTOAPPROVAL_AD_URL", url.as_str()),
        ];
        all_env.extend_from_slice(env);
        let mut all_args = vec!["--namespace", NS, "--replica-name", "traced-1"];
        all_args.extend_from_slice(args);
        let port = free_port();
        let child = spawn_run(&self.kubeconfig, port, pool, &all_args, &all_env);
        (child, port)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Stops `child` with SIGTERM and returns its stderr.
async fn stop(child: tokio::process::Child) -> String {
    let output = stop_on_sigterm(child, Duration::from_secs(30)).await;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    stderr
}

/// `key` of a JSON log line: its own field, or the nearest span's that has it.
fn field<'a>(line: &'a Value, key: &str) -> Option<&'a Value> {
    if let Some(v) = line["fields"].get(key) {
        return Some(v);
    }
    line["spans"]
        .as_array()?
        .iter()
        .rev()
        .find_map(|span| span.get(key))
}

on_both!(every_log_line_of_an_attempt_carries_its_request_shard_token_and_step);
async fn every_log_line_of_an_attempt_carries_its_request_shard_token_and_step(db: Db) {
    let stage = Stage::start(&format!("logs-{}", db.name())).await;
    let (child, _) = stage.run(
        &db,
        &["--log-json"],
        &[("RUST_LOG", "info,autoapproval=debug")],
    );
    owner_now(31).insert(&db).await;
    eventually("request 31 to be approved", || async {
        (request_status(&db, 31).await == "APPROVED").then_some(())
    })
    .await;
    let stderr = stop(child).await;

    let lines: Vec<Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let message = |l: &Value| l["fields"]["message"].as_str().unwrap_or("").to_owned();
    let from = lines
        .iter()
        .position(|l| message(l) == "claimed")
        .unwrap_or_else(|| panic!("no `claimed` line in:\n{stderr}"));
    let to = lines
        .iter()
        .rposition(|l| message(l) == "approved")
        .unwrap_or_else(|| panic!("no `approved` line in:\n{stderr}"));
    // The request's own path: the chain, its external calls and its store calls.
    let on_the_path = |l: &&Value| {
        let target = l["target"].as_str().unwrap_or("");
        ["approval", "processors", "external", "store"]
            .iter()
            .any(|m| target.starts_with(&format!("autoapproval::{m}")))
    };
    let attempt: Vec<&Value> = lines[from..=to].iter().filter(on_the_path).collect();
    for line in &attempt {
        assert_eq!(field(line, "request_id"), Some(&Value::from(31)), "{line}");
        assert!(field(line, "shard").is_some(), "no shard: {line}");
        assert!(field(line, "token").is_some(), "no fencing token: {line}");
    }
    // The e-sign check, the owner's and the store's creation, each answered
    // inside the step that made it.
    let calls: Vec<&&Value> = attempt
        .iter()
        .filter(|l| message(l) == "external call answered")
        .collect();
    assert!(
        calls.len() >= 3,
        "{} external calls: {attempt:#?}",
        calls.len()
    );
    let steps: Vec<&str> = calls
        .iter()
        .filter_map(|l| field(l, "step")?.as_str())
        .collect();
    assert_eq!(
        steps.len(),
        calls.len(),
        "a call outside a step: {calls:#?}"
    );
    assert!(
        steps.contains(&"owner") && steps.contains(&"store"),
        "{steps:?}"
    );
}

#[test]
fn help_names_the_opentelemetry_variables_and_never_prints_the_headers() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
        .args(["run", "--help"])
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Bearer%20hunter4",
        )
        .output()
        .expect("run --help");
    let help = String::from_utf8_lossy(&output.stdout);
    for shown in [
        "$OTEL_EXPORTER_OTLP_ENDPOINT",
        "[env: OTEL_EXPORTER_OTLP_HEADERS]",
        "[env: OTEL_SERVICE_NAME=]",
        "[default: autoapproval]",
    ] {
        assert!(help.contains(shown), "{shown} in:\n{help}");
    }
    assert!(!help.contains("hunter4"), "{help}");
}

#[cfg(feature = "otlp")]
mod otlp {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::{Arc, Mutex};

    use autoapproval::external::System;
    use autoapproval_sim::{FaultKind, Faults};
    use axum::body::Bytes;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value;
    use prost::Message;

    use super::*;

    /// One span as the collector received it.
    #[derive(Clone, Debug)]
    struct Received {
        trace_id: String,
        span_id: String,
        parent: String,
        name: String,
        attributes: BTreeMap<String, String>,
        /// The resource's `service.name`.
        service: String,
        /// The headers of the export that carried it.
        headers: BTreeMap<String, String>,
    }

    /// An attribute's value as text.
    fn text(value: Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
        match value.and_then(|v| v.value) {
            Some(any_value::Value::StringValue(s)) => s,
            Some(any_value::Value::IntValue(i)) => i.to_string(),
            Some(other) => format!("{other:?}"),
            None => String::new(),
        }
    }

    /// An OTLP/HTTP receiver in this process: `POST /v1/traces`, protobuf.
    async fn collector() -> (String, Arc<Mutex<Vec<Received>>>) {
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = received.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: Bytes| {
                let sink = sink.clone();
                async move {
                    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                        return axum::http::StatusCode::BAD_REQUEST;
                    };
                    let headers: BTreeMap<String, String> = headers
                        .iter()
                        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                        .collect();
                    let spans = request.resource_spans.into_iter().flat_map(|r| {
                        let service = r
                            .resource
                            .into_iter()
                            .flat_map(|r| r.attributes)
                            .find(|kv| kv.key == "service.name")
                            .map(|kv| text(kv.value))
                            .unwrap_or_default();
                        let headers = headers.clone();
                        r.scope_spans
                            .into_iter()
                            .flat_map(|s| s.spans)
                            .map(move |s| Received {
                                trace_id: hex(&s.trace_id),
                                span_id: hex(&s.span_id),
                                parent: hex(&s.parent_span_id),
                                name: s.name,
                                attributes: s
                                    .attributes
                                    .into_iter()
                                    .map(|kv| (kv.key, text(kv.value)))
                                    .collect(),
                                service: service.clone(),
                                headers: headers.clone(),
                            })
                    });
                    sink.lock().expect("spans").extend(spans);
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the collector");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, received)
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[sqlx::test(migrations = false)]
    async fn each_attempt_is_one_trace_covering_its_external_calls_and_the_downstream_gets_it(
        pool: sqlx::PgPool,
    ) {
        let pool = crate::support::migrated(pool).await;
        let (collector_url, received) = collector().await;
        let stage = Stage::start("otlp").await;
        // The first attempt's owner creation fails: a transient retry, so
        // the request is approved on its second attempt.
        stage
            .sim
            .set_faults(Faults::fail_next_creation(
                System::Owner,
                1,
                FaultKind::Error,
            ))
            .expect("faults");
        let (child, port) = stage.run(
            &pool,
            &[
                "--otlp-endpoint",
                &collector_url,
                "--transient-retry-base",
                "200ms",
            ],
            &[],
        );
        owner_now(41).insert(&pool).await;
        eventually("request 41 to be approved", || async {
            (request_status(&pool, 41).await == "APPROVED").then_some(())
        })
        .await;
        let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .expect("/metrics")
            .text()
            .await
            .expect("body");
        // Shutdown flushes the spans still in the exporter's batch.
        let stderr = stop(child).await;

        let spans = received.lock().expect("spans").clone();
        let attempts: Vec<&Received> = spans
            .iter()
            .filter(|s| s.name == "attempt" && s.attributes["request_id"] == "41")
            .collect();
        assert_eq!(attempts.len(), 2, "attempts: {attempts:#?}\n{stderr}");
        let traces: BTreeSet<&str> = attempts.iter().map(|s| s.trace_id.as_str()).collect();
        assert_eq!(traces.len(), 2, "two attempts, two traces: {attempts:#?}");
        let by_id: BTreeMap<&str, &Received> =
            spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
        let mut calls = Vec::new();
        for trace in &traces {
            let in_trace: Vec<&Received> = spans.iter().filter(|s| s.trace_id == *trace).collect();
            let roots: Vec<&str> = in_trace
                .iter()
                .filter(|s| s.parent.is_empty())
                .map(|s| s.name.as_str())
                .collect();
            assert_eq!(roots, ["reconcile"], "trace {trace}: {in_trace:#?}");
            let external: Vec<&&Received> = in_trace
                .iter()
                .filter(|s| s.name == "external call")
                .collect();
            assert!(external.len() >= 2, "trace {trace}: {in_trace:#?}");
            for call in &external {
                assert!(!call.attributes["system"].is_empty(), "{call:#?}");
                let parent = by_id.get(call.parent.as_str()).map(|p| p.name.as_str());
                assert_eq!(parent, Some("step"), "{call:#?}");
            }
            assert!(
                in_trace.iter().any(|s| s.name == "store.claim"),
                "trace {trace}: {in_trace:#?}"
            );
            calls.extend(
                external
                    .into_iter()
                    .map(|s| (trace.to_string(), s.span_id.clone())),
            );
        }
        // The latency histograms point at the traces they were observed in.
        for histogram in [
            "autoapproval_pickup_latency_seconds_bucket",
            "autoapproval_reconcile_duration_seconds_bucket",
        ] {
            let exemplars: Vec<&str> = metrics
                .lines()
                .filter(|l| l.starts_with(histogram))
                .filter_map(|l| l.split_once("# {trace_id=\"")?.1.split('"').next())
                .collect();
            assert!(
                !exemplars.is_empty(),
                "no exemplar on {histogram}:\n{metrics}"
            );
            for trace in &exemplars {
                assert!(
                    spans.iter().any(|s| s.trace_id == *trace),
                    "{histogram}: exemplar {trace} is no exported trace"
                );
            }
        }
        // Every call reached the simulator with its own span as the parent.
        let seen: Vec<(String, String)> = stage
            .sim
            .stats()
            .traced_calls
            .iter()
            .map(|c| {
                let parts: Vec<&str> = c.traceparent.split('-').collect();
                assert_eq!(parts.len(), 4, "{c:?}");
                assert_eq!(parts[3], "01", "sampled: {c:?}");
                (parts[1].to_owned(), parts[2].to_owned())
            })
            .collect();
        let mut seen = seen;
        calls.sort();
        seen.sort();
        assert_eq!(
            seen, calls,
            "traceparents the simulator saw vs the exported call spans"
        );
    }

    /// Runs the binary with `args` and `env` until request 42 is approved,
    /// and what the collector received of its attempt.
    async fn export_of_one_request(
        pool: &sqlx::PgPool,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Vec<Received> {
        let (collector_url, received) = collector().await;
        let stage = Stage::start(&format!("otel-{}", args.len())).await;
        let args: Vec<&str> = args
            .iter()
            .map(|a| {
                if *a == "COLLECTOR" {
                    collector_url.as_str()
                } else {
                    a
                }
            })
            .collect();
        let env: Vec<(&str, &str)> = env
            .iter()
            .map(|&(k, v)| {
                (
                    k,
                    if v == "COLLECTOR" {
                        collector_url.as_str()
                    } else {
                        v
                    },
                )
            })
            .collect();
        let (child, _) = stage.run(pool, &args, &env);
        owner_now(42).insert(pool).await;
        eventually("request 42 to be approved", || async {
            (request_status(pool, 42).await == "APPROVED").then_some(())
        })
        .await;
        let stderr = stop(child).await;
        let spans: Vec<Received> = received
            .lock()
            .expect("spans")
            .iter()
            .filter(|s| s.name == "attempt" && s.attributes["request_id"] == "42")
            .cloned()
            .collect();
        assert!(!spans.is_empty(), "no attempt exported:\n{stderr}");
        spans
    }

    #[sqlx::test(migrations = false)]
    async fn the_opentelemetry_variables_alone_configure_the_export(pool: sqlx::PgPool) {
        let pool = crate::support::migrated(pool).await;
        let spans = export_of_one_request(
            &pool,
            &[],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "COLLECTOR"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "x-tenant=acme%2C%20inc, authorization=Bearer%20t0k",
                ),
                ("OTEL_SERVICE_NAME", "approver-from-env"),
            ],
        )
        .await;
        for span in &spans {
            assert_eq!(span.service, "approver-from-env", "{span:#?}");
            assert_eq!(span.headers["x-tenant"], "acme, inc", "{span:#?}");
            assert_eq!(span.headers["authorization"], "Bearer t0k", "{span:#?}");
        }
    }

    #[sqlx::test(migrations = false)]
    async fn the_flags_win_over_the_opentelemetry_variables(pool: sqlx::PgPool) {
        let pool = crate::support::migrated(pool).await;
        let spans = export_of_one_request(
            &pool,
            &[
                "--otlp-endpoint",
                "COLLECTOR",
                "--otlp-headers",
                "x-tenant=from-flag",
                "--otlp-service-name",
                "approver-from-flag",
            ],
            &[
                // Nothing listens there: only the flag's collector gets spans.
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "x-tenant=from-env,x-env-only=1",
                ),
                ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-traces-env=1"),
                ("OTEL_SERVICE_NAME", "approver-from-env"),
            ],
        )
        .await;
        for span in &spans {
            assert_eq!(span.service, "approver-from-flag", "{span:#?}");
            assert_eq!(span.headers["x-tenant"], "from-flag", "{span:#?}");
            for env_only in ["x-env-only", "x-traces-env"] {
                assert!(!span.headers.contains_key(env_only), "{span:#?}");
            }
        }
    }

    #[test]
    fn a_bad_otel_exporter_otlp_headers_is_refused_by_name_before_anything_starts() {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_autoapproval"))
            .args(["run", "--database-url", "postgres://127.0.0.1:1/none"])
            .env("AUTOAPPROVAL_KUBECONFIG", "/nonexistent")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
            .env(
                "OTEL_EXPORTER_OTLP_HEADERS",
                "x-ok=1,api-key-without-equals",
            )
            .output()
            .expect("autoapproval run");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--otlp-headers (entry 2)") && stderr.contains("name=value"),
            "{stderr}"
        );
        assert!(
            !stderr.contains("api-key-without-equals"),
            "the value is never echoed: {stderr}"
        );
    }
}
