//! Every SQL statement the store runs, in one place and by concern, so the
//! indexes in `migrations/` can name the query they serve and tests can
//! `EXPLAIN` the exact text.
//!
//! Conventions: in a statement that reads store time, `$1` is the Clock
//! port's offset (an interval) and store time is
//! `statement_timestamp() + $1` — the database's clock, constant within the
//! statement and advancing between the statements of a transaction (so a
//! scheduler pass never records an event dated before the finish it reacts
//! to).
//!
//! Writes do not call `pg_notify` themselves: a transaction that notifies
//! holds PostgreSQL's global notify lock through its commit's WAL flush,
//! which serialises every notifying commit (measured here: 16 clients of a
//! one-row UPDATE fell from ~8 400 to ~500 commits/s). Each write instead
//! returns which wake-ups it owes (`woke…` columns) and the store sends
//! [`NOTIFY`] right after the commit (see `notify.rs`).

/// Store time: the database clock plus the Clock port's offset (`$1`).
macro_rules! now {
    () => {
        "(statement_timestamp() + $1::interval)"
    };
}

/// The columns of a task-run event row.
macro_rules! event_insert {
    () => {
        "INSERT INTO task_run_event \
         (task_run_id, run_id, task_key, transition, from_state, to_state, attempt, fencing_token, worker, at, error) "
    };
}

/// The SET list of the `reset` edge (docs/design/retry.md), after its
/// target state: attempt + 1 with the earlier ones as `attempt_base`, token
/// + 1, everything the earlier attempt left cleared. The row is `tr`.
macro_rules! reset_set {
    () => {
        "attempt = tr.attempt + 1, attempt_base = tr.attempt, fencing_token = tr.fencing_token + 1, \
         cancel_reason = NULL, skip_reason = NULL, finished_at = NULL, result = NULL, result_bytes = NULL, \
         error = NULL, retry_at = NULL, progress = NULL, needs_pass = false"
    };
}

/// The outbox rows of the rows in CTE `moved` (id, run_id, task_key,
/// fencing_token, priority, map_of), each with its task type from workflow
/// `$workflow` (a parameter or a subquery), looked up per row: see
/// [`LOWER_AND_PROMOTE`] on why a wide batch's plan is pinned to index
/// probes; held from the sweep until `$sweep_after` and published at
/// `$published_at` (both NULL unless the committer publishes them itself,
/// docs/design/outbox-and-queues.md#publish-after-commit). Returns what a
/// dispatch carries.
macro_rules! dispatch_moved {
    ($workflow:literal, $sweep_after:expr, $published_at:expr) => {
        concat!(
            "INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority, sweep_after,
                    published_at)
    SELECT m.id, m.run_id, m.task_key, t.task_type, m.fencing_token, ",
            now!(),
            ", m.priority, ",
            $sweep_after,
            ", ",
            $published_at,
            "
    FROM moved AS m
    CROSS JOIN LATERAL (SELECT task_type FROM task WHERE workflow_id = ",
            $workflow,
            " AND key = COALESCE(m.map_of, m.task_key) LIMIT 1) AS t
    ORDER BY m.id
    ON CONFLICT ON CONSTRAINT uniq_outbox_taskrun_token DO NOTHING
    RETURNING id, task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority"
        )
    };
}

/// The tail of a promotion to ready: closes the `moved` CTE (the rows made
/// ready: id, run_id, task_key, attempt, fencing_token, priority, map_of),
/// then
/// writes each
/// row's `$edge` event from `$from` and its outbox row (task type from
/// workflow `$3`, `dispatch_moved!`) in CTEs `event` and `dispatched`.
macro_rules! made_ready {
    ($edge:literal, $from:literal) => {
        concat!(
            "), event AS (\n    ",
            event_insert!(),
            "SELECT id, run_id, task_key, '",
            $edge,
            "', '",
            $from,
            "', 'ready', attempt, fencing_token, NULL, ",
            now!(),
            ", NULL FROM moved ORDER BY id
), dispatched AS (
    ",
            dispatch_moved!("$3", "NULL", "NULL"),
            "
)"
        )
    };
}

/// The CTEs that clear a run's flags and return its flagged task runs
/// (CTE `flagged`), for the run `$run` (a parameter or a subquery).
macro_rules! take_flags {
    ($run:literal) => {
        concat!(
            "run_flag AS (
    UPDATE workflow_run SET needs_pass = false WHERE id = ",
            $run,
            " AND needs_pass RETURNING id
), flagged AS (
    UPDATE task_run SET needs_pass = false WHERE run_id = ",
            $run,
            " AND needs_pass
    RETURNING id, task_key, state, cancel_reason, compensate_for
)"
        )
    };
}

/// The columns `any_active, any_started` of run `$run` (see [`ACTIVITY`]);
/// `$not_pending` is true when the run is no longer pending.
macro_rules! activity_columns {
    ($run:literal, $not_pending:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM task_run
               WHERE run_id = ",
            $run,
            " AND state IN ('pending', 'ready', 'running', 'retrying')
                 AND compensate_for IS NULL) AS any_active,
       ",
            $not_pending,
            " OR EXISTS (SELECT 1 FROM task_run WHERE run_id = ",
            $run,
            " AND started_at IS NOT NULL) AS any_started"
        )
    };
}

/// Whether a CTE produced a row: tells Rust which wake-ups the write owes.
macro_rules! any_row {
    ($cte:literal) => {
        concat!("(SELECT count(*) FROM ", $cte, ") > 0")
    };
}

/// Channel woken by finishes, first claims, started runs, cancel requests
/// and reaps.
pub const CHANNEL_SCHEDULER: &str = "flowforge_scheduler";
/// Channel woken when outbox rows are inserted.
pub const CHANNEL_PUBLISHER: &str = "flowforge_publisher";
/// Channel woken when a run reaches a terminal state.
pub const CHANNEL_RUN_SETTLED: &str = "flowforge_run_settled";

/// Notifies channels, after the write they announce has committed. `$1`
/// channels, `$2` payload (this store's instance id).
pub const NOTIFY: &str = "SELECT count(pg_notify(c, $2)::text) FROM unnest($1::text[]) AS c";

mod definitions;
mod outbox;
mod pass;
mod runs;
mod schedules;
mod tokens;
mod workers;

pub use definitions::*;
pub use outbox::*;
pub use pass::*;
pub use runs::*;
pub use schedules::*;
pub use tokens::*;
pub use workers::*;
