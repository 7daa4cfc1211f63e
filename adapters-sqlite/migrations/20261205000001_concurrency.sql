-- Concurrency limits (docs/design/concurrency.md). A limited run or task
-- waits at a gate: a `concurrency_wait` row, written when the run starts,
-- naming the slot pool (`scope`) its input resolved to. Passing the gate
-- takes a `concurrency_slot` row; the primary key (scope, slot) with slot
-- below the pool's size keeps the holders of a pool within its `max`. The
-- same tables and constraints as on PostgreSQL.

ALTER TABLE workflow_run ADD COLUMN gated INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workflow_run ADD COLUMN cancel_reason TEXT
    CONSTRAINT workflowrun_cancel_reason_valid CHECK (cancel_reason IN ('concurrency_limit'));

CREATE TABLE concurrency_wait (
    id       INTEGER PRIMARY KEY,
    run_id   TEXT NOT NULL REFERENCES workflow_run (id),
    task_key TEXT,
    scope    TEXT NOT NULL,
    label    TEXT NOT NULL,
    max      INTEGER NOT NULL,
    strategy TEXT NOT NULL,
    tried    INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT concurrencywait_max_positive CHECK (max >= 1),
    CONSTRAINT concurrencywait_strategy_valid CHECK (strategy IN ('queue', 'cancel_newest', 'cancel_in_progress'))
) STRICT;
CREATE INDEX concurrencywait_run_idx ON concurrency_wait (run_id);

CREATE TABLE concurrency_slot (
    scope       TEXT NOT NULL,
    slot        INTEGER NOT NULL,
    run_id      TEXT NOT NULL REFERENCES workflow_run (id),
    task_key    TEXT,
    acquired_at INTEGER NOT NULL,
    PRIMARY KEY (scope, slot),
    CONSTRAINT concurrencyslot_slot_natural CHECK (slot >= 0)
) STRICT;
CREATE INDEX concurrencyslot_run_idx ON concurrency_slot (run_id);
