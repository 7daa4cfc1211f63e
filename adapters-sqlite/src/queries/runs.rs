//! The run store's statements: each transition's conditional UPDATE and its
//! event row, sent as one `BEGIN IMMEDIATE … COMMIT` call.

macro_rules! summary_columns {
    () => {
        "r.id, r.workflow_id, w.name, w.version, r.state, r.cancel_requested_at IS NOT NULL AS cancel_requested, \
         r.cancel_reason, r.generation, r.priority, r.created_at, r.started_at, r.finished_at"
    };
}

/// claim_task_run: ready → running at the dispatch's token (primary key).
/// `?2` id, `?3` token, `?4` worker, `?5` lease in ms; given, `$id`,
/// `$token` and `$lease` number those instead, and `$tag` (`N AS tag, `)
/// leads the returned row.
macro_rules! claim_update {
    () => {
        claim_update!("?2", "?3", "?5", "")
    };
    ($id:literal, $token:literal, $lease:literal, $tag:literal) => {
        concat!(
            "UPDATE task_run SET state = 'running', fencing_token = fencing_token + 1, lease_owner = ?4, \
             progress = NULL, lease_expires_at = ",
            now!(),
            " + ",
            $lease,
            ", started_at = COALESCE(started_at, ",
            now!(),
            "), needs_pass = CASE WHEN needs_pass = 1 OR (started_at IS NULL AND \
             (SELECT r.state FROM workflow_run r WHERE r.id = task_run.run_id) = 'pending') THEN 1 ELSE 0 END \
             WHERE id = ",
            $id,
            " AND state = 'ready' AND fencing_token = ",
            $token,
            " AND (compensate_for IS NOT NULL \
                  OR (SELECT r.cancel_requested_at FROM workflow_run r WHERE r.id = task_run.run_id) IS NULL) \
             RETURNING ",
            $tag,
            "run_id, task_key, compensate_for, attempt, attempt_base, fencing_token, lease_expires_at, needs_pass, \
             (SELECT r.workflow_id FROM workflow_run r WHERE r.id = task_run.run_id) AS workflow_id"
        )
    };
}

/// The claim's UPDATE alone (its plan is checked in `plans.rs`).
#[cfg(test)]
pub(crate) const CLAIM_UPDATE: &str = claim_update!();

/// claim_task_run's statements: [`claim_update!`], then its event and
/// its count when it matched, numbered as [`claim_update!`] numbers them.
macro_rules! claim {
    () => {
        claim!("?2", "?3", "?5", "")
    };
    ($id:literal, $token:literal, $lease:literal, $tag:literal) => {
        concat!(
            claim_update!($id, $token, $lease, $tag),
            "; ",
            event_if_changed!("claim", "ready", "running", "?4", "NULL", $id)
        )
    };
}

/// claim_task_run in one call: [`claim!`], committed.
pub(crate) const CLAIM: &str = concat!("BEGIN IMMEDIATE; ", claim!(), "; COMMIT");

/// finish_task_run, `succeed`, its transaction left open, setting the
/// flag to `$flag`, with `$then` between the success's event and the
/// stale audit: `?2` id, `?3` token, `?4` worker, `?5` output. The
/// success's row comes back tagged 0.
macro_rules! finish_succeeded {
    ($flag:literal) => {
        finish_succeeded!($flag, "")
    };
    ($flag:literal, $then:expr) => {
        concat!(
            "BEGIN IMMEDIATE; \
             UPDATE task_run SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, finished_at = ",
            now!(),
            ", result = ?5, needs_pass = ",
            $flag,
            " WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 \
             RETURNING 0 AS tag, run_id, task_key; ",
            event_if_changed!("succeed", "running", "succeeded", "?4", "NULL"),
            "; ",
            $then,
            stale_audit!("succeed")
        )
    };
}

/// finish_task_run, `succeed`.
pub(crate) const FINISH_SUCCEEDED: &str = concat!(finish_succeeded!("1"), "; COMMIT");

/// The writer connection's own table for [`FINISH_HANDING_OFF`]: the run
/// of the success the call recorded, so that its later statements act
/// only on a recorded success (a temporary table lives and dies with its
/// connection, and is rolled back with the call's transaction).
pub(crate) const CREATE_HANDING_OFF: &str = "CREATE TEMP TABLE IF NOT EXISTS handing_off (run_id TEXT NOT NULL)";

