//! The store handle: connection pools, migrations, and the SQL helpers that
//! every write path shares (event rows, outbox rows).

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use flowforge_ports::{Clock, RunId, StoreError};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqliteConnection, Transaction};

use crate::convert::offset_ms;
use crate::error::{migrate_error, store_error};
use crate::notify::Wakeups;

/// How long a statement waits for another process's lock on the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller waits for the writer connection before `Unavailable`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
/// Read connections: reads run beside the writer in WAL mode.
const READERS: u32 = 4;

/// FlowForge's store over SQLite. Cheap to clone: clones share the pools,
/// the clock and the wake-ups.
#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// ONE connection: every write transaction queues here.
    pub(crate) writer: SqlitePool,
    /// Read-only queries (for `sqlite::memory:`, the writer itself).
    pub(crate) reader: SqlitePool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) wakeups: Arc<Wakeups>,
    /// Runs whose scheduler pass is open in this process: a second
    /// `begin_pass` skips them, as `FOR UPDATE SKIP LOCKED` does on PostgreSQL.
    pub(crate) held_runs: Mutex<HashSet<RunId>>,
    /// Outbox rows handed to an open sweep in this process: a concurrent
    /// sweep skips them, so the open sweep does not hold the writer while
    /// its rows are published.
    pub(crate) held_dispatches: Mutex<HashSet<i64>>,
    /// Serialises choosing rows for sweeps, so two sweeps never pick the same row.
    pub(crate) sweep_gate: tokio::sync::Mutex<()>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("writer", &self.inner.writer)
            .field("reader", &self.inner.reader)
            .field("clock_offset", &self.inner.clock.offset())
            .finish_non_exhaustive()
    }
}

/// Locks a std mutex, taking the data even if a panicking holder poisoned
/// it: the sets it guards stay consistent under any interleaving.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a URL names an in-memory database.
fn is_memory(url: &str) -> bool {
    let rest = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
    let (db, params) = rest.split_once('?').unwrap_or((rest, ""));
    db == ":memory:" || params.split('&').any(|p| p == "mode=memory")
}

impl SqliteStore {
    /// Opens (creating if missing, with its folder) the database at `url`
    /// and applies the embedded migrations.
    ///
    /// Accepts `sqlite://path/to/file.db`, `sqlite:relative.db` and
    /// `sqlite::memory:`; an in-memory database lives on one shared
    /// connection, so every clone of the store sees the same data (and a
    /// read waits while a scheduler pass holds that connection).
    pub async fn connect(url: &str, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Other(format!("invalid SQLite URL '{url}': {e}")))?
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        let (writer, reader) = if is_memory(url) {
            // An in-memory database dies with its last connection, and
            // shared-cache connections lock whole tables: one connection,
            // never recycled, serves reads and writes alike.
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .test_before_acquire(false)
                .connect_with(options)
                .await
                .map_err(store_error)?;
            (pool.clone(), pool)
        } else {
            let options = options
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal);
            if let Some(parent) = options.get_filename().parent()
                && !parent.as_os_str().is_empty()
            {
                std::fs::create_dir_all(parent)
                    .map_err(|e| StoreError::Unavailable(format!("cannot create folder {}: {e}", parent.display())))?;
            }
            let writer = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .test_before_acquire(false)
                .connect_with(options.clone())
                .await
                .map_err(store_error)?;
            // Created after the writer switched the file to WAL.
            let reader = SqlitePoolOptions::new()
                .max_connections(READERS)
                .min_connections(0)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .test_before_acquire(false)
                .connect_lazy_with(options);
            (writer, reader)
        };
        let store = Self {
            inner: Arc::new(Inner {
                writer,
                reader,
                clock,
                wakeups: Arc::new(Wakeups::default()),
                held_runs: Mutex::new(HashSet::new()),
                held_dispatches: Mutex::new(HashSet::new()),
                sweep_gate: tokio::sync::Mutex::new(()),
            }),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Applies the embedded migrations (idempotent; `connect` already did).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("./migrations")
            .run(&self.inner.writer)
            .await
            .map_err(migrate_error)
    }

    /// Closes both pools, waiting for open connections to finish.
    pub async fn close(&self) {
        self.inner.writer.close().await;
        self.inner.reader.close().await;
    }
}

