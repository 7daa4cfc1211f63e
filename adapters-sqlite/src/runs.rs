//! Runs and task runs: the transition protocol
//! (docs/design/state-machines.md#transition-protocol) over SQLite.
//!
//! Every transition is one conditional UPDATE (`WHERE id = ? AND state = ?`
//! and, for lease-spending edges, `AND fencing_token = ?`) with `RETURNING`,
//! and its event row is written by the next statement of the same call only
//! when the UPDATE matched (`changes() = 1`): SQLite has no data-modifying
//! CTEs, so the pair is two statements under one write lock, sent as one
//! call from `BEGIN IMMEDIATE` to `COMMIT`.

use std::time::Duration;

use flowforge_domain::{RunState, TaskRunState, TaskTransition, initial_task_run_state};
use flowforge_ports::store::resolve_generic_transition;
use flowforge_ports::{
    CancelOutcome, Claim, EventView, FinishResult, LeaseStatus, Reaped, RunDetail, RunId, RunStore, RunSummary, Scope,
    StoreError, TaskInputs, TaskOutcome, TaskRunId, TaskRunView, Topic, TransitionError, WorkerId, WorkflowId,
};
use serde_json::{Map, Value};
use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow, Row};

use crate::convert::{duration_ms, json, name, opt_name, opt_time, run_id, run_key, time, u32_of};
use crate::error::{DecodeError, store_error};
use crate::notify::SqliteNotifier;
use crate::pass::SqlitePass;
use crate::store::{SqliteStore, lock, padded, sql, tagged};

/// The scope filter bound into queries: a JSON array of run keys, NULL for
/// every run.
pub(crate) fn scope_key(scope: &Scope) -> Option<String> {
    scope
        .run_ids()
        .map(|runs| Value::from(runs.into_iter().map(run_key).collect::<Vec<_>>()).to_string())
}

/// Decodes a row by column names, a decoding failure being corrupt data.
pub(crate) fn decode<'r, T: FromRow<'r, SqliteRow>>(row: &'r SqliteRow) -> Result<T, StoreError> {
    T::from_row(row).map_err(store_error)
}

/// One column of a row by position.
pub(crate) fn col<'r, T>(row: &'r SqliteRow, index: usize) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(index).map_err(store_error)
}

#[derive(Debug, sqlx::FromRow)]
struct SummaryRow {
    id: String,
    workflow_id: i64,
    name: String,
    version: i64,
    state: String,
    cancel_requested: bool,
    created_at: i64,
    started_at: Option<i64>,
    finished_at: Option<i64>,
}

macro_rules! summary_columns {
    () => {
        "r.id, r.workflow_id, w.name, w.version, r.state, r.cancel_requested_at IS NOT NULL AS cancel_requested, \
         r.created_at, r.started_at, r.finished_at"
    };
}