/// finish_and_hand_off, its transaction left open
/// (docs/design/scheduler.md#handoff): the success, then, only when it was
/// recorded, [`hand_off!`]'s promotion of the dependents it alone held
/// back and lowering of its joins. The flag is left as it was (a first
/// claim's stays): the handoff sets it unless it was whole. A
/// stale finish keeps its audit and promotes nothing. `?2` id, `?3`
/// token, `?4` worker, `?5` output, `?6` the dependents (a JSON array),
/// `?7` whole, `?8` the hold in milliseconds or NULL, `?9` whether the
/// caller pushes the dispatches, `?10` the joins (a JSON array).
macro_rules! finish_handing_off {
    () => {
        concat!(
            finish_succeeded!(
                "needs_pass",
                "INSERT INTO temp.handing_off (run_id) SELECT run_id FROM task_run WHERE id = ?2 AND changes() = 1; "
            ),
            "; ",
            hand_off!(),
            "; DELETE FROM temp.handing_off"
        )
    };
}

/// finish_and_hand_off in one call: [`finish_handing_off!`], committed.
pub(crate) const FINISH_HANDING_OFF: &str = concat!(finish_handing_off!(), "; COMMIT");

/// finish_and_claim in one call and one transaction
/// (docs/design/leases-and-fencing.md#finish-and-claim-next):
/// [`FINISH_HANDING_OFF`]'s statements and values, then [`CLAIM`]'s of the
/// next task run for the same worker `?4`, `?11` its id, `?12` its token,
/// `?13` the lease in ms. The claim's row comes back tagged 7.
pub(crate) const FINISH_HANDING_OFF_THEN_CLAIM: &str = concat!(
    finish_handing_off!(),
    "; ",
    claim!("?11", "?12", "?13", "7 AS tag, "),
    "; COMMIT"
);

/// finish_task_run, `fail` for good: `?5` the error.
pub(crate) const FINISH_FAILED: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'failed', lease_owner = NULL, lease_expires_at = NULL, finished_at = ",
    now!(),
    ", error = ?5, needs_pass = 1 WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 RETURNING id; ",
    event_if_changed!("fail", "running", "failed", "?4", "?5"),
    "; ",
    stale_audit!("fail"),
    "; COMMIT"
);

/// finish_task_run, `fail` then `schedule_retry` in one UPDATE (decision
/// 1): the row never rests in failed, so a resting failed row means failed
/// for good. The scheduler need not look: the retry's due time brings it
/// back. Both events, in order: `fail` at the attempt that failed, then
/// `schedule_retry` at the next one.
/// `?5` the error, `?6` the delay in ms.
pub(crate) const FINISH_RETRY: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'retrying', attempt = attempt + 1, retry_at = ",
    now!(),
    " + ?6, lease_owner = NULL, lease_expires_at = NULL, finished_at = NULL, error = ?5 \
     WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 RETURNING id; ",
    event_insert!(),
    "SELECT id, run_id, task_key, e.transition, e.from_state, e.to_state, attempt - e.back, fencing_token, \
     e.worker, ",
    now!(),
    ", e.error, ",
    event_number!("task_run.run_id", "e.seq"),
    " FROM task_run, (\
     SELECT 1 AS seq, 'fail' AS transition, 'running' AS from_state, 'failed' AS to_state, 1 AS back, \
     ?4 AS worker, ?5 AS error \
     UNION ALL SELECT 2, 'schedule_retry', 'failed', 'retrying', 0, ?4, NULL) AS e \
     WHERE task_run.id = ?2 AND changes() = 1 ORDER BY e.seq; ",
    events_written!("task_run_event"),
    "; ",
    stale_audit!("fail"),
    "; COMMIT"
);

/// finish_task_run, `cancel_running` (reason `user`).
pub(crate) const FINISH_CANCELLED: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'cancelled', cancel_reason = 'user', lease_owner = NULL, \
     lease_expires_at = NULL, finished_at = ",
    now!(),
    ", needs_pass = 1 WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 RETURNING id; ",
    event_if_changed!("cancel_running", "running", "cancelled", "?4", "NULL"),
    "; ",
    stale_audit!("cancel_running"),
    "; COMMIT"
);

/// A renewal's condition and answer: the lease held at the token, and
/// whether a forward task's run is being cancelled (a compensator finishes
/// its step). `?2` id, `?3` token.
macro_rules! renewed {
    () => {
        " WHERE id = ?2 AND state = 'running' AND fencing_token = ?3 \
         RETURNING compensate_for IS NULL \
           AND (SELECT r.cancel_requested_at IS NOT NULL FROM workflow_run r WHERE r.id = task_run.run_id); \
         COMMIT"
    };
}

/// renew_lease: `?2` id, `?3` token, `?4` lease in ms.
pub(crate) const RENEW_LEASE: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE task_run SET lease_expires_at = ",
    now!(),
    " + ?4",
    renewed!()
);

