//! FlowForge's store ports over SQLite: the embedded store
//! (docs/design/data-model.md#tables, docs/design/scheduler.md#the-pass).
//!
//! [`SqliteStore`] implements every store port — definitions, runs and task
//! runs, the scheduler pass, the outbox, the worker registry and the API
//! tokens — over one database file in WAL mode (or one shared in-memory
//! connection).
//!
//! SQLite has a single writer per database. Rather than let in-process
//! writers collide on the file lock and sleep through `SQLITE_BUSY` retries,
//! every write goes through ONE writer connection behind an async mutex, so
//! writers queue in process; reads use a few other connections and see the
//! last committed state (WAL snapshots). Every write transaction starts
//! with `BEGIN IMMEDIATE`, so another process's writer makes it wait on the
//! busy timeout at `BEGIN` instead of failing half-way through.
//!
//! Each statement costs a round trip to the connection's worker thread,
//! which dwarfs SQLite's own work, so every single-shot write is ONE call
//! from `BEGIN IMMEDIATE` to `COMMIT` (see the `store` module). SQLite
//! has no data-modifying CTEs; a transition's event row is written in the
//! same call either by the statement after the UPDATE, guarded by
//! `changes()` (the rows the UPDATE changed), or, for a batch, by an INSERT
//! placed before the UPDATE with the very same time-free WHERE: under the
//! write lock nothing else changes the rows in between, so both see the
//! same rows.
//!
//! Two more costs are kept off the path from one task to the next: WAL
//! checkpoints (each copies pages back and fsyncs twice) run on a
//! connection of their own beside the writer instead of inside whichever
//! commit crosses SQLite's threshold, and `task_inputs` answers from the
//! run inputs and succeeded outputs this store already wrote or read, which
//! never change (see the `inputs` module).
//!
//! Store time is SQLite's own clock plus the [`Clock`](flowforge_ports::Clock)
//! offset, computed inside each statement (`?1` of every query that needs
//! it); times are stored as INTEGER milliseconds since the Unix epoch.
//!
//! A consequence of the single writer: while a [`SqlitePass`] is open it
//! holds the writer, so the task that opened it must not call another
//! writing method of the store before committing or dropping it (it would
//! wait for itself until the acquire timeout).

/// The store-time expression: SQLite's clock in milliseconds plus the
/// Clock port's offset, bound as `?1` in every statement that uses it.
macro_rules! now {
    () => {
        "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + ?1)"
    };
}

/// The last id of the run's history: both event tables draw their ids from
/// one sequence, so ordering the merged history by id is commit order.
/// Millisecond store time cannot order it (a pass's run transition and the
/// next task transition often share a millisecond), and since every write
/// is serialised, max + 1 under the write lock is a safe next id.
macro_rules! next_event_id {
    () => {
        "(SELECT COALESCE(MAX(m), 0) FROM (SELECT MAX(id) AS m FROM task_run_event \
         UNION ALL SELECT MAX(id) AS m FROM workflow_run_event))"
    };
}

/// The columns of an event insert, in the order every event SELECT gives them.
macro_rules! event_insert {
    () => {
        "INSERT INTO task_run_event (id, task_run_id, run_id, task_key, transition, from_state, to_state, \
         attempt, fencing_token, worker, at, error) "
    };
}

/// The event of task run `?2` after the statement before it changed that
/// row (`changes() = 1`), with the row's attempt and token after the
/// transition. `$worker` and `$error` are SQL expressions.
macro_rules! event_if_changed {
    ($transition:literal, $from:literal, $to:literal, $worker:literal, $error:literal) => {
        concat!(
            event_insert!(),
            "SELECT ",
            next_event_id!(),
            " + 1, id, run_id, task_key, '",
            $transition,
            "', '",
            $from,
            "', '",
            $to,
            "', attempt, fencing_token, ",
            $worker,
            ", ",
            now!(),
            ", ",
            $error,
            " FROM task_run WHERE id = ?2 AND changes() = 1"
        )
    };
}

