//! The store handle: its connections, migrations, and the one way every
//! query reaches SQLite ([`Conn`]).
//!
//! Why no pool: with sqlx every statement is a round trip to the
//! connection's own worker thread (tens of µs on a small, busy VM, most of
//! it thread wake-ups), and a pool acquire costs more than that again. So the writer
//! is ONE connection behind an async mutex, the readers a few connections
//! each behind its own mutex, and every hot operation is ONE call holding
//! all its statements (`BEGIN IMMEDIATE; …; COMMIT`), which sqlx-sqlite
//! runs back to back on the worker thread.
//!
//! A call that opens a transaction may not finish it: a statement fails, a
//! caller drops the future half-way, a pass is dropped without commit.
//! Each slot therefore records that its connection may be inside a
//! transaction (`needs_rollback`), set before every call and cleared once
//! the call is known to have ended it; whoever finds it set issues
//! `ROLLBACK` before anything else, so a write left behind is never
//! committed by the next user's `COMMIT`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use flowforge_ports::{Clock, RunId, WorkflowId, store};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqliteRow, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Sqlite, SqliteConnection};
use tokio::sync::{OwnedMutexGuard, mpsc};

use crate::error::{migrate_error, store_error};
use crate::group::Group;
use crate::inputs::InputCache;
use crate::notify::Wakeups;
use crate::rows::{col, offset_ms};

/// The schema, embedded in the binary.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long a statement waits for another process's lock on the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller waits for a connection before `Unavailable`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
/// Read connections: reads run beside the writer in WAL mode. The loops of
/// one process read at most this many at once (scheduler, publisher, two
/// worker slots), so a reader is almost always free.
const READERS: usize = 4;

/// Bytes per database page for a new file (SQLite's default is 4 096).
const PAGE_SIZE: u32 = 1024;
/// Bytes of the database file each connection maps (reads beyond it use
/// ordinary I/O).
const MMAP_SIZE: &str = "268435456";
/// Write calls between two background checkpoints (a claim or finish adds
/// six or seven pages to the WAL, so about 800 pages, close to SQLite's
/// own threshold of 1 000: each checkpoint fsyncs twice, however little
/// it copies).
const CHECKPOINT_EVERY: u32 = 128;
/// The writer's own automatic checkpoint, in WAL pages: only a safety net
/// for a background checkpointer that cannot keep up (SQLite's default is
/// 1 000 pages).
const WRITER_AUTOCHECKPOINT: &str = "10000";
/// Bytes the WAL file keeps when it restarts: checkpoints that run beside
/// a busy writer rarely catch up with it, so a long burst grows the WAL
/// further than SQLite's own checkpoints would; this gives the space back.
const WAL_SIZE_LIMIT: &str = "67108864";
/// How long a call's caller keeps its thread awake waiting for the
/// answer ([`eager`]): about a claim or a finish on a small VM.
const EAGER_WAIT: Duration = Duration::from_micros(250);

/// NULLs bound after a multi-statement call's own values. sqlx numbers a
/// statement's unused slots below its highest `?NNN` positionally, counting
/// on from the slots of the statements before it; once that count passes
/// the values bound it stops binding the statement, leaving its later
/// `?NNN` NULL. Padding keeps every slot in range (`tests::padding_covers_every_call`
/// checks each multi-statement SQL needs fewer).
pub(crate) const PAD: usize = 64;

/// A query as the store builds it: SQL text is always a `'static` constant,
/// values are always bound.
pub(crate) type Query = sqlx::query::Query<'static, Sqlite, SqliteArguments>;

/// A `'static` SQL constant as a query (`&'static str` is SQL-safe to sqlx).
pub(crate) fn sql(text: &'static str) -> Query {
    sqlx::query(text)
}

/// Binds [`PAD`] NULLs after a multi-statement call's own values.
pub(crate) fn padded(mut q: Query) -> Query {
    for _ in 0..PAD {
        q = q.bind(None::<i64>);
    }
    q
}

