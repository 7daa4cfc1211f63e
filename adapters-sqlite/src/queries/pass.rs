//! The scheduler pass's statements: taking a run's flags, promoting,
//! cancelling, compensating and moving the run, each measuring the run's
//! activity again at its end (see `pass.rs`).

/// take_flagged: read and clear the run's flags (`taskrun_needs_pass_idx`). `?2` run.
macro_rules! take_flagged {
    () => {
        "UPDATE task_run SET needs_pass = 0 WHERE run_id = ?2 AND needs_pass \
         RETURNING 1 AS tag, id, task_key, state, cancel_reason, compensate_for"
    };
}

/// The run's own flag: a cancel request not handled yet.
macro_rules! take_run_flag {
    () => {
        "UPDATE workflow_run SET needs_pass = 0 WHERE id = ?2 AND needs_pass RETURNING 2 AS tag"
    };
}

/// activity: is a forward row still active (`taskrun_active_idx`, whose
/// condition the query restates word for word to use it), has any row
/// started (looked up only while the run is pending; a running run has),
/// and is any row retrying (`taskrun_active_idx`).
macro_rules! activity {
    () => {
        concat!(
            "SELECT 9 AS tag, EXISTS (SELECT 1 FROM task_run WHERE run_id = ?2 AND ",
            active_states!(),
            " AND compensate_for IS NULL), \
             CASE WHEN (SELECT state FROM workflow_run WHERE id = ?2) <> 'pending' THEN 1 \
                  ELSE EXISTS (SELECT 1 FROM task_run WHERE run_id = ?2 AND started_at IS NOT NULL) END, \
             EXISTS (SELECT 1 FROM task_run WHERE run_id = ?2 AND state = 'retrying')"
        )
    };
}

/// satisfy_dependencies: lower the counts, one lookup per key (`uniq_taskrun_run_key`).
/// MATERIALIZED makes SQLite walk the batch and look each row up by
/// (run_id, task_key); joined directly, the planner scans the JSON once per
/// task row of the run, which is quadratic on a wide fan-out. `?3` the batch.
macro_rules! lower_pending {
    () => {
        "WITH done (k, n) AS MATERIALIZED (SELECT j.value ->> 'k', j.value ->> 'n' FROM json_each(?3) AS j) \
         UPDATE task_run SET pending_deps = pending_deps - done.n FROM done \
         WHERE task_run.run_id = ?2 AND task_run.task_key = done.k \
         AND task_run.state = 'pending' AND task_run.compensate_for IS NULL"
    };
}

/// The pending forward rows at zero (`taskrun_active_idx`, which carries
/// `pending_deps`, so only those rows are visited, never the run's
/// finished ones).
/// `$run` is the run (`?2` unless named).
macro_rules! promotable {
    () => {
        promotable!("?2")
    };
    ($run:expr) => {
        concat!(
            "run_id = ",
            $run,
            " AND state = 'pending' \
             AND pending_deps = 0 AND compensate_for IS NULL"
        )
    };
}

/// promote_due_retries marks the due rows with a `retry_at` of -1 first,
/// so the statements after it name exactly the rows due at that instant
/// without reading the clock again (a row with that `retry_at` is due
/// anyway). Invisible outside the transaction.
macro_rules! due_marked {
    () => {
        "run_id = ?2 AND state = 'retrying' AND retry_at = -1"
    };
}

/// The events of a batch: rows of `task_run` matching `$where`, all of
/// run `$run`, in id order, with their (unchanged) attempt and token, and
/// their count.
macro_rules! batch_events {
    ($transition:literal, $from:literal, $to:literal, $run:expr, $where:expr) => {
        concat!(
            event_insert!(),
            "SELECT id, run_id, task_key, '",
            $transition,
            "', '",
            $from,
            "', '",
            $to,
            "', attempt, fencing_token, NULL, ",
            now!(),
            ", NULL, ",
            event_number!($run, "ROW_NUMBER() OVER (ORDER BY id)"),
            " FROM task_run WHERE ",
            $where,
            " ORDER BY id; ",
            events_written!("task_run_event")
        )
    };
}

