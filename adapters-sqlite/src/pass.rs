//! One run's scheduler transaction (DESIGN §5) over SQLite.
//!
//! The pass holds the writer connection inside `BEGIN IMMEDIATE` until it
//! commits or is dropped (rolled back). Two passes over the same run in
//! this process never overlap: the second `begin_pass` is told the run is
//! held, as `FOR UPDATE SKIP LOCKED` tells it on PostgreSQL. Each change is
//! a batched conditional UPDATE with `RETURNING`, then one INSERT of the
//! event rows for exactly the rows it returned.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use flowforge_domain::derive::TaskTally;
use flowforge_domain::{CancelReason, RunState, RunTransition, TaskRunState, run_machine};
use flowforge_ports::{Activity, PassRun, PassTask, RunId, RunPass, StoreError, TaskRunId, Topic, WorkflowId};
use sqlx::{Sqlite, Transaction};

use crate::convert::{name, opt_name, run_key, u64_of};
use crate::error::store_error;
use crate::runs::keys_in_order;
use crate::store::{Edge, Inner, dispatch, lock, record};

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

/// An open scheduler pass over one run. Dropping it rolls back.
pub struct SqlitePass {
    tx: Transaction<'static, Sqlite>,
    run: PassRun,
    key: String,
    inner: Arc<Inner>,
    wrote_outbox: bool,
    settled: bool,
    // Declared last so the hold is released after the transaction ends.
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
struct Touched {
    id: i64,
    task_key: String,
}

/// take_flagged: read and clear the run's flags (`taskrun_needs_pass_idx`).
pub(crate) const TAKE_FLAGGED: &str = "UPDATE task_run SET needs_pass = 0 WHERE run_id = ?1 AND needs_pass \
             RETURNING id, task_key, state, cancel_reason, compensate_for";

/// satisfy_dependencies: lower the counts, one lookup per key (`uniq_taskrun_run_key`).
/// MATERIALIZED makes SQLite walk the batch and look each row up by
/// (run_id, task_key); joined directly, the planner scans the JSON once per
/// task row of the run, which is quadratic on a wide fan-out.
pub(crate) const LOWER_PENDING: &str = "WITH done (k, n) AS MATERIALIZED (SELECT j.value ->> 'k', j.value ->> 'n' FROM json_each(?2) AS j) \
                 UPDATE task_run SET pending_deps = pending_deps - done.n FROM done \
                 WHERE task_run.run_id = ?1 AND task_run.task_key = done.k \
                 AND task_run.state = 'pending' AND task_run.compensate_for IS NULL";

/// satisfy_dependencies: promote the rows at zero (`taskrun_active_idx`).
/// `state IN (…)` repeats the index's WHERE: SQLite uses a partial index
/// only when the query states its condition literally, and without it a
/// pass would walk every row of the run, finished or not.
pub(crate) const PROMOTE_READY: &str = "UPDATE task_run SET state = 'ready' \
             WHERE run_id = ?1 AND state IN ('pending', 'ready', 'running', 'retrying') AND state = 'pending' \
             AND pending_deps = 0 AND compensate_for IS NULL RETURNING id, task_key";

/// promote_due_retries: the run's due retries (`taskrun_active_idx`).
pub(crate) const PROMOTE_DUE: &str = concat!(
    "UPDATE task_run SET state = 'ready', retry_at = NULL \
             WHERE run_id = ?2 AND state IN ('pending', 'ready', 'running', 'retrying') AND state = 'retrying' AND retry_at <= ",
    now!(),
    " RETURNING id, task_key"
);

/// activity: is a forward row still active (`taskrun_active_idx`), and has
/// any row started (asked only while the run is pending; a running run has).
pub(crate) const ACTIVITY: &str = "SELECT \
     EXISTS (SELECT 1 FROM task_run WHERE run_id = ?1 \
             AND state IN ('pending', 'ready', 'running', 'retrying') AND compensate_for IS NULL), \
     ?2 OR EXISTS (SELECT 1 FROM task_run WHERE run_id = ?1 AND started_at IS NOT NULL)";

/// cancel_waiting: the run's rows in one waiting state (`taskrun_active_idx`).
pub(crate) const CANCEL_WAITING: &str = concat!(
    "UPDATE task_run SET state = 'cancelled', cancel_reason = 'user', retry_at = NULL, finished_at = ",
    now!(),
    " WHERE run_id = ?2 AND state IN ('pending', 'ready', 'running', 'retrying') AND state = ?3 \
                 AND compensate_for IS NULL RETURNING id, task_key"
);

impl SqlitePass {
    pub(crate) async fn begin(inner: Arc<Inner>, run: RunId) -> Result<Option<Self>, StoreError> {
        if !lock(&inner.held_runs).insert(run) {
            return Ok(None);
        }
        // From here on the hold is released on every exit path.
        let hold = RunHold {
            inner: inner.clone(),
            run,
        };
        let key = run_key(run);
        let mut tx = inner.write().await?;
        let row: Option<(i64, String, bool)> = sqlx::query_as(
            "SELECT workflow_id, state, cancel_requested_at IS NOT NULL FROM workflow_run WHERE id = ?1",
        )
        .bind(&key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(store_error)?;
        let Some((workflow_id, state, cancel_requested)) = row else {
            return Ok(None);
        };
        let state: RunState = name("workflow_run.state", &state)?;
        if run_machine().is_terminal(state) {
            return Ok(None);
        }
        Ok(Some(Self {
            tx,
            run: PassRun {
                id: run,
                workflow_id: WorkflowId(workflow_id),
                state,
                cancel_requested,
            },
            key,
            inner,
            wrote_outbox: false,
            settled: false,
            hold,
        }))
    }

    fn offset(&self) -> i64 {
        self.inner.offset()
    }

    /// Records `edge` for the touched rows and returns their keys in id order.
    async fn recorded(&mut self, mut touched: Vec<Touched>, edge: Edge<'_>) -> Result<Vec<String>, StoreError> {
        touched.sort_by_key(|t| t.id);
        let ids: Vec<i64> = touched.iter().map(|t| t.id).collect();
        let offset = self.offset();
        record(&mut self.tx, offset, &ids, edge).await?;
        Ok(touched.into_iter().map(|t| t.task_key).collect())
    }

    /// Records `edge` and writes the outbox rows of rows made ready.
    async fn made_ready(&mut self, mut touched: Vec<Touched>, edge: Edge<'_>) -> Result<Vec<String>, StoreError> {
        touched.sort_by_key(|t| t.id);
        let ids: Vec<i64> = touched.iter().map(|t| t.id).collect();
        let keys: HashMap<i64, String> = touched.into_iter().map(|t| (t.id, t.task_key)).collect();
        let offset = self.offset();
        record(&mut self.tx, offset, &ids, edge).await?;
        dispatch(&mut self.tx, offset, &ids).await?;
        self.wrote_outbox |= !ids.is_empty();
        Ok(keys_in_order(&ids, &keys))
    }
}

impl RunPass for SqlitePass {
    fn run(&self) -> &PassRun {
        &self.run
    }

