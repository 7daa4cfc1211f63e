//! Worker registrations (docs/design/handlers.md#worker-registry): who serves
//! which task types, seen when — in store time, so tests age a worker by moving
//! the clock.

use std::collections::BTreeSet;
use std::time::Duration;

use flowforge_ports::{WorkerId, WorkerInfo, WorkerRegistration, WorkerRegistry, store};
use serde_json::Value;

use crate::error::store_error;
use crate::queries;
use crate::rows::{WorkerRow, to_i32};
use crate::store::{PgStore, interval};

impl WorkerRegistry for PgStore {
    async fn register_worker(&self, worker: &WorkerRegistration) -> Result<(), store::Error> {
        let types = Value::from(worker.task_types.clone());
        let pid =
            i32::try_from(worker.pid).map_err(|_| store::Error::Other(format!("pid {} is too large", worker.pid)))?;
        sqlx::query(queries::REGISTER_WORKER)
            .bind(self.offset())
            .bind(&worker.id.0)
            .bind(&worker.host)
            .bind(pid)
            .bind(&types)
            .bind(to_i32(worker.concurrency, "concurrency")?)
            .execute(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn touch_worker(&self, id: &WorkerId) -> Result<(), store::Error> {
        sqlx::query(queries::TOUCH_WORKER)
            .bind(self.offset())
            .bind(&id.0)
            .execute(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn deregister_worker(&self, id: &WorkerId) -> Result<(), store::Error> {
        sqlx::query(queries::DEREGISTER_WORKER)
            .bind(self.offset())
            .bind(&id.0)
            .execute(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn list_workers(&self) -> Result<Vec<WorkerInfo>, store::Error> {
        let rows: Vec<WorkerRow> = sqlx::query_as(queries::LIST_WORKERS)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        rows.into_iter().map(WorkerRow::into_info).collect()
    }

    async fn live_task_types(&self, within: Duration) -> Result<BTreeSet<String>, store::Error> {
        let types: Vec<String> = sqlx::query_scalar(queries::LIVE_TASK_TYPES)
            .bind(self.offset())
            .bind(interval(within)?)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(store_error)?;
        Ok(types.into_iter().collect())
    }
}
