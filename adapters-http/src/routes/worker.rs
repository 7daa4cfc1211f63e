//! The remote-worker API (docs/design/handlers.md#remote-workers): claim
//! ready task runs of your types by long poll, heartbeat their leases,
//! store their outcomes with their tokens — for workers in any language.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use flowforge_app::remote::{Beat, BeatStatus, RemoteClaim, RemoteOutcome, RemoteResult};
use flowforge_app::tokens::ApiScope;
use flowforge_ports::store::FinishResult;
use flowforge_ports::{RunId, TaskRunId, WorkerId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::require;
use crate::body;
use crate::problem::{Problem, ProblemBody};
use crate::state::ApiState;
use crate::views::time;

/// The longest worker id accepted.
const MAX_WORKER_ID: usize = 200;

/// Claim ready task runs.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClaimRequest {
    /// Who is claiming: shown as the lease owner and in the worker list.
    pub(crate) worker: String,
    /// The task types this worker runs.
    pub(crate) task_types: Vec<String>,
    /// The most task runs to claim (1–100, default 1).
    #[serde(default)]
    pub(crate) max: Option<u32>,
    /// How long to wait for work when none is ready (0–25 s, default 0).
    #[serde(default)]
    pub(crate) wait_seconds: Option<f64>,
    /// The lease each claim holds until renewed (1–600 s, default the
    /// server's lease).
    #[serde(default)]
    pub(crate) lease_seconds: Option<f64>,
}

/// A claimed task run: everything its attempt needs.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ClaimItem {
    /// The task run.
    pub(crate) task_run_id: i64,
    /// The fencing token to present with heartbeats and the result.
    pub(crate) token: i64,
    /// Its run.
    pub(crate) run_id: String,
    /// The task's key.
    pub(crate) task_key: String,
    /// The task's type.
    pub(crate) task_type: String,
    /// The task it undoes, for a compensator.
    pub(crate) compensate_for: Option<String>,
    /// 1-based attempt.
    pub(crate) attempt: u32,
    /// `{run_id}:{task_key}`, the same on every attempt: make side effects
    /// idempotent with it.
    pub(crate) idempotency_key: String,
    /// The run's input.
    #[schema(value_type = Object)]
    pub(crate) run_input: Value,
    /// Dependencies' outputs by task key.
    #[schema(value_type = Object)]
    pub(crate) inputs: Map<String, Value>,
    /// The task's config.
    #[schema(value_type = Object)]
    pub(crate) config: Map<String, Value>,
    /// For a child `task[i]` of a mapped task, its item's index (absent
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) index: Option<u32>,
    /// For a child of a mapped task, its item (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub(crate) item: Option<Value>,
    /// The lease heartbeats renew, in seconds (heartbeat every third).
    pub(crate) lease_seconds: f64,
    /// When the lease runs out unless renewed (RFC 3339).
    pub(crate) lease_expires_at: String,
    /// When the attempt times out (RFC 3339): stop by then.
    pub(crate) deadline: String,
}

/// The claims made (none when nothing was ready within the wait).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ClaimResponse {
    /// Claimed task runs.
    pub(crate) claims: Vec<ClaimItem>,
}

/// Renew leases.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeartbeatRequest {
    /// Who holds them.
    pub(crate) worker: String,
    /// The leases to renew.
    pub(crate) leases: Vec<LeaseItem>,
}

/// One lease to renew.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseItem {
    /// The task run.
    pub(crate) task_run_id: i64,
    /// The claim's token.
    pub(crate) token: i64,
    /// Progress to show with the task (a small JSON value, ≤ 64 KiB).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub(crate) progress: Option<Value>,
}

/// What became of each lease, in request order.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HeartbeatResponse {
    /// One per requested lease.
    pub(crate) leases: Vec<LeaseStatusItem>,
}

/// One lease's status.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LeaseStatusItem {
    /// The task run.
    pub(crate) task_run_id: i64,
    /// `held` (go on), `cancel_requested` (stop, report `cancelled`),
    /// `lost` (stop: another attempt owns it) or `timed_out` (stop: failed
    /// as timed out).
    pub(crate) status: &'static str,
}

/// Store outcomes.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResultsRequest {
    /// Who ran them.
    pub(crate) worker: String,
    /// The outcomes.
    pub(crate) results: Vec<ResultItem>,
}

