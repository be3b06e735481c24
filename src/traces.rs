//! Traces: the spans' export over OTLP/HTTP (cargo feature `otlp`), the W3C
//! `traceparent` header sent to the external systems, and the trace id the
//! latency histograms keep as exemplars.
//!
//! The spans themselves (`reconcile`, `attempt`, `step`, `external call`,
//! `store.*`) are always there: they put `request_id`, `shard`, the claim's
//! `token` and the `step` on every log line. Export only adds a layer.

use std::time::Duration;

use crate::flags::SettingError;

/// `--otlp-*` flags of `run`; the OpenTelemetry `OTEL_*` variables are
/// read too, and a flag (or its `AUTOAPPROVAL_*` variable) wins over them.
#[derive(clap::Args, Clone, Debug)]
pub struct TracingArgs {
    /// OTLP/HTTP collector to export spans to, as a base URL over plain http (e.g. http://otel-collector:4318; /v1/traces is appended); empty: $OTEL_EXPORTER_OTLP_ENDPOINT when set, else no export. Needs a build with the `otlp` cargo feature (the image has it).
    #[arg(long, env = "AUTOAPPROVAL_OTLP_ENDPOINT", default_value = "")]
    pub otlp_endpoint: String,
    /// Headers sent with every export, as `name=value,name2=value2` with percent-encoded values (the OpenTelemetry format), e.g. `authorization=Bearer%20…`.
    // Often a credential: never shown by --help (as the database URL).
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_HEADERS",
        hide_env_values = true,
        default_value = ""
    )]
    pub otlp_headers: String,
    /// The `service.name` of the exported spans.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "autoapproval")]
    pub otlp_service_name: String,
    /// Share of new traces sampled, from 0 to 1; a trace an upstream caller sampled is always kept.
    #[arg(long, env = "AUTOAPPROVAL_OTLP_SAMPLING_RATIO", default_value_t = 1.0)]
    pub otlp_sampling_ratio: f64,
}

/// The OpenTelemetry variable `--otlp-endpoint` falls back to.
pub const OTEL_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Validated export settings: present only when spans are exported.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpConfig {
    /// Where spans are posted: the collector's `/v1/traces`.
    pub traces_url: url::Url,
    /// Sent with every export, values marked sensitive (never logged).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Share of new traces sampled.
    pub sampling_ratio: f64,
}

/// How long shutdown waits for the last spans to reach the collector.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

impl TracingArgs {
    /// The export settings, or `None` when no endpoint is set; a bad value
    /// is refused naming its flag (or variable) before anything is contacted.
    pub fn config(&self) -> Result<Option<OtlpConfig>, SettingError> {
        self.config_with(std::env::var(OTEL_ENDPOINT_VAR).ok().as_deref())
    }

