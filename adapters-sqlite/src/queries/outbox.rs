//! The outbox sweep's statements.

/// begin_sweep: the first `?3` unpublished rows in dispatch order
/// (docs/design/priorities.md): ready time minus priority × `?4`
/// milliseconds of aging, then id. The embedded engine publishes every row
/// as it is written, so the pending set a sweep sorts is small; its queue
/// orders them again by the same key. A row still held for its committer
/// (docs/design/outbox-and-queues.md#publish-after-commit) is passed over:
/// `?5` is the clock offset.
pub(crate) const SWEEP: &str = concat!(
    "SELECT id, task_run_id, run_id, task_key, task_type, fencing_token, created_at, \
             priority FROM outbox \
             WHERE published_at IS NULL AND (?1 IS NULL OR run_id IN (SELECT value FROM json_each(?1))) \
             AND id NOT IN (SELECT value FROM json_each(?2)) \
             AND (sweep_after IS NULL OR sweep_after <= CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + ?5) \
             ORDER BY created_at - priority * ?4, id",
    limit!("?3")
);

/// sweep commit: the marks, in one call. `?2` the rows.
pub(crate) const MARK_PUBLISHED: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE outbox SET published_at = ",
    now!(),
    " WHERE id IN (SELECT value FROM json_each(?2)) AND published_at IS NULL; COMMIT"
);

/// rearm_lost_dispatches: unpublishes the rows of `?2`'s runs (NULL: every
/// run) published at least `?3` milliseconds ago whose task run is still
/// ready at the row's token, found from the ready task runs
/// (`taskrun_ready_idx`, named as for `READY_OF_TYPES`, then the outbox's
/// unique (task run, token) index)
/// rather than by scanning published rows.
pub(crate) const REARM_LOST: &str = concat!(
    "UPDATE outbox SET published_at = NULL \
     WHERE (task_run_id, fencing_token) IN ( \
         SELECT id, fencing_token FROM task_run INDEXED BY taskrun_ready_idx \
         WHERE state = 'ready' AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2)))) \
       AND published_at <= ",
    now!(),
    " - ?3 RETURNING id"
);

/// settle_held in one call: marks the held rows `?2` published and
/// releases the held rows `?3` to the sweep
/// (docs/design/outbox-and-queues.md#publish-after-commit), returning the
/// released ones.
pub(crate) const SETTLE_HELD: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE outbox SET published_at = ",
    now!(),
    " WHERE id IN (SELECT value FROM json_each(?2)) AND published_at IS NULL; \
     UPDATE outbox SET sweep_after = NULL \
     WHERE id IN (SELECT value FROM json_each(?3)) AND published_at IS NULL AND sweep_after IS NOT NULL \
     RETURNING id; COMMIT"
);

/// held_for: milliseconds of store time until the first row of `?2`'s
/// runs (NULL: every run) held for its committer and not yet published is
/// released, negative when it already is (`outbox_held_idx`); NULL when
/// there is none.
pub(crate) const HELD_FOR: &str = concat!(
    "SELECT min(sweep_after) - ",
    now!(),
    " FROM outbox WHERE published_at IS NULL AND sweep_after IS NOT NULL \
     AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2)))"
);