/// report_progress: [`RENEW`] that also stores the progress. `?2` id,
/// `?3` token, `?4` lease in ms, `?5` progress (JSON text).
pub(crate) const REPORT_PROGRESS: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE task_run SET progress = ?5, lease_expires_at = ",
    now!(),
    " + ?4",
    renewed!()
);

/// claim_ready: the first ready rows of the task types `?1` (a JSON
/// array), at most `?2`, in the sweep's dispatch order — the readiness
/// (the outbox row at the token the row is ready at) minus priority ×
/// `?3` milliseconds of aging, then the readiness — with the token each is
/// ready at; each is then claimed by [`CLAIM_CALL`] at that token. The
/// ready rows come from `taskrun_ready_idx`, named: `taskrun_active_idx`
/// holds them too, among every other active row, and SQLite, which keeps
/// no statistics here, may walk that one instead.
pub(crate) const READY_OF_TYPES: &str = concat!(
    "SELECT tr.id, tr.fencing_token FROM task_run tr INDEXED BY taskrun_ready_idx \
JOIN workflow_run r ON r.id = tr.run_id \
JOIN task t ON t.workflow_id = r.workflow_id AND t.key = COALESCE(tr.map_of, tr.task_key) \
JOIN outbox ON outbox.task_run_id = tr.id AND outbox.fencing_token = tr.fencing_token \
WHERE tr.state = 'ready' AND t.task_type IN (SELECT value FROM json_each(?1)) \
  AND (tr.compensate_for IS NOT NULL OR r.cancel_requested_at IS NULL) \
ORDER BY outbox.created_at - outbox.priority * ?3, outbox.id",
    limit!("?2")
);

/// dispatch_is_current: `?1` id, `?2` token.
pub(crate) const DISPATCH_IS_CURRENT: &str =
    "SELECT EXISTS (SELECT 1 FROM task_run WHERE id = ?1 AND state = 'ready' AND fencing_token = ?2)";

/// request_cancel: the run as it was, then the request when it applies
/// (the UPDATE restates exactly the conditions the caller reads). `?2` run.
pub(crate) const REQUEST_CANCEL: &str = concat!(
    "BEGIN IMMEDIATE; \
     SELECT state, cancel_requested_at IS NOT NULL FROM workflow_run WHERE id = ?2; \
     UPDATE workflow_run SET cancel_requested_at = ",
    now!(),
    ", needs_pass = 1 WHERE id = ?2 AND cancel_requested_at IS NULL AND state IN ('pending', 'running'); \
     COMMIT"
);

/// The event of a generic transition: `?3` from, `?4` transition, `?5` to.
macro_rules! generic_event {
    () => {
        concat!(
            event_insert!(),
            "SELECT id, run_id, task_key, ?4, ?3, ?5, attempt, fencing_token, NULL, ",
            now!(),
            ", NULL, ",
            event_number!("task_run.run_id", "1"),
            " FROM task_run WHERE id = ?2 AND changes() = 1; ",
            events_written!("task_run_event")
        )
    };
}

/// The outbox row of task run `?2` after the event insert before it wrote
/// one row (docs/design/outbox-and-queues.md#one-outbox-row-per-readiness).
macro_rules! dispatch_if_changed {
    () => {
        concat!(
            "INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority) \
             SELECT tr.id, tr.run_id, tr.task_key, ",
            task_type_of!("tr"),
            ", tr.fencing_token, ",
            now!(),
            ", tr.priority FROM task_run tr WHERE tr.id = ?2 AND changes() = 1"
        )
    };
}

/// transition_task_run, `dependencies_satisfied`.
pub(crate) const GENERIC_SATISFIED: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'ready', pending_deps = 0 WHERE id = ?2 AND state = 'pending' RETURNING id; ",
    generic_event!(),
    "; ",
    dispatch_if_changed!(),
    "; COMMIT"
);

/// transition_task_run, `retry_ready`.
pub(crate) const GENERIC_RETRY_READY: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'ready', retry_at = NULL WHERE id = ?2 AND state = 'retrying' RETURNING id; ",
    generic_event!(),
    "; ",
    dispatch_if_changed!(),
    "; COMMIT"
);

/// transition_task_run, the user's cancels of a waiting row.
pub(crate) const GENERIC_CANCEL: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE task_run SET state = 'cancelled', cancel_reason = 'user', retry_at = NULL, finished_at = ",
    now!(),
    ", needs_pass = 1 WHERE id = ?2 AND state = ?3 RETURNING id; ",
    generic_event!(),
    "; COMMIT"
);

/// start_run: the forward tasks of a definition (immutable once
/// published, so read outside the write).
pub(crate) const START_TASKS: &str = "SELECT key, json_array_length(depends_on), priority, conditional FROM task \
     WHERE workflow_id = ?1 AND compensate_for IS NULL ORDER BY position";

