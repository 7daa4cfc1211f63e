-- no-transaction
-- The `skipped` state (docs/design/conditions.md#skipping): a task run that
-- did not run by its definition's rule, with its reason. SQLite cannot
-- change a CHECK constraint in place, so `task_run` is rebuilt (same
-- columns, ids and rows, plus `skip_reason`) by SQLite's own procedure for
-- changing a table: foreign keys off while the parent table is swapped
-- (the events and the outbox refer to it), all in one transaction. sqlx
-- records this migration after it, outside that transaction, so it is
-- written to run again to the same end if the process stops in between.
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
    CONSTRAINT uniq_taskrun_run_key UNIQUE (run_id, task_key),
    CONSTRAINT taskrun_state_valid
        CHECK (state IN ('pending', 'ready', 'running', 'succeeded', 'failed', 'retrying', 'cancelled', 'skipped')),
    CONSTRAINT taskrun_lease_iff_running CHECK ((state = 'running') = (lease_expires_at IS NOT NULL)),
    CONSTRAINT taskrun_owner_iff_running CHECK ((state = 'running') = (lease_owner IS NOT NULL)),
    CONSTRAINT taskrun_retry_at_iff_retrying CHECK ((state = 'retrying') = (retry_at IS NOT NULL)),
    CONSTRAINT taskrun_cancel_reason_iff_cancelled CHECK ((state = 'cancelled') = (cancel_reason IS NOT NULL)),
    CONSTRAINT taskrun_cancel_reason_valid CHECK (cancel_reason IN ('user', 'upstream_failed')),
    CONSTRAINT taskrun_skip_reason_iff_skipped CHECK ((state = 'skipped') = (skip_reason IS NOT NULL)),
    CONSTRAINT taskrun_skip_reason_valid CHECK (skip_reason IN ('condition_false', 'upstream_skipped')),
    CONSTRAINT taskrun_finished_iff_finished_state
        CHECK ((state IN ('succeeded', 'failed', 'cancelled', 'skipped')) = (finished_at IS NOT NULL)),
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
     progress, generation, attempt_base, priority)
SELECT id, run_id, task_key, compensate_for, state, attempt, fencing_token, pending_deps, lease_owner,
       lease_expires_at, retry_at, cancel_reason, needs_pass, created_at, started_at, finished_at, result, error,
       progress, generation, attempt_base, priority
FROM task_run;
DROP TABLE task_run;
ALTER TABLE task_run_next RENAME TO task_run;

-- The indexes the old table had.
CREATE INDEX taskrun_needs_pass_idx ON task_run (run_id) WHERE needs_pass;
CREATE INDEX taskrun_retry_due_idx ON task_run (retry_at) WHERE state = 'retrying';
CREATE INDEX taskrun_lease_expiry_idx ON task_run (lease_expires_at) WHERE state = 'running';
CREATE INDEX taskrun_active_idx ON task_run (run_id, state, pending_deps)
    WHERE state IN ('pending', 'ready', 'running', 'retrying');
CREATE INDEX taskrun_ready_idx ON task_run (id) WHERE state = 'ready';
COMMIT;
PRAGMA foreign_keys = ON;
