//! The scheduler pass's statements: taking a run's flags, promoting,
//! cancelling, compensating and deriving the run's state.

/// begin_pass and take_flagged in one round trip: the run locked (`FOR NO
/// KEY UPDATE SKIP LOCKED`, so several schedulers can run at once, while a
/// finish handing on holds it `FOR KEY SHARE`; by primary key), then [`TAKE_FLAGGED`]'s clearing, only when the lock was taken. One row
/// per flagged task run (its columns NULL when none is flagged), none when
/// the run is locked by another scheduler or terminal. `$1` run, `$2`
/// offset (for the run's age).
pub const BEGIN_PASS_TAKING_FLAGS: &str = concat!(
    "WITH locked AS (
    SELECT id, workflow_id, state, cancel_requested_at IS NOT NULL AS cancel_requested, gated,
           cancel_reason IS NOT NULL AS limit_cancelled,
           EXTRACT(EPOCH FROM (statement_timestamp() + $2::interval) - created_at)::float8 AS age_seconds
    FROM workflow_run
    WHERE id = $1 AND state IN ('pending', 'running')
    FOR NO KEY UPDATE SKIP LOCKED
), ",
    take_flags!("(SELECT id FROM locked)"),
    "
SELECT l.id AS run_id, l.workflow_id, l.state AS run_state, l.cancel_requested, l.gated, l.limit_cancelled,
       l.age_seconds,
       f.id, f.task_key, f.state, f.cancel_reason, f.compensate_for
FROM locked AS l LEFT JOIN flagged AS f ON true
ORDER BY f.id"
);

/// take_flagged: reads and clears the task-run flags in one statement
/// (`taskrun_needs_pass_idx`), and clears the run's flag. `$1` run.
pub const TAKE_FLAGGED: &str = concat!(
    "WITH ",
    take_flags!("$1"),
    "
SELECT id, task_key, state, cancel_reason, compensate_for FROM flagged ORDER BY id"
);

/// satisfy_dependencies: lowers the pending rows' counts in one batched
/// UPDATE, applying `dependencies_satisfied` in the same statement to every
/// forward row that reaches zero, with its event and one outbox row each.
///
/// Each key is looked up by its own probe of `uniq_taskrun_run_key`, in a
/// LATERAL subquery that LIMIT keeps from being flattened into a join, and
/// the UPDATE joins what it found by primary key. Joined directly, the plan
/// followed the run's row estimate, which is stale for a run started since
/// the last ANALYZE (estimated at one row), and could rescan the whole
/// batch for each of the run's rows: quadratic on a wide fan-out.
/// `$1` offset, `$2` run, `$3` workflow, `$4` keys, `$5` amounts.
pub const LOWER_AND_PROMOTE: &str = concat!(
    "WITH found AS MATERIALIZED (
    SELECT t.id, d.n
    FROM unnest($4::text[], $5::int4[]) AS d(key, n)
    CROSS JOIN LATERAL (SELECT id FROM task_run WHERE run_id = $2 AND task_key = d.key LIMIT 1) AS t
), lowered AS (
    UPDATE task_run AS tr
    SET pending_deps = tr.pending_deps - f.n,
        state = CASE WHEN tr.pending_deps - f.n = 0 AND tr.compensate_for IS NULL THEN 'ready' ELSE tr.state END
    FROM found AS f
    WHERE tr.id = f.id AND tr.state = 'pending'
    RETURNING tr.id, tr.run_id, tr.task_key, tr.attempt, tr.fencing_token, tr.state, tr.priority, tr.map_of
), moved AS (
    SELECT id, run_id, task_key, attempt, fencing_token, priority, map_of FROM lowered WHERE state = 'ready'
",
    made_ready!("dependencies_satisfied", "pending"),
    "
SELECT m.task_key, ",
    any_row!("dispatched"),
    " AS woke FROM moved AS m ORDER BY m.id"
);

