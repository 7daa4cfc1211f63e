//! One run's scheduler transaction (docs/design/scheduler.md#the-pass) over
//! SQLite.
//!
//! The pass holds the writer connection inside `BEGIN IMMEDIATE` until it
//! commits or is dropped (rolled back). Two passes over the same run in
//! this process never overlap: the second `begin_pass` is told the run is
//! held, as `FOR NO KEY UPDATE SKIP LOCKED` tells it on PostgreSQL.
//!
//! Each method is ONE call to the connection, and some cost none:
//! * `begin_pass` opens the transaction, reads the run, reads and clears
//!   its flags and measures its activity in one call; `take_flagged` then
//!   hands out the rows read. A pass committed without taking them puts
//!   the flags back in its commit call, so the store ends as if they had
//!   never been read.
//! * Every call that changes task runs ends by measuring the activity
//!   again (the forward rows still moving, whether one started, whether a
//!   retry is waiting), so `activity` answers from it, and
//!   `promote_due_retries` costs nothing when no row of the run is retrying.
//!   Both are exact: the pass holds the file's write lock, so between its
//!   own calls nothing else changes the run.
//! * A batch change writes its events and dispatches from the rows it is
//!   about to change, by the same time-free WHERE, then changes them:
//!   SQLite has no data-modifying CTEs, and under the write lock the
//!   statements of one call see the same rows.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use flowforge_domain::derive::TaskTally;
use flowforge_domain::map::Children;
use flowforge_domain::{CancelReason, RunState, RunTransition, SkipReason, TaskRunState, TaskTransition, run_machine};
use flowforge_ports::store::{Collect, DependencyOutcomes, GateCheck, Wait};
use flowforge_ports::{Activity, LockedRun, PassTask, RunId, RunPass, Topic, WorkflowId, store};
use sqlx::sqlite::SqliteRow;

use crate::queries;
use crate::rows::{FlaggedRow, WaitRow};
use crate::rows::{col, decode};
use crate::rows::{json, name, opt_name, run_id, run_key, u32_of, u64_of};
use crate::store::{Conn, Inner, Query, ids_json, lock, padded, sql, tagged};

/// Marks a run as held by an open pass in this process until dropped.
struct RunHold {
    inner: Arc<Inner>,
    run: RunId,
}

impl Drop for RunHold {
    fn drop(&mut self) {
        lock(&self.inner.held_runs).remove(&self.run);
    }
}

/// The flags `begin_pass` read and cleared.
#[derive(Debug)]
enum Flags {
    /// Not handed out yet: the task runs, and whether the run's own flag
    /// (an unhandled cancel request) was set.
    Read { tasks: Vec<PassTask>, run: bool },
    /// Handed out by `take_flagged`.
    Taken,
}

/// What the last call that changed task runs measured.
#[derive(Debug, Clone, Copy)]
struct Measured {
    activity: Activity,
    /// A forward or compensating row of the run is retrying.
    any_retrying: bool,
}

/// An open scheduler pass over one run. Dropping it rolls back.
pub struct SqlitePass {
    conn: Conn,
    run: LockedRun,
    key: String,
    inner: Arc<Inner>,
    flags: Flags,
    /// The run's activity as of the last call: every call of a pass ends by
    /// measuring it.
    measured: Measured,
    /// A task run changed since `begin_pass` (so a flagged row read then
    /// may have changed too).
    changed: bool,
    /// A call failed and rolled the transaction back: the pass is over.
    failed: bool,
    wrote_outbox: bool,
    settled: bool,
    /// Slots were let go, or another run's cancel requested: wake the
    /// schedulers after commit.
    released: bool,
    // Declared last so the hold is released after the connection (and its
    // rollback, which keeps the writer until done) is given up.
    hold: RunHold,
}

impl fmt::Debug for SqlitePass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlitePass")
            .field("run", &self.run)
            .field("wrote_outbox", &self.wrote_outbox)
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

