//! The outbox sweep's statements.

/// begin_sweep: up to `$1` unpublished rows, oldest first, locked in a CTE
/// with `FOR UPDATE SKIP LOCKED` so a concurrent sweeper takes others
/// (`outbox_unpublished_idx`). `$2` run (NULL: every run).
pub const SWEEP: &str = "\
WITH picked AS (
    SELECT id FROM outbox
    WHERE published_at IS NULL AND ($2::uuid[] IS NULL OR run_id = ANY($2))
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
SELECT o.id, o.task_run_id, o.run_id, o.task_key, o.task_type, o.fencing_token, o.created_at
FROM outbox AS o JOIN picked USING (id)
ORDER BY o.id";

/// mark_published: within the sweep's transaction. `$1` offset, `$2` ids.
pub const MARK_PUBLISHED: &str = concat!(
    "UPDATE outbox SET published_at = ",
    now!(),
    " WHERE id = ANY($2) AND published_at IS NULL"
);
