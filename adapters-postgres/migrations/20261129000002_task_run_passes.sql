-- Room on every task_run page for the new version of a row updated in
-- place: a join task's dependency counter is lowered once per scheduler
-- pass (thousands of times for a wide fan-in), and with full pages each
-- lowering was a non-HOT update adding an entry to every index, which the
-- next lowering's lookup then had to step over. With free space those
-- updates stay on their page (HOT) and touch no index. Applies to pages
-- written from now on.
ALTER TABLE task_run SET (fillfactor = 70);

-- A pending row waits on at least one dependency: the statement that
-- lowers a counter to zero moves the row to ready in the same UPDATE, and
-- a run starts its dependency-free tasks ready. So no pass has to look for
-- pending rows at zero, a scan over every waiting row of the run.
ALTER TABLE task_run ADD CONSTRAINT taskrun_pending_waits_on_deps CHECK (state <> 'pending' OR pending_deps > 0);
