//! `/api/v1/runs`: start (idempotent under a key), list by keyset pages,
//! read, cancel, and a task's attempts.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use flowforge_app::tokens::ApiScope;
use flowforge_domain::RunState;
use flowforge_ports::RunId;
use flowforge_ports::store::{CancelOutcome, IdempotencyKey, KeyedStart, RunCursor, RunQuery};
use sha2::{Digest, Sha256};

use crate::auth::require;
use crate::body;
use crate::problem::{Problem, ProblemBody};
use crate::state::ApiState;
use crate::views::{
    AttemptBody, AttemptList, CancelAccepted, Report, RetryAccepted, RetryRun, RunItem, RunPage, StartRun, Started,
};

/// The longest idempotency key accepted.
const MAX_KEY_LEN: usize = 255;

pub(crate) fn run_id(id: &str) -> Result<RunId, Problem> {
    id.parse()
        .map_err(|_| Problem::not_found(format!("run {id:?} not found (a run id is a UUID)")))
}

fn idempotency_key(headers: &HeaderMap, request: &StartRun) -> Result<Option<IdempotencyKey>, Problem> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_LEN && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| {
            Problem::bad_request(format!(
                "Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters"
            ))
        })?;
    // The parsed request, re-serialised: object keys sort, so the same
    // request written in another key order or spacing is the same request.
    let canonical = serde_json::to_vec(request).map_err(|e| Problem::internal(e.to_string()))?;
    let digest = Sha256::digest(&canonical);
    Ok(Some(IdempotencyKey {
        key: key.to_owned(),
        request_hash: digest.iter().map(|b| format!("{b:02x}")).collect(),
    }))
}

/// Start a run of a published definition.
#[utoipa::path(
    post, operation_id = "startRun", path = "/runs", tag = "runs",
    request_body = StartRun,
    params(("Idempotency-Key" = Option<String>, Header, description = "Retrying with the same key and body returns the first run")),
    responses(
        (status = 201, description = "Started", body = Started),
        (status = 200, description = "Replayed: this key already started this run (header Idempotent-Replayed: true)", body = Started),
        (status = 404, description = "No such workflow", body = ProblemBody),
        (status = 422, description = "idempotency_key_reused, unknown_task_type, refused_value, concurrency_key_unresolved", body = ProblemBody),
    ),
    security(("bearer" = ["runs:write"]))
)]
pub(crate) async fn start(State(state): State<ApiState>, headers: HeaderMap, raw: Bytes) -> Result<Response, Problem> {
    require(&state, &headers, ApiScope::RunsWrite).await?;
    let request: StartRun = body::json(&headers, &raw)?;
    let key = idempotency_key(&headers, &request)?;
    let backend = state.backend();
    let published = backend.find(&request.workflow, request.version).await?;
    backend.check_types(&published.definition).await?;
    let priority = request.priority.unwrap_or_default();
    let (status, started) = match backend.start(published.id, request.input, priority, key).await? {
        // What the response says of a new run is known without reading it.
        KeyedStart::Started(run) => (
            StatusCode::CREATED,
            Started::new(
                run.id,
                published.definition.name(),
                published.definition.version(),
                run.created_at,
            ),
        ),
        // The first run may be of another version: as it was stored.
        KeyedStart::Replayed(run) => (StatusCode::OK, Started::of(&backend.summary(run).await?)),
        KeyedStart::Reused(run) => {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                format!("this Idempotency-Key started run {run} with a different request body"),
            )
            .with("run_id", run.to_string().into()));
        }
    };
    let mut response = (status, Json(started)).into_response();
    if status == StatusCode::OK {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

fn encode_cursor(c: &RunCursor) -> String {
    let plain = format!("{}/{}", c.created_at.timestamp_micros(), c.id);
    plain.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_cursor(text: &str) -> Option<RunCursor> {
    let bytes: Option<Vec<u8>> = (0..text.len())
        .step_by(2)
        .map(|i| text.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    let plain = String::from_utf8(bytes?).ok()?;
    let (micros, id) = plain.split_once('/')?;
    Some(RunCursor {
        created_at: DateTime::<Utc>::from_timestamp_micros(micros.parse().ok()?)?,
        id: id.parse().ok()?,
    })
}

fn time_param(name: &str, value: &str) -> Result<DateTime<Utc>, Problem> {
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            Problem::bad_request(format!(
                "{name} must be an RFC 3339 time such as 2026-12-01T10:00:00Z: {e}"
            ))
        })
}

fn run_query(raw: Option<&str>) -> Result<RunQuery, Problem> {
    let mut query = RunQuery {
        limit: 50,
        ..RunQuery::default()
    };
    for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*name {
            "limit" => {
                query.limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=500).contains(n))
                    .ok_or_else(|| Problem::bad_request(format!("limit must be 1 to 500, not {value:?}")))?;
            }
            "cursor" => {
                query.after = Some(decode_cursor(&value).ok_or_else(|| {
                    Problem::bad_request("cursor is not one this server gave out: pass next_cursor as it came")
                })?);
            }
            "state" => query.states.push(value.parse::<RunState>().map_err(|_| {
                Problem::bad_request(format!(
                    "state must be pending, running, succeeded, failed or cancelled, not {value:?}"
                ))
            })?),
            "workflow" => query.workflows.push(value.into_owned()),
            "created_after" => query.created_after = Some(time_param("created_after", &value)?),
            "created_before" => query.created_before = Some(time_param("created_before", &value)?),
            other => {
                return Err(Problem::bad_request(format!(
                    "unknown parameter {other:?}; the parameters are limit, cursor, state, workflow, created_after, created_before"
                ))
                .with("parameter", other.into()));
            }
        }
    }
    Ok(query)
}