impl SummaryRow {
    fn into_summary(self) -> Result<RunSummary, DecodeError> {
        Ok(RunSummary {
            id: run_id(&self.id)?,
            workflow_id: WorkflowId(self.workflow_id),
            workflow: self.name,
            version: u32_of("workflow.version", self.version)?,
            state: name("workflow_run.state", &self.state)?,
            cancel_requested: self.cancel_requested,
            created_at: time("workflow_run.created_at", self.created_at)?,
            started_at: opt_time("workflow_run.started_at", self.started_at)?,
            finished_at: opt_time("workflow_run.finished_at", self.finished_at)?,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
struct TaskRunRow {
    id: i64,
    task_key: String,
    compensate_for: Option<String>,
    state: String,
    attempt: i64,
    fencing_token: i64,
    cancel_reason: Option<String>,
    result: Option<String>,
    error: Option<String>,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    retry_at: Option<i64>,
    lease_owner: Option<String>,
    created_at: i64,
}

impl TaskRunRow {
    fn into_view(self) -> Result<TaskRunView, DecodeError> {
        Ok(TaskRunView {
            id: TaskRunId(self.id),
            key: self.task_key,
            compensate_for: self.compensate_for,
            state: name("task_run.state", &self.state)?,
            attempt: u32_of("task_run.attempt", self.attempt)?,
            token: self.fencing_token,
            cancel_reason: opt_name("task_run.cancel_reason", self.cancel_reason.as_deref())?,
            output: self.result.as_deref().map(|r| json("task_run.result", r)).transpose()?,
            error: self.error,
            started_at: opt_time("task_run.started_at", self.started_at)?,
            finished_at: opt_time("task_run.finished_at", self.finished_at)?,
            retry_at: opt_time("task_run.retry_at", self.retry_at)?,
            lease_owner: self.lease_owner,
            created_at: time("task_run.created_at", self.created_at)?,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
struct EventRow {
    task: Option<String>,
    transition: String,
    from_state: Option<String>,
    to_state: Option<String>,
    attempt: Option<i64>,
    token: Option<i64>,
    worker: Option<String>,
    at: i64,
    error: Option<String>,
}

#[derive(Debug, sqlx::FromRow)]
struct ClaimRow {
    run_id: String,
    task_key: String,
    compensate_for: Option<String>,
    attempt: i64,
    fencing_token: i64,
    lease_expires_at: i64,
    needs_pass: bool,
    workflow_id: i64,
}

#[derive(Debug, sqlx::FromRow)]
struct ExpiredRow {
    id: i64,
    run_id: String,
    task_key: String,
    attempt: i64,
    fencing_token: i64,
    lease_expires_at: i64,
}

/// claim_task_run: ready → running at the dispatch's token (primary key).
/// `?2` id, `?3` token, `?4` worker, `?5` lease in ms.
macro_rules! claim_update {
    () => {
        concat!(
            "UPDATE task_run SET state = 'running', fencing_token = fencing_token + 1, lease_owner = ?4, \
             lease_expires_at = ",
            now!(),
            " + ?5, started_at = COALESCE(started_at, ",
            now!(),
            "), needs_pass = CASE WHEN needs_pass = 1 OR (started_at IS NULL AND \
             (SELECT r.state FROM workflow_run r WHERE r.id = task_run.run_id) = 'pending') THEN 1 ELSE 0 END \
             WHERE id = ?2 AND state = 'ready' AND fencing_token = ?3 \
             AND (compensate_for IS NOT NULL \
                  OR (SELECT r.cancel_requested_at FROM workflow_run r WHERE r.id = task_run.run_id) IS NULL) \
             RETURNING run_id, task_key, compensate_for, attempt, fencing_token, lease_expires_at, needs_pass, \
             (SELECT r.workflow_id FROM workflow_run r WHERE r.id = task_run.run_id) AS workflow_id"
        )
    };
}

/// The claim's UPDATE alone (its plan is checked in `plans.rs`).
#[cfg(test)]
pub(crate) const CLAIM: &str = claim_update!();

/// claim_task_run in one call: the UPDATE, then its event when it matched.
pub(crate) const CLAIM_CALL: &str = concat!(
    "BEGIN IMMEDIATE; ",
    claim_update!(),
    "; ",
    event_if_changed!("claim", "ready", "running", "?4", "NULL"),
    "; COMMIT"
);

/// finish_task_run, `succeed`: `?2` id, `?3` token, `?4` worker, `?5` output.
pub(crate) const FINISH_SUCCEEDED: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, finished_at = ",
    now!(),
    ", result = ?5, needs_pass = 1 WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 \
     RETURNING run_id, task_key; ",
    event_if_changed!("succeed", "running", "succeeded", "?4", "NULL"),
    "; ",
    stale_audit!("succeed"),
    "; COMMIT"
);

/// finish_task_run, `fail` for good: `?5` the error.
pub(crate) const FINISH_FAILED: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'failed', lease_owner = NULL, lease_expires_at = NULL, finished_at = ",
    now!(),
    ", error = ?5, needs_pass = 1 WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 RETURNING id; ",
    event_if_changed!("fail", "running", "failed", "?4", "?5"),
    "; ",
    stale_audit!("fail"),
    "; COMMIT"
);

/// finish_task_run, `fail` then `schedule_retry` in one UPDATE (decision
/// 1): the row never rests in failed, so a resting failed row means failed
/// for good. The scheduler need not look: the retry's due time brings it
/// back. Both events, in order: `fail` at the attempt that failed, then
/// `schedule_retry` at the next one; the audit then sees `changes() = 2`.
/// `?5` the error, `?6` the delay in ms.
pub(crate) const FINISH_RETRY: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'retrying', attempt = attempt + 1, retry_at = ",
    now!(),
    " + ?6, lease_owner = NULL, lease_expires_at = NULL, finished_at = NULL, error = ?5 \
     WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 RETURNING id; ",
    event_insert!(),
    "SELECT ",
    next_event_id!(),
    " + e.seq, id, run_id, task_key, e.transition, e.from_state, e.to_state, attempt - e.back, fencing_token, \
     e.worker, ",
    now!(),
    ", e.error FROM task_run, (\
     SELECT 1 AS seq, 'fail' AS transition, 'running' AS from_state, 'failed' AS to_state, 1 AS back, \
     ?4 AS worker, ?5 AS error \
     UNION ALL SELECT 2, 'schedule_retry', 'failed', 'retrying', 0, NULL, NULL) AS e \
     WHERE task_run.id = ?2 AND changes() = 1 ORDER BY e.seq; ",
    stale_audit!("fail"),
    "; COMMIT"
);

/// finish_task_run, `cancel_running` (reason `user`).
pub(crate) const FINISH_CANCELLED: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'cancelled', cancel_reason = 'user', lease_owner = NULL, \
     lease_expires_at = NULL, finished_at = ",
    now!(),
    ", needs_pass = 1 WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 RETURNING id; ",
    event_if_changed!("cancel_running", "running", "cancelled", "?4", "NULL"),
    "; ",
    stale_audit!("cancel_running"),
    "; COMMIT"
);

/// renew_lease: `?2` id, `?3` token, `?4` lease in ms.
pub(crate) const RENEW: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE task_run SET lease_expires_at = ",
    now!(),
    " + ?4 WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 \
     RETURNING compensate_for IS NULL \
       AND (SELECT r.cancel_requested_at IS NOT NULL FROM workflow_run r WHERE r.id = task_run.run_id); \
     COMMIT"
);

/// request_cancel: the run as it was, then the request when it applies
/// (the UPDATE restates exactly the conditions the caller reads). `?2` run.
pub(crate) const REQUEST_CANCEL: &str = concat!(
    "BEGIN IMMEDIATE; \
     SELECT state, cancel_requested_at IS NOT NULL FROM workflow_run WHERE id = ?2; \
     UPDATE workflow_run SET cancel_requested_at = ",
    now!(),
    ", needs_pass = 1 WHERE id = ?2 AND cancel_requested_at IS NULL AND state IN ('pending', 'running'); \
     COMMIT"
);

/// The event of a generic transition: `?3` from, `?4` transition, `?5` to.
macro_rules! generic_event {
    () => {
        concat!(
            event_insert!(),
            "SELECT ",
            next_event_id!(),
            " + 1, id, run_id, task_key, ?4, ?3, ?5, attempt, fencing_token, NULL, ",
            now!(),
            ", NULL FROM task_run WHERE id = ?2 AND changes() = 1"
        )
    };
}

/// The outbox row of task run `?2` after the event insert before it wrote
/// one row (docs/design/outbox-and-queues.md#one-outbox-row-per-readiness).
macro_rules! dispatch_if_changed {
    () => {
        concat!(
            "INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at) \
             SELECT tr.id, tr.run_id, tr.task_key, ",
            task_type_of!("tr"),
            ", tr.fencing_token, ",
            now!(),
            " FROM task_run tr WHERE tr.id = ?2 AND changes() = 1"
        )
    };
}

/// transition_task_run, `dependencies_satisfied`.
pub(crate) const GENERIC_SATISFIED: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'ready', pending_deps = 0 WHERE id = ?2 AND state = 'pending' RETURNING id; ",
    generic_event!(),
    "; ",
    dispatch_if_changed!(),
    "; COMMIT"
);

/// transition_task_run, `retry_ready`.
pub(crate) const GENERIC_RETRY_READY: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'ready', retry_at = NULL WHERE id = ?2 AND state = 'retrying' RETURNING id; ",
    generic_event!(),
    "; ",
    dispatch_if_changed!(),
    "; COMMIT"
);

/// transition_task_run, the user's cancels of a waiting row.
pub(crate) const GENERIC_CANCEL: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'cancelled', cancel_reason = 'user', retry_at = NULL, finished_at = ",
    now!(),
    ", needs_pass = 1 WHERE id = ?2 AND state = ?3 RETURNING id; ",
    generic_event!(),
    "; COMMIT"
);

