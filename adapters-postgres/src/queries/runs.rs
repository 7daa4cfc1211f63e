//! The run store's statements: starting runs, every task-run transition
//! with its event row in the same statement, reaping, reading runs back.

/// start_run: the run, one task run per forward task (ready when nothing
/// holds it back, else pending) and one outbox row per ready task run, in
/// one statement; each outbox row's task type is looked up per row (see
/// [`super::LOWER_AND_PROMOTE`] on pinning a wide batch's plan). The gates
/// (docs/design/concurrency.md#gates) become waits, and each counts as one
/// more dependency of what it holds back: a run gate of the tasks without
/// dependencies, a task gate of its task; a conditional task waits on one
/// hold more, which the scheduler lowers once it has decided it
/// (docs/design/conditions.md#deciding). A gated run, and a run with a
/// conditional task without dependencies, is flagged for its first pass. `$1` offset, `$2` run id, `$3` workflow id, `$4` input, `$5`
/// the run's priority, `$6` the gates as a JSON array of records.
pub const START_RUN: &str = concat!(
    "WITH gate AS (
    SELECT * FROM jsonb_to_recordset($6) AS g(task text, scope text, label text, max int4, strategy text)
), run AS (
    INSERT INTO workflow_run (id, workflow_id, state, input, created_at, priority, gated, needs_pass)
    SELECT $2, w.id, 'pending', $4, ",
    now!(),
    ", $5, jsonb_array_length($6) > 0,
           jsonb_array_length($6) > 0
           OR EXISTS (SELECT 1 FROM task AS c WHERE c.workflow_id = w.id AND c.conditional
                                                AND jsonb_array_length(c.depends_on) = 0)
    FROM workflow AS w WHERE w.id = $3
    RETURNING id, workflow_id, created_at, priority
), created AS (
    INSERT INTO task_run (run_id, task_key, state, pending_deps, created_at, priority)
    SELECT run.id, t.key, CASE WHEN held.n = 0 THEN 'ready' ELSE 'pending' END, held.n, run.created_at,
           COALESCE(t.priority, run.priority)
    FROM run JOIN task AS t ON t.workflow_id = run.workflow_id
    CROSS JOIN LATERAL (
        SELECT jsonb_array_length(t.depends_on)
             + CASE WHEN jsonb_array_length(t.depends_on) = 0
                         AND EXISTS (SELECT 1 FROM gate WHERE gate.task IS NULL) THEN 1 ELSE 0 END
             + CASE WHEN EXISTS (SELECT 1 FROM gate WHERE gate.task = t.key) THEN 1 ELSE 0 END
             + CASE WHEN t.conditional THEN 1 ELSE 0 END AS n
    ) AS held
    WHERE t.compensate_for IS NULL
    ORDER BY t.position
    RETURNING id, run_id, task_key, state, fencing_token, priority
), waits AS (
    INSERT INTO concurrency_wait (run_id, task_key, scope, label, max, strategy)
    SELECT run.id, gate.task, gate.scope, gate.label, gate.max, gate.strategy FROM run, gate
), dispatched AS (
    INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority)
    SELECT c.id, c.run_id, c.task_key, t.task_type, c.fencing_token, ",
    now!(),
    ", c.priority
    FROM created AS c
    CROSS JOIN LATERAL (SELECT task_type FROM task WHERE workflow_id = $3 AND key = c.task_key LIMIT 1) AS t
    WHERE c.state = 'ready'
    ORDER BY c.id
    RETURNING id
)
SELECT (SELECT created_at FROM run) AS created_at, ",
    any_row!("dispatched"),
    " AS woke_publisher, ",
    any_row!("run"),
    " AS woke_scheduler"
);

/// The `claim` edge's SET list, shared by both claims: running, token + 1,
/// the lease to `$4` until now + `$5`, `started_at = COALESCE(started_at,
/// now)`, the last attempt's progress cleared, and the run flagged when
/// this is the first start of a task in a still-pending run. Needs the run
/// as `wr`.
macro_rules! claim_set {
    () => {
        concat!(
            "SET state = 'running',
        fencing_token = tr.fencing_token + 1,
        lease_owner = $4,
        lease_expires_at = ",
            now!(),
            " + $5::interval,
        started_at = COALESCE(tr.started_at, ",
            now!(),
            "),
        progress = NULL,
        needs_pass = tr.needs_pass OR (wr.state = 'pending' AND tr.started_at IS NULL)"
        )
    };
}

/// What a claim returns, its `claim` event, and the claims as rows
/// (closes the `claimed` CTE), joined and ordered by `$order`.
macro_rules! claim_tail {
    ($order:literal) => {
        concat!(
            "
    RETURNING tr.id, tr.run_id, wr.workflow_id, tr.task_key, tr.compensate_for, tr.attempt, tr.attempt_base,
              tr.fencing_token, tr.lease_expires_at, wr.state = 'pending' AS run_pending
), event AS (
    ",
            event_insert!(),
            "SELECT id, run_id, task_key, 'claim', 'ready', 'running', attempt, fencing_token, $4, ",
            now!(),
            ", NULL FROM claimed ORDER BY id
)
SELECT c.id, c.run_id, c.workflow_id, c.task_key, c.compensate_for, c.attempt, c.attempt_base, c.fencing_token,
       c.lease_expires_at, c.run_pending AS woke_scheduler
FROM claimed AS c ",
            $order
        )
    };
}

