//! One run's scheduler transaction (docs/design/scheduler.md#the-pass): the run
//! locked with `FOR NO KEY UPDATE SKIP LOCKED`, every change a batched conditional
//! UPDATE with its events and outbox rows, nothing visible until commit.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use flowforge_domain::derive::TaskTally;
use flowforge_domain::map::Children;
use flowforge_domain::{CancelReason, RunState, RunTransition, SkipReason, TaskRunState, TaskTransition, run_machine};
use flowforge_ports::store::{Collect, DependencyOutcomes, GateCheck, Wait};
use flowforge_ports::{Activity, LockedRun, PassTask, RunId, RunPass, Topic, WorkflowId, store};
use serde_json::Value;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use crate::error::{corrupt, store_error};
use crate::queries;
use crate::rows::{FlaggedRow, WaitRow, parse_name, to_u32};
use crate::store::PgStore;

/// The scheduler transaction of one run. Dropping it rolls back.
pub struct PgRunPass {
    store: PgStore,
    /// `None` only once committed (or while dropping).
    tx: Option<Transaction<'static, Postgres>>,
    run: LockedRun,
    /// Outbox rows were written: wake the publisher after commit.
    dispatched: bool,
    /// The run reached a terminal state: wake its waiters after commit.
    settled: bool,
    /// Slots were let go, or another run's cancel requested: wake the
    /// schedulers after commit.
    released: bool,
    /// The activity read by the last statement, while no write since can
    /// have changed it (`promote_due_retries` reads it for `activity`).
    activity: Option<Activity>,
    /// The flags `begin` took, until `take_flagged` hands them over.
    flagged: Option<Vec<PassTask>>,
}

impl Drop for PgRunPass {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            self.store.inner.rollbacks.spawn(tx);
        }
    }
}

impl fmt::Debug for PgRunPass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgRunPass")
            .field("run", &self.run)
            .field("dispatched", &self.dispatched)
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, sqlx::FromRow)]
struct LockedRow {
    run_id: Uuid,
    workflow_id: i64,
    run_state: String,
    cancel_requested: bool,
    gated: bool,
    limit_cancelled: bool,
    age_seconds: f64,
    #[sqlx(flatten, try_from = "MaybeFlagged")]
    flagged: Option<FlaggedRow>,
}

/// A flagged task run's columns, all NULL when no row was flagged.
#[derive(Debug, sqlx::FromRow)]
struct MaybeFlagged {
    id: Option<i64>,
    task_key: Option<String>,
    state: Option<String>,
    cancel_reason: Option<String>,
    compensate_for: Option<String>,
}

