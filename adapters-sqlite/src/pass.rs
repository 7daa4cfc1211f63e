//! One run's scheduler transaction (docs/design/scheduler.md#the-pass) over
//! SQLite.
//!
//! The pass holds the writer connection inside `BEGIN IMMEDIATE` until it
//! commits or is dropped (rolled back). Two passes over the same run in
//! this process never overlap: the second `begin_pass` is told the run is
//! held, as `FOR UPDATE SKIP LOCKED` tells it on PostgreSQL.
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
use flowforge_domain::{CancelReason, RunState, RunTransition, TaskRunState, run_machine};
use flowforge_ports::{Activity, LockedRun, PassTask, RunId, RunPass, TaskRunId, Topic, WorkflowId, store};
use sqlx::sqlite::SqliteRow;

use crate::convert::{col, decode};
use crate::convert::{name, opt_name, run_key, u64_of};
use crate::error::DecodeError;
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

#[derive(Debug, sqlx::FromRow)]
struct Flagged {
    id: i64,
    task_key: String,
    state: String,
    cancel_reason: Option<String>,
    compensate_for: Option<String>,
}

impl Flagged {
    fn into_task(self) -> Result<PassTask, DecodeError> {
        Ok(PassTask {
            id: TaskRunId(self.id),
            key: self.task_key,
            state: name("task_run.state", &self.state)?,
            cancel_reason: opt_name("task_run.cancel_reason", self.cancel_reason.as_deref())?,
            compensate_for: self.compensate_for,
        })
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
const MEASURED: i64 = 9;

/// take_flagged: read and clear the run's flags (`taskrun_needs_pass_idx`). `?2` run.
macro_rules! take_flagged {
    () => {
        "UPDATE task_run SET needs_pass = 0 WHERE run_id = ?2 AND needs_pass \
         RETURNING 1 AS tag, id, task_key, state, cancel_reason, compensate_for"
    };
}

/// The run's own flag: a cancel request not handled yet.
macro_rules! take_run_flag {
    () => {
        "UPDATE workflow_run SET needs_pass = 0 WHERE id = ?2 AND needs_pass RETURNING 2 AS tag"
    };
}

/// activity: is a forward row still active (`taskrun_active_idx`), has any
/// row started (looked up only while the run is pending; a running run
/// has), and is any row retrying (`taskrun_active_idx`).
macro_rules! activity {
    () => {
        "SELECT 9 AS tag, \
         EXISTS (SELECT 1 FROM task_run WHERE run_id = ?2 \
                 AND state IN ('pending', 'ready', 'running', 'retrying') AND compensate_for IS NULL), \
         CASE WHEN (SELECT state FROM workflow_run WHERE id = ?2) <> 'pending' THEN 1 \
              ELSE EXISTS (SELECT 1 FROM task_run WHERE run_id = ?2 AND started_at IS NOT NULL) END, \
         EXISTS (SELECT 1 FROM task_run WHERE run_id = ?2 \
                 AND state IN ('pending', 'ready', 'running', 'retrying') AND state = 'retrying')"
    };
}

/// satisfy_dependencies: lower the counts, one lookup per key (`uniq_taskrun_run_key`).
/// MATERIALIZED makes SQLite walk the batch and look each row up by
/// (run_id, task_key); joined directly, the planner scans the JSON once per
/// task row of the run, which is quadratic on a wide fan-out. `?3` the batch.
macro_rules! lower_pending {
    () => {
        "WITH done (k, n) AS MATERIALIZED (SELECT j.value ->> 'k', j.value ->> 'n' FROM json_each(?3) AS j) \
         UPDATE task_run SET pending_deps = pending_deps - done.n FROM done \
         WHERE task_run.run_id = ?2 AND task_run.task_key = done.k \
         AND task_run.state = 'pending' AND task_run.compensate_for IS NULL"
    };
}

/// The pending forward rows at zero (`taskrun_active_idx`, which carries
/// `pending_deps`, so only those rows are visited). `state IN (…)` repeats
/// the index's WHERE: SQLite uses a partial index only when the query
/// states its condition literally, and without it a pass would walk every
/// row of the run, finished or not.
macro_rules! promotable {
    () => {
        "run_id = ?2 AND state IN ('pending', 'ready', 'running', 'retrying') AND state = 'pending' \
         AND pending_deps = 0 AND compensate_for IS NULL"
    };
}

/// promote_due_retries marks the due rows with a `retry_at` of -1 first,
/// so the statements after it name exactly the rows due at that instant
/// without reading the clock again (a row with that `retry_at` is due
/// anyway). Invisible outside the transaction.
macro_rules! due_marked {
    () => {
        "run_id = ?2 AND state IN ('pending', 'ready', 'running', 'retrying') AND state = 'retrying' \
         AND retry_at = -1"
    };
}

/// The events of a batch: rows of `task_run` matching `$where`, in id
/// order, with their (unchanged) attempt and token.
macro_rules! batch_events {
    ($transition:literal, $from:literal, $to:literal, $where:expr) => {
        concat!(
            event_insert!(),
            "SELECT ",
            next_event_id!(),
            " + ROW_NUMBER() OVER (ORDER BY id), id, run_id, task_key, '",
            $transition,
            "', '",
            $from,
            "', '",
            $to,
            "', attempt, fencing_token, NULL, ",
            now!(),
            ", NULL FROM task_run WHERE ",
            $where,
            " ORDER BY id"
        )
    };
}

/// The outbox rows of a batch of rows about to become ready
/// (docs/design/outbox-and-queues.md#one-outbox-row-per-readiness).
macro_rules! batch_dispatch {
    ($where:expr) => {
        concat!(
            "INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at) \
             SELECT id, run_id, task_key, ",
            task_type_of!("task_run"),
            ", fencing_token, ",
            now!(),
            " FROM task_run WHERE ",
            $where,
            " ORDER BY id"
        )
    };
}

#[cfg(test)]
pub(crate) const TAKE_FLAGGED: &str = take_flagged!();
#[cfg(test)]
pub(crate) const ACTIVITY: &str = activity!();
#[cfg(test)]
pub(crate) const LOWER_PENDING: &str = lower_pending!();

/// begin_pass in one call: open the transaction, read the run, take its
/// flags, measure it. `?2` run.
pub(crate) const BEGIN_PASS: &str = concat!(
    "BEGIN IMMEDIATE; \
     SELECT 0 AS tag, workflow_id, state, cancel_requested_at IS NOT NULL, ",
    now!(),
    " - created_at FROM workflow_run WHERE id = ?2; ",
    take_flagged!(),
    "; ",
    take_run_flag!(),
    "; ",
    activity!()
);

/// take_flagged after the pass changed rows: the flagged rows as they are
/// now (`?3` their ids), and any flag set since (none can be, while the
/// pass holds the write lock; asked anyway, it is the statement's meaning).
pub(crate) const REREAD_FLAGGED: &str = concat!(
    "SELECT 1 AS tag, id, task_key, state, cancel_reason, compensate_for FROM task_run \
     WHERE id IN (SELECT value FROM json_each(?3)); ",
    take_flagged!(),
    "; ",
    take_run_flag!()
);

/// A second take_flagged: the statement itself.
pub(crate) const TAKE_AGAIN: &str = concat!(take_flagged!(), "; ", take_run_flag!());

/// satisfy_dependencies' promotion (its plan is checked in `plans.rs`).
macro_rules! promote_ready {
    () => {
        concat!(
            "UPDATE task_run SET state = 'ready' WHERE ",
            promotable!(),
            " RETURNING 3 AS tag, id, task_key"
        )
    };
}

#[cfg(test)]
pub(crate) const PROMOTE_READY: &str = promote_ready!();

/// satisfy_dependencies in one call: lower, then `dependencies_satisfied`
/// on every pending forward row at zero with its event and dispatch.
pub(crate) const SATISFY: &str = concat!(
    lower_pending!(),
    "; ",
    batch_events!("dependencies_satisfied", "pending", "ready", promotable!()),
    "; ",
    batch_dispatch!(promotable!()),
    "; ",
    promote_ready!(),
    "; ",
    activity!()
);

/// promote_due_retries' first statement: mark the run's due retries
/// (`taskrun_active_idx`).
macro_rules! mark_due {
    () => {
        concat!(
            "UPDATE task_run SET retry_at = -1 \
             WHERE run_id = ?2 AND state IN ('pending', 'ready', 'running', 'retrying') AND state = 'retrying' \
             AND retry_at <= ",
            now!()
        )
    };
}

#[cfg(test)]
pub(crate) const PROMOTE_DUE: &str = mark_due!();

/// promote_due_retries in one call.
pub(crate) const PROMOTE_DUE_CALL: &str = concat!(
    mark_due!(),
    "; ",
    batch_events!("retry_ready", "retrying", "ready", due_marked!()),
    "; ",
    batch_dispatch!(due_marked!()),
    "; UPDATE task_run SET state = 'ready', retry_at = NULL WHERE ",
    due_marked!(),
    " RETURNING 3 AS tag, id, task_key; ",
    activity!()
);

macro_rules! pending_named {
    () => {
        "run_id = ?2 AND state = 'pending' AND task_key IN (SELECT value FROM json_each(?3))"
    };
}

/// cancel_pending in one call: `?3` the keys, `?4` the reason.
pub(crate) const CANCEL_PENDING: &str = concat!(
    batch_events!("cancel_pending", "pending", "cancelled", pending_named!()),
    "; UPDATE task_run SET state = 'cancelled', cancel_reason = ?4, finished_at = ",
    now!(),
    " WHERE ",
    pending_named!(),
    " RETURNING 3 AS tag, id, task_key; ",
    activity!()
);

macro_rules! waiting {
    () => {
        "run_id = ?2 AND state IN ('pending', 'ready', 'running', 'retrying') \
         AND state IN ('pending', 'ready', 'retrying') AND compensate_for IS NULL"
    };
}

/// cancel_waiting's UPDATE: the run's waiting forward rows (`taskrun_active_idx`).
macro_rules! cancel_waiting {
    () => {
        concat!(
            "UPDATE task_run SET state = 'cancelled', cancel_reason = 'user', retry_at = NULL, finished_at = ",
            now!(),
            " WHERE ",
            waiting!(),
            " RETURNING 3 AS tag, id, task_key"
        )
    };
}

#[cfg(test)]
pub(crate) const CANCEL_WAITING: &str = cancel_waiting!();

/// cancel_waiting in one call. Each source state has its own transition
/// name; the events go by state (pending, ready, retrying), then id.
pub(crate) const CANCEL_WAITING_CALL: &str = concat!(
    event_insert!(),
    "SELECT ",
    next_event_id!(),
    " + ROW_NUMBER() OVER (ORDER BY CASE state WHEN 'pending' THEN 0 WHEN 'ready' THEN 1 ELSE 2 END, id), \
     id, run_id, task_key, \
     CASE state WHEN 'pending' THEN 'cancel_pending' WHEN 'ready' THEN 'cancel_ready' ELSE 'cancel_retrying' END, \
     state, 'cancelled', attempt, fencing_token, NULL, ",
    now!(),
    ", NULL FROM task_run WHERE ",
    waiting!(),
    " ORDER BY CASE state WHEN 'pending' THEN 0 WHEN 'ready' THEN 1 ELSE 2 END, id; ",
    cancel_waiting!(),
    "; ",
    activity!()
);

/// create_compensator in one call: the declared task, the row (only when
/// declared so, once), its dispatch when it was created. `?3` workflow,
/// `?4` key, `?5` the task it undoes.
pub(crate) const CREATE_COMPENSATOR: &str = concat!(
    "SELECT 5 AS tag, compensate_for FROM task WHERE workflow_id = ?3 AND key = ?4; \
     INSERT INTO task_run (run_id, task_key, compensate_for, state, pending_deps, created_at) \
     SELECT ?2, ?4, ?5, 'ready', 0, ",
    now!(),
    " WHERE EXISTS (SELECT 1 FROM task WHERE workflow_id = ?3 AND key = ?4 AND compensate_for = ?5) \
     ON CONFLICT (run_id, task_key) DO NOTHING RETURNING 6 AS tag, id; \
     INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at) \
     SELECT tr.id, tr.run_id, tr.task_key, ",
    task_type_of!("tr"),
    ", tr.fencing_token, ",
    now!(),
    " FROM task_run tr WHERE tr.run_id = ?2 AND tr.task_key = ?4 AND changes() = 1; ",
    activity!()
);

/// transition_run in one call: `?3` source, `?4` target, `?5` whether it
/// starts the run, `?6` whether it ends it, `?7` the edge.
pub(crate) const TRANSITION_RUN: &str = concat!(
    "UPDATE workflow_run SET state = ?4, \
     started_at = CASE WHEN ?5 THEN COALESCE(started_at, ",
    now!(),
    ") ELSE started_at END, \
     finished_at = CASE WHEN ?6 THEN ",
    now!(),
    " ELSE finished_at END \
     WHERE id = ?2 AND state = ?3 RETURNING 4 AS tag; \
     INSERT INTO workflow_run_event (id, run_id, transition, from_state, to_state, at) SELECT ",
    next_event_id!(),
    " + 1, ?2, ?7, ?3, ?4, ",
    now!(),
    " WHERE changes() = 1; ",
    activity!()
);

/// Commit after putting back the flags `begin_pass` cleared but nobody
/// took: `?1` their task run ids, `?2` the run, `?3` whether its flag was set.
pub(crate) const COMMIT_RESTORING: &str = "UPDATE task_run SET needs_pass = 1 WHERE id IN (SELECT value FROM json_each(?1)); \
     UPDATE workflow_run SET needs_pass = 1 WHERE id = ?2 AND ?3; COMMIT";

const TALLY: &str = "SELECT state, cancel_reason, COUNT(*), MAX(started_at IS NOT NULL) FROM task_run \
     WHERE run_id = ?1 AND compensate_for IS NULL GROUP BY state, cancel_reason";

const SUCCEEDED_KEYS: &str =
    "SELECT task_key FROM task_run WHERE run_id = ?1 AND state = 'succeeded' AND compensate_for IS NULL";

const COMPENSATOR_STATES: &str =
    "SELECT task_key, state FROM task_run WHERE run_id = ?1 AND compensate_for IS NOT NULL ORDER BY id";

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
        let task = decode::<Flagged>(row)?.into_task()?;
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
            .open_call(padded(sql(BEGIN_PASS).bind(inner.offset()).bind(&key)))
            .await?;
        let header = match tagged(&rows, HEADER).next() {
            Some(row) => {
                let state: String = col(row, 2)?;
                let state: RunState = name("workflow_run.state", &state)?;
                let age = Duration::from_millis(u64::try_from(col::<i64>(row, 4)?).unwrap_or(0));
                Some((col::<i64>(row, 1)?, state, col::<bool>(row, 3)?, age))
            }
            None => None,
        };
        let Some((workflow_id, state, cancel_requested, age)) =
            header.filter(|(_, s, _, _)| !run_machine().is_terminal(*s))
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
                let q = padded(self.query(REREAD_FLAGGED).bind(ids_json(&ids)));
                let rows = self.call(q).await?;
                flagged_tasks(tagged(&rows, FLAGGED))
            }
            Flags::Taken => {
                let q = padded(self.query(TAKE_AGAIN));
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
        let rows = self.change(self.query(SATISFY).bind(batch)).await?;
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
        let rows = self.change(self.query(PROMOTE_DUE_CALL)).await?;
        let keys = touched_keys(&rows)?;
        self.wrote_outbox |= !keys.is_empty();
        Ok(keys)
    }

