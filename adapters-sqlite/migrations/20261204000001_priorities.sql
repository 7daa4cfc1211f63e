-- Dispatch priorities (docs/design/priorities.md): a run is started at a
-- priority, a task may name its own, and each task run carries the one it
-- is dispatched at into its outbox rows, which the publisher sweeps in
-- priority order with aging. The same columns and constraints as on
-- PostgreSQL.

ALTER TABLE workflow_run ADD COLUMN priority INTEGER NOT NULL DEFAULT 5
    CONSTRAINT workflowrun_priority_range CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE task ADD COLUMN priority INTEGER
    CONSTRAINT task_priority_range CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE task_run ADD COLUMN priority INTEGER NOT NULL DEFAULT 5
    CONSTRAINT taskrun_priority_range CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE outbox ADD COLUMN priority INTEGER NOT NULL DEFAULT 5
    CONSTRAINT outbox_priority_range CHECK (priority BETWEEN 0 AND 9);

-- The pending rows in the sweep's terms; it replaces the index of pending
-- rows by id, which nothing reads any more.
CREATE INDEX outbox_pending_order_idx ON outbox (priority, created_at, id) WHERE published_at IS NULL;
DROP INDEX outbox_unpublished_idx;
