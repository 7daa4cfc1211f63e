//! Rows as the statements return them, and their checked conversion into the
//! ports' types: the column conversions, and the rows that become port views.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_domain::Priority;
use flowforge_ports::store::{DefinitionSummary, FireCounts, NewSchedule, ScheduleView, TokenStatus, TokenView, Wait};
use flowforge_ports::{
    Clock, EventView, PassTask, RunId, RunSummary, Scope, TaskRunId, TaskRunView, WorkerId, WorkerInfo, WorkflowId,
    store,
};
use serde_json::Value;
use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow, Row};

use crate::error::{DecodeError, store_error};

/// The longest duration bound into SQL: a century. Larger values would
/// overflow SQLite's 64-bit arithmetic into REAL, which a STRICT INTEGER
/// column refuses.
const MAX_DURATION_MS: u128 = 100 * 365 * 24 * 3600 * 1000;

/// A duration in whole milliseconds, clamped to [`MAX_DURATION_MS`].
pub(crate) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis().min(MAX_DURATION_MS)).unwrap_or(i64::MAX)
}

/// The clock's offset in milliseconds: bound as `?1` of every statement
/// that computes store time.
pub(crate) fn offset_ms(clock: &dyn Clock) -> i64 {
    clock.offset().num_milliseconds()
}

/// A stored time (milliseconds since the epoch).
pub(crate) fn time(column: &'static str, millis: i64) -> Result<DateTime<Utc>, DecodeError> {
    DateTime::from_timestamp_millis(millis).ok_or(DecodeError::Time { column, millis })
}

/// A nullable stored time.
pub(crate) fn opt_time(column: &'static str, millis: Option<i64>) -> Result<Option<DateTime<Utc>>, DecodeError> {
    millis.map(|m| time(column, m)).transpose()
}

/// A stored enum name (state, reason, transition).
pub(crate) fn name<T: FromStr>(column: &'static str, value: &str) -> Result<T, DecodeError> {
    value.parse().map_err(|_| DecodeError::UnknownName {
        column,
        value: value.to_owned(),
    })
}

/// A nullable stored enum name.
pub(crate) fn opt_name<T: FromStr>(column: &'static str, value: Option<&str>) -> Result<Option<T>, DecodeError> {
    value.map(|v| name(column, v)).transpose()
}

/// A stored run id.
pub(crate) fn run_id(value: &str) -> Result<RunId, DecodeError> {
    value.parse().map_err(|_| DecodeError::Uuid(value.to_owned()))
}

/// The text form a run id is stored in.
pub(crate) fn run_key(run: RunId) -> String {
    run.0.hyphenated().to_string()
}

/// A stored JSON document.
pub(crate) fn json(column: &'static str, text: &str) -> Result<Value, DecodeError> {
    serde_json::from_str(text).map_err(|e| DecodeError::Json {
        column,
        problem: e.to_string(),
    })
}

/// A stored non-negative number that must fit a `u32`.
pub(crate) fn u32_of(column: &'static str, value: i64) -> Result<u32, DecodeError> {
    u32::try_from(value).map_err(|_| DecodeError::Number { column, value })
}

/// A stored priority, checked against the scale.
pub(crate) fn priority(value: i64, column: &'static str) -> Result<Priority, DecodeError> {
    Priority::new(value).map_err(|_| DecodeError::Number { column, value })
}

/// A stored count.
pub(crate) fn u64_of(column: &'static str, value: i64) -> Result<u64, DecodeError> {
    u64::try_from(value).map_err(|_| DecodeError::Number { column, value })
}

/// The scope filter bound into queries: a JSON array of run keys, NULL for
/// every run.
pub(crate) fn scope_key(scope: &Scope) -> Option<String> {
    scope
        .run_ids()
        .map(|runs| Value::from(runs.into_iter().map(run_key).collect::<Vec<_>>()).to_string())
}

/// Decodes a row by column names, a decoding failure being corrupt data.
pub(crate) fn decode<'r, T: FromRow<'r, SqliteRow>>(row: &'r SqliteRow) -> Result<T, store::Error> {
    T::from_row(row).map_err(store_error)
}

/// One column of a row by position.
pub(crate) fn col<'r, T>(row: &'r SqliteRow, index: usize) -> Result<T, store::Error>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(index).map_err(store_error)
}

/// A due wait (docs/design/concurrency.md#gates).
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub(crate) struct WaitRow {
    task_key: Option<String>,
    scope: String,
    label: String,
    max: i64,
    strategy: String,
    tried: bool,
}