/// promote_due_retries: `retry_ready` on every due retrying row of the
/// run, with one outbox row each (`taskrun_retry_due_idx` or
/// `taskrun_active_idx`, whichever is smaller), and the run's activity
/// (see [`ACTIVITY`]) in the same round trip: the scheduler asks for it
/// next, and a promotion cannot change it (retrying and ready are both
/// active, and nothing starts). `$1` offset, `$2` run, `$3` workflow, `$4`
/// true when the run is no longer pending.
pub const PROMOTE_RETRIES: &str = concat!(
    "WITH moved AS (
    UPDATE task_run SET state = 'ready', retry_at = NULL
    WHERE run_id = $2 AND state = 'retrying' AND retry_at <= ",
    now!(),
    "
    RETURNING id, run_id, task_key, attempt, fencing_token, priority, map_of
",
    made_ready!("retry_ready", "retrying"),
    "
SELECT COALESCE((SELECT array_agg(task_key ORDER BY id) FROM moved), '{}') AS keys, ",
    any_row!("dispatched"),
    " AS woke,
       ",
    activity_columns!("$2", "$4")
);

/// A move of the named rows still pending (`uniq_taskrun_run_key`) by
/// `$edge` to `$to`, with `$set` (the reason `$4`, and whatever else the
/// edge sets) and its event; returns the keys moved. `$1` offset, `$2`
/// run, `$3` keys.
macro_rules! move_pending {
    ($edge:literal, $to:literal, $set:literal) => {
        concat!(
            "WITH moved AS (
    UPDATE task_run SET state = '",
            $to,
            "', ",
            $set,
            ", finished_at = ",
            now!(),
            "
    WHERE run_id = $2 AND task_key = ANY($3) AND state = 'pending'
    RETURNING id, run_id, task_key, attempt, fencing_token
), event AS (
    ",
            event_insert!(),
            "SELECT id, run_id, task_key, '",
            $edge,
            "', 'pending', '",
            $to,
            "', attempt, fencing_token, NULL, ",
            now!(),
            ", NULL FROM moved ORDER BY id
)
SELECT task_key FROM moved ORDER BY id"
        )
    };
}

/// cancel_pending: `$4` the reason.
pub const CANCEL_PENDING: &str = move_pending!("cancel_pending", "cancelled", "cancel_reason = $4");

/// skip_pending: `$4` the reason; each row flagged so this pass's next
/// take_flagged reacts to it.
pub const SKIP_PENDING: &str = move_pending!("skip", "skipped", "skip_reason = $4, needs_pass = true");

/// fail_pending: `$5` (`fail_condition` or `fail_map`) on the named row if
/// still pending, with its error, flagged like [`SKIP_PENDING`]. `$1`
/// offset, `$2` run, `$3` key, `$4` error, `$5` edge.
pub const FAIL_PENDING: &str = concat!(
    "WITH moved AS (
    UPDATE task_run SET state = 'failed', error = $4, needs_pass = true, finished_at = ",
    now!(),
    "
    WHERE run_id = $2 AND task_key = $3 AND state = 'pending'
    RETURNING id, run_id, task_key, attempt, fencing_token
), event AS (
    ",
    event_insert!(),
    "SELECT id, run_id, task_key, $5, 'pending', 'failed', attempt, fencing_token, NULL, ",
    now!(),
    ", $4 FROM moved
)
SELECT count(*) > 0 FROM moved"
);

