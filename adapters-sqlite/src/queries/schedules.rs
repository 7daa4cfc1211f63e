//! The schedule store's statements (docs/design/schedules.md#the-store).
//! A fire is several calls in one transaction: the first takes the write
//! lock and reads the schedule, the store decides in Rust, the last
//! writes and commits.

/// A schedule's columns, as `ScheduleRow` reads them.
macro_rules! schedule_columns {
    () => {
        "id, name, workflow, version, cron, timezone, input, overlap, catchup_window_ms, paused, cursor, \
         buffered_at, created_at, started, skipped_overlap, buffered, missed"
    };
}

/// Whether a run of schedule `?2` is pending or running
/// (`workflowrun_schedule_active_idx`).
macro_rules! schedule_active {
    () => {
        "EXISTS (SELECT 1 FROM workflow_run WHERE schedule_id = ?2 AND state IN ('pending', 'running'))"
    };
}

/// create_schedule in one call; its cursor and creation time are store
/// now. `?2` name … `?9` catch-up window in ms. A taken name breaks the
/// UNIQUE constraint, which fails the call.
pub(crate) const CREATE_SCHEDULE: &str = concat!(
    "BEGIN IMMEDIATE; \
     INSERT INTO schedule (name, workflow, version, cron, timezone, input, overlap, catchup_window_ms, cursor, \
     created_at) VALUES (?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ",
    now!(),
    ", ",
    now!(),
    ") RETURNING ",
    schedule_columns!(),
    "; COMMIT"
);

/// list_schedules.
pub(crate) const LIST_SCHEDULES: &str = concat!("SELECT ", schedule_columns!(), " FROM schedule ORDER BY name");

/// get_schedule. `?1` name.
pub(crate) const GET_SCHEDULE: &str = concat!("SELECT ", schedule_columns!(), " FROM schedule WHERE name = ?1");

/// set_schedule_paused in one call. `?2` name, `?3` paused; a resume moves
/// the cursor to store now, so the pause's fire times are neither fired
/// nor missed.
pub(crate) const SET_SCHEDULE_PAUSED: &str = concat!(
    "BEGIN IMMEDIATE; \
     UPDATE schedule SET cursor = CASE WHEN paused = 1 AND ?3 = 0 THEN max(cursor, ",
    now!(),
    ") ELSE cursor END, paused = ?3 WHERE name = ?2 RETURNING ",
    schedule_columns!(),
    "; COMMIT"
);

/// delete_schedule in one call. `?2` name.
pub(crate) const DELETE_SCHEDULE: &str = "BEGIN IMMEDIATE; \
     DELETE FROM schedule_fire WHERE schedule_id = (SELECT id FROM schedule WHERE name = ?2); \
     DELETE FROM schedule WHERE name = ?2 RETURNING id; COMMIT";

/// store_now.
pub(crate) const STORE_NOW: &str = concat!("SELECT ", now!());

/// fire_schedule's first call: the write lock, and what the decision needs
/// of schedule `?2`.
pub(crate) const FIRE_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE; SELECT paused, cursor, overlap, buffered_at, ",
    schedule_active!(),
    " FROM schedule WHERE id = ?2"
);

/// fire_schedule: the missed fire times `?3` (a JSON array) of schedule
/// `?2`, each unless already recorded; returns a row per time recorded.
pub(crate) const FIRE_MISSED: &str = concat!(
    "INSERT INTO schedule_fire (schedule_id, fire_time, outcome, recorded_at) SELECT ?2, j.value, 'missed', ",
    now!(),
    " FROM json_each(?3) AS j WHERE true ON CONFLICT DO NOTHING RETURNING fire_time"
);

/// fire_schedule, `cancel_previous`: the cancel requests of schedule `?2`'s
/// active runs, as request_cancel writes them; a row per run.
pub(crate) const FIRE_CANCEL_ACTIVE: &str = concat!(
    "UPDATE workflow_run SET cancel_requested_at = ",
    now!(),
    ", needs_pass = 1 WHERE schedule_id = ?2 AND state IN ('pending', 'running') \
     AND cancel_requested_at IS NULL RETURNING id"
);

/// fire_schedule's last call when nothing starts: the due fire `?4` (NULL:
/// none) with outcome `?5`, the cursor moved to `?3`, `?6` missed times
/// counted.
pub(crate) const FIRE_HELD: &str = concat!(
    "INSERT INTO schedule_fire (schedule_id, fire_time, outcome, recorded_at) SELECT ?2, ?4, ?5, ",
    now!(),
    " WHERE ?4 IS NOT NULL; \
     UPDATE schedule SET cursor = ?3, missed = missed + ?6, \
     skipped_overlap = skipped_overlap + (?5 IS 'skipped_overlap'), buffered = buffered + (?5 IS 'buffered'), \
     buffered_at = CASE WHEN ?5 IS 'buffered' THEN ?4 ELSE buffered_at END WHERE id = ?2; COMMIT"
);

/// fire_schedule when the fire starts its run, before the start: fire
/// `?3` of schedule `?2` recorded `started` by run `?4`, the cursor moved
/// to it, `?5` missed times counted.
pub(crate) const FIRE_STARTED: &str = concat!(
    "INSERT INTO schedule_fire (schedule_id, fire_time, outcome, run_id, recorded_at) VALUES (?2, ?3, 'started', ?4, ",
    now!(),
    "); UPDATE schedule SET cursor = ?3, missed = missed + ?5, started = started + 1 WHERE id = ?2"
);

/// The last call of a fire that starts a run (at the fire, from the
/// buffer, or by a backfill): start_run's writes (`?1` to `?7`), the run
/// marked as schedule `?8`'s.
pub(crate) const SCHEDULED_START: &str = concat!(
    start_writes!("UPDATE workflow_run SET schedule_id = ?8 WHERE id = ?2; ",),
    "COMMIT"
);

/// start_buffered's first call: the write lock, and schedule `?2`'s pause,
/// waiting fire and activity.
pub(crate) const BUFFERED_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE; SELECT paused, buffered_at, ",
    schedule_active!(),
    " FROM schedule WHERE id = ?2"
);

/// start_buffered, before the start: the waiting fire `?3` of schedule
/// `?2` names run `?4`; the buffer empties.
pub(crate) const BUFFERED_STARTED: &str = "UPDATE schedule_fire SET run_id = ?4 WHERE schedule_id = ?2 AND fire_time = ?3; \
     UPDATE schedule SET buffered_at = NULL WHERE id = ?2";

/// backfill_fire's first call: the write lock, and fire `?3` of schedule
/// `?2` recorded `started` by run `?4` as a backfill unless the fire time
/// already has an outcome or is after the cursor (then no row, and
/// nothing counted).
pub(crate) const BACKFILL_BEGIN: &str = concat!(
    "BEGIN IMMEDIATE; \
     INSERT INTO schedule_fire (schedule_id, fire_time, outcome, run_id, backfill, recorded_at) \
     SELECT ?2, ?3, 'started', ?4, 1, ",
    now!(),
    " WHERE ?3 <= (SELECT cursor FROM schedule WHERE id = ?2) ON CONFLICT DO NOTHING RETURNING fire_time; \
     UPDATE schedule SET started = started + changes() WHERE id = ?2"
);

/// schedule_fires. `?1` schedule, `?2` from, `?3` to (ms), `?4` limit.
pub(crate) const SCHEDULE_FIRES: &str = concat!(
    "SELECT fire_time, outcome, run_id, backfill FROM schedule_fire \
     WHERE schedule_id = ?1 AND fire_time BETWEEN ?2 AND ?3 ORDER BY fire_time",
    limit!("?4")
);