/// claim_task_run: ready → running at the dispatch's token, refusing a
/// forward task of a cancel-requested run; the event in the same
/// statement. `$1` offset, `$2` id, `$3` token, `$4` worker, `$5` lease.
pub const CLAIM: &str = concat!(
    "WITH claimed AS (
    UPDATE task_run AS tr
    ",
    claim_set!(),
    "
    FROM workflow_run AS wr
    WHERE tr.id = $2 AND tr.state = 'ready' AND tr.fencing_token = $3
      AND wr.id = tr.run_id
      -- A cancel request stops forward tasks; a rollback goes on
      -- (docs/design/cancellation.md#rollbacks-are-not-interrupted).
      AND (wr.cancel_requested_at IS NULL OR tr.compensate_for IS NOT NULL)",
    claim_tail!("ORDER BY c.id")
);

/// claim_ready: the `claim` edge of [`CLAIM`] for up to `$3` ready rows of
/// the task types `$2`, skipping rows another claimer holds, in the
/// sweep's dispatch order: the readiness (the outbox row at the token the
/// row is ready at) minus priority × `$6` microseconds of aging, then the
/// readiness. `$1` offset, `$2` task types, `$3` most rows, `$4` worker,
/// `$5` lease.
pub const CLAIM_READY: &str = concat!(
    "WITH picked AS (
    SELECT tr.id, o.created_at - (o.priority * $6::float8) * interval '1 microsecond' AS rank_at, o.id AS readiness
    FROM task_run AS tr
    JOIN workflow_run AS wr ON wr.id = tr.run_id
    JOIN task AS t ON t.workflow_id = wr.workflow_id AND t.key = COALESCE(tr.map_of, tr.task_key)
    JOIN outbox AS o ON o.task_run_id = tr.id AND o.fencing_token = tr.fencing_token
    WHERE tr.state = 'ready' AND t.task_type = ANY($2)
      AND (wr.cancel_requested_at IS NULL OR tr.compensate_for IS NOT NULL)
    ORDER BY rank_at, readiness
    LIMIT $3
    FOR UPDATE OF tr SKIP LOCKED
), claimed AS (
    UPDATE task_run AS tr
    ",
    claim_set!(),
    "
    FROM picked, workflow_run AS wr
    WHERE tr.id = picked.id AND tr.state = 'ready' AND wr.id = tr.run_id",
    claim_tail!("JOIN picked AS p USING (id) ORDER BY p.rank_at, p.readiness")
);

/// dispatch_is_current: the row is ready at the dispatch's token. `$1` id,
/// `$2` token.
pub const DISPATCH_IS_CURRENT: &str =
    "SELECT EXISTS (SELECT 1 FROM task_run WHERE id = $1 AND state = 'ready' AND fencing_token = $2)";

/// report_progress: [`RENEW_LEASE`] that also stores the attempt's
/// progress. `$1` offset, `$2` id, `$3` token, `$4` lease, `$5` progress.
pub const REPORT_PROGRESS: &str = concat!(
    "UPDATE task_run AS tr SET lease_expires_at = ",
    now!(),
    " + $4::interval, progress = $5
FROM workflow_run AS wr
WHERE tr.id = $2 AND tr.state = 'running' AND tr.fencing_token = $3 AND wr.id = tr.run_id
RETURNING wr.cancel_requested_at IS NOT NULL AND tr.compensate_for IS NULL AS cancel_requested"
);

/// renew_lease: extends the lease while the token holds it, reporting a
/// cancel request to forward tasks (a compensator finishes its step). `$1` offset, `$2` id, `$3` token, `$4` lease.
pub const RENEW_LEASE: &str = concat!(
    "UPDATE task_run AS tr SET lease_expires_at = ",
    now!(),
    " + $4::interval
FROM workflow_run AS wr
WHERE tr.id = $2 AND tr.state = 'running' AND tr.fencing_token = $3 AND wr.id = tr.run_id
RETURNING wr.cancel_requested_at IS NOT NULL AND tr.compensate_for IS NULL AS cancel_requested"
);

/// finish_task_run: a lease-spending edge (`succeed`, `fail`,
/// `cancel_running`) at the presented token, clearing the lease and
/// flagging the row; when the token no longer matches, the
/// `stale_write_rejected` audit event instead — both in one statement. An
/// outcome without an error keeps the row's last error, as SQLite does (a
/// task that succeeded on a retry still reports why the attempt before
/// failed).
/// `$1` offset, `$2` id, `$3` token, `$4` worker, `$5`
/// target state, `$6` transition, `$7` output (JSON text), `$8` error, `$9`
/// cancel reason, `$10` the most stale-write audits one task run keeps.
pub const FINISH: &str = concat!(
    "WITH done AS (
    UPDATE task_run
    SET state = $5, lease_owner = NULL, lease_expires_at = NULL, finished_at = ",
    now!(),
    ",
        result = $7::jsonb, result_bytes = octet_length($7::text), error = COALESCE($8, error), cancel_reason = $9,
        needs_pass = true
    WHERE id = $2 AND state = 'running' AND fencing_token = $3
    RETURNING id, run_id, task_key, attempt, fencing_token
), event AS (
    ",
    event_insert!(),
    "SELECT id, run_id, task_key, $6, 'running', $5, attempt, fencing_token, $4, ",
    now!(),
    ", $8 FROM done
), stale AS (
    ",
    event_insert!(),
    "SELECT tr.id, tr.run_id, tr.task_key, 'stale_write_rejected', NULL, NULL, tr.attempt, $3, $4, ",
    now!(),
    ",
           'rejected ' || $6 || ' with fencing token ' || $3::text || ': the row is ' || tr.state
           || ' at token ' || tr.fencing_token::text
    FROM task_run AS tr
    WHERE tr.id = $2 AND NOT EXISTS (SELECT 1 FROM done)
      AND (SELECT count(*) FROM task_run_event AS e
           WHERE e.task_run_id = $2 AND e.transition = 'stale_write_rejected') < $10
)
SELECT (SELECT count(*) FROM done) > 0 AS recorded, ",
    any_row!("done"),
    " AS woke_scheduler"
);