impl WaitRow {
    pub(crate) fn into_wait(self) -> Result<Wait, DecodeError> {
        Ok(Wait {
            task: self.task_key,
            scope: self.scope,
            label: self.label,
            max: u32_of("concurrency_wait.max", self.max)?,
            strategy: name("concurrency_wait.strategy", &self.strategy)?,
            tried: self.tried,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SummaryRow {
    id: String,
    workflow_id: i64,
    name: String,
    version: i64,
    state: String,
    cancel_requested: bool,
    cancel_reason: Option<String>,
    generation: i64,
    priority: i64,
    created_at: i64,
    started_at: Option<i64>,
    finished_at: Option<i64>,
}

impl SummaryRow {
    pub(crate) fn into_summary(self) -> Result<RunSummary, DecodeError> {
        Ok(RunSummary {
            id: run_id(&self.id)?,
            workflow_id: WorkflowId(self.workflow_id),
            workflow: self.name,
            version: u32_of("workflow.version", self.version)?,
            state: name("workflow_run.state", &self.state)?,
            cancel_requested: self.cancel_requested,
            cancel_reason: self.cancel_reason,
            generation: u32_of("workflow_run.generation", self.generation)?,
            priority: priority(self.priority, "workflow_run.priority")?,
            created_at: time("workflow_run.created_at", self.created_at)?,
            started_at: opt_time("workflow_run.started_at", self.started_at)?,
            finished_at: opt_time("workflow_run.finished_at", self.finished_at)?,
        })
    }
}

#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub(crate) struct TaskRunRow {
    pub(crate) id: i64,
    task_key: String,
    compensate_for: Option<String>,
    state: String,
    attempt: i64,
    generation: i64,
    fencing_token: i64,
    priority: i64,
    cancel_reason: Option<String>,
    skip_reason: Option<String>,
    result: Option<String>,
    error: Option<String>,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    retry_at: Option<i64>,
    lease_owner: Option<String>,
    progress: Option<String>,
    created_at: i64,
}

impl TaskRunRow {
    pub(crate) fn into_view(self) -> Result<TaskRunView, DecodeError> {
        Ok(TaskRunView {
            id: TaskRunId(self.id),
            key: self.task_key,
            compensate_for: self.compensate_for,
            state: name("task_run.state", &self.state)?,
            attempt: u32_of("task_run.attempt", self.attempt)?,
            generation: u32_of("task_run.generation", self.generation)?,
            token: self.fencing_token,
            priority: priority(self.priority, "task_run.priority")?,
            blocked_by: None,
            cancel_reason: opt_name("task_run.cancel_reason", self.cancel_reason.as_deref())?,
            skip_reason: opt_name("task_run.skip_reason", self.skip_reason.as_deref())?,
            output: self.result.as_deref().map(|r| json("task_run.result", r)).transpose()?,
            error: self.error,
            started_at: opt_time("task_run.started_at", self.started_at)?,
            finished_at: opt_time("task_run.finished_at", self.finished_at)?,
            retry_at: opt_time("task_run.retry_at", self.retry_at)?,
            lease_owner: self.lease_owner,
            progress: self
                .progress
                .as_deref()
                .map(|p| json("task_run.progress", p))
                .transpose()?,
            created_at: time("task_run.created_at", self.created_at)?,
        })
    }
}

#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub(crate) struct EventRow {
    pub(crate) seq: i64,
    task: Option<String>,
    transition: String,
    from_state: Option<String>,
    to_state: Option<String>,
    attempt: Option<i64>,
    token: Option<i64>,
    worker: Option<String>,
    at: i64,
    error: Option<String>,
    generation: i64,
}

impl EventRow {
    pub(crate) fn into_view(self) -> Result<EventView, DecodeError> {
        Ok(EventView {
            seq: u64_of("event.seq", self.seq)?,
            task: self.task,
            transition: self.transition,
            from: self.from_state,
            to: self.to_state,
            attempt: self.attempt.map(|a| u32_of("task_run_event.attempt", a)).transpose()?,
            token: self.token,
            worker: self.worker,
            at: time("event.at", self.at)?,
            error: self.error,
            generation: u32_of("event.generation", self.generation)?,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct FlaggedRow {
    id: i64,
    task_key: String,
    state: String,
    cancel_reason: Option<String>,
    compensate_for: Option<String>,
}

impl FlaggedRow {
    pub(crate) fn into_task(self) -> Result<PassTask, DecodeError> {
        Ok(PassTask {
            id: TaskRunId(self.id),
            key: self.task_key,
            state: name("task_run.state", &self.state)?,
            cancel_reason: opt_name("task_run.cancel_reason", self.cancel_reason.as_deref())?,
            compensate_for: self.compensate_for,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct WorkerRow {
    id: String,
    host: String,
    pid: i64,
    task_types: String,
    concurrency: i64,
    started_at: i64,
    last_seen_at: i64,
    stopped_at: Option<i64>,
}

impl WorkerRow {
    pub(crate) fn into_info(self) -> Result<WorkerInfo, DecodeError> {
        let types = json("worker.task_types", &self.task_types)?;
        let task_types = serde_json::from_value(types).map_err(|e| DecodeError::Json {
            column: "worker.task_types",
            problem: e.to_string(),
        })?;
        Ok(WorkerInfo {
            id: WorkerId(self.id),
            host: self.host,
            pid: u32_of("worker.pid", self.pid)?,
            task_types,
            concurrency: u32_of("worker.concurrency", self.concurrency)?,
            started_at: time("worker.started_at", self.started_at)?,
            last_seen_at: time("worker.last_seen_at", self.last_seen_at)?,
            stopped_at: opt_time("worker.stopped_at", self.stopped_at)?,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TokenRow {
    name: String,
    hash: String,
    scopes: String,
    created_at: i64,
    expires_at: Option<i64>,
    revoked_at: Option<i64>,
    status: String,
}

impl TokenRow {
    pub(crate) fn into_view(self) -> Result<TokenView, DecodeError> {
        let scopes =
            serde_json::from_value(json("api_token.scopes", &self.scopes)?).map_err(|e| DecodeError::Json {
                column: "api_token.scopes",
                problem: e.to_string(),
            })?;
        let status = match self.status.as_str() {
            "active" => TokenStatus::Active,
            "expired" => TokenStatus::Expired,
            "revoked" => TokenStatus::Revoked,
            _ => {
                return Err(DecodeError::UnknownName {
                    column: "api_token status",
                    value: self.status,
                });
            }
        };
        Ok(TokenView {
            name: self.name,
            hash: self.hash,
            scopes,
            created_at: time("api_token.created_at", self.created_at)?,
            expires_at: opt_time("api_token.expires_at", self.expires_at)?,
            revoked_at: opt_time("api_token.revoked_at", self.revoked_at)?,
            status,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DefinitionRow {
    id: i64,
    name: String,
    version: i64,
    fingerprint: String,
    created_at: i64,
    tasks: i64,
}

impl DefinitionRow {
    pub(crate) fn into_summary(self) -> Result<DefinitionSummary, store::Error> {
        Ok(DefinitionSummary {
            id: WorkflowId(self.id),
            version: u32_of("workflow.version", self.version)?,
            tasks: u32_of("task count", self.tasks)?,
            created_at: time("workflow.created_at", self.created_at)?,
            name: self.name,
            fingerprint: self.fingerprint,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ScheduleRow {
    id: i64,
    name: String,
    workflow: String,
    version: Option<i64>,
    cron: String,
    timezone: String,
    input: String,
    overlap: String,
    catchup_window_ms: i64,
    paused: bool,
    cursor: i64,
    buffered_at: Option<i64>,
    created_at: i64,
    started: i64,
    skipped_overlap: i64,
    buffered: i64,
    missed: i64,
}

impl ScheduleRow {
    pub(crate) fn into_view(self) -> Result<ScheduleView, DecodeError> {
        let count = |column, value| u64_of(column, value);
        Ok(ScheduleView {
            id: self.id,
            spec: NewSchedule {
                name: self.name,
                workflow: self.workflow,
                version: self.version.map(|v| u32_of("schedule.version", v)).transpose()?,
                cron: self.cron,
                timezone: self.timezone,
                input: json("schedule.input", &self.input)?,
                overlap: name("schedule.overlap", &self.overlap)?,
                catchup_window: Duration::from_millis(u64_of("schedule.catchup_window_ms", self.catchup_window_ms)?),
            },
            paused: self.paused,
            cursor: time("schedule.cursor", self.cursor)?,
            buffered: opt_time("schedule.buffered_at", self.buffered_at)?,
            created_at: time("schedule.created_at", self.created_at)?,
            counts: FireCounts {
                started: count("schedule.started", self.started)?,
                skipped_overlap: count("schedule.skipped_overlap", self.skipped_overlap)?,
                buffered: count("schedule.buffered", self.buffered)?,
                missed: count("schedule.missed", self.missed)?,
            },
        })
    }
}
