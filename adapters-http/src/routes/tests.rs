//! The router with a stand-in backend: a panicking handler is a 500
//! problem and the server lives on; a slow one hits the request timeout;
//! the committed OpenAPI document is the generated one; every route is
//! built through utoipa-axum, so none can be missing from the document.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use chrono::{DateTime, Utc};
use flowforge_app::attempts::Attempt;
use flowforge_app::schedules::{BackfillFire, ScheduleRequest};
use flowforge_app::tokens::Verdict;
use flowforge_app::{Error, Retry, RunReport};
use flowforge_domain::{Priority, WorkflowDefinition};
use flowforge_ports::store::ScheduleView;
use flowforge_ports::store::{
    CancelOutcome, DefinitionSummary, EventView, Gauges, IdempotencyKey, KeyedStart, Published, RunQuery,
};
use flowforge_ports::{RunId, RunSummary, WorkerInfo, WorkflowId};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::backend::{Backend, Fut};
use crate::{ApiConfig, ApiState, AuthMode};

fn missing<'a, T: Send + 'a>() -> Fut<'a, T> {
    Box::pin(async { Err(Error::RunNotFound(RunId(uuid::Uuid::nil()))) })
}

/// Every call fails as "not found", except `report` (panics) and
/// `workers` (never answers).
struct Stub;

impl Backend for Stub {
    fn publish<'a>(&'a self, _: &'a WorkflowDefinition) -> Fut<'a, Published> {
        missing()
    }
    fn find<'a>(&'a self, _: &'a str, _: Option<u32>) -> Fut<'a, Published> {
        missing()
    }
    fn definitions<'a>(&'a self, _: Option<&'a str>) -> Fut<'a, Vec<DefinitionSummary>> {
        missing()
    }
    fn check_types<'a>(&'a self, _: &'a WorkflowDefinition) -> Fut<'a, ()> {
        missing()
    }
    fn start(&self, _: WorkflowId, _: Value, _: Priority, _: Option<IdempotencyKey>) -> Fut<'_, KeyedStart> {
        missing()
    }
    fn page<'a>(&'a self, _: &'a RunQuery) -> Fut<'a, Vec<RunSummary>> {
        missing()
    }
    fn summary(&self, _: RunId) -> Fut<'_, RunSummary> {
        missing()
    }
    #[allow(clippy::panic)] // the point of the stub
    fn report(&self, _: RunId) -> Fut<'_, RunReport> {
        Box::pin(async { panic!("boom in a handler") })
    }
    fn cancel(&self, _: RunId) -> Fut<'_, CancelOutcome> {
        missing()
    }
    fn retry<'a>(&'a self, _: RunId, _: &'a [String], _: bool) -> Fut<'a, Retry> {
        missing()
    }
    fn attempts<'a>(&'a self, _: RunId, _: &'a str) -> Fut<'a, Option<Vec<Attempt>>> {
        missing()
    }
    fn events(&self, _: RunId, _: u64, _: u32) -> Fut<'_, Vec<EventView>> {
        missing()
    }
    fn workers(&self) -> Fut<'_, Vec<WorkerInfo>> {
        Box::pin(std::future::pending())
    }
    fn gauges(&self) -> Fut<'_, Gauges> {
        missing()
    }
    fn ready(&self) -> Fut<'_, ()> {
        missing()
    }
    fn create_schedule(&self, _: ScheduleRequest) -> Fut<'_, ScheduleView> {
        missing()
    }
    fn schedules(&self) -> Fut<'_, Vec<ScheduleView>> {
        missing()
    }
    fn schedule<'a>(&'a self, _: &'a str) -> Fut<'a, ScheduleView> {
        missing()
    }
    fn pause_schedule<'a>(&'a self, _: &'a str, _: bool) -> Fut<'a, ScheduleView> {
        missing()
    }
    fn delete_schedule<'a>(&'a self, _: &'a str) -> Fut<'a, ()> {
        missing()
    }
    fn backfill<'a>(&'a self, _: &'a str, _: DateTime<Utc>, _: DateTime<Utc>, _: bool) -> Fut<'a, Vec<BackfillFire>> {
        missing()
    }
    fn verify<'a>(&'a self, _: &'a str) -> Fut<'a, Verdict> {
        Box::pin(async { Ok(Verdict::Unknown) })
    }
    fn claim<'a>(
        &'a self,
        _: &'a flowforge_ports::WorkerId,
        _: &'a [String],
        _: u32,
        _: Option<Duration>,
        _: Duration,
        _: &'a tokio_util::sync::CancellationToken,
    ) -> Fut<'a, Vec<flowforge_app::remote::RemoteClaim>> {
        missing()
    }
    fn heartbeat<'a>(
        &'a self,
        _: &'a flowforge_ports::WorkerId,
        _: &'a [flowforge_app::remote::Beat],
    ) -> Fut<'a, Vec<flowforge_app::remote::BeatStatus>> {
        missing()
    }
    fn finish_remote<'a>(
        &'a self,
        _: &'a flowforge_ports::WorkerId,
        _: Vec<flowforge_app::remote::RemoteResult>,
    ) -> Fut<'a, Vec<flowforge_ports::store::FinishResult>> {
        missing()
    }
}