/// finish_and_hand_off, a success with dependents to hand on
/// (docs/design/scheduler.md#handoff): [`FINISH`]'s `succeed`, and in the
/// same statement each named dependent still pending at a counter of one
/// in a run not cancel-requested made ready, its event written after the
/// success's and its outbox row. The row is locked first (`mine`) and
/// everything else hangs off it, so a finish whose token lost hands on
/// nothing. The run row is held `FOR KEY SHARE`, which [`REQUEST_CANCEL`]'s
/// `FOR UPDATE` waits for (and which waits for it, reading the request
/// once it commits): a dependent is never made ready after a cancel
/// request's pass looked for waiting tasks. A pass's `FOR NO KEY UPDATE`
/// does not conflict with it. The success is flagged for a pass unless `$8` (the handoff is
/// whole) and every named dependent moved; a flag already set (a first
/// claim's) stays. With a hold (`$9` microseconds), the outbox rows are
/// held from the sweep that long and returned as `held`, a JSON array, with
/// `queued`, whether other rows wait for the sweep; pushed (`$10`), they
/// are written published and returned as `held`; either way the publisher
/// is not woken
/// (docs/design/outbox-and-queues.md#publish-after-commit). `$1` offset,
/// `$2` id, `$3` token, `$4` worker, `$5` output (JSON text), `$6` the most
/// stale-write audits one task run keeps, `$7` the dependents, `$8` whole,
/// `$9` the hold or NULL, `$10` whether the caller pushes them.
pub const FINISH_HANDOFF: &str = concat!(
    "WITH mine AS MATERIALIZED (
    SELECT tr.id, tr.run_id, wr.workflow_id, wr.cancel_requested_at IS NULL AS open
    FROM task_run AS tr JOIN workflow_run AS wr ON wr.id = tr.run_id
    WHERE tr.id = $2 AND tr.state = 'running' AND tr.fencing_token = $3
    FOR UPDATE OF tr FOR KEY SHARE OF wr
), moved AS (
    UPDATE task_run AS d SET state = 'ready', pending_deps = 0
    FROM mine
    WHERE mine.open AND d.run_id = mine.run_id AND d.task_key = ANY($7::text[])
      AND d.state = 'pending' AND d.pending_deps = 1 AND d.compensate_for IS NULL
    RETURNING d.id, d.run_id, d.task_key, d.attempt, d.fencing_token, d.priority, d.map_of
), done AS (
    UPDATE task_run AS tr
    SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, finished_at = ",
    now!(),
    ",
        result = $5::jsonb, result_bytes = octet_length($5::text), cancel_reason = NULL,
        needs_pass = tr.needs_pass OR NOT ($8 AND (SELECT count(*) FROM moved) = cardinality($7::text[]))
    FROM mine
    WHERE tr.id = mine.id
    RETURNING tr.id, tr.run_id, tr.task_key, tr.attempt, tr.fencing_token, tr.needs_pass
), event AS (
    ",
    event_insert!(),
    "SELECT e.id, e.run_id, e.task_key, e.transition, e.from_state, e.to_state, e.attempt, e.fencing_token, e.worker, ",
    now!(),
    ", NULL
    FROM (SELECT 0 AS o, id, run_id, task_key, 'succeed' AS transition, 'running' AS from_state,
                 'succeeded' AS to_state, attempt, fencing_token, $4 AS worker FROM done
          UNION ALL
          SELECT 1, id, run_id, task_key, 'dependencies_satisfied', 'pending', 'ready', attempt, fencing_token, NULL
          FROM moved) AS e
    ORDER BY e.o, e.id
), dispatched AS (
    ",
    dispatch_moved!(
        "(SELECT workflow_id FROM mine)",
        concat!(
            "CASE WHEN $9::float8 IS NOT NULL THEN ",
            now!(),
            " + $9::float8 * interval '1 microsecond' END"
        ),
        concat!("CASE WHEN $10::bool THEN ", now!(), " END")
    ),
    "
), stale AS (
    ",
    event_insert!(),
    "SELECT tr.id, tr.run_id, tr.task_key, 'stale_write_rejected', NULL, NULL, tr.attempt, $3, $4, ",
    now!(),
    ",
           'rejected succeed with fencing token ' || $3::text || ': the row is ' || tr.state
           || ' at token ' || tr.fencing_token::text
    FROM task_run AS tr
    WHERE tr.id = $2 AND NOT EXISTS (SELECT 1 FROM mine)
      AND (SELECT count(*) FROM task_run_event AS e
           WHERE e.task_run_id = $2 AND e.transition = 'stale_write_rejected') < $6
)
SELECT (SELECT count(*) FROM done) > 0 AS recorded,
       EXISTS (SELECT 1 FROM done WHERE needs_pass) AS woke_scheduler,
       $9::float8 IS NULL AND NOT $10::bool AND EXISTS (SELECT 1 FROM dispatched) AS woke_publisher,
       CASE WHEN $9::float8 IS NOT NULL OR $10::bool THEN
           (SELECT json_agg(json_build_object('id', id, 'task_run_id', task_run_id, 'run_id', run_id,
                   'task_key', task_key, 'task_type', task_type, 'fencing_token', fencing_token,
                   'created_at', created_at, 'priority', priority) ORDER BY id)::text
            FROM dispatched)
       END AS held,
       $9::float8 IS NOT NULL AND EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL AND sweep_after IS NULL)
           AS queued"
);

