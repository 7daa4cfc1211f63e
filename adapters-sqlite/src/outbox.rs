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

use flowforge_ports::{Dispatch, DispatchId, OutboxStore, OutboxSweep, Scope, TaskRunId, store};

use crate::queries;
use crate::rows::run_id;
use crate::rows::{decode, priority, scope_key, time};
use crate::store::{Inner, SqliteStore, ids_json, lock, padded, sql};

#[derive(Debug, sqlx::FromRow)]
struct OutboxRow {
    id: i64,
    task_run_id: i64,
    run_id: String,
    task_key: String,
    task_type: String,
    fencing_token: i64,
    created_at: i64,
    priority: i64,
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
                    .bind(i64::try_from(aging.as_millis()).unwrap_or(i64::MAX)),
            )
            .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let dispatches = rows
            .iter()
            .map(|r| {
                let r: OutboxRow = decode(r)?;
                Ok(Dispatch {
                    priority: priority(r.priority, "outbox.priority")?,
                    dispatch_id: DispatchId(r.id),
                    task_run_id: TaskRunId(r.task_run_id),
                    run_id: run_id(&r.run_id)?,
                    task_key: r.task_key,
                    task_type: r.task_type,
                    fencing_token: r.fencing_token,
                    ready_at: Some(time("outbox.created_at", r.created_at)?),
                })
            })
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
        Ok(rows.len() as u64)
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
