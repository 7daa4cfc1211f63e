-- The stale-write audits of one task run are capped
-- (docs/design/data-flow.md#limits); counting them must read only them,
-- not the run's whole history.
CREATE INDEX taskrunevent_stale_idx ON task_run_event (task_run_id) WHERE transition = 'stale_write_rejected';
