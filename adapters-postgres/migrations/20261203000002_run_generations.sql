-- An operator's retry of a finished run (docs/design/retry.md): the run
-- keeps its id and opens its next generation; the tasks of the retry set
-- take the `reset` edge. Every row and event says which generation it
-- belongs to, so the history keeps every attempt of every generation.

-- The run's current generation; `resume` adds one.
ALTER TABLE workflow_run ADD COLUMN generation INTEGER NOT NULL DEFAULT 1,
    ADD CONSTRAINT workflowrun_generation_positive CHECK (generation >= 1);

-- The generation a task run was last reset in, and how many attempts it
-- had made before it: `max_attempts` counts `attempt - attempt_base`. An
-- attempt below 1 is taskrun_attempt_positive's to refuse, so that a bad row
-- is reported under the one constraint it breaks.
ALTER TABLE task_run ADD COLUMN generation INTEGER NOT NULL DEFAULT 1,
    ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0,
    ADD CONSTRAINT taskrun_generation_positive CHECK (generation >= 1),
    ADD CONSTRAINT taskrun_prior_attempts_below_attempt CHECK (attempt_base >= 0 AND (attempt_base < attempt OR attempt < 1));

-- Each event is stamped with its run's generation by the trigger that
-- numbers it, from the run's counter row: no event writer names it, and a
-- `resume` moves the counter row's generation before writing its own event.
ALTER TABLE run_event_seq ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
ALTER TABLE task_run_event ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
ALTER TABLE workflow_run_event ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;

CREATE OR REPLACE FUNCTION next_run_event_seq() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_event_seq AS s (run_id, seq) VALUES (NEW.run_id, 1)
    ON CONFLICT (run_id) DO UPDATE SET seq = s.seq + 1
    RETURNING s.seq, s.generation INTO NEW.seq, NEW.generation;
    RETURN NEW;
END
$$;

-- The retry edges join the histories' names.
ALTER TABLE task_run_event DROP CONSTRAINT taskrunevent_transition_valid,
    ADD CONSTRAINT taskrunevent_transition_valid CHECK (transition IN (
        'dependencies_satisfied', 'cancel_pending', 'claim', 'cancel_ready', 'succeed', 'fail',
        'cancel_running', 'reap_lease', 'reap_lease_final', 'schedule_retry', 'retry_ready',
        'cancel_retrying', 'stale_write_rejected', 'reset'));
ALTER TABLE workflow_run_event DROP CONSTRAINT workflowrunevent_transition_valid,
    ADD CONSTRAINT workflowrunevent_transition_valid
        CHECK (transition IN ('start', 'cancel_before_start', 'succeed', 'fail', 'cancel', 'resume'));