    /// [`Self::config`] with `$OTEL_EXPORTER_OTLP_ENDPOINT` given.
    fn config_with(&self, otel_endpoint: Option<&str>) -> Result<Option<OtlpConfig>, SettingError> {
        let ratio = self.otlp_sampling_ratio;
        if !(0.0..=1.0).contains(&ratio) {
            return Err(SettingError {
                flag: "--otlp-sampling-ratio",
                value: ratio.to_string(),
                message: "must be between 0 and 1",
            });
        }
        let (flag, endpoint) = match self.otlp_endpoint.trim() {
            "" => (OTEL_ENDPOINT_VAR, otel_endpoint.unwrap_or_default().trim()),
            given => ("--otlp-endpoint", given),
        };
        if endpoint.is_empty() {
            return Ok(None);
        }
        let refuse = |message| SettingError {
            flag,
            value: endpoint.to_owned(),
            message,
        };
        if !cfg!(feature = "otlp") {
            if flag == OTEL_ENDPOINT_VAR {
                // An ambient variable (an OpenTelemetry operator sets it for
                // every pod) does not stop a build that cannot export:
                // `report_unexported` says so in the log instead.
                return Ok(None);
            }
            return Err(refuse(
                "this build cannot export spans: it was built without the `otlp` cargo feature",
            ));
        }
        let mut url = url::Url::parse(endpoint)
            .map_err(|_| refuse("must be an absolute URL such as http://otel-collector:4318"))?;
        if url.scheme() != "http" {
            // The exporter's HTTP client is built without TLS; an in-cluster
            // collector (or a sidecar) is reached over plain http.
            return Err(refuse(
                "must be a plain http:// URL (no TLS to the collector; use an in-cluster collector)",
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(refuse("must be a base URL without query or fragment"));
        }
        // The OTEL_EXPORTER_OTLP_ENDPOINT convention: a base URL, the
        // signal's path appended.
        let path = format!("{}/v1/traces", url.path().trim_end_matches('/'));
        url.set_path(&path);
        let service_name = self.otlp_service_name.trim();
        if service_name.is_empty() {
            return Err(SettingError {
                flag: "--otlp-service-name",
                value: String::new(),
                message: "must not be empty (set by the flag or OTEL_SERVICE_NAME)",
            });
        }
        Ok(Some(OtlpConfig {
            traces_url: url,
            headers: parse_headers(&self.otlp_headers)?,
            service_name: service_name.to_owned(),
            sampling_ratio: ratio,
        }))
    }

    /// Says in the log that `$OTEL_EXPORTER_OTLP_ENDPOINT` is set but not
    /// honoured, in a build without the `otlp` feature (call once logging is up).
    pub fn report_unexported(&self) {
        let ambient = std::env::var(OTEL_ENDPOINT_VAR).unwrap_or_default();
        if !cfg!(feature = "otlp")
            && self.otlp_endpoint.trim().is_empty()
            && !ambient.trim().is_empty()
        {
            tracing::warn!(
                endpoint = %ambient,
                "{OTEL_ENDPOINT_VAR} is set but this build has no `otlp` cargo feature: no spans are exported"
            );
        }
    }
}

/// Parses `--otlp-headers` / `OTEL_EXPORTER_OTLP_HEADERS`: comma-separated
/// `name=value`, each value percent-decoded (the OpenTelemetry format).
/// A refusal names the header, never its value (often a secret).
pub fn parse_headers(
    list: &str,
) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, SettingError> {
    let refuse = |value: String, message| SettingError {
        flag: "--otlp-headers",
        value,
        message,
    };
    let mut headers = Vec::new();
    for (n, entry) in list.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            continue;
        }
        let Some((name, value)) = entry.split_once('=') else {
            return Err(refuse(
                format!("(entry {})", n + 1),
                "each header must be name=value, comma-separated (OTEL_EXPORTER_OTLP_HEADERS format)",
            ));
        };
        let name = name.trim();
        let header = http::HeaderName::try_from(name).map_err(|_| {
            refuse(
                name.to_owned(),
                "not a valid HTTP header name (OTEL_EXPORTER_OTLP_HEADERS format: name=value,…)",
            )
        })?;
        let mut value = percent_decode(value.trim())
            .and_then(|bytes| http::HeaderValue::from_bytes(&bytes).ok())
            .ok_or_else(|| {
                refuse(
                    name.to_owned(),
                    "the value is not a valid header value once percent-decoded (bad %XX or a control character)",
                )
            })?;
        value.set_sensitive(true);
        headers.push((header, value));
    }
    Ok(headers)
}

/// `%XX` escapes decoded; `None` on a malformed escape.
fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// A failure to start the export pipeline.
#[derive(Debug, thiserror::Error)]
#[error("starting the OTLP span export to {url}: {message}")]
pub struct ExportError {
    /// The collector URL.
    pub url: String,
    /// What the exporter said.
    pub message: String,
}