/// finish_task_run, a failure with attempts left: `schedule_retry` in the
/// failing transaction — attempt + 1, `retry_at`, and `finished_at` and the
/// lease cleared in the same statement. `$1` offset, `$2` id, `$3` token,
/// `$4` retry delay, `$5` worker.
pub const SCHEDULE_RETRY: &str = concat!(
    "WITH retried AS (
    UPDATE task_run
    SET state = 'retrying', attempt = attempt + 1, retry_at = ",
    now!(),
    " + $4::interval,
        finished_at = NULL, lease_owner = NULL, lease_expires_at = NULL
    WHERE id = $2 AND state = 'failed' AND fencing_token = $3
    RETURNING id, run_id, task_key, attempt, fencing_token
), event AS (
    ",
    event_insert!(),
    "SELECT id, run_id, task_key, 'schedule_retry', 'failed', 'retrying', attempt, fencing_token, $5, ",
    now!(),
    ", NULL FROM retried
)
SELECT count(*) FROM retried"
);

/// transition_task_run for `dependencies_satisfied` and `retry_ready`:
/// → ready, with its outbox row. `$1` offset, `$2` id, `$3`
/// source state, `$4` transition.
pub const GENERIC_TO_READY: &str = concat!(
    "WITH moved AS (
    UPDATE task_run SET state = 'ready', pending_deps = 0, retry_at = NULL
    WHERE id = $2 AND state = $3
    RETURNING id, run_id, task_key, attempt, fencing_token, priority, map_of
), event AS (
    ",
    event_insert!(),
    "SELECT id, run_id, task_key, $4, $3, 'ready', attempt, fencing_token, NULL, ",
    now!(),
    ", NULL FROM moved
), dispatched AS (
    INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority)
    SELECT m.id, m.run_id, m.task_key, t.task_type, m.fencing_token, ",
    now!(),
    ", m.priority
    FROM moved AS m
    JOIN workflow_run AS wr ON wr.id = m.run_id
    JOIN task AS t ON t.workflow_id = wr.workflow_id AND t.key = COALESCE(m.map_of, m.task_key)
    ON CONFLICT ON CONSTRAINT uniq_outbox_taskrun_token DO NOTHING
    RETURNING id
)
SELECT (SELECT count(*) FROM moved) > 0 AS moved, ",
    any_row!("dispatched"),
    " AS woke"
);

