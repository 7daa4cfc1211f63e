-- Task conditions (docs/design/conditions.md): a task's `when` and
-- `trigger` as written (kept apart so a load gives back the very document
-- that was published), whether either makes it conditional (for the start's
-- SQL: a conditional task waits on one hold beyond its dependencies, which
-- the scheduler lowers once it has decided it), and the `skipped` state
-- with its reason and edges. The same columns and constraints as on SQLite.

ALTER TABLE task
    ADD COLUMN when_expr TEXT,
    ADD COLUMN trigger_rule TEXT
        CONSTRAINT task_trigger_rule_valid CHECK (trigger_rule IN ('all_succeeded', 'none_failed', 'all_done')),
    ADD COLUMN conditional BOOLEAN NOT NULL DEFAULT false;

ALTER TABLE task_run
    ADD COLUMN skip_reason TEXT
        CONSTRAINT taskrun_skip_reason_valid CHECK (skip_reason IN ('condition_false', 'upstream_skipped'));
ALTER TABLE task_run
    DROP CONSTRAINT taskrun_state_valid,
    ADD CONSTRAINT taskrun_state_valid
        CHECK (state IN ('pending', 'ready', 'running', 'succeeded', 'failed', 'retrying', 'cancelled', 'skipped')),
    DROP CONSTRAINT taskrun_finished_iff_finished_state,
    ADD CONSTRAINT taskrun_finished_iff_finished_state
        CHECK ((state IN ('succeeded', 'failed', 'cancelled', 'skipped')) = (finished_at IS NOT NULL)),
    ADD CONSTRAINT taskrun_skip_reason_iff_skipped CHECK ((state = 'skipped') = (skip_reason IS NOT NULL));

ALTER TABLE task_run_event DROP CONSTRAINT taskrunevent_transition_valid,
    ADD CONSTRAINT taskrunevent_transition_valid CHECK (transition IN (
        'dependencies_satisfied', 'cancel_pending', 'claim', 'cancel_ready', 'succeed', 'fail',
        'cancel_running', 'reap_lease', 'reap_lease_final', 'schedule_retry', 'retry_ready',
        'cancel_retrying', 'stale_write_rejected', 'reset', 'skip', 'fail_condition'));
