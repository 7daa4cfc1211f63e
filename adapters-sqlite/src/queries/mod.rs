//! Every SQL statement the store sends, in one place and by concern, so the
//! indexes in `migrations/` can name the statement they serve and tests can
//! check the exact text (`plans.rs`).
//!
//! Conventions: `?1` is the Clock port's offset in every statement that
//! reads store time; a write is ONE call from `BEGIN IMMEDIATE` to `COMMIT`
//! (see the crate docs), its transition's event written by the statement
//! after the UPDATE (`changes() = 1`) or, for a batch, by an INSERT before
//! it, and counted in its run's history by the statement after that
//! ([`events_written!`]; the stale audit counts first, the reaper by
//! each run's last event).

/// The store-time expression: SQLite's clock in milliseconds plus the
/// Clock port's offset, bound as `?1` in every statement that uses it.
macro_rules! now {
    () => {
        "(CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + ?1)"
    };
}

/// `taskrun_active_idx`'s condition, word for word, for a query that asks
/// for more than one of its states: SQLite uses a partial index for such a
/// query only when it restates the index's condition. One that names a
/// single state (`state = 'pending'`) needs nothing more, since the
/// condition is an OR of equalities (migration 20261210000001), which
/// also spares every statement the temporary b-tree an `IN` list opens.
macro_rules! active_states {
    () => {
        "(state = 'pending' OR state = 'ready' OR state = 'running' OR state = 'retrying')"
    };
}

/// The due waits of run `$run` (docs/design/concurrency.md#gates): its own
/// gates, and a task's once only its gate holds it back (pending with one
/// dependency left, and the run past its own gates).
macro_rules! due_waits {
    ($run:literal) => {
        concat!(
            "SELECT w.task_key, w.scope, w.label, w.max, w.strategy, w.tried FROM concurrency_wait w \
             LEFT JOIN task_run tr ON tr.run_id = w.run_id AND tr.task_key = w.task_key \
             WHERE w.run_id = ",
            $run,
            " AND (w.task_key IS NULL OR (tr.state = 'pending' AND tr.pending_deps = 1 \
             AND NOT EXISTS (SELECT 1 FROM concurrency_wait r WHERE r.run_id = w.run_id AND r.task_key IS NULL))) \
             ORDER BY w.task_key NULLS FIRST, w.scope"
        )
    };
}

/// A bound row limit, `LIMIT $param`, written so that binding it does not
/// expire the statement. SQLite re-prepares a statement (parses and plans
/// it again) on its next step whenever a parameter its plan looked at is
/// rebound, and it looks at a bare `LIMIT ?N`; sqlx rebinds every
/// parameter on every call, so a bare bound limit cost a parse and a plan
/// per call (the scheduler's `RUNS_WITH_WORK`: a tenth of the embedded
/// fan-out's CPU). Through a CAST the planner treats it as an expression.
macro_rules! limit {
    ($param:literal) => {
        concat!(" LIMIT CAST(", $param, " AS INTEGER)")
    };
}

/// The columns of an event insert, in the order every event SELECT gives
/// them. A statement numbers its events itself
/// (docs/design/data-model.md#event-numbers): `seq` and `generation`
/// from [`event_number!`], and [`events_written!`] after it (the stale
/// audit and the reaper count theirs their own way).
macro_rules! event_insert {
    () => {
        "INSERT INTO task_run_event (task_run_id, run_id, task_key, transition, from_state, to_state, \
         attempt, fencing_token, worker, at, error, seq, generation) "
    };
}

/// The last number of run `$run`'s history, 0 before its first event
/// (`run_event_seq`, by its primary key).
macro_rules! last_seq {
    ($run:expr) => {
        concat!(
            "COALESCE((SELECT s.seq FROM run_event_seq AS s WHERE s.run_id = ",
            $run,
            "), 0)"
        )
    };
}

/// Run `$run`'s current generation, which its new events carry.
macro_rules! current_generation {
    ($run:expr) => {
        concat!(
            "COALESCE((SELECT s.generation FROM run_event_seq AS s WHERE s.run_id = ",
            $run,
            "), 1)"
        )
    };
}

/// An event's `seq` and `generation`, in that order: run `$run`'s count
/// plus `$offset` (1, or a row number for a batch), and its current
/// generation.
macro_rules! event_number {
    ($run:expr, $offset:literal) => {
        concat!(last_seq!($run), " + ", $offset, ", ", current_generation!($run))
    };
}

