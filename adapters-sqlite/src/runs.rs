//! Runs and task runs: the transition protocol of spec 000 over SQLite.
//!
//! Every transition is one conditional UPDATE (`WHERE id = ? AND state = ?`
//! and, for lease-spending edges, `AND fencing_token = ?`) with `RETURNING`,
//! followed by its event row in the same `BEGIN IMMEDIATE` transaction only
//! when the UPDATE matched: SQLite has no data-modifying CTEs, so the pair
//! is two statements under one write lock.

use std::collections::HashMap;
use std::time::Duration;

use flowforge_domain::{RunState, TaskRunState, TaskTransition, initial_task_run_state};
use flowforge_ports::store::resolve_generic_transition;
use flowforge_ports::{
    CancelOutcome, Claim, EventView, FinishResult, LeaseStatus, Reaped, RunDetail, RunId, RunStore, RunSummary, Scope,
    StoreError, TaskInputs, TaskOutcome, TaskRunId, TaskRunView, Topic, TransitionError, WorkerId, WorkflowId,
};
use serde_json::{Map, Value};
use sqlx::SqliteExecutor;

use crate::convert::{duration_ms, json, name, opt_name, opt_time, run_id, run_key, time, u32_of};
use crate::error::{DecodeError, store_error};
use crate::notify::SqliteNotifier;
use crate::pass::SqlitePass;
use crate::store::{Edge, SqliteStore, dispatch, record};

/// The scope filter bound into queries: NULL for every run.
pub(crate) fn scope_key(scope: Scope) -> Option<String> {
    match scope {
        Scope::All => None,
        Scope::Run(run) => Some(run_key(run)),
    }
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

const SUMMARY_COLUMNS: &str = "r.id, r.workflow_id, w.name, w.version, r.state, \
     r.cancel_requested_at IS NOT NULL AS cancel_requested, r.created_at, r.started_at, r.finished_at";

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
    fencing_token: i64,
    attempt: i64,
    lease_owner: Option<String>,
    max_attempts: i64,
    cancel_requested: bool,
}

async fn summary<'e>(
    exec: impl SqliteExecutor<'e>,
    run: &str,
) -> Result<Option<(SummaryRow, String, String)>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        summary: SummaryRow,
        fingerprint: String,
        input: String,
    }
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS}, w.fingerprint, r.input FROM workflow_run r \
         JOIN workflow w ON w.id = r.workflow_id WHERE r.id = ?1"
    );
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(run)
        .fetch_optional(exec)
        .await
        .map_err(store_error)?;
    Ok(row.map(|r| (r.summary, r.fingerprint, r.input)))
}

/// claim_task_run: ready → running at the dispatch's token (primary key).
pub(crate) const CLAIM: &str = concat!(
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
);

/// reap_expired_leases: the expired leases (`taskrun_lease_expiry_idx`).
pub(crate) const EXPIRED_LEASES: &str = concat!(
    "SELECT tr.id, tr.run_id, tr.task_key, tr.fencing_token, tr.attempt, tr.lease_owner, t.max_attempts, \
             (r.cancel_requested_at IS NOT NULL AND tr.compensate_for IS NULL) AS cancel_requested \
             FROM task_run tr \
             JOIN workflow_run r ON r.id = tr.run_id \
             JOIN task t ON t.workflow_id = r.workflow_id AND t.key = tr.task_key \
             WHERE tr.state = 'running' AND tr.lease_expires_at < ",
    now!(),
    " AND (?2 IS NULL OR tr.run_id = ?2) ORDER BY tr.lease_expires_at, tr.id LIMIT ?3"
);

