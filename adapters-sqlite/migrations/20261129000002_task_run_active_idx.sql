-- A pass's per-run queries over active rows: promotion, cancellation, and
-- activity (is anything still moving?), so a pass never walks finished rows.
-- Unlike PostgreSQL's it carries pending_deps: a pass promotes the pending
-- rows at zero by an index search instead of visiting every pending row of
-- the run (a long chain's), three times per pass (event, dispatch, UPDATE).
-- It replaces taskrun_waiting_idx, which left running rows out.
DROP INDEX taskrun_waiting_idx;
CREATE INDEX taskrun_active_idx ON task_run (run_id, state, pending_deps)
    WHERE state IN ('pending', 'ready', 'running', 'retrying');