/// FlowForge's store over SQLite. Cheap to clone: clones share the
/// connections, the clock and the wake-ups.
#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// ONE connection: every write transaction queues here.
    pub(crate) writer: Arc<Slot>,
    /// Read-only queries (for `sqlite::memory:`, the writer itself).
    readers: Vec<Arc<Slot>>,
    /// Which reader the next read waits for when all are busy.
    next_reader: AtomicUsize,
    /// Write calls so far, to pace the background checkpoints.
    pub(crate) writes: AtomicU32,
    /// Asks the background checkpointer for a checkpoint (file databases).
    checkpoints: Option<mpsc::Sender<()>>,
    /// The checkpointer's connection, closed with the others.
    checkpointer: Option<Arc<Slot>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) wakeups: Arc<Wakeups>,
    /// Runs whose scheduler pass is open in this process: a second
    /// `begin_pass` skips them, as `FOR NO KEY UPDATE SKIP LOCKED` does on PostgreSQL.
    pub(crate) held_runs: Mutex<HashSet<RunId>>,
    /// Outbox rows handed to an open sweep in this process: a concurrent
    /// sweep skips them, so the open sweep does not hold the writer while
    /// its rows are published.
    pub(crate) held_dispatches: Mutex<HashSet<i64>>,
    /// Serialises choosing rows for sweeps, so two sweeps never pick the same row.
    pub(crate) sweep_gate: tokio::sync::Mutex<()>,
    /// Run inputs and succeeded outputs already read or written.
    pub(crate) inputs: Mutex<InputCache>,
    /// The forward tasks a start of each definition creates, already read:
    /// a published (name, version) never changes, so neither do they.
    pub(crate) start_tasks: Mutex<HashMap<WorkflowId, Arc<[StartTask]>>>,
    /// Claims and finishes waiting for the writer, to commit together.
    pub(crate) group: Group,
}

/// A forward task as a start creates its task run: key, dependency
/// count, own priority, and whether the scheduler decides it
/// (docs/design/conditions.md#deciding).
#[derive(Debug)]
pub(crate) struct StartTask {
    pub(crate) key: String,
    pub(crate) deps: i64,
    pub(crate) priority: Option<i64>,
    pub(crate) conditional: bool,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("readers", &self.inner.readers.len())
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

/// Creates the database file (0600) and the folders above it (0700) when
/// missing, so that only their owner can read the runs' inputs and outputs.
/// SQLite gives the `-wal` and `-shm` files the database file's mode.
/// Existing files and folders keep theirs: their owner chose them.
fn create_private(path: &std::path::Path) -> Result<(), store::Error> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| store::Error::Unavailable(format!("cannot create folder {}: {e}", parent.display())))?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(store::Error::Unavailable(format!(
            "cannot create database file {}: {e}",
            path.display()
        ))),
    }
}

/// The writer's slot, its connection given what only the writer's calls
/// use: the temporary table of a finish that hands on, kept in memory.
async fn writer(mut conn: SqliteConnection) -> Result<Slot, store::Error> {
    for statement in ["PRAGMA temp_store = MEMORY", crate::queries::CREATE_HANDING_OFF] {
        sqlx::query(statement).execute(&mut conn).await.map_err(store_error)?;
    }
    Ok(Slot::open(conn, None))
}