/// runs_with_work: flagged rows, due retries, cancel requests (their partial indexes).
pub(crate) const RUNS_WITH_WORK: &str = concat!(
    "SELECT w.run_id FROM (\
             SELECT run_id FROM task_run WHERE needs_pass AND (?2 IS NULL OR run_id = ?2) \
             UNION SELECT run_id FROM task_run WHERE state = 'retrying' AND retry_at <= ",
    now!(),
    " AND (?2 IS NULL OR run_id = ?2) \
             UNION SELECT id FROM workflow_run WHERE needs_pass AND (?2 IS NULL OR id = ?2)\
             ) AS w JOIN workflow_run r ON r.id = w.run_id \
             WHERE r.state IN ('pending', 'running') ORDER BY r.created_at, r.id LIMIT ?3"
);

/// next_deadline: the earliest retry or lease end (the retry and lease indexes).
pub(crate) const NEXT_DEADLINE: &str = concat!(
    "SELECT MIN(d) - ",
    now!(),
    " FROM (\
             SELECT MIN(retry_at) AS d FROM task_run WHERE state = 'retrying' AND (?2 IS NULL OR run_id = ?2) \
             UNION ALL \
             SELECT MIN(lease_expires_at) FROM task_run WHERE state = 'running' AND (?2 IS NULL OR run_id = ?2))"
);

impl RunStore for SqliteStore {
    type Pass = SqlitePass;
    type Notifier = SqliteNotifier;

    async fn start_run(&self, workflow: WorkflowId, input: Value) -> Result<RunId, StoreError> {
        let run = RunId(uuid::Uuid::now_v7());
        let key = run_key(run);
        let input =
            serde_json::to_string(&input).map_err(|e| StoreError::Other(format!("cannot encode input: {e}")))?;
        let offset = self.inner.offset();
        let mut tx = self.inner.write().await?;
        let tasks: Vec<(String, i64)> = sqlx::query_as(
            "SELECT key, json_array_length(depends_on) FROM task \
             WHERE workflow_id = ?1 AND compensate_for IS NULL ORDER BY position",
        )
        .bind(workflow.0)
        .fetch_all(&mut *tx)
        .await
        .map_err(store_error)?;
        if tasks.is_empty() {
            let exists: Option<i64> = sqlx::query_scalar("SELECT id FROM workflow WHERE id = ?1")
                .bind(workflow.0)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
            return Err(match exists {
                None => StoreError::Other(format!("no workflow definition with id {workflow}")),
                Some(_) => StoreError::Corrupt(format!("workflow {workflow} has no forward task rows")),
            });
        }
        sqlx::query(concat!(
            "INSERT INTO workflow_run (id, workflow_id, state, input, created_at) VALUES (?2, ?3, 'pending', ?4, ",
            now!(),
            ")"
        ))
        .bind(offset)
        .bind(&key)
        .bind(workflow.0)
        .bind(&input)
        .execute(&mut *tx)
        .await
        .map_err(store_error)?;
        let mut rows = Vec::with_capacity(tasks.len());
        for (task, deps) in &tasks {
            let count = usize::try_from(*deps).map_err(|_| {
                StoreError::Corrupt(format!("task '{task}' of workflow {workflow} has {deps} dependencies"))
            })?;
            rows.push(serde_json::json!({
                "k": task,
                "s": initial_task_run_state(count).as_str(),
                "d": deps,
            }));
        }
        let rows = serde_json::to_string(&rows).map_err(|e| StoreError::Other(e.to_string()))?;
        sqlx::query(concat!(
            "INSERT INTO task_run (run_id, task_key, state, pending_deps, created_at) \
             SELECT ?2, j.value ->> 'k', j.value ->> 's', j.value ->> 'd', ",
            now!(),
            " FROM json_each(?3) AS j ORDER BY j.key"
        ))
        .bind(offset)
        .bind(&key)
        .bind(&rows)
        .execute(&mut *tx)
        .await
        .map_err(store_error)?;
        let dispatched = sqlx::query(concat!(
            "INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at) \
             SELECT tr.id, tr.run_id, tr.task_key, t.task_type, tr.fencing_token, ",
            now!(),
            " FROM task_run tr JOIN task t ON t.workflow_id = ?3 AND t.key = tr.task_key \
             WHERE tr.run_id = ?2 AND tr.state IN ('pending', 'ready', 'running', 'retrying') AND tr.state = 'ready' \
             ORDER BY tr.id"
        ))
        .bind(offset)
        .bind(&key)
        .bind(workflow.0)
        .execute(&mut *tx)
        .await
        .map_err(store_error)?
        .rows_affected();
        tx.commit().await.map_err(store_error)?;
        if dispatched > 0 {
            self.inner.wakeups.wake(Topic::Publisher);
        }
        Ok(run)
    }

