-- Publish after commit (docs/design/outbox-and-queues.md#publish-after-commit):
-- a committer that publishes its own outbox rows right after its commit
-- holds them from the sweep until `sweep_after`; the sweep takes them once
-- that has passed, so a committer that died first loses nothing. NULL: the
-- sweep's from the start, as every row was before.

ALTER TABLE outbox ADD COLUMN sweep_after TIMESTAMPTZ;

-- The rows still held, for the publisher's wait until the first is
-- released; a row leaves it when published, so it stays small.
CREATE INDEX outbox_held_idx ON outbox (sweep_after) WHERE published_at IS NULL AND sweep_after IS NOT NULL;