impl SqliteStore {
    /// Opens (creating if missing, with its folder) the database at `url`
    /// and applies the embedded migrations. A created file is private to
    /// its owner (0600, its folders 0700).
    ///
    /// Accepts `sqlite://path/to/file.db`, `sqlite:relative.db` and
    /// `sqlite::memory:`; an in-memory database lives on one shared
    /// connection, so every clone of the store sees the same data (and a
    /// read waits while a scheduler pass holds that connection).
    pub async fn connect(url: &str, clock: Arc<dyn Clock>) -> Result<Self, store::Error> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| store::Error::Other(format!("invalid SQLite URL '{url}': {e}")))?
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        let (writer, readers, checkpointer) = if is_memory(url) {
            // An in-memory database dies with its last connection, and
            // shared-cache connections lock whole tables: one connection,
            // never recycled, serves reads and writes alike.
            let writer = Arc::new(writer(options.connect().await.map_err(store_error)?).await?);
            (writer.clone(), vec![writer], None)
        } else {
            let options = options
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                // Every write elsewhere empties a connection's page cache
                // (WAL mode cannot tell which pages changed), so a reader
                // re-reads each page it touches; mapped, those reads of
                // the database file are memory reads instead of syscalls.
                .pragma("mmap_size", MMAP_SIZE)
                // A claim or a finish changes a few small entries on six or
                // seven pages (the row, three indexes, the event and its
                // index), and a commit writes each changed page whole to
                // the WAL: smaller pages make every commit cheaper (the
                // embedded benchmark's claim + finish: ~40% less time).
                // Applied only when the file is created; bulky JSON (a
                // definition, a large output) spills into more overflow
                // pages, which only its rare reads pay for.
                .page_size(PAGE_SIZE);
            create_private(options.get_filename())?;
            // A checkpoint run by a COMMIT copies up to a thousand pages and
            // fsyncs twice: milliseconds on a small VM's disk, on the path
            // of whichever claim or finish crossed the threshold. So the
            // writer leaves checkpoints to a connection of their own.
            let conn = options
                .clone()
                .pragma("wal_autocheckpoint", WRITER_AUTOCHECKPOINT)
                .pragma("journal_size_limit", WAL_SIZE_LIMIT)
                .connect()
                .await
                .map_err(store_error)?;
            let writer = Arc::new(writer(conn).await?);
            // Opened after the writer switched the file to WAL: by the
            // warm-up below, or by their first use if that comes first.
            let readers = (0..READERS).map(|_| Arc::new(Slot::lazy(options.clone()))).collect();
            (writer, readers, Some(Arc::new(Slot::lazy(options))))
        };
        let checkpoints = checkpointer.as_ref().map(|slot| {
            // Capacity 1: a request made while one waits adds nothing.
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(checkpoint(slot.clone(), rx));
            tx
        });
        let store = Self {
            inner: Arc::new(Inner {
                writer,
                readers,
                next_reader: AtomicUsize::new(0),
                writes: AtomicU32::new(0),
                checkpoints,
                checkpointer,
                clock,
                wakeups: Arc::new(Wakeups::default()),
                held_runs: Mutex::new(HashSet::new()),
                held_dispatches: Mutex::new(HashSet::new()),
                sweep_gate: tokio::sync::Mutex::new(()),
                inputs: Mutex::new(InputCache::default()),
                start_tasks: Mutex::new(HashMap::new()),
                group: Group::default(),
            }),
        };
        store.migrate().await?;
        // Opening a connection takes a thread and a few milliseconds: open
        // the others now, beside the caller, rather than in the middle of
        // the first run's hops when reads first overlap.
        let lazy: Vec<Arc<Slot>> = store
            .inner
            .readers
            .iter()
            .chain(&store.inner.checkpointer)
            .filter(|slot| slot.options.is_some())
            .cloned()
            .collect();
        if !lazy.is_empty() {
            tokio::spawn(async move {
                for slot in lazy {
                    // A failure surfaces on the first real use instead.
                    let _ = Conn::acquire(&slot).await;
                }
            });
        }
        Ok(store)
    }

    /// Applies the embedded migrations (idempotent; `connect` already did).
    pub async fn migrate(&self) -> Result<(), store::Error> {
        let mut conn = self.inner.write().await?;
        let result = MIGRATOR.run_direct(None, conn.raw()?, false).await;
        result.map_err(migrate_error)
    }

    /// Checks that the database holds exactly this binary's migrations,
    /// applied and unmodified, as `connect` left it: another process may
    /// have migrated the file further since, or broken it.
    pub(crate) async fn check_migrations(&self) -> Result<(), store::Error> {
        let rows = self
            .inner
            .read()
            .await?
            .call(sql(
                "SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version",
            ))
            .await?;
        let mut applied = std::collections::BTreeMap::new();
        for row in &rows {
            let version: i64 = col(row, 0)?;
            let success: bool = col(row, 1)?;
            let checksum: Vec<u8> = col(row, 2)?;
            applied.insert(version, (success, checksum));
        }
        store::check_migrations(
            MIGRATOR
                .iter()
                .map(|m| (m.version, m.description.as_ref(), m.checksum.as_ref())),
            &applied,
        )
    }

    /// Closes every connection, waiting for calls in flight to finish;
    /// later calls fail as `Unavailable`.
    pub async fn close(&self) {
        let mut slots = vec![self.inner.writer.clone()];
        slots.extend(self.inner.readers.iter().cloned());
        slots.extend(self.inner.checkpointer.iter().cloned());
        for slot in slots {
            let mut state = slot.state.clone().lock_owned().await;
            state.closed = true;
            if let Some(conn) = state.conn.take() {
                // A connection left inside a transaction rolls it back as
                // SQLite closes it.
                let _ = conn.close().await;
            }
        }
    }
}

