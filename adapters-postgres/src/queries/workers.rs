//! The worker registry's statements.

/// register_worker: insert or refresh (keeping the first `started_at`).
/// `$1` offset, `$2` id, `$3` host, `$4` pid, `$5` task types, `$6`
/// concurrency.
pub const REGISTER_WORKER: &str = concat!(
    "INSERT INTO worker (id, host, pid, task_types, concurrency, started_at, last_seen_at)
VALUES ($2, $3, $4, $5, $6, ",
    now!(),
    ", ",
    now!(),
    ")
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, task_types = EXCLUDED.task_types,
    concurrency = EXCLUDED.concurrency, last_seen_at = EXCLUDED.last_seen_at, stopped_at = NULL"
);

/// touch_worker. `$1` offset, `$2` id.
pub const TOUCH_WORKER: &str = concat!("UPDATE worker SET last_seen_at = ", now!(), " WHERE id = $2");

/// deregister_worker. `$1` offset, `$2` id.
pub const DEREGISTER_WORKER: &str = concat!(
    "UPDATE worker SET stopped_at = ",
    now!(),
    ", last_seen_at = ",
    now!(),
    " WHERE id = $2"
);

/// list_workers: most recently seen first.
pub const LIST_WORKERS: &str = "\
SELECT id, host, pid, task_types, concurrency, started_at, last_seen_at, stopped_at
FROM worker ORDER BY last_seen_at DESC, id";

/// live_task_types. `$1` offset, `$2` window.
pub const LIVE_TASK_TYPES: &str = concat!(
    "SELECT DISTINCT jsonb_array_elements_text(task_types) AS task_type FROM worker
WHERE stopped_at IS NULL AND last_seen_at >= ",
    now!(),
    " - $2::interval"
);