/// start_run's writes, without the transaction around them: `?2` run, `?3`
/// workflow, `?4` input, `?5` the task rows (their pending counts include
/// the gates that hold them back, docs/design/concurrency.md#gates), `?6`
/// the run's priority, `?7` its gates (a JSON array; each becomes a wait,
/// and a gated run is flagged for its first pass, as is a run with a
/// conditional task without dependencies); the literals given (a
/// statement ending in `; `, each literal followed by a comma) go right
/// after the run row. Returns the run's `created_at`, then one row per
/// dispatch written.
macro_rules! start_writes {
    ($($after_run:tt)*) => {
        concat!(
            "INSERT INTO workflow_run (id, workflow_id, state, input, created_at, priority, gated, needs_pass) \
             VALUES (?2, ?3, 'pending', ?4, ",
            now!(),
            ", ?6, json_array_length(?7) > 0, json_array_length(?7) > 0 OR EXISTS (SELECT 1 FROM task \
             WHERE workflow_id = ?3 AND conditional AND json_array_length(depends_on) = 0)) RETURNING created_at; \
             INSERT INTO concurrency_wait (run_id, task_key, scope, label, max, strategy) \
             SELECT ?2, j.value ->> 'task', j.value ->> 'scope', j.value ->> 'label', j.value ->> 'max', \
                    j.value ->> 'strategy' FROM json_each(?7) AS j ORDER BY j.key; ",
            $($after_run)*
            "INSERT INTO task_run (run_id, task_key, state, pending_deps, created_at, priority) \
             SELECT ?2, j.value ->> 'k', j.value ->> 's', j.value ->> 'd', ",
            now!(),
            ", j.value ->> 'p' FROM json_each(?5) AS j ORDER BY j.key; \
             INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority) \
             SELECT tr.id, tr.run_id, tr.task_key, t.task_type, tr.fencing_token, ",
            now!(),
            ", tr.priority FROM task_run tr JOIN task t ON t.workflow_id = ?3 AND t.key = tr.task_key \
             WHERE tr.run_id = ?2 AND tr.state = 'ready' \
             ORDER BY tr.id RETURNING task_run_id; "
        )
    };
}

/// start_run in one call: `?2` run, `?3` workflow, `?4` input, `?5` the
/// task rows, `?6` the run's priority, `?7` its gates; returns the run's
/// `created_at`, then one row per dispatch written.
pub(crate) const START_RUN: &str = concat!("BEGIN IMMEDIATE; ", start_writes!(), "COMMIT");

/// start_run_keyed in one call: start_run's, with the key `?8` and request
/// hash `?9` recorded beside the run. A key already recorded breaks
/// `run_idempotency`'s primary key, which fails the call and rolls the run
/// back.
pub(crate) const START_RUN_KEYED: &str = concat!(
    "BEGIN IMMEDIATE; ",
    start_writes!(
        "INSERT INTO run_idempotency (key, request_hash, run_id, created_at) VALUES (?8, ?9, ?2, ",
        now!(),
        "); ",
    ),
    "COMMIT"
);

/// start_run_keyed: the run a key started, and the hash of the request it
/// came with (primary key). `?1` key.
pub(crate) const KEYED_RUN: &str = "SELECT request_hash, run_id FROM run_idempotency WHERE key = ?1";

/// reap_expired_leases: the expired leases (`taskrun_lease_expiry_idx`),
/// read outside the write; the write re-checks each row.
pub(crate) const EXPIRED_LEASES: &str = concat!(
    "SELECT tr.id, tr.run_id, tr.task_key, tr.attempt, tr.fencing_token, tr.lease_expires_at, t.task_type, \
     tr.compensate_for \
             FROM task_run tr \
             JOIN workflow_run r ON r.id = tr.run_id \
             JOIN task t ON t.workflow_id = r.workflow_id AND t.key = COALESCE(tr.map_of, tr.task_key) \
             WHERE tr.state = 'running' AND tr.lease_expires_at < ",
    now!(),
    " AND (?2 IS NULL OR tr.run_id IN (SELECT value FROM json_each(?2))) ORDER BY tr.lease_expires_at, tr.id",
    limit!("?3")
);