/// expand_map: the mapped task `$3` of run `$2`, pending on its hold alone
/// and not expanded, gets its size `$4` (it keeps its hold, so no
/// promotion ever takes it to ready); its children
/// `key[0]` … `key[$4 - 1]` go in pending on one hold each, at the run's
/// generation and the mapped task's priority. Returns whether it expanded.
/// `$1` offset.
pub const EXPAND_MAP: &str = concat!(
    "WITH parent AS (
    UPDATE task_run SET map_size = $4
    WHERE run_id = $2 AND task_key = $3 AND state = 'pending' AND pending_deps = 1 AND map_size IS NULL
      AND compensate_for IS NULL
    RETURNING run_id, task_key, priority, generation
), children AS (
    INSERT INTO task_run (run_id, task_key, state, pending_deps, created_at, priority, generation, map_of, map_index)
    SELECT p.run_id, p.task_key || '[' || i || ']', 'pending', 1, ",
    now!(),
    ", p.priority, p.generation, p.task_key, i
    FROM parent AS p CROSS JOIN generate_series(0, $4 - 1) AS i
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM parent)"
);

/// map_children: how the children of mapped task `$2` of run `$1` stand
/// (`taskrun_map_children_idx`): its size, the children succeeded and
/// active, the lowest-index one failed (with its error), and up to `$3`
/// held-back ones, lowest index first.
pub const MAP_CHILDREN: &str = "\
SELECT (SELECT map_size FROM task_run WHERE run_id = $1 AND task_key = $2) AS size,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state IN ('ready', 'running', 'retrying')) AS active,
       (SELECT jsonb_build_array(map_index, error) FROM task_run
        WHERE run_id = $1 AND map_of = $2 AND state = 'failed' ORDER BY map_index LIMIT 1) AS failed,
       COALESCE((SELECT array_agg(map_index ORDER BY map_index) FROM (
           SELECT map_index FROM task_run WHERE run_id = $1 AND map_of = $2 AND state = 'pending'
           ORDER BY map_index LIMIT $3) AS w), '{}') AS waiting
FROM task_run WHERE run_id = $1 AND map_of = $2";

/// collect_map: `collect` on the expanded mapped task `$3` of run `$2` if
/// still pending, every child succeeded and the array of their outputs
/// takes at most `$4` bytes (their sizes as stored, a comma each and the
/// brackets): its output that array in index order
/// (`taskrun_map_children_idx`), flagged like [`SKIP_PENDING`], with that
/// size, which is the compact text's, as its `result_bytes` (jsonb's own
/// text spaces it out). The array is only built once it fits. Returns
/// whether it moved, whether every child succeeded, and the array's size.
/// `$1` offset.
pub const COLLECT_MAP: &str = concat!(
    "WITH sized AS (
    SELECT count(*) FILTER (WHERE c.state = 'succeeded') = p.map_size AS ready,
           (COALESCE(sum(COALESCE(c.result_bytes, octet_length(c.result::text))), 0) + count(*) + 1)::int8 AS bytes
    FROM task_run AS p JOIN task_run AS c ON c.run_id = p.run_id AND c.map_of = p.task_key
    WHERE p.run_id = $2 AND p.task_key = $3 AND p.state = 'pending' AND p.map_size IS NOT NULL
    GROUP BY p.map_size
), collected AS (
    SELECT jsonb_agg(c.result ORDER BY c.map_index) AS result, min(s.bytes) AS bytes
    FROM sized AS s, task_run AS c
    WHERE s.ready AND s.bytes <= $4 AND c.run_id = $2 AND c.map_of = $3
), moved AS (
    UPDATE task_run AS tr
    SET state = 'succeeded', needs_pass = true, finished_at = ",
    now!(),
    ",
        result = a.result, result_bytes = a.bytes
    FROM collected AS a
    WHERE tr.run_id = $2 AND tr.task_key = $3 AND tr.state = 'pending' AND a.result IS NOT NULL
    RETURNING tr.id, tr.run_id, tr.task_key, tr.attempt, tr.fencing_token
), event AS (
    ",
    event_insert!(),
    "SELECT id, run_id, task_key, 'collect', 'pending', 'succeeded', attempt, fencing_token, NULL, ",
    now!(),
    ", NULL FROM moved
)
SELECT EXISTS (SELECT 1 FROM moved), COALESCE((SELECT ready FROM sized), false), (SELECT bytes FROM sized)"
);