fn app() -> axum::Router {
    let config = ApiConfig {
        auth: AuthMode::Disabled,
        request_timeout: Duration::from_millis(200),
        ..ApiConfig::default()
    };
    super::router(ApiState::new(Arc::new(Stub), config, None, CancellationToken::new()))
}

async fn call(app: &axum::Router, path: &str) -> (StatusCode, Value) {
    let request = Request::get(path).body(Body::empty()).unwrap_or_default();
    let response = app.clone().oneshot(request).await.unwrap_or_default();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_panic_is_a_500_problem_and_the_router_lives_on() {
    let app = app();
    let (status, body) = call(&app, "/api/v1/runs/00000000-0000-0000-0000-000000000000").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["code"], "internal");
    let (status, _) = call(&app, "/healthz").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_slow_request_hits_the_timeout() {
    let (status, _) = call(&app(), "/api/v1/workers").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

/// The committed document (`adapters-http/openapi.json`) is the generated
/// one; `UPDATE_OPENAPI=1 cargo test -p flowforge-adapters-http` rewrites it.
#[test]
fn the_committed_openapi_document_is_current() {
    let generated = format!(
        "{}\n",
        serde_json::to_string_pretty(super::openapi()).unwrap_or_default()
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(path, &generated).unwrap_or_default();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "adapters-http/openapi.json is not the generated document; run UPDATE_OPENAPI=1 cargo test -p flowforge-adapters-http and commit it"
    );
}

/// API routes come only from utoipa-axum's `routes!`, which documents what
/// it serves: a plain axum `.route(` would serve a path the document omits.
/// The UI's pages are the one other set of routes (`ui.rs`).
#[test]
fn no_route_bypasses_the_document() {
    let source = include_str!("mod.rs");
    assert!(
        !source.contains(concat!(".route", "(")),
        "a route added outside routes!()"
    );
    let doc = super::openapi();
    let paths: Vec<&str> = doc.paths.paths.keys().map(String::as_str).collect();
    for expected in [
        "/api/v1/definitions",
        "/api/v1/definitions/{name}",
        "/api/v1/definitions/{name}/versions/{version}",
        "/api/v1/runs",
        "/api/v1/runs/{id}",
        "/api/v1/runs/{id}/cancel",
        "/api/v1/runs/{id}/retry",
        "/api/v1/runs/{id}/tasks/{key}/attempts",
        "/api/v1/runs/{id}/events",
        "/api/v1/schedules",
        "/api/v1/schedules/{name}",
        "/api/v1/schedules/{name}/pause",
        "/api/v1/schedules/{name}/resume",
        "/api/v1/schedules/{name}/backfill",
        "/api/v1/workers",
        "/api/v1/worker/claims",
        "/api/v1/worker/heartbeats",
        "/api/v1/worker/results",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(paths.contains(&expected), "{expected} missing from {paths:?}");
    }
    assert_eq!(paths.len(), 22, "{paths:?}");
    // The web UI's pages (docs/design/ui.md) are served beside the API but
    // are not API: none may shadow or be shadowed by a documented path.
    for page in crate::ui::PAGES.iter().chain([&crate::ui::ASSETS]) {
        assert!(!paths.contains(page), "UI page {page} collides with the API");
        assert!(!page.starts_with(super::PREFIX), "UI page {page} under the API prefix");
    }
    let ids: Vec<&str> = doc
        .paths
        .paths
        .values()
        .flat_map(|item| {
            [&item.get, &item.post, &item.put, &item.delete, &item.patch]
                .into_iter()
                .flatten()
        })
        .filter_map(|op| op.operation_id.as_deref())
        .collect();
    let unique: std::collections::BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "operation ids repeat: {ids:?}");
}
