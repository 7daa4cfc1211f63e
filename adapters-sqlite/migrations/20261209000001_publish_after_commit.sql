-- Publish after commit (docs/design/outbox-and-queues.md#publish-after-commit):
-- a committer that publishes its own outbox rows right after its commit
-- holds them from the sweep until `sweep_after` (store milliseconds); the
-- sweep takes them once that has passed, so a committer that died first
-- loses nothing. NULL: the sweep's from the start. The same column and
-- index as on PostgreSQL.

ALTER TABLE outbox ADD COLUMN sweep_after INTEGER;

CREATE INDEX outbox_held_idx ON outbox (sweep_after) WHERE published_at IS NULL AND sweep_after IS NOT NULL;