/// One attempt's outcome.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResultItem {
    /// The task run.
    pub(crate) task_run_id: i64,
    /// Its run, as the claim gave it.
    pub(crate) run_id: String,
    /// The claim's token.
    pub(crate) token: i64,
    /// `succeeded`, `failed` or `cancelled`.
    pub(crate) outcome: String,
    /// The output of a success (JSON; default null).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub(crate) output: Option<Value>,
    /// Why a failure failed.
    #[serde(default)]
    pub(crate) error: Option<String>,
    /// Whether another attempt may succeed (default true).
    #[serde(default)]
    pub(crate) retryable: Option<bool>,
    /// The least wait before the next attempt, in seconds.
    #[serde(default)]
    pub(crate) retry_after_seconds: Option<f64>,
}

/// What became of each outcome, in request order.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ResultsResponse {
    /// One per submitted outcome.
    pub(crate) results: Vec<ResultStatusItem>,
}

/// One outcome's fate.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ResultStatusItem {
    /// The task run.
    pub(crate) task_run_id: i64,
    /// `recorded`, or `stale_token` (the lease was lost: discarded).
    pub(crate) status: &'static str,
    /// The task run's state after a recorded outcome (`succeeded`,
    /// `retrying`, `failed`, `cancelled`).
    pub(crate) state: Option<String>,
}

fn worker_id(worker: &str) -> Result<WorkerId, Problem> {
    if worker.trim().is_empty() || worker.len() > MAX_WORKER_ID || worker.chars().any(char::is_control) {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!("$.worker must be 1 to {MAX_WORKER_ID} printable characters"),
        ));
    }
    Ok(WorkerId(worker.to_owned()))
}

fn invalid(detail: String) -> Problem {
    Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", detail)
}

fn seconds(value: Option<f64>, at: &str, range: std::ops::RangeInclusive<f64>) -> Result<Option<Duration>, Problem> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && range.contains(&s) => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(invalid(format!(
            "{at} is {s}; it must be between {} and {} seconds",
            range.start(),
            range.end()
        ))),
    }
}

fn claim_item(c: RemoteClaim) -> ClaimItem {
    ClaimItem {
        task_run_id: c.task_run_id.0,
        token: c.token,
        run_id: c.run_id.to_string(),
        task_key: c.task_key,
        task_type: c.task_type,
        compensate_for: c.compensate_for,
        attempt: c.attempt,
        idempotency_key: c.idempotency_key,
        run_input: c.run_input,
        inputs: c.inputs,
        config: c.config,
        index: c.item.as_ref().map(|i| i.index),
        item: c.item.map(|i| i.item),
        lease_seconds: c.lease.as_secs_f64(),
        lease_expires_at: time(c.lease_expires_at),
        deadline: time(c.deadline),
    }
}

/// Claim up to `max` ready task runs of the given types, waiting up to
/// `wait_seconds` for one. Each claim takes a lease and bumps the task
/// run's fencing token, exactly as a queue-fed worker's claim does.
#[utoipa::path(
    post, operation_id = "claimTaskRuns", path = "/worker/claims", tag = "worker",
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "Claimed (possibly none)", body = ClaimResponse),
        (status = 422, description = "invalid_request", body = ProblemBody),
    ),
    security(("bearer" = ["worker"]))
)]
pub(crate) async fn claims(State(state): State<ApiState>, headers: HeaderMap, raw: Bytes) -> Result<Response, Problem> {
    require(&state, &headers, ApiScope::Worker).await?;
    let request: ClaimRequest = body::json(&headers, &raw)?;
    let worker = worker_id(&request.worker)?;
    if request.task_types.is_empty() || request.task_types.iter().any(|t| t.trim().is_empty()) {
        return Err(invalid(
            "$.task_types must name at least one task type, none blank".to_owned(),
        ));
    }
    let max = request.max.unwrap_or(1);
    if !(1..=100).contains(&max) {
        return Err(invalid(format!("$.max is {max}; it must be between 1 and 100")));
    }
    let wait = seconds(request.wait_seconds, "$.wait_seconds", 0.0..=25.0)?.unwrap_or_default();
    let lease = seconds(request.lease_seconds, "$.lease_seconds", 1.0..=600.0)?;
    let claims = state
        .backend()
        .claim(&worker, &request.task_types, max, lease, wait, state.shutdown())
        .await?;
    Ok(Json(ClaimResponse {
        claims: claims.into_iter().map(claim_item).collect(),
    })
    .into_response())
}

