-- Schedules and the outcome of each of their fire times
-- (docs/design/schedules.md#the-store). Times are milliseconds since the
-- epoch, UTC, as everywhere in this store.

-- AUTOINCREMENT: a deleted schedule's id is never given to a new one, so
-- the runs that name it (workflow_run.schedule_id) never change owner.
CREATE TABLE schedule (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    name                TEXT NOT NULL UNIQUE,
    workflow            TEXT NOT NULL,
    version             INTEGER,
    cron                TEXT NOT NULL,
    timezone            TEXT NOT NULL,
    input               TEXT NOT NULL,
    overlap             TEXT NOT NULL,
    catchup_window_ms   INTEGER NOT NULL,
    paused              INTEGER NOT NULL DEFAULT 0,
    -- The last fire time handled: the next fire is the first after it.
    cursor              INTEGER NOT NULL,
    -- The fire time waiting for the active run to end (buffer_one).
    buffered_at         INTEGER,
    created_at          INTEGER NOT NULL,
    started             INTEGER NOT NULL DEFAULT 0,
    skipped_overlap     INTEGER NOT NULL DEFAULT 0,
    buffered            INTEGER NOT NULL DEFAULT 0,
    missed              INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT schedule_overlap_known CHECK (overlap IN ('skip', 'buffer_one', 'allow', 'cancel_previous')),
    CONSTRAINT schedule_version_positive CHECK (version IS NULL OR version >= 1),
    CONSTRAINT schedule_window_positive CHECK (catchup_window_ms > 0),
    CONSTRAINT schedule_paused_bool CHECK (paused IN (0, 1))
) STRICT;

-- Each fire time's one outcome: the primary key is the (schedule, fire
-- time) key that makes any number of schedulers fire each time once.
CREATE TABLE schedule_fire (
    schedule_id INTEGER NOT NULL REFERENCES schedule (id) ON DELETE CASCADE,
    fire_time   INTEGER NOT NULL,
    outcome     TEXT NOT NULL,
    run_id      TEXT,
    backfill    INTEGER NOT NULL DEFAULT 0,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (schedule_id, fire_time),
    CONSTRAINT schedulefire_outcome_known CHECK (outcome IN ('started', 'skipped_overlap', 'buffered', 'missed')),
    CONSTRAINT schedulefire_started_has_run CHECK (outcome <> 'started' OR run_id IS NOT NULL),
    CONSTRAINT schedulefire_backfill_bool CHECK (backfill IN (0, 1))
) STRICT, WITHOUT ROWID;

-- The schedule whose fire started a run. No foreign key: a schedule's
-- deletion leaves its runs as they are.
ALTER TABLE workflow_run ADD COLUMN schedule_id INTEGER;

-- A fire asks whether a run of its schedule is active: only active runs
-- are indexed, so the answer costs what is running, not the history.
CREATE INDEX workflowrun_schedule_active_idx ON workflow_run (schedule_id)
    WHERE schedule_id IS NOT NULL AND state IN ('pending', 'running');
