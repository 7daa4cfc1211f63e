-- What an HTTP API server reads and writes: a per-run event sequence, keyed
-- run starts, run pages, and API tokens (docs/design/data-model.md#tables).

-- The last event number of each run. A table of its own rather than a
-- column of workflow_run: bumping it must not rewrite a run row, which
-- carries the run's input (up to 1 MiB).
CREATE TABLE run_event_seq (
    run_id TEXT PRIMARY KEY,
    seq    INTEGER NOT NULL,
    CONSTRAINT runeventseq_seq_positive CHECK (seq >= 1)
) STRICT, WITHOUT ROWID;

-- Every event's place in its run's history
-- (docs/design/state-machines.md#event-history). SQLite cannot make an added
-- column NOT NULL without rebuilding the table; the triggers below fill it
-- in the statement that inserts the row.
ALTER TABLE task_run_event ADD COLUMN seq INTEGER;
ALTER TABLE workflow_run_event ADD COLUMN seq INTEGER;

-- The history so far, numbered in the order get_run merged it: both tables
-- draw their ids from one sequence, so by id.
WITH numbered AS (
    SELECT id, row_number() OVER (PARTITION BY run_id ORDER BY id) AS n
    FROM (SELECT id, run_id FROM task_run_event UNION ALL SELECT id, run_id FROM workflow_run_event)
)
UPDATE task_run_event SET seq = numbered.n FROM numbered WHERE numbered.id = task_run_event.id;
WITH numbered AS (
    SELECT id, row_number() OVER (PARTITION BY run_id ORDER BY id) AS n
    FROM (SELECT id, run_id FROM task_run_event UNION ALL SELECT id, run_id FROM workflow_run_event)
)
UPDATE workflow_run_event SET seq = numbered.n FROM numbered WHERE numbered.id = workflow_run_event.id;
INSERT INTO run_event_seq (run_id, seq)
SELECT run_id, max(seq) FROM (
    SELECT run_id, seq FROM task_run_event UNION ALL SELECT run_id, seq FROM workflow_run_event
) GROUP BY run_id;

-- Each new event takes the run's next number. Writes are serialised (one
-- writer), so the numbers follow commit order, and a rolled-back write
-- rolls its number back with it: no gap.
CREATE TRIGGER taskrunevent_seq AFTER INSERT ON task_run_event FOR EACH ROW BEGIN
    INSERT INTO run_event_seq (run_id, seq) VALUES (NEW.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET seq = seq + 1;
    UPDATE task_run_event SET seq = (SELECT s.seq FROM run_event_seq AS s WHERE s.run_id = NEW.run_id)
        WHERE id = NEW.id;
END;
CREATE TRIGGER workflowrunevent_seq AFTER INSERT ON workflow_run_event FOR EACH ROW BEGIN
    INSERT INTO run_event_seq (run_id, seq) VALUES (NEW.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET seq = seq + 1;
    UPDATE workflow_run_event SET seq = (SELECT s.seq FROM run_event_seq AS s WHERE s.run_id = NEW.run_id)
        WHERE id = NEW.id;
END;

-- get_run, run_events: a run's history by number, each table a range
-- search, merged. They replace the (run_id, id) indexes get_run used.
CREATE UNIQUE INDEX taskrunevent_run_seq_idx ON task_run_event (run_id, seq);
CREATE UNIQUE INDEX workflowrunevent_run_seq_idx ON workflow_run_event (run_id, seq);
DROP INDEX taskrunevent_run_idx;
DROP INDEX workflowrunevent_run_idx;

-- start_run_keyed: one run per client key, recorded in the run's own
-- transaction.
CREATE TABLE run_idempotency (
    key          TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,
    run_id       TEXT NOT NULL REFERENCES workflow_run (id),
    created_at   INTEGER NOT NULL
) STRICT;

-- list_runs, list_runs_page: newest first, ties by id, so a page starts
-- strictly after its cursor by an index search. Replaces workflowrun_created_idx.
CREATE INDEX workflowrun_created_id_idx ON workflow_run (created_at DESC, id DESC);
DROP INDEX workflowrun_created_idx;

-- gauges: the runs not yet terminal, counted without walking finished ones.
CREATE INDEX workflowrun_active_idx ON workflow_run (id) WHERE state IN ('pending', 'running');

-- API tokens: only a digest of each secret is stored.
CREATE TABLE api_token (
    name       TEXT PRIMARY KEY,
    hash       TEXT NOT NULL,
    scopes     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    revoked_at INTEGER,
    -- token_by_hash.
    CONSTRAINT uniq_apitoken_hash UNIQUE (hash),
    CONSTRAINT apitoken_name_not_blank CHECK (trim(name) <> ''),
    CONSTRAINT apitoken_hash_sha256 CHECK (length(hash) = 64 AND hash NOT GLOB '*[^0-9a-f]*'),
    CONSTRAINT apitoken_scopes_json CHECK (json_valid(scopes) AND json_type(scopes) = 'array')
) STRICT;