// Tags of the rows a pass call returns (first column).
const HEADER: i64 = 0;
const FLAGGED: i64 = 1;
const RUN_FLAG: i64 = 2;
const TOUCHED: i64 = 3;
const RUN_CHANGED: i64 = 4;
const DECLARED: i64 = 5;
const CREATED: i64 = 6;
const SIZED: i64 = 7;
const MEASURED: i64 = 9;

fn measured(rows: &[SqliteRow]) -> Result<Measured, store::Error> {
    let r = tagged(rows, MEASURED)
        .next()
        .ok_or_else(|| store::Error::Other("a scheduler pass call did not measure the run".into()))?;
    Ok(Measured {
        activity: Activity {
            any_active: col(r, 1)?,
            any_started: col(r, 2)?,
        },
        any_retrying: col(r, 3)?,
    })
}

/// The task keys of the rows tagged [`TOUCHED`], in id order.
fn touched_keys(rows: &[SqliteRow]) -> Result<Vec<String>, store::Error> {
    let mut touched = tagged(rows, TOUCHED)
        .map(|r| Ok((col::<i64>(r, 1)?, col::<String>(r, 2)?)))
        .collect::<Result<Vec<_>, store::Error>>()?;
    touched.sort_by_key(|(id, _)| *id);
    Ok(touched.into_iter().map(|(_, key)| key).collect())
}

fn flagged_tasks<'a>(rows: impl Iterator<Item = &'a SqliteRow>) -> Result<Vec<PassTask>, store::Error> {
    let mut by_id: HashMap<i64, PassTask> = HashMap::new();
    for row in rows {
        let task = decode::<FlaggedRow>(row)?.into_task()?;
        by_id.insert(task.id.0, task);
    }
    let mut tasks: Vec<PassTask> = by_id.into_values().collect();
    tasks.sort_by_key(|t| t.id.0);
    Ok(tasks)
}

impl SqlitePass {
    pub(crate) async fn begin(inner: Arc<Inner>, run: RunId) -> Result<Option<Self>, store::Error> {
        if !lock(&inner.held_runs).insert(run) {
            return Ok(None);
        }
        // From here on the hold is released on every exit path.
        let hold = RunHold {
            inner: inner.clone(),
            run,
        };
        let key = run_key(run);
        let mut conn = inner.write().await?;
        let rows = conn
            .open_call(padded(sql(queries::BEGIN_PASS).bind(inner.offset()).bind(&key)))
            .await?;
        let header = match tagged(&rows, HEADER).next() {
            Some(row) => {
                let state: String = col(row, 2)?;
                let state: RunState = name("workflow_run.state", &state)?;
                let age = Duration::from_millis(u64::try_from(col::<i64>(row, 4)?).unwrap_or(0));
                let flags = (col::<bool>(row, 5)?, col::<bool>(row, 6)?);
                Some((col::<i64>(row, 1)?, state, col::<bool>(row, 3)?, age, flags))
            }
            None => None,
        };
        let Some((workflow_id, state, cancel_requested, age, (gated, limit_cancelled))) =
            header.filter(|(_, s, _, _, _)| !run_machine().is_terminal(*s))
        else {
            // No pass: the flags this call cleared go back.
            conn.rollback().await?;
            return Ok(None);
        };
        let tasks = flagged_tasks(tagged(&rows, FLAGGED))?;
        let run_flag = tagged(&rows, RUN_FLAG).next().is_some();
        let measured = measured(&rows)?;
        Ok(Some(Self {
            conn,
            run: LockedRun {
                id: run,
                workflow_id: WorkflowId(workflow_id),
                state,
                cancel_requested,
                gated,
                limit_cancelled,
                age,
            },
            key,
            inner,
            flags: Flags::Read { tasks, run: run_flag },
            measured,
            changed: false,
            failed: false,
            wrote_outbox: false,
            settled: false,
            released: false,
            hold,
        }))
    }

    /// Refuses every step once a call failed.
    fn usable(&self) -> Result<(), store::Error> {
        if self.failed {
            return Err(store::Error::Other(
                "this scheduler pass failed earlier and was rolled back".into(),
            ));
        }
        Ok(())
    }