/// The rows of the reap batch `?2` (`[{i: id, t: token, x: expiry}]`)
/// still running at the token and expiry the read saw: not finished,
/// renewed or reaped since. Time-free, so every statement of the call sees
/// the same rows.
macro_rules! reapable {
    ($row:literal) => {
        concat!(
            $row,
            ".id IN (SELECT j.value ->> 'i' FROM json_each(?2) AS j) AND ",
            $row,
            ".state = 'running' AND EXISTS (SELECT 1 FROM json_each(?2) AS j WHERE j.value ->> 'i' = ",
            $row,
            ".id AND j.value ->> 't' = ",
            $row,
            ".fencing_token AND j.value ->> 'x' = ",
            $row,
            ".lease_expires_at)"
        )
    };
}

/// What the reaper does to a row, decided on the data under the write lock
/// (docs/design/leases-and-fencing.md#the-reaper): `c` reap then cancel (a
/// forward task of a cancel-requested run), `r` reap and re-dispatch (attempts
/// left), `f` fail for good.
macro_rules! reap_kind {
    ($row:literal) => {
        concat!(
            "(CASE WHEN ",
            $row,
            ".compensate_for IS NULL AND (SELECT r.cancel_requested_at FROM workflow_run r WHERE r.id = ",
            $row,
            ".run_id) IS NOT NULL THEN 'c' WHEN ",
            $row,
            ".attempt - ",
            $row,
            ".attempt_base < (SELECT t.max_attempts FROM task t WHERE t.workflow_id = (SELECT r.workflow_id \
             FROM workflow_run r WHERE r.id = ",
            $row,
            ".run_id) AND t.key = COALESCE(",
            $row,
            ".map_of, ",
            $row,
            ".task_key)) THEN 'r' ELSE 'f' END)"
        )
    };
}

/// reap_expired_leases in one call. The events and dispatches are written
/// before the UPDATE, from the same rows, with the token and attempt the
/// UPDATE gives them, in the order the rows were read, numbered run by
/// run; then each of those runs' counts goes to its last event (a running
/// row's run has one already: its claim's). `?3` the final attempt's error.
pub(crate) const REAP: &str = concat!(
    "BEGIN IMMEDIATE; ",
    event_insert!(),
    "SELECT m.id, m.run_id, m.task_key, e.transition, e.from_state, \
     e.to_state, m.attempt + e.bump, m.fencing_token + 1, CASE WHEN e.seq = 1 THEN m.lease_owner END, ",
    now!(),
    ", e.error, ",
    event_number!(
        "m.run_id",
        "ROW_NUMBER() OVER (PARTITION BY m.run_id ORDER BY m.pos, e.seq)"
    ),
    " FROM (SELECT tr.id, tr.run_id, tr.task_key, tr.attempt, tr.fencing_token, tr.lease_owner, ",
    reap_kind!("tr"),
    " AS k, (SELECT j.key FROM json_each(?2) AS j WHERE j.value ->> 'i' = tr.id) AS pos \
     FROM task_run tr WHERE ",
    reapable!("tr"),
    ") AS m JOIN (\
     SELECT 'c' AS k, 1 AS seq, 'reap_lease' AS transition, 'running' AS from_state, 'ready' AS to_state, \
     1 AS bump, 'lease expired' AS error \
     UNION ALL SELECT 'c', 2, 'cancel_ready', 'ready', 'cancelled', 1, NULL \
     UNION ALL SELECT 'r', 1, 'reap_lease', 'running', 'ready', 1, 'lease expired' \
     UNION ALL SELECT 'f', 1, 'reap_lease_final', 'running', 'failed', 0, ?3) AS e ON e.k = m.k \
     ORDER BY m.pos, e.seq; \
     UPDATE run_event_seq SET seq = (SELECT MAX(e.seq) FROM task_run_event AS e WHERE e.run_id = run_event_seq.run_id) \
     WHERE run_id IN (SELECT tr.run_id FROM task_run tr WHERE ",
    reapable!("tr"),
    "); \
     INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority) \
     SELECT m.id, m.run_id, m.task_key, m.task_type, m.fencing_token + 1, ",
    now!(),
    ", m.priority FROM (SELECT tr.id, tr.run_id, tr.task_key, tr.fencing_token, tr.priority, ",
    task_type_of!("tr"),
    " AS task_type, ",
    reap_kind!("tr"),
    " AS k, (SELECT j.key FROM json_each(?2) AS j WHERE j.value ->> 'i' = tr.id) AS pos \
     FROM task_run tr WHERE ",
    reapable!("tr"),
    ") AS m WHERE m.k = 'r' ORDER BY m.pos; \
     UPDATE task_run SET state = CASE ",
    reap_kind!("task_run"),
    " WHEN 'c' THEN 'cancelled' WHEN 'r' THEN 'ready' ELSE 'failed' END, \
     fencing_token = fencing_token + 1, \
     attempt = attempt + (",
    reap_kind!("task_run"),
    " <> 'f'), lease_owner = NULL, lease_expires_at = NULL, \
     cancel_reason = CASE ",
    reap_kind!("task_run"),
    " WHEN 'c' THEN 'user' ELSE cancel_reason END, \
     finished_at = CASE WHEN ",
    reap_kind!("task_run"),
    " IN ('c', 'f') THEN ",
    now!(),
    " ELSE finished_at END, \
     error = CASE ",
    reap_kind!("task_run"),
    " WHEN 'f' THEN ?3 ELSE error END, \
     needs_pass = CASE WHEN ",
    reap_kind!("task_run"),
    " IN ('c', 'f') THEN 1 ELSE needs_pass END \
     WHERE ",
    reapable!("task_run"),
    " RETURNING id, state; COMMIT"
);

