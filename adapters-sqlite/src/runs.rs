//! Runs and task runs: the transition protocol
//! (docs/design/state-machines.md#transition-protocol) over SQLite.
//!
//! Every transition is one conditional UPDATE (`WHERE id = ? AND state = ?`
//! and, for lease-spending edges, `AND fencing_token = ?`) with `RETURNING`,
//! and its event row is written by the next statement of the same call only
//! when the UPDATE matched (`changes() = 1`): SQLite has no data-modifying
//! CTEs, so the pair is two statements under one write lock, sent as one
//! call from `BEGIN IMMEDIATE` to `COMMIT`.

use std::sync::Arc;
use std::time::Duration;

use flowforge_domain::concurrency::Gate;
use flowforge_domain::limits::{self, Refusal, ValueKind};
use flowforge_domain::plan::Handoff;
use flowforge_domain::retry::Reset;
use flowforge_domain::{Priority, RunState, TaskRunState, TaskTransition, initial_task_run_state};
use flowforge_ports::store::resolve_generic_transition;
use flowforge_ports::store::{
    FinishCall, Finished, Gauges, Handover, IdempotencyKey, KeyedStart, NewRun, NextClaim, RunQuery, StartOptions,
};
use flowforge_ports::{
    CancelOutcome, Claim, Dispatch, EventView, FinishResult, LeaseStatus, Reaped, RunDetail, RunId, RunStore,
    RunSummary, Scope, TaskInputs, TaskOutcome, TaskRunId, Topic, TransitionError, WorkerId, WorkflowId, store,
};
use serde_json::{Map, Value};
use sqlx::Row;

use crate::error::{is_unique_violation, store_error};
use crate::group::Write;
use crate::notify::SqliteNotifier;
use crate::outbox::OutboxRow;
use crate::pass::SqlitePass;
use crate::queries;
use crate::rows::{EventRow, SummaryRow, TaskRunRow, WaitRow};
use crate::rows::{col, decode, duration_ms, json, name, run_id, run_key, scope_key, time, u32_of, u64_of};
use crate::store::{Failure, Query, SqliteStore, StartTask, lock, padded, sql, tagged};

/// The rows a call returned as one JSON array under `tag` (see `GET_RUN`).
fn aggregated<T: serde::de::DeserializeOwned>(
    rows: &[sqlx::sqlite::SqliteRow],
    tag: i64,
    what: &str,
) -> Result<Vec<T>, store::Error> {
    let Some(row) = tagged(rows, tag).next() else {
        return Ok(Vec::new());
    };
    let text: String = row.try_get("rows").map_err(store_error)?;
    serde_json::from_str(&text).map_err(|e| store::Error::Other(format!("cannot read the stored {what}: {e}")))
}

/// A renewal's answer: the row's cancel flag when the token held the lease.
fn lease_status(rows: &[sqlx::sqlite::SqliteRow]) -> Result<LeaseStatus, store::Error> {
    Ok(match rows.first() {
        Some(row) => LeaseStatus::Held {
            cancel_requested: col(row, 0)?,
        },
        None => LeaseStatus::Lost,
    })
}

#[derive(Debug, sqlx::FromRow)]
struct ClaimRow {
    run_id: String,
    task_key: String,
    compensate_for: Option<String>,
    attempt: i64,
    attempt_base: i64,
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
    task_type: String,
    compensate_for: Option<String>,
}

/// A run start whose call is on its way: what [`SqliteStore::started`]
/// needs once it returns.
#[derive(Debug)]
pub(crate) struct Starting {
    pub(crate) run: RunId,
    input: String,
    first_pass: bool,
}

/// Definitions whose start rows are kept at most; past it the cache
/// starts over (each entry is a few bytes per task).
const START_TASKS_KEPT: usize = 1024;

impl SqliteStore {
    /// start_run's work, shared by start_run_keyed: the run, its task runs
    /// and their dispatches in one call, with `key` recorded beside them
    /// when given. `None`: the key was already recorded (nothing written).
    async fn create_run(
        &self,
        workflow: WorkflowId,
        input: Value,
        options: &StartOptions,
        key: Option<&IdempotencyKey>,
    ) -> Result<Option<NewRun>, store::Error> {
        let text = if key.is_some() {
            queries::START_RUN_KEYED
        } else {
            queries::START_RUN
        };
        let (mut query, start) = self.start_call(text, workflow, input, options).await?;
        if let Some(k) = key {
            query = query.bind(k.key.clone()).bind(k.request_hash.clone());
        }
        let called = self.inner.write().await?.call_sqlx(padded(query)).await;
        match called {
            Ok(rows) => self.started(&start, &rows).map(Some),
            // The key's row is the only one the call could find taken.
            Err(Failure::Sqlx(e)) if key.is_some() && is_unique_violation(&e) => Ok(None),
            Err(e) => Err(e.into_store()),
        }
    }