/// pending_counts: the pending forward rows among the keys, with their
/// counters, but for mapped tasks already expanded (`uniq_taskrun_run_key`). `$1` run, `$2` keys.
pub const PENDING_COUNTS: &str = "\
SELECT task_key, pending_deps FROM task_run
WHERE run_id = $1 AND task_key = ANY($2) AND state = 'pending' AND compensate_for IS NULL AND map_size IS NULL
ORDER BY id";

/// dependency_outcomes: the run's input, then each named forward row's
/// state and output (`uniq_taskrun_run_key`). `$1` run, `$2` keys.
pub const DEPENDENCY_OUTCOMES: &str = "\
SELECT (SELECT input FROM workflow_run WHERE id = $1) AS input,
       COALESCE((SELECT jsonb_agg(jsonb_build_array(task_key, state, result) ORDER BY id) FROM task_run
                 WHERE run_id = $1 AND task_key = ANY($2) AND compensate_for IS NULL), '[]') AS tasks";

/// One CTE of [`CANCEL_WAITING`] and [`CANCEL_CHILDREN`]: a cancel for
/// `$reason` of the run's rows in `$state` that match `$which`
/// (`taskrun_active_idx`, or `taskrun_map_children_idx` for children),
/// naming the state each left.
macro_rules! cancel_from {
    ($state:literal, $reason:literal, $which:literal) => {
        concat!(
            "from_",
            $state,
            " AS (
    UPDATE task_run SET state = 'cancelled', cancel_reason = '",
            $reason,
            "', finished_at = ",
            now!(),
            ", retry_at = NULL
    WHERE run_id = $2 AND state = '",
            $state,
            "' AND ",
            $which,
            "
    RETURNING id, run_id, task_key, attempt, fencing_token, '",
            $state,
            "'::text AS from_state
)"
        )
    };
}

/// The tail of [`CANCEL_WAITING`] and [`CANCEL_CHILDREN`]: the rows moved
/// from each state, their events by their own edges, and their keys.
macro_rules! cancelled_tail {
    () => {
        concat!(
            ", moved AS (
    SELECT * FROM from_pending UNION ALL SELECT * FROM from_ready UNION ALL SELECT * FROM from_retrying
), event AS (
    ",
            event_insert!(),
            "SELECT id, run_id, task_key,
           CASE from_state WHEN 'pending' THEN 'cancel_pending' WHEN 'ready' THEN 'cancel_ready'
                           ELSE 'cancel_retrying' END,
           from_state, 'cancelled', attempt, fencing_token, NULL, ",
            now!(),
            ", NULL
    FROM moved ORDER BY id
)
SELECT task_key FROM moved ORDER BY id"
        )
    };
}

/// cancel_children: the children of mapped task `$3` still waiting
/// (pending, ready or retrying), cancelled `upstream_failed` each by its
/// own edge, once their mapped task failed. `$1` offset, `$2` run.
pub const CANCEL_CHILDREN: &str = concat!(
    "WITH ",
    cancel_from!("pending", "upstream_failed", "map_of = $3"),
    ", ",
    cancel_from!("ready", "upstream_failed", "map_of = $3"),
    ", ",
    cancel_from!("retrying", "upstream_failed", "map_of = $3"),
    cancelled_tail!()
);

/// cancel_waiting: every waiting forward row of the run, each by its own
/// edge. One single-table UPDATE per source state, not a join of the run's
/// rows with themselves: a join's plan follows the run's row estimate,
/// which is stale for a run started since the last ANALYZE, and a nested
/// loop over a wide run's rows on both sides is quadratic. `$1` offset,
/// `$2` run.
pub const CANCEL_WAITING: &str = concat!(
    "WITH ",
    cancel_from!("pending", "user", "compensate_for IS NULL"),
    ", ",
    cancel_from!("ready", "user", "compensate_for IS NULL"),
    ", ",
    cancel_from!("retrying", "user", "compensate_for IS NULL"),
    cancelled_tail!()
);