impl Inner {
    /// The Clock port's offset, bound as `?1` wherever store time is computed.
    pub(crate) fn offset(&self) -> i64 {
        offset_ms(&*self.clock)
    }

    /// The writer connection, exclusively, until the guard is dropped, for
    /// one write call.
    pub(crate) async fn write(&self) -> Result<Conn, store::Error> {
        let conn = self.hold_writer().await?;
        self.wrote(1);
        Ok(conn)
    }

    /// The writer connection, counting no write: the caller counts what
    /// it writes ([`Inner::wrote`]).
    pub(crate) async fn hold_writer(&self) -> Result<Conn, store::Error> {
        Conn::acquire(&self.writer).await
    }

    /// Counts `calls` write calls, asking for a background checkpoint each
    /// time the count crosses a multiple of [`CHECKPOINT_EVERY`].
    pub(crate) fn wrote(&self, calls: usize) {
        let Some(checkpoints) = &self.checkpoints else {
            return;
        };
        let calls = u32::try_from(calls).unwrap_or(u32::MAX);
        let before = self.writes.fetch_add(calls, Ordering::Relaxed);
        if before / CHECKPOINT_EVERY != before.wrapping_add(calls) / CHECKPOINT_EVERY {
            // Full: a checkpoint is already due, and will cover these pages.
            let _ = checkpoints.try_send(());
        }
    }

    /// A reader connection: the first free one, so a connection is opened
    /// only when that many reads overlap; when all are busy, a wait on one
    /// of them in turn.
    pub(crate) async fn read(&self) -> Result<Conn, store::Error> {
        for slot in &self.readers {
            if let Ok(guard) = slot.state.clone().try_lock_owned() {
                return Conn::ready(slot, guard).await;
            }
        }
        let next = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
        Conn::acquire(&self.readers[next]).await
    }
}

/// The background checkpointer: a PASSIVE checkpoint on its own
/// connection whenever the writer asks, so WAL pages reach the database
/// file beside the writer instead of inside one of its commits. It ends
/// when the store is dropped (the sender goes) or closed.
async fn checkpoint(slot: Arc<Slot>, mut requests: mpsc::Receiver<()>) {
    while requests.recv().await.is_some() {
        let Ok(mut conn) = Conn::acquire(&slot).await else {
            return;
        };
        if let Err(e) = conn.call(sql("PRAGMA wal_checkpoint(PASSIVE)")).await {
            // Another process's checkpoint, a busy file: the next request retries.
            tracing::debug!(error = %e, "background WAL checkpoint failed");
        }
    }
}

/// One connection slot.
pub(crate) struct Slot {
    state: Arc<tokio::sync::Mutex<SlotState>>,
    /// How to open the connection when it is first needed (readers, the
    /// checkpointer); `None` for the writer, opened at connect.
    options: Option<SqliteConnectOptions>,
}