    async fn take_flagged(&mut self) -> Result<Vec<PassTask>, StoreError> {
        #[derive(sqlx::FromRow)]
        struct Flagged {
            id: i64,
            task_key: String,
            state: String,
            cancel_reason: Option<String>,
            compensate_for: Option<String>,
        }
        // Read and cleared in one statement: a change committed after this
        // point sets the flag again and is seen by the next pass.
        let mut rows: Vec<Flagged> = sqlx::query_as(TAKE_FLAGGED)
            .bind(&self.key)
            .fetch_all(&mut *self.tx)
            .await
            .map_err(store_error)?;
        sqlx::query("UPDATE workflow_run SET needs_pass = 0 WHERE id = ?1 AND needs_pass")
            .bind(&self.key)
            .execute(&mut *self.tx)
            .await
            .map_err(store_error)?;
        rows.sort_by_key(|r| r.id);
        rows.into_iter()
            .map(|r| {
                Ok(PassTask {
                    id: TaskRunId(r.id),
                    key: r.task_key,
                    state: name("task_run.state", &r.state)?,
                    cancel_reason: opt_name("task_run.cancel_reason", r.cancel_reason.as_deref())?,
                    compensate_for: r.compensate_for,
                })
            })
            .collect::<Result<Vec<_>, crate::error::DecodeError>>()
            .map_err(StoreError::from)
    }

    async fn satisfy_dependencies(&mut self, done: &[(String, u32)]) -> Result<Vec<String>, StoreError> {
        // Summed per key first: UPDATE … FROM applies one joined row per
        // target row, so duplicates would otherwise be lost.
        let mut totals: HashMap<&str, i64> = HashMap::new();
        for (key, n) in done {
            *totals.entry(key.as_str()).or_default() += i64::from(*n);
        }
        if !totals.is_empty() {
            let batch: Vec<serde_json::Value> = totals
                .iter()
                .map(|(k, n)| serde_json::json!({ "k": k, "n": n }))
                .collect();
            let batch = serde_json::to_string(&batch).map_err(|e| StoreError::Other(e.to_string()))?;
            sqlx::query(LOWER_PENDING)
                .bind(&self.key)
                .bind(&batch)
                .execute(&mut *self.tx)
                .await
                .map_err(store_error)?;
        }
        let touched: Vec<Touched> = sqlx::query_as(PROMOTE_READY)
            .bind(&self.key)
            .fetch_all(&mut *self.tx)
            .await
            .map_err(store_error)?;
        self.made_ready(touched, Edge::new("dependencies_satisfied", "pending", "ready"))
            .await
    }