/// tally: the forward task runs of the run by state and cancel reason
/// (`uniq_taskrun_run_key`). `$1` run.
pub const TALLY: &str = "\
SELECT state, cancel_reason, count(*) AS n, bool_or(started_at IS NOT NULL) AS any_started
FROM task_run WHERE run_id = $1 AND compensate_for IS NULL
GROUP BY state, cancel_reason";

/// activity: whether a forward row is still active (`taskrun_active_idx`:
/// an index probe, not a scan of the run) and whether any row started;
/// `$2` is true when the run is no longer pending, which already says so
/// (a run moves to running only once something started), so the scan for
/// `started_at` runs only in a pending run. `$1` run.
pub const ACTIVITY: &str = concat!("SELECT ", activity_columns!("$1", "$2"));

/// succeeded_keys (`uniq_taskrun_run_key`). `$1` run.
pub const SUCCEEDED_KEYS: &str =
    "SELECT task_key FROM task_run WHERE run_id = $1 AND compensate_for IS NULL AND state = 'succeeded'";

/// compensator_states: the compensator rows of the run's current
/// generation; an earlier generation's rollback is not this one's
/// (docs/design/retry.md#compensated-runs) (`uniq_taskrun_run_key`). `$1` run.
pub const COMPENSATOR_STATES: &str = "\
SELECT task_key, state FROM task_run
WHERE run_id = $1 AND compensate_for IS NOT NULL
  AND generation = (SELECT generation FROM workflow_run WHERE id = $1)
ORDER BY id";

/// create_compensator: the compensator row, ready, in the run's current
/// generation, with its outbox row; nothing when it exists
/// ([`REARM_COMPENSATOR`] takes an earlier generation's). `$1` offset, `$2`
/// run, `$3` workflow, `$4` key, `$5` compensated key.
pub const CREATE_COMPENSATOR: &str = concat!(
    "WITH known AS (
    SELECT t.key, t.task_type, t.priority FROM task AS t
    WHERE t.workflow_id = $3 AND t.key = $4 AND t.compensate_for = $5
), created AS (
    INSERT INTO task_run (run_id, task_key, compensate_for, state, pending_deps, created_at, generation, priority)
    SELECT $2, k.key, $5, 'ready', 0, ",
    now!(),
    ", wr.generation, COALESCE(k.priority, wr.priority)
    FROM known AS k, workflow_run AS wr WHERE wr.id = $2
    ON CONFLICT ON CONSTRAINT uniq_taskrun_run_key DO NOTHING
    RETURNING id, run_id, task_key, fencing_token, priority
), dispatched AS (
    INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority)
    SELECT c.id, c.run_id, c.task_key, k.task_type, c.fencing_token, ",
    now!(),
    ", c.priority
    FROM created AS c, known AS k
    RETURNING id
)
SELECT (SELECT count(*) FROM known) > 0 AS known, (SELECT count(*) FROM created) > 0 AS created, ",
    any_row!("dispatched"),
    " AS woke"
);

