//! The schedule store's statements (docs/design/schedules.md#the-store).
//! A fire is one transaction: the schedule row is locked first, then read
//! again with the state of its runs, so the decision sees every write of
//! the fire that held the lock before it.

/// A schedule's columns, as `ScheduleRow` reads them.
macro_rules! schedule_columns {
    () => {
        "id, name, workflow, version, cron, timezone, input, overlap, catchup_window_ms, paused, cursor, \
         buffered_at, created_at, started, skipped_overlap, buffered, missed"
    };
}

/// create_schedule; its cursor and creation time are store now. `$2` name
/// … `$9` catch-up window in ms. No row: the name is taken.
pub const CREATE_SCHEDULE: &str = concat!(
    "INSERT INTO schedule (name, workflow, version, cron, timezone, input, overlap, catchup_window_ms, cursor, \
     created_at) VALUES ($2, $3, $4, $5, $6, $7, $8, $9, ",
    now!(),
    ", ",
    now!(),
    ") ON CONFLICT (name) DO NOTHING RETURNING ",
    schedule_columns!()
);

/// list_schedules.
pub const LIST_SCHEDULES: &str = concat!("SELECT ", schedule_columns!(), " FROM schedule ORDER BY name");

/// get_schedule. `$1` name.
pub const GET_SCHEDULE: &str = concat!("SELECT ", schedule_columns!(), " FROM schedule WHERE name = $1");

/// set_schedule_paused. `$2` name, `$3` paused; a resume moves the cursor
/// to store now, so the pause's fire times are neither fired nor missed.
pub const SET_SCHEDULE_PAUSED: &str = concat!(
    "UPDATE schedule SET cursor = CASE WHEN paused AND NOT $3 THEN greatest(cursor, ",
    now!(),
    ") ELSE cursor END, paused = $3 WHERE name = $2 RETURNING ",
    schedule_columns!()
);

/// delete_schedule (its fires go with it: ON DELETE CASCADE). `$1` name.
pub const DELETE_SCHEDULE: &str = "DELETE FROM schedule WHERE name = $1 RETURNING id";

/// store_now.
pub const STORE_NOW: &str = concat!("SELECT ", now!());

/// A fire's lock on schedule `$1`, and what the decision needs of it.
pub const LOCK_SCHEDULE: &str = "SELECT paused, cursor, overlap, buffered_at FROM schedule WHERE id = $1 FOR UPDATE";

/// Whether a run of schedule `$1` is pending or running
/// (`workflowrun_schedule_active_idx`), read after the lock so that it
/// sees the runs of the fire that held it before.
pub const SCHEDULE_ACTIVE: &str = "SELECT EXISTS (SELECT 1 FROM workflow_run WHERE schedule_id = $1 \
     AND state IN ('pending', 'running'))";

/// fire_schedule: the missed fire times `$3` of schedule `$2`, each unless
/// already recorded; returns how many were recorded.
pub const FIRE_MISSED: &str = concat!(
    "WITH recorded AS (
    INSERT INTO schedule_fire (schedule_id, fire_time, outcome, recorded_at)
    SELECT $2, t, 'missed', ",
    now!(),
    " FROM unnest($3::timestamptz[]) AS t
    ON CONFLICT DO NOTHING RETURNING 1
)
SELECT count(*) FROM recorded"
);

/// fire_schedule, `cancel_previous`: the cancel requests of schedule `$2`'s
/// active runs, as request_cancel writes them, each run row locked `FOR
/// UPDATE` first (in id order) so a finish handing on in it is serialized
/// with the request (docs/design/scheduler.md#handoff); a row per run.
pub const FIRE_CANCEL_ACTIVE: &str = concat!(
    "WITH locked AS (
    SELECT id FROM workflow_run
    WHERE schedule_id = $2 AND state IN ('pending', 'running') AND cancel_requested_at IS NULL
    ORDER BY id
    FOR UPDATE
)
UPDATE workflow_run SET cancel_requested_at = ",
    now!(),
    ", needs_pass = true WHERE id IN (SELECT id FROM locked) AND state IN ('pending', 'running') \
     AND cancel_requested_at IS NULL RETURNING id"
);

/// fire_schedule when nothing starts: the due fire `$4` (NULL: none) with
/// outcome `$5`, the cursor moved to `$3`, `$6` missed times counted.
pub const FIRE_HELD: &str = concat!(
    "WITH fired AS (
    INSERT INTO schedule_fire (schedule_id, fire_time, outcome, recorded_at)
    SELECT $2, $4::timestamptz, $5::text, ",
    now!(),
    " WHERE $4::timestamptz IS NOT NULL
)
UPDATE schedule SET cursor = $3, missed = missed + $6,
       skipped_overlap = skipped_overlap + CASE WHEN $5::text = 'skipped_overlap' THEN 1 ELSE 0 END,
       buffered = buffered + CASE WHEN $5::text = 'buffered' THEN 1 ELSE 0 END,
       buffered_at = CASE WHEN $5::text = 'buffered' THEN $4::timestamptz ELSE buffered_at END
WHERE id = $2"
);

/// A fire's run, recorded before the run is created in the same
/// transaction: fire `$3` of schedule `$2` `started` run `$4`, by a
/// backfill when `$5` (which leaves the cursor where it is, and records
/// nothing after it), `$6` missed times counted. No row: the fire time is
/// already recorded, or a backfill's is after the cursor.
pub const FIRE_STARTED: &str = concat!(
    "WITH fired AS (
    INSERT INTO schedule_fire (schedule_id, fire_time, outcome, run_id, backfill, recorded_at)
    SELECT $2, $3, 'started', $4, $5, ",
    now!(),
    "
    WHERE NOT $5 OR $3 <= (SELECT cursor FROM schedule WHERE id = $2)
    ON CONFLICT DO NOTHING RETURNING 1
)
UPDATE schedule SET started = started + 1, cursor = CASE WHEN $5 THEN cursor ELSE $3 END, missed = missed + $6
WHERE id = $2 AND EXISTS (SELECT 1 FROM fired) RETURNING id"
);

/// The run `$2` marked as schedule `$1`'s, once created.
pub const MARK_SCHEDULED_RUN: &str = "UPDATE workflow_run SET schedule_id = $1 WHERE id = $2";

/// start_buffered's lock on schedule `$1`.
pub const LOCK_BUFFERED: &str = "SELECT paused, buffered_at FROM schedule WHERE id = $1 FOR UPDATE";

/// start_buffered: the waiting fire `$2` of schedule `$1` names run `$3`;
/// the buffer empties.
pub const BUFFERED_STARTED: &str = "WITH named AS (
    UPDATE schedule_fire SET run_id = $3 WHERE schedule_id = $1 AND fire_time = $2
)
UPDATE schedule SET buffered_at = NULL WHERE id = $1";

/// schedule_fires. `$1` schedule, `$2` from, `$3` to, `$4` limit.
pub const SCHEDULE_FIRES: &str = "SELECT fire_time, outcome, run_id, backfill FROM schedule_fire \
     WHERE schedule_id = $1 AND fire_time BETWEEN $2 AND $3 ORDER BY fire_time LIMIT $4";
