//! The transactional outbox
//! (docs/design/outbox-and-queues.md#one-outbox-row-per-readiness): a sweep
//! holds its rows locked (`FOR UPDATE SKIP LOCKED` in a CTE, bounded) in a
//! transaction kept open while the publisher publishes, and marks them in it.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use flowforge_ports::store::Topic;
use flowforge_ports::{Dispatch, DispatchId, OutboxStore, OutboxSweep, RunId, Scope, TaskRunId, store};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::error::store_error;
use crate::queries;
use crate::rows::priority;
use crate::runs::scope_runs;
use crate::store::{PgStore, micros};

/// An outbox row as a sweep reads it, or as a finish that holds its rows
/// returns them (JSON).
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub(crate) struct OutboxRow {
    id: i64,
    task_run_id: i64,
    run_id: Uuid,
    task_key: String,
    task_type: String,
    fencing_token: i64,
    created_at: DateTime<Utc>,
    priority: i16,
}

impl OutboxRow {
    pub(crate) fn into_dispatch(self) -> Result<Dispatch, store::Error> {
        Ok(Dispatch {
            priority: priority(self.priority, "outbox.priority")?,
            dispatch_id: DispatchId(self.id),
            task_run_id: TaskRunId(self.task_run_id),
            run_id: RunId(self.run_id),
            task_key: self.task_key,
            task_type: self.task_type,
            fencing_token: self.fencing_token,
            ready_at: Some(self.created_at),
        })
    }
}

/// One sweep: the rows it holds stay locked until commit or drop (drop
/// rolls back: every row stays unpublished).
pub struct PgSweep {
    store: PgStore,
    /// `None` only once committed (or while dropping).
    tx: Option<Transaction<'static, Postgres>>,
    dispatches: Vec<Dispatch>,
    held: BTreeSet<i64>,
}

impl Drop for PgSweep {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            self.store.inner.rollbacks.spawn(tx);
        }
    }
}

impl fmt::Debug for PgSweep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgSweep")
            .field("dispatches", &self.dispatches.len())
            .finish_non_exhaustive()
    }
}

impl OutboxStore for PgStore {
    type Sweep = PgSweep;

    async fn begin_sweep(&self, scope: Scope, limit: u32, aging: Duration) -> Result<Option<PgSweep>, store::Error> {
        if limit == 0 {
            return Ok(None);
        }
        // A sweep this process dropped may still hold its rows' locks.
        self.inner.rollbacks.settled().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        let rows: Vec<OutboxRow> = sqlx::query_as(queries::SWEEP)
            .bind(i64::from(limit))
            .bind(scope_runs(&scope))
            .bind(micros(aging))
            .bind(self.offset())
            .fetch_all(&mut *tx)
            .await
            .map_err(store_error)?;
        if rows.is_empty() {
            tx.rollback().await.map_err(store_error)?;
            return Ok(None);
        }
        let held = rows.iter().map(|r| r.id).collect();
        let dispatches = rows
            .into_iter()
            .map(OutboxRow::into_dispatch)
            .collect::<Result<_, store::Error>>()?;
        Ok(Some(PgSweep {
            store: self.clone(),
            tx: Some(tx),
            dispatches,
            held,
        }))
    }

    async fn rearm_lost_dispatches(&self, scope: Scope, age: Duration) -> Result<u64, store::Error> {
        let done = sqlx::query(queries::REARM_LOST)
            .bind(self.offset())
            .bind(scope_runs(&scope))
            .bind(micros(age))
            .execute(&self.inner.pool)
            .await
            .map_err(store_error)?;
        self.announce(&[(Topic::Publisher, done.rows_affected() > 0)]).await;
        Ok(done.rows_affected())
    }

    async fn settle_held(&self, published: &[DispatchId], released: &[DispatchId]) -> Result<(), store::Error> {
        if published.is_empty() && released.is_empty() {
            return Ok(());
        }
        let ids = |ids: &[DispatchId]| ids.iter().map(|d| d.0).collect::<Vec<i64>>();
        let woke: bool = sqlx::query_scalar(queries::SETTLE_HELD)
            .bind(self.offset())
            .bind(ids(published))
            .bind(ids(released))
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)?;
        self.announce(&[(Topic::Publisher, woke)]).await;
        Ok(())
    }

    async fn held_for(&self, scope: Scope) -> Result<Option<Duration>, store::Error> {
        let micros: Option<f64> = sqlx::query_scalar(queries::HELD_FOR)
            .bind(self.offset())
            .bind(scope_runs(&scope))
            .fetch_one(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(micros.map(|m| Duration::from_secs_f64(m.max(0.0) / 1_000_000.0)))
    }
}

impl OutboxSweep for PgSweep {
    fn dispatches(&self) -> &[Dispatch] {
        &self.dispatches
    }

    async fn mark_published(&mut self, ids: &[DispatchId]) -> Result<(), store::Error> {
        // Only rows this sweep holds: marking another sweeper's row would
        // wait on its lock and publish nothing.
        let ids: Vec<i64> = ids.iter().map(|d| d.0).filter(|id| self.held.contains(id)).collect();
        if ids.is_empty() {
            return Ok(());
        }
        let offset = self.store.offset();
        let tx = self
            .tx
            .as_deref_mut()
            .ok_or_else(|| store::Error::Other("the sweep has ended".to_owned()))?;
        sqlx::query(queries::MARK_PUBLISHED)
            .bind(offset)
            .bind(&ids)
            .execute(tx)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn commit(mut self) -> Result<(), store::Error> {
        let tx = self
            .tx
            .take()
            .ok_or_else(|| store::Error::Other("the sweep has ended".to_owned()))?;
        tx.commit().await.map_err(store_error)
    }
}
