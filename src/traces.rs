//! Traces: the spans' export over OTLP/HTTP (cargo feature `otlp`), the W3C
//! `traceparent` header sent to the external systems, and the trace id the
//! latency histograms keep as exemplars.
//!
//! The spans themselves (`reconcile`, `attempt`, `step`, `external call`,
//! `store.*`) are always there: they put `request_id`, `shard`, the claim's
//! `token` and the `step` on every log line. Export only adds a layer.

use std::time::Duration;

use crate::flags::SettingError;

/// `--otlp-*` flags of `run`.
#[derive(clap::Args, Clone, Debug)]
pub struct TracingArgs {
    /// OTLP/HTTP collector to export spans to, as a base URL over plain http (e.g. http://otel-collector:4318; /v1/traces is appended); empty: no export. Needs a build with the `otlp` cargo feature (the image has it).
    #[arg(long, env = "AUTOAPPROVAL_OTLP_ENDPOINT", default_value = "")]
    pub otlp_endpoint: String,
    /// Share of new traces sampled, from 0 to 1; a trace an upstream caller sampled is always kept.
    #[arg(long, env = "AUTOAPPROVAL_OTLP_SAMPLING_RATIO", default_value_t = 1.0)]
    pub otlp_sampling_ratio: f64,
}

/// Validated export settings: present only when spans are exported.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpConfig {
    /// Where spans are posted: the collector's `/v1/traces`.
    pub traces_url: url::Url,
    /// Share of new traces sampled.
    pub sampling_ratio: f64,
}

/// How long shutdown waits for the last spans to reach the collector.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

impl TracingArgs {
    /// The export settings, or `None` when no endpoint is set; a bad value
    /// is refused naming its flag before anything is contacted.
    pub fn config(&self) -> Result<Option<OtlpConfig>, SettingError> {
        let ratio = self.otlp_sampling_ratio;
        if !(0.0..=1.0).contains(&ratio) {
            return Err(SettingError {
                flag: "--otlp-sampling-ratio",
                value: ratio.to_string(),
                message: "must be between 0 and 1",
            });
        }
        let endpoint = self.otlp_endpoint.trim();
        if endpoint.is_empty() {
            return Ok(None);
        }
        let refuse = |message| SettingError {
            flag: "--otlp-endpoint",
            value: endpoint.to_owned(),
            message,
        };
        if !cfg!(feature = "otlp") {
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
        Ok(Some(OtlpConfig {
            traces_url: url,
            sampling_ratio: ratio,
        }))
    }
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
    use opentelemetry_otlp::{Protocol, WithExportConfig};
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
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
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
                    .with_service_name("autoapproval")
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
            otlp_sampling_ratio: ratio,
        }
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
}