/// transition_task_run for `cancel_pending`, `cancel_ready` and
/// `cancel_retrying` (reason `user`), flagging the row for the scheduler.
/// `$1` offset, `$2` id, `$3` source state, `$4` transition.
pub const GENERIC_CANCEL: &str = concat!(
    "WITH moved AS (
    UPDATE task_run
    SET state = 'cancelled', cancel_reason = 'user', finished_at = ",
    now!(),
    ", retry_at = NULL, needs_pass = true
    WHERE id = $2 AND state = $3
    RETURNING id, run_id, task_key, attempt, fencing_token
), event AS (
    ",
    event_insert!(),
    "SELECT id, run_id, task_key, $4, $3, 'cancelled', attempt, fencing_token, NULL, ",
    now!(),
    ", NULL FROM moved
)
SELECT (SELECT count(*) FROM moved) > 0 AS moved, ",
    any_row!("moved"),
    " AS woke"
);

/// Whether the reaper sends a row back to ready (`reap_lease`): attempts
/// remain, or it is a forward task of a cancel-requested run, which
/// `REAP_CANCEL` then cancels — even on its final attempt, so the run ends
/// cancelled, not failed (docs/design/cancellation.md#reaping-a-cancelled-run).
macro_rules! reaped_to_ready {
    () => {
        "(tr.attempt - tr.attempt_base < t.max_attempts
          OR (wr.cancel_requested_at IS NOT NULL AND tr.compensate_for IS NULL))"
    };
}

/// reap_expired_leases: one conditional UPDATE over the expired leases it
/// read, each still `running`, still expired and still at the token read —
/// so a row a worker has just finished is never touched. Bumps the token;
/// `reap_lease` (attempt + 1, outbox row unless it is a forward task of a
/// cancel-requested run) when attempts remain or the run is
/// cancel-requested, else `reap_lease_final`. Its event names the worker
/// whose lease expired, read before the UPDATE clears it. The
/// candidate scan is served by `taskrun_lease_expiry_idx`. `$1` offset, `$2`
/// limit, `$3` run (NULL: every run).
pub const REAP: &str = concat!(
    "WITH candidate AS (
    SELECT tr.id, tr.fencing_token, tr.lease_owner
    FROM task_run AS tr
    WHERE tr.state = 'running' AND tr.lease_expires_at < ",
    now!(),
    "
      AND ($3::uuid[] IS NULL OR tr.run_id = ANY($3))
    ORDER BY tr.lease_expires_at
    LIMIT $2
), reaped AS (
    UPDATE task_run AS tr
    SET state = CASE WHEN ",
    reaped_to_ready!(),
    " THEN 'ready' ELSE 'failed' END,
        fencing_token = tr.fencing_token + 1,
        attempt = CASE WHEN ",
    reaped_to_ready!(),
    " THEN tr.attempt + 1 ELSE tr.attempt END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        finished_at = CASE WHEN ",
    reaped_to_ready!(),
    " THEN NULL ELSE ",
    now!(),
    " END,
        error = CASE WHEN ",
    reaped_to_ready!(),
    " THEN tr.error ELSE 'lease expired on the final attempt' END,
        needs_pass = tr.needs_pass OR NOT ",
    reaped_to_ready!(),
    "
    FROM candidate AS c, workflow_run AS wr, task AS t
    WHERE tr.id = c.id AND tr.fencing_token = c.fencing_token
      AND tr.state = 'running' AND tr.lease_expires_at < ",
    now!(),
    "
      AND wr.id = tr.run_id AND t.workflow_id = wr.workflow_id AND t.key = COALESCE(tr.map_of, tr.task_key)
    RETURNING tr.id, tr.run_id, tr.task_key, tr.state, tr.attempt, tr.fencing_token, tr.error, t.task_type,
              tr.priority, tr.compensate_for, c.lease_owner AS lost_worker,
              wr.cancel_requested_at IS NOT NULL AND tr.compensate_for IS NULL AS cancel_requested
), event AS (
    ",
    event_insert!(),
    "SELECT id, run_id, task_key, CASE WHEN state = 'ready' THEN 'reap_lease' ELSE 'reap_lease_final' END,
           'running', state, attempt, fencing_token, lost_worker, ",
    now!(),
    ", CASE WHEN state = 'ready' THEN 'lease expired' ELSE error END
    -- By run first: each event locks its run's sequence counter, and two
    -- reapers must take the counters of the runs they share in one order.
    FROM reaped ORDER BY run_id, id
), dispatched AS (
    INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority)
    SELECT id, run_id, task_key, task_type, fencing_token, ",
    now!(),
    ", priority
    FROM reaped WHERE state = 'ready' AND NOT cancel_requested
    ORDER BY id
    ON CONFLICT ON CONSTRAINT uniq_outbox_taskrun_token DO NOTHING
    RETURNING id
)
SELECT id, run_id, task_key, state, task_type, compensate_for, CASE WHEN state = 'ready' THEN NULL ELSE error END AS error,
       cancel_requested, (SELECT count(*) FROM dispatched) AS dispatched,
       CASE WHEN state = 'ready' THEN attempt - 1 ELSE attempt END AS lost_attempt,
       fencing_token - 1 AS lost_token