/// runs_with_work: flagged rows, due retries, cancel requests (their
/// partial indexes), and gates passable now (a scan of the waits, which
/// only gated runs not yet settled have), among the runs not yet terminal, each looked up by
/// primary key. CROSS JOIN fixes that order: left to itself, SQLite walks
/// every run ever started in `created_at` order to skip the final sort,
/// which costs history, not work.
pub(crate) const RUNS_WITH_WORK: &str = concat!(
    "SELECT w.run_id FROM (\
             SELECT run_id FROM task_run WHERE needs_pass AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2))) \
             UNION SELECT run_id FROM task_run WHERE state = 'retrying' AND retry_at <= ",
    now!(),
    " AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2))) \
             UNION SELECT id FROM workflow_run WHERE needs_pass AND (?2 IS NULL OR id IN (SELECT value FROM json_each(?2))) \
             UNION SELECT q.run_id FROM (\
                 SELECT g.run_id, row_number() OVER (PARTITION BY g.scope ORDER BY g.id) AS place, \
                        g.max - (SELECT count(*) FROM concurrency_slot s WHERE s.scope = g.scope AND s.slot < g.max) AS room \
                 FROM concurrency_wait g \
                 WHERE (?2 IS NULL OR g.run_id IN (SELECT value FROM json_each(?2))) \
                   AND (g.task_key IS NULL OR EXISTS (SELECT 1 FROM task_run tr WHERE tr.run_id = g.run_id \
                        AND tr.task_key = g.task_key AND tr.state = 'pending' AND tr.pending_deps = 1)) \
                   AND NOT EXISTS (SELECT 1 FROM concurrency_wait o WHERE o.run_id = g.run_id AND o.task_key IS g.task_key \
                        AND (SELECT count(*) FROM concurrency_slot s WHERE s.scope = o.scope AND s.slot < o.max) >= o.max)\
             ) AS q WHERE q.place <= q.room \
             ) AS w CROSS JOIN workflow_run r ON r.id = w.run_id \
             WHERE r.state IN ('pending', 'running') ORDER BY r.created_at, r.id",
    limit!("?3")
);

/// next_deadline: the earliest retry or lease end (the retry and lease indexes).
pub(crate) const NEXT_DEADLINE: &str = concat!(
    "SELECT MIN(d) - ",
    now!(),
    " FROM (\
             SELECT MIN(retry_at) AS d FROM task_run WHERE state = 'retrying' AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2))) \
             UNION ALL \
             SELECT MIN(lease_expires_at) FROM task_run WHERE state = 'running' AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2))))"
);

/// task_inputs: the run input, the total size of the dependencies'
/// outputs (tag 2, `octet_length` reads no content) and, only when that
/// total is within `?3` bytes, the outputs themselves — in ONE statement,
/// so all come from one snapshot without a transaction.
pub(crate) const TASK_INPUTS: &str = "WITH wanted AS MATERIALIZED (SELECT id, task_key, result FROM task_run \
     WHERE run_id = ?1 AND state = 'succeeded' AND result IS NOT NULL \
     AND task_key IN (SELECT value FROM json_each(?2))), \
     total AS (SELECT coalesce(sum(octet_length(result)), 0) AS n FROM wanted) \
     SELECT 0 AS tag, input AS v, NULL AS k, 0 AS o FROM workflow_run WHERE id = ?1 \
     UNION ALL SELECT 2, NULL, NULL, n FROM total \
     UNION ALL SELECT 1, result, task_key, id FROM wanted WHERE (SELECT n FROM total) <= ?3 ORDER BY 1, 4";

