-- What an HTTP API server reads and writes: a per-run event sequence, keyed
-- run starts, run pages, and API tokens (docs/design/data-model.md#tables).

-- The last event number of each run. A table of its own, not a column of
-- workflow_run: every event write locks its run's counter row until commit,
-- and the scheduler locks run rows FOR UPDATE SKIP LOCKED, so a counter on
-- the run row would make passes skip (or wait for) every run a worker is
-- finishing a task of. No foreign key either, for the same reason: its
-- check would take a KEY SHARE lock on the run row.
CREATE TABLE run_event_seq (
    run_id UUID PRIMARY KEY,
    seq    BIGINT NOT NULL,
    CONSTRAINT runeventseq_seq_positive CHECK (seq >= 1)
);

-- Every event's place in its run's history
-- (docs/design/state-machines.md#event-history).
ALTER TABLE task_run_event ADD COLUMN seq BIGINT;
ALTER TABLE workflow_run_event ADD COLUMN seq BIGINT;

-- The history so far, numbered in the order get_run merged it: by time,
-- task events before the run transition of the same instant, then by id.
CREATE TEMPORARY TABLE numbered ON COMMIT DROP AS
SELECT kind, id, run_id, row_number() OVER (PARTITION BY run_id ORDER BY at, kind, id) AS n FROM (
    SELECT 0 AS kind, id, run_id, at FROM task_run_event
    UNION ALL
    SELECT 1, id, run_id, at FROM workflow_run_event
) AS e;
UPDATE task_run_event AS t SET seq = n.n FROM numbered AS n WHERE n.kind = 0 AND n.id = t.id;
UPDATE workflow_run_event AS w SET seq = n.n FROM numbered AS n WHERE n.kind = 1 AND n.id = w.id;
INSERT INTO run_event_seq (run_id, seq) SELECT run_id, max(n) FROM numbered GROUP BY run_id;

ALTER TABLE task_run_event ALTER COLUMN seq SET NOT NULL;
ALTER TABLE workflow_run_event ALTER COLUMN seq SET NOT NULL;

-- Each new event takes the run's next number. The upsert locks the run's
-- counter row until the writing transaction ends, so a run's event writers
-- take turns and the numbers follow commit order; a rollback takes its
-- increment back with it, so there is no gap.
CREATE FUNCTION next_run_event_seq() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_event_seq AS s (run_id, seq) VALUES (NEW.run_id, 1)
    ON CONFLICT (run_id) DO UPDATE SET seq = s.seq + 1
    RETURNING s.seq INTO NEW.seq;
    RETURN NEW;
END
$$;
CREATE TRIGGER taskrunevent_seq BEFORE INSERT ON task_run_event
    FOR EACH ROW EXECUTE FUNCTION next_run_event_seq();
CREATE TRIGGER workflowrunevent_seq BEFORE INSERT ON workflow_run_event
    FOR EACH ROW EXECUTE FUNCTION next_run_event_seq();

-- get_run, run_events: a run's history by number, each table an index
-- range scan, merged. They replace the (run_id, id) indexes get_run used.
CREATE UNIQUE INDEX taskrunevent_run_seq_idx ON task_run_event (run_id, seq);
CREATE UNIQUE INDEX workflowrunevent_run_seq_idx ON workflow_run_event (run_id, seq);
DROP INDEX taskrunevent_run_idx;
DROP INDEX workflowrunevent_run_idx;

-- start_run_keyed: one run per client key, recorded in the run's own
-- transaction. The key is written before the run (so a concurrent call
-- with the same key waits on it before doing any work), hence the
-- deferred foreign key.
CREATE TABLE run_idempotency (
    key          TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,
    run_id       UUID NOT NULL REFERENCES workflow_run (id) DEFERRABLE INITIALLY DEFERRED,
    created_at   TIMESTAMPTZ NOT NULL
);

-- list_runs, list_runs_page: newest first, ties by id, so a page starts
-- strictly after its cursor by an index range scan. Replaces
-- workflowrun_created_idx.
CREATE INDEX workflowrun_created_id_idx ON workflow_run (created_at DESC, id DESC);
DROP INDEX workflowrun_created_idx;

-- API tokens: only a digest of each secret is stored.
CREATE TABLE api_token (
    name       TEXT PRIMARY KEY,
    hash       TEXT NOT NULL,
    scopes     TEXT[] NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ,
    revoked_at TIMESTAMPTZ,
    -- token_by_hash.
    CONSTRAINT uniq_apitoken_hash UNIQUE (hash),
    CONSTRAINT apitoken_name_not_blank CHECK (btrim(name) <> ''),
    CONSTRAINT apitoken_hash_sha256 CHECK (hash ~ '^[0-9a-f]{64}$')
);
