-- Schedules and the outcome of each of their fire times
-- (docs/design/schedules.md#the-store).

-- An identity column is never reused, so the runs that name a deleted
-- schedule (workflow_run.schedule_id) never change owner.
CREATE TABLE schedule (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                TEXT NOT NULL UNIQUE,
    workflow            TEXT NOT NULL,
    version             INTEGER,
    cron                TEXT NOT NULL,
    timezone            TEXT NOT NULL,
    input               JSONB NOT NULL,
    overlap             TEXT NOT NULL,
    catchup_window_ms   BIGINT NOT NULL,
    paused              BOOLEAN NOT NULL DEFAULT false,
    -- The last fire time handled: the next fire is the first after it.
    cursor              TIMESTAMPTZ NOT NULL,
    -- The fire time waiting for the active run to end (buffer_one).
    buffered_at         TIMESTAMPTZ,
    created_at          TIMESTAMPTZ NOT NULL,
    started             BIGINT NOT NULL DEFAULT 0,
    skipped_overlap     BIGINT NOT NULL DEFAULT 0,
    buffered            BIGINT NOT NULL DEFAULT 0,
    missed              BIGINT NOT NULL DEFAULT 0,
    CONSTRAINT schedule_overlap_known CHECK (overlap IN ('skip', 'buffer_one', 'allow', 'cancel_previous')),
    CONSTRAINT schedule_version_positive CHECK (version IS NULL OR version >= 1),
    CONSTRAINT schedule_window_positive CHECK (catchup_window_ms > 0)
);

-- Each fire time's one outcome: the primary key is the (schedule, fire
-- time) key that makes any number of schedulers fire each time once.
CREATE TABLE schedule_fire (
    schedule_id BIGINT NOT NULL REFERENCES schedule (id) ON DELETE CASCADE,
    fire_time   TIMESTAMPTZ NOT NULL,
    outcome     TEXT NOT NULL,
    run_id      UUID,
    backfill    BOOLEAN NOT NULL DEFAULT false,
    recorded_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (schedule_id, fire_time),
    CONSTRAINT schedulefire_outcome_known CHECK (outcome IN ('started', 'skipped_overlap', 'buffered', 'missed')),
    CONSTRAINT schedulefire_started_has_run CHECK (outcome <> 'started' OR run_id IS NOT NULL)
);

-- The schedule whose fire started a run. No foreign key: a schedule's
-- deletion leaves its runs as they are, and the check would lock the
-- schedule row on every run write.
ALTER TABLE workflow_run ADD COLUMN schedule_id BIGINT;

-- A fire asks whether a run of its schedule is active: only active runs
-- are indexed, so the answer costs what is running, not the history.
CREATE INDEX workflowrun_schedule_active_idx ON workflow_run (schedule_id)
    WHERE schedule_id IS NOT NULL AND state IN ('pending', 'running');