/// The running export: flushes and stops on drop, so the last attempt's
/// spans leave before the process does.
pub struct Export {
    #[cfg(feature = "otlp")]
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

impl Drop for Export {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        if let Err(error) = self.provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
            eprintln!("autoapproval: flushing the last spans: {error}");
        }
    }
}

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
    use opentelemetry_http::{Bytes, HttpClient, HttpError};
    use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::Layer;
    use tracing_subscriber::registry::LookupSpan;

    use super::{Export, ExportError, OtlpConfig};

    /// The layer that turns spans into OpenTelemetry spans, and its export.
    pub fn layer<S>(config: &OtlpConfig) -> Result<(impl Layer<S> + use<S>, Export), ExportError>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        let failed = |message: String| ExportError {
            url: config.traces_url.to_string(),
            message,
        };
        let client = FlagHeaders::build(config).map_err(failed)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.traces_url.as_str())
            .with_timeout(super::FLUSH_TIMEOUT)
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sampling_ratio,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .with_attribute(opentelemetry::KeyValue::new(
                        "service.version",
                        env!("CARGO_PKG_VERSION"),
                    ))
                    .build(),
            )
            .build();
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let tracer = provider.tracer("autoapproval");
        let layer = tracing_opentelemetry::layer().with_tracer(tracer);
        Ok((layer, Export { provider }))
    }

    /// The exporter's HTTP client, sending exactly the configured headers:
    /// the SDK also adds `$OTEL_EXPORTER_OTLP_HEADERS` (and its `TRACES_`
    /// variant) by itself, which would override `--otlp-headers`.
    #[derive(Debug)]
    struct FlagHeaders {
        inner: reqwest_otlp::blocking::Client,
        headers: http::HeaderMap,
    }

    impl FlagHeaders {
        fn build(config: &OtlpConfig) -> Result<Self, String> {
            // reqwest's blocking client must not be built (nor dropped) on
            // an async runtime's thread: built on its own, as the SDK does.
            let inner = std::thread::spawn(|| {
                reqwest_otlp::blocking::Client::builder()
                    .timeout(super::FLUSH_TIMEOUT)
                    .build()
            })
            .join()
            .map_err(|_| "building the HTTP client panicked".to_owned())?
            .map_err(|e| e.to_string())?;
            Ok(Self {
                inner,
                headers: config.headers.iter().cloned().collect(),
            })
        }
    }

    #[async_trait::async_trait]
    impl HttpClient for FlagHeaders {
        async fn send_bytes(
            &self,
            mut request: http::Request<Bytes>,
        ) -> Result<http::Response<Bytes>, HttpError> {
            // Only the SDK's own framing headers are kept.
            let sent = request.headers_mut();
            let mut headers = self.headers.clone();
            for name in [http::header::CONTENT_TYPE, http::header::CONTENT_ENCODING] {
                if let Some(value) = sent.remove(&name) {
                    headers.insert(name, value);
                }
            }
            *sent = headers;
            self.inner.send_bytes(request).await
        }
    }

    /// The current span's W3C trace-context headers.
    pub fn headers() -> Vec<(String, String)> {
        let cx = tracing::Span::current().context();
        let mut carrier = std::collections::HashMap::new();
        opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
        carrier.into_iter().collect()
    }

    /// The current span's trace id, when it is sampled (exported).
    pub fn trace_id() -> Option<String> {
        let cx = tracing::Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        (sc.is_valid() && sc.is_sampled()).then(|| sc.trace_id().to_string())
    }
}

#[cfg(feature = "otlp")]
pub use otlp::layer;

/// The W3C trace-context headers (`traceparent`, `tracestate`) of the
/// current span, for an outgoing call; none when spans are not exported.
pub fn propagation_headers() -> Vec<(String, String)> {
    #[cfg(feature = "otlp")]
    return otlp::headers();
    #[cfg(not(feature = "otlp"))]
    Vec::new()
}

