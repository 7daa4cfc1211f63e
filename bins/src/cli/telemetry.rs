//! Logs and traces: log lines on stderr (text or JSON, `RUST_LOG`), and,
//! with `--otlp-endpoint`, spans exported over OTLP/HTTP with each run's
//! trace id derived from the run id (docs/design/server.md#traces).

use std::collections::HashMap;
use std::io;

use flowforge_ports::RunId;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use super::LogFormat;

/// Flushes the exported spans when dropped (at the process's end).
#[derive(Debug)]
pub(crate) struct Telemetry(Option<SdkTracerProvider>);

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: exporting the last spans failed: {e}");
        }
    }
}

/// The OTLP/HTTP traces URL for an endpoint: a bare `http://host:4318`
/// gets the standard `/v1/traces` path, as `OTEL_EXPORTER_OTLP_ENDPOINT`
/// does.
fn traces_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim_end_matches('/');
    let has_path = trimmed.split_once("://").is_some_and(|(_, rest)| rest.contains('/'));
    if has_path {
        trimmed.to_owned()
    } else {
        format!("{trimmed}/v1/traces")
    }
}

/// The trace every span about `run` belongs to: the run id's 128 bits are
/// the trace id, so processes that never talk agree on it. A span that
/// came with a `traceparent` (a dispatch's broker header) is its child.
fn link_to_run(span: &tracing::Span, run: RunId, trace_parent: Option<&str>) {
    if let Some(header) = trace_parent {
        let carrier = HashMap::from([("traceparent".to_owned(), header.to_owned())]);
        let context = TraceContextPropagator::new().extract(&carrier);
        if context.span().span_context().is_valid() {
            let _ = span.set_parent(context);
            return;
        }
        tracing::debug!(%header, "ignoring an invalid traceparent; linking the span by its run id");
    }
    let bytes = run.0.into_bytes();
    let mut low = [0u8; 8];
    low.copy_from_slice(&bytes[8..]);
    // A span id of zero is invalid; a v7 UUID's low half never is.
    let parent = SpanContext::new(
        TraceId::from_bytes(bytes),
        SpanId::from_bytes(low),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent));
}

/// Installs the log subscriber and, when `otlp` is given, the trace
/// exporter.
pub(crate) fn init(format: LogFormat, default_level: &str, otlp: Option<&str>) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let ansi = io::IsTerminal::is_terminal(&io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let logs = tracing_subscriber::fmt::layer().with_writer(io::stderr).with_ansi(ansi);
    let logs = match format {
        LogFormat::Text => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
    };
    let (traces, provider) = match otlp {
        None => (None, None),
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(traces_url(endpoint))
                .build()?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name("flowforge")
                        .build(),
                )
                .build();
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("flowforge"))
                // FlowForge's own spans at info and above, whatever the log level.
                .with_filter(filter_fn(|m| {
                    m.target().starts_with("flowforge") && *m.level() <= LevelFilter::INFO
                }));
            flowforge_app::telemetry::set_span_linker(link_to_run);
            (Some(layer), Some(provider))
        }
    };
    // A second initialisation (tests calling `run` twice) is harmless.
    let _ = Registry::default().with(logs).with(traces).try_init();
    Ok(Telemetry(provider))
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{TraceContextExt, TracerProvider};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    use super::{RunId, link_to_run, traces_url};

    /// The trace id `span` ends up in once linked.
    fn linked_trace(run: RunId, header: Option<&str>) -> String {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::Registry::default()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("t")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("flowforge.task.execute");
            link_to_run(&span, run, header);
            span.context().span().span_context().trace_id().to_string()
        })
    }

    #[test]
    fn a_dispatchs_traceparent_parents_the_span_and_the_run_id_is_the_fallback() {
        let run = RunId(uuid::Uuid::now_v7());
        assert_eq!(linked_trace(run, None), run.0.simple().to_string());
        let other = "4bf92f3577b34da6a3ce929d0e0e4736";
        let header = format!("00-{other}-00f067aa0ba902b7-01");
        assert_eq!(linked_trace(run, Some(&header)), other);
        assert_eq!(linked_trace(run, Some("not a traceparent")), run.0.simple().to_string());
    }

    #[test]
    fn a_bare_endpoint_gets_the_traces_path() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/custom"), "http://c:4318/custom");
    }
}
