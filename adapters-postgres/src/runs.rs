//! Runs and task runs: the transition protocol
//! (docs/design/state-machines.md#transition-protocol) and what it relies on —
//! one conditional UPDATE per transition, its event in the same statement,
//! fencing on every lease-spending write, store time only.

use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_domain::concurrency::Gate;
use flowforge_domain::limits::{self, MAX_STALE_AUDITS_PER_TASK_RUN, Refusal, ValueKind};
use flowforge_domain::plan::Handoff;
use flowforge_domain::retry::Reset;
use flowforge_domain::{RunState, TaskRunState, TaskTransition, run_machine};
use flowforge_ports::store::{
    Finished, Gauges, Handover, IdempotencyKey, KeyedStart, NewRun, RunQuery, StartOptions, Wait,
    resolve_generic_transition,
};
use flowforge_ports::{
    CancelOutcome, Claim, Dispatch, EventView, FinishResult, LeaseStatus, Reaped, RunDetail, RunId, RunStore,
    RunSummary, Scope, TaskInputs, TaskOutcome, TaskRunId, TaskRunView, Topic, TransitionError, WorkerId, WorkflowId,
    store,
};
use serde_json::{Map, Value};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::error::{corrupt, store_error};
use crate::notify::PgNotifier;
use crate::outbox::OutboxRow;
use crate::pass::PgRunPass;
use crate::queries;
use crate::rows::{DetailRow, EventRow, SummaryRow, TaskRunRow, WaitRow, parse_name, to_u32, to_u64};
use crate::store::{PgStore, interval, micros};

#[derive(Debug, sqlx::FromRow)]
struct ClaimRow {
    id: i64,
    run_id: Uuid,
    workflow_id: i64,
    task_key: String,
    compensate_for: Option<String>,
    attempt: i32,
    attempt_base: i32,
    fencing_token: i64,
    lease_expires_at: Option<DateTime<Utc>>,
    woke_scheduler: bool,
}

/// A renewal's answer: the row's cancel flag when the token held the lease.
fn lease_status(cancel_requested: Option<bool>) -> LeaseStatus {
    match cancel_requested {
        Some(cancel_requested) => LeaseStatus::Held { cancel_requested },
        None => LeaseStatus::Lost,
    }
}