    /// Runs one call inside the transaction; a failure has rolled it back
    /// and ends the pass, as an error ends a transaction on PostgreSQL.
    async fn call(&mut self, q: Query) -> Result<Vec<SqliteRow>, store::Error> {
        self.usable()?;
        match self.conn.open_call(q).await {
            Ok(rows) => Ok(rows),
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        }
    }

    /// Runs a call that changes task runs and ends by measuring the run.
    async fn change(&mut self, q: Query) -> Result<Vec<SqliteRow>, store::Error> {
        self.changed = true;
        let rows = self.call(padded(q)).await?;
        self.measured = measured(&rows)?;
        Ok(rows)
    }

    /// Moves those of `keys` still pending by the call `text` (cancel or
    /// skip: `?3` the keys, `?4` the reason), returning the keys moved.
    async fn move_pending(
        &mut self,
        text: &'static str,
        keys: &[String],
        reason: &str,
    ) -> Result<Vec<String>, store::Error> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let wanted = serde_json::to_string(keys).map_err(|e| store::Error::Other(e.to_string()))?;
        let rows = self
            .change(self.query(text).bind(wanted).bind(reason.to_owned()))
            .await?;
        touched_keys(&rows)
    }

    /// A query binding `?1` the clock offset and `?2` the run.
    fn query(&self, text: &'static str) -> Query {
        sql(text).bind(self.inner.offset()).bind(self.key.clone())
    }
}

impl RunPass for SqlitePass {
    fn run(&self) -> &LockedRun {
        &self.run
    }

    async fn take_flagged(&mut self) -> Result<Vec<PassTask>, store::Error> {
        match std::mem::replace(&mut self.flags, Flags::Taken) {
            // Read and cleared by begin_pass's statement, and nothing has
            // changed since: a change committed after it sets the flag
            // again and is seen by the next pass.
            Flags::Read { tasks, .. } if !self.changed => Ok(tasks),
            Flags::Read { tasks, .. } => {
                let ids: Vec<i64> = tasks.iter().map(|t| t.id.0).collect();
                let q = padded(self.query(queries::REREAD_FLAGGED).bind(ids_json(&ids)));
                let rows = self.call(q).await?;
                flagged_tasks(tagged(&rows, FLAGGED))
            }
            Flags::Taken => {
                let q = padded(self.query(queries::TAKE_AGAIN));
                let rows = self.call(q).await?;
                flagged_tasks(tagged(&rows, FLAGGED))
            }
        }
    }

    async fn satisfy_dependencies(&mut self, done: &[(String, u32)]) -> Result<Vec<String>, store::Error> {
        // Summed per key first: UPDATE … FROM applies one joined row per
        // target row, so duplicates would otherwise be lost.
        let mut totals: HashMap<&str, i64> = HashMap::new();
        for (key, n) in done {
            *totals.entry(key.as_str()).or_default() += i64::from(*n);
        }
        let batch: Vec<serde_json::Value> = totals
            .iter()
            .map(|(k, n)| serde_json::json!({ "k": k, "n": n }))
            .collect();
        let batch = serde_json::to_string(&batch).map_err(|e| store::Error::Other(e.to_string()))?;
        let rows = self.change(self.query(queries::SATISFY).bind(batch)).await?;
        let keys = touched_keys(&rows)?;
        self.wrote_outbox |= !keys.is_empty();
        Ok(keys)
    }

    async fn promote_due_retries(&mut self) -> Result<Vec<String>, store::Error> {
        if !self.measured.any_retrying {
            // No row of the run is retrying, and only this pass can write
            // until it ends: the UPDATE would match nothing.
            return Ok(Vec::new());
        }
        let rows = self.change(self.query(queries::PROMOTE_DUE_CALL)).await?;
        let keys = touched_keys(&rows)?;
        self.wrote_outbox |= !keys.is_empty();
        Ok(keys)
    }

    async fn cancel_pending(&mut self, keys: &[String], reason: CancelReason) -> Result<Vec<String>, store::Error> {
        self.move_pending(queries::CANCEL_PENDING, keys, reason.as_str()).await
    }

    async fn skip_pending(&mut self, keys: &[String], reason: SkipReason) -> Result<Vec<String>, store::Error> {
        self.move_pending(queries::SKIP_PENDING, keys, reason.as_str()).await
    }