    /// A call of `text`, a statement built around `start_writes!`, with
    /// start_run's values bound as `?1` to `?7`; the caller binds its own
    /// from `?8` on and pads it.
    pub(crate) async fn start_call(
        &self,
        text: &'static str,
        workflow: WorkflowId,
        input: Value,
        options: &StartOptions,
    ) -> Result<(Query, Starting), store::Error> {
        let priority = options.priority;
        // SQLite could keep it, PostgreSQL cannot: both refuse it, so the
        // two modes agree (docs/design/data-flow.md#limits).
        limits::refuse_nul(ValueKind::RunInput, &input)?;
        let run = RunId(uuid::Uuid::now_v7());
        let run_text = run_key(run);
        let input =
            serde_json::to_string(&input).map_err(|e| store::Error::Other(format!("cannot encode input: {e}")))?;
        let tasks = self.start_tasks(workflow).await?;
        let run_gated = options.gates.iter().any(|g| g.task.is_none());
        let mut rows = Vec::with_capacity(tasks.len());
        let mut first_pass = !options.gates.is_empty();
        for StartTask {
            key: task,
            deps,
            priority: own,
            conditional,
        } in tasks.iter()
        {
            let mut deps = *deps;
            // A conditional task waits on one hold more, which the
            // scheduler lowers once it has decided it; one without
            // dependencies is decided by the run's first pass
            // (docs/design/conditions.md#deciding).
            if *conditional {
                first_pass |= deps == 0;
                deps += 1;
            }
            // A gate counts as one more dependency of what it holds back
            // (docs/design/concurrency.md#gates).
            if deps == 0 && run_gated {
                deps += 1;
            }
            if options.gates.iter().any(|g| g.task.as_deref() == Some(task.as_str())) {
                deps += 1;
            }
            let task_priority = match *own {
                Some(p) => Priority::new(p).map_err(|e| store::Error::Corrupt(format!("task '{task}': {e}")))?,
                None => priority,
            };
            let count = usize::try_from(deps).map_err(|_| {
                store::Error::Corrupt(format!("task '{task}' of workflow {workflow} has {deps} dependencies"))
            })?;
            rows.push(serde_json::json!({
                "k": task,
                "s": initial_task_run_state(count).as_str(),
                "d": deps,
                "p": task_priority.get(),
            }));
        }
        let rows = serde_json::to_string(&rows).map_err(|e| store::Error::Other(e.to_string()))?;
        let gates = serde_json::to_string(&options.gates)
            .map_err(|e| store::Error::Other(format!("cannot encode the gates: {e}")))?;
        let query = sql(text)
            .bind(self.inner.offset())
            .bind(run_text)
            .bind(workflow.0)
            .bind(input.clone())
            .bind(rows)
            .bind(i64::from(priority.get()))
            .bind(gates);
        Ok((query, Starting { run, input, first_pass }))
    }

    /// The run a start call created, from the rows it returned: its
    /// `created_at`, then one row per dispatch. Wakes who must know.
    pub(crate) fn started(&self, start: &Starting, rows: &[sqlx::sqlite::SqliteRow]) -> Result<NewRun, store::Error> {
        let run = start.run;
        let Some((created, dispatched)) = rows.split_first() else {
            return Err(store::Error::Other(format!("starting run {run} returned no row")));
        };
        let created_at = time("workflow_run.created_at", col(created, 0)?)?;
        lock(&self.inner.inputs).input(run, &start.input);
        if !dispatched.is_empty() {
            self.inner.wakeups.wake(Topic::Publisher);
        }
        if start.first_pass {
            self.inner.wakeups.wake(Topic::Scheduler);
        }
        Ok(NewRun { id: run, created_at })
    }

    /// The forward tasks a start of `workflow` creates, in position order:
    /// read once per definition, then from memory.
    async fn start_tasks(&self, workflow: WorkflowId) -> Result<Arc<[StartTask]>, store::Error> {
        if let Some(tasks) = lock(&self.inner.start_tasks).get(&workflow) {
            return Ok(Arc::clone(tasks));
        }
        let mut reader = self.inner.read().await?;
        let rows = reader.call(sql(queries::START_TASKS).bind(workflow.0)).await?;
        if rows.is_empty() {
            let exists = reader.call(sql(queries::WORKFLOW_EXISTS).bind(workflow.0)).await?;
            return Err(if exists.is_empty() {
                store::Error::Other(format!("workflow definition id {workflow} not found"))
            } else {
                store::Error::Corrupt(format!("workflow {workflow} has no forward task rows"))
            });
        }
        drop(reader);
        let tasks: Arc<[StartTask]> = rows
            .iter()
            .map(|row| {
                Ok(StartTask {
                    key: col(row, 0)?,
                    deps: col(row, 1)?,
                    priority: col(row, 2)?,
                    conditional: col(row, 3)?,
                })
            })
            .collect::<Result<_, store::Error>>()?;
        let mut cache = lock(&self.inner.start_tasks);
        if cache.len() >= START_TASKS_KEPT {
            cache.clear();
        }
        cache.insert(workflow, Arc::clone(&tasks));
        Ok(tasks)
    }

