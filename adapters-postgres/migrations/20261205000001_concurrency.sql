-- Concurrency limits (docs/design/concurrency.md). A limited run or task
-- waits at a gate: a `concurrency_wait` row, written when the run starts,
-- naming the slot pool (`scope`) its input resolved to. Passing the gate
-- takes a `concurrency_slot` row; the primary key (scope, slot) with slot
-- below the pool's size is what keeps the holders of a pool within its
-- `max` whatever races, since no two transactions can hold one slot.

-- Whether the run has gates, so a pass over any other run asks nothing
-- more; and why a run was cancelled when a request was not a user's.
ALTER TABLE workflow_run ADD COLUMN gated BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN cancel_reason TEXT,
    ADD CONSTRAINT workflowrun_cancel_reason_valid CHECK (cancel_reason IN ('concurrency_limit'));

CREATE TABLE concurrency_wait (
    id       BIGSERIAL PRIMARY KEY,
    run_id   UUID NOT NULL REFERENCES workflow_run (id),
    -- NULL: the run's own gate, in front of its first tasks.
    task_key TEXT,
    scope    TEXT NOT NULL,
    label    TEXT NOT NULL,
    max      INTEGER NOT NULL,
    strategy TEXT NOT NULL,
    -- Whether the run has met its full pool once (its strategy acted).
    tried    BOOLEAN NOT NULL DEFAULT false,
    CONSTRAINT concurrencywait_max_positive CHECK (max >= 1),
    CONSTRAINT concurrencywait_strategy_valid CHECK (strategy IN ('queue', 'cancel_newest', 'cancel_in_progress'))
);
CREATE INDEX concurrencywait_run_idx ON concurrency_wait (run_id);

CREATE TABLE concurrency_slot (
    scope       TEXT NOT NULL,
    slot        INTEGER NOT NULL,
    run_id      UUID NOT NULL REFERENCES workflow_run (id),
    -- NULL: held by the run itself.
    task_key    TEXT,
    acquired_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (scope, slot),
    CONSTRAINT concurrencyslot_slot_natural CHECK (slot >= 0)
);
CREATE INDEX concurrencyslot_run_idx ON concurrency_slot (run_id);