/// The current span's trace id when it is exported, for an exemplar.
pub fn current_trace_id() -> Option<String> {
    #[cfg(feature = "otlp")]
    return otlp::trace_id();
    #[cfg(not(feature = "otlp"))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(endpoint: &str, ratio: f64) -> TracingArgs {
        TracingArgs {
            otlp_endpoint: endpoint.into(),
            otlp_headers: String::new(),
            otlp_service_name: "autoapproval".into(),
            otlp_sampling_ratio: ratio,
        }
    }

    /// The names and values of parsed headers, as text.
    fn headers(list: &str) -> Vec<(String, String)> {
        parse_headers(list)
            .unwrap()
            .into_iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8(v.as_bytes().to_vec()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn headers_are_comma_separated_pairs_with_percent_encoded_values() {
        assert_eq!(headers(""), []);
        assert_eq!(
            headers("api-key=s3cr%3Dt, Authorization = Bearer%20abc ,x=a=b,"),
            [
                ("api-key".into(), "s3cr=t".into()),
                ("authorization".into(), "Bearer abc".into()),
                ("x".into(), "a=b".into()),
            ]
        );
        // A `+` is not a space: these are percent-encoded, not form-encoded.
        assert_eq!(headers("k=a+b"), [("k".into(), "a+b".into())]);
    }

    #[test]
    fn a_bad_header_is_refused_naming_the_flag_and_the_header_not_its_value() {
        for (list, named) in [
            ("novalue", "(entry 1)"),
            ("a=1,secret-token", "(entry 2)"),
            ("bad name=1", "bad name"),
            ("=1", ""),
            ("k=%zz", "k"),
            ("k=%4", "k"),
            ("k=%+1", "k"),
            ("k=a%0Ab", "k"),
        ] {
            let e = parse_headers(list).unwrap_err();
            assert_eq!(e.flag, "--otlp-headers", "{list}");
            assert_eq!(e.value, named, "{list}");
            assert!(!e.to_string().contains("secret"), "{e}");
        }
    }

    #[test]
    fn the_flag_wins_over_otel_exporter_otlp_endpoint() {
        let flag = args("http://flag:4318", 1.0);
        let from_env = args("", 1.0);
        if cfg!(feature = "otlp") {
            let config = flag.config_with(Some("http://env:4318")).unwrap().unwrap();
            assert_eq!(config.traces_url.as_str(), "http://flag:4318/v1/traces");
            let config = from_env
                .config_with(Some("http://env:4318"))
                .unwrap()
                .unwrap();
            assert_eq!(config.traces_url.as_str(), "http://env:4318/v1/traces");
        }
        assert_eq!(from_env.config_with(Some("  ")).unwrap(), None);
        assert_eq!(from_env.config_with(None).unwrap(), None);
    }

    #[cfg(feature = "otlp")]
    #[test]
    fn a_bad_otel_exporter_otlp_endpoint_is_refused_naming_the_variable() {
        let e = args("", 1.0)
            .config_with(Some("https://env:4318"))
            .unwrap_err();
        assert_eq!(e.flag, OTEL_ENDPOINT_VAR);
        assert_eq!(e.value, "https://env:4318");
    }

    #[cfg(feature = "otlp")]
    #[test]
    fn headers_and_service_name_reach_the_config_and_are_checked() {
        let mut a = args("http://c:4318", 1.0);
        a.otlp_headers = "k=v%21".into();
        a.otlp_service_name = " billing-approver ".into();
        let config = a.config_with(None).unwrap().unwrap();
        assert_eq!(config.service_name, "billing-approver");
        assert_eq!(config.headers.len(), 1);
        assert_eq!(config.headers[0].1, "v!");
        assert!(
            !format!("{config:?}").contains("v!"),
            "values are sensitive"
        );
        a.otlp_headers = "k".into();
        assert_eq!(a.config_with(None).unwrap_err().flag, "--otlp-headers");
        a.otlp_headers = String::new();
        a.otlp_service_name = " ".into();
        assert_eq!(a.config_with(None).unwrap_err().flag, "--otlp-service-name");
    }

    #[test]
    fn no_endpoint_exports_nothing() {
        assert_eq!(args("", 1.0).config().unwrap(), None);
        assert_eq!(args("  ", 0.5).config().unwrap(), None);
    }

    #[test]
    fn a_ratio_outside_zero_to_one_is_refused_naming_the_flag() {
        for ratio in [-0.1, 1.5, f64::NAN] {
            let e = args("", ratio).config().unwrap_err();
            assert_eq!(e.flag, "--otlp-sampling-ratio", "{ratio}");
        }
    }

    #[test]
    fn bad_endpoints_are_refused_naming_the_flag() {
        for endpoint in [
            "collector:4318",
            "https://collector:4318",
            "http://collector:4318/?x=1",
        ] {
            let e = args(endpoint, 1.0).config().unwrap_err();
            assert_eq!(e.flag, "--otlp-endpoint", "{endpoint}");
            assert_eq!(e.value, endpoint);
        }
    }

    #[cfg(feature = "otlp")]
    #[test]
    fn the_traces_path_is_appended_to_the_base_url() {
        for (base, want) in [
            ("http://c:4318", "http://c:4318/v1/traces"),
            ("http://c:4318/", "http://c:4318/v1/traces"),
            ("http://c/otlp/", "http://c/otlp/v1/traces"),
        ] {
            let config = args(base, 0.25).config().unwrap().unwrap();
            assert_eq!(config.traces_url.as_str(), want);
            assert_eq!(config.sampling_ratio, 0.25);
        }
    }

    #[cfg(not(feature = "otlp"))]
    #[test]
    fn a_build_without_the_feature_refuses_an_endpoint() {
        let e = args("http://c:4318", 1.0).config().unwrap_err();
        assert_eq!(e.flag, "--otlp-endpoint");
        assert!(e.message.contains("otlp"), "{}", e.message);
    }

    #[cfg(not(feature = "otlp"))]
    #[test]
    fn a_build_without_the_feature_runs_with_otel_exporter_otlp_endpoint_set() {
        // Not a refusal: `report_unexported` logs it.
        assert_eq!(
            args("", 1.0).config_with(Some("http://c:4318")).unwrap(),
            None
        );
    }
}
