-- Workers that poll through the API instead of consuming dispatches
-- (docs/design/handlers.md#remote-workers).

-- What a running attempt last reported of its progress; replaced by each
-- report, cleared by the next claim.
ALTER TABLE task_run ADD COLUMN progress JSONB;

-- claim_ready: the oldest ready rows, without reading finished history.
CREATE INDEX taskrun_ready_idx ON task_run (id) WHERE state = 'ready';
