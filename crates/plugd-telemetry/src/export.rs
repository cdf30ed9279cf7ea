//! The OTLP/HTTP trace exporter, set up from the standard `OTEL_*`
//! variables, and its HTTP client: the workspace's reqwest, driven on
//! plugd's tokio runtime (the SDK's batch thread only waits for it).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::global;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;

use crate::ENABLED;

/// How long one export request may take (the OTLP default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP HTTP client could not be built.
    #[error("cannot build the OTLP HTTP client: {0}")]
    Client(String),
    /// The exporter refused its configuration.
    #[error(
        "cannot set up the OTLP trace exporter: {0}; check OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and OTEL_EXPORTER_OTLP_HEADERS"
    )]
    Exporter(String),
}

/// Traces as configured by the environment: the tracer provider when an
/// endpoint is set, nothing otherwise. Keep it until the end of the command
/// and [`Telemetry::shutdown`] it so the last spans leave.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Reads the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (the
    /// base URL; traces go to `/v1/traces` under it) or
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL),
    /// `OTEL_EXPORTER_OTLP_HEADERS` (`k=v,k2=v2`), `OTEL_SERVICE_NAME`
    /// (default `plugd`), `OTEL_TRACES_SAMPLER` (+ `_ARG`) and the
    /// `OTEL_BSP_*` batch settings. With no endpoint set, or with
    /// `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`, nothing is
    /// installed. Exports run on `runtime`.
    pub fn from_env(runtime: &tokio::runtime::Handle) -> Result<Telemetry, TelemetryError> {
        if !configured(|k| std::env::var(k).ok()) {
            return Ok(Telemetry::default());
        }
        // reqwest is built without a crypto provider; plugd's is ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TelemetryError::Client(e.to_string()))?;
        let exporter = SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(OtlpClient {
                client,
                runtime: runtime.clone(),
            })
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let resource = if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
            Resource::builder().build()
        } else {
            Resource::builder().with_service_name("plugd").build()
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        global::set_tracer_provider(provider.clone());
        global::set_text_map_propagator(TraceContextPropagator::new());
        ENABLED.store(true, Ordering::Relaxed);
        tracing::info!("exporting traces over OTLP/HTTP");
        Ok(Telemetry {
            provider: Some(provider),
        })
    }

    /// Whether spans are exported.
    pub fn is_on(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends the spans still queued and stops the exporter, waiting at most
    /// `within`. Blocks: call it outside the async runtime, which must still
    /// be running (it carries the export requests).
    pub fn shutdown(self, within: Duration) {
        let Some(provider) = self.provider else {
            return;
        };
        ENABLED.store(false, Ordering::Relaxed);
        if let Err(e) = provider.shutdown_with_timeout(within) {
            tracing::warn!("traces not all exported at shutdown: {e}");
        }
    }
}

/// Whether the variables (read with `var`) ask for an OTLP trace export.
fn configured(var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| var(k).is_some_and(|v| !v.trim().is_empty());
    let is = |k: &str, v: &str| var(k).is_some_and(|x| x.trim().eq_ignore_ascii_case(v));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        && !is("OTEL_TRACES_EXPORTER", "none")
        && !is("OTEL_SDK_DISABLED", "true")
}

/// The exporter's HTTP client: each request runs as a task of plugd's tokio
/// runtime (reqwest needs one); the SDK's batch thread waits for its answer.
#[derive(Debug)]
struct OtlpClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl HttpClient for OtlpClient {
    fn send_bytes<'s, 'f>(
        &'s self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'f>>
    where
        's: 'f,
        Self: 'f,
    {
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            let response = client.execute(reqwest::Request::try_from(request)?).await?;
            let mut answer = Response::builder().status(response.status());
            if let Some(h) = answer.headers_mut() {
                *h = response.headers().clone();
            }
            Ok::<_, HttpError>(answer.body(response.bytes().await?)?)
        });
        Box::pin(async move { task.await? })
    }
}

#[cfg(test)]
mod tests {
    use super::configured;

    fn with(vars: &[(&str, &str)]) -> bool {
        configured(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn an_endpoint_turns_export_on_and_the_standard_switches_off() {
        assert!(!with(&[]));
        assert!(!with(&[("OTEL_SERVICE_NAME", "x")]));
        assert!(!with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]));
        assert!(with(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4318"
        )]));
        assert!(with(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces"
        )]));
        assert!(!with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ]));
        assert!(!with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ]));
    }
}
