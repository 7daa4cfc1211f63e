-- no-transaction
-- CHECK constraints and a partial index written as ORs of equalities
-- (docs/design/data-model.md#constraints-without-lookup-tables). SQLite
-- evaluates `x IN (a, b, c, …)` with more than two constants through a
-- temporary b-tree it opens and frees every time a statement runs; an OR
-- of equalities is a few comparisons. `task_run` and `task_run_event` are
-- written on every task's every transition, so their state and transition
-- checks and `taskrun_active_idx`'s condition (evaluated for the old and
-- the new row of every update of those columns) were four to five of those
-- b-trees per claim or finish. The same rows are allowed as before, and as
-- on PostgreSQL. SQLite cannot change a CHECK constraint in place, so both
-- tables are rebuilt as 20261208000001 rebuilt them (same columns, ids,
-- indexes and trigger), in one transaction, written to run again to the
-- same end if the process stops before sqlx records it.
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;
DROP TABLE IF EXISTS task_run_next;
CREATE TABLE task_run_next (
    id               INTEGER PRIMARY KEY,
    run_id           TEXT NOT NULL REFERENCES workflow_run (id),
    task_key         TEXT NOT NULL,
    compensate_for   TEXT,
    state            TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 1,
    fencing_token    INTEGER NOT NULL DEFAULT 0,
    -- Dependencies (and holds) not yet released; the scheduler lowers it.
    pending_deps     INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    retry_at         INTEGER,
    cancel_reason    TEXT,
    -- A change the scheduler has not reacted to yet.
    needs_pass       INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    result           TEXT,
    error            TEXT,
    progress         TEXT,
    generation       INTEGER NOT NULL DEFAULT 1,
    attempt_base     INTEGER NOT NULL DEFAULT 0,
    priority         INTEGER NOT NULL DEFAULT 5,
    skip_reason      TEXT,
    map_of           TEXT,
    map_index        INTEGER,
    map_size         INTEGER,
    CONSTRAINT uniq_taskrun_run_key UNIQUE (run_id, task_key),
    CONSTRAINT taskrun_state_valid
        CHECK (state = 'pending' OR state = 'ready' OR state = 'running' OR state = 'succeeded' OR state = 'failed'
               OR state = 'retrying' OR state = 'cancelled' OR state = 'skipped'),
    CONSTRAINT taskrun_lease_iff_running CHECK ((state = 'running') = (lease_expires_at IS NOT NULL)),
    CONSTRAINT taskrun_owner_iff_running CHECK ((state = 'running') = (lease_owner IS NOT NULL)),
    CONSTRAINT taskrun_retry_at_iff_retrying CHECK ((state = 'retrying') = (retry_at IS NOT NULL)),
    CONSTRAINT taskrun_cancel_reason_iff_cancelled CHECK ((state = 'cancelled') = (cancel_reason IS NOT NULL)),
    CONSTRAINT taskrun_cancel_reason_valid CHECK (cancel_reason IN ('user', 'upstream_failed')),
    CONSTRAINT taskrun_skip_reason_iff_skipped CHECK ((state = 'skipped') = (skip_reason IS NOT NULL)),
    CONSTRAINT taskrun_skip_reason_valid CHECK (skip_reason IN ('condition_false', 'upstream_skipped', 'empty_map')),
    CONSTRAINT taskrun_map_child CHECK ((map_of IS NULL) = (map_index IS NULL)),
    CONSTRAINT taskrun_map_index_nonnegative CHECK (map_index >= 0),
    CONSTRAINT taskrun_map_size_positive CHECK (map_size >= 1),
    CONSTRAINT taskrun_finished_iff_finished_state
        CHECK ((state = 'succeeded' OR state = 'failed' OR state = 'cancelled' OR state = 'skipped')
               = (finished_at IS NOT NULL)),
    CONSTRAINT taskrun_result_only_when_succeeded CHECK (result IS NULL OR state = 'succeeded'),
    CONSTRAINT taskrun_attempt_positive CHECK (attempt >= 1),
    CONSTRAINT taskrun_token_nonnegative CHECK (fencing_token >= 0),
    CONSTRAINT taskrun_pending_deps_nonnegative CHECK (pending_deps >= 0),
    CONSTRAINT taskrun_needs_pass_bool CHECK (needs_pass IN (0, 1)),
    CONSTRAINT taskrun_result_json CHECK (result IS NULL OR json_valid(result)),
    CONSTRAINT taskrun_generation_positive CHECK (generation >= 1),
    CONSTRAINT taskrun_prior_attempts_below_attempt
        CHECK (attempt_base >= 0 AND (attempt_base < attempt OR attempt < 1)),
    CONSTRAINT taskrun_priority_range CHECK (priority BETWEEN 0 AND 9)
) STRICT;
INSERT INTO task_run_next
    (id, run_id, task_key, compensate_for, state, attempt, fencing_token, pending_deps, lease_owner,
     lease_expires_at, retry_at, cancel_reason, needs_pass, created_at, started_at, finished_at, result, error,
     progress, generation, attempt_base, priority, skip_reason, map_of, map_index, map_size)