/// create_compensator, when the row exists from an earlier generation's
/// rollback (docs/design/retry.md#compensated-runs): it takes `reset` to
/// ready in the current generation as a retried forward task does —
/// attempt + 1 over its earlier attempts, token + 1, its output and error
/// cleared — with its event and dispatch. The self-join reads the state it
/// leaves. `$1` offset, `$2` run, `$3` key.
pub const REARM_COMPENSATOR: &str = concat!(
    "WITH moved AS (
    UPDATE task_run AS tr
    SET state = 'ready', pending_deps = 0, generation = wr.generation, ",
    reset_set!(),
    "
    FROM task_run AS old, workflow_run AS wr
    WHERE tr.run_id = $2 AND tr.task_key = $3 AND tr.compensate_for IS NOT NULL
      AND old.id = tr.id AND wr.id = tr.run_id AND tr.generation < wr.generation
      AND tr.state IN ('succeeded', 'failed', 'cancelled')
    RETURNING tr.id, tr.run_id, tr.task_key, old.state AS from_state, tr.state, tr.attempt, tr.fencing_token,
              tr.priority, wr.workflow_id
), event AS (
    ",
    event_insert!(),
    "SELECT id, run_id, task_key, 'reset', from_state, state, attempt, fencing_token, NULL, ",
    now!(),
    ", NULL FROM moved
), dispatched AS (
    INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority)
    SELECT m.id, m.run_id, m.task_key, t.task_type, m.fencing_token, ",
    now!(),
    ", m.priority
    FROM moved AS m JOIN task AS t ON t.workflow_id = m.workflow_id AND t.key = m.task_key
    RETURNING id
)
SELECT count(*) > 0 FROM dispatched"
);

/// transition_run: a WorkflowRun edge conditional on the stored state,
/// with its event; a terminal edge clears the run's leftover flags and
/// wakes the waiters of settled runs. `$1` offset, `$2` run,
/// `$3` source, `$4` target, `$5` edge, `$6` whether the target is terminal.
pub const TRANSITION_RUN: &str = concat!(
    "WITH moved AS (
    UPDATE workflow_run
    SET state = $4,
        started_at = CASE WHEN $5 = 'start' THEN ",
    now!(),
    " ELSE started_at END,
        finished_at = CASE WHEN $6 THEN ",
    now!(),
    " ELSE finished_at END,
        needs_pass = needs_pass AND NOT $6
    WHERE id = $2 AND state = $3
    RETURNING id
), event AS (
    INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at)
    SELECT id, $5, $3, $4, ",
    now!(),
    " FROM moved
), unflagged AS (
    UPDATE task_run SET needs_pass = false
    WHERE run_id = $2 AND needs_pass AND $6 AND EXISTS (SELECT 1 FROM moved)
)
SELECT (SELECT count(*) FROM moved) > 0 AS moved,
       (SELECT count(*) FROM moved WHERE $6) > 0 AS woke"
);

/// waits: the run's due waits (docs/design/concurrency.md#gates): its own
/// gates, and a task's once only its gate holds it back (pending with one
/// dependency left, and the run past its own gates). `$1` run.
pub const WAITS: &str = "\
SELECT w.task_key, w.scope, w.label, w.max, w.strategy, w.tried
FROM concurrency_wait AS w
LEFT JOIN task_run AS tr ON tr.run_id = w.run_id AND tr.task_key = w.task_key
WHERE w.run_id = $1
  AND (w.task_key IS NULL
       OR (tr.state = 'pending' AND tr.pending_deps = 1
           AND NOT EXISTS (SELECT 1 FROM concurrency_wait AS r WHERE r.run_id = $1 AND r.task_key IS NULL)))
ORDER BY w.task_key NULLS FIRST, w.scope";

/// pass_gates: the scopes and sizes of one holder's waits, by scope (so
/// two holders of the same pools take them in one order). `$1` run, `$2`
/// task (NULL: the run).
pub const HOLDER_WAITS: &str = "\
SELECT scope, max FROM concurrency_wait
WHERE run_id = $1 AND task_key IS NOT DISTINCT FROM $2
ORDER BY scope";

/// pass_gates: the lowest free slot of a pool below its size, for one
/// holder; nothing when none is free or a concurrent holder took the one
/// picked (the primary key decides). `$1` offset, `$2` scope, `$3` size,
/// `$4` run, `$5` task.
pub const TAKE_SLOT: &str = concat!(
    "INSERT INTO concurrency_slot (scope, slot, run_id, task_key, acquired_at)
SELECT $2, n, $4, $5, ",
    now!(),
    "
FROM generate_series(0, $3 - 1) AS n
WHERE NOT EXISTS (SELECT 1 FROM concurrency_slot AS s WHERE s.scope = $2 AND s.slot = n)
ORDER BY n LIMIT 1
ON CONFLICT DO NOTHING
RETURNING slot"
);