/// The outbox rows of a batch of rows about to become ready
/// (docs/design/outbox-and-queues.md#one-outbox-row-per-readiness), held
/// from the sweep until `$sweep_after` and published at `$published_at`
/// (both NULL unless the committer publishes them itself).
macro_rules! batch_dispatch {
    ($where:expr) => {
        batch_dispatch!($where, "NULL", "NULL", "")
    };
    ($where:expr, $sweep_after:expr, $published_at:expr, $returning:expr) => {
        concat!(
            "INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority, \
             sweep_after, published_at) SELECT id, run_id, task_key, ",
            task_type_of!("task_run"),
            ", fencing_token, ",
            now!(),
            ", priority, ",
            $sweep_after,
            ", ",
            $published_at,
            " FROM task_run WHERE ",
            $where,
            " ORDER BY id",
            $returning
        )
    };
}

#[cfg(test)]
pub(crate) const TAKE_FLAGGED: &str = take_flagged!();
#[cfg(test)]
pub(crate) const ACTIVITY: &str = activity!();
#[cfg(test)]
pub(crate) const LOWER_PENDING: &str = lower_pending!();

/// begin_pass in one call: open the transaction, read the run, take its
/// flags, measure it. `?2` run.
pub(crate) const BEGIN_PASS: &str = concat!(
    "BEGIN IMMEDIATE; \
     SELECT 0 AS tag, workflow_id, state, cancel_requested_at IS NOT NULL, ",
    now!(),
    " - created_at, gated, cancel_reason IS NOT NULL FROM workflow_run WHERE id = ?2; ",
    take_flagged!(),
    "; ",
    take_run_flag!(),
    "; ",
    activity!()
);

/// take_flagged after the pass changed rows: the flagged rows as they are
/// now (`?3` their ids), and any flag set since (none can be, while the
/// pass holds the write lock; asked anyway, it is the statement's meaning).
pub(crate) const REREAD_FLAGGED: &str = concat!(
    "SELECT 1 AS tag, id, task_key, state, cancel_reason, compensate_for FROM task_run \
     WHERE id IN (SELECT value FROM json_each(?3)); ",
    take_flagged!(),
    "; ",
    take_run_flag!()
);

/// A second take_flagged: the statement itself.
pub(crate) const TAKE_AGAIN: &str = concat!(take_flagged!(), "; ", take_run_flag!());

/// satisfy_dependencies' promotion (its plan is checked in `plans.rs`).
macro_rules! promote_ready {
    () => {
        promote_ready!("?2")
    };
    ($run:expr) => {
        concat!(
            "UPDATE task_run SET state = 'ready' WHERE ",
            promotable!($run),
            " RETURNING 3 AS tag, id, task_key"
        )
    };
}

#[cfg(test)]
pub(crate) const PROMOTE_READY: &str = promote_ready!();

/// satisfy_dependencies in one call: lower, then `dependencies_satisfied`
/// on every pending forward row at zero with its event and dispatch.
pub(crate) const SATISFY: &str = concat!(
    lower_pending!(),
    "; ",
    batch_events!("dependencies_satisfied", "pending", "ready", "?2", promotable!()),
    "; ",
    batch_dispatch!(promotable!()),
    "; ",
    promote_ready!(),
    "; ",
    activity!()
);

/// The run of the success a [`FINISH_HANDING_OFF`](super::FINISH_HANDING_OFF)
/// call recorded, or NULL when the finish was stale (the writer
/// connection's `temp.handing_off`, empty outside such a call).
macro_rules! handing_run {
    () => {
        "(SELECT run_id FROM temp.handing_off)"
    };
}

/// finish_and_hand_off's first step (see [`hand_off!`]): the named
/// dependents (`?6`), each looked up by its key (`uniq_taskrun_run_key`;
/// `+state` as in `pending_named!`, or a chain's hop would walk every
/// pending row of the run at a counter of one).
macro_rules! hand_off_dependents {
    () => {
        concat!(
            "UPDATE task_run SET pending_deps = 0 \
             WHERE json_array_length(?6) > 0 AND run_id = ",
            handing_run!(),
            " AND task_key IN (SELECT value FROM json_each(?6)) \
             AND +state = 'pending' AND pending_deps = 1 AND compensate_for IS NULL \
             AND (SELECT cancel_requested_at FROM workflow_run WHERE id = ",
            handing_run!(),
            ") IS NULL"
        )
    };
}