/// start_run: the forward tasks of a definition (immutable once
/// published, so read outside the write).
const START_TASKS: &str = "SELECT key, json_array_length(depends_on) FROM task \
     WHERE workflow_id = ?1 AND compensate_for IS NULL ORDER BY position";

/// start_run in one call: `?2` run, `?3` workflow, `?4` input, `?5` the
/// task rows; returns one row per dispatch written.
pub(crate) const START_CALL: &str = concat!(
    "BEGIN IMMEDIATE; \
     INSERT INTO workflow_run (id, workflow_id, state, input, created_at) VALUES (?2, ?3, 'pending', ?4, ",
    now!(),
    "); \
     INSERT INTO task_run (run_id, task_key, state, pending_deps, created_at) \
     SELECT ?2, j.value ->> 'k', j.value ->> 's', j.value ->> 'd', ",
    now!(),
    " FROM json_each(?5) AS j ORDER BY j.key; \
     INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at) \
     SELECT tr.id, tr.run_id, tr.task_key, t.task_type, tr.fencing_token, ",
    now!(),
    " FROM task_run tr JOIN task t ON t.workflow_id = ?3 AND t.key = tr.task_key \
     WHERE tr.run_id = ?2 AND tr.state IN ('pending', 'ready', 'running', 'retrying') AND tr.state = 'ready' \
     ORDER BY tr.id RETURNING task_run_id; \
     COMMIT"
);

