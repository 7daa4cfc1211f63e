//! Rows as the queries return them, and their checked conversion into the
//! ports' types: a stored value outside its domain is `Corrupt`, named.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use flowforge_domain::{CancelReason, Priority, RunState, SkipReason, TaskRunState};
use flowforge_ports::store::{DefinitionSummary, FireCounts, NewSchedule, ScheduleView, TokenStatus, TokenView, Wait};
use flowforge_ports::{
    EventView, PassTask, RunId, RunSummary, TaskRunId, TaskRunView, WorkerId, WorkerInfo, WorkflowId, store,
};
use serde_json::Value;
use uuid::Uuid;

use crate::error::corrupt;

/// Parses a stored enum name (state, reason) or reports which column broke.
pub(crate) fn parse_name<T: FromStr>(value: &str, column: &str) -> Result<T, store::Error> {
    value
        .parse()
        .map_err(|_| corrupt(format!("{column} holds '{value}', which this binary does not know")))
}

/// Converts a stored count or number to `u64`.
pub(crate) fn to_u64(value: i64, column: &str) -> Result<u64, store::Error> {
    u64::try_from(value).map_err(|_| corrupt(format!("{column} holds {value}, which is negative")))
}

/// Converts a stored non-negative integer to `u32`.
pub(crate) fn to_u32(value: i32, column: &str) -> Result<u32, store::Error> {
    u32::try_from(value).map_err(|_| corrupt(format!("{column} holds {value}, which is negative")))
}

/// Converts a count or id bound for SQL.
pub(crate) fn to_i32(value: u32, what: &str) -> Result<i32, store::Error> {
    i32::try_from(value).map_err(|_| store::Error::Other(format!("{what} {value} does not fit the store")))
}

/// Checks a stored priority against the scale.
pub(crate) fn priority(value: i16, column: &str) -> Result<Priority, store::Error> {
    Priority::new(value.into()).map_err(|_| corrupt(format!("{column} holds {value}, which is off the 0-9 scale")))
}

fn reason(value: Option<String>) -> Result<Option<CancelReason>, store::Error> {
    value
        .map(|r| parse_name::<CancelReason>(&r, "task_run.cancel_reason"))
        .transpose()
}

/// A due wait (docs/design/concurrency.md#gates).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct WaitRow {
    pub(crate) task_key: Option<String>,
    pub(crate) scope: String,
    pub(crate) label: String,
    pub(crate) max: i32,
    pub(crate) strategy: String,
    pub(crate) tried: bool,
}