/// After a statement that wrote events to `$table`, numbered on from
/// [`last_seq!`] and all of one run: that run's count advances by the
/// rows it wrote. The run is read from the last row written
/// (`last_insert_rowid()`), so the statement binds nothing. It leaves
/// `changes()` at 1 when that statement wrote any and at 0 when none, so
/// a later test of `changes() = 1` or `changes() = 0` answers as it would
/// have right after the events.
macro_rules! events_written {
    ($table:literal) => {
        concat!(
            "INSERT INTO run_event_seq (run_id, seq) SELECT e.run_id, changes() FROM ",
            $table,
            " AS e WHERE e.id = last_insert_rowid() AND changes() > 0 \
             ON CONFLICT (run_id) DO UPDATE SET seq = seq + excluded.seq"
        )
    };
}

/// The event of task run `?2` (or `$id`) after the statement before it
/// changed that row (`changes() = 1`), with the row's attempt and token
/// after the transition, and its count. `$worker` and `$error` are SQL
/// expressions.
macro_rules! event_if_changed {
    ($transition:literal, $from:literal, $to:literal, $worker:literal, $error:literal) => {
        event_if_changed!($transition, $from, $to, $worker, $error, "?2")
    };
    ($transition:literal, $from:literal, $to:literal, $worker:literal, $error:literal, $id:literal) => {
        concat!(
            event_insert!(),
            "SELECT id, run_id, task_key, '",
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
            ", ",
            event_number!("task_run.run_id", "1"),
            " FROM task_run WHERE id = ",
            $id,
            " AND changes() = 1; ",
            events_written!("task_run_event")
        )
    };
}

/// The audit event of a finish whose UPDATE matched nothing
/// (docs/design/leases-and-fencing.md#stale-writes): placed after the
/// transition's event, which then wrote nothing, so `changes() = 0`.
/// Token presented `?3`, worker `?4`. The run's count advances first, in
/// the statement that asks whether the row has room for another audit:
/// an insert that read `task_run_event` itself would be run through a
/// temporary table on every finish.
macro_rules! stale_audit {
    ($label:literal) => {
        concat!(
            "INSERT INTO run_event_seq (run_id, seq) SELECT run_id, 1 FROM task_run \
             WHERE id = ?2 AND changes() = 0 \
             AND (SELECT count(*) FROM task_run_event WHERE task_run_id = ?2 \
             AND transition = 'stale_write_rejected') < ",
            max_stale_audits!(),
            " ON CONFLICT (run_id) DO UPDATE SET seq = seq + 1; ",
            event_insert!(),
            "SELECT t.id, t.run_id, t.task_key, 'stale_write_rejected', NULL, NULL, t.attempt, ?3, ?4, ",
            now!(),
            ", 'rejected ",
            $label,
            " with fencing token ' || ?3 || ': the row is ' || t.state || ' at token ' || t.fencing_token, \
             s.seq, s.generation FROM task_run AS t JOIN run_event_seq AS s ON s.run_id = t.run_id \
             WHERE t.id = ?2 AND changes() = 1"
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
            ".run_id) AND t.key = COALESCE(",
            $row,
            ".map_of, ",
            $row,
            ".task_key))"
        )
    };
}

/// The SET list of the `reset` edge (docs/design/retry.md), after its
/// target state: attempt + 1 with the earlier ones as `attempt_base`, token
/// + 1, everything the earlier attempt left cleared.
macro_rules! reset_set {
    () => {
        "attempt = attempt + 1, attempt_base = attempt, fencing_token = fencing_token + 1, cancel_reason = NULL, \
         skip_reason = NULL, finished_at = NULL, result = NULL, error = NULL, retry_at = NULL, progress = NULL, \
         needs_pass = 0"
    };
}

mod definitions;
mod outbox;
#[macro_use]
mod pass;
#[macro_use]
mod runs;
mod schedules;
mod tokens;
mod workers;

pub(crate) use definitions::*;
pub(crate) use outbox::*;
pub(crate) use pass::*;
pub(crate) use runs::*;
pub(crate) use schedules::*;
pub(crate) use tokens::*;
pub(crate) use workers::*;

