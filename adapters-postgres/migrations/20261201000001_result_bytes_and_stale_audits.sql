-- The size of each stored output (its compact JSON text, as the store
-- received it), so `task_inputs` can refuse a task's inputs that add up
-- past the limit by summing sizes instead of reading the outputs
-- (docs/design/data-flow.md#limits). Rows finished before this migration
-- have none; their size is computed from the output when asked.
ALTER TABLE task_run ADD COLUMN result_bytes BIGINT
    CONSTRAINT taskrun_result_bytes_sized CHECK (result_bytes IS NULL OR (result_bytes >= 0 AND result IS NOT NULL));

-- The stale-write audits of one task run are capped; counting them must
-- read only them, not the run's whole history.
CREATE INDEX taskrunevent_stale_idx ON task_run_event (task_run_id) WHERE transition = 'stale_write_rejected';