#[cfg(test)]
pub(crate) const HAND_OFF_DEPENDENTS: &str = hand_off_dependents!();

/// finish_and_hand_off's promotion, in the success's transaction
/// (docs/design/scheduler.md#handoff), for the run [`handing_run!`] names,
/// so none when the finish was stale:
///
/// 1. each named dependent (`?6`, a JSON array) still pending at a counter
///    of one in a run not cancel-requested goes to zero;
/// 2. the success (`?2`) is flagged, and the flag comes back tagged 6,
///    unless the handoff is whole: it says so (`?7`), every named
///    dependent moved (`changes()` of step 1), no flag is up already (a
///    first claim's), the run is not cancel-requested, and every named
///    join is still pending (one a failure cancelled leaves this success
///    for the pass, which may settle or roll back the run). Only then is
///    this success one no pass will count; a condition that cannot be
///    told true flags it;
/// 3. only then, so while the success is still unflagged, each named join
///    (`?10`, a JSON array) still pending is lowered by one
///    (docs/design/scheduler.md#joins), so a join is never counted both
///    here and by a pass. Each key is looked up on its own
///    (`uniq_taskrun_run_key`): with `task_key IN (json_each(…))` the
///    planner walks every row of the run instead, which made a 2 000-wide
///    fan-in's every finish cost 0.2 ms more;
/// 4. every pending row of the run at zero takes the pass's promotion
///    (events, outbox rows, ready).
///
/// Steps 1 and 3 each begin with a test of their list's length, which
/// SQLite makes before it opens a cursor: a success without dependents of
/// one kind (a fan-in's middle task has only its join, a chain's hop no
/// join) skips that step's cursors and index walk.
///
/// The outbox rows are returned, tagged 4
/// (docs/design/outbox-and-queues.md#publish-after-commit): with a hold
/// (`?8` milliseconds) they are held from the sweep that long, and whether
/// other rows wait for the sweep comes back tagged 5; pushed (`?9`), they
/// are written published.
macro_rules! hand_off {
    () => {
        concat!(
            hand_off_dependents!(),
            "; UPDATE task_run SET needs_pass = 1 WHERE id = ?2 AND EXISTS (SELECT 1 FROM temp.handing_off) \
             AND (?7 AND changes() = json_array_length(?6) AND needs_pass = 0 \
                 AND (SELECT cancel_requested_at FROM workflow_run WHERE id = task_run.run_id) IS NULL \
                 AND NOT EXISTS (SELECT 1 FROM json_each(?10) AS j WHERE (SELECT t.state FROM task_run t \
                     WHERE t.run_id = task_run.run_id AND t.task_key = j.value) IS NOT 'pending')) IS NOT 1 \
             RETURNING 6 AS tag; \
             UPDATE task_run SET pending_deps = pending_deps - 1 \
             WHERE json_array_length(?10) > 0 AND id IN (SELECT (SELECT t.id FROM task_run t WHERE t.run_id = ",
            handing_run!(),
            " AND t.task_key = j.value) FROM json_each(?10) AS j) \
             AND state = 'pending' AND compensate_for IS NULL \
             AND (SELECT needs_pass FROM task_run WHERE id = ?2 AND EXISTS (SELECT 1 FROM temp.handing_off)) = 0; ",
            batch_events!(
                "dependencies_satisfied",
                "pending",
                "ready",
                handing_run!(),
                promotable!(handing_run!())
            ),
            "; ",
            batch_dispatch!(
                promotable!(handing_run!()),
                concat!("CASE WHEN ?8 IS NOT NULL THEN ", now!(), " + ?8 END"),
                concat!("CASE WHEN ?9 THEN ", now!(), " END"),
                " RETURNING 4 AS tag, id, task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority"
            ),
            "; ",
            promote_ready!(handing_run!()),
            "; SELECT 5 AS tag, EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL AND sweep_after IS NULL) \
             WHERE ?8 IS NOT NULL AND EXISTS (SELECT 1 FROM temp.handing_off)"
        )
    };
}

