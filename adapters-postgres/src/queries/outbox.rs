//! The outbox sweep's statements.

/// begin_sweep: the first `$1` unpublished rows in dispatch order
/// (docs/design/priorities.md) that no concurrent sweeper holds. The
/// candidates are the oldest `$1` unheld rows of each priority (ten range
/// scans of `outbox_pending_order_idx`, each locking what it reads with
/// `FOR UPDATE SKIP LOCKED`; a row still held for its committer,
/// docs/design/outbox-and-queues.md#publish-after-commit, is passed over),
/// merged by order key: ready time minus
/// priority × `$3` microseconds of aging, then id. A candidate not taken
/// stays locked until the sweep ends, so a concurrent sweeper takes the
/// next rows instead: the sweeps still never share one. `$2` runs (NULL:
/// every run); `$4` the clock offset.
pub const SWEEP: &str = "\
WITH candidate AS (
    SELECT o.id, o.created_at - (p.priority * $3::float8) * interval '1 microsecond' AS rank_at
    FROM generate_series(0, 9) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT id, created_at FROM outbox
        WHERE published_at IS NULL AND priority = p.priority AND ($2::uuid[] IS NULL OR run_id = ANY($2))
          AND (sweep_after IS NULL OR sweep_after <= statement_timestamp() + $4::interval)
        ORDER BY created_at, id
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    ) AS o
), picked AS (
    SELECT id, rank_at FROM candidate ORDER BY rank_at, id LIMIT $1
)
SELECT o.id, o.task_run_id, o.run_id, o.task_key, o.task_type, o.fencing_token, o.created_at, o.priority
FROM outbox AS o JOIN picked USING (id)
ORDER BY picked.rank_at, o.id";

/// mark_published: within the sweep's transaction. `$1` offset, `$2` ids.
pub const MARK_PUBLISHED: &str = concat!(
    "UPDATE outbox SET published_at = ",
    now!(),
    " WHERE id = ANY($2) AND published_at IS NULL"
);

/// rearm_lost_dispatches: unpublishes the rows of `$2`'s runs (NULL: every
/// run) published at least `$3` microseconds ago whose task run is still
/// ready at the row's token, found from the ready task runs
/// (`taskrun_ready_idx`, then the outbox's unique (task run, token) index)
/// rather than by scanning published rows.
pub const REARM_LOST: &str = concat!(
    "UPDATE outbox AS o SET published_at = NULL
FROM task_run AS tr
WHERE tr.state = 'ready' AND ($2::uuid[] IS NULL OR tr.run_id = ANY($2))
  AND o.task_run_id = tr.id AND o.fencing_token = tr.fencing_token
  AND o.published_at <= ",
    now!(),
    " - $3::float8 * interval '1 microsecond'"
);

/// settle_held: marks the held rows `$2` published and releases the held
/// rows `$3` to the sweep (docs/design/outbox-and-queues.md#publish-after-commit);
/// returns whether it released any. `$1` offset.
pub const SETTLE_HELD: &str = concat!(
    "WITH published AS (
    UPDATE outbox SET published_at = ",
    now!(),
    " WHERE id = ANY($2) AND published_at IS NULL
    RETURNING id
), released AS (
    UPDATE outbox SET sweep_after = NULL WHERE id = ANY($3) AND published_at IS NULL AND sweep_after IS NOT NULL
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM released)"
);

/// held_for: microseconds of store time until the first row of `$2`'s runs
/// (NULL: every run) held for its committer and not yet published is
/// released, negative when it already is (`outbox_held_idx`); NULL when
/// there is none. `$1` offset.
pub const HELD_FOR: &str = concat!(
    "SELECT (EXTRACT(EPOCH FROM (min(sweep_after) - ",
    now!(),
    ")) * 1000000)::float8
FROM outbox
WHERE published_at IS NULL AND sweep_after IS NOT NULL AND ($2::uuid[] IS NULL OR run_id = ANY($2))"
);
