-- Task conditions (docs/design/conditions.md): a task's `when` and
-- `trigger` as written, and whether either makes it conditional (for the
-- start: a conditional task waits on one hold beyond its dependencies,
-- which the scheduler lowers once it has decided it); the `skip` and
-- `fail_condition` edges join the history's names. The `skipped` state
-- itself needs `task_run` rebuilt, which the next migration does. The same
-- columns and constraints as on PostgreSQL.

ALTER TABLE task ADD COLUMN when_expr TEXT;
ALTER TABLE task ADD COLUMN trigger_rule TEXT
    CONSTRAINT task_trigger_rule_valid CHECK (trigger_rule IN ('all_succeeded', 'none_failed', 'all_done'));
ALTER TABLE task ADD COLUMN conditional INTEGER NOT NULL DEFAULT 0
    CONSTRAINT task_conditional_bool CHECK (conditional IN (0, 1));

-- SQLite cannot change a CHECK constraint in place: the event table is
-- rebuilt (same columns, ids and numbers), with its indexes and trigger.
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
    seq           INTEGER,
    generation    INTEGER NOT NULL DEFAULT 1,
    CONSTRAINT taskrunevent_transition_valid CHECK (transition IN (
        'dependencies_satisfied', 'cancel_pending', 'claim', 'cancel_ready', 'succeed', 'fail',
        'cancel_running', 'reap_lease', 'reap_lease_final', 'schedule_retry', 'retry_ready',
        'cancel_retrying', 'stale_write_rejected', 'reset', 'skip', 'fail_condition')),
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

-- Each new event takes the run's next number and its current generation.
CREATE TRIGGER taskrunevent_seq AFTER INSERT ON task_run_event FOR EACH ROW BEGIN
    INSERT INTO run_event_seq (run_id, seq) VALUES (NEW.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET seq = seq + 1;
    UPDATE task_run_event
        SET (seq, generation) = (SELECT s.seq, s.generation FROM run_event_seq AS s WHERE s.run_id = NEW.run_id)
        WHERE id = NEW.id;
END;
