//! Prometheus metrics: the recorder, the HTTP middleware, the gauges read
//! from the store, and a bare `/metrics` listener for the processes that
//! serve no API (the loops count through the `metrics` facade in `app`).
//! Labels are only workflow, task type, queue, outcome, route and status
//! — never a run id, so the series stay few (docs/design/server.md#metrics).

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use flowforge_ports::store::Gauges;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Installs the process-wide recorder (once; later calls get the same
/// handle) and describes the metrics.
pub fn install() -> Result<PrometheusHandle, String> {
    static HANDLE: std::sync::OnceLock<Result<PrometheusHandle, String>> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .install_recorder()
                .map_err(|e| format!("installing the metrics recorder: {e}"))?;
            describe();
            Ok(handle)
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!("flowforge_runs_started_total", "Runs started by this process");
    describe_counter!("flowforge_runs_finished_total", "Runs this process settled, by state");
    describe_counter!(
        "flowforge_task_attempts_total",
        "Task attempts this process ended, by outcome"
    );
    describe_histogram!(
        "flowforge_task_duration_seconds",
        metrics::Unit::Seconds,
        "From claim to stored outcome"
    );
    describe_counter!("flowforge_leases_reaped_total", "Expired leases taken back");
    describe_counter!(
        "flowforge_stale_writes_rejected_total",
        "Outcomes refused for a stale fencing token"
    );
    describe_gauge!("flowforge_worker_slots", "Worker slots, total and busy");
    describe_gauge!("flowforge_queue_depth", "Task runs ready and waiting for a worker");
    describe_gauge!("flowforge_tasks_running", "Task runs holding a lease");
    describe_gauge!("flowforge_outbox_unpublished", "Outbox rows not yet published");
    describe_gauge!("flowforge_runs_active", "Runs pending or running");
    describe_counter!("flowforge_http_requests_total", "HTTP requests, by route and status");
    describe_histogram!(
        "flowforge_http_request_duration_seconds",
        metrics::Unit::Seconds,
        "HTTP request duration, by route"
    );
}

/// Sets the store gauges.
pub(crate) fn record_gauges(g: &Gauges) {
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let f = |n: u64| n as f64;
    metrics::gauge!("flowforge_queue_depth").set(f(g.ready));
    metrics::gauge!("flowforge_tasks_running").set(f(g.running));
    metrics::gauge!("flowforge_outbox_unpublished").set(f(g.outbox_unpublished));
    metrics::gauge!("flowforge_runs_active").set(f(g.active_runs));
}

/// Counts every request by its route template (never the raw path: ids
/// would make a series per run) and status.
pub(crate) async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("flowforge_http_requests_total", "route" => route.clone(), "status" => status).increment(1);
    metrics::histogram!("flowforge_http_request_duration_seconds", "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}

/// Serves only `GET /metrics` (no token: bind it where only the scraper
/// reaches) on `listener` until `shutdown`.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), crate::Error> {
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move { handle.render() }
        }),
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(crate::Error::Serve)
}