/// List runs, newest first, a page at a time.
#[utoipa::path(
    get, operation_id = "listRuns", path = "/runs", tag = "runs",
    params(
        ("limit" = Option<u32>, Query, description = "1 to 500, default 50"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
        ("state" = Option<Vec<String>>, Query, description = "repeat for OR"),
        ("workflow" = Option<Vec<String>>, Query, description = "repeat for OR"),
        ("created_after" = Option<String>, Query, description = "RFC 3339, inclusive"),
        ("created_before" = Option<String>, Query, description = "RFC 3339, exclusive"),
    ),
    responses((status = 200, body = RunPage), (status = 400, body = ProblemBody)),
    security(("bearer" = ["runs:read"]))
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Json<RunPage>, Problem> {
    require(&state, &headers, ApiScope::RunsRead).await?;
    let query = run_query(raw.as_deref())?;
    let runs = state.backend().page(&query).await?;
    let next_cursor = (runs.len() == query.limit as usize)
        .then(|| runs.last())
        .flatten()
        .map(|r| {
            encode_cursor(&RunCursor {
                created_at: r.created_at,
                id: r.id,
            })
        });
    Ok(Json(RunPage {
        items: runs.iter().map(RunItem::from).collect(),
        next_cursor,
    }))
}

/// The run report: tasks, compensations and the history.
#[utoipa::path(
    get, operation_id = "getRun", path = "/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    responses((status = 200, body = Report), (status = 404, body = ProblemBody)),
    security(("bearer" = ["runs:read"]))
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Report>, Problem> {
    require(&state, &headers, ApiScope::RunsRead).await?;
    Ok(Json(Report(state.backend().report(run_id(&id)?).await?)))
}

/// Request cancellation of a run.
#[utoipa::path(
    post, operation_id = "cancelRun", path = "/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 202, description = "Requested: waiting tasks are cancelled, running ones stop", body = CancelAccepted),
        (status = 404, body = ProblemBody),
        (status = 409, description = "run_finished", body = ProblemBody),
    ),
    security(("bearer" = ["runs:write"]))
)]
pub(crate) async fn cancel(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    require(&state, &headers, ApiScope::RunsWrite).await?;
    let run = run_id(&id)?;
    let cancel = match state.backend().cancel(run).await? {
        CancelOutcome::Requested => "requested",
        CancelOutcome::AlreadyRequested => "already_requested",
        CancelOutcome::AlreadyFinished(s) => {
            return Err(Problem::new(
                StatusCode::CONFLICT,
                "run_finished",
                format!("run {run} has already ended ({s})"),
            )
            .with("state", s.to_string().into()));
        }
    };
    Ok((
        StatusCode::ACCEPTED,
        Json(CancelAccepted {
            id: run.to_string(),
            cancel,
        }),
    )
        .into_response())
}