/// promote_due_retries' first statement: mark the run's due retries
/// (`taskrun_active_idx`).
macro_rules! mark_due {
    () => {
        concat!(
            "UPDATE task_run SET retry_at = -1 \
             WHERE run_id = ?2 AND state = 'retrying' \
             AND retry_at <= ",
            now!()
        )
    };
}

#[cfg(test)]
pub(crate) const PROMOTE_DUE: &str = mark_due!();

/// promote_due_retries in one call.
pub(crate) const PROMOTE_DUE_CALL: &str = concat!(
    mark_due!(),
    "; ",
    batch_events!("retry_ready", "retrying", "ready", "?2", due_marked!()),
    "; ",
    batch_dispatch!(due_marked!()),
    "; UPDATE task_run SET state = 'ready', retry_at = NULL WHERE ",
    due_marked!(),
    " RETURNING 3 AS tag, id, task_key; ",
    activity!()
);

/// The named rows (`?3`) of the run still pending, each looked up by its
/// key (`uniq_taskrun_run_key`). The `+` keeps `state` out of the index
/// search: `taskrun_active_idx` would qualify and walk every pending row
/// of the run instead.
macro_rules! pending_named {
    () => {
        "run_id = ?2 AND +state = 'pending' AND task_key IN (SELECT value FROM json_each(?3))"
    };
}

#[cfg(test)]
pub(crate) const PENDING_NAMED: &str = concat!("SELECT id FROM task_run WHERE ", pending_named!());

/// A move of the named rows still pending by `$edge` to `$to`, with
/// `$set` (the reason `?4`, and whatever else the edge sets) and its
/// events, in one call: `?3` the keys.
macro_rules! move_pending {
    ($edge:literal, $to:literal, $set:literal) => {
        concat!(
            batch_events!($edge, "pending", $to, "?2", pending_named!()),
            "; UPDATE task_run SET state = '",
            $to,
            "', ",
            $set,
            ", finished_at = ",
            now!(),
            " WHERE ",
            pending_named!(),
            " RETURNING 3 AS tag, id, task_key; ",
            activity!()
        )
    };
}

/// cancel_pending in one call: `?3` the keys, `?4` the reason.
pub(crate) const CANCEL_PENDING: &str = move_pending!("cancel_pending", "cancelled", "cancel_reason = ?4");

/// skip_pending in one call: the named rows still pending, skipped and
/// flagged so this pass's next take_flagged reacts to them. `?3` the keys,
/// `?4` the reason.
pub(crate) const SKIP_PENDING: &str = move_pending!("skip", "skipped", "skip_reason = ?4, needs_pass = 1");

/// fail_pending in one call: `?5` (`fail_condition` or `fail_map`) on the
/// named row (`?3` a one-key list) if still pending, with its error `?4`,
/// flagged like [`SKIP_PENDING`].
pub(crate) const FAIL_PENDING: &str = concat!(
    event_insert!(),
    "SELECT id, run_id, task_key, ?5, 'pending', 'failed', attempt, fencing_token, NULL, ",
    now!(),
    ", ?4, ",
    event_number!("?2", "ROW_NUMBER() OVER (ORDER BY id)"),
    " FROM task_run WHERE ",
    pending_named!(),
    " ORDER BY id; ",
    events_written!("task_run_event"),
    "; UPDATE task_run SET state = 'failed', error = ?4, needs_pass = 1, finished_at = ",
    now!(),
    " WHERE ",
    pending_named!(),
    " RETURNING 3 AS tag, id, task_key; ",
    activity!()
);

/// The mapped task `?3` of run `?2`, pending on its hold alone and not
/// expanded yet.
macro_rules! expandable {
    () => {
        "run_id = ?2 AND task_key = ?3 AND state = 'pending' AND pending_deps = 1 AND map_size IS NULL \
         AND compensate_for IS NULL"
    };
}

