//! The transactional outbox's sweep
//! (docs/design/outbox-and-queues.md#the-publisher) over SQLite.
//!
//! PostgreSQL locks swept rows with `FOR UPDATE SKIP LOCKED` and holds its
//! transaction while the rows are published. On SQLite that transaction
//! would hold the only writer for the whole publish, stalling every claim
//! and finish behind the broker. So a sweep holds its rows in process
//! instead: a concurrent sweep skips them, dropping the sweep releases
//! them unpublished, and `commit` writes the marks in one short write
//! transaction. Two processes sweeping one file could both publish a row,
//! which the ports allow (a duplicate dispatch claims nothing).

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use flowforge_ports::{Dispatch, DispatchId, OutboxStore, OutboxSweep, Scope, TaskRunId, Topic, store};

use crate::queries;
use crate::rows::run_id;
use crate::rows::{col, decode, priority, scope_key, time};
use crate::store::{Inner, SqliteStore, ids_json, lock, padded, sql};

/// An outbox row as a sweep reads it, or as a finish that holds its rows
/// returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct OutboxRow {
    id: i64,
    task_run_id: i64,
    run_id: String,
    task_key: String,
    task_type: String,
    fencing_token: i64,
    created_at: i64,
    priority: i64,
}

impl OutboxRow {
    pub(crate) fn into_dispatch(self) -> Result<Dispatch, store::Error> {
        Ok(Dispatch {
            priority: priority(self.priority, "outbox.priority")?,
            dispatch_id: DispatchId(self.id),
            task_run_id: TaskRunId(self.task_run_id),
            run_id: run_id(&self.run_id)?,
            task_key: self.task_key,
            task_type: self.task_type,
            fencing_token: self.fencing_token,
            ready_at: Some(time("outbox.created_at", self.created_at)?),
        })
    }
}

/// An open sweep: rows held in this process until committed or dropped.
pub struct SqliteSweep {
    inner: Arc<Inner>,
    dispatches: Vec<Dispatch>,
    held: HashSet<i64>,
    marked: Vec<i64>,
}

impl fmt::Debug for SqliteSweep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteSweep")
            .field("dispatches", &self.dispatches)
            .field("marked", &self.marked)
            .finish_non_exhaustive()
    }
}

impl Drop for SqliteSweep {
    fn drop(&mut self) {
        let mut held = lock(&self.inner.held_dispatches);
        for id in &self.held {
            held.remove(id);
        }
    }
}

impl OutboxStore for SqliteStore {
    type Sweep = SqliteSweep;

    async fn begin_sweep(
        &self,
        scope: Scope,
        limit: u32,
        aging: Duration,
    ) -> Result<Option<SqliteSweep>, store::Error> {
        let _gate = self.inner.sweep_gate.lock().await;
        let skip: Vec<i64> = lock(&self.inner.held_dispatches).iter().copied().collect();
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::SWEEP)
                    .bind(scope_key(&scope))
                    .bind(ids_json(&skip))
                    .bind(i64::from(limit))
                    .bind(i64::try_from(aging.as_millis()).unwrap_or(i64::MAX))
                    .bind(self.inner.offset()),
            )
            .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let dispatches = rows
            .iter()
            .map(|r| decode::<OutboxRow>(r)?.into_dispatch())
            .collect::<Result<Vec<_>, store::Error>>()?;
        let held: HashSet<i64> = dispatches.iter().map(|d| d.dispatch_id.0).collect();
        lock(&self.inner.held_dispatches).extend(held.iter().copied());
        Ok(Some(SqliteSweep {
            inner: self.inner.clone(),
            dispatches,
            held,
            marked: Vec::new(),
        }))
    }

    async fn rearm_lost_dispatches(&self, scope: Scope, age: Duration) -> Result<u64, store::Error> {
        let offset = self.inner.offset();
        let rows = self
            .inner
            .write()
            .await?
            .call(
                sql(queries::REARM_LOST)
                    .bind(offset)
                    .bind(scope_key(&scope))
                    .bind(i64::try_from(age.as_millis()).unwrap_or(i64::MAX)),
            )
            .await?;
        if !rows.is_empty() {
            self.inner.wakeups.wake(Topic::Publisher);
        }
        Ok(rows.len() as u64)
    }

    async fn settle_held(&self, published: &[DispatchId], released: &[DispatchId]) -> Result<(), store::Error> {
        if published.is_empty() && released.is_empty() {
            return Ok(());
        }
        let ids = |ids: &[DispatchId]| ids_json(&ids.iter().map(|d| d.0).collect::<Vec<i64>>());
        let offset = self.inner.offset();
        let rows = self
            .inner
            .write()
            .await?
            .call(padded(
                sql(queries::SETTLE_HELD)
                    .bind(offset)
                    .bind(ids(published))
                    .bind(ids(released)),
            ))
            .await?;
        if !rows.is_empty() {
            self.inner.wakeups.wake(Topic::Publisher);
        }
        Ok(())
    }

    async fn held_for(&self, scope: Scope) -> Result<Option<Duration>, store::Error> {
        let offset = self.inner.offset();
        let rows = self
            .inner
            .read()
            .await?
            .call(padded(sql(queries::HELD_FOR).bind(offset).bind(scope_key(&scope))))
            .await?;
        let millis: Option<i64> = match rows.first() {
            Some(row) => col(row, 0)?,
            None => None,
        };
        Ok(millis.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }
}

impl OutboxSweep for SqliteSweep {
    fn dispatches(&self) -> &[Dispatch] {
        &self.dispatches
    }

    async fn mark_published(&mut self, ids: &[DispatchId]) -> Result<(), store::Error> {
        // Only rows this sweep holds: another sweep's rows are not ours to mark.
        self.marked
            .extend(ids.iter().map(|d| d.0).filter(|id| self.held.contains(id)));
        Ok(())
    }

    async fn commit(mut self) -> Result<(), store::Error> {
        let marked = std::mem::take(&mut self.marked);
        if marked.is_empty() {
            return Ok(());
        }
        let offset = self.inner.offset();
        self.inner
            .write()
            .await?
            .call(padded(
                sql(queries::MARK_PUBLISHED).bind(offset).bind(ids_json(&marked)),
            ))
            .await?;
        Ok(())
    }
}