FROM reaped ORDER BY id"
);

/// reap_expired_leases, for forward tasks of a cancel-requested run:
/// `cancel_ready` on the rows just reaped, in the reaper's transaction, with no dispatch. `$1`
/// offset, `$2` ids.
pub const REAP_CANCEL: &str = concat!(
    "WITH cancelled AS (
    UPDATE task_run
    SET state = 'cancelled', cancel_reason = 'user', finished_at = ",
    now!(),
    ", needs_pass = true
    WHERE id = ANY($2) AND state = 'ready'
    RETURNING id, run_id, task_key, attempt, fencing_token
), event AS (
    ",
    event_insert!(),
    "SELECT id, run_id, task_key, 'cancel_ready', 'ready', 'cancelled', attempt, fencing_token, NULL, ",
    now!(),
    ", NULL FROM cancelled ORDER BY id
)
SELECT id FROM cancelled"
);

/// runs_with_work: runs with a flagged task run (`taskrun_needs_pass_idx`),
/// a due retry (`taskrun_retry_due_idx`), an unhandled cancel request
/// (`workflowrun_needs_pass_idx`) or a gate it could pass now (a scan of
/// the waits, which only gated runs not yet settled have); terminal runs
/// excluded by primary key. `$1` offset, `$2` limit, `$3` run (NULL: every
/// run).
pub const RUNS_WITH_WORK: &str = concat!(
    "SELECT wr.id FROM workflow_run AS wr
WHERE wr.state IN ('pending', 'running') AND wr.id IN (
    SELECT run_id FROM task_run WHERE needs_pass AND ($3::uuid[] IS NULL OR run_id = ANY($3))
    UNION
    SELECT run_id FROM task_run
    WHERE state = 'retrying' AND retry_at <= ",
    now!(),
    " AND ($3::uuid[] IS NULL OR run_id = ANY($3))
    UNION
    SELECT id FROM workflow_run WHERE needs_pass AND ($3::uuid[] IS NULL OR id = ANY($3))
    UNION
    -- Due waiters whose every pool has room, at most as many per pool as
    -- it has room for, oldest first (docs/design/concurrency.md#wake-ups).
    SELECT q.run_id FROM (
        SELECT w.run_id, row_number() OVER (PARTITION BY w.scope ORDER BY w.id) AS place,
               w.max - (SELECT count(*) FROM concurrency_slot AS s WHERE s.scope = w.scope AND s.slot < w.max) AS room
        FROM concurrency_wait AS w
        WHERE ($3::uuid[] IS NULL OR w.run_id = ANY($3))
          AND (w.task_key IS NULL OR EXISTS (
              SELECT 1 FROM task_run AS tr
              WHERE tr.run_id = w.run_id AND tr.task_key = w.task_key AND tr.state = 'pending'
                AND tr.pending_deps = 1))
          AND NOT EXISTS (
              SELECT 1 FROM concurrency_wait AS o
              WHERE o.run_id = w.run_id AND o.task_key IS NOT DISTINCT FROM w.task_key
                AND (SELECT count(*) FROM concurrency_slot AS s WHERE s.scope = o.scope AND s.slot < o.max) >= o.max)
    ) AS q
    WHERE q.place <= q.room
)
ORDER BY wr.id
LIMIT $2"
);

/// next_deadline: seconds until the earliest `retry_at`
/// (`taskrun_retry_due_idx`) or `lease_expires_at`
/// (`taskrun_lease_expiry_idx`). `$1` offset, `$2` run (NULL: every run).
pub const NEXT_DEADLINE: &str = concat!(
    "SELECT EXTRACT(EPOCH FROM (LEAST(
    (SELECT min(retry_at) FROM task_run WHERE state = 'retrying' AND ($2::uuid[] IS NULL OR run_id = ANY($2))),
    (SELECT min(lease_expires_at) FROM task_run WHERE state = 'running' AND ($2::uuid[] IS NULL OR run_id = ANY($2)))
) - ",
    now!(),
    "))::float8"
);

/// request_cancel: records the request once, on a run not yet terminal,
/// and flags the run. `$1` offset, `$2` run.
pub const REQUEST_CANCEL: &str = concat!(
    "WITH locked AS (
    SELECT id FROM workflow_run
    WHERE id = $2 AND cancel_requested_at IS NULL AND state IN ('pending', 'running')
    FOR UPDATE
), requested AS (
    UPDATE workflow_run SET cancel_requested_at = ",
    now!(),
    ", needs_pass = true
    WHERE id = (SELECT id FROM locked) AND cancel_requested_at IS NULL AND state IN ('pending', 'running')
    RETURNING id
)
SELECT (SELECT count(*) FROM requested) > 0 AS requested, ",
    any_row!("requested"),
    " AS woke"
);