    async fn fail_pending(&mut self, key: &str, edge: TaskTransition, error: &str) -> Result<bool, store::Error> {
        let wanted = serde_json::to_string(&[key]).map_err(|e| store::Error::Other(e.to_string()))?;
        let q = self
            .query(queries::FAIL_PENDING)
            .bind(wanted)
            .bind(error.to_owned())
            .bind(edge.as_str());
        let rows = self.change(q).await?;
        Ok(!touched_keys(&rows)?.is_empty())
    }

    async fn expand_map(&mut self, key: &str, size: u32) -> Result<bool, store::Error> {
        let q = self
            .query(queries::EXPAND_MAP)
            .bind(key.to_owned())
            .bind(i64::from(size));
        let rows = self.change(q).await?;
        Ok(!touched_keys(&rows)?.is_empty())
    }

    async fn map_children(&mut self, key: &str, waiting: u32) -> Result<Children, store::Error> {
        let q = sql(queries::MAP_CHILDREN)
            .bind(self.key.clone())
            .bind(key.to_owned())
            .bind(i64::from(waiting));
        let rows = self.call(q).await?;
        let row = rows
            .first()
            .ok_or_else(|| store::Error::Other(format!("run {}: no answer about '{key}'", self.run.id)))?;
        let failed = col::<Option<String>>(row, 3)?
            .map(|text| serde_json::from_str::<(u32, Option<String>)>(&text))
            .transpose()
            .map_err(|e| store::Error::Corrupt(format!("run {}: a failed child of '{key}': {e}", self.run.id)))?;
        let waiting: Vec<u32> = serde_json::from_str(&col::<String>(row, 4)?)
            .map_err(|e| store::Error::Corrupt(format!("run {}: the waiting children of '{key}': {e}", self.run.id)))?;
        Ok(Children {
            size: col::<Option<i64>>(row, 0)?
                .map(|n| u32_of("task_run.map_size", n))
                .transpose()?,
            succeeded: u32_of("succeeded children", col(row, 1)?)?,
            active: u32_of("active children", col(row, 2)?)?,
            failed,
            waiting,
        })
    }

    async fn collect_map(&mut self, key: &str, limit: usize) -> Result<Collect, store::Error> {
        let q = self
            .query(queries::COLLECT_MAP)
            .bind(key.to_owned())
            .bind(i64::try_from(limit).unwrap_or(i64::MAX));
        let rows = self.change(q).await?;
        if !touched_keys(&rows)?.is_empty() {
            return Ok(Collect::Collected);
        }
        let sized = tagged(&rows, SIZED)
            .next()
            .ok_or_else(|| store::Error::Other(format!("run {}: no size of '{key}'", self.run.id)))?;
        Ok(if col::<bool>(sized, 1)? {
            Collect::TooLarge(u64_of("collected bytes", col(sized, 2)?)?)
        } else {
            Collect::NotReady
        })
    }

