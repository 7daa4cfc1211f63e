//! Joining spans to their run's trace: a run's trace id derives from its
//! id, so every process's spans about one run meet in one trace, and a
//! dispatch carries that context to its worker as a W3C `traceparent`
//! (docs/design/server.md#traces). The app knows no tracing backend; the
//! binary installs the linker that sets a span's parent when it exports
//! traces.

use std::sync::OnceLock;

use flowforge_ports::RunId;

/// Makes `span` part of `run`'s trace: a child of the `traceparent` that
/// came with its dispatch when there is one, of the run's root otherwise.
pub type SpanLinker = fn(&tracing::Span, RunId, Option<&str>);

static LINKER: OnceLock<SpanLinker> = OnceLock::new();

/// Installs the process's linker (the first call wins).
pub fn set_span_linker(linker: SpanLinker) {
    let _ = LINKER.set(linker);
}

/// Joins `span` to `run`'s trace, if a linker is installed.
pub(crate) fn link(span: &tracing::Span, run: RunId, trace_parent: Option<&str>) {
    if let Some(linker) = LINKER.get() {
        linker(span, run, trace_parent);
    }
}
