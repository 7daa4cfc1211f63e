//! The worker registry (docs/design/handlers.md#worker-registry): who serves
//! which task types, and when each was last seen (store time).

use std::collections::BTreeSet;
use std::time::Duration;

use flowforge_ports::{WorkerId, WorkerInfo, WorkerRegistration, WorkerRegistry, store};

use crate::convert::{col, decode};
use crate::convert::{duration_ms, json, opt_time, time, u32_of};
use crate::error::DecodeError;
use crate::store::{SqliteStore, padded, sql};

/// register_worker in one call: a re-registration refreshes everything but
/// the first start. `?2` id, `?3` host, `?4` pid, `?5` task types, `?6` concurrency.
pub(crate) const REGISTER: &str = concat!(
    "BEGIN IMMEDIATE; \
     INSERT INTO worker (id, host, pid, task_types, concurrency, started_at, last_seen_at) \
     VALUES (?2, ?3, ?4, ?5, ?6, ",
    now!(),
    ", ",
    now!(),
    ") ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
     task_types = excluded.task_types, concurrency = excluded.concurrency, \
     last_seen_at = excluded.last_seen_at, stopped_at = NULL; COMMIT"
);

/// touch_worker in one call. `?2` id.
pub(crate) const TOUCH: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE worker SET last_seen_at = ",
    now!(),
    " WHERE id = ?2; COMMIT"
);

/// deregister_worker in one call. `?2` id.
pub(crate) const DEREGISTER: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE worker SET stopped_at = ",
    now!(),
    ", last_seen_at = ",
    now!(),
    " WHERE id = ?2; COMMIT"
);

#[derive(Debug, sqlx::FromRow)]
struct WorkerRow {
    id: String,
    host: String,
    pid: i64,
    task_types: String,
    concurrency: i64,
    started_at: i64,
    last_seen_at: i64,
    stopped_at: Option<i64>,
}

impl WorkerRow {
    fn into_info(self) -> Result<WorkerInfo, DecodeError> {
        let types = json("worker.task_types", &self.task_types)?;
        let task_types = serde_json::from_value(types).map_err(|e| DecodeError::Json {
            column: "worker.task_types",
            problem: e.to_string(),
        })?;
        Ok(WorkerInfo {
            id: WorkerId(self.id),
            host: self.host,
            pid: u32_of("worker.pid", self.pid)?,
            task_types,
            concurrency: u32_of("worker.concurrency", self.concurrency)?,
            started_at: time("worker.started_at", self.started_at)?,
            last_seen_at: time("worker.last_seen_at", self.last_seen_at)?,
            stopped_at: opt_time("worker.stopped_at", self.stopped_at)?,
        })
    }
}

impl WorkerRegistry for SqliteStore {
    async fn register_worker(&self, worker: &WorkerRegistration) -> Result<(), store::Error> {
        let types: BTreeSet<&str> = worker.task_types.iter().map(String::as_str).collect();
        let types = serde_json::to_string(&types).map_err(|e| store::Error::Other(e.to_string()))?;
        let offset = self.inner.offset();
        self.inner
            .write()
            .await?
            .call(padded(
                sql(REGISTER)
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
            .call(padded(sql(TOUCH).bind(offset).bind(id.0.clone())))
            .await?;
        Ok(())
    }

    async fn deregister_worker(&self, id: &WorkerId) -> Result<(), store::Error> {
        let offset = self.inner.offset();
        self.inner
            .write()
            .await?
            .call(padded(sql(DEREGISTER).bind(offset).bind(id.0.clone())))
            .await?;
        Ok(())
    }

    async fn list_workers(&self) -> Result<Vec<WorkerInfo>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(
                "SELECT id, host, pid, task_types, concurrency, started_at, last_seen_at, stopped_at FROM worker \
                 ORDER BY last_seen_at DESC, id",
            ))
            .await?;
        rows.iter().map(|r| Ok(decode::<WorkerRow>(r)?.into_info()?)).collect()
    }

    async fn live_task_types(&self, within: Duration) -> Result<BTreeSet<String>, store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(
                sql(concat!(
                    "SELECT DISTINCT j.value FROM worker AS w, json_each(w.task_types) AS j \
                     WHERE w.stopped_at IS NULL AND w.last_seen_at >= ",
                    now!(),
                    " - ?2"
                ))
                .bind(self.inner.offset())
                .bind(duration_ms(within)),
            )
            .await?;
        rows.iter().map(|r| col::<String>(r, 0)).collect()
    }
}