    /// The run a key started, as start_run_keyed answers for it.
    async fn keyed_run(&self, key: &IdempotencyKey) -> Result<Option<KeyedStart>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(queries::KEYED_RUN).bind(key.key.clone()))
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let hash: String = col(row, 0)?;
        let run = run_id(&col::<String>(row, 1)?)?;
        Ok(Some(if hash == key.request_hash {
            KeyedStart::Replayed(run)
        } else {
            KeyedStart::Reused(run)
        }))
    }

    /// finish_and_hand_off, and with `next` finish_and_claim: a success
    /// handing on is [`Self::finish_handing_off`]'s one call, which with
    /// `next` claims it too; any other outcome is [`Self::finish`]'s one
    /// call, claiming nothing (`None`: the caller claims apart).
    async fn finish_with(
        &self,
        call: FinishCall<'_>,
        next: Option<NextClaim>,
    ) -> Result<(Finished, Option<Result<Option<Claim>, store::Error>>), store::Error> {
        let call = FinishCall {
            outcome: call.outcome.storable(),
            ..call
        };
        if let TaskOutcome::Succeeded { output } = &call.outcome
            && !call.handoff.is_empty()
        {
            return self.finish_handing_off(&call, output, next).await;
        }
        let finished = Finished {
            result: self.finish(call.id, call.token, call.worker, call.outcome).await?,
            held: Vec::new(),
            queued: false,
        };
        Ok((finished, None))
    }

    /// A success handed on (docs/design/scheduler.md#handoff), in one
    /// call: the finish of `call` with its storable `output`, then, in its
    /// transaction and only when it was recorded, the promotion of the
    /// dependents it alone held back and, when that is all a pass would
    /// do, the lowering of its joins (docs/design/scheduler.md#joins).
    /// With `next`, the same call and transaction then claims that task
    /// run for the same worker
    /// (docs/design/leases-and-fencing.md#finish-and-claim-next), and
    /// `Some` of the claim's answer comes back.
    async fn finish_handing_off(
        &self,
        call: &FinishCall<'_>,
        output: &Value,
        next: Option<NextClaim>,
    ) -> Result<(Finished, Option<Result<Option<Claim>, store::Error>>), store::Error> {
        let (id, token, handoff, handover) = (call.id, call.token, call.handoff, call.handover);
        let offset = self.inner.offset();
        let output =
            serde_json::to_string(output).map_err(|e| store::Error::Other(format!("cannot encode output: {e}")))?;
        let names = |keys: &[String]| serde_json::to_string(keys).map_err(|e| store::Error::Other(e.to_string()));
        let (dependents, joins) = (names(&handoff.dependents)?, names(&handoff.joins)?);
        let (worker, stored, whole) = (call.worker.0.clone(), output.clone(), handoff.whole);
        let hold = match handover {
            Handover::Held(hold) => Some(duration_ms(hold)),
            Handover::Sweep | Handover::Pushed => None,
        };
        let text = match next {
            Some(_) => queries::FINISH_HANDING_OFF_THEN_CLAIM,
            None => queries::FINISH_HANDING_OFF,
        };
        let moved = self
            .inner
            .grouped(Write::new(text, move |q| {
                let q = q
                    .bind(offset)
                    .bind(id.0)
                    .bind(token)
                    .bind(worker.clone())
                    .bind(stored.clone())
                    .bind(dependents.clone())
                    .bind(whole)
                    .bind(hold)
                    .bind(handover == Handover::Pushed)
                    .bind(joins.clone());
                match next {
                    Some(next) => q.bind(next.id.0).bind(next.token).bind(duration_ms(next.lease)),
                    None => q,
                }
            }))
            .await?;
        // The claim's answer is its own: a row it cannot read fails the
        // claim, not the finish the same transaction committed.
        let claimed = next.map(|next| {
            tagged(&moved, 7)
                .next()
                .map(|row| self.claimed(next.id, row))
                .transpose()
        });
        let Some(row) = tagged(&moved, 0).next() else {
            // Stale: nothing was handed on; the audit is kept.
            let finished = Finished {
                result: FinishResult::Stale,
                held: Vec::new(),
                queued: false,
            };
            return Ok((finished, claimed));
        };
        let run: String = col(row, 1)?;
        let key: String = col(row, 2)?;
        lock(&self.inner.inputs).output(run_id(&run)?, &key, id.0, &output);
        let promoted = tagged(&moved, 3).count();
        if promoted > 0 && handover == Handover::Sweep {
            self.inner.wakeups.wake(Topic::Publisher);
        }
        if tagged(&moved, 6).next().is_some() {
            self.inner.wakeups.wake(Topic::Scheduler);
        }
        let queued = match tagged(&moved, 5).next() {
            Some(row) => col::<bool>(row, 1).unwrap_or(false),
            None => false,
        };
        let finished = Finished {
            result: FinishResult::Recorded(TaskRunState::Succeeded),
            held: match handover {
                Handover::Sweep => Vec::new(),
                Handover::Held(_) | Handover::Pushed => held_dispatches(&moved),
            },
            queued,
        };
        Ok((finished, claimed))
    }

    /// The claim of task run `id` from its claim's returned row, waking
    /// the scheduler when the claim flagged the run.
    fn claimed(&self, id: TaskRunId, row: &sqlx::sqlite::SqliteRow) -> Result<Claim, store::Error> {
        let row: ClaimRow = decode(row)?;
        if row.needs_pass {
            self.inner.wakeups.wake(Topic::Scheduler);
        }
        Ok(Claim {
            task_run_id: id,
            run_id: run_id(&row.run_id)?,
            workflow_id: WorkflowId(row.workflow_id),
            task_key: row.task_key,
            compensate_for: row.compensate_for,
            attempt: u32_of("task_run.attempt", row.attempt)?,
            attempt_base: u32_of("task_run.attempt_base", row.attempt_base)?,
            token: row.fencing_token,
            lease_expires_at: time("task_run.lease_expires_at", row.lease_expires_at)?,
        })
    }

    /// A finish that hands nothing on: one call, one transaction. The
    /// outcome is already storable.
    async fn finish(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        outcome: TaskOutcome,
    ) -> Result<FinishResult, store::Error> {
        let offset = self.inner.offset();
        let worker = worker.0.clone();
        let write = move |text: &'static str, values: Option<(String, Option<i64>)>| {
            Write::new(text, move |q| {
                let q = q.bind(offset).bind(id.0).bind(token).bind(worker.clone());
                match &values {
                    Some((value, delay)) => q.bind(value.clone()).bind(*delay),
                    None => q,
                }
            })
        };
        let mut stored = None;
        let (write, rests_in) = match outcome {
            TaskOutcome::Succeeded { output } => {
                let output = serde_json::to_string(&output)
                    .map_err(|e| store::Error::Other(format!("cannot encode output: {e}")))?;
                stored = Some(output.clone());
                (
                    write(queries::FINISH_SUCCEEDED, Some((output, None))),
                    TaskRunState::Succeeded,
                )
            }
            TaskOutcome::Failed { error, retry_in: None } => {
                (write(queries::FINISH_FAILED, Some((error, None))), TaskRunState::Failed)
            }
            TaskOutcome::Failed {
                error,
                retry_in: Some(delay),
            } => (
                write(queries::FINISH_RETRY, Some((error, Some(duration_ms(delay))))),
                TaskRunState::Retrying,
            ),
            TaskOutcome::Cancelled => (write(queries::FINISH_CANCELLED, None), TaskRunState::Cancelled),
        };
        let rows = self.inner.grouped(write).await?;
        if let (Some(output), Some(row)) = (stored, rows.first()) {
            // Succeeded is terminal: this is the output every later read finds.
            let run = run_id(&col::<String>(row, 1)?)?;
            lock(&self.inner.inputs).output(run, &col::<String>(row, 2)?, id.0, &output);
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
}