/// A run's history, both tables merged in `seq` order, each a range search
/// of its `(run_id, seq)` index: `$head` starts each row, `$bound` ends each
/// WHERE. `?1` run.
macro_rules! history {
    ($head:literal, $bound:literal) => {
        concat!(
            "SELECT ",
            $head,
            "seq, task_key AS task, transition, from_state, to_state, attempt, fencing_token AS token, worker, \
             at, error, generation FROM task_run_event WHERE run_id = ?1",
            $bound,
            " UNION ALL SELECT ",
            $head,
            "seq, NULL, transition, from_state, to_state, NULL, NULL, NULL, at, NULL, generation \
             FROM workflow_run_event WHERE run_id = ?1",
            $bound,
            " ORDER BY seq"
        )
    };
}

/// get_run: run, task runs and history from one read transaction, in one
/// call. The task runs and the history each come back as one JSON array in
/// one row: a large run has thousands of rows, and the driver hands each
/// row over on its own (a copy of every value and a thread wake-up), which
/// cost more than the query (`GET /runs/{id}` of a 1 000-task run). The
/// arrays are not sorted here: an ORDER BY inside the aggregate builds a
/// temporary b-tree, while the rows already arrive nearly in order (the
/// history's two index scans merged by `seq`), which the caller's sort
/// confirms in one pass.
pub(crate) const GET_RUN: &str = concat!(
    "BEGIN; SELECT 0 AS tag, ",
    summary_columns!(),
    ", w.fingerprint, r.input FROM workflow_run r JOIN workflow w ON w.id = r.workflow_id WHERE r.id = ?1; \
     SELECT 1 AS tag, json_group_array(json_object('id', id, 'task_key', task_key, 'compensate_for', compensate_for, \
     'state', state, 'attempt', attempt, 'generation', generation, 'fencing_token', fencing_token, \
     'priority', priority, 'cancel_reason', cancel_reason, 'skip_reason', skip_reason, \
     'result', result, 'error', error, 'started_at', started_at, 'finished_at', finished_at, 'retry_at', retry_at, \
     'lease_owner', lease_owner, 'progress', progress, 'created_at', created_at)) AS rows \
     FROM task_run WHERE run_id = ?1; \
     SELECT 2 AS tag, json_group_array(json_object('seq', seq, 'task', task, 'transition', transition, \
     'from_state', from_state, 'to_state', to_state, 'attempt', attempt, 'token', token, 'worker', worker, \
     'at', at, 'error', error, 'generation', generation)) AS rows FROM (",
    history!("", ""),
    "); SELECT 3 AS tag, json_group_array(json_object('task_key', task_key, 'scope', scope, 'label', label, \
     'max', max, 'strategy', strategy, 'tried', json(CASE WHEN tried THEN 'true' ELSE 'false' END))) AS rows FROM (",
    due_waits!("?1"),
    "); COMMIT"
);

/// run_events: the events numbered above `?2`, at most `?3`
/// (`taskrunevent_run_seq_idx`, `workflowrunevent_run_seq_idx`, merged).
pub(crate) const RUN_EVENTS: &str = concat!(history!("", " AND seq > ?2"), limit!("?3"));

/// list_runs: newest first (`workflowrun_created_id_idx`).
pub(crate) const LIST_RUNS: &str = concat!(
    "SELECT ",
    summary_columns!(),
    " FROM workflow_run r JOIN workflow w ON w.id = r.workflow_id ORDER BY r.created_at DESC, r.id DESC",
    limit!("?1")
);

/// list_runs_page: newest first, strictly after the cursor (`?1` created_at,
/// `?2` id), by a search of `workflowrun_created_id_idx`. Without a cursor
/// both are NULL and the bound is above every run (no id sorts after 'g':
/// ids are lower-case hex and hyphens). Filters, NULL for none: `?3` states
/// and `?4` workflow names (JSON arrays), `?5` created at or after, `?6`
/// created before. `?7` limit.
pub(crate) const LIST_RUNS_PAGE: &str = concat!(
    "SELECT ",
    summary_columns!(),
    " FROM workflow_run r JOIN workflow w ON w.id = r.workflow_id \
     WHERE (r.created_at, r.id) < (COALESCE(?1, 9223372036854775807), COALESCE(?2, 'g')) \
     AND (?3 IS NULL OR r.state IN (SELECT value FROM json_each(?3))) \
     AND (?4 IS NULL OR w.name IN (SELECT value FROM json_each(?4))) \
     AND (?5 IS NULL OR r.created_at >= ?5) AND (?6 IS NULL OR r.created_at < ?6) \
     ORDER BY r.created_at DESC, r.id DESC",
    limit!("?7")
);

/// run_summary: one run by primary key. `?1` run.
pub(crate) const RUN_SUMMARY: &str = concat!(
    "SELECT ",
    summary_columns!(),
    " FROM workflow_run r JOIN workflow w ON w.id = r.workflow_id WHERE r.id = ?1"
);

