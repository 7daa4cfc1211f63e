//! The worker registry (docs/design/handlers.md#worker-registry): who serves
//! which task types, and when each was last seen (store time).

use std::collections::BTreeSet;
use std::time::Duration;

use flowforge_ports::{WorkerId, WorkerInfo, WorkerRegistration, WorkerRegistry, store};

use crate::queries;
use crate::rows::WorkerRow;
use crate::rows::duration_ms;
use crate::rows::{col, decode};
use crate::store::{SqliteStore, padded, sql};

impl WorkerRegistry for SqliteStore {
    async fn register_worker(&self, worker: &WorkerRegistration) -> Result<(), store::Error> {
        let types: BTreeSet<&str> = worker.task_types.iter().map(String::as_str).collect();
        let types = serde_json::to_string(&types).map_err(|e| store::Error::Other(e.to_string()))?;
        let offset = self.inner.offset();
        self.inner
            .write()
            .await?
            .call(padded(
                sql(queries::REGISTER_WORKER)
                    .bind(offset)
                    .bind(worker.id.0.clone())
                    .bind(worker.host.clone())
                    .bind(i64::from(worker.pid))
                    .bind(types)
                    .bind(i64::from(worker.concurrency)),
            ))
            .await?;
        Ok(())
    }

    async fn touch_worker(&self, id: &WorkerId) -> Result<(), store::Error> {
        let offset = self.inner.offset();
        self.inner
            .write()
            .await?
            .call(padded(sql(queries::TOUCH_WORKER).bind(offset).bind(id.0.clone())))
            .await?;
        Ok(())
    }

    async fn deregister_worker(&self, id: &WorkerId) -> Result<(), store::Error> {
        let offset = self.inner.offset();
        self.inner
            .write()
            .await?
            .call(padded(sql(queries::DEREGISTER_WORKER).bind(offset).bind(id.0.clone())))
            .await?;
        Ok(())
    }

    async fn list_workers(&self) -> Result<Vec<WorkerInfo>, store::Error> {
        let rows = self.inner.read().await?.call(sql(queries::LIST_WORKERS)).await?;
        rows.iter().map(|r| Ok(decode::<WorkerRow>(r)?.into_info()?)).collect()
    }

    async fn live_task_types(&self, within: Duration) -> Result<BTreeSet<String>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(queries::LIVE_TASK_TYPES)
                    .bind(self.inner.offset())
                    .bind(duration_ms(within)),
            )
            .await?;
        rows.iter().map(|r| col::<String>(r, 0)).collect()
    }
}