impl ClaimRow {
    fn into_claim(self) -> Result<Claim, store::Error> {
        let id = self.id;
        Ok(Claim {
            task_run_id: TaskRunId(self.id),
            run_id: RunId(self.run_id),
            workflow_id: WorkflowId(self.workflow_id),
            task_key: self.task_key,
            compensate_for: self.compensate_for,
            attempt: to_u32(self.attempt, "task_run.attempt")?,
            attempt_base: to_u32(self.attempt_base, "task_run.attempt_base")?,
            token: self.fencing_token,
            lease_expires_at: self
                .lease_expires_at
                .ok_or_else(|| corrupt(format!("task run {id} is running without a lease")))?,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
struct ReapRow {
    id: i64,
    run_id: Uuid,
    task_key: String,
    state: String,
    task_type: String,
    compensate_for: Option<String>,
    error: Option<String>,
    cancel_requested: bool,
    dispatched: i64,
    lost_attempt: i32,
    lost_token: i64,
}

/// The scope filter bound into queries: the run ids, NULL for every run.
pub(crate) fn scope_runs(scope: &Scope) -> Option<Vec<Uuid>> {
    scope.run_ids().map(|runs| runs.into_iter().map(|r| r.0).collect())
}

impl PgStore {
    /// Announces the wake-ups a committed write owes: this process's
    /// waiters at once, other processes' by NOTIFY.
    pub(crate) async fn announce(&self, owed: &[(Topic, bool)]) {
        let topics: Vec<Topic> = owed.iter().filter(|(_, due)| *due).map(|(t, _)| *t).collect();
        if !topics.is_empty() {
            self.inner.hub.publish(&self.inner.pool, &topics).await;
        }
    }

    /// start_run's statement, shared by start_run_keyed (which runs it in
    /// the transaction that recorded its key): the run `id`, its task runs
    /// and their dispatches. Returns the run's creation time and the
    /// wake-ups it owes, to announce after the commit; `Other` when the
    /// definition does not exist. The caller has refused an input holding
    /// NUL, before any I/O.
    pub(crate) async fn create_run<'e>(
        &self,
        exec: impl PgExecutor<'e>,
        id: Uuid,
        workflow: WorkflowId,
        input: &Value,
        options: &StartOptions,
    ) -> Result<(NewRun, [(Topic, bool); 2]), store::Error> {
        let gates = serde_json::to_value(&options.gates)
            .map_err(|e| store::Error::Other(format!("cannot encode the gates: {e}")))?;
        let (created_at, woke_publisher, woke_scheduler): (Option<DateTime<Utc>>, bool, bool) =
            sqlx::query_as(queries::START_RUN)
                .bind(self.offset())
                .bind(id)
                .bind(workflow.0)
                .bind(input)
                .bind(i16::from(options.priority.get()))
                .bind(gates)
                .fetch_one(exec)
                .await
                .map_err(store_error)?;
        let Some(created_at) = created_at else {
            return Err(store::Error::Other(format!(
                "workflow definition id {workflow} not found"
            )));
        };
        Ok((
            NewRun {
                id: RunId(id),
                created_at,
            },
            [(Topic::Publisher, woke_publisher), (Topic::Scheduler, woke_scheduler)],
        ))
    }

    /// The run a key started, as start_run_keyed answers for it.
    async fn keyed_run<'e>(
        &self,
        exec: impl PgExecutor<'e>,
        key: &IdempotencyKey,
    ) -> Result<Option<KeyedStart>, store::Error> {
        let row: Option<(String, Uuid)> = sqlx::query_as(queries::KEYED_RUN)
            .bind(&key.key)
            .fetch_optional(exec)
            .await
            .map_err(store_error)?;
        Ok(row.map(|(hash, run)| {
            if hash == key.request_hash {
                KeyedStart::Replayed(RunId(run))
            } else {
                KeyedStart::Reused(RunId(run))
            }
        }))
    }

    /// A success handed on in its one statement
    /// (docs/design/scheduler.md#handoff).
    async fn finish_handing_off(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        output: &Value,
        handoff: &Handoff,
        handover: Handover,
    ) -> Result<Finished, store::Error> {
        let output =
            serde_json::to_string(output).map_err(|e| store::Error::Other(format!("cannot encode output: {e}")))?;
        let (recorded, woke_scheduler, woke_publisher, held, queued): (bool, bool, bool, Option<String>, bool) =
            sqlx::query_as(queries::FINISH_HANDOFF)
                .bind(self.offset())
                .bind(id.0)
                .bind(token)
                .bind(&worker.0)
                .bind(output)
                .bind(MAX_STALE_AUDITS_PER_TASK_RUN)
                .bind(&handoff.dependents)
                // The joins are left to the pass, which lowers a wide
                // join's counter once for all the successes it sees, where
                // each success lowering it would make it a hot row
                // (docs/design/scheduler.md#joins): a success naming any is
                // flagged.
                .bind(handoff.whole && handoff.joins.is_empty())
                .bind(match handover {
                    Handover::Held(hold) => Some(micros(hold)),
                    Handover::Sweep | Handover::Pushed => None,
                })
                .bind(handover == Handover::Pushed)
                .fetch_one(&self.inner.pool)
                .await
                .map_err(store_error)?;
        self.announce(&[(Topic::Publisher, woke_publisher), (Topic::Scheduler, woke_scheduler)])
            .await;
        let result = if recorded {
            FinishResult::Recorded(TaskRunState::Succeeded)
        } else {
            FinishResult::Stale
        };
        Ok(Finished {
            result,
            held: held_dispatches(held.as_deref()),
            queued,
        })
    }

    async fn finish(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        outcome: TaskOutcome,
    ) -> Result<FinishResult, store::Error> {
        let (state, transition, output, error, reason, retry_in) = match outcome.storable() {
            TaskOutcome::Succeeded { output } => (
                TaskRunState::Succeeded,
                TaskTransition::Succeed,
                // Sent as text: PostgreSQL parses it into jsonb and keeps
                // its length for task_inputs' limit.
                Some(
                    serde_json::to_string(&output)
                        .map_err(|e| store::Error::Other(format!("cannot encode output: {e}")))?,
                ),
                None,
                None,
                None,
            ),
            TaskOutcome::Failed { error, retry_in } => (
                TaskRunState::Failed,
                TaskTransition::Fail,
                None,
                Some(error),
                None,
                retry_in,
            ),
            TaskOutcome::Cancelled => (
                TaskRunState::Cancelled,
                TaskTransition::CancelRunning,
                None,
                None,
                Some("user"),
                None,
            ),
        };
        let finish = sqlx::query_as::<_, (bool, bool)>(queries::FINISH)
            .bind(self.offset())
            .bind(id.0)
            .bind(token)
            .bind(&worker.0)
            .bind(state.as_str())
            .bind(transition.as_str())
            .bind(output)
            .bind(error)
            .bind(reason)
            .bind(MAX_STALE_AUDITS_PER_TASK_RUN);
        let Some(retry_in) = retry_in else {
            // One statement, one implicit transaction: the hot path.
            let (recorded, woke) = finish.fetch_one(&self.inner.pool).await.map_err(store_error)?;
            self.announce(&[(Topic::Scheduler, woke)]).await;
            return Ok(if recorded {
                FinishResult::Recorded(state)
            } else {
                FinishResult::Stale
            });
        };
        // fail and schedule_retry in one transaction
        // (docs/design/state-machines.md#attempts-and-retries): the row never
        // rests in `failed` when another attempt is allowed.
        let retry_in = interval(retry_in)?;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let (recorded, woke) = finish.fetch_one(&mut *tx).await.map_err(store_error)?;
        if !recorded {
            tx.commit().await.map_err(store_error)?;
            return Ok(FinishResult::Stale);
        }
        let retried: i64 = sqlx::query_scalar(queries::SCHEDULE_RETRY)
            .bind(self.offset())
            .bind(id.0)
            .bind(token)
            .bind(retry_in)
            .bind(&worker.0)
            .fetch_one(&mut *tx)
            .await
            .map_err(store_error)?;
        if retried != 1 {
            // The row is locked by this transaction since the fail: this
            // cannot happen unless the schema's rules changed under us.
            return Err(corrupt(format!(
                "task run {id}: schedule_retry did not apply right after fail"
            )));
        }
        tx.commit().await.map_err(store_error)?;
        self.announce(&[(Topic::Scheduler, woke)]).await;
        Ok(FinishResult::Recorded(TaskRunState::Retrying))
    }

    async fn generic(&self, id: TaskRunId, from: TaskRunState, edge: TaskTransition) -> Result<bool, store::Error> {
        let (sql, topic) = match edge {
            TaskTransition::DependenciesSatisfied | TaskTransition::RetryReady => {
                (queries::GENERIC_TO_READY, Topic::Publisher)
            }
            TaskTransition::CancelPending | TaskTransition::CancelReady | TaskTransition::CancelRetrying => {
                (queries::GENERIC_CANCEL, Topic::Scheduler)
            }
            // resolve_generic_transition refuses every other edge first.
            other => {
                return Err(store::Error::Other(format!(
                    "transition '{other}' has no generic implementation"
                )));
            }
        };
        let (moved, woke): (bool, bool) = sqlx::query_as(sql)
            .bind(self.offset())
            .bind(id.0)
            .bind(from.as_str())
            .bind(edge.as_str())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)?;
        self.announce(&[(topic, woke)]).await;
        Ok(moved)
    }
}

impl RunStore for PgStore {
    type Pass = PgRunPass;
    type Notifier = PgNotifier;