struct SlotState {
    conn: Option<SqliteConnection>,
    /// The connection may be inside a transaction nobody will finish: the
    /// next user rolls it back first.
    needs_rollback: bool,
    closed: bool,
}

impl Slot {
    fn open(conn: SqliteConnection, options: Option<SqliteConnectOptions>) -> Self {
        Self {
            state: Arc::new(tokio::sync::Mutex::new(SlotState {
                conn: Some(conn),
                needs_rollback: false,
                closed: false,
            })),
            options,
        }
    }

    fn lazy(options: SqliteConnectOptions) -> Self {
        Self {
            state: Arc::new(tokio::sync::Mutex::new(SlotState {
                conn: None,
                needs_rollback: false,
                closed: false,
            })),
            options: Some(options),
        }
    }
}

/// Exclusive use of one connection. An owned guard, so a scheduler pass can
/// keep the writer across its calls.
///
/// Dropped while its connection may be inside a transaction (a pass not
/// committed, a call abandoned half-way), it rolls back in a spawned task
/// that keeps the connection until done, so the write lock on the file is
/// given up at once and the next user finds a clean connection; without a
/// runtime to spawn on, the slot stays marked and the next user rolls back.
pub(crate) struct Conn {
    guard: Option<OwnedMutexGuard<SlotState>>,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn").finish_non_exhaustive()
    }
}

/// Why a call failed: the database's own error, or the store's.
#[derive(Debug)]
pub(crate) enum Failure {
    Sqlx(sqlx::Error),
    Store(store::Error),
}

impl Failure {
    pub(crate) fn into_store(self) -> store::Error {
        match self {
            Self::Sqlx(e) => store_error(e),
            Self::Store(e) => e,
        }
    }
}

fn closed() -> store::Error {
    store::Error::Unavailable("the database pool is closed".into())
}

impl Conn {
    async fn acquire(slot: &Slot) -> Result<Self, store::Error> {
        let guard = match slot.state.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => tokio::time::timeout(ACQUIRE_TIMEOUT, slot.state.clone().lock_owned())
                .await
                .map_err(|_| store::Error::Unavailable("timed out waiting for a database connection".into()))?,
        };
        Self::ready(slot, guard).await
    }

    /// Opens a lazy connection and finishes what a previous user left.
    async fn ready(slot: &Slot, guard: OwnedMutexGuard<SlotState>) -> Result<Self, store::Error> {
        let mut conn = Self { guard: Some(guard) };
        let state = conn.state();
        if state.closed {
            return Err(closed());
        }
        if state.conn.is_none() {
            let Some(options) = &slot.options else {
                return Err(closed());
            };
            state.conn = Some(options.connect().await.map_err(store_error)?);
        }
        if state.needs_rollback {
            conn.rollback().await?;
        }
        Ok(conn)
    }

    fn state(&mut self) -> &mut SlotState {
        // Present from construction until Drop takes it.
        self.guard.as_mut().expect("a Conn holds its guard until dropped")
    }

    /// The connection itself, for sqlx APIs that take one (migrations).
    pub(crate) fn raw(&mut self) -> Result<&mut SqliteConnection, store::Error> {
        self.state().conn.as_mut().ok_or_else(closed)
    }

    /// Runs a call that leaves no transaction open when it succeeds (a
    /// read, or a write from `BEGIN IMMEDIATE` to `COMMIT`) and returns the
    /// rows of all its statements, in order. On failure it rolls back at
    /// once, so the file's write lock is not held until the next user.
    pub(crate) async fn call(&mut self, q: Query) -> Result<Vec<SqliteRow>, store::Error> {
        self.call_sqlx(q).await.map_err(Failure::into_store)
    }

    /// [`Conn::call`], keeping sqlx's error for callers that tell kinds apart.
    pub(crate) async fn call_sqlx(&mut self, q: Query) -> Result<Vec<SqliteRow>, Failure> {
        let rows = self.open_call_sqlx(q).await?;
        self.state().needs_rollback = false;
        Ok(rows)
    }

    /// Runs a call that leaves its transaction open (a pass's statements):
    /// the slot stays marked until [`Conn::call`] or [`Conn::rollback`]
    /// ends it. On failure it rolls back at once.
    pub(crate) async fn open_call(&mut self, q: Query) -> Result<Vec<SqliteRow>, store::Error> {
        self.open_call_sqlx(q).await.map_err(Failure::into_store)
    }

    async fn open_call_sqlx(&mut self, q: Query) -> Result<Vec<SqliteRow>, Failure> {
        let state = self.state();
        state.needs_rollback = true;
        let conn = state.conn.as_mut().ok_or_else(|| Failure::Store(closed()))?;
        // `fetch_all`, never `fetch_optional`: it stops after the first row
        // and would leave the call's later statements (COMMIT) unrun.
        match eager(q.fetch_all(conn), EAGER_WAIT).await {
            Ok(rows) => Ok(rows),
            Err(e) => {
                // The original failure is what the caller needs; a failed
                // rollback leaves the slot marked for the next user.
                let _ = self.rollback().await;
                Err(Failure::Sqlx(e))
            }
        }
    }

    /// Ends whatever transaction the connection is in, if any.
    pub(crate) async fn rollback(&mut self) -> Result<(), store::Error> {
        rollback(self.state()).await
    }
}

