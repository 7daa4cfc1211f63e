//! What operators and their tools read: liveness, readiness, Prometheus
//! metrics, the worker registry and the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flowforge_app::tokens::ApiScope;

use crate::auth::require;
use crate::metrics::record_gauges;
use crate::problem::{Problem, ProblemBody};
use crate::state::ApiState;
use crate::views::{WorkerItem, WorkerList};

/// The process is up.
#[utoipa::path(get, operation_id = "healthz", path = "/healthz", tag = "operations", responses((status = 200, description = "ok")))]
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// The store is reachable and migrated (503 otherwise).
#[utoipa::path(
    get, operation_id = "readyz", path = "/readyz", tag = "operations",
    responses((status = 200, description = "ready"), (status = 503, body = ProblemBody))
)]
pub(crate) async fn readyz(State(state): State<ApiState>) -> Result<&'static str, Problem> {
    state
        .backend()
        .ready()
        .await
        .map_err(|e| Problem::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", e.to_string()))?;
    Ok("ready\n")
}

/// Prometheus metrics (text format); needs a token with `admin` unless
/// the server runs with `--metrics-open`.
#[utoipa::path(
    get, operation_id = "metrics", path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain")),
    security((), ("bearer" = ["admin"]))
)]
pub(crate) async fn metrics(State(state): State<ApiState>, headers: HeaderMap) -> Result<Response, Problem> {
    if !state.config().metrics_open {
        require(&state, &headers, ApiScope::Admin).await?;
    }
    let Some(handle) = state.metrics() else {
        return Err(Problem::not_found("metrics are not enabled in this process"));
    };
    // Gauges read from the store are set at scrape time, by the server only.
    if let Ok(gauges) = state.backend().gauges().await {
        record_gauges(&gauges);
    }
    let mut response = handle.render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}

/// Registered workers, their task types and last heartbeat.
#[utoipa::path(
    get, operation_id = "listWorkers", path = "/workers", tag = "workers",
    responses((status = 200, body = WorkerList)),
    security(("bearer" = ["workers:read"]))
)]
pub(crate) async fn workers(State(state): State<ApiState>, headers: HeaderMap) -> Result<Json<WorkerList>, Problem> {
    require(&state, &headers, ApiScope::WorkersRead).await?;
    let workers = state.backend().workers().await?;
    Ok(Json(WorkerList {
        items: workers.iter().map(WorkerItem::from).collect(),
    }))
}