/// The calls that join a group commit (`group`), each `BEGIN IMMEDIATE;
/// …; COMMIT` around statements that can run inside another's
/// transaction.
#[cfg(test)]
pub(crate) fn grouped_writes() -> Vec<(&'static str, &'static str)> {
    vec![
        ("claim", CLAIM),
        ("finish succeeded", FINISH_SUCCEEDED),
        ("finish handing off", FINISH_HANDING_OFF),
        ("finish handing off, then claim", FINISH_HANDING_OFF_THEN_CLAIM),
        ("finish failed", FINISH_FAILED),
        ("finish retry", FINISH_RETRY),
        ("finish cancelled", FINISH_CANCELLED),
    ]
}

/// Every SQL text sent with several statements in one call, for the
/// checks that each is bound safely (`store::tests`) and parses.
#[cfg(test)]
pub(crate) fn multi_statement_calls() -> Vec<(&'static str, &'static str)> {
    let mut calls = grouped_writes();
    calls.extend([
        ("renew", RENEW_LEASE),
        ("request_cancel", REQUEST_CANCEL),
        ("generic satisfied", GENERIC_SATISFIED),
        ("generic retry_ready", GENERIC_RETRY_READY),
        ("generic cancel", GENERIC_CANCEL),
        ("start_run", START_RUN),
        ("start_run_keyed", START_RUN_KEYED),
        ("reap", REAP),
        ("get_run", GET_RUN),
        ("begin_pass", BEGIN_PASS),
        ("reread flagged", REREAD_FLAGGED),
        ("take again", TAKE_AGAIN),
        ("satisfy", SATISFY),
        ("promote due", PROMOTE_DUE_CALL),
        ("cancel_pending", CANCEL_PENDING),
        ("fail_pending", FAIL_PENDING),
        ("expand map", EXPAND_MAP),
        ("cancel children", CANCEL_CHILDREN),
        ("collect map", COLLECT_MAP),
        ("cancel_waiting", CANCEL_WAITING_CALL),
        ("create_compensator", CREATE_COMPENSATOR),
        ("rearm_compensator", REARM_COMPENSATOR),
        ("transition_run", TRANSITION_RUN),
        ("release slots", RELEASE_SLOTS),
        ("commit restoring", COMMIT_RESTORING),
        ("mark published", MARK_PUBLISHED),
        ("settle held", SETTLE_HELD),
        ("register worker", REGISTER_WORKER),
        ("touch worker", TOUCH_WORKER),
        ("deregister worker", DEREGISTER_WORKER),
        ("publish", PUBLISH_DEFINITION),
        ("load", LOAD_DEFINITION),
        ("create token", CREATE_TOKEN),
        ("revoke token", REVOKE_TOKEN),
        ("create schedule", CREATE_SCHEDULE),
        ("pause schedule", SET_SCHEDULE_PAUSED),
        ("delete schedule", DELETE_SCHEDULE),
        ("fire begin", FIRE_BEGIN),
        ("fire held", FIRE_HELD),
        ("fire started", FIRE_STARTED),
        ("scheduled start", SCHEDULED_START),
        ("buffered begin", BUFFERED_BEGIN),
        ("buffered started", BUFFERED_STARTED),
        ("backfill begin", BACKFILL_BEGIN),
    ]);
    calls
}

#[cfg(test)]
mod tests {
    /// Every statement's source, as written.
    const SOURCES: [(&str, &str); 8] = [
        ("mod.rs", include_str!("mod.rs")),
        ("definitions.rs", include_str!("definitions.rs")),
        ("outbox.rs", include_str!("outbox.rs")),
        ("pass.rs", include_str!("pass.rs")),
        ("runs.rs", include_str!("runs.rs")),
        ("schedules.rs", include_str!("schedules.rs")),
        ("tokens.rs", include_str!("tokens.rs")),
        ("workers.rs", include_str!("workers.rs")),
    ];

    /// A bare bound `LIMIT`/`OFFSET` would make SQLite parse and plan its
    /// statement again on every call (see `limit!`).
    #[test]
    fn no_statement_binds_a_bare_limit() {
        for (file, source) in SOURCES {
            for (n, line) in source.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                // Spelled in two halves so that this line does not match.
                for bare in [concat!("LIMIT", " ?"), concat!("OFFSET", " ?")] {
                    assert!(!line.contains(bare), "{file}:{}: `{bare}` here; write limit!(…)", n + 1);
                }
            }
        }
    }
}