    async fn pending_counts(&mut self, keys: &[String]) -> Result<Vec<(String, u32)>, store::Error> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let wanted = serde_json::to_string(keys).map_err(|e| store::Error::Other(e.to_string()))?;
        let rows = self
            .call(sql(queries::PENDING_COUNTS).bind(self.key.clone()).bind(wanted))
            .await?;
        rows.iter()
            .map(|r| Ok((col::<String>(r, 0)?, u32_of("task_run.pending_deps", col(r, 1)?)?)))
            .collect()
    }

    async fn dependency_outcomes(&mut self, keys: &[String]) -> Result<DependencyOutcomes, store::Error> {
        let wanted = serde_json::to_string(keys).map_err(|e| store::Error::Other(e.to_string()))?;
        let rows = self
            .call(padded(self.query(queries::DEPENDENCY_OUTCOMES).bind(wanted)))
            .await?;
        let input = tagged(&rows, 0)
            .next()
            .ok_or_else(|| store::Error::Other(format!("run {} not found", self.run.id)))?;
        let run_input = json("workflow_run.input", &col::<String>(input, 1)?)?;
        let tasks = tagged(&rows, 1)
            .map(|r| {
                let state: String = col(r, 2)?;
                let output = col::<Option<String>>(r, 3)?
                    .map(|text| json("task_run.result", &text))
                    .transpose()?;
                Ok((col::<String>(r, 1)?, name("task_run.state", &state)?, output))
            })
            .collect::<Result<_, store::Error>>()?;
        Ok(DependencyOutcomes { run_input, tasks })
    }

    async fn cancel_children(&mut self, key: &str) -> Result<Vec<String>, store::Error> {
        let rows = self
            .change(self.query(queries::CANCEL_CHILDREN).bind(key.to_owned()))
            .await?;
        touched_keys(&rows)
    }

    async fn cancel_waiting(&mut self) -> Result<Vec<String>, store::Error> {
        let rows = self.change(self.query(queries::CANCEL_WAITING_CALL)).await?;
        touched_keys(&rows)
    }

    async fn activity(&mut self) -> Result<Activity, store::Error> {
        self.usable()?;
        Ok(self.measured.activity)
    }

    async fn tally(&mut self) -> Result<TaskTally, store::Error> {
        let rows = self.call(sql(queries::TALLY).bind(self.key.clone())).await?;
        let mut tally = TaskTally::default();
        for row in &rows {
            let state: String = col(row, 0)?;
            let reason: Option<String> = col(row, 1)?;
            let count = u64_of("task_run count", col(row, 2)?)?;
            let started: bool = col(row, 3)?;
            let state: TaskRunState = name("task_run.state", &state)?;
            let reason: Option<CancelReason> = opt_name("task_run.cancel_reason", reason.as_deref())?;
            tally.add_count(state, reason, count, started);
        }
        Ok(tally)
    }

    async fn succeeded_keys(&mut self) -> Result<BTreeSet<String>, store::Error> {
        let rows = self.call(sql(queries::SUCCEEDED_KEYS).bind(self.key.clone())).await?;
        rows.iter().map(|r| col::<String>(r, 0)).collect()
    }

    async fn compensator_states(&mut self) -> Result<Vec<(String, TaskRunState)>, store::Error> {
        let rows = self
            .call(sql(queries::COMPENSATOR_STATES).bind(self.key.clone()))
            .await?;
        rows.iter()
            .map(|r| {
                let state: String = col(r, 1)?;
                Ok((col::<String>(r, 0)?, name("task_run.state", &state)?))
            })
            .collect()
    }

    async fn create_compensator(&mut self, key: &str, compensate_for: &str) -> Result<bool, store::Error> {
        let q = self
            .query(queries::CREATE_COMPENSATOR)
            .bind(self.run.workflow_id.0)
            .bind(key.to_owned())
            .bind(compensate_for.to_owned());
        let rows = self.change(q).await?;
        let declared: Option<String> = match tagged(&rows, DECLARED).next() {
            Some(row) => col(row, 1)?,
            None => None,
        };
        if declared.as_deref() != Some(compensate_for) {
            // The call created nothing: its INSERT requires the declaration.
            return Err(store::Error::Other(format!(
                "workflow {} declares no compensation task '{key}' for '{compensate_for}'",
                self.run.workflow_id
            )));
        }
        if tagged(&rows, CREATED).next().is_some() {
            self.wrote_outbox = true;
            return Ok(true);
        }
        let q = self.query(queries::REARM_COMPENSATOR).bind(key.to_owned());
        let rearmed = tagged(&self.change(q).await?, CREATED).next().is_some();
        self.wrote_outbox |= rearmed;
        Ok(rearmed)
    }

    async fn transition_run(&mut self, edge: RunTransition) -> Result<bool, store::Error> {
        let Some(t) = run_machine().get(edge).copied() else {
            return Err(store::Error::Other(format!("'{edge}' is not a WorkflowRun transition")));
        };
        if t.source != self.run.state {
            return Err(store::Error::Other(format!(
                "illegal workflow run transition '{edge}' from {}: it leaves {}",
                self.run.state, t.source
            )));
        }
        let terminal = run_machine().is_terminal(t.target);
        let q = self
            .query(queries::TRANSITION_RUN)
            .bind(t.source.as_str())
            .bind(t.target.as_str())
            .bind(edge == RunTransition::Start)
            .bind(terminal)
            .bind(edge.as_str());
        // It changes no task run, but the activity reads the run's state.
        let rows = self.call(padded(q)).await?;
        self.measured = measured(&rows)?;
        if tagged(&rows, RUN_CHANGED).next().is_none() {
            return Ok(false);
        }
        self.run.state = t.target;
        self.settled |= terminal;
        Ok(true)
    }

    async fn waits(&mut self) -> Result<Vec<Wait>, store::Error> {
        let rows = self.call(self.query(queries::WAITS)).await?;
        rows.iter().map(|r| Ok(decode::<WaitRow>(r)?.into_wait()?)).collect()
    }

    async fn pass_gates(&mut self, task: Option<&str>) -> Result<GateCheck, store::Error> {
        let task = task.map(str::to_owned);
        let pools = self.call(self.query(queries::HOLDER_WAITS).bind(task.clone())).await?;
        for pool in &pools {
            let scope: String = col(pool, 0)?;
            let max: i64 = col(pool, 1)?;
            // Under the write lock nothing takes a slot meanwhile: a miss
            // means the pool is full.
            let q = self
                .query(queries::TAKE_SLOT)
                .bind(task.clone())
                .bind(scope.clone())
                .bind(max);
            if self.call(q).await?.is_empty() {
                self.call(self.query(queries::UNTAKE_SLOTS).bind(task.clone())).await?;
                return Ok(GateCheck::Full(scope));
            }
        }
        self.call(self.query(queries::DROP_WAITS).bind(task)).await?;
        Ok(GateCheck::Passed)
    }

    async fn mark_gates_tried(&mut self) -> Result<(), store::Error> {
        self.call(self.query(queries::MARK_GATES_TRIED)).await?;
        Ok(())
    }

    async fn cancel_oldest_holder(&mut self, scope: &str) -> Result<Option<RunId>, store::Error> {
        let rows = self
            .call(self.query(queries::CANCEL_OLDEST_HOLDER).bind(scope.to_owned()))
            .await?;
        self.released |= !rows.is_empty();
        rows.first().map(|r| Ok(run_id(&col::<String>(r, 0)?)?)).transpose()
    }

    async fn cancel_for_limit(&mut self) -> Result<(), store::Error> {
        self.call(self.query(queries::CANCEL_FOR_LIMIT)).await?;
        self.run.cancel_requested = true;
        self.run.limit_cancelled = true;
        Ok(())
    }

    async fn release_slots(&mut self, settled: bool) -> Result<usize, store::Error> {
        let rows = self
            .call(padded(self.query(queries::RELEASE_SLOTS).bind(settled)))
            .await?;
        self.released |= !rows.is_empty();
        Ok(rows.len())
    }

    async fn commit(mut self) -> Result<(), store::Error> {
        if self.failed {
            return Err(store::Error::Other(
                "this scheduler pass failed earlier and was rolled back".into(),
            ));
        }
        let q = match std::mem::replace(&mut self.flags, Flags::Taken) {
            Flags::Read { tasks, run } if !tasks.is_empty() || run => {
                let ids: Vec<i64> = tasks.iter().map(|t| t.id.0).collect();
                padded(
                    sql(queries::COMMIT_RESTORING)
                        .bind(ids_json(&ids))
                        .bind(self.key.clone())
                        .bind(run),
                )
            }
            _ => sql("COMMIT"),
        };
        self.conn.call(q).await?;
        let Self {
            conn,
            run,
            inner,
            wrote_outbox,
            settled,
            released,
            hold,
            ..
        } = self;
        drop(conn);
        drop(hold);
        if settled {
            // No attempt of a finished run reads its inputs again.
            lock(&inner.inputs).forget(run.id);
        }
        if wrote_outbox {
            inner.wakeups.wake(Topic::Publisher);
        }
        if settled {
            inner.wakeups.wake(Topic::RunSettled);
        }
        if released {
            inner.wakeups.wake(Topic::Scheduler);
        }
        Ok(())
    }
}