SELECT id, run_id, task_key, compensate_for, state, attempt, fencing_token, pending_deps, lease_owner,
       lease_expires_at, retry_at, cancel_reason, needs_pass, created_at, started_at, finished_at, result, error,
       progress, generation, attempt_base, priority, skip_reason, map_of, map_index, map_size
FROM task_run;
DROP TABLE task_run;
ALTER TABLE task_run_next RENAME TO task_run;

-- The indexes the old table had.
CREATE INDEX taskrun_needs_pass_idx ON task_run (run_id) WHERE needs_pass;
CREATE INDEX taskrun_retry_due_idx ON task_run (retry_at) WHERE state = 'retrying';
CREATE INDEX taskrun_lease_expiry_idx ON task_run (lease_expires_at) WHERE state = 'running';
CREATE INDEX taskrun_active_idx ON task_run (run_id, state, pending_deps)
    WHERE state = 'pending' OR state = 'ready' OR state = 'running' OR state = 'retrying';
CREATE INDEX taskrun_ready_idx ON task_run (id) WHERE state = 'ready';
-- A mapped task's children by index: map_children, collect_map.
CREATE INDEX taskrun_map_children_idx ON task_run (run_id, map_of, map_index) WHERE map_of IS NOT NULL;

-- The event table (same columns, ids and numbers), with its indexes and
-- trigger.
DROP TABLE IF EXISTS task_run_event_next;
CREATE TABLE task_run_event_next (
    id            INTEGER PRIMARY KEY,
    task_run_id   INTEGER NOT NULL REFERENCES task_run (id),
    run_id        TEXT NOT NULL,
    task_key      TEXT NOT NULL,
    transition    TEXT NOT NULL,
    from_state    TEXT,
    to_state      TEXT,
    attempt       INTEGER NOT NULL,
    fencing_token INTEGER NOT NULL,
    worker        TEXT,
    at            INTEGER NOT NULL,
    error         TEXT,
    seq           INTEGER,
    generation    INTEGER NOT NULL DEFAULT 1,
    CONSTRAINT taskrunevent_transition_valid CHECK (
        transition = 'dependencies_satisfied' OR transition = 'cancel_pending' OR transition = 'claim'
        OR transition = 'cancel_ready' OR transition = 'succeed' OR transition = 'fail'
        OR transition = 'cancel_running' OR transition = 'reap_lease' OR transition = 'reap_lease_final'
        OR transition = 'schedule_retry' OR transition = 'retry_ready' OR transition = 'cancel_retrying'
        OR transition = 'stale_write_rejected' OR transition = 'reset' OR transition = 'skip'
        OR transition = 'fail_condition' OR transition = 'collect' OR transition = 'fail_map'),
    -- An audit event records no state change; a transition records both ends.
    CONSTRAINT taskrunevent_states_iff_transition
        CHECK ((transition = 'stale_write_rejected') = (from_state IS NULL AND to_state IS NULL))
) STRICT;
INSERT INTO task_run_event_next
    (id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt, fencing_token, worker, at, error,
     seq, generation)
SELECT id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt, fencing_token, worker, at, error,
       seq, generation
FROM task_run_event;
DROP TABLE task_run_event;
ALTER TABLE task_run_event_next RENAME TO task_run_event;

CREATE UNIQUE INDEX taskrunevent_run_seq_idx ON task_run_event (run_id, seq);
CREATE INDEX taskrunevent_stale_idx ON task_run_event (task_run_id) WHERE transition = 'stale_write_rejected';

-- Each new event takes the run's next number and its current generation.
CREATE TRIGGER taskrunevent_seq AFTER INSERT ON task_run_event FOR EACH ROW BEGIN
    INSERT INTO run_event_seq (run_id, seq) VALUES (NEW.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET seq = seq + 1;
    UPDATE task_run_event
        SET (seq, generation) = (SELECT s.seq, s.generation FROM run_event_seq AS s WHERE s.run_id = NEW.run_id)
        WHERE id = NEW.id;
END;
COMMIT;
PRAGMA foreign_keys = ON;