/// reap_expired_leases: the expired leases (`taskrun_lease_expiry_idx`),
/// read outside the write; the write re-checks each row.
pub(crate) const EXPIRED_LEASES: &str = concat!(
    "SELECT tr.id, tr.run_id, tr.task_key, tr.attempt, tr.fencing_token, tr.lease_expires_at \
             FROM task_run tr \
             JOIN workflow_run r ON r.id = tr.run_id \
             JOIN task t ON t.workflow_id = r.workflow_id AND t.key = tr.task_key \
             WHERE tr.state = 'running' AND tr.lease_expires_at < ",
    now!(),
    " AND (?2 IS NULL OR tr.run_id IN (SELECT value FROM json_each(?2))) ORDER BY tr.lease_expires_at, tr.id LIMIT ?3"
);

/// The rows of the reap batch `?2` (`[{i: id, t: token, x: expiry}]`)
/// still running at the token and expiry the read saw: not finished,
/// renewed or reaped since. Time-free, so every statement of the call sees
/// the same rows.
macro_rules! reapable {
    ($row:literal) => {
        concat!(
            $row,
            ".id IN (SELECT j.value ->> 'i' FROM json_each(?2) AS j) AND ",
            $row,
            ".state = 'running' AND EXISTS (SELECT 1 FROM json_each(?2) AS j WHERE j.value ->> 'i' = ",
            $row,
            ".id AND j.value ->> 't' = ",
            $row,
            ".fencing_token AND j.value ->> 'x' = ",
            $row,
            ".lease_expires_at)"
        )
    };
}

/// What the reaper does to a row, decided on the data under the write lock
/// (docs/design/leases-and-fencing.md#the-reaper): `c` reap then cancel (a
/// forward task of a cancel-requested run), `r` reap and re-dispatch (attempts
/// left), `f` fail for good.
macro_rules! reap_kind {
    ($row:literal) => {
        concat!(
            "(CASE WHEN ",
            $row,
            ".compensate_for IS NULL AND (SELECT r.cancel_requested_at FROM workflow_run r WHERE r.id = ",
            $row,
            ".run_id) IS NOT NULL THEN 'c' WHEN ",
            $row,
            ".attempt < (SELECT t.max_attempts FROM task t WHERE t.workflow_id = (SELECT r.workflow_id \
             FROM workflow_run r WHERE r.id = ",
            $row,
            ".run_id) AND t.key = ",
            $row,
            ".task_key) THEN 'r' ELSE 'f' END)"
        )
    };
}

/// reap_expired_leases in one call. The events and dispatches are written
/// before the UPDATE, from the same rows, with the token and attempt the
/// UPDATE gives them, in the order the rows were read. `?3` the final
/// attempt's error.
pub(crate) const REAP_CALL: &str = concat!(
    "BEGIN IMMEDIATE; ",
    event_insert!(),
    "SELECT ",
    next_event_id!(),
    " + ROW_NUMBER() OVER (ORDER BY m.pos, e.seq), m.id, m.run_id, m.task_key, e.transition, e.from_state, \
     e.to_state, m.attempt + e.bump, m.fencing_token + 1, CASE WHEN e.seq = 1 THEN m.lease_owner END, ",
    now!(),
    ", e.error FROM (SELECT tr.id, tr.run_id, tr.task_key, tr.attempt, tr.fencing_token, tr.lease_owner, ",
    reap_kind!("tr"),
    " AS k, (SELECT j.key FROM json_each(?2) AS j WHERE j.value ->> 'i' = tr.id) AS pos \
     FROM task_run tr WHERE ",
    reapable!("tr"),
    ") AS m JOIN (\
     SELECT 'c' AS k, 1 AS seq, 'reap_lease' AS transition, 'running' AS from_state, 'ready' AS to_state, \
     1 AS bump, 'lease expired' AS error \
     UNION ALL SELECT 'c', 2, 'cancel_ready', 'ready', 'cancelled', 1, NULL \
     UNION ALL SELECT 'r', 1, 'reap_lease', 'running', 'ready', 1, 'lease expired' \
     UNION ALL SELECT 'f', 1, 'reap_lease_final', 'running', 'failed', 0, ?3) AS e ON e.k = m.k \
     ORDER BY m.pos, e.seq; \
     INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at) \
     SELECT m.id, m.run_id, m.task_key, m.task_type, m.fencing_token + 1, ",
    now!(),
    " FROM (SELECT tr.id, tr.run_id, tr.task_key, tr.fencing_token, ",
    task_type_of!("tr"),
    " AS task_type, ",
    reap_kind!("tr"),
    " AS k, (SELECT j.key FROM json_each(?2) AS j WHERE j.value ->> 'i' = tr.id) AS pos \
     FROM task_run tr WHERE ",
    reapable!("tr"),
    ") AS m WHERE m.k = 'r' ORDER BY m.pos; \
     UPDATE task_run SET state = CASE ",
    reap_kind!("task_run"),
    " WHEN 'c' THEN 'cancelled' WHEN 'r' THEN 'ready' ELSE 'failed' END, \
     fencing_token = fencing_token + 1, \
     attempt = attempt + (",
    reap_kind!("task_run"),
    " <> 'f'), lease_owner = NULL, lease_expires_at = NULL, \
     cancel_reason = CASE ",
    reap_kind!("task_run"),
    " WHEN 'c' THEN 'user' ELSE cancel_reason END, \
     finished_at = CASE WHEN ",
    reap_kind!("task_run"),
    " IN ('c', 'f') THEN ",
    now!(),
    " ELSE finished_at END, \
     error = CASE ",
    reap_kind!("task_run"),
    " WHEN 'f' THEN ?3 ELSE error END, \
     needs_pass = CASE WHEN ",
    reap_kind!("task_run"),
    " IN ('c', 'f') THEN 1 ELSE needs_pass END \
     WHERE ",
    reapable!("task_run"),
    " RETURNING id, state; COMMIT"
);

