//! The outbox sweep's statements.

/// begin_sweep: unpublished rows, oldest first (`outbox_unpublished_idx`).
pub(crate) const SWEEP: &str = "SELECT id, task_run_id, run_id, task_key, task_type, fencing_token, created_at FROM outbox \
             WHERE published_at IS NULL AND (?1 IS NULL OR run_id IN (SELECT value FROM json_each(?1))) \
             AND id NOT IN (SELECT value FROM json_each(?2)) ORDER BY id LIMIT ?3";

/// sweep commit: the marks, in one call. `?2` the rows.
pub(crate) const MARK_PUBLISHED: &str = concat!(
    "BEGIN IMMEDIATE; UPDATE outbox SET published_at = ",
    now!(),
    " WHERE id IN (SELECT value FROM json_each(?2)) AND published_at IS NULL; COMMIT"
);