impl RunStore for SqliteStore {
    type Pass = SqlitePass;
    type Notifier = SqliteNotifier;

    async fn start_run_with(
        &self,
        workflow: WorkflowId,
        input: Value,
        options: &StartOptions,
    ) -> Result<NewRun, store::Error> {
        // Without a key there is no key to find taken: always a run.
        self.create_run(workflow, input, options, None)
            .await?
            .ok_or_else(|| store::Error::Other("start_run found a key it was not given".into()))
    }

    async fn request_cancel(&self, run: RunId) -> Result<Option<CancelOutcome>, store::Error> {
        let key = run_key(run);
        let offset = self.inner.offset();
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(sql(queries::REQUEST_CANCEL).bind(offset).bind(&key)))
            .await?;
        // The UPDATE applied exactly when the run read here was pending or
        // running without a request.
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state: String = col(row, 0)?;
        let requested: bool = col(row, 1)?;
        let state: RunState = name("workflow_run.state", &state)?;
        if state.is_terminal() {
            return Ok(Some(CancelOutcome::AlreadyFinished(state)));
        }
        if requested {
            return Ok(Some(CancelOutcome::AlreadyRequested));
        }
        self.inner.wakeups.wake(Topic::Scheduler);
        Ok(Some(CancelOutcome::Requested))
    }

    async fn resume_run(
        &self,
        run: RunId,
        state: RunState,
        generation: u32,
        resets: &[Reset],
        gates: &[Gate],
    ) -> Result<Option<u32>, store::Error> {
        let key = run_key(run);
        let gates =
            serde_json::to_string(gates).map_err(|e| store::Error::Other(format!("cannot encode the gates: {e}")))?;
        let plan: Vec<Value> = resets
            .iter()
            .map(|r| serde_json::json!({"k": r.key, "f": r.from.as_str(), "t": r.to.as_str(), "d": r.pending_deps}))
            .collect();
        let plan = serde_json::to_string(&plan).map_err(|e| store::Error::Other(e.to_string()))?;
        let offset = self.inner.offset();
        let mut conn = self.inner.write().await?;
        let rows = conn
            .open_call(padded(
                sql(queries::RESUME_RUN)
                    .bind(offset)
                    .bind(key.clone())
                    .bind(state.as_str())
                    .bind(i64::from(generation))
                    .bind(gates.clone()),
            ))
            .await?;
        let Some(row) = rows.first() else {
            conn.rollback().await?;
            return Ok(None);
        };
        let next: i64 = col(row, 0)?;
        let rows = conn
            .open_call(padded(
                sql(queries::RESET_TASKS)
                    .bind(offset)
                    .bind(key)
                    .bind(plan)
                    .bind(next)
                    .bind(state.as_str())
                    .bind(gates),
            ))
            .await?;
        let reset: i64 = match rows.last() {
            Some(row) => col(row, 0)?,
            None => 0,
        };
        if usize::try_from(reset).ok() != Some(resets.len()) {
            // A task moved since the plan was read: apply nothing.
            conn.rollback().await?;
            return Ok(None);
        }
        conn.call(sql("COMMIT")).await?;
        drop(conn);
        self.inner.wakeups.wake(Topic::Publisher);
        self.inner.wakeups.wake(Topic::Scheduler);
        Ok(Some(u32_of("workflow_run.generation", next)?))
    }

    async fn claim_task_run(
        &self,
        id: TaskRunId,
        token: i64,
        worker: &WorkerId,
        lease: Duration,
    ) -> Result<Option<Claim>, store::Error> {
        let offset = self.inner.offset();
        // `started_at IS NULL` in SET reads the old row: the first start of
        // a task while its run is still pending flags the run's pass, which
        // moves the run to running.
        let (worker, lease) = (worker.0.clone(), duration_ms(lease));
        let rows = self
            .inner
            .grouped(Write::new(queries::CLAIM, move |q| {
                q.bind(offset).bind(id.0).bind(token).bind(worker.clone()).bind(lease)
            }))
            .await?;
        rows.first().map(|row| self.claimed(id, row)).transpose()
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
        let types = serde_json::to_string(task_types).map_err(|e| store::Error::Other(e.to_string()))?;
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::READY_OF_TYPES)
                    .bind(types)
                    .bind(i64::from(max))
                    .bind(i64::try_from(aging.as_millis()).unwrap_or(i64::MAX)),
            )
            .await?;
        // Each candidate is claimed at the token it was read at: one that
        // a dispatch or another poller took meanwhile no longer matches
        // and is skipped, as the claim's conditional UPDATE decides.
        let mut claims = Vec::with_capacity(rows.len());
        for row in &rows {
            let id = TaskRunId(col(row, 0)?);
            if let Some(claim) = self.claim_task_run(id, col(row, 1)?, worker, lease).await? {
                claims.push(claim);
            }
        }
        Ok(claims)
    }

    async fn dispatch_is_current(&self, id: TaskRunId, token: i64) -> Result<bool, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(queries::DISPATCH_IS_CURRENT).bind(id.0).bind(token))
            .await?;
        match rows.first() {
            Some(row) => col(row, 0),
            None => Ok(false),
        }
    }

    async fn report_progress(
        &self,
        id: TaskRunId,
        token: i64,
        progress: &Value,
        lease: Duration,
    ) -> Result<LeaseStatus, store::Error> {
        limits::refuse_nul(ValueKind::TaskProgress, progress)?;
        let offset = self.inner.offset();
        let text = progress.to_string();
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(
                sql(queries::REPORT_PROGRESS)
                    .bind(offset)
                    .bind(id.0)
                    .bind(token)
                    .bind(duration_ms(lease))
                    .bind(text),
            ))
            .await?;
        lease_status(&rows)
    }

    async fn task_inputs(&self, run: RunId, keys: &[String], limit: usize) -> Result<TaskInputs, store::Error> {
        let too_large = |bytes: usize| {
            store::Error::from(Refusal::TooLarge {
                kind: ValueKind::TaskInputs,
                bytes,
                limit,
            })
        };
        let cached = lock(&self.inner.inputs).get(run, keys);
        if let Some((input, outputs)) = cached {
            let bytes: usize = outputs.iter().map(|(_, text)| text.len()).sum();
            if bytes > limit {
                return Err(too_large(bytes));
            }
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
        let wanted = serde_json::to_string(keys).map_err(|e| store::Error::Other(e.to_string()))?;
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::TASK_INPUTS)
                    .bind(&key)
                    .bind(&wanted)
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX)),
            )
            .await?;
        let mut input = None;
        let mut map = Map::new();
        let mut cache = lock(&self.inner.inputs);
        for row in &rows {
            match col::<i64>(row, 0)? {
                0 => {
                    let value: String = col(row, 1)?;
                    input = Some(json("workflow_run.input", &value)?);
                    cache.input(run, &value);
                }
                2 => {
                    let bytes = usize::try_from(col::<i64>(row, 3)?).unwrap_or(usize::MAX);
                    if bytes > limit {
                        return Err(too_large(bytes));
                    }
                }
                _ => {
                    let value: String = col(row, 1)?;
                    let task: String = col(row, 2)?;
                    cache.output(run, &task, col(row, 3)?, &value);
                    map.insert(task, json("task_run.result", &value)?);
                }
            }
        }
        drop(cache);
        let Some(run_input) = input else {
            return Err(store::Error::Other(format!("run {run} not found")));
        };
        Ok(TaskInputs {
            run_input,
            outputs: map,
        })
    }

    async fn renew_lease(&self, id: TaskRunId, token: i64, lease: Duration) -> Result<LeaseStatus, store::Error> {
        let offset = self.inner.offset();
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(
                sql(queries::RENEW_LEASE)
                    .bind(offset)
                    .bind(id.0)
                    .bind(token)
                    .bind(duration_ms(lease)),
            ))
            .await?;
        lease_status(&rows)
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
        let call = FinishCall {
            id,
            token,
            worker,
            outcome,
            handoff,
            handover,
        };
        Ok(self.finish_with(call, None).await?.0)
    }

    async fn finish_and_claim(
        &self,
        finish: FinishCall<'_>,
        next: NextClaim,
    ) -> Result<(Finished, Result<Option<Claim>, store::Error>), store::Error> {
        let worker = finish.worker;
        // The hot path (a success handing on) is one call; other outcomes
        // are rarer, and claim in a second.
        let (finished, claimed) = self.finish_with(finish, Some(next)).await?;
        let claimed = match claimed {
            Some(claimed) => claimed,
            None => self.claim_task_run(next.id, next.token, worker, next.lease).await,
        };
        Ok((finished, claimed))
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
            TaskTransition::DependenciesSatisfied => (queries::GENERIC_SATISFIED, true),
            TaskTransition::RetryReady => (queries::GENERIC_RETRY_READY, true),
            TaskTransition::CancelPending | TaskTransition::CancelReady | TaskTransition::CancelRetrying => {
                (queries::GENERIC_CANCEL, false)
            }
            other => {
                return Err(TransitionError::Store(store::Error::Other(format!(
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

    async fn reap_expired_leases(&self, scope: Scope, limit: u32) -> Result<Vec<Reaped>, store::Error> {
        // Read first, off the writer: almost always nothing has expired,
        // and then the reaper costs one read and never takes the write lock.
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::EXPIRED_LEASES)
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
        let batch = serde_json::to_string(&batch).map_err(|e| store::Error::Other(e.to_string()))?;
        const FINAL: &str = "lease expired on the final attempt";
        let offset = self.inner.offset();
        // Each row is re-checked under the write lock
        // (docs/design/leases-and-fencing.md#the-reaper): a row a worker
        // finished, renewed or another reaper took meanwhile is left alone.
        let done = self
            .inner
            .write()
            .await?
            .call(padded(sql(queries::REAP).bind(offset).bind(batch).bind(FINAL)))
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
                task_type: row.task_type,
                compensate_for: row.compensate_for,
                error: (transition == TaskTransition::ReapLeaseFinal).then(|| FINAL.to_owned()),
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

    async fn runs_with_work(&self, scope: Scope, limit: u32) -> Result<Vec<RunId>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::RUNS_WITH_WORK)
                    .bind(self.inner.offset())
                    .bind(scope_key(&scope))
                    .bind(i64::from(limit)),
            )
            .await?;
        rows.iter()
            .map(|r| run_id(&col::<String>(r, 0)?).map_err(store::Error::from))
            .collect()
    }

    async fn next_deadline(&self, scope: Scope) -> Result<Option<Duration>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::NEXT_DEADLINE)
                    .bind(self.inner.offset())
                    .bind(scope_key(&scope)),
            )
            .await?;
        let wait: Option<i64> = match rows.first() {
            Some(row) => col(row, 0)?,
            None => None,
        };
        Ok(wait.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }

    async fn begin_pass(&self, run: RunId) -> Result<Option<SqlitePass>, store::Error> {
        SqlitePass::begin(self.inner.clone(), run).await
    }

    async fn get_run(&self, run: RunId) -> Result<Option<RunDetail>, store::Error> {
        let key = run_key(run);
        // One read transaction: a consistent snapshot of run, tasks and history.
        let rows = self
            .inner
            .read()
            .await?
            .call(padded(sql(queries::GET_RUN).bind(&key)))
            .await?;
        let Some(first) = tagged(&rows, 0).next() else {
            return Ok(None);
        };
        let summary_row: SummaryRow = decode(first)?;
        let fingerprint: String = first.try_get("fingerprint").map_err(store_error)?;
        let input: String = first.try_get("input").map_err(store_error)?;
        let mut tasks = aggregated::<TaskRunRow>(&rows, 1, "task_run")?;
        tasks.sort_by_key(|t| t.id);
        let mut tasks = tasks
            .into_iter()
            .map(|r| Ok(r.into_view()?))
            .collect::<Result<Vec<_>, store::Error>>()?;
        let waits = aggregated::<WaitRow>(&rows, 3, "concurrency waits")?
            .into_iter()
            .map(|w| Ok(w.into_wait()?))
            .collect::<Result<Vec<_>, store::Error>>()?;
        store::mark_blocked(&mut tasks, &waits);
        // Merged in SQL by `seq`, which is commit order; the sort only confirms it.
        let mut events = aggregated::<EventRow>(&rows, 2, "run history")?;
        events.sort_by_key(|e| e.seq);
        let events = events
            .into_iter()
            .map(|r| Ok(r.into_view()?))
            .collect::<Result<Vec<_>, store::Error>>()?;
        Ok(Some(RunDetail {
            summary: summary_row.into_summary()?,
            fingerprint,
            input: json("workflow_run.input", &input)?,
            tasks,
            events,
        }))
    }

    async fn list_runs(&self, limit: u32) -> Result<Vec<RunSummary>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(queries::LIST_RUNS).bind(i64::from(limit)))
            .await?;
        rows.iter()
            .map(|r| Ok(decode::<SummaryRow>(r)?.into_summary()?))
            .collect()
    }

    async fn start_run_keyed(
        &self,
        workflow: WorkflowId,
        input: Value,
        options: &StartOptions,
        key: &IdempotencyKey,
    ) -> Result<KeyedStart, store::Error> {
        // A retried request usually finds its key: answered from a reader,
        // without taking the writer.
        if let Some(found) = self.keyed_run(key).await? {
            return Ok(found);
        }
        if let Some(run) = self.create_run(workflow, input, options, Some(key)).await? {
            return Ok(KeyedStart::Started(run));
        }
        // Another call recorded the key between the read and the write; it
        // has committed, since the write that failed came after it.
        self.keyed_run(key)
            .await?
            .ok_or_else(|| store::Error::Other(format!("idempotency key '{}' is taken but not found", key.key)))
    }

    async fn list_runs_page(&self, query: &RunQuery) -> Result<Vec<RunSummary>, store::Error> {
        let list = |values: Vec<&str>| -> Result<Option<String>, store::Error> {
            if values.is_empty() {
                return Ok(None);
            }
            serde_json::to_string(&values)
                .map(Some)
                .map_err(|e| store::Error::Other(e.to_string()))
        };
        let states = list(query.states.iter().map(|s| s.as_str()).collect())?;
        let workflows = list(query.workflows.iter().map(String::as_str).collect())?;
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::LIST_RUNS_PAGE)
                    .bind(query.after.map(|c| c.created_at.timestamp_millis()))
                    .bind(query.after.map(|c| run_key(c.id)))
                    .bind(states)
                    .bind(workflows)
                    .bind(query.created_after.map(|t| t.timestamp_millis()))
                    .bind(query.created_before.map(|t| t.timestamp_millis()))
                    .bind(i64::from(query.limit)),
            )
            .await?;
        rows.iter()
            .map(|r| Ok(decode::<SummaryRow>(r)?.into_summary()?))
            .collect()
    }

    async fn run_summary(&self, run: RunId) -> Result<Option<RunSummary>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(queries::RUN_SUMMARY).bind(run_key(run)))
            .await?;
        rows.first()
            .map(|r| Ok(decode::<SummaryRow>(r)?.into_summary()?))
            .transpose()
    }

    async fn run_events(&self, run: RunId, after: u64, limit: u32) -> Result<Vec<EventView>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::RUN_EVENTS)
                    .bind(run_key(run))
                    .bind(i64::try_from(after).unwrap_or(i64::MAX))
                    .bind(i64::from(limit)),
            )
            .await?;
        rows.iter().map(|r| Ok(decode::<EventRow>(r)?.into_view()?)).collect()
    }

    async fn gauges(&self) -> Result<Gauges, store::Error> {
        let rows = self.inner.read().await?.call(sql(queries::GAUGES)).await?;
        let Some(row) = rows.first() else {
            return Err(store::Error::Other("the gauges query returned no row".into()));
        };
        let count = |i: usize, what: &'static str| -> Result<u64, store::Error> { Ok(u64_of(what, col(row, i)?)?) };
        Ok(Gauges {
            ready: count(0, "ready task runs")?,
            running: count(1, "running task runs")?,
            outbox_unpublished: count(2, "unpublished outbox rows")?,
            active_runs: count(3, "active runs")?,
        })
    }

    async fn ready(&self) -> Result<(), store::Error> {
        self.check_migrations().await
    }

    async fn notifier(&self) -> Result<SqliteNotifier, store::Error> {
        Ok(SqliteNotifier::new(self.inner.wakeups.clone()))
    }
}