/// runs_with_work: flagged rows, due retries, cancel requests (their
/// partial indexes), among the runs not yet terminal, each looked up by
/// primary key. CROSS JOIN fixes that order: left to itself, SQLite walks
/// every run ever started in `created_at` order to skip the final sort,
/// which costs history, not work.
pub(crate) const RUNS_WITH_WORK: &str = concat!(
    "SELECT w.run_id FROM (\
             SELECT run_id FROM task_run WHERE needs_pass AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2))) \
             UNION SELECT run_id FROM task_run WHERE state = 'retrying' AND retry_at <= ",
    now!(),
    " AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2))) \
             UNION SELECT id FROM workflow_run WHERE needs_pass AND (?2 IS NULL OR id IN (SELECT value FROM json_each(?2)))\
             ) AS w CROSS JOIN workflow_run r ON r.id = w.run_id \
             WHERE r.state IN ('pending', 'running') ORDER BY r.created_at, r.id LIMIT ?3"
);

/// next_deadline: the earliest retry or lease end (the retry and lease indexes).
pub(crate) const NEXT_DEADLINE: &str = concat!(
    "SELECT MIN(d) - ",
    now!(),
    " FROM (\
             SELECT MIN(retry_at) AS d FROM task_run WHERE state = 'retrying' AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2))) \
             UNION ALL \
             SELECT MIN(lease_expires_at) FROM task_run WHERE state = 'running' AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2))))"
);

/// task_inputs: the run input and the dependencies' outputs in ONE
/// statement, so both come from one snapshot without a transaction.
pub(crate) const TASK_INPUTS: &str = "SELECT 0 AS tag, input AS v, NULL AS k, 0 AS o FROM workflow_run WHERE id = ?1 \
     UNION ALL \
     SELECT 1, result, task_key, id FROM task_run WHERE run_id = ?1 AND state = 'succeeded' \
     AND result IS NOT NULL AND task_key IN (SELECT value FROM json_each(?2)) ORDER BY 1, 4";

/// get_run: run, task runs and history from one read transaction, in one call.
pub(crate) const GET_RUN: &str = concat!(
    "BEGIN; SELECT 0 AS tag, ",
    summary_columns!(),
    ", w.fingerprint, r.input FROM workflow_run r JOIN workflow w ON w.id = r.workflow_id WHERE r.id = ?1; \
     SELECT 1 AS tag, id, task_key, compensate_for, state, attempt, fencing_token, cancel_reason, result, error, \
     started_at, finished_at, retry_at, lease_owner, created_at FROM task_run WHERE run_id = ?1 ORDER BY id; \
     SELECT 2 AS tag, task, transition, from_state, to_state, attempt, token, worker, at, error FROM (\
     SELECT task_key AS task, transition, from_state, to_state, attempt, fencing_token AS token, worker, \
     at, error, id FROM task_run_event WHERE run_id = ?1 \
     UNION ALL \
     SELECT NULL, transition, from_state, to_state, NULL, NULL, NULL, at, NULL, id \
     FROM workflow_run_event WHERE run_id = ?1\
     ) ORDER BY id; COMMIT"
);

/// list_runs: newest first.
const LIST_RUNS: &str = concat!(
    "SELECT ",
    summary_columns!(),
    " FROM workflow_run r JOIN workflow w ON w.id = r.workflow_id ORDER BY r.created_at DESC, r.id DESC LIMIT ?1"
);

impl RunStore for SqliteStore {
    type Pass = SqlitePass;
    type Notifier = SqliteNotifier;

