//! A run's history as it happens: Server-Sent Events, each with `id` =
//! the event's per-run sequence number so `Last-Event-ID` resumes with no
//! gap and no repeat, ending with `event: end` after the run's terminal
//! event; or, with `Accept: application/json`, a long poll.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use flowforge_app::tokens::ApiScope;
use flowforge_ports::RunId;
use flowforge_ports::store::EventView;
use futures_util::{Stream, StreamExt};

use super::runs::run_id;
use crate::auth::require;
use crate::problem::{Problem, ProblemBody};
use crate::state::ApiState;
use crate::views::{Event, EventBatch};

/// Events read per query: a stream of a wide run catches up in batches.
const BATCH: u32 = 500;
/// The longest long poll.
const MAX_WAIT: u64 = 60;

/// Whether `e` is the run's own move to a terminal state.
fn ends_run(e: &EventView) -> bool {
    e.task.is_none() && matches!(e.to.as_deref(), Some("succeeded" | "failed" | "cancelled"))
}

/// Where a reader resumes: `Last-Event-ID`, else `after`, else the start.
fn resume_point(headers: &HeaderMap, after: Option<u64>) -> Result<u64, Problem> {
    match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| Problem::bad_request("Last-Event-ID must be an event's sequence number")),
        None => Ok(after.unwrap_or(0)),
    }
}

fn params(raw: Option<&str>) -> Result<(Option<u64>, u64), Problem> {
    let (mut after, mut wait) = (None, 30);
    for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| Problem::bad_request(format!("{name} must be a whole number, not {value:?}")))
        };
        match &*name {
            "after" => after = Some(number()?),
            "wait" => wait = number()?.min(MAX_WAIT),
            other => {
                return Err(Problem::bad_request(format!(
                    "unknown parameter {other:?}; the parameters are after and wait"
                )));
            }
        }
    }
    Ok((after, wait))
}

/// Stream a run's events (SSE), or long-poll them as JSON.
#[utoipa::path(
    get, operation_id = "streamRunEvents", path = "/runs/{id}/events", tag = "runs",
    params(
        ("id" = String, Path, description = "Run id"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this sequence number"),
        ("after" = Option<u64>, Query, description = "Resume after this sequence number"),
        ("wait" = Option<u64>, Query, description = "Long poll (Accept: application/json): seconds to wait for an event, at most 60"),
    ),
    responses(
        (status = 200, description = "text/event-stream: one `transition` event per event (id = seq, data = Event), then `end`; or, for Accept: application/json, an EventBatch", body = EventBatch),
        (status = 404, body = ProblemBody),
    ),
    security(("bearer" = ["runs:read"]))
)]
pub(crate) async fn events(
    State(state): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, Problem> {
    require(&state, &headers, ApiScope::RunsRead).await?;
    let run = run_id(&id)?;
    let (after, wait) = params(raw.as_deref())?;
    let after = resume_point(&headers, after)?;
    // 404 before a stream starts: a stream cannot change its status.
    state.backend().summary(run).await?;
    let wants_json = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/json") && !a.contains("text/event-stream"));
    if wants_json {
        return Ok(Json(long_poll(&state, run, after, Duration::from_secs(wait)).await?).into_response());
    }
    let keep_alive = KeepAlive::new().interval(state.config().keep_alive).text("keep-alive");
    Ok(Sse::new(stream(state, run, after))
        .keep_alive(keep_alive)
        .into_response())
}

async fn finished(state: &ApiState, run: RunId) -> Result<bool, Problem> {
    Ok(state.backend().summary(run).await?.state.is_terminal())
}

async fn long_poll(state: &ApiState, run: RunId, after: u64, wait: Duration) -> Result<EventBatch, Problem> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let events = state.backend().events(run, after, BATCH).await?;
        let ended = events.iter().any(ends_run);
        if !events.is_empty() || tokio::time::Instant::now() >= deadline {
            let finished = ended || (events.is_empty() && finished(state, run).await?);
            return Ok(EventBatch {
                last_seq: events.last().map_or(after, |e| e.seq),
                events: events.iter().map(Event::from).collect(),
                finished,
            });
        }
        if finished(state, run).await? {
            return Ok(EventBatch {
                events: Vec::new(),
                last_seq: after,
                finished: true,
            });
        }
        tokio::select! {
            () = tokio::time::sleep(state.config().events_poll) => {}
            () = tokio::time::sleep_until(deadline) => {}
            () = state.shutdown().cancelled() => {}
        }
    }
}

enum Step {
    Read,
    Ended,
}

/// The stream: read a batch after the last sequence number sent, send it,
/// and when nothing is new wait a poll interval; end after the run's
/// terminal event, or with `event: shutdown` when the server stops.
fn stream(state: ApiState, run: RunId, after: u64) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures_util::stream::unfold((state, after, Step::Read), move |(state, mut after, step)| async move {
        if matches!(step, Step::Ended) {
            return None;
        }
        loop {
            if state.shutdown().is_cancelled() {
                let bye = SseEvent::default()
                    .event("shutdown")
                    .data("the server is stopping; reconnect with Last-Event-ID");
                return Some((vec![Ok(bye)], (state, after, Step::Ended)));
            }
            let events = match state.backend().events(run, after, BATCH).await {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(%run, error = %e, "event stream read failed; retrying");
                    Vec::new()
                }
            };
            if let Some(last) = events.last() {
                after = last.seq;
                let ended = events.iter().any(ends_run);
                let mut out: Vec<Result<SseEvent, Infallible>> = events
                    .iter()
                    .map(|e| {
                        Ok(SseEvent::default()
                            .event("transition")
                            .id(e.seq.to_string())
                            .data(serde_json::to_string(&Event::from(e)).unwrap_or_default()))
                    })
                    .collect();
                if ended {
                    out.push(Ok(SseEvent::default().event("end").data("{}")));
                    return Some((out, (state, after, Step::Ended)));
                }
                return Some((out, (state, after, Step::Read)));
            }
            // Nothing new: a reader resuming after the end gets its `end`.
            if matches!(state.backend().summary(run).await, Ok(s) if s.state.is_terminal())
                && state.backend().events(run, after, 1).await.is_ok_and(|e| e.is_empty())
            {
                return Some((
                    vec![Ok(SseEvent::default().event("end").data("{}"))],
                    (state, after, Step::Ended),
                ));
            }
            tokio::select! {
                () = tokio::time::sleep(state.config().events_poll) => {}
                () = state.shutdown().cancelled() => {}
            }
        }
    })
    .flat_map(futures_util::stream::iter)
}
