//! The worker registry's statements.

/// register_worker in one call: a re-registration refreshes everything but
/// the first start. `?2` id, `?3` host, `?4` pid, `?5` task types, `?6` concurrency.
pub(crate) const REGISTER_WORKER: &str = concat!(
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
pub(crate) const TOUCH_WORKER: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE worker SET last_seen_at = ",
    now!(),
    " WHERE id = ?2; COMMIT"
);

/// deregister_worker in one call. `?2` id.
pub(crate) const DEREGISTER_WORKER: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE worker SET stopped_at = ",
    now!(),
    ", last_seen_at = ",
    now!(),
    " WHERE id = ?2; COMMIT"
);

/// list_workers: the most recently seen first.
pub(crate) const LIST_WORKERS: &str = "SELECT id, host, pid, task_types, concurrency, started_at, last_seen_at, \
     stopped_at FROM worker ORDER BY last_seen_at DESC, id";

/// live_task_types: the types served by a worker not stopped and seen
/// within `?2` ms.
pub(crate) const LIVE_TASK_TYPES: &str = concat!(
    "SELECT DISTINCT j.value FROM worker AS w, json_each(w.task_types) AS j \
     WHERE w.stopped_at IS NULL AND w.last_seen_at >= ",
    now!(),
    " - ?2"
);
