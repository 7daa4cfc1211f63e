-- An operator's retry of a finished run (docs/design/retry.md): the run
-- keeps its id and opens its next generation; the tasks of the retry set
-- take the `reset` edge. Every row and event says which generation it
-- belongs to, so the history keeps every attempt of every generation.
-- The same columns and constraints as on PostgreSQL.

-- The run's current generation; `resume` adds one.
ALTER TABLE workflow_run ADD COLUMN generation INTEGER NOT NULL DEFAULT 1
    CONSTRAINT workflowrun_generation_positive CHECK (generation >= 1);

-- The generation a task run was last reset in, and how many attempts it
-- had made before it: `max_attempts` counts `attempt - attempt_base`. An
-- attempt below 1 is taskrun_attempt_positive's to refuse, so that a bad row
-- is reported under the one constraint it breaks.
ALTER TABLE task_run ADD COLUMN generation INTEGER NOT NULL DEFAULT 1
    CONSTRAINT taskrun_generation_positive CHECK (generation >= 1);
ALTER TABLE task_run ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0
    CONSTRAINT taskrun_prior_attempts_below_attempt CHECK (attempt_base >= 0 AND (attempt_base < attempt OR attempt < 1));

-- Each event is stamped with its run's generation by the trigger that
-- numbers it, from the run's counter row: no event writer names it, and a
-- `resume` moves the counter row's generation before writing its own event.
ALTER TABLE run_event_seq ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;

-- The retry edges join the histories' names. SQLite cannot change a CHECK
-- constraint in place, so both event tables are rebuilt (same columns, ids
-- and numbers, plus the generation), with their indexes and triggers.
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
        'cancel_retrying', 'stale_write_rejected', 'reset')),
    -- An audit event records no state change; a transition records both ends.
    CONSTRAINT taskrunevent_states_iff_transition
        CHECK ((transition = 'stale_write_rejected') = (from_state IS NULL AND to_state IS NULL))
) STRICT;
INSERT INTO task_run_event_next
    (id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt, fencing_token, worker, at, error, seq)
SELECT id, task_run_id, run_id, task_key, transition, from_state, to_state, attempt, fencing_token, worker, at, error, seq
FROM task_run_event;
DROP TABLE task_run_event;
ALTER TABLE task_run_event_next RENAME TO task_run_event;

CREATE TABLE workflow_run_event_next (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES workflow_run (id),
    transition TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    at         INTEGER NOT NULL,
    seq        INTEGER,
    generation INTEGER NOT NULL DEFAULT 1,
    CONSTRAINT workflowrunevent_transition_valid
        CHECK (transition IN ('start', 'cancel_before_start', 'succeed', 'fail', 'cancel', 'resume'))
) STRICT;
INSERT INTO workflow_run_event_next (id, run_id, transition, from_state, to_state, at, seq)
SELECT id, run_id, transition, from_state, to_state, at, seq FROM workflow_run_event;
DROP TABLE workflow_run_event;
ALTER TABLE workflow_run_event_next RENAME TO workflow_run_event;

-- The indexes the old tables had (get_run, run_events; the stale-write audit).
CREATE UNIQUE INDEX taskrunevent_run_seq_idx ON task_run_event (run_id, seq);
CREATE UNIQUE INDEX workflowrunevent_run_seq_idx ON workflow_run_event (run_id, seq);
CREATE INDEX taskrunevent_stale_idx ON task_run_event (task_run_id) WHERE transition = 'stale_write_rejected';

-- Each new event takes the run's next number and its current generation.
CREATE TRIGGER taskrunevent_seq AFTER INSERT ON task_run_event FOR EACH ROW BEGIN
    INSERT INTO run_event_seq (run_id, seq) VALUES (NEW.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET seq = seq + 1;
    UPDATE task_run_event
        SET (seq, generation) = (SELECT s.seq, s.generation FROM run_event_seq AS s WHERE s.run_id = NEW.run_id)
        WHERE id = NEW.id;
END;
CREATE TRIGGER workflowrunevent_seq AFTER INSERT ON workflow_run_event FOR EACH ROW BEGIN
    INSERT INTO run_event_seq (run_id, seq) VALUES (NEW.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET seq = seq + 1;
    UPDATE workflow_run_event
        SET (seq, generation) = (SELECT s.seq, s.generation FROM run_event_seq AS s WHERE s.run_id = NEW.run_id)
        WHERE id = NEW.id;
END;