impl Inner {
    /// The Clock port's offset, bound as `?1` wherever store time is computed.
    pub(crate) fn offset(&self) -> i64 {
        offset_ms(&*self.clock)
    }

    /// Opens a write transaction on the writer connection.
    pub(crate) async fn write(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        // IMMEDIATE takes the file's write lock at BEGIN: a writer in another
        // process makes us wait there (busy timeout) instead of failing a
        // read-to-write upgrade half-way through the transaction.
        self.writer.begin_with("BEGIN IMMEDIATE").await.map_err(store_error)
    }
}

/// A JSON array of row ids, for `json_each(?)` batches.
pub(crate) fn ids_json(ids: &[i64]) -> String {
    let mut s = String::with_capacity(ids.len() * 8 + 2);
    s.push('[');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&id.to_string());
    }
    s.push(']');
    s
}

/// One transition to record for a batch of task runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Edge<'a> {
    pub(crate) transition: &'static str,
    pub(crate) from: &'static str,
    pub(crate) to: &'static str,
    pub(crate) worker: Option<&'a str>,
    pub(crate) error: Option<&'a str>,
}

impl<'a> Edge<'a> {
    pub(crate) fn new(transition: &'static str, from: &'static str, to: &'static str) -> Self {
        Self {
            transition,
            from,
            to,
            worker: None,
            error: None,
        }
    }

    pub(crate) fn worker(self, worker: Option<&'a str>) -> Self {
        Self { worker, ..self }
    }

    pub(crate) fn error(self, error: Option<&'a str>) -> Self {
        Self { error, ..self }
    }
}

/// Writes one event row per task run in `ids` (which an UPDATE has just
/// moved along `edge`), with the rows' current attempt and token — the
/// values after the transition. One statement for the whole batch.
pub(crate) async fn record(
    conn: &mut SqliteConnection,
    offset: i64,
    ids: &[i64],
    edge: Edge<'_>,
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(concat!(
        "INSERT INTO task_run_event (id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt, \
         fencing_token, worker, at, error) SELECT ",
        next_event_id!(),
        " + ROW_NUMBER() OVER (ORDER BY id), id, run_id, task_key, ?3, ?4, ?5, attempt, fencing_token, ?6, ",
        now!(),
        ", ?7 FROM task_run WHERE id IN (SELECT value FROM json_each(?2)) ORDER BY id"
    ))
    .bind(offset)
    .bind(ids_json(ids))
    .bind(edge.transition)
    .bind(edge.from)
    .bind(edge.to)
    .bind(edge.worker)
    .bind(edge.error)
    .execute(conn)
    .await
    .map_err(store_error)?;
    Ok(())
}

/// Writes the outbox row of each task run in `ids`, which has just become
/// ready at its current token (decision 9). One statement for the batch.
pub(crate) async fn dispatch(conn: &mut SqliteConnection, offset: i64, ids: &[i64]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let written = sqlx::query(concat!(
        "INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at) \
         SELECT tr.id, tr.run_id, tr.task_key, t.task_type, tr.fencing_token, ",
        now!(),
        " FROM task_run tr \
         JOIN workflow_run r ON r.id = tr.run_id \
         JOIN task t ON t.workflow_id = r.workflow_id AND t.key = tr.task_key \
         WHERE tr.id IN (SELECT value FROM json_each(?2)) ORDER BY tr.id"
    ))
    .bind(offset)
    .bind(ids_json(ids))
    .execute(conn)
    .await
    .map_err(store_error)?
    .rows_affected();
    if usize::try_from(written).ok() != Some(ids.len()) {
        // A ready row without a dispatch would never run; refuse to commit it.
        return Err(StoreError::Corrupt(format!(
            "{} of {} task runs made ready have no task row to dispatch from",
            ids.len().saturating_sub(usize::try_from(written).unwrap_or(0)),
            ids.len()
        )));
    }
    Ok(())
}