/// request_cancel, when nothing was recorded: why. `$1` run.
pub const RUN_STATE: &str = "SELECT state FROM workflow_run WHERE id = $1";

/// task_inputs: the run input and the outputs of the named task runs
/// (served by `uniq_taskrun_run_key`). `$1` run, `$2` keys.
pub const TASK_INPUTS: &str = "\
WITH wanted AS MATERIALIZED (
    SELECT tr.id, COALESCE(tr.result_bytes, octet_length(tr.result::text)) AS bytes
    FROM task_run AS tr
    WHERE tr.run_id = $1 AND tr.task_key = ANY($2) AND tr.state = 'succeeded'
), total AS (
    SELECT COALESCE(sum(bytes), 0)::bigint AS bytes FROM wanted
)
SELECT wr.input, total.bytes,
       CASE WHEN total.bytes <= $3 THEN
           (SELECT jsonb_object_agg(tr.task_key, tr.result) FROM task_run AS tr WHERE tr.id IN (SELECT id FROM wanted))
       END AS outputs
FROM workflow_run AS wr, total WHERE wr.id = $1";

/// The columns of a run summary, of `wr` (workflow_run) joined to `w` (workflow).
macro_rules! summary_columns {
    () => {
        "wr.id, wr.workflow_id, w.name AS workflow, w.version, wr.state,
       wr.cancel_requested_at IS NOT NULL AS cancel_requested, wr.cancel_reason, wr.generation, wr.priority,
       wr.created_at,
       wr.started_at, wr.finished_at"
    };
}

/// get_run: the run with its definition's identity. `$1` run.
pub const GET_RUN: &str = concat!(
    "SELECT ",
    summary_columns!(),
    ", w.fingerprint, wr.input
FROM workflow_run AS wr JOIN workflow AS w ON w.id = wr.workflow_id
WHERE wr.id = $1"
);

/// get_run: the task runs in creation order (`uniq_taskrun_run_key`). `$1` run.
pub const GET_RUN_TASKS: &str = "\
SELECT id, task_key, compensate_for, state, attempt, generation, fencing_token, priority, cancel_reason,
       skip_reason, result, error, started_at, finished_at, retry_at, lease_owner, progress, created_at
FROM task_run WHERE run_id = $1 ORDER BY id";

/// get_run (`$2` 0, `$3` NULL) and run_events: the run's events numbered
/// above `$2`, in number order, at most `$3`: each table an index range scan
/// (`taskrunevent_run_seq_idx`, `workflowrunevent_run_seq_idx`) stopped at
/// the limit, merged. `$1` run.
pub const RUN_EVENTS: &str = "\
(SELECT seq, task_key AS task, transition, from_state, to_state, attempt, fencing_token AS token, worker, at, error,
        generation
 FROM task_run_event WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3)
UNION ALL
(SELECT seq, NULL, transition, from_state, to_state, NULL, NULL, NULL, at, NULL, generation
 FROM workflow_run_event WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3)
ORDER BY seq
LIMIT $3";

/// list_runs: the newest runs (`workflowrun_created_id_idx`). `$1` limit.
pub const LIST_RUNS: &str = concat!(
    "SELECT ",
    summary_columns!(),
    "
FROM workflow_run AS wr JOIN workflow AS w ON w.id = wr.workflow_id
ORDER BY wr.created_at DESC, wr.id DESC
LIMIT $1"
);