    async fn promote_due_retries(&mut self) -> Result<Vec<String>, StoreError> {
        let touched: Vec<Touched> = sqlx::query_as(PROMOTE_DUE)
            .bind(self.offset())
            .bind(&self.key)
            .fetch_all(&mut *self.tx)
            .await
            .map_err(store_error)?;
        self.made_ready(touched, Edge::new("retry_ready", "retrying", "ready"))
            .await
    }

    async fn cancel_pending(&mut self, keys: &[String], reason: CancelReason) -> Result<Vec<String>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let wanted = serde_json::to_string(keys).map_err(|e| StoreError::Other(e.to_string()))?;
        let touched: Vec<Touched> = sqlx::query_as(concat!(
            "UPDATE task_run SET state = 'cancelled', cancel_reason = ?4, finished_at = ",
            now!(),
            " WHERE run_id = ?2 AND state = 'pending' AND task_key IN (SELECT value FROM json_each(?3)) \
             RETURNING id, task_key"
        ))
        .bind(self.offset())
        .bind(&self.key)
        .bind(&wanted)
        .bind(reason.as_str())
        .fetch_all(&mut *self.tx)
        .await
        .map_err(store_error)?;
        self.recorded(touched, Edge::new("cancel_pending", "pending", "cancelled"))
            .await
    }

    async fn cancel_waiting(&mut self) -> Result<Vec<String>, StoreError> {
        // One UPDATE per source state: RETURNING shows only the new row, and
        // each state's rows need their own transition name in the history.
        let mut cancelled: Vec<(i64, String)> = Vec::new();
        for (from, transition) in [
            ("pending", "cancel_pending"),
            ("ready", "cancel_ready"),
            ("retrying", "cancel_retrying"),
        ] {
            let touched: Vec<Touched> = sqlx::query_as(CANCEL_WAITING)
                .bind(self.offset())
                .bind(&self.key)
                .bind(from)
                .fetch_all(&mut *self.tx)
                .await
                .map_err(store_error)?;
            let ids: Vec<i64> = touched.iter().map(|t| t.id).collect();
            let offset = self.offset();
            record(&mut self.tx, offset, &ids, Edge::new(transition, from, "cancelled")).await?;
            cancelled.extend(touched.into_iter().map(|t| (t.id, t.task_key)));
        }
        cancelled.sort_by_key(|(id, _)| *id);
        Ok(cancelled.into_iter().map(|(_, key)| key).collect())
    }

    async fn activity(&mut self) -> Result<Activity, StoreError> {
        let (any_active, any_started): (bool, bool) = sqlx::query_as(ACTIVITY)
            .bind(&self.key)
            .bind(self.run.state != RunState::Pending)
            .fetch_one(&mut *self.tx)
            .await
            .map_err(store_error)?;
        Ok(Activity {
            any_active,
            any_started,
        })
    }

    async fn tally(&mut self) -> Result<TaskTally, StoreError> {
        let rows: Vec<(String, Option<String>, i64, bool)> = sqlx::query_as(
            "SELECT state, cancel_reason, COUNT(*), MAX(started_at IS NOT NULL) FROM task_run \
             WHERE run_id = ?1 AND compensate_for IS NULL GROUP BY state, cancel_reason",
        )
        .bind(&self.key)
        .fetch_all(&mut *self.tx)
        .await
        .map_err(store_error)?;
        let mut tally = TaskTally::default();
        for (state, reason, count, started) in rows {
            let count = u64_of("task_run count", count)?;
            let state: TaskRunState = name("task_run.state", &state)?;
            let reason: Option<CancelReason> = opt_name("task_run.cancel_reason", reason.as_deref())?;
            let slot = match state {
                TaskRunState::Pending => &mut tally.pending,
                TaskRunState::Ready => &mut tally.ready,
                TaskRunState::Running => &mut tally.running,
                TaskRunState::Retrying => &mut tally.retrying,
                TaskRunState::Succeeded => &mut tally.succeeded,
                TaskRunState::Failed => &mut tally.failed,
                TaskRunState::Cancelled => match reason {
                    Some(CancelReason::UpstreamFailed) => &mut tally.cancelled_upstream,
                    Some(CancelReason::User) | None => &mut tally.cancelled_by_user,
                },
            };
            *slot += count;
            tally.any_started |= started;
        }
        Ok(tally)
    }

