-- no-transaction
-- Events numbered by the statements that write them
-- (docs/design/data-model.md#event-numbers). Until now an AFTER INSERT
-- trigger gave each event row its number and generation: per row, an
-- upsert of `run_event_seq` and an UPDATE that rewrote the row just
-- written (its `(run_id, seq)` index entry deleted and inserted again).
-- The statements now write `seq` and `generation` with the row, from
-- `run_event_seq`, and advance it by the rows they wrote. Each table is
-- rebuilt so that `seq` and `generation` are NOT NULL without a default
-- (an event without its number or generation is refused, not written),
-- and `workflowrunevent_transition_valid` becomes an OR of equalities as
-- 20261210000001 made the other checks
-- (docs/design/data-model.md#constraints-without-lookup-tables). Same
-- columns, ids and indexes; in one transaction, written to run again to
-- the same end if the process stops before sqlx records it.
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;
DROP TRIGGER IF EXISTS taskrunevent_seq;
DROP TRIGGER IF EXISTS workflowrunevent_seq;

DROP TABLE IF EXISTS task_run_event_next;
CREATE TABLE task_run_event_next (
    id            INTEGER PRIMARY KEY,
    task_run_id   INTEGER NOT NULL REFERENCES task_run (id),
    run_id        TEXT NOT NULL,
    task_key      TEXT NOT NULL,
    transition    TEXT NOT NULL,
    from_state    TEXT,
    to_state      TEXT,
    attempt       INTEGER NOT NULL,
    fencing_token INTEGER NOT NULL,
    worker        TEXT,
    at            INTEGER NOT NULL,
    error         TEXT,
    seq           INTEGER NOT NULL,
    generation    INTEGER NOT NULL,
    CONSTRAINT taskrunevent_transition_valid CHECK (
        transition = 'dependencies_satisfied' OR transition = 'cancel_pending' OR transition = 'claim'
        OR transition = 'cancel_ready' OR transition = 'succeed' OR transition = 'fail'
        OR transition = 'cancel_running' OR transition = 'reap_lease' OR transition = 'reap_lease_final'
        OR transition = 'schedule_retry' OR transition = 'retry_ready' OR transition = 'cancel_retrying'
        OR transition = 'stale_write_rejected' OR transition = 'reset' OR transition = 'skip'
        OR transition = 'fail_condition' OR transition = 'collect' OR transition = 'fail_map'),
    -- An audit event records no state change; a transition records both ends.
    CONSTRAINT taskrunevent_states_iff_transition
        CHECK ((transition = 'stale_write_rejected') = (from_state IS NULL AND to_state IS NULL))
) STRICT;
INSERT INTO task_run_event_next
    (id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt, fencing_token, worker, at, error,
     seq, generation)
SELECT id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt, fencing_token, worker, at, error,
       seq, generation
FROM task_run_event;
DROP TABLE task_run_event;
ALTER TABLE task_run_event_next RENAME TO task_run_event;
CREATE UNIQUE INDEX taskrunevent_run_seq_idx ON task_run_event (run_id, seq);
CREATE INDEX taskrunevent_stale_idx ON task_run_event (task_run_id) WHERE transition = 'stale_write_rejected';

DROP TABLE IF EXISTS workflow_run_event_next;
CREATE TABLE workflow_run_event_next (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES workflow_run (id),
    transition TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    at         INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    CONSTRAINT workflowrunevent_transition_valid CHECK (
        transition = 'start' OR transition = 'cancel_before_start' OR transition = 'succeed'
        OR transition = 'fail' OR transition = 'cancel' OR transition = 'resume')
) STRICT;
INSERT INTO workflow_run_event_next (id, run_id, transition, from_state, to_state, at, seq, generation)
SELECT id, run_id, transition, from_state, to_state, at, seq, generation FROM workflow_run_event;
DROP TABLE workflow_run_event;
ALTER TABLE workflow_run_event_next RENAME TO workflow_run_event;
CREATE UNIQUE INDEX workflowrunevent_run_seq_idx ON workflow_run_event (run_id, seq);
COMMIT;
PRAGMA foreign_keys = ON;
