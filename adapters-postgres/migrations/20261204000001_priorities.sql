-- Dispatch priorities (docs/design/priorities.md): a run is started at a
-- priority, a task may name its own, and each task run carries the one it
-- is dispatched at into its outbox rows, which the publisher sweeps in
-- priority order with aging.

ALTER TABLE workflow_run ADD COLUMN priority SMALLINT NOT NULL DEFAULT 5,
    ADD CONSTRAINT workflowrun_priority_range CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE task ADD COLUMN priority SMALLINT,
    ADD CONSTRAINT task_priority_range CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE task_run ADD COLUMN priority SMALLINT NOT NULL DEFAULT 5,
    ADD CONSTRAINT taskrun_priority_range CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE outbox ADD COLUMN priority SMALLINT NOT NULL DEFAULT 5,
    ADD CONSTRAINT outbox_priority_range CHECK (priority BETWEEN 0 AND 9);

-- The sweep reads the oldest pending rows of each priority (ten short
-- range scans) and merges them by order key: no sort over the backlog. It
-- replaces the index of pending rows by id, which nothing reads any more.
CREATE INDEX outbox_pending_order_idx ON outbox (priority, created_at, id) WHERE published_at IS NULL;
DROP INDEX outbox_unpublished_idx;