async fn rollback(state: &mut SlotState) -> Result<(), store::Error> {
    let Some(conn) = state.conn.as_mut() else {
        // No connection: nothing can be open.
        state.needs_rollback = false;
        return Ok(());
    };
    match sqlx::query("ROLLBACK").execute(conn).await {
        Ok(_) => {}
        // The call it follows got as far as COMMIT, or failed before BEGIN.
        Err(sqlx::Error::Database(db)) if db.message().contains("no transaction is active") => {}
        Err(e) => return Err(store_error(e)),
    }
    state.needs_rollback = false;
    Ok(())
}

impl Drop for Conn {
    fn drop(&mut self) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        if !guard.needs_rollback {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // The guard moves into the task: nobody else uses the
            // connection before the rollback has run.
            runtime.spawn(async move {
                if let Err(e) = rollback(&mut guard).await {
                    tracing::warn!(error = %e, "rolling back an abandoned SQLite transaction failed; the next user retries");
                }
            });
        }
    }
}

/// Awaits `work`, polling it again in place for up to `wait` instead of
/// letting the caller's thread sleep between the messages of one call.
///
/// sqlx-sqlite answers a call with one channel message per statement and
/// per row, each waking the awaiting task; a runtime thread that found
/// nothing else to do sleeps in between, and on a VM whose idle vCPUs
/// halt, each wake-up is a VM exit. The embedded benchmark's 1 000-deep
/// chain counted 22 voluntary context switches per task this way, and 3
/// with this wait (BENCHMARKS.md, "hot path v2: waiting for SQLite
/// awake"). Polling in place, rather than asking the runtime to poll
/// again (which may hand the task to its other thread), keeps the answer
/// on the thread that asked. The wait is about one claim or finish, so
/// the thread is held no longer than a synchronous SQLite call would hold
/// it; past it, the task waits for its waker as any other.
async fn eager<F: std::future::Future>(work: F, wait: Duration) -> F::Output {
    use std::task::Poll;
    let mut work = std::pin::pin!(work);
    let mut until = None;
    std::future::poll_fn(move |cx| {
        loop {
            match work.as_mut().poll(cx) {
                Poll::Ready(out) => return Poll::Ready(out),
                Poll::Pending => {
                    let until = *until.get_or_insert_with(|| std::time::Instant::now() + wait);
                    if std::time::Instant::now() >= until {
                        return Poll::Pending;
                    }
                    std::hint::spin_loop();
                }
            }
        }
    })
    .await
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

/// The rows of a multi-statement call that carry `tag` in their first
/// column (each statement that returns rows tags them, so rows of
/// different shapes can share one call).
pub(crate) fn tagged(rows: &[SqliteRow], tag: i64) -> impl Iterator<Item = &SqliteRow> {
    use sqlx::Row;
    rows.iter().filter(move |r| r.try_get::<i64, _>(0).ok() == Some(tag))
}

#[cfg(test)]
mod tests {
    use super::PAD;

    #[test]
    fn the_stale_audit_cap_is_the_domains() {
        assert_eq!(
            max_stale_audits!().parse::<i64>().ok(),
            Some(flowforge_domain::limits::MAX_STALE_AUDITS_PER_TASK_RUN)
        );
    }

    /// How many slots of a multi-statement SQL text sqlx numbers
    /// positionally: per statement, the unused numbers below its highest
    /// `?NNN`.
    pub(crate) fn positional_slots(sql: &str) -> usize {
        sql.split(';')
            .map(|statement| {
                let mut used = std::collections::BTreeSet::new();
                let bytes = statement.as_bytes();
                let mut i = 0;
                while i < bytes.len() {
                    if bytes[i] == b'?' {
                        let digits: String = statement[i + 1..].chars().take_while(char::is_ascii_digit).collect();
                        if let Ok(n) = digits.parse::<usize>() {
                            used.insert(n);
                        }
                    }
                    i += 1;
                }
                used.last().map_or(0, |max| max - used.len())
            })
            .sum()
    }

    /// Why the padding: a statement's unused slots below its highest
    /// `?NNN` are numbered on from the statements before it, and once past
    /// the values bound, sqlx stops binding that statement.
    #[tokio::test]
    async fn numbered_parameters_bind_across_statements_only_when_padded() {
        use sqlx::{ConnectOptions, Row};
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .in_memory(true)
            .connect()
            .await
            .expect("connect");
        const SQL: &str = "SELECT ?3; SELECT ?3; SELECT ?3; SELECT ?1";
        assert_eq!(positional_slots(SQL), 6);
        let values = |rows: Vec<sqlx::sqlite::SqliteRow>| -> Vec<Option<i64>> {
            rows.iter().map(|r| r.try_get(0).expect("a value")).collect()
        };
        let q = || super::sql(SQL).bind(1_i64).bind(2_i64).bind(3_i64);
        let bare = values(q().fetch_all(&mut conn).await.expect("bare"));
        assert_ne!(bare, [Some(3), Some(3), Some(3), Some(1)], "unpadded binds go astray");
        let padded = values(super::padded(q()).fetch_all(&mut conn).await.expect("padded"));
        assert_eq!(padded, [Some(3), Some(3), Some(3), Some(1)]);
    }

    /// A future that is ready on its third poll and never wakes its task.
    fn ready_on_third_poll() -> impl std::future::Future<Output = u32> {
        let mut polls = 0;
        std::future::poll_fn(move |_| {
            polls += 1;
            if polls == 3 {
                std::task::Poll::Ready(polls)
            } else {
                std::task::Poll::Pending
            }
        })
    }

    #[tokio::test]
    async fn eager_polls_again_while_its_wait_lasts_then_leaves_it_to_the_waker() {
        use std::time::Duration;
        let long = Duration::from_secs(30);
        assert_eq!(
            tokio::time::timeout(long, super::eager(ready_on_third_poll(), long)).await,
            Ok(3),
            "polled again at once within the wait"
        );
        assert!(
            tokio::time::timeout(
                Duration::from_millis(50),
                super::eager(ready_on_third_poll(), Duration::ZERO)
            )
            .await
            .is_err(),
            "past the wait, only a wake-up polls it again"
        );
    }

    #[test]
    fn padding_covers_every_call() {
        for (name, sql) in crate::queries::multi_statement_calls() {
            let needed = positional_slots(sql);
            assert!(needed < PAD, "{name} needs {needed} padding slots, PAD is {PAD}");
        }
    }
}