    async fn start_run(&self, workflow: WorkflowId, input: Value) -> Result<RunId, StoreError> {
        let run = RunId(uuid::Uuid::now_v7());
        let key = run_key(run);
        let input =
            serde_json::to_string(&input).map_err(|e| StoreError::Other(format!("cannot encode input: {e}")))?;
        let tasks = {
            let mut reader = self.inner.read().await?;
            let rows = reader.call(sql(START_TASKS).bind(workflow.0)).await?;
            if rows.is_empty() {
                let exists = reader
                    .call(sql("SELECT id FROM workflow WHERE id = ?1").bind(workflow.0))
                    .await?;
                return Err(if exists.is_empty() {
                    StoreError::Other(format!("no workflow definition with id {workflow}"))
                } else {
                    StoreError::Corrupt(format!("workflow {workflow} has no forward task rows"))
                });
            }
            rows
        };
        let mut rows = Vec::with_capacity(tasks.len());
        for row in &tasks {
            let task: String = col(row, 0)?;
            let deps: i64 = col(row, 1)?;
            let count = usize::try_from(deps).map_err(|_| {
                StoreError::Corrupt(format!("task '{task}' of workflow {workflow} has {deps} dependencies"))
            })?;
            rows.push(serde_json::json!({
                "k": task,
                "s": initial_task_run_state(count).as_str(),
                "d": deps,
            }));
        }
        let rows = serde_json::to_string(&rows).map_err(|e| StoreError::Other(e.to_string()))?;
        let offset = self.inner.offset();
        let dispatched = self
            .inner
            .write()
            .await?
            .call(padded(
                sql(START_CALL)
                    .bind(offset)
                    .bind(&key)
                    .bind(workflow.0)
                    .bind(input.clone())
                    .bind(rows),
            ))
            .await?;
        lock(&self.inner.inputs).input(run, &input);
        if !dispatched.is_empty() {
            self.inner.wakeups.wake(Topic::Publisher);
        }
        Ok(run)
    }