    async fn cancel_pending(&mut self, keys: &[String], reason: CancelReason) -> Result<Vec<String>, store::Error> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let wanted = serde_json::to_string(keys).map_err(|e| store::Error::Other(e.to_string()))?;
        let rows = self
            .change(self.query(CANCEL_PENDING).bind(wanted).bind(reason.as_str()))
            .await?;
        touched_keys(&rows)
    }

    async fn cancel_waiting(&mut self) -> Result<Vec<String>, store::Error> {
        let rows = self.change(self.query(CANCEL_WAITING_CALL)).await?;
        touched_keys(&rows)
    }

    async fn activity(&mut self) -> Result<Activity, store::Error> {
        self.usable()?;
        Ok(self.measured.activity)
    }

    async fn tally(&mut self) -> Result<TaskTally, store::Error> {
        let rows = self.call(sql(TALLY).bind(self.key.clone())).await?;
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
        let rows = self.call(sql(SUCCEEDED_KEYS).bind(self.key.clone())).await?;
        rows.iter().map(|r| col::<String>(r, 0)).collect()
    }

    async fn compensator_states(&mut self) -> Result<Vec<(String, TaskRunState)>, store::Error> {
        let rows = self.call(sql(COMPENSATOR_STATES).bind(self.key.clone())).await?;
        rows.iter()
            .map(|r| {
                let state: String = col(r, 1)?;
                Ok((col::<String>(r, 0)?, name("task_run.state", &state)?))
            })
            .collect()
    }

    async fn create_compensator(&mut self, key: &str, compensate_for: &str) -> Result<bool, store::Error> {
        let q = self
            .query(CREATE_COMPENSATOR)
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
        let created = tagged(&rows, CREATED).next().is_some();
        self.wrote_outbox |= created;
        Ok(created)
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
            .query(TRANSITION_RUN)
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
                    sql(COMMIT_RESTORING)
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
        Ok(())
    }
}