/// The audit event of a finish whose UPDATE matched nothing
/// (docs/design/leases-and-fencing.md#stale-writes): placed after the
/// transition's event insert, which then inserted nothing, so `changes() = 0`.
/// Token presented `?3`, worker `?4`.
macro_rules! stale_audit {
    ($label:literal) => {
        concat!(
            event_insert!(),
            "SELECT ",
            next_event_id!(),
            " + 1, id, run_id, task_key, 'stale_write_rejected', NULL, NULL, attempt, ?3, ?4, ",
            now!(),
            ", 'rejected ",
            $label,
            " with fencing token ' || ?3 || ': the row is ' || state || ' at token ' || fencing_token \
             FROM task_run WHERE id = ?2 AND changes() = 0 \
             AND (SELECT count(*) FROM task_run_event WHERE task_run_id = ?2 \
             AND transition = 'stale_write_rejected') < ",
            max_stale_audits!()
        )
    };
}

/// `MAX_STALE_AUDITS_PER_TASK_RUN` as a literal the statements can be
/// built from (a unit test keeps the two equal).
macro_rules! max_stale_audits {
    () => {
        "100"
    };
}

/// The task type of the task run in `$row` (an alias of `task_run`), for
/// its outbox row. A missing task row gives NULL, which the outbox's NOT
/// NULL refuses: a ready row without a dispatch would never run, so the
/// whole call fails rather than commit it.
macro_rules! task_type_of {
    ($row:literal) => {
        concat!(
            "(SELECT t.task_type FROM task t WHERE t.workflow_id = (SELECT r.workflow_id FROM workflow_run r \
             WHERE r.id = ",
            $row,
            ".run_id) AND t.key = ",
            $row,
            ".task_key)"
        )
    };
}

mod convert;
mod definitions;
mod error;
mod inputs;
mod notify;
mod outbox;
mod pass;
#[cfg(test)]
mod plans;
mod runs;
mod store;
mod tokens;
mod workers;

/// Every SQL text sent with several statements in one call, for the
/// checks that each is bound safely (`store::tests`) and parses.
#[cfg(test)]
pub(crate) fn multi_statement_calls() -> Vec<(&'static str, &'static str)> {
    vec![
        ("claim", runs::sql::CLAIM_CALL),
        ("finish succeeded", runs::sql::FINISH_SUCCEEDED),
        ("finish failed", runs::sql::FINISH_FAILED),
        ("finish retry", runs::sql::FINISH_RETRY),
        ("finish cancelled", runs::sql::FINISH_CANCELLED),
        ("renew", runs::sql::RENEW),
        ("request_cancel", runs::sql::REQUEST_CANCEL),
        ("generic satisfied", runs::sql::GENERIC_SATISFIED),
        ("generic retry_ready", runs::sql::GENERIC_RETRY_READY),
        ("generic cancel", runs::sql::GENERIC_CANCEL),
        ("start_run", runs::sql::START_CALL),
        ("start_run_keyed", runs::sql::START_KEYED_CALL),
        ("reap", runs::sql::REAP_CALL),
        ("get_run", runs::sql::GET_RUN),
        ("begin_pass", pass::BEGIN_PASS),
        ("reread flagged", pass::REREAD_FLAGGED),
        ("take again", pass::TAKE_AGAIN),
        ("satisfy", pass::SATISFY),
        ("promote due", pass::PROMOTE_DUE_CALL),
        ("cancel_pending", pass::CANCEL_PENDING),
        ("cancel_waiting", pass::CANCEL_WAITING_CALL),
        ("create_compensator", pass::CREATE_COMPENSATOR),
        ("transition_run", pass::TRANSITION_RUN),
        ("commit restoring", pass::COMMIT_RESTORING),
        ("mark published", outbox::MARK_PUBLISHED),
        ("register worker", workers::REGISTER),
        ("touch worker", workers::TOUCH),
        ("deregister worker", workers::DEREGISTER),
        ("publish", definitions::PUBLISH),
        ("load", definitions::LOAD),
        ("create token", tokens::CREATE),
        ("revoke token", tokens::REVOKE),
    ]
}

pub use error::DecodeError;
pub use notify::SqliteNotifier;
pub use outbox::SqliteSweep;
pub use pass::SqlitePass;
pub use store::SqliteStore;