impl WaitRow {
    pub(crate) fn into_wait(self) -> Result<Wait, store::Error> {
        Ok(Wait {
            task: self.task_key,
            scope: self.scope,
            label: self.label,
            max: to_u32(self.max, "concurrency_wait.max")?,
            strategy: self
                .strategy
                .parse()
                .map_err(|e: String| store::Error::Corrupt(format!("concurrency_wait.strategy: {e}")))?,
            tried: self.tried,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SummaryRow {
    pub(crate) id: Uuid,
    pub(crate) workflow_id: i64,
    pub(crate) workflow: String,
    pub(crate) version: i32,
    pub(crate) state: String,
    pub(crate) cancel_requested: bool,
    pub(crate) cancel_reason: Option<String>,
    pub(crate) generation: i32,
    pub(crate) priority: i16,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) started_at: Option<DateTime<Utc>>,
    pub(crate) finished_at: Option<DateTime<Utc>>,
}

impl SummaryRow {
    pub(crate) fn into_summary(self) -> Result<RunSummary, store::Error> {
        Ok(RunSummary {
            id: RunId(self.id),
            workflow_id: WorkflowId(self.workflow_id),
            workflow: self.workflow,
            version: to_u32(self.version, "workflow.version")?,
            state: parse_name::<RunState>(&self.state, "workflow_run.state")?,
            cancel_requested: self.cancel_requested,
            cancel_reason: self.cancel_reason,
            generation: to_u32(self.generation, "workflow_run.generation")?,
            priority: priority(self.priority, "workflow_run.priority")?,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DetailRow {
    #[sqlx(flatten)]
    pub(crate) summary: SummaryRow,
    pub(crate) fingerprint: String,
    pub(crate) input: Value,
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TaskRunRow {
    pub(crate) id: i64,
    pub(crate) task_key: String,
    pub(crate) compensate_for: Option<String>,
    pub(crate) state: String,
    pub(crate) attempt: i32,
    pub(crate) generation: i32,
    pub(crate) fencing_token: i64,
    pub(crate) priority: i16,
    pub(crate) cancel_reason: Option<String>,
    pub(crate) skip_reason: Option<String>,
    pub(crate) result: Option<Value>,
    pub(crate) error: Option<String>,
    pub(crate) started_at: Option<DateTime<Utc>>,
    pub(crate) finished_at: Option<DateTime<Utc>>,
    pub(crate) retry_at: Option<DateTime<Utc>>,
    pub(crate) lease_owner: Option<String>,
    pub(crate) progress: Option<Value>,
    pub(crate) created_at: DateTime<Utc>,
}

impl TaskRunRow {
    pub(crate) fn into_view(self) -> Result<TaskRunView, store::Error> {
        Ok(TaskRunView {
            id: TaskRunId(self.id),
            key: self.task_key,
            compensate_for: self.compensate_for,
            state: parse_name::<TaskRunState>(&self.state, "task_run.state")?,
            attempt: to_u32(self.attempt, "task_run.attempt")?,
            generation: to_u32(self.generation, "task_run.generation")?,
            token: self.fencing_token,
            priority: priority(self.priority, "task_run.priority")?,
            blocked_by: None,
            cancel_reason: reason(self.cancel_reason)?,
            skip_reason: self
                .skip_reason
                .map(|r| parse_name::<SkipReason>(&r, "task_run.skip_reason"))
                .transpose()?,
            output: self.result,
            error: self.error,
            started_at: self.started_at,
            finished_at: self.finished_at,
            retry_at: self.retry_at,
            lease_owner: self.lease_owner,
            progress: self.progress,
            created_at: self.created_at,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EventRow {
    pub(crate) seq: i64,
    pub(crate) task: Option<String>,
    pub(crate) transition: String,
    pub(crate) from_state: Option<String>,
    pub(crate) to_state: Option<String>,
    pub(crate) attempt: Option<i32>,
    pub(crate) token: Option<i64>,
    pub(crate) worker: Option<String>,
    pub(crate) at: DateTime<Utc>,
    pub(crate) error: Option<String>,
    pub(crate) generation: i32,
}

impl EventRow {
    pub(crate) fn into_view(self) -> Result<EventView, store::Error> {
        Ok(EventView {
            seq: to_u64(self.seq, "event.seq")?,
            task: self.task,
            transition: self.transition,
            from: self.from_state,
            to: self.to_state,
            attempt: self.attempt.map(|a| to_u32(a, "task_run_event.attempt")).transpose()?,
            token: self.token,
            worker: self.worker,
            at: self.at,
            error: self.error,
            generation: to_u32(self.generation, "event.generation")?,
        })
    }
}

/// A task run as a pass sees it (take_flagged).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct FlaggedRow {
    pub(crate) id: i64,
    pub(crate) task_key: String,
    pub(crate) state: String,
    pub(crate) cancel_reason: Option<String>,
    pub(crate) compensate_for: Option<String>,
}

impl FlaggedRow {
    pub(crate) fn into_pass_task(self) -> Result<PassTask, store::Error> {
        Ok(PassTask {
            id: TaskRunId(self.id),
            key: self.task_key,
            state: parse_name::<TaskRunState>(&self.state, "task_run.state")?,
            cancel_reason: reason(self.cancel_reason)?,
            compensate_for: self.compensate_for,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct WorkerRow {
    pub(crate) id: String,
    pub(crate) host: String,
    pub(crate) pid: i32,
    pub(crate) task_types: Value,
    pub(crate) concurrency: i32,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) last_seen_at: DateTime<Utc>,
    pub(crate) stopped_at: Option<DateTime<Utc>>,
}

impl WorkerRow {
    pub(crate) fn into_info(self) -> Result<WorkerInfo, store::Error> {
        let task_types: Vec<String> = serde_json::from_value(self.task_types)
            .map_err(|e| corrupt(format!("worker {}: task_types is not a list of names: {e}", self.id)))?;
        Ok(WorkerInfo {
            pid: u32::try_from(self.pid)
                .map_err(|_| corrupt(format!("worker {}: pid {} is negative", self.id, self.pid)))?,
            concurrency: to_u32(self.concurrency, "worker.concurrency")?,
            id: WorkerId(self.id),
            host: self.host,
            task_types,
            started_at: self.started_at,
            last_seen_at: self.last_seen_at,
            stopped_at: self.stopped_at,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DefinitionRow {
    pub(crate) id: i64,
    pub(crate) name: String,
    pub(crate) version: i32,
    pub(crate) fingerprint: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) tasks: i64,
}

impl DefinitionRow {
    pub(crate) fn into_summary(self) -> Result<DefinitionSummary, store::Error> {
        Ok(DefinitionSummary {
            id: WorkflowId(self.id),
            version: to_u32(self.version, "workflow.version")?,
            tasks: u32::try_from(self.tasks)
                .map_err(|_| corrupt(format!("workflow {} counts {} tasks", self.id, self.tasks)))?,
            name: self.name,
            fingerprint: self.fingerprint,
            created_at: self.created_at,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TokenRow {
    pub(crate) name: String,
    pub(crate) hash: String,
    pub(crate) scopes: Vec<String>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    pub(crate) revoked_at: Option<DateTime<Utc>>,
    pub(crate) status: String,
}

impl TokenRow {
    pub(crate) fn into_view(self) -> Result<TokenView, store::Error> {
        let status = match self.status.as_str() {
            "active" => TokenStatus::Active,
            "expired" => TokenStatus::Expired,
            "revoked" => TokenStatus::Revoked,
            other => return Err(corrupt(format!("token '{}' has status '{other}'", self.name))),
        };
        Ok(TokenView {
            name: self.name,
            hash: self.hash,
            scopes: self.scopes,
            created_at: self.created_at,
            expires_at: self.expires_at,
            revoked_at: self.revoked_at,
            status,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ScheduleRow {
    pub(crate) id: i64,
    pub(crate) name: String,
    pub(crate) workflow: String,
    pub(crate) version: Option<i32>,
    pub(crate) cron: String,
    pub(crate) timezone: String,
    pub(crate) input: Value,
    pub(crate) overlap: String,
    pub(crate) catchup_window_ms: i64,
    pub(crate) paused: bool,
    pub(crate) cursor: DateTime<Utc>,
    pub(crate) buffered_at: Option<DateTime<Utc>>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) started: i64,
    pub(crate) skipped_overlap: i64,
    pub(crate) buffered: i64,
    pub(crate) missed: i64,
}

impl ScheduleRow {
    pub(crate) fn into_view(self) -> Result<ScheduleView, store::Error> {
        let count = to_u64;
        let window = count(self.catchup_window_ms, "schedule.catchup_window_ms")?;
        Ok(ScheduleView {
            id: self.id,
            spec: NewSchedule {
                name: self.name,
                workflow: self.workflow,
                version: self.version.map(|v| to_u32(v, "schedule.version")).transpose()?,
                cron: self.cron,
                timezone: self.timezone,
                input: self.input,
                overlap: parse_name(&self.overlap, "schedule.overlap")?,
                catchup_window: std::time::Duration::from_millis(window),
            },
            paused: self.paused,
            cursor: self.cursor,
            buffered: self.buffered_at,
            created_at: self.created_at,
            counts: FireCounts {
                started: count(self.started, "schedule.started")?,
                skipped_overlap: count(self.skipped_overlap, "schedule.skipped_overlap")?,
                buffered: count(self.buffered, "schedule.buffered")?,
                missed: count(self.missed, "schedule.missed")?,
            },
        })
    }
}