/// expand_map in one call: the children `key[0]` … `key[?4 - 1]` of the
/// expandable mapped task `?3` go in pending on one hold each, at its
/// generation and priority; then it gets its size `?4`. It keeps its hold,
/// so no promotion ever takes it to ready.
pub(crate) const EXPAND_MAP: &str = concat!(
    "INSERT INTO task_run (run_id, task_key, state, pending_deps, created_at, priority, generation, map_of, map_index) \
     WITH RECURSIVE i (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n + 1 < ?4) \
     SELECT p.run_id, p.task_key || '[' || i.n || ']', 'pending', 1, ",
    now!(),
    ", p.priority, p.generation, p.task_key, i.n FROM task_run p, i WHERE ",
    expandable!(),
    "; UPDATE task_run SET map_size = ?4 WHERE ",
    expandable!(),
    " RETURNING 3 AS tag, id, task_key; ",
    activity!()
);

/// map_children: how the children of mapped task `?2` of run `?1` stand
/// (`taskrun_map_children_idx`): its size, the children succeeded and
/// active, the lowest-index one failed (`[index, error]`), and up to `?3`
/// held-back ones, lowest index first (a JSON array).
pub(crate) const MAP_CHILDREN: &str = concat!(
    "SELECT (SELECT map_size FROM task_run WHERE run_id = ?1 AND task_key = ?2),
       count(*) FILTER (WHERE state = 'succeeded'),
       count(*) FILTER (WHERE state IN ('ready', 'running', 'retrying')),
       (SELECT json_array(map_index, error) FROM task_run
        WHERE run_id = ?1 AND map_of = ?2 AND state = 'failed' ORDER BY map_index LIMIT 1),
       (SELECT json_group_array(map_index) FROM (
           SELECT map_index FROM task_run WHERE run_id = ?1 AND map_of = ?2 AND state = 'pending'
           ORDER BY map_index",
    limit!("?3"),
    "))
FROM task_run WHERE run_id = ?1 AND map_of = ?2"
);

/// The expanded mapped task `?3` of run `?2`, still pending, every child
/// of which succeeded (`taskrun_map_children_idx`).
macro_rules! all_succeeded {
    () => {
        "run_id = ?2 AND task_key = ?3 AND state = 'pending' AND map_size IS NOT NULL \
         AND map_size = (SELECT count(*) FROM task_run c WHERE c.run_id = ?2 AND c.map_of = ?3 \
                         AND c.state = 'succeeded')"
    };
}

/// The size of the array of the children's outputs of `?3`: their stored
/// text, a comma each and the brackets.
macro_rules! collected_bytes {
    () => {
        "(SELECT COALESCE(sum(length(CAST(c.result AS BLOB))), 0) + count(*) + 1 FROM task_run c \
          WHERE c.run_id = ?2 AND c.map_of = ?3)"
    };
}

/// [`all_succeeded!`], with the array at most `?4` bytes.
macro_rules! collectable {
    () => {
        concat!(all_succeeded!(), " AND ", collected_bytes!(), " <= ?4")
    };
}

/// collect_map in one call: `collect` on the collectable mapped task `?3`,
/// its output the array of its children's in index order, flagged like
/// [`SKIP_PENDING`]; then (tag 7) whether every child succeeded, and the
/// array's size.
pub(crate) const COLLECT_MAP: &str = concat!(
    event_insert!(),
    "SELECT id, run_id, task_key, 'collect', 'pending', 'succeeded', attempt, fencing_token, NULL, ",
    now!(),
    ", NULL, ",
    event_number!("?2", "1"),
    " FROM task_run WHERE ",
    collectable!(),
    "; ",
    events_written!("task_run_event"),
    "; UPDATE task_run SET state = 'succeeded', needs_pass = 1, finished_at = ",
    now!(),
    ", result = (SELECT json_group_array(json(c.result) ORDER BY c.map_index) FROM task_run c \
     WHERE c.run_id = ?2 AND c.map_of = ?3) WHERE ",
    collectable!(),
    " RETURNING 3 AS tag, id, task_key; SELECT 7 AS tag, EXISTS (SELECT 1 FROM task_run WHERE ",
    all_succeeded!(),
    "), ",
    collected_bytes!(),
    "; ",
    activity!()
);

/// pending_counts: the pending forward rows of run `?1` among the keys
/// `?2` (`uniq_taskrun_run_key`, with `+state` as in `pending_named!`),
/// with their counters, but for mapped tasks already expanded.
pub(crate) const PENDING_COUNTS: &str = "\
SELECT task_key, pending_deps FROM task_run
WHERE run_id = ?1 AND +state = 'pending' AND compensate_for IS NULL AND map_size IS NULL
  AND task_key IN (SELECT value FROM json_each(?2))
ORDER BY id";

/// dependency_outcomes: the run's input (tag 0), then each named forward
/// row's state and output (tag 1; `uniq_taskrun_run_key`). `?3` the keys.
pub(crate) const DEPENDENCY_OUTCOMES: &str = "\
SELECT 0 AS tag, input, NULL, NULL FROM workflow_run WHERE id = ?2;
SELECT 1 AS tag, task_key, state, result FROM task_run
WHERE run_id = ?2 AND compensate_for IS NULL AND task_key IN (SELECT value FROM json_each(?3))
ORDER BY id";

/// The run's waiting forward rows: active (`taskrun_active_idx`) and not
/// running.
macro_rules! waiting {
    () => {
        concat!(
            "run_id = ?2 AND ",
            active_states!(),
            " AND state <> 'running' AND compensate_for IS NULL"
        )
    };
}

/// A cancel for `$reason` of the rows matching `$where`: the UPDATE.
macro_rules! cancel_rows {
    ($where:expr, $reason:literal) => {
        concat!(
            "UPDATE task_run SET state = 'cancelled', cancel_reason = '",
            $reason,
            "', retry_at = NULL, finished_at = ",
            now!(),
            " WHERE ",
            $where,
            " RETURNING 3 AS tag, id, task_key"
        )
    };
}

/// A cancel for `$reason` of the waiting rows of run `?2` matching
/// `$where`, in one call. Each source state has its own transition name;
/// the events go by state (pending, ready, retrying), then id.
macro_rules! cancel_call {
    ($where:expr, $reason:literal) => {
        concat!(
            event_insert!(),
            "SELECT id, run_id, task_key, \
             CASE state WHEN 'pending' THEN 'cancel_pending' WHEN 'ready' THEN 'cancel_ready' \
             ELSE 'cancel_retrying' END, state, 'cancelled', attempt, fencing_token, NULL, ",
            now!(),
            ", NULL, ",
            event_number!(
                "?2",
                "ROW_NUMBER() OVER (ORDER BY CASE state WHEN 'pending' THEN 0 WHEN 'ready' THEN 1 ELSE 2 END, id)"
            ),
            " FROM task_run WHERE ",
            $where,
            " ORDER BY CASE state WHEN 'pending' THEN 0 WHEN 'ready' THEN 1 ELSE 2 END, id; ",
            events_written!("task_run_event"),
            "; ",
            cancel_rows!($where, $reason),
            "; ",
            activity!()
        )
    };
}

/// cancel_waiting's UPDATE: the run's waiting forward rows (`taskrun_active_idx`).
#[cfg(test)]
pub(crate) const CANCEL_WAITING: &str = cancel_rows!(waiting!(), "user");

/// cancel_waiting in one call: a user's cancel of the run's waiting forward
/// rows.
pub(crate) const CANCEL_WAITING_CALL: &str = cancel_call!(waiting!(), "user");

/// The children of mapped task `?3` still waiting (`taskrun_map_children_idx`).
macro_rules! waiting_children {
    () => {
        "run_id = ?2 AND map_of = ?3 AND state IN ('pending', 'ready', 'retrying')"
    };
}

/// cancel_children in one call: the waiting children of mapped task `?3`,
/// cancelled `upstream_failed` once it failed.
pub(crate) const CANCEL_CHILDREN: &str = cancel_call!(waiting_children!(), "upstream_failed");

/// create_compensator in one call: the declared task, the row (only when
/// declared so, once) in the run's current generation, its dispatch when it
/// was created ([`REARM_COMPENSATOR`] takes an earlier generation's row).
/// `?3` workflow, `?4` key, `?5` the task it undoes.
pub(crate) const CREATE_COMPENSATOR: &str = concat!(
    "SELECT 5 AS tag, compensate_for FROM task WHERE workflow_id = ?3 AND key = ?4; \
     INSERT INTO task_run (run_id, task_key, compensate_for, state, pending_deps, created_at, generation, priority) \
     SELECT ?2, ?4, ?5, 'ready', 0, ",
    now!(),
    ", wr.generation, COALESCE(t.priority, wr.priority) FROM workflow_run wr, task t \
     WHERE wr.id = ?2 AND t.workflow_id = ?3 AND t.key = ?4 AND t.compensate_for = ?5 \
     ON CONFLICT (run_id, task_key) DO NOTHING RETURNING 6 AS tag, id; \
     INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority) \
     SELECT tr.id, tr.run_id, tr.task_key, ",
    task_type_of!("tr"),
    ", tr.fencing_token, ",
    now!(),
    ", tr.priority FROM task_run tr WHERE tr.run_id = ?2 AND tr.task_key = ?4 AND changes() = 1; ",
    activity!()
);

/// The compensator row `?3` of run `?2` when an earlier generation's
/// rollback left it finished.
macro_rules! stale_compensator {
    () => {
        "task_run WHERE run_id = ?2 AND task_key = ?3 AND compensate_for IS NOT NULL \
         AND state IN ('succeeded', 'failed', 'cancelled') \
         AND generation < (SELECT generation FROM workflow_run WHERE id = ?2)"
    };
}

/// create_compensator, when the row exists from an earlier generation's
/// rollback (docs/design/retry.md#compensated-runs), in one call: its
/// `reset` event (read before the row moves), then `reset` to ready in the
/// current generation as a retried forward task takes it — attempt + 1
/// over its earlier attempts, token + 1, output and error cleared — and its
/// dispatch. `?3` key.
pub(crate) const REARM_COMPENSATOR: &str = concat!(
    event_insert!(),
    "SELECT id, run_id, task_key, 'reset', state, 'ready', attempt + 1, fencing_token + 1, NULL, ",
    now!(),
    ", NULL, ",
    event_number!("?2", "1"),
    " FROM ",
    stale_compensator!(),
    "; ",
    events_written!("task_run_event"),
    "; UPDATE task_run SET state = 'ready', pending_deps = 0, \
     generation = (SELECT generation FROM workflow_run WHERE id = ?2), ",
    reset_set!(),
    " WHERE id = (SELECT id FROM ",
    stale_compensator!(),
    ") RETURNING 6 AS tag, id; \
     INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority) \
     SELECT tr.id, tr.run_id, tr.task_key, ",
    task_type_of!("tr"),
    ", tr.fencing_token, ",
    now!(),
    ", tr.priority FROM task_run tr WHERE tr.run_id = ?2 AND tr.task_key = ?3 AND changes() = 1; ",
    activity!()
);

/// transition_run in one call: `?3` source, `?4` target, `?5` whether it
/// starts the run, `?6` whether it ends it, `?7` the edge.
pub(crate) const TRANSITION_RUN: &str = concat!(
    "UPDATE workflow_run SET state = ?4, \
     started_at = CASE WHEN ?5 THEN COALESCE(started_at, ",
    now!(),
    ") ELSE started_at END, \
     finished_at = CASE WHEN ?6 THEN ",
    now!(),
    " ELSE finished_at END \
     WHERE id = ?2 AND state = ?3 RETURNING 4 AS tag; \
     INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at, seq, generation) \
     SELECT ?2, ?7, ?3, ?4, ",
    now!(),
    ", ",
    event_number!("?2", "1"),
    " WHERE changes() = 1; ",
    events_written!("workflow_run_event"),
    "; ",
    activity!()
);

/// Commit after putting back the flags `begin_pass` cleared but nobody
/// took: `?1` their task run ids, `?2` the run, `?3` whether its flag was set.
pub(crate) const COMMIT_RESTORING: &str = "UPDATE task_run SET needs_pass = 1 WHERE id IN (SELECT value FROM json_each(?1)); \
     UPDATE workflow_run SET needs_pass = 1 WHERE id = ?2 AND ?3; COMMIT";

pub(crate) const TALLY: &str = "SELECT state, cancel_reason, COUNT(*), MAX(started_at IS NOT NULL) FROM task_run \
     WHERE run_id = ?1 AND compensate_for IS NULL GROUP BY state, cancel_reason";

pub(crate) const SUCCEEDED_KEYS: &str =
    "SELECT task_key FROM task_run WHERE run_id = ?1 AND state = 'succeeded' AND compensate_for IS NULL";

/// compensator_states: the current generation's rows; an earlier
/// generation's rollback is not this one's.
pub(crate) const COMPENSATOR_STATES: &str = "SELECT task_key, state FROM task_run \
     WHERE run_id = ?1 AND compensate_for IS NOT NULL \
     AND generation = (SELECT generation FROM workflow_run WHERE id = ?1) ORDER BY id";

/// waits: the run's due waits. `?2` run.
pub(crate) const WAITS: &str = due_waits!("?2");

/// pass_gates: the scopes and sizes of one holder's waits, by scope. `?2`
/// run, `?3` task (NULL: the run).
pub(crate) const HOLDER_WAITS: &str =
    "SELECT scope, max FROM concurrency_wait WHERE run_id = ?2 AND task_key IS ?3 ORDER BY scope";

/// pass_gates: the lowest free slot of a pool below its size, for one
/// holder (the primary key would refuse a taken one; under the write lock
/// none is taken meanwhile). `?2` run, `?3` task, `?4` scope, `?5` size.
pub(crate) const TAKE_SLOT: &str = concat!(
    "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?5) \
     INSERT INTO concurrency_slot (scope, slot, run_id, task_key, acquired_at) \
     SELECT ?4, i, ?2, ?3, ",
    now!(),
    " FROM n WHERE NOT EXISTS (SELECT 1 FROM concurrency_slot s WHERE s.scope = ?4 AND s.slot = n.i) \
     ORDER BY i LIMIT 1 RETURNING slot"
);

/// pass_gates, when one pool of a holder is full: gives back the slots
/// this pass took for it. `?2` run, `?3` task.
pub(crate) const UNTAKE_SLOTS: &str = "DELETE FROM concurrency_slot WHERE run_id = ?2 AND task_key IS ?3";

/// pass_gates, once every pool gave a slot. `?2` run, `?3` task.
pub(crate) const DROP_WAITS: &str = "DELETE FROM concurrency_wait WHERE run_id = ?2 AND task_key IS ?3";

/// mark_gates_tried: the run's own waits. `?2` run.
pub(crate) const MARK_GATES_TRIED: &str =
    "UPDATE concurrency_wait SET tried = 1 WHERE run_id = ?2 AND task_key IS NULL";

/// cancel_oldest_holder: the cancel request, reason `concurrency_limit`,
/// of the run holding a slot of `?3` longest, not cancel-requested and not
/// `?2`; it is flagged for a pass.
pub(crate) const CANCEL_OLDEST_HOLDER: &str = concat!(
    "UPDATE workflow_run SET cancel_requested_at = ",
    now!(),
    ", cancel_reason = 'concurrency_limit', needs_pass = 1 \
     WHERE id = (SELECT s.run_id FROM concurrency_slot s JOIN workflow_run r ON r.id = s.run_id \
                 WHERE s.scope = ?3 AND s.task_key IS NULL AND s.run_id <> ?2 AND r.cancel_requested_at IS NULL \
                   AND r.state IN ('pending', 'running') \
                 ORDER BY s.acquired_at, r.created_at, s.run_id LIMIT 1) \
       AND cancel_requested_at IS NULL AND state IN ('pending', 'running') RETURNING id"
);

/// cancel_for_limit: the run's cancel request, with its reason. `?2` run.
pub(crate) const CANCEL_FOR_LIMIT: &str = concat!(
    "UPDATE workflow_run SET cancel_requested_at = COALESCE(cancel_requested_at, ",
    now!(),
    "), cancel_reason = 'concurrency_limit' WHERE id = ?2"
);

/// release_slots: the slots of the run's finished tasks and, when `?3`
/// (the run settled), every slot and wait of the run; returns a row per
/// slot let go. `?2` run.
pub(crate) const RELEASE_SLOTS: &str = "DELETE FROM concurrency_slot AS s WHERE s.run_id = ?2 \
     AND (?3 OR (s.task_key IS NOT NULL AND EXISTS (SELECT 1 FROM task_run tr WHERE tr.run_id = ?2 \
          AND tr.task_key = s.task_key AND tr.state IN ('succeeded', 'failed', 'cancelled')))) RETURNING 1; \
     DELETE FROM concurrency_wait WHERE run_id = ?2 AND ?3";