    async fn request_cancel(&self, run: RunId) -> Result<Option<CancelOutcome>, StoreError> {
        let key = run_key(run);
        let offset = self.inner.offset();
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(sql(REQUEST_CANCEL).bind(offset).bind(&key)))
            .await?;
        // The UPDATE applied exactly when the run read here was pending or
        // running without a request.
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state: String = col(row, 0)?;
        let requested: bool = col(row, 1)?;
        let state: RunState = name("workflow_run.state", &state)?;
        if matches!(state, RunState::Succeeded | RunState::Failed | RunState::Cancelled) {
            return Ok(Some(CancelOutcome::AlreadyFinished(state)));
        }
        if requested {
            return Ok(Some(CancelOutcome::AlreadyRequested));
        }
        self.inner.wakeups.wake(Topic::Scheduler);
        Ok(Some(CancelOutcome::Requested))
    }

    async fn claim_task_run(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        lease: Duration,
    ) -> Result<Option<Claim>, StoreError> {
        let offset = self.inner.offset();
        // `started_at IS NULL` in SET reads the old row: the first start of
        // a task while its run is still pending flags the run's pass, which
        // moves the run to running.
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(
                sql(CLAIM_CALL)
                    .bind(offset)
                    .bind(id.0)
                    .bind(token)
                    .bind(&worker.0)
                    .bind(duration_ms(lease)),
            ))
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let row: ClaimRow = decode(row)?;
        if row.needs_pass {
            self.inner.wakeups.wake(Topic::Scheduler);
        }
        Ok(Some(Claim {
            task_run_id: id,
            run_id: run_id(&row.run_id)?,
            workflow_id: WorkflowId(row.workflow_id),
            task_key: row.task_key,
            compensate_for: row.compensate_for,
            attempt: u32_of("task_run.attempt", row.attempt)?,
            token: row.fencing_token,
            lease_expires_at: time("task_run.lease_expires_at", row.lease_expires_at)?,
        }))
    }

    async fn task_inputs(&self, run: RunId, keys: &[String]) -> Result<TaskInputs, StoreError> {
        let cached = lock(&self.inner.inputs).get(run, keys);
        if let Some((input, outputs)) = cached {
            let mut map = Map::new();
            for (task, output) in outputs {
                map.insert(task, json("task_run.result", &output)?);
            }
            return Ok(TaskInputs {
                run_input: json("workflow_run.input", &input)?,
                outputs: map,
            });
        }
        let key = run_key(run);
        let wanted = serde_json::to_string(keys).map_err(|e| StoreError::Other(e.to_string()))?;
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(TASK_INPUTS).bind(&key).bind(&wanted))
            .await?;
        let mut input = None;
        let mut map = Map::new();
        let mut cache = lock(&self.inner.inputs);
        for row in &rows {
            let value: String = col(row, 1)?;
            if col::<i64>(row, 0)? == 0 {
                input = Some(json("workflow_run.input", &value)?);
                cache.input(run, &value);
            } else {
                let task: String = col(row, 2)?;
                cache.output(run, &task, col(row, 3)?, &value);
                map.insert(task, json("task_run.result", &value)?);
            }
        }
        drop(cache);
        let Some(run_input) = input else {
            return Err(StoreError::Other(format!("no run with id {run}")));
        };
        Ok(TaskInputs {
            run_input,
            outputs: map,
        })
    }

    async fn renew_lease(&self, id: TaskRunId, token: i64, lease: Duration) -> Result<LeaseStatus, StoreError> {
        let offset = self.inner.offset();
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(
                sql(RENEW).bind(offset).bind(id.0).bind(token).bind(duration_ms(lease)),
            ))
            .await?;
        Ok(match rows.first() {
            Some(row) => LeaseStatus::Held {
                cancel_requested: col(row, 0)?,
            },
            None => LeaseStatus::Lost,
        })
    }

    async fn finish_task_run(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        outcome: TaskOutcome,
    ) -> Result<FinishResult, StoreError> {
        let offset = self.inner.offset();
        let base = |text: &'static str| sql(text).bind(offset).bind(id.0).bind(token).bind(worker.0.clone());
        let mut stored = None;
        let (query, rests_in) = match outcome {
            TaskOutcome::Succeeded { output } => {
                let output = serde_json::to_string(&output)
                    .map_err(|e| StoreError::Other(format!("cannot encode output: {e}")))?;
                stored = Some(output.clone());
                (base(FINISH_SUCCEEDED).bind(output), TaskRunState::Succeeded)
            }
            TaskOutcome::Failed { error, retry_in: None } => (base(FINISH_FAILED).bind(error), TaskRunState::Failed),
            TaskOutcome::Failed {
                error,
                retry_in: Some(delay),
            } => (
                base(FINISH_RETRY).bind(error).bind(duration_ms(delay)),
                TaskRunState::Retrying,
            ),
            TaskOutcome::Cancelled => (base(FINISH_CANCELLED), TaskRunState::Cancelled),
        };
        let rows = self.inner.write().await?.call(padded(query)).await?;
        if let (Some(output), Some(row)) = (stored, rows.first()) {
            // Succeeded is terminal: this is the output every later read finds.
            let run = run_id(&col::<String>(row, 0)?)?;
            lock(&self.inner.inputs).output(run, &col::<String>(row, 1)?, id.0, &output);
        }
        if rows.is_empty() {
            // Not a transition, but an audit fact
            // (docs/design/leases-and-fencing.md#stale-writes), written by the
            // same call: which worker presented which token, and where the row
            // really was.
            return Ok(FinishResult::Stale);
        }
        // A retry also wakes the scheduler, whose next deadline may now be
        // this row's retry_at.
        self.inner.wakeups.wake(Topic::Scheduler);
        Ok(FinishResult::Recorded(rests_in))
    }

    async fn transition_task_run(
        &self,
        id: TaskRunId,
        from: TaskRunState,
        to: TaskRunState,
    ) -> Result<bool, TransitionError> {
        // The caller contract (docs/design/state-machines.md#caller-contract):
        // refuse before any I/O.
        let edge = resolve_generic_transition(from, to)?;
        let offset = self.inner.offset();
        let (text, makes_ready): (&'static str, bool) = match edge {
            TaskTransition::DependenciesSatisfied => (GENERIC_SATISFIED, true),
            TaskTransition::RetryReady => (GENERIC_RETRY_READY, true),
            TaskTransition::CancelPending | TaskTransition::CancelReady | TaskTransition::CancelRetrying => {
                (GENERIC_CANCEL, false)
            }
            other => {
                return Err(TransitionError::Store(StoreError::Other(format!(
                    "transition '{other}' has no generic implementation"
                ))));
            }
        };
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(
                sql(text)
                    .bind(offset)
                    .bind(id.0)
                    .bind(from.as_str())
                    .bind(edge.as_str())
                    .bind(to.as_str()),
            ))
            .await?;
        if rows.is_empty() {
            return Ok(false);
        }
        self.inner.wakeups.wake(if makes_ready {
            Topic::Publisher
        } else {
            Topic::Scheduler
        });
        Ok(true)
    }

    async fn reap_expired_leases(&self, scope: Scope, limit: u32) -> Result<Vec<Reaped>, StoreError> {
        // Read first, off the writer: almost always nothing has expired,
        // and then the reaper costs one read and never takes the write lock.
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(EXPIRED_LEASES)
                    .bind(self.inner.offset())
                    .bind(scope_key(&scope))
                    .bind(i64::from(limit)),
            )
            .await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let expired = rows.iter().map(decode::<ExpiredRow>).collect::<Result<Vec<_>, _>>()?;
        let batch: Vec<Value> = expired
            .iter()
            .map(|r| serde_json::json!({ "i": r.id, "t": r.fencing_token, "x": r.lease_expires_at }))
            .collect();
        let batch = serde_json::to_string(&batch).map_err(|e| StoreError::Other(e.to_string()))?;
        const FINAL: &str = "lease expired on the final attempt";
        let offset = self.inner.offset();
        // Each row is re-checked under the write lock
        // (docs/design/leases-and-fencing.md#the-reaper): a row a worker
        // finished, renewed or another reaper took meanwhile is left alone.
        let done = self
            .inner
            .write()
            .await?
            .call(padded(sql(REAP_CALL).bind(offset).bind(batch).bind(FINAL)))
            .await?;
        let mut outcome = std::collections::HashMap::with_capacity(done.len());
        for row in &done {
            outcome.insert(col::<i64>(row, 0)?, col::<String>(row, 1)?);
        }
        let mut reaped = Vec::with_capacity(outcome.len());
        let mut dispatched = false;
        for row in expired {
            let Some(state) = outcome.get(&row.id) else {
                continue;
            };
            let (transition, cancelled) = match state.as_str() {
                "cancelled" => (TaskTransition::ReapLease, true),
                "ready" => {
                    dispatched = true;
                    (TaskTransition::ReapLease, false)
                }
                _ => (TaskTransition::ReapLeaseFinal, false),
            };
            reaped.push(Reaped {
                task_run_id: TaskRunId(row.id),
                run_id: run_id(&row.run_id)?,
                task_key: row.task_key,
                transition,
                cancelled,
                attempt: u32::try_from(row.attempt).unwrap_or(u32::MAX),
                token: row.fencing_token,
            });
        }
        if reaped.is_empty() {
            return Ok(reaped);
        }
        self.inner.wakeups.wake(Topic::Scheduler);
        if dispatched {
            self.inner.wakeups.wake(Topic::Publisher);
        }
        Ok(reaped)
    }

    async fn runs_with_work(&self, scope: Scope, limit: u32) -> Result<Vec<RunId>, StoreError> {
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(RUNS_WITH_WORK)
                    .bind(self.inner.offset())
                    .bind(scope_key(&scope))
                    .bind(i64::from(limit)),
            )
            .await?;
        rows.iter()
            .map(|r| run_id(&col::<String>(r, 0)?).map_err(StoreError::from))
            .collect()
    }

    async fn next_deadline(&self, scope: Scope) -> Result<Option<Duration>, StoreError> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(NEXT_DEADLINE).bind(self.inner.offset()).bind(scope_key(&scope)))
            .await?;
        let wait: Option<i64> = match rows.first() {
            Some(row) => col(row, 0)?,
            None => None,
        };
        Ok(wait.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }

    async fn begin_pass(&self, run: RunId) -> Result<Option<SqlitePass>, StoreError> {
        SqlitePass::begin(self.inner.clone(), run).await
    }

    async fn get_run(&self, run: RunId) -> Result<Option<RunDetail>, StoreError> {
        let key = run_key(run);
        // One read transaction: a consistent snapshot of run, tasks and history.
        let rows = self.inner.read().await?.call(padded(sql(GET_RUN).bind(&key))).await?;
        let Some(first) = tagged(&rows, 0).next() else {
            return Ok(None);
        };
        let summary_row: SummaryRow = decode(first)?;
        let fingerprint: String = first.try_get("fingerprint").map_err(store_error)?;
        let input: String = first.try_get("input").map_err(store_error)?;
        let tasks = tagged(&rows, 1)
            .map(|r| Ok(decode::<TaskRunRow>(r)?.into_view()?))
            .collect::<Result<Vec<_>, StoreError>>()?;
        // Merged in SQL in commit order: both tables share one id sequence
        // (see `next_event_id!`).
        let events = tagged(&rows, 2)
            .map(|r| {
                let e: EventRow = decode(r)?;
                Ok(EventView {
                    task: e.task,
                    transition: e.transition,
                    from: e.from_state,
                    to: e.to_state,
                    attempt: e.attempt.map(|a| u32_of("task_run_event.attempt", a)).transpose()?,
                    token: e.token,
                    worker: e.worker,
                    at: time("event.at", e.at)?,
                    error: e.error,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(Some(RunDetail {
            summary: summary_row.into_summary()?,
            fingerprint,
            input: json("workflow_run.input", &input)?,
            tasks,
            events,
        }))
    }

    async fn list_runs(&self, limit: u32) -> Result<Vec<RunSummary>, StoreError> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(LIST_RUNS).bind(i64::from(limit)))
            .await?;
        rows.iter()
            .map(|r| Ok(decode::<SummaryRow>(r)?.into_summary()?))
            .collect()
    }

    async fn notifier(&self) -> Result<SqliteNotifier, StoreError> {
        Ok(SqliteNotifier::new(self.inner.wakeups.clone()))
    }
}