    async fn start_run_with(
        &self,
        workflow: WorkflowId,
        input: Value,
        options: &StartOptions,
    ) -> Result<NewRun, store::Error> {
        limits::refuse_nul(ValueKind::RunInput, &input)?;
        let (run, owed) = self
            .create_run(&self.inner.pool, Uuid::now_v7(), workflow, &input, options)
            .await?;
        self.announce(&owed).await;
        Ok(run)
    }

    async fn request_cancel(&self, run: RunId) -> Result<Option<CancelOutcome>, store::Error> {
        let (requested, woke): (bool, bool) = sqlx::query_as(queries::REQUEST_CANCEL)
            .bind(self.offset())
            .bind(run.0)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)?;
        self.announce(&[(Topic::Scheduler, woke)]).await;
        if requested {
            return Ok(Some(CancelOutcome::Requested));
        }
        let state: Option<String> = sqlx::query_scalar(queries::RUN_STATE)
            .bind(run.0)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        let Some(state) = state else {
            return Ok(None);
        };
        let state: RunState = parse_name(&state, "workflow_run.state")?;
        Ok(Some(if run_machine().is_terminal(state) {
            CancelOutcome::AlreadyFinished(state)
        } else {
            CancelOutcome::AlreadyRequested
        }))
    }

    async fn resume_run(
        &self,
        run: RunId,
        state: RunState,
        generation: u32,
        resets: &[Reset],
        gates: &[Gate],
    ) -> Result<Option<u32>, store::Error> {
        let gates =
            serde_json::to_value(gates).map_err(|e| store::Error::Other(format!("cannot encode the gates: {e}")))?;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let moved: Option<(i32, i64)> = sqlx::query_as(queries::RESUME_RUN)
            .bind(run.0)
            .bind(state.as_str())
            .bind(i64::from(generation))
            .bind(gates)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?;
        let Some((next, counted)) = moved else {
            return Ok(None);
        };
        if counted != 1 {
            return Err(corrupt(format!("run {run} is finished but has no event counter")));
        }
        sqlx::query(queries::RESUME_EVENT)
            .bind(self.offset())
            .bind(run.0)
            .bind(state.as_str())
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        let keys: Vec<&str> = resets.iter().map(|r| r.key.as_str()).collect();
        let from: Vec<&str> = resets.iter().map(|r| r.from.as_str()).collect();
        let to: Vec<&str> = resets.iter().map(|r| r.to.as_str()).collect();
        let deps: Vec<i32> = resets
            .iter()
            .map(|r| i32::try_from(r.pending_deps).map_err(|_| store::Error::Other("too many dependencies".into())))
            .collect::<Result<_, _>>()?;
        let reset: i64 = sqlx::query_scalar(queries::RESET_TASKS)
            .bind(self.offset())
            .bind(run.0)
            .bind(&keys)
            .bind(&from)
            .bind(&to)
            .bind(&deps)
            .bind(next)
            .fetch_one(&mut *tx)
            .await
            .map_err(store_error)?;
        if usize::try_from(reset).ok() != Some(resets.len()) {
            // A task moved since the plan was read: apply nothing.
            return Ok(None);
        }
        tx.commit().await.map_err(store_error)?;
        self.announce(&[(Topic::Publisher, true), (Topic::Scheduler, true)])
            .await;
        Ok(Some(to_u32(next, "workflow_run.generation")?))
    }