impl From<MaybeFlagged> for Option<FlaggedRow> {
    fn from(row: MaybeFlagged) -> Self {
        Some(FlaggedRow {
            id: row.id?,
            task_key: row.task_key?,
            state: row.state?,
            cancel_reason: row.cancel_reason,
            compensate_for: row.compensate_for,
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
struct TallyRow {
    state: String,
    cancel_reason: Option<String>,
    n: i64,
    any_started: Option<bool>,
}

impl PgRunPass {
    /// Moves those of `keys` still pending by `statement` (cancel or skip:
    /// `$1` offset, `$2` run, `$3` keys, `$4` reason), returning the keys
    /// moved.
    async fn move_pending(
        &mut self,
        statement: &'static str,
        keys: &[String],
        reason: &str,
    ) -> Result<Vec<String>, store::Error> {
        self.activity = None;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let offset = self.store.offset();
        sqlx::query_scalar(statement)
            .bind(offset)
            .bind(self.run.id.0)
            .bind(keys)
            .bind(reason)
            .fetch_all(self.conn()?)
            .await
            .map_err(store_error)
    }

    pub(crate) async fn begin(store: PgStore, run: RunId) -> Result<Option<Self>, store::Error> {
        // A pass this process dropped may still hold the run's lock.
        store.inner.rollbacks.settled().await;
        let mut tx = store.inner.pool.begin().await.map_err(store_error)?;
        // Every pass starts with take_flagged: its flags come with the lock,
        // saving a round trip on the path of every hop.
        let rows: Vec<LockedRow> = sqlx::query_as(queries::BEGIN_PASS_TAKING_FLAGS)
            .bind(run.0)
            .bind(store.offset())
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        let Some(locked) = rows.first() else {
            tx.rollback().await.map_err(store_error)?;
            return Ok(None);
        };
        let run = LockedRun {
            id: RunId(locked.run_id),
            workflow_id: WorkflowId(locked.workflow_id),
            state: parse_name::<RunState>(&locked.run_state, "workflow_run.state")?,
            cancel_requested: locked.cancel_requested,
            gated: locked.gated,
            limit_cancelled: locked.limit_cancelled,
            age: Duration::try_from_secs_f64(locked.age_seconds).unwrap_or_default(),
        };
        let flagged = rows
            .into_iter()
            .filter_map(|row| row.flagged)
            .map(FlaggedRow::into_pass_task)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Self {
            store,
            tx: Some(tx),
            run,
            dispatched: false,
            settled: false,
            released: false,
            activity: None,
            flagged: Some(flagged),
        }))
    }

    /// The pass's connection, inside its transaction.
    fn conn(&mut self) -> Result<&mut PgConnection, store::Error> {
        self.tx
            .as_deref_mut()
            .ok_or_else(|| store::Error::Other("the scheduler pass has ended".to_owned()))
    }
}

impl RunPass for PgRunPass {
    fn run(&self) -> &LockedRun {
        &self.run
    }

    async fn take_flagged(&mut self) -> Result<Vec<PassTask>, store::Error> {
        if let Some(taken) = self.flagged.take() {
            return Ok(taken);
        }
        let rows: Vec<FlaggedRow> = sqlx::query_as(queries::TAKE_FLAGGED)
            .bind(self.run.id.0)
            .fetch_all(self.conn()?)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(FlaggedRow::into_pass_task).collect()
    }

    async fn satisfy_dependencies(&mut self, done: &[(String, u32)]) -> Result<Vec<String>, store::Error> {
        self.activity = None;
        let offset = self.store.offset();
        // One UPDATE for the whole batch: a row named twice gets the sum
        // (an UPDATE … FROM would apply only one of its matches).
        let mut sums: BTreeMap<&str, i64> = BTreeMap::new();
        for (key, n) in done {
            *sums.entry(key.as_str()).or_default() += i64::from(*n);
        }
        let mut made_ready = Vec::new();
        if !sums.is_empty() {
            let keys: Vec<&str> = sums.keys().copied().collect();
            let amounts = sums
                .values()
                .map(|n| {
                    i32::try_from(*n).map_err(|_| store::Error::Other(format!("dependency count {n} is too large")))
                })
                .collect::<Result<Vec<i32>, _>>()?;
            let rows: Vec<(String, bool)> = sqlx::query_as(queries::LOWER_AND_PROMOTE)
                .bind(offset)
                .bind(self.run.id.0)
                .bind(self.run.workflow_id.0)
                .bind(&keys)
                .bind(&amounts)
                .fetch_all(self.conn()?)
                .await
                .map_err(store_error)?;
            self.dispatched |= rows.iter().any(|(_, woke)| *woke);
            made_ready.extend(rows.into_iter().map(|(key, _)| key));
        }
        // A pending row always waits on a dependency
        // (`taskrun_pending_waits_on_deps`): the lowering above made every
        // row it brought to zero ready, so no other row can be.
        Ok(made_ready)
    }

    async fn promote_due_retries(&mut self) -> Result<Vec<String>, store::Error> {
        let offset = self.store.offset();
        let not_pending = self.run.state != RunState::Pending;
        let (keys, woke, any_active, any_started): (Vec<String>, bool, bool, bool) =
            sqlx::query_as(queries::PROMOTE_RETRIES)
                .bind(offset)
                .bind(self.run.id.0)
                .bind(self.run.workflow_id.0)
                .bind(not_pending)
                .fetch_one(self.conn()?)
                .await
                .map_err(store_error)?;
        self.dispatched |= woke;
        self.activity = Some(Activity {
            any_active,
            any_started,
        });
        Ok(keys)
    }

    async fn cancel_pending(&mut self, keys: &[String], reason: CancelReason) -> Result<Vec<String>, store::Error> {
        self.move_pending(queries::CANCEL_PENDING, keys, reason.as_str()).await
    }

    async fn skip_pending(&mut self, keys: &[String], reason: SkipReason) -> Result<Vec<String>, store::Error> {
        self.move_pending(queries::SKIP_PENDING, keys, reason.as_str()).await
    }

    async fn fail_pending(&mut self, key: &str, edge: TaskTransition, error: &str) -> Result<bool, store::Error> {
        self.activity = None;
        sqlx::query_scalar(queries::FAIL_PENDING)
            .bind(self.store.offset())
            .bind(self.run.id.0)
            .bind(key)
            .bind(error)
            .bind(edge.as_str())
            .fetch_one(self.conn()?)
            .await
            .map_err(store_error)
    }

    async fn expand_map(&mut self, key: &str, size: u32) -> Result<bool, store::Error> {
        self.activity = None;
        let size = i32::try_from(size).map_err(|_| store::Error::Other(format!("map size {size} is too large")))?;
        sqlx::query_scalar(queries::EXPAND_MAP)
            .bind(self.store.offset())
            .bind(self.run.id.0)
            .bind(key)
            .bind(size)
            .fetch_one(self.conn()?)
            .await
            .map_err(store_error)
    }

    async fn map_children(&mut self, key: &str, waiting: u32) -> Result<Children, store::Error> {
        let limit = i64::from(waiting);
        let (size, succeeded, active, failed, waiting): (Option<i32>, i64, i64, Option<Value>, Vec<i32>) =
            sqlx::query_as(queries::MAP_CHILDREN)
                .bind(self.run.id.0)
                .bind(key)
                .bind(limit)
                .fetch_one(self.conn()?)
                .await
                .map_err(store_error)?;
        let count = |n: i64, what: &str| u32::try_from(n).map_err(|_| corrupt(format!("{what} {n} out of range")));
        let failed = failed
            .map(serde_json::from_value::<(i32, Option<String>)>)
            .transpose()
            .map_err(|e| corrupt(format!("run {}: a failed child of '{key}': {e}", self.run.id)))?
            .map(|(i, e)| Ok::<_, store::Error>((to_u32(i, "task_run.map_index")?, e)))
            .transpose()?;
        Ok(Children {
            size: size.map(|n| to_u32(n, "task_run.map_size")).transpose()?,
            succeeded: count(succeeded, "succeeded children")?,
            active: count(active, "active children")?,
            failed,
            waiting: waiting
                .into_iter()
                .map(|i| to_u32(i, "task_run.map_index"))
                .collect::<Result<_, _>>()?,
        })
    }

    async fn collect_map(&mut self, key: &str, limit: usize) -> Result<Collect, store::Error> {
        self.activity = None;
        let (moved, ready, bytes): (bool, bool, Option<i64>) = sqlx::query_as(queries::COLLECT_MAP)
            .bind(self.store.offset())
            .bind(self.run.id.0)
            .bind(key)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_one(self.conn()?)
            .await
            .map_err(store_error)?;
        Ok(match (moved, ready) {
            (true, _) => Collect::Collected,
            (false, true) => Collect::TooLarge(bytes.and_then(|b| u64::try_from(b).ok()).unwrap_or(u64::MAX)),
            (false, false) => Collect::NotReady,
        })
    }

    async fn pending_counts(&mut self, keys: &[String]) -> Result<Vec<(String, u32)>, store::Error> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(String, i32)> = sqlx::query_as(queries::PENDING_COUNTS)
            .bind(self.run.id.0)
            .bind(keys)
            .fetch_all(self.conn()?)
            .await
            .map_err(store_error)?;
        rows.into_iter()
            .map(|(key, n)| Ok((key, to_u32(n, "task_run.pending_deps")?)))
            .collect()
    }

    async fn dependency_outcomes(&mut self, keys: &[String]) -> Result<DependencyOutcomes, store::Error> {
        let (run_input, tasks): (Value, Value) = sqlx::query_as(queries::DEPENDENCY_OUTCOMES)
            .bind(self.run.id.0)
            .bind(keys)
            .fetch_one(self.conn()?)
            .await
            .map_err(store_error)?;
        let tasks: Vec<(String, String, Option<Value>)> = serde_json::from_value(tasks)
            .map_err(|e| corrupt(format!("run {}: dependency outcomes: {e}", self.run.id)))?;
        let tasks = tasks
            .into_iter()
            .map(|(key, state, output)| {
                let state: TaskRunState = parse_name(&state, "task_run.state")?;
                // A JSON null inside the array reads back as no value; a
                // succeeded row always has its output, null included.
                let output = output.or_else(|| (state == TaskRunState::Succeeded).then_some(Value::Null));
                Ok((key, state, output))
            })
            .collect::<Result<_, store::Error>>()?;
        Ok(DependencyOutcomes { run_input, tasks })
    }

    async fn cancel_children(&mut self, key: &str) -> Result<Vec<String>, store::Error> {
        self.activity = None;
        sqlx::query_scalar(queries::CANCEL_CHILDREN)
            .bind(self.store.offset())
            .bind(self.run.id.0)
            .bind(key)
            .fetch_all(self.conn()?)
            .await
            .map_err(store_error)
    }

    async fn cancel_waiting(&mut self) -> Result<Vec<String>, store::Error> {
        self.activity = None;
        let offset = self.store.offset();
        sqlx::query_scalar(queries::CANCEL_WAITING)
            .bind(offset)
            .bind(self.run.id.0)
            .fetch_all(self.conn()?)
            .await
            .map_err(store_error)
    }

    async fn tally(&mut self) -> Result<TaskTally, store::Error> {
        let rows: Vec<TallyRow> = sqlx::query_as(queries::TALLY)
            .bind(self.run.id.0)
            .fetch_all(self.conn()?)
            .await
            .map_err(store_error)?;
        let mut tally = TaskTally::default();
        for row in rows {
            let state: TaskRunState = parse_name(&row.state, "task_run.state")?;
            let reason = row
                .cancel_reason
                .map(|r| parse_name::<CancelReason>(&r, "task_run.cancel_reason"))
                .transpose()?;
            let count = u64::try_from(row.n).unwrap_or_default();
            tally.add_count(state, reason, count, row.any_started.unwrap_or(false));
        }
        Ok(tally)
    }

    async fn activity(&mut self) -> Result<Activity, store::Error> {
        if let Some(known) = self.activity.take() {
            return Ok(known);
        }
        let not_pending = self.run.state != RunState::Pending;
        let (any_active, any_started): (bool, bool) = sqlx::query_as(queries::ACTIVITY)
            .bind(self.run.id.0)
            .bind(not_pending)
            .fetch_one(self.conn()?)
            .await
            .map_err(store_error)?;
        Ok(Activity {
            any_active,
            any_started,
        })
    }

    async fn succeeded_keys(&mut self) -> Result<BTreeSet<String>, store::Error> {
        let keys: Vec<String> = sqlx::query_scalar(queries::SUCCEEDED_KEYS)
            .bind(self.run.id.0)
            .fetch_all(self.conn()?)
            .await
            .map_err(store_error)?;
        Ok(keys.into_iter().collect())
    }

    async fn compensator_states(&mut self) -> Result<Vec<(String, TaskRunState)>, store::Error> {
        let rows: Vec<(String, String)> = sqlx::query_as(queries::COMPENSATOR_STATES)
            .bind(self.run.id.0)
            .fetch_all(self.conn()?)
            .await
            .map_err(store_error)?;
        rows.into_iter()
            .map(|(key, state)| Ok((key, parse_name(&state, "task_run.state")?)))
            .collect()
    }

    async fn create_compensator(&mut self, key: &str, compensate_for: &str) -> Result<bool, store::Error> {
        self.activity = None;
        let offset = self.store.offset();
        let (known, created, woke): (bool, bool, bool) = sqlx::query_as(queries::CREATE_COMPENSATOR)
            .bind(offset)
            .bind(self.run.id.0)
            .bind(self.run.workflow_id.0)
            .bind(key)
            .bind(compensate_for)
            .fetch_one(self.conn()?)
            .await
            .map_err(store_error)?;
        if !known {
            return Err(store::Error::Other(format!(
                "workflow {} has no compensation task '{key}' for '{compensate_for}'",
                self.run.workflow_id
            )));
        }
        self.dispatched |= woke;
        if created {
            return Ok(true);
        }
        let rearmed: bool = sqlx::query_scalar(queries::REARM_COMPENSATOR)
            .bind(offset)
            .bind(self.run.id.0)
            .bind(key)
            .fetch_one(self.conn()?)
            .await
            .map_err(store_error)?;
        self.dispatched |= rearmed;
        Ok(rearmed)
    }

    async fn transition_run(&mut self, edge: RunTransition) -> Result<bool, store::Error> {
        self.activity = None;
        let offset = self.store.offset();
        let Some(t) = run_machine().get(edge) else {
            return Err(store::Error::Other(format!("'{edge}' is not a WorkflowRun transition")));
        };
        // The pass holds the run's lock, so the state it tracks is the
        // stored one: an edge from another state is a caller bug.
        if t.source != self.run.state {
            return Err(store::Error::Other(format!(
                "illegal workflow run transition '{edge}' from '{}' (it leaves '{}')",
                self.run.state, t.source
            )));
        }
        let terminal = run_machine().is_terminal(t.target);
        let (moved, woke): (bool, bool) = sqlx::query_as(queries::TRANSITION_RUN)
            .bind(offset)
            .bind(self.run.id.0)
            .bind(t.source.as_str())
            .bind(t.target.as_str())
            .bind(edge.as_str())
            .bind(terminal)
            .fetch_one(self.conn()?)
            .await
            .map_err(store_error)?;
        if moved {
            self.run.state = t.target;
            self.settled |= woke;
        }
        Ok(moved)
    }

    async fn waits(&mut self) -> Result<Vec<Wait>, store::Error> {
        let rows: Vec<WaitRow> = sqlx::query_as(queries::WAITS)
            .bind(self.run.id.0)
            .fetch_all(self.conn()?)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(WaitRow::into_wait).collect()
    }

    async fn pass_gates(&mut self, task: Option<&str>) -> Result<GateCheck, store::Error> {
        let run = self.run.id.0;
        let offset = self.store.offset();
        let pools: Vec<(String, i32)> = sqlx::query_as(queries::HOLDER_WAITS)
            .bind(run)
            .bind(task)
            .fetch_all(self.conn()?)
            .await
            .map_err(store_error)?;
        for (scope, max) in &pools {
            // Each miss means a concurrent holder committed a slot of this
            // pool meanwhile, so the loop ends within `max` misses.
            let mut taken = false;
            for _ in 0..=*max {
                let slot: Option<i32> = sqlx::query_scalar(queries::TAKE_SLOT)
                    .bind(offset)
                    .bind(scope)
                    .bind(max)
                    .bind(run)
                    .bind(task)
                    .fetch_optional(self.conn()?)
                    .await
                    .map_err(store_error)?;
                if slot.is_some() {
                    taken = true;
                    break;
                }
                let room: bool = sqlx::query_scalar(queries::POOL_HAS_ROOM)
                    .bind(scope)
                    .bind(i64::from(*max))
                    .fetch_one(self.conn()?)
                    .await
                    .map_err(store_error)?;
                if !room {
                    break;
                }
            }
            if !taken {
                sqlx::query(queries::UNTAKE_SLOTS)
                    .bind(run)
                    .bind(task)
                    .execute(self.conn()?)
                    .await
                    .map_err(store_error)?;
                return Ok(GateCheck::Full(scope.clone()));
            }
        }
        sqlx::query(queries::DROP_WAITS)
            .bind(run)
            .bind(task)
            .execute(self.conn()?)
            .await
            .map_err(store_error)?;
        Ok(GateCheck::Passed)
    }

    async fn mark_gates_tried(&mut self) -> Result<(), store::Error> {
        sqlx::query(queries::MARK_GATES_TRIED)
            .bind(self.run.id.0)
            .execute(self.conn()?)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn cancel_oldest_holder(&mut self, scope: &str) -> Result<Option<RunId>, store::Error> {
        let offset = self.store.offset();
        // A concurrent waiter may pick the same victim first: the UPDATE
        // then re-checks and changes nothing, and the next statement's
        // snapshot sees the next holder. Each miss is a holder cancelled
        // meanwhile; the bound only guards against a bug looping forever.
        for _ in 0..64 {
            let run: Option<Uuid> = sqlx::query_scalar(queries::CANCEL_OLDEST_HOLDER)
                .bind(offset)
                .bind(self.run.id.0)
                .bind(scope)
                .fetch_optional(self.conn()?)
                .await
                .map_err(store_error)?;
            if let Some(run) = run {
                self.released = true;
                return Ok(Some(RunId(run)));
            }
            let candidate: bool = sqlx::query_scalar(queries::HOLDER_TO_CANCEL)
                .bind(self.run.id.0)
                .bind(scope)
                .fetch_one(self.conn()?)
                .await
                .map_err(store_error)?;
            if !candidate {
                return Ok(None);
            }
        }
        Ok(None)
    }

    async fn cancel_for_limit(&mut self) -> Result<(), store::Error> {
        let offset = self.store.offset();
        sqlx::query(queries::CANCEL_FOR_LIMIT)
            .bind(offset)
            .bind(self.run.id.0)
            .execute(self.conn()?)
            .await
            .map_err(store_error)?;
        self.run.cancel_requested = true;
        self.run.limit_cancelled = true;
        Ok(())
    }

    async fn release_slots(&mut self, settled: bool) -> Result<usize, store::Error> {
        let released: i64 = sqlx::query_scalar(queries::RELEASE_SLOTS)
            .bind(self.run.id.0)
            .bind(settled)
            .fetch_one(self.conn()?)
            .await
            .map_err(store_error)?;
        self.released |= released > 0;
        Ok(usize::try_from(released).unwrap_or_default())
    }

    async fn commit(mut self) -> Result<(), store::Error> {
        let tx = self
            .tx
            .take()
            .ok_or_else(|| store::Error::Other("the scheduler pass has ended".to_owned()))?;
        tx.commit().await.map_err(store_error)?;
        self.store
            .announce(&[
                (Topic::Publisher, self.dispatched),
                (Topic::RunSettled, self.settled),
                (Topic::Scheduler, self.released),
            ])
            .await;
        Ok(())
    }
}