/// The rows a hand-off returned to its caller (tagged 4), in id order. The
/// finish has committed, so rows that cannot be read are not its error:
/// held ones are left to the sweep, which takes them once their hold is
/// over; pushed ones to the next publisher's re-arm.
fn held_dispatches(rows: &[sqlx::sqlite::SqliteRow]) -> Vec<Dispatch> {
    let held = tagged(rows, 4)
        .map(|r| decode::<OutboxRow>(r)?.into_dispatch())
        .collect::<Result<Vec<_>, store::Error>>();
    match held {
        Ok(mut held) => {
            held.sort_by_key(|d| d.dispatch_id.0);
            held
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot read the dispatches a finish handed back; the sweep publishes held ones after their hold, \
                 the next publisher's start re-arms pushed ones");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use flowforge_domain::plan::Handoff;
    use flowforge_domain::{TaskRunState, WorkflowDefinition, WorkflowDocument};
    use flowforge_ports::store::{FinishCall, FinishResult, Handover, NextClaim};
    use flowforge_ports::{DefinitionStore, RunStore, SystemClock, TaskOutcome, WorkerId};
    use serde_json::json;

    use crate::SqliteStore;

    const LEASE: Duration = Duration::from_secs(300);

    /// A success handing on and the claim of the slot's next task take
    /// one write call (docs/design/leases-and-fencing.md#finish-and-claim-next),
    /// where a failure and its claim take two.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_success_handing_on_and_the_next_claim_take_one_write() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let url = format!("sqlite://{}", dir.path().join("ff.db").display());
        let store = SqliteStore::connect(&url, Arc::new(SystemClock))
            .await
            .expect("connect");
        let doc: WorkflowDocument = serde_json::from_value(json!({"name": "fork", "version": 1, "tasks": [
            {"key": "a", "task_type": "noop"},
            {"key": "b", "task_type": "noop"},
            {"key": "c", "task_type": "noop", "depends_on": ["a"]}
        ]}))
        .expect("a document");
        let definition = WorkflowDefinition::from_document(doc).expect("a definition");
        let published = store.publish_definition(&definition).await.expect("publish");
        let w = WorkerId("w".into());
        let handoff = Handoff {
            dependents: vec!["c".to_owned()],
            joins: Vec::new(),
            whole: true,
        };
        for (outcome, calls) in [
            (TaskOutcome::Succeeded { output: json!({}) }, 1),
            (
                TaskOutcome::Failed {
                    error: "boom".into(),
                    retry_in: None,
                },
                2,
            ),
        ] {
            let run = store.start_run(published.id, json!({})).await.expect("start");
            let tasks = store.get_run(run).await.expect("get_run").expect("the run").tasks;
            let of = |key: &str| tasks.iter().find(|t| t.key == key).expect("the task");
            let (a, b) = (of("a"), of("b"));
            let claim = store
                .claim_task_run(a.id, a.token, &w, LEASE)
                .await
                .expect("claim")
                .expect("a is ready");
            let before = store.inner.writes.load(Ordering::Relaxed);
            let call = FinishCall {
                id: claim.task_run_id,
                token: claim.token,
                worker: &w,
                outcome: outcome.clone(),
                handoff: &handoff,
                handover: Handover::Pushed,
            };
            let next = NextClaim {
                id: b.id,
                token: b.token,
                lease: LEASE,
            };
            let (finished, claimed) = store.finish_and_claim(call, next).await.expect("finish_and_claim");
            assert_eq!(
                store.inner.writes.load(Ordering::Relaxed) - before,
                calls,
                "{outcome:?}: write calls"
            );
            assert!(matches!(finished.result, FinishResult::Recorded(_)), "{outcome:?}");
            assert_eq!(claimed.expect("the claim").map(|c| c.task_key), Some("b".to_owned()));
            let succeeded = matches!(outcome, TaskOutcome::Succeeded { .. });
            assert_eq!(finished.held.len(), usize::from(succeeded), "c handed on");
            let after = store.get_run(run).await.expect("get_run").expect("the run").tasks;
            let state = |key: &str| after.iter().find(|t| t.key == key).expect("the task").state;
            assert_eq!(state("b"), TaskRunState::Running);
            if succeeded {
                assert_eq!(state("c"), TaskRunState::Ready);
            }
        }
        store.close().await;
    }
}