/// Retry a failed or cancelled run in place (docs/design/retry.md): it
/// keeps its id, opens its next generation, and reruns only the retry set.
#[utoipa::path(
    post, operation_id = "retryRun", path = "/runs/{id}/retry", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    request_body(content = RetryRun, description = "Empty: retry every failed or cancelled task"),
    responses(
        (status = 202, description = "Retried (or, for a dry run, the set it would retry)", body = RetryAccepted),
        (status = 404, body = ProblemBody),
        (status = 409, description = "run_not_retryable, run_compensated, retry_conflict", body = ProblemBody),
        (status = 422, description = "retry_refused: a named task is unknown, or one would wait forever", body = ProblemBody),
    ),
    security(("bearer" = ["runs:write"]))
)]
pub(crate) async fn retry(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<Response, Problem> {
    require(&state, &headers, ApiScope::RunsWrite).await?;
    let run = run_id(&id)?;
    let request: RetryRun = if raw.iter().all(u8::is_ascii_whitespace) {
        RetryRun::default()
    } else {
        body::json(&headers, &raw)?
    };
    let retry = state.backend().retry(run, &request.from, request.dry_run).await?;
    Ok((StatusCode::ACCEPTED, Json(RetryAccepted::new(run.to_string(), &retry))).into_response())
}

/// Every attempt of one task, oldest first.
#[utoipa::path(
    get, operation_id = "listAttempts", path = "/runs/{id}/tasks/{key}/attempts", tag = "runs",
    params(("id" = String, Path, description = "Run id"), ("key" = String, Path, description = "Task key")),
    responses((status = 200, body = AttemptList), (status = 404, body = ProblemBody)),
    security(("bearer" = ["runs:read"]))
)]
pub(crate) async fn attempts(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path((id, key)): Path<(String, String)>,
) -> Result<Json<AttemptList>, Problem> {
    require(&state, &headers, ApiScope::RunsRead).await?;
    let run = run_id(&id)?;
    let attempts = state
        .backend()
        .attempts(run, &key)
        .await?
        .ok_or_else(|| Problem::not_found(format!("run {run} has no task {key:?}")))?;
    Ok(Json(AttemptList {
        items: attempts.into_iter().map(AttemptBody).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_garbage_is_refused() {
        let c = RunCursor {
            created_at: DateTime::<Utc>::from_timestamp_micros(1_764_000_000_123_456).unwrap_or_default(),
            id: RunId(uuid::Uuid::nil()),
        };
        assert_eq!(decode_cursor(&encode_cursor(&c)), Some(c));
        assert_eq!(decode_cursor("zz"), None);
        assert_eq!(decode_cursor("abc"), None);
    }

    #[test]
    fn unknown_and_out_of_range_parameters_are_400() {
        assert!(run_query(Some("limit=0")).is_err());
        assert!(run_query(Some("limit=501")).is_err());
        assert!(run_query(Some("colour=red")).is_err());
        let q = run_query(Some("state=failed&state=cancelled&workflow=a&limit=7")).unwrap_or_default();
        assert_eq!(q.limit, 7);
        assert_eq!(q.states, vec![RunState::Failed, RunState::Cancelled]);
        assert_eq!(q.workflows, vec!["a".to_owned()]);
    }
}