/// pass_gates: whether a pool has room below `$2` slots. `$1` scope.
pub const POOL_HAS_ROOM: &str = "SELECT count(*) < $2::int8 FROM concurrency_slot WHERE scope = $1 AND slot < $2";

/// pass_gates, when one pool of a holder is full: gives back the slots
/// this pass took for it. `$1` run, `$2` task.
pub const UNTAKE_SLOTS: &str = "DELETE FROM concurrency_slot WHERE run_id = $1 AND task_key IS NOT DISTINCT FROM $2";

/// pass_gates, once every pool gave a slot: the holder's waits are done.
/// `$1` run, `$2` task.
pub const DROP_WAITS: &str = "DELETE FROM concurrency_wait WHERE run_id = $1 AND task_key IS NOT DISTINCT FROM $2";

/// mark_gates_tried: the run's own waits. `$1` run.
pub const MARK_GATES_TRIED: &str = "UPDATE concurrency_wait SET tried = true WHERE run_id = $1 AND task_key IS NULL";

/// cancel_oldest_holder: the cancel request, reason `concurrency_limit`,
/// of the run holding a slot of `$3` longest, not cancel-requested and not
/// `$2`; it is flagged for a pass. `$1` offset.
pub const CANCEL_OLDEST_HOLDER: &str = concat!(
    "UPDATE workflow_run SET cancel_requested_at = ",
    now!(),
    ", cancel_reason = 'concurrency_limit', needs_pass = true
WHERE id = (
    SELECT s.run_id FROM concurrency_slot AS s JOIN workflow_run AS wr ON wr.id = s.run_id
    WHERE s.scope = $3 AND s.task_key IS NULL AND s.run_id <> $2 AND wr.cancel_requested_at IS NULL
      AND wr.state IN ('pending', 'running')
    ORDER BY s.acquired_at, wr.created_at, s.run_id
    LIMIT 1
) AND cancel_requested_at IS NULL AND state IN ('pending', 'running')
RETURNING id"
);

/// cancel_oldest_holder, after a miss: whether a holder of `$2` other than
/// `$1` is still not cancel-requested.
pub const HOLDER_TO_CANCEL: &str = "\
SELECT EXISTS (
    SELECT 1 FROM concurrency_slot AS s JOIN workflow_run AS wr ON wr.id = s.run_id
    WHERE s.scope = $2 AND s.task_key IS NULL AND s.run_id <> $1 AND wr.cancel_requested_at IS NULL
      AND wr.state IN ('pending', 'running'))";

/// cancel_for_limit: the run's cancel request, with its reason. `$1`
/// offset, `$2` run.
pub const CANCEL_FOR_LIMIT: &str = concat!(
    "UPDATE workflow_run SET cancel_requested_at = COALESCE(cancel_requested_at, ",
    now!(),
    "), cancel_reason = 'concurrency_limit' WHERE id = $2"
);

/// release_slots: the slots of the run's finished tasks and, when `$2`
/// (the run settled), every slot and wait of the run. `$1` run.
pub const RELEASE_SLOTS: &str = "\
WITH released AS (
    DELETE FROM concurrency_slot AS s
    WHERE s.run_id = $1
      AND ($2 OR (s.task_key IS NOT NULL AND EXISTS (
          SELECT 1 FROM task_run AS tr
          WHERE tr.run_id = $1 AND tr.task_key = s.task_key AND tr.state IN ('succeeded', 'failed', 'cancelled'))))
    RETURNING 1
), unwaited AS (
    DELETE FROM concurrency_wait WHERE run_id = $1 AND $2
)
SELECT count(*) FROM released";