/// list_runs_page: newest first, strictly after the cursor (`$1`
/// created_at, `$2` id), by a range scan of `workflowrun_created_id_idx`;
/// without a cursor both are NULL and the bound is above every run. Filters,
/// NULL for none: `$3` states, `$4` workflow names, `$5` created at or
/// after, `$6` created before. `$7` limit.
pub const LIST_RUNS_PAGE: &str = concat!(
    "SELECT ",
    summary_columns!(),
    "
FROM workflow_run AS wr JOIN workflow AS w ON w.id = wr.workflow_id
WHERE (wr.created_at, wr.id) < (COALESCE($1::timestamptz, 'infinity'),
                                COALESCE($2::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
  AND ($3::text[] IS NULL OR wr.state = ANY($3))
  AND ($4::text[] IS NULL OR w.name = ANY($4))
  AND ($5::timestamptz IS NULL OR wr.created_at >= $5)
  AND ($6::timestamptz IS NULL OR wr.created_at < $6)
ORDER BY wr.created_at DESC, wr.id DESC
LIMIT $7"
);

/// run_summary: one run by primary key. `$1` run.
pub const RUN_SUMMARY: &str = concat!(
    "SELECT ",
    summary_columns!(),
    "
FROM workflow_run AS wr JOIN workflow AS w ON w.id = wr.workflow_id
WHERE wr.id = $1"
);

/// start_run_keyed: records the key before the run, in the run's
/// transaction; a second call with the key waits here until the first
/// commits (then inserts nothing) or rolls back (then inserts). `$1`
/// offset, `$2` key, `$3` request hash, `$4` run id.
pub const RECORD_KEY: &str = concat!(
    "INSERT INTO run_idempotency (key, request_hash, run_id, created_at) VALUES ($2, $3, $4, ",
    now!(),
    ")
ON CONFLICT (key) DO NOTHING
RETURNING run_id"
);

/// start_run_keyed: the run a key started and its request's hash (primary
/// key). `$1` key.
pub const KEYED_RUN: &str = "SELECT request_hash, run_id FROM run_idempotency WHERE key = $1";

/// gauges: each count from the partial index that holds its rows
/// (`taskrun_active_idx`, `taskrun_lease_expiry_idx`,
/// `outbox_pending_order_idx`, `workflowrun_active_idx`), so the cost follows
/// active work, not history.
pub const GAUGES: &str = "\
SELECT (SELECT count(*) FROM task_run WHERE state = 'ready') AS ready,
       (SELECT count(*) FROM task_run WHERE state = 'running') AS running,
       (SELECT count(*) FROM outbox WHERE published_at IS NULL) AS outbox_unpublished,
       (SELECT count(*) FROM workflow_run WHERE state IN ('pending', 'running')) AS active_runs";

/// resume_run: the run's `resume` edge (docs/design/retry.md), conditional
/// on its state and generation, so of two concurrent retries exactly one
/// matches; its event counter row takes the new generation first, so the
/// `resume` event and every later one carry it (the numbering trigger
/// stamps it). A limit's cancel reason is cleared, and the gates `$4`
/// become waits, already tried. The run is flagged for a first pass, which
/// admits it past its gates (docs/design/concurrency.md#retries) and decides
/// its conditional tasks (docs/design/conditions.md#retries). `$1` run, `$2`
/// from state, `$3` generation.
pub const RESUME_RUN: &str = "\
WITH moved AS (
    UPDATE workflow_run
    SET state = 'running', generation = generation + 1, finished_at = NULL, cancel_requested_at = NULL,
        cancel_reason = NULL, gated = jsonb_array_length($4) > 0, needs_pass = true
    WHERE id = $1 AND state = $2 AND generation = $3
    RETURNING id, generation
), counter AS (
    UPDATE run_event_seq AS s SET generation = m.generation FROM moved AS m WHERE s.run_id = m.id
    RETURNING s.run_id
), waits AS (
    INSERT INTO concurrency_wait (run_id, task_key, scope, label, max, strategy, tried)
    SELECT m.id, g.task, g.scope, g.label, g.max, g.strategy, true
    FROM moved AS m, jsonb_to_recordset($4) AS g(task text, scope text, label text, max int4, strategy text)
)
SELECT m.generation, (SELECT count(*) FROM counter) AS counted FROM moved AS m";

/// resume_run: the `resume` event, after [`RESUME_RUN`] moved the counter.
/// `$1` offset, `$2` run, `$3` from state.
pub const RESUME_EVENT: &str = concat!(
    "INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at) VALUES ($2, 'resume', $3, 'running', ",
    now!(),
    ")"
);

/// resume_run: each task of the retry set takes `reset` from its planned
/// state: attempt + 1 (the earlier ones become `attempt_base`), token + 1,
/// its dependencies inside the set as the counter, its output, error and
/// cancel reason cleared; events in key order and a dispatch for each row
/// made ready. `$1` offset, `$2` run, `$3` keys, `$4` from states, `$5` to
/// states, `$6` pending dependencies, `$7` generation.
pub const RESET_TASKS: &str = concat!(
    "WITH planned AS (
    SELECT * FROM unnest($3::text[], $4::text[], $5::text[], $6::int4[]) AS p(key, from_state, to_state, pending_deps)
), moved AS (
    UPDATE task_run AS tr
    SET state = p.to_state, pending_deps = p.pending_deps, generation = $7, ",
    reset_set!(),
    "
    FROM planned AS p
    WHERE tr.run_id = $2 AND tr.task_key = p.key AND tr.state = p.from_state AND tr.compensate_for IS NULL
    RETURNING tr.id, tr.run_id, tr.task_key, p.from_state, tr.state, tr.attempt, tr.fencing_token, tr.priority
), event AS (
    ",
    event_insert!(),
    "SELECT id, run_id, task_key, 'reset', from_state, state, attempt, fencing_token, NULL, ",
    now!(),
    ", NULL FROM moved ORDER BY id
), dispatched AS (
    INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority)
    SELECT m.id, m.run_id, m.task_key, t.task_type, m.fencing_token, ",
    now!(),
    ", m.priority
    FROM moved AS m
    CROSS JOIN LATERAL (
        SELECT task_type FROM task
        WHERE workflow_id = (SELECT workflow_id FROM workflow_run WHERE id = $2) AND key = m.task_key LIMIT 1
    ) AS t
    WHERE m.state = 'ready'
    ORDER BY m.id
)
SELECT count(*) FROM moved"
);