    async fn claim_task_run(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        lease: Duration,
    ) -> Result<Option<Claim>, store::Error> {
        let row: Option<ClaimRow> = sqlx::query_as(queries::CLAIM)
            .bind(self.offset())
            .bind(id.0)
            .bind(token)
            .bind(&worker.0)
            .bind(interval(lease)?)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        self.announce(&[(Topic::Scheduler, row.woke_scheduler)]).await;
        row.into_claim().map(Some)
    }

    async fn claim_ready(
        &self,
        task_types: &[String],
        worker: &WorkerId,
        lease: Duration,
        max: u32,
        aging: Duration,
    ) -> Result<Vec<Claim>, store::Error> {
        if max == 0 || task_types.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<ClaimRow> = sqlx::query_as(queries::CLAIM_READY)
            .bind(self.offset())
            .bind(task_types)
            .bind(i64::from(max))
            .bind(&worker.0)
            .bind(interval(lease)?)
            .bind(micros(aging))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        let woke = rows.iter().any(|r| r.woke_scheduler);
        self.announce(&[(Topic::Scheduler, woke)]).await;
        rows.into_iter().map(ClaimRow::into_claim).collect()
    }

    async fn dispatch_is_current(&self, id: TaskRunId, token: i64) -> Result<bool, store::Error> {
        sqlx::query_scalar(queries::DISPATCH_IS_CURRENT)
            .bind(id.0)
            .bind(token)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)
    }

    async fn report_progress(
        &self,
        id: TaskRunId,
        token: i64,
        progress: &Value,
        lease: Duration,
    ) -> Result<LeaseStatus, store::Error> {
        limits::refuse_nul(ValueKind::TaskProgress, progress)?;
        let cancel_requested: Option<bool> = sqlx::query_scalar(queries::REPORT_PROGRESS)
            .bind(self.offset())
            .bind(id.0)
            .bind(token)
            .bind(interval(lease)?)
            .bind(progress)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(lease_status(cancel_requested))
    }

    async fn task_inputs(&self, run: RunId, keys: &[String], limit: usize) -> Result<TaskInputs, store::Error> {
        let row: Option<(Value, i64, Option<Value>)> = sqlx::query_as(queries::TASK_INPUTS)
            .bind(run.0)
            .bind(keys)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        let Some((run_input, bytes, outputs)) = row else {
            return Err(store::Error::Other(format!("run {run} not found")));
        };
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        if bytes > limit {
            return Err(Refusal::TooLarge {
                kind: ValueKind::TaskInputs,
                bytes,
                limit,
            }
            .into());
        }
        let outputs = match outputs {
            None => Map::new(),
            Some(Value::Object(map)) => map,
            Some(other) => return Err(corrupt(format!("run {run}: outputs aggregate to {other}"))),
        };
        Ok(TaskInputs { run_input, outputs })
    }

    async fn renew_lease(&self, id: TaskRunId, token: i64, lease: Duration) -> Result<LeaseStatus, store::Error> {
        let cancel_requested: Option<bool> = sqlx::query_scalar(queries::RENEW_LEASE)
            .bind(self.offset())
            .bind(id.0)
            .bind(token)
            .bind(interval(lease)?)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(lease_status(cancel_requested))
    }

    async fn finish_and_hand_off(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        outcome: TaskOutcome,
        handoff: &Handoff,
        handover: Handover,
    ) -> Result<Finished, store::Error> {
        match outcome.storable() {
            TaskOutcome::Succeeded { output } if !handoff.dependents.is_empty() => {
                self.finish_handing_off(id, token, worker, &output, handoff, handover)
                    .await
            }
            outcome => Ok(Finished {
                result: self.finish(id, token, worker, outcome).await?,
                held: Vec::new(),
                queued: false,
            }),
        }
    }

    async fn transition_task_run(
        &self,
        id: TaskRunId,
        from: TaskRunState,
        to: TaskRunState,
    ) -> Result<bool, TransitionError> {
        // Illegal, lease-requiring and reserved edges are refused here,
        // before any SQL (docs/design/state-machines.md#caller-contract).
        let edge = resolve_generic_transition(from, to)?;
        Ok(self.generic(id, from, edge).await?)
    }

    async fn reap_expired_leases(&self, scope: Scope, limit: u32) -> Result<Vec<Reaped>, store::Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let rows: Vec<ReapRow> = sqlx::query_as(queries::REAP)
            .bind(self.offset())
            .bind(i64::from(limit))
            .bind(scope_runs(&scope))
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        if rows.is_empty() {
            // Nothing written; ending read-only work is cheap either way.
            tx.rollback().await.map_err(store_error)?;
            return Ok(Vec::new());
        }
        // A cancel-requested run gets reap_lease then cancel_ready, in this
        // transaction, and no dispatch
        // (docs/design/leases-and-fencing.md#the-reaper).
        let to_cancel: Vec<i64> = rows
            .iter()
            .filter(|r| r.cancel_requested && r.state == TaskRunState::Ready.as_str())
            .map(|r| r.id)
            .collect();
        let cancelled: Vec<i64> = if to_cancel.is_empty() {
            Vec::new()
        } else {
            sqlx::query_scalar(queries::REAP_CANCEL)
                .bind(self.offset())
                .bind(&to_cancel)
                .fetch_all(&mut *tx)
                .await
                .map_err(store_error)?
        };
        let dispatched = rows.first().is_some_and(|r| r.dispatched > 0);
        let failed_for_good = rows.iter().any(|r| r.state != TaskRunState::Ready.as_str());
        tx.commit().await.map_err(store_error)?;
        self.announce(&[
            (Topic::Publisher, dispatched),
            (Topic::Scheduler, failed_for_good || !cancelled.is_empty()),
        ])
        .await;
        rows.into_iter()
            .map(|r| {
                let state: TaskRunState = parse_name(&r.state, "task_run.state")?;
                Ok(Reaped {
                    task_run_id: TaskRunId(r.id),
                    run_id: RunId(r.run_id),
                    task_key: r.task_key,
                    transition: if state == TaskRunState::Ready {
                        TaskTransition::ReapLease
                    } else {
                        TaskTransition::ReapLeaseFinal
                    },
                    cancelled: cancelled.contains(&r.id),
                    attempt: u32::try_from(r.lost_attempt).unwrap_or(u32::MAX),
                    token: r.lost_token,
                    task_type: r.task_type,
                    compensate_for: r.compensate_for,
                    error: r.error,
                })
            })
            .collect()
    }

    async fn runs_with_work(&self, scope: Scope, limit: u32) -> Result<Vec<RunId>, store::Error> {
        let ids: Vec<Uuid> = sqlx::query_scalar(queries::RUNS_WITH_WORK)
            .bind(self.offset())
            .bind(i64::from(limit))
            .bind(scope_runs(&scope))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(ids.into_iter().map(RunId).collect())
    }

    async fn next_deadline(&self, scope: Scope) -> Result<Option<Duration>, store::Error> {
        let seconds: Option<f64> = sqlx::query_scalar(queries::NEXT_DEADLINE)
            .bind(self.offset())
            .bind(scope_runs(&scope))
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(seconds.map(|s| {
            if s.is_finite() && s > 0.0 {
                Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
            } else {
                Duration::ZERO
            }
        }))
    }

    async fn begin_pass(&self, run: RunId) -> Result<Option<PgRunPass>, store::Error> {
        PgRunPass::begin(self.clone(), run).await
    }

    async fn get_run(&self, run: RunId) -> Result<Option<RunDetail>, store::Error> {
        // One snapshot for the run, its task runs and its history, so a
        // report never mixes two moments.
        let mut tx = self
            .inner
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(store_error)?;
        let Some(detail) = sqlx::query_as::<_, DetailRow>(queries::GET_RUN)
            .bind(run.0)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?
        else {
            return Ok(None);
        };
        let tasks: Vec<TaskRunRow> = sqlx::query_as(queries::GET_RUN_TASKS)
            .bind(run.0)
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        let events: Vec<EventRow> = sqlx::query_as(queries::RUN_EVENTS)
            .bind(run.0)
            .bind(0_i64)
            .bind(None::<i64>)
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        let waits: Vec<WaitRow> = sqlx::query_as(queries::WAITS)
            .bind(run.0)
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        let mut tasks: Vec<TaskRunView> = tasks.into_iter().map(TaskRunRow::into_view).collect::<Result<_, _>>()?;
        let waits: Vec<Wait> = waits.into_iter().map(WaitRow::into_wait).collect::<Result<_, _>>()?;
        store::mark_blocked(&mut tasks, &waits);
        Ok(Some(RunDetail {
            summary: detail.summary.into_summary()?,
            fingerprint: detail.fingerprint,
            input: detail.input,
            tasks,
            events: events.into_iter().map(EventRow::into_view).collect::<Result<_, _>>()?,
        }))
    }

    async fn list_runs(&self, limit: u32) -> Result<Vec<RunSummary>, store::Error> {
        let rows: Vec<SummaryRow> = sqlx::query_as(queries::LIST_RUNS)
            .bind(i64::from(limit))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(SummaryRow::into_summary).collect()
    }

    async fn start_run_keyed(
        &self,
        workflow: WorkflowId,
        input: Value,
        options: &StartOptions,
        key: &IdempotencyKey,
    ) -> Result<KeyedStart, store::Error> {
        limits::refuse_nul(ValueKind::RunInput, &input)?;
        let id = Uuid::now_v7();
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let recorded: Option<Uuid> = sqlx::query_scalar(queries::RECORD_KEY)
            .bind(self.offset())
            .bind(&key.key)
            .bind(&key.request_hash)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?;
        if recorded.is_none() {
            // The key's first call has committed (the insert waited for
            // it); this statement's fresh snapshot sees its row.
            let found = self.keyed_run(&mut *tx, key).await?;
            tx.rollback().await.map_err(store_error)?;
            return found
                .ok_or_else(|| store::Error::Other(format!("idempotency key '{}' is taken but not found", key.key)));
        }
        let (run, owed) = match self.create_run(&mut *tx, id, workflow, &input, options).await {
            Ok(created) => created,
            Err(e) => {
                // Now, not on the connection's next use: a call waiting on
                // this key goes on as soon as it is free again.
                let _ = tx.rollback().await;
                return Err(e);
            }
        };
        tx.commit().await.map_err(store_error)?;
        self.announce(&owed).await;
        Ok(KeyedStart::Started(run))
    }

    async fn list_runs_page(&self, query: &RunQuery) -> Result<Vec<RunSummary>, store::Error> {
        let states: Vec<&str> = query.states.iter().map(|s| s.as_str()).collect();
        let rows: Vec<SummaryRow> = sqlx::query_as(queries::LIST_RUNS_PAGE)
            .bind(query.after.map(|c| c.created_at))
            .bind(query.after.map(|c| c.id.0))
            .bind((!states.is_empty()).then_some(states))
            .bind((!query.workflows.is_empty()).then_some(&query.workflows))
            .bind(query.created_after)
            .bind(query.created_before)
            .bind(i64::from(query.limit))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(SummaryRow::into_summary).collect()
    }

    async fn run_summary(&self, run: RunId) -> Result<Option<RunSummary>, store::Error> {
        let row: Option<SummaryRow> = sqlx::query_as(queries::RUN_SUMMARY)
            .bind(run.0)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(store_error)?;
        row.map(SummaryRow::into_summary).transpose()
    }

    async fn run_events(&self, run: RunId, after: u64, limit: u32) -> Result<Vec<EventView>, store::Error> {
        let rows: Vec<EventRow> = sqlx::query_as(queries::RUN_EVENTS)
            .bind(run.0)
            .bind(i64::try_from(after).unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(EventRow::into_view).collect()
    }

    async fn gauges(&self) -> Result<Gauges, store::Error> {
        let (ready, running, outbox_unpublished, active_runs): (i64, i64, i64, i64) = sqlx::query_as(queries::GAUGES)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(Gauges {
            ready: to_u64(ready, "ready task runs")?,
            running: to_u64(running, "running task runs")?,
            outbox_unpublished: to_u64(outbox_unpublished, "unpublished outbox rows")?,
            active_runs: to_u64(active_runs, "active runs")?,
        })
    }

    async fn ready(&self) -> Result<(), store::Error> {
        // What `connect` checks: the server answers and the schema is this binary's.
        self.check_migrations().await
    }

    async fn notifier(&self) -> Result<PgNotifier, store::Error> {
        self.inner.hub.ensure_listening().await?;
        Ok(PgNotifier::new(std::sync::Arc::clone(&self.inner.hub)))
    }
}

/// The rows a finish returned to its caller (JSON). The finish has
/// committed, so rows that cannot be read are not its error: held ones are
/// left to the sweep, which takes them once their hold is over; pushed
/// ones to the next publisher's re-arm.
fn held_dispatches(rows: Option<&str>) -> Vec<Dispatch> {
    let Some(rows) = rows else {
        return Vec::new();
    };
    match serde_json::from_str::<Vec<OutboxRow>>(rows)
        .map_err(|e| corrupt(format!("outbox: held rows: {e}")))
        .and_then(|rows| rows.into_iter().map(OutboxRow::into_dispatch).collect())
    {
        Ok(held) => held,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the dispatches a finish handed back; the sweep publishes held ones after their hold, \
                 the next publisher's start re-arms pushed ones");
            Vec::new()
        }
    }
}
