//! `/api/v1/schedules`: runs started on a clock (docs/design/schedules.md)
//! — create, list, read, pause, resume, delete, backfill. Reading needs
//! `runs:read`; everything else starts or stops runs, so `runs:write`.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use flowforge_app::schedules::ScheduleRequest;
use flowforge_app::tokens::ApiScope;

use crate::auth::require;
use crate::body;
use crate::problem::{Problem, ProblemBody};
use crate::state::ApiState;
use crate::views::{BackfillBody, BackfillItem, BackfillRequest, CreateSchedule, ScheduleBody, ScheduleList};

/// Create a schedule; it fires from now on.
#[utoipa::path(
    post, operation_id = "createSchedule", path = "/schedules", tag = "schedules",
    request_body = CreateSchedule,
    responses(
        (status = 201, description = "Created", body = ScheduleBody),
        (status = 404, description = "The workflow is not published", body = ProblemBody),
        (status = 409, description = "schedule_exists: the name is taken", body = ProblemBody),
        (status = 422, description = "invalid_schedule: the field at fault and why", body = ProblemBody),
    ),
    security(("bearer" = ["runs:write"]))
)]
pub(crate) async fn create(State(state): State<ApiState>, headers: HeaderMap, raw: Bytes) -> Result<Response, Problem> {
    require(&state, &headers, ApiScope::RunsWrite).await?;
    let request: CreateSchedule = body::json(&headers, &raw)?;
    let view = state
        .backend()
        .create_schedule(ScheduleRequest {
            name: request.name,
            workflow: request.workflow,
            version: request.version,
            cron: request.cron,
            timezone: request.timezone,
            input: request.input,
            overlap: request.overlap,
            catchup_window: request.catchup_window_seconds.map(Duration::from_secs),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(ScheduleBody::from(&view))).into_response())
}

/// Every schedule, with its next fire time and outcome counts.
#[utoipa::path(
    get, operation_id = "listSchedules", path = "/schedules", tag = "schedules",
    responses((status = 200, body = ScheduleList)),
    security(("bearer" = ["runs:read"]))
)]
pub(crate) async fn list(State(state): State<ApiState>, headers: HeaderMap) -> Result<Json<ScheduleList>, Problem> {
    require(&state, &headers, ApiScope::RunsRead).await?;
    let items = state.backend().schedules().await?;
    Ok(Json(ScheduleList {
        items: items.iter().map(ScheduleBody::from).collect(),
    }))
}

/// One schedule.
#[utoipa::path(
    get, operation_id = "getSchedule", path = "/schedules/{name}", tag = "schedules",
    params(("name" = String, Path, description = "Schedule name")),
    responses((status = 200, body = ScheduleBody), (status = 404, body = ProblemBody)),
    security(("bearer" = ["runs:read"]))
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<ScheduleBody>, Problem> {
    require(&state, &headers, ApiScope::RunsRead).await?;
    Ok(Json(ScheduleBody::from(&state.backend().schedule(&name).await?)))
}

/// Delete a schedule and its fire records; its runs stay.
#[utoipa::path(
    delete, operation_id = "deleteSchedule", path = "/schedules/{name}", tag = "schedules",
    params(("name" = String, Path, description = "Schedule name")),
    responses((status = 204, description = "Deleted"), (status = 404, body = ProblemBody)),
    security(("bearer" = ["runs:write"]))
)]
pub(crate) async fn delete(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<StatusCode, Problem> {
    require(&state, &headers, ApiScope::RunsWrite).await?;
    state.backend().delete_schedule(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pause a schedule: it stops firing; its runs go on.
#[utoipa::path(
    post, operation_id = "pauseSchedule", path = "/schedules/{name}/pause", tag = "schedules",
    params(("name" = String, Path, description = "Schedule name")),
    responses((status = 200, body = ScheduleBody), (status = 404, body = ProblemBody)),
    security(("bearer" = ["runs:write"]))
)]
pub(crate) async fn pause(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<ScheduleBody>, Problem> {
    switch(&state, &headers, &name, true).await
}

/// Resume a schedule: it fires from now on; the pause's fire times are
/// neither fired nor counted.
#[utoipa::path(
    post, operation_id = "resumeSchedule", path = "/schedules/{name}/resume", tag = "schedules",
    params(("name" = String, Path, description = "Schedule name")),
    responses((status = 200, body = ScheduleBody), (status = 404, body = ProblemBody)),
    security(("bearer" = ["runs:write"]))
)]
pub(crate) async fn resume(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<ScheduleBody>, Problem> {
    switch(&state, &headers, &name, false).await
}

async fn switch(
    state: &ApiState,
    headers: &HeaderMap,
    name: &str,
    paused: bool,
) -> Result<Json<ScheduleBody>, Problem> {
    require(state, headers, ApiScope::RunsWrite).await?;
    Ok(Json(ScheduleBody::from(
        &state.backend().pause_schedule(name, paused).await?,
    )))
}

/// Start a run for each fire time from `from` to `to` without an outcome
/// yet, whatever the overlap policy; `dry_run` only says which.
#[utoipa::path(
    post, operation_id = "backfillSchedule", path = "/schedules/{name}/backfill", tag = "schedules",
    params(("name" = String, Path, description = "Schedule name")),
    request_body = BackfillRequest,
    responses(
        (status = 200, body = BackfillBody),
        (status = 404, body = ProblemBody),
        (status = 422, description = "backfill_refused: the range is reversed or holds too many fire times", body = ProblemBody),
    ),
    security(("bearer" = ["runs:write"]))
)]
pub(crate) async fn backfill(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    raw: Bytes,
) -> Result<Json<BackfillBody>, Problem> {
    require(&state, &headers, ApiScope::RunsWrite).await?;
    let request: BackfillRequest = body::json(&headers, &raw)?;
    let fires = state
        .backend()
        .backfill(&name, request.from, request.to, request.dry_run)
        .await?;
    Ok(Json(BackfillBody {
        fires: fires.iter().map(BackfillItem::from).collect(),
    }))
}