    async fn request_cancel(&self, run: RunId) -> Result<Option<CancelOutcome>, StoreError> {
        let key = run_key(run);
        let offset = self.inner.offset();
        let mut tx = self.inner.write().await?;
        let row: Option<(String, bool)> =
            sqlx::query_as("SELECT state, cancel_requested_at IS NOT NULL FROM workflow_run WHERE id = ?1")
                .bind(&key)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
        let Some((state, requested)) = row else {
            return Ok(None);
        };
        let state: RunState = name("workflow_run.state", &state)?;
        if matches!(state, RunState::Succeeded | RunState::Failed | RunState::Cancelled) {
            return Ok(Some(CancelOutcome::AlreadyFinished(state)));
        }
        if requested {
            return Ok(Some(CancelOutcome::AlreadyRequested));
        }
        sqlx::query(concat!(
            "UPDATE workflow_run SET cancel_requested_at = ",
            now!(),
            ", needs_pass = 1 WHERE id = ?2 AND cancel_requested_at IS NULL AND state IN ('pending', 'running')"
        ))
        .bind(offset)
        .bind(&key)
        .execute(&mut *tx)
        .await
        .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
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
        let mut tx = self.inner.write().await?;
        // `started_at IS NULL` in SET reads the old row: the first start of
        // a task while its run is still pending flags the run's pass, which
        // moves the run to running.
        let row: Option<ClaimRow> = sqlx::query_as(CLAIM)
            .bind(offset)
            .bind(id.0)
            .bind(token)
            .bind(&worker.0)
            .bind(duration_ms(lease))
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        record(
            &mut tx,
            offset,
            &[id.0],
            Edge::new("claim", "ready", "running").worker(Some(&worker.0)),
        )
        .await?;
        tx.commit().await.map_err(store_error)?;
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
        let key = run_key(run);
        let mut tx = self.inner.reader.begin().await.map_err(store_error)?;
        let input: Option<String> = sqlx::query_scalar("SELECT input FROM workflow_run WHERE id = ?1")
            .bind(&key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?;
        let Some(input) = input else {
            return Err(StoreError::Other(format!("no run with id {run}")));
        };
        let wanted = serde_json::to_string(keys).map_err(|e| StoreError::Other(e.to_string()))?;
        let outputs: Vec<(String, String)> = sqlx::query_as(
            "SELECT task_key, result FROM task_run WHERE run_id = ?1 AND state = 'succeeded' \
             AND result IS NOT NULL AND task_key IN (SELECT value FROM json_each(?2)) ORDER BY id",
        )
        .bind(&key)
        .bind(&wanted)
        .fetch_all(&mut *tx)
        .await
        .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        let mut map = Map::new();
        for (task, output) in outputs {
            map.insert(task, json("task_run.result", &output)?);
        }
        Ok(TaskInputs {
            run_input: json("workflow_run.input", &input)?,
            outputs: map,
        })
    }

    async fn renew_lease(&self, id: TaskRunId, token: i64, lease: Duration) -> Result<LeaseStatus, StoreError> {
        let offset = self.inner.offset();
        let mut tx = self.inner.write().await?;
        let cancel_requested: Option<bool> = sqlx::query_scalar(concat!(
            "UPDATE task_run SET lease_expires_at = ",
            now!(),
            " + ?4 WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 \
             RETURNING compensate_for IS NULL \
               AND (SELECT r.cancel_requested_at IS NOT NULL FROM workflow_run r WHERE r.id = task_run.run_id)"
        ))
        .bind(offset)
        .bind(id.0)
        .bind(token)
        .bind(duration_ms(lease))
        .fetch_optional(&mut *tx)
        .await
        .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        Ok(match cancel_requested {
            Some(cancel_requested) => LeaseStatus::Held { cancel_requested },
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
        let worker_name = Some(worker.0.as_str());
        let mut tx = self.inner.write().await?;
        let (matched, rests_in, label) = match &outcome {
            TaskOutcome::Succeeded { output } => {
                let output = serde_json::to_string(output)
                    .map_err(|e| StoreError::Other(format!("cannot encode output: {e}")))?;
                let hit: Option<i64> = sqlx::query_scalar(concat!(
                    "UPDATE task_run SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, \
                     finished_at = ",
                    now!(),
                    ", result = ?4, needs_pass = 1 \
                     WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 RETURNING id"
                ))
                .bind(offset)
                .bind(id.0)
                .bind(token)
                .bind(&output)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
                if hit.is_some() {
                    record(
                        &mut tx,
                        offset,
                        &[id.0],
                        Edge::new("succeed", "running", "succeeded").worker(worker_name),
                    )
                    .await?;
                }
                (hit.is_some(), TaskRunState::Succeeded, "succeed")
            }
            TaskOutcome::Failed { error, retry_in: None } => {
                let hit: Option<i64> = sqlx::query_scalar(concat!(
                    "UPDATE task_run SET state = 'failed', lease_owner = NULL, lease_expires_at = NULL, \
                     finished_at = ",
                    now!(),
                    ", error = ?4, needs_pass = 1 \
                     WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 RETURNING id"
                ))
                .bind(offset)
                .bind(id.0)
                .bind(token)
                .bind(error)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
                if hit.is_some() {
                    record(
                        &mut tx,
                        offset,
                        &[id.0],
                        Edge::new("fail", "running", "failed")
                            .worker(worker_name)
                            .error(Some(error)),
                    )
                    .await?;
                }
                (hit.is_some(), TaskRunState::Failed, "fail")
            }
            TaskOutcome::Failed {
                error,
                retry_in: Some(delay),
            } => {
                // fail and schedule_retry in one UPDATE (decision 1): the row
                // never rests in failed, so a resting failed row means failed
                // for good. The scheduler need not look: the retry's due
                // time brings it back.
                let hit: Option<i64> = sqlx::query_scalar(concat!(
                    "UPDATE task_run SET state = 'retrying', attempt = attempt + 1, retry_at = ",
                    now!(),
                    " + ?5, lease_owner = NULL, lease_expires_at = NULL, finished_at = NULL, error = ?4 \
                     WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 RETURNING id"
                ))
                .bind(offset)
                .bind(id.0)
                .bind(token)
                .bind(error)
                .bind(duration_ms(*delay))
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
                if hit.is_some() {
                    // Both edges, in order: `fail` at the attempt that failed,
                    // then `schedule_retry` at the next one.
                    sqlx::query(concat!(
                        "INSERT INTO task_run_event (id, task_run_id, run_id, task_key, transition, from_state, \
                         to_state, attempt, fencing_token, worker, at, error) \
                         SELECT ",
                        next_event_id!(),
                        " + e.seq, id, run_id, task_key, e.transition, e.from_state, e.to_state, \
                         attempt - e.back, fencing_token, e.worker, ",
                        now!(),
                        ", e.error FROM task_run, (\
                         SELECT 1 AS seq, 'fail' AS transition, 'running' AS from_state, 'failed' AS to_state, \
                         1 AS back, ?3 AS worker, ?4 AS error \
                         UNION ALL SELECT 2, 'schedule_retry', 'failed', 'retrying', 0, NULL, NULL) AS e \
                         WHERE task_run.id = ?2 ORDER BY e.seq"
                    ))
                    .bind(offset)
                    .bind(id.0)
                    .bind(&worker.0)
                    .bind(error)
                    .execute(&mut *tx)
                    .await
                    .map_err(store_error)?;
                }
                (hit.is_some(), TaskRunState::Retrying, "fail")
            }
            TaskOutcome::Cancelled => {
                let hit: Option<i64> = sqlx::query_scalar(concat!(
                    "UPDATE task_run SET state = 'cancelled', cancel_reason = 'user', lease_owner = NULL, \
                     lease_expires_at = NULL, finished_at = ",
                    now!(),
                    ", needs_pass = 1 WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 RETURNING id"
                ))
                .bind(offset)
                .bind(id.0)
                .bind(token)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
                if hit.is_some() {
                    record(
                        &mut tx,
                        offset,
                        &[id.0],
                        Edge::new("cancel_running", "running", "cancelled").worker(worker_name),
                    )
                    .await?;
                }
                (hit.is_some(), TaskRunState::Cancelled, "cancel_running")
            }
        };
        if !matched {
            // Not a transition, but an audit fact (decision 7): which worker
            // presented which token, and where the row really was.
            sqlx::query(concat!(
                "INSERT INTO task_run_event (id, task_run_id, run_id, task_key, transition, from_state, to_state, \
                 attempt, fencing_token, worker, at, error) SELECT ",
                next_event_id!(),
                " + 1, id, run_id, task_key, 'stale_write_rejected', NULL, NULL, attempt, ?3, ?4, ",
                now!(),
                ", 'stale ' || ?5 || ' rejected: token ' || ?3 || ' presented, the row is ' || state || \
                 ' at token ' || fencing_token FROM task_run WHERE id = ?2"
            ))
            .bind(offset)
            .bind(id.0)
            .bind(token)
            .bind(&worker.0)
            .bind(label)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
            tx.commit().await.map_err(store_error)?;
            return Ok(FinishResult::Stale);
        }
        tx.commit().await.map_err(store_error)?;
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
        // The caller contract of spec 000: refuse before any I/O.
        let edge = resolve_generic_transition(from, to)?;
        let offset = self.inner.offset();
        let (sql, makes_ready): (&'static str, bool) = match edge {
            TaskTransition::DependenciesSatisfied => (
                "UPDATE task_run SET state = 'ready', pending_deps = 0 \
                 WHERE id = ?2 AND state = 'pending' RETURNING id",
                true,
            ),
            TaskTransition::RetryReady => (
                "UPDATE task_run SET state = 'ready', retry_at = NULL \
                 WHERE id = ?2 AND state = 'retrying' RETURNING id",
                true,
            ),
            TaskTransition::CancelPending | TaskTransition::CancelReady | TaskTransition::CancelRetrying => (
                concat!(
                    "UPDATE task_run SET state = 'cancelled', cancel_reason = 'user', retry_at = NULL, \
                     finished_at = ",
                    now!(),
                    ", needs_pass = 1 WHERE id = ?2 AND state = ?3 RETURNING id"
                ),
                false,
            ),
            other => {
                return Err(TransitionError::Store(StoreError::Other(format!(
                    "transition '{other}' has no generic implementation"
                ))));
            }
        };
        let mut tx = self.inner.write().await?;
        let hit: Option<i64> = sqlx::query_scalar(sql)
            .bind(offset)
            .bind(id.0)
            .bind(from.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?;
        if hit.is_none() {
            return Ok(false);
        }
        record(
            &mut tx,
            offset,
            &[id.0],
            Edge::new(edge.as_str(), from.as_str(), to.as_str()),
        )
        .await?;
        if makes_ready {
            dispatch(&mut tx, offset, &[id.0]).await?;
        }
        tx.commit().await.map_err(store_error)?;
        self.inner.wakeups.wake(if makes_ready {
            Topic::Publisher
        } else {
            Topic::Scheduler
        });
        Ok(true)
    }

    async fn reap_expired_leases(&self, scope: Scope, limit: u32) -> Result<Vec<Reaped>, StoreError> {
        let offset = self.inner.offset();
        let mut tx = self.inner.write().await?;
        let expired: Vec<ExpiredRow> = sqlx::query_as(EXPIRED_LEASES)
            .bind(offset)
            .bind(scope_key(scope))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        let mut reaped = Vec::with_capacity(expired.len());
        let mut dispatched = false;
        for row in expired {
            let lost_by = row.lease_owner.as_deref();
            // Each UPDATE re-checks what the SELECT saw (decision 2): a row a
            // worker finished or renewed meanwhile is left alone.
            let (transition, cancelled) = if row.cancel_requested {
                let hit: Option<i64> = sqlx::query_scalar(concat!(
                    "UPDATE task_run SET state = 'cancelled', fencing_token = fencing_token + 1, \
                     attempt = attempt + 1, lease_owner = NULL, lease_expires_at = NULL, cancel_reason = 'user', \
                     finished_at = ",
                    now!(),
                    ", needs_pass = 1 WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 \
                     AND lease_expires_at < ",
                    now!(),
                    " RETURNING id"
                ))
                .bind(offset)
                .bind(row.id)
                .bind(row.fencing_token)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
                if hit.is_none() {
                    continue;
                }
                record(
                    &mut tx,
                    offset,
                    &[row.id],
                    Edge::new("reap_lease", "running", "ready")
                        .worker(lost_by)
                        .error(Some("lease expired")),
                )
                .await?;
                record(
                    &mut tx,
                    offset,
                    &[row.id],
                    Edge::new("cancel_ready", "ready", "cancelled"),
                )
                .await?;
                (TaskTransition::ReapLease, true)
            } else if row.attempt < row.max_attempts {
                let hit: Option<i64> = sqlx::query_scalar(concat!(
                    "UPDATE task_run SET state = 'ready', fencing_token = fencing_token + 1, attempt = attempt + 1, \
                     lease_owner = NULL, lease_expires_at = NULL \
                     WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 AND lease_expires_at < ",
                    now!(),
                    " RETURNING id"
                ))
                .bind(offset)
                .bind(row.id)
                .bind(row.fencing_token)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
                if hit.is_none() {
                    continue;
                }
                record(
                    &mut tx,
                    offset,
                    &[row.id],
                    Edge::new("reap_lease", "running", "ready")
                        .worker(lost_by)
                        .error(Some("lease expired")),
                )
                .await?;
                dispatch(&mut tx, offset, &[row.id]).await?;
                dispatched = true;
                (TaskTransition::ReapLease, false)
            } else {
                const FINAL: &str = "lease expired on the final attempt";
                let hit: Option<i64> = sqlx::query_scalar(concat!(
                    "UPDATE task_run SET state = 'failed', fencing_token = fencing_token + 1, lease_owner = NULL, \
                     lease_expires_at = NULL, finished_at = ",
                    now!(),
                    ", error = ?4, needs_pass = 1 WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 \
                     AND lease_expires_at < ",
                    now!(),
                    " RETURNING id"
                ))
                .bind(offset)
                .bind(row.id)
                .bind(row.fencing_token)
                .bind(FINAL)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_error)?;
                if hit.is_none() {
                    continue;
                }
                record(
                    &mut tx,
                    offset,
                    &[row.id],
                    Edge::new("reap_lease_final", "running", "failed")
                        .worker(lost_by)
                        .error(Some(FINAL)),
                )
                .await?;
                (TaskTransition::ReapLeaseFinal, false)
            };
            reaped.push(Reaped {
                task_run_id: TaskRunId(row.id),
                run_id: run_id(&row.run_id)?,
                task_key: row.task_key,
                transition,
                cancelled,
            });
        }
        if reaped.is_empty() {
            return Ok(reaped);
        }
        tx.commit().await.map_err(store_error)?;
        self.inner.wakeups.wake(Topic::Scheduler);
        if dispatched {
            self.inner.wakeups.wake(Topic::Publisher);
        }
        Ok(reaped)
    }

    async fn runs_with_work(&self, scope: Scope, limit: u32) -> Result<Vec<RunId>, StoreError> {
        let runs: Vec<String> = sqlx::query_scalar(RUNS_WITH_WORK)
            .bind(self.inner.offset())
            .bind(scope_key(scope))
            .bind(i64::from(limit))
            .fetch_all(&self.inner.reader)
            .await
            .map_err(store_error)?;
        runs.iter().map(|r| run_id(r).map_err(StoreError::from)).collect()
    }

    async fn next_deadline(&self, scope: Scope) -> Result<Option<Duration>, StoreError> {
        let wait: Option<i64> = sqlx::query_scalar(NEXT_DEADLINE)
            .bind(self.inner.offset())
            .bind(scope_key(scope))
            .fetch_one(&self.inner.reader)
            .await
            .map_err(store_error)?;
        Ok(wait.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }

    async fn begin_pass(&self, run: RunId) -> Result<Option<SqlitePass>, StoreError> {
        SqlitePass::begin(self.inner.clone(), run).await
    }

    async fn get_run(&self, run: RunId) -> Result<Option<RunDetail>, StoreError> {
        let key = run_key(run);
        // One read transaction: a consistent snapshot of run, tasks and history.
        let mut tx = self.inner.reader.begin().await.map_err(store_error)?;
        let Some((summary_row, fingerprint, input)) = summary(&mut *tx, &key).await? else {
            return Ok(None);
        };
        let tasks: Vec<TaskRunRow> = sqlx::query_as(
            "SELECT id, task_key, compensate_for, state, attempt, fencing_token, cancel_reason, result, error, \
             started_at, finished_at, retry_at, lease_owner, created_at FROM task_run WHERE run_id = ?1 ORDER BY id",
        )
        .bind(&key)
        .fetch_all(&mut *tx)
        .await
        .map_err(store_error)?;
        // Merged in SQL in commit order: both tables share one id sequence
        // (see `next_event_id!`).
        let history: Vec<EventRow> = sqlx::query_as(
            "SELECT task, transition, from_state, to_state, attempt, token, worker, at, error FROM (\
             SELECT task_key AS task, transition, from_state, to_state, attempt, fencing_token AS token, worker, \
             at, error, id FROM task_run_event WHERE run_id = ?1 \
             UNION ALL \
             SELECT NULL, transition, from_state, to_state, NULL, NULL, NULL, at, NULL, id \
             FROM workflow_run_event WHERE run_id = ?1\
             ) ORDER BY id",
        )
        .bind(&key)
        .fetch_all(&mut *tx)
        .await
        .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;

        let tasks = tasks
            .into_iter()
            .map(TaskRunRow::into_view)
            .collect::<Result<Vec<_>, _>>()?;
        let events = history
            .into_iter()
            .map(|e| {
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
            .collect::<Result<Vec<_>, DecodeError>>()?;
        Ok(Some(RunDetail {
            summary: summary_row.into_summary()?,
            fingerprint,
            input: json("workflow_run.input", &input)?,
            tasks,
            events,
        }))
    }

    async fn list_runs(&self, limit: u32) -> Result<Vec<RunSummary>, StoreError> {
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM workflow_run r JOIN workflow w ON w.id = r.workflow_id \
             ORDER BY r.created_at DESC, r.id DESC LIMIT ?1"
        );
        let rows: Vec<SummaryRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(i64::from(limit))
            .fetch_all(&self.inner.reader)
            .await
            .map_err(store_error)?;
        rows.into_iter()
            .map(|r| r.into_summary().map_err(StoreError::from))
            .collect()
    }

    async fn notifier(&self) -> Result<SqliteNotifier, StoreError> {
        Ok(SqliteNotifier::new(self.inner.wakeups.clone()))
    }
}

/// Keys of the given rows, keeping the order of `ids`.
pub(crate) fn keys_in_order(ids: &[i64], keys: &HashMap<i64, String>) -> Vec<String> {
    ids.iter().filter_map(|id| keys.get(id).cloned()).collect()
}