/// gauges: each count from the partial index of live rows that holds it
/// (the ready, lease, unpublished and active-run indexes; the ready one
/// named, as for [`READY_OF_TYPES`]).
pub(crate) const GAUGES: &str = "SELECT \
     (SELECT count(*) FROM task_run INDEXED BY taskrun_ready_idx WHERE state = 'ready'), \
     (SELECT count(*) FROM task_run WHERE state = 'running'), \
     (SELECT count(*) FROM outbox WHERE published_at IS NULL), \
     (SELECT count(*) FROM workflow_run WHERE state IN ('pending', 'running'))";

/// start_run, when the workflow has no forward task rows: whether it
/// exists at all (primary key). `?1` the workflow.
pub(crate) const WORKFLOW_EXISTS: &str = "SELECT id FROM workflow WHERE id = ?1";

/// resume_run's first call, leaving its transaction open: the run's
/// `resume` edge (docs/design/retry.md), conditional on its state and
/// generation, so of two concurrent retries exactly one matches; a limit's
/// cancel reason is cleared, and the run is flagged for a first pass, which
/// admits it past its gates `?5` (docs/design/concurrency.md#retries) and
/// decides its conditional tasks (docs/design/conditions.md#retries). `?2` run,
/// `?3` from state, `?4` generation.
pub(crate) const RESUME_RUN: &str = "BEGIN IMMEDIATE; \
     UPDATE workflow_run SET state = 'running', generation = generation + 1, finished_at = NULL, \
     cancel_requested_at = NULL, cancel_reason = NULL, gated = json_array_length(?5) > 0, needs_pass = 1 \
     WHERE id = ?2 AND state = ?3 AND generation = ?4 RETURNING generation";

/// The task runs of the retry set `?3` (`{k, f, t, d}`: key, from, to,
/// dependencies inside the set) once reset to generation `?4`.
macro_rules! reset_rows {
    () => {
        "task_run tr JOIN json_each(?3) AS p ON tr.task_key = p.value ->> 'k' \
         WHERE tr.run_id = ?2 AND tr.generation = ?4 AND tr.compensate_for IS NULL"
    };
}

/// resume_run's second call, in the first's transaction: the run's event
/// counter takes the new generation `?4` before the `resume` event (from
/// `?5`), so it and every later event carry it; then each task of the
/// retry set `?3` takes `reset` from its planned state — attempt + 1 (the
/// earlier ones become `attempt_base`), token + 1, its output, error and
/// cancel reason cleared — with its event and, once ready, its dispatch;
/// the gates `?6` become waits, already tried. Returns how many rows were
/// reset. `?2` run.
pub(crate) const RESET_TASKS: &str = concat!(
    "UPDATE run_event_seq SET generation = ?4 WHERE run_id = ?2; \
     INSERT INTO workflow_run_event (run_id, transition, from_state, to_state, at, seq, generation) \
     SELECT ?2, 'resume', ?5, 'running', ",
    now!(),
    ", ",
    last_seq!("?2"),
    " + 1, ?4; ",
    events_written!("workflow_run_event"),
    "; UPDATE task_run SET state = p.value ->> 't', pending_deps = p.value ->> 'd', generation = ?4, ",
    reset_set!(),
    " FROM json_each(?3) AS p \
     WHERE task_run.run_id = ?2 AND task_run.task_key = p.value ->> 'k' AND task_run.state = p.value ->> 'f' \
     AND task_run.compensate_for IS NULL; ",
    event_insert!(),
    "SELECT tr.id, tr.run_id, tr.task_key, 'reset', p.value ->> 'f', tr.state, \
     tr.attempt, tr.fencing_token, NULL, ",
    now!(),
    ", NULL, ",
    last_seq!("?2"),
    " + ROW_NUMBER() OVER (ORDER BY tr.id), ?4 FROM ",
    reset_rows!(),
    " ORDER BY tr.id; ",
    events_written!("task_run_event"),
    "; \
     INSERT INTO outbox (task_run_id, run_id, task_key, task_type, fencing_token, created_at, priority) \
     SELECT tr.id, tr.run_id, tr.task_key, ",
    task_type_of!("tr"),
    ", tr.fencing_token, ",
    now!(),
    ", tr.priority FROM ",
    reset_rows!(),
    " AND tr.state = 'ready' ORDER BY tr.id; \
     INSERT INTO concurrency_wait (run_id, task_key, scope, label, max, strategy, tried) \
     SELECT ?2, j.value ->> 'task', j.value ->> 'scope', j.value ->> 'label', j.value ->> 'max', \
            j.value ->> 'strategy', 1 FROM json_each(?6) AS j ORDER BY j.key; \
     SELECT COUNT(*) FROM ",
    reset_rows!()
);
