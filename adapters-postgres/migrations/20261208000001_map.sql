-- Mapped tasks (docs/design/map.md). A child `task[i]` is a task run of
-- its own (its own attempts, lease and token) that names the mapped task
-- it belongs to (`map_of`, whose definition row gives its type, retry
-- policy and timeout) and its item's index; the mapped task's row records
-- how many children it expanded into (`map_size`). An empty array skips
-- it (`empty_map`); `collect` and `fail_map` end it. The same columns and
-- constraints as on SQLite.

ALTER TABLE task_run
    ADD COLUMN map_of TEXT,
    ADD COLUMN map_index INTEGER,
    ADD COLUMN map_size INTEGER,
    ADD CONSTRAINT taskrun_map_child CHECK ((map_of IS NULL) = (map_index IS NULL)),
    ADD CONSTRAINT taskrun_map_index_nonnegative CHECK (map_index >= 0),
    ADD CONSTRAINT taskrun_map_size_positive CHECK (map_size >= 1),
    DROP CONSTRAINT taskrun_skip_reason_valid,
    ADD CONSTRAINT taskrun_skip_reason_valid
        CHECK (skip_reason IN ('condition_false', 'upstream_skipped', 'empty_map'));

-- A mapped task's children by index: map_children, collect_map.
CREATE INDEX taskrun_map_children_idx ON task_run (run_id, map_of, map_index) WHERE map_of IS NOT NULL;

ALTER TABLE task_run_event DROP CONSTRAINT taskrunevent_transition_valid,
    ADD CONSTRAINT taskrunevent_transition_valid CHECK (transition IN (
        'dependencies_satisfied', 'cancel_pending', 'claim', 'cancel_ready', 'succeed', 'fail',
        'cancel_running', 'reap_lease', 'reap_lease_final', 'schedule_retry', 'retry_ready',
        'cancel_retrying', 'stale_write_rejected', 'reset', 'skip', 'fail_condition', 'collect', 'fail_map'));