/// Renew the leases of claimed task runs, optionally with progress. Stop
/// any whose status is not `held`.
#[utoipa::path(
    post, operation_id = "heartbeatTaskRuns", path = "/worker/heartbeats", tag = "worker",
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "Each lease's status", body = HeartbeatResponse),
        (status = 422, description = "invalid_request, refused_value", body = ProblemBody),
    ),
    security(("bearer" = ["worker"]))
)]
pub(crate) async fn heartbeats(
    State(state): State<ApiState>,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Json<HeartbeatResponse>, Problem> {
    require(&state, &headers, ApiScope::Worker).await?;
    let request: HeartbeatRequest = body::json(&headers, &raw)?;
    let worker = worker_id(&request.worker)?;
    let beats: Vec<Beat> = request
        .leases
        .into_iter()
        .map(|l| Beat {
            task_run_id: TaskRunId(l.task_run_id),
            token: l.token,
            progress: l.progress,
        })
        .collect();
    let statuses = state.backend().heartbeat(&worker, &beats).await?;
    Ok(Json(HeartbeatResponse {
        leases: beats
            .iter()
            .zip(statuses)
            .map(|(b, s)| LeaseStatusItem {
                task_run_id: b.task_run_id.0,
                status: match s {
                    BeatStatus::Held => "held",
                    BeatStatus::CancelRequested => "cancel_requested",
                    BeatStatus::Lost => "lost",
                    BeatStatus::TimedOut => "timed_out",
                },
            })
            .collect(),
    }))
}

fn remote_result(index: usize, item: ResultItem) -> Result<RemoteResult, Problem> {
    let at = format!("$.results[{index}]");
    let run_id = Uuid::parse_str(&item.run_id)
        .map(RunId)
        .map_err(|e| invalid(format!("{at}.run_id is not a run id: {e}")))?;
    let outcome = match item.outcome.as_str() {
        "succeeded" => RemoteOutcome::Succeeded(item.output.unwrap_or(Value::Null)),
        "failed" => RemoteOutcome::Failed {
            error: item
                .error
                .unwrap_or_else(|| "the remote worker reported a failure".to_owned()),
            retryable: item.retryable.unwrap_or(true),
            retry_after: seconds(
                item.retry_after_seconds,
                &format!("{at}.retry_after_seconds"),
                0.0..=86_400.0,
            )?,
        },
        "cancelled" => RemoteOutcome::Cancelled,
        other => {
            return Err(invalid(format!(
                "{at}.outcome is '{other}'; it must be succeeded, failed or cancelled"
            )));
        }
    };
    Ok(RemoteResult {
        task_run_id: TaskRunId(item.task_run_id),
        run_id,
        token: item.token,
        outcome,
    })
}

/// Store the outcomes of claimed task runs, each with its token. An
/// outcome whose token no longer holds the lease is discarded (and
/// audited); when every outcome of the request is, the answer is 409
/// `stale_token`.
#[utoipa::path(
    post, operation_id = "storeTaskResults", path = "/worker/results", tag = "worker",
    request_body = ResultsRequest,
    responses(
        (status = 200, description = "Each outcome's fate", body = ResultsResponse),
        (status = 409, description = "stale_token: no outcome was stored", body = ProblemBody),
        (status = 422, description = "invalid_request", body = ProblemBody),
    ),
    security(("bearer" = ["worker"]))
)]
pub(crate) async fn results(
    State(state): State<ApiState>,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Response, Problem> {
    require(&state, &headers, ApiScope::Worker).await?;
    let request: ResultsRequest = body::json(&headers, &raw)?;
    let worker = worker_id(&request.worker)?;
    if request.results.is_empty() {
        return Err(invalid("$.results is empty".to_owned()));
    }
    let results = request
        .results
        .into_iter()
        .enumerate()
        .map(|(i, item)| remote_result(i, item))
        .collect::<Result<Vec<_>, _>>()?;
    let ids: Vec<i64> = results.iter().map(|r| r.task_run_id.0).collect();
    let stored = state.backend().finish_remote(&worker, results).await?;
    if stored.iter().all(|s| *s == FinishResult::Stale) {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "stale_token",
            "no outcome was stored: the token no longer holds the lease (it was reaped or another attempt \
             claimed the task); the write was discarded",
        )
        .with("task_run_ids", Value::from(ids)));
    }
    Ok(Json(ResultsResponse {
        results: ids
            .into_iter()
            .zip(stored)
            .map(|(id, s)| match s {
                FinishResult::Recorded(state) => ResultStatusItem {
                    task_run_id: id,
                    status: "recorded",
                    state: Some(state.as_str().to_owned()),
                },
                FinishResult::Stale => ResultStatusItem {
                    task_run_id: id,
                    status: "stale_token",
                    state: None,
                },
            })
            .collect(),
    })
    .into_response())
}