    async fn succeeded_keys(&mut self) -> Result<BTreeSet<String>, StoreError> {
        let keys: Vec<String> = sqlx::query_scalar(
            "SELECT task_key FROM task_run WHERE run_id = ?1 AND state = 'succeeded' AND compensate_for IS NULL",
        )
        .bind(&self.key)
        .fetch_all(&mut *self.tx)
        .await
        .map_err(store_error)?;
        Ok(keys.into_iter().collect())
    }

    async fn compensator_states(&mut self) -> Result<Vec<(String, TaskRunState)>, StoreError> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT task_key, state FROM task_run WHERE run_id = ?1 AND compensate_for IS NOT NULL ORDER BY id",
        )
        .bind(&self.key)
        .fetch_all(&mut *self.tx)
        .await
        .map_err(store_error)?;
        rows.into_iter()
            .map(|(key, state)| Ok((key, name("task_run.state", &state)?)))
            .collect::<Result<Vec<_>, crate::error::DecodeError>>()
            .map_err(StoreError::from)
    }

    async fn create_compensator(&mut self, key: &str, compensate_for: &str) -> Result<bool, StoreError> {
        let declared: Option<Option<String>> =
            sqlx::query_scalar("SELECT compensate_for FROM task WHERE workflow_id = ?1 AND key = ?2")
                .bind(self.run.workflow_id.0)
                .bind(key)
                .fetch_optional(&mut *self.tx)
                .await
                .map_err(store_error)?;
        if declared.as_ref().and_then(Option::as_deref) != Some(compensate_for) {
            return Err(StoreError::Other(format!(
                "workflow {} declares no compensation task '{key}' for '{compensate_for}'",
                self.run.workflow_id
            )));
        }
        let created: Option<i64> = sqlx::query_scalar(concat!(
            "INSERT INTO task_run (run_id, task_key, compensate_for, state, pending_deps, created_at) \
             VALUES (?2, ?3, ?4, 'ready', 0, ",
            now!(),
            ") ON CONFLICT (run_id, task_key) DO NOTHING RETURNING id"
        ))
        .bind(self.offset())
        .bind(&self.key)
        .bind(key)
        .bind(compensate_for)
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(store_error)?;
        let Some(id) = created else {
            return Ok(false);
        };
        let offset = self.offset();
        dispatch(&mut self.tx, offset, &[id]).await?;
        self.wrote_outbox = true;
        Ok(true)
    }

    async fn transition_run(&mut self, edge: RunTransition) -> Result<bool, StoreError> {
        let Some(t) = run_machine().get(edge).copied() else {
            return Err(StoreError::Other(format!("'{edge}' is not a WorkflowRun transition")));
        };
        if t.source != self.run.state {
            return Err(StoreError::Other(format!(
                "illegal workflow run transition '{edge}' from {}: it leaves {}",
                self.run.state, t.source
            )));
        }
        let terminal = run_machine().is_terminal(t.target);
        let changed: Option<String> = sqlx::query_scalar(concat!(
            "UPDATE workflow_run SET state = ?4, \
             started_at = CASE WHEN ?5 THEN COALESCE(started_at, ",
            now!(),
            ") ELSE started_at END, \
             finished_at = CASE WHEN ?6 THEN ",
            now!(),
            " ELSE finished_at END \
             WHERE id = ?2 AND state = ?3 RETURNING id"
        ))
        .bind(self.offset())
        .bind(&self.key)
        .bind(t.source.as_str())
        .bind(t.target.as_str())
        .bind(edge == RunTransition::Start)
        .bind(terminal)
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(store_error)?;
        if changed.is_none() {
            return Ok(false);
        }
        sqlx::query(concat!(
            "INSERT INTO workflow_run_event (id, run_id, transition, from_state, to_state, at) VALUES (",
            next_event_id!(),
            " + 1, ?2, ?3, ?4, ?5, ",
            now!(),
            ")"
        ))
        .bind(self.offset())
        .bind(&self.key)
        .bind(edge.as_str())
        .bind(t.source.as_str())
        .bind(t.target.as_str())
        .execute(&mut *self.tx)
        .await
        .map_err(store_error)?;
        self.run.state = t.target;
        self.settled |= terminal;
        Ok(true)
    }

    async fn commit(self) -> Result<(), StoreError> {
        let Self {
            tx,
            inner,
            wrote_outbox,
            settled,
            hold,
            ..
        } = self;
        tx.commit().await.map_err(store_error)?;
        drop(hold);
        if wrote_outbox {
            inner.wakeups.wake(Topic::Publisher);
        }
        if settled {
            inner.wakeups.wake(Topic::RunSettled);
        }
        Ok(())
    }
}
